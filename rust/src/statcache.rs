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
//! **The manifest witness.** A scan that writes the cache also records the
//! digest of the manifest its rows make, with the key of how it scanned
//! (policy, roots, secret set, code version). A later scan under the same key
//! that reuses every listing and every file entry, and hashes no file outside
//! the cache, has the same rows: each file row is its cache entry's stat and
//! hash, each directory's mode is covered by that directory's own listing
//! stat (a chmod moves its ctime), and each symlink can only change by being
//! replaced, which moves its directory's stat. So it knows its manifest's
//! digest without encoding it, and a no-change capture compares digests
//! instead of every byte (see `scan`). A restore, which merges entries it
//! wrote into the cache, drops the witness.
//!
//! File format: see [`write_cache`] (`"CKPDSTC5"`, replaced atomically by
//! rename). The file entries are kept per directory, one block each; the
//! directories follow them, each with its stat, its raw listing and where
//! its block is and what it hashes to, then a trailer, the directories and
//! the trailer checksummed together. A scan reads the directories whole and
//! looks a directory's block up while it lists that directory, on whichever
//! walk thread lists it: reusing a file's hash needs no pass over all the
//! entries after the walk, nor the walk's rows in path order. A file of an
//! older version is not read: the next scan hashes everything once and
//! writes the new format. A missing, truncated or corrupt file is an empty
//! cache, and a block that does not match its checksum an empty directory
//! (so no fsync: a torn write after a crash only costs one re-hash); a
//! block is verified before any of its entries is used. Secrets are never
//! stored.
//!
//! [`LoadedCache`] is a cache opened for a scan: its directories in memory
//! (a few bytes per directory) and its entries left in the file, read one
//! directory's block at a time ([`LoadedCache::dir_files`]), so a
//! million-entry cache never costs a scan its size at once. [`StatCache`]
//! is the owned form a restore merges its writes into.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::fs::Stat;

const MAGIC: &[u8; 8] = b"CKPDSTC5";

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

/// What the scan that wrote a cache produced: the manifest digest of its
/// rows, and the key of how it scanned (policy, roots, secret set, code
/// version; see `scan::outcome_key`). A later scan that reuses every
/// listing and every file entry of that cache, under the same key, has
/// the same rows, so its manifest has this digest without being encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ManifestWitness {
    pub key: [u8; 32],
    pub digest: [u8; 32],
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

/// A cache in its owned form: what a restore merges its writes into, and what
/// tests build. (A scan never builds one: it streams its rows to
/// [`write_cache`] and reads the old cache through [`LoadedCache`].)
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
        let entries = |visit: &mut dyn FnMut(&str, CacheEntry)| self.visit_entries(visit);
        // An owned cache is one a restore merged its writes into: the rows
        // of no scan, so it vouches for no manifest.
        write_cache(
            path,
            &self.fingerprint,
            self.reference_ns,
            None,
            &entries,
            self.listed(),
        )
    }

    /// Its file entries in path order, as `write_cache` visits them.
    fn visit_entries(&self, visit: &mut dyn FnMut(&str, CacheEntry)) {
        for (p, e) in &self.entries {
            visit(p, *e);
        }
    }

    /// Its listed directories in path order, as `write_cache` takes them.
    fn listed(&self) -> impl Iterator<Item = (&str, DirStat, &[u8])> {
        self.dirs
            .iter()
            .map(|(p, d)| (p.as_str(), d.stat, d.listing.as_slice()))
    }
}

/// Record what a restore wrote: each `(path, entry)` is the stat of an inode
/// the restore itself created and renamed in (never a fresh `stat(path)`
/// paired with a hash it did not see written). Merged into the cache at
/// `path` (a cache made with other secrets, or one that does not verify, is
/// started afresh), as [`write_merged`] merges. A restore merges into the
/// cache its own live scan kept in memory instead ([`crate::scan::KeptCache`]),
/// so the file is written once.
pub fn record_written(
    path: &Path,
    fingerprint: [u8; 32],
    reference_ns: i64,
    updates: Vec<(String, CacheEntry)>,
) -> io::Result<()> {
    let old = LoadedCache::load(path)
        .and_then(LoadedCache::into_owned)
        .unwrap_or_else(|| StatCache {
            fingerprint,
            reference_ns: i64::MIN,
            ..StatCache::default()
        });
    let entries = |visit: &mut dyn FnMut(&str, CacheEntry)| old.visit_entries(visit);
    let base = Base {
        fingerprint: old.fingerprint,
        reference_ns: old.reference_ns,
        entries: &entries,
        dirs: old.listed(),
    };
    write_merged(path, base, fingerprint, reference_ns, updates)
}

/// The cache a restore's writes are merged into: its secret-set
/// fingerprint, reference time, file entries (in path order) and listed
/// directories (in path order).
pub struct Base<'a, D> {
    pub fingerprint: [u8; 32],
    pub reference_ns: i64,
    pub entries: &'a EntryVisitor<'a>,
    pub dirs: D,
}

