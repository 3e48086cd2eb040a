//! Restoring files stored as content-defined chunks (`crate::chunk`).
//!
//! A chunked file of the plan is prepared in staging like any other write
//! (its own new file, created by the restore), then filled chunk by chunk:
//! each chunk, verified (length and BLAKE3) before a byte of it is written,
//! goes to every offset of every file that uses it. Chunks already at hand
//! are not fetched: the live scan lists the chunks of every live file stored
//! as chunks, and a needed chunk found there (the old version of the same
//! file, or any other) is read from that file beneath the root, zeroed as
//! the capture zeroed it and checked against its digest; what does not check
//! out is fetched. Once every byte of a file is written it is read back and
//! hashed whole: only a file that equals its whole-file digest is finished
//! (mode, mtime) and later renamed in.
//!
//! Zeros are not written: a file is sized first, so a chunk of zeros (a
//! sparse file's holes) stays a hole.
//!
//! A file whose live version holds most of its chunks where they belong is
//! patched in place instead (`crate::restore::patch`): only its changed
//! chunks are staged, end to end in a patch file.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use rayon::prelude::*;

use crate::chunk::{self, ChunkParams, ChunkRef};
use crate::fs;
use crate::hash::{self, DigestMap, DigestSet};
use crate::manifest;
use crate::redact::SecretSet;
use crate::restore::patch::{self, Patch};
use crate::restore::{Restore, RestoreError};

/// Chunk lists by whole-file digest.
type ChunkLists = Vec<([u8; 32], Vec<ChunkRef>)>;

/// A chunked blob the plan needs: its whole-file digest, size, prepared
/// files (write index and fd; taken once finished) and bytes still missing.
struct Target {
    whole: [u8; 32],
    size: u64,
    uses: Mutex<Vec<(usize, OwnedFd)>>,
    left: AtomicU64,
    /// Built as a patch of the live file: `uses` is then its patch file.
    patch: Option<Patch>,
}

/// The chunked files of one restore, being filled.
pub struct Assembly {
    targets: Vec<Target>,
    /// The targets' whole-file digests.
    wholes: DigestSet,
    /// Per needed chunk: its length and every (target, offset) it fills.
    places: DigestMap<(u32, Vec<(u32, u64)>)>,
    /// Chunks written already (a chunk is written once).
    staged: Mutex<DigestSet>,
    /// The target of each write patched in place, by write index.
    patched: std::collections::HashMap<usize, usize>,
    /// The chunk lists of the target's and the live tree's chunked files,
    /// for the chunk cache once the restore is done (with the params of the
    /// captures to come; None: not saved).
    cache: Option<(ChunkParams, ChunkLists)>,
}

/// Give `restore` the assembly of its writes stored as chunks (`target`:
/// the target manifest's chunked files), and stage the chunks live files
/// hold (`live`: the live scan's chunked files). `params`: the chunking of
/// the captures to come, for the chunk cache.
pub fn prepare(
    mut restore: Restore,
    target: Vec<manifest::ChunkedFile>,
    live: Vec<manifest::ChunkedFile>,
    secrets: &SecretSet,
    params: Option<ChunkParams>,
) -> Result<Restore, RestoreError> {
    let Some(mut assembly) = Assembly::new(&restore, &target, &live, secrets)? else {
        return Ok(restore);
    };
    assembly.stage_local(&restore, &live, secrets)?;
    assembly.cache = params.map(|params| {
        let mut lists: DigestMap<Vec<ChunkRef>> = DigestMap::default();
        for file in target.into_iter().chain(live) {
            lists.entry(file.digest).or_insert(file.chunks);
        }
        (params, lists.into_iter().collect())
    });
    restore.chunks = Some(assembly);
    Ok(restore)
}

