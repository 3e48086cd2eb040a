//! The per-workspace stat cache: path → (dev, ino, size, mtime_ns, ctime_ns,
//! mode, hash), plus the fingerprint of the secret set the hashes were made
//! with and a reference time taken from the filesystem.
//!
//! git's racy-clean rule, on ctime as well as mtime: an entry whose mtime OR
//! ctime is at or after the reference time may have been modified again
//! within the same timestamp tick after we looked, so it is never trusted. The
//! reference time is read from the filesystem BEFORE the scan stats anything,
//! so anything stat'ed in a tick that could still change carries a time >= it.
//! (git looks at mtime only, so a same-second edit followed by `touch -d` that
//! sets the mtime back leaves git's index entry looking clean: same size, old
//! mtime, and a ctime equal to the recorded one because both fall in the same
//! second. The ctime cannot be set back by the sandbox, so checking it closes
//! that hole, at the price of hashing a file once more when only its ctime is
//! recent.)
//!
//! **Directories (git's untracked cache).** Beside the files, the cache keeps
//! each directory the scan listed: its stat (dev, ino, mtime, ctime) taken by
//! `fstat` of the very fd that was then listed, before the listing, and the
//! raw listing (every name with its `d_type`, before the policy is applied, so
//! a policy change needs no re-read). A later scan reuses a listing when the
//! fstat of the directory it opened matches and the recorded mtime and ctime
//! are before the reference time (the racy rule of the files, for the same
//! reason: a change in the tick of the listing leaves the stat as it was). Why that is
//! enough: a directory's listing changes only through an operation on the
//! directory itself (create, unlink, rename in or out), which sets its mtime
//! AND ctime to now. `touch -d` can set the mtime back but not the ctime;
//! a directory replaced by another one (or by a symlink, or moved in from
//! elsewhere) has another ino or a new ctime. Every entry of a reused listing
//! is still lstat'ed (files against their own cache entries, directories
//! opened and fstat'ed, so a mount point on a listed directory is seen:
//! mounting does not touch the parent's stat). What stays unseen, as in git:
//! a filesystem that does not update a directory's mtime/ctime when its
//! entries change (some network and FUSE filesystems), and a host clock set
//! back so that a new ctime equals the recorded one to the nanosecond.
//!
//! File format (little-endian), replaced atomically by rename:
//! `"CKPDSTC2"`, fingerprint[32], reference_ns i64, count u64, then per entry
//! `path_len u32, path, dev u64, ino u64, size u64, mtime_ns i64, ctime_ns i64,
//! mode u32, hash[32]`, sorted by path bytes; then `dir_count u64` and per
//! directory `path_len u32, path, dev u64, ino u64, mtime_ns i64, ctime_ns i64,
//! listing_len u32, listing` (sorted by path; the listing is per name
//! `d_type u8, name_len u16, name, NUL`), then BLAKE3 of everything before.
//! A `"CKPDSTC1"` file (no directory part) is still read.
//! A missing, truncated or corrupt file is an empty cache (so no fsync: a torn
//! write after a crash only costs one re-hash). Secrets are never stored.
//!
//! [`StatCache`] is the owned form a scan builds and saves; [`LoadedCache`]
//! keeps the file's bytes as read and parses an entry only when it is looked
//! at, so a 100,000-entry cache costs its file size in memory, once.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::fs::Stat;

const MAGIC: &[u8; 8] = b"CKPDSTC2";
/// The format before directories were kept (read, never written).
const MAGIC_V1: &[u8; 8] = b"CKPDSTC1";

/// One timestamp tick of a filesystem whose clock reading had no sub-second
/// part (ext4 with 128-byte inodes, ext3, FAT, overlays on those: 1 s), and of
/// one with fine timestamps (the kernel's coarse clock advances per jiffy,
/// at most 10 ms).
const COARSE_TICK_NS: i64 = 1_000_000_000;
const FINE_TICK_NS: i64 = 10_000_000;

