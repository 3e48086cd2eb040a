//! A scan's chunking of large files (see `crate::chunk`): which files are
//! chunked, the chunk list of each, the chunks fed to the upload, and the
//! chunk cache that lets a file the stat cache vouches for keep its chunk
//! list without being read.
//!
//! The chunk cache (`<stat cache>.chunks` in the data directory, beside the
//! stat cache) maps a whole-file digest to its chunk list under one set of
//! [`ChunkParams`]. A chunk list is a function of the zeroed bytes, which
//! the whole-file digest names, so a cached list is right for any file with
//! that digest. A file the stat cache vouches for whose list the cache lacks
//! is read again (once: its list is then cached).
//!
//! Chunks in the cache were most likely stored by the capture that cached
//! them, so the scan does not feed them to the upload again: a capture
//! whose parent lacks one finds it missing and reads it from the file then
//! (`read_chunks_beneath`), as it does for a file the stat cache vouched for.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::cancel::Cancel;
use crate::chunk::{self, ChunkParams, ChunkRef, PositionalReader};
use crate::feed::BlobFeed;
use crate::fs::{self as wfs, Stat};
use crate::hash::{DigestMap, DigestSet, HashError};
use crate::pack::Frame;
use crate::redact::SecretSet;
use crate::walk::{Batch, FileSlot, Kind};

const MAGIC: &[u8; 8] = b"CPDCHNK1";

/// Where a hashed file's bytes go besides the hash: the upload's feed, and
/// the chunking of large files.
#[derive(Clone, Copy, Default)]
pub struct Sinks<'a> {
    pub feed: Option<&'a BlobFeed>,
    pub chunking: Option<&'a Chunking>,
}

/// One scan's chunking state.
pub struct Chunking {
    pub params: ChunkParams,
    /// The chunk lists of the files this scan keeps, by whole-file digest
    /// (the manifest's text of each).
    lists: Mutex<DigestMap<Arc<str>>>,
    /// The chunk cache as the last scan saved it.
    cached: DigestMap<Arc<str>>,
    /// Every chunk digest `cached` names: not fed to the upload again.
    known: DigestSet,
}

impl Chunking {
    /// The chunking of a scan with `params`, with the chunk cache beside
    /// `cache_path` (the stat cache) when there is one and it was written
    /// under the same params (anything else is ignored: lists are read again).
    pub fn new(params: ChunkParams, cache_path: Option<&Path>) -> Chunking {
        map_large_allocations_apart();
        let mut chunking = Chunking {
            params,
            lists: Mutex::new(DigestMap::default()),
            cached: DigestMap::default(),
            known: DigestSet::default(),
        };
        if let Some(loaded) = cache_path.and_then(|p| load(&list_path(p), &params)) {
            for (whole, chunks) in loaded {
                chunking.known.extend(chunks.iter().map(|c| c.digest));
                chunking
                    .cached
                    .insert(whole, Arc::from(chunk::encode_list(&chunks)));
            }
        }
        chunking
    }

    fn lists(&self) -> std::sync::MutexGuard<'_, DigestMap<Arc<str>>> {
        self.lists.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Files whose hash the stat cache gave and that are chunked need their
    /// chunk list: from the chunk cache, else their hash is dropped (they
    /// are read). Returns how many were dropped.
    pub fn claim_reused(&self, batches: &mut [Batch]) -> u64 {
        let mut dropped = 0;
        let mut lists = self.lists();
        for batch in batches.iter_mut() {
            for entry in batch.entries.iter_mut() {
                let Kind::File(slot) = &mut entry.kind else {
                    continue;
                };
                let Some(hash) = slot.hash.filter(|_| self.params.applies(slot.stat.size)) else {
                    continue;
                };
                match self.cached.get(&hash) {
                    Some(list) => {
                        lists.insert(hash, list.clone());
                    }
                    None => {
                        slot.hash = None;
                        dropped += 1;
                    }
                }
            }
        }
        dropped
    }

