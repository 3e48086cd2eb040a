//! `BlobFeed`: the zeroed bytes of small files the scan just hashed, handed to
//! the upload while the scan goes on, so a new file is read once.
//!
//! The scan reads a small file whole, zeroes its secrets and hashes that buffer;
//! with a feed, it also hands exactly those bytes over, in their stored form
//! (a [`Frame`], compressed by the scan thread while they are in its cache, so
//! a pack only concatenates frames). The digest was computed on those bytes,
//! and the fstat before and after the read matched, so what is uploaded is
//! what the manifest names: nothing torn, nothing re-opened. Digests the
//! parent checkpoint already references (`skip`) and digests already fed are
//! not fed again.
//!
//! Memory is bounded: batches wait in a queue of at most `capacity` stored bytes; a
//! scan thread that would exceed it waits until the consumer takes a batch
//! (back-pressure), unless the consumer abandoned the feed or the scan is
//! cancelled, in which case bytes are dropped (their files then take the
//! engine's ordinary upload path).
//!
//! Larger files are not copied: the scan hands over the open file it hashed
//! ([`HeldFile`]), which the upload streams through a
//! [`crate::verify::VerifyingReader`]. Open files are bounded the same way: at
//! most `max_held_files` are queued or being uploaded at once (a place is
//! given back when the upload drops the reader); a scan thread that would
//! exceed that waits, so thousands of large files never exhaust the process's
//! descriptors.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crate::cancel::Cancel;
use crate::hash::DigestSet;
use crate::pack::Frame;
use crate::verify::{FdSlots, HeldFile};

/// Files per batch, and stored bytes per batch: a batch ends at whichever
/// comes first. Each batch is one index lookup (and at most one pin
/// transaction) for the upload, so small files go 4,096 at a time (about
/// 8 MiB of source files).
pub const BATCH_FILES: usize = 4096;
pub const BATCH_BYTES: usize = 8 << 20;

pub type Batch = Vec<Frame>;

/// What `next_batch` found.
pub enum Next {
    Batch(Batch),
    /// The scan ended and every batch was taken (or the feed was abandoned).
    Done,
    /// Nothing yet within the timeout: ask again.
    Waiting,
}

/// What `next_file` found.
pub enum NextFile {
    File(HeldFile),
    Done,
    Waiting,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Batch>,
    queued_bytes: usize,
    current: Batch,
    current_bytes: usize,
    files: VecDeque<HeldFile>,
    seen: DigestSet,
    /// The scan finished (or failed): no more batches will come.
    closed: bool,
    /// The consumer gave up: never wait, drop what comes.
    abandoned: bool,
}

/// The digests a feed skips (the parent's): distinct 32-byte digests laid end
/// to end in sorted order, searched where they lie. A million-file parent
/// holds 32 MB of them; copied and sorted for every capture they cost more
/// than a capture after one edit. (Out of order, the feed only skips less: a
/// digest is skipped only where the search finds it.)
pub type Skip = Box<dyn AsRef<[u8]> + Send + Sync>;

pub struct BlobFeed {
    capacity: usize,
    /// Files larger than this are never fed.
    pub max_file: usize,
    skip: Skip,
    state: Mutex<State>,
    changed: Condvar,
    /// Open files handed over and not yet dropped by the upload.
    slots: Arc<FdSlots>,
    /// `State::abandoned`, readable while waiting for a slot (no lock nesting).
    gave_up: AtomicBool,
}

impl BlobFeed {
    pub fn new(capacity: usize, max_file: usize, skip: Skip, max_held_files: usize) -> BlobFeed {
        BlobFeed {
            capacity: capacity.max(BATCH_BYTES),
            max_file,
            skip,
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            slots: FdSlots::new(max_held_files),
            gave_up: AtomicBool::new(false),
        }
    }

    /// Open files handed over and not yet dropped.
    pub fn held_files(&self) -> usize {
        self.slots.held()
    }

    /// Hand over a file the scan just hashed (waits while `max_held_files`
    /// are out). Dropped instead when the consumer abandoned the feed or the
    /// scan is cancelled: its file then takes the ordinary upload path.
    pub fn push_file(&self, mut file: HeldFile, cancel: &Cancel) {
        if !self.wants(&file.digest) {
            return;
        }
        let slot = self
            .slots
            .acquire(|| cancel.is_cancelled() || self.gave_up.load(Ordering::Relaxed));
        let Some(slot) = slot else { return };
        file.slot = Some(slot);
        let mut state = self.lock();
        if state.abandoned || !state.seen.insert(file.digest) {
            return;
        }
        state.files.push_back(file);
        self.changed.notify_all();
    }

