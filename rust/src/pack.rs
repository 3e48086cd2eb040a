//! Pack objects: many small blobs in one bucket object, each compressed on its
//! own, so a capture of thousands of small files is a handful of PUTs and any
//! one blob is still one ranged GET.
//!
//! # Format (version 1)
//!
//! All integers little-endian. Offsets are from the start of the pack object.
//!
//! ```text
//! pack    := header frame* trailer footer
//! header  := "CKPK" | version u8 (=1) | 3 zero bytes                     (8 bytes)
//! frame   := the blob's stored bytes: a zstd frame (codec 1) or the raw bytes
//!            (codec 0); frames follow each other with no gap, in trailer order
//! trailer := entry*                                                      (42 bytes each)
//! entry   := digest [32] | stored_len u32 | raw_len u32 | codec u8 | kind u8
//! footer  := trailer_len u32 | entries u32 | check [8] | version u8 (=1)
//!            | 3 zero bytes | "CKPK"                                     (24 bytes)
//! ```
//!
//! * `digest` is the blob's key: BLAKE3 of its raw (secret-zeroed, uncompressed)
//!   bytes, exactly as for a single-object blob. `kind` 0 is a file blob
//!   (`sandbox-files/blake3/<hex>`); no other kind is written yet.
//! * The frame of entry *i* starts at `8 + sum(stored_len of entries < i)`; the
//!   trailer lists them in order, so the pack describes itself and an index can
//!   be rebuilt (or checked) from the bucket alone: read the last 24 bytes, then
//!   the `trailer_len` bytes before them (`check` is the first 8 bytes of the
//!   trailer's BLAKE3, so a torn or overwritten trailer is recognised).
//! * codec 1 is one zstd frame (level [`LEVEL`], content size recorded, no zstd
//!   checksum: the BLAKE3 key already checks the bytes). A blob is stored raw
//!   (codec 0) when compression does not make it smaller, so incompressible data
//!   costs nothing extra and an empty blob is an empty frame.
//! * The pack object's own key is `sandbox-packs/blake3/<BLAKE3 of the whole
//!   pack object>`: packs are immutable and content-addressed like blobs.
//!
//! Reading a blob needs only its index row (offset, stored length, raw length,
//! codec): one ranged GET of `stored_len` bytes at `offset`, then
//! [`decode_frame`], which refuses a frame whose decompressed size or BLAKE3
//! differs from the key (so a truncated, overwritten or mis-indexed pack can never
//! hand wrong bytes to a restore).

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;

use rayon::prelude::*;

pub const MAGIC: &[u8; 4] = b"CKPK";
pub const VERSION: u8 = 1;
pub const HEADER_LEN: usize = 8;
pub const ENTRY_LEN: usize = 42;
pub const FOOTER_LEN: usize = 24;
/// zstd level: 1 is the fastest level that still finds most of the redundancy
/// of source files; capture must stay close to `tar | zstd -1`.
pub const LEVEL: i32 = 1;
/// Below this a blob is not worth a compression attempt (a zstd frame's own
/// header is ~10 bytes).
const MIN_COMPRESS: usize = 32;

pub const CODEC_RAW: u8 = 0;
pub const CODEC_ZSTD: u8 = 1;
pub const KIND_FILE: u8 = 0;

/// Where one blob is inside a pack, and how it is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub digest: [u8; 32],
    pub offset: u64,
    pub stored_len: u32,
    pub raw_len: u32,
    pub codec: u8,
    pub kind: u8,
}

/// Why a frame or a pack was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PackError {
    /// A blob's stored bytes do not decode to its key (size or BLAKE3), or
    /// cannot be decoded at all.
    Blob { digest: [u8; 32], reason: String },
    /// The pack's header, trailer or footer is damaged or missing.
    Pack(String),
    /// A blob too large for a pack (lengths are u32).
    TooLarge(usize),
}

impl fmt::Display for PackError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PackError::Blob { reason, .. } => write!(f, "{reason}"),
            PackError::Pack(reason) => write!(f, "{reason}"),
            PackError::TooLarge(n) => write!(f, "a blob of {n} bytes cannot go into a pack"),
        }
    }
}

