//! `scan`: own the inputs, release the GIL, run the core,
//! hand the manifest back as one `bytes`.

use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};

use super::args;
use super::bytes::{moved_into_bytes, uninit_bytes};
use super::cancel::run_released;
use super::errors::to_py;
use super::keywords::{cancel_token, ScanArgs, TreeArgs};
use super::recycle::{self, Purpose};
use crate::error::ScanError;
use crate::scan::{self as core, ScanOutput, ScanRequest};
use crate::walk;

/// Counters a running scan publishes (entries seen, files hashed, bytes
/// hashed): give one to `scan(progress=...)` and read `snapshot()` from another
/// thread while it runs (relaxed atomics: cheap, each count monotone).
#[pyclass(module = "checkpointd._native", name = "ScanProgress", frozen)]
#[derive(Default)]
pub struct PyScanProgress {
    pub inner: std::sync::Arc<walk::ScanProgress>,
}

#[pymethods]
impl PyScanProgress {
    #[new]
    fn new() -> Self {
        PyScanProgress::default()
    }

    /// `(entries_seen, files_hashed, bytes_hashed)` so far.
    fn snapshot(&self) -> (u64, u64, u64) {
        self.inner.snapshot()
    }
}

#[pyclass(module = "checkpointd._native", frozen)]
pub struct ScanResult {
    #[pyo3(get)]
    manifest: Py<PyBytes>,
    #[pyo3(get)]
    unsupported: Py<PyList>,
    #[pyo3(get)]
    entries: u64,
    #[pyo3(get)]
    files_hashed: u64,
    #[pyo3(get)]
    files_reused: u64,
    #[pyo3(get)]
    bytes_hashed: u64,
    #[pyo3(get)]
    files_with_secrets: u64,
    #[pyo3(get)]
    phases_ms: Py<PyDict>,
    /// The distinct file digests, sorted, 32 bytes each.
    #[pyo3(get)]
    digests: Py<PyBytes>,
    /// Each digest's count of references, `u32` little-endian (empty with
    /// the digests).
    #[pyo3(get)]
    digest_counts: Py<PyBytes>,
    /// The manifest's fingerprint (BLAKE3 of its bytes), when the scan
    /// worked it out.
    #[pyo3(get)]
    fingerprint: Option<Py<PyBytes>>,
    /// The manifest is the previous one (`manifest` and `digests` are empty).
    #[pyo3(get)]
    same_as_previous: bool,
    #[pyo3(get)]
    file_count: u64,
    #[pyo3(get)]
    file_bytes: u64,
    #[pyo3(get)]
    dirs_listed: u64,
    #[pyo3(get)]
    dirs_reused: u64,
    #[pyo3(get)]
    manifest_witnessed: bool,
    #[pyo3(get)]
    policy_warnings: Vec<(&'static str, String, String)>,
    /// "journal" (directed by a journal ticket) or "full".
    #[pyo3(get)]
    scan_mode: &'static str,
    /// Why a scan given a journal ticket scanned everything after all.
    #[pyo3(get)]
    fallback: Option<String>,
    /// Entries stat'ed plus directories listed.
    #[pyo3(get)]
    entries_examined: u64,
    /// A journal scan's delta from the parent (the store's encoding) and the
    /// rows it inserts; None otherwise.
    #[pyo3(get)]
    delta: Option<(Py<PyBytes>, usize)>,
}

#[pymethods]
impl ScanResult {
    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "ScanResult(entries={}, files_hashed={}, files_reused={}, bytes_hashed={}, unsupported={})",
            self.entries,
            self.files_hashed,
            self.files_reused,
            self.bytes_hashed,
            self.unsupported.bind(py).len()
        )
    }
}

/// The scan's manifest buffer: the buffer of a new Python bytes object of the
/// exact length, written by the scan's threads without the GIL and handed to
/// Python as is (a million entries are ~180 MB: no second copy is made).
#[derive(Default)]
struct PyBytesBuffer {
    object: Option<Py<PyBytes>>,
    previous: Option<core::Previous>,
    /// The scan found the previous manifest: nothing was allocated.
    kept_previous: bool,
}

impl core::ManifestBuffer for PyBytesBuffer {
    fn previous(&self) -> Option<core::Previous> {
        self.previous
    }

