//! What the journal learns from the tree itself: whether the workspace is a
//! filesystem of its own (where a fanotify filesystem mark sees only it), and
//! the directories and hard-linked files beneath a directory (a watch walk).

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::Path;

use crate::fs::{self, DirReader, DirentType};
use crate::policy::PolicyMatcher;

/// Whether `root` (canonical) is the root of a mounted filesystem: a mount
/// whose mount point is `root` and which mounts its filesystem's own root
/// (not a bind mount of a directory inside a larger one).
pub fn is_filesystem_root(root: &Path) -> bool {
    let Ok(table) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let wanted = root.to_string_lossy();
    table.lines().any(|line| {
        // id parent major:minor root mount-point options ...
        let mut fields = line.split(' ');
        let (Some(fs_root), Some(point)) = (fields.nth(3), fields.next()) else {
            return false;
        };
        fs_root == "/" && unescape(point) == wanted
    })
}

/// mountinfo's octal escapes (`\040` for a space) undone.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 4 <= bytes.len()
            && bytes[i + 1..i + 4].iter().all(u8::is_ascii_digit)
        {
            let digits = std::str::from_utf8(&bytes[i + 1..i + 4]).unwrap_or("0");
            out.push(u8::from_str_radix(digits, 8).unwrap_or(b'?'));
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The directory `rel` beneath the root, opened without following links
/// ("" is the root itself: a fresh descriptor of it).
pub fn open_dir(root_fd: RawFd, rel: &str) -> io::Result<OwnedFd> {
    if rel.is_empty() {
        // SAFETY: valid fd and a static C string; the fd is owned below.
        let fd = unsafe { libc::openat(root_fd, c".".as_ptr(), fs::DIR_FLAGS | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fresh fd.
        return Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) });
    }
    fs::open_beneath(root_fd, rel.as_bytes(), fs::DIR_FLAGS)
}

/// What one directory holds, for the journal.
#[derive(Debug, Default)]
pub struct Listed {
    /// Subdirectories a capture would enter (the policy keeps them, their
    /// names are UTF-8, they are on the workspace's filesystem).
    pub dirs: Vec<String>,
    /// Regular files with more than one name: path, (dev, ino), link count.
    pub linked: Vec<(String, (u64, u64), u64)>,
}

/// List the directory `rel`, open as `dir`.
pub fn list(dir: OwnedFd, rel: &str, policy: &PolicyMatcher, root_dev: u64) -> io::Result<Listed> {
    let mut reader = DirReader::new(dir)?;
    let mut listed = Listed::default();
    let mut names: Vec<(Vec<u8>, DirentType)> = Vec::new();
    while let Some((name, kind)) = reader.next_entry()? {
        names.push((name.to_bytes().to_vec(), kind));
    }
    let fd = reader.fd();
    for (name, kind) in names {
        let Ok(text) = std::str::from_utf8(&name) else {
            continue; // never captured (refused by name): nothing to watch
        };
        let path = crate::journal::dirty::join(rel, text);
        let c_name = std::ffi::CString::new(name).expect("a name holds no NUL");
        match kind {
            DirentType::Dir if entered(fd, &c_name, &path, policy, root_dev) => {
                listed.dirs.push(path);
            }
            DirentType::File | DirentType::Unknown => {
                let Ok((stat, links)) = fs::lstat_links_at(fd, &c_name) else {
                    continue;
                };
                if stat.is_dir() {
                    if entered(fd, &c_name, &path, policy, root_dev) {
                        listed.dirs.push(path);
                    }
                } else if stat.is_file() && links > 1 {
                    listed.linked.push((path, (stat.dev, stat.ino), links));
                }
            }
            _ => {}
        }
    }
    Ok(listed)
}

/// Whether a capture enters the subdirectory `name` (at `path`) of `dir`.
fn entered(dir: RawFd, name: &CStr, path: &str, policy: &PolicyMatcher, root_dev: u64) -> bool {
    if policy.excluded(path, true) {
        return false;
    }
    match fs::stat_entry(dir, name) {
        Ok((stat, mount_root)) => {
            stat.is_dir() && !fs::judge_mount_point(&stat, root_dev, || mount_root)
        }
        Err(_) => false,
    }
}

/// The (dev, ino) of the directory at `path` now (not following a link).
pub fn identity(path: &Path) -> Option<(u64, u64)> {
    fs::lstat_path(path).ok().map(|s| (s.dev, s.ino))
}

/// The link count and inode of the entry `rel` beneath the root, when it is
/// a regular file.
pub fn file_links(root_fd: RawFd, rel: &str) -> Option<(u64, (u64, u64))> {
    let (parent, name) = crate::journal::dirty::split(rel);
    let dir = open_dir(root_fd, parent).ok()?;
    let name = std::ffi::CString::new(name).ok()?;
    let (stat, links) = fs::lstat_links_at(dir.as_raw_fd(), &name).ok()?;
    stat.is_file().then_some((links, (stat.dev, stat.ino)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_keeps_entered_directories_and_linked_files() {
        let root = tempfile::tempdir().unwrap();
        let p = root.path();
        std::fs::create_dir_all(p.join("a/b")).unwrap();
        std::fs::create_dir(p.join("node_modules")).unwrap();
        std::fs::write(p.join("a/f"), b"x").unwrap();
        std::fs::hard_link(p.join("a/f"), p.join("g")).unwrap();
        std::fs::write(p.join("h"), b"y").unwrap();
        let policy = PolicyMatcher::new::<&str>(&[], &[], true).unwrap();
        let fd = fs::open_dir_path(p).unwrap();
        let dev = fs::fstat(fd.as_raw_fd()).unwrap().dev;
        let listed = list(open_dir(fd.as_raw_fd(), "").unwrap(), "", &policy, dev).unwrap();
        assert_eq!(listed.dirs, vec!["a".to_string()]);
        assert_eq!(listed.linked.len(), 1);
        assert_eq!(listed.linked[0].0, "g");
        let inner = list(open_dir(fd.as_raw_fd(), "a").unwrap(), "a", &policy, dev).unwrap();
        assert_eq!(inner.dirs, vec!["a/b".to_string()]);
        assert_eq!(inner.linked[0].0, "a/f");
        assert_eq!(inner.linked[0].1, listed.linked[0].1);
        assert_eq!(inner.linked[0].2, 2);
        assert_eq!(file_links(fd.as_raw_fd(), "a/f").unwrap().0, 2);
        assert_eq!(file_links(fd.as_raw_fd(), "h").unwrap().0, 1);
    }

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape("/a\\040b"), "/a b");
        assert!(is_filesystem_root(Path::new("/proc")));
        assert!(!is_filesystem_root(Path::new("/proc/self")));
    }
}
