//! Large files patched in place. A file stored as chunks whose live version
//! at the same path already holds at least half of the target's bytes, as
//! the same chunks at the same offsets (as the restore's live scan found
//! them), is not built whole in staging: staging gets only the chunks that
//! differ, end to end in a small patch file, and apply writes them into the
//! live file at their offsets. A 2 GiB file with a few changed pages costs a
//! few MiB of writes, not 2 GiB.
//!
//! The live file is patched only when its inode is the workspace's alone (a
//! regular file with one link, on the workspace's filesystem, not a mount
//! point), and apply opens it again without following links and patches it
//! only when it is the inode planned with, unchanged since (dev, ino, size,
//! mtime, ctime). Before a byte of it changes, the bytes the patch overwrites
//! are saved in staging. Once patched, it is read back whole: unless it holds
//! the checkpoint's bytes (it changed under the restore, or its cached chunk
//! list no longer described it), the saved bytes are written back and the
//! restore fails with the path; the file then has a new ctime, so running
//! the restore again scans it afresh. Only a file read back so is learned by
//! the stat cache. A restore that zeroes secrets rebuilds files whole (their
//! live bytes may hold the secrets).
//!
//! A patch is not atomic as a rename is: a restore killed while it patches
//! leaves that one file part old, part new. Running the restore again
//! completes it.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileExt;
use std::sync::Mutex;

use super::dirs::DirStack;
use super::{in_place, InPlace, Restore, RestoreError};
use crate::chunk::ChunkRef;
use crate::fs::{self, Stat};
use crate::hash::{self};
use crate::statcache::CacheEntry;

/// At least this share of a file's bytes must stay where they are for it to
/// be patched in place (1/2).
const KEPT_SHARE_DIVISOR: u64 = 2;

/// One chunk the patch writes: where in the file, its length, where in the
/// patch file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    pub offset: u64,
    pub len: u32,
    pub staged_at: u64,
}

/// Chunks with their offsets in the file.
pub type Placed = Vec<(u64, ChunkRef)>;

/// A write of the plan done as a patch of the live file.
pub struct Patch {
    /// The plan's write index.
    pub index: usize,
    pub pieces: Vec<Piece>,
    /// The live file when the restore planned the patch.
    planned: Stat,
    /// The staged patch file, once every piece is in it.
    ready: Mutex<Option<OwnedFd>>,
}

/// The target's chunks split into those the live file holds at the same
/// offset (kept) and the others (changed), each with its offset; None when
/// less than half the target's bytes would be kept.
pub fn split_kept(target: &[ChunkRef], live: &[ChunkRef]) -> Option<(Placed, Placed)> {
    let (mut kept, mut changed) = (Vec::new(), Vec::new());
    let (mut kept_bytes, mut size) = (0u64, 0u64);
    let mut live_chunks = live.iter();
    let mut live_at = 0u64;
    let mut next_live = live_chunks.next();
    for c in target {
        while let Some(l) = next_live.filter(|_| live_at < size) {
            live_at += u64::from(l.len);
            next_live = live_chunks.next();
        }
        if next_live.is_some_and(|l| live_at == size && l == c) {
            kept.push((size, *c));
            kept_bytes += u64::from(c.len);
        } else {
            changed.push((size, *c));
        }
        size += u64::from(c.len);
    }
    (size > 0 && kept_bytes * KEPT_SHARE_DIVISOR >= size).then_some((kept, changed))
}

/// The stat of the live file `path` beneath `root_fd` when it may be
/// patched: its inode is the workspace's alone and it is `size` bytes long
/// (the length its chunk list gives).
pub fn patchable(root_fd: RawFd, path: &str, ws_dev: u64, size: u64) -> Option<Stat> {
    let fd = fs::open_to_read(root_fd, path.as_bytes()).ok()?;
    own_inode(fd.as_raw_fd(), ws_dev).filter(|stat| stat.size == size)
}

/// The stat of the open file `fd` when its inode is the workspace's alone
/// ([`in_place`]).
pub fn own_inode(fd: RawFd, ws_dev: u64) -> Option<Stat> {
    match in_place(fd, ws_dev) {
        Ok(InPlace::Own(stat)) => Some(stat),
        _ => None,
    }
}

fn same_inode(a: &Stat, b: &Stat) -> bool {
    (a.dev, a.ino, a.size, a.mtime_ns, a.ctime_ns) == (b.dev, b.ino, b.size, b.mtime_ns, b.ctime_ns)
}

impl Patch {
    pub fn new(index: usize, changed: &[(u64, ChunkRef)], planned: Stat) -> Patch {
        let mut staged_at = 0u64;
        let pieces = changed
            .iter()
            .map(|(offset, c)| {
                let piece = Piece {
                    offset: *offset,
                    len: c.len,
                    staged_at,
                };
                staged_at += u64::from(c.len);
                piece
            })
            .collect();
        Patch {
            index,
            pieces,
            planned,
            ready: Mutex::new(None),
        }
    }

