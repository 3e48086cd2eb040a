//! The per-workspace stat cache: path → (dev, ino, size, mtime_ns, ctime_ns,
//! mode, hash), plus the fingerprint of the secret set the hashes were made
//! with and a reference time taken from the filesystem.
//!
//! git's racy-clean rule: an entry whose mtime is at or after the reference time
//! may have been modified again within the same timestamp tick after we looked,
//! so it is never trusted. The reference time is read from the filesystem
//! BEFORE the scan stats anything, so any file stat'ed in a tick that could
//! still change carries an mtime >= it.
//!
//! File format (little-endian), replaced atomically by rename:
//! `"CKPDSTC1"`, fingerprint[32], reference_ns i64, count u64, then per entry
//! `path_len u32, path, dev u64, ino u64, size u64, mtime_ns i64, ctime_ns i64,
//! mode u32, hash[32]`, sorted by path bytes, then BLAKE3 of everything before.
//! A missing, truncated or corrupt file is an empty cache (so no fsync: a torn
//! write after a crash only costs one re-hash). Secrets are never stored.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::fs::Stat;

const MAGIC: &[u8; 8] = b"CKPDSTC1";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheEntry {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    pub mode: u32,
    pub hash: [u8; 32],
}

impl CacheEntry {
    pub fn new(stat: &Stat, hash: [u8; 32]) -> CacheEntry {
        CacheEntry {
            dev: stat.dev,
            ino: stat.ino,
            size: stat.size,
            mtime_ns: stat.mtime_ns,
            ctime_ns: stat.ctime_ns,
            mode: stat.mode,
            hash,
        }
    }