impl Assembly {
    /// The assembly of the plan's writes stored as chunks in `target` (the
    /// target manifest's bytes): their files created in staging. None when
    /// the plan writes none.
    fn new(
        restore: &Restore,
        target: &[manifest::ChunkedFile],
        live: &[manifest::ChunkedFile],
        secrets: &SecretSet,
    ) -> Result<Option<Assembly>, RestoreError> {
        let mut lists: DigestMap<Vec<ChunkRef>> = DigestMap::default();
        for file in target {
            if restore.needs(&file.digest) {
                lists.entry(file.digest).or_insert(file.chunks.clone());
            }
        }
        if lists.is_empty() {
            return Ok(None);
        }
        raise_open_file_limit(lists.len());
        let live_lists: std::collections::HashMap<&str, &[ChunkRef]> = live
            .iter()
            .map(|f| (f.path.as_str(), f.chunks.as_slice()))
            .collect();
        let mut assembly = Assembly {
            targets: Vec::with_capacity(lists.len()),
            wholes: lists.keys().copied().collect(),
            places: DigestMap::default(),
            staged: Mutex::new(DigestSet::default()),
            patched: std::collections::HashMap::new(),
            cache: None,
        };
        for (whole, chunks) in lists {
            let patched = if secrets.is_empty() {
                plan_patch(restore, &whole, &chunks, &live_lists)
            } else {
                None
            };
            let (placed, patch) = match patched {
                Some((patch, changed)) => (changed, Some(patch)),
                None => (chunks, None),
            };
            assembly.add_target(restore, whole, &placed, patch)?;
        }
        // A file of size 0 has no chunk and is finished at once (never chunked
        // by a capture, but a list could say so); so is a patch with nothing
        // to write.
        for t in 0..assembly.targets.len() {
            if assembly.targets[t].size == 0 {
                assembly.finish(restore, t)?;
            }
        }
        Ok(Some(assembly))
    }

    /// Add the target `whole` built from `chunks` end to end (for a patch:
    /// its changed chunks, in its patch file).
    fn add_target(
        &mut self,
        restore: &Restore,
        whole: [u8; 32],
        chunks: &[ChunkRef],
        patch: Option<Patch>,
    ) -> Result<(), RestoreError> {
        let size: u64 = chunks.iter().map(|c| u64::from(c.len)).sum();
        let uses = restore.create_uses_for_chunks(&whole)?;
        for (index, fd) in &uses {
            fs_size(fd, size).map_err(|e| io_error(restore.shown_write(*index), "size", e))?;
        }
        let number = self.targets.len() as u32;
        let mut offset = 0u64;
        for c in chunks {
            let place = self
                .places
                .entry(c.digest)
                .or_insert_with(|| (c.len, Vec::new()));
            if place.0 != c.len {
                return Err(RestoreError::InvalidBlob {
                    hash: c.digest,
                    reason: format!("chunk lists give it lengths {} and {}", place.0, c.len),
                });
            }
            place.1.push((number, offset));
            offset += u64::from(c.len);
        }
        if let Some(patch) = &patch {
            self.patched.insert(patch.index, self.targets.len());
        }
        self.targets.push(Target {
            whole,
            size,
            uses: Mutex::new(uses),
            left: AtomicU64::new(size),
            patch,
        });
        Ok(())
    }

    /// The patch of the write of `index`, when it is patched in place
    /// (asked for every write the apply renames in: one lookup).
    pub fn patch_for(&self, index: usize) -> Option<&Patch> {
        let target = *self.patched.get(&index)?;
        self.targets[target].patch.as_ref()
    }

    /// The length of a chunk this assembly needs.
    pub fn chunk_len(&self, digest: &[u8; 32]) -> Option<u64> {
        self.places.get(digest).map(|p| u64::from(p.0))
    }

    /// Whether the chunked blob `whole` is built here (never fetched whole).
    pub fn builds(&self, whole: &[u8; 32]) -> bool {
        self.wholes.contains(whole)
    }