/// Save at `path` the cache `base` with a restore's `updates` merged in (an
/// update replaces the entry of its path; the first of a path's updates
/// wins), the reference time moved to `reference_ns` (read on the
/// workspace's filesystem after the last write). A base made with other
/// secrets than `fingerprint` is dropped (the cache starts afresh). Entries
/// and directories the base's own reference already distrusted are dropped
/// first, as they would look clean under the new one. The result vouches for
/// no manifest (no witness): it holds the rows of no scan.
pub fn write_merged<'b, D>(
    path: &Path,
    base: Base<'_, D>,
    fingerprint: [u8; 32],
    reference_ns: i64,
    mut updates: Vec<(String, CacheEntry)>,
) -> io::Result<()>
where
    D: Iterator<Item = (&'b str, DirStat, &'b [u8])>,
{
    updates.sort_by(|a, b| a.0.cmp(&b.0));
    updates.dedup_by(|later, earlier| later.0 == earlier.0);
    let same_secrets = base.fingerprint == fingerprint;
    let base_reference = base.reference_ns;
    let kept = move |mtime: i64, ctime: i64| same_secrets && settled(base_reference, mtime, ctime);
    let entries = |visit: &mut dyn FnMut(&str, CacheEntry)| {
        let mut pending = updates.iter().peekable();
        (base.entries)(&mut |p, e| {
            while let Some((u, ue)) = pending.next_if(|(u, _)| u.as_str() < p) {
                visit(u, *ue);
            }
            if pending.peek().is_some_and(|(u, _)| u.as_str() == p) {
                return;
            }
            if kept(e.mtime_ns, e.ctime_ns) {
                visit(p, e);
            }
        });
        for (u, ue) in pending {
            visit(u, *ue);
        }
    };
    let dirs = base
        .dirs
        .filter(move |(_, stat, _)| kept(stat.mtime_ns, stat.ctime_ns));
    // (A base of other secrets is dropped whole: its reference goes too.)
    let reference_ns = match same_secrets {
        true => base_reference.max(reference_ns),
        false => reference_ns,
    };
    write_cache(path, &fingerprint, reference_ns, None, &entries, dirs)
}

/// Write `bytes` to `path` through a temp file next to it and a rename, so a
/// reader sees the old file or the new one. Creates the parent directory.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_streamed(path, |file| file.write_all(bytes))
}

/// Like [`write_atomically`], with the bytes written by `write` into the
/// temp file as they are made (no copy of the whole file in memory).
fn write_streamed(
    path: &Path,
    write: impl FnOnce(&mut fs::File) -> io::Result<()>,
) -> io::Result<()> {
    if let Some(parent) = path.parent() {
        if !parent.as_os_str().is_empty() {
            fs::create_dir_all(parent)?;
        }
    }
    let tmp = temp_path(path);
    let result = (|| {
        let mut file = fs::File::create(&tmp)?;
        write(&mut file)?;
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

/// Bytes of the fixed part of an entry after its name.
const FIXED: usize = 8 * 5 + 4 + 32;
/// Bytes before an entry's name: its length (u16).
const ENTRY_HEAD: usize = 2;
/// Bytes of a directory record between its path and its listing (flags,
/// stat, listing length), and after its listing (its file block).
const DIR_BEFORE_LISTING: usize = 1 + 8 * 4 + 4;
const DIR_AFTER_LISTING: usize = 8 + 4 + 4 + 8;
/// A directory record's flag: it holds the directory's listing (a record
/// without one only carries the file entries a restore wrote there).
const LISTED: u8 = 1;
/// fingerprint, reference, entry count, directory count, directory bytes,
/// entry bytes, witness key and digest (all zero for none); then the checksum.
const TRAILER: usize = 32 + 8 * 5 + 32 + 32;
const CHECKSUM: usize = 32;
/// Writes are buffered in blocks of this size.
const BLOCK: usize = 1 << 20;
/// A path longer than this is not cached (its file is hashed every time);
/// the walk cannot open one anyway (PATH_MAX is 4096).
const MAX_PATH: usize = u16::MAX as usize;

/// Where a directory's file entries are in the entry section, how many, and
/// the checksum of their bytes (kept in the checksummed directory section,
/// so a block read on its own is verified against it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct BlockRef {
    at: u64,
    len: u32,
    count: u32,
    checksum: u64,
}

/// A block's checksum: XXH3-64, not BLAKE3, for it is verified for every
/// directory of every scan (BLAKE3 of the blocks was ~4% of a no-change
/// scan) and only has to catch damage (a torn write, a bad disk block): the
/// file is in the data dir, which the sandbox cannot write, and the
/// directory section holding these checksums is itself under BLAKE3.
fn block_checksum(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

/// Buffered writes to the cache file, through a BLAKE3 of what is written
/// while `hashing` (the directory section and the trailer).
struct CacheWriter<'f> {
    file: &'f mut fs::File,
    buffer: Vec<u8>,
    hasher: blake3::Hasher,
    hashing: bool,
}

impl CacheWriter<'_> {
    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        if self.hashing {
            self.hasher.update(bytes);
        }
        self.buffer.extend_from_slice(bytes);
        if self.buffer.len() >= BLOCK {
            self.file.write_all(&self.buffer)?;
            self.buffer.clear();
        }
        Ok(())
    }

    fn finish(mut self) -> io::Result<()> {
        let checksum = self.hasher.finalize();
        self.buffer.extend_from_slice(checksum.as_bytes());
        self.file.write_all(&self.buffer)
    }
}

/// One directory's file entries while they are gathered for its block:
/// `name_len u16, name, fixed record` each, in name order.
struct OpenBlock {
    dir: String,
    bytes: Vec<u8>,
    count: u32,
}