/// One blob in its stored form, ready to go into a pack: the zstd frame of
/// its raw bytes when that is smaller, else the raw bytes themselves. The
/// scan makes these while a small file's bytes are still in cache, so the
/// feed carries (and bounds) stored bytes and a pack only concatenates them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub digest: [u8; 32],
    pub raw_len: u32,
    pub codec: u8,
    pub stored: Vec<u8>,
}

impl Frame {
    /// The frame of `raw`, whose key is `digest`. `raw` must fit a pack
    /// (below 4 GiB: [`PackBuilder::add_many`] refuses larger blobs first).
    pub fn encode(digest: [u8; 32], raw: &[u8]) -> Frame {
        let raw_len = u32::try_from(raw.len()).expect("a packed blob is below 4 GiB");
        let compressed = if raw.len() >= MIN_COMPRESS {
            compress_smaller(raw)
        } else {
            None
        };
        let (codec, stored) = match compressed {
            Some(stored) => (CODEC_ZSTD, stored),
            None => (CODEC_RAW, raw.to_vec()),
        };
        Frame {
            digest,
            raw_len,
            codec,
            stored,
        }
    }

    /// The raw bytes back, checked against the key ([`decode_frame`]).
    pub fn decode(&self) -> Result<Vec<u8>, PackError> {
        let entry = Entry {
            digest: self.digest,
            offset: 0,
            stored_len: self.stored.len() as u32,
            raw_len: self.raw_len,
            codec: self.codec,
            kind: KIND_FILE,
        };
        decode_frame(&entry, &self.stored)
    }
}

thread_local! {
    // One zstd context per thread, reused: making one costs more than
    // compressing a small file (a context is a few hundred KiB of tables).
    static COMPRESSOR: RefCell<Option<zstd::bulk::Compressor<'static>>> = const { RefCell::new(None) };
    // Where a frame is compressed before it is copied out at its exact size
    // (a frame sized by the compression bound would hold twice its bytes).
    static COMPRESSED: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    static DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
}

/// The zstd frame of `raw` when it is smaller than `raw` (None otherwise, or
/// when zstd fails, which stores the blob raw).
fn compress_smaller(raw: &[u8]) -> Option<Vec<u8>> {
    COMPRESSOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            let mut c = zstd::bulk::Compressor::new(LEVEL).ok()?;
            c.include_checksum(false).ok()?;
            c.include_contentsize(true).ok()?;
            c.include_dictid(false).ok()?;
            *slot = Some(c);
        }
        let compressor = slot.as_mut().expect("just set");
        COMPRESSED.with(|out| {
            let mut out = out.borrow_mut();
            out.clear();
            out.reserve(zstd::zstd_safe::compress_bound(raw.len()));
            let n = compressor.compress_to_buffer(raw, &mut *out).ok()?;
            (n < raw.len()).then(|| out[..n].to_vec())
        })
    })
}

fn decompress(stored: &[u8], capacity: usize) -> std::io::Result<Vec<u8>> {
    DECOMPRESSOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(zstd::bulk::Decompressor::new()?);
        }
        slot.as_mut()
            .expect("just set")
            .decompress(stored, capacity)
    })
}

/// The raw bytes of a frame, checked against its entry: the decoded length must
/// be `raw_len` and its BLAKE3 must be `digest`.
pub fn decode_frame(entry: &Entry, stored: &[u8]) -> Result<Vec<u8>, PackError> {
    let fail = |reason: String| PackError::Blob {
        digest: entry.digest,
        reason,
    };
    if stored.len() != entry.stored_len as usize {
        return Err(fail(format!(
            "the pack holds {} of its {} stored bytes (truncated)",
            stored.len(),
            entry.stored_len
        )));
    }
    let raw = match entry.codec {
        CODEC_RAW => stored.to_vec(),
        CODEC_ZSTD => {
            // The capacity is the recorded size: a frame claiming more (a
            // damaged or hostile pack) fails instead of allocating without bound.
            decompress(stored, entry.raw_len as usize)
                .map_err(|e| fail(format!("its zstd frame does not decode: {e}")))?
        }
        other => return Err(fail(format!("unknown codec {other}"))),
    };
    if raw.len() != entry.raw_len as usize {
        return Err(fail(format!(
            "it decodes to {} bytes, not {}",
            raw.len(),
            entry.raw_len
        )));
    }
    if blake3::hash(&raw).as_bytes() != &entry.digest {
        return Err(fail("the BLAKE3 of its bytes is not its key".to_string()));
    }
    Ok(raw)
}

