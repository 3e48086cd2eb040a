//! Writing the cache file: streamed from the caller's rows, one block per
//! directory, replaced atomically by rename.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use super::format::{
    block_checksum, BlockRef, BLOCK, DIR_AFTER_LISTING, DIR_BEFORE_LISTING, FIXED, LISTED, MAGIC,
    MAX_PATH,
};
use super::{CacheEntry, DirStat, ManifestWitness};

/// Write `bytes` to `path` through a temp file next to it and a rename, so a
/// reader sees the old file or the new one. Creates the parent directory.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_streamed(path, |file| file.write_all(bytes))
}

/// Like [`write_atomically`], with the bytes written by `write` into the
/// temp file as they are made (no copy of the whole file in memory).
fn write_streamed(
    path: &Path,
    write: impl FnOnce(&mut fs::File) -> io::Result<()>,
) -> io::Result<()> {
    if let Some(parent) = path.parent() {
        if !parent.as_os_str().is_empty() {
            fs::create_dir_all(parent)?;
        }
    }
    let tmp = temp_path(path);
    let result = (|| {
        let mut file = fs::File::create(&tmp)?;
        write(&mut file)?;
        drop(file);
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

fn temp_path(path: &Path) -> PathBuf {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut name = path
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(format!(".tmp-{}-{}", std::process::id(), n));
    path.with_file_name(name)
}

/// Buffered writes to the cache file, through a BLAKE3 of what is written
/// while `hashing` (the directory section and the trailer).
struct CacheWriter<'f> {
    file: &'f mut fs::File,
    buffer: Vec<u8>,
    hasher: blake3::Hasher,
    hashing: bool,
}

impl CacheWriter<'_> {
    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        if self.hashing {
            self.hasher.update(bytes);
        }
        self.buffer.extend_from_slice(bytes);
        if self.buffer.len() >= BLOCK {
            self.file.write_all(&self.buffer)?;
            self.buffer.clear();
        }
        Ok(())
    }

    fn finish(mut self) -> io::Result<()> {
        let checksum = self.hasher.finalize();
        self.buffer.extend_from_slice(checksum.as_bytes());
        self.file.write_all(&self.buffer)
    }
}

/// One directory's file entries while they are gathered for its block:
/// `name_len u16, name, fixed record` each, in name order.
struct OpenBlock {
    dir: String,
    bytes: Vec<u8>,
    count: u32,
}

/// Whether `dir` is `ancestor` or lies below it ("" is the root, above all).
fn within(dir: &str, ancestor: &str) -> bool {
    ancestor.is_empty()
        || (dir.starts_with(ancestor)
            && (dir.len() == ancestor.len() || dir.as_bytes()[ancestor.len()] == b'/'))
}

/// The directory and name of a file entry's path (`a/b/c` is `a/b`, `c`).
pub(super) fn split_path(path: &str) -> (&str, &str) {
    match path.rfind('/') {
        Some(at) => (&path[..at], &path[at + 1..]),
        None => ("", path),
    }
}

/// Calls its argument with each cache entry, in path order.
pub type EntryVisitor<'a> = dyn Fn(&mut dyn FnMut(&str, CacheEntry)) + 'a;

