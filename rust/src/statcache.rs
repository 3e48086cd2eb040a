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
//! File format: see [`write_cache`] (`"CKPDSTC4"`, replaced atomically by
//! rename; a `CKPDSTC3` file is read as one without a witness). The header and the directories come first, checksummed together,
//! and are read whole; the file entries follow, paths prefix-compressed
//! against the previous entry and fixed-width records after them, with their
//! own checksum at the end, and are read once in path order in blocks. A file
//! of an older version (`CKPDSTC1`, `CKPDSTC2`) is not read: the next scan
//! hashes everything once and writes the new format. A missing, truncated or
//! corrupt file is an empty cache (so no fsync: a torn write after a crash
//! only costs one re-hash); entries used before their checksum is checked are
//! taken back when it does not match. Secrets are never stored.
//!
//! [`LoadedCache`] is a cache opened for a scan: its directories in memory
//! (a few bytes per directory) and its entries left in the file, streamed by
//! [`CacheEntries`], so a million-entry cache costs a scan one read block, not
//! its size. [`StatCache`] is the owned form a restore merges its writes into.

use std::fs;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use crate::fs::Stat;

const MAGIC: &[u8; 8] = b"CKPDSTC4";
/// The previous version: the same layout without the manifest witness, still
/// read (its listings and hashes are as good; only the witness is missing).
const MAGIC_V3: &[u8; 8] = b"CKPDSTC3";

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
/// [`write_cache`] and reads the old cache through [`CacheEntries`].)
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
    fn listed(&self) -> impl Iterator<Item = (&str, DirStat, &[u8])> + Clone {
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
    D: Iterator<Item = (&'b str, DirStat, &'b [u8])> + Clone,
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

/// Bytes of the fixed part of an entry after its path.
const FIXED: usize = 8 * 5 + 4 + 32;
/// Bytes before an entry's path suffix: shared prefix length, suffix length (u16 each).
const ENTRY_HEAD: usize = 4;
/// Bytes of the fixed part of a directory after its path (stat, listing length).
const DIR_FIXED: usize = 8 * 4 + 4;
/// magic, fingerprint, reference, entry count, directory count, directory
/// bytes, then the manifest witness (key, digest; all zero for none).
const HEADER: usize = HEADER_V3 + 32 + 32;
/// The header of a `CKPDSTC3` file, which has no witness.
const HEADER_V3: usize = 8 + 32 + 8 + 8 + 8 + 8;
/// The entries are written and read in blocks of this size (each hashed whole).
const BLOCK: usize = 1 << 20;
/// A path longer than this is not cached (its file is hashed every time);
/// the walk cannot open one anyway (PATH_MAX is 4096).
const MAX_PATH: usize = u16::MAX as usize;

/// Writes a section in blocks through a BLAKE3 of everything written.
struct SectionWriter<'f> {
    file: &'f mut fs::File,
    block: Vec<u8>,
    hasher: blake3::Hasher,
}

impl<'f> SectionWriter<'f> {
    fn new(file: &'f mut fs::File) -> Self {
        SectionWriter {
            file,
            block: Vec::with_capacity(BLOCK + 4096),
            hasher: blake3::Hasher::new(),
        }
    }

    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.block.extend_from_slice(bytes);
        if self.block.len() >= BLOCK {
            self.flush_block()?;
        }
        Ok(())
    }

    fn flush_block(&mut self) -> io::Result<()> {
        self.hasher.update(&self.block);
        self.file.write_all(&self.block)?;
        self.block.clear();
        Ok(())
    }

    /// Write what is left, then the section's checksum (not itself hashed).
    fn end_section(&mut self) -> io::Result<()> {
        self.flush_block()?;
        let checksum = self.hasher.finalize();
        self.hasher.reset();
        self.file.write_all(checksum.as_bytes())
    }
}

/// Calls its argument with each cache entry, in path order.
pub type EntryVisitor<'a> = dyn Fn(&mut dyn FnMut(&str, CacheEntry)) + 'a;

