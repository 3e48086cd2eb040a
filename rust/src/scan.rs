//! One scan of a workspace: walk (reusing cached hashes as each directory is
//! listed) → hash the rest in parallel → put the rows in path order (unless
//! the stat cache vouches for the manifest) → encode the manifest → save the
//! stat cache.

use std::cell::RefCell;
use std::collections::HashSet;
use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use crate::cancel::Cancel;
use crate::chunking::{Chunking, Sinks};
use crate::classify::Unsupported;
use crate::error::ScanError;
use crate::feed::{BlobFeed, CloseOnDrop};
use crate::fs;
use crate::hash::{self, HashError};
use crate::manifest::{Counter, ManifestWriter, Sink, SliceWriter};
use crate::pack::Frame;
use crate::policy::PolicyMatcher;
use crate::redact::SecretSet;
use crate::statcache::{self, secrets_fingerprint, CacheEntry, LoadedCache};
use crate::verify::HeldFile;
use crate::walk::{Batch, FileSlot, Kind, ListedDir, ScanProgress, Walker};

/// Everything a scan needs, owned (so the binding can release the GIL).
pub struct ScanRequest {
    pub root: PathBuf,
    pub policy: PolicyMatcher,
    pub secrets: Vec<Vec<u8>>,
    pub cache_path: Option<PathBuf>,
    /// 0 = one per core.
    pub threads: usize,
    pub cancel: Cancel,
    /// Where the zeroed bytes of small files just hashed go, and the open
    /// files of larger ones (each file read once by the scan).
    pub feed: Option<std::sync::Arc<BlobFeed>>,
    /// Counters published while the scan runs (None: counted, not shared).
    pub progress: Option<std::sync::Arc<ScanProgress>>,
    /// A restore's live scan: the stat cache is not saved but handed back
    /// ([`ScanOutput::kept_cache`]), for the restore to save once with what
    /// it wrote merged in; no digests are collected (nothing is uploaded).
    pub keep_cache: bool,
    /// Files above the threshold are stored as content-defined chunks
    /// (`crate::chunking`); None stores every file whole.
    pub chunks: Option<crate::chunk::ChunkParams>,
}

#[derive(Debug, Default)]
pub struct ScanOutput {
    /// The codec's JSON rows, sorted by path bytes ([`scan`], [`scan_root`];
    /// [`scan_into`] writes them into its buffer instead).
    pub manifest: Vec<u8>,
    /// Sorted by path bytes.
    pub unsupported: Vec<(Vec<u8>, Unsupported)>,
    pub entries: u64,
    pub files_hashed: u64,
    pub files_reused: u64,
    pub bytes_hashed: u64,
    /// Files in which secrets were zeroed (their rows carry the positions).
    pub files_with_secrets: u64,
    /// The distinct content digests of the manifest's files, sorted, 32
    /// bytes each (what `manifest::digests` would compute from `manifest`);
    /// empty when the manifest is the buffer's previous one (whose digests
    /// the caller has).
    pub digests: Vec<u8>,
    /// File rows in the manifest and the sum of their sizes.
    pub file_count: u64,
    pub file_bytes: u64,
    /// Directories entered, and how many of their listings the cache gave.
    pub dirs_listed: u64,
    pub dirs_reused: u64,
    /// The manifest is the previous one on the stat cache's word (its
    /// manifest witness): no row was encoded or compared.
    pub manifest_witnessed: bool,
    /// Wall milliseconds per phase, in order.
    pub phases_ms: Vec<(&'static str, f64)>,
    /// With [`ScanRequest::keep_cache`] and a cache path: the cache this
    /// scan would have saved.
    pub kept_cache: Option<KeptCache>,
}

/// The stat cache a restore's live scan saw, kept in memory (its rows and
/// listings as the scan made them) until the restore has written: then
/// [`KeptCache::save_with_written`] saves it once, with the restore's own
/// writes merged in, where saving it after the scan and merging into the
/// file later wrote it twice.
pub struct KeptCache {
    fingerprint: [u8; 32],
    reference_ns: i64,
    rows: Rows,
    dirs: Vec<ListedDir>,
}

impl std::fmt::Debug for KeptCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeptCache")
            .field("entries", &self.rows.order.len())
            .field("dirs", &self.dirs.len())
            .finish()
    }
}

impl KeptCache {
    /// Save at `path`, as [`statcache::write_merged`] merges `updates`.
    pub fn save_with_written(
        &self,
        path: &Path,
        fingerprint: [u8; 32],
        reference_ns: i64,
        updates: Vec<(String, CacheEntry)>,
    ) -> std::io::Result<()> {
        let entries = |visit: &mut dyn FnMut(&str, CacheEntry)| cache_entries(&self.rows, visit);
        let base = statcache::Base {
            fingerprint: self.fingerprint,
            reference_ns: self.reference_ns,
            entries: &entries,
            dirs: self.dirs.iter().map(ListedDir::as_listed),
        };
        statcache::write_merged(path, base, fingerprint, reference_ns, updates)
    }
}

/// The stat cache's entries of a scan's rows, in path order: every kept
/// file but those holding secrets (the cache keeps no secret positions, and a
/// reused hash without them would lose the secrets on restore).
fn cache_entries(rows: &Rows, visit: &mut dyn FnMut(&str, CacheEntry)) {
    let mut path = String::new();
    for r in &rows.order {
        let batch = &rows.batches[r.batch as usize];
        let entry = &batch.entries[r.entry as usize];
        match &entry.kind {
            Kind::File(slot) if !slot.vanished && slot.secrets.is_empty() => {
                let hash = slot.hash.expect("every kept file was hashed or reused");
                join_path(&batch.dir, batch.name(entry), &mut path);
                visit(&path, CacheEntry::new(&slot.stat, hash));
            }
            _ => {}
        }
    }
}

/// Wall time per phase of a scan.
struct Phases {
    last: std::time::Instant,
    done: Vec<(&'static str, f64)>,
}

impl Phases {
    fn start() -> Phases {
        Phases {
            last: std::time::Instant::now(),
            done: Vec::new(),
        }
    }

    /// Close the phase that just ended.
    fn end(&mut self, name: &'static str) {
        let now = std::time::Instant::now();
        self.done
            .push((name, (now - self.last).as_secs_f64() * 1e3));
        self.last = now;
    }
}

/// How often a file that changes while we hash it is retried before giving up.
const HASH_ATTEMPTS: usize = 3;

/// An opened, validated workspace root.
pub struct Root {
    pub path: PathBuf,
    pub fd: std::os::fd::OwnedFd,
    /// The path as given (absolute, lexical) and as the kernel resolves it.
    pub forms: Vec<Vec<u8>>,
}

impl Root {
    /// Errors: RootIsSymlink, RootNotDirectory, or Io when it cannot be read.
    pub fn open(root: &Path) -> Result<Root, ScanError> {
        let path = if root.is_absolute() {
            root.to_path_buf()
        } else {
            std::env::current_dir()
                .map_err(|e| ScanError::io(root, "resolve", e))?
                .join(root)
        };
        let stat = fs::lstat_path(&path).map_err(|e| ScanError::io(&path, "lstat", e))?;
        if stat.is_symlink() {
            return Err(ScanError::RootIsSymlink(path));
        }
        if !stat.is_dir() {
            return Err(ScanError::RootNotDirectory(path));
        }
        let fd = fs::open_dir_path(&path).map_err(|e| ScanError::io(&path, "open", e))?;
        let mut forms = vec![path.as_os_str().as_bytes().to_vec()];
        if let Ok(real) = std::fs::canonicalize(&path) {
            let real = real.as_os_str().as_bytes().to_vec();
            if real != forms[0] {
                forms.push(real);
            }
        }
        Ok(Root { path, fd, forms })
    }

