//! Hashing the files the stat cache did not vouch for: one task per
//! directory's files, each file read once.

use std::cell::RefCell;
use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;

use rayon::prelude::*;

use crate::cancel::Cancel;
use crate::chunking::Sinks;
use crate::error::ScanError;
use crate::fs::{self, Stat};
use crate::hash::{self, HashError};
use crate::pack::Frame;
use crate::redact::{SecretMatch, SecretSet};
use crate::verify::HeldFile;
use crate::walk::{Batch, FileSlot, Kind, ScanProgress};

use super::order::join_path;

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

/// What hashing a file needs besides the file: the root (naming it in
/// messages), the secrets zeroed in what is read, the scan's cancel flag and
/// where the bytes go besides the hash.
#[derive(Clone, Copy)]
pub(crate) struct HashContext<'a> {
    pub root_path: &'a Path,
    pub secrets: &'a SecretSet,
    pub cancel: &'a Cancel,
    pub sinks: Sinks<'a>,
}

/// Hash one file, `path` from the root (for messages and the feed), opened
/// as `at` without following links: a directory fd beneath the root and the
/// file's path from it (its name, or its whole path from the root fd).
/// Returns the bytes read. The slot's stat becomes the fstat of what was hashed.
pub(crate) fn hash_slot(
    at: (RawFd, &str),
    path: &str,
    slot: &mut FileSlot,
    cx: &HashContext<'_>,
) -> Result<u64, ScanError> {
    let abs = || cx.root_path.join(path);
    let (secrets, cancel, feed) = (cx.secrets, cx.cancel, cx.sinks.feed);
    if cancel.is_cancelled() {
        return Err(ScanError::Cancelled);
    }
    let Some(file) = open_slot(at, slot, &abs)? else {
        return Ok(0);
    };
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
        if let Some(chunking) = cx.sinks.chunking.filter(|c| c.params.applies(before.size)) {
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
        let read = WholeRead {
            file: &file,
            before,
            rewind: attempt > 0,
            trust_walk,
        };
        let (digest, size, kept) = match read.hash(cx, &mut found) {
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
            feed_hashed(file, path, digest, before, kept, cx);
            return Ok(total);
        }
    }
    Err(ScanError::Changed(abs()))
}

/// The file of `slot` opened to read as `at`; None when it was deleted since
/// the walk (the slot is then marked vanished).
fn open_slot(
    at: (RawFd, &str),
    slot: &mut FileSlot,
    abs: &dyn Fn() -> std::path::PathBuf,
) -> Result<Option<File>, ScanError> {
    match fs::open_to_read(at.0, at.1.as_bytes()) {
        Ok(fd) => Ok(Some(File::from(fd))),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
            // Deleted since the walk: it is simply not part of this checkpoint.
            slot.vanished = true;
            Ok(None)
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
            Err(ScanError::Changed(abs()))
        }
        Err(e) => Err(ScanError::io(abs(), "open", e)),
    }
}

/// One read of a whole file stored whole, of `before.size` bytes: from its
/// start again (`rewind`) after an earlier attempt, and bounded by that size
/// + 1 while the walk's stat is trusted.
struct WholeRead<'f> {
    file: &'f File,
    before: Stat,
    rewind: bool,
    trust_walk: bool,
}

impl WholeRead<'_> {
    /// The zeroed bytes' digest and size, the secrets found in `found`, and
    /// the frame of a small file the feed wants (compressed now, while its
    /// bytes are in this thread's cache).
    fn hash(
        &self,
        cx: &HashContext<'_>,
        found: &mut Vec<SecretMatch>,
    ) -> std::io::Result<([u8; 32], u64, Option<Frame>)> {
        let before = self.before;
        SCRATCH.with(|scratch| {
            let mut scratch = scratch.borrow_mut();
            if self.rewind {
                let mut reader = self.file;
                std::io::Seek::rewind(&mut reader)?;
            }
            let limit = if self.trust_walk {
                before.size + 1
            } else {
                u64::MAX
            };
            let options = hash::HashOptions {
                secrets: cx.secrets,
                cancel: cx.cancel,
                parallel: true,
            };
            let (digest, size) = hash::hash_reader_recording(
                std::io::Read::take(hash::FileBytes::of(self.file, before.size), limit),
                Some(before.size),
                options,
                &mut scratch,
                found,
            )
            .map_err(|e| match e {
                HashError::Io(e) => e,
                HashError::Cancelled => std::io::Error::from(std::io::ErrorKind::Interrupted),
            })?;
            // A small file was read whole: the scratch holds exactly the zeroed
            // bytes just hashed. Keep their frame for the upload if it wants
            // them, compressed now, while they are in this thread's cache.
            let kept = match cx.sinks.feed {
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
        })
    }
}

