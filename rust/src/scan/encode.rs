//! Encoding the scan's rows as the manifest: sized on every core, written
//! once into the caller's buffer, or only fingerprinted when the previous
//! manifest may be the same.

use rayon::prelude::*;

use crate::chunking::Chunking;
use crate::error::ScanError;
use crate::manifest::{Counter, ManifestWriter, Sink, SliceWriter};
use crate::walk::{Batch, Kind};

use super::order::{RowRef, Rows};

/// Where a scan writes its manifest: one buffer of exactly the length asked
/// for, allocated once when the length is known and written once.
pub trait ManifestBuffer {
    fn allocate(&mut self, len: usize) -> std::io::Result<&mut [u8]>;

    /// The manifest this scan is expected to equal (the parent checkpoint's),
    /// by its length and fingerprint: when the bytes the scan would write
    /// have both, nothing is allocated and [`ManifestBuffer::keep_previous`]
    /// is called instead. (The previous manifest itself is never needed.)
    fn previous(&self) -> Option<Previous> {
        None
    }

    /// The scan's manifest is byte for byte the one [`ManifestBuffer::previous`] names.
    fn keep_previous(&mut self) {}

    /// A buffer of `len` bytes about to be written whole at once (a directed
    /// scan's spliced manifest), its pages resident: by default a new one,
    /// faulted in by [`populate`]; a binding may hand out one it has kept.
    fn allocate_whole(&mut self, len: usize) -> std::io::Result<&mut [u8]> {
        let buffer = self.allocate(len)?;
        populate(buffer);
        Ok(buffer)
    }
}

/// Buffers from this size on are faulted in by [`populate`].
const POPULATE_FROM: usize = 16 << 20;

/// Fault in the pages of `buffer`, which is about to be written whole at
/// once (a directed scan's spliced manifest), on two threads: written as it
/// is, a million-entry manifest (~180 MB) takes ~46,000 page faults, at a
/// million files the largest cost of a capture after one edit. Best effort:
/// a kernel without `MADV_POPULATE_WRITE` faults them in as they are written.
/// (Not for a buffer filled while the scan frees what it encodes from: its
/// pages would all be resident at once.)
pub fn populate(buffer: &mut [u8]) {
    if buffer.len() < POPULATE_FROM {
        return;
    }
    let page = 4096;
    let at = buffer.as_mut_ptr() as usize;
    let start = at.next_multiple_of(page);
    let end = (at + buffer.len()) / page * page;
    let middle = (start + (end - start) / 2) / page * page;
    let advise = |from: usize, to: usize| {
        // SAFETY: the range lies inside `buffer`, borrowed mutably here;
        // populating writes none of its bytes.
        unsafe {
            libc::madvise(
                from as *mut libc::c_void,
                to - from,
                libc::MADV_POPULATE_WRITE,
            );
        }
    };
    std::thread::scope(|s| {
        s.spawn(|| advise(start, middle));
        advise(middle, end);
    });
}

/// A manifest named by its length in bytes and its fingerprint: the BLAKE3
/// hash of its bytes (what `checkpointd.manifest.Manifest.fingerprint` is).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Previous {
    pub len: usize,
    pub fingerprint: [u8; 32],
}

/// Rows per encoded piece while a manifest is only hashed: the pieces in
/// flight (two windows of a few per thread) stay a few MB at any size.
const HASHED_PIECE_ROWS: usize = 4096;

/// Hashes encoded pieces in order, a comma between non-empty ones (the
/// manifest's layout, as [`scan_into`](super::scan_into) writes it).
struct PieceHasher {
    hasher: blake3::Hasher,
    first: bool,
}

impl PieceHasher {
    fn add(&mut self, pieces: &[Vec<u8>]) {
        for piece in pieces.iter().filter(|p| !p.is_empty()) {
            if !std::mem::take(&mut self.first) {
                self.hasher.update(b",");
            }
            self.hasher.update(piece);
        }
    }
}

