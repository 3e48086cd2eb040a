//! Staging: every needed blob verified and written into the private staging
//! directory before the workspace changes.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use super::dirs::{DirStack, Reached};
use super::{cname, flat_name, split_parent, Dest, Restore, RestoreError, Written, NO_USE};
use crate::cancel::Cancel;
use crate::fs;
use crate::hash;
use crate::pack;
use rayon::prelude::*;

impl Restore {
    /// The planned directories of `range` beneath new roots, made in
    /// staging's tree if staging has not made them yet (their modes are set
    /// once they are in place). Staging makes the directories of the files
    /// it writes as it goes, on all its threads, so what is left here are
    /// the empty ones: a restore does not start with thousands of serial mkdirs.
    pub(super) fn make_tree_dirs(
        &self,
        range: std::ops::Range<usize>,
    ) -> Result<usize, RestoreError> {
        let prefix = self.tree_prefix();
        let mut dirs = DirStack::beneath(&self.ws, self.tree.as_raw_fd(), &prefix);
        for dir in &self.plan.dirs_to_make[range] {
            if self.tree_dirs.contains(dir) {
                dirs.reach(dir.as_bytes(), true)?;
            }
        }
        Ok(0)
    }

    /// Whether the plan needs the blob `hash`.
    pub fn needs(&self, hash: &[u8; 32]) -> bool {
        match &self.chunks {
            Some(chunks) if chunks.builds(hash) => return false,
            Some(chunks) if chunks.chunk_len(hash).is_some() => return true,
            _ => {}
        }
        self.blobs.contains_key(hash)
    }

    /// The size the plan expects for `hash`, or InvalidBlob for a blob it does not need.
    pub fn expected(&self, hash: &[u8; 32]) -> Result<u64, RestoreError> {
        if let Some(len) = self.chunks.as_ref().and_then(|c| c.chunk_len(hash)) {
            return Ok(len);
        }
        self.blobs
            .get(hash)
            .map(|uses| uses.size)
            .ok_or_else(|| RestoreError::InvalidBlob {
                hash: *hash,
                reason: "the restore did not ask for it".into(),
            })
    }