/// Hand a file just hashed to the upload: its frame when it was kept, else
/// (too large to copy) the open file itself, when the feed wants its digest.
fn feed_hashed(
    file: File,
    path: &str,
    digest: [u8; 32],
    stat: Stat,
    kept: Option<Frame>,
    cx: &HashContext<'_>,
) {
    match (cx.sinks.feed, kept) {
        (Some(feed), Some(frame)) => feed.push(frame, cx.cancel),
        // Too large to copy: the open file itself goes to the upload.
        (Some(feed), None) if feed.wants(&digest) => feed.push_file(
            HeldFile {
                file,
                path: path.to_string(),
                digest,
                stat,
                secrets: cx.secrets.clone(),
                slot: None,
            },
            cx.cancel,
        ),
        _ => {}
    }
}

/// What the hashing stage did: files hashed, bytes read, and how many of the
/// files hashed the cache will hold (not those holding secrets).
pub(super) struct Hashed {
    pub(super) files: u64,
    pub(super) bytes: u64,
    pub(super) for_cache: usize,
}

/// Hash what the cache did not vouch for (in the walk's order: which file
/// is hashed first does not matter), a directory's files together: each
/// task opens its directory once, beneath the root, and its files by name
/// beneath that (one path component each, not the whole path per file:
/// ~13% of a cold capture's scan time in 8-deep trees).
pub(super) fn hash_files(
    pool: &rayon::ThreadPool,
    batches: &mut [Batch],
    all_reused: bool,
    root_fd: RawFd,
    progress: &ScanProgress,
    cx: &HashContext<'_>,
) -> Result<Hashed, ScanError> {
    let mut tasks = hash_tasks(batches, all_reused);
    let files = tasks.iter().map(|t| t.files.len() as u64).sum::<u64>();
    // Collecting into a Result stops the other workers at the first error.
    let sizes: Vec<u64> = pool
        .install(|| {
            tasks
                .par_iter_mut()
                .map(|task| task.hash(root_fd, progress, cx))
                .collect::<Result<Vec<u64>, ScanError>>()
        })
        .map_err(|e| {
            if cx.cancel.is_cancelled() {
                ScanError::Cancelled
            } else {
                e
            }
        })?;
    // Files holding secrets are never cached, so hashing them changes nothing there.
    let for_cache = tasks
        .iter()
        .flat_map(|task| &task.files)
        .filter(|(_, _, slot)| slot.secrets.is_empty())
        .count();
    Ok(Hashed {
        files,
        bytes: sizes.iter().sum(),
        for_cache,
    })
}

/// The files no hash was reused for, in tasks of one directory's files.
fn hash_tasks(batches: &mut [Batch], all_reused: bool) -> Vec<HashTask<'_>> {
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
    tasks
}

impl HashTask<'_> {
    /// Hash the task's files; the bytes read.
    fn hash(
        &mut self,
        root_fd: RawFd,
        progress: &ScanProgress,
        cx: &HashContext<'_>,
    ) -> Result<u64, ScanError> {
        // Not opened (gone, or swapped for a link since the walk):
        // each file is opened by its whole path, which says how.
        let dir_fd = self.open_dir(root_fd);
        let mut read = 0;
        for (path, name_len, slot) in self.files.iter_mut() {
            let at = match &dir_fd {
                Some(fd) => (fd.as_raw_fd(), &path[path.len() - *name_len..]),
                None => (root_fd, path.as_str()),
            };
            let bytes = hash_slot(at, path, slot, cx)?;
            ScanProgress::add(&progress.files_hashed, 1);
            ScanProgress::add(&progress.bytes_hashed, bytes);
            read += bytes;
        }
        Ok(read)
    }
}
