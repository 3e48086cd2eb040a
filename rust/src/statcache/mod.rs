//! The per-workspace stat cache: path → (dev, ino, size, mtime_ns, ctime_ns,
//! mode, hash), plus the fingerprint of the secret set the hashes were made
//! with and a reference time taken from the filesystem.
//!
//! git's racy-clean rule, on ctime as well as mtime: an entry whose mtime OR
//! ctime is at or after the reference time may have been modified again
//! within the same timestamp tick after we looked, so it is never trusted. The
//! reference time is read from the filesystem BEFORE the scan stats anything,
//! so anything stat'ed in a tick that could still change carries a time >= it.
//! (git looks at mtime only, so a same-second edit followed by `touch -d` that
//! sets the mtime back leaves git's index entry looking clean: same size, old
//! mtime, and a ctime equal to the recorded one because both fall in the same
//! second. The ctime cannot be set back by the sandbox, so checking it closes
//! that hole, at the price of hashing a file once more when only its ctime is
//! recent.)
//!
//! **Directories (git's untracked cache).** Beside the files, the cache keeps
//! each directory the scan listed: its stat (dev, ino, mtime, ctime) taken by
//! `fstat` of the very fd that was then listed, before the listing, and the
//! raw listing (every name with its `d_type`, before the policy is applied, so
//! a policy change needs no re-read). A later scan reuses a listing when the
//! fstat of the directory it opened matches and the recorded mtime and ctime
//! are before the reference time (the racy rule of the files, for the same
//! reason: a change in the tick of the listing leaves the stat as it was). Why that is
//! enough: a directory's listing changes only through an operation on the
//! directory itself (create, unlink, rename in or out), which sets its mtime
//! AND ctime to now. `touch -d` can set the mtime back but not the ctime;
//! a directory replaced by another one (or by a symlink, or moved in from
//! elsewhere) has another ino or a new ctime. Every entry of a reused listing
//! is still lstat'ed (files against their own cache entries, directories
//! opened and fstat'ed, so a mount point on a listed directory is seen:
//! mounting does not touch the parent's stat). What stays unseen, as in git:
//! a filesystem that does not update a directory's mtime/ctime when its
//! entries change (some network and FUSE filesystems), and a host clock set
//! back so that a new ctime equals the recorded one to the nanosecond.
//!
//! **The manifest witness.** A scan that writes the cache also records the
//! digest of the manifest its rows make, with the key of how it scanned
//! (policy, roots, secret set, code version). A later scan under the same key
//! that reuses every listing and every file entry, and hashes no file outside
//! the cache, has the same rows: each file row is its cache entry's stat and
//! hash, each directory's mode is covered by that directory's own listing
//! stat (a chmod moves its ctime), and each symlink can only change by being
//! replaced, which moves its directory's stat. So it knows its manifest's
//! digest without encoding it, and a no-change capture compares digests
//! instead of every byte (see `scan`). A restore, which merges entries it
//! wrote into the cache, drops the witness.
//!
//! File format: see [`write_cache`] (`"CKPDSTC5"`, replaced atomically by
//! rename). The file entries are kept per directory, one block each; the
//! directories follow them, each with its stat, its raw listing and where
//! its block is and what it hashes to, then a trailer, the directories and
//! the trailer checksummed together. A scan reads the directories whole and
//! looks a directory's block up while it lists that directory, on whichever
//! walk thread lists it: reusing a file's hash needs no pass over all the
//! entries after the walk, nor the walk's rows in path order. A file of an
//! older version is not read: the next scan hashes everything once and
//! writes the new format. A missing, truncated or corrupt file is an empty
//! cache, and a block that does not match its checksum an empty directory
//! (so no fsync: a torn write after a crash only costs one re-hash); a
//! block is verified before any of its entries is used. Secrets are never
//! stored.
//!
//! [`LoadedCache`] is a cache opened for a scan: its directories in memory
//! (a few bytes per directory) and its entries left in the file, read one
//! directory's block at a time ([`LoadedCache::dir_files`]), so a
//! million-entry cache never costs a scan its size at once. [`StatCache`]
//! is the owned form a restore merges its writes into.

mod clock;
mod format;
mod listing;
mod load;
mod merge;
mod write;

#[cfg(test)]
mod tests;

use crate::fs::Stat;

pub use clock::racy_reference_ns;
pub use listing::{listing_names, Listing};
pub use load::{DirFiles, LoadedCache};
pub use merge::{record_written, write_merged, Base, StatCache};
pub use write::{write_atomically, write_cache, EntryVisitor};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheEntry {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    pub mode: u32,
    pub hash: [u8; 32],
}

impl CacheEntry {
    pub fn new(stat: &Stat, hash: [u8; 32]) -> CacheEntry {
        CacheEntry {
            dev: stat.dev,
            ino: stat.ino,
            size: stat.size,
            mtime_ns: stat.mtime_ns,
            ctime_ns: stat.ctime_ns,
            mode: stat.mode,
            hash,
        }
    }

    /// Same inode, size, times and mode as `stat`.
    pub fn same_stat(&self, stat: &Stat) -> bool {
        self.dev == stat.dev
            && self.ino == stat.ino
            && self.size == stat.size
            && self.mtime_ns == stat.mtime_ns
            && self.ctime_ns == stat.ctime_ns
            && self.mode == stat.mode
    }
}

/// A directory's stat when it was listed: what must be unchanged for its
/// listing to be reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirStat {
    pub dev: u64,
    pub ino: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
}

impl DirStat {
    pub fn of(stat: &Stat) -> DirStat {
        DirStat {
            dev: stat.dev,
            ino: stat.ino,
            mtime_ns: stat.mtime_ns,
            ctime_ns: stat.ctime_ns,
        }
    }
}

/// What the scan that wrote a cache produced: the manifest digest of its
/// rows, and the key of how it scanned (policy, roots, secret set, code
/// version; see `scan::outcome_key`). A later scan that reuses every
/// listing and every file entry of that cache, under the same key, has
/// the same rows, so its manifest has this digest without being encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ManifestWitness {
    pub key: [u8; 32],
    pub digest: [u8; 32],
}

/// One listed directory: its stat and its raw listing (see [`Listing`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirRecord {
    pub stat: DirStat,
    pub listing: Vec<u8>,
}

/// Not racily clean under `reference_ns`: both times strictly before it (see
/// the module docs for why ctime counts too).
fn settled(reference_ns: i64, mtime_ns: i64, ctime_ns: i64) -> bool {
    mtime_ns < reference_ns && ctime_ns < reference_ns
}

/// A keyed BLAKE3 of the sorted, de-duplicated secret set: the cache can tell
/// whether its hashes were made with the same secrets without storing them.
pub fn secrets_fingerprint<S: AsRef<[u8]>>(secrets: &[S]) -> [u8; 32] {
    let key = blake3::derive_key(
        "checkpointd 2026-11 stat cache secret-set fingerprint v1",
        b"",
    );
    let mut sorted: Vec<&[u8]> = secrets.iter().map(|s| s.as_ref()).collect();
    sorted.sort();
    sorted.dedup();
    let mut hasher = blake3::Hasher::new_keyed(&key);
    hasher.update(&(sorted.len() as u64).to_le_bytes());
    for s in sorted {
        // Length-prefixed so that ["ab", "cd"] and ["abcd"] differ.
        hasher.update(&(s.len() as u64).to_le_bytes());
        hasher.update(s);
    }
    *hasher.finalize().as_bytes()
}
