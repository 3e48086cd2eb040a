//! The one Rust → Python error map of the extension.
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

/// ScanError → the exception the `.pyi` promises.
pub fn to_py(error: ScanError) -> PyErr {
    let kind = error.kind();
    match error {
        ScanError::Io { path, op, source } => {
            let message = format!("{op}: {source}");
            let filename = path.to_string_lossy().into_owned();
            let errno = source.raw_os_error().unwrap_or(libc::EIO);
            os_error(kind, errno, message, filename)
        }
        ScanError::Pattern(e) => PyValueError::new_err(e.to_string()),
        ScanError::ShortSecret(e) => PyValueError::new_err(e.to_string()),
        ScanError::RootNotDirectory(ref path) | ScanError::RootIsSymlink(ref path) => {
            let filename = path.to_string_lossy().into_owned();
            os_error(kind, libc::ENOTDIR, error.to_string(), filename)
        }
        ScanError::Changed(ref path) => {
            let filename = path.to_string_lossy().into_owned();
            os_error(kind, libc::EAGAIN, error.to_string(), filename)
        }
        ScanError::Cancelled => ScanCancelled::new_err("scan cancelled"),
    }
}

/// An `std::io::Error` on `path` as a Python OSError (for the small helpers).
pub fn io_to_py(path: &str, op: &'static str, error: std::io::Error) -> PyErr {
    to_py(ScanError::io(path, op, error))
}
