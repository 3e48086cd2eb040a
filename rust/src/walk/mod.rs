//! The parallel walk: list every directory beneath the root on a rayon pool,
//! apply the policy per entry (excluded directories are never opened), lstat
//! what is kept and classify it. Nothing is followed: a directory is opened
//! by the task listing its parent, beneath the parent's fd, one component with
//! `openat2(RESOLVE_NO_SYMLINKS)` (see `fs`), and listed from that fd by its
//! own task (held fds, never a path resolved again; past PREOPENED_DIRS_MAX
//! waiting fds, or when that open fails, its task opens it beneath the root).
//!
//! With a stat cache, a directory whose fstat matches the listing recorded
//! last time (and is not racily clean) is not read again: its recorded raw
//! listing is used (see `statcache`), and every entry the policy keeps is
//! still lstat'ed. Each directory actually listed is recorded for the next
//! scan: the fstat of the fd taken before reading it, and what it held. The
//! task that lists a directory also reads the cache's file entries of that
//! directory and gives each file whose lstat matches its entry the entry's
//! hash, so reusing hashes is spread over the walk's threads and needs the
//! rows in no particular order.
//!
//! Output order is arbitrary; the scan sorts.

mod list;

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::cancel::Cancel;
use crate::classify::Unsupported;
use crate::error::ScanError;
use crate::fs::{DirReader, Stat};
use crate::policy::PolicyMatcher;
use crate::redact::{SecretMatch, SecretSet};
use crate::statcache::{DirStat, LoadedCache};

/// A regular file as the walk found it, and what the scan learns of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileSlot {
    pub stat: Stat,
    /// The content digest, once reused from the cache or hashed.
    pub hash: Option<[u8; 32]>,
    /// Deleted before it could be hashed: not part of the checkpoint.
    pub vanished: bool,
    /// Where secrets were zeroed (empty for almost every file: no allocation).
    pub secrets: SecretSpans,
}

/// A file's secret matches: none for almost every file, in one pointer (a
/// million files' records are 8 MB smaller than with a boxed slice's 16 bytes).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
// The box is the point: a thin pointer, where a Vec or a boxed slice is wider.
#[allow(clippy::box_collection)]
pub struct SecretSpans(Option<Box<Vec<SecretMatch>>>);

impl From<Vec<SecretMatch>> for SecretSpans {
    fn from(found: Vec<SecretMatch>) -> SecretSpans {
        SecretSpans((!found.is_empty()).then(|| Box::new(found)))
    }
}

impl std::ops::Deref for SecretSpans {
    type Target = [SecretMatch];

    fn deref(&self) -> &[SecretMatch] {
        self.0.as_deref().map_or(&[], Vec::as_slice)
    }
}

/// What a kept entry is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    File(FileSlot),
    /// `included`: the include list takes it (or the list is empty); a
    /// directory that is not included is recorded only if it holds a recorded entry.
    Dir {
        mode: u32,
        included: bool,
    },
    Symlink(Box<str>),
}

/// One kept entry of a [`Batch`]: where its name is in the batch's `names`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name_at: u32,
    pub name_len: u16,
    pub kind: Kind,
}

/// What one directory holds: its path ("" is the root) and its kept
/// entries, whose names share one string (no allocation per entry: a
/// million-entry workspace is ~50,000 batches, not a million paths).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Batch {
    pub dir: String,
    pub names: String,
    pub entries: Vec<Entry>,
}

impl Batch {
    pub fn name(&self, entry: &Entry) -> &str {
        let at = entry.name_at as usize;
        &self.names[at..at + entry.name_len as usize]
    }

    fn push(&mut self, name: &str, kind: Kind) {
        self.entries.push(Entry {
            name_at: self.names.len() as u32,
            name_len: name.len() as u16,
            kind,
        });
        self.names.push_str(name);
    }
}

/// Entries a checkpoint cannot hold: path and why.
pub type Refused = Vec<(Vec<u8>, Unsupported)>;

/// The deepest a captured entry lies: this many directories below the root
/// (a file directly in the root is at depth 1). A deeper entry is refused as
/// `too-deep` and a directory at this depth is entered but none below it, so
/// neither a walk nor a restore holds more than this many directories open
/// on one path, and a chain of directories costs memory for this many paths.
pub const MAX_DEPTH: usize = 256;