    /// Hash and chunk an open file of `before.size` bytes (above the
    /// threshold) from its start, feeding each chunk the upload lacks.
    /// Returns the bytes read, and whether the slot now holds the file's
    /// hash: false when the file changed under the read (`fstat` before and
    /// after differ), to be read again.
    pub fn hash_slot(
        &self,
        file: &File,
        before: Stat,
        slot: &mut FileSlot,
        secrets: &SecretSet,
        cancel: &Cancel,
        feed: Option<&BlobFeed>,
    ) -> Result<(u64, bool), HashError> {
        let reader = PositionalReader {
            file,
            at: 0,
            limit: before.size.saturating_add(1),
        };
        let mut on_chunk = |digest: &[u8; 32], bytes: &[u8]| {
            if let Some(feed) = feed {
                if !self.known.contains(digest) && feed.wants(digest) {
                    feed.push_chunk(Frame::encode(*digest, bytes), cancel);
                }
            }
        };
        let chunked =
            chunk::hash_chunked(reader, secrets, self.params, cancel, true, &mut on_chunk)?;
        let after = wfs::fstat(std::os::fd::AsRawFd::as_raw_fd(file))?;
        if after != before || chunked.size != before.size {
            return Ok((chunked.size, false));
        }
        slot.stat = before;
        slot.hash = Some(chunked.digest);
        slot.secrets = chunked.found.into();
        self.lists().insert(
            chunked.digest,
            Arc::from(chunk::encode_list(&chunked.chunks)),
        );
        Ok((chunked.size, true))
    }

    /// The chunk list of a kept file of `size` bytes with this digest (None
    /// for a file stored whole).
    pub fn list(&self, hash: &[u8; 32], size: u64) -> Option<Arc<str>> {
        if !self.params.applies(size) {
            return None;
        }
        self.lists().get(hash).cloned()
    }

    /// The blob digests of a kept file: its chunks', or its own.
    pub fn blob_digests(&self, hash: &[u8; 32], size: u64, out: &mut Vec<[u8; 32]>) {
        match self.list(hash, size) {
            Some(list) => out.extend(
                chunk::parse_list(list.as_bytes())
                    .expect("lists are ours")
                    .iter()
                    .map(|c| c.digest),
            ),
            None => out.push(*hash),
        }
    }

    /// Save the lists of this scan's files as the chunk cache beside
    /// `cache_path`, when they are not the cache already.
    pub fn save(&self, cache_path: &Path) -> io::Result<()> {
        let lists = self.lists();
        if lists.len() == self.cached.len() && lists.keys().all(|k| self.cached.contains_key(k)) {
            return Ok(());
        }
        let entries = lists.iter().map(|(whole, text)| {
            (
                *whole,
                chunk::parse_list(text.as_bytes()).expect("lists are ours"),
            )
        });
        save(&list_path(cache_path), &self.params, entries)
    }
}

/// Allocations of 128 KiB and more get pages of their own (glibc's
/// `M_MMAP_THRESHOLD`, fixed instead of its sliding default), set once per
/// process. Chunk frames are made on the scan's threads and freed on the
/// upload's: with the sliding threshold they came from the heap arenas,
/// which kept every freed one mapped (a 2 GiB file's capture peaked at 400 MB,
/// 230 MB with the threshold fixed).
fn map_large_allocations_apart() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        // SAFETY: mallopt only sets an allocator parameter; safe at any time.
        ONCE.call_once(|| unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 128 << 10);
        });
    }
}

/// A scan key's share of the chunking: rows of the same files encode the
/// same only under the same params (or without chunking).
pub fn mix_key(key: [u8; 32], params: Option<&ChunkParams>) -> [u8; 32] {
    match params {
        None => key,
        Some(params) => {
            let mut hasher = blake3::Hasher::new_keyed(&key);
            hasher.update(b"chunks");
            hasher.update(&params.fingerprint());
            *hasher.finalize().as_bytes()
        }
    }
}

/// What the chunk cache's name adds to its stat cache's.
pub const CACHE_SUFFIX: &str = ".chunks";

/// The chunk cache beside a stat cache.
pub fn list_path(cache_path: &Path) -> PathBuf {
    let mut name = cache_path.as_os_str().to_owned();
    name.push(CACHE_SUFFIX);
    PathBuf::from(name)
}