    /// Every piece is in the patch file `fd`.
    pub fn set_ready(&self, fd: OwnedFd) {
        *self.ready.lock().unwrap_or_else(|e| e.into_inner()) = Some(fd);
    }

    /// Save into `undo` the bytes of `live` (`old_size` long) the pieces
    /// overwrite, end to end in piece order.
    fn save_overwritten(&self, live: &File, old_size: u64, undo: &File) -> io::Result<()> {
        self.copy_overwritten(old_size, |data, offset, at| {
            live.read_exact_at(data, offset)?;
            undo.write_all_at(data, at)
        })
    }

    /// Write back what [`Patch::save_overwritten`] saved and the old length.
    fn put_back(&self, live: &File, old_size: u64, undo: &File) -> io::Result<()> {
        self.copy_overwritten(old_size, |data, offset, at| {
            undo.read_exact_at(data, at)?;
            live.write_all_at(data, offset)
        })?;
        live.set_len(old_size)
    }

    /// `copy(buffer, offset in the file, offset in the undo file)` for each
    /// piece's bytes that overwrite a file `old_size` long.
    fn copy_overwritten(
        &self,
        old_size: u64,
        mut copy: impl FnMut(&mut [u8], u64, u64) -> io::Result<()>,
    ) -> io::Result<()> {
        let mut buffer = self.buffer();
        let mut at = 0u64;
        for piece in &self.pieces {
            let n = overwritten(piece, old_size);
            if n > 0 {
                copy(&mut buffer[..n as usize], piece.offset, at)?;
                at += n;
            }
        }
        Ok(())
    }

    /// Copy every piece from the patch file into `live` and give it the
    /// target's length.
    fn write_into(&self, live: &File, size: u64) -> io::Result<()> {
        let ready = self.ready.lock().unwrap_or_else(|e| e.into_inner());
        let Some(staged) = ready.as_ref() else {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "its changed chunks were never staged",
            ));
        };
        let staged = borrowed(staged);
        let mut buffer = self.buffer();
        for piece in &self.pieces {
            let data = &mut buffer[..piece.len as usize];
            staged.read_exact_at(data, piece.staged_at)?;
            live.write_all_at(data, piece.offset)?;
        }
        live.set_len(size)
    }

    fn buffer(&self) -> Vec<u8> {
        vec![0u8; self.pieces.iter().map(|p| p.len).max().unwrap_or(0) as usize]
    }
}

/// The bytes of a file `old_size` long that writing `piece` overwrites.
fn overwritten(piece: &Piece, old_size: u64) -> u64 {
    old_size
        .saturating_sub(piece.offset)
        .min(u64::from(piece.len))
}

/// A `File` view of an fd the caller keeps open.
fn borrowed(fd: &OwnedFd) -> std::mem::ManuallyDrop<File> {
    // SAFETY: the view never closes the fd (ManuallyDrop) and lives no
    // longer than the caller's borrow of it.
    std::mem::ManuallyDrop::new(unsafe {
        <File as std::os::fd::FromRawFd>::from_raw_fd(fd.as_raw_fd())
    })
}

impl Restore {
    /// Write `index` as the patch `patch` of the live file at its path (see
    /// the module): the overwritten bytes saved, the pieces written, mode and
    /// mtime set, the file read back whole (put back as it was unless it
    /// holds the checkpoint's bytes).
    pub(super) fn patch_in_place(
        &self,
        dirs: &mut DirStack<'_>,
        index: usize,
        patch: &Patch,
    ) -> Result<(), RestoreError> {
        let entry = &self.plan.writes[index];
        let path = entry.path.as_bytes();
        let shown = || self.ws.shown(path);
        let Some((parent_fd, leaf)) = self.reach_parent(dirs, path)? else {
            return Ok(());
        };
        let fd = fs::open_leaf_at(parent_fd, &leaf, libc::O_RDWR)
            .map_err(|e| RestoreError::raced(shown(), "open to patch", e))?;
        if !own_inode(fd.as_raw_fd(), self.ws.dev)
            .is_some_and(|now| same_inode(&now, &patch.planned))
        {
            return Err(changed(
                shown(),
                "it is not the file the restore planned to patch",
            ));
        }
        let live = File::from(fd);
        let undo = File::from(
            fs::create_file_mode_at(self.staging.as_raw_fd(), &undo_name(index), 0o600).map_err(
                |e| RestoreError::io(self.shown_staging(&undo_name(index)), "create", e),
            )?,
        );
        let old_size = patch.planned.size;
        patch
            .save_overwritten(&live, old_size, &undo)
            .map_err(|e| RestoreError::io(shown(), "save before patching", e))?;
        patch
            .write_into(&live, entry.size)
            .map_err(|e| RestoreError::io(shown(), "patch", e))?;
        let raw = live.as_raw_fd();
        set_mode_and_mtime(raw, entry.mode, entry.mtime_ns)
            .map_err(|e| RestoreError::raced(shown(), "chmod", e))?;
        // The stat the cache may learn, then the bytes read back after it.
        let stat = fs::fstat(raw).map_err(|e| RestoreError::raced(shown(), "fstat", e))?;
        let holds = stat.size == entry.size
            && hash::file_holds(raw, entry.size, &entry.hash, None)
                .map_err(|e| RestoreError::io(shown(), "read back", e))?;
        if !holds {
            patch
                .put_back(&live, old_size, &undo)
                .and_then(|()| set_mode_and_mtime(raw, patch.planned.mode, patch.planned.mtime_ns))
                .map_err(|e| RestoreError::io(shown(), "put back after a failed patch", e))?;
            return Err(changed(
                shown(),
                "it did not hold the checkpoint's bytes once patched",
            ));
        }
        self.count_written([entry.size]);
        if self.record && !entry.secrets {
            self.record_written(entry.path.clone(), CacheEntry::new(&stat, entry.hash));
        }
        Ok(())
    }
}