    /// A root already opened by the caller (restore opens a sub-root one
    /// component at a time from the workspace fd, so the scan never resolves a
    /// path through the sandbox). `path` names it in messages and judges
    /// absolute symlink targets, together with the kernel's name for the fd.
    pub fn from_fd(fd: std::os::fd::OwnedFd, path: PathBuf) -> Root {
        let mut forms = vec![path.as_os_str().as_bytes().to_vec()];
        let proc_name = format!("/proc/self/fd/{}", fd.as_raw_fd());
        if let Ok(real) = std::fs::read_link(proc_name) {
            let real = real.as_os_str().as_bytes().to_vec();
            if real != forms[0] {
                forms.push(real);
            }
        }
        Root { path, fd, forms }
    }
}

pub fn build_pool(threads: usize) -> Result<rayon::ThreadPool, ScanError> {
    let threads = if threads == 0 {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2)
    } else {
        threads
    };
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("checkpointd-scan-{i}"))
        .build()
        .map_err(|e| ScanError::io("<thread pool>", "start threads", std::io::Error::other(e)))
}

/// Where a scan writes its manifest: one buffer of exactly the length asked
/// for, allocated once when the length is known and written once.
pub trait ManifestBuffer {
    fn allocate(&mut self, len: usize) -> std::io::Result<&mut [u8]>;

    /// The manifest this scan is expected to equal (the parent checkpoint's),
    /// by its length and fingerprint: when the bytes the scan would write
    /// have both, nothing is allocated and [`ManifestBuffer::keep_previous`]
    /// is called instead. (The previous manifest itself is never needed.)
    fn previous(&self) -> Option<Previous> {
        None
    }

    /// The scan's manifest is byte for byte the one [`ManifestBuffer::previous`] names.
    fn keep_previous(&mut self) {}
}

/// A manifest named by its length in bytes and its fingerprint: the BLAKE3
/// hash of its bytes (what `checkpointd.manifest.Manifest.fingerprint` is).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Previous {
    pub len: usize,
    pub fingerprint: [u8; 32],
}

/// Rows per encoded piece while a manifest is only hashed: the pieces in
/// flight (two windows of a few per thread) stay a few MB at any size.
const HASHED_PIECE_ROWS: usize = 4096;

/// Hashes encoded pieces in order, a comma between non-empty ones (the
/// manifest's layout, as [`scan_into`] writes it).
struct PieceHasher {
    hasher: blake3::Hasher,
    first: bool,
}

impl PieceHasher {
    fn add(&mut self, pieces: &[Vec<u8>]) {
        for piece in pieces.iter().filter(|p| !p.is_empty()) {
            if !std::mem::take(&mut self.first) {
                self.hasher.update(b",");
            }
            self.hasher.update(piece);
        }
    }
}

/// The fingerprint of the manifest of `order`'s rows, never holding more than
/// two windows of small pieces: each window is encoded on every core while
/// the one before it is hashed.
fn fingerprint_rows(
    pool: &rayon::ThreadPool,
    batches: &[Batch],
    order: &[RowRef],
    chunking: Option<&Chunking>,
) -> [u8; 32] {
    let pieces: Vec<&[RowRef]> = order.chunks(HASHED_PIECE_ROWS).collect();
    let window = (pool.current_num_threads() * 2).max(2);
    // Two windows of buffers, reused: each grows to a piece's size once.
    let encode = |group: &[&[RowRef]], buffers: &mut Vec<Vec<u8>>| {
        buffers.resize_with(group.len(), Vec::new);
        group
            .par_iter()
            .zip(buffers.par_iter_mut())
            .for_each(|(rows, buffer)| {
                buffer.clear();
                let (_, written) = encode_rows(batches, rows, std::mem::take(buffer), chunking);
                *buffer = written;
            });
    };
    let mut hashing = PieceHasher {
        hasher: blake3::Hasher::new(),
        first: true,
    };
    hashing.hasher.update(b"[");
    pool.install(|| {
        let (mut encoded, mut next) = (Vec::new(), Vec::new());
        for group in pieces.chunks(window) {
            rayon::join(|| hashing.add(&encoded), || encode(group, &mut next));
            std::mem::swap(&mut encoded, &mut next);
        }
        hashing.add(&encoded);
    });
    hashing.hasher.update(b"]");
    *hashing.hasher.finalize().as_bytes()
}

impl ManifestBuffer for Vec<u8> {
    fn allocate(&mut self, len: usize) -> std::io::Result<&mut [u8]> {
        self.clear();
        self.resize(len, 0);
        Ok(self.as_mut_slice())
    }
}

/// Run a scan. Errors: see [`ScanError`].
pub fn scan(request: &ScanRequest) -> Result<ScanOutput, ScanError> {
    scan_root(request, Root::open(&request.root)?)
}

/// [`scan`] of a root the caller opened (`request.root` only names it).
pub fn scan_root(request: &ScanRequest, root: Root) -> Result<ScanOutput, ScanError> {
    let mut manifest = Vec::new();
    let mut out = scan_into(request, root, &mut manifest)?;
    out.manifest = manifest;
    Ok(out)
}

