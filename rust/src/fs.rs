//! Thin, safe wrappers over the Linux calls the scanner needs: opening beneath a
//! root without following symlinks, `fstatat`, `readlinkat` and a raw directory
//! reader that yields names with their `d_type`.
//!
//! Why raw calls: the walk must never follow a symlink, not even in a parent
//! component (code in the sandbox can swap a directory for a link to `/etc` while
//! we scan). `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` guarantees that in
//! one call; where the kernel lacks it we open one component at a time with
//! `O_NOFOLLOW`.

use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

/// The stat fields the scanner uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Stat {
    pub dev: u64,
    pub ino: u64,
    pub mode: u32,
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
}

impl Stat {
    fn from_raw(st: &libc::stat) -> Stat {
        Stat {
            dev: st.st_dev,
            ino: st.st_ino,
            mode: st.st_mode,
            size: st.st_size as u64,
            mtime_ns: st.st_mtime * 1_000_000_000 + st.st_mtime_nsec,
            ctime_ns: st.st_ctime * 1_000_000_000 + st.st_ctime_nsec,
        }
    }

    pub fn file_type(&self) -> u32 {
        self.mode & libc::S_IFMT
    }

    pub fn is_dir(&self) -> bool {
        self.file_type() == libc::S_IFDIR
    }

    pub fn is_file(&self) -> bool {
        self.file_type() == libc::S_IFREG
    }

    pub fn is_symlink(&self) -> bool {
        self.file_type() == libc::S_IFLNK
    }
}

fn cstring(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

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
static NO_OPENAT2: AtomicBool = AtomicBool::new(false);

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
fn openat2_beneath(
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

fn open_beneath_stepwise(root: RawFd, rel: &[u8], flags: libc::c_int) -> io::Result<OwnedFd> {
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

// ---------------------------------------------------------------------------
// Writing beneath a root (restore). Every call takes a directory fd and one
// name, never a path: a parent reached by fd cannot be redirected by a
// symlink swapped in later.

/// The process's umask, read without changing it (`/proc/self/status`); None
/// where that is unavailable.
pub fn current_umask() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Umask:"))?;
    u32::from_str_radix(line["Umask:".len()..].trim(), 8).ok()
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

/// Write all of `data` (retrying short writes and EINTR).
pub fn write_all(fd: RawFd, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        // SAFETY: `data` is a live slice; write reads at most its length.
        let n = unsafe { libc::write(fd, data.as_ptr().cast(), data.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::from(io::ErrorKind::WriteZero));
        }
        data = &data[n as usize..];
    }
    Ok(())
}

/// The size of the blocks [`write_sparse_at`] leaves unwritten when they
/// hold only zeros (a filesystem's usual block: smaller holes save nothing).
pub const HOLE_BLOCK: usize = 4096;

/// Write `data` at `offset` of `fd` as [`write_all`] would, except that the
/// part of each [`HOLE_BLOCK`]-aligned block of the file that `data` holds
/// is left unwritten when it is all zeros: in a file created empty it stays
/// a hole, which reads as zeros and takes no space (a stream's pieces may
/// cut a block anywhere). Returns whether a part was left out (the caller
/// then sets the file's length, [`set_len`], in case the last ones were).
pub fn write_sparse_at(fd: RawFd, offset: u64, data: &[u8]) -> io::Result<bool> {
    let mut skipped = false;
    let mut at = 0usize;
    while at < data.len() {
        // From `at` to the next block boundary of the file, or a whole block.
        let into_block = ((offset + at as u64) % HOLE_BLOCK as u64) as usize;
        let end = (at + HOLE_BLOCK - into_block).min(data.len());
        let block = &data[at..end];
        if all_zero(block) {
            skipped = true;
            at = end;
            continue;
        }
        // A run of blocks with data, written at once.
        let mut run_end = end;
        while run_end < data.len() {
            let next = (run_end + HOLE_BLOCK).min(data.len());
            if all_zero(&data[run_end..next]) {
                break;
            }
            run_end = next;
        }
        pwrite_all(fd, &data[at..run_end], offset + at as u64)?;
        at = run_end;
    }
    Ok(skipped)
}

/// Whether `bytes` are all zero (16 at a time; most data fails on the first).
fn all_zero(bytes: &[u8]) -> bool {
    let mut words = bytes.chunks_exact(16);
    let whole = words
        .by_ref()
        .all(|w| u128::from_ne_bytes(w.try_into().unwrap_or([1; 16])) == 0);
    whole && words.remainder().iter().all(|&b| b == 0)
}

/// `pwrite` all of `data` at `offset` (retrying short writes and EINTR).
fn pwrite_all(fd: RawFd, mut data: &[u8], mut offset: u64) -> io::Result<()> {
    while !data.is_empty() {
        // SAFETY: `data` is a live slice; pwrite reads at most its length.
        let n =
            unsafe { libc::pwrite(fd, data.as_ptr().cast(), data.len(), offset as libc::off_t) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::from(io::ErrorKind::WriteZero));
        }
        data = &data[n as usize..];
        offset += n as u64;
    }
    Ok(())
}

/// `ftruncate`: the file's length becomes `len` (a hole where it grows).
pub fn set_len(fd: RawFd, len: u64) -> io::Result<()> {
    // SAFETY: valid fd.
    check(unsafe { libc::ftruncate(fd, len as libc::off_t) }).map(drop)
}

/// Where the data or the hole that `offset` of `fd` lies in ends: `lseek`
/// with SEEK_HOLE (`hole`) or SEEK_DATA. None past the last data (ENXIO).
pub fn seek_extent(fd: RawFd, offset: u64, hole: bool) -> io::Result<Option<u64>> {
    let whence = if hole {
        libc::SEEK_HOLE
    } else {
        libc::SEEK_DATA
    };
    // SAFETY: valid fd; lseek only moves the file's offset.
    let at = unsafe { libc::lseek(fd, offset as libc::off_t, whence) };
    if at < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENXIO) => Ok(None),
            _ => Err(e),
        };
    }
    Ok(Some(at as u64))
}

