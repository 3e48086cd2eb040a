//! Opening beneath a root without following symlinks: `openat2` where the
//! kernel has it, else one component at a time with `O_NOFOLLOW`.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use super::{check, cstring};

/// Open a directory (not a symlink) by path, for the root of a scan.
pub fn open_dir_path(path: &Path) -> io::Result<OwnedFd> {
    let c = cstring(path.as_os_str().as_bytes())?;
    // SAFETY: valid C string; the returned fd is owned below.
    let fd = check(unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    })?;
    // SAFETY: `fd` was just returned by open and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// Set once the kernel tells us openat2 is unavailable (ENOSYS, or EPERM from a
/// seccomp filter), so we stop trying it.
pub(super) static NO_OPENAT2: AtomicBool = AtomicBool::new(false);

/// Set once an open with O_NOATIME was refused (EPERM: we are neither the
/// file's owner nor hold CAP_FOWNER): from then on [`open_to_read`] lets the
/// kernel update access times.
static NO_NOATIME: AtomicBool = AtomicBool::new(false);

/// Open `rel` beneath `root` (as [`open_beneath`]) to read its bytes
/// ([`READ_FLAGS`]), leaving its access time alone where the kernel lets us
/// (O_NOATIME, as restic reads). A cold capture reads every new file once,
/// and under `relatime` the first read of a file written since it was last
/// read writes its inode back: a journaled metadata write per file, ~5% of
/// a 100k-file capture, for a time nobody asked us to set.
pub fn open_to_read(root: RawFd, rel: &[u8]) -> io::Result<OwnedFd> {
    if !NO_NOATIME.load(Ordering::Relaxed) {
        match open_beneath(root, rel, READ_FLAGS | libc::O_NOATIME) {
            Err(err) if err.raw_os_error() == Some(libc::EPERM) => {
                NO_NOATIME.store(true, Ordering::Relaxed)
            }
            other => return other,
        }
    }
    open_beneath(root, rel, READ_FLAGS)
}

/// Open `rel` (a relative, '/'-separated path) beneath the directory `root`
/// without following any symlink in any component. `flags` are open(2) flags
/// for the last component (O_NOFOLLOW and O_CLOEXEC are always added).
///
/// Errors: ELOOP when a component is a symlink, ENOTDIR when a parent is not a
/// directory, ENOENT when it vanished, and the usual permission errors.
pub fn open_beneath(root: RawFd, rel: &[u8], flags: libc::c_int) -> io::Result<OwnedFd> {
    let flags = flags | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    if !NO_OPENAT2.load(Ordering::Relaxed) {
        match openat2_beneath(root, rel, flags, 0) {
            Ok(fd) => return Ok(fd),
            // Refused for O_NOATIME (not ours), not for openat2: the caller
            // opens again without it (`open_to_read`).
            Err(err) if err.raw_os_error() == Some(libc::EPERM) && flags & libc::O_NOATIME != 0 => {
                return Err(err)
            }
            // ENOSYS/EPERM: no openat2 here (latched); EAGAIN: RESOLVE_* raced
            // with a rename. Either way the slow path decides.
            Err(err)
                if matches!(
                    err.raw_os_error(),
                    Some(libc::ENOSYS | libc::EPERM | libc::EAGAIN)
                ) => {}
            Err(err) => return Err(err),
        }
    }
    open_beneath_stepwise(root, rel, flags)
}

/// One `openat2` of `rel` beneath `root` crossing no symlink (nor magic
/// link), with `extra_resolve` added to the RESOLVE_* flags. ENOSYS and EPERM
/// (no openat2 in the kernel, or a seccomp filter) latch `NO_OPENAT2`.
pub(super) fn openat2_beneath(
    root: RawFd,
    rel: &[u8],
    flags: libc::c_int,
    extra_resolve: u64,
) -> io::Result<OwnedFd> {
    let c = cstring(rel)?;
    let how = OpenHow {
        flags: flags as u64,
        mode: 0,
        resolve: libc::RESOLVE_BENEATH
            | libc::RESOLVE_NO_SYMLINKS
            | libc::RESOLVE_NO_MAGICLINKS
            | extra_resolve,
    };
    // SAFETY: valid fd, C string and a properly laid-out open_how of the size passed.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            root,
            c.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    if ret < 0 {
        let err = io::Error::last_os_error();
        if matches!(err.raw_os_error(), Some(libc::ENOSYS | libc::EPERM)) {
            NO_OPENAT2.store(true, Ordering::Relaxed);
        }
        return Err(err);
    }
    // SAFETY: a fresh fd owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(ret as RawFd) })
}

pub(super) fn open_beneath_stepwise(
    root: RawFd,
    rel: &[u8],
    flags: libc::c_int,
) -> io::Result<OwnedFd> {
    let flags = flags | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    let parts: Vec<&[u8]> = rel
        .split(|&b| b == b'/')
        .filter(|p| !p.is_empty())
        .collect();
    let Some((last, parents)) = parts.split_last() else {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    };
    let mut current: Option<OwnedFd> = None;
    for part in parents {
        if *part == b".." || *part == b"." {
            return Err(io::Error::from_raw_os_error(libc::EXDEV));
        }
        let dir = current.as_ref().map_or(root, |fd| fd.as_raw_fd());
        let c = cstring(part)?;
        // SAFETY: valid fd and C string.
        let fd = check(unsafe {
            libc::openat(
                dir,
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        })?;
        // SAFETY: fresh fd.
        current = Some(unsafe { OwnedFd::from_raw_fd(fd) });
    }
    if *last == b".." || *last == b"." {
        return Err(io::Error::from_raw_os_error(libc::EXDEV));
    }
    let dir = current.as_ref().map_or(root, |fd| fd.as_raw_fd());
    let c = cstring(last)?;
    // SAFETY: valid fd and C string.
    let fd = check(unsafe { libc::openat(dir, c.as_ptr(), flags) })?;
    // SAFETY: fresh fd.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Flags for reading a file's bytes: O_NONBLOCK so that a file swapped for a
/// fifo after the walk cannot block the scan forever (no effect on regular files).
pub const READ_FLAGS: libc::c_int = libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY;

/// Flags for opening a directory to list it.
pub const DIR_FLAGS: libc::c_int = libc::O_RDONLY | libc::O_DIRECTORY;
