//! `PolicyMatcher`: the core policy, compiled once, callable from Python.

use pyo3::prelude::*;

use super::args;
use super::errors::to_py;
use crate::error::ScanError;
use crate::policy;

#[pyclass(module = "checkpointd._native", frozen, name = "PolicyMatcher")]
pub struct PyPolicyMatcher {
    pub inner: policy::PolicyMatcher,
}

#[pymethods]
impl PyPolicyMatcher {
    /// Raises ValueError for an entry that cannot be one gitignore line.
    #[new]
    #[pyo3(signature = (exclude, include, default_excludes))]
    fn new(
        exclude: &Bound<'_, PyAny>,
        include: &Bound<'_, PyAny>,
        default_excludes: bool,
    ) -> PyResult<Self> {
        let exclude = args::patterns(Some(exclude))?;
        let include = args::patterns(Some(include))?;
        let inner = policy::PolicyMatcher::new(&exclude, &include, default_excludes)
            .map_err(|e| to_py(ScanError::Pattern(e)))?;
        Ok(PyPolicyMatcher { inner })
    }

    /// `(list, pattern, reason)` for each line git accepts but that never
    /// matches (or holds a reversed range).
    #[getter]
    fn warnings(&self) -> Vec<(&'static str, String, String)> {
        warning_tuples(self.inner.warnings())
    }

    fn selects(&self, path: &str, is_dir: bool) -> bool {
        self.inner.selects(path, is_dir)
    }

    fn excluded(&self, path: &str, is_dir: bool) -> bool {
        self.inner.excluded(path, is_dir)
    }

    fn included(&self, path: &str, is_dir: bool) -> bool {
        self.inner.included(path, is_dir)
    }
}

/// The policy's warnings as plain tuples (no Python class only for this).
pub fn warning_tuples(warnings: &[policy::PatternWarning]) -> Vec<(&'static str, String, String)> {
    warnings
        .iter()
        .map(|w| (w.list, w.pattern.clone(), w.reason.clone()))
        .collect()
}
