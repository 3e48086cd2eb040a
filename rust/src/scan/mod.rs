//! One scan of a workspace: walk (reusing cached hashes as each directory is
//! listed) → hash the rest in parallel → put the rows in path order (unless
//! the stat cache vouches for the manifest) → encode the manifest → save the
//! stat cache.

mod cache;
mod encode;
mod freeing;
mod hashing;
mod order;

#[cfg(test)]
mod tests;

use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use crate::cancel::Cancel;
use crate::chunking::{Chunking, Sinks};
use crate::classify::Unsupported;
use crate::error::ScanError;
use crate::feed::{BlobFeed, CloseOnDrop};
use crate::fs;
use crate::policy::PolicyMatcher;
use crate::redact::SecretSet;
use crate::statcache::{self, secrets_fingerprint, CacheEntry, LoadedCache};
use crate::walk::{Batch, ListedDir, ScanProgress, WalkOutput, Walker};

use cache::{cache_dir, cache_entries, outcome_key};
use encode::{encode_manifest, Encoded};
use freeing::{free_records, wait_for_freeing};
use hashing::{hash_files, Hashed};
use order::{file_rows, in_path_order, keep_dirs_holding_entries, Rows};

pub use cache::KeptCache;
pub(crate) use encode::write_entry;
pub use encode::{populate, ManifestBuffer, Previous};
pub use freeing::release_freed_memory;
pub(crate) use hashing::{hash_slot, HashContext};

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
    /// How many references each of `digests` has (`manifest::Counted`).
    pub digest_counts: Vec<u8>,
    /// The manifest's fingerprint (the BLAKE3 hash of its bytes), when the
    /// scan worked it out.
    pub fingerprint: Option<[u8; 32]>,
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
    let own_progress = ScanProgress::default();
    let (scan, mut old_cache) = Scan::start(request, &root, &own_progress)?;
    phases.end("setup");
    let (mut walked, reuse_hashes) = scan.walk(&mut old_cache)?;
    phases.end("walk");

    // Unsupported entries are never entered, so they are few: a plain sort.
    walked.unsupported.sort();
    scan.pool
        .install(|| walked.dirs.par_sort_unstable_by(|a, b| a.path.cmp(&b.path)));
    if !walked.unsupported.is_empty() && request.feed.is_some() {
        // A capture (the one scan that feeds uploads) refuses these: hash and
        // upload nothing. A restore's live scan goes on: it plans around them.
        return Ok(ScanOutput {
            phases_ms: phases.done,
            unsupported: walked.unsupported,
            ..ScanOutput::default()
        });
    }
    phases.end("sort");

    let hashed = scan.hash(&mut walked)?;
    let settled = scan.settle(&walked, &hashed, old_cache, reuse_hashes);
    phases.end("hash");

    let batches = std::mem::take(&mut walked.batches);
    let (mut rows, witnessed, digest) = scan.order(batches, &walked, &settled, manifest)?;
    phases.end("order");
    let (total, same, digest) = scan.encode(&mut rows, &walked, witnessed, digest, manifest)?;
    phases.end("encode");

    let witness = statcache::ManifestWitness {
        key: settled.key,
        digest,
    };
    scan.save_cache(&rows, &walked.dirs, &settled, witness)?;
    // Kept for a restore's one save, else freed before the digests (peak
    // memory; a few allocations per directory, so freed here: the rows, ~25
    // per 100 entries, go to `free_records` below).
    let dirs = std::mem::take(&mut walked.dirs);
    let dirs = if request.keep_cache { dirs } else { Vec::new() };
    phases.end("save_cache");

    let (digests, kept_cache) = scan.finish(rows, dirs, &total, same);
    phases.end("digests");

    Ok(ScanOutput {
        phases_ms: phases.done,
        manifest: Vec::new(),
        unsupported: walked.unsupported,
        entries: total.rows,
        files_hashed: hashed.files,
        files_reused: walked.files_reused,
        bytes_hashed: hashed.bytes,
        files_with_secrets: total.files_with_secrets,
        digests: digests.digests,
        digest_counts: digests.counts,
        fingerprint: Some(digest),
        file_count: total.file_count,
        file_bytes: total.file_bytes,
        dirs_listed: walked.dirs_listed,
        dirs_reused: walked.dirs_reused,
        manifest_witnessed: witnessed,
        kept_cache,
    })
}

