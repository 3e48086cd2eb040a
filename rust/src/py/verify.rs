//! `VerifyingReader` (see `crate::verify`) and `rehash_beneath`, GIL released.

use std::os::fd::RawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::args;
use super::cancel::CancelToken;
use super::errors::{io_to_py, to_py};
use crate::cancel::Cancel;
use crate::error::ScanError;
use crate::hash;
use crate::redact::SecretSet;
use crate::verify::{self as core, ReadError, Rehash, VerifyingReader};

/// The Python exception for a reader's failure on `path`: FileChangedError,
/// ScanCancelled, or the OSError of the read.
pub fn read_error(path: &str, error: ReadError) -> PyErr {
    match error {
        ReadError::Changed => to_py(ScanError::Changed(PathBuf::from(path))),
        ReadError::Cancelled => to_py(ScanError::Cancelled),
        ReadError::Io(e) => io_to_py(path, "read", e),
    }
}

fn digest_of(hex: &str) -> PyResult<[u8; 32]> {
    hash::from_hex(hex).ok_or_else(|| PyValueError::new_err("digest must be 64 hex digits"))
}

pub fn cancel_of(cancel: Option<&Bound<'_, CancelToken>>) -> Cancel {
    cancel.map(|c| c.get().inner.clone()).unwrap_or_default()
}

/// See `_native.pyi`.
#[pyclass(module = "checkpointd._native", name = "VerifyingReader", frozen)]
pub struct PyVerifyingReader {
    /// None once closed. Locked only with the GIL released (a read in
    /// another thread holds it for one chunk).
    pub inner: Mutex<Option<VerifyingReader>>,
    #[pyo3(get)]
    path: String,
    #[pyo3(get)]
    size: u64,
    digest: [u8; 32],
    /// The reader's stop flag, reachable without its lock.
    stop: Cancel,
    /// Its count of bytes handed out, reachable without its lock.
    progress: Arc<AtomicU64>,
}

impl PyVerifyingReader {
    pub fn new(reader: VerifyingReader) -> PyVerifyingReader {
        PyVerifyingReader {
            path: reader.path.clone(),
            size: reader.size,
            digest: reader.digest,
            stop: reader.stop.clone(),
            progress: reader.progress.clone(),
            inner: Mutex::new(Some(reader)),
        }
    }

    /// Run `work` on the open reader, GIL released.
    pub fn with_reader<T: Send>(
        &self,
        py: Python<'_>,
        work: impl FnOnce(&mut VerifyingReader) -> Result<T, ReadError> + Send,
    ) -> PyResult<T> {
        py.allow_threads(|| {
            let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            match guard.as_mut() {
                Some(reader) => Ok(work(reader)),
                None => Err(()),
            }
        })
        .map_err(|()| PyValueError::new_err(format!("reader of {} is closed", self.path)))?
        .map_err(|e| read_error(&self.path, e))
    }
}

#[pymethods]
impl PyVerifyingReader {
    /// Open `path` beneath `root_fd` to upload the bytes the manifest
    /// records. Raises FileChangedError (gone, a symlink, another size),
    /// OSError, ValueError.
    #[staticmethod]
    #[pyo3(signature = (root_fd, path, digest_hex, size, secrets=None))]
    fn open(
        py: Python<'_>,
        root_fd: RawFd,
        path: String,
        digest_hex: &str,
        size: u64,
        secrets: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let digest = digest_of(digest_hex)?;
        let secrets = SecretSet::new(&args::secrets(secrets)?)
            .map_err(|e| to_py(ScanError::ShortSecret(e)))?;
        let opened =
            py.allow_threads(|| VerifyingReader::open(root_fd, &path, digest, size, secrets));
        opened.map(Self::new).map_err(|e| read_error(&path, e))
    }

    /// Open `path` beneath `root_fd` to stream it as it is now, its digest
    /// learned from the bytes (see `learned`). Raises FileChangedError (gone,
    /// a symlink, not a regular file), OSError, ValueError.
    #[staticmethod]
    #[pyo3(signature = (root_fd, path, secrets=None))]
    fn open_unhashed(
        py: Python<'_>,
        root_fd: RawFd,
        path: String,
        secrets: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let secrets = SecretSet::new(&args::secrets(secrets)?)
            .map_err(|e| to_py(ScanError::ShortSecret(e)))?;
        let opened = py.allow_threads(|| VerifyingReader::open_unhashed(root_fd, &path, secrets));
        opened.map(Self::new).map_err(|e| read_error(&path, e))
    }

    /// Once every byte came out and passed the end checks: (64-hex digest
    /// of the bytes, secret spans, st_mode, mtime_ns of the fstat they were
    /// read under); None before.
    fn learned(&self, py: Python<'_>) -> PyResult<Option<Learned>> {
        self.with_reader(py, |r| {
            if !r.complete {
                return Ok(None);
            }
            let spans = r
                .secret_matches()
                .iter()
                .map(|m| (m.offset, m.len, m.secret))
                .collect();
            let stat = r.stat();
            Ok(Some((
                hash::to_hex(&r.digest),
                spans,
                stat.mode,
                stat.mtime_ns,
            )))
        })
    }

    /// Verified bytes handed out so far (a copy in another thread included):
    /// what a progress report polls while a native copy runs.
    #[getter]
    fn bytes_verified(&self) -> u64 {
        self.progress.load(Ordering::Relaxed)
    }

    /// 64-hex digest the bytes must have.
    #[getter]
    fn digest_hex(&self) -> String {
        hash::to_hex(&self.digest)
    }

    /// The next verified chunk, None after the last (which comes only once
    /// the whole file matched). Raises FileChangedError, OSError.
    fn read_chunk(&self, py: Python<'_>) -> PyResult<Option<Py<PyBytes>>> {
        let chunk = self.with_reader(py, |r| Ok(r.next_chunk()?.map(<[u8]>::to_vec)))?;
        Ok(chunk.map(|c| PyBytes::new(py, &c).unbind()))
    }

