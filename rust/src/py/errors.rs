//! The one Rust → Python error map of the extension.

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyNotADirectoryError, PyOSError, PyValueError};
use pyo3::PyErr;

use crate::error::ScanError;

create_exception!(
    checkpointd._native,
    ScanCancelled,
    PyException,
    "Raised by `scan` when its `CancelToken` was cancelled."
);

/// ScanError → the exception the `.pyi` promises.
pub fn to_py(error: ScanError) -> PyErr {
    match error {
        ScanError::Io { path, op, source } => {
            let message = format!("{op}: {source}");
            let filename = path.to_string_lossy().into_owned();
            match source.raw_os_error() {
                // OSError(errno, ...) picks the matching subclass (FileNotFoundError, ...).
                Some(errno) => PyOSError::new_err((errno, message, filename)),
                None => PyOSError::new_err(format!("{message}: {filename}")),
            }
        }
        ScanError::Pattern(e) => PyValueError::new_err(e.to_string()),
        ScanError::ShortSecret(e) => PyValueError::new_err(e.to_string()),
        e @ ScanError::RootNotDirectory(_) | e @ ScanError::RootIsSymlink(_) => {
            let (ScanError::RootNotDirectory(path) | ScanError::RootIsSymlink(path)) = &e else {
                unreachable!()
            };
            let filename = path.to_string_lossy().into_owned();
            PyNotADirectoryError::new_err((libc::ENOTDIR, e.to_string(), filename))
        }
        e @ ScanError::Changed(_) => PyOSError::new_err(e.to_string()),
        ScanError::Cancelled => ScanCancelled::new_err("scan cancelled"),
    }
}

/// An `std::io::Error` on `path` as a Python OSError (for the small helpers).
pub fn io_to_py(path: &str, op: &'static str, error: std::io::Error) -> PyErr {
    to_py(ScanError::io(path, op, error))
}
