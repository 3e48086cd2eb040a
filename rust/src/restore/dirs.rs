//! Directories reached from the restore root by fd, one name per call, and
//! trees removed without entering a mount point.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use super::{cname, is_errno, RestoreError, Workspace, STAGING_PREFIX};
use crate::fs;
use crate::walk::MAX_DEPTH;

/// What [`DirStack::open_child`] found at a name.
pub(super) enum Child {
    Dir(OwnedFd),
    /// Missing (or, without `create`, a symlink or a non-directory).
    Absent,
    /// A file mounted there (a bind mount): never removed.
    MountPoint,
}

/// A directory reached from the root by fd, or why not.
pub(super) enum Reached {
    Dir(RawFd),
    /// Missing, or a symlink or a non-directory stands on the path.
    Absent,
    /// On another device: a mount point at or above it (its path).
    OtherDevice(Vec<u8>),
}

/// The directory fds of the last path visited (operations come in path order,
/// so consecutive ones mostly share their parents).
pub(super) struct DirStack<'w> {
    ws: &'w Workspace,
    /// The directory paths start from (the root, or staging's tree).
    base: RawFd,
    /// `base`'s path relative to the root, for messages ("" = the root).
    prefix: Vec<u8>,
    parts: Vec<(Vec<u8>, OwnedFd)>,
    /// The last directory reached in one `openat2` (its path and fd): the
    /// fast path, one system call for a whole path, where the component walk
    /// of `parts` takes three per component.
    last: Option<(Vec<u8>, OwnedFd)>,
}

