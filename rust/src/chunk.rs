//! Content-defined chunks of large files: FastCDC 2020 (the `fastcdc`
//! crate's cut-point function, normalization level 1) over a file's
//! secret-zeroed bytes, in one streaming pass that also computes the
//! whole-file BLAKE3 (see docs/chunks.md).
//!
//! A file above [`ChunkParams::threshold`] is stored as its chunks: each
//! chunk is a blob keyed by the BLAKE3 of its bytes, packed like any small
//! blob. Its manifest row keeps the whole-file digest and lists the chunks
//! (see [`encode_list`]). Cut points depend only on the bytes, so an edit
//! changes the chunks around it and the rest of the file keeps its chunks.
//!
//! Memory is bounded whatever the file size: the cutter holds at most one
//! maximum-size chunk plus one read piece.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;

use crate::cancel::Cancel;
use crate::hash::{HashError, STREAM_CHUNK};
use crate::redact::{SecretMatch, SecretSet, ZeroingStream};

/// Where content-defined chunking applies and the chunk sizes it aims for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkParams {
    /// Files of more bytes than this are chunked.
    pub threshold: u64,
    pub min: u32,
    pub avg: u32,
    pub max: u32,
}

/// Files above 1 MiB are chunked by default.
pub const DEFAULT_THRESHOLD: u64 = 1 << 20;
/// Chunks average 64 KiB by default (16 KiB to 256 KiB).
pub const DEFAULT_AVG: u32 = 64 << 10;
/// The smallest threshold accepted: smaller files are cheaper whole.
pub const MIN_THRESHOLD: u64 = 64 << 10;

impl Default for ChunkParams {
    fn default() -> ChunkParams {
        ChunkParams::new(DEFAULT_THRESHOLD, DEFAULT_AVG).expect("the defaults are valid")
    }
}

impl ChunkParams {
    /// Chunks of `avg` bytes on average (a power of two from 1 KiB to
    /// 4 MiB), at least a quarter and at most four times that, for files
    /// above `threshold` bytes (at least [`MIN_THRESHOLD`]). Err names the
    /// setting and the rule.
    pub fn new(threshold: u64, avg: u32) -> Result<ChunkParams, String> {
        use fastcdc::v2020::{AVERAGE_MAX, MAXIMUM_MAX};
        if !avg.is_power_of_two() || !(1024..=AVERAGE_MAX).contains(&avg) {
            return Err(format!(
                "chunk average {avg} must be a power of two from 1024 to {AVERAGE_MAX} bytes"
            ));
        }
        if threshold < MIN_THRESHOLD {
            return Err(format!(
                "chunk threshold {threshold} must be at least {MIN_THRESHOLD} bytes"
            ));
        }
        Ok(ChunkParams {
            threshold,
            min: avg / 4,
            avg,
            max: (avg * 4).min(MAXIMUM_MAX),
        })
    }

    /// Whether a file of `size` bytes is chunked.
    pub fn applies(&self, size: u64) -> bool {
        size > self.threshold
    }

    /// What decides a file's chunk list (the threshold and the sizes), for
    /// caches of chunk lists.
    pub fn fingerprint(&self) -> [u8; 20] {
        let mut out = [0u8; 20];
        out[..8].copy_from_slice(&self.threshold.to_le_bytes());
        out[8..12].copy_from_slice(&self.min.to_le_bytes());
        out[12..16].copy_from_slice(&self.avg.to_le_bytes());
        out[16..].copy_from_slice(&self.max.to_le_bytes());
        out
    }
}

/// One chunk of a file: its blob's digest and its length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChunkRef {
    pub digest: [u8; 32],
    pub len: u32,
}

/// The chunk list as a manifest row holds it: one JSON string of
/// `<64 hex digest><decimal length>` items joined by `,` (no character JSON
/// escapes, so the row's bytes are this text between quotes).
pub fn encode_list(chunks: &[ChunkRef]) -> String {
    let mut out = String::with_capacity(chunks.len() * 71);
    for (i, chunk) in chunks.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&crate::hash::to_hex(&chunk.digest));
        out.push_str(&chunk.len.to_string());
    }
    out
}

/// The chunks of an [`encode_list`] text; None unless well formed (every
/// length above 0).
pub fn parse_list(text: &[u8]) -> Option<Vec<ChunkRef>> {
    let mut out = Vec::with_capacity(text.len() / 70 + 1);
    for item in text.split(|&b| b == b',') {
        out.push(parse_item(item)?);
    }
    Some(out)
}

fn parse_item(item: &[u8]) -> Option<ChunkRef> {
    if item.len() <= 64 || item.len() > 64 + 10 {
        return None;
    }
    let digest = crate::hash::from_hex(std::str::from_utf8(&item[..64]).ok()?)?;
    let digits = &item[64..];
    if !digits.iter().all(u8::is_ascii_digit) || digits[0] == b'0' {
        return None;
    }
    let len: u32 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(ChunkRef { digest, len })
}

