//! The local blob directory behind a `file://` blob store, batch by batch.
//!
//! Layout (what obstore's `LocalStore` reads and lists, so both share one
//! directory): key `a/b/c` is the file `<root>/a/b/c`. Callers only pass plain
//! keys (letters, digits, `._-` segments; obstore would percent-encode others).
//!
//! Every path is resolved relative to the root's fd (never by re-joining strings
//! onto a path that could move). A blob appears only complete: its bytes go to
//! an unnamed `O_TMPFILE` in the key's directory that is then linked to the
//! final name; linking fails when the key exists (content-addressed: what is
//! there is these bytes). Where `O_TMPFILE` is refused the bytes go to a hidden
//! staging name `<file>#<digits>` (obstore's own staging form, which listings
//! hide) that is hard-linked, then removed. A batch that wrote anything ends
//! with one `syncfs` of the directory's filesystem, so every blob is durable
//! before the checkpoint append that references it: one sync per batch, not one
//! per small file.

use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::cancel::Cancel;
use crate::fs::write_all;
use crate::verify::{ReadError, VerifyingReader};

/// A failure on one blob: which key, which operation, the OS error.
#[derive(Debug)]
pub struct BlobError {
    pub key: String,
    pub op: &'static str,
    pub path: PathBuf,
    pub source: io::Error,
}

impl std::fmt::Display for BlobError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {:?} at {} failed: {}",
            self.op,
            self.key,
            self.path.display(),
            self.source
        )
    }
}

/// What `get_many` found for a key.
pub enum Fetched {
    Bytes(Vec<u8>),
    Missing,
}

pub struct BlobDir {
    root: PathBuf,
    fd: OwnedFd,
    /// Cleared at the first sign that unnamed temporary files do not work here.
    use_tmpfile: AtomicBool,
}

const DIR_OPEN: libc::c_int = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC;

fn cstr(text: &str) -> io::Result<CString> {
    CString::new(text).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn check(result: libc::c_int) -> io::Result<libc::c_int> {
    if result < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(result)
    }
}

/// What opening an `O_TMPFILE` (or linking it through `/proc`) fails with
/// where that is not available: then a named staging file serves.
fn tmpfile_unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EOPNOTSUPP)
            | Some(libc::EISDIR)
            | Some(libc::EINVAL)
            | Some(libc::ENOENT)
            | Some(libc::EXDEV)
    )
}

/// An unnamed file in `dir_fd`, open for writing.
fn open_unnamed(dir_fd: RawFd) -> io::Result<OwnedFd> {
    let dot = cstr(".")?;
    // SAFETY: valid fd and C string; the result is owned below.
    let fd = check(unsafe {
        libc::openat(
            dir_fd,
            dot.as_ptr(),
            libc::O_TMPFILE | libc::O_WRONLY | libc::O_CLOEXEC,
            0o666 as libc::c_uint,
        )
    })?;
    // SAFETY: just opened, owned here.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Give the unnamed `file` the name `name` in `dir_fd`; false when it exists.
fn link_unnamed(file: &OwnedFd, dir_fd: RawFd, name: &CString) -> io::Result<bool> {
    // linkat(AT_EMPTY_PATH) needs CAP_DAC_READ_SEARCH; the /proc link of our
    // own fd does the same for anyone. This names the blob file we wrote,
    // not anything in the workspace.
    let proc_path = cstr(&format!("/proc/self/fd/{}", file.as_raw_fd()))?;
    // SAFETY: valid C strings and fds.
    let r = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            proc_path.as_ptr(),
            dir_fd,
            name.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EEXIST) {
            return Ok(false);
        }
        return Err(e);
    }
    Ok(true)
}

/// Why `put_verified` stored nothing.
#[derive(Debug)]
pub enum PutFileError {
    /// The source file: changed since the scan, cancelled, or unreadable.
    Read(ReadError),
    /// The blob directory refused.
    Blob(BlobError),
}