/// [`scan_root`] with the manifest written into `manifest` (untouched when
/// the scan returns early for unsupported entries; `ScanOutput::manifest` stays empty).
pub fn scan_into(
    request: &ScanRequest,
    root: Root,
    manifest: &mut dyn ManifestBuffer,
) -> Result<ScanOutput, ScanError> {
    let mut phases = Phases::start();
    // However the scan ends, the consumer of the feed learns it.
    let _close_feed = CloseOnDrop(request.feed.as_deref());
    let secrets = SecretSet::new(&request.secrets)?;
    let fingerprint = secrets_fingerprint(&request.secrets);
    let cancel = &request.cancel;
    let chunking = request
        .chunks
        .map(|params| Chunking::new(params, request.cache_path.as_deref()));

    // The reference time comes first, read on the WORKSPACE's filesystem (its
    // timestamps may be coarser than the data dir's) and moved back by one of
    // its timestamp ticks: a file stat'ed in a tick that could still change
    // carries an mtime at or after it and is not trusted next time.
    let (mut old_cache, reference_ns) = match &request.cache_path {
        Some(path) => {
            let dir = cache_dir(path)?;
            let now = statcache::racy_reference_ns(root.fd.as_raw_fd(), &dir)
                .map_err(|e| ScanError::io(&root.path, "read the clock of", e))?;
            (LoadedCache::load(path), now)
        }
        None => (None, 0),
    };

    // The last scan's records are freed before this one makes its own (peak memory).
    wait_for_freeing();
    let pool = build_pool(request.threads)?;
    let own_progress = ScanProgress::default();
    let progress = request.progress.as_deref().unwrap_or(&own_progress);
    phases.end("setup");
    let root_forms: Vec<&[u8]> = root.forms.iter().map(|f| f.as_slice()).collect();
    // The cache's hashes were made with these secrets (else none is reused).
    let reuse_hashes = old_cache
        .as_ref()
        .is_some_and(|c| c.fingerprint == fingerprint);
    let walked = Walker {
        root_fd: root.fd.as_raw_fd(),
        root_path: &root.path,
        roots: &root_forms,
        policy: &request.policy,
        secrets: &secrets,
        cancel,
        root_dev: fs::fstat(root.fd.as_raw_fd())
            .map_err(|e| ScanError::io(&root.path, "fstat", e))?
            .dev,
        cache: old_cache.as_ref(),
        reuse_hashes,
        progress,
        direction: None,
    }
    .walk(&pool)?;
    // The listings were looked up by the walk alone (it kept copies of those
    // it reused): freed before the scan's records are all built (peak memory).
    if let Some(cache) = old_cache.as_mut() {
        cache.forget_listings();
    }
    let mut unsupported = walked.unsupported;
    let mut dirs = walked.dirs;
    let mut batches = walked.found;
    let dirs_listed = dirs.len() as u64;
    let dirs_reused = dirs.iter().filter(|d| d.reused).count() as u64;
    // Every file of the walk: none has been hashed, so none vanished yet.
    let (files_found, bytes_found, mut files_reused) =
        (walked.files, walked.file_bytes, walked.files_reused);
    // A chunked file's reused hash needs its chunk list (else it is read).
    if let Some(chunking) = &chunking {
        files_reused -= chunking.claim_reused(&mut batches);
    }
    phases.end("walk");

    // Unsupported entries are never entered, so they are few: a plain sort.
    unsupported.sort();
    pool.install(|| dirs.par_sort_unstable_by(|a, b| a.path.cmp(&b.path)));
    if !unsupported.is_empty() && request.feed.is_some() {
        // A capture (the one scan that feeds uploads) refuses these: hash and
        // upload nothing. A restore's live scan goes on: it plans around them.
        return Ok(ScanOutput {
            phases_ms: phases.done,
            unsupported,
            ..ScanOutput::default()
        });
    }
    phases.end("sort");

    // Hash what the cache did not vouch for (in the walk's order: which file
    // is hashed first does not matter), a directory's files together: each
    // task opens its directory once, beneath the root, and its files by name
    // beneath that (one path component each, not the whole path per file:
    // ~13% of a cold capture's scan time in 8-deep trees).
    let all_reused = files_reused == files_found;
    let mut tasks: Vec<HashTask> = Vec::new();
    for batch in batches.iter_mut().filter(|_| !all_reused) {
        let Batch {
            dir,
            names,
            entries,
        } = batch;
        let mut task = HashTask::new(dir);
        for entry in entries.iter_mut() {
            if let Kind::File(slot) = &mut entry.kind {
                if slot.hash.is_none() {
                    let at = entry.name_at as usize;
                    let name = &names[at..at + entry.name_len as usize];
                    let mut path = String::new();
                    join_path(dir, name, &mut path);
                    task.files.push((path, name.len(), slot));
                    if task.files.len() == HASH_TASK_FILES {
                        tasks.push(std::mem::replace(&mut task, HashTask::new(dir)));
                    }
                }
            }
        }
        if !task.files.is_empty() {
            tasks.push(task);
        }
    }
    let files_hashed = tasks.iter().map(|t| t.files.len() as u64).sum::<u64>();
    let root_fd = root.fd.as_raw_fd();
    // Collecting into a Result stops the other workers at the first error.
    let sizes: Vec<u64> = pool
        .install(|| {
            tasks
                .par_iter_mut()
                .map(|task| {
                    // Not opened (gone, or swapped for a link since the walk):
                    // each file is opened by its whole path, which says how.
                    let dir_fd = task.open_dir(root_fd);
                    let mut read = 0;
                    for (path, name_len, slot) in task.files.iter_mut() {
                        let at = match &dir_fd {
                            Some(fd) => (fd.as_raw_fd(), &path[path.len() - *name_len..]),
                            None => (root_fd, path.as_str()),
                        };
                        let bytes = hash_slot(
                            at,
                            &root.path,
                            path,
                            slot,
                            &secrets,
                            cancel,
                            Sinks {
                                feed: request.feed.as_deref(),
                                chunking: chunking.as_ref(),
                            },
                        )?;
                        ScanProgress::add(&progress.files_hashed, 1);
                        ScanProgress::add(&progress.bytes_hashed, bytes);
                        read += bytes;
                    }
                    Ok(read)
                })
                .collect::<Result<Vec<u64>, ScanError>>()
        })
        .map_err(|e| {
            if cancel.is_cancelled() {
                ScanError::Cancelled
            } else {
                e
            }
        })?;
    let bytes_hashed: u64 = sizes.iter().sum();
    // Files holding secrets are never cached, so hashing them changes nothing there.
    let hashed_for_cache = tasks
        .iter()
        .flat_map(|task| &task.files)
        .filter(|(_, _, slot)| slot.secrets.is_empty())
        .count();
    drop(tasks);
    // An untouched cache stays valid under its own (older) reference time:
    // every listing came from it, it holds no others, and every file entry
    // was reused.
    let cache_unchanged = old_cache.as_ref().is_some_and(|old| {
        reuse_hashes
            && hashed_for_cache == 0
            && old.len() as u64 == files_reused
            && dirs_reused == dirs_listed
            && old.dir_count() as u64 == dirs_listed
    });
    let key = outcome_key(&request.policy, &root.forms, &fingerprint);
    let key = crate::chunking::mix_key(key, request.chunks.as_ref());
    let old_witness = old_cache.as_ref().and_then(|c| c.witness);
    // Not needed any more: free it before the manifest is built (peak memory).
    drop(old_cache);
    phases.end("hash");

    // The manifest's digest, once known (the previous manifest's, or the one written).
    let mut digest: Option<[u8; 32]> = None;
    // The cache vouches for these rows (see statcache's "manifest witness"):
    // it is unchanged, was written under this key, and every file row is one
    // of its entries (none hashed: a file holding secrets is never cached).
    // Then the manifest is the one whose digest it recorded, and when that is
    // the previous manifest's, nothing is encoded or compared.
    let witnessed = match (&old_witness, manifest.previous()) {
        (Some(witness), Some(previous))
            if cache_unchanged
                && witness.key == key
                && unsupported.is_empty()
                && (all_reused || file_rows(&batches) == files_reused) =>
        {
            // (The previous manifest's digest is its fingerprint.)
            digest = Some(previous.fingerprint);
            previous.fingerprint == witness.digest
        }
        _ => false,
    };
    // Rows in path order are for encoding them and for the cache; a
    // witnessed manifest needs neither (unless an include list decides which
    // directories are rows: that takes the order, see
    // `keep_dirs_holding_entries`), so its rows are never put in order.
    let in_order = !witnessed || request.policy.has_include() || request.keep_cache;
    let mut rows = if in_order {
        let mut rows = pool.install(|| in_path_order(batches));
        if request.policy.has_include() {
            keep_dirs_holding_entries(&mut rows);
        }
        rows
    } else {
        Rows::unordered(batches)
    };
    if cancel.is_cancelled() {
        return Err(ScanError::Cancelled);
    }
    phases.end("order");
    let (total, same) = if witnessed {
        manifest.keep_previous();
        let mut total = Encoded {
            rows: match in_order {
                true => rows.order.len() as u64,
                // Without an include list every entry the walk kept is a row.
                false => rows.batches.iter().map(|b| b.entries.len() as u64).sum(),
            },
            ..Encoded::default()
        };
        if all_reused {
            (total.file_count, total.file_bytes) = (files_found, bytes_found);
        } else {
            for slot in rows.files_mut() {
                total.file_count += 1;
                total.file_bytes += slot.stat.size;
            }
        }
        (total, true)
    } else {
        let (total, same, written) =
            encode_manifest(&pool, &rows, manifest, digest, chunking.as_ref())?;
        digest = Some(written);
        (total, same)
    };
    phases.end("encode");

    let witness = statcache::ManifestWitness {
        key,
        digest: digest.expect("the manifest's digest is known"),
    };
    // Rewrite the cache when something changed, or to record the witness
    // (the first scan after an upgrade or a restore, or under another policy).
    if let Some(path) = request.cache_path.as_ref().filter(|_| !request.keep_cache) {
        if !cache_unchanged || old_witness != Some(witness) {
            let files = |visit: &mut dyn FnMut(&str, CacheEntry)| cache_entries(&rows, visit);
            let listed = dirs.iter().map(ListedDir::as_listed);
            // Streamed to the file from the rows: no copy of the cache in memory.
            statcache::write_cache(
                path,
                &fingerprint,
                reference_ns,
                Some(&witness),
                &files,
                listed,
            )
            .map_err(|e| ScanError::io(path, "save stat cache", e))?;
        }
        if let Some(chunking) = &chunking {
            chunking
                .save(path)
                .map_err(|e| ScanError::io(path, "save the chunk cache beside", e))?;
        }
    }
    // Kept for a restore's one save, else freed before the digests (peak
    // memory; a few allocations per directory, so freed here: the rows, ~25
    // per 100 entries, go to `free_records` below).
    let dirs = if request.keep_cache { dirs } else { Vec::new() };
    phases.end("save_cache");

    let (files_with_secrets, file_count, file_bytes) =
        (total.files_with_secrets, total.file_count, total.file_bytes);
    let entries = total.rows;
    // (Every file is in the order: only directories leave it.) A manifest
    // that is the previous one has its digests already: none are collected.
    let mut digests: Vec<[u8; 32]> = Vec::new();
    if !same && !request.keep_cache {
        digests.reserve_exact(file_count as usize);
        for slot in rows.files_mut().filter(|slot| !slot.vanished) {
            match (slot.hash, &chunking) {
                (Some(hash), Some(chunking)) => {
                    chunking.blob_digests(&hash, slot.stat.size, &mut digests)
                }
                (Some(hash), None) => digests.push(hash),
                (None, _) => {}
            }
        }
    }
    let kept_cache = if request.keep_cache && request.cache_path.is_some() {
        Some(KeptCache {
            fingerprint,
            reference_ns,
            rows,
            dirs,
        })
    } else {
        free_records(rows, entries);
        None
    };
    pool.install(|| digests.par_sort_unstable());
    digests.dedup();
    let digests = digests.concat();
    drop(pool);
    phases.end("digests");

    Ok(ScanOutput {
        phases_ms: phases.done,
        manifest: Vec::new(),
        unsupported,
        entries,
        files_hashed,
        files_reused,
        bytes_hashed,
        files_with_secrets,
        digests,
        file_count,
        file_bytes,
        dirs_listed,
        dirs_reused,
        manifest_witnessed: witnessed,
        kept_cache,
    })
}

