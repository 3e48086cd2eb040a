//! Packs (see `crate::pack`): build a pack from batches of small blobs and
//! decode blobs out of ranged reads, GIL released, in parallel.

use std::sync::Mutex;

use pyo3::create_exception;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::PyBytes;

use crate::hash::{from_hex, to_hex};
use crate::pack::{self as core, Entry, PackBuilder, PackError};

create_exception!(
    checkpointd._native,
    PackedBlobInvalid,
    PyValueError,
    "A packed blob does not decode to its key: args are (64-hex digest, reason)."
);

create_exception!(
    checkpointd._native,
    PackInvalid,
    PyValueError,
    "A pack object's header, trailer or footer is damaged: args are (reason,)."
);

fn pack_to_py(error: PackError) -> PyErr {
    match error {
        PackError::Blob { digest, reason } => PackedBlobInvalid::new_err((to_hex(&digest), reason)),
        PackError::Pack(reason) => PackInvalid::new_err((reason,)),
        e @ PackError::TooLarge(_) => PyValueError::new_err(e.to_string()),
    }
}

fn digest(hex: &str) -> PyResult<[u8; 32]> {
    from_hex(hex).ok_or_else(|| PyValueError::new_err(format!("not a 64-hex digest: {hex:?}")))
}

/// `(offset, stored_len, raw_len, codec)`: what the index records of a blob.
type Placed = (u64, u32, u32, u8);

fn placed(e: &Entry) -> Placed {
    (e.offset, e.stored_len, e.raw_len, e.codec)
}

/// See `_native.pyi`.
#[pyclass(module = "checkpointd._native", name = "PackWriter", frozen)]
pub struct PyPackWriter {
    inner: Mutex<Option<PackBuilder>>,
}

impl PyPackWriter {
    /// Compress and append the blobs (digests checked first, the work done
    /// without the GIL): the body of ``add_many`` and ``extend``.
    fn append(&self, py: Python<'_>, items: &[(String, PyBackedBytes)]) -> PyResult<Vec<Entry>> {
        let mut parsed = Vec::with_capacity(items.len());
        for (hex, data) in items {
            parsed.push((digest(hex)?, data));
        }
        let entries = py.allow_threads(|| {
            let views: Vec<([u8; 32], &[u8])> =
                parsed.iter().map(|(d, b)| (*d, b.as_ref())).collect();
            self.with(|builder| builder.add_many(&views))
        })?;
        entries.map_err(pack_to_py)
    }

    fn with<T>(&self, work: impl FnOnce(&mut PackBuilder) -> T) -> PyResult<T> {
        let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        match guard.as_mut() {
            Some(builder) => Ok(work(builder)),
            None => Err(PyValueError::new_err("the pack was already finished")),
        }
    }
}

#[pymethods]
impl PyPackWriter {
    #[new]
    fn new() -> Self {
        PyPackWriter {
            inner: Mutex::new(Some(PackBuilder::new())),
        }
    }

    /// Compress and append ``[(hex digest, raw bytes), ...]``; per blob
    /// ``(offset, stored_len, raw_len, codec)``.
    fn add_many(
        &self,
        py: Python<'_>,
        items: Vec<(String, PyBackedBytes)>,
    ) -> PyResult<Vec<Placed>> {
        Ok(self.append(py, &items)?.iter().map(placed).collect())
    }

    /// ``add_many`` without the per-blob answer (the index rows come from
    /// ``finish_with_rows``); returns the number of blobs added.
    fn extend(&self, py: Python<'_>, items: Vec<(String, PyBackedBytes)>) -> PyResult<usize> {
        Ok(self.append(py, &items)?.len())
    }

    /// Bytes the pack would have if finished now.
    #[getter]
    fn size(&self) -> PyResult<usize> {
        self.with(|b| b.len())
    }

    /// Blobs added so far.
    #[getter]
    fn count(&self) -> PyResult<usize> {
        self.with(|b| b.entries().len())
    }

    /// The complete pack object and the 64-hex BLAKE3 of it (its key's hash);
    /// the writer cannot be used afterwards.
    fn finish<'py>(&self, py: Python<'py>) -> PyResult<(String, Bound<'py, PyBytes>)> {
        let builder = self
            .inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(|| PyValueError::new_err("the pack was already finished"))?;
        let (hex, bytes) = py.allow_threads(|| {
            let bytes = builder.finish();
            (blake3::hash(&bytes).to_hex().to_string(), bytes)
        });
        Ok((hex, PyBytes::new(py, &bytes)))
    }

    /// ``finish`` and the pack's index rows as columns (``crate::pack::index_columns``):
    /// ``(hex, pack, digests, offsets, lengths, raw_sizes, codecs)``.
    #[allow(clippy::type_complexity)]
    fn finish_with_rows<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<(
        String,
        Bound<'py, PyBytes>,
        Bound<'py, PyBytes>,
        Bound<'py, PyBytes>,
        Bound<'py, PyBytes>,
        Bound<'py, PyBytes>,
        Bound<'py, PyBytes>,
    )> {
        let builder = self
            .inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(|| PyValueError::new_err("the pack was already finished"))?;
        let (hex, bytes, columns) = py.allow_threads(|| {
            let columns = core::index_columns(builder.entries());
            let bytes = builder.finish();
            (blake3::hash(&bytes).to_hex().to_string(), bytes, columns)
        });
        Ok((
            hex,
            PyBytes::new(py, &bytes),
            PyBytes::new(py, &columns.digests),
            PyBytes::new(py, &columns.offsets),
            PyBytes::new(py, &columns.lengths),
            PyBytes::new(py, &columns.raw_sizes),
            PyBytes::new(py, &columns.codecs),
        ))
    }
}