/// The fingerprint of the manifest of `order`'s rows, never holding more than
/// two windows of small pieces: each window is encoded on every core while
/// the one before it is hashed.
fn fingerprint_rows(
    pool: &rayon::ThreadPool,
    batches: &[Batch],
    order: &[RowRef],
    chunking: Option<&Chunking>,
) -> [u8; 32] {
    let pieces: Vec<&[RowRef]> = order.chunks(HASHED_PIECE_ROWS).collect();
    let window = (pool.current_num_threads() * 2).max(2);
    // Two windows of buffers, reused: each grows to a piece's size once.
    let encode = |group: &[&[RowRef]], buffers: &mut Vec<Vec<u8>>| {
        buffers.resize_with(group.len(), Vec::new);
        group
            .par_iter()
            .zip(buffers.par_iter_mut())
            .for_each(|(rows, buffer)| {
                buffer.clear();
                let (_, written) = encode_rows(batches, rows, std::mem::take(buffer), chunking);
                *buffer = written;
            });
    };
    let mut hashing = PieceHasher {
        hasher: blake3::Hasher::new(),
        first: true,
    };
    hashing.hasher.update(b"[");
    pool.install(|| {
        let (mut encoded, mut next) = (Vec::new(), Vec::new());
        for group in pieces.chunks(window) {
            rayon::join(|| hashing.add(&encoded), || encode(group, &mut next));
            std::mem::swap(&mut encoded, &mut next);
        }
        hashing.add(&encoded);
    });
    hashing.hasher.update(b"]");
    *hashing.hasher.finalize().as_bytes()
}

impl ManifestBuffer for Vec<u8> {
    fn allocate(&mut self, len: usize) -> std::io::Result<&mut [u8]> {
        self.clear();
        self.resize(len, 0);
        Ok(self.as_mut_slice())
    }
}

/// Encode the rows into `manifest`: sized on every core, in chunks, then
/// written once into the buffer it hands out (the binding's is the buffer of
/// a Python bytes object), so the manifest is never copied or joined; or,
/// when every byte would be its previous manifest's, nothing is allocated and
/// the previous one is kept. Returns the totals, whether the previous one
/// was kept, and the manifest's digest (`previous_digest`, when the caller
/// already has the previous manifest's, is not computed again).
pub(super) fn encode_manifest(
    pool: &rayon::ThreadPool,
    rows: &Rows,
    manifest: &mut dyn ManifestBuffer,
    previous_digest: Option<[u8; 32]>,
    chunking: Option<&Chunking>,
) -> Result<(Encoded, bool, [u8; 32]), ScanError> {
    let digest_of = |bytes: &[u8]| {
        pool.install(|| {
            *blake3::Hasher::new()
                .update_rayon(bytes)
                .finalize()
                .as_bytes()
        })
    };
    // Encode on every core, in chunks of rows: sized first, then written
    // once into the buffer `manifest` hands out (the binding's is the buffer
    // of a Python bytes object), so the manifest is never copied or joined.
    let chunk_rows = (rows.order.len() / (pool.current_num_threads() * 4)).max(8192);
    let sized: Vec<(Encoded, Counter)> = pool.install(|| {
        rows.order
            .par_chunks(chunk_rows)
            .map(|chunk| encode_rows(&rows.batches, chunk, Counter::default(), chunking))
            .collect()
    });
    let total = sized
        .iter()
        .fold(Encoded::default(), |sum, (part, _)| Encoded {
            rows: sum.rows + part.rows,
            files_with_secrets: sum.files_with_secrets + part.files_with_secrets,
            file_count: sum.file_count + part.file_count,
            file_bytes: sum.file_bytes + part.file_bytes,
        });
    let lengths: Vec<usize> = sized.iter().map(|(_, counted)| counted.0).collect();
    let commas = lengths.iter().filter(|&&n| n > 0).count().saturating_sub(1);
    let manifest_len = 2 + lengths.iter().sum::<usize>() + commas;
    // A scan that changed nothing writes the parent's manifest again: its
    // length and fingerprint say so (the manifest is hashed piece by piece as
    // it is encoded), and it is not allocated a second time (~180 MB at a
    // million entries), nor is the parent's needed in memory to compare with.
    let same = manifest.previous().is_some_and(|previous| {
        previous.len == manifest_len
            && fingerprint_rows(pool, &rows.batches, &rows.order, chunking) == previous.fingerprint
    });
    if same {
        let digest = previous_digest.unwrap_or_else(|| {
            manifest
                .previous()
                .expect("compared with the previous manifest")
                .fingerprint
        });
        manifest.keep_previous();
        return Ok((total, true, digest));
    }
    let buffer = manifest
        .allocate(manifest_len)
        .map_err(|e| ScanError::io("<manifest>", "allocate", e))?;
    let pieces = manifest_pieces(&mut buffer[..manifest_len], &lengths);
    pool.install(|| {
        rows.order
            .par_chunks(chunk_rows)
            .zip(pieces.into_par_iter())
            .for_each(|(chunk, piece)| {
                let length = piece.len();
                let (_, written) = encode_rows(
                    &rows.batches,
                    chunk,
                    SliceWriter { buf: piece, at: 0 },
                    chunking,
                );
                assert_eq!(written.at, length, "a chunk is written as it was sized");
            })
    });
    Ok((total, false, digest_of(buffer)))
}

