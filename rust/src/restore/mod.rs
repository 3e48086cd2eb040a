//! Restore, planned and applied natively (docs/contract.md#restore): diff a target manifest
//! against a live scan, stage every needed blob (verified) on the target's
//! filesystem, then apply fd-relative with `O_NOFOLLOW` and record in the stat
//! cache exactly the inodes the restore wrote.
//!
//! The threat: code in the sandbox owns the workspace and may swap any
//! directory for a symlink between two system calls, plant a hard link to a
//! file outside, or mount something inside. So:
//!
//! - the restore root (a sub-root too) is opened from the workspace fd one
//!   component at a time with `O_NOFOLLOW` ([`Workspace::open`]); every later
//!   operation starts from that fd, one name per call, never a path string;
//! - a mount point (a directory on another device, or a mount's root on this
//!   one: a bind mount, `fs::is_mount_point`) is never entered, neither to
//!   delete nor to write: its paths are reported in [`Applied::skipped`];
//! - in-place metadata changes (mode, mtime) only touch an inode with one link;
//!   a file that shares its inode with another name is replaced from its blob
//!   instead, so a hard link to an outside file never changes that file;
//! - the stat cache learns only a stat the restore took through an fd of the
//!   file and then read the file's bytes back through that fd after: the
//!   sandbox can write into staging (it lies inside the workspace) and into a
//!   file just renamed in, keeping its size and putting its mtime back. A file
//!   of a directory moved in whole keeps the `fstat` taken in staging after
//!   the restore's last write (a directory rename leaves its files' ctimes
//!   alone); a file renamed in by itself is opened again after the rename, and
//!   its `fstat` counts only when it is the inode staged (dev, ino, size,
//!   mtime, mode). Anything written after that `fstat` moves the file's ctime
//!   (the kernel hands out a fine-grained ctime once one was queried: Linux
//!   6.13 and later on ext4, xfs, btrfs and tmpfs), so the next capture hashes
//!   it again; before it, the read-back sees it, and nothing is recorded.
//!
//! Staging is a private directory at the top of the restore root (same
//! filesystem, so every final rename is atomic); blobs are verified (size and
//! BLAKE3) before their bytes are written there, and nothing in the workspace
//! changes before every blob is staged. Data is made durable with one `syncfs`
//! of the workspace's filesystem at the end; while staging and apply run, a
//! [`Writeback`] thread calls `syncfs` every 300 ms so the disk works beside
//! the CPUs and the final sync waits for the last interval only (100,000 small
//! files on a fresh ext4: 0.8 s less per restore, the final sync 1.5 s -> 0.4 s).
//! (A `sync_file_range` hint per staged file made staging 100,000 small files
//! about 1.8 s slower on two cores, more than the whole final sync.)
//!
//! One file per stage: `plan` (what changes), `stage` (blobs verified into
//! staging), `apply` (staging moved in, metadata set, the stat cache told),
//! `patch` (a large file's changed chunks written into the live file),
//! `writeback` (the `syncfs` thread); `dirs` reaches directories by fd for
//! all of them. This file holds the error, the workspace and the [`Restore`]
//! that carries one restore through the stages.

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

use crate::cancel::Cancel;
use crate::chunk::ChunkParams;
use crate::error::ScanError;
use crate::fs::{self, Stat};
use crate::hash;
use crate::hash::{DigestMap, DigestSet};
use crate::manifest::{self, SpannedFile};
use crate::policy::PolicyMatcher;
use crate::redact::SecretSet;
use crate::scan::KeptCache;
use crate::scan::{self, Root, ScanRequest};
use crate::spans;
use crate::statcache::CacheEntry;

mod apply;
mod dirs;
pub(crate) mod patch;
mod plan;
mod stage;
mod writeback;

pub use plan::{
    check_target, leave_alone, name_max, plan, plan_encoded, replace_shared_inodes, Doomed, Plan,
    Target, TargetFile,
};
pub use stage::{RangeStager, StagedWriter};

use dirs::remove_tree;
use writeback::Writeback;

/// Top-level names reserved for staging (never captured, never deleted).
pub const STAGING_PREFIX: &str = ".checkpointd-staging-";

