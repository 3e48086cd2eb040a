//! The keywords of `scan` (documented in `_native.pyi`), read from its
//! `**options` into one typed value: unknown ones are refused as Python
//! refuses them, and a value of the wrong type names its keyword.

use std::os::fd::RawFd;
use std::path::PathBuf;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use super::cancel::CancelToken;
use super::feed::PyBlobFeed;
use super::journal::PyTicket;
use super::scan::PyScanProgress;

pub struct ScanArgs<'py> {
    pub exclude: Option<Bound<'py, PyAny>>,
    pub include: Option<Bound<'py, PyAny>>,
    pub default_excludes: bool,
    pub secrets: Option<Bound<'py, PyAny>>,
    pub cache_path: Option<PathBuf>,
    pub threads: usize,
    pub cancel: Option<Bound<'py, CancelToken>>,
    pub feed: Option<Bound<'py, PyBlobFeed>>,
    pub root_fd: Option<RawFd>,
    pub progress: Option<Bound<'py, PyScanProgress>>,
    pub previous_length: Option<usize>,
    pub previous_fingerprint: Option<Bound<'py, PyBytes>>,
    pub chunk_threshold: Option<u64>,
    pub chunk_average: u32,
    pub journal: Option<Bound<'py, PyTicket>>,
    pub parent: Option<Bound<'py, PyBytes>>,
    pub parent_totals: Option<(u64, u64, u64)>,
    pub parent_digests: Option<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)>,
}

impl<'py> ScanArgs<'py> {
    /// The defaults `_native.pyi` documents, then each keyword given.
    pub fn of(options: Option<&Bound<'py, PyDict>>) -> PyResult<Self> {
        let mut args = ScanArgs {
            exclude: None,
            include: None,
            default_excludes: true,
            secrets: None,
            cache_path: None,
            threads: 0,
            cancel: None,
            feed: None,
            root_fd: None,
            progress: None,
            previous_length: None,
            previous_fingerprint: None,
            chunk_threshold: None,
            chunk_average: crate::chunk::DEFAULT_AVG,
            journal: None,
            parent: None,
            parent_totals: None,
            parent_digests: None,
        };
        for (key, value) in options.into_iter().flat_map(|options| options.iter()) {
            let key: String = key.extract()?;
            match args.set(&key, &value) {
                Ok(true) => {}
                Ok(false) => {
                    return Err(PyTypeError::new_err(format!(
                        "scan() got an unexpected keyword argument '{key}'"
                    )))
                }
                Err(error) => return Err(named(value.py(), &key, error)),
            }
        }
        Ok(args)
    }

    /// Set `key` to `value`; false for a keyword `scan` does not take.
    fn set(&mut self, key: &str, value: &Bound<'py, PyAny>) -> PyResult<bool> {
        let given = (!value.is_none()).then(|| value.clone());
        match key {
            "exclude" => self.exclude = given,
            "include" => self.include = given,
            "secrets" => self.secrets = given,
            "default_excludes" => self.default_excludes = value.extract()?,
            "cache_path" => self.cache_path = value.extract()?,
            "threads" => self.threads = value.extract()?,
            "cancel" => self.cancel = value.extract()?,
            "feed" => self.feed = value.extract()?,
            "root_fd" => self.root_fd = value.extract()?,
            "progress" => self.progress = value.extract()?,
            "previous_length" => self.previous_length = value.extract()?,
            "previous_fingerprint" => self.previous_fingerprint = value.extract()?,
            "chunk_threshold" => self.chunk_threshold = value.extract()?,
            "chunk_average" => self.chunk_average = value.extract()?,
            "journal" => self.journal = value.extract()?,
            "parent" => self.parent = value.extract()?,
            "parent_totals" => self.parent_totals = value.extract()?,
            "parent_digests" => self.parent_digests = value.extract()?,
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// A keyword's TypeError names the keyword (as for any Python function);
/// other errors (an OverflowError, say) stay what they are.
fn named(py: Python<'_>, key: &str, error: PyErr) -> PyErr {
    if error.is_instance_of::<PyTypeError>(py) {
        PyTypeError::new_err(format!("argument '{key}': {}", error.value(py)))
    } else {
        error
    }
}
