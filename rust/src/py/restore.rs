//! `RestoreSession`: a native restore driven by the Python engine in batches
//! (see `crate::restore` for the rules; `_native.pyi` for the surface).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};

use super::args;
use super::bytes::moved_into_bytes;
use super::errors::to_py;
use super::keywords::{cancel_token, RestoreArgs, TreeArgs};
use crate::cancel::Cancel;
use crate::error::ScanError;
use crate::hash::{from_hex, to_hex, DigestMap};
use crate::manifest::SpannedFile;
use crate::pack::{self as pack_core, Entry, KIND_FILE};
use crate::redact::SecretSet;
use crate::restore::{self as core, RangeStager, Restore, RestoreError, StagedWriter};
use crate::spans::{self, GivenSecrets};
use crate::statcache::secrets_fingerprint;

fn digest(hex: &str) -> PyResult<[u8; 32]> {
    from_hex(hex)
        .ok_or_else(|| PyValueError::new_err(format!("not a 64-hex BLAKE3 digest: {hex:?}")))
}

/// See `_native.pyi`.
#[pyclass(module = "checkpointd._native")]
pub struct RestoreSession {
    /// None once closed: closing releases the descriptors at once (a session
    /// kept alive by a traceback must not pin the workspace's filesystem).
    inner: Option<Restore>,
    /// A dry run's plan (``plan_only``): no staging directory is made and no
    /// leftover is removed, so it may run beside a restore that holds the lease.
    preview: Option<core::Plan>,
    cache_path: Option<PathBuf>,
    cancel: Cancel,
    writers: Mutex<DigestMap<StagedWriter>>,
    /// The frames of each pack read `plan_pack_reads` planned, by read id,
    /// until the read is staged (or the session closes).
    reads: Mutex<HashMap<u64, Vec<Entry>>>,
    /// Pack reads being staged, by read id.
    ranges: Mutex<HashMap<u64, RangeStager>>,
    next_read: std::sync::atomic::AtomicU64,
    /// The live scan's tree (``keep_live``), until ``take_live`` hands it over.
    live: Mutex<Option<core::LiveTree>>,
    /// The target's files where capture zeroed secrets, and the secrets the
    /// caller gives: ``fill_secrets`` writes them back.
    spanned: Vec<SpannedFile>,
    given: GivenSecrets,
}

#[pymethods]
impl RestoreSession {
    /// Raises OSError, ValueError (bad pattern or manifest), InvalidBlob,
    /// ScanCancelled.
    #[new]
    #[pyo3(signature = (root, target, **options))]
    fn new(
        py: Python<'_>,
        root: PathBuf,
        target: &[u8],
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let RestoreArgs {
            tree:
                TreeArgs {
                    policy,
                    secrets,
                    cache_path,
                    cancel,
                    chunk_threshold,
                    chunk_average,
                },
            subdir,
            secret_names,
            plan_only,
            keep_live,
        } = RestoreArgs::of(options)?;
        let chunks_params = args::chunk_params(chunk_threshold, chunk_average)?;
        // The live scan zeroes the caller's secrets, so a file that still holds
        // them compares equal to its zeroed blob; a file equal to the
        // checkpoint but for its secret spans is never rewritten (`spans`).
        let secrets = args::secrets(secrets.as_ref())?;
        let secret_set = SecretSet::new(&secrets).map_err(|e| to_py(ScanError::ShortSecret(e)))?;
        let given = GivenSecrets::new(secrets.clone(), secret_names);
        let policy = policy.matcher()?;
        let cancel = cancel_token(cancel.as_ref());
        let request = core::Request {
            root,
            subdir,
            target: target.to_vec(),
            policy,
            secrets,
            secret_set,
            cache_path: cache_path.clone(),
            cancel: cancel.clone(),
            plan_only,
            keep_live,
            chunks: chunks_params,
        };
        let (inner, preview, live_tree, spanned) = py
            .allow_threads(move || core::prepare_restore(request))
            .map_err(to_py)?;
        Ok(RestoreSession {
            inner,
            preview,
            cache_path,
            cancel,
            writers: Mutex::new(DigestMap::default()),
            reads: Mutex::new(HashMap::new()),
            ranges: Mutex::new(HashMap::new()),
            next_read: std::sync::atomic::AtomicU64::new(0),
            live: Mutex::new(live_tree),
            spanned,
            given,
        })
    }