/// The live tree the restore's scan saw, kept when asked (`keep_live`): the
/// manifest's rows, its entry, file and byte counts, and how many files had
/// secrets zeroed (a restore's scan collects no digests). Restore history
/// saves it to the thread's stash without scanning the tree a second time.
pub type LiveTree = (Vec<u8>, u64, u64, u64, u64);

/// A restore ready to stage, or with `plan_only` its plan alone; the live
/// tree when `keep_live`; and the target's files where capture zeroed secrets.
pub type Prepared = (
    Option<Restore>,
    Option<Plan>,
    Option<LiveTree>,
    Vec<SpannedFile>,
);

/// What [`prepare_restore`] plans a restore from.
pub struct Request {
    /// The workspace root (the operator's path) and the sub-root beneath it.
    pub root: PathBuf,
    pub subdir: String,
    /// The target manifest's bytes.
    pub target: Vec<u8>,
    pub policy: PolicyMatcher,
    /// The live scan zeroes the caller's secrets, so a file that still holds
    /// them compares equal to its zeroed blob; a file equal to the checkpoint
    /// but for its secret spans is never rewritten (`crate::spans`).
    pub secrets: Vec<Vec<u8>>,
    pub secret_set: SecretSet,
    pub cache_path: Option<PathBuf>,
    pub cancel: Cancel,
    /// Plan only: no staging directory is made and no leftover is removed.
    pub plan_only: bool,
    pub keep_live: bool,
    pub chunks: Option<ChunkParams>,
}

/// Open the workspace, scan it live, plan the restore to `target` and,
/// unless `plan_only`, make its staging directory ([`Restore::new`]) and
/// prepare the files stored as chunks.
pub fn prepare_restore(request: Request) -> Result<Prepared, RestoreError> {
    let ws = Workspace::open(&request.root, &request.subdir)?;
    // With a stat cache, what the restore writes is read back before the
    // cache learns it (see [`Restore::finish`]).
    let record = request.cache_path.is_some();
    // Files stored as chunks are built from their chunks.
    let target_chunked = manifest::chunked_files(&request.target)
        .map_err(|e| RestoreError::Manifest(e.to_string()))?;
    let spanned = manifest::spanned_files(&request.target)
        .map_err(|e| RestoreError::Manifest(e.to_string()))?;
    let holding = spans::holding(&ws, &spanned)?;
    let target = Target::read(&request.target, name_max(ws.fd.as_raw_fd()))?;
    let scan_request = ScanRequest {
        root: ws.path.clone(),
        policy: request.policy,
        secrets: request.secrets,
        cache_path: request.cache_path.clone(),
        threads: 0,
        cancel: request.cancel,
        feed: None,
        progress: None,
        // A restore saves the cache once, with its writes, at
        // `finish`; a dry run's scan saves it as a capture's does.
        keep_cache: !request.plan_only,
        chunks: request.chunks,
    };
    let mut live = scan::scan_root(&scan_request, Root::from_fd(ws.dup_fd()?, ws.path.clone()))
        .map_err(RestoreError::Scan)?;
    let mut plan = plan_encoded(target, &live.manifest, &live.unsupported)?;
    leave_alone(&mut plan, &holding);
    replace_shared_inodes(&ws, &mut plan)?;
    let kept = live.kept_cache.take();
    let live_chunked = manifest::chunked_files(&live.manifest).unwrap_or_default();
    let live_tree = request.keep_live.then(|| {
        (
            std::mem::take(&mut live.manifest),
            live.entries,
            live.file_count,
            live.file_bytes,
            live.files_with_secrets,
        )
    });
    drop(live);
    if request.plan_only {
        return Ok((None, Some(plan), live_tree, spanned));
    }
    let restore = crate::restore_chunks::prepare(
        Restore::new(ws, plan, kept, record)?,
        target_chunked,
        live_chunked,
        &request.secret_set,
        request.chunks,
    )?;
    Ok((Some(restore), None, live_tree, spanned))
}

