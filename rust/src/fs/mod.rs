//! Thin, safe wrappers over the Linux calls the scanner needs: opening beneath a
//! root without following symlinks, `fstatat`, `readlinkat` and a raw directory
//! reader that yields names with their `d_type`.
//!
//! Why raw calls: the walk must never follow a symlink, not even in a parent
//! component (code in the sandbox can swap a directory for a link to `/etc` while
//! we scan). `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` guarantees that in
//! one call; where the kernel lacks it we open one component at a time with
//! `O_NOFOLLOW`.

mod data;
mod dir;
mod open;
mod stat;
mod write;

#[cfg(test)]
mod tests;

use std::ffi::CString;
use std::io;

pub use data::{
    copy_fd, read_full_at, seek_extent, set_len, write_all, write_sparse_at, HOLE_BLOCK,
};
pub use dir::{DirReader, DirentType};
pub use open::{open_beneath, open_dir_path, open_to_read, DIR_FLAGS, READ_FLAGS};
pub use stat::{
    filesystem_now, fstat, fstat_links, is_mount_point, is_mount_point_fd, is_mount_root_at,
    judge_mount_point, lstat_at, lstat_links_at, lstat_path, mount_id, readlink_at, stat_entry,
};
pub use write::{
    create_file_at, create_file_mode_at, current_umask, fchmod, mark_top_of_hierarchy, mkdir_at,
    open_dir_at, open_dir_beneath_same_mount, open_leaf_at, open_subdir, rename_at, rmdir_at,
    set_mtime, symlink_at, syncfs, try_lock_exclusive, unlink_at,
};

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
