//! The verifying reader: the bytes of a file the scan hashed, streamed again
//! from the scan's own open file for the upload, checked on the way.
//!
//! The scan opens each file beneath the held root fd (`O_NOFOLLOW`, no symlink
//! in any component), hashes it, and, for a file too large to hand over as
//! bytes, hands over the open file itself ([`HeldFile`], through the feed). The
//! upload reads that fd with `pread` (its file position is the scan's, and
//! nobody else's), zeroes the secrets again, hashes again, and yields a chunk
//! only while everything still matches: the last chunk comes out only after
//!
//! * the bytes hashed equal the digest the scan put in the manifest, at exactly
//!   the scanned size (a read at that offset finds the end), and
//! * the fd's fstat (dev, ino, mode, size, mtime, ctime) equals the one the scan
//!   hashed under, before the first read and after the last.
//!
//! Otherwise [`ReadError::Changed`]: the caller hashes the path again or reports
//! FILE_CHANGED, and an upload fed by this reader never completes with torn
//! bytes. Nothing is re-opened by path: a file swapped for a symlink after the
//! scan is still the inode the scan opened inside the workspace (and its
//! unlink changed its ctime, so it fails the check).
//!
//! Open files are a bounded resource: [`FdSlots`] caps how many the scan may
//! hand over before the upload has closed some (back-pressure on the scan).

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crate::cancel::Cancel;
use crate::fs::{self, Stat};
use crate::hash::{self, HashError};
use crate::redact::{SecretMatch, SecretSet, ZeroingStream};

/// Bytes per chunk handed to the upload.
pub const CHUNK: usize = 1 << 20;

/// A cap on open files handed from the scan to the upload.
pub struct FdSlots {
    held: Mutex<usize>,
    freed: Condvar,
    limit: usize,
}

/// One place under the cap; given back when dropped (with the file it guards).
pub struct FdSlot(Arc<FdSlots>);

