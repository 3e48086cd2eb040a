//! Packs (see `crate::pack`): build a pack from batches of small blobs and
//! decode blobs out of ranged reads, GIL released, in parallel.

use std::collections::HashSet;
use std::fs::File;
use std::os::fd::{BorrowedFd, OwnedFd, RawFd};
use std::sync::Mutex;

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::PyBytes;

use super::bytes::moved_into_bytes;
use super::errors::to_py;
use super::feed::FedBatch;
use crate::hash::{self, from_hex, to_hex, DigestBuild};
use crate::pack::{self as core, Entry, PackBuilder, PackError};
use crate::packcheck::{self, Limits};

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
        entries.map_err(to_py)
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

    /// Pack the blobs of ``batch`` (a ``FedBatch``, already compressed) from
    /// index ``start`` on whose digest is in ``wanted`` (concatenated 32-byte
    /// digests; each wanted digest is packed once, at its first place) and
    /// whose raw size is below ``below``, until the pack reaches ``target``
    /// bytes (so it overshoots by at most one frame). Returns ``(next, added,
    /// added_raw_bytes)``: call again from ``next`` with a new writer while
    /// ``next < len(batch)``. GIL released.
    fn extend_fed(
        &self,
        py: Python<'_>,
        batch: &Bound<'_, FedBatch>,
        start: usize,
        wanted: &[u8],
        target: usize,
        below: usize,
    ) -> PyResult<(usize, usize, u64)> {
        if wanted.len() % 32 != 0 {
            return Err(PyValueError::new_err(
                "wanted must be concatenated 32-byte digests",
            ));
        }
        let batch = batch.get();
        py.allow_threads(|| {
            let mut wanted: HashSet<&[u8], DigestBuild> = wanted.chunks_exact(32).collect();
            self.with(|builder| {
                let (mut added, mut added_bytes) = (0, 0);
                let mut next = start.min(batch.items.len());
                while next < batch.items.len() && builder.len() < target {
                    let frame = &batch.items[next];
                    next += 1;
                    if (frame.raw_len as usize) < below && wanted.remove(&frame.digest[..]) {
                        builder.push(frame);
                        added += 1;
                        added_bytes += frame.raw_len as u64;
                    }
                }
                (next, added, added_bytes)
            })
        })
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
        Ok((hex, moved_into_bytes(py, bytes)?))
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
        let (digests, offsets, lengths, raw_sizes, codecs) = columns_to_py(py, &columns);
        Ok((
            hex,
            moved_into_bytes(py, bytes)?,
            digests,
            offsets,
            lengths,
            raw_sizes,
            codecs,
        ))
    }
}

/// The smallest and largest of a column of native-endian u32s (None when it
/// is empty): a capture's index columns checked at once, no int per row.
#[pyfunction]
pub fn u32_bounds(column: &[u8]) -> PyResult<Option<(u32, u32)>> {
    if column.len() % 4 != 0 {
        return Err(PyValueError::new_err(
            "a u32 column's length is not a multiple of 4",
        ));
    }
    let mut values = column
        .chunks_exact(4)
        .map(|c| u32::from_ne_bytes(c.try_into().expect("4 bytes")));
    let first = match values.next() {
        Some(v) => v,
        None => return Ok(None),
    };
    Ok(Some(values.fold((first, first), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    })))
}

/// One pack's index columns as ``decimal_rows`` takes them: the pack's id,
/// its digests (32 bytes each) and its offsets, lengths and raw sizes
/// (native-endian u32s) and codecs, one per digest.
type PackGroup = (
    u32,
    PyBackedBytes,
    PyBackedBytes,
    PyBackedBytes,
    PyBackedBytes,
    PyBackedBytes,
);