/// The longest path a captured entry has, in bytes: the longest the kernel
/// takes in one call (`PATH_MAX` less its NUL). A longer one is refused as
/// `path-too-long`, and a directory with such a path is not entered.
pub const MAX_PATH_BYTES: usize = 4095;

/// Why a path `depth` components deep and `len` bytes long cannot be
/// captured (or restored), if it cannot.
pub fn beyond_limits(depth: usize, len: usize) -> Option<Unsupported> {
    if depth > MAX_DEPTH {
        Some(Unsupported::TooDeep)
    } else if len > MAX_PATH_BYTES {
        Some(Unsupported::PathTooLong)
    } else {
        None
    }
}

/// What every directory task needs.
pub struct Walker<'a> {
    pub root_fd: RawFd,
    pub root_path: &'a Path,
    /// The root as given and as resolved, for judging absolute symlink targets.
    pub roots: &'a [&'a [u8]],
    pub policy: &'a PolicyMatcher,
    /// The scan's secrets: an entry whose name (or link target) holds one is
    /// refused with the secret masked in its path, and a directory listing
    /// that holds one is not given to the stat cache (secrets are never stored).
    pub secrets: &'a SecretSet,
    pub cancel: &'a Cancel,
    /// The root's device: a directory on another one, or a mount's root on
    /// this one (`fs::is_mount_point`), is a mount point, reported and never
    /// entered.
    pub root_dev: u64,
    /// Last scan's directory listings and file entries (None: read every
    /// directory, hash every file).
    pub cache: Option<&'a LoadedCache>,
    /// The cache's hashes were made with this scan's secret set: a file
    /// whose stat matches its entry takes the entry's hash (see `statcache`).
    pub reuse_hashes: bool,
    /// Counts published while the walk runs (entries seen).
    pub progress: &'a ScanProgress,
    /// A walk the change journal directs (`crate::journal::scan`): which
    /// names to look at and which directories to enter (None: everything).
    pub direction: Option<&'a dyn Direction>,
}

/// What a change journal tells a walk (`crate::journal::scan`).
pub trait Direction: Sync {
    /// The names of the directory `rel` to look at, encoded as a listing
    /// (`statcache::Listing`), instead of reading it; None: read it.
    fn names(&self, rel: &str) -> Option<Vec<u8>>;
    /// Whether to enter the directory `rel` the walk found.
    fn enters(&self, rel: &str) -> bool;
}

/// Counters a scan publishes while it runs, for progress reports (read by
/// another thread at any time; relaxed: each is a monotone count of its own).
#[derive(Debug, Default)]
pub struct ScanProgress {
    /// Manifest entries found so far (files, links, included directories).
    pub entries_seen: std::sync::atomic::AtomicU64,
    /// Files read and hashed so far (the cache vouched for the others).
    pub files_hashed: std::sync::atomic::AtomicU64,
    /// Bytes read and hashed so far.
    pub bytes_hashed: std::sync::atomic::AtomicU64,
}

impl ScanProgress {
    pub fn add(counter: &std::sync::atomic::AtomicU64, n: u64) {
        counter.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// (entries seen, files hashed, bytes hashed).
    pub fn snapshot(&self) -> (u64, u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (
            self.entries_seen.load(Relaxed),
            self.files_hashed.load(Relaxed),
            self.bytes_hashed.load(Relaxed),
        )
    }
}

/// One directory the walk listed (or reused), for the next scan's cache.
pub struct ListedDir {
    pub path: String,
    pub stat: DirStat,
    pub listing: Vec<u8>,
    /// The listing came from the cache, not from reading the directory.
    pub reused: bool,
}

impl ListedDir {
    /// As the stat cache's writers take a listed directory.
    pub fn as_listed(&self) -> (&str, DirStat, &[u8]) {
        (self.path.as_str(), self.stat, self.listing.as_slice())
    }
}

/// What a walk found.
pub struct WalkOutput {
    /// One batch per directory listed that holds kept entries (unordered).
    pub found: Vec<Batch>,
    /// Entries a checkpoint cannot hold (unordered): path and why.
    pub unsupported: Vec<(Vec<u8>, Unsupported)>,
    /// Every directory entered, unordered.
    pub dirs: Vec<ListedDir>,
    /// Files found, their bytes, and how many took their hash from the cache.
    pub files: u64,
    pub file_bytes: u64,
    pub files_reused: u64,
}

/// What the walk's tasks count as they go.
#[derive(Default)]
struct FileCounts {
    files: AtomicU64,
    bytes: AtomicU64,
    reused: AtomicU64,
}

/// A listed directory's open fd: plain, or inside the reader that listed it.
enum Held {
    Fd(OwnedFd),
    Reader(DirReader),
}

impl Held {
    fn fd(&self) -> RawFd {
        match self {
            Held::Fd(fd) => fd.as_raw_fd(),
            Held::Reader(reader) => reader.fd(),
        }
    }
}

/// Directories opened by their parent's listing task and not yet listed, at
/// most: each holds an fd until its task runs (a directory of 100,000
/// subdirectories must not hold 100,000 fds). Past it a directory is opened
/// by its path from the root when its task runs.
const PREOPENED_DIRS_MAX: usize = 256;

/// A directory its parent's task opened (`Walker::preopen`), with its stat
/// and whether it is a mount's root (as `fs::stat_entry` says).
struct Opened<'s> {
    fd: OwnedFd,
    stat: Stat,
    mount_root: Option<bool>,
    /// Held until the directory is listed and its fd closed.
    slot: PreopenSlot<'s>,
}