/// The key of how a scan is made, beside its manifest digest in the stat
/// cache (statcache's "manifest witness"): rows equal to a recorded scan's
/// encode to the same manifest only under the same policy (what is kept),
/// roots (which symlinks stay inside), secret set (what is zeroed) and
/// encoder (this code's version).
fn outcome_key(policy: &PolicyMatcher, roots: &[Vec<u8>], secrets: &[u8; 32]) -> [u8; 32] {
    let key = blake3::derive_key("checkpointd 2026-12 scan outcome key v1", b"");
    let mut hasher = blake3::Hasher::new_keyed(&key);
    let version = env!("CARGO_PKG_VERSION").as_bytes();
    hasher.update(&(version.len() as u64).to_le_bytes());
    hasher.update(version);
    hasher.update(&policy.source_fingerprint());
    hasher.update(secrets);
    hasher.update(&(roots.len() as u64).to_le_bytes());
    for root in roots {
        hasher.update(&(root.len() as u64).to_le_bytes());
        hasher.update(root);
    }
    *hasher.finalize().as_bytes()
}

/// Encode the rows into `manifest`: sized on every core, in chunks, then
/// written once into the buffer it hands out (the binding's is the buffer of
/// a Python bytes object), so the manifest is never copied or joined; or,
/// when every byte would be its previous manifest's, nothing is allocated and
/// the previous one is kept. Returns the totals, whether the previous one
/// was kept, and the manifest's digest (`previous_digest`, when the caller
/// already has the previous manifest's, is not computed again).
fn encode_manifest(
    pool: &rayon::ThreadPool,
    rows: &Rows,
    manifest: &mut dyn ManifestBuffer,
    previous_digest: Option<[u8; 32]>,
    chunking: Option<&Chunking>,
) -> Result<(Encoded, bool, [u8; 32]), ScanError> {
    let digest_of = |bytes: &[u8]| {
        pool.install(|| {
            *blake3::Hasher::new()
                .update_rayon(bytes)
                .finalize()
                .as_bytes()
        })
    };
    // Encode on every core, in chunks of rows: sized first, then written
    // once into the buffer `manifest` hands out (the binding's is the buffer
    // of a Python bytes object), so the manifest is never copied or joined.
    let chunk_rows = (rows.order.len() / (pool.current_num_threads() * 4)).max(8192);
    let sized: Vec<(Encoded, Counter)> = pool.install(|| {
        rows.order
            .par_chunks(chunk_rows)
            .map(|chunk| encode_rows(&rows.batches, chunk, Counter::default(), chunking))
            .collect()
    });
    let total = sized
        .iter()
        .fold(Encoded::default(), |sum, (part, _)| Encoded {
            rows: sum.rows + part.rows,
            files_with_secrets: sum.files_with_secrets + part.files_with_secrets,
            file_count: sum.file_count + part.file_count,
            file_bytes: sum.file_bytes + part.file_bytes,
        });
    let lengths: Vec<usize> = sized.iter().map(|(_, counted)| counted.0).collect();
    let commas = lengths.iter().filter(|&&n| n > 0).count().saturating_sub(1);
    let manifest_len = 2 + lengths.iter().sum::<usize>() + commas;
    // A scan that changed nothing writes the parent's manifest again: its
    // length and fingerprint say so (the manifest is hashed piece by piece as
    // it is encoded), and it is not allocated a second time (~180 MB at a
    // million entries), nor is the parent's needed in memory to compare with.
    let same = manifest.previous().is_some_and(|previous| {
        previous.len == manifest_len
            && fingerprint_rows(pool, &rows.batches, &rows.order, chunking) == previous.fingerprint
    });
    if same {
        let digest = previous_digest.unwrap_or_else(|| {
            manifest
                .previous()
                .expect("compared with the previous manifest")
                .fingerprint
        });
        manifest.keep_previous();
        return Ok((total, true, digest));
    }
    let buffer = manifest
        .allocate(manifest_len)
        .map_err(|e| ScanError::io("<manifest>", "allocate", e))?;
    buffer[0] = b'[';
    buffer[manifest_len - 1] = b']';
    let mut rest = &mut buffer[1..manifest_len - 1];
    let mut pieces: Vec<&mut [u8]> = Vec::with_capacity(lengths.len());
    let mut first = true;
    for &length in &lengths {
        if length > 0 && !std::mem::take(&mut first) {
            let (comma, after) = std::mem::take(&mut rest).split_at_mut(1);
            comma[0] = b',';
            rest = after;
        }
        let (piece, after) = std::mem::take(&mut rest).split_at_mut(length);
        pieces.push(piece);
        rest = after;
    }
    pool.install(|| {
        rows.order
            .par_chunks(chunk_rows)
            .zip(pieces.into_par_iter())
            .for_each(|(chunk, piece)| {
                let length = piece.len();
                let (_, written) = encode_rows(
                    &rows.batches,
                    chunk,
                    SliceWriter { buf: piece, at: 0 },
                    chunking,
                );
                assert_eq!(written.at, length, "a chunk is written as it was sized");
            })
    });
    Ok((total, false, digest_of(buffer)))
}