/// Decode many frames at once (in parallel): `data` holds the bytes of the
/// pack from `base` on; each entry's frame must lie inside it.
pub fn decode_many(base: u64, data: &[u8], entries: &[Entry]) -> Vec<Result<Vec<u8>, PackError>> {
    entries
        .par_iter()
        .map(|entry| {
            let start = entry.offset.checked_sub(base).map(|s| s as usize);
            let end = start.map(|s| s + entry.stored_len as usize);
            match (start, end) {
                (Some(s), Some(e)) if e <= data.len() => decode_frame(entry, &data[s..e]),
                (Some(s), _) if s <= data.len() => decode_frame(entry, &data[s..]),
                _ => Err(PackError::Blob {
                    digest: entry.digest,
                    reason: "its frame lies outside the bytes read (truncated pack)".to_string(),
                }),
            }
        })
        .collect()
}

/// A pack being built: frames appended in order, trailer and footer at `finish`.
pub struct PackBuilder {
    buf: Vec<u8>,
    entries: Vec<Entry>,
}

impl Default for PackBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl PackBuilder {
    pub fn new() -> PackBuilder {
        let mut buf = Vec::with_capacity(1 << 20);
        buf.extend_from_slice(MAGIC);
        buf.extend_from_slice(&[VERSION, 0, 0, 0]);
        PackBuilder {
            buf,
            entries: Vec::new(),
        }
    }

    /// Bytes so far (header and frames; the trailer adds `ENTRY_LEN` per blob).
    pub fn len(&self) -> usize {
        self.buf.len() + self.entries.len() * ENTRY_LEN + FOOTER_LEN
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// Compress `blobs` (in parallel) and append them; their entries, in order.
    pub fn add_many(&mut self, blobs: &[([u8; 32], &[u8])]) -> Result<Vec<Entry>, PackError> {
        if let Some((_, raw)) = blobs.iter().find(|(_, raw)| raw.len() > u32::MAX as usize) {
            return Err(PackError::TooLarge(raw.len()));
        }
        let frames: Vec<Frame> = blobs
            .par_iter()
            .map(|(digest, raw)| Frame::encode(*digest, raw))
            .collect();
        Ok(frames.iter().map(|frame| self.push(frame)).collect())
    }

    /// Append one blob already in its stored form; its entry.
    pub fn push(&mut self, frame: &Frame) -> Entry {
        let entry = Entry {
            digest: frame.digest,
            offset: self.buf.len() as u64,
            stored_len: frame.stored.len() as u32,
            raw_len: frame.raw_len,
            codec: frame.codec,
            kind: KIND_FILE,
        };
        self.buf.extend_from_slice(&frame.stored);
        self.entries.push(entry);
        entry
    }

    /// The complete pack object.
    pub fn finish(mut self) -> Vec<u8> {
        let mut trailer = Vec::with_capacity(self.entries.len() * ENTRY_LEN);
        for e in &self.entries {
            trailer.extend_from_slice(&e.digest);
            trailer.extend_from_slice(&e.stored_len.to_le_bytes());
            trailer.extend_from_slice(&e.raw_len.to_le_bytes());
            trailer.push(e.codec);
            trailer.push(e.kind);
        }
        let check = blake3::hash(&trailer);
        self.buf.extend_from_slice(&trailer);
        self.buf
            .extend_from_slice(&(trailer.len() as u32).to_le_bytes());
        self.buf
            .extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        self.buf.extend_from_slice(&check.as_bytes()[..8]);
        self.buf.extend_from_slice(&[VERSION, 0, 0, 0]);
        self.buf.extend_from_slice(MAGIC);
        self.buf
    }
}

/// A pack's index rows in columns, one row per distinct digest, in digest
/// order: what an append records, handed to Python as a few byte strings
/// instead of one object per blob. Integers are native-endian `u32`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct IndexColumns {
    pub digests: Vec<u8>,
    pub offsets: Vec<u8>,
    pub lengths: Vec<u8>,
    pub raw_sizes: Vec<u8>,
    pub codecs: Vec<u8>,
}

