//! `stat` in its forms: by path, beneath a directory fd, of an fd, with the
//! mount checks that tell a mount point; `readlinkat`, and the filesystem's clock.

use std::ffi::{CStr, OsStr};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use super::{check, cstring, Stat};

/// `lstat` of an absolute or cwd-relative path (used once, for the root).
pub fn lstat_path(path: &Path) -> io::Result<Stat> {
    let c = cstring(path.as_os_str().as_bytes())?;
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `c` is a valid C string and `st` is writable stat storage.
    check(unsafe { libc::lstat(c.as_ptr(), st.as_mut_ptr()) })?;
    // SAFETY: lstat succeeded, so it filled `st`.
    Ok(Stat::from_raw(unsafe { &st.assume_init() }))
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`: the entry itself, never a link's target.
pub fn lstat_at(dir: RawFd, name: &CStr) -> io::Result<Stat> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: valid fd, C string and writable stat storage.
    check(unsafe {
        libc::fstatat(
            dir,
            name.as_ptr(),
            st.as_mut_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    // SAFETY: fstatat succeeded.
    Ok(Stat::from_raw(unsafe { &st.assume_init() }))
}

pub fn fstat(fd: RawFd) -> io::Result<Stat> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: valid fd and writable stat storage.
    check(unsafe { libc::fstat(fd, st.as_mut_ptr()) })?;
    // SAFETY: fstat succeeded.
    Ok(Stat::from_raw(unsafe { &st.assume_init() }))
}

/// Set once the kernel (or a seccomp filter) refuses `statx`.
static NO_STATX: AtomicBool = AtomicBool::new(false);

/// Whether `name` in `dir` (not followed; `name` empty: `dir` itself) is the
/// root of a mount: `statx`'s `STATX_ATTR_MOUNT_ROOT` (Linux 5.8+). `None` when
/// the kernel does not say (no `statx`, or the attribute is missing from
/// `stx_attributes_mask`): callers then have only the `st_dev` comparison, which
/// misses a bind mount of a directory of the same filesystem.
pub fn is_mount_root_at(dir: RawFd, name: &CStr) -> io::Result<Option<bool>> {
    let found = statx_nofollow(dir, name, libc::AT_STATX_DONT_SYNC, libc::STATX_TYPE)?;
    Ok(found.and_then(|stx| mount_root_of(&stx)))
}

/// The raw `statx(dir, name, AT_SYMLINK_NOFOLLOW | flags, mask)` (`name`
/// empty: `dir` itself), or None once the kernel (or a seccomp filter) refuses
/// `statx`. The raw syscall, not glibc's wrapper: the wheels target glibc 2.17,
/// which has none (it came in 2.28).
fn statx_nofollow(
    dir: RawFd,
    name: &CStr,
    flags: libc::c_int,
    mask: u32,
) -> io::Result<Option<libc::statx>> {
    if NO_STATX.load(Ordering::Relaxed) {
        return Ok(None);
    }
    let mut flags = flags | libc::AT_SYMLINK_NOFOLLOW;
    if name.to_bytes().is_empty() {
        flags |= libc::AT_EMPTY_PATH;
    }
    let mut stx = std::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: valid fd, C string and writable statx storage of the kernel's layout.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_statx,
            dir,
            name.as_ptr(),
            flags,
            mask,
            stx.as_mut_ptr(),
        )
    };
    if ret < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENOSYS) | Some(libc::EPERM) => {
                NO_STATX.store(true, Ordering::Relaxed);
                Ok(None)
            }
            _ => Err(e),
        };
    }
    // SAFETY: zero-initialised, and statx succeeded.
    Ok(Some(unsafe { stx.assume_init() }))
}

/// The id of the mount the open `fd` lies on (`statx`'s `stx_mnt_id`, Linux
/// 5.8+), or None where the kernel does not say: two fds with the same id
/// are on one mount (a bind mount of the same filesystem has its own).
pub fn mount_id(fd: RawFd) -> Option<u64> {
    let stx = statx_nofollow(fd, c"", libc::AT_STATX_DONT_SYNC, libc::STATX_MNT_ID)
        .ok()
        .flatten()?;
    (stx.stx_mask & libc::STATX_MNT_ID != 0).then_some(stx.stx_mnt_id)
}

/// `STATX_ATTR_MOUNT_ROOT` of a statx result, None when the kernel does not
/// report the attribute (before Linux 5.8).
fn mount_root_of(stx: &libc::statx) -> Option<bool> {
    let bit = libc::STATX_ATTR_MOUNT_ROOT as u64;
    (stx.stx_attributes_mask & bit != 0).then_some(stx.stx_attributes & bit != 0)
}

/// The rule both walks keep (the scan's and restore's deletion): an entry is
/// a mount point, never entered, read, changed or deleted, when the kernel
/// says it is a mount's root (a bind mount of a file or a directory, of this
/// filesystem or another), or when it is a directory on another device than
/// the workspace. `stat` is the entry's lstat; a non-directory's `st_dev` is
/// not compared (overlayfs reports it from the lower layer), only the mount
/// root is asked of it.
pub fn is_mount_point(dir: RawFd, name: &CStr, stat: &Stat, workspace_dev: u64) -> bool {
    // An entry gone or unreadable since its lstat is judged by its device alone;
    // whoever opens it next sees what it is then.
    judge_mount_point(stat, workspace_dev, || {
        is_mount_root_at(dir, name).ok().flatten()
    })
}

/// [`is_mount_point`]'s rule, with the kernel's word on the mount root
/// asked of `mount_root` only when it decides (anything but a directory on
/// another device): from [`stat_entry`], which learnt it with the stat, or
/// from a `statx` of its own.
pub fn judge_mount_point(
    stat: &Stat,
    workspace_dev: u64,
    mount_root: impl FnOnce() -> Option<bool>,
) -> bool {
    if stat.is_dir() && stat.dev != workspace_dev {
        return true;
    }
    mount_root() == Some(true)
}

/// `statx(dir, name, AT_SYMLINK_NOFOLLOW)` (`name` empty: `dir` itself): the
/// entry's lstat and, in the same call, whether it is a mount's root
/// ([`is_mount_root_at`]'s answer, None when the kernel does not say). One
/// system call where a walk made two for each directory (and the same stat
/// as `fstatat`/`fstat` give, field for field, `st_dev` included). Without
/// `statx` (or a filesystem that does not fill the basic fields), `fstatat`
/// or `fstat`, with the mount root unknown.
pub fn stat_entry(dir: RawFd, name: &CStr) -> io::Result<(Stat, Option<bool>)> {
    const WANTED: u32 = libc::STATX_TYPE
        | libc::STATX_MODE
        | libc::STATX_INO
        | libc::STATX_SIZE
        | libc::STATX_MTIME
        | libc::STATX_CTIME;
    let itself = name.to_bytes().is_empty();
    let fallback = || {
        if itself {
            fstat(dir)
        } else {
            lstat_at(dir, name)
        }
        .map(|stat| (stat, None))
    };
    let stx = match statx_nofollow(dir, name, 0, WANTED)? {
        Some(stx) if stx.stx_mask & WANTED == WANTED => stx,
        _ => return fallback(),
    };
    let mount_root = mount_root_of(&stx);
    let time = |t: libc::statx_timestamp| t.tv_sec * 1_000_000_000 + i64::from(t.tv_nsec);
    let stat = Stat {
        dev: libc::makedev(stx.stx_dev_major, stx.stx_dev_minor),
        ino: stx.stx_ino,
        mode: u32::from(stx.stx_mode),
        size: stx.stx_size,
        mtime_ns: time(stx.stx_mtime),
        ctime_ns: time(stx.stx_ctime),
    };
    Ok((stat, mount_root))
}

/// [`is_mount_point`] of an open file or directory itself (its `fstat` in
/// `stat`): the check that no swap between a parent's lstat and the open can
/// slip past.
pub fn is_mount_point_fd(fd: RawFd, stat: &Stat, workspace_dev: u64) -> bool {
    const ITSELF: &CStr = match CStr::from_bytes_with_nul(b"\0") {
        Ok(name) => name,
        Err(_) => panic!("a NUL alone is a C string"),
    };
    is_mount_point(fd, ITSELF, stat, workspace_dev)
}

/// `readlinkat(dir, name)`: the target bytes exactly as stored.
pub fn readlink_at(dir: RawFd, name: &CStr) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; 256];
    loop {
        // SAFETY: `buf` is writable for `buf.len()` bytes.
        let n = unsafe { libc::readlinkat(dir, name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = n as usize;
        if n < buf.len() {
            buf.truncate(n);
            return Ok(buf);
        }
        // Possibly truncated: grow and ask again.
        let larger = buf.len() * 4;
        buf.resize(larger, 0);
    }
}

/// The current time as the filesystem holding `dir` records it: create a temp
/// file there, read its mtime, remove it. Used as the stat cache's reference
/// time (git's racy-clean rule compares file mtimes with a filesystem clock,
/// which can run at a coarser granularity than the system clock).
pub fn filesystem_now(dir: &Path) -> io::Result<i64> {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let name = format!(".checkpointd-tick-{}-{}", std::process::id(), n);
    let path = dir.join(OsStr::new(&name));
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)?;
    let result = fstat(file.as_raw_fd()).map(|st| st.mtime_ns);
    drop(file);
    let _ = std::fs::remove_file(&path);
    result
}

/// `fstat` with the link count: in-place metadata changes only touch an inode
/// no other name shares (a hard link planted in the workspace may name a file
/// outside it).
pub fn fstat_links(fd: RawFd) -> io::Result<(Stat, u64)> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: valid fd and writable stat storage.
    check(unsafe { libc::fstat(fd, st.as_mut_ptr()) })?;
    // SAFETY: fstat succeeded.
    let st = unsafe { st.assume_init() };
    Ok((Stat::from_raw(&st), st.st_nlink))
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)` with the link count.
pub fn lstat_links_at(dir: RawFd, name: &CStr) -> io::Result<(Stat, u64)> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: valid fd, C string and writable stat storage.
    check(unsafe {
        libc::fstatat(
            dir,
            name.as_ptr(),
            st.as_mut_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    // SAFETY: fstatat succeeded.
    let st = unsafe { st.assume_init() };
    Ok((Stat::from_raw(&st), st.st_nlink))
}
