use std::path::{Path, PathBuf};

use super::write::split_path;
use super::*;

fn dir(ino: u64, names: &[&[u8]]) -> DirRecord {
    let mut listing = Listing::default();
    for name in names {
        listing.push(name, libc::DT_REG);
    }
    DirRecord {
        stat: DirStat {
            dev: 1,
            ino,
            mtime_ns: 5,
            ctime_ns: 6,
        },
        listing: listing.bytes,
    }
}

fn entry(n: u8) -> CacheEntry {
    CacheEntry {
        dev: 1,
        ino: n as u64,
        size: 10,
        mtime_ns: -3,
        ctime_ns: 1 << 40,
        mode: 0o100644,
        hash: [n; 32],
    }
}

fn sample() -> StatCache {
    StatCache {
        fingerprint: secrets_fingerprint::<&[u8]>(&[]),
        reference_ns: 1_700_000_000_000_000_000,
        entries: vec![
            ("a".into(), entry(1)),
            ("a/é".into(), entry(2)),
            ("a/éz".into(), entry(3)),
            ("b".into(), entry(4)),
        ],
        dirs: vec![
            ("".into(), dir(1, &[b"a", b"b"])),
            ("a".into(), dir(2, &[b"\xff"])),
        ],
    }
}

fn saved(cache: &StatCache) -> (tempfile::TempDir, PathBuf, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sub/cache.bin");
    cache.save(&path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    (dir, path, bytes)
}

fn load_owned(path: &Path) -> Option<StatCache> {
    LoadedCache::load(path).and_then(LoadedCache::into_owned)
}

#[test]
fn roundtrip_and_corruption() {
    let cache = sample();
    let (_dir, path, bytes) = saved(&cache);
    assert_eq!(load_owned(&path), Some(cache.clone()));
    // Every flipped byte, in the entries, the directories, the trailer or
    // the checksum, makes the file (or, for an entry, its directory's
    // block, which the owned form needs whole) a cache that is not used.
    for i in 0..bytes.len() {
        let mut bad = bytes.clone();
        bad[i] ^= 1;
        std::fs::write(&path, &bad).unwrap();
        assert_eq!(load_owned(&path), None, "flip at {i}");
    }
    for cut in [0, 1, 8, bytes.len() - 33, bytes.len() - 1] {
        std::fs::write(&path, &bytes[..cut]).unwrap();
        assert_eq!(load_owned(&path), None, "cut at {cut}");
    }
    let mut longer = bytes.clone();
    longer.push(0);
    std::fs::write(&path, &longer).unwrap();
    assert_eq!(load_owned(&path), None);
    // The previous versions are not read (their file is rebuilt).
    for old in [b"CKPDSTC4", b"CKPDSTC3"] {
        let mut old_file = bytes.clone();
        old_file[..8].copy_from_slice(old);
        std::fs::write(&path, &old_file).unwrap();
        assert!(LoadedCache::load(&path).is_none());
    }
    // Unsorted names are refused even with valid checksums.
    let mut unsorted = cache.clone();
    unsorted.entries.swap(1, 2);
    unsorted.save(&path).unwrap();
    assert_eq!(load_owned(&path), None);
    let mut unsorted = cache.clone();
    unsorted.dirs.swap(0, 1);
    unsorted.save(&path).unwrap();
    assert!(LoadedCache::load(&path).is_none());
}

/// A block that does not verify costs its own directory's entries only:
/// the other directories' blocks, and every listing, are still used.
#[test]
fn a_corrupt_block_is_an_empty_directory() {
    let cache = sample();
    let (_dir, path, mut bytes) = saved(&cache);
    // The first block is the first directory closed: "a", holding "é" and "éz".
    let at = 8 + 2 + "é".len() + 5;
    bytes[at] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    let loaded = LoadedCache::load(&path).unwrap();
    let a = loaded.find_dir("a").unwrap();
    assert!(loaded.dir_files(a).is_none());
    let root = loaded.find_dir("").unwrap();
    let files = loaded.dir_files(root).unwrap();
    let (_, e) = &cache.entries[0];
    assert_eq!(files.reusable(b"a", &stat_of(e)), Some(e.hash));
    assert!(loaded.dir_listing("a", &dir_stat(2)).is_some());
}

impl LoadedCache {
    /// [`LoadedCache::settled_listing`] of the directory at `path`.
    fn dir_listing(&self, path: &str, stat: &Stat) -> Option<&[u8]> {
        self.settled_listing(self.find_dir(path)?, stat)
    }
}

fn stat_of(e: &CacheEntry) -> Stat {
    Stat {
        dev: e.dev,
        ino: e.ino,
        mode: e.mode,
        size: e.size,
        mtime_ns: e.mtime_ns,
        ctime_ns: e.ctime_ns,
    }
}

fn dir_stat(ino: u64) -> Stat {
    Stat {
        dev: 1,
        ino,
        mtime_ns: 5,
        ctime_ns: 6,
        ..Stat::default()
    }
}

/// The witness round-trips; an owned cache (what a restore saves) has none.
#[test]
fn manifest_witness_is_kept_and_dropped() {
    let cache = sample();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cache.bin");
    let witness = ManifestWitness {
        key: [7; 32],
        digest: [9; 32],
    };
    let entries = |visit: &mut dyn FnMut(&str, CacheEntry)| cache.visit_entries(visit);
    write_cache(
        &path,
        &cache.fingerprint,
        cache.reference_ns,
        Some(&witness),
        &entries,
        cache.listed(),
    )
    .unwrap();
    assert_eq!(LoadedCache::load(&path).unwrap().witness, Some(witness));
    assert_eq!(load_owned(&path), Some(cache.clone()));
    record_written(&path, cache.fingerprint, cache.reference_ns, Vec::new()).unwrap();
    assert_eq!(LoadedCache::load(&path).unwrap().witness, None);
    assert_eq!(load_owned(&path), Some(cache));
}

#[test]
fn save_and_load() {
    let cache = sample();
    let (dir, path, _) = saved(&cache);
    assert_eq!(load_owned(&path), Some(cache));
    assert_eq!(
        std::fs::read_dir(path.parent().unwrap()).unwrap().count(),
        1
    );
    assert!(LoadedCache::load(&dir.path().join("missing")).is_none());
    let empty = StatCache::default();
    empty.save(&path).unwrap();
    assert_eq!(load_owned(&path), Some(empty));
}

/// Entries of many directories, deep and wide, interleaved in path order
/// with their subdirectories' (the writer's open blocks), including
/// directories with files and no listing: each is found by its directory
/// and name, and the owned form gives them back in path order.
#[test]
fn entries_are_found_per_directory() {
    let mut entries: Vec<(String, CacheEntry)> = Vec::new();
    for i in 0..40_000u32 {
        let d = i / 1000;
        entries.push((format!("dir{d:03}/file-{i:08}"), entry(i as u8)));
        entries.push((format!("dir{d:03}/sub/file-{i:08}"), entry(i as u8)));
        entries.push((format!("dir{d:03}/sub.x/file-{i:08}"), entry(i as u8)));
    }
    entries.push(("top".into(), entry(1)));
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    let cache = StatCache {
        entries,
        ..sample()
    };
    let (_dir, path, _) = saved(&cache);
    assert_eq!(load_owned(&path), Some(cache.clone()));
    let loaded = LoadedCache::load(&path).unwrap();
    assert_eq!(loaded.len(), cache.entries.len());
    for (path, e) in cache.entries.iter().step_by(7) {
        let (dir, name) = split_path(path);
        let files = loaded.dir_files(loaded.find_dir(dir).unwrap()).unwrap();
        assert_eq!(files.reusable(name.as_bytes(), &stat_of(e)), Some(e.hash));
        // Between this entry and the next: not in the cache.
        assert_eq!(
            files.reusable(format!("{name}-").as_bytes(), &stat_of(e)),
            None
        );
    }
    // A directory without files or listing has no record.
    assert!(loaded.find_dir("dir000/none").is_none());
}

#[test]
fn reuse_rules() {
    let owned = sample();
    let (_dir, path, _) = saved(&owned);
    let (_, e) = &owned.entries[1];
    let stat = stat_of(e);
    let loaded = LoadedCache::load(&path).unwrap();
    let files = loaded.dir_files(loaded.find_dir("a").unwrap()).unwrap();
    assert_eq!(files.reusable("é".as_bytes(), &stat), Some(e.hash));
    assert_eq!(files.reusable(b"a", &stat), None);
    let changed = Stat {
        ctime_ns: 5,
        ..stat
    };
    assert_eq!(files.reusable("éz".as_bytes(), &changed), None);
    assert_eq!(files.reusable(b"zz", &stat), None);
    let racy = StatCache {
        reference_ns: e.mtime_ns,
        ..owned.clone()
    };
    racy.save(&path).unwrap();
    let racy = LoadedCache::load(&path).unwrap();
    let files = racy.dir_files(racy.find_dir("a").unwrap()).unwrap();
    assert_eq!(files.reusable("é".as_bytes(), &stat), None);
    let root = dir_stat(1);
    // The directories' own racy rule: under the racy reference, none is reused.
    assert!(racy.dir_listing("", &root).is_none());
    owned.save(&path).unwrap();
    let settled = LoadedCache::load(&path).unwrap();
    assert!(settled.dir_listing("", &root).is_some());
    assert!(settled.dir_listing("", &Stat { ino: 9, ..root }).is_none());
    assert!(settled.dir_listing("b", &root).is_none());
}

#[test]
fn record_written_merges_and_starts_afresh_on_a_bad_cache() {
    let cache = sample();
    let (_dir, path, bytes) = saved(&cache);
    record_written(
        &path,
        cache.fingerprint,
        cache.reference_ns,
        vec![("a/b".into(), entry(9))],
    )
    .unwrap();
    let merged = load_owned(&path).unwrap();
    let paths: Vec<&str> = merged.entries.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(paths, ["a", "a/b", "a/é", "a/éz", "b"]);
    let mut bad = bytes.clone();
    bad[9] ^= 1; // in the first block

    std::fs::write(&path, &bad).unwrap();
    record_written(
        &path,
        cache.fingerprint,
        cache.reference_ns,
        vec![("a/b".into(), entry(9))],
    )
    .unwrap();
    let fresh = load_owned(&path).unwrap();
    assert_eq!(fresh.entries, vec![("a/b".to_string(), entry(9))]);
    assert!(fresh.dirs.is_empty());
}

#[test]
fn fingerprint_is_order_free_and_length_prefixed() {
    assert_eq!(
        secrets_fingerprint(&[b"abcd", b"efgh"]),
        secrets_fingerprint(&[b"efgh", b"abcd"])
    );
    assert_ne!(
        secrets_fingerprint(&[b"abcd".as_slice(), b"efgh"]),
        secrets_fingerprint(&[b"abcdefgh".as_slice()])
    );
}

/// A shared load is the kept cache while the file is the same file (under
/// any name), and the new file's cache once another was renamed over it.
#[test]
fn a_shared_load_is_kept_until_the_file_is_replaced() {
    let cache = sample();
    let (dir, path, _) = saved(&cache);
    let first = LoadedCache::load_shared(&path).unwrap();
    // A capture loads a hard link of the live cache under a name of its own.
    let link = dir.path().join("link.bin");
    std::fs::hard_link(&path, &link).unwrap();
    let again = LoadedCache::load_shared(&link).unwrap();
    assert!(std::sync::Arc::ptr_eq(&first, &again));
    std::fs::remove_file(&link).unwrap();
    assert_eq!(first.len(), cache.entries.len());

    let mut fewer = cache.clone();
    fewer.entries.pop();
    let other = dir.path().join("other.bin");
    fewer.save(&other).unwrap();
    std::fs::rename(&other, &path).unwrap();
    let replaced = LoadedCache::load_shared(&path).unwrap();
    assert!(!std::sync::Arc::ptr_eq(&first, &replaced));
    assert_eq!(replaced.len(), fewer.entries.len());

    LoadedCache::release_shared();
    let reread = LoadedCache::load_shared(&path).unwrap();
    assert!(!std::sync::Arc::ptr_eq(&replaced, &reread));

    std::fs::remove_file(&path).unwrap();
    assert!(LoadedCache::load_shared(&path).is_none());
}