    /// Stage many small blobs at once (each verified before a byte is
    /// written), spread over a few threads.
    pub fn stage_many(
        &self,
        items: &[([u8; 32], &[u8])],
        cancel: &Cancel,
    ) -> Result<(), RestoreError> {
        let chunk = items.len().div_ceil(self.threads).max(1);
        let prefix = self.tree_prefix();
        std::thread::scope(|scope| {
            let handles: Vec<_> = items
                .chunks(chunk)
                .map(|part| {
                    let prefix = &prefix;
                    scope.spawn(move || {
                        let mut dirs = DirStack::beneath(&self.ws, self.tree.as_raw_fd(), prefix);
                        for (hash, data) in part {
                            if cancel.is_cancelled() {
                                return Err(RestoreError::Cancelled);
                            }
                            self.stage_bytes(&mut dirs, hash, data)?;
                        }
                        Ok(())
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or(Err(RestoreError::Cancelled)))
                .collect::<Result<Vec<()>, RestoreError>>()
                .map(drop)
        })
    }

    fn verify(hash: &[u8; 32], size: u64, data: &[u8]) -> Result<(), RestoreError> {
        if data.len() as u64 != size {
            return Err(RestoreError::InvalidBlob {
                hash: *hash,
                reason: format!("{} bytes where the checkpoint records {size}", data.len()),
            });
        }
        if blake3::hash(data).as_bytes() != hash {
            return Err(RestoreError::InvalidBlob {
                hash: *hash,
                reason: "its BLAKE3 hash does not match its key".into(),
            });
        }
        Ok(())
    }

    /// One blob given whole: verified, then written to each of its uses.
    fn stage_bytes(
        &self,
        dirs: &mut DirStack<'_>,
        hash: &[u8; 32],
        data: &[u8],
    ) -> Result<(), RestoreError> {
        Self::verify(hash, self.expected(hash)?, data)?;
        self.write_uses(dirs, hash, data).map(drop)
    }

    /// Write verified bytes to every use of `hash`, once per blob: false
    /// when it was staged before (and is skipped).
    fn write_uses(
        &self,
        dirs: &mut DirStack<'_>,
        hash: &[u8; 32],
        data: &[u8],
    ) -> Result<bool, RestoreError> {
        if let Some(chunks) = &self.chunks {
            if chunks.write_chunk(self, hash, data)? && !self.blobs.contains_key(hash) {
                return Ok(true);
            }
        }
        if !self
            .staged
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(*hash)
        {
            return Ok(false);
        }
        for (index, fd) in self.create_uses(dirs, hash)? {
            write_sparse(&fd, 0, data, Some(data.len() as u64))
                .map_err(|e| RestoreError::io(self.shown_prepared(index), "write", e))?;
            self.finish_use(index, &fd, Some(data))?;
        }
        Ok(true)
    }

    /// One complete frame of `data` (the pack's bytes from `base` on):
    /// checked against the plan's size, decoded and verified, then staged;
    /// false when its blob was staged before.
    fn stage_frame(
        &self,
        dirs: &mut DirStack<'_>,
        base: u64,
        data: &[u8],
        entry: &pack::Entry,
    ) -> Result<bool, RestoreError> {
        let expected = self.expected(&entry.digest)?;
        if expected != u64::from(entry.raw_len) {
            return Err(RestoreError::InvalidBlob {
                hash: entry.digest,
                reason: format!(
                    "the pack index records {} bytes where the checkpoint records {expected}",
                    entry.raw_len
                ),
            });
        }
        // Inside `data` by construction (RangeStager::feed).
        let start = entry.offset.saturating_sub(base) as usize;
        let stop = (start + entry.stored_len as usize).min(data.len());
        let stored = &data[start.min(stop)..stop];
        let raw = pack::decode_frame(entry, stored).map_err(|e| match e {
            pack::PackError::Blob { digest, reason } => RestoreError::InvalidBlob {
                hash: digest,
                reason,
            },
            other => RestoreError::InvalidBlob {
                hash: entry.digest,
                reason: other.to_string(),
            },
        })?;
        self.write_uses(dirs, &entry.digest, &raw)
    }

    /// Decode, verify and stage the complete frames `frames` of a pack read
    /// (`data` holds the pack's bytes from offset `base` on), spread over a
    /// few threads. Each frame is checked against its index row and the plan
    /// (raw size, then decoded size and BLAKE3: one hash per blob) before a
    /// byte of it is written. Returns (blobs, bytes) staged.
    fn stage_frames(
        &self,
        base: u64,
        data: &[u8],
        frames: &[pack::Entry],
        cancel: &Cancel,
    ) -> Result<(u64, u64), RestoreError> {
        if frames.is_empty() {
            return Ok((0, 0));
        }
        // On rayon's pool, shared by every pack read in flight: as many
        // threads create files as there are cores, however many reads run
        // (more would only contend for the filesystem's locks).
        let chunk = frames.len().div_ceil(self.threads * 2).max(1);
        let prefix = self.tree_prefix();
        // Only blobs staged now count (a read again after a repack skips some).
        frames
            .par_chunks(chunk)
            .map(|part| {
                let mut dirs = DirStack::beneath(&self.ws, self.tree.as_raw_fd(), &prefix);
                let (mut blobs, mut bytes) = (0, 0);
                for entry in part {
                    if cancel.is_cancelled() {
                        return Err(RestoreError::Cancelled);
                    }
                    if self.stage_frame(&mut dirs, base, data, entry)? {
                        blobs += 1;
                        bytes += u64::from(entry.raw_len);
                    }
                }
                Ok((blobs, bytes))
            })
            .try_reduce(|| (0, 0), |a, b| Ok((a.0 + b.0, a.1 + b.1)))
    }

    fn shown_prepared(&self, index: usize) -> String {
        match self.dests[index] {
            Dest::Flat => self.shown_flat(index),
            Dest::Tree => {
                let mut rel = self.tree_prefix();
                rel.push(b'/');
                rel.extend_from_slice(self.plan.writes[index].path.as_bytes());
                self.ws.shown(&rel)
            }
        }
    }

    /// [`Restore::create_uses`] of a blob stored as chunks.
    pub(crate) fn create_uses_for_chunks(
        &self,
        hash: &[u8; 32],
    ) -> Result<Vec<(usize, OwnedFd)>, RestoreError> {
        let prefix = self.tree_prefix();
        let mut dirs = DirStack::beneath(&self.ws, self.tree.as_raw_fd(), &prefix);
        self.create_uses(&mut dirs, hash)
    }

    /// The write of `hash` when it is its only one and renamed in by itself
    /// (so the live file at its path, if any, may be patched instead).
    pub(crate) fn single_flat_use(&self, hash: &[u8; 32]) -> Option<usize> {
        let first = self.blobs.get(hash)?.first;
        (self.next_use[first] == NO_USE && self.dests[first] == Dest::Flat).then_some(first)
    }

    /// Where write `index` is prepared, for messages.
    pub(crate) fn shown_write(&self, index: usize) -> String {
        self.shown_prepared(index)
    }

    /// [`Restore::finish_use`] of a file built from chunks (read back whole by then).
    pub(crate) fn finish_chunked_use(
        &self,
        index: usize,
        fd: &OwnedFd,
    ) -> Result<(), RestoreError> {
        self.finish_use(index, fd, None)
    }

    /// A new, empty file for every write that uses `hash`.
    fn create_uses(
        &self,
        dirs: &mut DirStack<'_>,
        hash: &[u8; 32],
    ) -> Result<Vec<(usize, OwnedFd)>, RestoreError> {
        let mut out = Vec::new();
        let mut index = self.blobs.get(hash).map_or(NO_USE, |uses| uses.first);
        while index != NO_USE {
            // Created with its final mode: staging is private (0700), so
            // nobody else can reach the file before it moves in.
            let mode = self.plan.writes[index].mode & 0o777;
            let fd = match self.dests[index] {
                Dest::Flat => {
                    fs::create_file_mode_at(self.flat_dir(index), &flat_name(index), mode)
                }
                Dest::Tree => {
                    let (parent, leaf) = split_parent(self.plan.writes[index].path.as_bytes());
                    let parent_fd = match dirs.reach(parent, true)? {
                        Reached::Dir(fd) => fd,
                        _ => {
                            return Err(RestoreError::io(
                                self.shown_prepared(index),
                                "create",
                                io::Error::from_raw_os_error(libc::ENOENT),
                            ))
                        }
                    };
                    fs::create_file_mode_at(parent_fd, &cname(leaf)?, mode)
                }
            }
            .map_err(|e| RestoreError::io(self.shown_prepared(index), "create", e))?;
            out.push((index, fd));
            index = self.next_use[index];
        }
        Ok(out)
    }

    /// Mode and mtime through our own fd, then its stat: what moves in.
    /// A file that moves in with its directory is read back through the fd
    /// after that stat (compared with `bytes`, the blob, when given; else
    /// hashed): the stat cache may learn the stat only if it then held the
    /// blob. (A file renamed in by itself is read back after its rename.)
    fn finish_use(
        &self,
        index: usize,
        fd: &OwnedFd,
        bytes: Option<&[u8]>,
    ) -> Result<(), RestoreError> {
        let entry = &self.plan.writes[index];
        let raw = fd.as_raw_fd();
        let shown = || self.shown_prepared(index);
        if entry.mode & 0o777 & self.umask != 0 {
            fs::fchmod(raw, entry.mode & 0o777)
                .map_err(|e| RestoreError::io(shown(), "chmod", e))?;
        }
        fs::set_mtime(raw, entry.mtime_ns)
            .map_err(|e| RestoreError::io(shown(), "set the mtime of", e))?;
        let stat = fs::fstat(raw).map_err(|e| RestoreError::io(shown(), "fstat", e))?;
        let verified = self.record
            && !entry.secrets
            && self.dests[index] == Dest::Tree
            && stat.size == entry.size
            && hash::file_holds(raw, entry.size, &entry.hash, bytes)
                .map_err(|e| RestoreError::io(shown(), "read back", e))?;
        self.prepared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(index, Written { stat, verified });
        Ok(())
    }

    /// A writer streaming one (large) blob into staging, hashing as it goes.
    pub fn stage_writer(&self, hash: &[u8; 32], size: u64) -> Result<StagedWriter, RestoreError> {
        let expected = self.expected(hash)?;
        if expected != size {
            return Err(RestoreError::InvalidBlob {
                hash: *hash,
                reason: format!(
                    "asked for with {size} bytes where the checkpoint records {expected}"
                ),
            });
        }
        let prefix = self.tree_prefix();
        let mut dirs = DirStack::beneath(&self.ws, self.tree.as_raw_fd(), &prefix);
        Ok(StagedWriter {
            uses: self.create_uses(&mut dirs, hash)?,
            hash: *hash,
            size,
            written: 0,
            hasher: blake3::Hasher::new(),
            holes: false,
        })
    }
}

/// One (large) blob being written into staging, to every file that uses
/// it, hashing as it goes; `finish` checks size and hash.
pub struct StagedWriter {
    uses: Vec<(usize, OwnedFd)>,
    hash: [u8; 32],
    size: u64,
    written: u64,
    hasher: blake3::Hasher,
    /// A block of zeros was left a hole (the files' length is set at the end).
    holes: bool,
}

/// Write `data` at `offset` of a staged file, leaving its blocks of zeros
/// holes (`fs::write_sparse_at`): a sparse file is restored sparse. With
/// `len` (the file's whole length: `data` is its last bytes), the length
/// is set when the last blocks were left out. Returns whether any was.
fn write_sparse(fd: &OwnedFd, offset: u64, data: &[u8], len: Option<u64>) -> io::Result<bool> {
    let holes = fs::write_sparse_at(fd.as_raw_fd(), offset, data)?;
    if let (true, Some(len)) = (holes, len) {
        fs::set_len(fd.as_raw_fd(), len)?;
    }
    Ok(holes)
}

impl StagedWriter {
    /// Append a chunk. InvalidBlob as soon as it is longer than recorded (a
    /// hostile or corrupt blob must not fill the disk).
    pub fn write(&mut self, restore: &Restore, chunk: &[u8]) -> Result<(), RestoreError> {
        self.written += chunk.len() as u64;
        if self.written > self.size {
            return Err(RestoreError::InvalidBlob {
                hash: self.hash,
                reason: format!("longer than the {} bytes the checkpoint records", self.size),
            });
        }
        self.hasher.update(chunk);
        let offset = self.written - chunk.len() as u64;
        for (index, fd) in &self.uses {
            self.holes |= write_sparse(fd, offset, chunk, None)
                .map_err(|e| RestoreError::io(restore.shown_prepared(*index), "write", e))?;
        }
        Ok(())
    }

    /// Check size and hash, then give each file its entry's mode and mtime.
    pub fn finish(mut self, restore: &Restore) -> Result<(), RestoreError> {
        if self.written != self.size {
            return Err(RestoreError::InvalidBlob {
                hash: self.hash,
                reason: format!(
                    "{} bytes where the checkpoint records {}",
                    self.written, self.size
                ),
            });
        }
        let digest = std::mem::take(&mut self.hasher).finalize();
        if digest.as_bytes() != &self.hash {
            return Err(RestoreError::InvalidBlob {
                hash: self.hash,
                reason: "its BLAKE3 hash does not match its key".into(),
            });
        }
        for (index, fd) in &self.uses {
            if self.holes {
                // The last blocks may have been left out: the file's length.
                fs::set_len(fd.as_raw_fd(), self.size)
                    .map_err(|e| RestoreError::io(restore.shown_prepared(*index), "write", e))?;
            }
            restore.finish_use(*index, fd, None)?;
        }
        Ok(())
    }
}

/// One ranged read of a pack, staged as its bytes arrive: each frame is
/// decoded, verified and written once it is complete, so memory holds one
/// chunk and at most one partial frame, never the whole range.
pub struct RangeStager {
    /// The frames wanted, by offset (gaps between them are read and skipped).
    entries: Vec<pack::Entry>,
    /// The next frame to stage.
    next: usize,
    /// Bytes received but not yet consumed, starting at pack offset `at`.
    pending: Vec<u8>,
    at: u64,
}

impl RangeStager {
    /// A read starting at the first entry's offset (after sorting by offset).
    pub fn new(mut entries: Vec<pack::Entry>) -> RangeStager {
        entries.sort_by_key(|e| e.offset);
        let at = entries.first().map_or(0, |e| e.offset);
        RangeStager {
            entries,
            next: 0,
            pending: Vec::new(),
            at,
        }
    }

    /// The next bytes of the range. Returns (blobs, bytes) staged by this
    /// chunk; InvalidBlob for a frame that does not decode to its key.
    pub fn feed(
        &mut self,
        restore: &Restore,
        chunk: &[u8],
        cancel: &Cancel,
    ) -> Result<(u64, u64), RestoreError> {
        // Consume straight from the chunk when nothing is pending (no copy).
        let mut held = std::mem::take(&mut self.pending);
        let data: &[u8] = if held.is_empty() {
            chunk
        } else {
            held.extend_from_slice(chunk);
            &held
        };
        let end = self.at + data.len() as u64;
        let first = self.next;
        while self.next < self.entries.len() {
            let e = &self.entries[self.next];
            if e.offset + u64::from(e.stored_len) > end {
                break;
            }
            self.next += 1;
        }
        let staged =
            restore.stage_frames(self.at, data, &self.entries[first..self.next], cancel)?;
        // Keep only what the next frame needs (gaps and staged frames go).
        let keep_from = match self.entries.get(self.next) {
            Some(e) => e.offset.clamp(self.at, end),
            None => end,
        };
        let skip = (keep_from - self.at) as usize;
        self.pending = if held.is_empty() {
            chunk[skip..].to_vec()
        } else {
            held.drain(..skip);
            held
        };
        self.at = keep_from;
        Ok(staged)
    }

    /// The range ended: InvalidBlob naming the first frame it did not hold
    /// whole (the pack is shorter than its index says).
    pub fn finish(self) -> Result<(), RestoreError> {
        match self.entries.get(self.next) {
            None => Ok(()),
            Some(e) => Err(RestoreError::InvalidBlob {
                hash: e.digest,
                reason: format!(
                    "the pack holds {} of its {} stored bytes (truncated)",
                    (self.at + self.pending.len() as u64)
                        .saturating_sub(e.offset)
                        .min(u64::from(e.stored_len)),
                    e.stored_len
                ),
            }),
        }
    }
}