    /// The chunks still missing, concatenated digests, and their bytes.
    pub fn missing(&self) -> (Vec<u8>, u64) {
        let staged = self.staged.lock().unwrap_or_else(|e| e.into_inner());
        // In the order of the first place each fills (file by file, chunk by
        // chunk): the order a capture packed them in, so a slice of the list
        // lies in few packs, side by side, and is read in a few long reads.
        let mut wanted: Vec<(u32, u64, &[u8; 32], u32)> = self
            .places
            .iter()
            .filter(|(digest, _)| !staged.contains(*digest))
            .filter_map(|(digest, (len, places))| {
                let &(target, offset) = places.iter().min()?;
                Some((target, offset, digest, *len))
            })
            .collect();
        wanted.sort_unstable();
        let mut out = Vec::with_capacity(wanted.len() * 32);
        let mut bytes = 0;
        for (_target, _offset, digest, len) in wanted {
            out.extend_from_slice(digest);
            bytes += u64::from(len);
        }
        (out, bytes)
    }

    /// Write a chunk's bytes (verified by the caller against `digest`) to
    /// every place it fills. Returns false for a digest this assembly does
    /// not need; a chunk written before is not written again.
    pub fn write_chunk(
        &self,
        restore: &Restore,
        digest: &[u8; 32],
        data: &[u8],
    ) -> Result<bool, RestoreError> {
        let Some((len, places)) = self.places.get(digest) else {
            return Ok(false);
        };
        if data.len() as u64 != u64::from(*len) {
            return Err(RestoreError::InvalidBlob {
                hash: *digest,
                reason: format!("{} bytes where the chunk list records {len}", data.len()),
            });
        }
        if !self
            .staged
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(*digest)
        {
            return Ok(true);
        }
        let zeros = data.iter().all(|&b| b == 0);
        for &(t, offset) in places {
            let target = &self.targets[t as usize];
            if !zeros {
                let uses = target.uses.lock().unwrap_or_else(|e| e.into_inner());
                for (index, fd) in uses.iter() {
                    write_at(fd, data, offset)
                        .map_err(|e| io_error(restore.shown_write(*index), "write", e))?;
                }
            }
            let before = target.left.fetch_sub(u64::from(*len), Ordering::AcqRel);
            if before == u64::from(*len) {
                self.finish(restore, t as usize)?;
            }
        }
        Ok(true)
    }

    /// Every byte of target `t` is written: each of its files is read back
    /// and must hash to its whole-file digest, then is finished.
    fn finish(&self, restore: &Restore, t: usize) -> Result<(), RestoreError> {
        let target = &self.targets[t];
        let uses = std::mem::take(&mut *target.uses.lock().unwrap_or_else(|e| e.into_inner()));
        if let Some(patch) = &target.patch {
            // Its pieces were each verified as they came: apply patches.
            for (_index, fd) in uses {
                patch.set_ready(fd);
            }
            return Ok(());
        }
        for (index, fd) in uses {
            let holds = hash::file_holds(fd.as_raw_fd(), target.size, &target.whole, None)
                .map_err(|e| io_error(restore.shown_write(index), "read back", e))?;
            if !holds {
                return Err(RestoreError::InvalidBlob {
                    hash: target.whole,
                    reason: "its chunks do not make up the file the checkpoint records".into(),
                });
            }
            restore.finish_chunked_use(index, &fd)?;
        }
        Ok(())
    }

    /// InvalidBlob naming the first file not complete (a chunk never came).
    pub fn check_complete(&self) -> Result<(), RestoreError> {
        match self
            .targets
            .iter()
            .find(|t| t.left.load(Ordering::Acquire) > 0)
        {
            None => Ok(()),
            Some(t) => Err(RestoreError::InvalidBlob {
                hash: t.whole,
                reason: "some of its chunks were never staged".into(),
            }),
        }
    }