    fn keep_previous(&mut self) {
        self.kept_previous = true;
    }

    fn allocate(&mut self, len: usize) -> std::io::Result<&mut [u8]> {
        let (object, data) = Python::with_gil(|py| {
            // (A full scan's manifest grows beside the entries it encodes:
            // the kept buffers nobody holds go first.)
            recycle::release_unheld(py);
            uninit_bytes(py, len).map(|(bytes, data)| (bytes.unbind(), data))
        })
        .map_err(out_of_memory)?;
        Ok(self.hold(object, data, len))
    }

    fn allocate_whole(&mut self, len: usize) -> std::io::Result<&mut [u8]> {
        let (object, data, resident) =
            Python::with_gil(|py| recycle::whole_bytes(py, len, Purpose::Manifest))
                .map_err(out_of_memory)?;
        let buffer = self.hold(object, data, len);
        if !resident {
            core::populate(buffer);
        }
        Ok(buffer)
    }
}

impl PyBytesBuffer {
    /// Keep `object`, whose buffer `data` holds `len` bytes, and lend it.
    fn hold(&mut self, object: Py<PyBytes>, data: *mut u8, len: usize) -> &mut [u8] {
        self.object = Some(object);
        // SAFETY: the buffer of the bytes object held in `self.object` (alive
        // while `self` is borrowed); no Python code sees that object until
        // the scan has returned, so this is its only writer and reader.
        unsafe { std::slice::from_raw_parts_mut(data, len) }
    }
}

fn out_of_memory(error: PyErr) -> std::io::Error {
    drop(error);
    std::io::Error::from(std::io::ErrorKind::OutOfMemory)
}

/// How a scan went: the journal's word on it (see `Scanned`).
struct Scanned {
    out: ScanOutput,
    mode: &'static str,
    fallback: Option<String>,
    examined: u64,
    delta: Option<(Vec<u8>, usize)>,
}

impl Scanned {
    fn full(out: ScanOutput, fallback: Option<String>) -> Scanned {
        // Every entry kept was stat'ed, every directory not reused was read.
        let examined = out.entries + out.dirs_listed - out.dirs_reused;
        Scanned {
            out,
            mode: "full",
            fallback,
            examined,
            delta: None,
        }
    }
}

fn to_result(
    py: Python<'_>,
    scanned: Scanned,
    manifest: PyBytesBuffer,
    policy_warnings: Vec<(&'static str, String, String)>,
) -> PyResult<ScanResult> {
    let Scanned {
        mut out,
        mode,
        fallback,
        examined,
        delta,
    } = scanned;
    let unsupported = PyList::empty(py);
    for (path, kind) in &out.unsupported {
        // Non-UTF-8 names come back as os.fsdecode would give them.
        let raw = PyBytes::new(py, path);
        let text = raw.call_method1("decode", ("utf-8", "surrogateescape"))?;
        let pair = PyTuple::new(py, [text, PyString::new(py, kind.as_str()).into_any()])?;
        unsupported.append(pair)?;
    }
    let phases_ms = PyDict::new(py);
    for (name, ms) in &out.phases_ms {
        phases_ms.set_item(*name, *ms)?;
    }
    Ok(ScanResult {
        phases_ms: phases_ms.unbind(),
        same_as_previous: manifest.kept_previous,
        manifest: match manifest.object {
            Some(object) => object,
            None => moved_into_bytes(py, std::mem::take(&mut out.manifest))?.unbind(),
        },
        // (A directed scan's are as large as a full scan's: see `recycle`.)
        digests: match mode {
            "journal" => recycle::copied_bytes(py, &out.digests, Purpose::Digests)?,
            _ => PyBytes::new(py, &out.digests).unbind(),
        },
        digest_counts: PyBytes::new(py, &out.digest_counts).unbind(),
        fingerprint: out.fingerprint.map(|f| PyBytes::new(py, &f).unbind()),
        file_count: out.file_count,
        file_bytes: out.file_bytes,
        dirs_listed: out.dirs_listed,
        dirs_reused: out.dirs_reused,
        manifest_witnessed: out.manifest_witnessed,
        unsupported: unsupported.unbind(),
        entries: out.entries,
        files_hashed: out.files_hashed,
        files_reused: out.files_reused,
        bytes_hashed: out.bytes_hashed,
        files_with_secrets: out.files_with_secrets,
        policy_warnings,
        scan_mode: mode,
        fallback,
        entries_examined: examined,
        delta: delta.map(|(ops, added)| (PyBytes::new(py, &ops).unbind(), added)),
    })
}

/// A journal ticket, the parent manifest, its totals and (when known) its
/// digests and their counts.
type Journaled<'a> = (
    &'a crate::journal::Ticket,
    &'a [u8],
    (u64, u64, u64),
    Option<(&'a [u8], &'a [u8])>,
);

