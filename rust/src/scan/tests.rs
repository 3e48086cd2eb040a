use std::os::fd::RawFd;

use crate::cancel::Cancel;
use crate::walk::{FileSlot, Kind};

use super::hashing::HashTask;
use super::*;

/// Names where the order of full paths differs from a depth-first walk
/// with children sorted by name: `-` (0x2d) and `.` (0x2e) sort before
/// `/` (0x2f), `0` after it, and a name can be a prefix of another.
#[test]
fn in_path_order_is_the_order_of_full_paths() {
    use crate::fs::Stat;
    let dirs = ["", "a", "a/x", "a-b", "a0", "b", "a.b/c", "a.b"];
    let file = || {
        Kind::File(FileSlot {
            stat: Stat::default(),
            hash: None,
            vanished: false,
            secrets: crate::walk::SecretSpans::default(),
        })
    };
    let dir = || Kind::Dir {
        mode: 0o755,
        included: true,
    };
    let mut batches: Vec<Batch> = Vec::new();
    let mut expected: Vec<String> = Vec::new();
    for parent in dirs {
        let prefix = if parent.is_empty() {
            String::new()
        } else {
            format!("{parent}/")
        };
        let mut children: Vec<(String, Kind)> = Vec::new();
        for child in dirs
            .iter()
            .filter(|d| !d.is_empty() && d.starts_with(&prefix) && !d[prefix.len()..].contains('/'))
        {
            children.push((child[prefix.len()..].to_string(), dir()));
            expected.push(child.to_string());
        }
        for name in ["a", "a-", "a0", "a.", "z", "é"] {
            let path = format!("{prefix}{name}");
            if !dirs.contains(&path.as_str()) {
                children.push((name.to_string(), file()));
                expected.push(path);
            }
        }
        children.reverse(); // the walk's order is arbitrary
        let mut batch = Batch {
            dir: parent.to_string(),
            ..Batch::default()
        };
        for (name, kind) in children {
            batch.entries.push(crate::walk::Entry {
                name_at: batch.names.len() as u32,
                name_len: name.len() as u16,
                kind,
            });
            batch.names.push_str(&name);
        }
        batches.push(batch);
    }
    batches.reverse();
    expected.sort();
    let rows = in_path_order(batches);
    let mut path = String::new();
    let got: Vec<String> = rows
        .order
        .iter()
        .map(|&r| {
            rows.path(r, &mut path);
            path.clone()
        })
        .collect();
    assert_eq!(got, expected);
}

/// `hash_slot` of `path` (from `root`), opened as `at`, as the walk left
/// it: `stat` is the walk's lstat.
fn hash_at(
    at: (RawFd, &str),
    root: &Path,
    path: &str,
    stat: crate::fs::Stat,
) -> (Result<u64, ScanError>, FileSlot) {
    let mut slot = FileSlot {
        stat,
        hash: None,
        vanished: false,
        secrets: crate::walk::SecretSpans::default(),
    };
    let cx = HashContext {
        root_path: root,
        secrets: &SecretSet::empty(),
        cancel: &Cancel::new(),
        sinks: Sinks::default(),
    };
    let done = hash_slot(at, path, &mut slot, &cx);
    (done, slot)
}

/// [`hash_at`] of `name` beneath `dir`, by name from an fd of `dir`.
fn hash_walked(
    dir: &Path,
    name: &str,
    stat: crate::fs::Stat,
) -> (Result<u64, ScanError>, FileSlot) {
    let root = crate::fs::open_dir_path(dir).unwrap();
    hash_at((root.as_raw_fd(), name), dir, name, stat)
}

fn lstat(dir: &Path, name: &str) -> crate::fs::Stat {
    let root = crate::fs::open_dir_path(dir).unwrap();
    let name = std::ffi::CString::new(name).unwrap();
    crate::fs::lstat_at(root.as_raw_fd(), &name).unwrap()
}

