//! The core's one error type; `py/errors.rs` maps each case to a Python exception.

use std::io;
use std::path::PathBuf;

use crate::policy::PatternError;
use crate::redact::ShortSecretError;

#[derive(Debug)]
pub enum ScanError {
    /// A system call failed on `path` (absolute, for the message).
    Io {
        path: PathBuf,
        op: &'static str,
        source: io::Error,
    },
    Pattern(PatternError),
    ShortSecret(ShortSecretError),
    RootNotDirectory(PathBuf),
    RootIsSymlink(PathBuf),
    /// A file kept changing (or changed kind) while it was hashed.
    Changed(PathBuf),
    Cancelled,
}

/// What kind of failure a [`ScanError`] is: the classes a caller acts on
/// differently (retry, fix the input, free space...). `py/errors.rs` gives each
/// its own Python exception class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// A file changed (or vanished, or changed kind) while it was read.
    FileChanged,
    /// The workspace root is missing, not a directory, or a symlink.
    RootInvalid,
    /// A name or path longer than the filesystem allows (ENAMETOOLONG).
    NameTooLong,
    /// The filesystem (or the user's quota) is full (ENOSPC, EDQUOT).
    NoSpace,
    /// A rename or link across filesystems (EXDEV).
    CrossDevice,
    /// Permission denied or a read-only filesystem (EACCES, EPERM, EROFS).
    PermissionDenied,
    /// A bad pattern or a short secret.
    InvalidInput,
    Cancelled,
    /// Any other system call failure.
    Io,
}

/// The kind of an OS error number (one home for the errno rules).
pub fn errno_kind(errno: i32) -> ErrorKind {
    match errno {
        libc::ENAMETOOLONG => ErrorKind::NameTooLong,
        libc::ENOSPC | libc::EDQUOT => ErrorKind::NoSpace,
        libc::EXDEV => ErrorKind::CrossDevice,
        libc::EACCES | libc::EPERM | libc::EROFS => ErrorKind::PermissionDenied,
        _ => ErrorKind::Io,
    }
}

impl ScanError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            ScanError::Io { source, .. } => source.raw_os_error().map_or(ErrorKind::Io, errno_kind),
            ScanError::Pattern(_) | ScanError::ShortSecret(_) => ErrorKind::InvalidInput,
            ScanError::RootNotDirectory(_) | ScanError::RootIsSymlink(_) => ErrorKind::RootInvalid,
            ScanError::Changed(_) => ErrorKind::FileChanged,
            ScanError::Cancelled => ErrorKind::Cancelled,
        }
    }

    pub fn io(path: impl Into<PathBuf>, op: &'static str, source: io::Error) -> ScanError {
        ScanError::Io {
            path: path.into(),
            op,
            source,
        }
    }
}

impl std::fmt::Display for ScanError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ScanError::Io { path, op, source } => write!(f, "{op} {}: {source}", path.display()),
            ScanError::Pattern(e) => write!(f, "{e}"),
            ScanError::ShortSecret(e) => write!(f, "{e}"),
            ScanError::RootNotDirectory(p) => {
                write!(f, "workspace root {} is not a directory", p.display())
            }
            ScanError::RootIsSymlink(p) => {
                write!(
                    f,
                    "workspace root {} is a symlink; pass the real directory",
                    p.display()
                )
            }
            ScanError::Changed(p) => {
                write!(f, "{} kept changing while it was scanned", p.display())
            }
            ScanError::Cancelled => write!(f, "scan cancelled"),
        }
    }
}

impl std::error::Error for ScanError {}

impl From<PatternError> for ScanError {
    fn from(e: PatternError) -> Self {
        ScanError::Pattern(e)
    }
}

impl From<ShortSecretError> for ScanError {
    fn from(e: ShortSecretError) -> Self {
        ScanError::ShortSecret(e)
    }
}
