use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::Path;

use super::open::open_beneath_stepwise;
use super::*;

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

#[test]
fn a_directory_marked_top_of_hierarchy_keeps_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let fd = open_dir_path(dir.path()).unwrap();
    match mark_top_of_hierarchy(fd.as_raw_fd()) {
        Ok(()) => {
            let mut flags: libc::c_int = 0;
            // SAFETY: valid fd; the kernel writes one int.
            assert_eq!(
                unsafe { libc::ioctl(fd.as_raw_fd(), libc::FS_IOC_GETFLAGS, &mut flags) },
                0
            );
            assert_ne!(flags & super::write::TOPDIR_FLAG, 0, "flags {flags:#x}");
            // Marking it again changes nothing and is no error.
            mark_top_of_hierarchy(fd.as_raw_fd()).unwrap();
        }
        // A filesystem without the flag (tmpfs) refuses it, and that is all.
        Err(e) => assert!(
            matches!(e.raw_os_error(), Some(libc::ENOTTY | libc::EOPNOTSUPP)),
            "{e}"
        ),
    }
}
