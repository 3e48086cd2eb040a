//! Apply: the staged files moved into the workspace step by step, fd-relative,
//! and the stat cache told what was written.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;
use std::sync::atomic::Ordering;

use super::dirs::{remove_tree, DirStack, Reached};
use super::{
    cname, flat_name, in_place, is_errno, split_parent, Dest, Doomed, InPlace, Restore,
    RestoreError, Step, TargetFile,
};
use crate::cancel::Cancel;
use crate::fs::{self, Stat};
use crate::hash;
use crate::statcache::{self, CacheEntry};

impl Restore {
    /// Whether apply has more to do.
    pub fn done(&self) -> bool {
        self.step == Step::Done
    }

    /// Apply up to `budget` operations of the current step (steps run in
    /// order: staging's empty directories, deletions, directories, new
    /// directory trees moved in whole, other files by atomic rename,
    /// symlinks, file modes and mtimes, directory modes deepest first).
    /// Returns how many were done (files moved in with their directory count
    /// too; the empty directories count none); see [`Restore::done`].
    pub fn apply_some(&mut self, budget: usize, cancel: &Cancel) -> Result<usize, RestoreError> {
        let budget = budget.max(1);
        while self.step != Step::Done {
            if cancel.is_cancelled() {
                return Err(RestoreError::Cancelled);
            }
            let total = match self.step {
                Step::TreeDirs => self.plan.dirs_to_make.len(),
                Step::Deletions => self.plan.deletions.len(),
                Step::Dirs => self.plan.dirs_to_make.len(),
                Step::Trees => self.new_roots.len(),
                Step::Writes => self.plan.writes.len(),
                Step::Links => self.plan.links.len(),
                Step::FileMetadata => self.plan.file_metadata.len(),
                Step::DirModes => self.plan.dir_modes.len(),
                Step::Done => 0,
            };
            if self.cursor >= total {
                self.step = match self.step {
                    Step::TreeDirs => Step::Deletions,
                    Step::Deletions => Step::Dirs,
                    Step::Dirs => Step::Trees,
                    Step::Trees => Step::Writes,
                    Step::Writes => Step::Links,
                    Step::Links => Step::FileMetadata,
                    Step::FileMetadata => Step::DirModes,
                    Step::DirModes | Step::Done => Step::Done,
                };
                self.cursor = 0;
                continue;
            }
            let range = self.cursor..(self.cursor + budget).min(total);
            let count = match self.step {
                Step::TreeDirs => self.make_tree_dirs(range.clone())?,
                Step::Deletions => self.delete(range.clone())?,
                Step::Dirs => self.make_dirs(range.clone())?,
                Step::Trees => self.move_trees(range.clone())?,
                Step::Writes => self.parallel(range.clone(), Restore::rename_write)?,
                Step::Links => self.make_links(range.clone())?,
                Step::FileMetadata => self.set_file_metadata(range.clone())?,
                Step::DirModes => self.set_dir_modes(range.clone())?,
                Step::Done => 0,
            };
            self.cursor = range.end;
            return Ok(count);
        }
        Ok(0)
    }

