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

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::cancel::Cancel;
use crate::classify::Unsupported;
use crate::error::ScanError;
use crate::fs::{self, Stat};
use crate::hash;
use crate::hash::{DigestMap, DigestSet};
use crate::manifest::{self, ManifestRow};
use crate::pack;
use crate::scan::KeptCache;
use crate::statcache::{self, CacheEntry};
use crate::walk::{self, MAX_DEPTH, MAX_PATH_BYTES};
use rayon::prelude::*;

/// Top-level names reserved for staging (never captured, never deleted).
pub const STAGING_PREFIX: &str = ".checkpointd-staging-";

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

/// A file of the target manifest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetFile {
    pub path: String,
    pub hash: [u8; 32],
    pub size: u64,
    pub mode: u32,
    pub mtime_ns: i64,
    /// Capture zeroed secrets in it: never put in the stat cache (a cached
    /// hash would lose the secret positions the next manifest must carry).
    pub secrets: bool,
}

/// What stands at a path the checkpoint lacks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Doomed {
    /// A directory: removed only when empty (one holding excluded paths stays).
    Dir,
    /// A file or symlink.
    Leaf,
    /// A fifo, escaping link, non-UTF-8 name...: removed whatever it is.
    Unsupported,
}

/// What a restore changes, computed from the checkpoint and the live tree.
#[derive(Debug, Default)]
pub struct Plan {
    /// Deepest first.
    pub deletions: Vec<(Vec<u8>, Doomed)>,
    /// Shallowest first.
    pub dirs_to_make: Vec<String>,
    /// Content differs or missing, in path order.
    pub writes: Vec<TargetFile>,
    pub links: Vec<(String, String)>,
    /// Same bytes, mode or mtime differ.
    pub file_metadata: Vec<TargetFile>,
    /// Deepest first.
    pub dir_modes: Vec<(String, u32)>,
    /// Distinct blobs the writes need, with their sizes, in first-use order.
    pub blobs: Vec<([u8; 32], u64)>,
}

impl Plan {
    pub fn operations(&self) -> usize {
        self.deletions.len()
            + self.dirs_to_make.len()
            + self.writes.len()
            + self.links.len()
            + self.file_metadata.len()
            + self.dir_modes.len()
    }

    /// Files and symlinks whose content apply writes (progress: files_total).
    pub fn files_to_write(&self) -> u64 {
        (self.writes.len() + self.links.len()) as u64
    }

    /// Bytes of the files apply writes (progress: bytes_total).
    pub fn bytes_to_write(&self) -> u64 {
        self.writes.iter().map(|w| w.size).sum()
    }
}

/// Compare the target with the live (policy-selected) tree. `unsupported`
/// are the live entries the scan could not capture; `target` need not be
/// sorted. Errors: InvalidBlob when two entries give one blob two sizes.
/// Refuse, before any change, a target path under a top-level `.checkpointd*`
/// name (reserved for staging) or with a name longer than `name_max` bytes
/// (better refused whole than half restored).
pub fn check_target(target: &[ManifestRow], name_max: usize) -> Result<(), RestoreError> {
    target
        .iter()
        .try_for_each(|row| check_target_path(row.path(), name_max))
}

/// An encoded manifest row and its path.
type KeyedRow<'a> = (std::borrow::Cow<'a, str>, &'a [u8]);

/// Each encoded row of a manifest with its path, sorted by path bytes (a
/// sort only when the manifest is not in that order already: ours always is).
/// Err when the bytes are not the compact encoding, row by row.
fn keyed_rows(data: &[u8]) -> Result<Vec<KeyedRow<'_>>, RestoreError> {
    let shown = |e: manifest::ManifestError| RestoreError::Manifest(e.to_string());
    let mut keyed = Vec::new();
    for row in manifest::rows(data).map_err(shown)? {
        keyed.push((manifest::row_path(row).map_err(shown)?, row));
    }
    if !keyed
        .windows(2)
        .all(|w| w[0].0.as_bytes() <= w[1].0.as_bytes())
    {
        keyed.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    }
    Ok(keyed)
}

/// Rows decoded per task by `decode_rows`.
const DECODE_SLICE_ROWS: usize = 8192;

/// The rows of `rows` decoded, in order, [`DECODE_SLICE_ROWS`] per task.
fn decode_rows(rows: &[&[u8]]) -> Result<Vec<ManifestRow>, RestoreError> {
    let slices: Vec<Vec<ManifestRow>> = rows
        .par_chunks(DECODE_SLICE_ROWS)
        .map(decode_slice)
        .collect::<Result<_, _>>()?;
    Ok(slices.into_iter().flatten().collect())
}

/// The rows of `rows` decoded (a manifest of just those rows).
fn decode_slice(rows: &[&[u8]]) -> Result<Vec<ManifestRow>, RestoreError> {
    let mut joined = Vec::with_capacity(rows.iter().map(|r| r.len() + 1).sum::<usize>() + 2);
    joined.push(b'[');
    for (i, row) in rows.iter().enumerate() {
        if i > 0 {
            joined.push(b',');
        }
        joined.extend_from_slice(row);
    }
    joined.push(b']');
    manifest::decode(&joined).map_err(RestoreError::Manifest)
}

/// The target manifest, read for planning and checked ([`check_target`]'s
/// refusals, before any change): its rows kept encoded, each with its path,
/// or, for bytes that are not the compact encoding row by row, decoded.
pub enum Target<'a> {
    Encoded(Vec<KeyedRow<'a>>),
    Decoded(Vec<ManifestRow>),
}