/// Blobs a `put_many` batch may hold and still sync file by file (see there).
const SYNC_EACH_UP_TO: usize = 4;

/// `write_all`, then `fdatasync` when `sync`.
fn write_synced(fd: RawFd, data: &[u8], sync: bool) -> io::Result<()> {
    write_all(fd, data)?;
    if sync {
        // SAFETY: a valid fd.
        check(unsafe { libc::fdatasync(fd) })?;
    }
    Ok(())
}

fn split_key(key: &str) -> (&str, &str) {
    match key.rfind('/') {
        Some(i) => (&key[..i], &key[i + 1..]),
        None => ("", key),
    }
}

impl BlobDir {
    /// Open (create when missing) the directory at `root`.
    pub fn open(root: &Path) -> io::Result<BlobDir> {
        std::fs::create_dir_all(root)?;
        let path = cstr(&root.to_string_lossy())?;
        // SAFETY: a valid C string; the returned fd is owned below.
        let fd = check(unsafe { libc::open(path.as_ptr(), DIR_OPEN) })?;
        Ok(BlobDir {
            root: root.to_path_buf(),
            // SAFETY: `fd` was just opened and is owned by nobody else.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            use_tmpfile: AtomicBool::new(true),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn error(&self, key: &str, op: &'static str, source: io::Error) -> BlobError {
        BlobError {
            key: key.to_string(),
            op,
            path: self.root.join(key),
            source,
        }
    }

    /// The fd of `dir` (relative to the root), created when `create`.
    fn open_dir(&self, dir: &str, create: bool) -> io::Result<OwnedFd> {
        let rel = cstr(if dir.is_empty() { "." } else { dir })?;
        // SAFETY: valid fd and C string; the result is owned below.
        let fd = unsafe { libc::openat(self.fd.as_raw_fd(), rel.as_ptr(), DIR_OPEN) };
        if fd >= 0 {
            // SAFETY: just opened, owned here.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        let e = io::Error::last_os_error();
        if !create || e.raw_os_error() != Some(libc::ENOENT) {
            return Err(e);
        }
        let mut at = String::new();
        for part in dir.split('/') {
            if !at.is_empty() {
                at.push('/');
            }
            at.push_str(part);
            let c = cstr(&at)?;
            // SAFETY: valid fd and C string.
            let r = unsafe { libc::mkdirat(self.fd.as_raw_fd(), c.as_ptr(), 0o777) };
            if r < 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EEXIST) {
                    return Err(e);
                }
            }
        }
        self.open_dir(dir, false)
    }

    /// The keys whose file is not there (a regular file is a present blob, as
    /// obstore's `head` sees it), in the order given.
    pub fn missing(&self, keys: &[String]) -> Result<Vec<usize>, BlobError> {
        let mut out = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            let rel = cstr(key).map_err(|e| self.error(key, "head", e))?;
            // SAFETY: zeroed stat is a valid out-parameter.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: valid fd, C string and out-pointer.
            let r = unsafe {
                libc::fstatat(
                    self.fd.as_raw_fd(),
                    rel.as_ptr(),
                    &mut st,
                    libc::AT_SYMLINK_NOFOLLOW,
                )
            };
            if r < 0 {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::ENOENT) | Some(libc::ENOTDIR) => out.push(i),
                    _ => return Err(self.error(key, "head", e)),
                }
            } else if st.st_mode & libc::S_IFMT != libc::S_IFREG {
                out.push(i);
            }
        }
        Ok(out)
    }

    /// Store each `(key, bytes)` unless the key exists; per item whether bytes
    /// were written. Durable on return: a batch of at most `SYNC_EACH_UP_TO`
    /// blobs into existing directories (a pack, one large file) syncs its own
    /// files and their directories; any other batch that wrote ends with one
    /// `syncfs`, which also flushes whatever else is dirty on the filesystem
    /// (on a shared disk, other processes' writes: a 16 MiB pack waited for them).
    pub fn put_many(&self, items: &[(String, &[u8])]) -> Result<Vec<bool>, BlobError> {
        let mut dirs: HashMap<&str, OwnedFd> = HashMap::new();
        let mut written = Vec::with_capacity(items.len());
        let mut sync_each = items.len() <= SYNC_EACH_UP_TO;
        let mut synced_dirs: Vec<&str> = Vec::new();
        for (key, data) in items {
            let (dir, name) = split_key(key);
            if !dirs.contains_key(dir) {
                let fd = match self.open_dir(dir, false) {
                    Ok(fd) => fd,
                    Err(_) => {
                        // Created now: its own entry must be durable too.
                        sync_each = false;
                        self.open_dir(dir, true)
                            .map_err(|e| self.error(key, "put", e))?
                    }
                };
                dirs.insert(dir, fd);
            }
            let dir_fd = dirs[dir].as_raw_fd();
            let done = self
                .put_one(dir_fd, name, data, sync_each)
                .map_err(|e| self.error(key, "put", e))?;
            if done && !synced_dirs.contains(&dir) {
                synced_dirs.push(dir);
            }
            written.push(done);
        }
        if sync_each {
            // Each written file was fdatasynced before it got its name.
            for dir in synced_dirs {
                // SAFETY: a valid fd.
                check(unsafe { libc::fsync(dirs[dir].as_raw_fd()) }).map_err(|e| BlobError {
                    key: String::new(),
                    op: "sync",
                    path: self.root.join(dir),
                    source: e,
                })?;
            }
        } else if written.iter().any(|w| *w) {
            // SAFETY: a valid fd.
            check(unsafe { libc::syncfs(self.fd.as_raw_fd()) }).map_err(|e| BlobError {
                key: String::new(),
                op: "sync",
                path: self.root.clone(),
                source: e,
            })?;
        }
        Ok(written)
    }

    /// `sync`: the bytes are `fdatasync`ed before the blob gets its name.
    fn put_one(&self, dir_fd: RawFd, name: &str, data: &[u8], sync: bool) -> io::Result<bool> {
        let final_name = cstr(name)?;
        if self.use_tmpfile.load(Ordering::Relaxed) {
            match self.put_unnamed(dir_fd, &final_name, data, sync) {
                Ok(written) => return Ok(written),
                Err(e) if tmpfile_unsupported(&e) => {
                    self.use_tmpfile.store(false, Ordering::Relaxed);
                }
                Err(e) => return Err(e),
            }
        }
        self.put_staged(dir_fd, name, &final_name, data, sync)
    }

    /// Write an unnamed file in `dir_fd` and link it as `name`; false when the
    /// name exists. ENOSPC and friends leave nothing behind (the file has no name).
    fn put_unnamed(
        &self,
        dir_fd: RawFd,
        name: &CString,
        data: &[u8],
        sync: bool,
    ) -> io::Result<bool> {
        let file = open_unnamed(dir_fd)?;
        write_synced(file.as_raw_fd(), data, sync)?;
        link_unnamed(&file, dir_fd, name)
    }

    /// Stream a verified file into the blob `key` (unless it exists: false),
    /// in fixed memory; durable when this returns true: the bytes are
    /// `fdatasync`ed before the blob gets its name, the directory after. The
    /// blob appears only complete, and never when the reader found the file
    /// changed (its error comes back as [`PutFileError::Read`]).
    pub fn put_verified(
        &self,
        key: &str,
        reader: &mut VerifyingReader,
        cancel: &Cancel,
    ) -> Result<bool, PutFileError> {
        let (dir, name) = split_key(key);
        let final_name = cstr(name).map_err(|e| PutFileError::Blob(self.error(key, "put", e)))?;
        let target = PutTarget {
            key,
            dir,
            unless: Some(&final_name),
            final_name: Some(&final_name),
        };
        let written = self.put_file(target, reader, cancel)?;
        Ok(written.unwrap_or(false))
    }

    /// As `put_verified` for a reader that learns its digest
    /// ([`VerifyingReader::open_unhashed`]): the blob goes in the directory of
    /// `beside` (a key of the same kind), named by the digest the bytes had,
    /// which is known only once they are all written: the file is read once.
    /// Returns that key and whether it was written (false: it existed).
    /// `unless_beside`: when the blob `beside` exists, nothing is read and
    /// `(beside, false)` comes back (the caller trusts the file holds its bytes).
    pub fn put_learned(
        &self,
        beside: &str,
        unless_beside: bool,
        reader: &mut VerifyingReader,
        cancel: &Cancel,
    ) -> Result<(String, bool), PutFileError> {
        let (dir, name) = split_key(beside);
        let beside_name =
            cstr(name).map_err(|e| PutFileError::Blob(self.error(beside, "put", e)))?;
        let present = unless_beside.then_some(&beside_name);
        let target = PutTarget {
            key: beside,
            dir,
            unless: present,
            final_name: None,
        };
        let Some(written) = self.put_file(target, reader, cancel)? else {
            return Ok((beside.to_string(), false));
        };
        let name = crate::hash::to_hex(&reader.digest);
        let key = if dir.is_empty() {
            name
        } else {
            format!("{dir}/{name}")
        };
        Ok((key, written))
    }

    /// The body of `put_verified` and `put_learned`: None, with nothing read,
    /// when the blob `target.unless` exists; else whether the blob was written
    /// (see [`PutTarget`]).
    fn put_file(
        &self,
        target: PutTarget<'_>,
        reader: &mut VerifyingReader,
        cancel: &Cancel,
    ) -> Result<Option<bool>, PutFileError> {
        let PutTarget {
            key,
            dir,
            unless,
            final_name,
        } = target;
        let blob = |e| PutFileError::Blob(self.error(key, "put", e));
        let (_, staging_stem) = split_key(key);
        let dir_fd = self.open_dir(dir, true).map_err(blob)?;
        if unless.is_some_and(|existing| is_regular_at(dir_fd.as_raw_fd(), existing)) {
            return Ok(None); // content-addressed: already these bytes
        }
        let learned = std::cell::Cell::new(None::<[u8; 32]>);
        let mut failure: Option<ReadError> = None;
        let mut fill = |fd: RawFd| -> io::Result<()> {
            reader
                .copy_to(cancel, &mut |chunk| write_all(fd, chunk))
                .map_err(|e| {
                    failure = Some(e);
                    io::Error::from_raw_os_error(libc::ECANCELED)
                })??;
            learned.set(Some(reader.digest));
            // SAFETY: a valid fd.
            check(unsafe { libc::fdatasync(fd) })?;
            Ok(())
        };
        // The blob's name, once `fill` has run (the reader's digest, unless given).
        let name_now = || -> io::Result<CString> {
            match (final_name, learned.get()) {
                (Some(name), _) => Ok(name.clone()),
                (None, Some(digest)) => cstr(&crate::hash::to_hex(&digest)),
                (None, None) => Err(io::Error::from_raw_os_error(libc::ECANCELED)),
            }
        };
        let mut staged = true;
        let mut result = Ok(false);
        if self.use_tmpfile.load(Ordering::Relaxed) {
            match open_unnamed(dir_fd.as_raw_fd()) {
                Ok(file) => {
                    staged = false;
                    result = fill(file.as_raw_fd())
                        .and_then(|()| link_unnamed(&file, dir_fd.as_raw_fd(), &name_now()?));
                }
                Err(e) if tmpfile_unsupported(&e) => {
                    self.use_tmpfile.store(false, Ordering::Relaxed)
                }
                Err(e) => return Err(blob(e)),
            }
        }
        if staged {
            result = self.put_staged_with(dir_fd.as_raw_fd(), staging_stem, &name_now, &mut fill);
        }
        if let Some(read_error) = failure {
            return Err(PutFileError::Read(read_error));
        }
        let written = result.map_err(blob)?;
        if written {
            // SAFETY: a valid fd.
            check(unsafe { libc::fsync(dir_fd.as_raw_fd()) }).map_err(blob)?;
        }
        Ok(Some(written))
    }

    fn put_staged(
        &self,
        dir_fd: RawFd,
        name: &str,
        final_name: &CString,
        data: &[u8],
        sync: bool,
    ) -> io::Result<bool> {
        let final_name = || Ok(final_name.clone());
        self.put_staged_with(dir_fd, name, &final_name, &mut |fd| {
            write_synced(fd, data, sync)
        })
    }

    /// Fill a staging file `<name>#<digits>`, then hard-link it as
    /// `final_name()` (asked after the fill) and remove it.
    fn put_staged_with(
        &self,
        dir_fd: RawFd,
        name: &str,
        final_name: &dyn Fn() -> io::Result<CString>,
        fill: &mut dyn FnMut(RawFd) -> io::Result<()>,
    ) -> io::Result<bool> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let mut attempt = 0;
        let (staging, fd) = loop {
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            // Digits only, as obstore's staging names; unique per process and call.
            let staging = cstr(&format!(
                "{name}#{}{:07}",
                std::process::id(),
                n % 10_000_000
            ))?;
            // SAFETY: valid fd and C string.
            let fd = unsafe {
                libc::openat(
                    dir_fd,
                    staging.as_ptr(),
                    libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
                    0o666 as libc::c_uint,
                )
            };
            if fd >= 0 {
                // SAFETY: just opened, owned here.
                break (staging, unsafe { OwnedFd::from_raw_fd(fd) });
            }
            let e = io::Error::last_os_error();
            attempt += 1;
            if e.raw_os_error() != Some(libc::EEXIST) || attempt >= 8 {
                return Err(e);
            }
        };
        let result = (|| {
            fill(fd.as_raw_fd())?;
            let final_name = final_name()?;
            // SAFETY: valid fds and C strings.
            let r =
                unsafe { libc::linkat(dir_fd, staging.as_ptr(), dir_fd, final_name.as_ptr(), 0) };
            if r < 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EEXIST) {
                    return Ok(false);
                }
                return Err(e);
            }
            Ok(true)
        })();
        // SAFETY: valid fd and C string.
        unsafe { libc::unlinkat(dir_fd, staging.as_ptr(), 0) };
        result
    }

    /// All bytes of each key's file, in order; `Missing` when it is not there.
    pub fn get_many(&self, keys: &[String]) -> Result<Vec<Fetched>, BlobError> {
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            let rel = cstr(key).map_err(|e| self.error(key, "get", e))?;
            // SAFETY: valid fd and C string; the result is owned below.
            let fd = unsafe {
                libc::openat(
                    self.fd.as_raw_fd(),
                    rel.as_ptr(),
                    libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
                )
            };
            if fd < 0 {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::ENOENT) | Some(libc::ENOTDIR) | Some(libc::ELOOP) => {
                        out.push(Fetched::Missing);
                        continue;
                    }
                    _ => return Err(self.error(key, "get", e)),
                }
            }
            // SAFETY: just opened, owned here.
            let file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
            let meta = file.metadata().map_err(|e| self.error(key, "get", e))?;
            if !meta.is_file() {
                out.push(Fetched::Missing);
                continue;
            }
            let mut data = Vec::with_capacity(meta.len() as usize);
            io::Read::read_to_end(&mut &file, &mut data).map_err(|e| self.error(key, "get", e))?;
            out.push(Fetched::Bytes(data));
        }
        Ok(out)
    }
}