/// The index columns of `entries` (a blob listed twice keeps its first frame).
pub fn index_columns(entries: &[Entry]) -> IndexColumns {
    let mut sorted: Vec<&Entry> = entries.iter().collect();
    sorted.sort_by_key(|e| e.digest); // stable: the first frame first
    sorted.dedup_by(|later, first| later.digest == first.digest);
    let mut out = IndexColumns {
        digests: Vec::with_capacity(sorted.len() * 32),
        offsets: Vec::with_capacity(sorted.len() * 4),
        lengths: Vec::with_capacity(sorted.len() * 4),
        raw_sizes: Vec::with_capacity(sorted.len() * 4),
        codecs: Vec::with_capacity(sorted.len()),
    };
    for e in sorted {
        out.digests.extend_from_slice(&e.digest);
        // A pack is far below 4 GiB (its writer keeps it near its target).
        out.offsets
            .extend_from_slice(&(e.offset as u32).to_ne_bytes());
        out.lengths.extend_from_slice(&e.stored_len.to_ne_bytes());
        out.raw_sizes.extend_from_slice(&e.raw_len.to_ne_bytes());
        out.codecs.push(e.codec);
    }
    out
}

fn u32_at(data: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(data[at..at + 4].try_into().expect("4 bytes"))
}

/// The trailer length a pack's last [`FOOTER_LEN`] bytes announce (so a reader
/// can fetch exactly the tail it needs), checked for magic and version.
pub fn footer_trailer_len(footer: &[u8]) -> Result<usize, PackError> {
    if footer.len() < FOOTER_LEN {
        return Err(PackError::Pack(format!(
            "the pack is shorter than its {FOOTER_LEN}-byte footer"
        )));
    }
    let f = &footer[footer.len() - FOOTER_LEN..];
    if &f[20..24] != MAGIC || f[16] != VERSION {
        return Err(PackError::Pack(
            "the pack has no version-1 footer (truncated or not a pack)".to_string(),
        ));
    }
    let trailer_len = u32_at(f, 0) as usize;
    let count = u32_at(f, 4) as usize;
    if trailer_len != count * ENTRY_LEN {
        return Err(PackError::Pack(format!(
            "the footer names {count} blobs but {trailer_len} trailer bytes"
        )));
    }
    Ok(trailer_len)
}

/// The blobs a pack lists, read from its tail: `tail` is the last bytes of the
/// pack (at least trailer and footer; the whole pack will do) and `pack_len`
/// the pack's full length. Checks the header magic when `tail` is the whole
/// pack, the trailer's check bytes, and that the frames exactly fill the space
/// between header and trailer.
pub fn read_trailer(tail: &[u8], pack_len: u64) -> Result<Vec<Entry>, PackError> {
    let trailer_len = footer_trailer_len(tail)?;
    let need = trailer_len + FOOTER_LEN;
    if tail.len() < need {
        return Err(PackError::Pack(format!(
            "need the last {need} bytes of the pack to read its trailer"
        )));
    }
    if (pack_len as usize) < HEADER_LEN + need {
        return Err(PackError::Pack(
            "the pack is shorter than its trailer".to_string(),
        ));
    }
    if tail.len() as u64 == pack_len && &tail[..4] != MAGIC {
        return Err(PackError::Pack("the pack has no header".to_string()));
    }
    let footer = &tail[tail.len() - FOOTER_LEN..];
    let trailer = &tail[tail.len() - need..tail.len() - FOOTER_LEN];
    if blake3::hash(trailer).as_bytes()[..8] != footer[8..16] {
        return Err(PackError::Pack("the pack's trailer is damaged".to_string()));
    }
    let mut entries = Vec::with_capacity(trailer_len / ENTRY_LEN);
    let mut offset = HEADER_LEN as u64;
    for raw in trailer.chunks_exact(ENTRY_LEN) {
        let entry = Entry {
            digest: raw[..32].try_into().expect("32 bytes"),
            offset,
            stored_len: u32_at(raw, 32),
            raw_len: u32_at(raw, 36),
            codec: raw[40],
            kind: raw[41],
        };
        offset += entry.stored_len as u64;
        entries.push(entry);
    }
    if offset != pack_len - need as u64 {
        return Err(PackError::Pack(format!(
            "the trailer's frames end at {offset}, the pack's frames at {}",
            pack_len - need as u64
        )));
    }
    Ok(entries)
}