    /// Flat writes of `range`, renamed in on a few threads; returns how many.
    fn parallel(
        &self,
        range: std::ops::Range<usize>,
        op: fn(&Restore, &mut DirStack<'_>, usize) -> Result<(), RestoreError>,
    ) -> Result<usize, RestoreError> {
        let indexes: Vec<usize> = range.filter(|&i| self.dests[i] == Dest::Flat).collect();
        // Contiguous chunks keep each thread's paths together (shared parents).
        let chunk = indexes.len().div_ceil(self.threads).max(1);
        std::thread::scope(|scope| {
            let handles: Vec<_> = indexes
                .chunks(chunk)
                .map(|part| {
                    scope.spawn(move || {
                        let mut dirs = DirStack::new(&self.ws);
                        for &i in part {
                            op(self, &mut dirs, i)?;
                        }
                        Ok(())
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or(Err(RestoreError::Cancelled)))
                .collect::<Result<Vec<()>, RestoreError>>()
                .map(drop)
        })?;
        Ok(indexes.len())
    }

    fn skip(&self, path: Vec<u8>) {
        let mut skipped = self.skipped.lock().unwrap_or_else(|e| e.into_inner());
        if !skipped.contains(&path) {
            skipped.push(path);
        }
    }

    fn delete(&self, range: std::ops::Range<usize>) -> Result<usize, RestoreError> {
        let count = range.len();
        let mut dirs = DirStack::new(&self.ws);
        for (path, kind) in &self.plan.deletions[range] {
            let (parent, name) = split_parent(path);
            let parent_fd = match dirs.reach(parent, false)? {
                Reached::Dir(fd) => fd,
                Reached::Absent => continue,
                Reached::OtherDevice(at) => {
                    self.skip(at);
                    continue;
                }
            };
            let cname = cname(name)?;
            match kind {
                Doomed::Dir => match fs::rmdir_at(parent_fd, &cname) {
                    Ok(()) => dirs.forget(),
                    // Holds excluded paths (or is a mount point): it stays.
                    Err(e)
                        if is_errno(
                            &e,
                            &[libc::ENOENT, libc::ENOTEMPTY, libc::EEXIST, libc::ENOTDIR],
                        ) => {}
                    Err(e) if is_errno(&e, &[libc::EBUSY]) => self.skip(path.clone()),
                    Err(e) => return Err(RestoreError::raced(self.ws.shown(path), "rmdir", e)),
                },
                Doomed::Leaf => match fs::unlink_at(parent_fd, &cname) {
                    Ok(()) => {}
                    Err(e)
                        if is_errno(
                            &e,
                            &[libc::ENOENT, libc::EISDIR, libc::ENOTDIR, libc::EPERM],
                        ) => {}
                    // A file mounted there since the scan: it stays.
                    Err(e) if is_errno(&e, &[libc::EBUSY]) => self.skip(path.clone()),
                    Err(e) => return Err(RestoreError::raced(self.ws.shown(path), "unlink", e)),
                },
                Doomed::Unsupported => {
                    let mut skipped = Vec::new();
                    remove_tree(&self.ws, parent_fd, &cname, path, &mut skipped)?;
                    for s in skipped {
                        self.skip(s);
                    }
                    dirs.forget();
                }
            }
        }
        Ok(count)
    }

    fn make_dirs(&self, range: std::ops::Range<usize>) -> Result<usize, RestoreError> {
        let mut dirs = DirStack::new(&self.ws);
        let mut count = 0;
        for path in &self.plan.dirs_to_make[range] {
            if self.tree_dirs.contains(path) {
                continue; // moves in with its new root
            }
            count += 1;
            if let Reached::OtherDevice(at) = dirs.reach(path.as_bytes(), true)? {
                self.skip(at);
            }
        }
        Ok(count)
    }

    /// Move each new root in from staging's tree with one rename; the files
    /// in it keep the stat they were written with (a directory rename changes
    /// only the directory's ctime), which is what the stat cache learns.
    fn move_trees(&self, range: std::ops::Range<usize>) -> Result<usize, RestoreError> {
        let prefix = self.tree_prefix();
        let mut staged_dirs = DirStack::beneath(&self.ws, self.tree.as_raw_fd(), &prefix);
        let mut dirs = DirStack::new(&self.ws);
        let mut moved_files = 0;
        for root in &self.new_roots[range] {
            let path = root.as_bytes();
            let (parent, leaf) = split_parent(path);
            let leaf = cname(leaf)?;
            let from = match staged_dirs.reach(parent, false)? {
                Reached::Dir(fd) => fd,
                _ => {
                    return Err(RestoreError::io(
                        self.ws.shown(path),
                        "restore",
                        io::Error::other("its staged directory vanished"),
                    ))
                }
            };
            let Some((to, _)) = self.reach_parent(&mut dirs, path)? else {
                continue;
            };
            let whole = self.move_dir(from, to, &leaf, path)?;
            let files = self.tree_writes_under(root);
            moved_files += files.len();
            self.count_written(files.iter().map(|&i| self.plan.writes[i].size));
            if whole {
                let prepared = self.prepared.lock().unwrap_or_else(|e| e.into_inner());
                let mut recorded = self.recorded.lock().unwrap_or_else(|e| e.into_inner());
                for index in files {
                    if let Some(written) = prepared.get(&index).filter(|w| w.verified) {
                        let entry = &self.plan.writes[index];
                        if entry.secrets {
                            continue;
                        }
                        recorded.push((
                            entry.path.clone(),
                            CacheEntry::new(&written.stat, entry.hash),
                        ));
                    }
                }
            }
        }
        Ok(moved_files)
    }

    /// The tree-staged writes beneath `root` (a contiguous run of the sorted writes).
    fn tree_writes_under(&self, root: &str) -> Vec<usize> {
        let mut prefix = root.as_bytes().to_vec();
        prefix.push(b'/');
        let writes = &self.plan.writes;
        let start = writes.partition_point(|w| w.path.as_bytes() < prefix.as_slice());
        (start..writes.len())
            .take_while(|&i| writes[i].path.as_bytes().starts_with(&prefix))
            .filter(|&i| self.dests[i] == Dest::Tree)
            .collect()
    }

    /// Rename staged directory `leaf` (in `from`) to `leaf` in `to`. Returns
    /// true when it moved in whole; when a directory appeared there since the
    /// plan, its content is merged entry by entry (those files are not
    /// recorded: the next capture hashes them); a non-directory standing
    /// there is unlinked first.
    fn move_dir(
        &self,
        from: RawFd,
        to: RawFd,
        leaf: &CStr,
        path: &[u8],
    ) -> Result<bool, RestoreError> {
        match fs::rename_at(from, leaf, to, leaf) {
            Ok(()) => return Ok(true),
            Err(e) if is_errno(&e, &[libc::ENOTDIR]) => {
                if fs::is_mount_root_at(to, leaf).ok().flatten() == Some(true) {
                    // A file mounted there: left alone, and what goes beneath it.
                    self.skip(path.to_vec());
                    return Ok(false);
                }
                // A file or symlink stands there: the link itself goes, never its target.
                let _ = fs::unlink_at(to, leaf);
                fs::rename_at(from, leaf, to, leaf)
                    .map_err(|e| RestoreError::raced(self.ws.shown(path), "rename into", e))?;
                return Ok(true);
            }
            // EBUSY: a mount point stands there (judged below, and skipped).
            Err(e) if is_errno(&e, &[libc::ENOTEMPTY, libc::EEXIST, libc::EBUSY]) => {}
            Err(e) => return Err(RestoreError::raced(self.ws.shown(path), "rename into", e)),
        }
        let source = fs::open_dir_at(from, leaf)
            .map_err(|e| RestoreError::raced(self.ws.shown(path), "open", e))?;
        let target = fs::open_dir_at(to, leaf)
            .map_err(|e| RestoreError::raced(self.ws.shown(path), "open", e))?;
        let stat = fs::fstat(target.as_raw_fd())
            .map_err(|e| RestoreError::raced(self.ws.shown(path), "fstat", e))?;
        if fs::is_mount_point_fd(target.as_raw_fd(), &stat, self.ws.dev) {
            self.skip(path.to_vec());
            return Ok(false);
        }
        let listing = source
            .try_clone()
            .map_err(|e| RestoreError::raced(self.ws.shown(path), "dup", e))?;
        let mut reader = fs::DirReader::new(listing)
            .map_err(|e| RestoreError::raced(self.ws.shown(path), "list", e))?;
        let mut children: Vec<(CString, fs::DirentType)> = Vec::new();
        while let Some((name, kind)) = reader
            .next_entry()
            .map_err(|e| RestoreError::raced(self.ws.shown(path), "list", e))?
        {
            children.push((name.to_owned(), kind));
        }
        drop(reader);
        for (child, kind) in children {
            let mut child_path = path.to_vec();
            child_path.push(b'/');
            child_path.extend_from_slice(child.to_bytes());
            if kind == fs::DirentType::Dir {
                self.move_dir(source.as_raw_fd(), target.as_raw_fd(), &child, &child_path)?;
            } else {
                self.rename_from(
                    source.as_raw_fd(),
                    &child,
                    target.as_raw_fd(),
                    &child,
                    &child_path,
                )?;
            }
        }
        Ok(false)
    }

    /// Rename one prepared flat file into place and record the inode it put there.
    fn rename_write(&self, dirs: &mut DirStack<'_>, index: usize) -> Result<(), RestoreError> {
        if let Some(patch) = self.chunks.as_ref().and_then(|c| c.patch_for(index)) {
            return self.patch_in_place(dirs, index, patch);
        }
        let entry = &self.plan.writes[index];
        let written = self
            .prepared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&index)
            .copied();
        let Some(written) = written else {
            return Err(RestoreError::io(
                self.ws.shown(entry.path.as_bytes()),
                "restore",
                io::Error::new(io::ErrorKind::NotFound, "its blob was never staged"),
            ));
        };
        let path = entry.path.as_bytes();
        let Some((parent_fd, leaf)) = self.reach_parent(dirs, path)? else {
            return Ok(());
        };
        if !self.rename_from(
            self.flat_dir(index),
            &flat_name(index),
            parent_fd,
            &leaf,
            path,
        )? {
            return Ok(());
        }
        self.count_written([entry.size]);
        if self.record && !entry.secrets {
            if let Some(stat) = self.read_back(parent_fd, &leaf, entry, &written.stat) {
                self.record_written(entry.path.clone(), CacheEntry::new(&stat, entry.hash));
            }
        }
        Ok(())
    }

    /// The stat cache learns `entry` for `path` at `finish` (its bytes were read back).
    pub(super) fn record_written(&self, path: String, entry: CacheEntry) {
        self.recorded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((path, entry));
    }

    /// The stat the cache may learn of the file `leaf` in `parent_fd` just
    /// renamed in: opened again, its `fstat` (the rename moved its ctime) when
    /// it is the inode staged (`ours`: same dev, ino, size, mtime and mode)
    /// and, read back through that fd after the `fstat`, holds the blob.
    /// None otherwise, or when it cannot be opened to be read (the next
    /// capture hashes it).
    fn read_back(
        &self,
        parent_fd: RawFd,
        leaf: &CStr,
        entry: &TargetFile,
        ours: &Stat,
    ) -> Option<Stat> {
        let fd = fs::open_leaf_at(parent_fd, leaf, libc::O_RDONLY).ok()?;
        let now = fs::fstat(fd.as_raw_fd()).ok()?;
        let same = now.is_file()
            && (now.dev, now.ino, now.size, now.mtime_ns, now.mode)
                == (ours.dev, ours.ino, ours.size, ours.mtime_ns, ours.mode);
        (same && hash::file_holds(fd.as_raw_fd(), entry.size, &entry.hash, None).ok()?)
            .then_some(now)
    }

    /// The parent directory of `path` (created as needed) and the leaf name;
    /// None when it lies on another device (reported, left alone).
    pub(super) fn reach_parent(
        &self,
        dirs: &mut DirStack<'_>,
        path: &[u8],
    ) -> Result<Option<(RawFd, CString)>, RestoreError> {
        let (parent, name) = split_parent(path);
        match dirs.reach(parent, true)? {
            Reached::Dir(fd) => Ok(Some((fd, cname(name)?))),
            Reached::Absent => Err(RestoreError::io(
                self.ws.shown(parent),
                "create",
                io::Error::from_raw_os_error(libc::ENOENT),
            )),
            Reached::OtherDevice(at) => {
                self.skip(at);
                Ok(None)
            }
        }
    }

    /// Atomically move staged `name` to `leaf` in `parent_fd`; a directory
    /// standing there is removed first (rename cannot replace it with a file).
    /// False when a mount point stands there: it is left alone (reported).
    fn rename_in(
        &self,
        parent_fd: RawFd,
        name: &CStr,
        leaf: &CStr,
        path: &[u8],
    ) -> Result<bool, RestoreError> {
        self.rename_from(self.staging.as_raw_fd(), name, parent_fd, leaf, path)
    }

    fn rename_from(
        &self,
        from: RawFd,
        name: &CStr,
        parent_fd: RawFd,
        leaf: &CStr,
        path: &[u8],
    ) -> Result<bool, RestoreError> {
        let refused = match fs::rename_at(from, name, parent_fd, leaf) {
            Ok(()) => return Ok(true),
            Err(e) => e,
        };
        let mount_point = || fs::is_mount_root_at(parent_fd, leaf).ok().flatten() == Some(true);
        if is_errno(&refused, &[libc::EBUSY, libc::EISDIR]) && mount_point() {
            self.skip(path.to_vec());
            return Ok(false);
        }
        if !is_errno(&refused, &[libc::EISDIR, libc::ENOTEMPTY, libc::EEXIST]) {
            return Err(RestoreError::raced(
                self.ws.shown(path),
                "rename into",
                refused,
            ));
        }
        let mut skipped = Vec::new();
        remove_tree(&self.ws, parent_fd, leaf, path, &mut skipped)?;
        let kept = !skipped.is_empty();
        for s in skipped {
            self.skip(s);
        }
        match fs::rename_at(from, name, parent_fd, leaf) {
            Ok(()) => Ok(true),
            // A mount point beneath it kept the directory: it stays.
            Err(e) if kept && is_errno(&e, &[libc::EISDIR, libc::ENOTEMPTY, libc::EEXIST]) => {
                Ok(false)
            }
            Err(e) => Err(RestoreError::raced(self.ws.shown(path), "rename into", e)),
        }
    }

    fn make_links(&self, range: std::ops::Range<usize>) -> Result<usize, RestoreError> {
        let count = range.len();
        let mut dirs = DirStack::new(&self.ws);
        for index in range {
            let (path, target) = &self.plan.links[index];
            let name = CString::new(format!("l-{index}")).expect("no NUL");
            let target_c = cname(target.as_bytes())?;
            fs::symlink_at(&target_c, self.staging.as_raw_fd(), &name)
                .map_err(|e| RestoreError::io(self.shown_staging(&name), "symlink", e))?;
            let Some((parent_fd, leaf)) = self.reach_parent(&mut dirs, path.as_bytes())? else {
                continue;
            };
            if self.rename_in(parent_fd, &name, &leaf, path.as_bytes())? {
                self.count_written([0]);
            }
        }
        Ok(count)
    }

    /// Mode and mtime of files whose bytes are right, in place: only through
    /// an fd of a regular file with one link (the plan replaced shared ones;
    /// one that became shared since is left alone).
    fn set_file_metadata(&self, range: std::ops::Range<usize>) -> Result<usize, RestoreError> {
        let count = range.len();
        let mut dirs = DirStack::new(&self.ws);
        for entry in &self.plan.file_metadata[range] {
            let (parent, name) = split_parent(entry.path.as_bytes());
            let parent_fd = match dirs.reach(parent, false)? {
                Reached::Dir(fd) => fd,
                Reached::Absent => continue,
                Reached::OtherDevice(at) => {
                    self.skip(at);
                    continue;
                }
            };
            let leaf = cname(name)?;
            let shown = || self.ws.shown(entry.path.as_bytes());
            let (fd, by_path) = match fs::open_leaf_at(parent_fd, &leaf, libc::O_RDONLY) {
                Ok(fd) => (fd, false),
                // Unreadable for us (mode 0200 as a non-root user): an O_PATH
                // fd needs no permission, and /proc/self/fd/N names exactly it.
                Err(e) if is_errno(&e, &[libc::EACCES]) => {
                    match fs::open_leaf_at(parent_fd, &leaf, libc::O_PATH) {
                        Ok(fd) => (fd, true),
                        Err(_) => continue,
                    }
                }
                Err(e)
                    if is_errno(&e, &[libc::ENOENT, libc::ELOOP, libc::ENOTDIR, libc::ENXIO]) =>
                {
                    continue
                }
                Err(e) => return Err(RestoreError::raced(shown(), "open", e)),
            };
            match in_place(fd.as_raw_fd(), self.ws.dev)
                .map_err(|e| RestoreError::raced(shown(), "fstat", e))?
            {
                InPlace::Own(_) => {}
                InPlace::Other => continue,
                InPlace::MountPoint => {
                    // A file mounted there since the scan: its inode is not ours.
                    self.skip(entry.path.as_bytes().to_vec());
                    continue;
                }
            }
            let mode = entry.mode & 0o777;
            if by_path {
                let proc =
                    CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).expect("no NUL");
                chmod_and_mtime_by_proc(&proc, mode, entry.mtime_ns)
                    .map_err(|e| RestoreError::raced(shown(), "chmod", e))?;
            } else {
                fs::fchmod(fd.as_raw_fd(), mode)
                    .map_err(|e| RestoreError::raced(shown(), "chmod", e))?;
                fs::set_mtime(fd.as_raw_fd(), entry.mtime_ns)
                    .map_err(|e| RestoreError::raced(shown(), "set the mtime of", e))?;
            }
        }
        Ok(count)
    }

    fn set_dir_modes(&self, range: std::ops::Range<usize>) -> Result<usize, RestoreError> {
        let count = range.len();
        let mut dirs = DirStack::new(&self.ws);
        for (path, mode) in &self.plan.dir_modes[range] {
            let fd = match dirs.reach(path.as_bytes(), false)? {
                Reached::Dir(fd) => fd,
                Reached::Absent => continue,
                Reached::OtherDevice(at) => {
                    self.skip(at);
                    continue;
                }
            };
            fs::fchmod(fd, mode & 0o777)
                .map_err(|e| RestoreError::raced(self.ws.shown(path.as_bytes()), "chmod", e))?;
        }
        Ok(count)
    }

    /// After apply: make the restored data durable (one `syncfs` of the
    /// workspace's filesystem), then record what was written in the stat
    /// cache at `cache_path` (if any), with a reference time read on the
    /// workspace's filesystem.
    pub fn finish(
        &self,
        cache_path: Option<&Path>,
        fingerprint: [u8; 32],
    ) -> Result<(), RestoreError> {
        drop(
            self.writeback
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take(),
        );
        fs::syncfs(self.ws.fd.as_raw_fd())
            .map_err(|e| RestoreError::io(self.ws.shown(b""), "sync", e))?;
        let Some(cache_path) = cache_path else {
            return Ok(());
        };
        let reference_ns = self.filesystem_now()?;
        let updates = std::mem::take(&mut *self.recorded.lock().unwrap_or_else(|e| e.into_inner()));
        if let Some(parent) = cache_path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| RestoreError::io(parent.to_string_lossy(), "create", e))?;
        }
        let kept = self
            .kept_cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        match kept {
            Some(kept) => kept.save_with_written(cache_path, fingerprint, reference_ns, updates),
            // (A live scan without a cache path kept none: merged into the file.)
            None => statcache::record_written(cache_path, fingerprint, reference_ns, updates),
        }
        .map_err(|e| RestoreError::io(cache_path.to_string_lossy(), "save stat cache", e))
    }