impl FdSlots {
    pub fn new(limit: usize) -> Arc<FdSlots> {
        Arc::new(FdSlots {
            held: Mutex::new(0),
            freed: Condvar::new(),
            limit: limit.max(1),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, usize> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wait for a free place; None as soon as `give_up()` says so (checked
    /// at least every 50 ms).
    pub fn acquire(self: &Arc<Self>, give_up: impl Fn() -> bool) -> Option<FdSlot> {
        let mut held = self.lock();
        loop {
            if give_up() {
                return None;
            }
            if *held < self.limit {
                *held += 1;
                return Some(FdSlot(self.clone()));
            }
            held = self
                .freed
                .wait_timeout(held, Duration::from_millis(50))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Places taken now.
    pub fn held(&self) -> usize {
        *self.lock()
    }

    pub fn wake_all(&self) {
        self.freed.notify_all();
    }
}

impl Drop for FdSlot {
    fn drop(&mut self) {
        let mut held = self.0.lock();
        *held -= 1;
        self.0.freed.notify_all();
    }
}

/// A file the scan hashed, still open, with what it saw.
pub struct HeldFile {
    pub file: File,
    /// Workspace-relative path (names it in messages and for a re-hash).
    pub path: String,
    pub digest: [u8; 32],
    /// The fstat the file was hashed under (equal before and after the read).
    pub stat: Stat,
    pub secrets: SecretSet,
    /// Its place under the feed's cap, if it holds one.
    pub slot: Option<FdSlot>,
}

#[derive(Debug)]
pub enum ReadError {
    /// Not the bytes or the file the scan hashed any more (or gone).
    Changed,
    Cancelled,
    Io(io::Error),
}

/// `Read` over `pread` from a running offset: independent of the fd's position.
struct PreadAt {
    file: Arc<File>,
    offset: u64,
}

impl Read for PreadAt {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.file.read_at(buf, self.offset)?;
        self.offset += n as u64;
        Ok(n)
    }
}

pub struct VerifyingReader {
    file: Arc<File>,
    pub path: String,
    /// The digest the bytes must have or, for a reader opened by
    /// [`VerifyingReader::open_unhashed`], the one they had (once `complete`).
    pub digest: [u8; 32],
    pub size: u64,
    stat: Stat,
    /// The digest is learned from the bytes, not checked against them.
    learning: bool,
    /// Every byte came out and every check at the end passed.
    pub complete: bool,
    /// Where secrets were zeroed, taken from the stream once `complete`.
    found: Option<Vec<SecretMatch>>,
    stream: ZeroingStream<PreadAt>,
    hasher: blake3::Hasher,
    emitted: u64,
    started: bool,
    finished: bool,
    /// Set from another thread to stop at the next chunk (`Cancelled`).
    pub stop: Cancel,
    /// Bytes handed out so far, readable from another thread while a copy
    /// runs (progress reports; relaxed: a monotone count of its own).
    pub progress: Arc<AtomicU64>,
    _slot: Option<FdSlot>,
}

/// What [`VerifyingReader`]'s bytes are checked against at their end: the
/// file (nothing past its size), its stat, and whether the digest is learned
/// rather than checked.
struct Expected<'r> {
    file: &'r File,
    stat: &'r Stat,
    learning: bool,
}

fn stat_unchanged(file: &File, expected: &Stat) -> Result<(), ReadError> {
    match fs::fstat(file.as_raw_fd()) {
        Ok(now) if now == *expected => Ok(()),
        Ok(_) => Err(ReadError::Changed),
        Err(e) => Err(ReadError::Io(e)),
    }
}

impl VerifyingReader {
    /// The reader over a file the scan handed over.
    pub fn from_held(held: HeldFile) -> VerifyingReader {
        Self::new(
            Arc::new(held.file),
            held.path,
            held.digest,
            held.stat,
            held.secrets,
            held.slot,
        )
    }

    /// Open `rel` beneath `root_fd` (no symlink in any component) to stream
    /// it as it is now, for a file that changed after the scan: the bytes are
    /// hashed on the way and the digest is learned, not checked, so the file is
    /// read once to hash and upload it (the store names the blob when it has
    /// the digest). The fstat taken now must hold from the first read to past
    /// the last, at exactly its size: otherwise `Changed`, never a last chunk.
    /// Changed also when the file is gone, a symlink or not a regular file.
    pub fn open_unhashed(
        root_fd: RawFd,
        rel: &str,
        secrets: SecretSet,
    ) -> Result<VerifyingReader, ReadError> {
        let (file, stat) = Self::open_regular(root_fd, rel)?;
        let mut reader = Self::new(
            Arc::new(file),
            rel.to_string(),
            [0; 32],
            stat,
            secrets,
            None,
        );
        reader.learning = true;
        Ok(reader)
    }

    /// The regular file at `rel` beneath `root_fd` and its fstat; Changed when
    /// it is gone, a symlink (in any component) or not a regular file.
    fn open_regular(root_fd: RawFd, rel: &str) -> Result<(File, Stat), ReadError> {
        let fd = match fs::open_to_read(root_fd, rel.as_bytes()) {
            Ok(fd) => fd,
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENOENT)
                        | Some(libc::ELOOP)
                        | Some(libc::ENOTDIR)
                        | Some(libc::EXDEV)
                ) =>
            {
                return Err(ReadError::Changed)
            }
            Err(e) => return Err(ReadError::Io(e)),
        };
        let file = File::from(fd);
        let stat = fs::fstat(file.as_raw_fd()).map_err(ReadError::Io)?;
        if !stat.is_file() {
            return Err(ReadError::Changed);
        }
        Ok((file, stat))
    }

    /// The fstat the bytes are read under.
    pub fn stat(&self) -> &Stat {
        &self.stat
    }

    /// Where secrets were zeroed in the bytes (offset order), once `complete`.
    pub fn secret_matches(&mut self) -> &[SecretMatch] {
        if self.complete && self.found.is_none() {
            self.found = Some(self.stream.matches());
        }
        self.found.as_deref().unwrap_or_default()
    }

    /// Open `rel` beneath `root_fd` (no symlink in any component) to upload
    /// the bytes the manifest records as `digest` and `size`: for a file whose
    /// hash the stat cache vouched for, or one hashed again. The fstat taken
    /// now must hold until the end. Changed when the file is gone, a symlink,
    /// not a regular file, or not `size` bytes.
    pub fn open(
        root_fd: RawFd,
        rel: &str,
        digest: [u8; 32],
        size: u64,
        secrets: SecretSet,
    ) -> Result<VerifyingReader, ReadError> {
        let (file, stat) = Self::open_regular(root_fd, rel)?;
        if stat.size != size {
            return Err(ReadError::Changed);
        }
        Ok(Self::new(
            Arc::new(file),
            rel.to_string(),
            digest,
            stat,
            secrets,
            None,
        ))
    }

    fn new(
        file: Arc<File>,
        path: String,
        digest: [u8; 32],
        stat: Stat,
        secrets: SecretSet,
        slot: Option<FdSlot>,
    ) -> VerifyingReader {
        let stream = ZeroingStream::new(
            PreadAt {
                file: file.clone(),
                offset: 0,
            },
            secrets,
            CHUNK,
        );
        VerifyingReader {
            file,
            path,
            digest,
            size: stat.size,
            stat,
            learning: false,
            complete: false,
            found: None,
            stream,
            hasher: blake3::Hasher::new(),
            emitted: 0,
            started: false,
            finished: false,
            stop: Cancel::new(),
            progress: Arc::new(AtomicU64::new(0)),
            _slot: slot,
        }
    }

    /// The next zeroed chunk, `None` after the last. The last chunk is only
    /// returned once the whole file matched (see the module docs); any
    /// mismatch is `Changed`, and the reader is spent.
    pub fn next_chunk(&mut self) -> Result<Option<&[u8]>, ReadError> {
        if self.finished {
            return Ok(None);
        }
        if self.stop.is_cancelled() {
            self.finished = true;
            return Err(ReadError::Cancelled);
        }
        if !self.started {
            self.started = true;
            if let Err(e) = stat_unchanged(&self.file, &self.stat) {
                self.finished = true;
                return Err(e);
            }
        }
        let expected = Expected {
            file: &self.file,
            stat: &self.stat,
            learning: self.learning,
        };
        let result = Self::advance(
            &mut self.stream,
            &mut self.hasher,
            &mut self.emitted,
            &mut self.digest,
            expected,
        );
        match result {
            Ok(Some(_)) if self.emitted < self.size => {}
            Ok(_) => {
                self.finished = true;
                self.complete = true;
            }
            Err(_) => self.finished = true,
        }
        if result.is_ok() {
            self.progress.store(self.emitted, Ordering::Relaxed);
        }
        result
    }

    fn advance<'a>(
        stream: &'a mut ZeroingStream<PreadAt>,
        hasher: &mut blake3::Hasher,
        emitted: &mut u64,
        digest: &mut [u8; 32],
        expected: Expected<'_>,
    ) -> Result<Option<&'a [u8]>, ReadError> {
        let Expected {
            file,
            stat,
            learning,
        } = expected;
        let size = stat.size;
        let chunk = stream.next_chunk().map_err(ReadError::Io)?;
        let len = chunk.map_or(0, |c| c.len() as u64);
        if let Some(chunk) = chunk {
            hasher.update(chunk);
        }
        *emitted += len;
        if *emitted > size || (len == 0 && *emitted < size) {
            return Err(ReadError::Changed); // grew, or ended early
        }
        if *emitted == size {
            // The end: nothing past the scanned size, the digest, the stat.
            let mut probe = [0u8; 1];
            if file.read_at(&mut probe, size).map_err(ReadError::Io)? != 0 {
                return Err(ReadError::Changed);
            }
            let found = *hasher.finalize().as_bytes();
            if !learning && found != *digest {
                return Err(ReadError::Changed);
            }
            stat_unchanged(file, stat)?;
            *digest = found;
        }
        Ok(chunk)
    }