/// A directory with the file `f` holding "hello", and the walk's lstat of it.
fn walked_file() -> (tempfile::TempDir, std::path::PathBuf, crate::fs::Stat) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f");
    std::fs::write(&path, b"hello").unwrap();
    let walked = lstat(dir.path(), "f");
    (dir, path, walked)
}

#[test]
fn a_task_hashes_its_files_by_name_beneath_its_directory() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("a/b")).unwrap();
    std::fs::write(root.path().join("a/b/f"), b"hello").unwrap();
    let walked = lstat(&root.path().join("a/b"), "f");
    let root_fd = crate::fs::open_dir_path(root.path()).unwrap();
    assert!(HashTask::new("").open_dir(root_fd.as_raw_fd()).is_none());
    let dir_fd = HashTask::new("a/b").open_dir(root_fd.as_raw_fd()).unwrap();
    for at in [(dir_fd.as_raw_fd(), "f"), (root_fd.as_raw_fd(), "a/b/f")] {
        let (done, slot) = hash_at(at, root.path(), "a/b/f", walked);
        assert_eq!(done.unwrap(), 5);
        assert_eq!(slot.hash, Some(*blake3::hash(b"hello").as_bytes()));
        assert_eq!(slot.stat, walked);
    }
}

#[test]
fn a_directory_swapped_for_a_link_after_the_walk_is_not_entered() {
    let root = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("d")).unwrap();
    std::fs::write(root.path().join("d/f"), b"inside").unwrap();
    let walked = lstat(&root.path().join("d"), "f");
    // The directory moves out and a link to it takes its place.
    std::fs::rename(root.path().join("d"), outside.path().join("d")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("d"), root.path().join("d")).unwrap();
    let root_fd = crate::fs::open_dir_path(root.path()).unwrap();
    assert!(HashTask::new("d").open_dir(root_fd.as_raw_fd()).is_none());
    // So its files are opened by their whole path, which refuses the link.
    let (done, slot) = hash_at((root_fd.as_raw_fd(), "d/f"), root.path(), "d/f", walked);
    assert!(matches!(done, Err(ScanError::Changed(_))), "{done:?}");
    assert_eq!(slot.hash, None);
}

#[test]
fn a_small_file_unchanged_since_the_walk_is_hashed_with_the_walks_stat() {
    let (dir, _path, walked) = walked_file();
    let (done, slot) = hash_walked(dir.path(), "f", walked);
    assert_eq!(done.unwrap(), 5);
    assert_eq!(slot.hash, Some(*blake3::hash(b"hello").as_bytes()));
    assert_eq!(slot.stat, walked);
}

#[test]
fn a_small_file_rewritten_after_the_walk_is_hashed_as_it_is_now() {
    let (dir, path, walked) = walked_file();
    // Same size, other bytes, another mtime: the walk's stat no longer holds.
    std::fs::write(&path, b"HELLO").unwrap();
    let past = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
    let file = std::fs::File::options().write(true).open(&path).unwrap();
    file.set_modified(past).unwrap();
    let (done, slot) = hash_walked(dir.path(), "f", walked);
    assert!(done.is_ok());
    assert_eq!(slot.hash, Some(*blake3::hash(b"HELLO").as_bytes()));
    assert_eq!(slot.stat, lstat(dir.path(), "f"));
    assert_ne!(slot.stat, walked);
}

#[test]
fn a_fifo_swapped_in_after_the_walk_is_a_change_even_with_a_writer() {
    let (dir, path, walked) = walked_file();
    std::fs::remove_file(&path).unwrap();
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    // A writer that keeps the fifo full: an unbounded read would never end.
    let writer = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let feeding = std::thread::spawn(move || {
        let mut writer = writer;
        let block = [7u8; 4096];
        while std::io::Write::write_all(&mut writer, &block).is_ok() {}
    });
    let (done, slot) = hash_walked(dir.path(), "f", walked);
    assert!(matches!(done, Err(ScanError::Changed(_))), "{done:?}");
    assert_eq!(slot.hash, None);
    std::fs::remove_file(&path).unwrap();
    drop(feeding); // detached: it ends with the test process
}