impl<'a> Target<'a> {
    pub fn read(data: &'a [u8], name_max: usize) -> Result<Target<'a>, RestoreError> {
        let Ok(rows) = keyed_rows(data) else {
            let rows = manifest::decode(data).map_err(RestoreError::Manifest)?;
            check_target(&rows, name_max)?;
            return Ok(Target::Decoded(rows));
        };
        for (path, _) in &rows {
            check_target_path(path, name_max)?;
        }
        Ok(Target::Encoded(rows))
    }
}

/// The plan of [`plan`] from the target and the encoded live scan, at a cost
/// proportional to what differs: a row byte-identical in both (same path,
/// kind, content, mode, mtime) needs nothing, so only the rows that differ
/// are decoded and planned. (Paths are unique in each manifest, so a live row
/// with no identical target row names a path whose target row, if any,
/// differs too: deletions and comparisons come out as [`plan`] over every
/// row would give them.)
pub fn plan_encoded(
    target: Target<'_>,
    live: &[u8],
    unsupported: &[(Vec<u8>, Unsupported)],
) -> Result<Plan, RestoreError> {
    let target_rows = match target {
        Target::Encoded(rows) => rows,
        Target::Decoded(rows) => {
            let live = manifest::decode(live).map_err(RestoreError::Manifest)?;
            return plan(rows, live, unsupported);
        }
    };
    let live_rows = keyed_rows(live)?;
    let (mut wanted, mut found) = (Vec::new(), Vec::new());
    let (mut t, mut l) = (target_rows.iter().peekable(), live_rows.iter().peekable());
    loop {
        match (t.peek(), l.peek()) {
            (Some(a), Some(b)) => match a.0.as_bytes().cmp(b.0.as_bytes()) {
                std::cmp::Ordering::Less => wanted.push(t.next().expect("peeked").1),
                std::cmp::Ordering::Greater => found.push(l.next().expect("peeked").1),
                std::cmp::Ordering::Equal => {
                    let (a, b) = (t.next().expect("peeked").1, l.next().expect("peeked").1);
                    if a != b {
                        wanted.push(a);
                        found.push(b);
                    }
                }
            },
            (Some(_), None) => wanted.push(t.next().expect("peeked").1),
            (None, Some(_)) => found.push(l.next().expect("peeked").1),
            (None, None) => break,
        }
    }
    plan(decode_rows(&wanted)?, decode_rows(&found)?, unsupported)
}

/// [`check_target`] of one path.
fn check_target_path(path: &str, name_max: usize) -> Result<(), RestoreError> {
    if path
        .split('/')
        .next()
        .is_some_and(|top| top.starts_with(".checkpointd"))
    {
        return Err(RestoreError::InvalidPath {
            path: path.to_string(),
            reason: "top-level .checkpointd* names are reserved".into(),
        });
    }
    if path.split('/').any(|part| part.len() > name_max) {
        return Err(RestoreError::NameTooLong {
            path: path.to_string(),
            limit: name_max,
        });
    }
    // What no capture makes (the walk refuses it): a hostile manifest's.
    let reason = match walk::beyond_limits(path.split('/').count(), path.len()) {
        Some(Unsupported::TooDeep) => format!("deeper than {MAX_DEPTH} directories"),
        Some(_) => format!("longer than {MAX_PATH_BYTES} bytes"),
        None => return Ok(()),
    };
    Err(RestoreError::InvalidPath {
        path: path.to_string(),
        reason,
    })
}

/// The longest name the filesystem holding `fd` allows (255 when unknown).
pub fn name_max(fd: RawFd) -> usize {
    // SAFETY: valid fd; fpathconf only reads it.
    let limit = unsafe { libc::fpathconf(fd, libc::_PC_NAME_MAX) };
    if limit > 0 {
        limit as usize
    } else {
        255
    }
}

pub fn plan(
    mut target: Vec<ManifestRow>,
    mut live: Vec<ManifestRow>,
    unsupported: &[(Vec<u8>, Unsupported)],
) -> Result<Plan, RestoreError> {
    // Both in path order, then one merge pairs each target row with the live
    // row at its path (no hash set of 100,000 paths).
    target.sort_by(|a, b| a.path().as_bytes().cmp(b.path().as_bytes()));
    live.sort_by(|a, b| a.path().as_bytes().cmp(b.path().as_bytes()));
    let mut plan = Plan::default();
    let mut doomed: Vec<(Vec<u8>, Doomed)> = Vec::new();
    let mut current_of: Vec<Option<&ManifestRow>> = Vec::with_capacity(target.len());
    let mut live_rows = live.iter().peekable();
    for row in &target {
        let mut current = None;
        while let Some(found) = live_rows.peek() {
            match found.path().as_bytes().cmp(row.path().as_bytes()) {
                std::cmp::Ordering::Less => {
                    doomed.push(doomed_row(found));
                    live_rows.next();
                }
                std::cmp::Ordering::Equal => {
                    current = live_rows.next();
                    break;
                }
                std::cmp::Ordering::Greater => break,
            }
        }
        current_of.push(current);
    }
    doomed.extend(live_rows.map(doomed_row));
    let wanted = |path: &str| {
        target
            .binary_search_by(|row| row.path().as_bytes().cmp(path.as_bytes()))
            .is_ok()
    };
    for (path, kind) in unsupported {
        if *kind == Unsupported::SecretInName {
            // Shown masked: not a path to act on; the entry is left alone.
            continue;
        }
        let known = std::str::from_utf8(path).is_ok_and(wanted);
        if !known {
            doomed.push((path.clone(), Doomed::Unsupported));
        }
    }
    // Reverse byte order puts every path after its descendants ("a/b" > "a").
    doomed.sort_by(|a, b| b.0.cmp(&a.0));
    plan.deletions = doomed;

    let mut sizes: DigestMap<u64> = DigestMap::default();
    for (row, current) in target.iter().zip(current_of) {
        match row {
            ManifestRow::File {
                path,
                hash,
                size,
                mode,
                mtime_ns,
                secrets,
            } => {
                let file = TargetFile {
                    path: path.clone(),
                    hash: *hash,
                    size: *size,
                    mode: *mode,
                    mtime_ns: *mtime_ns,
                    secrets: *secrets,
                };
                match current {
                    Some(ManifestRow::File {
                        hash: h,
                        size: s,
                        mode: m,
                        mtime_ns: t,
                        ..
                    }) if h == hash && s == size => {
                        if m != mode || t != mtime_ns {
                            plan.file_metadata.push(file);
                        }
                    }
                    _ => plan.writes.push(file),
                }
            }
            ManifestRow::Dir { path, mode } => match current {
                Some(ManifestRow::Dir { mode: m, .. }) => {
                    if m != mode {
                        plan.dir_modes.push((path.clone(), *mode));
                    }
                }
                _ => {
                    plan.dirs_to_make.push(path.clone());
                    plan.dir_modes.push((path.clone(), *mode));
                }
            },
            ManifestRow::Symlink { path, target } => match current {
                Some(ManifestRow::Symlink { target: t, .. }) if t == target => {}
                _ => plan.links.push((path.clone(), target.clone())),
            },
        }
    }
    plan.dir_modes.reverse();
    for write in &plan.writes {
        add_blob(&mut plan.blobs, &mut sizes, write)?;
    }
    Ok(plan)
}

/// A live row the target lacks: deleted.
fn doomed_row(row: &ManifestRow) -> (Vec<u8>, Doomed) {
    let kind = match row {
        ManifestRow::Dir { .. } => Doomed::Dir,
        _ => Doomed::Leaf,
    };
    (row.path().as_bytes().to_vec(), kind)
}

/// Drop from the writes the files at `paths` (a live file equal to the
/// checkpoint's but for the secrets capture zeroed in it: rewriting it would
/// put zeros over the real secrets), and the blobs only they needed.
pub fn leave_alone(plan: &mut Plan, paths: &std::collections::HashSet<String>) {
    if paths.is_empty() {
        return;
    }
    plan.writes.retain(|file| !paths.contains(&file.path));
    let needed: DigestSet = plan.writes.iter().map(|f| f.hash).collect();
    plan.blobs.retain(|(hash, _)| needed.contains(hash));
}

fn add_blob(
    blobs: &mut Vec<([u8; 32], u64)>,
    sizes: &mut DigestMap<u64>,
    file: &TargetFile,
) -> Result<(), RestoreError> {
    match sizes.get(&file.hash) {
        Some(&known) if known != file.size => Err(RestoreError::InvalidBlob {
            hash: file.hash,
            reason: format!("entries give it sizes {known} and {}", file.size),
        }),
        Some(_) => Ok(()),
        None => {
            sizes.insert(file.hash, file.size);
            blobs.push((file.hash, file.size));
            Ok(())
        }
    }
}

/// Files whose bytes are right but whose mode or mtime differ are changed in
/// place, unless their inode has other names (a hard link planted in the
/// workspace may name a file outside it): those are replaced from their blob.
pub fn replace_shared_inodes(ws: &Workspace, plan: &mut Plan) -> Result<(), RestoreError> {
    let mut dirs = DirStack::new(ws);
    let mut shared = Vec::new();
    let mut kept = Vec::with_capacity(plan.file_metadata.len());
    for entry in std::mem::take(&mut plan.file_metadata) {
        let (parent, name) = split_parent(entry.path.as_bytes());
        let links = match dirs.reach(parent, false)? {
            Reached::Dir(fd) => fs::lstat_links_at(fd, &cname(name)?)
                .map(|(_, n)| n)
                .unwrap_or(1),
            _ => 1,
        };
        if links > 1 {
            shared.push(entry);
        } else {
            kept.push(entry);
        }
    }
    plan.file_metadata = kept;
    if shared.is_empty() {
        return Ok(());
    }
    let mut sizes: DigestMap<u64> = plan.blobs.iter().copied().collect();
    for entry in &shared {
        add_blob(&mut plan.blobs, &mut sizes, entry)?;
    }
    plan.writes.extend(shared);
    plan.writes
        .sort_by(|a, b| a.path.as_bytes().cmp(b.path.as_bytes()));
    Ok(())
}

/// What [`DirStack::open_child`] found at a name.
enum Child {
    Dir(OwnedFd),
    /// Missing (or, without `create`, a symlink or a non-directory).
    Absent,
    /// A file mounted there (a bind mount): never removed.
    MountPoint,
}

/// A directory reached from the root by fd, or why not.
enum Reached {
    Dir(RawFd),
    /// Missing, or a symlink or a non-directory stands on the path.
    Absent,
    /// On another device: a mount point at or above it (its path).
    OtherDevice(Vec<u8>),
}

/// The directory fds of the last path visited (operations come in path order,
/// so consecutive ones mostly share their parents).
struct DirStack<'w> {
    ws: &'w Workspace,
    /// The directory paths start from (the root, or staging's tree).
    base: RawFd,
    /// `base`'s path relative to the root, for messages ("" = the root).
    prefix: Vec<u8>,
    parts: Vec<(Vec<u8>, OwnedFd)>,
    /// The last directory reached in one `openat2` (its path and fd): the
    /// fast path, one system call for a whole path, where the component walk
    /// of `parts` takes three per component.
    last: Option<(Vec<u8>, OwnedFd)>,
}