    /// Every verified byte at once (for small files).
    pub fn read_all(&mut self, cancel: &Cancel) -> Result<Vec<u8>, ReadError> {
        let mut out = Vec::with_capacity(self.size as usize);
        while let Some(chunk) = self.next_chunk()? {
            out.extend_from_slice(chunk);
            if cancel.is_cancelled() {
                return Err(ReadError::Cancelled);
            }
        }
        Ok(out)
    }

    /// Pass every verified chunk to `sink`, stopping at the first error: the
    /// reader's (outer) or the sink's (inner, e.g. ENOSPC where it writes).
    pub fn copy_to(
        &mut self,
        cancel: &Cancel,
        sink: &mut dyn FnMut(&[u8]) -> io::Result<()>,
    ) -> Result<io::Result<()>, ReadError> {
        while let Some(chunk) = self.next_chunk()? {
            if let Err(e) = sink(chunk) {
                return Ok(Err(e));
            }
            if cancel.is_cancelled() {
                return Err(ReadError::Cancelled);
            }
        }
        Ok(Ok(()))
    }
}

/// What [`Rehasher::rehash`] found at a path.
pub enum Rehash {
    /// Gone (or a parent is no longer a directory).
    Gone,
    /// There, but no longer a regular file (its stat).
    NotRegular(Stat),
    /// A regular file larger than `unread_above`, not read (its stat).
    Larger(Stat),
    /// Hashed: the digest of the zeroed bytes, the fstat they were read under,
    /// where secrets were zeroed, and (`keep_small`, a file under
    /// `hash::WHOLE_READ_LIMIT`) those very zeroed bytes, for the upload.
    Hashed([u8; 32], Stat, Vec<SecretMatch>, Option<Vec<u8>>),
}