    /// The live tree the scan saw (``keep_live``): ``(manifest, entries,
    /// files, file_bytes, files_with_secrets)``, once; None after that or
    /// without ``keep_live``.
    fn take_live<'py>(&self, py: Python<'py>) -> PyResult<Option<LiveTuple<'py>>> {
        let taken = self.live.lock().unwrap_or_else(|e| e.into_inner()).take();
        taken
            .map(|(rows, entries, files, bytes, with_secrets)| {
                Ok((
                    moved_into_bytes(py, rows)?,
                    entries,
                    files,
                    bytes,
                    with_secrets,
                ))
            })
            .transpose()
    }

    /// The distinct blobs to fetch: (64-hex digest, size), in first-use order.
    #[getter]
    fn blobs(&self) -> PyResult<Vec<(String, u64)>> {
        Ok(self
            .plan()?
            .blobs
            .iter()
            .map(|(h, s)| (to_hex(h), *s))
            .collect())
    }

    #[getter]
    fn operations(&self) -> PyResult<usize> {
        Ok(self.plan()?.operations())
    }

    /// Files and symlinks apply writes, and the bytes of those files.
    #[getter]
    fn files_to_write(&self) -> PyResult<u64> {
        Ok(self.plan()?.files_to_write())
    }

    #[getter]
    fn bytes_to_write(&self) -> PyResult<u64> {
        Ok(self.plan()?.bytes_to_write())
    }

    /// (files and symlinks, bytes) apply has written so far.
    #[getter]
    fn written(&self) -> PyResult<(u64, u64)> {
        Ok(self.inner()?.written())
    }

    /// Counts per kind of change: deletions, dirs, writes, links, file_metadata, dir_modes.
    #[getter]
    fn counts(&self) -> PyResult<HashMap<&'static str, usize>> {
        let p = self.plan()?;
        Ok(HashMap::from([
            ("deletions", p.deletions.len()),
            ("dirs", p.dirs_to_make.len()),
            ("writes", p.writes.len()),
            ("links", p.links.len()),
            ("file_metadata", p.file_metadata.len()),
            ("dir_modes", p.dir_modes.len()),
        ]))
    }

    /// The workspace-relative paths this restore deletes (deepest first; names
    /// that are not UTF-8 are shown with replacement characters).
    #[getter]
    fn deleted_paths(&self) -> PyResult<Vec<String>> {
        Ok(self
            .plan()?
            .deletions
            .iter()
            .map(|(path, _)| String::from_utf8_lossy(path).into_owned())
            .collect())
    }

    /// The workspace-relative paths of the files and symlinks this restore
    /// writes, in path order.
    #[getter]
    fn written_paths(&self) -> PyResult<Vec<String>> {
        let plan = self.plan()?;
        let mut paths: Vec<String> = plan.writes.iter().map(|w| w.path.clone()).collect();
        paths.extend(plan.links.iter().map(|(path, _)| path.clone()));
        paths.sort_unstable();
        Ok(paths)
    }

    /// Verify and stage many small blobs: ``[(hex, bytes), ...]``.
    fn stage_many(&self, py: Python<'_>, items: Vec<(String, PyBackedBytes)>) -> PyResult<()> {
        let mut parsed = Vec::with_capacity(items.len());
        for (hex, data) in &items {
            parsed.push((digest(hex)?, data));
        }
        let inner = self.inner()?;
        let cancel = &self.cancel;
        py.allow_threads(|| {
            let views: Vec<([u8; 32], &[u8])> =
                parsed.iter().map(|(h, d)| (*h, d.as_ref())).collect();
            inner.stage_many(&views, cancel)
        })
        .map_err(to_py)
    }

    /// The blobs to fetch, split at ``max_size`` bytes: the digests of the
    /// smaller ones concatenated (32 bytes each, in first-use order), the
    /// larger ones as (64-hex digest, size), and the bytes of all of them.
    #[allow(clippy::type_complexity)]
    fn needed<'py>(
        &self,
        py: Python<'py>,
        max_size: u64,
    ) -> PyResult<(Bound<'py, PyBytes>, Vec<(String, u64)>, u64)> {
        let plan = self.plan()?;
        let mut small = Vec::with_capacity(plan.blobs.len() * 32);
        let mut large = Vec::new();
        let mut total = 0;
        // Files stored as chunks: their missing chunks instead (any size:
        // chunks are packed).
        let chunks = self.inner.as_ref().and_then(|r| r.chunks.as_ref());
        if let Some(chunks) = chunks {
            let (missing, bytes) = chunks.missing();
            small.extend_from_slice(&missing);
            total += bytes;
        }
        for (hash, size) in &plan.blobs {
            if chunks.is_some_and(|c| c.builds(hash)) {
                continue;
            }
            total += size;
            if *size <= max_size {
                small.extend_from_slice(hash);
            } else {
                large.push((to_hex(hash), *size));
            }
        }
        Ok((PyBytes::new(py, &small), large, total))
    }

    /// Plan the ranged pack reads that stage the blobs ``wanted``
    /// (concatenated digests) from the pack index rows found for them, each
    /// ``(digest, pack digest, offset, stored_len, raw_len, codec)``
    /// (``pack::plan_reads`` merges frames at most ``merge_gap`` apart, up to
    /// ``max_range`` bytes a read). Returns the reads as ``(read id, pack
    /// digest, start, end)``, which ``begin_range`` / ``stage_ranges`` /
    /// ``read_frames`` take, and the wanted blobs no row places, as (64-hex
    /// digest, size): they are fetched as objects of their own.
    #[allow(clippy::type_complexity)]
    fn plan_pack_reads<'py>(
        &self,
        py: Python<'py>,
        wanted: &[u8],
        rows: &Bound<'py, PyList>,
        merge_gap: u64,
        max_range: u64,
    ) -> PyResult<(
        Vec<(u64, Bound<'py, PyBytes>, u64, u64)>,
        Vec<(String, u64)>,
    )> {
        let inner = self.inner()?;
        // Read the rows in place (no copy of a digest into a Python object).
        let mut located: Vec<([u8; 32], Entry)> = Vec::with_capacity(rows.len());
        for row in rows.iter() {
            let row = row.downcast::<PyTuple>()?;
            let bytes_at = |i: usize| -> PyResult<[u8; 32]> {
                digest_bytes(row.get_borrowed_item(i)?.downcast::<PyBytes>()?.as_bytes())
            };
            located.push((
                bytes_at(1)?,
                Entry {
                    digest: bytes_at(0)?,
                    offset: row.get_borrowed_item(2)?.extract()?,
                    stored_len: row.get_borrowed_item(3)?.extract()?,
                    raw_len: row.get_borrowed_item(4)?.extract()?,
                    codec: row.get_borrowed_item(5)?.extract()?,
                    kind: KIND_FILE,
                },
            ));
        }
        let (packs, reads, unplaced) = py.allow_threads(|| {
            let mut packs: Vec<[u8; 32]> = Vec::new();
            let mut pack_numbers: DigestMap<usize> = DigestMap::default();
            let mut entries = Vec::with_capacity(located.len());
            let mut frames = Vec::with_capacity(located.len());
            let mut placed = std::collections::HashSet::with_capacity(located.len());
            for (pack, entry) in located {
                if !inner.needs(&entry.digest) || !placed.insert(entry.digest) {
                    continue; // a blob this restore does not need, or a second row
                }
                let number = *pack_numbers.entry(pack).or_insert_with(|| {
                    packs.push(pack);
                    packs.len() - 1
                });
                frames.push((number, entry.offset, u64::from(entry.stored_len)));
                entries.push(entry);
            }
            let mut unplaced = Vec::new();
            for hash in wanted.chunks(32) {
                let hash = digest_bytes(hash)?;
                if !placed.contains(&hash) {
                    unplaced.push((to_hex(&hash), inner.expected(&hash).map_err(to_py)?));
                }
            }
            let reads: Vec<(usize, u64, u64, Vec<Entry>)> =
                pack_core::plan_reads(&frames, merge_gap, max_range)
                    .into_iter()
                    .map(|read| {
                        let held = read.frames.iter().map(|&i| entries[i]).collect();
                        (read.pack, read.start, read.end, held)
                    })
                    .collect();
            PyResult::Ok((packs, reads, unplaced))
        })?;
        let mut planned = self.reads.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::with_capacity(reads.len());
        for (pack, start, end, held) in reads {
            let id = self
                .next_read
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            planned.insert(id, held);
            out.push((id, PyBytes::new(py, &packs[pack]), start, end));
        }
        Ok((out, unplaced))
    }

    /// The frames of a planned read, ``(digest, offset, stored_len, raw_len,
    /// codec)`` by offset: to look them up again when the pack is gone, or
    /// for a store that serves a pack frame by frame.
    fn read_frames<'py>(&self, py: Python<'py>, read: u64) -> PyResult<Vec<PlannedFrame<'py>>> {
        let mut entries = self.planned(read)?;
        entries.sort_by_key(|e| e.offset);
        Ok(entries
            .iter()
            .map(|e| {
                (
                    PyBytes::new(py, &e.digest),
                    e.offset,
                    e.stored_len,
                    e.raw_len,
                    e.codec,
                )
            })
            .collect())
    }

    /// Stage whole planned reads of one pack at once: each ``(read id,
    /// data)`` holds the bytes read from the read's start on. Every frame is
    /// decoded and verified before a byte of it is written; InvalidBlob for
    /// one that does not decode to its key or that ``data`` does not hold
    /// whole (a truncated pack). Returns (blobs, bytes) staged.
    fn stage_ranges(
        &self,
        py: Python<'_>,
        reads: Vec<(u64, PyBackedBytes)>,
    ) -> PyResult<(u64, u64)> {
        let mut parsed = Vec::with_capacity(reads.len());
        for (read, data) in &reads {
            parsed.push((self.planned(*read)?, data));
        }
        let inner = self.inner()?;
        let cancel = &self.cancel;
        let staged = py
            .allow_threads(|| {
                use rayon::prelude::*;
                parsed
                    .into_par_iter()
                    .map(|(frames, data)| {
                        let mut stager = RangeStager::new(frames);
                        let staged = stager.feed(inner, data, cancel)?;
                        stager.finish()?;
                        Ok::<_, RestoreError>(staged)
                    })
                    .try_reduce(|| (0, 0), |a, b| Ok((a.0 + b.0, a.1 + b.1)))
            })
            .map_err(to_py)?;
        let mut planned = self.reads.lock().unwrap_or_else(|e| e.into_inner());
        for (read, _) in &reads {
            planned.remove(read);
        }
        Ok(staged)
    }

    /// Start staging one planned read as its bytes arrive (``feed_range``,
    /// then ``end_range``).
    fn begin_range(&self, read: u64) -> PyResult<()> {
        let entries = self.planned(read)?;
        self.inner()?;
        self.ranges
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(read, RangeStager::new(entries));
        Ok(())
    }

    /// The next bytes of a pack read: every frame completed by them is
    /// decoded, verified (size and BLAKE3) and staged. Returns (blobs, bytes)
    /// staged; InvalidBlob for a frame that does not decode to its key.
    fn feed_range(
        &self,
        py: Python<'_>,
        handle: u64,
        chunk: PyBackedBytes,
    ) -> PyResult<(u64, u64)> {
        let mut stager = self.take_range(handle)?;
        let inner = self.inner()?;
        let cancel = &self.cancel;
        let result = py.allow_threads(|| stager.feed(inner, &chunk, cancel));
        self.ranges
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(handle, stager);
        result.map_err(to_py)
    }

    /// A whole planned read from `fd` (a blob directory's pack file), read
    /// `span` (start, end) a piece of `piece` bytes at a time into one buffer
    /// and staged as ``feed_range`` stages, without a trip through Python
    /// per piece, then ended as ``end_range`` ends it. Returns (blobs, bytes)
    /// staged; OSError when the pack cannot be read, InvalidBlob as
    /// ``feed_range`` and ``end_range`` raise it.
    fn stage_range_from(
        &self,
        py: Python<'_>,
        handle: u64,
        fd: i32,
        span: (u64, u64),
        piece: usize,
    ) -> PyResult<(u64, u64)> {
        let mut stager = RangeStager::new(self.planned(handle)?);
        let inner = self.inner()?;
        let cancel = &self.cancel;
        let staged = py.allow_threads(|| {
            let (start, end) = span;
            let mut buffer = vec![0u8; piece.clamp(1, 16 << 20)];
            // (A read of empty blobs only has no bytes: fed nothing once.)
            let mut staged = if start < end {
                (0, 0)
            } else {
                stager.feed(inner, &[], cancel).map_err(to_py)?
            };
            let mut at = start;
            while at < end {
                let want = buffer.len().min((end - at) as usize);
                let got = crate::fs::read_full_at(fd, &mut buffer[..want], at)?;
                if got == 0 {
                    break; // the pack ends early: `finish` names the frame it lacks
                }
                let (blobs, bytes) = stager.feed(inner, &buffer[..got], cancel).map_err(to_py)?;
                staged = (staged.0 + blobs, staged.1 + bytes);
                at += got as u64;
            }
            stager.finish().map_err(to_py)?;
            Ok::<_, PyErr>(staged)
        })?;
        self.reads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&handle);
        Ok(staged)
    }

    /// The read ended: InvalidBlob naming the first frame it did not hold
    /// whole. The handle is released; ``discard`` releases it without that
    /// check (the read failed).
    #[pyo3(signature = (handle, discard=false))]
    fn end_range(&self, handle: u64, discard: bool) -> PyResult<()> {
        let stager = self.take_range(handle)?;
        self.reads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&handle);
        if discard {
            return Ok(());
        }
        stager.finish().map_err(to_py)
    }

    /// Start streaming a (large) blob into staging.
    fn begin_blob(&self, py: Python<'_>, hex: &str, size: u64) -> PyResult<()> {
        let hash = digest(hex)?;
        let inner = self.inner()?;
        let writer = py
            .allow_threads(|| inner.stage_writer(&hash, size))
            .map_err(to_py)?;
        self.writers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(hash, writer);
        Ok(())
    }

    fn write_blob(&self, py: Python<'_>, hex: &str, chunk: PyBackedBytes) -> PyResult<()> {
        let hash = digest(hex)?;
        let mut writer = self.take_writer(&hash)?;
        let inner = self.inner()?;
        let result = py.allow_threads(|| writer.write(inner, &chunk));
        self.writers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(hash, writer);
        result.map_err(to_py)
    }

    /// Check size and hash of a streamed blob; InvalidBlob when wrong.
    fn end_blob(&self, py: Python<'_>, hex: &str) -> PyResult<()> {
        let hash = digest(hex)?;
        let writer = self.take_writer(&hash)?;
        let inner = self.inner()?;
        py.allow_threads(|| writer.finish(inner)).map_err(to_py)
    }

    /// True once apply has nothing left to do.
    #[getter]
    fn done(&self) -> PyResult<bool> {
        Ok(self.inner()?.done())
    }

    /// Apply up to ``budget`` operations; returns how many were done.
    fn apply_some(&mut self, py: Python<'_>, budget: usize) -> PyResult<usize> {
        let inner = self.inner.as_mut().ok_or_else(closed)?;
        if let Some(chunks) = &inner.chunks {
            chunks.check_complete().map_err(to_py)?;
        }
        let cancel = &self.cancel;
        py.allow_threads(|| inner.apply_some(budget, cancel))
            .map_err(to_py)
    }

    /// Sync the workspace's filesystem, then record what was written in the
    /// stat cache.
    fn finish(&self, py: Python<'_>) -> PyResult<()> {
        let fingerprint = secrets_fingerprint::<&[u8]>(&[]);
        let cache = self.cache_path.clone();
        let inner = self.inner()?;
        py.allow_threads(|| {
            inner.finish(cache.as_deref(), fingerprint)?;
            match (&cache, &inner.chunks) {
                // (A cache not saved costs the next capture a read of those files.)
                (Some(path), Some(chunks)) => {
                    chunks.save_cache(path).map_err(|e| RestoreError::Io {
                        path: path.display().to_string(),
                        op: "save the chunk cache beside",
                        source: e,
                    })
                }
                _ => Ok(()),
            }
        })
        .map_err(to_py)
    }

    /// After ``finish``: write the given secrets back where capture zeroed
    /// them (see `crate::spans::fill`); returns the paths (relative to the
    /// restore root, sorted) left with zeros where a secret was.
    fn fill_secrets(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        let inner = self.inner()?;
        py.allow_threads(|| spans::fill(&inner.ws, &self.spanned, &self.given))
            .map_err(to_py)
    }

    /// Paths left alone because they lie on another filesystem (mount points).
    #[getter]
    fn skipped<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyAny>>> {
        self.inner()?
            .skipped()
            .into_iter()
            .map(|p| PyBytes::new(py, &p).call_method1("decode", ("utf-8", "surrogateescape")))
            .collect()
    }

    /// How many written files the stat cache learns at ``finish``.
    #[getter]
    fn recorded(&self) -> PyResult<usize> {
        Ok(self.inner()?.recorded_count())
    }

    /// Remove the staging directory and release every descriptor (call it in
    /// every case; later calls do nothing).
    fn close(&mut self, py: Python<'_>) -> PyResult<()> {
        self.writers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        self.ranges
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        self.reads.lock().unwrap_or_else(|e| e.into_inner()).clear();
        self.preview = None;
        let Some(inner) = self.inner.take() else {
            return Ok(());
        };
        py.allow_threads(move || inner.remove_staging())
            .map_err(to_py)
    }
}