/// Whether `dir` is `ancestor` or lies below it ("" is the root, above all).
fn within(dir: &str, ancestor: &str) -> bool {
    ancestor.is_empty()
        || (dir.starts_with(ancestor)
            && (dir.len() == ancestor.len() || dir.as_bytes()[ancestor.len()] == b'/'))
}

/// The directory and name of a file entry's path (`a/b/c` is `a/b`, `c`).
fn split_path(path: &str) -> (&str, &str) {
    match path.rfind('/') {
        Some(at) => (&path[..at], &path[at + 1..]),
        None => ("", path),
    }
}

/// Calls its argument with each cache entry, in path order.
pub type EntryVisitor<'a> = dyn Fn(&mut dyn FnMut(&str, CacheEntry)) + 'a;

/// Save a cache of `entries` and `dirs` (each sorted by path bytes, unique)
/// at `path`, atomically, streamed from the caller's data: the entries are
/// gathered per directory (only the directories on the path being visited
/// are open at a time: in path order a directory's subtree is contiguous)
/// and each directory's block is written when its subtree has been passed.
///
/// Layout (little-endian, `"CKPDSTC5"`): the magic; the entry section, one
/// block per directory holding files (per entry `name_len u16, name, dev,
/// ino, size u64, mtime_ns, ctime_ns i64, mode u32, hash[32]`, in name
/// order); the directory section, in path order (per directory `path_len
/// u32, path, flags u8 (1: listed), dev u64, ino u64, mtime_ns i64,
/// ctime_ns i64, listing_len u32, listing, block_at u64, block_len u32,
/// block_count u32, block XXH3-64 u64`, where a directory without a listing
/// carries only a restore's entries and a zero stat); the trailer
/// (fingerprint[32], reference_ns i64, entry count u64, directory count
/// u64, directory bytes u64, entry bytes u64, witness key[32], witness
/// digest[32], both zero for no witness); the BLAKE3 of the directory
/// section and the trailer. So a scan reads the directories whole and each
/// directory's block when it lists that directory, verified on its own.
pub fn write_cache<'b, D>(
    path: &Path,
    fingerprint: &[u8; 32],
    reference_ns: i64,
    witness: Option<&ManifestWitness>,
    entries: &EntryVisitor<'_>,
    dirs: D,
) -> io::Result<()>
where
    D: Iterator<Item = (&'b str, DirStat, &'b [u8])>,
{
    write_streamed(path, |file| {
        let mut out = CacheWriter {
            file,
            buffer: Vec::with_capacity(BLOCK + 4096),
            hasher: blake3::Hasher::new(),
            hashing: false,
        };
        out.put(MAGIC)?;
        let mut entry_bytes = 0u64;
        let mut entry_count = 0u64;
        let mut blocks: Vec<(String, BlockRef)> = Vec::new();
        let mut failed: Option<io::Error> = None;
        let mut close = |block: OpenBlock, out: &mut CacheWriter<'_>| -> io::Result<()> {
            out.put(&block.bytes)?;
            blocks.push((
                block.dir,
                BlockRef {
                    at: entry_bytes,
                    len: block.bytes.len() as u32,
                    count: block.count,
                    checksum: block_checksum(&block.bytes),
                },
            ));
            entry_bytes += block.bytes.len() as u64;
            entry_count += u64::from(block.count);
            Ok(())
        };
        let mut open: Vec<OpenBlock> = Vec::new();
        let mut record = [0u8; FIXED];
        entries(&mut |path, e| {
            let (dir, name) = split_path(path);
            if failed.is_some() || path.len() > MAX_PATH || name.is_empty() {
                return;
            }
            // The blocks of directories whose subtree is behind us are complete.
            while open.last().is_some_and(|b| !within(dir, &b.dir)) {
                let done = open.pop().expect("just seen");
                if let Err(error) = close(done, &mut out) {
                    failed = Some(error);
                    return;
                }
            }
            if open.last().map_or(true, |b| b.dir != dir) {
                open.push(OpenBlock {
                    dir: dir.to_string(),
                    bytes: Vec::new(),
                    count: 0,
                });
            }
            let block = open.last_mut().expect("just pushed");
            record[0..8].copy_from_slice(&e.dev.to_le_bytes());
            record[8..16].copy_from_slice(&e.ino.to_le_bytes());
            record[16..24].copy_from_slice(&e.size.to_le_bytes());
            record[24..32].copy_from_slice(&e.mtime_ns.to_le_bytes());
            record[32..40].copy_from_slice(&e.ctime_ns.to_le_bytes());
            record[40..44].copy_from_slice(&e.mode.to_le_bytes());
            record[44..76].copy_from_slice(&e.hash);
            block
                .bytes
                .extend_from_slice(&(name.len() as u16).to_le_bytes());
            block.bytes.extend_from_slice(name.as_bytes());
            block.bytes.extend_from_slice(&record);
            block.count += 1;
        });
        if let Some(error) = failed {
            return Err(error);
        }
        while let Some(done) = open.pop() {
            close(done, &mut out)?;
        }
        blocks.sort_unstable_by(|a, b| a.0.cmp(&b.0));

        // The directories: the listed ones and those holding a block, merged.
        out.hashing = true;
        let (mut dir_count, mut dir_bytes) = (0u64, 0u64);
        let mut put_dir = |out: &mut CacheWriter<'_>,
                           path: &str,
                           listed: Option<(DirStat, &[u8])>,
                           block: BlockRef|
         -> io::Result<()> {
            let (stat, listing) = listed.unwrap_or((
                DirStat {
                    dev: 0,
                    ino: 0,
                    mtime_ns: 0,
                    ctime_ns: 0,
                },
                &[],
            ));
            out.put(&(path.len() as u32).to_le_bytes())?;
            out.put(path.as_bytes())?;
            out.put(&[if listed.is_some() { LISTED } else { 0 }])?;
            out.put(&stat.dev.to_le_bytes())?;
            out.put(&stat.ino.to_le_bytes())?;
            out.put(&stat.mtime_ns.to_le_bytes())?;
            out.put(&stat.ctime_ns.to_le_bytes())?;
            out.put(&(listing.len() as u32).to_le_bytes())?;
            out.put(listing)?;
            out.put(&block.at.to_le_bytes())?;
            out.put(&block.len.to_le_bytes())?;
            out.put(&block.count.to_le_bytes())?;
            out.put(&block.checksum.to_le_bytes())?;
            dir_count += 1;
            dir_bytes +=
                (4 + path.len() + DIR_BEFORE_LISTING + listing.len() + DIR_AFTER_LISTING) as u64;
            Ok(())
        };
        let empty_block = BlockRef {
            checksum: block_checksum(b""),
            ..BlockRef::default()
        };
        let mut blocks = blocks.into_iter().peekable();
        for (path, stat, listing) in dirs {
            while let Some((dir, block)) = blocks.next_if(|(dir, _)| dir.as_str() < path) {
                put_dir(&mut out, &dir, None, block)?;
            }
            let block = match blocks.next_if(|(dir, _)| dir.as_str() == path) {
                Some((_, block)) => block,
                None => empty_block,
            };
            put_dir(&mut out, path, Some((stat, listing)), block)?;
        }
        for (dir, block) in blocks {
            put_dir(&mut out, &dir, None, block)?;
        }
        let none = ManifestWitness {
            key: [0; 32],
            digest: [0; 32],
        };
        let witness = witness.unwrap_or(&none);
        out.put(fingerprint)?;
        out.put(&reference_ns.to_le_bytes())?;
        out.put(&entry_count.to_le_bytes())?;
        out.put(&dir_count.to_le_bytes())?;
        out.put(&dir_bytes.to_le_bytes())?;
        out.put(&entry_bytes.to_le_bytes())?;
        out.put(&witness.key)?;
        out.put(&witness.digest)?;
        out.finish()
    })
}

