//! The one Rust → Python error map of the extension: every core error
//! ([`ScanError`], [`RestoreError`], [`PackError`]) becomes a [`NativeError`]
//! and [`to_py`] gives each case its exception.
//!
//! Each [`ErrorKind`] has its own exception class, so Python never has to
//! re-interpret a bare `OSError`: `FileChangedError`, `RootInvalidError`,
//! `NameTooLongError`, `NoSpaceError`, `CrossDeviceError` and
//! `PermissionDeniedError` subclass `OSError` (`RootInvalidError` subclasses
//! `NotADirectoryError`), with `errno`, `strerror` and `filename` set, so code
//! that catches `OSError` keeps working;
//! `checkpointd.errors.from_os_error` maps each to one checkpointd code.

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyNotADirectoryError, PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyType;

use crate::error::{errno_kind, ErrorKind, ScanError};
use crate::hash::to_hex;
use crate::pack::PackError;
use crate::restore::RestoreError;

create_exception!(
    checkpointd._native,
    ScanCancelled,
    PyException,
    "Raised by `scan` when its `CancelToken` was cancelled."
);
create_exception!(
    checkpointd._native,
    FileChangedError,
    PyOSError,
    "A file changed, vanished or changed kind while it was read."
);
create_exception!(
    checkpointd._native,
    RootInvalidError,
    PyNotADirectoryError,
    "The workspace root is missing, not a directory, or a symlink."
);
create_exception!(
    checkpointd._native,
    NameTooLongError,
    PyOSError,
    "A name or path is longer than the filesystem allows (ENAMETOOLONG)."
);
create_exception!(
    checkpointd._native,
    NoSpaceError,
    PyOSError,
    "The filesystem or quota is full (ENOSPC, EDQUOT)."
);
create_exception!(
    checkpointd._native,
    CrossDeviceError,
    PyOSError,
    "A rename or link across filesystems (EXDEV)."
);
create_exception!(
    checkpointd._native,
    PermissionDeniedError,
    PyOSError,
    "Permission denied or a read-only filesystem (EACCES, EPERM, EROFS)."
);
create_exception!(
    checkpointd._native,
    TargetRefused,
    PyValueError,
    "A target path restore refuses before any change: args are (reason code, path, message), \
     the code \"invalid-path\" or \"name-too-long\"."
);
create_exception!(
    checkpointd._native,
    InvalidBlob,
    PyValueError,
    "A blob is not what the checkpoint records: args are (64-hex digest, reason)."
);
create_exception!(
    checkpointd._native,
    PackedBlobInvalid,
    PyValueError,
    "A packed blob does not decode to its key: args are (64-hex digest, reason)."
);
create_exception!(
    checkpointd._native,
    PackInvalid,
    PyValueError,
    "A pack object's header, trailer or footer is damaged: args are (reason,)."
);

/// Add every exception class of this map, and [`errno_error`], to the module.
pub fn add_to(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("ScanCancelled", py.get_type::<ScanCancelled>())?;
    m.add("FileChangedError", py.get_type::<FileChangedError>())?;
    m.add("RootInvalidError", py.get_type::<RootInvalidError>())?;
    m.add("NameTooLongError", py.get_type::<NameTooLongError>())?;
    m.add("NoSpaceError", py.get_type::<NoSpaceError>())?;
    m.add("CrossDeviceError", py.get_type::<CrossDeviceError>())?;
    m.add(
        "PermissionDeniedError",
        py.get_type::<PermissionDeniedError>(),
    )?;
    m.add("TargetRefused", py.get_type::<TargetRefused>())?;
    m.add("InvalidBlob", py.get_type::<InvalidBlob>())?;
    m.add("PackedBlobInvalid", py.get_type::<PackedBlobInvalid>())?;
    m.add("PackInvalid", py.get_type::<PackInvalid>())?;
    m.add_function(wrap_pyfunction!(errno_error, m)?)
}

/// Any error of the core, as the binding raises it (see [`to_py`]).
pub enum NativeError {
    Scan(ScanError),
    Restore(RestoreError),
    Pack(PackError),
}

impl From<ScanError> for NativeError {
    fn from(e: ScanError) -> Self {
        NativeError::Scan(e)
    }
}

impl From<RestoreError> for NativeError {
    fn from(e: RestoreError) -> Self {
        NativeError::Restore(e)
    }
}

impl From<PackError> for NativeError {
    fn from(e: PackError) -> Self {
        NativeError::Pack(e)
    }
}

