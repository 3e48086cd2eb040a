//! The small helpers around secret zeroing and hashing: `hash_file`,
//! `ZeroingReader`, `zero_secrets`, `secrets_fingerprint`.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::args;
use super::errors::{io_to_py, to_py};
use crate::cancel::Cancel;
use crate::error::ScanError;
use crate::fs;
use crate::hash::{self, HashError};
use crate::redact::{SecretSet, ZeroingStream};
use crate::scan;
use crate::statcache;

fn secret_set(secrets: Option<&Bound<'_, PyAny>>) -> PyResult<SecretSet> {
    SecretSet::new(&args::secrets(secrets)?).map_err(|e| to_py(ScanError::ShortSecret(e)))
}

/// Open a regular file for reading without following a final symlink and
/// without blocking on a fifo.
fn open_regular(path: &PathBuf) -> PyResult<File> {
    let shown = path.to_string_lossy().into_owned();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| io_to_py(&shown, "open", e))?;
    let stat = fs::fstat(file.as_raw_fd()).map_err(|e| io_to_py(&shown, "fstat", e))?;
    if !stat.is_file() {
        return Err(PyOSError::new_err(format!("{shown} is not a regular file")));
    }
    Ok(file)
}

/// Files at least this big are hashed on several threads (starting a pool
/// costs well under a millisecond; 16 MiB take ~5 ms on one core).
const PARALLEL_HASH_MIN: u64 = 16 << 20;

/// See `_native.pyi`. Raises OSError, ValueError.
#[pyfunction]
#[pyo3(signature = (path, secrets=None))]
pub fn hash_file(
    py: Python<'_>,
    path: PathBuf,
    secrets: Option<&Bound<'_, PyAny>>,
) -> PyResult<(String, u64)> {
    hash_file_recording(py, path, secrets).map(|(hex, size, _)| (hex, size))
}

/// (64-hex digest, size, sorted (offset, length, secret index) of each match).
type HashWithSecrets = (String, u64, Vec<(u64, u32, u32)>);

/// See `_native.pyi`: `hash_file` plus where each secret was zeroed.
#[pyfunction]
#[pyo3(signature = (path, secrets=None))]
pub fn hash_file_with_secrets(
    py: Python<'_>,
    path: PathBuf,
    secrets: Option<&Bound<'_, PyAny>>,
) -> PyResult<HashWithSecrets> {
    hash_file_recording(py, path, secrets)
}

fn hash_file_recording(
    py: Python<'_>,
    path: PathBuf,
    secrets: Option<&Bound<'_, PyAny>>,
) -> PyResult<HashWithSecrets> {
    let secrets = secret_set(secrets)?;
    let file = open_regular(&path)?;
    let shown = path.to_string_lossy().into_owned();
    let size = fs::fstat(file.as_raw_fd())
        .map_err(|e| io_to_py(&shown, "fstat", e))?
        .size;
    let mut found = Vec::new();
    py.allow_threads(|| {
        let mut scratch = Vec::new();
        let cancel = Cancel::new();
        let found = &mut found;
        let mut run = |parallel: bool| {
            hash::hash_file_recording(
                &file,
                None,
                &secrets,
                &cancel,
                parallel,
                &mut scratch,
                found,
            )
        };
        if size < PARALLEL_HASH_MIN {
            return run(false);
        }
        // A short-lived pool (no threads outlive the call, so fork() stays safe).
        match scan::build_pool(0) {
            Ok(pool) => pool.install(|| run(true)),
            Err(_) => run(false),
        }
    })
    .map(|(digest, size)| {
        let spans = found.iter().map(|m| (m.offset, m.len, m.secret)).collect();
        (hash::to_hex(&digest), size, spans)
    })
    .map_err(|e| match e {
        HashError::Io(e) => io_to_py(&shown, "read", e),
        HashError::Cancelled => to_py(ScanError::Cancelled),
    })
}

/// See `_native.pyi`.
#[pyclass(module = "checkpointd._native")]
pub struct ZeroingReader {
    stream: Option<ZeroingStream<File>>,
    path: String,
}

#[pymethods]
impl ZeroingReader {
    /// Raises OSError (missing, a symlink, not a regular file), ValueError.
    #[new]
    #[pyo3(signature = (path, secrets=None, chunk_size=1 << 20))]
    fn new(path: PathBuf, secrets: Option<&Bound<'_, PyAny>>, chunk_size: usize) -> PyResult<Self> {
        if chunk_size == 0 {
            return Err(PyValueError::new_err("chunk_size must be positive"));
        }
        let secrets = secret_set(secrets)?;
        let file = open_regular(&path)?;
        Ok(ZeroingReader {
            stream: Some(ZeroingStream::new(file, secrets, chunk_size)),
            path: path.to_string_lossy().into_owned(),
        })
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let Some(stream) = self.stream.as_mut() else {
            return Ok(None);
        };
        let chunk = py.allow_threads(|| stream.next_chunk().map(|c| c.map(|c| c.to_vec())));
        match chunk {
            Ok(Some(bytes)) => Ok(Some(PyBytes::new(py, &bytes))),
            Ok(None) => {
                self.stream = None;
                Ok(None)
            }
            Err(e) => Err(io_to_py(&self.path, "read", e)),
        }
    }

    fn close(&mut self) {
        self.stream = None;
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    #[pyo3(signature = (_exc_type=None, _exc=None, _tb=None))]
    fn __exit__(
        &mut self,
        _exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) {
        self.close();
    }
}

/// See `_native.pyi`. Raises ValueError for a secret shorter than 4 bytes.
#[pyfunction]
pub fn zero_secrets<'py>(
    py: Python<'py>,
    data: &[u8],
    secrets: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyBytes>> {
    let secrets = secret_set(Some(secrets))?;
    let mut out = data.to_vec();
    secrets.zero_in_place(&mut out);
    Ok(PyBytes::new(py, &out))
}

/// See `_native.pyi`: 64-hex keyed BLAKE3 of the sorted, de-duplicated set.
#[pyfunction]
pub fn secrets_fingerprint(secrets: &Bound<'_, PyAny>) -> PyResult<String> {
    let secrets = args::secrets(Some(secrets))?;
    Ok(hash::to_hex(&statcache::secrets_fingerprint(&secrets)))
}