    /// Same inode, size, times and mode as `stat`.
    pub fn same_stat(&self, stat: &Stat) -> bool {
        self.dev == stat.dev
            && self.ino == stat.ino
            && self.size == stat.size
            && self.mtime_ns == stat.mtime_ns
            && self.ctime_ns == stat.ctime_ns
            && self.mode == stat.mode
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatCache {
    pub fingerprint: [u8; 32],
    pub reference_ns: i64,
    /// Sorted by path bytes, unique.
    pub entries: Vec<(String, CacheEntry)>,
}

impl StatCache {
    /// The cached hash of `path` if the cache may be trusted for `stat` under
    /// the secret set `fingerprint` (same stat, not racily clean).
    pub fn reusable(&self, path: &str, stat: &Stat, fingerprint: &[u8; 32]) -> Option<[u8; 32]> {
        if &self.fingerprint != fingerprint {
            return None;
        }
        let index = self
            .entries
            .binary_search_by(|(p, _)| p.as_str().cmp(path))
            .ok()?;
        let entry = &self.entries[index].1;
        (entry.same_stat(stat) && entry.mtime_ns < self.reference_ns).then_some(entry.hash)
    }

    /// Like [`StatCache::reusable`] for callers visiting paths in ascending
    /// order: `cursor` remembers where the last lookup ended (a merge, not a search).
    pub fn reusable_in_order(
        &self,
        cursor: &mut usize,
        path: &str,
        stat: &Stat,
        fingerprint: &[u8; 32],
    ) -> Option<[u8; 32]> {
        if &self.fingerprint != fingerprint {
            return None;
        }
        while *cursor < self.entries.len() && self.entries[*cursor].0.as_str() < path {
            *cursor += 1;
        }
        let (cached_path, entry) = self.entries.get(*cursor)?;
        (cached_path == path && entry.same_stat(stat) && entry.mtime_ns < self.reference_ns)
            .then_some(entry.hash)
    }

    /// Read the cache at `path`; None when missing or not a valid cache.
    pub fn load(path: &Path) -> Option<StatCache> {
        let data = fs::read(path).ok()?;
        decode(&data)
    }

    /// Write atomically (temp file next to it, then rename). Creates the parent.
    pub fn save(&self, path: &Path) -> io::Result<()> {
        if let Some(parent) = path.parent() {
            if !parent.as_os_str().is_empty() {
                fs::create_dir_all(parent)?;
            }
        }
        let tmp = temp_path(path);
        let result = (|| {
            let mut file = fs::File::create(&tmp)?;
            file.write_all(&encode(self))?;
            drop(file);
            fs::rename(&tmp, path)
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result
    }

    /// Drop entries the racy rule already distrusts (used before moving the
    /// reference time forward, which would otherwise make them look clean).
    pub fn forget_racy(&mut self) {
        let reference = self.reference_ns;
        self.entries.retain(|(_, e)| e.mtime_ns < reference);
    }
}

fn temp_path(path: &Path) -> PathBuf {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut name = path
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(format!(".tmp-{}-{}", std::process::id(), n));
    path.with_file_name(name)
}

pub fn encode(cache: &StatCache) -> Vec<u8> {
    let per_entry: usize = cache
        .entries
        .iter()
        .map(|(p, _)| p.len() + 4 + 8 * 5 + 4 + 32)
        .sum();
    let mut out = Vec::with_capacity(8 + 32 + 16 + per_entry + 32);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&cache.fingerprint);
    out.extend_from_slice(&cache.reference_ns.to_le_bytes());
    out.extend_from_slice(&(cache.entries.len() as u64).to_le_bytes());
    for (path, e) in &cache.entries {
        out.extend_from_slice(&(path.len() as u32).to_le_bytes());
        out.extend_from_slice(path.as_bytes());
        out.extend_from_slice(&e.dev.to_le_bytes());
        out.extend_from_slice(&e.ino.to_le_bytes());
        out.extend_from_slice(&e.size.to_le_bytes());
        out.extend_from_slice(&e.mtime_ns.to_le_bytes());
        out.extend_from_slice(&e.ctime_ns.to_le_bytes());
        out.extend_from_slice(&e.mode.to_le_bytes());
        out.extend_from_slice(&e.hash);
    }
    let checksum = blake3::hash(&out);
    out.extend_from_slice(checksum.as_bytes());
    out
}

struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let slice = self.data.get(self.pos..end)?;
        self.pos = end;
        Some(slice)
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    fn u64(&mut self) -> Option<u64> {
        self.array::<8>().map(u64::from_le_bytes)
    }

    fn i64(&mut self) -> Option<i64> {
        self.array::<8>().map(i64::from_le_bytes)
    }

    fn u32(&mut self) -> Option<u32> {
        self.array::<4>().map(u32::from_le_bytes)
    }
}

pub fn decode(data: &[u8]) -> Option<StatCache> {
    if data.len() < MAGIC.len() + 32 + 16 + 32 {
        return None;
    }
    let (body, checksum) = data.split_at(data.len() - 32);
    if blake3::hash(body).as_bytes() != checksum {
        return None;
    }
    let mut r = Reader { data: body, pos: 0 };
    if r.take(MAGIC.len())? != MAGIC {
        return None;
    }
    let fingerprint = r.array::<32>()?;
    let reference_ns = r.i64()?;
    let count = r.u64()?;
    // Each entry is at least 88 bytes: refuse counts the body cannot hold.
    if count > (body.len() / 88) as u64 {
        return None;
    }
    let mut entries: Vec<(String, CacheEntry)> = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let len = r.u32()? as usize;
        let path = std::str::from_utf8(r.take(len)?).ok()?.to_string();
        let entry = CacheEntry {
            dev: r.u64()?,
            ino: r.u64()?,
            size: r.u64()?,
            mtime_ns: r.i64()?,
            ctime_ns: r.i64()?,
            mode: r.u32()?,
            hash: r.array::<32>()?,
        };
        if let Some((last, _)) = entries.last() {
            if last.as_str() >= path.as_str() {
                return None;
            }
        }
        entries.push((path, entry));
    }
    if r.pos != body.len() {
        return None;
    }
    Some(StatCache {
        fingerprint,
        reference_ns,
        entries,
    })
}

/// A keyed BLAKE3 of the sorted, de-duplicated secret set: the cache can tell
/// whether its hashes were made with the same secrets without storing them.
pub fn secrets_fingerprint<S: AsRef<[u8]>>(secrets: &[S]) -> [u8; 32] {
    let key = blake3::derive_key(
        "checkpointd 2026-11 stat cache secret-set fingerprint v1",
        b"",
    );
    let mut sorted: Vec<&[u8]> = secrets.iter().map(|s| s.as_ref()).collect();
    sorted.sort();
    sorted.dedup();
    let mut hasher = blake3::Hasher::new_keyed(&key);
    hasher.update(&(sorted.len() as u64).to_le_bytes());
    for s in sorted {
        // Length-prefixed so that ["ab", "cd"] and ["abcd"] differ.
        hasher.update(&(s.len() as u64).to_le_bytes());
        hasher.update(s);
    }
    *hasher.finalize().as_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> StatCache {
        let e = |n: u8| CacheEntry {
            dev: 1,
            ino: n as u64,
            size: 10,
            mtime_ns: -3,
            ctime_ns: 1 << 40,
            mode: 0o100644,
            hash: [n; 32],
        };
        StatCache {
            fingerprint: secrets_fingerprint::<&[u8]>(&[]),
            reference_ns: 1_700_000_000_000_000_000,
            entries: vec![("a".into(), e(1)), ("a/é".into(), e(2)), ("b".into(), e(3))],
        }
    }

    #[test]
    fn roundtrip_and_corruption() {
        let cache = sample();
        let bytes = encode(&cache);
        assert_eq!(decode(&bytes), Some(cache.clone()));
        for i in [0, 9, 50, bytes.len() - 1] {
            let mut bad = bytes.clone();
            bad[i] ^= 1;
            assert_eq!(decode(&bad), None, "flip at {i}");
        }
        assert_eq!(decode(&bytes[..bytes.len() - 1]), None);
        assert_eq!(decode(b""), None);
    }

    #[test]
    fn save_and_load() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/cache.bin");
        let cache = sample();
        cache.save(&path).unwrap();
        assert_eq!(StatCache::load(&path), Some(cache));
        assert_eq!(
            std::fs::read_dir(path.parent().unwrap()).unwrap().count(),
            1
        );
        assert_eq!(StatCache::load(&dir.path().join("missing")), None);
    }