/// Finds cut points in a stream of bytes exactly where the crate's
/// `FastCDC` over the whole input would: a cut is made only with at least
/// one maximum chunk of bytes ahead, or at the end of the input.
pub struct Cutter {
    params: ChunkParams,
    masks: (u64, u64),
    held: Vec<u8>,
}

impl Cutter {
    pub fn new(params: ChunkParams) -> Cutter {
        use fastcdc::v2020::{logarithm2, Normalization, MASKS};
        let bits = logarithm2(params.avg);
        let level = Normalization::Level1.bits();
        Cutter {
            params,
            masks: (
                MASKS[(bits + level) as usize],
                MASKS[(bits - level) as usize],
            ),
            held: Vec::with_capacity(params.max as usize + STREAM_CHUNK),
        }
    }

    /// The length of the first chunk of `data` (all of `data` when it is the
    /// input's end and short).
    fn cut(&self, data: &[u8]) -> usize {
        let (mask_s, mask_l) = self.masks;
        let p = &self.params;
        let (_, at) = fastcdc::v2020::cut(
            data,
            p.min as usize,
            p.avg as usize,
            p.max as usize,
            mask_s,
            mask_l,
            mask_s << 1,
            mask_l << 1,
        );
        at
    }

    /// Take `data`, handing each chunk it completes to `emit` in order.
    pub fn push<E>(&mut self, data: &[u8], emit: &mut E) -> io::Result<()>
    where
        E: FnMut(&[u8]) -> io::Result<()>,
    {
        let max = self.params.max as usize;
        self.held.extend_from_slice(data);
        let mut at = 0;
        while self.held.len() - at >= max {
            let len = self.cut(&self.held[at..]);
            emit(&self.held[at..at + len])?;
            at += len;
        }
        // Less than a maximum chunk is left: moved to the front (a copy of
        // at most `max` bytes per piece).
        self.held.drain(..at);
        Ok(())
    }

    /// The input ended: the held bytes' chunks.
    pub fn finish<E>(&mut self, emit: &mut E) -> io::Result<()>
    where
        E: FnMut(&[u8]) -> io::Result<()>,
    {
        let held = std::mem::take(&mut self.held);
        let mut at = 0;
        while at < held.len() {
            let len = self.cut(&held[at..]);
            emit(&held[at..at + len])?;
            at += len;
        }
        Ok(())
    }
}

/// What one chunking pass over a file found.
#[derive(Debug, Default)]
pub struct Chunked {
    /// BLAKE3 of the whole zeroed file.
    pub digest: [u8; 32],
    pub size: u64,
    pub chunks: Vec<ChunkRef>,
    /// Where secrets were zeroed, sorted.
    pub found: Vec<SecretMatch>,
}

/// Read `reader` to its end once: zero the secrets, hash the whole, cut
/// it into chunks and hash each; `on_chunk` gets each chunk's digest and
/// zeroed bytes, in order. `parallel`: the whole-file hash uses rayon.
pub fn hash_chunked<R: Read>(
    reader: R,
    secrets: &SecretSet,
    params: ChunkParams,
    cancel: &Cancel,
    parallel: bool,
    on_chunk: &mut dyn FnMut(&[u8; 32], &[u8]),
) -> Result<Chunked, HashError> {
    let mut stream = ZeroingStream::new(reader, secrets.clone(), STREAM_CHUNK);
    let mut whole = blake3::Hasher::new();
    let mut cutter = Cutter::new(params);
    let mut chunks = Vec::new();
    let mut emit = |chunk: &[u8]| -> io::Result<()> {
        let digest = *blake3::hash(chunk).as_bytes();
        chunks.push(ChunkRef {
            digest,
            len: chunk.len() as u32,
        });
        on_chunk(&digest, chunk);
        Ok(())
    };
    while let Some(piece) = stream.next_chunk()? {
        if cancel.is_cancelled() {
            return Err(HashError::Cancelled);
        }
        if parallel && piece.len() >= 1 << 17 {
            whole.update_rayon(piece);
        } else {
            whole.update(piece);
        }
        cutter.push(piece, &mut emit)?;
    }
    cutter.finish(&mut emit)?;
    Ok(Chunked {
        digest: *whole.finalize().as_bytes(),
        size: stream.bytes_read,
        chunks,
        found: stream.matches(),
    })
}

/// Reads a file with `pread` from an offset (its file position untouched),
/// at most `limit` bytes.
pub struct PositionalReader<'a> {
    pub file: &'a File,
    pub at: u64,
    pub limit: u64,
}

