//! `hash_file` (the benchmarks time the machine's BLAKE3 with it; tests hash
//! restored files with it) and `secrets_fingerprint` (the journal's key for
//! the secret set).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;

use super::args;
use super::errors::{io_to_py, to_py};
use crate::cancel::Cancel;
use crate::error::ScanError;
use crate::fs;
use crate::hash::{self, HashError};
use crate::redact::SecretSet;
use crate::scan;
use crate::statcache;

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

/// See `_native.pyi`. Raises OSError.
#[pyfunction]
pub fn hash_file(py: Python<'_>, path: PathBuf) -> PyResult<(String, u64)> {
    let file = open_regular(&path)?;
    let shown = path.to_string_lossy().into_owned();
    let size = fs::fstat(file.as_raw_fd())
        .map_err(|e| io_to_py(&shown, "fstat", e))?
        .size;
    py.allow_threads(|| {
        let mut scratch = Vec::new();
        let cancel = Cancel::new();
        let secrets = SecretSet::empty();
        let mut run = |parallel: bool| {
            hash::hash_file(&file, None, &secrets, &cancel, parallel, &mut scratch)
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
    .map(|(digest, size)| (hash::to_hex(&digest), size))
    .map_err(|e| match e {
        HashError::Io(e) => io_to_py(&shown, "read", e),
        HashError::Cancelled => to_py(ScanError::Cancelled),
    })
}

/// See `_native.pyi`: 64-hex keyed BLAKE3 of the sorted, de-duplicated set.
#[pyfunction]
pub fn secrets_fingerprint(secrets: &Bound<'_, PyAny>) -> PyResult<String> {
    let secrets = args::secrets(Some(secrets))?;
    Ok(hash::to_hex(&statcache::secrets_fingerprint(&secrets)))
}
