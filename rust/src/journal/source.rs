//! The kernel's change events, read from an inotify or a fanotify descriptor
//! and parsed into [`Event`]s. Nothing here decides what an event means for
//! the workspace (see `journal::State::apply`).
//!
//! Both descriptors are non-blocking: a read returns what is queued now, so
//! a capture can drain the queue before it takes the change set (every
//! change whose system call returned before that is then in the set: the
//! kernel queues the event before the call returns).

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::{tree, Requested};

/// The directory an event names: an inotify watch, or a fanotify file handle
/// (`handle_type` then the handle's bytes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DirRef {
    Watch(i32),
    Handle(Vec<u8>),
    /// None: an event about a file alone (fanotify's link-count change).
    None,
}

/// One event, as the journal needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub dir: DirRef,
    /// The entry of `dir` it concerns; empty: `dir` itself.
    pub name: Vec<u8>,
    /// A name appeared (created, or moved in).
    pub created: bool,
    /// A name went away (deleted, or moved out).
    pub removed: bool,
    /// The entry is a directory.
    pub is_dir: bool,
    /// `dir` itself was deleted or moved.
    pub self_gone: bool,
    /// The watch is gone (inotify's `IN_IGNORED`).
    pub ignored: bool,
    /// The filesystem holding `dir` was unmounted.
    pub unmounted: bool,
    /// The kernel dropped events (its queue was full).
    pub overflow: bool,
    /// The file handle of the object itself (fanotify: the inode written or
    /// changed, whichever name it was reached by).
    pub object: Option<Vec<u8>>,
}

impl Event {
    fn blank(dir: DirRef) -> Event {
        Event {
            dir,
            name: Vec::new(),
            created: false,
            removed: false,
            is_dir: false,
            self_gone: false,
            ignored: false,
            unmounted: false,
            overflow: false,
            object: None,
        }
    }
}

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// What a directory watch reports: entries created, deleted, moved in or
/// out, written or changed in mode, owner or times, and the directory itself
/// deleted or moved. (`IN_EXCL_UNLINK`: nothing about a file after it left
/// the directory.)
const INOTIFY_MASK: u32 = libc::IN_CREATE
    | libc::IN_DELETE
    | libc::IN_MOVED_FROM
    | libc::IN_MOVED_TO
    | libc::IN_MODIFY
    | libc::IN_ATTRIB
    | libc::IN_DELETE_SELF
    | libc::IN_MOVE_SELF
    | libc::IN_ONLYDIR
    | libc::IN_EXCL_UNLINK;

/// The same events for a whole filesystem, each naming the directory and the
/// entry (`FAN_REPORT_DFID_NAME`) and the object itself (`FAN_REPORT_FID`:
/// the inode, so a write through a name that is gone by the time the event
/// is read still names the file it changed).
const FANOTIFY_MASK: u64 = libc::FAN_CREATE
    | libc::FAN_DELETE
    | libc::FAN_MOVED_FROM
    | libc::FAN_MOVED_TO
    | libc::FAN_MODIFY
    | libc::FAN_ATTRIB
    | libc::FAN_DELETE_SELF
    | libc::FAN_MOVE_SELF
    | libc::FAN_ONDIR;

/// An event descriptor of either kind.
pub enum Source {
    Inotify(OwnedFd),
    Fanotify {
        fd: OwnedFd,
        /// Any descriptor on the watched filesystem, for `open_by_handle_at`.
        mount: OwnedFd,
    },
}