/// The cache's entries; None when it is missing, damaged or of other params.
/// Layout: magic, params fingerprint, entry count (u64), then per entry the
/// whole digest, a chunk count (u32) and (digest, length u32) per chunk,
/// then the BLAKE3 of everything before.
pub fn load(path: &Path, params: &ChunkParams) -> Option<Vec<([u8; 32], Vec<ChunkRef>)>> {
    let mut data = Vec::new();
    File::open(path).ok()?.read_to_end(&mut data).ok()?;
    let body_len = data.len().checked_sub(32)?;
    let (body, sum) = data.split_at(body_len);
    if blake3::hash(body).as_bytes() != sum || !body.starts_with(MAGIC) {
        return None;
    }
    let mut at = MAGIC.len();
    let mut take = |n: usize| -> Option<&[u8]> {
        let out = body.get(at..at + n)?;
        at += n;
        Some(out)
    };
    if take(20)? != params.fingerprint() {
        return None;
    }
    let count = u64::from_le_bytes(take(8)?.try_into().ok()?);
    let mut out = Vec::new();
    for _ in 0..count {
        let whole: [u8; 32] = take(32)?.try_into().ok()?;
        let n = u32::from_le_bytes(take(4)?.try_into().ok()?);
        let mut chunks = Vec::with_capacity(n.min(1 << 20) as usize);
        for _ in 0..n {
            let digest: [u8; 32] = take(32)?.try_into().ok()?;
            let len = u32::from_le_bytes(take(4)?.try_into().ok()?);
            chunks.push(ChunkRef { digest, len });
        }
        out.push((whole, chunks));
    }
    Some(out)
}

/// Write the cache at `path` (a new file renamed over the old one).
pub fn save(
    path: &Path,
    params: &ChunkParams,
    entries: impl Iterator<Item = ([u8; 32], Vec<ChunkRef>)>,
) -> io::Result<()> {
    let mut body = Vec::new();
    body.extend_from_slice(MAGIC);
    body.extend_from_slice(&params.fingerprint());
    body.extend_from_slice(&[0u8; 8]);
    let mut count = 0u64;
    for (whole, chunks) in entries {
        body.extend_from_slice(&whole);
        body.extend_from_slice(&(chunks.len() as u32).to_le_bytes());
        for c in &chunks {
            body.extend_from_slice(&c.digest);
            body.extend_from_slice(&c.len.to_le_bytes());
        }
        count += 1;
    }
    body[MAGIC.len() + 20..MAGIC.len() + 28].copy_from_slice(&count.to_le_bytes());
    let sum = *blake3::hash(&body).as_bytes();
    let mut temp = path.as_os_str().to_owned();
    temp.push(format!(".tmp-{}", std::process::id()));
    let temp = PathBuf::from(temp);
    let mut file = File::create(&temp)?;
    file.write_all(&body)?;
    file.write_all(&sum)?;
    drop(file);
    std::fs::rename(&temp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_that_changed_under_the_read_is_not_vouched_for() {
        use std::os::fd::AsRawFd;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..(3u32 << 20)).map(|i| (i * 31 % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let file = File::open(&path).unwrap();
        let chunking = Chunking::new(ChunkParams::default(), None);
        let mut slot = FileSlot {
            stat: Stat::default(),
            hash: None,
            vanished: false,
            secrets: Default::default(),
        };
        let now = wfs::fstat(file.as_raw_fd()).unwrap();
        let hash = |slot: &mut FileSlot, before: Stat| {
            chunking
                .hash_slot(
                    &file,
                    before,
                    slot,
                    &SecretSet::empty(),
                    &Cancel::new(),
                    None,
                )
                .unwrap()
        };
        // The stat the read started from is not the file's after it: an
        // edit came in between, so the bytes are read again, not kept.
        let stale = Stat {
            mtime_ns: now.mtime_ns - 1,
            ..now
        };
        assert_eq!(hash(&mut slot, stale), (data.len() as u64, false));
        assert_eq!(slot.hash, None);
        let whole = *blake3::hash(&data).as_bytes();
        assert_eq!(chunking.list(&whole, data.len() as u64), None);
        assert_eq!(hash(&mut slot, now), (data.len() as u64, true));
        assert_eq!(slot.hash, Some(whole));
        assert!(chunking.list(&whole, data.len() as u64).is_some());
    }

    #[test]
    fn the_cache_round_trips_and_refuses_other_params_or_damage() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cache.chunks");
        let params = ChunkParams::default();
        let entries = vec![(
            [1u8; 32],
            vec![
                ChunkRef {
                    digest: [2u8; 32],
                    len: 9,
                },
                ChunkRef {
                    digest: [3u8; 32],
                    len: 7,
                },
            ],
        )];
        save(&path, &params, entries.clone().into_iter()).unwrap();
        assert_eq!(load(&path, &params), Some(entries));
        let other = ChunkParams::new(1 << 21, 1 << 16).unwrap();
        assert_eq!(load(&path, &other), None);
        let mut data = std::fs::read(&path).unwrap();
        data[40] ^= 1;
        std::fs::write(&path, &data).unwrap();
        assert_eq!(load(&path, &params), None);
    }
}