/// Save a cache of `entries` and `dirs` (each sorted by path bytes, unique)
/// at `path`, atomically, streamed from the caller's data: the entries are
/// gathered per directory (only the directories on the path being visited
/// are open at a time: in path order a directory's subtree is contiguous)
/// and each directory's block is written when its subtree has been passed.
///
/// Layout (little-endian, `"CKPDSTC5"`): the magic; the entry section, one
/// block per directory holding files (per entry `name_len u16, name, dev,
/// ino, size u64, mtime_ns, ctime_ns i64, mode u32, hash[32]`, in name
/// order); the directory section, in path order (per directory `path_len
/// u32, path, flags u8 (1: listed), dev u64, ino u64, mtime_ns i64,
/// ctime_ns i64, listing_len u32, listing, block_at u64, block_len u32,
/// block_count u32, block XXH3-64 u64`, where a directory without a listing
/// carries only a restore's entries and a zero stat); the trailer
/// (fingerprint[32], reference_ns i64, entry count u64, directory count
/// u64, directory bytes u64, entry bytes u64, witness key[32], witness
/// digest[32], both zero for no witness); the BLAKE3 of the directory
/// section and the trailer. So a scan reads the directories whole and each
/// directory's block when it lists that directory, verified on its own.
pub fn write_cache<'b, D>(
    path: &Path,
    fingerprint: &[u8; 32],
    reference_ns: i64,
    witness: Option<&ManifestWitness>,
    entries: &EntryVisitor<'_>,
    dirs: D,
) -> io::Result<()>
where
    D: Iterator<Item = (&'b str, DirStat, &'b [u8])>,
{
    write_streamed(path, |file| {
        let mut out = CacheWriter {
            file,
            buffer: Vec::with_capacity(BLOCK + 4096),
            hasher: blake3::Hasher::new(),
            hashing: false,
        };
        out.put(MAGIC)?;
        let section = write_blocks(&mut out, entries)?;

        // The directories: the listed ones and those holding a block, merged.
        out.hashing = true;
        let (dir_count, dir_bytes) = write_dirs(&mut out, section.blocks, dirs)?;
        let none = ManifestWitness {
            key: [0; 32],
            digest: [0; 32],
        };
        let witness = witness.unwrap_or(&none);
        out.put(fingerprint)?;
        out.put(&reference_ns.to_le_bytes())?;
        out.put(&section.entry_count.to_le_bytes())?;
        out.put(&dir_count.to_le_bytes())?;
        out.put(&dir_bytes.to_le_bytes())?;
        out.put(&section.entry_bytes.to_le_bytes())?;
        out.put(&witness.key)?;
        out.put(&witness.digest)?;
        out.finish()
    })
}

/// The entry section as written: each directory's block (sorted by its
/// path), the bytes of all the blocks and their entries.
struct EntrySection {
    blocks: Vec<(String, BlockRef)>,
    entry_bytes: u64,
    entry_count: u64,
}

/// Write the entry section: `entries` gathered per directory (only the
/// directories on the path being visited are open at a time), each
/// directory's block written when its subtree has been passed.
fn write_blocks(out: &mut CacheWriter<'_>, entries: &EntryVisitor<'_>) -> io::Result<EntrySection> {
    let mut section = EntrySection {
        blocks: Vec::new(),
        entry_bytes: 0,
        entry_count: 0,
    };
    let mut failed: Option<io::Error> = None;
    let mut open: Vec<OpenBlock> = Vec::new();
    entries(&mut |path, e| {
        let (dir, name) = split_path(path);
        if failed.is_some() || path.len() > MAX_PATH || name.is_empty() {
            return;
        }
        // The blocks of directories whose subtree is behind us are complete.
        while open.last().is_some_and(|b| !within(dir, &b.dir)) {
            let done = open.pop().expect("just seen");
            if let Err(error) = section.close(done, out) {
                failed = Some(error);
                return;
            }
        }
        if open.last().map_or(true, |b| b.dir != dir) {
            open.push(OpenBlock {
                dir: dir.to_string(),
                bytes: Vec::new(),
                count: 0,
            });
        }
        open.last_mut().expect("just pushed").push(name, &e);
    });
    if let Some(error) = failed {
        return Err(error);
    }
    while let Some(done) = open.pop() {
        section.close(done, out)?;
    }
    section.blocks.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    Ok(section)
}

impl EntrySection {
    /// Write a directory's complete block and note where it is.
    fn close(&mut self, block: OpenBlock, out: &mut CacheWriter<'_>) -> io::Result<()> {
        out.put(&block.bytes)?;
        self.blocks.push((
            block.dir,
            BlockRef {
                at: self.entry_bytes,
                len: block.bytes.len() as u32,
                count: block.count,
                checksum: block_checksum(&block.bytes),
            },
        ));
        self.entry_bytes += block.bytes.len() as u64;
        self.entry_count += u64::from(block.count);
        Ok(())
    }
}

