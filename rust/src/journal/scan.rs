//! A capture's scan directed by the change journal: only what the journal
//! names is examined, and every other row is the parent manifest's.
//!
//! For each directory the journal names (a *start*) the walk looks at the
//! named entries only (`lstat` beneath the directory's fd, as the full walk
//! does, with the same policy and classification: it is the same walk, told
//! what to look at through `walk::Direction`), or lists the directory whole
//! when the journal kept no names for it. A subdirectory that appeared
//! (created or moved in), or that the parent manifest does not hold as a
//! directory, is walked whole. Files the stat cache cannot vouch for are
//! hashed as in a full scan (`scan::hash_slot`: the feed, chunking, secrets).
//!
//! The new manifest is the parent's bytes with each changed row put in its
//! place (`splice`): the parent is never decoded, and rows whose bytes did
//! not change are left as they are, so a capture whose changes cancel out
//! (a file written back as it was) keeps the parent's manifest.
//!
//! Whatever cannot be done consistently (the parent holds no directory the
//! journal names, two changes overlap because the tree moved under the
//! walk) gives up with a reason: the capture then scans everything.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::os::fd::AsRawFd;

use rayon::prelude::*;

use super::digests::{digests_after, Known};
use super::dirty::{join, split, DirChanges, Dirty};
use super::splice::{self, Edit, Parent};
use super::tree;
use crate::chunking::{Chunking, Sinks};
use crate::error::ScanError;
use crate::fs;
use crate::manifest::{file_row, ManifestWriter};
use crate::policy::PolicyMatcher;
use crate::redact::SecretSet;
use crate::scan::{
    build_pool, hash_slot, write_entry, HashContext, ManifestBuffer, Root, ScanOutput, ScanRequest,
};
use crate::statcache::{secrets_fingerprint, Listing, LoadedCache};
use crate::walk::{Batch, Direction, Kind, ScanProgress, Walker};

/// What a directed scan needs beyond a scan's request.
pub struct Request<'a> {
    pub scan: &'a ScanRequest,
    /// The parent manifest: the one the journal's changes are relative to.
    pub parent: &'a [u8],
    /// Its (entries, files, file bytes).
    pub parent_totals: (u64, u64, u64),
    pub dirty: &'a Dirty,
    /// Inodes of the hard-linked files whose names the journal knows.
    pub linked: &'a std::collections::HashSet<(u64, u64)>,
    /// The parent manifest's blob digests and their counts (see
    /// `manifest::Counted`), when known: the new manifest's are then worked
    /// out from the changes, else read from every row.
    pub parent_digests: Option<Known<'a>>,
}

/// A delta in the store's encoding and the rows it inserts.
pub type Delta = (Vec<u8>, usize);

/// What a directed scan did.
#[derive(Debug)]
pub enum Outcome {
    /// The manifest is written (or, `same`, is the parent's).
    Done {
        out: Box<ScanOutput>,
        same: bool,
        /// Entries stat'ed plus directories listed.
        examined: u64,
        /// The store's delta from the parent to the new manifest and the rows
        /// it inserts (`splice::delta`), when a new manifest was written.
        delta: Option<Delta>,
    },
    /// The changes cannot be applied consistently: scan everything, for this reason.
    Fallback(String),
}

/// Which directories the walk starts from and what it looks at in each.
struct Plan<'p, 'd> {
    parent: &'p Parent<'d>,
    /// The starts' changes (only starts are keys).
    changes: BTreeMap<String, DirChanges>,
}

impl Direction for Plan<'_, '_> {
    fn names(&self, rel: &str) -> Option<Vec<u8>> {
        let names = self.changes.get(rel)?.names.as_ref()?;
        let mut listing = Listing::default();
        for name in names.iter().filter(|n| !n.is_empty()) {
            listing.push(name, libc::DT_UNKNOWN);
        }
        Some(listing.bytes)
    }

    fn enters(&self, rel: &str) -> bool {
        let (dir, name) = split(rel);
        match self.changes.get(dir) {
            // Beside a start: only what appeared, or what was no directory.
            Some(changes) => changes.is_deep(name.as_bytes()) || !self.is_dir_row(rel),
            // Inside a directory walked whole.
            None => true,
        }
    }
}