/// Save a cache of `entries` and `dirs` (each sorted by path bytes, unique)
/// at `path`, atomically, streamed from the caller's data: no copy of the
/// cache is built in memory. `entries` calls its argument with each entry in
/// order, and is called twice (to count, then to write), so the caller can
/// make each path in a buffer of its own.
///
/// Layout (little-endian, `"CKPDSTC4"`): a header (magic, fingerprint[32],
/// reference_ns i64, entry count u64, directory count u64, directory bytes
/// u64, witness key[32], witness digest[32], both zero for no witness; a
/// `"CKPDSTC3"` header ends before the witness), the directories (per directory `path_len u32, path, dev u64, ino
/// u64, mtime_ns i64, ctime_ns i64, listing_len u32, listing`), BLAKE3 of the
/// header and directories; then the entries (per entry `shared u16,
/// suffix_len u16, suffix, dev, ino, size u64, mtime_ns, ctime_ns i64, mode
/// u32, hash[32]`, the path being the previous entry's first `shared` bytes
/// followed by `suffix`), BLAKE3 of the entries.
pub fn write_cache<'b, D>(
    path: &Path,
    fingerprint: &[u8; 32],
    reference_ns: i64,
    witness: Option<&ManifestWitness>,
    entries: &EntryVisitor<'_>,
    dirs: D,
) -> io::Result<()>
where
    D: Iterator<Item = (&'b str, DirStat, &'b [u8])> + Clone,
{
    let mut entry_count = 0u64;
    entries(&mut |p, _| entry_count += u64::from(p.len() <= MAX_PATH));
    let (dir_count, dir_bytes) = dirs.clone().fold((0u64, 0u64), |(n, b), (p, _, l)| {
        (n + 1, b + (4 + p.len() + DIR_FIXED + l.len()) as u64)
    });
    write_streamed(path, |file| {
        let mut out = SectionWriter::new(file);
        out.put(MAGIC)?;
        out.put(fingerprint)?;
        out.put(&reference_ns.to_le_bytes())?;
        out.put(&entry_count.to_le_bytes())?;
        out.put(&dir_count.to_le_bytes())?;
        out.put(&dir_bytes.to_le_bytes())?;
        let none = ManifestWitness {
            key: [0; 32],
            digest: [0; 32],
        };
        let witness = witness.unwrap_or(&none);
        out.put(&witness.key)?;
        out.put(&witness.digest)?;
        for (path, stat, listing) in dirs {
            out.put(&(path.len() as u32).to_le_bytes())?;
            out.put(path.as_bytes())?;
            out.put(&stat.dev.to_le_bytes())?;
            out.put(&stat.ino.to_le_bytes())?;
            out.put(&stat.mtime_ns.to_le_bytes())?;
            out.put(&stat.ctime_ns.to_le_bytes())?;
            out.put(&(listing.len() as u32).to_le_bytes())?;
            out.put(listing)?;
        }
        out.end_section()?;
        let mut previous: Vec<u8> = Vec::new();
        let mut record = [0u8; FIXED];
        let mut failed: Option<io::Error> = None;
        entries(&mut |path, e| {
            let path = path.as_bytes();
            if failed.is_some() || path.len() > MAX_PATH {
                return;
            }
            let shared = previous
                .iter()
                .zip(path)
                .take_while(|(a, b)| a == b)
                .count();
            let suffix = &path[shared..];
            record[0..8].copy_from_slice(&e.dev.to_le_bytes());
            record[8..16].copy_from_slice(&e.ino.to_le_bytes());
            record[16..24].copy_from_slice(&e.size.to_le_bytes());
            record[24..32].copy_from_slice(&e.mtime_ns.to_le_bytes());
            record[32..40].copy_from_slice(&e.ctime_ns.to_le_bytes());
            record[40..44].copy_from_slice(&e.mode.to_le_bytes());
            record[44..76].copy_from_slice(&e.hash);
            let written = out
                .put(&(shared as u16).to_le_bytes())
                .and_then(|()| out.put(&(suffix.len() as u16).to_le_bytes()))
                .and_then(|()| out.put(suffix))
                .and_then(|()| out.put(&record));
            failed = written.err();
            previous.truncate(shared);
            previous.extend_from_slice(suffix);
        });
        if let Some(error) = failed {
            return Err(error);
        }
        out.end_section()
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

/// A cache as opened from disk: the header and the directories, read and
/// verified whole (a few bytes per directory), and the entries left in the
/// file, read once in path order through [`CacheEntries`] by whoever takes
/// them. So a million-entry cache costs a scan one read block of memory, not
/// its file size, and its paths are never turned into objects.
#[derive(Debug)]
pub struct LoadedCache {
    pub fingerprint: [u8; 32],
    pub reference_ns: i64,
    /// None: the cache was written by a restore, or by an older version.
    pub witness: Option<ManifestWitness>,
    entry_count: u64,
    /// How many directories the cache holds (kept by [`LoadedCache::forget_listings`]).
    dir_count: usize,
    /// The directory section as read (validated).
    dir_data: Vec<u8>,
    /// Offset of each directory's path bytes in `dir_data`, and the path length.
    dirs: Vec<(u32, u32)>,
    /// The open file, positioned at the entries, and how many bytes they span.
    entries: Option<(fs::File, u64)>,
}

impl LoadedCache {
    /// Open the cache at `path`; None when missing, of another version, or
    /// when its header or directories do not verify (the entries are verified
    /// by [`CacheEntries::verify`] as they are read).
    pub fn load(path: &Path) -> Option<LoadedCache> {
        let mut file = fs::File::open(path).ok()?;
        let len = file.metadata().ok()?.len();
        let mut magic = [0u8; 8];
        file.read_exact(&mut magic).ok()?;
        let header_len = match &magic {
            MAGIC => HEADER,
            MAGIC_V3 => HEADER_V3,
            _ => return None,
        };
        if len < (header_len + 64) as u64 {
            return None;
        }
        let mut header = vec![0u8; header_len];
        header[..8].copy_from_slice(&magic);
        file.read_exact(&mut header[8..]).ok()?;
        let fingerprint: [u8; 32] = header[8..40].try_into().ok()?;
        let reference_ns = le_i64(&header[40..]);
        let entry_count = le_u64(&header[48..]);
        let dir_count = le_u64(&header[56..]);
        let dir_bytes = le_u64(&header[64..]);
        let witness = (header_len == HEADER)
            .then(|| ManifestWitness {
                key: header[HEADER_V3..HEADER_V3 + 32]
                    .try_into()
                    .expect("32 bytes"),
                digest: header[HEADER_V3 + 32..HEADER].try_into().expect("32 bytes"),
            })
            .filter(|w| w.key != [0; 32]);
        let rest = len - (header_len + 64) as u64;
        // Refuse sizes the file cannot hold before allocating for them.
        if dir_bytes > rest
            || dir_count > dir_bytes / (4 + DIR_FIXED) as u64
            || entry_count > (rest - dir_bytes) / (ENTRY_HEAD + FIXED) as u64
        {
            return None;
        }
        let mut dir_data = vec![0u8; dir_bytes as usize + 32];
        file.read_exact(&mut dir_data).ok()?;
        let checksum = dir_data.split_off(dir_bytes as usize);
        let mut hasher = blake3::Hasher::new();
        hasher.update(&header);
        hasher.update(&dir_data);
        if hasher.finalize().as_bytes() != checksum.as_slice() {
            return None;
        }
        let dirs = parse_dirs(&dir_data, dir_count)?;
        Some(LoadedCache {
            fingerprint,
            reference_ns,
            witness,
            entry_count,
            dir_count: dirs.len(),
            dir_data,
            dirs,
            entries: Some((file, rest - dir_bytes)),
        })
    }

    /// How many directories' listings the cache holds.
    pub fn dir_count(&self) -> usize {
        self.dir_count
    }

    /// Free the directory listings once the walk that looked them up is over
    /// (a million-file cache holds ~20 MB of them, and the walk copied what
    /// it reused): from here on no listing is found; the count stays.
    pub fn forget_listings(&mut self) {
        self.dir_data = Vec::new();
        self.dirs = Vec::new();
    }

    /// How many file entries the header announces.
    pub fn len(&self) -> usize {
        self.entry_count as usize
    }

    pub fn is_empty(&self) -> bool {
        self.entry_count == 0
    }

    /// Directory `index`: its path, recorded stat and listing bytes.
    fn dir(&self, index: usize) -> (&str, DirStat, &[u8]) {
        let (start, len) = self.dirs[index];
        let (start, end) = (start as usize, (start + len) as usize);
        let path = std::str::from_utf8(&self.dir_data[start..end]).unwrap_or_default();
        let fixed = &self.dir_data[end..end + DIR_FIXED];
        let stat = DirStat {
            dev: le_u64(&fixed[0..]),
            ino: le_u64(&fixed[8..]),
            mtime_ns: le_i64(&fixed[16..]),
            ctime_ns: le_i64(&fixed[24..]),
        };
        let listing_len = le_u32(&fixed[32..]) as usize;
        let at = end + DIR_FIXED;
        (path, stat, &self.dir_data[at..at + listing_len])
    }

    /// The recorded listing of the directory at `path` when it may be reused
    /// for a directory whose fstat (taken before looking here) is `stat`:
    /// same dev, ino, mtime and ctime, and not racily clean (both strictly
    /// before the reference time of the scan that listed it).
    pub fn dir_listing(&self, path: &str, stat: &Stat) -> Option<&[u8]> {
        let index = self
            .dirs
            .binary_search_by(|&(start, len)| {
                self.dir_data[start as usize..(start + len) as usize].cmp(path.as_bytes())
            })
            .ok()?;
        let (_, recorded, listing) = self.dir(index);
        (recorded == DirStat::of(stat)
            && settled(self.reference_ns, recorded.mtime_ns, recorded.ctime_ns))
        .then_some(listing)
    }

    /// The file entries, to be read once in path order (None once taken).
    pub fn take_entries(&mut self) -> Option<CacheEntries> {
        let (file, bytes) = self.entries.take()?;
        Some(CacheEntries {
            file,
            unread: bytes,
            buf: Vec::new(),
            pos: 0,
            hasher: blake3::Hasher::new(),
            left: self.entry_count,
            path: Vec::new(),
            current: None,
            started: false,
            bad: false,
            fingerprint: self.fingerprint,
            reference_ns: self.reference_ns,
        })
    }

    /// The owned form (for merging updates into it); None when the entries
    /// do not verify.
    pub fn into_owned(mut self) -> Option<StatCache> {
        let mut stream = self.take_entries()?;
        let mut entries = Vec::with_capacity(self.len().min(1 << 20));
        while stream.advance() {
            let path = String::from_utf8(stream.path.clone()).ok()?;
            entries.push((path, stream.current.take().expect("just read")));
        }
        if !stream.verify() {
            return None;
        }
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
        Some(StatCache {
            fingerprint: self.fingerprint,
            reference_ns: self.reference_ns,
            entries,
            dirs,
        })
    }
}

/// The directories of a verified directory section: where each path starts
/// and its length. None unless exactly `count` well-formed directories with
/// UTF-8, strictly increasing paths and valid listings fill `data`.
fn parse_dirs(data: &[u8], count: u64) -> Option<Vec<(u32, u32)>> {
    let mut dirs = Vec::with_capacity(count as usize);
    let mut at = 0usize;
    let mut previous: &[u8] = &[];
    for index in 0..count {
        let len = le_u32(data.get(at..at + 4)?) as usize;
        let start = at + 4;
        let path = data.get(start..start + len)?;
        std::str::from_utf8(path).ok()?;
        if index > 0 && previous >= path {
            return None;
        }
        previous = path;
        let fixed = data.get(start + len..start + len + DIR_FIXED)?;
        let listing_len = le_u32(&fixed[32..]) as usize;
        let listing_at = start + len + DIR_FIXED;
        if !valid_listing(data.get(listing_at..listing_at + listing_len)?) {
            return None;
        }
        dirs.push((start as u32, len as u32));
        at = listing_at + listing_len;
    }
    (at == data.len()).then_some(dirs)
}

/// Not racily clean under `reference_ns`: both times strictly before it (see
/// the module docs for why ctime counts too).
fn settled(reference_ns: i64, mtime_ns: i64, ctime_ns: i64) -> bool {
    mtime_ns < reference_ns && ctime_ns < reference_ns
}

/// A cache's file entries, read from its file in blocks, in path order, each
/// block hashed as it is read. An entry is looked up by [`CacheEntries::find`]
/// (a merge with the caller's sorted paths, not a search), and nothing read is
/// to be relied on until [`CacheEntries::verify`] says the whole section was
/// well-formed and its checksum matches: a scan takes reused hashes back when
/// it does not.
pub struct CacheEntries {
    file: fs::File,
    /// Bytes of the entry section not yet read into `buf`.
    unread: u64,
    buf: Vec<u8>,
    /// Start of the unparsed bytes of `buf`.
    pos: usize,
    hasher: blake3::Hasher,
    /// Entries not yet parsed.
    left: u64,
    /// The path of the last entry parsed.
    path: Vec<u8>,
    /// That entry, until it is passed or taken.
    current: Option<CacheEntry>,
    /// An entry was parsed (the next one has a previous path).
    started: bool,
    bad: bool,
    fingerprint: [u8; 32],
    reference_ns: i64,
}

impl CacheEntries {
    /// Make at least `n` unparsed bytes available; false at the end of the section.
    fn fill(&mut self, n: usize) -> bool {
        while self.buf.len() - self.pos < n {
            if self.unread == 0 {
                return false;
            }
            self.buf.drain(..self.pos);
            self.pos = 0;
            let old = self.buf.len();
            let want = (self.unread as usize).min(BLOCK);
            self.buf.resize(old + want, 0);
            if self.file.read_exact(&mut self.buf[old..]).is_err() {
                return false;
            }
            self.hasher.update(&self.buf[old..]);
            self.unread -= want as u64;
        }
        true
    }

    /// Parse the next entry into `path`/`current`; false at the end or on a
    /// malformed entry (then `bad`).
    fn advance(&mut self) -> bool {
        self.current = None;
        if self.bad || self.left == 0 {
            return false;
        }
        if !self.fill(ENTRY_HEAD) {
            self.bad = true;
            return false;
        }
        let head = &self.buf[self.pos..self.pos + ENTRY_HEAD];
        let shared = le_u16(head) as usize;
        let suffix_len = le_u16(&head[2..]) as usize;
        let first = !self.started;
        if shared > self.path.len() || !self.fill(ENTRY_HEAD + suffix_len + FIXED) {
            self.bad = true;
            return false;
        }
        let at = self.pos + ENTRY_HEAD;
        let suffix = &self.buf[at..at + suffix_len];
        // Strictly increasing, non-empty paths: the merge relies on the order.
        if (first && suffix.is_empty()) || (!first && suffix <= &self.path[shared..]) {
            self.bad = true;
            return false;
        }
        self.path.truncate(shared);
        self.path.extend_from_slice(suffix);
        self.current = Some(parse_fixed(&self.buf[at + suffix_len..]));
        self.pos = at + suffix_len + FIXED;
        self.left -= 1;
        self.started = true;
        true
    }

    /// The cached hash of `path` if the cache may be trusted for `stat` under
    /// the secret set `fingerprint`: same stat, and not racily clean (mtime
    /// and ctime strictly before the reference time). Paths must be asked in
    /// ascending byte order.
    pub fn reusable(
        &mut self,
        path: &[u8],
        stat: &Stat,
        fingerprint: &[u8; 32],
    ) -> Option<[u8; 32]> {
        if &self.fingerprint != fingerprint {
            return None;
        }
        let entry = self.find(path)?;
        (entry.same_stat(stat) && settled(self.reference_ns, entry.mtime_ns, entry.ctime_ns))
            .then_some(entry.hash)
    }

    /// The entry at `path`, if the cache holds one (ascending order of asking).
    fn find(&mut self, path: &[u8]) -> Option<CacheEntry> {
        loop {
            if self.current.is_none() && !self.advance() {
                return None;
            }
            match self.path.as_slice().cmp(path) {
                std::cmp::Ordering::Less => self.current = None,
                std::cmp::Ordering::Equal => return self.current.take(),
                std::cmp::Ordering::Greater => return None,
            }
        }
    }

    /// Read the rest; true when every entry was well-formed, the section ends
    /// where the header said, and its checksum matches.
    pub fn verify(mut self) -> bool {
        while self.advance() {}
        if self.bad || self.pos != self.buf.len() || self.unread != 0 {
            return false;
        }
        let mut checksum = [0u8; 32];
        if self.file.read_exact(&mut checksum).is_err() {
            return false;
        }
        let mut rest = [0u8; 1];
        // Nothing may follow the checksum.
        matches!(self.file.read(&mut rest), Ok(0)) && self.hasher.finalize().as_bytes() == &checksum
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
        // Every flipped byte, in the header, the directories, the entries or
        // either checksum, makes the file a cache that is not used.
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 1;
            std::fs::write(&path, &bad).unwrap();
            assert_eq!(load_owned(&path), None, "flip at {i}");
        }
        for cut in [0, 1, HEADER, bytes.len() - 33, bytes.len() - 1] {
            std::fs::write(&path, &bytes[..cut]).unwrap();
            assert_eq!(load_owned(&path), None, "cut at {cut}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        std::fs::write(&path, &longer).unwrap();
        assert_eq!(load_owned(&path), None);
        // The previous versions are not read (their file is rebuilt).
        let mut old = bytes.clone();
        old[..8].copy_from_slice(b"CKPDSTC2");
        std::fs::write(&path, &old).unwrap();
        assert!(LoadedCache::load(&path).is_none());
        // Unsorted paths are refused even with valid checksums.
        let mut unsorted = cache.clone();
        unsorted.entries.swap(0, 3);
        unsorted.save(&path).unwrap();
        assert_eq!(load_owned(&path), None);
        let mut unsorted = cache.clone();
        unsorted.dirs.swap(0, 1);
        unsorted.save(&path).unwrap();
        assert!(LoadedCache::load(&path).is_none());
    }

    /// The witness round-trips; an owned cache (what a restore saves) has
    /// none; a `CKPDSTC3` file (no witness in its header) is read, listings
    /// and entries alike, as one without a witness.
    #[test]
    fn manifest_witness_is_kept_dropped_and_absent_in_v3() {
        let cache = sample();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cache.bin");
        let witness = ManifestWitness {
            key: [7; 32],
            digest: [9; 32],
        };
        let write = |witness: Option<&ManifestWitness>| {
            let entries = |visit: &mut dyn FnMut(&str, CacheEntry)| {
                for (p, e) in &cache.entries {
                    visit(p, *e);
                }
            };
            let dirs = cache
                .dirs
                .iter()
                .map(|(p, d)| (p.as_str(), d.stat, d.listing.as_slice()));
            write_cache(
                &path,
                &cache.fingerprint,
                cache.reference_ns,
                witness,
                &entries,
                dirs,
            )
            .unwrap();
        };
        write(Some(&witness));
        assert_eq!(LoadedCache::load(&path).unwrap().witness, Some(witness));
        assert_eq!(load_owned(&path), Some(cache.clone()));
        record_written(&path, cache.fingerprint, cache.reference_ns, Vec::new()).unwrap();
        assert_eq!(LoadedCache::load(&path).unwrap().witness, None);
        // The same cache in the previous layout: the header without the
        // witness, its checksum over that header and the directories.
        write(None);
        let v4 = std::fs::read(&path).unwrap();
        let dir_end = v4.len() - 32 * 2 - cache.entries.len() * FIXED - {
            let mut suffixes = 0;
            let mut previous = "";
            for (p, _) in &cache.entries {
                let shared = previous
                    .bytes()
                    .zip(p.bytes())
                    .take_while(|(a, b)| a == b)
                    .count();
                suffixes += ENTRY_HEAD + p.len() - shared;
                previous = p;
            }
            suffixes
        };
        let mut v3 = b"CKPDSTC3".to_vec();
        v3.extend_from_slice(&v4[8..HEADER_V3]);
        v3.extend_from_slice(&v4[HEADER..dir_end]);
        let mut hasher = blake3::Hasher::new();
        hasher.update(&v3);
        v3.extend_from_slice(hasher.finalize().as_bytes());
        v3.extend_from_slice(&v4[dir_end + 32..]);
        std::fs::write(&path, &v3).unwrap();
        let loaded = LoadedCache::load(&path).unwrap();
        assert_eq!(loaded.witness, None);
        assert_eq!(loaded.into_owned(), Some(cache));
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

    #[test]
    fn entries_stream_across_blocks() {
        // Enough entries for several read blocks, sharing long prefixes.
        let entries: Vec<(String, CacheEntry)> = (0..40_000u32)
            .map(|i| {
                (
                    format!("dir{:03}/sub/file-{i:08}", i / 1000),
                    entry(i as u8),
                )
            })
            .collect();
        let cache = StatCache {
            entries,
            ..sample()
        };
        let (_dir, path, _) = saved(&cache);
        assert_eq!(load_owned(&path), Some(cache.clone()));
        let mut loaded = LoadedCache::load(&path).unwrap();
        let mut stream = loaded.take_entries().unwrap();
        assert!(loaded.take_entries().is_none());
        let fp = cache.fingerprint;
        for (path, e) in cache.entries.iter().step_by(7) {
            let stat = Stat {
                dev: e.dev,
                ino: e.ino,
                mode: e.mode,
                size: e.size,
                mtime_ns: e.mtime_ns,
                ctime_ns: e.ctime_ns,
            };
            assert_eq!(stream.reusable(path.as_bytes(), &stat, &fp), Some(e.hash));
            // Between this entry and the next: not in the cache.
            assert_eq!(
                stream.reusable(format!("{path}-").as_bytes(), &stat, &fp),
                None
            );
        }
        assert!(stream.verify());
    }

    #[test]
    fn reuse_rules() {
        let owned = sample();
        let (_dir, path, _) = saved(&owned);
        let fp = owned.fingerprint;
        let (name, e) = &owned.entries[1];
        let stat = Stat {
            dev: e.dev,
            ino: e.ino,
            mode: e.mode,
            size: e.size,
            mtime_ns: e.mtime_ns,
            ctime_ns: e.ctime_ns,
        };
        let mut stream = LoadedCache::load(&path).unwrap().take_entries().unwrap();
        assert_eq!(stream.reusable(b"a", &stat, &fp), None);
        assert_eq!(stream.reusable(name.as_bytes(), &stat, &fp), Some(e.hash));
        let changed = Stat {
            ctime_ns: 5,
            ..stat
        };
        assert_eq!(stream.reusable("a/éz".as_bytes(), &changed, &fp), None);
        assert_eq!(stream.reusable(b"zz", &stat, &fp), None);
        assert!(stream.verify());
        let mut stream = LoadedCache::load(&path).unwrap().take_entries().unwrap();
        assert_eq!(
            stream.reusable(name.as_bytes(), &stat, &secrets_fingerprint(&[b"abcd"])),
            None
        );
        let racy = StatCache {
            reference_ns: e.mtime_ns,
            ..owned.clone()
        };
        racy.save(&path).unwrap();
        let mut racy = LoadedCache::load(&path).unwrap();
        assert_eq!(
            racy.take_entries()
                .unwrap()
                .reusable(name.as_bytes(), &stat, &fp),
            None
        );
        let root = Stat {
            dev: 1,
            ino: 1,
            mtime_ns: 5,
            ctime_ns: 6,
            ..Stat::default()
        };
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
        let last = bad.len() - 40;
        bad[last] ^= 1;
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
