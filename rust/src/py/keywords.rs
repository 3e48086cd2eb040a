//! Keyword arguments of the binding's larger calls (`scan`,
//! `RestoreSession`, `Journal`), documented in `_native.pyi`, read from
//! `**options` into one typed value per call: an unknown keyword is refused
//! and a value of the wrong type names its keyword, as Python does for any
//! function. The keywords they share are read in one place each: the policy
//! in [`PolicyArgs`], the rest of what a scan of the tree takes (secrets,
//! stat cache, cancel token, chunking) in [`TreeArgs`].

use std::os::fd::RawFd;
use std::path::PathBuf;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use super::cancel::CancelToken;
use super::errors::to_py;
use super::feed::PyBlobFeed;
use super::journal::PyTicket;
use super::scan::PyScanProgress;
use crate::error::ScanError;
use crate::policy::PolicyMatcher;

/// Give each keyword in `options` to `set`, which returns false for one
/// `function` does not take.
fn read<'py>(
    function: &str,
    options: Option<&Bound<'py, PyDict>>,
    mut set: impl FnMut(&str, &Bound<'py, PyAny>) -> PyResult<bool>,
) -> PyResult<()> {
    for (key, value) in options.into_iter().flat_map(|options| options.iter()) {
        let key: String = key.extract()?;
        match set(&key, &value) {
            Ok(true) => {}
            Ok(false) => {
                return Err(PyTypeError::new_err(format!(
                    "{function}() got an unexpected keyword argument '{key}'"
                )))
            }
            // A TypeError names the keyword; others (an OverflowError, say)
            // stay what they are.
            Err(error) if error.is_instance_of::<PyTypeError>(value.py()) => {
                return Err(PyTypeError::new_err(format!(
                    "argument '{key}': {}",
                    error.value(value.py())
                )))
            }
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

/// The policy's keywords (`scan`, `RestoreSession`, `Journal`).
pub struct PolicyArgs<'py> {
    pub exclude: Option<Bound<'py, PyAny>>,
    pub include: Option<Bound<'py, PyAny>>,
    pub default_excludes: bool,
}

impl Default for PolicyArgs<'_> {
    fn default() -> Self {
        PolicyArgs {
            exclude: None,
            include: None,
            default_excludes: true,
        }
    }
}

impl<'py> PolicyArgs<'py> {
    /// The policy these keywords give (ValueError for a bad pattern).
    pub fn matcher(&self) -> PyResult<PolicyMatcher> {
        PolicyMatcher::new(
            &super::args::patterns(self.exclude.as_ref())?,
            &super::args::patterns(self.include.as_ref())?,
            self.default_excludes,
        )
        .map_err(|e| to_py(ScanError::Pattern(e)))
    }

    fn set(&mut self, key: &str, value: &Bound<'py, PyAny>) -> PyResult<bool> {
        let given = (!value.is_none()).then(|| value.clone());
        match key {
            "exclude" => self.exclude = given,
            "include" => self.include = given,
            "default_excludes" => self.default_excludes = value.extract()?,
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// The keywords about the tree that `scan` and `RestoreSession` share.
pub struct TreeArgs<'py> {
    pub policy: PolicyArgs<'py>,
    pub secrets: Option<Bound<'py, PyAny>>,
    pub cache_path: Option<PathBuf>,
    pub cancel: Option<Bound<'py, CancelToken>>,
    pub chunk_threshold: Option<u64>,
    pub chunk_average: u32,
}

impl Default for TreeArgs<'_> {
    fn default() -> Self {
        TreeArgs {
            policy: PolicyArgs::default(),
            secrets: None,
            cache_path: None,
            cancel: None,
            chunk_threshold: None,
            chunk_average: crate::chunk::DEFAULT_AVG,
        }
    }
}

impl<'py> TreeArgs<'py> {
    fn set(&mut self, key: &str, value: &Bound<'py, PyAny>) -> PyResult<bool> {
        match key {
            "secrets" => self.secrets = (!value.is_none()).then(|| value.clone()),
            "cache_path" => self.cache_path = value.extract()?,
            "cancel" => self.cancel = value.extract()?,
            "chunk_threshold" => self.chunk_threshold = value.extract()?,
            "chunk_average" => self.chunk_average = value.extract()?,
            _ => return self.policy.set(key, value),
        }
        Ok(true)
    }
}

/// The call's cancel token (`cancel`; a new one when none was given).
pub fn cancel_token(cancel: Option<&Bound<'_, CancelToken>>) -> crate::cancel::Cancel {
    cancel.map(|c| c.get().inner.clone()).unwrap_or_default()
}

/// `scan`'s keywords.
#[derive(Default)]
pub struct ScanArgs<'py> {
    pub tree: TreeArgs<'py>,
    pub threads: usize,
    pub feed: Option<Bound<'py, PyBlobFeed>>,
    pub root_fd: Option<RawFd>,
    pub progress: Option<Bound<'py, PyScanProgress>>,
    pub previous_length: Option<usize>,
    pub previous_fingerprint: Option<Bound<'py, PyBytes>>,
    pub journal: Option<Bound<'py, PyTicket>>,
    pub parent: Option<Bound<'py, PyBytes>>,
    pub parent_totals: Option<(u64, u64, u64)>,
    pub parent_digests: Option<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)>,
}

