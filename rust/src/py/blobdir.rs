//! `BlobDir`: the local blob directory's batches (`crate::blobdir`), GIL released.

use std::path::PathBuf;

use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::cancel::CancelToken;
use super::verify::{cancel_of, PyVerifyingReader};
use crate::blobdir::{self as core, BlobError, Fetched, PutFileError};
use crate::verify::VerifyingReader;

fn blob_error(e: BlobError) -> PyErr {
    let message = format!("{} {:?}: {}", e.op, e.key, e.source);
    let filename = e.path.to_string_lossy().into_owned();
    match e.source.raw_os_error() {
        Some(errno) => PyOSError::new_err((errno, message, filename)),
        None => PyOSError::new_err(format!("{message}: {filename}")),
    }
}

/// See `_native.pyi`.
#[pyclass(module = "checkpointd._native", name = "BlobDir", frozen)]
pub struct PyBlobDir {
    inner: core::BlobDir,
}

#[pymethods]
impl PyBlobDir {
    #[new]
    fn new(py: Python<'_>, root: PathBuf) -> PyResult<Self> {
        let inner = py
            .allow_threads(|| core::BlobDir::open(&root))
            .map_err(|e| {
                let filename = root.to_string_lossy().into_owned();
                match e.raw_os_error() {
                    Some(errno) => PyOSError::new_err((errno, format!("open: {e}"), filename)),
                    None => PyOSError::new_err(format!("open {filename}: {e}")),
                }
            })?;
        Ok(PyBlobDir { inner })
    }

    /// Indexes (into `keys`) of the keys that are not there.
    fn missing(&self, py: Python<'_>, keys: Vec<String>) -> PyResult<Vec<usize>> {
        py.allow_threads(|| self.inner.missing(&keys))
            .map_err(blob_error)
    }

    /// Per item whether it was written; one filesystem sync when any was.
    fn put_many(
        &self,
        py: Python<'_>,
        items: Vec<(String, Bound<'_, PyBytes>)>,
    ) -> PyResult<Vec<bool>> {
        // bytes are immutable and the Bound values keep them alive while the
        // GIL is released, so borrowing their buffers is sound.
        let borrowed: Vec<(String, &[u8])> = items
            .iter()
            .map(|(key, data)| (key.clone(), data.as_bytes()))
            .collect();
        py.allow_threads(|| self.inner.put_many(&borrowed))
            .map_err(blob_error)
    }

    /// Stream a verified file into `key` unless it exists; durable when it
    /// returns True. Raises FileChangedError (the file is not what the scan
    /// hashed: nothing was stored), ScanCancelled, OSError.
    #[pyo3(signature = (key, reader, cancel=None))]
    fn put_verified(
        &self,
        py: Python<'_>,
        key: String,
        reader: &PyVerifyingReader,
        cancel: Option<&Bound<'_, CancelToken>>,
    ) -> PyResult<bool> {
        let cancel = cancel_of(cancel);
        put_file(py, reader, |r| self.inner.put_verified(&key, r, &cancel))
    }

    /// Stream an unhashed reader's file (``VerifyingReader.open_unhashed``)
    /// into the directory of the key ``beside``, named by the digest its bytes
    /// had: (that key, whether written). Durable on return. Raises as
    /// ``put_verified``.
    /// ``unless_beside``: when ``beside`` exists, nothing is read and
    /// ``(beside, False)`` comes back.
    #[pyo3(signature = (beside, reader, cancel=None, unless_beside=false))]
    fn put_learned(
        &self,
        py: Python<'_>,
        beside: String,
        reader: &PyVerifyingReader,
        cancel: Option<&Bound<'_, CancelToken>>,
        unless_beside: bool,
    ) -> PyResult<(String, bool)> {
        let cancel = cancel_of(cancel);
        put_file(py, reader, |r| {
            self.inner.put_learned(&beside, unless_beside, r, &cancel)
        })
    }

    /// Each key's bytes, None for a missing key.
    fn get_many(&self, py: Python<'_>, keys: Vec<String>) -> PyResult<Vec<Option<Py<PyBytes>>>> {
        let fetched = py
            .allow_threads(|| self.inner.get_many(&keys))
            .map_err(blob_error)?;
        Ok(fetched
            .into_iter()
            .map(|f| match f {
                Fetched::Bytes(data) => Some(PyBytes::new(py, &data).unbind()),
                Fetched::Missing => None,
            })
            .collect())
    }
}

/// Run a put of the reader's file, GIL released: the reader's failure as its
/// exception (FileChangedError...), the blob directory's as OSError.
fn put_file<T: Send>(
    py: Python<'_>,
    reader: &PyVerifyingReader,
    put: impl FnOnce(&mut VerifyingReader) -> Result<T, PutFileError> + Send,
) -> PyResult<T> {
    let mut failure = None;
    let done = reader.with_reader(py, |r| match put(r) {
        Ok(done) => Ok(Some(done)),
        Err(PutFileError::Read(e)) => Err(e),
        Err(PutFileError::Blob(e)) => {
            failure = Some(e);
            Ok(None)
        }
    })?;
    match (done, failure) {
        (Some(done), _) => Ok(done),
        (None, Some(e)) => Err(blob_error(e)),
        (None, None) => unreachable!("a put either wrote, found, or failed"),
    }
}
