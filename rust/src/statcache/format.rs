//! The cache file's layout: sizes of its records, block references and
//! checksums, and little-endian field readers.

use super::CacheEntry;

pub(super) const MAGIC: &[u8; 8] = b"CKPDSTC5";

/// Bytes of the fixed part of an entry after its name.
pub(super) const FIXED: usize = 8 * 5 + 4 + 32;

/// Bytes before an entry's name: its length (u16).
pub(super) const ENTRY_HEAD: usize = 2;

/// Bytes of a directory record between its path and its listing (flags,
/// stat, listing length), and after its listing (its file block).
pub(super) const DIR_BEFORE_LISTING: usize = 1 + 8 * 4 + 4;

pub(super) const DIR_AFTER_LISTING: usize = 8 + 4 + 4 + 8;

/// A directory record's flag: it holds the directory's listing (a record
/// without one only carries the file entries a restore wrote there).
pub(super) const LISTED: u8 = 1;

/// fingerprint, reference, entry count, directory count, directory bytes,
/// entry bytes, witness key and digest (all zero for none); then the checksum.
pub(super) const TRAILER: usize = 32 + 8 * 5 + 32 + 32;

pub(super) const CHECKSUM: usize = 32;

/// Writes are buffered in blocks of this size.
pub(super) const BLOCK: usize = 1 << 20;

/// A path longer than this is not cached (its file is hashed every time);
/// the walk cannot open one anyway (PATH_MAX is 4096).
pub(super) const MAX_PATH: usize = u16::MAX as usize;

/// Where a directory's file entries are in the entry section, how many, and
/// the checksum of their bytes (kept in the checksummed directory section,
/// so a block read on its own is verified against it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct BlockRef {
    pub(super) at: u64,
    pub(super) len: u32,
    pub(super) count: u32,
    pub(super) checksum: u64,
}

/// A block's checksum: XXH3-64, not BLAKE3, for it is verified for every
/// directory of every scan (BLAKE3 of the blocks was ~4% of a no-change
/// scan) and only has to catch damage (a torn write, a bad disk block): the
/// file is in the data dir, which the sandbox cannot write, and the
/// directory section holding these checksums is itself under BLAKE3.
pub(super) fn block_checksum(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

pub(super) fn le_u64(bytes: &[u8]) -> u64 {
    u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"))
}

pub(super) fn le_i64(bytes: &[u8]) -> i64 {
    i64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"))
}

pub(super) fn le_u32(bytes: &[u8]) -> u32 {
    u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes"))
}

pub(super) fn le_u16(bytes: &[u8]) -> u16 {
    u16::from_le_bytes(bytes[..2].try_into().expect("2 bytes"))
}

pub(super) fn parse_fixed(r: &[u8]) -> CacheEntry {
    CacheEntry {
        dev: le_u64(&r[0..]),
        ino: le_u64(&r[8..]),
        size: le_u64(&r[16..]),
        mtime_ns: le_i64(&r[24..]),
        ctime_ns: le_i64(&r[32..]),
        mode: le_u32(&r[40..]),
        hash: r[44..76].try_into().expect("32 bytes"),
    }
}

/// Where the entry section starts (after the magic).
pub(super) const ENTRIES_AT: u64 = MAGIC.len() as u64;