/// An OSError of the class for `kind`, built as `Class(errno, message, filename)`.
fn os_error(kind: ErrorKind, errno: i32, message: String, filename: String) -> PyErr {
    let args = (errno, message, filename);
    match kind {
        ErrorKind::FileChanged => FileChangedError::new_err(args),
        ErrorKind::RootInvalid => RootInvalidError::new_err(args),
        ErrorKind::NameTooLong => NameTooLongError::new_err(args),
        ErrorKind::NoSpace => NoSpaceError::new_err(args),
        ErrorKind::CrossDevice => CrossDeviceError::new_err(args),
        ErrorKind::PermissionDenied => PermissionDeniedError::new_err(args),
        // OSError(errno, ...) picks the matching builtin subclass (FileNotFoundError, ...).
        _ => PyOSError::new_err(args),
    }
}

/// See `_native.pyi`: the class of the OSError this module raises for
/// `errno`, so Python classes its own OSErrors by the one errno table
/// ([`errno_kind`]).
#[pyfunction]
pub fn errno_error(py: Python<'_>, errno: i32) -> Bound<'_, PyType> {
    os_error(errno_kind(errno), errno, String::new(), String::new()).get_type(py)
}

/// A core error → the exception the `.pyi` promises.
pub fn to_py(error: impl Into<NativeError>) -> PyErr {
    use NativeError::{Pack, Restore, Scan};
    match error.into() {
        Scan(
            ref e @ ScanError::Io {
                ref path,
                op,
                ref source,
            },
        ) => {
            let filename = path.to_string_lossy().into_owned();
            let errno = source.raw_os_error().unwrap_or(libc::EIO);
            os_error(e.kind(), errno, format!("{op}: {source}"), filename)
        }
        Scan(ScanError::Pattern(e)) => PyValueError::new_err(e.to_string()),
        Scan(ScanError::ShortSecret(e)) => PyValueError::new_err(e.to_string()),
        Scan(
            ref e @ (ScanError::RootNotDirectory(ref path) | ScanError::RootIsSymlink(ref path)),
        ) => {
            let filename = path.to_string_lossy().into_owned();
            os_error(e.kind(), libc::ENOTDIR, e.to_string(), filename)
        }
        Scan(ref e @ ScanError::Changed(ref path)) => {
            let filename = path.to_string_lossy().into_owned();
            os_error(e.kind(), libc::EAGAIN, e.to_string(), filename)
        }
        Scan(ScanError::Cancelled) => ScanCancelled::new_err("scan cancelled"),
        // A restore's I/O error is a plain OSError (the builtin subclass of its errno).
        Restore(RestoreError::Io { path, op, source }) => {
            let message = format!("{op}: {source}");
            match source.raw_os_error() {
                Some(errno) => PyOSError::new_err((errno, message, path)),
                None => PyOSError::new_err(format!("{message}: {path}")),
            }
        }
        Restore(RestoreError::InvalidBlob { hash, reason }) => {
            InvalidBlob::new_err((to_hex(&hash), reason))
        }
        Restore(
            ref e @ RestoreError::Subdir {
                ref subdir,
                ref source,
            },
        ) => {
            let errno = source.raw_os_error().unwrap_or(libc::ENOTDIR);
            PyOSError::new_err((errno, e.to_string(), subdir.clone()))
        }
        Restore(RestoreError::Manifest(m)) => PyValueError::new_err(m),
        Restore(ref e @ RestoreError::InvalidPath { ref path, .. }) => {
            TargetRefused::new_err(("invalid-path", path.clone(), e.to_string()))
        }
        Restore(ref e @ RestoreError::NameTooLong { ref path, .. }) => {
            TargetRefused::new_err(("name-too-long", path.clone(), e.to_string()))
        }
        Restore(
            ref e @ RestoreError::Changed {
                ref path,
                ref source,
                ..
            },
        ) => {
            let errno = source.raw_os_error().unwrap_or(libc::EAGAIN);
            FileChangedError::new_err((errno, e.to_string(), path.clone()))
        }
        Restore(RestoreError::Scan(e)) => to_py(e),
        Restore(RestoreError::Cancelled) => ScanCancelled::new_err("restore cancelled"),
        Pack(PackError::Blob { digest, reason }) => {
            PackedBlobInvalid::new_err((to_hex(&digest), reason))
        }
        Pack(PackError::Pack(reason)) => PackInvalid::new_err((reason,)),
        Pack(e @ PackError::TooLarge(_)) => PyValueError::new_err(e.to_string()),
    }
}

/// An `std::io::Error` on `path` as a Python OSError (for the small helpers).
pub fn io_to_py(path: &str, op: &'static str, error: std::io::Error) -> PyErr {
    to_py(ScanError::io(path, op, error))
}