impl<'p, 'd> Plan<'p, 'd> {
    fn is_dir_row(&self, path: &str) -> bool {
        matches!(self.parent.find(path), Ok(Some((_, b'd'))))
    }

    /// The starts: every directory the journal names that is not inside a
    /// directory walked whole. One the parent does not hold as a directory,
    /// or that cannot be opened as one now (gone, or replaced), is looked at
    /// from its parent instead (as a name there; walked whole when new).
    fn new(
        parent: &'p Parent<'d>,
        dirty: &Dirty,
        root_fd: i32,
        policy: &PolicyMatcher,
    ) -> Plan<'p, 'd> {
        let mut plan = Plan {
            parent,
            changes: dirty.dirs.clone(),
        };
        loop {
            let mut moved = false;
            let dirs: Vec<String> = plan
                .changes
                .keys()
                .filter(|d| !d.is_empty())
                .cloned()
                .collect();
            for dir in dirs {
                if plan.under_deep(&dir) || policy.excluded(&dir, true) {
                    plan.changes.remove(&dir);
                    continue;
                }
                let held = plan.is_dir_row(&dir);
                if held && tree::open_dir(root_fd, &dir).is_ok() {
                    continue;
                }
                plan.changes.remove(&dir);
                let (up, name) = split(&dir);
                let changes = plan
                    .changes
                    .entry(up.to_string())
                    .or_insert_with(|| DirChanges {
                        names: Some(BTreeSet::new()),
                        ..DirChanges::default()
                    });
                if let Some(names) = &mut changes.names {
                    names.insert(name.as_bytes().into());
                }
                if !held {
                    changes.deep.insert(name.as_bytes().into());
                }
                moved = true;
            }
            if !moved {
                return plan;
            }
        }
    }

    /// Whether `dir` is inside (or is) a directory walked whole.
    fn under_deep(&self, dir: &str) -> bool {
        let mut at = dir;
        while !at.is_empty() {
            let (up, name) = split(at);
            if self
                .changes
                .get(up)
                .is_some_and(|c| c.is_deep(name.as_bytes()))
            {
                return true;
            }
            at = up;
        }
        false
    }

    fn starts(&self) -> Vec<(String, bool)> {
        // No include list here (see `scan`): every directory is included.
        self.changes.keys().map(|d| (d.clone(), true)).collect()
    }
}