    /// The workspace filesystem's clock: the mtime of a new file in staging.
    fn filesystem_now(&self) -> Result<i64, RestoreError> {
        let name = c"tick";
        let fd = fs::create_file_at(self.staging.as_raw_fd(), name)
            .map_err(|e| RestoreError::io(self.shown_staging(name), "create", e))?;
        let stat = fs::fstat(fd.as_raw_fd())
            .map_err(|e| RestoreError::io(self.shown_staging(name), "fstat", e))?;
        drop(fd);
        let _ = fs::unlink_at(self.staging.as_raw_fd(), name);
        Ok(stat.mtime_ns)
    }

    /// Paths left alone because they lie on another device (mount points).
    pub fn skipped(&self) -> Vec<Vec<u8>> {
        let mut skipped = self
            .skipped
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        skipped.sort();
        skipped
    }

    pub(super) fn count_written(&self, sizes: impl IntoIterator<Item = u64>) {
        let (mut files, mut bytes) = (0, 0);
        for size in sizes {
            files += 1;
            bytes += size;
        }
        self.files_written.fetch_add(files, Ordering::Relaxed);
        self.bytes_written.fetch_add(bytes, Ordering::Relaxed);
    }

    /// (files and symlinks, bytes) written into the workspace so far.
    pub fn written(&self) -> (u64, u64) {
        (
            self.files_written.load(Ordering::Relaxed),
            self.bytes_written.load(Ordering::Relaxed),
        )
    }