/// Flush the whole filesystem holding `fd` (one call for a batch of files).
pub fn syncfs(fd: RawFd) -> io::Result<()> {
    // SAFETY: valid fd.
    check(unsafe { libc::syncfs(fd) }).map(drop)
}

/// Copy all of `src` (from offset 0) into `dst`.
pub fn copy_fd(src: RawFd, dst: RawFd) -> io::Result<()> {
    loop {
        // SAFETY: valid fds; null offsets use (and advance) the file positions.
        let n = unsafe {
            libc::copy_file_range(
                src,
                std::ptr::null_mut(),
                dst,
                std::ptr::null_mut(),
                1 << 30,
                0,
            )
        };
        if n == 0 {
            return Ok(());
        }
        if n > 0 {
            continue;
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EXDEV)
            | Some(libc::ENOSYS)
            | Some(libc::EOPNOTSUPP)
            | Some(libc::EINVAL) => break,
            _ => return Err(e),
        }
    }
    let mut buf = vec![0u8; 1 << 20];
    loop {
        // SAFETY: `buf` is writable for its length.
        let n = unsafe { libc::read(src, buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Ok(());
        }
        write_all(dst, &buf[..n as usize])?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn setup() -> (tempfile::TempDir, OwnedFd) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        std::fs::write(dir.path().join("a/b/f"), b"data").unwrap();
        std::os::unix::fs::symlink("b", dir.path().join("a/link")).unwrap();
        std::os::unix::fs::symlink("/etc", dir.path().join("out")).unwrap();
        let root = open_dir_path(dir.path()).unwrap();
        (dir, root)
    }

    fn read(fd: OwnedFd) -> Vec<u8> {
        let mut out = Vec::new();
        std::fs::File::from(fd).read_to_end(&mut out).unwrap();
        out
    }

    /// A file opened to be read keeps its access time; the control read
    /// after it (a plain open) shows this filesystem does update it.
    #[test]
    fn open_to_read_leaves_the_access_time_alone() {
        let (dir, root) = setup();
        let path = dir.path().join("a/b/f");
        // Accessed no later than modified: under relatime the next plain
        // read sets the access time to now.
        let past = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
        let times = std::fs::FileTimes::new()
            .set_accessed(past)
            .set_modified(past);
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_times(times)
            .unwrap();
        let accessed = || std::fs::metadata(&path).unwrap().accessed().unwrap();
        assert_eq!(
            read(open_to_read(root.as_raw_fd(), b"a/b/f").unwrap()),
            b"data"
        );
        assert_eq!(accessed(), past);
        assert_eq!(std::fs::read(&path).unwrap(), b"data");
        assert!(
            accessed() > past,
            "this filesystem does not update access times"
        );
    }

    /// `stat_entry` gives what `fstatat` (or `fstat` of the fd itself)
    /// gives, field for field (the stat cache compares them across both):
    /// for a file, a directory, a symlink (not followed) and a fd; a gone
    /// name is ENOENT; a plain directory is no mount root, `/` is one.
    #[test]
    fn stat_entry_is_lstat_with_the_mount_root() {
        let (_dir, root) = setup();
        let a = open_beneath(root.as_raw_fd(), b"a", DIR_FLAGS).unwrap();
        for (dir, name) in [
            (a.as_raw_fd(), c"b"),
            (a.as_raw_fd(), c"link"),
            (root.as_raw_fd(), c"out"),
            (root.as_raw_fd(), c"a"),
        ] {
            let (stat, mount_root) = stat_entry(dir, name).unwrap();
            assert_eq!(stat, lstat_at(dir, name).unwrap(), "{name:?}");
            assert_ne!(mount_root, Some(true), "{name:?}");
        }
        let b = open_beneath(root.as_raw_fd(), b"a/b", DIR_FLAGS).unwrap();
        let (stat, _) = stat_entry(b.as_raw_fd(), c"f").unwrap();
        assert_eq!(
            (stat, stat.size),
            (lstat_at(b.as_raw_fd(), c"f").unwrap(), 4)
        );
        assert!(stat.is_file());
        let (itself, _) = stat_entry(b.as_raw_fd(), c"").unwrap();
        assert_eq!(itself, fstat(b.as_raw_fd()).unwrap());
        assert!(itself.is_dir());
        let gone = stat_entry(b.as_raw_fd(), c"gone").unwrap_err();
        assert_eq!(gone.raw_os_error(), Some(libc::ENOENT));
        let slash = open_dir_path(Path::new("/")).unwrap();
        let (_, mount_root) = stat_entry(slash.as_raw_fd(), c"").unwrap();
        assert_ne!(mount_root, Some(false), "/ is a mount's root");
    }

    #[test]
    fn both_paths_open_beneath_without_following_links() {
        let (_dir, root) = setup();
        let root = root.as_raw_fd();
        type Opener = fn(RawFd, &[u8], libc::c_int) -> io::Result<OwnedFd>;
        for open in [open_beneath as Opener, open_beneath_stepwise as Opener] {
            assert_eq!(read(open(root, b"a/b/f", READ_FLAGS).unwrap()), b"data");
            let errno = |p: &[u8]| match open(root, p, READ_FLAGS) {
                Ok(_) => panic!("{} opened", String::from_utf8_lossy(p)),
                Err(e) => e.raw_os_error(),
            };
            // A link as a parent: ELOOP from openat2, ENOTDIR from O_DIRECTORY|O_NOFOLLOW.
            let refused = |e: Option<i32>| matches!(e, Some(libc::ELOOP) | Some(libc::ENOTDIR));
            assert!(refused(errno(b"a/link/f")));
            assert!(refused(errno(b"out/passwd")));
            assert_eq!(errno(b"a/link"), Some(libc::ELOOP));
            assert_eq!(errno(b"a/missing"), Some(libc::ENOENT));
            assert_eq!(errno(b"a/b/f/x"), Some(libc::ENOTDIR));
            assert!(open(root, b"../x", READ_FLAGS).is_err());
            assert!(open(root, b"a/../../x", READ_FLAGS).is_err());
        }
    }

    #[test]
    fn dir_reader_lists_names_with_types() {
        let (dir, _root) = setup();
        let fd = open_dir_path(&dir.path().join("a")).unwrap();
        let mut reader = DirReader::new(fd).unwrap();
        let mut seen = Vec::new();
        while let Some((name, kind)) = reader.next_entry().unwrap() {
            seen.push((name.to_bytes().to_vec(), kind));
        }
        seen.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[0].0, b"b");
        assert!(matches!(seen[0].1, DirentType::Dir | DirentType::Unknown));
        assert_eq!(seen[1].0, b"link");
    }

    /// Blocks of zeros stay holes, the rest is written where it belongs, and
    /// the file reads back as the bytes given.
    #[test]
    fn write_sparse_at_leaves_blocks_of_zeros_as_holes() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let file = std::fs::File::create_new(&path).unwrap();
        let fd = file.as_raw_fd();
        let mut data = vec![0u8; 64 * HOLE_BLOCK];
        data[10] = 1; // the first block has data
        data[40 * HOLE_BLOCK + 7] = 2; // one block in the middle
                                       // Written in pieces that cut blocks anywhere, as a stream arrives.
        let mut skipped = false;
        for (at, piece) in [(0, 5000), (5000, 100_000), (105_000, data.len() - 105_000)] {
            skipped |= write_sparse_at(fd, at as u64, &data[at..at + piece]).unwrap();
        }
        assert!(skipped);
        set_len(fd, data.len() as u64).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), data);
        let meta = std::fs::metadata(&path).unwrap();
        assert!(
            meta.blocks() * 512 <= 8 * HOLE_BLOCK as u64,
            "{} blocks",
            meta.blocks()
        );
        assert_eq!(
            seek_extent(fd, HOLE_BLOCK as u64, false).unwrap(),
            Some(40 * HOLE_BLOCK as u64)
        );
        assert_eq!(seek_extent(fd, 0, true).unwrap(), Some(HOLE_BLOCK as u64));
        // Data without a whole block of zeros is written whole.
        let dense = dir.path().join("g");
        let file = std::fs::File::create_new(&dense).unwrap();
        assert!(!write_sparse_at(file.as_raw_fd(), 0, &[7u8; 3 * HOLE_BLOCK + 5]).unwrap());
        assert_eq!(
            std::fs::read(&dense).unwrap(),
            vec![7u8; 3 * HOLE_BLOCK + 5]
        );
    }

    #[test]
    fn filesystem_clock_moves_forward_and_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let first = filesystem_now(dir.path()).unwrap();
        let second = filesystem_now(dir.path()).unwrap();
        assert!(second >= first);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