fn le_u64(bytes: &[u8]) -> u64 {
    u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"))
}

fn le_i64(bytes: &[u8]) -> i64 {
    i64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"))
}

fn le_u32(bytes: &[u8]) -> u32 {
    u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes"))
}

fn le_u16(bytes: &[u8]) -> u16 {
    u16::from_le_bytes(bytes[..2].try_into().expect("2 bytes"))
}

fn parse_fixed(r: &[u8]) -> CacheEntry {
    CacheEntry {
        dev: le_u64(&r[0..]),
        ino: le_u64(&r[8..]),
        size: le_u64(&r[16..]),
        mtime_ns: le_i64(&r[24..]),
        ctime_ns: le_i64(&r[32..]),
        mode: le_u32(&r[40..]),
        hash: r[44..76].try_into().expect("32 bytes"),
    }
}

/// One directory record of a loaded cache.
#[derive(Debug, Clone, Copy)]
struct DirIndex {
    path_at: u32,
    path_len: u32,
    /// Its recorded stat and listing, when it was listed.
    listed: Option<DirStat>,
    listing_at: u32,
    listing_len: u32,
    block: BlockRef,
}

/// A cache as opened from disk: the trailer and the directories, read and
/// verified whole (a few bytes per directory), and the file entries left in
/// the file, one block per directory read by [`LoadedCache::dir_files`] when
/// the walk lists that directory. So a million-entry cache costs a scan its
/// directories in memory, never its entries at once, and its paths are
/// never turned into objects.
#[derive(Debug)]
pub struct LoadedCache {
    pub fingerprint: [u8; 32],
    pub reference_ns: i64,
    /// None: the cache was written by a restore.
    pub witness: Option<ManifestWitness>,
    entry_count: u64,
    /// How many directories the cache holds (kept by [`LoadedCache::forget_listings`]).
    dir_count: usize,
    /// The directory section as read (validated).
    dir_data: Vec<u8>,
    dirs: Vec<DirIndex>,
    file: fs::File,
}

/// Where the entry section starts (after the magic).
const ENTRIES_AT: u64 = MAGIC.len() as u64;