#[derive(Debug)]
pub enum RestoreError {
    /// A system call failed on `path` (workspace-relative, or absolute for the root).
    Io {
        path: String,
        op: &'static str,
        source: io::Error,
    },
    /// The blob with this hash is not what the checkpoint records.
    InvalidBlob {
        hash: [u8; 32],
        reason: String,
    },
    /// The sub-root cannot be opened as a real directory beneath the root.
    Subdir {
        subdir: String,
        source: io::Error,
    },
    Manifest(String),
    /// A target path restore refuses before any change (reserved name).
    InvalidPath {
        path: String,
        reason: String,
    },
    /// A name longer than the workspace's filesystem allows.
    NameTooLong {
        path: String,
        limit: usize,
    },
    /// A path changed kind or content under the restore (code in the
    /// sandbox swapped it, or wrote beside it): what the system call on it
    /// found instead (see [`RestoreError::raced`]).
    Changed {
        path: String,
        op: &'static str,
        source: io::Error,
    },
    Scan(ScanError),
    Cancelled,
}

/// What a system call on a workspace path says when the path changed under
/// the restore: gone, or another kind of entry than the one it acted on, or a
/// directory that is no longer empty.
const RACED: &[i32] = &[
    libc::ENOENT,
    libc::ENOTDIR,
    libc::EISDIR,
    libc::ENOTEMPTY,
    libc::EEXIST,
    libc::ELOOP,
];

impl RestoreError {
    fn io(path: impl Into<String>, op: &'static str, source: io::Error) -> RestoreError {
        RestoreError::Io {
            path: path.into(),
            op,
            source,
        }
    }

    /// [`RestoreError::io`] of an operation on a path the plan saw as it
    /// was: [`RestoreError::Changed`] when the error says the path changed
    /// since ([`RACED`]).
    fn raced(path: impl Into<String>, op: &'static str, source: io::Error) -> RestoreError {
        if is_errno(&source, RACED) {
            return RestoreError::Changed {
                path: path.into(),
                op,
                source,
            };
        }
        RestoreError::io(path, op, source)
    }
}

impl std::fmt::Display for RestoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RestoreError::Io { path, op, source } => write!(f, "{op} {path}: {source}"),
            RestoreError::InvalidBlob { hash, reason } => {
                write!(f, "blob {} is invalid: {reason}", hash::to_hex(hash))
            }
            RestoreError::Subdir { subdir, source } => write!(
                f,
                "workspace_subdir {subdir:?} is not a directory beneath the workspace root \
                 (a symlink or a file on the way?): {source}"
            ),
            RestoreError::Manifest(m) => write!(f, "{m}"),
            RestoreError::InvalidPath { path, reason } => {
                write!(f, "invalid path {path}: {reason}")
            }
            RestoreError::NameTooLong { path, limit } => write!(
                f,
                "{path}: a name in it is longer than the {limit} bytes the filesystem allows"
            ),
            RestoreError::Changed { path, op, source } => {
                write!(
                    f,
                    "{op} {path}: {source}: it changed while the restore worked on it"
                )
            }
            RestoreError::Scan(e) => write!(f, "{e}"),
            RestoreError::Cancelled => write!(f, "restore cancelled"),
        }
    }
}

impl std::error::Error for RestoreError {}

fn cname(bytes: &[u8]) -> Result<CString, RestoreError> {
    CString::new(bytes).map_err(|_| RestoreError::Manifest("a path holds a NUL byte".into()))
}

fn split_parent(rel: &[u8]) -> (&[u8], &[u8]) {
    match rel.iter().rposition(|&b| b == b'/') {
        Some(at) => (&rel[..at], &rel[at + 1..]),
        None => (&rel[..0], rel),
    }
}

fn is_errno(e: &io::Error, codes: &[i32]) -> bool {
    e.raw_os_error().is_some_and(|c| codes.contains(&c))
}

/// Whose inode an open file is, for a change made in place.
pub(crate) enum InPlace {
    /// The workspace's alone: a regular file with one link on the
    /// workspace's device, not a mount point.
    Own(Stat),
    /// A file mounted there (a bind mount may bring one in from outside).
    MountPoint,
    /// Not a regular file, on another device, or shared with another name
    /// (a hard link may name a file outside).
    Other,
}