/// Threads still freeing what earlier scans built (see [`free_later`]), and
/// the process that started them: a child forked meanwhile has none of its
/// parent's threads, so it starts its count afresh. (Atomics, not a lock or
/// join handles: a fork may come at any moment, and neither survives one.)
static FREEING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static FREEING_PID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// How many threads of this process are freeing (a fork's child: none).
fn freeing_here() -> &'static std::sync::atomic::AtomicUsize {
    use std::sync::atomic::Ordering::SeqCst;
    let pid = std::process::id();
    if FREEING_PID.swap(pid, SeqCst) != pid {
        FREEING.store(0, SeqCst);
    }
    &FREEING
}

/// Scans of more entries than this free their records before they return.
/// Below it they are freed on a thread of their own, off the scan's critical
/// path (at 100k files the walk's batches are ~25,000 allocations, 2 ms of a
/// 90 ms no-change scan); above it the capture's next step (reading its
/// parent again: ~60 MB at a million entries) would overlap the freeing and
/// add to the peak (a million-file no-change capture peaked at up to 341 MB
/// that way, 243-264 MB freeing first; the goal is 300 MB).
const FREE_INLINE_ENTRIES: u64 = 250_000;

/// Free a scan's `records` (of a scan of `entries` entries), then give the
/// heap back ([`release_freed_memory`]): inline for a large scan, else on a
/// thread of their own ([`free_later`]; see [`FREE_INLINE_ENTRIES`]).
fn free_records<T: Send + 'static>(records: T, entries: u64) {
    if entries > FREE_INLINE_ENTRIES {
        drop(records);
        release_freed_memory();
    } else {
        free_later(records);
    }
}

/// Free `records` on a thread of their own, then give the heap back: never
/// beside the next scan's records, which waits for it ([`wait_for_freeing`]).
/// When no thread can be started, freed here.
fn free_later<T: Send + 'static>(records: T) {
    use std::sync::atomic::Ordering::SeqCst;
    let count = freeing_here();
    count.fetch_add(1, SeqCst);
    let freeing = std::thread::Builder::new()
        .name("checkpointd-free".into())
        .spawn(move || {
            drop(records);
            release_freed_memory();
            FREEING.fetch_sub(1, SeqCst);
        });
    if freeing.is_err() {
        count.fetch_sub(1, SeqCst);
    }
}

/// Wait until what earlier scans handed to [`free_later`] is freed (by then
/// it has almost always been: the freeing takes a few ms per 100k files).
fn wait_for_freeing() {
    let count = freeing_here();
    while count.load(std::sync::atomic::Ordering::SeqCst) > 0 {
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
}

/// Give the heap a scan freed back to the system, when it is a lot. The
/// walk's batches are ~100 bytes per entry in many small allocations, made on
/// the pool's threads; glibc keeps freed small chunks mapped in each thread's
/// arena, so a daemon would otherwise keep a large scan's whole peak (hundreds
/// of MB at a million files) resident between captures. Called once the
/// scan's records are freed ([`free_later`]): called before, while they
/// were still held, it gave back almost nothing (185 MB resident after a
/// million-file scan, 56 MB when called after). Below
/// [`KEEP_FREED_HEAP`] the free heap is kept: the next scan reuses it instead
/// of faulting every page in again (at 100k files that was a fault per
/// ~20 entries, each scan), and a daemon never holds more than that extra.
pub fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 only reads the allocator's counters; malloc_trim
        // only returns free memory of its own arenas to the kernel. Both are
        // safe to call at any time from any thread.
        let keep = match mallinfo2() {
            Some(mallinfo2) => (unsafe { mallinfo2() }).fordblks <= KEEP_FREED_HEAP,
            None => false,
        };
        if !keep {
            unsafe { libc::malloc_trim(0) };
        }
    }
}

/// glibc's `mallinfo2`, looked up when the process runs: it exists from glibc
/// 2.33 on, and the wheel is built for manylinux2014 (glibc 2.17), so linking
/// it would make the module fail to load on older systems (Debian bullseye has
/// 2.31). Without it every scan trims, as before the threshold.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn mallinfo2() -> Option<unsafe extern "C" fn() -> libc::mallinfo2> {
    static FOUND: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only looks a
    // symbol up; a non-null result is glibc's mallinfo2, of this signature.
    let address = *FOUND
        .get_or_init(|| unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"mallinfo2".as_ptr()) as usize });
    (address != 0).then(|| unsafe {
        std::mem::transmute::<usize, unsafe extern "C" fn() -> libc::mallinfo2>(address)
    })
}

/// Free heap (bytes, every arena) a scan leaves mapped for the next one.
const KEEP_FREED_HEAP: usize = 48 << 20;

/// A manifest row in the making: an entry of a walk batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RowRef {
    batch: u32,
    entry: u32,
}

/// The walk's batches, and their entries in the order of their full paths.
struct Rows {
    batches: Vec<Batch>,
    order: Vec<RowRef>,
}

/// File rows of the manifest (every kept file that did not vanish).
fn file_rows(batches: &[Batch]) -> u64 {
    batches
        .iter()
        .flat_map(|b| b.entries.iter())
        .filter(|e| matches!(&e.kind, Kind::File(slot) if !slot.vanished))
        .count() as u64
}

impl Rows {
    /// Batches whose rows are never encoded nor cached (a witnessed scan's):
    /// no order is made, so `order` stays empty.
    fn unordered(batches: Vec<Batch>) -> Rows {
        Rows {
            batches,
            order: Vec::new(),
        }
    }

    /// Every file slot, in no particular order.
    fn files_mut(&mut self) -> impl Iterator<Item = &mut FileSlot> {
        self.batches
            .iter_mut()
            .flat_map(|b| b.entries.iter_mut())
            .filter_map(|e| match &mut e.kind {
                Kind::File(slot) => Some(slot),
                _ => None,
            })
    }

    fn path(&self, r: RowRef, out: &mut String) {
        let batch = &self.batches[r.batch as usize];
        join_path(
            &batch.dir,
            batch.name(&batch.entries[r.entry as usize]),
            out,
        );
    }
}