impl LoadedCache {
    /// Open the cache at `path`; None when missing, of another version, or
    /// when its trailer or directories do not verify (each directory's block
    /// is verified when it is read).
    pub fn load(path: &Path) -> Option<LoadedCache> {
        use std::os::unix::fs::FileExt;
        let file = fs::File::open(path).ok()?;
        let len = file.metadata().ok()?.len();
        let mut magic = [0u8; 8];
        file.read_exact_at(&mut magic, 0).ok()?;
        if &magic != MAGIC || len < ENTRIES_AT + (TRAILER + CHECKSUM) as u64 {
            return None;
        }
        let mut trailer = [0u8; TRAILER + CHECKSUM];
        file.read_exact_at(&mut trailer, len - (TRAILER + CHECKSUM) as u64)
            .ok()?;
        let fingerprint: [u8; 32] = trailer[0..32].try_into().ok()?;
        let reference_ns = le_i64(&trailer[32..]);
        let entry_count = le_u64(&trailer[40..]);
        let dir_count = le_u64(&trailer[48..]);
        let dir_bytes = le_u64(&trailer[56..]);
        let entry_bytes = le_u64(&trailer[64..]);
        let witness = ManifestWitness {
            key: trailer[72..104].try_into().expect("32 bytes"),
            digest: trailer[104..136].try_into().expect("32 bytes"),
        };
        let witness = (witness.key != [0; 32]).then_some(witness);
        // The sections must fill the file exactly; refuse sizes it cannot
        // hold before allocating for them.
        let body = len - ENTRIES_AT - (TRAILER + CHECKSUM) as u64;
        if dir_bytes.checked_add(entry_bytes) != Some(body)
            || dir_count > dir_bytes / (4 + DIR_BEFORE_LISTING + DIR_AFTER_LISTING) as u64
            || entry_count > entry_bytes / (ENTRY_HEAD + 1 + FIXED) as u64
            || dir_bytes > u32::MAX as u64
        {
            return None;
        }
        let mut dir_data = vec![0u8; dir_bytes as usize];
        file.read_exact_at(&mut dir_data, ENTRIES_AT + entry_bytes)
            .ok()?;
        let mut hasher = blake3::Hasher::new();
        hasher.update(&dir_data);
        hasher.update(&trailer[..TRAILER]);
        if hasher.finalize().as_bytes() != &trailer[TRAILER..] {
            return None;
        }
        let dirs = parse_dirs(&dir_data, dir_count, entry_count, entry_bytes)?;
        Some(LoadedCache {
            fingerprint,
            reference_ns,
            witness,
            entry_count,
            dir_count: dirs.len(),
            dir_data,
            dirs,
            file,
        })
    }

    /// How many directories' records the cache holds.
    pub fn dir_count(&self) -> usize {
        self.dir_count
    }

    /// Free the directory records once the walk that looked them up is over
    /// (a million-file cache holds ~20 MB of listings, and the walk copied
    /// those it reused): from here on no directory is found; the count stays.
    pub fn forget_listings(&mut self) {
        self.dir_data = Vec::new();
        self.dirs = Vec::new();
    }

    /// How many file entries the trailer announces.
    pub fn len(&self) -> usize {
        self.entry_count as usize
    }

    pub fn is_empty(&self) -> bool {
        self.entry_count == 0
    }

    fn dir_path(&self, dir: &DirIndex) -> &str {
        let at = dir.path_at as usize;
        std::str::from_utf8(&self.dir_data[at..at + dir.path_len as usize]).unwrap_or_default()
    }

    /// The index of the directory recorded at `path`, for
    /// [`LoadedCache::settled_listing`] and [`LoadedCache::dir_files`].
    pub fn find_dir(&self, path: &str) -> Option<usize> {
        self.dirs
            .binary_search_by(|d| self.dir_path(d).as_bytes().cmp(path.as_bytes()))
            .ok()
    }

    /// The recorded listing of directory `index` when it may be reused for a
    /// directory whose fstat (taken before looking here) is `stat`: same
    /// dev, ino, mtime and ctime, and not racily clean (both strictly before
    /// the reference time of the scan that listed it).
    pub fn settled_listing(&self, index: usize, stat: &Stat) -> Option<&[u8]> {
        let dir = self.dirs.get(index)?;
        let recorded = dir.listed?;
        if recorded != DirStat::of(stat)
            || !settled(self.reference_ns, recorded.mtime_ns, recorded.ctime_ns)
        {
            return None;
        }
        let listing = self.listing(dir);
        valid_listing(listing).then_some(listing)
    }

    /// A directory's recorded listing bytes, not yet checked.
    fn listing(&self, dir: &DirIndex) -> &[u8] {
        let at = dir.listing_at as usize;
        &self.dir_data[at..at + dir.listing_len as usize]
    }

    /// The file entries of directory `index`, read from the file and verified
    /// against the checksum its record holds; None when they cannot be read
    /// or do not verify (then none of them is trusted).
    pub fn dir_files(&self, index: usize) -> Option<DirFiles> {
        use std::os::unix::fs::FileExt;
        let block = self.dirs.get(index)?.block;
        let mut bytes = vec![0u8; block.len as usize];
        self.file
            .read_exact_at(&mut bytes, ENTRIES_AT + block.at)
            .ok()?;
        if block_checksum(&bytes) != block.checksum {
            return None;
        }
        let names = parse_block(&bytes, block.count)?;
        Some(DirFiles {
            bytes,
            names,
            reference_ns: self.reference_ns,
        })
    }