/// One scan under way: what its stages share.
struct Scan<'a> {
    request: &'a ScanRequest,
    root: &'a Root,
    secrets: SecretSet,
    fingerprint: [u8; 32],
    chunking: Option<Chunking>,
    pool: rayon::ThreadPool,
    progress: &'a ScanProgress,
    /// The racy-clean reference time of the cache this scan saves.
    reference_ns: i64,
}

/// What the walk found, with its counts.
struct Walked {
    unsupported: Vec<(Vec<u8>, Unsupported)>,
    dirs: Vec<ListedDir>,
    batches: Vec<Batch>,
    /// Every file of the walk (none has been hashed, so none vanished yet),
    /// their bytes, and how many took their hash from the cache.
    files_found: u64,
    bytes_found: u64,
    files_reused: u64,
    dirs_listed: u64,
    dirs_reused: u64,
}

impl Walked {
    fn of(walked: WalkOutput, chunking: Option<&Chunking>) -> Walked {
        let mut batches = walked.found;
        let mut files_reused = walked.files_reused;
        // A chunked file's reused hash needs its chunk list (else it is read).
        if let Some(chunking) = chunking {
            files_reused -= chunking.claim_reused(&mut batches);
        }
        let dirs = walked.dirs;
        Walked {
            unsupported: walked.unsupported,
            dirs_listed: dirs.len() as u64,
            dirs_reused: dirs.iter().filter(|d| d.reused).count() as u64,
            dirs,
            batches,
            files_found: walked.files,
            bytes_found: walked.file_bytes,
            files_reused,
        }
    }

    /// Every file took its hash from the cache.
    fn all_reused(&self) -> bool {
        self.files_reused == self.files_found
    }
}

/// What the stages after the hashing know of the old cache, which is freed
/// by then (peak memory).
struct Settled {
    /// The old cache stays valid under its own (older) reference time.
    cache_unchanged: bool,
    /// The key this scan's manifest witness is recorded under.
    key: [u8; 32],
    old_witness: Option<statcache::ManifestWitness>,
}

impl<'a> Scan<'a> {
    /// Set a scan up: its secrets, chunking, thread pool, and the old stat
    /// cache with the reference time of the new one.
    fn start(
        request: &'a ScanRequest,
        root: &'a Root,
        own_progress: &'a ScanProgress,
    ) -> Result<(Scan<'a>, Option<LoadedCache>), ScanError> {
        let secrets = SecretSet::new(&request.secrets)?;
        let chunking = request
            .chunks
            .map(|params| Chunking::new(params, request.cache_path.as_deref()));
        // The reference time comes first, read on the WORKSPACE's filesystem (its
        // timestamps may be coarser than the data dir's) and moved back by one of
        // its timestamp ticks: a file stat'ed in a tick that could still change
        // carries an mtime at or after it and is not trusted next time.
        let (old_cache, reference_ns) = match &request.cache_path {
            Some(path) => {
                let dir = cache_dir(path)?;
                let now = statcache::racy_reference_ns(root.fd.as_raw_fd(), &dir)
                    .map_err(|e| ScanError::io(&root.path, "read the clock of", e))?;
                LoadedCache::release_shared();
                (LoadedCache::load(path), now)
            }
            None => (None, 0),
        };
        // The last scan's records are freed before this one makes its own (peak memory).
        wait_for_freeing();
        let scan = Scan {
            request,
            root,
            secrets,
            fingerprint: secrets_fingerprint(&request.secrets),
            chunking,
            pool: build_pool(request.threads)?,
            progress: request.progress.as_deref().unwrap_or(own_progress),
            reference_ns,
        };
        Ok((scan, old_cache))
    }

    /// Walk the root, with the old cache's listings and (when they were
    /// made with these secrets: then `true`) its hashes.
    fn walk(&self, old_cache: &mut Option<LoadedCache>) -> Result<(Walked, bool), ScanError> {
        // The cache's hashes were made with these secrets (else none is reused).
        let reuse_hashes = old_cache
            .as_ref()
            .is_some_and(|c| c.fingerprint == self.fingerprint);
        let walked = self.walk_root(old_cache.as_ref(), reuse_hashes)?;
        // The listings were looked up by the walk alone (it kept copies of those
        // it reused): freed before the scan's records are all built (peak memory).
        if let Some(cache) = old_cache.as_mut() {
            cache.forget_listings();
        }
        Ok((Walked::of(walked, self.chunking.as_ref()), reuse_hashes))
    }