    /// Every verified byte. Raises FileChangedError, OSError, ScanCancelled.
    #[pyo3(signature = (cancel=None))]
    fn read_all(
        &self,
        py: Python<'_>,
        cancel: Option<&Bound<'_, CancelToken>>,
    ) -> PyResult<Py<PyBytes>> {
        let cancel = cancel_of(cancel);
        let data = self.with_reader(py, |r| r.read_all(&cancel))?;
        Ok(PyBytes::new(py, &data).unbind())
    }

    /// Make a read or copy in progress in another thread stop at its next
    /// chunk (ScanCancelled there); every later read raises it too.
    fn stop(&self) {
        self.stop.cancel();
    }

    /// Close the file (waits for a read in progress in another thread).
    fn close(&self, py: Python<'_>) {
        let reader =
            py.allow_threads(|| self.inner.lock().unwrap_or_else(|e| e.into_inner()).take());
        drop(reader);
    }
}

/// What an unhashed reader learned: (64-hex digest, spans, st_mode, mtime_ns).
type Learned = (String, Vec<(u64, u32, u32)>, u32, i64);

/// An fstat as Python compares it: (dev, ino, mode, size, mtime_ns, ctime_ns).
type Stamp = (u64, u64, u32, u64, i64, i64);

fn stamp(stat: &crate::fs::Stat) -> Stamp {
    (
        stat.dev,
        stat.ino,
        stat.mode,
        stat.size,
        stat.mtime_ns,
        stat.ctime_ns,
    )
}

/// (64-hex digest or "" when not a regular file, size, spans, st_mode,
/// mtime_ns, (the zeroed bytes, the fstat they were read under) when kept).
type Rehashed = (
    String,
    u64,
    Vec<(u64, u32, u32)>,
    u32,
    i64,
    Option<(Py<PyBytes>, Stamp)>,
);

/// See `_native.pyi`.
#[pyfunction]
pub fn stat_beneath(py: Python<'_>, root_fd: RawFd, path: String) -> PyResult<Option<Stamp>> {
    let found = py.allow_threads(|| core::stat_beneath(root_fd, &path));
    Ok(found
        .map_err(|e| io_to_py(&path, "open", e))?
        .map(|stat| stamp(&stat)))
}

/// See `_native.pyi`: the one component-by-component rule
/// (`fs::open_subdir`), for Python's sub-roots. The fd returned is the
/// caller's to close.
#[pyfunction]
#[pyo3(signature = (root_fd, subdir, create=false))]
pub fn open_beneath(
    py: Python<'_>,
    root_fd: RawFd,
    subdir: String,
    create: bool,
) -> PyResult<RawFd> {
    let opened = py.allow_threads(|| crate::fs::open_subdir(root_fd, subdir.as_bytes(), create));
    opened
        .map(std::os::fd::IntoRawFd::into_raw_fd)
        .map_err(|e| io_to_py(&subdir, "open", e))
}

/// See `_native.pyi`.
#[pyfunction]
#[pyo3(signature = (root_fd, paths, secrets=None, cancel=None, keep_small=false, unread_above=None))]
pub fn rehash_beneath(
    py: Python<'_>,
    root_fd: RawFd,
    paths: Vec<String>,
    secrets: Option<&Bound<'_, PyAny>>,
    cancel: Option<&Bound<'_, CancelToken>>,
    keep_small: bool,
    unread_above: Option<u64>,
) -> PyResult<Vec<PyObject>> {
    let secrets =
        SecretSet::new(&args::secrets(secrets)?).map_err(|e| to_py(ScanError::ShortSecret(e)))?;
    let cancel = cancel_of(cancel);
    // One trip without the GIL for every path: a worker thread taking it
    // back per file waits for the event loop each time.
    let found: Vec<_> = py.allow_threads(|| {
        let mut found = Vec::with_capacity(paths.len());
        let mut rehasher = core::Rehasher::new(&secrets, &cancel);
        rehasher.keep_small = keep_small;
        rehasher.unread_above = unread_above;
        for path in &paths {
            if cancel.is_cancelled() {
                found.push(Err(ReadError::Cancelled));
                break;
            }
            let one = rehasher.rehash(root_fd, path);
            let cancelled = matches!(one, Err(ReadError::Cancelled));
            found.push(one);
            if cancelled {
                break;
            }
        }
        found
    });
    let mut out = Vec::with_capacity(found.len());
    for (path, one) in paths.iter().zip(found) {
        out.push(match one {
            Err(ReadError::Cancelled) => return Err(to_py(ScanError::Cancelled)),
            Err(e) => read_error(path, e).into_value(py).into_any(),
            Ok(rehash) => rehashed(py, rehash).into_pyobject(py)?.into_any().unbind(),
        });
    }
    Ok(out)
}

/// What `rehash_beneath` says of one file (see `_native.pyi`).
fn rehashed(py: Python<'_>, rehash: Rehash) -> Option<Rehashed> {
    match rehash {
        Rehash::Gone => None,
        Rehash::NotRegular(stat) | Rehash::Larger(stat) => Some((
            String::new(),
            stat.size,
            Vec::new(),
            stat.mode,
            stat.mtime_ns,
            None,
        )),
        Rehash::Hashed(digest, stat, spans, kept) => Some((
            hash::to_hex(&digest),
            stat.size,
            spans.iter().map(|m| (m.offset, m.len, m.secret)).collect(),
            stat.mode,
            stat.mtime_ns,
            kept.map(|data| (PyBytes::new(py, &data).unbind(), stamp(&stat))),
        )),
    }
}