/// Several packs' index rows merged into digest order, for SQL that reads
/// integers out of text: the digests concatenated, and per row the pack id,
/// offset, length and raw size as 10 ASCII digits each, then the codec as one
/// digit (see ``_native.pyi``). Rows of one digest keep the order of their
/// groups (the later one is the newer). One statement then inserts every row
/// in key order, so the B-tree is filled from left to right instead of once
/// per pack. Raises ValueError for columns of unequal length.
#[pyfunction]
pub fn decimal_rows<'py>(
    py: Python<'py>,
    groups: Vec<PackGroup>,
) -> PyResult<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)> {
    for (_, digests, offsets, lengths, raw_sizes, codecs) in &groups {
        let n = codecs.len();
        if digests.len() != 32 * n
            || [offsets, lengths, raw_sizes]
                .iter()
                .any(|c| c.len() != 4 * n)
            || codecs.iter().any(|&c| c > 9)
        {
            return Err(PyValueError::new_err(
                "per pack 32-byte digests and 4-byte integers, one per codec (0-9), are needed",
            ));
        }
    }
    let (digests, columns) = py.allow_threads(|| {
        let mut order: Vec<(&[u8], usize, usize)> = groups
            .iter()
            .enumerate()
            .flat_map(|(g, group)| {
                (0..group.5.len()).map(move |i| (&group.1[32 * i..32 * i + 32], g, i))
            })
            .collect();
        order.sort_by(|a, b| a.0.cmp(b.0)); // stable: group order within a digest
        let mut digests = Vec::with_capacity(order.len() * 32);
        let mut columns = Vec::with_capacity(order.len() * ROW_CHARS);
        let u32_at = |column: &[u8], i: usize| {
            u32::from_ne_bytes(column[4 * i..4 * i + 4].try_into().expect("4 bytes"))
        };
        for (digest, g, i) in order {
            let (pack, _, offsets, lengths, raw_sizes, codecs) = &groups[g];
            digests.extend_from_slice(digest);
            for value in [
                *pack,
                u32_at(offsets, i),
                u32_at(lengths, i),
                u32_at(raw_sizes, i),
            ] {
                push_decimal10(&mut columns, value);
            }
            columns.push(b'0' + codecs[i]);
        }
        (digests, columns)
    });
    Ok((PyBytes::new(py, &digests), PyBytes::new(py, &columns)))
}

/// Characters per row of ``decimal_rows``'s columns.
pub const ROW_CHARS: usize = 41;

/// `value` as exactly 10 ASCII decimal digits, zero-padded (a u32 has at
/// most 10): what `format!("{value:010}")` gives, without a String per value
/// (an append of 100,000 rows formats 400,000 of them on its critical path).
fn push_decimal10(out: &mut Vec<u8>, mut value: u32) {
    let mut digits = [b'0'; 10];
    for digit in digits.iter_mut().rev() {
        *digit = b'0' + (value % 10) as u8;
        value /= 10;
    }
    out.extend_from_slice(&digits);
}

/// Whether ``digests`` (32 bytes each, concatenated) are in strictly rising
/// order: the shape of a pack's index columns (see ``_native.pyi``).
/// A set of 32-byte digests kept natively (see `_native.pyi`): what a pack
/// session has taken, asked about a batch at a time.
#[pyclass(module = "checkpointd._native", name = "DigestSet")]
#[derive(Default)]
pub struct DigestSet {
    digests: hash::DigestSet,
}

fn digest_chunks(digests: &[u8]) -> PyResult<impl Iterator<Item = [u8; 32]> + '_> {
    if digests.len() % 32 != 0 {
        return Err(PyValueError::new_err(
            "digest list length is not a multiple of 32",
        ));
    }
    Ok(digests
        .chunks_exact(32)
        .map(|c| c.try_into().expect("32 bytes")))
}

#[pymethods]
impl DigestSet {
    #[new]
    fn new() -> Self {
        DigestSet::default()
    }

    /// The digests of ``digests`` not in the set yet (each once, in order),
    /// which are in it from now on.
    fn take_new<'py>(&mut self, py: Python<'py>, digests: &[u8]) -> PyResult<Bound<'py, PyBytes>> {
        let mut out = Vec::new();
        for digest in digest_chunks(digests)? {
            if self.digests.insert(digest) {
                out.extend_from_slice(&digest);
            }
        }
        Ok(PyBytes::new(py, &out))
    }

    /// The digests of ``digests`` not in the set (each once, in order).
    fn without<'py>(&self, py: Python<'py>, digests: &[u8]) -> PyResult<Bound<'py, PyBytes>> {
        let mut seen = hash::DigestSet::default();
        let mut out = Vec::new();
        for digest in digest_chunks(digests)? {
            if !self.digests.contains(&digest) && seen.insert(digest) {
                out.extend_from_slice(&digest);
            }
        }
        Ok(PyBytes::new(py, &out))
    }

    fn __contains__(&self, digest: &[u8]) -> bool {
        <[u8; 32]>::try_from(digest).is_ok_and(|d| self.digests.contains(&d))
    }

    fn __len__(&self) -> usize {
        self.digests.len()
    }
}

/// The digests of ``a`` (concatenated, 32 bytes each) that ``b`` lacks, in
/// ``a``'s order, each once; neither needs to be sorted.
#[pyfunction]
pub fn digests_without<'py>(py: Python<'py>, a: &[u8], b: &[u8]) -> PyResult<Bound<'py, PyBytes>> {
    if a.len() % 32 != 0 || b.len() % 32 != 0 {
        return Err(PyValueError::new_err(
            "digest list length is not a multiple of 32",
        ));
    }
    let out = py.allow_threads(|| {
        let mut seen: HashSet<&[u8], DigestBuild> = b.chunks_exact(32).collect();
        let mut out = Vec::with_capacity(a.len());
        for digest in a.chunks_exact(32) {
            if seen.insert(digest) {
                out.extend_from_slice(digest);
            }
        }
        out
    });
    Ok(PyBytes::new(py, &out))
}