/// [`InPlace`] of the open file `fd` (`ws_dev`: the workspace's device).
pub(crate) fn in_place(fd: RawFd, ws_dev: u64) -> io::Result<InPlace> {
    let (stat, links) = fs::fstat_links(fd)?;
    if !stat.is_file() || links != 1 || stat.dev != ws_dev {
        return Ok(InPlace::Other);
    }
    if fs::is_mount_point_fd(fd, &stat, ws_dev) {
        return Ok(InPlace::MountPoint);
    }
    Ok(InPlace::Own(stat))
}

/// The restore root, held by fd.
pub struct Workspace {
    pub fd: OwnedFd,
    /// For messages and absolute symlink targets: the lexical `root/subdir`.
    pub path: PathBuf,
    pub dev: u64,
}

impl Workspace {
    /// Open `root` (the operator's path; it may itself be a symlink) and then
    /// `subdir` beneath it one component at a time without following links;
    /// a missing last component is created (its parent must exist).
    pub fn open(root: &Path, subdir: &str) -> Result<Workspace, RestoreError> {
        let shown = root.to_string_lossy().into_owned();
        let c = cname(root.as_os_str().as_bytes())?;
        // SAFETY: valid C string; the fd is owned below.
        let raw = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if raw < 0 {
            return Err(RestoreError::io(shown, "open", io::Error::last_os_error()));
        }
        // SAFETY: fresh fd owned by nobody else.
        let root_fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) };
        let subdir = subdir.trim_matches('/');
        let (fd, path) = if subdir.is_empty() {
            (root_fd, root.to_path_buf())
        } else {
            let fd = fs::open_subdir(root_fd.as_raw_fd(), subdir.as_bytes(), true).map_err(
                |source| RestoreError::Subdir {
                    subdir: subdir.to_string(),
                    source,
                },
            )?;
            (fd, root.join(subdir))
        };
        let stat = fs::fstat(fd.as_raw_fd())
            .map_err(|e| RestoreError::io(path.to_string_lossy(), "fstat", e))?;
        Ok(Workspace {
            fd,
            path,
            dev: stat.dev,
        })
    }

    fn shown(&self, rel: &[u8]) -> String {
        self.path
            .join(std::ffi::OsStr::from_bytes(rel))
            .to_string_lossy()
            .into_owned()
    }

    /// A second fd of the root (the scan takes ownership of one).
    pub fn dup_fd(&self) -> Result<OwnedFd, RestoreError> {
        self.fd
            .try_clone()
            .map_err(|e| RestoreError::io(self.path.to_string_lossy(), "dup", e))
    }
}

/// The stat a restore took of what it wrote in staging, after its last write.
#[derive(Clone, Copy)]
struct Written {
    stat: Stat,
    /// The bytes read back through the fd after `stat` were the blob's: the
    /// stat may be recorded as it is (a file moved in with its directory).
    verified: bool,
}

/// Where a write's file is prepared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dest {
    /// At its own path inside staging's tree: it lies beneath a directory
    /// the workspace lacks, which moves in whole with one rename.
    Tree,
    /// As `w-<index>` in staging, renamed into place by itself.
    Flat,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Step {
    /// Staging's directories that no staged file made (empty ones), before
    /// the first change to the workspace.
    TreeDirs,
    Deletions,
    Dirs,
    Trees,
    Writes,
    Links,
    FileMetadata,
    DirModes,
    Done,
}