    #[test]
    fn reuse_rules() {
        let cache = sample();
        let fp = cache.fingerprint;
        let (path, e) = &cache.entries[1];
        let stat = Stat {
            dev: e.dev,
            ino: e.ino,
            mode: e.mode,
            size: e.size,
            mtime_ns: e.mtime_ns,
            ctime_ns: e.ctime_ns,
        };
        assert_eq!(cache.reusable(path, &stat, &fp), Some(e.hash));
        let mut cursor = 0;
        assert_eq!(cache.reusable_in_order(&mut cursor, "a", &stat, &fp), None);
        assert_eq!(
            cache.reusable_in_order(&mut cursor, path, &stat, &fp),
            Some(e.hash)
        );
        assert_eq!(cache.reusable_in_order(&mut cursor, "az", &stat, &fp), None);
        assert_eq!(cursor, 2);
        assert_eq!(
            cache.reusable(
                path,
                &Stat {
                    ctime_ns: 5,
                    ..stat
                },
                &fp
            ),
            None
        );
        assert_eq!(cache.reusable("zz", &stat, &fp), None);
        assert_eq!(
            cache.reusable(path, &stat, &secrets_fingerprint(&[b"abcd"])),
            None
        );
        let racy = StatCache {
            reference_ns: e.mtime_ns,
            ..cache.clone()
        };
        assert_eq!(racy.reusable(path, &stat, &fp), None);
    }

    #[test]
    fn fingerprint_is_order_free_and_length_prefixed() {
        assert_eq!(
            secrets_fingerprint(&[b"abcd", b"efgh"]),
            secrets_fingerprint(&[b"efgh", b"abcd"])
        );
        assert_ne!(
            secrets_fingerprint(&[b"abcd".as_slice(), b"efgh"]),
            secrets_fingerprint(&[b"abcdefgh".as_slice()])
        );
    }
}
