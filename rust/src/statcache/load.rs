//! A cache opened for a scan: directories read and verified whole, each
//! directory's file entries read from the file when it is listed.

use std::fs;
use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::fs::Stat;

use super::format::{
    block_checksum, le_i64, le_u16, le_u32, le_u64, parse_fixed, BlockRef, CHECKSUM,
    DIR_AFTER_LISTING, DIR_BEFORE_LISTING, ENTRIES_AT, ENTRY_HEAD, FIXED, LISTED, MAGIC, TRAILER,
};
use super::listing::valid_listing;
use super::merge::StatCache;
use super::{settled, CacheEntry, DirRecord, DirStat, ManifestWitness};

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

/// Which file a kept cache was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileIdentity {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
}

impl FileIdentity {
    fn of(meta: &fs::Metadata) -> FileIdentity {
        use std::os::unix::fs::MetadataExt;
        FileIdentity {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
        }
    }
}

/// The cache [`LoadedCache::load_shared`] read last.
struct Kept {
    identity: FileIdentity,
    cache: Arc<LoadedCache>,
}

static KEPT: Mutex<Option<Kept>> = Mutex::new(None);

impl LoadedCache {
    /// Open the cache at `path`; None when missing, of another version, or
    /// when its trailer or directories do not verify (each directory's block
    /// is verified when it is read).
    pub fn load(path: &Path) -> Option<LoadedCache> {
        let file = fs::File::open(path).ok()?;
        let len = file.metadata().ok()?.len();
        Self::load_from(file, len)
    }

    /// [`LoadedCache::load`], the cache kept in memory for the next call
    /// while `path` names the same file: same device and inode (the kept
    /// cache holds it open, so its inode number is not reused), size and
    /// modification time (a cache is only ever replaced by renaming a new
    /// file over it, never written in place). Not its name or change time:
    /// each capture loads a hard link of the live cache under a name of its
    /// own. A directed scan never saves the cache, so the captures the change
    /// journal directs load the same file one after another, and at a million
    /// files reading and verifying its directory section (~20 MB) would cost
    /// more than the rest of such a scan. One cache is kept (the daemon serves
    /// one workspace); another file replaces it.
    pub fn load_shared(path: &Path) -> Option<Arc<LoadedCache>> {
        let file = fs::File::open(path).ok()?;
        let meta = file.metadata().ok()?;
        let identity = FileIdentity::of(&meta);
        let mut kept = KEPT.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(kept) = kept.as_ref().filter(|k| k.identity == identity) {
            return Some(Arc::clone(&kept.cache));
        }
        // The old one goes before the new one is read (peak memory).
        *kept = None;
        let cache = Arc::new(Self::load_from(file, meta.len())?);
        *kept = Some(Kept {
            identity,
            cache: Arc::clone(&cache),
        });
        Some(cache)
    }

    /// Let go of the cache [`LoadedCache::load_shared`] keeps: a full scan
    /// reads the file afresh and then replaces it (peak memory).
    pub fn release_shared() {
        *KEPT.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = None;
    }

    fn load_from(file: fs::File, len: u64) -> Option<LoadedCache> {
        use std::os::unix::fs::FileExt;
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