    /// The owned form (for merging updates into it); None when any block does
    /// not verify.
    pub fn into_owned(self) -> Option<StatCache> {
        let mut entries = Vec::with_capacity(self.len().min(1 << 20));
        let mut dirs = Vec::new();
        for (index, dir) in self.dirs.iter().enumerate() {
            let path = self.dir_path(dir);
            let files = self.dir_files(index)?;
            for i in 0..files.names.len() {
                let (name, entry) = files.entry(i);
                let name = std::str::from_utf8(name).ok()?;
                let full = if path.is_empty() {
                    name.to_string()
                } else {
                    format!("{path}/{name}")
                };
                entries.push((full, entry));
            }
            if let Some(stat) = dir.listed {
                let listing = self.listing(dir);
                if !valid_listing(listing) {
                    return None;
                }
                let listing = listing.to_vec();
                dirs.push((path.to_string(), DirRecord { stat, listing }));
            }
        }
        entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        Some(StatCache {
            fingerprint: self.fingerprint,
            reference_ns: self.reference_ns,
            entries,
            dirs,
        })
    }
}

/// The directories of a verified directory section. None unless exactly
/// `count` well-formed records with UTF-8, strictly increasing paths,
/// listings inside the section and blocks inside the entry section (`entry_bytes`, holding
/// `entry_count` entries in all) fill `data`.
fn parse_dirs(
    data: &[u8],
    count: u64,
    entry_count: u64,
    entry_bytes: u64,
) -> Option<Vec<DirIndex>> {
    let mut dirs: Vec<DirIndex> = Vec::with_capacity(count as usize);
    let mut at = 0usize;
    let mut entries = 0u64;
    for _ in 0..count {
        let len = le_u32(data.get(at..at + 4)?) as usize;
        let path_at = at + 4;
        let path = data.get(path_at..path_at + len)?;
        std::str::from_utf8(path).ok()?;
        if let Some(previous) = dirs.last() {
            let start = previous.path_at as usize;
            if &data[start..start + previous.path_len as usize] >= path {
                return None;
            }
        }
        let before = data.get(path_at + len..path_at + len + DIR_BEFORE_LISTING)?;
        let listed = match before[0] {
            LISTED => Some(DirStat {
                dev: le_u64(&before[1..]),
                ino: le_u64(&before[9..]),
                mtime_ns: le_i64(&before[17..]),
                ctime_ns: le_i64(&before[25..]),
            }),
            0 => None,
            _ => return None,
        };
        let listing_len = le_u32(&before[33..]) as usize;
        let listing_at = path_at + len + DIR_BEFORE_LISTING;
        // (Its names are checked where it is used, on the walk's threads:
        // see `settled_listing`.)
        data.get(listing_at..listing_at + listing_len)?;
        let after_at = listing_at + listing_len;
        let after = data.get(after_at..after_at + DIR_AFTER_LISTING)?;
        let block = BlockRef {
            at: le_u64(after),
            len: le_u32(&after[8..]),
            count: le_u32(&after[12..]),
            checksum: le_u64(&after[16..]),
        };
        if block.at.checked_add(u64::from(block.len))? > entry_bytes {
            return None;
        }
        entries += u64::from(block.count);
        dirs.push(DirIndex {
            path_at: path_at as u32,
            path_len: len as u32,
            listed,
            listing_at: listing_at as u32,
            listing_len: listing_len as u32,
            block,
        });
        at = after_at + DIR_AFTER_LISTING;
    }
    (at == data.len() && entries == entry_count).then_some(dirs)
}

/// Where each entry of a verified block starts and its name's length; None
/// unless exactly `count` entries with non-empty names in strictly
/// increasing order (holding no `/` or NUL) fill `bytes`.
fn parse_block(bytes: &[u8], count: u32) -> Option<Vec<(u32, u16)>> {
    let mut names = Vec::with_capacity(count as usize);
    let mut at = 0usize;
    let mut previous: &[u8] = &[];
    for _ in 0..count {
        let len = le_u16(bytes.get(at..at + ENTRY_HEAD)?) as usize;
        let name = bytes.get(at + ENTRY_HEAD..at + ENTRY_HEAD + len)?;
        bytes.get(at + ENTRY_HEAD + len..at + ENTRY_HEAD + len + FIXED)?;
        if name.is_empty() || name.contains(&b'/') || name.contains(&0) {
            return None;
        }
        if !names.is_empty() && previous >= name {
            return None;
        }
        previous = name;
        names.push((at as u32, len as u16));
        at += ENTRY_HEAD + len + FIXED;
    }
    (at == bytes.len()).then_some(names)
}

/// Not racily clean under `reference_ns`: both times strictly before it (see
/// the module docs for why ctime counts too).
fn settled(reference_ns: i64, mtime_ns: i64, ctime_ns: i64) -> bool {
    mtime_ns < reference_ns && ctime_ns < reference_ns
}

/// One directory's verified file entries, looked up by name.
pub struct DirFiles {
    bytes: Vec<u8>,
    /// Where each entry starts and its name's length, in name order.
    names: Vec<(u32, u16)>,
    reference_ns: i64,
}

impl DirFiles {
    fn entry(&self, i: usize) -> (&[u8], CacheEntry) {
        let (at, len) = self.names[i];
        let name_at = at as usize + ENTRY_HEAD;
        let end = name_at + len as usize;
        (&self.bytes[name_at..end], parse_fixed(&self.bytes[end..]))
    }