impl OpenBlock {
    /// Add the entry `name` of this directory.
    fn push(&mut self, name: &str, e: &CacheEntry) {
        let mut record = [0u8; FIXED];
        record[0..8].copy_from_slice(&e.dev.to_le_bytes());
        record[8..16].copy_from_slice(&e.ino.to_le_bytes());
        record[16..24].copy_from_slice(&e.size.to_le_bytes());
        record[24..32].copy_from_slice(&e.mtime_ns.to_le_bytes());
        record[32..40].copy_from_slice(&e.ctime_ns.to_le_bytes());
        record[40..44].copy_from_slice(&e.mode.to_le_bytes());
        record[44..76].copy_from_slice(&e.hash);
        self.bytes
            .extend_from_slice(&(name.len() as u16).to_le_bytes());
        self.bytes.extend_from_slice(name.as_bytes());
        self.bytes.extend_from_slice(&record);
        self.count += 1;
    }
}

/// Write the directory section: the listed directories `dirs` and those
/// holding a block, merged in path order. Returns how many and their bytes.
fn write_dirs<'b, D>(
    out: &mut CacheWriter<'_>,
    blocks: Vec<(String, BlockRef)>,
    dirs: D,
) -> io::Result<(u64, u64)>
where
    D: Iterator<Item = (&'b str, DirStat, &'b [u8])>,
{
    let (mut dir_count, mut dir_bytes) = (0u64, 0u64);
    let mut put_dir = |out: &mut CacheWriter<'_>,
                       path: &str,
                       listed: Option<(DirStat, &[u8])>,
                       block: BlockRef|
     -> io::Result<()> {
        dir_bytes += out.put_dir(path, listed, block)?;
        dir_count += 1;
        Ok(())
    };
    let empty_block = BlockRef {
        checksum: block_checksum(b""),
        ..BlockRef::default()
    };
    let mut blocks = blocks.into_iter().peekable();
    for (path, stat, listing) in dirs {
        while let Some((dir, block)) = blocks.next_if(|(dir, _)| dir.as_str() < path) {
            put_dir(out, &dir, None, block)?;
        }
        let block = match blocks.next_if(|(dir, _)| dir.as_str() == path) {
            Some((_, block)) => block,
            None => empty_block,
        };
        put_dir(out, path, Some((stat, listing)), block)?;
    }
    for (dir, block) in blocks {
        put_dir(out, &dir, None, block)?;
    }
    Ok((dir_count, dir_bytes))
}

impl CacheWriter<'_> {
    /// One directory's record (a zero stat and no listing when it was not
    /// listed); its bytes.
    fn put_dir(
        &mut self,
        path: &str,
        listed: Option<(DirStat, &[u8])>,
        block: BlockRef,
    ) -> io::Result<u64> {
        let (stat, listing) = listed.unwrap_or((
            DirStat {
                dev: 0,
                ino: 0,
                mtime_ns: 0,
                ctime_ns: 0,
            },
            &[],
        ));
        self.put(&(path.len() as u32).to_le_bytes())?;
        self.put(path.as_bytes())?;
        self.put(&[if listed.is_some() { LISTED } else { 0 }])?;
        self.put(&stat.dev.to_le_bytes())?;
        self.put(&stat.ino.to_le_bytes())?;
        self.put(&stat.mtime_ns.to_le_bytes())?;
        self.put(&stat.ctime_ns.to_le_bytes())?;
        self.put(&(listing.len() as u32).to_le_bytes())?;
        self.put(listing)?;
        self.put(&block.at.to_le_bytes())?;
        self.put(&block.len.to_le_bytes())?;
        self.put(&block.count.to_le_bytes())?;
        self.put(&block.checksum.to_le_bytes())?;
        Ok((4 + path.len() + DIR_BEFORE_LISTING + listing.len() + DIR_AFTER_LISTING) as u64)
    }
}