/// The digests (concatenated, 32 bytes each) sorted, each once.
#[pyfunction]
pub fn sort_digests<'py>(py: Python<'py>, digests: &[u8]) -> PyResult<Bound<'py, PyBytes>> {
    if digests.len() % 32 != 0 {
        return Err(PyValueError::new_err(
            "digest list length is not a multiple of 32",
        ));
    }
    let out = py.allow_threads(|| {
        let mut all: Vec<&[u8]> = digests.chunks_exact(32).collect();
        all.sort_unstable();
        all.dedup();
        all.concat()
    });
    Ok(PyBytes::new(py, &out))
}

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
        out.push(PyBytes::new(py, &result.map_err(to_py)?));
    }
    Ok(out)
}

/// Group frames ``(pack number, offset, stored_len)`` by pack and merge
/// nearby ones into ranged reads (``pack::plan_reads``): per read ``(pack
/// number, start, end, indices of its frames)``.
#[pyfunction]
pub fn plan_pack_reads(
    frames: Vec<(usize, u64, u64)>,
    merge_gap: u64,
    max_range: u64,
) -> Vec<(usize, u64, u64, Vec<usize>)> {
    core::plan_reads(&frames, merge_gap, max_range)
        .into_iter()
        .map(|read| (read.pack, read.start, read.end, read.frames))
        .collect()
}

/// The trailer length announced by a pack's footer (its last
/// ``PACK_FOOTER_LEN`` bytes). Raises PackInvalid.
#[pyfunction]
pub fn pack_trailer_len(footer: &[u8]) -> PyResult<usize> {
    core::footer_trailer_len(footer).map_err(to_py)
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
        .map_err(to_py)?;
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

/// Check a whole pack before anything may name it (``crate::packcheck``:
/// header, trailer, every entry's claimed size within ``max_blob`` and their
/// sum within ``max_total``, every frame decoded streaming and its size and
/// BLAKE3 compared) in the ``size`` bytes of the file ``fd`` (read by offset,
/// never whole), and return its index rows as columns, exactly as
/// ``PackWriter.finish_with_rows`` gives them: ``(digests, offsets, lengths,
/// raw_sizes, codecs)``. Raises PackInvalid, PackedBlobInvalid.
#[pyfunction]
pub fn verify_pack_file<'py>(
    py: Python<'py>,
    fd: RawFd,
    size: u64,
    max_blob: u64,
    max_total: u64,
) -> PyResult<PyIndexColumns<'py>> {
    // The caller's fd, borrowed: duplicated, so closing ours leaves theirs open.
    let file = File::from(dup_fd(fd).map_err(|e| PyOSError::new_err(format!("fd {fd}: {e}")))?);
    let limits = Limits {
        max_blob,
        max_total,
    };
    let columns = py
        .allow_threads(|| -> Result<_, PackError> {
            let entries = packcheck::verify_pack_at(&file, size, limits)?;
            Ok(core::index_columns(&entries))
        })
        .map_err(to_py)?;
    Ok(columns_to_py(py, &columns))
}

/// A duplicate of `fd` the caller owns.
fn dup_fd(fd: RawFd) -> std::io::Result<OwnedFd> {
    // SAFETY: the caller keeps `fd` open for the duration of this call.
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    borrowed.try_clone_to_owned()
}

/// A pack index's columns as Python sees them: digests, offsets, lengths,
/// raw sizes, codecs, each one bytes object.
type PyIndexColumns<'py> = (
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
);

fn columns_to_py<'py>(py: Python<'py>, columns: &core::IndexColumns) -> PyIndexColumns<'py> {
    (
        PyBytes::new(py, &columns.digests),
        PyBytes::new(py, &columns.offsets),
        PyBytes::new(py, &columns.lengths),
        PyBytes::new(py, &columns.raw_sizes),
        PyBytes::new(py, &columns.codecs),
    )
}

#[cfg(test)]
mod tests {
    use super::push_decimal10;

    #[test]
    fn decimal10_matches_format() {
        for value in [0, 7, 10, 99_999, 1_000_000_000, 4_294_967_295, 123_456_789] {
            let mut out = Vec::new();
            push_decimal10(&mut out, value);
            assert_eq!(out, format!("{value:010}").into_bytes());
        }
    }
}
