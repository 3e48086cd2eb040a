//! Listing one directory: open it (or take the fd its parent opened), read
//! its names (or reuse the cache's listing of it), judge each entry by the
//! policy, lstat and classify what is kept, and spawn a task per kept
//! subdirectory.

use std::ffi::CStr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering;

use crate::classify::{symlink_stays_inside, Unsupported};
use crate::error::ScanError;
use crate::fs::{self, DirReader, DirentType, Stat};
use crate::statcache::{self, DirStat, Listing, LoadedCache};

use super::{
    beyond_limits, Batch, FileCounts, FileSlot, Held, Kind, ListedDir, Opened, PreopenSlot,
    Refused, ScanProgress, SecretSpans, Shared, Walker,
};

impl Walker<'_> {
    fn open_dir(&self, rel: &str) -> std::io::Result<OwnedFd> {
        if rel.is_empty() {
            // A fresh open file description of the root (not a dup: readdir
            // offsets must not be shared with the root fd).
            // SAFETY: valid fd and a static C string.
            let fd = unsafe {
                libc::openat(self.root_fd, c".".as_ptr(), fs::DIR_FLAGS | libc::O_CLOEXEC)
            };
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // SAFETY: fresh fd owned by nobody else.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        fs::open_beneath(self.root_fd, rel.as_bytes(), fs::DIR_FLAGS)
    }

    /// A subdirectory `name` of the directory `dir_fd` being listed, opened
    /// now beneath it (one component, no link followed) for its own task, so
    /// the task need not resolve its whole path from the root again, and
    /// stat'ed through that fd: for a directory (never a link: the open does
    /// not follow one) that is its lstat, which is then taken once, not by the
    /// parent and again by its task. None when too many are held already or
    /// it cannot be opened as a directory (the caller then lstats it, and its
    /// task opens it by path).
    fn preopen<'s>(&self, shared: &'s Shared, dir_fd: RawFd, name: &CStr) -> Option<Opened<'s>> {
        let slot = PreopenSlot::take(&shared.preopened)?;
        let fd = fs::open_beneath(dir_fd, name.to_bytes(), fs::DIR_FLAGS).ok()?;
        let (stat, mount_root) = fs::stat_entry(fd.as_raw_fd(), c"").ok()?;
        Some(Opened {
            fd,
            stat,
            mount_root,
            slot,
        })
    }

    /// List the directory `rel` (`opened`: when its parent opened it).
    pub(super) fn visit<'s>(
        &'s self,
        scope: &rayon::Scope<'s>,
        shared: &'s Shared,
        rel: String,
        included: bool,
        opened: Option<Opened<'s>>,
    ) {
        if shared.failed() {
            return;
        }
        match self.list(scope, shared, &rel, included, opened) {
            Ok((batch, unsupported)) => {
                // What will be manifest entries (a directory outside the include
                // list may still join them later, so the final count is higher).
                let entries = batch
                    .entries
                    .iter()
                    .filter(|e| {
                        !matches!(
                            e.kind,
                            Kind::Dir {
                                included: false,
                                ..
                            }
                        )
                    })
                    .count();
                ScanProgress::add(&self.progress.entries_seen, entries as u64);
                if !batch.entries.is_empty() {
                    shared
                        .found
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(batch);
                }
                if !unsupported.is_empty() {
                    shared
                        .unsupported
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .extend(unsupported);
                }
            }
            Err(error) => shared.fail(error),
        }
    }

    fn list<'s>(
        &'s self,
        scope: &rayon::Scope<'s>,
        shared: &'s Shared,
        rel: &str,
        parent_included: bool,
        opened: Option<Opened<'s>>,
    ) -> Result<(Batch, Refused), ScanError> {
        let Some((fd, dir_stat, _held)) = self.open_listed(rel, opened)? else {
            // Removed since its parent was listed: nothing to capture.
            return Ok(Default::default());
        };
        let recorded = self.cache.and_then(|c| Some((c, c.find_dir(rel)?)));
        let (held, listing, reused) = self.read_listing(rel, fd, &dir_stat, recorded)?;
        // Sized from the listing once (names and entries of a directory are
        // kept for the whole scan: no room left over from growing them).
        let listed = statcache::listing_names(&listing).count();
        let mut dir = DirListing {
            rel,
            parent_included,
            segments: rel.split('/').filter(|s| !s.is_empty()).collect(),
            fd: held.fd(),
            batch: Batch {
                dir: rel.to_string(),
                names: String::with_capacity(listing.len().saturating_sub(4 * listed)),
                entries: Vec::with_capacity(listed),
            },
            found: Vec::new(),
        };
        // A name holding a secret, excluded or not: this listing is not cached.
        let mut listing_secret = false;
        for (name, d_type) in statcache::listing_names(&listing) {
            if self.cancel.is_cancelled() {
                return Err(ScanError::Cancelled);
            }
            let secret_name = self.secrets.occurs_in(name.to_bytes());
            listing_secret |= secret_name;
            let dirent = Dirent {
                name,
                d_type,
                secret_name,
            };
            self.list_entry(scope, shared, &mut dir, &dirent)?;
        }
        drop(held);
        let DirListing {
            mut batch, found, ..
        } = dir;
        self.reuse_hashes_into(&mut batch, recorded, &shared.counts);
        if !listing_secret {
            shared
                .dirs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(ListedDir {
                    path: rel.to_string(),
                    stat: DirStat::of(&dir_stat),
                    listing,
                    reused,
                });
        }
        Ok((batch, found))
    }

    /// `rel/name` (or `rel`, or the root) as an absolute path, for messages.
    fn abs(&self, rel: &str, name: &[u8]) -> std::path::PathBuf {
        use std::os::unix::ffi::OsStrExt;
        let mut p = self.root_path.to_path_buf();
        if !rel.is_empty() {
            p.push(rel);
        }
        if !name.is_empty() {
            p.push(std::ffi::OsStr::from_bytes(name));
        }
        p
    }

    /// The directory `rel` to list, its fd and stat (and the preopened slot
    /// it holds); None when it was removed since its parent was listed.
    fn open_listed<'s>(
        &self,
        rel: &str,
        opened: Option<Opened<'s>>,
    ) -> Result<Option<(OwnedFd, Stat, Option<PreopenSlot<'s>>)>, ScanError> {
        // The stat of the inode about to be listed, taken before the listing:
        // a change after it leaves another stat (or a racy one) for next time.
        // (With whether it is a mount's root, in the same call.) Its parent
        // took it when it opened it; else it is opened by path and taken now.
        // (Its mount point check too: `opened` is never one.)
        if let Some(opened) = opened {
            return Ok(Some((opened.fd, opened.stat, Some(opened.slot))));
        }
        let fd = match self.open_dir(rel) {
            Ok(fd) => fd,
            // Removed since its parent was listed: nothing to capture.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
            // Replaced by a symlink or a file since it was listed.
            Err(e)
                if !rel.is_empty()
                    && matches!(e.raw_os_error(), Some(libc::ELOOP) | Some(libc::ENOTDIR)) =>
            {
                return Err(ScanError::Changed(self.abs(rel, b"")))
            }
            Err(e) => return Err(ScanError::io(self.abs(rel, b""), "open directory", e)),
        };
        let (dir_stat, mount_root) = fs::stat_entry(fd.as_raw_fd(), c"")
            .map_err(|e| ScanError::io(self.abs(rel, b""), "fstat", e))?;
        if !rel.is_empty() && fs::judge_mount_point(&dir_stat, self.root_dev, || mount_root) {
            // Its parent saw no mount point here: something was mounted or
            // swapped in since. Never crossed.
            return Err(ScanError::Changed(self.abs(rel, b"")));
        }
        Ok(Some((fd, dir_stat, None)))
    }

    /// The names of directory `rel` (open as `fd`, of stat `dir_stat`): the
    /// direction's, the cache's recorded listing when it may be reused, else
    /// read now. Returns what holds the fd (kept open while the entries are
    /// lstat'ed), the listing and whether it was reused.
    fn read_listing(
        &self,
        rel: &str,
        fd: OwnedFd,
        dir_stat: &Stat,
        recorded: Option<(&LoadedCache, usize)>,
    ) -> Result<(Held, Vec<u8>, bool), ScanError> {
        let directed = self.direction.and_then(|d| d.names(rel));
        let cached = recorded
            .filter(|_| directed.is_none())
            .and_then(|(c, index)| c.settled_listing(index, dir_stat));
        // Whichever holds the fd keeps it open while the entries are lstat'ed.
        Ok(match (directed, cached) {
            (Some(names), _) => (Held::Fd(fd), names, true),
            (None, Some(listing)) => (Held::Fd(fd), listing.to_vec(), true),
            (None, None) => {
                let list_error = |e| ScanError::io(self.abs(rel, b""), "list directory", e);
                let mut reader = DirReader::new(fd).map_err(list_error)?;
                let mut listing = Listing::default();
                while let Some((name, d_type)) = reader.next_entry_raw().map_err(list_error)? {
                    listing.push(name.to_bytes(), d_type);
                }
                (Held::Reader(reader), listing.bytes, false)
            }
        })
    }

    /// Judge, stat and classify one entry of the directory being listed:
    /// into its batch, its refusals, or nowhere (excluded, or vanished); a
    /// kept subdirectory gets a task of its own.
    fn list_entry<'s>(
        &'s self,
        scope: &rayon::Scope<'s>,
        shared: &'s Shared,
        dir: &mut DirListing<'_>,
        dirent: &Dirent<'_>,
    ) -> Result<(), ScanError> {
        let name_bytes = dirent.name.to_bytes();
        let lossy;
        let (name_str, utf8) = match std::str::from_utf8(name_bytes) {
            Ok(s) => (s, true),
            Err(_) => {
                lossy = String::from_utf8_lossy(name_bytes).into_owned();
                (lossy.as_str(), false)
            }
        };
        let Some(judged) = self.judge(shared, dir, dirent, name_str)? else {
            return Ok(());
        };
        if let Some(refused) = self.refusal(dir, dirent, utf8, &judged) {
            dir.found.push(refused);
            return Ok(());
        }
        let stat = judged.stat;
        if stat.is_file() {
            dir.batch.push(
                name_str,
                Kind::File(FileSlot {
                    stat,
                    hash: None,
                    vanished: false,
                    secrets: SecretSpans::default(),
                }),
            );
            return Ok(());
        }
        let path = String::from_utf8(child_path(dir.rel, name_bytes)).expect("joined UTF-8 parts");
        if stat.is_dir() {
            let included = judged.included;
            dir.batch.push(
                name_str,
                Kind::Dir {
                    mode: stat.mode & 0o777,
                    included,
                },
            );
            if self.direction.map_or(true, |d| d.enters(&path)) {
                let opened = judged.opened;
                scope.spawn(move |s| self.visit(s, shared, path, included, opened));
            }
        } else if stat.is_symlink() {
            self.list_symlink(dir, dirent.name, name_str, path)?;
        } else {
            let kind = Unsupported::from_mode(stat.mode).unwrap_or(Unsupported::Unknown);
            dir.found.push((path.into_bytes(), kind));
        }
        Ok(())
    }

    /// An entry's stat and the policy's word on it; None when the policy
    /// excludes it or it vanished. A subdirectory is opened now when it can
    /// be (see [`Walker::preopen`]), else lstat'ed.
    fn judge<'s>(
        &self,
        shared: &'s Shared,
        dir: &DirListing<'_>,
        dirent: &Dirent<'_>,
        name_str: &str,
    ) -> Result<Option<Judged<'s>>, ScanError> {
        let name = dirent.name;
        let lstat_error = |e| ScanError::io(self.abs(dir.rel, name.to_bytes()), "lstat", e);
        let decide = |is_dir| self.decide(&dir.segments, name_str, is_dir, dir.parent_included);
        // The kind from readdir when it knows, so excluded entries cost no lstat.
        // The lstat, with the kernel's word on whether it is a mount's
        // root (see `lstat`).
        let mut stat: Option<(Stat, Option<bool>)> = None;
        let mut is_dir = match DirentType::from_raw(dirent.d_type) {
            DirentType::Dir => true,
            DirentType::Unknown => match self.lstat(dir.fd, name).map_err(lstat_error)? {
                Some(st) => {
                    let d = st.0.is_dir();
                    stat = Some(st);
                    d
                }
                None => return Ok(None),
            },
            _ => false,
        };
        let Some(decision) = decide(is_dir) else {
            return Ok(None);
        };
        let mut opened = None;
        if stat.is_none() && is_dir {
            opened = self.preopen(shared, dir.fd, name);
            stat = opened.as_ref().map(|o| (o.stat, o.mount_root));
        }
        if stat.is_none() {
            stat = self.lstat(dir.fd, name).map_err(lstat_error)?;
        }
        let Some((stat, mount_root)) = stat else {
            // Vanished between readdir and lstat.
            return Ok(None);
        };
        let mut included = decision;
        if stat.is_dir() != is_dir {
            // Replaced between readdir and lstat: judge it as what it is now.
            is_dir = stat.is_dir();
            match decide(is_dir) {
                Some(inc) => included = inc,
                None => return Ok(None),
            }
        }
        // Non-directories outside a non-empty include list are not captured.
        if !is_dir && !included {
            return Ok(None);
        }
        Ok(Some(Judged {
            stat,
            mount_root,
            included,
            opened,
        }))
    }

    /// Why a kept entry cannot be in a checkpoint (its path and the reason),
    /// if it cannot.
    fn refusal(
        &self,
        dir: &DirListing<'_>,
        dirent: &Dirent<'_>,
        utf8: bool,
        judged: &Judged<'_>,
    ) -> Option<(Vec<u8>, Unsupported)> {
        let name_bytes = dirent.name.to_bytes();
        // The entry's full path, built only where it is needed (directories,
        // links, refusals): a file is its batch's directory and its name.
        let path_of = || child_path(dir.rel, name_bytes);
        if dirent.secret_name || (self.secrets.spans_names() && self.secrets.occurs_in(&path_of()))
        {
            // Named by a secret: never entered nor read, and shown masked.
            return Some((self.secrets.masked(&path_of()), Unsupported::SecretInName));
        }
        if !utf8 {
            // Its children would have non-UTF-8 paths too: report it, do not enter.
            return Some((path_of(), Unsupported::NonUtf8Name));
        }
        if name_bytes.contains(&b'\\') {
            // docs/contract.md#data-model refuses `\` in a path: refused here, before any upload,
            // so every path the scan emits is valid by construction.
            return Some((path_of(), Unsupported::BackslashName));
        }
        let len = dir.rel.len() + usize::from(!dir.rel.is_empty()) + name_bytes.len();
        if let Some(kind) = beyond_limits(dir.segments.len() + 1, len) {
            // Never entered: a walk's memory grows with depth times path length.
            return Some((path_of(), kind));
        }
        if fs::judge_mount_point(&judged.stat, self.root_dev, || judged.mount_root) {
            // A filesystem, or a bind mount of a file or a directory,
            // mounted inside the workspace: never crossed nor read.
            return Some((path_of(), Unsupported::MountPoint));
        }
        None
    }

    /// A kept symlink `name` at `path`: its row, or why it is refused.
    fn list_symlink(
        &self,
        dir: &mut DirListing<'_>,
        name: &CStr,
        name_str: &str,
        path: String,
    ) -> Result<(), ScanError> {
        let target = match fs::readlink_at(dir.fd, name) {
            Ok(t) => t,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(()),
            // No longer a symlink: swapped since its lstat.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                return Err(ScanError::Changed(self.abs(dir.rel, name.to_bytes())))
            }
            Err(e) => {
                return Err(ScanError::io(
                    self.abs(dir.rel, name.to_bytes()),
                    "readlink",
                    e,
                ))
            }
        };
        if self.secrets.occurs_in(&target) {
            dir.found
                .push((path.into_bytes(), Unsupported::SecretInTarget));
            return Ok(());
        }
        if !symlink_stays_inside(&path, &target, self.roots) {
            dir.found
                .push((path.into_bytes(), Unsupported::SymlinkEscapes));
            return Ok(());
        }
        match String::from_utf8(target) {
            Ok(target) => dir
                .batch
                .push(name_str, Kind::Symlink(target.into_boxed_str())),
            // The manifest stores targets as text; a non-UTF-8 one cannot be kept.
            Err(_) => dir
                .found
                .push((path.into_bytes(), Unsupported::NonUtf8Name)),
        }
        Ok(())
    }

    /// Give the batch's files the hashes the cache vouches for (its entries of
    /// this directory, read now, on this task's thread), and count them.
    fn reuse_hashes_into(
        &self,
        batch: &mut Batch,
        recorded: Option<(&LoadedCache, usize)>,
        counts: &FileCounts,
    ) {
        let Batch { names, entries, .. } = batch;
        let slots = entries
            .iter_mut()
            .filter_map(|entry| match &mut entry.kind {
                Kind::File(slot) => {
                    let at = entry.name_at as usize;
                    Some((&names[at..at + entry.name_len as usize], slot))
                }
                _ => None,
            });
        let (mut files, mut bytes, mut reused) = (0u64, 0u64, 0u64);
        let mut cached = None;
        for (name, slot) in slots {
            files += 1;
            bytes += slot.stat.size;
            if !self.reuse_hashes {
                continue;
            }
            // Read once, at the directory's first file.
            let cached = cached.get_or_insert_with(|| recorded.and_then(|(c, i)| c.dir_files(i)));
            if let Some(hash) = cached
                .as_ref()
                .and_then(|c| c.reusable(name.as_bytes(), &slot.stat))
            {
                slot.hash = Some(hash);
                reused += 1;
            }
        }
        counts.files.fetch_add(files, Ordering::Relaxed);
        counts.bytes.fetch_add(bytes, Ordering::Relaxed);
        counts.reused.fetch_add(reused, Ordering::Relaxed);
    }

    /// None when the policy excludes the entry, else whether it is included.
    fn decide(
        &self,
        parent: &[&str],
        name: &str,
        is_dir: bool,
        parent_included: bool,
    ) -> Option<bool> {
        if self.policy.excludes_name(parent.len(), name) {
            return None;
        }
        if !self.policy.has_patterns() {
            // The common case: no per-entry path to build.
            return Some(true);
        }
        let mut segments = Vec::with_capacity(parent.len() + 1);
        segments.extend_from_slice(parent);
        segments.push(name);
        if self.policy.excludes_entry(&segments, is_dir) {
            return None;
        }
        Some(
            self.policy
                .included_below(parent_included, &segments, is_dir),
        )
    }

    /// lstat relative to the directory; Ok(None) when the entry vanished.
    /// Taken with `statx`, which says in the same call whether the entry is
    /// a mount's root (see `fs::stat_entry`): a file bind-mounted into the
    /// workspace is one, and is never read.
    fn lstat(&self, dir_fd: RawFd, name: &CStr) -> std::io::Result<Option<(Stat, Option<bool>)>> {
        match fs::stat_entry(dir_fd, name) {
            Ok(st) => Ok(Some(st)),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// A directory being listed: what its entries are judged against, and what
/// the listing makes of them.
struct DirListing<'r> {
    rel: &'r str,
    parent_included: bool,
    /// `rel`'s path components.
    segments: Vec<&'r str>,
    /// The directory's fd, held while its entries are lstat'ed.
    fd: RawFd,
    batch: Batch,
    found: Refused,
}

/// One name of a listing: its raw `d_type`, and whether it holds a secret.
struct Dirent<'n> {
    name: &'n CStr,
    d_type: u8,
    secret_name: bool,
}

/// A kept entry's stat, whether it is a mount's root (as `fs::stat_entry`
/// says), whether the include list takes it, and its fd when it is a
/// directory opened now.
struct Judged<'s> {
    stat: Stat,
    mount_root: Option<bool>,
    included: bool,
    opened: Option<Opened<'s>>,
}

/// `rel/name` (`name` in the root) as bytes.
fn child_path(rel: &str, name: &[u8]) -> Vec<u8> {
    let mut path = Vec::with_capacity(rel.len() + 1 + name.len());
    if !rel.is_empty() {
        path.extend_from_slice(rel.as_bytes());
        path.push(b'/');
    }
    path.extend_from_slice(name);
    path
}