/// The racy-clean reference for a scan of the workspace whose root is
/// `root_fd`: the workspace filesystem's own clock (the mtime of an unnamed
/// file made in the root with `O_TMPFILE`, so nothing appears in the
/// workspace; else a reserved top-level `.checkpointd-clock-*` name, which
/// capture and restore never touch), minus one timestamp tick of that
/// filesystem. A cache entry is trusted only when its mtime is before this, so
/// a rewrite within the same tick as the scan is always hashed again.
///
/// A workspace we cannot write to falls back to `fallback_dir`'s clock minus a
/// whole coarse tick (its granularity is unknown to us).
pub fn racy_reference_ns(root_fd: std::os::fd::RawFd, fallback_dir: &Path) -> io::Result<i64> {
    match workspace_clock_ns(root_fd) {
        Ok(now) => {
            let tick = if now % 1_000_000_000 == 0 {
                COARSE_TICK_NS
            } else {
                FINE_TICK_NS
            };
            Ok(now - tick)
        }
        Err(_) => Ok(crate::fs::filesystem_now(fallback_dir)? - COARSE_TICK_NS),
    }
}

fn workspace_clock_ns(root_fd: std::os::fd::RawFd) -> io::Result<i64> {
    use std::os::fd::{FromRawFd, OwnedFd};
    let open = |name: &std::ffi::CStr, flags: libc::c_int| -> io::Result<OwnedFd> {
        // SAFETY: a valid fd and C string; the result is owned below.
        let fd = unsafe { libc::openat(root_fd, name.as_ptr(), flags | libc::O_CLOEXEC, 0o600) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: just opened, owned here.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    };
    let unnamed = open(c".", libc::O_TMPFILE | libc::O_WRONLY);
    let file = match unnamed {
        Ok(file) => file,
        Err(_) => {
            static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let name =
                std::ffi::CString::new(format!(".checkpointd-clock-{}-{n}", std::process::id()))
                    .expect("no NUL");
            let file = open(
                &name,
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
            )?;
            // SAFETY: valid fd and C string.
            unsafe { libc::unlinkat(root_fd, name.as_ptr(), 0) };
            file
        }
    };
    use std::os::fd::AsRawFd;
    Ok(crate::fs::fstat(file.as_raw_fd())?.mtime_ns)
}

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

/// A directory's stat when it was listed: what must be unchanged for its
/// listing to be reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirStat {
    pub dev: u64,
    pub ino: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
}

impl DirStat {
    pub fn of(stat: &Stat) -> DirStat {
        DirStat {
            dev: stat.dev,
            ino: stat.ino,
            mtime_ns: stat.mtime_ns,
            ctime_ns: stat.ctime_ns,
        }
    }
}

/// One listed directory: its stat and its raw listing (see [`Listing`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirRecord {
    pub stat: DirStat,
    pub listing: Vec<u8>,
}

/// A directory's raw listing in the cache's encoding: per name `d_type u8,
/// name_len u16, name, NUL` (the NUL lets a reused name go to `fstatat` as is).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listing {
    pub bytes: Vec<u8>,
}

impl Listing {
    /// Append one name as `readdir` gave it (`d_type` raw: `DT_*`).
    pub fn push(&mut self, name: &[u8], d_type: u8) {
        debug_assert!(name.len() <= u16::MAX as usize && !name.contains(&0));
        self.bytes.push(d_type);
        self.bytes
            .extend_from_slice(&(name.len() as u16).to_le_bytes());
        self.bytes.extend_from_slice(name);
        self.bytes.push(0);
    }
}

/// The names of an encoded listing with their raw `d_type`, in listing order.
/// The bytes were validated when the cache was decoded (or built by us).
pub fn listing_names(bytes: &[u8]) -> impl Iterator<Item = (&std::ffi::CStr, u8)> + '_ {
    let mut at = 0usize;
    std::iter::from_fn(move || {
        let (name, d_type, next) = listing_entry(bytes, at)?;
        at = next;
        Some((name, d_type))
    })
}

/// The entry of `bytes` at `at`: name, `d_type` and where the next starts;
/// None at the end or when the bytes do not hold a well-formed entry.
fn listing_entry(bytes: &[u8], at: usize) -> Option<(&std::ffi::CStr, u8, usize)> {
    let d_type = *bytes.get(at)?;
    let len = u16::from_le_bytes(bytes.get(at + 1..at + 3)?.try_into().ok()?) as usize;
    let end = at + 3 + len + 1;
    let name = std::ffi::CStr::from_bytes_with_nul(bytes.get(at + 3..end)?).ok()?;
    Some((name, d_type, end))
}