/// The fstat of `rel` beneath `root_fd` (no symlink in any component), None
/// when it is gone or no longer reachable that way: to tell, without reading
/// it, whether a file is still the one a [`Rehasher::rehash`] read.
pub fn stat_beneath(root_fd: RawFd, rel: &str) -> io::Result<Option<Stat>> {
    match fs::open_beneath(root_fd, rel.as_bytes(), fs::READ_FLAGS) {
        Ok(fd) => fs::fstat(fd.as_raw_fd()).map(Some),
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ENOENT) | Some(libc::ELOOP) | Some(libc::ENOTDIR) | Some(libc::EXDEV)
            ) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// How often a file that changes while it is hashed again is retried.
const REHASH_ATTEMPTS: usize = 3;

/// Hashes files beneath a root again (no symlink in any component; the fstat
/// before and after the read must match), for files that changed after the
/// scan. How [`Rehasher::rehash`] reads: the secrets to zero and the cancel
/// token; `keep_small`: a file small enough to be read whole also hands back
/// the zeroed bytes it hashed, so the upload sends them as they are (a
/// changed small file is read once more, not once to hash and once again to
/// upload); `unread_above`: a file larger than that is not read (`Larger`),
/// so a caller that expected a small file can stream a large one instead, in
/// its one read.
pub struct Rehasher<'a> {
    pub secrets: &'a SecretSet,
    pub cancel: &'a Cancel,
    pub keep_small: bool,
    pub unread_above: Option<u64>,
    /// The whole-read buffer, kept from file to file: made afresh (1 MiB,
    /// zeroed) for each of a thousand small files it cost ~0.5 s of page
    /// faults and memset where the reads took 25 ms.
    scratch: Vec<u8>,
}