/// The manifest's brackets and commas written into `buffer`, and the pieces
/// between them of `lengths` bytes each, for the rows to be written into.
fn manifest_pieces<'b>(buffer: &'b mut [u8], lengths: &[usize]) -> Vec<&'b mut [u8]> {
    let manifest_len = buffer.len();
    buffer[0] = b'[';
    buffer[manifest_len - 1] = b']';
    let mut rest = &mut buffer[1..manifest_len - 1];
    let mut pieces: Vec<&mut [u8]> = Vec::with_capacity(lengths.len());
    let mut first = true;
    for &length in lengths {
        if length > 0 && !std::mem::take(&mut first) {
            let (comma, after) = std::mem::take(&mut rest).split_at_mut(1);
            comma[0] = b',';
            rest = after;
        }
        let (piece, after) = std::mem::take(&mut rest).split_at_mut(length);
        pieces.push(piece);
        rest = after;
    }
    pieces
}

/// What a run of manifest rows counts.
#[derive(Default)]
pub(super) struct Encoded {
    pub(super) rows: u64,
    pub(super) files_with_secrets: u64,
    pub(super) file_count: u64,
    pub(super) file_bytes: u64,
}

/// Encode the rows `order` (a run of the sorted rows, without brackets) into `sink`.
fn encode_rows<S: Sink>(
    batches: &[Batch],
    order: &[RowRef],
    sink: S,
    chunking: Option<&Chunking>,
) -> (Encoded, S) {
    let mut writer = ManifestWriter::rows_into(sink);
    let mut out = Encoded::default();
    for r in order {
        let batch = &batches[r.batch as usize];
        let entry = &batch.entries[r.entry as usize];
        let path = (batch.dir.as_str(), batch.name(entry));
        if let Kind::File(slot) = &entry.kind {
            if !slot.vanished {
                out.files_with_secrets += u64::from(!slot.secrets.is_empty());
                out.file_count += 1;
                out.file_bytes += slot.stat.size;
            }
        }
        write_entry(&mut writer, path, &entry.kind, chunking);
    }
    out.rows = writer.rows() as u64;
    (out, writer.into_sink())
}

/// Write the row of one kept entry at `path` (none for a file that vanished).
pub(crate) fn write_entry<S: Sink>(
    writer: &mut ManifestWriter<S>,
    path: impl crate::manifest::JsonPath,
    kind: &Kind,
    chunking: Option<&Chunking>,
) {
    match kind {
        Kind::File(slot) if slot.vanished => {}
        Kind::File(slot) => {
            let hash = slot.hash.expect("every kept file was hashed or reused");
            let list = chunking.and_then(|c| c.list(&hash, slot.stat.size));
            let fields = crate::manifest::FileFields {
                hash: &hash,
                size: slot.stat.size,
                mode: slot.stat.mode & 0o777,
                mtime_ns: slot.stat.mtime_ns,
                chunks: list.as_deref(),
            };
            writer.file_with_chunks(path, &fields, &slot.secrets);
        }
        Kind::Dir { mode, .. } => writer.dir(path, *mode),
        Kind::Symlink(target) => writer.symlink(path, target),
    }
}