/// Rows of fixed-width decimals for SQL that reads integers out of text: per
/// row each column's native-endian u32 as 10 digits, then the row's codec as
/// one digit (see ``_native.pyi``). Raises ValueError for columns of unequal length.
#[pyfunction]
pub fn decimal_rows<'py>(
    py: Python<'py>,
    columns: Vec<PyBackedBytes>,
    codecs: &[u8],
) -> PyResult<Bound<'py, PyBytes>> {
    let n = codecs.len();
    if columns.iter().any(|c| c.len() != 4 * n) || codecs.iter().any(|&c| c > 9) {
        return Err(PyValueError::new_err(
            "columns of 4-byte integers, one per codec (0-9), are needed",
        ));
    }
    let out = py.allow_threads(|| {
        let mut out = Vec::with_capacity(n * (10 * columns.len() + 1));
        for (i, codec) in codecs.iter().enumerate() {
            for column in &columns {
                let value = u32::from_ne_bytes(column[4 * i..4 * i + 4].try_into().unwrap());
                out.extend_from_slice(format!("{value:010}").as_bytes());
            }
            out.push(b'0' + codec);
        }
        out
    });
    Ok(PyBytes::new(py, &out))
}

/// Whether ``digests`` (32 bytes each, concatenated) are in strictly rising
/// order: the shape of a pack's index columns (see ``_native.pyi``).
#[pyfunction]
pub fn digests_sorted_distinct(digests: &[u8]) -> bool {
    digests.len() % 32 == 0
        && digests
            .chunks_exact(32)
            .zip(digests.chunks_exact(32).skip(1))
            .all(|(a, b)| a < b)
}

/// Decode blobs from ``data``, the pack's bytes from offset ``base`` on:
/// ``items`` are ``(hex digest, offset, stored_len, raw_len, codec)``; returns
/// each blob's raw bytes, checked (size and BLAKE3), in order. Raises
/// PackedBlobInvalid for the first blob that does not check.
#[pyfunction]
pub fn unpack_many<'py>(
    py: Python<'py>,
    data: PyBackedBytes,
    base: u64,
    items: Vec<(String, u64, u32, u32, u8)>,
) -> PyResult<Vec<Bound<'py, PyBytes>>> {
    let mut entries = Vec::with_capacity(items.len());
    for (hex, offset, stored_len, raw_len, codec) in &items {
        entries.push(Entry {
            digest: digest(hex)?,
            offset: *offset,
            stored_len: *stored_len,
            raw_len: *raw_len,
            codec: *codec,
            kind: core::KIND_FILE,
        });
    }
    let decoded = py.allow_threads(|| core::decode_many(base, &data, &entries));
    let mut out = Vec::with_capacity(decoded.len());
    for result in decoded {
        out.push(PyBytes::new(py, &result.map_err(pack_to_py)?));
    }
    Ok(out)
}

/// The trailer length announced by a pack's footer (its last
/// ``PACK_FOOTER_LEN`` bytes). Raises PackInvalid.
#[pyfunction]
pub fn pack_trailer_len(footer: &[u8]) -> PyResult<usize> {
    core::footer_trailer_len(footer).map_err(pack_to_py)
}

/// `(hex digest, offset, stored_len, raw_len, codec, kind)` of a listed blob.
type Listed = (String, u64, u32, u32, u8, u8);

/// The blobs a pack lists: ``tail`` is the pack's last bytes (trailer and
/// footer at least), ``pack_len`` its full length; per blob ``(hex digest,
/// offset, stored_len, raw_len, codec, kind)``. Raises PackInvalid.
#[pyfunction]
pub fn read_pack_trailer(
    py: Python<'_>,
    tail: PyBackedBytes,
    pack_len: u64,
) -> PyResult<Vec<Listed>> {
    let entries = py
        .allow_threads(|| core::read_trailer(&tail, pack_len))
        .map_err(pack_to_py)?;
    Ok(entries
        .iter()
        .map(|e| {
            (
                to_hex(&e.digest),
                e.offset,
                e.stored_len,
                e.raw_len,
                e.codec,
                e.kind,
            )
        })
        .collect())
}

/// Check a whole pack before anything may name it (``crate::pack::verify_pack``:
/// trailer, every frame decoded and its BLAKE3 compared) and return the 64-hex
/// BLAKE3 of the pack and its index rows as columns, exactly as
/// ``PackWriter.finish_with_rows`` gives them: ``(hex, digests, offsets,
/// lengths, raw_sizes, codecs)``. Raises PackInvalid, PackedBlobInvalid.
#[pyfunction]
#[allow(clippy::type_complexity)]
pub fn verify_pack<'py>(
    py: Python<'py>,
    data: PyBackedBytes,
) -> PyResult<(
    String,
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
)> {
    let (hex, columns) = py
        .allow_threads(|| -> Result<_, PackError> {
            let entries = core::verify_pack(&data)?;
            Ok((
                blake3::hash(&data).to_hex().to_string(),
                core::index_columns(&entries),
            ))
        })
        .map_err(pack_to_py)?;
    Ok((
        hex,
        PyBytes::new(py, &columns.digests),
        PyBytes::new(py, &columns.offsets),
        PyBytes::new(py, &columns.lengths),
        PyBytes::new(py, &columns.raw_sizes),
        PyBytes::new(py, &columns.codecs),
    ))
}