/// Run a directed scan of `root` (see the module docs).
pub fn scan(
    request: &Request,
    root: Root,
    manifest: &mut dyn ManifestBuffer,
) -> Result<Outcome, ScanError> {
    let scan = request.scan;
    // (The feed stays open on a fallback: the full scan that follows feeds it.)
    let started = std::time::Instant::now();
    if let Some(reason) = refused(request) {
        return Ok(Outcome::Fallback(reason));
    }
    let parent = match Parent::new(request.parent) {
        Ok(parent) => parent,
        Err(e) => return Ok(Outcome::Fallback(format!("the parent manifest: {e}"))),
    };
    let plan = Plan::new(&parent, request.dirty, root.fd.as_raw_fd(), &scan.policy);
    let starts = plan.starts();
    if starts.is_empty() {
        manifest.keep_previous();
        return Ok(unchanged(request.parent_totals, started));
    }
    let secrets = SecretSet::new(&scan.secrets)?;
    let chunking = scan
        .chunks
        .map(|params| Chunking::new(params, scan.cache_path.as_deref()));
    let pool = build_pool(scan.threads)?;
    let own_progress = ScanProgress::default();
    let progress = scan.progress.as_deref().unwrap_or(&own_progress);
    let walked = walk(request, &root, &plan, (&starts, &pool, &secrets, progress))?;
    let walk_ms = ms(started);
    if !walked.unsupported.is_empty() {
        return Ok(refusing(walked.unsupported));
    }
    let dirs_read = walked.dirs.iter().filter(|d| !d.reused).count();
    let examined = examined(&plan, &walked.found, dirs_read);
    let mut batches = match by_directory(walked.found) {
        Ok(batches) => batches,
        Err(reason) => return Ok(Outcome::Fallback(reason)),
    };
    if let Some(path) = unknown_links(&batches, request.linked, root.fd.as_raw_fd()) {
        return Ok(Outcome::Fallback(format!(
            "{path:?} has other names the journal does not know (a hard link)"
        )));
    }
    if let Some(chunking) = &chunking {
        let mut list: Vec<Batch> = std::mem::take(&mut batches).into_values().collect();
        chunking.claim_reused(&mut list);
        batches = list.into_iter().map(|b| (b.dir.clone(), b)).collect();
    }
    let sinks = (&secrets, chunking.as_ref(), progress);
    let (hashed, bytes_hashed) = hash_changed(scan, &root, &pool, &mut batches, sinks)?;
    let hash_ms = ms(started);
    let edits = plan_edits(&plan, &parent, &batches, chunking.as_ref())?;
    let totals = totals_after(&parent, &edits, request.parent_totals)?;
    let mut out = counted(totals, (hashed, bytes_hashed), &batches, starts.len());
    let Some((same, delta)) = write(request, &parent, edits, &mut out, manifest, &pool)? else {
        return Ok(Outcome::Fallback(
            "the journal's changes overlap (the tree moved under the scan)".into(),
        ));
    };
    out.phases_ms = vec![
        ("journal_walk", walk_ms),
        ("hash", hash_ms - walk_ms),
        ("splice", ms(started) - hash_ms),
    ];
    Ok(Outcome::Done {
        out: Box::new(out),
        same,
        examined,
        delta,
    })
}

/// Why the journal cannot direct this scan at all, if it cannot.
fn refused(request: &Request) -> Option<String> {
    if let Some(reason) = &request.dirty.everything {
        return Some(reason.clone());
    }
    request
        .scan
        .policy
        .has_include()
        .then(|| "the policy has an include list, which the journal does not direct".into())
}

/// Entries a checkpoint cannot hold among those looked at: the capture
/// refuses them, as after a full scan (there are no others: the parent's
/// capture found none).
fn refusing(mut unsupported: crate::walk::Refused) -> Outcome {
    unsupported.sort();
    let out = ScanOutput {
        unsupported,
        ..ScanOutput::default()
    };
    Outcome::Done {
        out: Box::new(out),
        same: false,
        examined: 0,
        delta: None,
    }
}

/// Nothing to look at: the manifest is the parent's.
fn unchanged(parent_totals: (u64, u64, u64), started: std::time::Instant) -> Outcome {
    let (entries, file_count, file_bytes) = parent_totals;
    let out = ScanOutput {
        phases_ms: vec![("journal", ms(started))],
        entries,
        file_count,
        file_bytes,
        // Every file's hash is the parent's.
        files_reused: file_count,
        ..ScanOutput::default()
    };
    Outcome::Done {
        out: Box::new(out),
        same: true,
        examined: 0,
        delta: None,
    }
}

/// What the walk needs beside the request: the starts, the pool, the
/// secrets and the progress counters.
type WalkWith<'a> = (
    &'a [(String, bool)],
    &'a rayon::ThreadPool,
    &'a SecretSet,
    &'a ScanProgress,
);

/// The directed walk from the starts (the stat cache lent for hashes).
fn walk(
    request: &Request,
    root: &Root,
    plan: &Plan,
    (starts, pool, secrets, progress): WalkWith<'_>,
) -> Result<crate::walk::WalkOutput, ScanError> {
    let scan = request.scan;
    let cache = scan
        .cache_path
        .as_deref()
        .and_then(LoadedCache::load_shared);
    let fingerprint = secrets_fingerprint(&scan.secrets);
    let root_forms: Vec<&[u8]> = root.forms.iter().map(|f| f.as_slice()).collect();
    Walker {
        root_fd: root.fd.as_raw_fd(),
        root_path: &root.path,
        roots: &root_forms,
        policy: &scan.policy,
        secrets,
        cancel: &scan.cancel,
        root_dev: fs::fstat(root.fd.as_raw_fd())
            .map_err(|e| ScanError::io(&root.path, "fstat", e))?
            .dev,
        cache: cache.as_deref(),
        reuse_hashes: cache.as_ref().is_some_and(|c| c.fingerprint == fingerprint),
        progress,
        direction: Some(plan),
    }
    .walk_from(pool, starts)
}