impl Source {
    pub fn inotify() -> io::Result<Source> {
        // SAFETY: plain system call; the fd is owned below.
        let fd = check(unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) })?;
        // SAFETY: fresh fd.
        Ok(Source::Inotify(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// A fanotify descriptor with a filesystem mark on the filesystem holding
    /// `root` (opened as `root_fd`). EPERM without CAP_SYS_ADMIN; EINVAL or
    /// EOPNOTSUPP on a kernel or filesystem without directory-entry events.
    pub fn fanotify(root: &Path, root_fd: RawFd) -> io::Result<Source> {
        // SAFETY: plain system call; the fd is owned below.
        let fd = check(unsafe {
            libc::fanotify_init(
                libc::FAN_CLASS_NOTIF
                    | libc::FAN_REPORT_DFID_NAME
                    | libc::FAN_REPORT_FID
                    | libc::FAN_NONBLOCK
                    | libc::FAN_CLOEXEC,
                (libc::O_RDONLY | libc::O_CLOEXEC) as libc::c_uint,
            )
        })?;
        // SAFETY: fresh fd.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let path = CString::new(root.as_os_str().as_bytes())
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: valid fds and C string.
        check(unsafe {
            libc::fanotify_mark(
                fd.as_raw_fd(),
                libc::FAN_MARK_ADD | libc::FAN_MARK_FILESYSTEM,
                FANOTIFY_MASK,
                libc::AT_FDCWD,
                path.as_ptr(),
            )
        })?;
        // SAFETY: valid fd; a fresh descriptor of the root for handle lookups.
        let mount = check(unsafe {
            libc::openat(
                root_fd,
                c".".as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        })?;
        Ok(Source::Fanotify {
            fd,
            // SAFETY: fresh fd.
            mount: unsafe { OwnedFd::from_raw_fd(mount) },
        })
    }

    pub fn fd(&self) -> RawFd {
        match self {
            Source::Inotify(fd) => fd.as_raw_fd(),
            Source::Fanotify { fd, .. } => fd.as_raw_fd(),
        }
    }

    /// Watch the directory open as `dir` (inotify; fanotify watches the whole
    /// filesystem already: None). Added through `/proc/self/fd`, so it is the
    /// directory that was opened beneath the root, whatever its path holds now.
    pub fn watch(&self, dir: RawFd) -> io::Result<Option<i32>> {
        let Source::Inotify(fd) = self else {
            return Ok(None);
        };
        let path = CString::new(format!("/proc/self/fd/{dir}")).expect("no NUL");
        // SAFETY: valid fd and C string.
        let wd =
            check(unsafe { libc::inotify_add_watch(fd.as_raw_fd(), path.as_ptr(), INOTIFY_MASK) })?;
        Ok(Some(wd))
    }

    /// Stop an inotify watch (its `IN_IGNORED` follows).
    pub fn unwatch(&self, wd: i32) {
        if let Source::Inotify(fd) = self {
            // SAFETY: valid fd; an unknown wd only returns EINVAL.
            unsafe { libc::inotify_rm_watch(fd.as_raw_fd(), wd) };
        }
    }

    /// Read what is queued now into `out` (nothing when the queue is empty).
    pub fn read(&self, buffer: &mut [u8], out: &mut Vec<Event>) -> io::Result<()> {
        loop {
            // SAFETY: valid fd and a writable buffer of that length.
            let n = unsafe { libc::read(self.fd(), buffer.as_mut_ptr().cast(), buffer.len()) };
            if n < 0 {
                let error = io::Error::last_os_error();
                return match error.raw_os_error() {
                    Some(libc::EAGAIN) => Ok(()),
                    Some(libc::EINTR) => continue,
                    _ => Err(error),
                };
            }
            if n == 0 {
                return Ok(());
            }
            let bytes = &buffer[..n as usize];
            match self {
                Source::Inotify(_) => parse_inotify(bytes, out),
                Source::Fanotify { .. } => parse_fanotify(bytes, out),
            }
        }
    }

    /// The (dev, ino) and link count of the file a fanotify handle names
    /// (None: gone, unlinked, or not resolvable).
    pub fn inode_of(&self, handle: &[u8]) -> Option<((u64, u64), u64)> {
        let fd = self.open_handle(handle, libc::O_PATH)?;
        let (stat, links) = crate::fs::fstat_links(fd.as_raw_fd()).ok()?;
        (links > 0).then_some(((stat.dev, stat.ino), links))
    }

    /// A path of the file a fanotify handle names, as the kernel resolves it
    /// now (None: gone, or not resolvable).
    pub fn path_of(&self, handle: &[u8]) -> Option<Vec<u8>> {
        let fd = self.open_handle(handle, libc::O_PATH)?;
        let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).ok()?;
        let link = link.as_os_str().as_bytes();
        (!link.ends_with(b" (deleted)")).then(|| link.to_vec())
    }

    /// The path of the directory a fanotify handle names, as the kernel
    /// resolves it now (None: gone, or not resolvable).
    pub fn resolve(&self, handle: &[u8]) -> Option<Vec<u8>> {
        let fd = self.open_handle(handle, libc::O_PATH | libc::O_DIRECTORY)?;
        let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).ok()?;
        let link = link.as_os_str().as_bytes();
        // A directory that was deleted meanwhile still resolves, so named.
        (!link.ends_with(b" (deleted)")).then(|| link.to_vec())
    }

    /// `open_by_handle_at` of a fanotify handle (`handle_type ++ f_handle`).
    fn open_handle(&self, handle: &[u8], flags: libc::c_int) -> Option<OwnedFd> {
        let Source::Fanotify { mount, .. } = self else {
            return None;
        };
        if handle.len() < 4 {
            return None;
        }
        let (kind, bytes) = handle.split_at(4);
        let header = std::mem::size_of::<libc::file_handle>();
        // A file_handle followed by its bytes, 8-byte aligned.
        let mut storage = vec![0u64; (header + bytes.len()).div_ceil(8)];
        let raw = storage.as_mut_ptr().cast::<u8>();
        // SAFETY: `storage` holds the header and the bytes; the header's
        // fields are written through an unaligned-safe path.
        unsafe {
            let fh = raw.cast::<libc::file_handle>();
            (*fh).handle_bytes = bytes.len() as libc::c_uint;
            (*fh).handle_type = i32::from_ne_bytes(kind.try_into().expect("4 bytes"));
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), raw.add(header), bytes.len());
        }
        // SAFETY: a well-formed file_handle; the fd is owned below.
        let fd = unsafe {
            libc::open_by_handle_at(mount.as_raw_fd(), raw.cast(), flags | libc::O_CLOEXEC)
        };
        if fd < 0 {
            return None;
        }
        // SAFETY: fresh fd.
        Some(unsafe { OwnedFd::from_raw_fd(fd) })
    }
}