/// One restore: its plan, its staging directory, and what it wrote.
pub struct Restore {
    pub ws: Workspace,
    pub plan: Plan,
    staging_name: CString,
    staging: OwnedFd,
    /// `staging/t`: the new directories of the plan, made and filled by
    /// staging, the empty ones at the start of apply.
    tree: OwnedFd,
    /// `staging/f0`..: the flat files, write `i` in `flat[i % len]`, so the
    /// threads that create them seldom wait for one directory's lock.
    flat: Vec<OwnedFd>,
    dests: Vec<Dest>,
    /// The directories the workspace lacks whose parent it has (or that are
    /// top-level): each moves in from staging's tree with one rename.
    new_roots: Vec<String>,
    /// Every planned directory at or beneath a new root (made in staging).
    tree_dirs: std::collections::HashSet<String>,
    /// Each needed blob: its size and its first write (every use gets its
    /// own prepared file); `next_use` chains a blob's other writes.
    blobs: DigestMap<BlobUses>,
    /// By write index: the next write of the same blob (NO_USE after the last).
    /// A chain, not a Vec per blob: 100,000 blobs are 100,000 allocations.
    next_use: Vec<usize>,
    /// The stat of each write's file as prepared in staging, by write index.
    prepared: Mutex<HashMap<usize, Written>>,
    /// Blobs already staged: a pack range read again (its pack moved by a
    /// repack mid-restore) skips them instead of creating their files twice.
    staged: Mutex<DigestSet>,
    step: Step,
    cursor: usize,
    recorded: Mutex<Vec<(String, CacheEntry)>>,
    /// The stat cache the live scan saw, saved once at `finish` with
    /// `recorded` merged in (None: no cache path, or taken by `finish`).
    kept_cache: Mutex<Option<KeptCache>>,
    skipped: Mutex<Vec<Vec<u8>>>,
    /// Files and symlinks put in place so far, and the bytes of those files
    /// (apply's progress; renames run on several threads).
    files_written: AtomicU64,
    bytes_written: AtomicU64,
    threads: usize,
    /// The umask new files are created under (all bits when unknown): a file
    /// created with its final mode needs no chmod when the umask keeps it.
    umask: u32,
    /// Starts writing staged data back while staging still creates files
    /// (None for a restore with little to write).
    writeback: Mutex<Option<Writeback>>,
    /// The stat cache learns what was written (a cache path was given): each
    /// file is then read back before it is vouched for.
    record: bool,
    /// The writes of files stored as chunks, filled chunk by chunk
    /// (`crate::restore_chunks`); None when the plan has none.
    pub chunks: Option<crate::restore_chunks::Assembly>,
}
fn flat_name(index: usize) -> CString {
    CString::new(format!("w-{index}")).expect("no NUL")
}

const TREE: &CStr = c"t";