/// A journal ticket with the parent manifest, its totals and its digests,
/// held for a directed scan (see [`Journaled`]).
type HeldJournal = (
    crate::journal::Ticket,
    Held,
    (u64, u64, u64),
    Option<(Held, Held)>,
);

/// A bytes object read in place while the scan runs without the GIL (a
/// million-entry parent is ~180 MB): held until then, and bytes never change.
struct Held {
    _object: Py<PyBytes>,
    at: usize,
    len: usize,
}

impl Held {
    fn of(bytes: Bound<'_, PyBytes>) -> Held {
        let (at, len) = (bytes.as_bytes().as_ptr() as usize, bytes.as_bytes().len());
        Held {
            _object: bytes.unbind(),
            at,
            len,
        }
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: the buffer of the bytes object `_object` keeps alive;
        // bytes objects are immutable.
        unsafe { std::slice::from_raw_parts(self.at as *const u8, self.len) }
    }
}

/// A scan the journal's `ticket` directs, relative to `parent` (the
/// manifest the ticket's changes are relative to, and its totals); when the
/// changes cannot be applied consistently, the full scan, saying why.
fn directed(
    request: &ScanRequest,
    root: core::Root,
    manifest: &mut PyBytesBuffer,
    journal: Journaled<'_>,
) -> Result<Scanned, ScanError> {
    use crate::journal::scan::{self as jscan, Outcome};
    let (ticket, parent, parent_totals, parent_digests) = journal;
    let again = core::Root {
        path: root.path.clone(),
        fd: root
            .fd
            .try_clone()
            .map_err(|e| ScanError::io(&root.path, "dup", e))?,
        forms: root.forms.clone(),
    };
    let directed = jscan::Request {
        scan: request,
        parent,
        parent_totals,
        dirty: &ticket.dirty,
        linked: &ticket.linked,
        parent_digests,
    };
    let outcome = {
        // Closed however it ends, unless the full scan takes over the feed.
        let mut closing = crate::feed::CloseOnDrop(request.feed.as_deref());
        let outcome = jscan::scan(&directed, root, manifest);
        if matches!(outcome, Ok(Outcome::Fallback(_))) {
            closing.0 = None;
        }
        outcome?
    };
    match outcome {
        Outcome::Done {
            out,
            same,
            examined,
            delta,
        } => {
            manifest.kept_previous = same;
            Ok(Scanned {
                out: *out,
                mode: "journal",
                fallback: None,
                examined,
                delta,
            })
        }
        Outcome::Fallback(reason) => {
            let out = core::scan_into(request, again, manifest)?;
            Ok(Scanned::full(out, Some(reason)))
        }
    }
}