/// `dir/name` (`name` in the root) into `out`.
fn join_path(dir: &str, name: &str, out: &mut String) {
    out.clear();
    if !dir.is_empty() {
        out.push_str(dir);
        out.push('/');
    }
    out.push_str(name);
}

/// The walk's per-directory batches with the order of their entries by
/// full path bytes, without comparing whole paths: each directory's children
/// are sorted by name, a subdirectory taking two places, its own row at
/// `name` and its subtree at `name/` (every path below it starts with
/// `name/`, and `/` sorts where it sorts in the full paths), and the subtrees
/// are expanded depth first. (A global sort of 100k deep paths spent most of
/// its time in `memcmp` over their shared prefixes.) No entry moves: the
/// order is a list of indexes.
fn in_path_order(mut batches: Vec<Batch>) -> Rows {
    // `name` (+ "/" for a subtree) compared as bytes.
    fn cmp_keys(a: (&[u8], bool), b: (&[u8], bool)) -> std::cmp::Ordering {
        use std::cmp::Ordering::{Equal, Greater, Less};
        let common = a.0.len().min(b.0.len());
        match a.0[..common].cmp(&b.0[..common]) {
            Equal => {}
            other => return other,
        }
        // One name is a prefix of the other (names hold no "/"): what follows
        // the shorter one is its subtree's "/" or nothing.
        match a.0.len().cmp(&b.0.len()) {
            Equal => a.1.cmp(&b.1),
            Less if a.1 => b'/'.cmp(&b.0[common]),
            Less => Less,
            Greater if b.1 => a.0[common].cmp(&b'/'),
            Greater => Greater,
        }
    }
    /// A batch's rows and subtrees in order: (entry index, is the subtree).
    fn sorted(batch: &Batch) -> std::vec::IntoIter<(u32, bool)> {
        let mut items = Vec::with_capacity(batch.entries.len() + batch.entries.len() / 8);
        for (i, entry) in batch.entries.iter().enumerate() {
            if matches!(entry.kind, Kind::Dir { .. }) {
                items.push((i as u32, true));
            }
            items.push((i as u32, false));
        }
        let key = |&(i, subtree): &(u32, bool)| {
            (batch.name(&batch.entries[i as usize]).as_bytes(), subtree)
        };
        items.sort_unstable_by(|a, b| cmp_keys(key(a), key(b)));
        items.into_iter()
    }

    batches.par_sort_unstable_by(|a, b| a.dir.cmp(&b.dir));
    let find = |dir: &str| {
        batches
            .binary_search_by(|b| b.dir.as_str().cmp(dir))
            .ok()
            .map(|i| i as u32)
    };
    /// An item of a batch's plan: a row (its entry), or the subtree below a
    /// directory entry (the batch listing it).
    #[derive(Clone, Copy)]
    enum Item {
        Row(u32),
        Below(u32),
    }
    // Every batch's plan, on every core: its rows and subtrees in order, each
    // subtree with its batch found (an empty or vanished directory has none).
    let plans: Vec<Vec<Item>> = batches
        .par_iter()
        .map(|batch| {
            let mut child = String::new();
            sorted(batch)
                .filter_map(|(entry, subtree)| {
                    if !subtree {
                        return Some(Item::Row(entry));
                    }
                    join_path(
                        &batch.dir,
                        batch.name(&batch.entries[entry as usize]),
                        &mut child,
                    );
                    find(&child).map(Item::Below)
                })
                .collect()
        })
        .collect();
    // Then only the expansion, depth first, is sequential.
    let total = batches.iter().map(|b| b.entries.len()).sum();
    let mut order: Vec<RowRef> = Vec::with_capacity(total);
    let mut stack: Vec<(u32, usize)> = find("").map(|b| (b, 0)).into_iter().collect();
    while let Some((batch, at)) = stack.last_mut() {
        let batch = *batch;
        let Some(&item) = plans[batch as usize].get(*at) else {
            stack.pop();
            continue;
        };
        *at += 1;
        match item {
            Item::Row(entry) => order.push(RowRef { batch, entry }),
            Item::Below(below) => stack.push((below, 0)),
        }
    }
    drop(plans);
    let rows = Rows { batches, order };
    debug_assert!(
        {
            let (mut a, mut b) = (String::new(), String::new());
            rows.order.windows(2).all(|w| {
                rows.path(w[0], &mut a);
                rows.path(w[1], &mut b);
                a < b
            })
        },
        "rows in path order"
    );
    rows
}

/// What a run of manifest rows counts.
#[derive(Default)]
struct Encoded {
    rows: u64,
    files_with_secrets: u64,
    file_count: u64,
    file_bytes: u64,
}

/// Encode the rows `order` (a run of the sorted rows, without brackets) into `sink`.
fn encode_rows<S: Sink>(
    batches: &[Batch],
    order: &[RowRef],
    sink: S,
    chunking: Option<&Chunking>,
) -> (Encoded, S) {
    let mut writer = ManifestWriter::rows_into(sink);
    let mut out = Encoded::default();
    for r in order {
        let batch = &batches[r.batch as usize];
        let entry = &batch.entries[r.entry as usize];
        let path = (batch.dir.as_str(), batch.name(entry));
        if let Kind::File(slot) = &entry.kind {
            if !slot.vanished {
                out.files_with_secrets += u64::from(!slot.secrets.is_empty());
                out.file_count += 1;
                out.file_bytes += slot.stat.size;
            }
        }
        write_entry(&mut writer, path, &entry.kind, chunking);
    }
    out.rows = writer.rows() as u64;
    (out, writer.into_sink())
}

/// Write the row of one kept entry at `path` (none for a file that vanished).
pub(crate) fn write_entry<S: Sink>(
    writer: &mut ManifestWriter<S>,
    path: impl crate::manifest::JsonPath,
    kind: &Kind,
    chunking: Option<&Chunking>,
) {
    match kind {
        Kind::File(slot) if slot.vanished => {}
        Kind::File(slot) => {
            let hash = slot.hash.expect("every kept file was hashed or reused");
            let list = chunking.and_then(|c| c.list(&hash, slot.stat.size));
            let fields = crate::manifest::FileFields {
                hash: &hash,
                size: slot.stat.size,
                mode: slot.stat.mode & 0o777,
                mtime_ns: slot.stat.mtime_ns,
                chunks: list.as_deref(),
            };
            writer.file_with_chunks(path, &fields, &slot.secrets);
        }
        Kind::Dir { mode, .. } => writer.dir(path, *mode),
        Kind::Symlink(target) => writer.symlink(path, target),
    }
}

fn cache_dir(path: &Path) -> Result<PathBuf, ScanError> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&dir).map_err(|e| ScanError::io(&dir, "create", e))?;
    Ok(dir)
}

/// With a non-empty include list: keep a directory only if the list takes it
/// or it holds a kept entry. `rows` is sorted, so a parent precedes its children.
fn keep_dirs_holding_entries(rows: &mut Rows) {
    let mut needed: HashSet<String> = HashSet::new();
    let mut path = String::new();
    for &r in &rows.order {
        let keeps = match rows.batches[r.batch as usize].entries[r.entry as usize].kind {
            Kind::Dir { included, .. } => included,
            _ => true,
        };
        if !keeps {
            continue;
        }
        rows.path(r, &mut path);
        let mut current = path.as_str();
        while let Some(slash) = current.rfind('/') {
            current = &current[..slash];
            if !needed.insert(current.to_string()) {
                break;
            }
        }
    }
    let Rows { batches, order } = rows;
    order.retain(|r| {
        let batch = &batches[r.batch as usize];
        let entry = &batch.entries[r.entry as usize];
        match entry.kind {
            Kind::Dir { included, .. } => {
                let mut path = String::new();
                join_path(&batch.dir, batch.name(entry), &mut path);
                included || needed.contains(&path)
            }
            _ => true,
        }
    });
}