/// One ranged read of a pack: bytes `[start, end)` of pack `pack` (the
/// caller's number for it) and the frames it holds (indices into the
/// caller's list), by offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedRead {
    pub pack: usize,
    pub start: u64,
    pub end: u64,
    pub frames: Vec<usize>,
}

/// Group frames `(pack, offset, stored_len)` by pack and merge nearby ones
/// into few ranged reads: a frame joins the read before it when it starts at
/// most `merge_gap` bytes after that read's end and the read stays within
/// `max_range` bytes. Packs come in the order of their first frame, each
/// pack's reads in offset order; given every frame a restore needs, that is
/// about one read per pack.
pub fn plan_reads(
    frames: &[(usize, u64, u64)],
    merge_gap: u64,
    max_range: u64,
) -> Vec<PlannedRead> {
    let mut order: Vec<usize> = (0..frames.len()).collect();
    let mut first_seen: HashMap<usize, usize> = HashMap::new();
    for (i, &(pack, _, _)) in frames.iter().enumerate() {
        first_seen.entry(pack).or_insert(i);
    }
    order.sort_by_key(|&i| (first_seen[&frames[i].0], frames[i].1));
    let mut out: Vec<PlannedRead> = Vec::new();
    for i in order {
        let (pack, offset, len) = frames[i];
        let end = offset + len;
        if let Some(read) = out.last_mut() {
            if read.pack == pack
                && offset.saturating_sub(read.end) <= merge_gap
                && end.saturating_sub(read.start) <= max_range
            {
                read.end = read.end.max(end);
                read.frames.push(i);
                continue;
            }
        }
        out.push(PlannedRead {
            pack,
            start: offset,
            end,
            frames: vec![i],
        });
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn plan_reads_merges_near_frames_of_one_pack_in_offset_order() {
        // pack 7 first (its first frame comes first), then pack 3.
        let frames = [
            (7, 100, 10),
            (3, 0, 5),
            (7, 0, 10),
            (7, 5000, 10),
            (3, 8, 2),
        ];
        let reads = plan_reads(&frames, 100, 1 << 20);
        assert_eq!(
            reads,
            vec![
                PlannedRead {
                    pack: 7,
                    start: 0,
                    end: 110,
                    frames: vec![2, 0]
                },
                PlannedRead {
                    pack: 7,
                    start: 5000,
                    end: 5010,
                    frames: vec![3]
                },
                PlannedRead {
                    pack: 3,
                    start: 0,
                    end: 10,
                    frames: vec![1, 4]
                },
            ]
        );
    }

    #[test]
    fn plan_reads_splits_a_read_at_the_range_limit() {
        let frames = [(0, 0, 60), (0, 60, 60), (0, 120, 60)];
        let reads = plan_reads(&frames, 0, 120);
        assert_eq!(
            reads.iter().map(|r| (r.start, r.end)).collect::<Vec<_>>(),
            vec![(0, 120), (120, 180)]
        );
    }

    use super::*;

    fn blob(data: &[u8]) -> ([u8; 32], Vec<u8>) {
        (*blake3::hash(data).as_bytes(), data.to_vec())
    }

    fn pseudo_random(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    #[test]
    fn round_trip_mixed_blobs() {
        let blobs = [
            blob(b""),
            blob(b"short"),
            blob(&b"compressible text ".repeat(200)),
            blob(&pseudo_random(5000, 7)),
        ];
        let mut pack = PackBuilder::new();
        let items: Vec<_> = blobs.iter().map(|(d, b)| (*d, b.as_slice())).collect();
        let entries = pack.add_many(&items).unwrap();
        assert_eq!(entries[0].codec, CODEC_RAW);
        assert_eq!(entries[2].codec, CODEC_ZSTD);
        assert!(entries[2].stored_len < entries[2].raw_len / 10);
        assert_eq!(
            entries[3].codec, CODEC_RAW,
            "incompressible data is stored raw"
        );
        let bytes = pack.finish();
        let listed = read_trailer(&bytes, bytes.len() as u64).unwrap();
        assert_eq!(listed, entries);
        let decoded = decode_many(0, &bytes, &entries);
        for ((_, raw), got) in blobs.iter().zip(decoded) {
            assert_eq!(&got.unwrap(), raw);
        }
        // One frame read on its own, as a ranged GET would.
        let e = entries[2];
        let frame = &bytes[e.offset as usize..(e.offset + e.stored_len as u64) as usize];
        assert_eq!(decode_frame(&e, frame).unwrap(), blobs[2].1);
    }

    #[test]
    fn a_frame_made_apart_packs_like_an_added_blob() {
        let (text, raw_text) = blob(&b"compressible text ".repeat(200));
        let (noise, raw_noise) = blob(&pseudo_random(5000, 3));
        let frames = [
            Frame::encode(text, &raw_text),
            Frame::encode(noise, &raw_noise),
        ];
        assert_eq!(frames[0].codec, CODEC_ZSTD);
        assert!(frames[0].stored.len() < raw_text.len() / 10);
        assert_eq!(
            (frames[1].codec, frames[1].stored.as_slice()),
            (CODEC_RAW, raw_noise.as_slice())
        );
        assert_eq!(frames[0].decode().unwrap(), raw_text);

        let mut pushed = PackBuilder::new();
        for frame in &frames {
            pushed.push(frame);
        }
        let mut added = PackBuilder::new();
        added
            .add_many(&[(text, raw_text.as_slice()), (noise, raw_noise.as_slice())])
            .unwrap();
        assert_eq!(pushed.entries(), added.entries());
        assert_eq!(pushed.finish(), added.finish());

        // A frame whose bytes were damaged after it was made is refused.
        let mut bad = frames[0].clone();
        bad.stored[3] ^= 1;
        assert!(matches!(bad.decode(), Err(PackError::Blob { digest, .. }) if digest == text));
    }

    #[test]
    fn index_columns_are_sorted_and_distinct() {
        let (a, raw_a) = blob(b"alpha alpha alpha alpha alpha alpha alpha");
        let (b, raw_b) = blob(b"b");
        let mut builder = PackBuilder::new();
        builder
            .add_many(&[(a, &raw_a), (b, &raw_b), (a, &raw_a)])
            .unwrap();
        let entries = builder.entries().to_vec();
        let columns = index_columns(&entries);
        let (first, second) = if a < b { (a, b) } else { (b, a) };
        assert_eq!(columns.digests, [first, second].concat());
        assert_eq!(columns.codecs.len(), 2);
        let of_a = entries[0];
        let at = if a < b { 0 } else { 4 };
        let offset = u32::from_ne_bytes(columns.offsets[at..at + 4].try_into().unwrap());
        let length = u32::from_ne_bytes(columns.lengths[at..at + 4].try_into().unwrap());
        assert_eq!((offset as u64, length), (of_a.offset, of_a.stored_len));
    }

    #[test]
    fn damage_is_refused() {
        let (digest, raw) = blob(&b"abcdefgh".repeat(100));
        let mut pack = PackBuilder::new();
        let e = pack.add_many(&[(digest, raw.as_slice())]).unwrap()[0];
        let mut bytes = pack.finish();
        let at = e.offset as usize + 5;
        bytes[at] ^= 0xff;
        let got = decode_many(0, &bytes, &[e]).pop().unwrap();
        assert!(matches!(got, Err(PackError::Blob { .. })));
        // Truncated: the frame runs past the bytes.
        let short = &bytes[..at];
        let got = decode_many(0, short, &[e]).pop().unwrap();
        assert!(matches!(got, Err(PackError::Blob { reason, .. }) if reason.contains("truncated")));
        assert!(read_trailer(short, short.len() as u64).is_err());
        // A wrong key for good bytes.
        let wrong = Entry {
            digest: [0; 32],
            ..e
        };
        bytes[at] ^= 0xff;
        assert!(decode_many(0, &bytes, &[wrong])[0].is_err());
    }
}
