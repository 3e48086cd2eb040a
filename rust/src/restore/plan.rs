//! The plan: what a restore changes, from the target manifest and the live scan.

use std::os::fd::RawFd;

use super::dirs::{DirStack, Reached};
use super::{cname, split_parent, RestoreError, Workspace};
use crate::classify::Unsupported;
use crate::fs;
use crate::hash::{DigestMap, DigestSet};
use crate::manifest::{self, ManifestRow};
use crate::walk::{self, MAX_DEPTH, MAX_PATH_BYTES};
use rayon::prelude::*;

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
    let (current_of, mut doomed) = pair_with_live(&target, &live);
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
        plan_row(&mut plan, row, current);
    }
    plan.dir_modes.reverse();
    for write in &plan.writes {
        add_blob(&mut plan.blobs, &mut sizes, write)?;
    }
    Ok(plan)
}

/// A path to delete and what stands there.
type Deletion = (Vec<u8>, Doomed);

/// Each target row's live row at its path (both sorted by path bytes), and
/// the live rows the target lacks (to delete).
fn pair_with_live<'l>(
    target: &[ManifestRow],
    live: &'l [ManifestRow],
) -> (Vec<Option<&'l ManifestRow>>, Vec<Deletion>) {
    let mut doomed: Vec<Deletion> = Vec::new();
    let mut current_of: Vec<Option<&ManifestRow>> = Vec::with_capacity(target.len());
    let mut live_rows = live.iter().peekable();
    for row in target {
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
    (current_of, doomed)
}

/// What `row` of the target needs, given the live row at its path.
fn plan_row(plan: &mut Plan, row: &ManifestRow, current: Option<&ManifestRow>) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash;

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