impl<'a> Rehasher<'a> {
    pub fn new(secrets: &'a SecretSet, cancel: &'a Cancel) -> Rehasher<'a> {
        Rehasher {
            secrets,
            cancel,
            keep_small: false,
            unread_above: None,
            scratch: Vec::new(),
        }
    }

    /// Hash `rel` again: `Gone` when it no longer exists, `NotRegular` when
    /// something else stands there, otherwise `Hashed` with the stat it was
    /// read under. `Changed` when it kept changing; `Io` for ELOOP (now a
    /// symlink) and other failures to read it.
    pub fn rehash(&mut self, root_fd: RawFd, rel: &str) -> Result<Rehash, ReadError> {
        let fd = match fs::open_to_read(root_fd, rel.as_bytes()) {
            Ok(fd) => fd,
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENOTDIR)) => {
                return Ok(Rehash::Gone)
            }
            Err(e) => return Err(ReadError::Io(e)),
        };
        let file = Arc::new(File::from(fd));
        for _ in 0..REHASH_ATTEMPTS {
            let before = fs::fstat(file.as_raw_fd()).map_err(ReadError::Io)?;
            if !before.is_file() {
                return Ok(Rehash::NotRegular(before));
            }
            if self.unread_above.is_some_and(|limit| before.size > limit) {
                return Ok(Rehash::Larger(before));
            }
            let mut found = Vec::new();
            let reader = PreadAt {
                file: file.clone(),
                offset: 0,
            };
            let options = hash::HashOptions {
                secrets: self.secrets,
                cancel: self.cancel,
                parallel: false,
            };
            let (digest, size) = hash::hash_reader_recording(
                reader,
                Some(before.size),
                options,
                &mut self.scratch,
                &mut found,
            )
            .map_err(|e| match e {
                HashError::Io(e) => ReadError::Io(e),
                HashError::Cancelled => ReadError::Cancelled,
            })?;
            let after = fs::fstat(file.as_raw_fd()).map_err(ReadError::Io)?;
            if after == before && size == before.size {
                // Read whole (under the limit): the scratch holds exactly the
                // zeroed bytes just hashed (see `hash::hash_reader_recording`).
                let kept = (self.keep_small && (size as usize) < hash::WHOLE_READ_LIMIT)
                    .then(|| self.scratch[..size as usize].to_vec());
                return Ok(Rehash::Hashed(digest, before, found, kept));
            }
        }
        Err(ReadError::Changed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    fn held(dir: &std::path::Path, name: &str, data: &[u8], secrets: &SecretSet) -> HeldFile {
        let path = dir.join(name);
        std::fs::File::create(&path)
            .unwrap()
            .write_all(data)
            .unwrap();
        let file = File::open(&path).unwrap();
        let stat = fs::fstat(file.as_raw_fd()).unwrap();
        let zeroed = crate::redact::zero_all(data, secrets);
        HeldFile {
            file,
            path: name.into(),
            digest: *blake3::hash(&zeroed).as_bytes(),
            stat,
            secrets: secrets.clone(),
            slot: None,
        }
    }

    /// A directory of the test's own, removed when the test ends.
    struct Scratch(std::path::PathBuf);

    impl std::ops::Deref for Scratch {
        type Target = std::path::Path;
        fn deref(&self) -> &std::path::Path {
            &self.0
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn scratch() -> Scratch {
        let dir = std::env::temp_dir().join(format!(
            "ckpt-verify-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    #[test]
    fn streams_zeroed_bytes_and_verifies() {
        let dir = scratch();
        let secrets = SecretSet::new(&[b"s3cr3t!"]).unwrap();
        let mut data: Vec<u8> = (0..(3 * CHUNK + 77)).map(|i| (i % 251) as u8).collect();
        data[CHUNK - 3..CHUNK + 4].copy_from_slice(b"s3cr3t!"); // spans a chunk boundary
        let mut reader = VerifyingReader::from_held(held(&dir, "a", &data, &secrets));
        let got = reader.read_all(&Cancel::new()).unwrap();
        assert_eq!(got, crate::redact::zero_all(&data, &secrets));
        assert!(reader.next_chunk().unwrap().is_none());
    }

    #[test]
    fn a_rewrite_after_the_scan_is_changed_never_the_last_chunk() {
        let dir = scratch();
        let data = vec![7u8; 2 * CHUNK + 5];
        let h = held(&dir, "b", &data, &SecretSet::empty());
        // Same size, other bytes, mtime put back: ctime still moves.
        let mtime = h.stat.mtime_ns;
        std::fs::write(dir.join("b"), vec![8u8; data.len()]).unwrap();
        let c = std::ffi::CString::new(dir.join("b").to_string_lossy().as_bytes()).unwrap();
        let times = [
            libc::timespec {
                tv_sec: mtime / 1_000_000_000,
                tv_nsec: mtime % 1_000_000_000,
            },
            libc::timespec {
                tv_sec: mtime / 1_000_000_000,
                tv_nsec: mtime % 1_000_000_000,
            },
        ];
        // SAFETY: valid C string and two timespecs.
        unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), 0) };
        let mut reader = VerifyingReader::from_held(h);
        assert!(matches!(reader.next_chunk(), Err(ReadError::Changed)));
        assert!(reader.next_chunk().unwrap().is_none());
    }

    #[test]
    fn a_wrong_digest_fails_before_the_last_chunk() {
        let dir = scratch();
        let data = vec![1u8; CHUNK + 10];
        let mut h = held(&dir, "c", &data, &SecretSet::empty());
        h.digest = [0u8; 32];
        let mut reader = VerifyingReader::from_held(h);
        assert!(reader.next_chunk().unwrap().is_some()); // the first of two
        assert!(matches!(reader.next_chunk(), Err(ReadError::Changed)));
    }

    #[test]
    fn an_unhashed_reader_learns_the_digest_and_spans_of_what_it_streamed() {
        let dir = scratch();
        let secrets = SecretSet::new(&[b"s3cr3t!"]).unwrap();
        let mut data = vec![5u8; 2 * CHUNK + 9];
        data[CHUNK - 2..CHUNK + 5].copy_from_slice(b"s3cr3t!");
        std::fs::write(dir.join("d"), &data).unwrap();
        let root = File::open(&*dir).unwrap();
        let mut reader =
            VerifyingReader::open_unhashed(root.as_raw_fd(), "d", secrets.clone()).unwrap();
        assert!(!reader.complete);
        let got = reader.read_all(&Cancel::new()).unwrap();
        let zeroed = crate::redact::zero_all(&data, &secrets);
        assert_eq!(got, zeroed);
        assert!(reader.complete);
        assert_eq!(reader.digest, *blake3::hash(&zeroed).as_bytes());
        let spans: Vec<_> = reader
            .secret_matches()
            .iter()
            .map(|m| (m.offset, m.len))
            .collect();
        assert_eq!(spans, [((CHUNK - 2) as u64, 7)]);
    }

    #[test]
    fn an_unhashed_reader_of_a_file_that_grows_is_changed_never_complete() {
        let dir = scratch();
        std::fs::write(dir.join("e"), vec![1u8; CHUNK + 3]).unwrap();
        let root = File::open(&*dir).unwrap();
        let mut reader =
            VerifyingReader::open_unhashed(root.as_raw_fd(), "e", SecretSet::empty()).unwrap();
        assert!(reader.next_chunk().unwrap().is_some());
        std::fs::OpenOptions::new()
            .append(true)
            .open(dir.join("e"))
            .unwrap()
            .write_all(b"more")
            .unwrap();
        assert!(matches!(reader.next_chunk(), Err(ReadError::Changed)));
        assert!(!reader.complete);
        assert!(matches!(
            VerifyingReader::open_unhashed(root.as_raw_fd(), "gone", SecretSet::empty()),
            Err(ReadError::Changed)
        ));
    }

    #[test]
    fn slots_bound_and_release() {
        let slots = FdSlots::new(2);
        let a = slots.acquire(|| false).unwrap();
        let _b = slots.acquire(|| false).unwrap();
        assert!(slots.acquire(|| true).is_none());
        assert_eq!(slots.held(), 2);
        drop(a);
        assert_eq!(slots.held(), 1);
        assert!(slots.acquire(|| false).is_some());
    }
}