    /// The next file handed over, waiting at most `timeout`.
    pub fn next_file(&self, timeout: Duration) -> NextFile {
        let mut state = self.lock();
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(file) = state.files.pop_front() {
                return NextFile::File(file);
            }
            if state.closed || state.abandoned {
                return NextFile::Done;
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return NextFile::Waiting;
            }
            state = self
                .changed
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `digest` is worth feeding (not skipped, not fed yet).
    pub fn wants(&self, digest: &[u8; 32]) -> bool {
        crate::manifest::search((*self.skip).as_ref(), digest).is_err()
            && !self.lock().seen.contains(digest)
    }

    /// Feed one file's verified bytes, as a frame (waits while the queue is full).
    pub fn push(&self, frame: Frame, cancel: &Cancel) {
        self.push_within(frame, cancel, self.capacity);
    }

    /// Feed one chunk of a large file (`crate::chunking`): as [`BlobFeed::push`],
    /// with a queue of one batch: a large file's chunks come at the speed of
    /// a sequential read, so a short queue keeps the upload as busy and the
    /// capture's memory low (a 2 GiB file: 400 MB peak with the whole queue,
    /// 180 MB with a quarter of it and large allocations mapped apart).
    pub fn push_chunk(&self, frame: Frame, cancel: &Cancel) {
        self.push_within(frame, cancel, BATCH_BYTES);
    }

    fn push_within(&self, frame: Frame, cancel: &Cancel, capacity: usize) {
        let mut state = self.lock();
        if state.abandoned || !state.seen.insert(frame.digest) {
            return;
        }
        state.current_bytes += frame.stored.len();
        state.current.push(frame);
        if state.current.len() < BATCH_FILES && state.current_bytes < BATCH_BYTES {
            return;
        }
        let batch = std::mem::take(&mut state.current);
        let bytes = std::mem::take(&mut state.current_bytes);
        while state.queued_bytes + bytes > capacity && !state.abandoned && !state.queue.is_empty() {
            if cancel.is_cancelled() {
                return;
            }
            state = self
                .changed
                .wait_timeout(state, Duration::from_millis(50))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        if state.abandoned {
            return;
        }
        state.queued_bytes += bytes;
        state.queue.push_back(batch);
        self.changed.notify_all();
    }

    /// No more files: queue what is left and wake the consumer.
    pub fn close(&self) {
        let mut state = self.lock();
        if !state.current.is_empty() {
            let batch = std::mem::take(&mut state.current);
            state.queued_bytes += std::mem::take(&mut state.current_bytes);
            state.queue.push_back(batch);
        }
        state.closed = true;
        self.changed.notify_all();
    }

    /// The consumer stops: queued bytes are freed, the scan never waits again.
    pub fn abandon(&self) {
        self.gave_up.store(true, Ordering::Relaxed);
        let files = {
            let mut state = self.lock();
            state.abandoned = true;
            state.queue.clear();
            state.current.clear();
            state.queued_bytes = 0;
            self.changed.notify_all();
            std::mem::take(&mut state.files)
        };
        // Closed outside the lock: each gives its slot back.
        drop(files);
        self.slots.wake_all();
    }

    /// The next batch, waiting at most `timeout`.
    pub fn next_batch(&self, timeout: Duration) -> Next {
        let mut state = self.lock();
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(batch) = state.queue.pop_front() {
                state.queued_bytes -= batch.iter().map(|f| f.stored.len()).sum::<usize>();
                self.changed.notify_all();
                return Next::Batch(batch);
            }
            if state.closed || state.abandoned {
                return Next::Done;
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return Next::Waiting;
            }
            state = self
                .changed
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// Closes the feed when the scan ends, however it ends.
pub struct CloseOnDrop<'a>(pub Option<&'a BlobFeed>);

impl Drop for CloseOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(feed) = self.0 {
            feed.close();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feeds_once_skips_and_drains() {
        let feed = BlobFeed::new(0, 1 << 20, Box::new([9u8; 32].to_vec()), 4);
        let cancel = Cancel::new();
        assert!(!feed.wants(&[9u8; 32]));
        assert!(feed.wants(&[1u8; 32]));
        feed.push(Frame::encode([1u8; 32], b"a"), &cancel);
        feed.push(Frame::encode([1u8; 32], b"a"), &cancel);
        assert!(!feed.wants(&[1u8; 32]));
        assert!(matches!(
            feed.next_batch(Duration::from_millis(1)),
            Next::Waiting
        ));
        feed.close();
        let Next::Batch(batch) = feed.next_batch(Duration::from_millis(1)) else {
            panic!("a batch");
        };
        assert_eq!(batch.len(), 1);
        assert!(matches!(
            feed.next_batch(Duration::from_millis(1)),
            Next::Done
        ));
    }
}