    /// How many files the stat cache will learn.
    pub fn recorded_count(&self) -> usize {
        self.recorded.lock().map(|r| r.len()).unwrap_or(0)
    }

    /// Remove the staging directory (whether the restore succeeded or not).
    pub fn remove_staging(&self) -> Result<(), RestoreError> {
        let mut skipped = Vec::new();
        remove_tree(
            &self.ws,
            self.ws.fd.as_raw_fd(),
            &self.staging_name,
            self.staging_name.to_bytes(),
            &mut skipped,
        )
    }
}

fn chmod_and_mtime_by_proc(proc: &CStr, mode: u32, mtime_ns: i64) -> io::Result<()> {
    // SAFETY: valid C string; /proc/self/fd/N names exactly our O_PATH fd's inode.
    if unsafe { libc::fchmodat(libc::AT_FDCWD, proc.as_ptr(), mode as libc::mode_t, 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let times = [
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        libc::timespec {
            tv_sec: mtime_ns.div_euclid(1_000_000_000) as libc::time_t,
            tv_nsec: mtime_ns.rem_euclid(1_000_000_000) as libc::c_long,
        },
    ];
    // SAFETY: valid C string and a two-element timespec array.
    if unsafe { libc::utimensat(libc::AT_FDCWD, proc.as_ptr(), times.as_ptr(), 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