/// One of the PREOPENED_DIRS_MAX fds, given back when dropped.
struct PreopenSlot<'s>(&'s std::sync::atomic::AtomicUsize);

impl<'s> PreopenSlot<'s> {
    fn take(held: &'s std::sync::atomic::AtomicUsize) -> Option<PreopenSlot<'s>> {
        if held.fetch_add(1, Ordering::Relaxed) >= PREOPENED_DIRS_MAX {
            held.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        Some(PreopenSlot(held))
    }
}

impl Drop for PreopenSlot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

struct Shared {
    /// Directories opened by their parent and not yet listed.
    preopened: std::sync::atomic::AtomicUsize,
    found: Mutex<Vec<Batch>>,
    unsupported: Mutex<Vec<(Vec<u8>, Unsupported)>>,
    dirs: Mutex<Vec<ListedDir>>,
    counts: FileCounts,
    error: Mutex<Option<ScanError>>,
}

impl Shared {
    /// Keep the first error (later ones are usually consequences of it).
    fn fail(&self, error: ScanError) {
        let mut slot = self.error.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_none() {
            *slot = Some(error);
        }
    }

    fn failed(&self) -> bool {
        self.error.lock().map(|e| e.is_some()).unwrap_or(true)
    }
}

impl Walker<'_> {
    /// Walk everything beneath the root on `pool`. Returns one batch per
    /// directory listed (unordered), so callers can convert them without
    /// first copying everything into one flat vector.
    pub fn walk(&self, pool: &rayon::ThreadPool) -> Result<WalkOutput, ScanError> {
        // The root itself is "included" only when there is no include list.
        self.walk_from(pool, &[(String::new(), !self.policy.has_include())])
    }

    /// [`Walker::walk`] of the directories `starts` (path, whether the
    /// include list takes it) and what they hold.
    pub fn walk_from(
        &self,
        pool: &rayon::ThreadPool,
        starts: &[(String, bool)],
    ) -> Result<WalkOutput, ScanError> {
        let shared = Shared {
            preopened: std::sync::atomic::AtomicUsize::new(0),
            found: Mutex::new(Vec::new()),
            unsupported: Mutex::new(Vec::new()),
            dirs: Mutex::new(Vec::new()),
            counts: FileCounts::default(),
            error: Mutex::new(None),
        };
        pool.scope(|scope| {
            for (start, included) in starts {
                let shared = &shared;
                scope.spawn(move |s| self.visit(s, shared, start.clone(), *included, None));
            }
        });
        // A cancelled walk reports the cancel, whatever else failed meanwhile.
        if self.cancel.is_cancelled() {
            return Err(ScanError::Cancelled);
        }
        if let Some(error) = shared.error.into_inner().unwrap_or_else(|e| e.into_inner()) {
            return Err(error);
        }
        Ok(WalkOutput {
            found: shared.found.into_inner().unwrap_or_else(|e| e.into_inner()),
            unsupported: shared
                .unsupported
                .into_inner()
                .unwrap_or_else(|e| e.into_inner()),
            dirs: shared.dirs.into_inner().unwrap_or_else(|e| e.into_inner()),
            files: shared.counts.files.into_inner(),
            file_bytes: shared.counts.bytes.into_inner(),
            files_reused: shared.counts.reused.into_inner(),
        })
    }
}
