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

impl ScanError {
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