/// The walk's batches by directory; Err when one directory came twice (the
/// tree moved under the walk).
fn by_directory(found: Vec<Batch>) -> Result<BTreeMap<String, Batch>, String> {
    let mut batches = BTreeMap::new();
    for batch in found {
        let dir = batch.dir.clone();
        if batches.insert(dir.clone(), batch).is_some() {
            return Err(format!(
                "the journal's changes reached {dir:?} twice (the tree moved under the scan)"
            ));
        }
    }
    Ok(batches)
}

/// A directed scan's counts: the new manifest's `totals`, the files and
/// bytes it `hashed`, and the directories it started from.
fn counted(
    totals: (u64, u64, u64),
    (hashed, bytes_hashed): (u64, u64),
    batches: &BTreeMap<String, Batch>,
    starts: usize,
) -> ScanOutput {
    ScanOutput {
        entries: totals.0,
        file_count: totals.1,
        file_bytes: totals.2,
        files_hashed: hashed,
        // Not read: the stat cache vouched for them, or they are the parent's rows.
        files_reused: totals.1.saturating_sub(hashed),
        bytes_hashed,
        files_with_secrets: with_secrets(batches),
        dirs_listed: starts as u64,
        ..ScanOutput::default()
    }
}

/// Kept files in which secrets were zeroed.
fn with_secrets(batches: &BTreeMap<String, Batch>) -> u64 {
    batches
        .values()
        .flat_map(|b| &b.entries)
        .filter(
            |e| matches!(&e.kind, Kind::File(slot) if !slot.vanished && !slot.secrets.is_empty()),
        )
        .count() as u64
}

/// Write the new manifest (the parent with `edits` spliced in), its
/// digests and its delta from the parent; `(true, None)` when the rows are
/// the parent's; None when two edits overlap.
fn write(
    request: &Request,
    parent: &Parent,
    mut edits: Vec<Edit>,
    out: &mut ScanOutput,
    manifest: &mut dyn ManifestBuffer,
    pool: &rayon::ThreadPool,
) -> Result<Option<(bool, Option<Delta>)>, ScanError> {
    if edits.is_empty() {
        manifest.keep_previous();
        return Ok(Some((true, None)));
    }
    splice::sort_edits(&mut edits);
    let Some(pieces) = splice::pieces(parent, &edits) else {
        return Ok(None);
    };
    let buffer = manifest
        .allocate_whole(splice::joined_len(&pieces))
        .map_err(|e| ScanError::io("<manifest>", "allocate", e))?;
    let known = request.parent_digests;
    // The join and its fingerprint on every core, beside the digests and
    // the delta (which need only the parent and the edits).
    let (fingerprint, (incremental, delta)) = pool.join(
        || splice::join_hashed(&pieces, buffer),
        || {
            let incremental = known.and_then(|known| digests_after(parent, &edits, known));
            (incremental, splice::delta(parent, &edits))
        },
    );
    let counted = match incremental {
        Some(counted) => counted,
        None => crate::manifest::digests_counted(buffer)
            .map_err(|e| ScanError::io("<manifest>", "read", std::io::Error::other(e)))?,
    };
    (out.digests, out.digest_counts) = (counted.digests, counted.counts);
    out.fingerprint = Some(fingerprint);
    Ok(Some((false, Some(delta))))
}