/// Whether `bytes` is a well-formed listing of real names (no empty name,
/// no `.`/`..`, no `/`; the NUL placement is checked by `CStr`).
fn valid_listing(bytes: &[u8]) -> bool {
    let mut at = 0;
    while at < bytes.len() {
        let Some((name, _, next)) = listing_entry(bytes, at) else {
            return false;
        };
        let name = name.to_bytes();
        if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') {
            return false;
        }
        at = next;
    }
    true
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatCache {
    pub fingerprint: [u8; 32],
    pub reference_ns: i64,
    /// Sorted by path bytes, unique.
    pub entries: Vec<(String, CacheEntry)>,
    /// Listed directories, sorted by path bytes, unique ("" is the root).
    pub dirs: Vec<(String, DirRecord)>,
}

impl StatCache {
    /// Write atomically (temp file next to it, then rename). Creates the parent.
    pub fn save(&self, path: &Path) -> io::Result<()> {
        write_atomically(path, &encode(self))
    }

    /// Drop entries the racy rule already distrusts (used before moving the
    /// reference time forward, which would otherwise make them look clean).
    pub fn forget_racy(&mut self) {
        let reference = self.reference_ns;
        let settled = |mtime: i64, ctime: i64| mtime < reference && ctime < reference;
        self.entries
            .retain(|(_, e)| settled(e.mtime_ns, e.ctime_ns));
        self.dirs
            .retain(|(_, d)| settled(d.stat.mtime_ns, d.stat.ctime_ns));
    }
}

/// Record what a restore wrote: each `(path, entry)` is the stat of an inode
/// the restore itself created and renamed in (never a fresh `stat(path)`
/// paired with a hash it did not see written). Merged into the cache at
/// `path` (a cache made with other secrets is started afresh), with the
/// reference time moved to `reference_ns` (read on the workspace's
/// filesystem after the last write); entries the old reference already
/// distrusted are dropped first, as they would look clean under the new one.
pub fn record_written(
    path: &Path,
    fingerprint: [u8; 32],
    reference_ns: i64,
    mut updates: Vec<(String, CacheEntry)>,
) -> io::Result<()> {
    let mut cache = match LoadedCache::load(path) {
        Some(c) if c.fingerprint == fingerprint => c.into_owned(),
        _ => StatCache {
            fingerprint,
            ..StatCache::default()
        },
    };
    cache.forget_racy();
    cache.reference_ns = cache.reference_ns.max(reference_ns);
    updates.sort_by(|a, b| a.0.cmp(&b.0));
    updates.dedup_by(|later, earlier| later.0 == earlier.0);
    let mut merged = Vec::with_capacity(cache.entries.len() + updates.len());
    let mut old = std::mem::take(&mut cache.entries).into_iter().peekable();
    for update in updates {
        while let Some(o) = old.next_if(|o| o.0 < update.0) {
            merged.push(o);
        }
        old.next_if(|o| o.0 == update.0);
        merged.push(update);
    }
    merged.extend(old);
    cache.entries = merged;
    cache.save(path)
}