fn random_token() -> String {
    let mut bytes = [0u8; 8];
    // SAFETY: `bytes` is writable for its length.
    let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if n != bytes.len() as isize {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        bytes = ((nanos as u64) ^ ((std::process::id() as u64) << 32)).to_le_bytes();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A blob the plan needs: its size and its first write index.
struct BlobUses {
    size: u64,
    first: usize,
}

/// The end of a `next_use` chain.
const NO_USE: usize = usize::MAX;

fn parent_of(path: &str) -> Option<&str> {
    path.rfind('/').map(|at| &path[..at])
}

/// What [`remove_stale_staging`] did: the staging directories it removed
/// (their names) and the paths it left (mount points inside, too deep).
#[derive(Debug, Default)]
pub struct StaleStaging {
    pub removed: Vec<Vec<u8>>,
    pub skipped: Vec<Vec<u8>>,
}

/// Remove the staging directories interrupted restores left at the top of
/// the root, and nothing else: an entry named like one that is not a
/// directory (a symlink, a file) stays, never followed, and a staging
/// directory a running restore holds (its `flock`, taken by
/// [`make_staging`] and released when that restore ends or dies) stays.
pub fn remove_stale_staging(ws: &Workspace) -> Result<StaleStaging, RestoreError> {
    let mut names = Vec::new();
    {
        let fd = ws.dup_fd()?;
        let mut reader =
            fs::DirReader::new(fd).map_err(|e| RestoreError::io(ws.shown(b""), "list", e))?;
        while let Some((name, _)) = reader
            .next_entry()
            .map_err(|e| RestoreError::io(ws.shown(b""), "list", e))?
        {
            if name.to_bytes().starts_with(STAGING_PREFIX.as_bytes()) {
                names.push(name.to_owned());
            }
        }
    }
    let mut done = StaleStaging::default();
    for name in names {
        let shown = ws.shown(name.to_bytes());
        let held = match fs::open_dir_at(ws.fd.as_raw_fd(), &name) {
            Ok(fd) => fd,
            // A symlink or a non-directory: not a staging directory; gone: done.
            Err(e) if is_errno(&e, &[libc::ENOENT, libc::ELOOP, libc::ENOTDIR]) => continue,
            Err(e) => return Err(RestoreError::io(shown, "open", e)),
        };
        if !fs::try_lock_exclusive(held.as_raw_fd())
            .map_err(|e| RestoreError::io(shown, "flock", e))?
        {
            continue; // a running restore's
        }
        remove_tree(
            ws,
            ws.fd.as_raw_fd(),
            &name,
            name.to_bytes(),
            &mut done.skipped,
        )?;
        done.removed.push(name.into_bytes());
    }
    Ok(done)
}

/// A fresh private staging directory at the top of the root.
struct Staging {
    name: CString,
    fd: OwnedFd,
    /// Its empty tree `t` (the plan's new directories are made there).
    tree: OwnedFd,
    /// Its directories of flat files, `f0` to `f{FLAT_DIRS - 1}`.
    flat: Vec<OwnedFd>,
}

/// How many directories the flat files are spread over: creating a file
/// holds its directory's lock (on ext4 without a journal, for as long as its
/// search for an inode not freed in the last minute takes), so in one
/// directory the staging threads would take turns.
const FLAT_DIRS: usize = 16;

fn make_staging(ws: &Workspace) -> Result<Staging, RestoreError> {
    let name = CString::new(format!("{STAGING_PREFIX}{}", random_token())).expect("no NUL");
    let shown = ws.shown(name.to_bytes());
    fs::mkdir_at(ws.fd.as_raw_fd(), &name, 0o700)
        .map_err(|e| RestoreError::io(shown.clone(), "mkdir", e))?;
    let fd = fs::open_dir_at(ws.fd.as_raw_fd(), &name)
        .map_err(|e| RestoreError::io(shown.clone(), "open", e))?;
    // Held for the whole restore: remove_stale_staging leaves it alone.
    fs::try_lock_exclusive(fd.as_raw_fd())
        .and_then(|locked| {
            locked
                .then_some(())
                .ok_or_else(|| io::Error::from_raw_os_error(libc::EWOULDBLOCK))
        })
        .map_err(|e| RestoreError::io(shown.clone(), "flock", e))?;
    // Where the files a restore replaces were staged, ext4 without a journal
    // keeps their freed inodes from reuse for a minute, and every file made
    // beside them searches past them all: staging's directories are placed
    // in block groups of their own instead (any error: placed as usual).
    let _ = fs::mark_top_of_hierarchy(fd.as_raw_fd());
    let subdir = |sub: &CStr| {
        fs::mkdir_at(fd.as_raw_fd(), sub, 0o700)
            .and_then(|()| fs::open_dir_at(fd.as_raw_fd(), sub))
            .map_err(|e| RestoreError::io(shown.clone(), "mkdir", e))
    };
    let tree = subdir(TREE)?;
    let flat = (0..FLAT_DIRS)
        .map(|shard| subdir(&flat_dir_name(shard)))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Staging {
        name,
        fd,
        tree,
        flat,
    })
}

fn flat_dir_name(shard: usize) -> CString {
    CString::new(format!("f{shard}")).expect("no NUL")
}

/// Where each write is prepared: the new roots (directories the workspace
/// lacks whose parent it has), every planned directory beneath them, and a
/// [`Dest`] per write.
fn staging_layout(plan: &Plan) -> (Vec<String>, std::collections::HashSet<String>, Vec<Dest>) {
    let planned: std::collections::HashSet<&str> =
        plan.dirs_to_make.iter().map(String::as_str).collect();
    let new_roots: Vec<String> = plan
        .dirs_to_make
        .iter()
        .filter(|d| parent_of(d).map_or(true, |p| !planned.contains(p)))
        .cloned()
        .collect();
    let roots: std::collections::HashSet<&str> = new_roots.iter().map(String::as_str).collect();
    let under_root = |path: &str| {
        let mut at = path;
        loop {
            if roots.contains(at) {
                return true;
            }
            match parent_of(at) {
                Some(p) => at = p,
                None => return false,
            }
        }
    };
    let tree_dirs: std::collections::HashSet<String> = plan
        .dirs_to_make
        .iter()
        .filter(|d| under_root(d))
        .cloned()
        .collect();
    // Writes come in path order, so most share the previous one's parent.
    let mut last: Option<(&str, Dest)> = None;
    let dests: Vec<Dest> = plan
        .writes
        .iter()
        .map(|w| {
            let parent = parent_of(&w.path);
            let dest = match (parent, last) {
                (Some(parent), Some((seen, dest))) if parent == seen => dest,
                (Some(parent), _) if under_root(parent) => Dest::Tree,
                _ => Dest::Flat,
            };
            last = parent.map(|parent| (parent, dest));
            dest
        })
        .collect();
    (new_roots, tree_dirs, dests)
}

/// Each needed blob's size and first write, and the `next_use` chains.
fn blob_uses(plan: &Plan) -> (DigestMap<BlobUses>, Vec<usize>) {
    let mut blobs: DigestMap<BlobUses> = plan
        .blobs
        .iter()
        .map(|&(hash, size)| {
            (
                hash,
                BlobUses {
                    size,
                    first: NO_USE,
                },
            )
        })
        .collect();
    // Linked from the last write back, so each chain runs in write order.
    let mut next_use = vec![NO_USE; plan.writes.len()];
    for (i, w) in plan.writes.iter().enumerate().rev() {
        let uses = blobs
            .get_mut(&w.hash)
            .expect("plan.blobs lists every write's blob");
        next_use[i] = uses.first;
        uses.first = i;
    }
    (blobs, next_use)
}

impl Restore {
    /// Remove what an interrupted restore left (a workspace has one restore at
    /// a time: its lease), then make a fresh private staging directory with
    /// the plan's new directories in it. `record`: the stat cache will learn
    /// what is written (see [`Restore::finish`]).
    pub fn new(
        ws: Workspace,
        plan: Plan,
        kept_cache: Option<KeptCache>,
        record: bool,
    ) -> Result<Restore, RestoreError> {
        let skipped = remove_stale_staging(&ws)?.skipped;
        let staging = make_staging(&ws)?;
        let (new_roots, tree_dirs, dests) = staging_layout(&plan);
        let (blobs, next_use) = blob_uses(&plan);
        let threads = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2)
            .clamp(2, 8);
        let writeback = (plan.bytes_to_write() >= Writeback::MIN_BYTES)
            .then(|| ws.dup_fd().map(Writeback::start))
            .transpose()?;
        let restore = Restore {
            blobs,
            next_use,
            ws,
            plan,
            staging_name: staging.name,
            staging: staging.fd,
            tree: staging.tree,
            flat: staging.flat,
            dests,
            new_roots,
            tree_dirs,
            prepared: Mutex::new(HashMap::new()),
            staged: Mutex::new(DigestSet::default()),
            step: Step::TreeDirs,
            cursor: 0,
            recorded: Mutex::new(Vec::new()),
            kept_cache: Mutex::new(kept_cache),
            skipped: Mutex::new(skipped),
            files_written: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
            threads,
            umask: fs::current_umask().unwrap_or(0o777),
            writeback: Mutex::new(writeback),
            record,
            chunks: None,
        };
        Ok(restore)
    }

    /// Staging's tree, relative to the root.
    fn tree_prefix(&self) -> Vec<u8> {
        let mut prefix = self.staging_name.to_bytes().to_vec();
        prefix.extend_from_slice(b"/t");
        prefix
    }

    /// The directory write `index` is staged in when it is flat.
    fn flat_dir(&self, index: usize) -> RawFd {
        self.flat[index % self.flat.len()].as_raw_fd()
    }

    /// Where flat write `index` is staged, for messages.
    fn shown_flat(&self, index: usize) -> String {
        let mut rel = flat_dir_name(index % self.flat.len()).into_bytes();
        rel.push(b'/');
        rel.extend_from_slice(flat_name(index).to_bytes());
        self.shown_staging(&CString::new(rel).expect("no NUL"))
    }

    fn shown_staging(&self, name: &CStr) -> String {
        let mut rel = self.staging_name.to_bytes().to_vec();
        rel.push(b'/');
        rel.extend_from_slice(name.to_bytes());
        self.ws.shown(&rel)
    }
}