fn set_mode_and_mtime(fd: RawFd, mode: u32, mtime_ns: i64) -> io::Result<()> {
    fs::fchmod(fd, mode & 0o777)?;
    fs::set_mtime(fd, mtime_ns)
}

fn undo_name(index: usize) -> std::ffi::CString {
    std::ffi::CString::new(format!("u-{index}")).expect("no NUL")
}

fn changed(path: String, why: &str) -> RestoreError {
    RestoreError::Changed {
        path,
        op: "patch",
        source: io::Error::other(why.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(tag: u8, len: u32) -> ChunkRef {
        ChunkRef {
            digest: [tag; 32],
            len,
        }
    }

    #[test]
    fn keeps_chunks_at_the_same_offsets_only() {
        let live = [c(1, 10), c(2, 10), c(3, 10), c(4, 10)];
        let target = [c(1, 10), c(9, 10), c(3, 10), c(4, 10)];
        let (kept, changed) = split_kept(&target, &live).unwrap();
        assert_eq!(kept, vec![(0, c(1, 10)), (20, c(3, 10)), (30, c(4, 10))]);
        assert_eq!(changed, vec![(10, c(9, 10))]);
    }

    #[test]
    fn a_shift_keeps_only_what_precedes_it() {
        // An insertion moves every later chunk: none of them is at its offset.
        let live = [c(1, 10), c(2, 10), c(3, 10), c(4, 10)];
        let target = [c(1, 10), c(7, 14), c(3, 10), c(4, 10)];
        assert!(split_kept(&target, &live).is_none());
        let target = [c(1, 10), c(2, 10), c(3, 10), c(7, 14), c(4, 10)];
        let (kept, changed) = split_kept(&target, &live).unwrap();
        assert_eq!(kept.len(), 3);
        assert_eq!(changed, vec![(30, c(7, 14)), (44, c(4, 10))]);
    }

    #[test]
    fn growth_and_truncation() {
        let live = [c(1, 10), c(2, 10)];
        let (kept, changed) = split_kept(&[c(1, 10), c(2, 10), c(5, 3)], &live).unwrap();
        assert_eq!((kept.len(), changed), (2, vec![(20, c(5, 3))]));
        let (kept, changed) = split_kept(&[c(1, 10)], &live).unwrap();
        assert_eq!((kept.len(), changed.len()), (1, 0));
        assert!(split_kept(&[], &live).is_none());
        assert!(split_kept(&[c(1, 10)], &[]).is_none());
    }

    #[test]
    fn a_patch_saves_what_it_overwrites_and_puts_it_back() {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, bytes: &[u8]| {
            let path = dir.path().join(name);
            std::fs::write(&path, bytes).unwrap();
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)
                .unwrap()
        };
        let old: Vec<u8> = (0..100u8).collect();
        let live = file("live", &old);
        // Pieces at 10 (4 bytes) and 96 (8 bytes, 4 past the old end).
        let staged = file("staged", b"ABCDwxyz1234");
        let undo = file("undo", b"");
        let stat = fs::fstat(live.as_raw_fd()).unwrap();
        let patch = Patch::new(9, &[(10, c(1, 4)), (96, c(2, 8))], stat);
        patch.set_ready(OwnedFd::from(staged));
        patch.save_overwritten(&live, 100, &undo).unwrap();
        patch.write_into(&live, 104).unwrap();
        let mut new = old.clone();
        new[10..14].copy_from_slice(b"ABCD");
        new.truncate(96);
        new.extend_from_slice(b"wxyz1234");
        assert_eq!(std::fs::read(dir.path().join("live")).unwrap(), new);
        patch.put_back(&live, 100, &undo).unwrap();
        assert_eq!(std::fs::read(dir.path().join("live")).unwrap(), old);
    }
}