    fn walk_root(
        &self,
        cache: Option<&LoadedCache>,
        reuse_hashes: bool,
    ) -> Result<WalkOutput, ScanError> {
        let root = self.root;
        let root_forms: Vec<&[u8]> = root.forms.iter().map(|f| f.as_slice()).collect();
        Walker {
            root_fd: root.fd.as_raw_fd(),
            root_path: &root.path,
            roots: &root_forms,
            policy: &self.request.policy,
            secrets: &self.secrets,
            cancel: &self.request.cancel,
            root_dev: fs::fstat(root.fd.as_raw_fd())
                .map_err(|e| ScanError::io(&root.path, "fstat", e))?
                .dev,
            cache,
            reuse_hashes,
            progress: self.progress,
            direction: None,
        }
        .walk(&self.pool)
    }

    /// Hash what the cache did not vouch for.
    fn hash(&self, walked: &mut Walked) -> Result<Hashed, ScanError> {
        let cx = HashContext {
            root_path: &self.root.path,
            secrets: &self.secrets,
            cancel: &self.request.cancel,
            sinks: Sinks {
                feed: self.request.feed.as_deref(),
                chunking: self.chunking.as_ref(),
            },
        };
        let all_reused = walked.all_reused();
        hash_files(
            &self.pool,
            &mut walked.batches,
            all_reused,
            self.root.fd.as_raw_fd(),
            self.progress,
            &cx,
        )
    }

    /// What the old cache tells the stages after the hashing, which then
    /// frees it.
    fn settle(
        &self,
        walked: &Walked,
        hashed: &Hashed,
        old_cache: Option<LoadedCache>,
        reuse_hashes: bool,
    ) -> Settled {
        // An untouched cache stays valid under its own (older) reference time:
        // every listing came from it, it holds no others, and every file entry
        // was reused.
        let cache_unchanged = old_cache.as_ref().is_some_and(|old| {
            reuse_hashes
                && hashed.for_cache == 0
                && old.len() as u64 == walked.files_reused
                && walked.dirs_reused == walked.dirs_listed
                && old.dir_count() as u64 == walked.dirs_listed
        });
        let key = outcome_key(&self.request.policy, &self.root.forms, &self.fingerprint);
        let key = crate::chunking::mix_key(key, self.request.chunks.as_ref());
        let old_witness = old_cache.as_ref().and_then(|c| c.witness);
        // Not needed any more: free it before the manifest is built (peak memory).
        drop(old_cache);
        Settled {
            cache_unchanged,
            key,
            old_witness,
        }
    }

    /// Whether the rows are put in path order: they are for encoding them and
    /// for the cache; a witnessed manifest needs neither (unless an include
    /// list decides which directories are rows: that takes the order, see
    /// `keep_dirs_holding_entries`).
    fn in_order(&self, witnessed: bool) -> bool {
        !witnessed || self.request.policy.has_include() || self.request.keep_cache
    }

    /// The rows, in path order unless the manifest is witnessed; whether it
    /// is, and its digest when known already.
    fn order(
        &self,
        batches: Vec<Batch>,
        walked: &Walked,
        settled: &Settled,
        manifest: &dyn ManifestBuffer,
    ) -> Result<(Rows, bool, Option<[u8; 32]>), ScanError> {
        // The manifest's digest, once known (the previous manifest's, or the one written).
        let mut digest: Option<[u8; 32]> = None;
        // The cache vouches for these rows (see statcache's "manifest witness"):
        // it is unchanged, was written under this key, and every file row is one
        // of its entries (none hashed: a file holding secrets is never cached).
        // Then the manifest is the one whose digest it recorded, and when that is
        // the previous manifest's, nothing is encoded or compared.
        let witnessed = match (&settled.old_witness, manifest.previous()) {
            (Some(witness), Some(previous))
                if settled.cache_unchanged
                    && witness.key == settled.key
                    && walked.unsupported.is_empty()
                    && (walked.all_reused() || file_rows(&batches) == walked.files_reused) =>
            {
                // (The previous manifest's digest is its fingerprint.)
                digest = Some(previous.fingerprint);
                previous.fingerprint == witness.digest
            }
            _ => false,
        };
        let rows = if self.in_order(witnessed) {
            let mut rows = self.pool.install(|| in_path_order(batches));
            if self.request.policy.has_include() {
                keep_dirs_holding_entries(&mut rows);
            }
            rows
        } else {
            Rows::unordered(batches)
        };
        if self.request.cancel.is_cancelled() {
            return Err(ScanError::Cancelled);
        }
        Ok((rows, witnessed, digest))
    }