/// Write `bytes` to `path` through a temp file next to it and a rename, so a
/// reader sees the old file or the new one. Creates the parent directory.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    if let Some(parent) = path.parent() {
        if !parent.as_os_str().is_empty() {
            fs::create_dir_all(parent)?;
        }
    }
    let tmp = temp_path(path);
    let result = (|| {
        let mut file = fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        drop(file);
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
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
    let entries = cache.entries.iter().map(|(p, e)| (p.as_str(), *e));
    let dirs = cache
        .dirs
        .iter()
        .map(|(p, d)| (p.as_str(), d.stat, d.listing.as_slice()));
    encode_entries(&cache.fingerprint, cache.reference_ns, entries, dirs)
}

/// The file bytes for `entries` and `dirs` (each sorted by path, unique),
/// written straight from the caller's data: no owned copy of the cache is
/// needed to save it.
pub fn encode_entries<'a, 'b, I, D>(
    fingerprint: &[u8; 32],
    reference_ns: i64,
    entries: I,
    dirs: D,
) -> Vec<u8>
where
    I: Iterator<Item = (&'a str, CacheEntry)> + Clone,
    D: Iterator<Item = (&'b str, DirStat, &'b [u8])> + Clone,
{
    let (count, bytes) = entries.clone().fold((0usize, 0usize), |(n, b), (p, _)| {
        (n + 1, b + 4 + p.len() + FIXED)
    });
    let dir_bytes: usize = dirs
        .clone()
        .map(|(p, _, l)| 4 + p.len() + DIR_FIXED + l.len())
        .sum();
    let mut out = Vec::with_capacity(HEADER + bytes + 8 + dir_bytes + 32);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(fingerprint);
    out.extend_from_slice(&reference_ns.to_le_bytes());
    out.extend_from_slice(&(count as u64).to_le_bytes());
    for (path, e) in entries {
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
    let count_at = out.len();
    out.extend_from_slice(&0u64.to_le_bytes());
    let mut dir_count = 0u64;
    for (path, stat, listing) in dirs {
        dir_count += 1;
        out.extend_from_slice(&(path.len() as u32).to_le_bytes());
        out.extend_from_slice(path.as_bytes());
        out.extend_from_slice(&stat.dev.to_le_bytes());
        out.extend_from_slice(&stat.ino.to_le_bytes());
        out.extend_from_slice(&stat.mtime_ns.to_le_bytes());
        out.extend_from_slice(&stat.ctime_ns.to_le_bytes());
        out.extend_from_slice(&(listing.len() as u32).to_le_bytes());
        out.extend_from_slice(listing);
    }
    out[count_at..count_at + 8].copy_from_slice(&dir_count.to_le_bytes());
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

/// Bytes of the fixed part of an entry after its path.
const FIXED: usize = 8 * 5 + 4 + 32;
/// Bytes of the fixed part of a directory after its path (stat, listing length).
const DIR_FIXED: usize = 8 * 4 + 4;
const HEADER: usize = 8 + 32 + 8 + 8;

/// A cache as read from disk: the validated bytes plus where each entry starts.
#[derive(Debug)]
pub struct LoadedCache {
    data: Vec<u8>,
    pub fingerprint: [u8; 32],
    pub reference_ns: i64,
    /// Offset of each entry's path bytes, and the path length.
    paths: Vec<(u32, u32)>,
    /// Offset of each directory's path bytes, and the path length.
    dirs: Vec<(u32, u32)>,
}

impl LoadedCache {
    /// Read the cache at `path`; None when missing or not a valid cache.
    pub fn load(path: &Path) -> Option<LoadedCache> {
        LoadedCache::decode(fs::read(path).ok()?)
    }

    /// Validate `data` (checksum, layout, UTF-8, strictly sorted paths).
    pub fn decode(mut data: Vec<u8>) -> Option<LoadedCache> {
        if data.len() < HEADER + 32 || data.len() > u32::MAX as usize {
            return None;
        }
        let body_len = data.len() - 32;
        // Big caches are checked on every core (a million entries: ~180 MB).
        let mut hasher = blake3::Hasher::new();
        if body_len >= 1 << 20 {
            hasher.update_rayon(&data[..body_len]);
        } else {
            hasher.update(&data[..body_len]);
        }
        if hasher.finalize().as_bytes() != &data[body_len..] {
            return None;
        }
        data.truncate(body_len);
        let mut r = Reader {
            data: &data,
            pos: 0,
        };
        let version = r.take(MAGIC.len())?;
        let has_dirs = version == MAGIC;
        if !has_dirs && version != MAGIC_V1 {
            return None;
        }
        let fingerprint = r.array::<32>()?;
        let reference_ns = r.i64()?;
        let count = r.u64()?;
        // Refuse counts the body cannot hold before allocating for them.
        if count > (body_len / (4 + FIXED)) as u64 {
            return None;
        }
        let mut paths: Vec<(u32, u32)> = Vec::with_capacity(count as usize);
        let mut previous: &[u8] = &[];
        for index in 0..count {
            let len = r.u32()? as usize;
            let start = r.pos;
            let path = r.take(len)?;
            std::str::from_utf8(path).ok()?;
            if index > 0 && previous >= path {
                return None;
            }
            previous = path;
            r.take(FIXED)?;
            paths.push((start as u32, len as u32));
        }
        let mut dirs: Vec<(u32, u32)> = Vec::new();
        if has_dirs {
            let dir_count = r.u64()?;
            if dir_count > (body_len / (4 + DIR_FIXED)) as u64 {
                return None;
            }
            dirs.reserve(dir_count as usize);
            let mut previous: &[u8] = &[];
            for index in 0..dir_count {
                let len = r.u32()? as usize;
                let start = r.pos;
                let path = r.take(len)?;
                std::str::from_utf8(path).ok()?;
                if index > 0 && previous >= path {
                    return None;
                }
                previous = path;
                r.take(DIR_FIXED - 4)?;
                let listing_len = r.u32()? as usize;
                if !valid_listing(r.take(listing_len)?) {
                    return None;
                }
                dirs.push((start as u32, len as u32));
            }
        }
        if r.pos != body_len {
            return None;
        }
        Some(LoadedCache {
            data,
            fingerprint,
            reference_ns,
            paths,
            dirs,
        })
    }

    /// How many directories' listings the cache holds.
    pub fn dir_count(&self) -> usize {
        self.dirs.len()
    }

    /// Directory `index`: its path, recorded stat and listing bytes.
    fn dir(&self, index: usize) -> (&str, DirStat, &[u8]) {
        let (start, len) = self.dirs[index];
        let path = &self.data[start as usize..(start + len) as usize];
        let at = (start + len) as usize;
        let mut r = Reader {
            data: &self.data[at..],
            pos: 0,
        };
        let parsed = (|| {
            let stat = DirStat {
                dev: r.u64()?,
                ino: r.u64()?,
                mtime_ns: r.i64()?,
                ctime_ns: r.i64()?,
            };
            let listing_len = r.u32()? as usize;
            Some((stat, r.take(listing_len)?))
        })();
        let (stat, listing) = parsed.expect("decode checked every directory's layout");
        (std::str::from_utf8(path).unwrap_or_default(), stat, listing)
    }

    /// The recorded listing of the directory at `path` when it may be reused
    /// for a directory whose fstat (taken before looking here) is `stat`:
    /// same dev, ino, mtime and ctime, and not racily clean (both strictly
    /// before the reference time of the scan that listed it).
    pub fn dir_listing(&self, path: &str, stat: &Stat) -> Option<&[u8]> {
        let index = self
            .dirs
            .binary_search_by(|&(start, len)| {
                self.data[start as usize..(start + len) as usize].cmp(path.as_bytes())
            })
            .ok()?;
        let (_, recorded, listing) = self.dir(index);
        (recorded == DirStat::of(stat) && self.settled(recorded.mtime_ns, recorded.ctime_ns))
            .then_some(listing)
    }

    /// Not racily clean: both times strictly before the reference (see the
    /// module docs for why ctime counts too).
    fn settled(&self, mtime_ns: i64, ctime_ns: i64) -> bool {
        mtime_ns < self.reference_ns && ctime_ns < self.reference_ns
    }

    pub fn len(&self) -> usize {
        self.paths.len()
    }

    pub fn is_empty(&self) -> bool {
        self.paths.is_empty()
    }

    fn path_bytes(&self, index: usize) -> &[u8] {
        let (start, len) = self.paths[index];
        &self.data[start as usize..(start + len) as usize]
    }

    /// The path of entry `index` (validated as UTF-8 by `decode`).
    pub fn path(&self, index: usize) -> &str {
        std::str::from_utf8(self.path_bytes(index)).unwrap_or_default()
    }

    /// Entry `index`, parsed from the bytes.
    pub fn entry(&self, index: usize) -> CacheEntry {
        let (start, len) = self.paths[index];
        let at = (start + len) as usize;
        let mut r = Reader {
            data: &self.data[at..at + FIXED],
            pos: 0,
        };
        let parsed = (|| {
            Some(CacheEntry {
                dev: r.u64()?,
                ino: r.u64()?,
                size: r.u64()?,
                mtime_ns: r.i64()?,
                ctime_ns: r.i64()?,
                mode: r.u32()?,
                hash: r.array::<32>()?,
            })
        })();
        parsed.expect("decode checked every entry's length")
    }

    /// The cached hash of `path` if the cache may be trusted for `stat` under
    /// the secret set `fingerprint`: same stat, and not racily clean (mtime
    /// and ctime strictly before the reference time).
    pub fn reusable(&self, path: &str, stat: &Stat, fingerprint: &[u8; 32]) -> Option<[u8; 32]> {
        let index = self
            .paths
            .binary_search_by(|&(start, len)| {
                self.data[start as usize..(start + len) as usize].cmp(path.as_bytes())
            })
            .ok()?;
        self.trusted(index, stat, fingerprint)
    }

    /// Like [`LoadedCache::reusable`] for callers visiting paths in ascending
    /// order: `cursor` remembers where the last lookup ended (a merge, not a search).
    pub fn reusable_in_order(
        &self,
        cursor: &mut usize,
        path: &str,
        stat: &Stat,
        fingerprint: &[u8; 32],
    ) -> Option<[u8; 32]> {
        while *cursor < self.paths.len() && self.path_bytes(*cursor) < path.as_bytes() {
            *cursor += 1;
        }
        if *cursor < self.paths.len() && self.path_bytes(*cursor) == path.as_bytes() {
            return self.trusted(*cursor, stat, fingerprint);
        }
        None
    }

    fn trusted(&self, index: usize, stat: &Stat, fingerprint: &[u8; 32]) -> Option<[u8; 32]> {
        if &self.fingerprint != fingerprint {
            return None;
        }
        let entry = self.entry(index);
        (entry.same_stat(stat) && self.settled(entry.mtime_ns, entry.ctime_ns))
            .then_some(entry.hash)
    }

    /// The owned form (for merging updates into it).
    pub fn into_owned(self) -> StatCache {
        let entries = (0..self.len())
            .map(|i| (self.path(i).to_string(), self.entry(i)))
            .collect();
        let dirs = (0..self.dirs.len())
            .map(|i| {
                let (path, stat, listing) = self.dir(i);
                (
                    path.to_string(),
                    DirRecord {
                        stat,
                        listing: listing.to_vec(),
                    },
                )
            })
            .collect();
        StatCache {
            fingerprint: self.fingerprint,
            reference_ns: self.reference_ns,
            entries,
            dirs,
        }
    }
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

    fn dir(ino: u64, names: &[&[u8]]) -> DirRecord {
        let mut listing = Listing::default();
        for name in names {
            listing.push(name, libc::DT_REG);
        }
        DirRecord {
            stat: DirStat {
                dev: 1,
                ino,
                mtime_ns: 5,
                ctime_ns: 6,
            },
            listing: listing.bytes,
        }
    }

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
            dirs: vec![
                ("".into(), dir(1, &[b"a", b"b"])),
                ("a".into(), dir(2, &[b"\xff"])),
            ],
        }
    }

    #[test]
    fn roundtrip_and_corruption() {
        let cache = sample();
        let bytes = encode(&cache);
        let decode = |b: &[u8]| LoadedCache::decode(b.to_vec()).map(LoadedCache::into_owned);
        assert_eq!(decode(&bytes), Some(cache.clone()));
        for i in [0, 9, 50, bytes.len() - 1] {
            let mut bad = bytes.clone();
            bad[i] ^= 1;
            assert_eq!(decode(&bad), None, "flip at {i}");
        }
        assert_eq!(decode(&bytes[..bytes.len() - 1]), None);
        assert_eq!(decode(b""), None);
        // Unsorted paths are refused even with a valid checksum.
        let mut unsorted = cache.clone();
        unsorted.entries.swap(0, 2);
        assert_eq!(decode(&encode(&unsorted)), None);
    }

    #[test]
    fn save_and_load() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/cache.bin");
        let cache = sample();
        cache.save(&path).unwrap();
        assert_eq!(
            LoadedCache::load(&path).map(LoadedCache::into_owned),
            Some(cache)
        );
        assert_eq!(
            std::fs::read_dir(path.parent().unwrap()).unwrap().count(),
            1
        );
        assert!(LoadedCache::load(&dir.path().join("missing")).is_none());
    }

    #[test]
    fn reuse_rules() {
        let owned = sample();
        let cache = LoadedCache::decode(encode(&owned)).unwrap();
        let fp = cache.fingerprint;
        let (path, e) = &owned.entries[1];
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
            ..owned.clone()
        };
        let racy = LoadedCache::decode(encode(&racy)).unwrap();
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