    /// Stage the needed chunks that live files stored as chunks hold (the
    /// live scan's manifest `live` lists them), each read beneath the root,
    /// zeroed with `secrets` and checked against its digest. Returns the
    /// chunks and bytes staged so.
    fn stage_local(
        &self,
        restore: &Restore,
        files: &[manifest::ChunkedFile],
        secrets: &SecretSet,
    ) -> Result<(u64, u64), RestoreError> {
        let mut wanted: DigestSet = self.places.keys().copied().collect();
        let (mut chunks, mut bytes) = (0, 0);
        for file in files {
            let mut reads = Vec::new();
            let mut offset = 0u64;
            for c in &file.chunks {
                if wanted.remove(&c.digest) {
                    reads.push((offset, *c));
                }
                offset += u64::from(c.len);
            }
            if reads.is_empty() {
                continue;
            }
            let Ok(fd) = fs::open_to_read(restore.ws.fd.as_raw_fd(), file.path.as_bytes()) else {
                continue;
            };
            let opened = std::fs::File::from(fd);
            // Chunk by chunk on every core: each read, checked and written
            // at its own offsets (a chunk that does not check out is fetched).
            let staged: Vec<u64> = reads
                .par_iter()
                .map(|(offset, c)| {
                    let Ok(data) =
                        chunk::read_zeroed_range(&opened, *offset, c.len as usize, secrets)
                    else {
                        return Ok(0);
                    };
                    let wrote = blake3::hash(&data).as_bytes() == &c.digest
                        && self.write_chunk(restore, &c.digest, &data)?;
                    Ok(if wrote { u64::from(c.len) } else { 0 })
                })
                .collect::<Result<_, RestoreError>>()?;
            chunks += staged.iter().filter(|&&n| n > 0).count() as u64;
            bytes += staged.iter().sum::<u64>();
        }
        Ok((chunks, bytes))
    }
}

impl Assembly {
    /// Save the chunk lists of the target and the live tree as the chunk
    /// cache beside the stat cache at `cache_path` (after the restore).
    pub fn save_cache(&self, cache_path: &std::path::Path) -> std::io::Result<()> {
        match &self.cache {
            Some((params, lists)) => crate::chunking::save(
                &crate::chunking::list_path(cache_path),
                params,
                lists.iter().cloned(),
            ),
            None => Ok(()),
        }
    }
}

/// The patch of the target `whole` and the chunks it stages, when its one
/// write can patch the live file at its path (`crate::restore::patch`).
fn plan_patch(
    restore: &Restore,
    whole: &[u8; 32],
    chunks: &[ChunkRef],
    live: &std::collections::HashMap<&str, &[ChunkRef]>,
) -> Option<(Patch, Vec<ChunkRef>)> {
    let index = restore.single_flat_use(whole)?;
    let path = restore.plan.writes[index].path.as_str();
    let live = live.get(path)?;
    let (_kept, changed) = patch::split_kept(chunks, live)?;
    let live_size = live.iter().map(|c| u64::from(c.len)).sum();
    let planned = patch::patchable(restore.ws.fd.as_raw_fd(), path, restore.ws.dev, live_size)?;
    let staged = changed.iter().map(|(_, c)| *c).collect();
    Some((Patch::new(index, &changed, planned), staged))
}

fn fs_size(fd: &OwnedFd, size: u64) -> std::io::Result<()> {
    let file = std::mem::ManuallyDrop::new(unsafe {
        // SAFETY: borrowed for the call only; ManuallyDrop keeps it open.
        <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd.as_raw_fd())
    });
    file.set_len(size)
}

/// Its blocks of zeros are left holes (`fs::write_sparse_at`): the file's
/// length is set once it is complete, and a sparse file comes back sparse.
fn write_at(fd: &OwnedFd, data: &[u8], offset: u64) -> std::io::Result<()> {
    crate::fs::write_sparse_at(fd.as_raw_fd(), offset, data).map(drop)
}

/// A restore holds one open file per chunked file it builds: raise the soft
/// limit on open files toward the hard one when they are many.
fn raise_open_file_limit(files: usize) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write `limit`.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return;
        }
        let want = (files as libc::rlim_t).saturating_add(1024);
        if limit.rlim_cur < want {
            limit.rlim_cur = want.min(limit.rlim_max);
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

fn io_error(path: String, op: &'static str, source: std::io::Error) -> RestoreError {
    RestoreError::Io { path, op, source }
}