/// ``take_live``'s tuple as Python sees it.
type LiveTuple<'py> = (Bound<'py, PyBytes>, u64, u64, u64, u64);

/// A planned read's frame as Python sees it: (digest, offset, stored_len, raw_len, codec).
type PlannedFrame<'py> = (Bound<'py, PyBytes>, u64, u32, u32, u8);

fn digest_bytes(bytes: &[u8]) -> PyResult<[u8; 32]> {
    bytes
        .try_into()
        .map_err(|_| PyValueError::new_err(format!("a digest is 32 bytes, not {}", bytes.len())))
}

fn closed() -> PyErr {
    PyValueError::new_err("the restore session is closed")
}

impl RestoreSession {
    fn inner(&self) -> PyResult<&Restore> {
        match (&self.inner, &self.preview) {
            (Some(restore), _) => Ok(restore),
            (None, Some(_)) => Err(PyValueError::new_err(
                "a plan-only restore session stages and applies nothing",
            )),
            (None, None) => Err(closed()),
        }
    }

    fn plan(&self) -> PyResult<&core::Plan> {
        match (&self.inner, &self.preview) {
            (Some(restore), _) => Ok(&restore.plan),
            (None, Some(plan)) => Ok(plan),
            (None, None) => Err(closed()),
        }
    }

    /// A copy of a planned read's frames.
    fn planned(&self, read: u64) -> PyResult<Vec<Entry>> {
        self.reads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&read)
            .cloned()
            .ok_or_else(|| PyValueError::new_err(format!("no pack read {read} planned")))
    }

    fn take_range(&self, handle: u64) -> PyResult<RangeStager> {
        self.ranges
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&handle)
            .ok_or_else(|| PyValueError::new_err(format!("no pack read {handle} being staged")))
    }

    fn take_writer(&self, hash: &[u8; 32]) -> PyResult<StagedWriter> {
        self.writers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(hash)
            .ok_or_else(|| PyValueError::new_err(format!("no blob {} being staged", to_hex(hash))))
    }
}

/// See `_native.pyi`.
#[pyfunction]
pub fn remove_stale_staging(py: Python<'_>, root: PathBuf) -> PyResult<Vec<String>> {
    let removed = py
        .allow_threads(|| {
            let ws = core::Workspace::open(&root, "")?;
            core::remove_stale_staging(&ws)
        })
        .map_err(to_py)?;
    Ok(removed
        .removed
        .iter()
        .map(|name| String::from_utf8_lossy(name).into_owned())
        .collect())
}
