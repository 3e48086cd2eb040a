//! A raw directory reader that yields names with their `d_type`.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

/// The kind of a directory entry as `readdir` reports it (saves an lstat when
/// the policy excludes the entry).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirentType {
    Dir,
    File,
    Symlink,
    Other,
    Unknown,
}

impl DirentType {
    /// The kind of a raw `d_type` (`DT_*`).
    pub fn from_raw(d_type: u8) -> DirentType {
        match d_type {
            libc::DT_DIR => DirentType::Dir,
            libc::DT_REG => DirentType::File,
            libc::DT_LNK => DirentType::Symlink,
            libc::DT_UNKNOWN => DirentType::Unknown,
            _ => DirentType::Other,
        }
    }
}

/// A directory being listed. Owns its `DIR*` (and so the fd given to it).
pub struct DirReader {
    dir: *mut libc::DIR,
}

// SAFETY: the DIR* is used by one thread at a time (we never share a reader).
unsafe impl Send for DirReader {}

impl DirReader {
    /// Takes ownership of `fd` (closed by `closedir`).
    pub fn new(fd: OwnedFd) -> io::Result<DirReader> {
        let raw = fd.as_raw_fd();
        // SAFETY: valid directory fd; on success DIR* owns it.
        let dir = unsafe { libc::fdopendir(raw) };
        if dir.is_null() {
            return Err(io::Error::last_os_error());
        }
        std::mem::forget(fd);
        Ok(DirReader { dir })
    }

    pub fn fd(&self) -> RawFd {
        // SAFETY: self.dir is a valid DIR*.
        unsafe { libc::dirfd(self.dir) }
    }

    /// The next entry other than `.` and `..`, or None at the end. The name
    /// borrows the reader's buffer (valid until the next call).
    pub fn next_entry(&mut self) -> io::Result<Option<(&CStr, DirentType)>> {
        Ok(self
            .next_entry_raw()?
            .map(|(name, d_type)| (name, DirentType::from_raw(d_type))))
    }

    /// Like [`DirReader::next_entry`], with the raw `d_type` (`DT_*`).
    pub fn next_entry_raw(&mut self) -> io::Result<Option<(&CStr, u8)>> {
        loop {
            // readdir signals errors only through errno.
            // SAFETY: errno location is thread-local.
            unsafe { *libc::__errno_location() = 0 };
            // SAFETY: valid DIR*; the returned pointer is valid until the next readdir.
            let ent = unsafe { libc::readdir64(self.dir) };
            if ent.is_null() {
                let err = io::Error::last_os_error();
                return match err.raw_os_error() {
                    Some(0) | None => Ok(None),
                    _ => Err(err),
                };
            }
            // SAFETY: d_name is a NUL-terminated array inside the entry.
            let (name, d_type) = unsafe { (CStr::from_ptr((*ent).d_name.as_ptr()), (*ent).d_type) };
            let bytes = name.to_bytes();
            if bytes == b"." || bytes == b".." {
                continue;
            }
            return Ok(Some((name, d_type)));
        }
    }
}

impl Drop for DirReader {
    fn drop(&mut self) {
        // SAFETY: valid DIR*, closed exactly once.
        unsafe { libc::closedir(self.dir) };
    }
}