/// The source for `requested`, its mode and why.
pub fn choose(
    root: &Path,
    root_fd: i32,
    requested: Requested,
) -> (Option<Source>, &'static str, String) {
    let fanotify = || Source::fanotify(root, root_fd);
    let inotify = |why: String| match Source::inotify() {
        Ok(source) => (Some(source), "inotify", why),
        Err(e) => (None, "off", format!("inotify cannot start: {e}")),
    };
    match requested {
        Requested::Off => (None, "off", "--watch off".into()),
        Requested::Fanotify => match fanotify() {
            Ok(source) => (Some(source), "fanotify", "--watch fanotify".into()),
            Err(e) => (
                None,
                "off",
                format!("fanotify cannot watch the workspace: {e}"),
            ),
        },
        Requested::Inotify => inotify("--watch inotify".into()),
        Requested::Auto if tree::is_filesystem_root(root) => match fanotify() {
            Ok(source) => (
                Some(source),
                "fanotify",
                "the workspace is a filesystem of its own".into(),
            ),
            Err(e) => inotify(format!("fanotify is not allowed here ({e})")),
        },
        Requested::Auto => inotify(
            "the workspace shares its filesystem, where a fanotify mark would see every write"
                .into(),
        ),
    }
}

/// The kernel's queue bound for this source's kind.
pub fn queue_limit(source: &Source) -> String {
    match source {
        Source::Inotify(_) => read_limit("max_queued_events"),
        Source::Fanotify { .. } => {
            std::fs::read_to_string("/proc/sys/fs/fanotify/max_queued_events")
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "16384".into())
        }
    }
}

