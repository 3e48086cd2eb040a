//! Hashing the files the stat cache did not vouch for: one task per
//! directory's files, each file read once.

use std::cell::RefCell;
use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;

use crate::cancel::Cancel;
use crate::chunking::Sinks;
use crate::error::ScanError;
use crate::fs;
use crate::hash::{self, HashError};
use crate::pack::Frame;
use crate::redact::SecretSet;
use crate::verify::HeldFile;
use crate::walk::FileSlot;

/// How often a file that changes while we hash it is retried before giving up.
const HASH_ATTEMPTS: usize = 3;

thread_local! {
    /// One read buffer per pool thread (the pool lives for one scan).
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Files hashed per task at most: a task opens its directory once, and a
/// directory of 100,000 files is still spread over every thread.
pub(super) const HASH_TASK_FILES: usize = 64;

/// Files of one directory to hash: per file its path from the root, the
/// length of its name (the path's last bytes) and its slot.
pub(super) struct HashTask<'b> {
    pub(super) dir: &'b str,
    pub(super) files: Vec<(String, usize, &'b mut FileSlot)>,
}

impl<'b> HashTask<'b> {
    pub(super) fn new(dir: &'b str) -> HashTask<'b> {
        HashTask {
            dir,
            files: Vec::new(),
        }
    }

    /// The directory, opened beneath the root without following links (an
    /// O_PATH fd: only opened beneath); None for the root itself, and when it
    /// cannot be opened.
    pub(super) fn open_dir(&self, root_fd: RawFd) -> Option<std::os::fd::OwnedFd> {
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