thread_local! {
    /// One read buffer per pool thread (the pool lives for one scan).
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Files hashed per task at most: a task opens its directory once, and a
/// directory of 100,000 files is still spread over every thread.
const HASH_TASK_FILES: usize = 64;

/// Files of one directory to hash: per file its path from the root, the
/// length of its name (the path's last bytes) and its slot.
struct HashTask<'b> {
    dir: &'b str,
    files: Vec<(String, usize, &'b mut FileSlot)>,
}

impl<'b> HashTask<'b> {
    fn new(dir: &'b str) -> HashTask<'b> {
        HashTask {
            dir,
            files: Vec::new(),
        }
    }

    /// The directory, opened beneath the root without following links (an
    /// O_PATH fd: only opened beneath); None for the root itself, and when it
    /// cannot be opened.
    fn open_dir(&self, root_fd: RawFd) -> Option<std::os::fd::OwnedFd> {
        if self.dir.is_empty() {
            return None;
        }
        fs::open_beneath(
            root_fd,
            self.dir.as_bytes(),
            libc::O_PATH | libc::O_DIRECTORY,
        )
        .ok()
    }
}

/// Hash one file, `path` from the root (for messages and the feed), opened
/// as `at` without following links: a directory fd beneath the root and the
/// file's path from it (its name, or its whole path from the root fd).
/// Returns the bytes read. The slot's stat becomes the fstat of what was hashed.
pub(crate) fn hash_slot(
    at: (RawFd, &str),
    root_path: &Path,
    path: &str,
    slot: &mut FileSlot,
    secrets: &SecretSet,
    cancel: &Cancel,
    sinks: Sinks<'_>,
) -> Result<u64, ScanError> {
    let abs = || root_path.join(path);
    let feed = sinks.feed;
    if cancel.is_cancelled() {
        return Err(ScanError::Cancelled);
    }
    let fd = match fs::open_to_read(at.0, at.1.as_bytes()) {
        Ok(fd) => fd,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
            // Deleted since the walk: it is simply not part of this checkpoint.
            slot.vanished = true;
            return Ok(0);
        }
        // A link or a file swapped in since the walk, a socket (ENXIO), or
        // (EXDEV, from openat2's RESOLVE_BENEATH) the file renamed out of the
        // workspace while it was being opened: it changed.
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ELOOP) | Some(libc::ENOTDIR) | Some(libc::EXDEV) | Some(libc::ENXIO)
            ) =>
        {
            return Err(ScanError::Changed(abs()));
        }
        Err(e) => return Err(ScanError::io(abs(), "open", e)),
    };
    let file = File::from(fd);
    let mut total = 0u64;
    for attempt in 0..HASH_ATTEMPTS {
        // A small file is read first against the walk's lstat, without an
        // fstat of its own (a cold capture of 100k files: 100k system calls
        // fewer). The read is bounded by that size + 1, and the bytes count
        // only when the fstat after the read gives that same stat (dev, ino,
        // mode, size, mtime, ctime): the same regular file, unchanged since
        // the walk. Anything else (an edit, or a fifo or device swapped in
        // between the walk and the open) is read again below, after an fstat
        // of its own that refuses what is not a regular file.
        let trust_walk =
            attempt == 0 && slot.stat.is_file() && slot.stat.size < hash::WHOLE_READ_LIMIT as u64;
        let before = if trust_walk {
            slot.stat
        } else {
            fs::fstat(file.as_raw_fd()).map_err(|e| ScanError::io(abs(), "fstat", e))?
        };
        if !before.is_file() {
            return Err(ScanError::Changed(abs()));
        }
        if let Some(chunking) = sinks.chunking.filter(|c| c.params.applies(before.size)) {
            // Stored as chunks: hashed, chunked and fed in one read.
            let (read, done) = chunking
                .hash_slot(&file, before, slot, secrets, cancel, feed)
                .map_err(|e| match e {
                    HashError::Cancelled => ScanError::Cancelled,
                    HashError::Io(e) => ScanError::io(abs(), "read", e),
                })?;
            total += read;
            if done {
                return Ok(total);
            }
            continue;
        }
        let mut found = Vec::new();
        let digest: std::io::Result<([u8; 32], u64, Option<Frame>)> = SCRATCH.with(|scratch| {
            let mut scratch = scratch.borrow_mut();
            if attempt > 0 {
                let mut reader = &file;
                std::io::Seek::rewind(&mut reader)?;
            }
            let limit = if trust_walk {
                before.size + 1
            } else {
                u64::MAX
            };
            let (digest, size) = hash::hash_reader_recording(
                std::io::Read::take(hash::FileBytes::of(&file, before.size), limit),
                Some(before.size),
                secrets,
                cancel,
                true,
                &mut scratch,
                &mut found,
            )
            .map_err(|e| match e {
                HashError::Io(e) => e,
                HashError::Cancelled => std::io::Error::from(std::io::ErrorKind::Interrupted),
            })?;
            // A small file was read whole: the scratch holds exactly the zeroed
            // bytes just hashed. Keep their frame for the upload if it wants
            // them, compressed now, while they are in this thread's cache.
            let kept = match feed {
                Some(feed)
                    if (size as usize) < hash::WHOLE_READ_LIMIT
                        && size as usize <= feed.max_file
                        && feed.wants(&digest) =>
                {
                    Some(Frame::encode(digest, &scratch[..size as usize]))
                }
                _ => None,
            };
            Ok((digest, size, kept))
        });
        let (digest, size, kept) = match digest {
            Ok(d) => d,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted && cancel.is_cancelled() => {
                return Err(ScanError::Cancelled)
            }
            // Not known to be a regular file yet (a fifo says EAGAIN): the
            // next attempt's fstat tells.
            Err(_) if trust_walk => continue,
            Err(e) => return Err(ScanError::io(abs(), "read", e)),
        };
        total += size;
        let after = fs::fstat(file.as_raw_fd()).map_err(|e| ScanError::io(abs(), "fstat", e))?;
        if after == before && size == before.size {
            slot.stat = before;
            slot.hash = Some(digest);
            slot.secrets = found.into();
            match (feed, kept) {
                (Some(feed), Some(frame)) => feed.push(frame, cancel),
                // Too large to copy: the open file itself goes to the upload.
                (Some(feed), None) if feed.wants(&digest) => feed.push_file(
                    HeldFile {
                        file,
                        path: path.to_string(),
                        digest,
                        stat: before,
                        secrets: secrets.clone(),
                        slot: None,
                    },
                    cancel,
                ),
                _ => {}
            }
            return Ok(total);
        }
    }
    Err(ScanError::Changed(abs()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names where the order of full paths differs from a depth-first walk
    /// with children sorted by name: `-` (0x2d) and `.` (0x2e) sort before
    /// `/` (0x2f), `0` after it, and a name can be a prefix of another.
    #[test]
    fn in_path_order_is_the_order_of_full_paths() {
        use crate::fs::Stat;
        let dirs = ["", "a", "a/x", "a-b", "a0", "b", "a.b/c", "a.b"];
        let file = || {
            Kind::File(FileSlot {
                stat: Stat::default(),
                hash: None,
                vanished: false,
                secrets: crate::walk::SecretSpans::default(),
            })
        };
        let dir = || Kind::Dir {
            mode: 0o755,
            included: true,
        };
        let mut batches: Vec<Batch> = Vec::new();
        let mut expected: Vec<String> = Vec::new();
        for parent in dirs {
            let prefix = if parent.is_empty() {
                String::new()
            } else {
                format!("{parent}/")
            };
            let mut children: Vec<(String, Kind)> = Vec::new();
            for child in dirs.iter().filter(|d| {
                !d.is_empty() && d.starts_with(&prefix) && !d[prefix.len()..].contains('/')
            }) {
                children.push((child[prefix.len()..].to_string(), dir()));
                expected.push(child.to_string());
            }
            for name in ["a", "a-", "a0", "a.", "z", "é"] {
                let path = format!("{prefix}{name}");
                if !dirs.contains(&path.as_str()) {
                    children.push((name.to_string(), file()));
                    expected.push(path);
                }
            }
            children.reverse(); // the walk's order is arbitrary
            let mut batch = Batch {
                dir: parent.to_string(),
                ..Batch::default()
            };
            for (name, kind) in children {
                batch.entries.push(crate::walk::Entry {
                    name_at: batch.names.len() as u32,
                    name_len: name.len() as u16,
                    kind,
                });
                batch.names.push_str(&name);
            }
            batches.push(batch);
        }
        batches.reverse();
        expected.sort();
        let rows = in_path_order(batches);
        let mut path = String::new();
        let got: Vec<String> = rows
            .order
            .iter()
            .map(|&r| {
                rows.path(r, &mut path);
                path.clone()
            })
            .collect();
        assert_eq!(got, expected);
    }

    /// `hash_slot` of `path` (from `root`), opened as `at`, as the walk left
    /// it: `stat` is the walk's lstat.
    fn hash_at(
        at: (RawFd, &str),
        root: &Path,
        path: &str,
        stat: crate::fs::Stat,
    ) -> (Result<u64, ScanError>, FileSlot) {
        let mut slot = FileSlot {
            stat,
            hash: None,
            vanished: false,
            secrets: crate::walk::SecretSpans::default(),
        };
        let done = hash_slot(
            at,
            root,
            path,
            &mut slot,
            &SecretSet::empty(),
            &Cancel::new(),
            Sinks::default(),
        );
        (done, slot)
    }

    /// [`hash_at`] of `name` beneath `dir`, by name from an fd of `dir`.
    fn hash_walked(
        dir: &Path,
        name: &str,
        stat: crate::fs::Stat,
    ) -> (Result<u64, ScanError>, FileSlot) {
        let root = crate::fs::open_dir_path(dir).unwrap();
        hash_at((root.as_raw_fd(), name), dir, name, stat)
    }

    fn lstat(dir: &Path, name: &str) -> crate::fs::Stat {
        let root = crate::fs::open_dir_path(dir).unwrap();
        let name = std::ffi::CString::new(name).unwrap();
        crate::fs::lstat_at(root.as_raw_fd(), &name).unwrap()
    }

    /// A directory with the file `f` holding "hello", and the walk's lstat of it.
    fn walked_file() -> (tempfile::TempDir, std::path::PathBuf, crate::fs::Stat) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"hello").unwrap();
        let walked = lstat(dir.path(), "f");
        (dir, path, walked)
    }

    #[test]
    fn a_task_hashes_its_files_by_name_beneath_its_directory() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("a/b")).unwrap();
        std::fs::write(root.path().join("a/b/f"), b"hello").unwrap();
        let walked = lstat(&root.path().join("a/b"), "f");
        let root_fd = crate::fs::open_dir_path(root.path()).unwrap();
        assert!(HashTask::new("").open_dir(root_fd.as_raw_fd()).is_none());
        let dir_fd = HashTask::new("a/b").open_dir(root_fd.as_raw_fd()).unwrap();
        for at in [(dir_fd.as_raw_fd(), "f"), (root_fd.as_raw_fd(), "a/b/f")] {
            let (done, slot) = hash_at(at, root.path(), "a/b/f", walked);
            assert_eq!(done.unwrap(), 5);
            assert_eq!(slot.hash, Some(*blake3::hash(b"hello").as_bytes()));
            assert_eq!(slot.stat, walked);
        }
    }

    #[test]
    fn a_directory_swapped_for_a_link_after_the_walk_is_not_entered() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("d")).unwrap();
        std::fs::write(root.path().join("d/f"), b"inside").unwrap();
        let walked = lstat(&root.path().join("d"), "f");
        // The directory moves out and a link to it takes its place.
        std::fs::rename(root.path().join("d"), outside.path().join("d")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("d"), root.path().join("d")).unwrap();
        let root_fd = crate::fs::open_dir_path(root.path()).unwrap();
        assert!(HashTask::new("d").open_dir(root_fd.as_raw_fd()).is_none());
        // So its files are opened by their whole path, which refuses the link.
        let (done, slot) = hash_at((root_fd.as_raw_fd(), "d/f"), root.path(), "d/f", walked);
        assert!(matches!(done, Err(ScanError::Changed(_))), "{done:?}");
        assert_eq!(slot.hash, None);
    }

    #[test]
    fn a_small_file_unchanged_since_the_walk_is_hashed_with_the_walks_stat() {
        let (dir, _path, walked) = walked_file();
        let (done, slot) = hash_walked(dir.path(), "f", walked);
        assert_eq!(done.unwrap(), 5);
        assert_eq!(slot.hash, Some(*blake3::hash(b"hello").as_bytes()));
        assert_eq!(slot.stat, walked);
    }

    #[test]
    fn a_small_file_rewritten_after_the_walk_is_hashed_as_it_is_now() {
        let (dir, path, walked) = walked_file();
        // Same size, other bytes, another mtime: the walk's stat no longer holds.
        std::fs::write(&path, b"HELLO").unwrap();
        let past = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
        let file = std::fs::File::options().write(true).open(&path).unwrap();
        file.set_modified(past).unwrap();
        let (done, slot) = hash_walked(dir.path(), "f", walked);
        assert!(done.is_ok());
        assert_eq!(slot.hash, Some(*blake3::hash(b"HELLO").as_bytes()));
        assert_eq!(slot.stat, lstat(dir.path(), "f"));
        assert_ne!(slot.stat, walked);
    }

    #[test]
    fn a_fifo_swapped_in_after_the_walk_is_a_change_even_with_a_writer() {
        let (dir, path, walked) = walked_file();
        std::fs::remove_file(&path).unwrap();
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // A writer that keeps the fifo full: an unbounded read would never end.
        let writer = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let feeding = std::thread::spawn(move || {
            let mut writer = writer;
            let block = [7u8; 4096];
            while std::io::Write::write_all(&mut writer, &block).is_ok() {}
        });
        let (done, slot) = hash_walked(dir.path(), "f", walked);
        assert!(matches!(done, Err(ScanError::Changed(_))), "{done:?}");
        assert_eq!(slot.hash, None);
        std::fs::remove_file(&path).unwrap();
        drop(feeding); // detached: it ends with the test process
    }
}