/// See `_native.pyi` for the keywords. Raises OSError, ValueError, ScanCancelled.
#[pyfunction]
#[pyo3(signature = (root, **options))]
pub fn scan(
    py: Python<'_>,
    root: PathBuf,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<ScanResult> {
    let ScanArgs {
        tree:
            TreeArgs {
                policy,
                secrets,
                cache_path,
                cancel,
                chunk_threshold,
                chunk_average,
            },
        threads,
        feed,
        root_fd,
        progress,
        previous_length,
        previous_fingerprint,
        journal,
        parent,
        parent_totals,
        parent_digests,
    } = ScanArgs::of(options)?;
    let held = dup_root_fd(&root, root_fd)?;
    let policy = policy.matcher()?;
    let policy_warnings = super::policy::warning_tuples(policy.warnings());
    let cancel = cancel_token(cancel.as_ref());
    let request = ScanRequest {
        root,
        policy,
        secrets: args::secrets(secrets.as_ref())?,
        cache_path,
        threads,
        cancel: cancel.clone(),
        feed: feed.as_ref().map(|f| f.get().inner.clone()),
        progress: progress.as_ref().map(|p| p.get().inner.clone()),
        keep_cache: false,
        chunks: super::args::chunk_params(chunk_threshold, chunk_average)?,
    };
    let previous = previous_of(
        previous_length,
        previous_fingerprint.as_ref().map(|f| f.as_bytes()),
    )?;
    // A journal ticket directs the scan relative to the parent manifest.
    let journal = match (journal.as_ref(), parent, parent_totals) {
        (Some(ticket), Some(parent), Some(totals)) => Some((
            ticket.get().ticket()?,
            Held::of(parent),
            totals,
            parent_digests.map(|(digests, counts)| (Held::of(digests), Held::of(counts))),
        )),
        (None, _, _) => None,
        _ => {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "a journal ticket needs the parent manifest and its totals",
            ))
        }
    };
    let (out, manifest) = run_released(py, &cancel, move || {
        let mut manifest = PyBytesBuffer {
            previous,
            ..PyBytesBuffer::default()
        };
        let out = run_scan(&request, held, journal.as_ref(), &mut manifest);
        (out, manifest)
    })?;
    // (What the scan freed goes back to the system once its records are
    // freed, off this thread: see `scan::free_later`.)
    to_result(py, out.map_err(to_py)?, manifest, policy_warnings)
}

/// The scan `scan` runs without the GIL: of `held` (a sub-root's fd) or of
/// the root it opens, directed by `journal` when given.
fn run_scan(
    request: &ScanRequest,
    held: Option<std::os::fd::OwnedFd>,
    journal: Option<&HeldJournal>,
    manifest: &mut PyBytesBuffer,
) -> Result<Scanned, ScanError> {
    let root = match held {
        Some(fd) => Ok(core::Root::from_fd(fd, request.root.clone())),
        None => core::Root::open(&request.root),
    };
    root.and_then(|root| match journal {
        Some((ticket, parent, totals, digests)) => {
            let known = digests.as_ref().map(|(d, c)| (d.bytes(), c.bytes()));
            directed(
                request,
                root,
                manifest,
                (ticket, parent.bytes(), *totals, known),
            )
        }
        None => core::scan_into(request, root, manifest).map(|o| Scanned::full(o, None)),
    })
}

/// A sub-root the caller opened fd by fd from the workspace root: scanned
/// through (a duplicate of) that fd, `root` only names it.
fn dup_root_fd(
    root: &std::path::Path,
    root_fd: Option<std::os::fd::RawFd>,
) -> PyResult<Option<std::os::fd::OwnedFd>> {
    let Some(fd) = root_fd else {
        return Ok(None);
    };
    // SAFETY: the caller keeps `fd` open for the call; we only dup it.
    let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    let owned = borrowed
        .try_clone_to_owned()
        .map_err(|e| to_py(ScanError::io(root, "dup", e)))?;
    Ok(Some(owned))
}

/// The manifest the scan is expected to equal, by its length and fingerprint.
fn previous_of(
    previous_length: Option<usize>,
    previous_fingerprint: Option<&[u8]>,
) -> PyResult<Option<core::Previous>> {
    match (previous_length, previous_fingerprint) {
        (Some(len), Some(fingerprint)) => Ok(Some(core::Previous {
            len,
            fingerprint: fingerprint.try_into().map_err(|_| {
                pyo3::exceptions::PyValueError::new_err("previous_fingerprint must be 32 bytes")
            })?,
        })),
        (None, None) => Ok(None),
        _ => Err(pyo3::exceptions::PyValueError::new_err(
            "previous_length and previous_fingerprint go together",
        )),
    }
}

/// Give freed heap back to the system when it is a lot
/// (`scan::release_freed_memory`, which every scan also calls once its records are freed):
/// a capture of a large workspace calls it when it ends, after Python has
/// dropped what it read (a million-entry parent's row), so a daemon does not
/// carry it into the next scan.
#[pyfunction]
pub fn release_freed_memory(py: Python<'_>) {
    py.allow_threads(core::release_freed_memory)
}