    /// Rewrite the cache when something changed, or to record the witness
    /// (the first scan after an upgrade or a restore, or under another policy).
    fn save_cache(
        &self,
        rows: &Rows,
        dirs: &[ListedDir],
        settled: &Settled,
        witness: statcache::ManifestWitness,
    ) -> Result<(), ScanError> {
        let request = self.request;
        let Some(path) = request.cache_path.as_ref().filter(|_| !request.keep_cache) else {
            return Ok(());
        };
        if !settled.cache_unchanged || settled.old_witness != Some(witness) {
            let files = |visit: &mut dyn FnMut(&str, CacheEntry)| cache_entries(rows, visit);
            let listed = dirs.iter().map(ListedDir::as_listed);
            // Streamed to the file from the rows: no copy of the cache in memory.
            statcache::write_cache(
                path,
                &self.fingerprint,
                self.reference_ns,
                Some(&witness),
                &files,
                listed,
            )
            .map_err(|e| ScanError::io(path, "save stat cache", e))?;
        }
        if let Some(chunking) = &self.chunking {
            chunking
                .save(path)
                .map_err(|e| ScanError::io(path, "save the chunk cache beside", e))?;
        }
        Ok(())
    }

    /// Encode the rows into `manifest` unless the manifest is witnessed:
    /// their totals, whether the manifest is the previous one, and its digest.
    fn encode(
        &self,
        rows: &mut Rows,
        walked: &Walked,
        witnessed: bool,
        digest: Option<[u8; 32]>,
        manifest: &mut dyn ManifestBuffer,
    ) -> Result<(Encoded, bool, [u8; 32]), ScanError> {
        if witnessed {
            manifest.keep_previous();
            let total = witnessed_totals(rows, walked, self.in_order(witnessed));
            return Ok((total, true, digest.expect("the manifest's digest is known")));
        }
        encode_manifest(&self.pool, rows, manifest, digest, self.chunking.as_ref())
    }

    /// The manifest's blob digests and the cache a restore keeps; frees the
    /// rows otherwise, then the scan's threads.
    fn finish(
        self,
        mut rows: Rows,
        dirs: Vec<ListedDir>,
        total: &Encoded,
        same: bool,
    ) -> (crate::manifest::Counted, Option<KeptCache>) {
        let request = self.request;
        // A manifest that is the previous one has its digests already: none are collected.
        let digests = match !same && !request.keep_cache {
            true => self.collect_digests(&mut rows, total.file_count),
            false => Vec::new(),
        };
        let kept_cache = if request.keep_cache && request.cache_path.is_some() {
            Some(KeptCache {
                fingerprint: self.fingerprint,
                reference_ns: self.reference_ns,
                rows,
                dirs,
            })
        } else {
            free_records(rows, total.rows);
            None
        };
        (self.sorted_digests(digests), kept_cache)
    }

    /// The blob digests of the manifest's files (every file is in the order:
    /// only directories leave it), unsorted.
    fn collect_digests(&self, rows: &mut Rows, file_count: u64) -> Vec<[u8; 32]> {
        let mut digests: Vec<[u8; 32]> = Vec::new();
        digests.reserve_exact(file_count as usize);
        for slot in rows.files_mut().filter(|slot| !slot.vanished) {
            match (slot.hash, &self.chunking) {
                (Some(hash), Some(chunking)) => {
                    chunking.blob_digests(&hash, slot.stat.size, &mut digests)
                }
                (Some(hash), None) => digests.push(hash),
                (None, _) => {}
            }
        }
        digests
    }

    /// The distinct digests, sorted, and their counts.
    fn sorted_digests(&self, mut digests: Vec<[u8; 32]>) -> crate::manifest::Counted {
        self.pool.install(|| digests.par_sort_unstable());
        crate::manifest::Counted::of_sorted(&digests)
    }
}

/// The totals of a witnessed manifest's rows, counted without encoding them.
fn witnessed_totals(rows: &mut Rows, walked: &Walked, in_order: bool) -> Encoded {
    let mut total = Encoded {
        rows: match in_order {
            true => rows.order.len() as u64,
            // Without an include list every entry the walk kept is a row.
            false => rows.batches.iter().map(|b| b.entries.len() as u64).sum(),
        },
        ..Encoded::default()
    };
    if walked.all_reused() {
        (total.file_count, total.file_bytes) = (walked.files_found, walked.bytes_found);
    } else {
        for slot in rows.files_mut() {
            total.file_count += 1;
            total.file_bytes += slot.stat.size;
        }
    }
    total
}
