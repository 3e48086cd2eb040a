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

use std::ffi::CStr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::cancel::Cancel;
use crate::classify::{symlink_stays_inside, Unsupported};
use crate::error::ScanError;
use crate::fs::{self, DirReader, DirentType, Stat};
use crate::policy::PolicyMatcher;
use crate::redact::{SecretMatch, SecretSet};
use crate::statcache::{self, DirStat, Listing, LoadedCache};

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

    fn open_dir(&self, rel: &str) -> std::io::Result<OwnedFd> {
        if rel.is_empty() {
            // A fresh open file description of the root (not a dup: readdir
            // offsets must not be shared with the root fd).
            // SAFETY: valid fd and a static C string.
            let fd = unsafe {
                libc::openat(self.root_fd, c".".as_ptr(), fs::DIR_FLAGS | libc::O_CLOEXEC)
            };
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // SAFETY: fresh fd owned by nobody else.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        fs::open_beneath(self.root_fd, rel.as_bytes(), fs::DIR_FLAGS)
    }

    /// A subdirectory `name` of the directory `dir_fd` being listed, opened
    /// now beneath it (one component, no link followed) for its own task, so
    /// the task need not resolve its whole path from the root again, and
    /// stat'ed through that fd: for a directory (never a link: the open does
    /// not follow one) that is its lstat, which is then taken once, not by the
    /// parent and again by its task. None when too many are held already or
    /// it cannot be opened as a directory (the caller then lstats it, and its
    /// task opens it by path).
    fn preopen<'s>(&self, shared: &'s Shared, dir_fd: RawFd, name: &CStr) -> Option<Opened<'s>> {
        let slot = PreopenSlot::take(&shared.preopened)?;
        let fd = fs::open_beneath(dir_fd, name.to_bytes(), fs::DIR_FLAGS).ok()?;
        let (stat, mount_root) = fs::stat_entry(fd.as_raw_fd(), c"").ok()?;
        Some(Opened {
            fd,
            stat,
            mount_root,
            slot,
        })
    }

    /// List the directory `rel` (`opened`: when its parent opened it).
    fn visit<'s>(
        &'s self,
        scope: &rayon::Scope<'s>,
        shared: &'s Shared,
        rel: String,
        included: bool,
        opened: Option<Opened<'s>>,
    ) {
        if shared.failed() {
            return;
        }
        match self.list(scope, shared, &rel, included, opened) {
            Ok((batch, unsupported)) => {
                // What will be manifest entries (a directory outside the include
                // list may still join them later, so the final count is higher).
                let entries = batch
                    .entries
                    .iter()
                    .filter(|e| {
                        !matches!(
                            e.kind,
                            Kind::Dir {
                                included: false,
                                ..
                            }
                        )
                    })
                    .count();
                ScanProgress::add(&self.progress.entries_seen, entries as u64);
                if !batch.entries.is_empty() {
                    shared
                        .found
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(batch);
                }
                if !unsupported.is_empty() {
                    shared
                        .unsupported
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .extend(unsupported);
                }
            }
            Err(error) => shared.fail(error),
        }
    }

    fn list<'s>(
        &'s self,
        scope: &rayon::Scope<'s>,
        shared: &'s Shared,
        rel: &str,
        parent_included: bool,
        opened: Option<Opened<'s>>,
    ) -> Result<(Batch, Refused), ScanError> {
        let abs = |name: &[u8]| -> std::path::PathBuf {
            use std::os::unix::ffi::OsStrExt;
            let mut p = self.root_path.to_path_buf();
            if !rel.is_empty() {
                p.push(rel);
            }
            if !name.is_empty() {
                p.push(std::ffi::OsStr::from_bytes(name));
            }
            p
        };
        // The stat of the inode about to be listed, taken before the listing:
        // a change after it leaves another stat (or a racy one) for next time.
        // (With whether it is a mount's root, in the same call.) Its parent
        // took it when it opened it; else it is opened by path and taken now.
        // (Its mount point check too: `opened` is never one.)
        let (fd, dir_stat, _held) = match opened {
            Some(opened) => (opened.fd, opened.stat, Some(opened.slot)),
            None => {
                let fd = match self.open_dir(rel) {
                    Ok(fd) => fd,
                    // Removed since its parent was listed: nothing to capture.
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                        return Ok(Default::default())
                    }
                    // Replaced by a symlink or a file since it was listed.
                    Err(e)
                        if !rel.is_empty()
                            && matches!(
                                e.raw_os_error(),
                                Some(libc::ELOOP) | Some(libc::ENOTDIR)
                            ) =>
                    {
                        return Err(ScanError::Changed(abs(b"")))
                    }
                    Err(e) => return Err(ScanError::io(abs(b""), "open directory", e)),
                };
                let (dir_stat, mount_root) = fs::stat_entry(fd.as_raw_fd(), c"")
                    .map_err(|e| ScanError::io(abs(b""), "fstat", e))?;
                if !rel.is_empty() && fs::judge_mount_point(&dir_stat, self.root_dev, || mount_root)
                {
                    // Its parent saw no mount point here: something was mounted or
                    // swapped in since. Never crossed.
                    return Err(ScanError::Changed(abs(b"")));
                }
                (fd, dir_stat, None)
            }
        };
        let recorded = self.cache.and_then(|c| Some((c, c.find_dir(rel)?)));
        let directed = self.direction.and_then(|d| d.names(rel));
        let cached = recorded
            .filter(|_| directed.is_none())
            .and_then(|(c, index)| c.settled_listing(index, &dir_stat));
        // Whichever holds the fd keeps it open while the entries are lstat'ed.
        let (held, listing, reused) = match (directed, cached) {
            (Some(names), _) => (Held::Fd(fd), names, true),
            (None, Some(listing)) => (Held::Fd(fd), listing.to_vec(), true),
            (None, None) => {
                let mut reader =
                    DirReader::new(fd).map_err(|e| ScanError::io(abs(b""), "list directory", e))?;
                let mut listing = Listing::default();
                while let Some((name, d_type)) = reader
                    .next_entry_raw()
                    .map_err(|e| ScanError::io(abs(b""), "list directory", e))?
                {
                    listing.push(name.to_bytes(), d_type);
                }
                (Held::Reader(reader), listing.bytes, false)
            }
        };
        let dir_fd = held.fd();
        let parent_segments: Vec<&str> = rel.split('/').filter(|s| !s.is_empty()).collect();
        // Sized from the listing once (names and entries of a directory are
        // kept for the whole scan: no room left over from growing them).
        let listed = statcache::listing_names(&listing).count();
        let mut batch = Batch {
            dir: rel.to_string(),
            names: String::with_capacity(listing.len().saturating_sub(4 * listed)),
            entries: Vec::with_capacity(listed),
        };
        let mut found: Refused = Vec::new();
        // A name holding a secret, excluded or not: this listing is not cached.
        let mut listing_secret = false;
        for (name, d_type) in statcache::listing_names(&listing) {
            if self.cancel.is_cancelled() {
                return Err(ScanError::Cancelled);
            }
            let dtype = DirentType::from_raw(d_type);
            let name_bytes = name.to_bytes();
            let secret_name = self.secrets.occurs_in(name_bytes);
            listing_secret |= secret_name;
            let lossy;
            let (name_str, utf8) = match std::str::from_utf8(name_bytes) {
                Ok(s) => (s, true),
                Err(_) => {
                    lossy = String::from_utf8_lossy(name_bytes).into_owned();
                    (lossy.as_str(), false)
                }
            };
            // The kind from readdir when it knows, so excluded entries cost no lstat.
            // The lstat, with the kernel's word on whether it is a mount's
            // root (see `lstat`).
            let mut stat: Option<(Stat, Option<bool>)> = None;
            let mut is_dir = match dtype {
                DirentType::Dir => true,
                DirentType::Unknown => match self.lstat(dir_fd, name) {
                    Ok(Some(st)) => {
                        let d = st.0.is_dir();
                        stat = Some(st);
                        d
                    }
                    Ok(None) => continue,
                    Err(e) => return Err(ScanError::io(abs(name_bytes), "lstat", e)),
                },
                _ => false,
            };
            let decision = self.decide(&parent_segments, name_str, is_dir, parent_included);
            if decision.is_none() {
                continue;
            }
            let mut opened = None;
            if stat.is_none() && is_dir {
                opened = self.preopen(shared, dir_fd, name);
                stat = opened.as_ref().map(|o| (o.stat, o.mount_root));
            }
            if stat.is_none() {
                stat = match self.lstat(dir_fd, name) {
                    Ok(st) => st,
                    Err(e) => return Err(ScanError::io(abs(name_bytes), "lstat", e)),
                };
            }
            let Some((stat, mount_root)) = stat else {
                // Vanished between readdir and lstat.
                continue;
            };
            let mut included = decision.unwrap_or(false);
            if stat.is_dir() != is_dir {
                // Replaced between readdir and lstat: judge it as what it is now.
                is_dir = stat.is_dir();
                match self.decide(&parent_segments, name_str, is_dir, parent_included) {
                    Some(inc) => included = inc,
                    None => continue,
                }
            }
            // Non-directories outside a non-empty include list are not captured.
            if !is_dir && !included {
                continue;
            }
            // The entry's full path, built only where it is needed (directories,
            // links, refusals): a file is its batch's directory and its name.
            let path_of = || {
                let mut path = Vec::with_capacity(rel.len() + 1 + name_bytes.len());
                if !rel.is_empty() {
                    path.extend_from_slice(rel.as_bytes());
                    path.push(b'/');
                }
                path.extend_from_slice(name_bytes);
                path
            };
            if secret_name || (self.secrets.spans_names() && self.secrets.occurs_in(&path_of())) {
                // Named by a secret: never entered nor read, and shown masked.
                found.push((self.secrets.masked(&path_of()), Unsupported::SecretInName));
                continue;
            }
            if !utf8 {
                // Its children would have non-UTF-8 paths too: report it, do not enter.
                found.push((path_of(), Unsupported::NonUtf8Name));
                continue;
            }
            if name_bytes.contains(&b'\\') {
                // docs/contract.md#data-model refuses `\` in a path: refused here, before any upload,
                // so every path the scan emits is valid by construction.
                found.push((path_of(), Unsupported::BackslashName));
                continue;
            }
            let len = rel.len() + usize::from(!rel.is_empty()) + name_bytes.len();
            if let Some(kind) = beyond_limits(parent_segments.len() + 1, len) {
                // Never entered: a walk's memory grows with depth times path length.
                found.push((path_of(), kind));
                continue;
            }
            if fs::judge_mount_point(&stat, self.root_dev, || mount_root) {
                // A filesystem, or a bind mount of a file or a directory,
                // mounted inside the workspace: never crossed nor read.
                found.push((path_of(), Unsupported::MountPoint));
                continue;
            }
            if stat.is_file() {
                batch.push(
                    name_str,
                    Kind::File(FileSlot {
                        stat,
                        hash: None,
                        vanished: false,
                        secrets: SecretSpans::default(),
                    }),
                );
                continue;
            }
            let path = String::from_utf8(path_of()).expect("joined UTF-8 parts");
            if stat.is_dir() {
                batch.push(
                    name_str,
                    Kind::Dir {
                        mode: stat.mode & 0o777,
                        included,
                    },
                );
                if self.direction.map_or(true, |d| d.enters(&path)) {
                    scope.spawn(move |s| self.visit(s, shared, path, included, opened));
                }
            } else if stat.is_symlink() {
                let target = match fs::readlink_at(dir_fd, name) {
                    Ok(t) => t,
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
                    // No longer a symlink: swapped since its lstat.
                    Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                        return Err(ScanError::Changed(abs(name_bytes)))
                    }
                    Err(e) => return Err(ScanError::io(abs(name_bytes), "readlink", e)),
                };
                if self.secrets.occurs_in(&target) {
                    found.push((path.into_bytes(), Unsupported::SecretInTarget));
                    continue;
                }
                if !symlink_stays_inside(&path, &target, self.roots) {
                    found.push((path.into_bytes(), Unsupported::SymlinkEscapes));
                    continue;
                }
                match String::from_utf8(target) {
                    Ok(target) => batch.push(name_str, Kind::Symlink(target.into_boxed_str())),
                    // The manifest stores targets as text; a non-UTF-8 one cannot be kept.
                    Err(_) => found.push((path.into_bytes(), Unsupported::NonUtf8Name)),
                }
            } else {
                let kind = Unsupported::from_mode(stat.mode).unwrap_or(Unsupported::Unknown);
                found.push((path.into_bytes(), kind));
            }
        }
        drop(held);
        self.reuse_hashes_into(&mut batch, recorded, &shared.counts);
        if !listing_secret {
            shared
                .dirs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(ListedDir {
                    path: rel.to_string(),
                    stat: DirStat::of(&dir_stat),
                    listing,
                    reused,
                });
        }
        Ok((batch, found))
    }

    /// Give the batch's files the hashes the cache vouches for (its entries of
    /// this directory, read now, on this task's thread), and count them.
    fn reuse_hashes_into(
        &self,
        batch: &mut Batch,
        recorded: Option<(&LoadedCache, usize)>,
        counts: &FileCounts,
    ) {
        let Batch { names, entries, .. } = batch;
        let slots = entries
            .iter_mut()
            .filter_map(|entry| match &mut entry.kind {
                Kind::File(slot) => {
                    let at = entry.name_at as usize;
                    Some((&names[at..at + entry.name_len as usize], slot))
                }
                _ => None,
            });
        let (mut files, mut bytes, mut reused) = (0u64, 0u64, 0u64);
        let mut cached = None;
        for (name, slot) in slots {
            files += 1;
            bytes += slot.stat.size;
            if !self.reuse_hashes {
                continue;
            }
            // Read once, at the directory's first file.
            let cached = cached.get_or_insert_with(|| recorded.and_then(|(c, i)| c.dir_files(i)));
            if let Some(hash) = cached
                .as_ref()
                .and_then(|c| c.reusable(name.as_bytes(), &slot.stat))
            {
                slot.hash = Some(hash);
                reused += 1;
            }
        }
        counts.files.fetch_add(files, Ordering::Relaxed);
        counts.bytes.fetch_add(bytes, Ordering::Relaxed);
        counts.reused.fetch_add(reused, Ordering::Relaxed);
    }

    /// None when the policy excludes the entry, else whether it is included.
    fn decide(
        &self,
        parent: &[&str],
        name: &str,
        is_dir: bool,
        parent_included: bool,
    ) -> Option<bool> {
        if self.policy.excludes_name(parent.len(), name) {
            return None;
        }
        if !self.policy.has_patterns() {
            // The common case: no per-entry path to build.
            return Some(true);
        }
        let mut segments = Vec::with_capacity(parent.len() + 1);
        segments.extend_from_slice(parent);
        segments.push(name);
        if self.policy.excludes_entry(&segments, is_dir) {
            return None;
        }
        Some(
            self.policy
                .included_below(parent_included, &segments, is_dir),
        )
    }

    /// lstat relative to the directory; Ok(None) when the entry vanished.
    /// Taken with `statx`, which says in the same call whether the entry is
    /// a mount's root (see `fs::stat_entry`): a file bind-mounted into the
    /// workspace is one, and is never read.
    fn lstat(&self, dir_fd: RawFd, name: &CStr) -> std::io::Result<Option<(Stat, Option<bool>)>> {
        match fs::stat_entry(dir_fd, name) {
            Ok(st) => Ok(Some(st)),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(e),
        }
    }
}