/// Where [`BlobDir::put_file`] puts a blob: `key` names it in errors and
/// names its staging file (where unnamed files are refused), in directory
/// `dir`; nothing is read when the blob `unless` exists; the blob is named
/// `final_name` or, when None, by the reader's digest once the copy is done.
struct PutTarget<'a> {
    key: &'a str,
    dir: &'a str,
    unless: Option<&'a CString>,
    final_name: Option<&'a CString>,
}

/// Whether `name` in `dir_fd` is a regular file (not following a link).
fn is_regular_at(dir_fd: RawFd, name: &CString) -> bool {
    // SAFETY: zeroed stat is a valid out-parameter.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd, C string and out-pointer.
    let r = unsafe { libc::fstatat(dir_fd, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) };
    r == 0 && st.st_mode & libc::S_IFMT == libc::S_IFREG
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_missing_get() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = BlobDir::open(tmp.path()).unwrap();
        let keys = vec!["a/b/one".to_string(), "a/b/two".to_string()];
        assert_eq!(dir.missing(&keys).unwrap(), vec![0, 1]);
        let items = vec![(keys[0].clone(), &b"1"[..])];
        assert_eq!(dir.put_many(&items).unwrap(), vec![true]);
        assert_eq!(dir.put_many(&items).unwrap(), vec![false]);
        assert_eq!(dir.missing(&keys).unwrap(), vec![1]);
        let got = dir.get_many(&keys).unwrap();
        assert!(matches!(&got[0], Fetched::Bytes(b) if b == b"1"));
        assert!(matches!(got[1], Fetched::Missing));
        // Nothing but the blob is left in its directory.
        let names: Vec<_> = std::fs::read_dir(tmp.path().join("a/b")).unwrap().collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn a_learned_put_names_the_blob_by_the_bytes_it_streamed() {
        use crate::redact::SecretSet;
        let tmp = tempfile::tempdir().unwrap();
        let work = tempfile::tempdir().unwrap();
        let data = vec![3u8; (3 << 20) + 11];
        std::fs::write(work.path().join("f"), &data).unwrap();
        let root = std::fs::File::open(work.path()).unwrap();
        let dir = BlobDir::open(tmp.path()).unwrap();
        let hex = crate::hash::to_hex(blake3::hash(&data).as_bytes());
        for fallback in [false, true] {
            // Unnamed files, then (as where O_TMPFILE is refused) named staging.
            dir.use_tmpfile.store(!fallback, Ordering::Relaxed);
            let _ = std::fs::remove_file(tmp.path().join("k").join(&hex));
            let mut reader =
                VerifyingReader::open_unhashed(root.as_raw_fd(), "f", SecretSet::empty()).unwrap();
            let (key, written) = dir
                .put_learned("k/old", true, &mut reader, &Cancel::new())
                .unwrap();
            assert_eq!((key.as_str(), written), (format!("k/{hex}").as_str(), true));
            assert_eq!(std::fs::read(tmp.path().join(&key)).unwrap(), data);
            let mut again =
                VerifyingReader::open_unhashed(root.as_raw_fd(), "f", SecretSet::empty()).unwrap();
            let (_, written) = dir
                .put_learned("k/old", false, &mut again, &Cancel::new())
                .unwrap();
            assert!(!written, "there already");
            let names: Vec<_> = std::fs::read_dir(tmp.path().join("k")).unwrap().collect();
            assert_eq!(names.len(), 1, "no staging file left");
        }
        // The blob `beside` names is there: trusted, nothing read.
        let beside = format!("k/{hex}");
        let mut unread =
            VerifyingReader::open_unhashed(root.as_raw_fd(), "f", SecretSet::empty()).unwrap();
        let found = dir
            .put_learned(&beside, true, &mut unread, &Cancel::new())
            .unwrap();
        assert_eq!(found, (beside, false));
        assert_eq!(unread.progress.load(Ordering::Relaxed), 0);
        assert!(!unread.complete);
    }
}
