//! `BlobFeed` (see `crate::feed`): small files' zeroed bytes, and the open
//! files of larger ones, from the scan to the upload (each read once).

use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::PyBytes;

use super::errors::to_py;
use super::verify::PyVerifyingReader;
use crate::feed::{Batch, BlobFeed, Next, NextFile, Skip};
use crate::verify::VerifyingReader;

/// `(digest, zeroed bytes)` pairs, as Python sees a batch.
type PyBatch = Vec<(Py<PyBytes>, Py<PyBytes>)>;

#[pyclass(module = "checkpointd._native", name = "BlobFeed", frozen)]
pub struct PyBlobFeed {
    pub inner: Arc<BlobFeed>,
}

impl PyBlobFeed {
    fn next(&self, py: Python<'_>) -> PyResult<Option<FedBatch>> {
        loop {
            let inner = self.inner.clone();
            match py.allow_threads(move || inner.next_batch(Duration::from_millis(100))) {
                Next::Done => return Ok(None),
                Next::Batch(items) => return Ok(Some(FedBatch::new(items))),
                Next::Waiting => py.check_signals()?,
            }
        }
    }
}

/// One batch of the feed as the scan made it: `(digest, zeroed bytes)` per
/// small file, and the digests concatenated in that order (see `_native.pyi`).
#[pyclass(module = "checkpointd._native", name = "FedBatch", frozen)]
pub struct FedBatch {
    pub items: Batch,
    digests: Vec<u8>,
}

impl FedBatch {
    fn new(items: Batch) -> FedBatch {
        let digests = items.iter().flat_map(|f| f.digest).collect();
        FedBatch { items, digests }
    }

    /// Each blob's digest and raw bytes (its frame decoded and checked):
    /// for uploads that store blobs whole, not in packs.
    fn pairs(&self, py: Python<'_>) -> PyResult<PyBatch> {
        self.items
            .iter()
            .map(|frame| {
                let raw = frame.decode().map_err(to_py)?;
                Ok((
                    PyBytes::new(py, &frame.digest).unbind(),
                    PyBytes::new(py, &raw).unbind(),
                ))
            })
            .collect()
    }
}

#[pymethods]
impl FedBatch {
    /// The digests, 32 bytes each, in the batch's order.
    #[getter]
    fn digests<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.digests)
    }

    fn __len__(&self) -> usize {
        self.items.len()
    }

    /// `[(digest, bytes), ...]`, as `next_batch` gives them.
    fn items(&self, py: Python<'_>) -> PyResult<PyBatch> {
        self.pairs(py)
    }
}

#[pymethods]
impl PyBlobFeed {
    #[new]
    #[pyo3(signature = (capacity_bytes, max_file_bytes, skip=None, max_held_files=16))]
    fn new(
        capacity_bytes: usize,
        max_file_bytes: usize,
        skip: Option<PyBackedBytes>,
        max_held_files: usize,
    ) -> PyResult<Self> {
        if skip.as_ref().is_some_and(|s| s.len() % 32 != 0) {
            return Err(PyValueError::new_err(
                "skip must be concatenated 32-byte digests",
            ));
        }
        // Held, not copied: the bytes object stays alive with the feed.
        let skip: Skip = match skip {
            Some(skip) => Box::new(skip),
            None => Box::new(Vec::new()),
        };
        Ok(PyBlobFeed {
            inner: Arc::new(BlobFeed::new(
                capacity_bytes,
                max_file_bytes,
                skip,
                max_held_files,
            )),
        })
    }

    /// The next batch of `(digest, bytes)`; None once the scan ended and all
    /// batches were taken (or the feed was abandoned). Blocks, GIL released.
    fn next_batch(&self, py: Python<'_>) -> PyResult<Option<PyBatch>> {
        self.next(py)?.map(|batch| batch.pairs(py)).transpose()
    }

    /// `next_batch` kept native (a `FedBatch`): its bytes never become Python
    /// objects, and a `PackWriter` packs them straight from it.
    fn next_fed(&self, py: Python<'_>) -> PyResult<Option<FedBatch>> {
        self.next(py)
    }

    /// The next file too large to copy, open as the scan hashed it, as a
    /// `VerifyingReader`; None once the scan ended and every file was taken
    /// (or the feed was abandoned). Blocks, GIL released.
    fn next_file(&self, py: Python<'_>) -> PyResult<Option<PyVerifyingReader>> {
        loop {
            let inner = self.inner.clone();
            match py.allow_threads(move || inner.next_file(Duration::from_millis(100))) {
                NextFile::Done => return Ok(None),
                NextFile::File(held) => {
                    return Ok(Some(PyVerifyingReader::new(VerifyingReader::from_held(
                        held,
                    ))))
                }
                NextFile::Waiting => py.check_signals()?,
            }
        }
    }

    /// Open files handed over and not yet closed by the upload.
    #[getter]
    fn held_files(&self) -> usize {
        self.inner.held_files()
    }

    /// Stop consuming: queued bytes are freed and the scan never waits again.
    fn abandon(&self) {
        self.inner.abandon();
    }
}
