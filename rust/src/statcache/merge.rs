//! The owned cache a restore merges its writes into, and the merge itself.

use std::io::{self};
use std::path::Path;

use super::load::LoadedCache;
use super::write::{write_cache, EntryVisitor};
use super::{settled, CacheEntry, DirRecord, DirStat};

/// A cache in its owned form: what a restore merges its writes into, and what
/// tests build. (A scan never builds one: it streams its rows to
/// [`write_cache`] and reads the old cache through [`LoadedCache`].)
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatCache {
    pub fingerprint: [u8; 32],
    pub reference_ns: i64,
    /// Sorted by path bytes, unique.
    pub entries: Vec<(String, CacheEntry)>,
    /// Listed directories, sorted by path bytes, unique ("" is the root).
    pub dirs: Vec<(String, DirRecord)>,
}

impl StatCache {
    /// Write atomically (temp file next to it, then rename). Creates the parent.
    pub fn save(&self, path: &Path) -> io::Result<()> {
        let entries = |visit: &mut dyn FnMut(&str, CacheEntry)| self.visit_entries(visit);
        // An owned cache is one a restore merged its writes into: the rows
        // of no scan, so it vouches for no manifest.
        write_cache(
            path,
            &self.fingerprint,
            self.reference_ns,
            None,
            &entries,
            self.listed(),
        )
    }

    /// Its file entries in path order, as `write_cache` visits them.
    pub(super) fn visit_entries(&self, visit: &mut dyn FnMut(&str, CacheEntry)) {
        for (p, e) in &self.entries {
            visit(p, *e);
        }
    }

    /// Its listed directories in path order, as `write_cache` takes them.
    pub(super) fn listed(&self) -> impl Iterator<Item = (&str, DirStat, &[u8])> {
        self.dirs
            .iter()
            .map(|(p, d)| (p.as_str(), d.stat, d.listing.as_slice()))
    }
}

/// Record what a restore wrote: each `(path, entry)` is the stat of an inode
/// the restore itself created and renamed in (never a fresh `stat(path)`
/// paired with a hash it did not see written). Merged into the cache at
/// `path` (a cache made with other secrets, or one that does not verify, is
/// started afresh), as [`write_merged`] merges. A restore merges into the
/// cache its own live scan kept in memory instead ([`crate::scan::KeptCache`]),
/// so the file is written once.
pub fn record_written(
    path: &Path,
    fingerprint: [u8; 32],
    reference_ns: i64,
    updates: Vec<(String, CacheEntry)>,
) -> io::Result<()> {
    let old = LoadedCache::load(path)
        .and_then(LoadedCache::into_owned)
        .unwrap_or_else(|| StatCache {
            fingerprint,
            reference_ns: i64::MIN,
            ..StatCache::default()
        });
    let entries = |visit: &mut dyn FnMut(&str, CacheEntry)| old.visit_entries(visit);
    let base = Base {
        fingerprint: old.fingerprint,
        reference_ns: old.reference_ns,
        entries: &entries,
        dirs: old.listed(),
    };
    write_merged(path, base, fingerprint, reference_ns, updates)
}

/// The cache a restore's writes are merged into: its secret-set
/// fingerprint, reference time, file entries (in path order) and listed
/// directories (in path order).
pub struct Base<'a, D> {
    pub fingerprint: [u8; 32],
    pub reference_ns: i64,
    pub entries: &'a EntryVisitor<'a>,
    pub dirs: D,
}

/// Save at `path` the cache `base` with a restore's `updates` merged in (an
/// update replaces the entry of its path; the first of a path's updates
/// wins), the reference time moved to `reference_ns` (read on the
/// workspace's filesystem after the last write). A base made with other
/// secrets than `fingerprint` is dropped (the cache starts afresh). Entries
/// and directories the base's own reference already distrusted are dropped
/// first, as they would look clean under the new one. The result vouches for
/// no manifest (no witness): it holds the rows of no scan.
pub fn write_merged<'b, D>(
    path: &Path,
    base: Base<'_, D>,
    fingerprint: [u8; 32],
    reference_ns: i64,
    mut updates: Vec<(String, CacheEntry)>,
) -> io::Result<()>
where
    D: Iterator<Item = (&'b str, DirStat, &'b [u8])>,
{
    updates.sort_by(|a, b| a.0.cmp(&b.0));
    updates.dedup_by(|later, earlier| later.0 == earlier.0);
    let same_secrets = base.fingerprint == fingerprint;
    let base_reference = base.reference_ns;
    let kept = move |mtime: i64, ctime: i64| same_secrets && settled(base_reference, mtime, ctime);
    let entries = |visit: &mut dyn FnMut(&str, CacheEntry)| {
        let mut pending = updates.iter().peekable();
        (base.entries)(&mut |p, e| {
            while let Some((u, ue)) = pending.next_if(|(u, _)| u.as_str() < p) {
                visit(u, *ue);
            }
            if pending.peek().is_some_and(|(u, _)| u.as_str() == p) {
                return;
            }
            if kept(e.mtime_ns, e.ctime_ns) {
                visit(p, e);
            }
        });
        for (u, ue) in pending {
            visit(u, *ue);
        }
    };
    let dirs = base
        .dirs
        .filter(move |(_, stat, _)| kept(stat.mtime_ns, stat.ctime_ns));
    // (A base of other secrets is dropped whole: its reference goes too.)
    let reference_ns = match same_secrets {
        true => base_reference.max(reference_ns),
        false => reference_ns,
    };
    write_cache(path, &fingerprint, reference_ns, None, &entries, dirs)
}