impl<'w> DirStack<'w> {
    pub(super) fn new(ws: &'w Workspace) -> DirStack<'w> {
        DirStack {
            ws,
            base: ws.fd.as_raw_fd(),
            prefix: Vec::new(),
            parts: Vec::new(),
            last: None,
        }
    }

    /// Paths beneath `base` (a directory inside staging at `prefix`).
    pub(super) fn beneath(ws: &'w Workspace, base: RawFd, prefix: &[u8]) -> DirStack<'w> {
        DirStack {
            ws,
            base,
            prefix: prefix.to_vec(),
            parts: Vec::new(),
            last: None,
        }
    }

    pub(super) fn shown(&self, rel: &[u8]) -> String {
        if self.prefix.is_empty() {
            return self.ws.shown(rel);
        }
        let mut full = self.prefix.clone();
        full.push(b'/');
        full.extend_from_slice(rel);
        self.ws.shown(&full)
    }

    pub(super) fn forget(&mut self) {
        self.parts.clear();
        self.last = None;
    }

    /// Reach directory `rel` ("" = the root). With `create`, missing
    /// directories are made (0755; a planned one gets its mode later) and a
    /// symlink or file in the way is unlinked first (the link, never its target).
    pub(super) fn reach(&mut self, rel: &[u8], create: bool) -> Result<Reached, RestoreError> {
        // Fast path: the whole path in one openat2 that crosses no symlink and
        // no mount point; anything else (missing, a link or file in the way,
        // a mount, no openat2) is the component walk's to judge.
        if !rel.is_empty() {
            if let Some((path, fd)) = &self.last {
                if path.as_slice() == rel {
                    return Ok(Reached::Dir(fd.as_raw_fd()));
                }
            }
            if let Ok(fd) = fs::open_dir_beneath_same_mount(self.base, rel) {
                let raw = fd.as_raw_fd();
                self.last = Some((rel.to_vec(), fd));
                return Ok(Reached::Dir(raw));
            }
        }
        let wanted: Vec<&[u8]> = if rel.is_empty() {
            Vec::new()
        } else {
            rel.split(|&b| b == b'/').collect()
        };
        let mut keep = 0;
        while keep < self.parts.len()
            && keep < wanted.len()
            && self.parts[keep].0.as_slice() == wanted[keep]
        {
            keep += 1;
        }
        self.parts.truncate(keep);
        for depth in keep..wanted.len() {
            let parent = match self.parts.last() {
                Some((_, fd)) => fd.as_raw_fd(),
                None => self.base,
            };
            let name = cname(wanted[depth])?;
            let here = || wanted[..=depth].join(&b'/');
            let fd = match self.open_child(parent, &name, create, &here)? {
                Child::Dir(fd) => fd,
                Child::Absent => return Ok(Reached::Absent),
                Child::MountPoint => return Ok(Reached::OtherDevice(here())),
            };
            let stat = fs::fstat(fd.as_raw_fd())
                .map_err(|e| RestoreError::raced(self.shown(&here()), "fstat", e))?;
            if fs::is_mount_point_fd(fd.as_raw_fd(), &stat, self.ws.dev) {
                return Ok(Reached::OtherDevice(here()));
            }
            self.parts.push((wanted[depth].to_vec(), fd));
        }
        Ok(Reached::Dir(match self.parts.last() {
            Some((_, fd)) => fd.as_raw_fd(),
            None => self.base,
        }))
    }

    pub(super) fn open_child(
        &self,
        parent: RawFd,
        name: &CStr,
        create: bool,
        here: &dyn Fn() -> Vec<u8>,
    ) -> Result<Child, RestoreError> {
        // Bounded: a racing writer cannot keep us looping.
        for _ in 0..8 {
            match fs::open_dir_at(parent, name) {
                Ok(fd) => return Ok(Child::Dir(fd)),
                Err(e) if !create => {
                    if is_errno(&e, &[libc::ENOENT, libc::ELOOP, libc::ENOTDIR]) {
                        return Ok(Child::Absent);
                    }
                    return Err(RestoreError::raced(self.shown(&here()), "open", e));
                }
                // A file bind-mounted where a directory must go: left alone.
                Err(e)
                    if is_errno(&e, &[libc::ENOTDIR])
                        && fs::is_mount_root_at(parent, name).ok().flatten() == Some(true) =>
                {
                    return Ok(Child::MountPoint)
                }
                Err(e) if is_errno(&e, &[libc::ELOOP, libc::ENOTDIR]) => {
                    match fs::unlink_at(parent, name) {
                        Ok(()) => {}
                        Err(e) if is_errno(&e, &[libc::ENOENT]) => {}
                        Err(e) => {
                            return Err(RestoreError::raced(self.shown(&here()), "unlink", e))
                        }
                    }
                }
                Err(e) if is_errno(&e, &[libc::ENOENT]) => {}
                Err(e) => return Err(RestoreError::raced(self.shown(&here()), "open", e)),
            }
            match fs::mkdir_at(parent, name, 0o755) {
                Ok(()) => {}
                Err(e) if is_errno(&e, &[libc::EEXIST]) => {}
                Err(e) => return Err(RestoreError::raced(self.shown(&here()), "mkdir", e)),
            }
        }
        Err(RestoreError::Changed {
            path: self.shown(&here()),
            op: "open",
            source: io::Error::other("the directory keeps changing under the restore"),
        })
    }
}

/// How deep below the root [`remove_tree`] goes: a checkpoint's deepest
/// paths, in staging's tree (two levels down: `.checkpointd-staging-*/t/`).
const REMOVE_DEPTH_MAX: usize = MAX_DEPTH + 2;

/// Remove whatever stands at `name` in `parent`: a non-directory is unlinked,
/// a directory emptied and removed, without ever entering a mount point nor
/// going deeper than [`REMOVE_DEPTH_MAX`] below the root (each level holds an
/// fd and a stack frame): such a path goes to `skipped`, and it stays.
pub(super) fn remove_tree(
    ws: &Workspace,
    parent: RawFd,
    name: &CStr,
    rel: &[u8],
    skipped: &mut Vec<Vec<u8>>,
) -> Result<(), RestoreError> {
    if rel.split(|&b| b == b'/').count() > REMOVE_DEPTH_MAX {
        skipped.push(rel.to_vec());
        return Ok(());
    }
    let stat = match fs::lstat_at(parent, name) {
        Ok(s) => s,
        Err(e) if is_errno(&e, &[libc::ENOENT, libc::ENOTDIR]) => return Ok(()),
        Err(e) => return Err(RestoreError::raced(ws.shown(rel), "lstat", e)),
    };
    if fs::is_mount_point(parent, name, &stat, ws.dev) {
        skipped.push(rel.to_vec());
        return Ok(());
    }
    if !stat.is_dir() {
        return match fs::unlink_at(parent, name) {
            // Mounted on since its lstat: it stays.
            Err(e) if is_errno(&e, &[libc::EBUSY]) => {
                skipped.push(rel.to_vec());
                Ok(())
            }
            Err(e) if !is_errno(&e, &[libc::ENOENT]) => {
                Err(RestoreError::raced(ws.shown(rel), "unlink", e))
            }
            _ => Ok(()),
        };
    }
    let fd = match fs::open_dir_at(parent, name) {
        Ok(fd) => fd,
        Err(e) if is_errno(&e, &[libc::ENOENT, libc::ELOOP, libc::ENOTDIR]) => return Ok(()),
        Err(e) => return Err(RestoreError::raced(ws.shown(rel), "open", e)),
    };
    let inner =
        fs::fstat(fd.as_raw_fd()).map_err(|e| RestoreError::raced(ws.shown(rel), "fstat", e))?;
    if fs::is_mount_point_fd(fd.as_raw_fd(), &inner, ws.dev) {
        skipped.push(rel.to_vec());
        return Ok(());
    }
    if inner.mode & 0o700 != 0o700 && rel.starts_with(STAGING_PREFIX.as_bytes()) {
        // Staging's own, so an owner that is not root can list and empty it
        // (any error: the removal below says what failed).
        let _ = fs::fchmod(fd.as_raw_fd(), (inner.mode & 0o7777) | 0o700);
    }
    let dir_fd = fd
        .try_clone()
        .map_err(|e| RestoreError::raced(ws.shown(rel), "dup", e))?;
    let mut reader =
        fs::DirReader::new(fd).map_err(|e| RestoreError::raced(ws.shown(rel), "list", e))?;
    let mut names: Vec<CString> = Vec::new();
    while let Some((child, _)) = reader
        .next_entry()
        .map_err(|e| RestoreError::raced(ws.shown(rel), "list", e))?
    {
        names.push(child.to_owned());
    }
    drop(reader);
    for child in names {
        let mut child_rel = rel.to_vec();
        child_rel.push(b'/');
        child_rel.extend_from_slice(child.to_bytes());
        remove_tree(ws, dir_fd.as_raw_fd(), &child, &child_rel, skipped)?;
    }
    match fs::rmdir_at(parent, name) {
        Ok(()) => Ok(()),
        Err(e) if is_errno(&e, &[libc::ENOENT]) => Ok(()),
        // A mount point inside (EBUSY) or a name that reappeared: it stays.
        Err(e) if is_errno(&e, &[libc::EBUSY, libc::ENOTEMPTY, libc::EEXIST]) => Ok(()),
        Err(e) => Err(RestoreError::raced(ws.shown(rel), "rmdir", e)),
    }
}