impl<'py> ScanArgs<'py> {
    pub fn of(options: Option<&Bound<'py, PyDict>>) -> PyResult<Self> {
        let mut args = ScanArgs::default();
        read("scan", options, |key, value| args.set(key, value))?;
        Ok(args)
    }

    fn set(&mut self, key: &str, value: &Bound<'py, PyAny>) -> PyResult<bool> {
        match key {
            "threads" => self.threads = value.extract()?,
            "feed" => self.feed = value.extract()?,
            "root_fd" => self.root_fd = value.extract()?,
            "progress" => self.progress = value.extract()?,
            "previous_length" => self.previous_length = value.extract()?,
            "previous_fingerprint" => self.previous_fingerprint = value.extract()?,
            "journal" => self.journal = value.extract()?,
            "parent" => self.parent = value.extract()?,
            "parent_totals" => self.parent_totals = value.extract()?,
            "parent_digests" => self.parent_digests = value.extract()?,
            _ => return self.tree.set(key, value),
        }
        Ok(true)
    }
}

/// `RestoreSession`'s keywords.
#[derive(Default)]
pub struct RestoreArgs<'py> {
    pub tree: TreeArgs<'py>,
    pub subdir: String,
    pub secret_names: Option<Vec<String>>,
    pub plan_only: bool,
    pub keep_live: bool,
}

impl<'py> RestoreArgs<'py> {
    pub fn of(options: Option<&Bound<'py, PyDict>>) -> PyResult<Self> {
        let mut args = RestoreArgs::default();
        read("RestoreSession", options, |key, value| args.set(key, value))?;
        Ok(args)
    }

    fn set(&mut self, key: &str, value: &Bound<'py, PyAny>) -> PyResult<bool> {
        match key {
            "subdir" => self.subdir = value.extract()?,
            "secret_names" => self.secret_names = value.extract()?,
            "plan_only" => self.plan_only = value.extract()?,
            "keep_live" => self.keep_live = value.extract()?,
            _ => return self.tree.set(key, value),
        }
        Ok(true)
    }
}

/// `Journal`'s keywords: the policy and the journal's bounds (None: the default).
#[derive(Default)]
pub struct JournalArgs<'py> {
    pub policy: PolicyArgs<'py>,
    pub names_per_dir: Option<usize>,
    pub dirs: Option<usize>,
    pub bytes: Option<usize>,
    pub linked_files: Option<usize>,
}

impl<'py> JournalArgs<'py> {
    pub fn of(options: Option<&Bound<'py, PyDict>>) -> PyResult<Self> {
        let mut args = JournalArgs::default();
        read("Journal", options, |key, value| args.set(key, value))?;
        Ok(args)
    }

    fn set(&mut self, key: &str, value: &Bound<'py, PyAny>) -> PyResult<bool> {
        match key {
            "names_per_dir" => self.names_per_dir = value.extract()?,
            "dirs" => self.dirs = value.extract()?,
            "bytes" => self.bytes = value.extract()?,
            "linked_files" => self.linked_files = value.extract()?,
            _ => return self.policy.set(key, value),
        }
        Ok(true)
    }
}
