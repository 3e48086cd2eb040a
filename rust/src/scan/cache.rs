//! The stat cache a scan saves or keeps: its entries from the scan's rows,
//! and the key its manifest witness is recorded under.

use std::path::{Path, PathBuf};

use crate::error::ScanError;
use crate::policy::PolicyMatcher;
use crate::statcache::{self, CacheEntry};
use crate::walk::{Kind, ListedDir};

use super::order::{join_path, Rows};

/// The stat cache a restore's live scan saw, kept in memory (its rows and
/// listings as the scan made them) until the restore has written: then
/// [`KeptCache::save_with_written`] saves it once, with the restore's own
/// writes merged in, where saving it after the scan and merging into the
/// file later wrote it twice.
pub struct KeptCache {
    pub(super) fingerprint: [u8; 32],
    pub(super) reference_ns: i64,
    pub(super) rows: Rows,
    pub(super) dirs: Vec<ListedDir>,
}

impl std::fmt::Debug for KeptCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeptCache")
            .field("entries", &self.rows.order.len())
            .field("dirs", &self.dirs.len())
            .finish()
    }
}

impl KeptCache {
    /// Save at `path`, as [`statcache::write_merged`] merges `updates`.
    pub fn save_with_written(
        &self,
        path: &Path,
        fingerprint: [u8; 32],
        reference_ns: i64,
        updates: Vec<(String, CacheEntry)>,
    ) -> std::io::Result<()> {
        let entries = |visit: &mut dyn FnMut(&str, CacheEntry)| cache_entries(&self.rows, visit);
        let base = statcache::Base {
            fingerprint: self.fingerprint,
            reference_ns: self.reference_ns,
            entries: &entries,
            dirs: self.dirs.iter().map(ListedDir::as_listed),
        };
        statcache::write_merged(path, base, fingerprint, reference_ns, updates)
    }
}

/// The stat cache's entries of a scan's rows, in path order: every kept
/// file but those holding secrets (the cache keeps no secret positions, and a
/// reused hash without them would lose the secrets on restore).
pub(super) fn cache_entries(rows: &Rows, visit: &mut dyn FnMut(&str, CacheEntry)) {
    let mut path = String::new();
    for r in &rows.order {
        let batch = &rows.batches[r.batch as usize];
        let entry = &batch.entries[r.entry as usize];
        match &entry.kind {
            Kind::File(slot) if !slot.vanished && slot.secrets.is_empty() => {
                let hash = slot.hash.expect("every kept file was hashed or reused");
                join_path(&batch.dir, batch.name(entry), &mut path);
                visit(&path, CacheEntry::new(&slot.stat, hash));
            }
            _ => {}
        }
    }
}

/// The key of how a scan is made, beside its manifest digest in the stat
/// cache (statcache's "manifest witness"): rows equal to a recorded scan's
/// encode to the same manifest only under the same policy (what is kept),
/// roots (which symlinks stay inside), secret set (what is zeroed) and
/// encoder (this code's version).
pub(super) fn outcome_key(
    policy: &PolicyMatcher,
    roots: &[Vec<u8>],
    secrets: &[u8; 32],
) -> [u8; 32] {
    let key = blake3::derive_key("checkpointd 2026-12 scan outcome key v1", b"");
    let mut hasher = blake3::Hasher::new_keyed(&key);
    let version = env!("CARGO_PKG_VERSION").as_bytes();
    hasher.update(&(version.len() as u64).to_le_bytes());
    hasher.update(version);
    hasher.update(&policy.source_fingerprint());
    hasher.update(secrets);
    hasher.update(&(roots.len() as u64).to_le_bytes());
    for root in roots {
        hasher.update(&(root.len() as u64).to_le_bytes());
        hasher.update(root);
    }
    *hasher.finalize().as_bytes()
}

pub(super) fn cache_dir(path: &Path) -> Result<PathBuf, ScanError> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&dir).map_err(|e| ScanError::io(&dir, "create", e))?;
    Ok(dir)
}