pub fn read_limit(name: &str) -> String {
    std::fs::read_to_string(format!("/proc/sys/fs/inotify/{name}"))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

fn parse_inotify(mut bytes: &[u8], out: &mut Vec<Event>) {
    const HEAD: usize = std::mem::size_of::<libc::inotify_event>();
    while bytes.len() >= HEAD {
        let field = |at: usize| u32::from_ne_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
        let (wd, mask, len) = (field(0) as i32, field(4), field(12) as usize);
        let end = (HEAD + len).min(bytes.len());
        let name = &bytes[HEAD..end];
        let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
        let mut event = Event::blank(DirRef::Watch(wd));
        event.name = name.to_vec();
        event.created = mask & (libc::IN_CREATE | libc::IN_MOVED_TO) != 0;
        event.removed = mask & (libc::IN_DELETE | libc::IN_MOVED_FROM) != 0;
        event.is_dir = mask & libc::IN_ISDIR != 0;
        event.self_gone = mask & (libc::IN_DELETE_SELF | libc::IN_MOVE_SELF) != 0;
        event.ignored = mask & libc::IN_IGNORED != 0;
        event.unmounted = mask & libc::IN_UNMOUNT != 0;
        event.overflow = mask & libc::IN_Q_OVERFLOW != 0;
        out.push(event);
        bytes = &bytes[end..];
    }
}

fn parse_fanotify(mut bytes: &[u8], out: &mut Vec<Event>) {
    const META: usize = std::mem::size_of::<libc::fanotify_event_metadata>();
    while bytes.len() >= META {
        let event_len = u32::from_ne_bytes(bytes[0..4].try_into().expect("4 bytes")) as usize;
        let metadata_len = u16::from_ne_bytes(bytes[6..8].try_into().expect("2 bytes")) as usize;
        let mask = u64::from_ne_bytes(bytes[8..16].try_into().expect("8 bytes"));
        if event_len < META || event_len > bytes.len() {
            break;
        }
        let mut event = Event::blank(DirRef::None);
        event.overflow = mask & libc::FAN_Q_OVERFLOW != 0;
        event.created = mask & (libc::FAN_CREATE | libc::FAN_MOVED_TO) != 0;
        event.removed = mask & (libc::FAN_DELETE | libc::FAN_MOVED_FROM) != 0;
        event.is_dir = mask & libc::FAN_ONDIR != 0;
        event.self_gone = mask & (libc::FAN_DELETE_SELF | libc::FAN_MOVE_SELF) != 0;
        let mut info = &bytes[metadata_len.min(event_len)..event_len];
        while info.len() >= 4 {
            let (kind, len) = (info[0], u16::from_ne_bytes([info[2], info[3]]) as usize);
            if len < 4 || len > info.len() {
                break;
            }
            if kind == libc::FAN_EVENT_INFO_TYPE_FID {
                event.object = file_handle(&info[12..len]).map(|(handle, _)| handle);
            } else if kind == libc::FAN_EVENT_INFO_TYPE_DFID_NAME
                || kind == libc::FAN_EVENT_INFO_TYPE_DFID
            {
                // header (4), fsid (8), then a file_handle and, for DFID_NAME, the name.
                if let Some((handle, rest)) = file_handle(&info[12..len]) {
                    event.dir = DirRef::Handle(handle);
                    if kind == libc::FAN_EVENT_INFO_TYPE_DFID_NAME {
                        let name = &rest[..rest.iter().position(|&b| b == 0).unwrap_or(rest.len())];
                        // "." names the directory itself.
                        event.name = if name == b"." {
                            Vec::new()
                        } else {
                            name.to_vec()
                        };
                    }
                }
            }
            info = &info[len..];
        }
        out.push(event);
        bytes = &bytes[event_len..];
    }
}

/// A `struct file_handle` at the start of `bytes` as `handle_type ++ f_handle`,
/// and what follows it.
fn file_handle(bytes: &[u8]) -> Option<(Vec<u8>, &[u8])> {
    let size = u32::from_ne_bytes(bytes.get(0..4)?.try_into().ok()?) as usize;
    let kind = bytes.get(4..8)?;
    let handle = bytes.get(8..8 + size)?;
    let mut key = kind.to_vec();
    key.extend_from_slice(handle);
    Some((key, &bytes[8 + size..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(source: &Source) -> Vec<Event> {
        let mut buffer = vec![0u8; 1 << 16];
        let mut out = Vec::new();
        source.read(&mut buffer, &mut out).unwrap();
        out
    }

    #[test]
    fn inotify_names_the_directory_and_the_entry() {
        let dir = tempfile::tempdir().unwrap();
        let source = Source::inotify().unwrap();
        let fd = crate::fs::open_dir_path(dir.path()).unwrap();
        let wd = source.watch(fd.as_raw_fd()).unwrap().unwrap();
        std::fs::write(dir.path().join("f"), b"x").unwrap();
        std::fs::create_dir(dir.path().join("d")).unwrap();
        std::fs::rename(dir.path().join("d"), dir.path().join("e")).unwrap();
        let events = drain(&source);
        assert!(events.iter().all(|e| e.dir == DirRef::Watch(wd)));
        let created: Vec<_> = events
            .iter()
            .filter(|e| e.created)
            .map(|e| (e.name.clone(), e.is_dir))
            .collect();
        assert_eq!(
            created,
            vec![
                (b"f".to_vec(), false),
                (b"d".to_vec(), true),
                (b"e".to_vec(), true)
            ]
        );
        assert!(events.iter().any(|e| e.removed && e.name == b"d"));
        assert!(drain(&source).is_empty());
    }

    #[test]
    fn fanotify_names_the_directory_by_handle_when_allowed() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let fd = crate::fs::open_dir_path(&root).unwrap();
        let Ok(source) = Source::fanotify(&root, fd.as_raw_fd()) else {
            // Not root here: the inotify test covers the rest.
            return;
        };
        std::fs::create_dir(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/f"), b"x").unwrap();
        let events = drain(&source);
        let mine: Vec<_> = events
            .iter()
            .filter_map(|e| match &e.dir {
                DirRef::Handle(h) => {
                    Some((source.resolve(h)?, e.name.clone(), e.created, e.is_dir))
                }
                DirRef::Watch(_) | DirRef::None => None,
            })
            .filter(|(path, ..)| path.starts_with(root.as_os_str().as_bytes()))
            .collect();
        let root_bytes = root.as_os_str().as_bytes().to_vec();
        let mut sub = root_bytes.clone();
        sub.extend_from_slice(b"/sub");
        assert!(
            mine.contains(&(root_bytes, b"sub".to_vec(), true, true)),
            "{mine:?}"
        );
        assert!(
            mine.iter()
                .any(|(p, n, c, d)| p == &sub && n == b"f" && *c && !d),
            "{mine:?}"
        );
        // The file itself is named too: its inode, whatever name reached it.
        use std::os::unix::fs::MetadataExt;
        let file = std::fs::symlink_metadata(root.join("sub/f")).unwrap();
        let object = events
            .iter()
            .filter(|e| e.name == b"f")
            .find_map(|e| e.object.clone())
            .expect("an object handle");
        assert_eq!(
            source.inode_of(&object),
            Some(((file.dev(), file.ino()), 1))
        );
    }
}