impl<'w> DirStack<'w> {
    fn new(ws: &'w Workspace) -> DirStack<'w> {
        DirStack {
            ws,
            base: ws.fd.as_raw_fd(),
            prefix: Vec::new(),
            parts: Vec::new(),
            last: None,
        }
    }

    /// Paths beneath `base` (a directory inside staging at `prefix`).
    fn beneath(ws: &'w Workspace, base: RawFd, prefix: &[u8]) -> DirStack<'w> {
        DirStack {
            ws,
            base,
            prefix: prefix.to_vec(),
            parts: Vec::new(),
            last: None,
        }
    }

    fn shown(&self, rel: &[u8]) -> String {
        if self.prefix.is_empty() {
            return self.ws.shown(rel);
        }
        let mut full = self.prefix.clone();
        full.push(b'/');
        full.extend_from_slice(rel);
        self.ws.shown(&full)
    }

    fn forget(&mut self) {
        self.parts.clear();
        self.last = None;
    }

    /// Reach directory `rel` ("" = the root). With `create`, missing
    /// directories are made (0755; a planned one gets its mode later) and a
    /// symlink or file in the way is unlinked first (the link, never its target).
    fn reach(&mut self, rel: &[u8], create: bool) -> Result<Reached, RestoreError> {
        // Fast path: the whole path in one openat2 that crosses no symlink and
        // no mount point; anything else (missing, a link or file in the way,
        // a mount, no openat2) is the component walk's to judge.
        if !rel.is_empty() {
            if let Some((path, fd)) = &self.last {
                if path.as_slice() == rel {
                    return Ok(Reached::Dir(fd.as_raw_fd()));
                }
            }
            if let Ok(fd) = fs::open_dir_beneath_same_mount(self.base, rel) {
                let raw = fd.as_raw_fd();
                self.last = Some((rel.to_vec(), fd));
                return Ok(Reached::Dir(raw));
            }
        }
        let wanted: Vec<&[u8]> = if rel.is_empty() {
            Vec::new()
        } else {
            rel.split(|&b| b == b'/').collect()
        };
        let mut keep = 0;
        while keep < self.parts.len()
            && keep < wanted.len()
            && self.parts[keep].0.as_slice() == wanted[keep]
        {
            keep += 1;
        }
        self.parts.truncate(keep);
        for depth in keep..wanted.len() {
            let parent = match self.parts.last() {
                Some((_, fd)) => fd.as_raw_fd(),
                None => self.base,
            };
            let name = cname(wanted[depth])?;
            let here = || wanted[..=depth].join(&b'/');
            let fd = match self.open_child(parent, &name, create, &here)? {
                Child::Dir(fd) => fd,
                Child::Absent => return Ok(Reached::Absent),
                Child::MountPoint => return Ok(Reached::OtherDevice(here())),
            };
            let stat = fs::fstat(fd.as_raw_fd())
                .map_err(|e| RestoreError::raced(self.shown(&here()), "fstat", e))?;
            if fs::is_mount_point_fd(fd.as_raw_fd(), &stat, self.ws.dev) {
                return Ok(Reached::OtherDevice(here()));
            }
            self.parts.push((wanted[depth].to_vec(), fd));
        }
        Ok(Reached::Dir(match self.parts.last() {
            Some((_, fd)) => fd.as_raw_fd(),
            None => self.base,
        }))
    }

    fn open_child(
        &self,
        parent: RawFd,
        name: &CStr,
        create: bool,
        here: &dyn Fn() -> Vec<u8>,
    ) -> Result<Child, RestoreError> {
        // Bounded: a racing writer cannot keep us looping.
        for _ in 0..8 {
            match fs::open_dir_at(parent, name) {
                Ok(fd) => return Ok(Child::Dir(fd)),
                Err(e) if !create => {
                    if is_errno(&e, &[libc::ENOENT, libc::ELOOP, libc::ENOTDIR]) {
                        return Ok(Child::Absent);
                    }
                    return Err(RestoreError::raced(self.shown(&here()), "open", e));
                }
                // A file bind-mounted where a directory must go: left alone.
                Err(e)
                    if is_errno(&e, &[libc::ENOTDIR])
                        && fs::is_mount_root_at(parent, name).ok().flatten() == Some(true) =>
                {
                    return Ok(Child::MountPoint)
                }
                Err(e) if is_errno(&e, &[libc::ELOOP, libc::ENOTDIR]) => {
                    match fs::unlink_at(parent, name) {
                        Ok(()) => {}
                        Err(e) if is_errno(&e, &[libc::ENOENT]) => {}
                        Err(e) => {
                            return Err(RestoreError::raced(self.shown(&here()), "unlink", e))
                        }
                    }
                }
                Err(e) if is_errno(&e, &[libc::ENOENT]) => {}
                Err(e) => return Err(RestoreError::raced(self.shown(&here()), "open", e)),
            }
            match fs::mkdir_at(parent, name, 0o755) {
                Ok(()) => {}
                Err(e) if is_errno(&e, &[libc::EEXIST]) => {}
                Err(e) => return Err(RestoreError::raced(self.shown(&here()), "mkdir", e)),
            }
        }
        Err(RestoreError::Changed {
            path: self.shown(&here()),
            op: "open",
            source: io::Error::other("the directory keeps changing under the restore"),
        })
    }
}

/// How deep below the root [`remove_tree`] goes: a checkpoint's deepest
/// paths, in staging's tree (two levels down: `.checkpointd-staging-*/t/`).
const REMOVE_DEPTH_MAX: usize = MAX_DEPTH + 2;

/// Remove whatever stands at `name` in `parent`: a non-directory is unlinked,
/// a directory emptied and removed, without ever entering a mount point nor
/// going deeper than [`REMOVE_DEPTH_MAX`] below the root (each level holds an
/// fd and a stack frame): such a path goes to `skipped`, and it stays.
fn remove_tree(
    ws: &Workspace,
    parent: RawFd,
    name: &CStr,
    rel: &[u8],
    skipped: &mut Vec<Vec<u8>>,
) -> Result<(), RestoreError> {
    if rel.split(|&b| b == b'/').count() > REMOVE_DEPTH_MAX {
        skipped.push(rel.to_vec());
        return Ok(());
    }
    let stat = match fs::lstat_at(parent, name) {
        Ok(s) => s,
        Err(e) if is_errno(&e, &[libc::ENOENT, libc::ENOTDIR]) => return Ok(()),
        Err(e) => return Err(RestoreError::raced(ws.shown(rel), "lstat", e)),
    };
    if fs::is_mount_point(parent, name, &stat, ws.dev) {
        skipped.push(rel.to_vec());
        return Ok(());
    }
    if !stat.is_dir() {
        return match fs::unlink_at(parent, name) {
            // Mounted on since its lstat: it stays.
            Err(e) if is_errno(&e, &[libc::EBUSY]) => {
                skipped.push(rel.to_vec());
                Ok(())
            }
            Err(e) if !is_errno(&e, &[libc::ENOENT]) => {
                Err(RestoreError::raced(ws.shown(rel), "unlink", e))
            }
            _ => Ok(()),
        };
    }
    let fd = match fs::open_dir_at(parent, name) {
        Ok(fd) => fd,
        Err(e) if is_errno(&e, &[libc::ENOENT, libc::ELOOP, libc::ENOTDIR]) => return Ok(()),
        Err(e) => return Err(RestoreError::raced(ws.shown(rel), "open", e)),
    };
    let inner =
        fs::fstat(fd.as_raw_fd()).map_err(|e| RestoreError::raced(ws.shown(rel), "fstat", e))?;
    if fs::is_mount_point_fd(fd.as_raw_fd(), &inner, ws.dev) {
        skipped.push(rel.to_vec());
        return Ok(());
    }
    let dir_fd = fd
        .try_clone()
        .map_err(|e| RestoreError::raced(ws.shown(rel), "dup", e))?;
    let mut reader =
        fs::DirReader::new(fd).map_err(|e| RestoreError::raced(ws.shown(rel), "list", e))?;
    let mut names: Vec<CString> = Vec::new();
    while let Some((child, _)) = reader
        .next_entry()
        .map_err(|e| RestoreError::raced(ws.shown(rel), "list", e))?
    {
        names.push(child.to_owned());
    }
    drop(reader);
    for child in names {
        let mut child_rel = rel.to_vec();
        child_rel.push(b'/');
        child_rel.extend_from_slice(child.to_bytes());
        remove_tree(ws, dir_fd.as_raw_fd(), &child, &child_rel, skipped)?;
    }
    match fs::rmdir_at(parent, name) {
        Ok(()) => Ok(()),
        Err(e) if is_errno(&e, &[libc::ENOENT]) => Ok(()),
        // A mount point inside (EBUSY) or a name that reappeared: it stays.
        Err(e) if is_errno(&e, &[libc::EBUSY, libc::ENOTEMPTY, libc::EEXIST]) => Ok(()),
        Err(e) => Err(RestoreError::raced(ws.shown(rel), "rmdir", e)),
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

/// A thread that calls `syncfs` on the workspace's filesystem every
/// [`Writeback::EVERY`] until dropped, so the disk writes what staging made
/// while staging keeps the CPUs busy: the final `syncfs` of
/// [`Restore::finish`] then waits for the last interval's data only. (The
/// kernel itself would start only after `dirty_expire_centisecs`, 30 s, or once
/// a tenth of memory is dirty, so without this every byte of a restore waits
/// for the end.)
struct Writeback {
    /// Dropping it wakes and ends the thread (its `recv_timeout` disconnects).
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Writeback {
    const EVERY: std::time::Duration = std::time::Duration::from_millis(300);
    /// Below this many bytes to write, the final sync alone is short.
    const MIN_BYTES: u64 = 32 << 20;

    fn start(fd: OwnedFd) -> Writeback {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("restore-writeback".into())
            .spawn(move || {
                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                    stopped.recv_timeout(Writeback::EVERY)
                {
                    // An error here is the final sync's to report.
                    let _ = fs::syncfs(fd.as_raw_fd());
                }
            })
            .ok();
        Writeback {
            stop: Some(stop),
            thread,
        }
    }
}

impl Drop for Writeback {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
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
        let mut leftovers = Vec::new();
        {
            let fd = ws.dup_fd()?;
            let mut reader =
                fs::DirReader::new(fd).map_err(|e| RestoreError::io(ws.shown(b""), "list", e))?;
            while let Some((name, _)) = reader
                .next_entry()
                .map_err(|e| RestoreError::io(ws.shown(b""), "list", e))?
            {
                if name.to_bytes().starts_with(STAGING_PREFIX.as_bytes()) {
                    leftovers.push(name.to_owned());
                }
            }
        }
        let mut skipped = Vec::new();
        for name in leftovers {
            remove_tree(&ws, ws.fd.as_raw_fd(), &name, name.to_bytes(), &mut skipped)?;
        }
        let staging_name =
            CString::new(format!("{STAGING_PREFIX}{}", random_token())).expect("no NUL");
        let shown = ws.shown(staging_name.to_bytes());
        fs::mkdir_at(ws.fd.as_raw_fd(), &staging_name, 0o700)
            .map_err(|e| RestoreError::io(shown.clone(), "mkdir", e))?;
        let staging = fs::open_dir_at(ws.fd.as_raw_fd(), &staging_name)
            .map_err(|e| RestoreError::io(shown.clone(), "open", e))?;
        fs::mkdir_at(staging.as_raw_fd(), TREE, 0o700)
            .map_err(|e| RestoreError::io(shown.clone(), "mkdir", e))?;
        let tree = fs::open_dir_at(staging.as_raw_fd(), TREE)
            .map_err(|e| RestoreError::io(shown, "open", e))?;

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
            staging_name,
            staging,
            tree,
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

    fn tree_prefix(&self) -> Vec<u8> {
        let mut prefix = self.staging_name.to_bytes().to_vec();
        prefix.extend_from_slice(b"/t");
        prefix
    }

    /// The planned directories of `range` beneath new roots, made in
    /// staging's tree if staging has not made them yet (their modes are set
    /// once they are in place). Staging makes the directories of the files
    /// it writes as it goes, on all its threads, so what is left here are
    /// the empty ones: a restore does not start with thousands of serial mkdirs.
    fn make_tree_dirs(&self, range: std::ops::Range<usize>) -> Result<usize, RestoreError> {
        let prefix = self.tree_prefix();
        let mut dirs = DirStack::beneath(&self.ws, self.tree.as_raw_fd(), &prefix);
        for dir in &self.plan.dirs_to_make[range] {
            if self.tree_dirs.contains(dir) {
                dirs.reach(dir.as_bytes(), true)?;
            }
        }
        Ok(0)
    }

    fn shown_staging(&self, name: &CStr) -> String {
        let mut rel = self.staging_name.to_bytes().to_vec();
        rel.push(b'/');
        rel.extend_from_slice(name.to_bytes());
        self.ws.shown(&rel)
    }

    /// Whether the plan needs the blob `hash`.
    pub fn needs(&self, hash: &[u8; 32]) -> bool {
        match &self.chunks {
            Some(chunks) if chunks.builds(hash) => return false,
            Some(chunks) if chunks.chunk_len(hash).is_some() => return true,
            _ => {}
        }
        self.blobs.contains_key(hash)
    }

    /// The size the plan expects for `hash`, or InvalidBlob for a blob it does not need.
    pub fn expected(&self, hash: &[u8; 32]) -> Result<u64, RestoreError> {
        if let Some(len) = self.chunks.as_ref().and_then(|c| c.chunk_len(hash)) {
            return Ok(len);
        }
        self.blobs
            .get(hash)
            .map(|uses| uses.size)
            .ok_or_else(|| RestoreError::InvalidBlob {
                hash: *hash,
                reason: "the restore did not ask for it".into(),
            })
    }

    /// Stage many small blobs at once (each verified before a byte is
    /// written), spread over a few threads.
    pub fn stage_many(
        &self,
        items: &[([u8; 32], &[u8])],
        cancel: &Cancel,
    ) -> Result<(), RestoreError> {
        let chunk = items.len().div_ceil(self.threads).max(1);
        let prefix = self.tree_prefix();
        std::thread::scope(|scope| {
            let handles: Vec<_> = items
                .chunks(chunk)
                .map(|part| {
                    let prefix = &prefix;
                    scope.spawn(move || {
                        let mut dirs = DirStack::beneath(&self.ws, self.tree.as_raw_fd(), prefix);
                        for (hash, data) in part {
                            if cancel.is_cancelled() {
                                return Err(RestoreError::Cancelled);
                            }
                            self.stage_bytes(&mut dirs, hash, data)?;
                        }
                        Ok(())
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or(Err(RestoreError::Cancelled)))
                .collect::<Result<Vec<()>, RestoreError>>()
                .map(drop)
        })
    }

    fn verify(hash: &[u8; 32], size: u64, data: &[u8]) -> Result<(), RestoreError> {
        if data.len() as u64 != size {
            return Err(RestoreError::InvalidBlob {
                hash: *hash,
                reason: format!("{} bytes where the checkpoint records {size}", data.len()),
            });
        }
        if blake3::hash(data).as_bytes() != hash {
            return Err(RestoreError::InvalidBlob {
                hash: *hash,
                reason: "its BLAKE3 hash does not match its key".into(),
            });
        }
        Ok(())
    }

    /// One blob given whole: verified, then written to each of its uses.
    fn stage_bytes(
        &self,
        dirs: &mut DirStack<'_>,
        hash: &[u8; 32],
        data: &[u8],
    ) -> Result<(), RestoreError> {
        Self::verify(hash, self.expected(hash)?, data)?;
        self.write_uses(dirs, hash, data).map(drop)
    }

    /// Write verified bytes to every use of `hash`, once per blob: false
    /// when it was staged before (and is skipped).
    fn write_uses(
        &self,
        dirs: &mut DirStack<'_>,
        hash: &[u8; 32],
        data: &[u8],
    ) -> Result<bool, RestoreError> {
        if let Some(chunks) = &self.chunks {
            if chunks.write_chunk(self, hash, data)? && !self.blobs.contains_key(hash) {
                return Ok(true);
            }
        }
        if !self
            .staged
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(*hash)
        {
            return Ok(false);
        }
        for (index, fd) in self.create_uses(dirs, hash)? {
            write_sparse(&fd, 0, data, Some(data.len() as u64))
                .map_err(|e| RestoreError::io(self.shown_prepared(index), "write", e))?;
            self.finish_use(index, &fd, Some(data))?;
        }
        Ok(true)
    }

    /// One complete frame of `data` (the pack's bytes from `base` on):
    /// checked against the plan's size, decoded and verified, then staged;
    /// false when its blob was staged before.
    fn stage_frame(
        &self,
        dirs: &mut DirStack<'_>,
        base: u64,
        data: &[u8],
        entry: &pack::Entry,
    ) -> Result<bool, RestoreError> {
        let expected = self.expected(&entry.digest)?;
        if expected != u64::from(entry.raw_len) {
            return Err(RestoreError::InvalidBlob {
                hash: entry.digest,
                reason: format!(
                    "the pack index records {} bytes where the checkpoint records {expected}",
                    entry.raw_len
                ),
            });
        }
        // Inside `data` by construction (RangeStager::feed).
        let start = entry.offset.saturating_sub(base) as usize;
        let stop = (start + entry.stored_len as usize).min(data.len());
        let stored = &data[start.min(stop)..stop];
        let raw = pack::decode_frame(entry, stored).map_err(|e| match e {
            pack::PackError::Blob { digest, reason } => RestoreError::InvalidBlob {
                hash: digest,
                reason,
            },
            other => RestoreError::InvalidBlob {
                hash: entry.digest,
                reason: other.to_string(),
            },
        })?;
        self.write_uses(dirs, &entry.digest, &raw)
    }

    /// Decode, verify and stage the complete frames `frames` of a pack read
    /// (`data` holds the pack's bytes from offset `base` on), spread over a
    /// few threads. Each frame is checked against its index row and the plan
    /// (raw size, then decoded size and BLAKE3: one hash per blob) before a
    /// byte of it is written. Returns (blobs, bytes) staged.
    fn stage_frames(
        &self,
        base: u64,
        data: &[u8],
        frames: &[pack::Entry],
        cancel: &Cancel,
    ) -> Result<(u64, u64), RestoreError> {
        if frames.is_empty() {
            return Ok((0, 0));
        }
        // On rayon's pool, shared by every pack read in flight: as many
        // threads create files as there are cores, however many reads run
        // (more would only contend for the filesystem's locks).
        let chunk = frames.len().div_ceil(self.threads * 2).max(1);
        let prefix = self.tree_prefix();
        // Only blobs staged now count (a read again after a repack skips some).
        frames
            .par_chunks(chunk)
            .map(|part| {
                let mut dirs = DirStack::beneath(&self.ws, self.tree.as_raw_fd(), &prefix);
                let (mut blobs, mut bytes) = (0, 0);
                for entry in part {
                    if cancel.is_cancelled() {
                        return Err(RestoreError::Cancelled);
                    }
                    if self.stage_frame(&mut dirs, base, data, entry)? {
                        blobs += 1;
                        bytes += u64::from(entry.raw_len);
                    }
                }
                Ok((blobs, bytes))
            })
            .try_reduce(|| (0, 0), |a, b| Ok((a.0 + b.0, a.1 + b.1)))
    }

    fn shown_prepared(&self, index: usize) -> String {
        match self.dests[index] {
            Dest::Flat => self.shown_staging(&flat_name(index)),
            Dest::Tree => {
                let mut rel = self.tree_prefix();
                rel.push(b'/');
                rel.extend_from_slice(self.plan.writes[index].path.as_bytes());
                self.ws.shown(&rel)
            }
        }
    }

    /// [`Restore::create_uses`] of a blob stored as chunks.
    pub(crate) fn create_uses_for_chunks(
        &self,
        hash: &[u8; 32],
    ) -> Result<Vec<(usize, OwnedFd)>, RestoreError> {
        let prefix = self.tree_prefix();
        let mut dirs = DirStack::beneath(&self.ws, self.tree.as_raw_fd(), &prefix);
        self.create_uses(&mut dirs, hash)
    }

    /// Where write `index` is prepared, for messages.
    pub(crate) fn shown_write(&self, index: usize) -> String {
        self.shown_prepared(index)
    }

    /// [`Restore::finish_use`] of a file built from chunks (read back whole by then).
    pub(crate) fn finish_chunked_use(
        &self,
        index: usize,
        fd: &OwnedFd,
    ) -> Result<(), RestoreError> {
        self.finish_use(index, fd, None)
    }

    /// A new, empty file for every write that uses `hash`.
    fn create_uses(
        &self,
        dirs: &mut DirStack<'_>,
        hash: &[u8; 32],
    ) -> Result<Vec<(usize, OwnedFd)>, RestoreError> {
        let mut out = Vec::new();
        let mut index = self.blobs.get(hash).map_or(NO_USE, |uses| uses.first);
        while index != NO_USE {
            // Created with its final mode: staging is private (0700), so
            // nobody else can reach the file before it moves in.
            let mode = self.plan.writes[index].mode & 0o777;
            let fd = match self.dests[index] {
                Dest::Flat => {
                    fs::create_file_mode_at(self.staging.as_raw_fd(), &flat_name(index), mode)
                }
                Dest::Tree => {
                    let (parent, leaf) = split_parent(self.plan.writes[index].path.as_bytes());
                    let parent_fd = match dirs.reach(parent, true)? {
                        Reached::Dir(fd) => fd,
                        _ => {
                            return Err(RestoreError::io(
                                self.shown_prepared(index),
                                "create",
                                io::Error::from_raw_os_error(libc::ENOENT),
                            ))
                        }
                    };
                    fs::create_file_mode_at(parent_fd, &cname(leaf)?, mode)
                }
            }
            .map_err(|e| RestoreError::io(self.shown_prepared(index), "create", e))?;
            out.push((index, fd));
            index = self.next_use[index];
        }
        Ok(out)
    }

    /// Mode and mtime through our own fd, then its stat: what moves in.
    /// A file that moves in with its directory is read back through the fd
    /// after that stat (compared with `bytes`, the blob, when given; else
    /// hashed): the stat cache may learn the stat only if it then held the
    /// blob. (A file renamed in by itself is read back after its rename.)
    fn finish_use(
        &self,
        index: usize,
        fd: &OwnedFd,
        bytes: Option<&[u8]>,
    ) -> Result<(), RestoreError> {
        let entry = &self.plan.writes[index];
        let raw = fd.as_raw_fd();
        let shown = || self.shown_prepared(index);
        if entry.mode & 0o777 & self.umask != 0 {
            fs::fchmod(raw, entry.mode & 0o777)
                .map_err(|e| RestoreError::io(shown(), "chmod", e))?;
        }
        fs::set_mtime(raw, entry.mtime_ns)
            .map_err(|e| RestoreError::io(shown(), "set the mtime of", e))?;
        let stat = fs::fstat(raw).map_err(|e| RestoreError::io(shown(), "fstat", e))?;
        let verified = self.record
            && !entry.secrets
            && self.dests[index] == Dest::Tree
            && stat.size == entry.size
            && hash::file_holds(raw, entry.size, &entry.hash, bytes)
                .map_err(|e| RestoreError::io(shown(), "read back", e))?;
        self.prepared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(index, Written { stat, verified });
        Ok(())
    }

    /// A writer streaming one (large) blob into staging, hashing as it goes.
    pub fn stage_writer(&self, hash: &[u8; 32], size: u64) -> Result<StagedWriter, RestoreError> {
        let expected = self.expected(hash)?;
        if expected != size {
            return Err(RestoreError::InvalidBlob {
                hash: *hash,
                reason: format!(
                    "asked for with {size} bytes where the checkpoint records {expected}"
                ),
            });
        }
        let prefix = self.tree_prefix();
        let mut dirs = DirStack::beneath(&self.ws, self.tree.as_raw_fd(), &prefix);
        Ok(StagedWriter {
            uses: self.create_uses(&mut dirs, hash)?,
            hash: *hash,
            size,
            written: 0,
            hasher: blake3::Hasher::new(),
            holes: false,
        })
    }

    /// Whether apply has more to do.
    pub fn done(&self) -> bool {
        self.step == Step::Done
    }

    /// Apply up to `budget` operations of the current step (steps run in
    /// order: staging's empty directories, deletions, directories, new
    /// directory trees moved in whole, other files by atomic rename,
    /// symlinks, file modes and mtimes, directory modes deepest first).
    /// Returns how many were done (files moved in with their directory count
    /// too; the empty directories count none); see [`Restore::done`].
    pub fn apply_some(&mut self, budget: usize, cancel: &Cancel) -> Result<usize, RestoreError> {
        let budget = budget.max(1);
        while self.step != Step::Done {
            if cancel.is_cancelled() {
                return Err(RestoreError::Cancelled);
            }
            let total = match self.step {
                Step::TreeDirs => self.plan.dirs_to_make.len(),
                Step::Deletions => self.plan.deletions.len(),
                Step::Dirs => self.plan.dirs_to_make.len(),
                Step::Trees => self.new_roots.len(),
                Step::Writes => self.plan.writes.len(),
                Step::Links => self.plan.links.len(),
                Step::FileMetadata => self.plan.file_metadata.len(),
                Step::DirModes => self.plan.dir_modes.len(),
                Step::Done => 0,
            };
            if self.cursor >= total {
                self.step = match self.step {
                    Step::TreeDirs => Step::Deletions,
                    Step::Deletions => Step::Dirs,
                    Step::Dirs => Step::Trees,
                    Step::Trees => Step::Writes,
                    Step::Writes => Step::Links,
                    Step::Links => Step::FileMetadata,
                    Step::FileMetadata => Step::DirModes,
                    Step::DirModes | Step::Done => Step::Done,
                };
                self.cursor = 0;
                continue;
            }
            let range = self.cursor..(self.cursor + budget).min(total);
            let count = match self.step {
                Step::TreeDirs => self.make_tree_dirs(range.clone())?,
                Step::Deletions => self.delete(range.clone())?,
                Step::Dirs => self.make_dirs(range.clone())?,
                Step::Trees => self.move_trees(range.clone())?,
                Step::Writes => self.parallel(range.clone(), Restore::rename_write)?,
                Step::Links => self.make_links(range.clone())?,
                Step::FileMetadata => self.set_file_metadata(range.clone())?,
                Step::DirModes => self.set_dir_modes(range.clone())?,
                Step::Done => 0,
            };
            self.cursor = range.end;
            return Ok(count);
        }
        Ok(0)
    }

    /// Flat writes of `range`, renamed in on a few threads; returns how many.
    fn parallel(
        &self,
        range: std::ops::Range<usize>,
        op: fn(&Restore, &mut DirStack<'_>, usize) -> Result<(), RestoreError>,
    ) -> Result<usize, RestoreError> {
        let indexes: Vec<usize> = range.filter(|&i| self.dests[i] == Dest::Flat).collect();
        // Contiguous chunks keep each thread's paths together (shared parents).
        let chunk = indexes.len().div_ceil(self.threads).max(1);
        std::thread::scope(|scope| {
            let handles: Vec<_> = indexes
                .chunks(chunk)
                .map(|part| {
                    scope.spawn(move || {
                        let mut dirs = DirStack::new(&self.ws);
                        for &i in part {
                            op(self, &mut dirs, i)?;
                        }
                        Ok(())
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or(Err(RestoreError::Cancelled)))
                .collect::<Result<Vec<()>, RestoreError>>()
                .map(drop)
        })?;
        Ok(indexes.len())
    }

    fn skip(&self, path: Vec<u8>) {
        let mut skipped = self.skipped.lock().unwrap_or_else(|e| e.into_inner());
        if !skipped.contains(&path) {
            skipped.push(path);
        }
    }

    fn delete(&self, range: std::ops::Range<usize>) -> Result<usize, RestoreError> {
        let count = range.len();
        let mut dirs = DirStack::new(&self.ws);
        for (path, kind) in &self.plan.deletions[range] {
            let (parent, name) = split_parent(path);
            let parent_fd = match dirs.reach(parent, false)? {
                Reached::Dir(fd) => fd,
                Reached::Absent => continue,
                Reached::OtherDevice(at) => {
                    self.skip(at);
                    continue;
                }
            };
            let cname = cname(name)?;
            match kind {
                Doomed::Dir => match fs::rmdir_at(parent_fd, &cname) {
                    Ok(()) => dirs.forget(),
                    // Holds excluded paths (or is a mount point): it stays.
                    Err(e)
                        if is_errno(
                            &e,
                            &[libc::ENOENT, libc::ENOTEMPTY, libc::EEXIST, libc::ENOTDIR],
                        ) => {}
                    Err(e) if is_errno(&e, &[libc::EBUSY]) => self.skip(path.clone()),
                    Err(e) => return Err(RestoreError::raced(self.ws.shown(path), "rmdir", e)),
                },
                Doomed::Leaf => match fs::unlink_at(parent_fd, &cname) {
                    Ok(()) => {}
                    Err(e)
                        if is_errno(
                            &e,
                            &[libc::ENOENT, libc::EISDIR, libc::ENOTDIR, libc::EPERM],
                        ) => {}
                    // A file mounted there since the scan: it stays.
                    Err(e) if is_errno(&e, &[libc::EBUSY]) => self.skip(path.clone()),
                    Err(e) => return Err(RestoreError::raced(self.ws.shown(path), "unlink", e)),
                },
                Doomed::Unsupported => {
                    let mut skipped = Vec::new();
                    remove_tree(&self.ws, parent_fd, &cname, path, &mut skipped)?;
                    for s in skipped {
                        self.skip(s);
                    }
                    dirs.forget();
                }
            }
        }
        Ok(count)
    }

    fn make_dirs(&self, range: std::ops::Range<usize>) -> Result<usize, RestoreError> {
        let mut dirs = DirStack::new(&self.ws);
        let mut count = 0;
        for path in &self.plan.dirs_to_make[range] {
            if self.tree_dirs.contains(path) {
                continue; // moves in with its new root
            }
            count += 1;
            if let Reached::OtherDevice(at) = dirs.reach(path.as_bytes(), true)? {
                self.skip(at);
            }
        }
        Ok(count)
    }

    /// Move each new root in from staging's tree with one rename; the files
    /// in it keep the stat they were written with (a directory rename changes
    /// only the directory's ctime), which is what the stat cache learns.
    fn move_trees(&self, range: std::ops::Range<usize>) -> Result<usize, RestoreError> {
        let prefix = self.tree_prefix();
        let mut staged_dirs = DirStack::beneath(&self.ws, self.tree.as_raw_fd(), &prefix);
        let mut dirs = DirStack::new(&self.ws);
        let mut moved_files = 0;
        for root in &self.new_roots[range] {
            let path = root.as_bytes();
            let (parent, leaf) = split_parent(path);
            let leaf = cname(leaf)?;
            let from = match staged_dirs.reach(parent, false)? {
                Reached::Dir(fd) => fd,
                _ => {
                    return Err(RestoreError::io(
                        self.ws.shown(path),
                        "restore",
                        io::Error::other("its staged directory vanished"),
                    ))
                }
            };
            let Some((to, _)) = self.reach_parent(&mut dirs, path)? else {
                continue;
            };
            let whole = self.move_dir(from, to, &leaf, path)?;
            let files = self.tree_writes_under(root);
            moved_files += files.len();
            self.count_written(files.iter().map(|&i| self.plan.writes[i].size));
            if whole {
                let prepared = self.prepared.lock().unwrap_or_else(|e| e.into_inner());
                let mut recorded = self.recorded.lock().unwrap_or_else(|e| e.into_inner());
                for index in files {
                    if let Some(written) = prepared.get(&index).filter(|w| w.verified) {
                        let entry = &self.plan.writes[index];
                        if entry.secrets {
                            continue;
                        }
                        recorded.push((
                            entry.path.clone(),
                            CacheEntry::new(&written.stat, entry.hash),
                        ));
                    }
                }
            }
        }
        Ok(moved_files)
    }

    /// The tree-staged writes beneath `root` (a contiguous run of the sorted writes).
    fn tree_writes_under(&self, root: &str) -> Vec<usize> {
        let mut prefix = root.as_bytes().to_vec();
        prefix.push(b'/');
        let writes = &self.plan.writes;
        let start = writes.partition_point(|w| w.path.as_bytes() < prefix.as_slice());
        (start..writes.len())
            .take_while(|&i| writes[i].path.as_bytes().starts_with(&prefix))
            .filter(|&i| self.dests[i] == Dest::Tree)
            .collect()
    }

    /// Rename staged directory `leaf` (in `from`) to `leaf` in `to`. Returns
    /// true when it moved in whole; when a directory appeared there since the
    /// plan, its content is merged entry by entry (those files are not
    /// recorded: the next capture hashes them); a non-directory standing
    /// there is unlinked first.
    fn move_dir(
        &self,
        from: RawFd,
        to: RawFd,
        leaf: &CStr,
        path: &[u8],
    ) -> Result<bool, RestoreError> {
        match fs::rename_at(from, leaf, to, leaf) {
            Ok(()) => return Ok(true),
            Err(e) if is_errno(&e, &[libc::ENOTDIR]) => {
                if fs::is_mount_root_at(to, leaf).ok().flatten() == Some(true) {
                    // A file mounted there: left alone, and what goes beneath it.
                    self.skip(path.to_vec());
                    return Ok(false);
                }
                // A file or symlink stands there: the link itself goes, never its target.
                let _ = fs::unlink_at(to, leaf);
                fs::rename_at(from, leaf, to, leaf)
                    .map_err(|e| RestoreError::raced(self.ws.shown(path), "rename into", e))?;
                return Ok(true);
            }
            // EBUSY: a mount point stands there (judged below, and skipped).
            Err(e) if is_errno(&e, &[libc::ENOTEMPTY, libc::EEXIST, libc::EBUSY]) => {}
            Err(e) => return Err(RestoreError::raced(self.ws.shown(path), "rename into", e)),
        }
        let source = fs::open_dir_at(from, leaf)
            .map_err(|e| RestoreError::raced(self.ws.shown(path), "open", e))?;
        let target = fs::open_dir_at(to, leaf)
            .map_err(|e| RestoreError::raced(self.ws.shown(path), "open", e))?;
        let stat = fs::fstat(target.as_raw_fd())
            .map_err(|e| RestoreError::raced(self.ws.shown(path), "fstat", e))?;
        if fs::is_mount_point_fd(target.as_raw_fd(), &stat, self.ws.dev) {
            self.skip(path.to_vec());
            return Ok(false);
        }
        let listing = source
            .try_clone()
            .map_err(|e| RestoreError::raced(self.ws.shown(path), "dup", e))?;
        let mut reader = fs::DirReader::new(listing)
            .map_err(|e| RestoreError::raced(self.ws.shown(path), "list", e))?;
        let mut children: Vec<(CString, fs::DirentType)> = Vec::new();
        while let Some((name, kind)) = reader
            .next_entry()
            .map_err(|e| RestoreError::raced(self.ws.shown(path), "list", e))?
        {
            children.push((name.to_owned(), kind));
        }
        drop(reader);
        for (child, kind) in children {
            let mut child_path = path.to_vec();
            child_path.push(b'/');
            child_path.extend_from_slice(child.to_bytes());
            if kind == fs::DirentType::Dir {
                self.move_dir(source.as_raw_fd(), target.as_raw_fd(), &child, &child_path)?;
            } else {
                self.rename_from(
                    source.as_raw_fd(),
                    &child,
                    target.as_raw_fd(),
                    &child,
                    &child_path,
                )?;
            }
        }
        Ok(false)
    }

    /// Rename one prepared flat file into place and record the inode it put there.
    fn rename_write(&self, dirs: &mut DirStack<'_>, index: usize) -> Result<(), RestoreError> {
        let entry = &self.plan.writes[index];
        let written = self
            .prepared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&index)
            .copied();
        let Some(written) = written else {
            return Err(RestoreError::io(
                self.ws.shown(entry.path.as_bytes()),
                "restore",
                io::Error::new(io::ErrorKind::NotFound, "its blob was never staged"),
            ));
        };
        let path = entry.path.as_bytes();
        let Some((parent_fd, leaf)) = self.reach_parent(dirs, path)? else {
            return Ok(());
        };
        if !self.rename_in(parent_fd, &flat_name(index), &leaf, path)? {
            return Ok(());
        }
        self.count_written([entry.size]);
        if self.record && !entry.secrets {
            if let Some(stat) = self.read_back(parent_fd, &leaf, entry, &written.stat) {
                self.recorded
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((entry.path.clone(), CacheEntry::new(&stat, entry.hash)));
            }
        }
        Ok(())
    }

    /// The stat the cache may learn of the file `leaf` in `parent_fd` just
    /// renamed in: opened again, its `fstat` (the rename moved its ctime) when
    /// it is the inode staged (`ours`: same dev, ino, size, mtime and mode)
    /// and, read back through that fd after the `fstat`, holds the blob.
    /// None otherwise, or when it cannot be opened to be read (the next
    /// capture hashes it).
    fn read_back(
        &self,
        parent_fd: RawFd,
        leaf: &CStr,
        entry: &TargetFile,
        ours: &Stat,
    ) -> Option<Stat> {
        let fd = fs::open_leaf_at(parent_fd, leaf, libc::O_RDONLY).ok()?;
        let now = fs::fstat(fd.as_raw_fd()).ok()?;
        let same = now.is_file()
            && (now.dev, now.ino, now.size, now.mtime_ns, now.mode)
                == (ours.dev, ours.ino, ours.size, ours.mtime_ns, ours.mode);
        (same && hash::file_holds(fd.as_raw_fd(), entry.size, &entry.hash, None).ok()?)
            .then_some(now)
    }

    /// The parent directory of `path` (created as needed) and the leaf name;
    /// None when it lies on another device (reported, left alone).
    fn reach_parent(
        &self,
        dirs: &mut DirStack<'_>,
        path: &[u8],
    ) -> Result<Option<(RawFd, CString)>, RestoreError> {
        let (parent, name) = split_parent(path);
        match dirs.reach(parent, true)? {
            Reached::Dir(fd) => Ok(Some((fd, cname(name)?))),
            Reached::Absent => Err(RestoreError::io(
                self.ws.shown(parent),
                "create",
                io::Error::from_raw_os_error(libc::ENOENT),
            )),
            Reached::OtherDevice(at) => {
                self.skip(at);
                Ok(None)
            }
        }
    }

    /// Atomically move staged `name` to `leaf` in `parent_fd`; a directory
    /// standing there is removed first (rename cannot replace it with a file).
    /// False when a mount point stands there: it is left alone (reported).
    fn rename_in(
        &self,
        parent_fd: RawFd,
        name: &CStr,
        leaf: &CStr,
        path: &[u8],
    ) -> Result<bool, RestoreError> {
        self.rename_from(self.staging.as_raw_fd(), name, parent_fd, leaf, path)
    }

    fn rename_from(
        &self,
        from: RawFd,
        name: &CStr,
        parent_fd: RawFd,
        leaf: &CStr,
        path: &[u8],
    ) -> Result<bool, RestoreError> {
        let refused = match fs::rename_at(from, name, parent_fd, leaf) {
            Ok(()) => return Ok(true),
            Err(e) => e,
        };
        let mount_point = || fs::is_mount_root_at(parent_fd, leaf).ok().flatten() == Some(true);
        if is_errno(&refused, &[libc::EBUSY, libc::EISDIR]) && mount_point() {
            self.skip(path.to_vec());
            return Ok(false);
        }
        if !is_errno(&refused, &[libc::EISDIR, libc::ENOTEMPTY, libc::EEXIST]) {
            return Err(RestoreError::raced(
                self.ws.shown(path),
                "rename into",
                refused,
            ));
        }
        let mut skipped = Vec::new();
        remove_tree(&self.ws, parent_fd, leaf, path, &mut skipped)?;
        let kept = !skipped.is_empty();
        for s in skipped {
            self.skip(s);
        }
        match fs::rename_at(from, name, parent_fd, leaf) {
            Ok(()) => Ok(true),
            // A mount point beneath it kept the directory: it stays.
            Err(e) if kept && is_errno(&e, &[libc::EISDIR, libc::ENOTEMPTY, libc::EEXIST]) => {
                Ok(false)
            }
            Err(e) => Err(RestoreError::raced(self.ws.shown(path), "rename into", e)),
        }
    }

    fn make_links(&self, range: std::ops::Range<usize>) -> Result<usize, RestoreError> {
        let count = range.len();
        let mut dirs = DirStack::new(&self.ws);
        for index in range {
            let (path, target) = &self.plan.links[index];
            let name = CString::new(format!("l-{index}")).expect("no NUL");
            let target_c = cname(target.as_bytes())?;
            fs::symlink_at(&target_c, self.staging.as_raw_fd(), &name)
                .map_err(|e| RestoreError::io(self.shown_staging(&name), "symlink", e))?;
            let Some((parent_fd, leaf)) = self.reach_parent(&mut dirs, path.as_bytes())? else {
                continue;
            };
            if self.rename_in(parent_fd, &name, &leaf, path.as_bytes())? {
                self.count_written([0]);
            }
        }
        Ok(count)
    }

    /// Mode and mtime of files whose bytes are right, in place: only through
    /// an fd of a regular file with one link (the plan replaced shared ones;
    /// one that became shared since is left alone).
    fn set_file_metadata(&self, range: std::ops::Range<usize>) -> Result<usize, RestoreError> {
        let count = range.len();
        let mut dirs = DirStack::new(&self.ws);
        for entry in &self.plan.file_metadata[range] {
            let (parent, name) = split_parent(entry.path.as_bytes());
            let parent_fd = match dirs.reach(parent, false)? {
                Reached::Dir(fd) => fd,
                Reached::Absent => continue,
                Reached::OtherDevice(at) => {
                    self.skip(at);
                    continue;
                }
            };
            let leaf = cname(name)?;
            let shown = || self.ws.shown(entry.path.as_bytes());
            let (fd, by_path) = match fs::open_leaf_at(parent_fd, &leaf, libc::O_RDONLY) {
                Ok(fd) => (fd, false),
                // Unreadable for us (mode 0200 as a non-root user): an O_PATH
                // fd needs no permission, and /proc/self/fd/N names exactly it.
                Err(e) if is_errno(&e, &[libc::EACCES]) => {
                    match fs::open_leaf_at(parent_fd, &leaf, libc::O_PATH) {
                        Ok(fd) => (fd, true),
                        Err(_) => continue,
                    }
                }
                Err(e)
                    if is_errno(&e, &[libc::ENOENT, libc::ELOOP, libc::ENOTDIR, libc::ENXIO]) =>
                {
                    continue
                }
                Err(e) => return Err(RestoreError::raced(shown(), "open", e)),
            };
            let (stat, links) = fs::fstat_links(fd.as_raw_fd())
                .map_err(|e| RestoreError::raced(shown(), "fstat", e))?;
            if !stat.is_file() || links != 1 || stat.dev != self.ws.dev {
                continue;
            }
            if fs::is_mount_point_fd(fd.as_raw_fd(), &stat, self.ws.dev) {
                // A file mounted there since the scan: its inode is not ours.
                self.skip(entry.path.as_bytes().to_vec());
                continue;
            }
            let mode = entry.mode & 0o777;
            if by_path {
                let proc =
                    CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).expect("no NUL");
                chmod_and_mtime_by_proc(&proc, mode, entry.mtime_ns)
                    .map_err(|e| RestoreError::raced(shown(), "chmod", e))?;
            } else {
                fs::fchmod(fd.as_raw_fd(), mode)
                    .map_err(|e| RestoreError::raced(shown(), "chmod", e))?;
                fs::set_mtime(fd.as_raw_fd(), entry.mtime_ns)
                    .map_err(|e| RestoreError::raced(shown(), "set the mtime of", e))?;
            }
        }
        Ok(count)
    }

    fn set_dir_modes(&self, range: std::ops::Range<usize>) -> Result<usize, RestoreError> {
        let count = range.len();
        let mut dirs = DirStack::new(&self.ws);
        for (path, mode) in &self.plan.dir_modes[range] {
            let fd = match dirs.reach(path.as_bytes(), false)? {
                Reached::Dir(fd) => fd,
                Reached::Absent => continue,
                Reached::OtherDevice(at) => {
                    self.skip(at);
                    continue;
                }
            };
            fs::fchmod(fd, mode & 0o777)
                .map_err(|e| RestoreError::raced(self.ws.shown(path.as_bytes()), "chmod", e))?;
        }
        Ok(count)
    }

    /// After apply: make the restored data durable (one `syncfs` of the
    /// workspace's filesystem), then record what was written in the stat
    /// cache at `cache_path` (if any), with a reference time read on the
    /// workspace's filesystem.
    pub fn finish(
        &self,
        cache_path: Option<&Path>,
        fingerprint: [u8; 32],
    ) -> Result<(), RestoreError> {
        drop(
            self.writeback
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take(),
        );
        fs::syncfs(self.ws.fd.as_raw_fd())
            .map_err(|e| RestoreError::io(self.ws.shown(b""), "sync", e))?;
        let Some(cache_path) = cache_path else {
            return Ok(());
        };
        let reference_ns = self.filesystem_now()?;
        let updates = std::mem::take(&mut *self.recorded.lock().unwrap_or_else(|e| e.into_inner()));
        if let Some(parent) = cache_path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| RestoreError::io(parent.to_string_lossy(), "create", e))?;
        }
        let kept = self
            .kept_cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        match kept {
            Some(kept) => kept.save_with_written(cache_path, fingerprint, reference_ns, updates),
            // (A live scan without a cache path kept none: merged into the file.)
            None => statcache::record_written(cache_path, fingerprint, reference_ns, updates),
        }
        .map_err(|e| RestoreError::io(cache_path.to_string_lossy(), "save stat cache", e))
    }

    /// The workspace filesystem's clock: the mtime of a new file in staging.
    fn filesystem_now(&self) -> Result<i64, RestoreError> {
        let name = c"tick";
        let fd = fs::create_file_at(self.staging.as_raw_fd(), name)
            .map_err(|e| RestoreError::io(self.shown_staging(name), "create", e))?;
        let stat = fs::fstat(fd.as_raw_fd())
            .map_err(|e| RestoreError::io(self.shown_staging(name), "fstat", e))?;
        drop(fd);
        let _ = fs::unlink_at(self.staging.as_raw_fd(), name);
        Ok(stat.mtime_ns)
    }

    /// Paths left alone because they lie on another device (mount points).
    pub fn skipped(&self) -> Vec<Vec<u8>> {
        let mut skipped = self
            .skipped
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        skipped.sort();
        skipped
    }

    fn count_written(&self, sizes: impl IntoIterator<Item = u64>) {
        let (mut files, mut bytes) = (0, 0);
        for size in sizes {
            files += 1;
            bytes += size;
        }
        self.files_written.fetch_add(files, Ordering::Relaxed);
        self.bytes_written.fetch_add(bytes, Ordering::Relaxed);
    }

    /// (files and symlinks, bytes) written into the workspace so far.
    pub fn written(&self) -> (u64, u64) {
        (
            self.files_written.load(Ordering::Relaxed),
            self.bytes_written.load(Ordering::Relaxed),
        )
    }

    /// How many files the stat cache will learn.
    pub fn recorded_count(&self) -> usize {
        self.recorded.lock().map(|r| r.len()).unwrap_or(0)
    }

    /// Remove the staging directory (whether the restore succeeded or not).
    pub fn remove_staging(&self) -> Result<(), RestoreError> {
        let mut skipped = Vec::new();
        remove_tree(
            &self.ws,
            self.ws.fd.as_raw_fd(),
            &self.staging_name,
            self.staging_name.to_bytes(),
            &mut skipped,
        )
    }
}

fn chmod_and_mtime_by_proc(proc: &CStr, mode: u32, mtime_ns: i64) -> io::Result<()> {
    // SAFETY: valid C string; /proc/self/fd/N names exactly our O_PATH fd's inode.
    if unsafe { libc::fchmodat(libc::AT_FDCWD, proc.as_ptr(), mode as libc::mode_t, 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let times = [
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        libc::timespec {
            tv_sec: mtime_ns.div_euclid(1_000_000_000) as libc::time_t,
            tv_nsec: mtime_ns.rem_euclid(1_000_000_000) as libc::c_long,
        },
    ];
    // SAFETY: valid C string and a two-element timespec array.
    if unsafe { libc::utimensat(libc::AT_FDCWD, proc.as_ptr(), times.as_ptr(), 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// One (large) blob being written into staging, to every file that uses
/// it, hashing as it goes; `finish` checks size and hash.
pub struct StagedWriter {
    uses: Vec<(usize, OwnedFd)>,
    hash: [u8; 32],
    size: u64,
    written: u64,
    hasher: blake3::Hasher,
    /// A block of zeros was left a hole (the files' length is set at the end).
    holes: bool,
}

/// Write `data` at `offset` of a staged file, leaving its blocks of zeros
/// holes (`fs::write_sparse_at`): a sparse file is restored sparse. With
/// `len` (the file's whole length: `data` is its last bytes), the length
/// is set when the last blocks were left out. Returns whether any was.
fn write_sparse(fd: &OwnedFd, offset: u64, data: &[u8], len: Option<u64>) -> io::Result<bool> {
    let holes = fs::write_sparse_at(fd.as_raw_fd(), offset, data)?;
    if let (true, Some(len)) = (holes, len) {
        fs::set_len(fd.as_raw_fd(), len)?;
    }
    Ok(holes)
}

impl StagedWriter {
    /// Append a chunk. InvalidBlob as soon as it is longer than recorded (a
    /// hostile or corrupt blob must not fill the disk).
    pub fn write(&mut self, restore: &Restore, chunk: &[u8]) -> Result<(), RestoreError> {
        self.written += chunk.len() as u64;
        if self.written > self.size {
            return Err(RestoreError::InvalidBlob {
                hash: self.hash,
                reason: format!("longer than the {} bytes the checkpoint records", self.size),
            });
        }
        self.hasher.update(chunk);
        let offset = self.written - chunk.len() as u64;
        for (index, fd) in &self.uses {
            self.holes |= write_sparse(fd, offset, chunk, None)
                .map_err(|e| RestoreError::io(restore.shown_prepared(*index), "write", e))?;
        }
        Ok(())
    }

    /// Check size and hash, then give each file its entry's mode and mtime.
    pub fn finish(mut self, restore: &Restore) -> Result<(), RestoreError> {
        if self.written != self.size {
            return Err(RestoreError::InvalidBlob {
                hash: self.hash,
                reason: format!(
                    "{} bytes where the checkpoint records {}",
                    self.written, self.size
                ),
            });
        }
        let digest = std::mem::take(&mut self.hasher).finalize();
        if digest.as_bytes() != &self.hash {
            return Err(RestoreError::InvalidBlob {
                hash: self.hash,
                reason: "its BLAKE3 hash does not match its key".into(),
            });
        }
        for (index, fd) in &self.uses {
            if self.holes {
                // The last blocks may have been left out: the file's length.
                fs::set_len(fd.as_raw_fd(), self.size)
                    .map_err(|e| RestoreError::io(restore.shown_prepared(*index), "write", e))?;
            }
            restore.finish_use(*index, fd, None)?;
        }
        Ok(())
    }
}

/// One ranged read of a pack, staged as its bytes arrive: each frame is
/// decoded, verified and written once it is complete, so memory holds one
/// chunk and at most one partial frame, never the whole range.
pub struct RangeStager {
    /// The frames wanted, by offset (gaps between them are read and skipped).
    entries: Vec<pack::Entry>,
    /// The next frame to stage.
    next: usize,
    /// Bytes received but not yet consumed, starting at pack offset `at`.
    pending: Vec<u8>,
    at: u64,
}

impl RangeStager {
    /// A read starting at the first entry's offset (after sorting by offset).
    pub fn new(mut entries: Vec<pack::Entry>) -> RangeStager {
        entries.sort_by_key(|e| e.offset);
        let at = entries.first().map_or(0, |e| e.offset);
        RangeStager {
            entries,
            next: 0,
            pending: Vec::new(),
            at,
        }
    }

    /// The next bytes of the range. Returns (blobs, bytes) staged by this
    /// chunk; InvalidBlob for a frame that does not decode to its key.
    pub fn feed(
        &mut self,
        restore: &Restore,
        chunk: &[u8],
        cancel: &Cancel,
    ) -> Result<(u64, u64), RestoreError> {
        // Consume straight from the chunk when nothing is pending (no copy).
        let mut held = std::mem::take(&mut self.pending);
        let data: &[u8] = if held.is_empty() {
            chunk
        } else {
            held.extend_from_slice(chunk);
            &held
        };
        let end = self.at + data.len() as u64;
        let first = self.next;
        while self.next < self.entries.len() {
            let e = &self.entries[self.next];
            if e.offset + u64::from(e.stored_len) > end {
                break;
            }
            self.next += 1;
        }
        let staged =
            restore.stage_frames(self.at, data, &self.entries[first..self.next], cancel)?;
        // Keep only what the next frame needs (gaps and staged frames go).
        let keep_from = match self.entries.get(self.next) {
            Some(e) => e.offset.clamp(self.at, end),
            None => end,
        };
        let skip = (keep_from - self.at) as usize;
        self.pending = if held.is_empty() {
            chunk[skip..].to_vec()
        } else {
            held.drain(..skip);
            held
        };
        self.at = keep_from;
        Ok(staged)
    }

    /// The range ended: InvalidBlob naming the first frame it did not hold
    /// whole (the pack is shorter than its index says).
    pub fn finish(self) -> Result<(), RestoreError> {
        match self.entries.get(self.next) {
            None => Ok(()),
            Some(e) => Err(RestoreError::InvalidBlob {
                hash: e.digest,
                reason: format!(
                    "the pack holds {} of its {} stored bytes (truncated)",
                    (self.at + self.pending.len() as u64)
                        .saturating_sub(e.offset)
                        .min(u64::from(e.stored_len)),
                    e.stored_len
                ),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, n: u8, size: u64) -> ManifestRow {
        ManifestRow::File {
            path: path.into(),
            hash: [n; 32],
            size,
            mode: 0o644,
            mtime_ns: 1,
            secrets: false,
        }
    }

    #[test]
    fn plan_diffs_target_against_live() {
        let target = vec![
            file("b", 2, 2),
            ManifestRow::Dir {
                path: "d".into(),
                mode: 0o755,
            },
            file("a", 1, 1),
            file("d/same", 3, 3),
            ManifestRow::Symlink {
                path: "l".into(),
                target: "a".into(),
            },
        ];
        let live = vec![
            file("a", 9, 1),
            ManifestRow::Dir {
                path: "d".into(),
                mode: 0o700,
            },
            file("d/same", 3, 3),
            file("d/gone", 4, 4),
            ManifestRow::Dir {
                path: "x".into(),
                mode: 0o755,
            },
        ];
        let unsupported = vec![(b"fifo".to_vec(), Unsupported::Fifo)];
        let plan = plan(target, live, &unsupported).unwrap();
        let names: Vec<&str> = plan.writes.iter().map(|w| w.path.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(
            plan.deletions,
            vec![
                (b"x".to_vec(), Doomed::Dir),
                (b"fifo".to_vec(), Doomed::Unsupported),
                (b"d/gone".to_vec(), Doomed::Leaf)
            ]
        );
        assert_eq!(plan.dir_modes, vec![("d".to_string(), 0o755)]);
        assert!(plan.dirs_to_make.is_empty() && plan.file_metadata.is_empty());
        assert_eq!(plan.links.len(), 1);
        assert_eq!(plan.blobs, vec![([1; 32], 1), ([2; 32], 2)]);
    }

    fn encode(rows: &[ManifestRow]) -> Vec<u8> {
        let mut w = manifest::ManifestWriter::with_capacity(0);
        for row in rows {
            match row {
                ManifestRow::File {
                    path,
                    hash,
                    size,
                    mode,
                    mtime_ns,
                    ..
                } => w.file(path.as_str(), hash, *size, *mode, *mtime_ns),
                ManifestRow::Dir { path, mode } => w.dir(path.as_str(), *mode),
                ManifestRow::Symlink { path, target } => w.symlink(path.as_str(), target),
            }
        }
        w.finish()
    }

    fn summary(plan: &Plan) -> String {
        format!(
            "{:?} {:?} {:?} {:?} {:?} {:?} {:?}",
            plan.deletions,
            plan.dirs_to_make,
            plan.writes,
            plan.links,
            plan.file_metadata,
            plan.dir_modes,
            plan.blobs
        )
    }

    #[test]
    fn plan_of_the_encoded_rows_equals_the_plan_of_every_row() {
        let dir = |path: &str, mode| ManifestRow::Dir {
            path: path.into(),
            mode,
        };
        let link = |path: &str, target: &str| ManifestRow::Symlink {
            path: path.into(),
            target: target.into(),
        };
        let mut mode_only = file("m", 5, 5);
        if let ManifestRow::File { mode, .. } = &mut mode_only {
            *mode = 0o755;
        }
        let target = vec![
            dir("a", 0o755),
            file("a/same", 1, 1),
            file("a/edited", 2, 4),
            file("became-dir", 3, 3),
            dir("d", 0o700),
            file("d/x", 4, 4),
            link("l", "a/same"),
            mode_only,
            file("new", 6, 6),
            file("q\"uote", 7, 7),
        ];
        let live = vec![
            dir("a", 0o755),
            file("a/edited", 9, 4), // same size, other bytes
            file("a/gone", 8, 8),
            file("a/same", 1, 1),
            dir("became-dir", 0o755),
            file("became-dir/inner", 3, 3),
            dir("d", 0o755), // mode only
            file("d/x", 4, 4),
            link("l", "elsewhere"),
            file("m", 5, 5),
            file("q\"uote", 7, 7),
        ];
        let unsupported = vec![(b"fifo".to_vec(), Unsupported::Fifo)];
        let (t, l) = (encode(&target), encode(&live));
        let whole = plan(target.clone(), live.clone(), &unsupported).unwrap();
        let encoded = plan_encoded(Target::read(&t, 255).unwrap(), &l, &unsupported).unwrap();
        assert_eq!(summary(&encoded), summary(&whole));
        let written: Vec<&str> = encoded.writes.iter().map(|w| w.path.as_str()).collect();
        assert_eq!(written, ["a/edited", "became-dir", "new"]);
        assert_eq!(encoded.file_metadata.len(), 1);
        assert_eq!(encoded.dir_modes, vec![("d".to_string(), 0o700)]);
        // A target in another order is planned the same.
        let mut shuffled = target.clone();
        shuffled.reverse();
        let encoded = plan_encoded(
            Target::read(&encode(&shuffled), 255).unwrap(),
            &l,
            &unsupported,
        )
        .unwrap();
        assert_eq!(summary(&encoded), summary(&whole));
        // Nothing differs: nothing to do.
        let same = plan_encoded(Target::read(&t, 255).unwrap(), &t, &[]).unwrap();
        assert_eq!(same.operations(), 0);
    }

    #[test]
    fn the_encoded_target_is_refused_as_the_decoded_one() {
        let reserved = encode(&[file(".checkpointd-x/a", 1, 1)]);
        assert!(matches!(
            Target::read(&reserved, 255),
            Err(RestoreError::InvalidPath { .. })
        ));
        // Escaped in the JSON, refused all the same.
        let escaped = br#"[["f","\u002echeckpointd",""#.to_vec();
        let mut escaped = escaped;
        escaped.extend_from_slice(hash::to_hex(&[1; 32]).as_bytes());
        escaped.extend_from_slice(br#"",1,420,1]]"#);
        assert!(matches!(
            Target::read(&escaped, 255),
            Err(RestoreError::InvalidPath { .. })
        ));
        let long = encode(&[file(&"n".repeat(20), 1, 1)]);
        assert!(matches!(
            Target::read(&long, 16),
            Err(RestoreError::NameTooLong { limit: 16, .. })
        ));
        // Not the compact encoding: read by the general decoder, same rules.
        assert!(matches!(
            Target::read(b"[ ]", 255),
            Ok(Target::Decoded(rows)) if rows.is_empty()
        ));
    }

    /// What no capture makes: a path deeper or longer than the walk takes.
    #[test]
    fn a_target_path_beyond_the_walks_limits_is_refused() {
        let deepest = vec!["d"; MAX_DEPTH].join("/");
        assert!(Target::read(&encode(&[file(&deepest, 1, 1)]), 255).is_ok());
        let refused = |path: &str| match Target::read(&encode(&[file(path, 1, 1)]), 255) {
            Err(RestoreError::InvalidPath { reason, .. }) => reason,
            other => panic!("{path:.40}: {:?}", other.map(|_| ())),
        };
        let deeper = format!("{deepest}/d");
        assert_eq!(
            refused(&deeper),
            format!("deeper than {MAX_DEPTH} directories")
        );
        let longest = vec!["n".repeat(200); 20].join("/") + "/" + &"n".repeat(75);
        assert_eq!(longest.len(), MAX_PATH_BYTES);
        assert!(Target::read(&encode(&[file(&longest, 1, 1)]), 255).is_ok());
        let longer = format!("{longest}n");
        assert_eq!(
            refused(&longer),
            format!("longer than {MAX_PATH_BYTES} bytes")
        );
    }

    #[test]
    fn one_blob_with_two_sizes_is_invalid() {
        let target = vec![file("a", 1, 1), file("b", 1, 2)];
        assert!(matches!(
            plan(target, vec![], &[]),
            Err(RestoreError::InvalidBlob { .. })
        ));
    }
}