fn ms(since: std::time::Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

/// Entries stat'ed plus directories listed: the names looked at in the
/// starts listed by name, and every entry of the directories read.
fn examined(plan: &Plan, found: &[Batch], dirs_read: usize) -> u64 {
    let named: usize = plan
        .changes
        .values()
        .filter_map(|c| c.names.as_ref())
        .map(|n| n.len())
        .sum();
    let read: usize = found
        .iter()
        .filter(|b| plan.changes.get(&b.dir).map_or(true, |c| c.names.is_none()))
        .map(|b| b.entries.len())
        .sum();
    (named + read + dirs_read) as u64
}

/// A file the walk found that has other names, none of which the journal
/// knows: a write through one of those names changes it unseen.
fn unknown_links(
    batches: &BTreeMap<String, Batch>,
    known: &std::collections::HashSet<(u64, u64)>,
    root_fd: i32,
) -> Option<String> {
    for (dir, batch) in batches {
        let dir_fd = tree::open_dir(root_fd, dir).ok();
        for entry in &batch.entries {
            let Kind::File(slot) = &entry.kind else {
                continue;
            };
            let name = std::ffi::CString::new(batch.name(entry)).ok()?;
            let links = dir_fd
                .as_ref()
                .and_then(|fd| fs::lstat_links_at(fd.as_raw_fd(), &name).ok());
            match links {
                // Gone, or another file now: hashing it tells.
                None => continue,
                Some((stat, _)) if stat.ino != slot.stat.ino || stat.dev != slot.stat.dev => {
                    continue
                }
                Some((stat, n)) if n > 1 && !known.contains(&(stat.dev, stat.ino)) => {
                    return Some(join(dir, batch.name(entry)));
                }
                Some(_) => {}
            }
        }
    }
    None
}

/// Hash every kept file the stat cache did not vouch for. Returns the files
/// hashed and their bytes.
fn hash_changed(
    scan: &ScanRequest,
    root: &Root,
    pool: &rayon::ThreadPool,
    batches: &mut BTreeMap<String, Batch>,
    (secrets, chunking, progress): (&SecretSet, Option<&Chunking>, &ScanProgress),
) -> Result<(u64, u64), ScanError> {
    let mut files = Vec::new();
    for batch in batches.values_mut() {
        let Batch {
            dir,
            names,
            entries,
        } = batch;
        for entry in entries.iter_mut() {
            if let Kind::File(slot) = &mut entry.kind {
                if slot.hash.is_none() {
                    let at = entry.name_at as usize;
                    files.push((join(dir, &names[at..at + entry.name_len as usize]), slot));
                }
            }
        }
    }
    let count = files.len() as u64;
    let root_fd = root.fd.as_raw_fd();
    let cx = HashContext {
        root_path: &root.path,
        secrets,
        cancel: &scan.cancel,
        sinks: Sinks {
            feed: scan.feed.as_deref(),
            chunking,
        },
    };
    let bytes: u64 = pool.install(|| {
        files
            .par_iter_mut()
            .map(|(path, slot)| {
                let read = hash_slot((root_fd, path.as_str()), path, slot, &cx)?;
                ScanProgress::add(&progress.files_hashed, 1);
                ScanProgress::add(&progress.bytes_hashed, read);
                Ok::<u64, ScanError>(read)
            })
            .try_reduce(|| 0, |a, b| Ok(a + b))
    })?;
    if scan.cancel.is_cancelled() {
        return Err(ScanError::Cancelled);
    }
    Ok((count, bytes))
}

/// The rows `kind` at `path` encodes to (none for a file that vanished).
fn encode(
    path: &str,
    kind: Option<&Kind>,
    chunking: Option<&Chunking>,
    out: &mut ManifestWriter<Vec<u8>>,
) {
    if let Some(kind) = kind {
        write_entry(out, path, kind, chunking);
    }
}

/// The edits of the parent: for each name looked at in each start, its row,
/// and the rows below it when it is a directory walked whole now or was a
/// directory before.
fn plan_edits(
    plan: &Plan,
    parent: &Parent,
    batches: &BTreeMap<String, Batch>,
    chunking: Option<&Chunking>,
) -> Result<Vec<Edit>, ScanError> {
    let bad = |e: crate::manifest::ManifestError| {
        ScanError::io("<parent manifest>", "read", std::io::Error::other(e))
    };
    let mut edits = Vec::new();
    for (dir, changes) in &plan.changes {
        let found: HashMap<&str, &Kind> = batches
            .get(dir)
            .map(|b| b.entries.iter().map(|e| (b.name(e), &e.kind)).collect())
            .unwrap_or_default();
        let mut names: BTreeSet<String> = match &changes.names {
            Some(names) => names
                .iter()
                .filter_map(|n| std::str::from_utf8(n).ok().filter(|n| !n.is_empty()))
                .map(str::to_string)
                .collect(),
            None => {
                let mut all: BTreeSet<String> = found.keys().map(|n| n.to_string()).collect();
                all.extend(parent.children(dir).map_err(bad)?.into_iter().map(|c| c.0));
                all
            }
        };
        names.extend(
            changes
                .deep
                .iter()
                .filter_map(|n| std::str::from_utf8(n).ok().map(str::to_string)),
        );
        for name in names {
            let path = join(dir, &name);
            let now = found
                .get(name.as_str())
                .copied()
                .filter(|k| !matches!(k, Kind::File(s) if s.vanished));
            let before = parent.find(&path).map_err(bad)?;
            let span = match before {
                Some((span, _)) => span,
                None => parent.place(&path).map_err(bad)?,
            };
            let mut row = ManifestWriter::fragment(256);
            encode(&path, now, chunking, &mut row);
            let row = row.into_fragment();
            if row.as_slice() != parent.rows(span) {
                edits.push(Edit {
                    span,
                    key: path.clone(),
                    rows: row,
                });
            }
            let is_dir = matches!(now, Some(Kind::Dir { .. }));
            let below = if is_dir && plan.enters(&path) {
                Some(region_rows(&path, batches, chunking))
            } else if !is_dir && matches!(before, Some((_, b'd'))) {
                Some(Vec::new())
            } else {
                None
            };
            if let Some(rows) = below {
                let span = parent.below(&path).map_err(bad)?;
                if rows.as_slice() != parent.rows(span) {
                    edits.push(Edit {
                        span,
                        key: format!("{path}/"),
                        rows,
                    });
                }
            }
        }
    }
    Ok(edits)
}

/// The rows below the directory `dir` as the walk found them, in path order.
fn region_rows(
    dir: &str,
    batches: &BTreeMap<String, Batch>,
    chunking: Option<&Chunking>,
) -> Vec<u8> {
    let below = format!("{dir}/");
    let mut rows: Vec<(String, &Kind)> = Vec::new();
    for (path, batch) in batches.range(dir.to_string()..) {
        if path != dir && !path.starts_with(&below) {
            break;
        }
        rows.extend(
            batch
                .entries
                .iter()
                .map(|e| (join(path, batch.name(e)), &e.kind)),
        );
    }
    rows.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    let mut writer = ManifestWriter::fragment(rows.len() * 160);
    for (path, kind) in rows {
        encode(&path, Some(kind), chunking, &mut writer);
    }
    writer.into_fragment()
}

/// The parent's (entries, files, file bytes) with the edits applied.
fn totals_after(
    parent: &Parent,
    edits: &[Edit],
    totals: (u64, u64, u64),
) -> Result<(u64, u64, u64), ScanError> {
    let (mut entries, mut files, mut bytes) =
        (totals.0 as i128, totals.1 as i128, totals.2 as i128);
    let mut count = |rows: &[u8], sign: i128| -> Result<(), ScanError> {
        if rows.is_empty() {
            return Ok(());
        }
        let wrapped = [b"[".as_slice(), rows, b"]"].concat();
        let all = crate::manifest::rows(&wrapped)
            .map_err(|e| ScanError::io("<manifest>", "read", std::io::Error::other(e)))?;
        for row in all {
            entries += sign;
            if let Ok(Some(file)) = file_row(row) {
                files += sign;
                bytes += sign * file.size as i128;
            }
        }
        Ok(())
    };
    for edit in edits {
        count(parent.rows(edit.span), -1)?;
        count(&edit.rows, 1)?;
    }
    let clamp = |n: i128| n.max(0) as u64;
    Ok((clamp(entries), clamp(files), clamp(bytes)))
}
