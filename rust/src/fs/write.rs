//! Writing beneath a root (restore). Every call takes a directory fd and one
//! name, never a path: a parent reached by fd cannot be redirected by a
//! symlink swapped in later.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering;

use super::open::{openat2_beneath, NO_OPENAT2};
use super::{check, cstring};

/// The process's umask, read without changing it (`/proc/self/status`); None
/// where that is unavailable.
pub fn current_umask() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Umask:"))?;
    u32::from_str_radix(line["Umask:".len()..].trim(), 8).ok()
}

/// Open the directory `name` in `dir`: never a symlink, never a non-directory.
pub fn open_dir_at(dir: RawFd, name: &CStr) -> io::Result<OwnedFd> {
    // SAFETY: valid fd and C string; the fd is owned below.
    let fd = check(unsafe {
        libc::openat(
            dir,
            name.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    })?;
    // SAFETY: fresh fd.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The directory `rel` beneath `root` in one `openat2`, crossing no symlink
/// and no mount point (`RESOLVE_NO_XDEV`: a bind mount of the same
/// filesystem too), so it is what a component-by-component open that checks
/// each directory for a mount point would reach. Any error (ENOSYS and EPERM
/// where the kernel or a seccomp filter refuses openat2, EAGAIN after a
/// racing rename, ELOOP, ENOTDIR, ENOENT, EXDEV) means: take the slow path,
/// which tells those cases apart.
pub fn open_dir_beneath_same_mount(root: RawFd, rel: &[u8]) -> io::Result<OwnedFd> {
    if NO_OPENAT2.load(Ordering::Relaxed) {
        return Err(io::Error::from_raw_os_error(libc::ENOSYS));
    }
    openat2_beneath(
        root,
        rel,
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        libc::RESOLVE_NO_XDEV,
    )
}

/// Open a leaf without following it (`O_NONBLOCK`: a fifo swapped in must not hang).
pub fn open_leaf_at(dir: RawFd, name: &CStr, flags: libc::c_int) -> io::Result<OwnedFd> {
    let flags = flags | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK | libc::O_NOCTTY;
    // SAFETY: valid fd and C string.
    let fd = check(unsafe { libc::openat(dir, name.as_ptr(), flags) })?;
    // SAFETY: fresh fd.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Open the directory `rel` beneath `root` one component at a time with
/// `O_NOFOLLOW`: a component that is a symlink (or not a directory) fails with
/// ELOOP/ENOTDIR, whatever the sandbox swaps in. With `create_last`, a missing
/// last component is made (mode 0755); its parents must exist.
pub fn open_subdir(root: RawFd, rel: &[u8], create_last: bool) -> io::Result<OwnedFd> {
    let parts: Vec<&[u8]> = rel
        .split(|&b| b == b'/')
        .filter(|p| !p.is_empty())
        .collect();
    // A fresh description of the root itself, owned by the caller.
    let mut current = open_dir_at(root, c".")?;
    for (index, part) in parts.iter().enumerate() {
        if *part == b".." || *part == b"." {
            return Err(io::Error::from_raw_os_error(libc::EXDEV));
        }
        let name = cstring(part)?;
        let opened = match open_dir_at(current.as_raw_fd(), &name) {
            Err(e)
                if e.raw_os_error() == Some(libc::ENOENT)
                    && create_last
                    && index + 1 == parts.len() =>
            {
                match mkdir_at(current.as_raw_fd(), &name, 0o755) {
                    Ok(()) => {}
                    Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
                    Err(e) => return Err(e),
                }
                open_dir_at(current.as_raw_fd(), &name)?
            }
            other => other?,
        };
        current = opened;
    }
    Ok(current)
}

pub fn mkdir_at(dir: RawFd, name: &CStr, mode: libc::mode_t) -> io::Result<()> {
    // SAFETY: valid fd and C string.
    check(unsafe { libc::mkdirat(dir, name.as_ptr(), mode) }).map(drop)
}

/// `FS_TOPDIR_FL`: the directory is the top of a hierarchy of its own.
pub(super) const TOPDIR_FLAG: libc::c_int = 0x0002_0000;

/// Mark the directory `fd` as the top of a hierarchy of its own
/// (`FS_TOPDIR_FL`), so ext2/3/4 place each directory made in it, and the
/// inodes of the files made there, in a block group of its own (the Orlov
/// spread it gives top-level directories) rather than beside its parent's.
/// A filesystem without the flag refuses it (ENOTTY, EOPNOTSUPP): nothing
/// depends on it but speed.
pub fn mark_top_of_hierarchy(fd: RawFd) -> io::Result<()> {
    let mut flags: libc::c_int = 0;
    // SAFETY: valid fd; the kernel reads and writes one int through the pointer.
    check(unsafe { libc::ioctl(fd, libc::FS_IOC_GETFLAGS, &mut flags) })?;
    if flags & TOPDIR_FLAG != 0 {
        return Ok(());
    }
    flags |= TOPDIR_FLAG;
    // SAFETY: as above.
    check(unsafe { libc::ioctl(fd, libc::FS_IOC_SETFLAGS, &flags) }).map(drop)
}

/// Take `flock(LOCK_EX)` on `fd` without waiting: false when another open
/// file description holds it (released when the holder's fd closes, or its
/// process dies).
pub fn try_lock_exclusive(fd: RawFd) -> io::Result<bool> {
    // SAFETY: plain syscall on a valid fd.
    match check(unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) }) {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => Ok(false),
        Err(e) => Err(e),
    }
}

pub fn unlink_at(dir: RawFd, name: &CStr) -> io::Result<()> {
    // SAFETY: valid fd and C string.
    check(unsafe { libc::unlinkat(dir, name.as_ptr(), 0) }).map(drop)
}

pub fn rmdir_at(dir: RawFd, name: &CStr) -> io::Result<()> {
    // SAFETY: valid fd and C string.
    check(unsafe { libc::unlinkat(dir, name.as_ptr(), libc::AT_REMOVEDIR) }).map(drop)
}

/// `renameat`: atomic replace of a non-directory at the destination.
pub fn rename_at(from_dir: RawFd, from: &CStr, to_dir: RawFd, to: &CStr) -> io::Result<()> {
    // SAFETY: valid fds and C strings.
    check(unsafe { libc::renameat(from_dir, from.as_ptr(), to_dir, to.as_ptr()) }).map(drop)
}

pub fn symlink_at(target: &CStr, dir: RawFd, name: &CStr) -> io::Result<()> {
    // SAFETY: valid fd and C strings.
    check(unsafe { libc::symlinkat(target.as_ptr(), dir, name.as_ptr()) }).map(drop)
}

/// A new private (0600) file `name` in `dir`, open for writing; fails if it exists.
pub fn create_file_at(dir: RawFd, name: &CStr) -> io::Result<OwnedFd> {
    create_file_mode_at(dir, name, 0o600)
}

/// A new file `name` in `dir` with `mode` (less the umask), open for reading
/// and writing (a restore reads back what it wrote before vouching for it);
/// fails if it exists.
pub fn create_file_mode_at(dir: RawFd, name: &CStr, mode: u32) -> io::Result<OwnedFd> {
    let flags = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: valid fd and C string.
    let fd = check(unsafe { libc::openat(dir, name.as_ptr(), flags, mode as libc::c_uint) })?;
    // SAFETY: fresh fd.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

pub fn fchmod(fd: RawFd, mode: u32) -> io::Result<()> {
    // SAFETY: valid fd.
    check(unsafe { libc::fchmod(fd, mode as libc::mode_t) }).map(drop)
}

fn timespec_of(ns: i64) -> libc::timespec {
    libc::timespec {
        tv_sec: ns.div_euclid(1_000_000_000) as libc::time_t,
        tv_nsec: ns.rem_euclid(1_000_000_000) as libc::c_long,
    }
}

/// Set the modification time through the fd (the access time is left alone).
pub fn set_mtime(fd: RawFd, mtime_ns: i64) -> io::Result<()> {
    let times = [
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        timespec_of(mtime_ns),
    ];
    // SAFETY: valid fd and a two-element timespec array.
    check(unsafe { libc::futimens(fd, times.as_ptr()) }).map(drop)
}

/// Flush the whole filesystem holding `fd` (one call for a batch of files).
pub fn syncfs(fd: RawFd) -> io::Result<()> {
    // SAFETY: valid fd.
    check(unsafe { libc::syncfs(fd) }).map(drop)
}
