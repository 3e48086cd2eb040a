//! `Journal` and its `JournalTicket`: the change journal of a workspace
//! (`crate::journal`). A scan directed by a ticket is `scan(journal=...)`
//! (`py/scan.rs`).

use std::sync::Mutex;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::errors::io_to_py;
use super::keywords::JournalArgs;
use crate::journal::{self as core, Limits, Requested, Ticket};

/// What a capture took from the journal (see `Journal.take`). Given back
/// once with `Journal.commit` or `Journal.abort`.
#[pyclass(module = "checkpointd._native", name = "JournalTicket", frozen)]
pub struct PyTicket {
    pub inner: Mutex<Option<Ticket>>,
    /// Why the capture must scan everything (None: the journal may direct it).
    #[pyo3(get)]
    full: Option<String>,
    /// Events the journal had recorded when it was taken.
    #[pyo3(get)]
    generation: u64,
    /// Names and directories it holds.
    #[pyo3(get)]
    changes: usize,
}

#[pymethods]
impl PyTicket {
    /// What it holds: `(directory, names or None when listed whole, names
    /// walked whole, every subdirectory walked whole)`, in path order.
    #[allow(clippy::type_complexity)]
    fn directories(&self) -> PyResult<Vec<(String, Option<Vec<Vec<u8>>>, Vec<Vec<u8>>, bool)>> {
        let ticket = self.ticket()?;
        Ok(ticket
            .dirty
            .dirs
            .iter()
            .map(|(dir, c)| {
                (
                    dir.clone(),
                    c.names
                        .as_ref()
                        .map(|n| n.iter().map(|n| n.to_vec()).collect()),
                    c.deep.iter().map(|n| n.to_vec()).collect(),
                    c.all_deep,
                )
            })
            .collect())
    }
}

impl PyTicket {
    /// A copy of the ticket (ValueError once it was given back).
    pub fn ticket(&self) -> PyResult<Ticket> {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| PyValueError::new_err("this journal ticket was already given back"))
    }

    fn give_back(&self) -> PyResult<Ticket> {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(|| PyValueError::new_err("this journal ticket was already given back"))
    }
}

#[pyclass(module = "checkpointd._native", name = "Journal", frozen)]
pub struct PyJournal {
    inner: core::Journal,
}

fn os_error(e: std::io::Error) -> PyErr {
    if e.kind() == std::io::ErrorKind::Other {
        return PyRuntimeError::new_err(e.to_string());
    }
    io_to_py("<journal>", "journal", e)
}

#[pymethods]
impl PyJournal {
    /// Start watching `root` (see `_native.pyi`). Raises ValueError for a bad
    /// mode or pattern, OSError when the root cannot be opened.
    #[new]
    #[pyo3(signature = (root, mode="auto", **options))]
    fn new(
        py: Python<'_>,
        root: std::path::PathBuf,
        mode: &str,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let JournalArgs {
            policy,
            names_per_dir,
            dirs,
            bytes,
            linked_files,
        } = JournalArgs::of(options)?;
        let requested = Requested::parse(mode).ok_or_else(|| {
            PyValueError::new_err(format!(
                "watch mode {mode:?}: expected auto, fanotify, inotify or off"
            ))
        })?;
        let policy = policy.matcher()?;
        let defaults = Limits::default();
        let limits = Limits {
            names_per_dir: names_per_dir.unwrap_or(defaults.names_per_dir),
            dirs: dirs.unwrap_or(defaults.dirs),
            bytes: bytes.unwrap_or(defaults.bytes),
            multi_links: linked_files.unwrap_or(defaults.multi_links),
            ..defaults
        };
        let journal = py
            .allow_threads(|| core::Journal::start(&root, requested, policy, limits))
            .map_err(|e| io_to_py(&root.to_string_lossy(), "watch", e))?;
        Ok(PyJournal { inner: journal })
    }

    /// Take what changed since the last take (see `_native.pyi`).
    fn take(&self, py: Python<'_>) -> PyResult<PyTicket> {
        let ticket = py.allow_threads(|| self.inner.take()).map_err(os_error)?;
        Ok(PyTicket {
            full: ticket.full.clone(),
            generation: ticket.generation,
            changes: ticket.dirty.len(),
            inner: Mutex::new(Some(ticket)),
        })
    }

    fn commit(&self, py: Python<'_>, ticket: &Bound<'_, PyTicket>) -> PyResult<()> {
        let ticket = ticket.get().give_back()?;
        py.allow_threads(|| self.inner.commit(&ticket))
            .map_err(os_error)
    }

    fn abort(&self, py: Python<'_>, ticket: &Bound<'_, PyTicket>) -> PyResult<()> {
        let ticket = ticket.get().give_back()?;
        py.allow_threads(|| self.inner.abort(ticket))
            .map_err(os_error)
    }

    #[pyo3(signature = (reason, *, find_links=false))]
    fn distrust(&self, py: Python<'_>, reason: &str, find_links: bool) -> PyResult<()> {
        py.allow_threads(|| self.inner.distrust(reason, find_links))
            .map_err(os_error)
    }

    fn covers(&self, py: Python<'_>, path: &str) -> PyResult<bool> {
        py.allow_threads(|| self.inner.covers(path))
            .map_err(os_error)
    }

    fn status<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let status = py.allow_threads(|| self.inner.status()).map_err(os_error)?;
        let out = PyDict::new(py);
        out.set_item("mode", status.mode)?;
        out.set_item("detail", status.detail)?;
        out.set_item("untrusted", status.untrusted)?;
        out.set_item("generation", status.generation)?;
        out.set_item("pending", status.pending)?;
        out.set_item("idle_ms", status.idle_ms)?;
        out.set_item("pending_ms", status.pending_ms)?;
        out.set_item("events", status.events)?;
        out.set_item("overflows", status.overflows)?;
        out.set_item("watches", status.watches)?;
        out.set_item("linked_files", status.linked_files)?;
        out.set_item("ready", status.ready)?;
        Ok(out)
    }

    fn close(&self, py: Python<'_>) {
        py.allow_threads(|| self.inner.close())
    }
}

/// The paths whose rows differ between two manifests, at most `limit` (see
/// `_native.pyi`). Raises ValueError for a malformed manifest.
#[pyfunction]
pub fn journal_differences(
    py: Python<'_>,
    base: &[u8],
    now: &[u8],
    limit: usize,
) -> PyResult<Vec<String>> {
    py.allow_threads(|| crate::journal::verify::differences(base, now, limit))
        .map_err(PyValueError::new_err)
}