impl Read for PositionalReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let want = (buf.len() as u64).min(self.limit) as usize;
        if want == 0 {
            return Ok(0);
        }
        let n = self.file.read_at(&mut buf[..want], self.at)?;
        self.at += n as u64;
        self.limit -= n as u64;
        Ok(n)
    }
}

/// The zeroed bytes of `file` at `[offset, offset + len)`, as a pass over the
/// whole file would zero them: a secret reaching into the range from either
/// side is zeroed too (the range is read with `overlap` bytes around it).
/// Short when the file ends before the range does.
pub fn read_zeroed_range(
    file: &File,
    offset: u64,
    len: usize,
    secrets: &SecretSet,
) -> io::Result<Vec<u8>> {
    let margin = if secrets.is_empty() {
        0
    } else {
        secrets.overlap() as u64
    };
    let start = offset.saturating_sub(margin);
    let before = (offset - start) as usize;
    let mut window = vec![0u8; before + len + margin as usize];
    let mut filled = 0;
    while filled < window.len() {
        match file.read_at(&mut window[filled..], start + filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    window.truncate(filled);
    if !secrets.is_empty() {
        secrets.zero_in_place(&mut window);
    }
    let end = (before + len).min(window.len());
    Ok(window
        .get(before..end)
        .map(<[u8]>::to_vec)
        .unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noise(len: usize, seed: u64) -> Vec<u8> {
        let mut state = seed | 1;
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 24) as u8
            })
            .collect()
    }

    /// The crate's own chunker over the whole input: the reference.
    fn reference(data: &[u8], p: ChunkParams) -> Vec<(usize, usize)> {
        fastcdc::v2020::FastCDC::new(data, p.min, p.avg, p.max)
            .map(|c| (c.offset, c.length))
            .collect()
    }

    fn streamed(data: &[u8], p: ChunkParams, piece: usize) -> Vec<(usize, usize)> {
        let mut cutter = Cutter::new(p);
        let mut out = Vec::new();
        let mut at = 0usize;
        let mut emit = |chunk: &[u8]| {
            out.push((at, chunk.len()));
            at += chunk.len();
            Ok(())
        };
        for part in data.chunks(piece.max(1)) {
            cutter.push(part, &mut emit).unwrap();
        }
        cutter.finish(&mut emit).unwrap();
        out
    }

    #[test]
    fn streaming_cuts_where_the_crate_cuts() {
        let p = ChunkParams::new(MIN_THRESHOLD, 4096).unwrap();
        for (len, seed) in [(0, 1), (100, 2), (1023, 3), (16_384, 4), (300_000, 5)] {
            let data = noise(len, seed);
            let want = reference(&data, p);
            for piece in [1, 7, 1000, 4096, 16_384, 65_536, 1 << 20] {
                assert_eq!(streamed(&data, p, piece), want, "len {len} piece {piece}");
            }
        }
        // Long runs of zeros cut at the maximum.
        let mut data = noise(50_000, 9);
        data.extend(std::iter::repeat(0).take(100_000));
        data.extend(noise(30_000, 10));
        assert_eq!(streamed(&data, p, 3000), reference(&data, p));
    }

    #[test]
    fn the_default_sizes_match_the_crate() {
        let p = ChunkParams::default();
        assert_eq!((p.min, p.avg, p.max), (16 << 10, 64 << 10, 256 << 10));
        let data = noise(3 << 20, 11);
        let want = reference(&data, p);
        assert!(want.len() > 20, "{} chunks", want.len());
        assert_eq!(streamed(&data, p, STREAM_CHUNK), want);
    }

    #[test]
    fn an_insertion_changes_only_nearby_chunks() {
        let p = ChunkParams::default();
        let data = noise(8 << 20, 12);
        let mut edited = data.clone();
        let middle = data.len() / 2;
        edited.splice(middle..middle, noise(4096, 13));
        let digests = |d: &[u8]| -> std::collections::HashSet<[u8; 32]> {
            let mut found = std::collections::HashSet::new();
            hash_chunked(
                d,
                &SecretSet::empty(),
                p,
                &Cancel::new(),
                false,
                &mut |h, _| {
                    found.insert(*h);
                },
            )
            .unwrap();
            found
        };
        let (before, after) = (digests(&data), digests(&edited));
        let new = after.difference(&before).count();
        assert!(
            (1..=3).contains(&new),
            "{new} new chunks of {}",
            after.len()
        );
    }

    #[test]
    fn hash_chunked_hashes_the_whole_and_each_chunk_of_the_zeroed_bytes() {
        let p = ChunkParams::default();
        let mut data = noise(2 << 20, 14);
        let secret = b"hunter2-secret";
        // A secret every 100 KiB: some straddle chunk boundaries.
        for at in (0..data.len() - 64).step_by(100 << 10) {
            data[at..at + secret.len()].copy_from_slice(secret);
        }
        let secrets = SecretSet::new(&[secret]).unwrap();
        let zeroed = crate::redact::zero_all(&data, &secrets);
        let mut bytes = Vec::new();
        let out = hash_chunked(&data[..], &secrets, p, &Cancel::new(), true, &mut |h, c| {
            assert_eq!(*h, *blake3::hash(c).as_bytes());
            bytes.extend_from_slice(c);
        })
        .unwrap();
        assert_eq!(bytes, zeroed);
        assert_eq!(out.digest, *blake3::hash(&zeroed).as_bytes());
        assert_eq!(out.size, data.len() as u64);
        assert_eq!(out.found.len(), data.len().div_ceil(100 << 10));
        let lens: Vec<(usize, usize)> = reference(&zeroed, p);
        assert_eq!(out.chunks.len(), lens.len());
        // Each chunk's zeroed bytes read back from the file by range.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, &data).unwrap();
        let file = File::open(&path).unwrap();
        for ((offset, len), chunk) in lens.iter().zip(&out.chunks) {
            let got = read_zeroed_range(&file, *offset as u64, *len, &secrets).unwrap();
            assert_eq!(*blake3::hash(&got).as_bytes(), chunk.digest);
        }
    }

    #[test]
    fn lists_round_trip_and_refuse_malformed_text() {
        let chunks = vec![
            ChunkRef {
                digest: [7u8; 32],
                len: 65_536,
            },
            ChunkRef {
                digest: [9u8; 32],
                len: 1,
            },
        ];
        let text = encode_list(&chunks);
        assert_eq!(parse_list(text.as_bytes()), Some(chunks));
        for bad in ["", "zz", &"a".repeat(64), &format!("{}0", "a".repeat(64))] {
            assert_eq!(parse_list(bad.as_bytes()), None, "{bad:?}");
        }
    }

    #[test]
    fn a_chunked_row_names_its_chunks_as_blobs() {
        use crate::manifest::{self, FileFields, ManifestWriter};
        let chunks = [
            ChunkRef {
                digest: [5u8; 32],
                len: 1 << 20,
            },
            ChunkRef {
                digest: [3u8; 32],
                len: 100,
            },
        ];
        let list = encode_list(&chunks);
        let size = (1 << 20) + 100;
        fn file(chunks: Option<&str>) -> FileFields<'_> {
            FileFields {
                hash: &[9u8; 32],
                size: (1 << 20) + 100,
                mode: 0o644,
                mtime_ns: -5,
                chunks,
            }
        }
        let secret = SecretMatch {
            offset: 7,
            len: 4,
            secret: 0,
        };
        for spans in [vec![], vec![secret]] {
            let mut w = ManifestWriter::with_capacity(0);
            w.file_with_chunks("big", &file(Some(&list)), &spans);
            w.file("small", &[1u8; 32], 3, 0o600, 1);
            let data = w.finish();
            assert_eq!(
                manifest::digests(&data).unwrap(),
                vec![[1u8; 32], [3u8; 32], [5u8; 32]]
            );
            assert_eq!(manifest::spanned_files(&data).unwrap().len(), spans.len());
            let rows = manifest::decode(&data).unwrap();
            assert!(matches!(
                &rows[0],
                manifest::ManifestRow::File { hash, secrets, .. }
                    if *hash == [9u8; 32] && *secrets != spans.is_empty()
            ));
            let found = manifest::chunked_files(&data).unwrap();
            assert_eq!(found.len(), 1);
            assert_eq!((found[0].path.as_str(), found[0].size), ("big", size));
            assert_eq!(found[0].chunks, chunks);
            assert_eq!(manifest::totals(&data).unwrap(), (2, 2, size + 3));
        }
        // Lengths that do not add up to the size are refused.
        let mut w = ManifestWriter::with_capacity(0);
        w.file_with_chunks(
            "big",
            &FileFields {
                size: size + 1,
                ..file(Some(&list))
            },
            &[],
        );
        assert!(manifest::digests(&w.finish()).is_err());
        // Without a list: the whole-file blob, as before chunks.
        let mut w = ManifestWriter::with_capacity(0);
        w.file_with_chunks("big", &file(None), &[]);
        assert_eq!(manifest::digests(&w.finish()).unwrap(), vec![[9u8; 32]]);
    }

    #[test]
    fn params_refuse_what_the_crate_cannot_cut() {
        assert!(ChunkParams::new(1 << 20, 3000).is_err());
        assert!(ChunkParams::new(1 << 20, 512).is_err());
        assert!(ChunkParams::new(1000, 65_536).is_err());
        assert!(ChunkParams::new(1 << 20, 8 << 20).is_err());
        assert!(ChunkParams::default().applies((1 << 20) + 1));
        assert!(!ChunkParams::default().applies(1 << 20));
    }
}