    /// The cached hash of the file `name` if the cache may be trusted for
    /// `stat`: same stat, and not racily clean (mtime and ctime strictly
    /// before the reference time). The caller has checked that the cache was
    /// made with the scan's secret set.
    pub fn reusable(&self, name: &[u8], stat: &Stat) -> Option<[u8; 32]> {
        let i = self
            .names
            .binary_search_by(|&(at, len)| {
                let at = at as usize + ENTRY_HEAD;
                self.bytes[at..at + len as usize].cmp(name)
            })
            .ok()?;
        let (_, entry) = self.entry(i);
        (entry.same_stat(stat) && settled(self.reference_ns, entry.mtime_ns, entry.ctime_ns))
            .then_some(entry.hash)
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

    fn entry(n: u8) -> CacheEntry {
        CacheEntry {
            dev: 1,
            ino: n as u64,
            size: 10,
            mtime_ns: -3,
            ctime_ns: 1 << 40,
            mode: 0o100644,
            hash: [n; 32],
        }
    }

    fn sample() -> StatCache {
        StatCache {
            fingerprint: secrets_fingerprint::<&[u8]>(&[]),
            reference_ns: 1_700_000_000_000_000_000,
            entries: vec![
                ("a".into(), entry(1)),
                ("a/é".into(), entry(2)),
                ("a/éz".into(), entry(3)),
                ("b".into(), entry(4)),
            ],
            dirs: vec![
                ("".into(), dir(1, &[b"a", b"b"])),
                ("a".into(), dir(2, &[b"\xff"])),
            ],
        }
    }

    fn saved(cache: &StatCache) -> (tempfile::TempDir, PathBuf, Vec<u8>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/cache.bin");
        cache.save(&path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        (dir, path, bytes)
    }

    fn load_owned(path: &Path) -> Option<StatCache> {
        LoadedCache::load(path).and_then(LoadedCache::into_owned)
    }

    #[test]
    fn roundtrip_and_corruption() {
        let cache = sample();
        let (_dir, path, bytes) = saved(&cache);
        assert_eq!(load_owned(&path), Some(cache.clone()));
        // Every flipped byte, in the entries, the directories, the trailer or
        // the checksum, makes the file (or, for an entry, its directory's
        // block, which the owned form needs whole) a cache that is not used.
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 1;
            std::fs::write(&path, &bad).unwrap();
            assert_eq!(load_owned(&path), None, "flip at {i}");
        }
        for cut in [0, 1, 8, bytes.len() - 33, bytes.len() - 1] {
            std::fs::write(&path, &bytes[..cut]).unwrap();
            assert_eq!(load_owned(&path), None, "cut at {cut}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        std::fs::write(&path, &longer).unwrap();
        assert_eq!(load_owned(&path), None);
        // The previous versions are not read (their file is rebuilt).
        for old in [b"CKPDSTC4", b"CKPDSTC3"] {
            let mut old_file = bytes.clone();
            old_file[..8].copy_from_slice(old);
            std::fs::write(&path, &old_file).unwrap();
            assert!(LoadedCache::load(&path).is_none());
        }
        // Unsorted names are refused even with valid checksums.
        let mut unsorted = cache.clone();
        unsorted.entries.swap(1, 2);
        unsorted.save(&path).unwrap();
        assert_eq!(load_owned(&path), None);
        let mut unsorted = cache.clone();
        unsorted.dirs.swap(0, 1);
        unsorted.save(&path).unwrap();
        assert!(LoadedCache::load(&path).is_none());
    }

    /// A block that does not verify costs its own directory's entries only:
    /// the other directories' blocks, and every listing, are still used.
    #[test]
    fn a_corrupt_block_is_an_empty_directory() {
        let cache = sample();
        let (_dir, path, mut bytes) = saved(&cache);
        // The first block is the first directory closed: "a", holding "é" and "éz".
        let at = 8 + 2 + "é".len() + 5;
        bytes[at] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let loaded = LoadedCache::load(&path).unwrap();
        let a = loaded.find_dir("a").unwrap();
        assert!(loaded.dir_files(a).is_none());
        let root = loaded.find_dir("").unwrap();
        let files = loaded.dir_files(root).unwrap();
        let (_, e) = &cache.entries[0];
        assert_eq!(files.reusable(b"a", &stat_of(e)), Some(e.hash));
        assert!(loaded.dir_listing("a", &dir_stat(2)).is_some());
    }

    impl LoadedCache {
        /// [`LoadedCache::settled_listing`] of the directory at `path`.
        fn dir_listing(&self, path: &str, stat: &Stat) -> Option<&[u8]> {
            self.settled_listing(self.find_dir(path)?, stat)
        }
    }

    fn stat_of(e: &CacheEntry) -> Stat {
        Stat {
            dev: e.dev,
            ino: e.ino,
            mode: e.mode,
            size: e.size,
            mtime_ns: e.mtime_ns,
            ctime_ns: e.ctime_ns,
        }
    }

    fn dir_stat(ino: u64) -> Stat {
        Stat {
            dev: 1,
            ino,
            mtime_ns: 5,
            ctime_ns: 6,
            ..Stat::default()
        }
    }

    /// The witness round-trips; an owned cache (what a restore saves) has none.
    #[test]
    fn manifest_witness_is_kept_and_dropped() {
        let cache = sample();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cache.bin");
        let witness = ManifestWitness {
            key: [7; 32],
            digest: [9; 32],
        };
        let entries = |visit: &mut dyn FnMut(&str, CacheEntry)| cache.visit_entries(visit);
        write_cache(
            &path,
            &cache.fingerprint,
            cache.reference_ns,
            Some(&witness),
            &entries,
            cache.listed(),
        )
        .unwrap();
        assert_eq!(LoadedCache::load(&path).unwrap().witness, Some(witness));
        assert_eq!(load_owned(&path), Some(cache.clone()));
        record_written(&path, cache.fingerprint, cache.reference_ns, Vec::new()).unwrap();
        assert_eq!(LoadedCache::load(&path).unwrap().witness, None);
        assert_eq!(load_owned(&path), Some(cache));
    }

    #[test]
    fn save_and_load() {
        let cache = sample();
        let (dir, path, _) = saved(&cache);
        assert_eq!(load_owned(&path), Some(cache));
        assert_eq!(
            std::fs::read_dir(path.parent().unwrap()).unwrap().count(),
            1
        );
        assert!(LoadedCache::load(&dir.path().join("missing")).is_none());
        let empty = StatCache::default();
        empty.save(&path).unwrap();
        assert_eq!(load_owned(&path), Some(empty));
    }

    /// Entries of many directories, deep and wide, interleaved in path order
    /// with their subdirectories' (the writer's open blocks), including
    /// directories with files and no listing: each is found by its directory
    /// and name, and the owned form gives them back in path order.
    #[test]
    fn entries_are_found_per_directory() {
        let mut entries: Vec<(String, CacheEntry)> = Vec::new();
        for i in 0..40_000u32 {
            let d = i / 1000;
            entries.push((format!("dir{d:03}/file-{i:08}"), entry(i as u8)));
            entries.push((format!("dir{d:03}/sub/file-{i:08}"), entry(i as u8)));
            entries.push((format!("dir{d:03}/sub.x/file-{i:08}"), entry(i as u8)));
        }
        entries.push(("top".into(), entry(1)));
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let cache = StatCache {
            entries,
            ..sample()
        };
        let (_dir, path, _) = saved(&cache);
        assert_eq!(load_owned(&path), Some(cache.clone()));
        let loaded = LoadedCache::load(&path).unwrap();
        assert_eq!(loaded.len(), cache.entries.len());
        for (path, e) in cache.entries.iter().step_by(7) {
            let (dir, name) = split_path(path);
            let files = loaded.dir_files(loaded.find_dir(dir).unwrap()).unwrap();
            assert_eq!(files.reusable(name.as_bytes(), &stat_of(e)), Some(e.hash));
            // Between this entry and the next: not in the cache.
            assert_eq!(
                files.reusable(format!("{name}-").as_bytes(), &stat_of(e)),
                None
            );
        }
        // A directory without files or listing has no record.
        assert!(loaded.find_dir("dir000/none").is_none());
    }

    #[test]
    fn reuse_rules() {
        let owned = sample();
        let (_dir, path, _) = saved(&owned);
        let (_, e) = &owned.entries[1];
        let stat = stat_of(e);
        let loaded = LoadedCache::load(&path).unwrap();
        let files = loaded.dir_files(loaded.find_dir("a").unwrap()).unwrap();
        assert_eq!(files.reusable("é".as_bytes(), &stat), Some(e.hash));
        assert_eq!(files.reusable(b"a", &stat), None);
        let changed = Stat {
            ctime_ns: 5,
            ..stat
        };
        assert_eq!(files.reusable("éz".as_bytes(), &changed), None);
        assert_eq!(files.reusable(b"zz", &stat), None);
        let racy = StatCache {
            reference_ns: e.mtime_ns,
            ..owned.clone()
        };
        racy.save(&path).unwrap();
        let racy = LoadedCache::load(&path).unwrap();
        let files = racy.dir_files(racy.find_dir("a").unwrap()).unwrap();
        assert_eq!(files.reusable("é".as_bytes(), &stat), None);
        let root = dir_stat(1);
        // The directories' own racy rule: under the racy reference, none is reused.
        assert!(racy.dir_listing("", &root).is_none());
        owned.save(&path).unwrap();
        let settled = LoadedCache::load(&path).unwrap();
        assert!(settled.dir_listing("", &root).is_some());
        assert!(settled.dir_listing("", &Stat { ino: 9, ..root }).is_none());
        assert!(settled.dir_listing("b", &root).is_none());
    }

    #[test]
    fn record_written_merges_and_starts_afresh_on_a_bad_cache() {
        let cache = sample();
        let (_dir, path, bytes) = saved(&cache);
        record_written(
            &path,
            cache.fingerprint,
            cache.reference_ns,
            vec![("a/b".into(), entry(9))],
        )
        .unwrap();
        let merged = load_owned(&path).unwrap();
        let paths: Vec<&str> = merged.entries.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(paths, ["a", "a/b", "a/é", "a/éz", "b"]);
        let mut bad = bytes.clone();
        bad[9] ^= 1; // in the first block

        std::fs::write(&path, &bad).unwrap();
        record_written(
            &path,
            cache.fingerprint,
            cache.reference_ns,
            vec![("a/b".into(), entry(9))],
        )
        .unwrap();
        let fresh = load_owned(&path).unwrap();
        assert_eq!(fresh.entries, vec![("a/b".to_string(), entry(9))]);
        assert!(fresh.dirs.is_empty());
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
