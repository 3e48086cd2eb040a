//! The check of a pack an untrusted writer uploads (the gateway's), in bounded
//! memory whatever the pack claims.
//!
//! A pack's trailer says how large each blob is once decoded, and a zstd frame
//! may decode to far more than it occupies: a few kilobytes of frames can claim
//! gigabytes of zeros. So the check never decodes a frame whole. Before any
//! frame is decoded, every entry's decoded size must be within
//! [`Limits::max_blob`] and their sum within [`Limits::max_total`]; then each
//! frame streams through one reused zstd context whose window is capped at
//! [`WINDOW_LOG_MAX`] (a frame asking for a larger window is refused), into a
//! fixed buffer that is hashed as it fills; decoding stops as soon as a frame
//! yields more bytes than its entry says. Memory per checking thread is the
//! window plus two small buffers; the pack itself is read by offset
//! ([`ReadAt`]), from a file or from memory.

use std::cell::RefCell;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use rayon::prelude::*;
use zstd::stream::raw::{DParameter, Decoder, InBuffer, Operation, OutBuffer};

use crate::pack::{
    footer_trailer_len, read_trailer, Entry, PackError, CODEC_RAW, CODEC_ZSTD, FOOTER_LEN,
    HEADER_LEN, KIND_FILE, MAGIC,
};

/// The largest zstd window a checked frame may use (8 MiB). The pack writer's
/// level-1 frames use at most 512 KiB.
pub const WINDOW_LOG_MAX: u32 = 23;
/// Stored bytes read per step.
const INPUT_CHUNK: usize = 64 << 10;
/// Decoded bytes hashed per step (zstd's own recommended output size).
const OUTPUT_CHUNK: usize = 128 << 10;

/// What a pack may claim before anything of it is decoded.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The largest decoded size of one blob.
    pub max_blob: u64,
    /// The largest decoded size of all the pack's blobs together.
    pub max_total: u64,
}

/// Bytes by offset: a pack in a file or in memory.
pub trait ReadAt: Sync {
    /// Fill `buf` from `offset` on; an error when the source ends first.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
}

impl ReadAt for &[u8] {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        match self.get(start..).and_then(|rest| rest.get(..buf.len())) {
            Some(bytes) => {
                buf.copy_from_slice(bytes);
                Ok(())
            }
            None => Err(io::ErrorKind::UnexpectedEof.into()),
        }
    }
}

impl ReadAt for File {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        FileExt::read_exact_at(self, buf, offset)
    }
}

fn io_error(error: io::Error) -> PackError {
    PackError::Pack(format!("the pack cannot be read: {error}"))
}

thread_local! {
    static DECODER: RefCell<Option<Decoder<'static>>> = const { RefCell::new(None) };
    static BUFFERS: RefCell<(Vec<u8>, Vec<u8>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// The entries of the pack of `len` bytes in `source`, read from its tail, and
/// checked against `limits` (see the module docs) and for their kind.
fn checked_entries(source: &dyn ReadAt, len: u64, limits: Limits) -> Result<Vec<Entry>, PackError> {
    if len < (HEADER_LEN + FOOTER_LEN) as u64 {
        return Err(PackError::Pack(
            "the pack is shorter than its header and footer".to_string(),
        ));
    }
    let mut footer = [0u8; FOOTER_LEN];
    source
        .read_exact_at(&mut footer, len - FOOTER_LEN as u64)
        .map_err(io_error)?;
    let need = (footer_trailer_len(&footer)? + FOOTER_LEN) as u64;
    if len < HEADER_LEN as u64 + need {
        return Err(PackError::Pack(
            "the pack is shorter than its trailer".to_string(),
        ));
    }
    let mut header = [0u8; 4];
    source.read_exact_at(&mut header, 0).map_err(io_error)?;
    if &header != MAGIC {
        return Err(PackError::Pack("the pack has no header".to_string()));
    }
    let mut tail = vec![0u8; need as usize];
    source
        .read_exact_at(&mut tail, len - need)
        .map_err(io_error)?;
    let entries = read_trailer(&tail, len)?;
    let mut total: u64 = 0;
    for e in &entries {
        if e.kind != KIND_FILE {
            return Err(PackError::Pack(format!(
                "the pack lists a blob of unknown kind {}",
                e.kind
            )));
        }
        if u64::from(e.raw_len) > limits.max_blob {
            return Err(PackError::Blob {
                digest: e.digest,
                reason: format!(
                    "it claims {} bytes, more than a packed blob may hold ({})",
                    e.raw_len, limits.max_blob
                ),
            });
        }
        total += u64::from(e.raw_len);
    }
    if total > limits.max_total {
        return Err(PackError::Pack(format!(
            "its blobs claim {total} bytes in all, more than a pack may hold ({})",
            limits.max_total
        )));
    }
    Ok(entries)
}

/// Check a whole pack before anything may name it: its header, trailer and
/// footer as [`read_trailer`] reads them, every entry a file blob within
/// `limits`, and every frame decoded (streaming, see the module docs) to
/// exactly its entry's size and BLAKE3. Frames are checked in parallel,
/// nothing decoded is kept. Returns the entries in pack order; a damaged
/// frame is [`PackError::Blob`] (the first one found).
pub fn verify_pack_at(
    source: &dyn ReadAt,
    len: u64,
    limits: Limits,
) -> Result<Vec<Entry>, PackError> {
    let entries = checked_entries(source, len, limits)?;
    entries
        .par_iter()
        .try_for_each(|e| verify_frame(source, e))?;
    Ok(entries)
}

/// [`verify_pack_at`] over a pack in memory.
pub fn verify_pack(pack: &[u8], limits: Limits) -> Result<Vec<Entry>, PackError> {
    verify_pack_at(&pack, pack.len() as u64, limits)
}

/// One frame (inside the pack: the trailer said so) decoded, counted and
/// hashed chunk by chunk, compared with its entry.
fn verify_frame(source: &dyn ReadAt, entry: &Entry) -> Result<(), PackError> {
    let fail = |reason: String| PackError::Blob {
        digest: entry.digest,
        reason,
    };
    let mut hasher = blake3::Hasher::new();
    let decoded = BUFFERS.with(|cell| {
        let (input, output) = &mut *cell.borrow_mut();
        input.resize(INPUT_CHUNK, 0);
        output.resize(OUTPUT_CHUNK, 0);
        match entry.codec {
            CODEC_RAW => hash_raw(source, entry, input, &mut hasher),
            CODEC_ZSTD => decode_zstd(source, entry, input, output, &mut hasher),
            other => Err(format!("unknown codec {other}")),
        }
    });
    let decoded = decoded.map_err(fail)?;
    if decoded != u64::from(entry.raw_len) {
        return Err(fail(format!(
            "it decodes to {decoded} bytes, not {}",
            entry.raw_len
        )));
    }
    if hasher.finalize().as_bytes() != &entry.digest {
        return Err(fail("the BLAKE3 of its bytes is not its key".to_string()));
    }
    Ok(())
}

fn hash_raw(
    source: &dyn ReadAt,
    entry: &Entry,
    input: &mut [u8],
    hasher: &mut blake3::Hasher,
) -> Result<u64, String> {
    let end = entry.offset + u64::from(entry.stored_len);
    let mut at = entry.offset;
    while at < end {
        let n = input.len().min((end - at) as usize);
        source
            .read_exact_at(&mut input[..n], at)
            .map_err(|e| format!("its frame cannot be read: {e}"))?;
        hasher.update(&input[..n]);
        at += n as u64;
    }
    Ok(u64::from(entry.stored_len))
}

/// The decoded size of a zstd frame (hashed into `hasher`), or why it does
/// not decode; stops at the first byte past the entry's size.
fn decode_zstd(
    source: &dyn ReadAt,
    entry: &Entry,
    input: &mut [u8],
    output: &mut [u8],
    hasher: &mut blake3::Hasher,
) -> Result<u64, String> {
    DECODER.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            let mut decoder = Decoder::new().map_err(|e| e.to_string())?;
            decoder
                .set_parameter(DParameter::WindowLogMax(WINDOW_LOG_MAX))
                .map_err(|e| e.to_string())?;
            *slot = Some(decoder);
        }
        let decoder = slot.as_mut().expect("just set");
        decoder.reinit().map_err(|e| e.to_string())?;
        let limit = u64::from(entry.raw_len);
        let end = entry.offset + u64::from(entry.stored_len);
        let (mut at, mut decoded, mut frame_done) = (entry.offset, 0u64, false);
        while at < end {
            let n = input.len().min((end - at) as usize);
            source
                .read_exact_at(&mut input[..n], at)
                .map_err(|e| format!("its frame cannot be read: {e}"))?;
            at += n as u64;
            let mut inbuf = InBuffer::around(&input[..n]);
            loop {
                let mut outbuf = OutBuffer::around(&mut output[..]);
                let hint = decoder
                    .run(&mut inbuf, &mut outbuf)
                    .map_err(|e| format!("its zstd frame does not decode: {e}"))?;
                let written = outbuf.pos();
                decoded += written as u64;
                if decoded > limit {
                    return Err(format!(
                        "it decodes to more than its {limit} bytes (stopped there)"
                    ));
                }
                hasher.update(&output[..written]);
                frame_done = hint == 0;
                // With the input used up, call again while output still comes.
                if inbuf.pos() == n && (written == 0 || frame_done) {
                    break;
                }
            }
        }
        if !frame_done {
            return Err("its zstd frame ends early (truncated)".to_string());
        }
        Ok(decoded)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pack::{PackBuilder, ENTRY_LEN};

    const ROOMY: Limits = Limits {
        max_blob: 1 << 30,
        max_total: 1 << 32,
    };

    fn blob(data: &[u8]) -> ([u8; 32], Vec<u8>) {
        (*blake3::hash(data).as_bytes(), data.to_vec())
    }

    fn pseudo_random(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    /// A pack of one zstd frame of `raw_len` zeros, made as a hostile writer
    /// would: level 19, the trailer's entry written by hand.
    fn bomb(raw_len: usize) -> (Vec<u8>, [u8; 32]) {
        let zeros = vec![0u8; raw_len];
        let digest = *blake3::hash(&zeros).as_bytes();
        let frame = zstd::bulk::compress(&zeros, 19).unwrap();
        let mut pack = MAGIC.to_vec();
        pack.extend_from_slice(&[1, 0, 0, 0]);
        pack.extend_from_slice(&frame);
        let mut trailer = digest.to_vec();
        trailer.extend_from_slice(&(frame.len() as u32).to_le_bytes());
        trailer.extend_from_slice(&(raw_len as u32).to_le_bytes());
        trailer.extend_from_slice(&[CODEC_ZSTD, KIND_FILE]);
        assert_eq!(trailer.len(), ENTRY_LEN);
        pack.extend_from_slice(&trailer);
        pack.extend_from_slice(&(ENTRY_LEN as u32).to_le_bytes());
        pack.extend_from_slice(&1u32.to_le_bytes());
        pack.extend_from_slice(&blake3::hash(&trailer).as_bytes()[..8]);
        pack.extend_from_slice(&[1, 0, 0, 0]);
        pack.extend_from_slice(MAGIC);
        (pack, digest)
    }

    #[test]
    fn checks_every_frame() {
        let mut builder = PackBuilder::new();
        let (d1, b1) = blob(&pseudo_random(300_000, 1));
        let (d2, b2) = blob(&b"hello hello hello hello hello hello hello".repeat(10_000));
        builder
            .add_many(&[(d1, b1.as_slice()), (d2, b2.as_slice())])
            .unwrap();
        let pack = builder.finish();
        assert_eq!(verify_pack(&pack, ROOMY).unwrap().len(), 2);
        // One flipped byte in a frame: the trailer still reads, the frame does not.
        let mut bad = pack.clone();
        bad[HEADER_LEN + 10] ^= 1;
        match verify_pack(&bad, ROOMY) {
            Err(PackError::Blob { digest, .. }) => assert_eq!(digest, d1),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            verify_pack(&pack[..pack.len() - 1], ROOMY),
            Err(PackError::Pack(_))
        ));
    }

    #[test]
    fn a_file_checks_as_its_bytes_do() {
        let mut builder = PackBuilder::new();
        let (d, b) = blob(&b"abc".repeat(50_000));
        builder.add_many(&[(d, b.as_slice())]).unwrap();
        let pack = builder.finish();
        let mut file = tempfile::tempfile().unwrap();
        io::Write::write_all(&mut file, &pack).unwrap();
        let entries = verify_pack_at(&file, pack.len() as u64, ROOMY).unwrap();
        assert_eq!(entries, verify_pack(&pack, ROOMY).unwrap());
    }

    #[test]
    fn limits_refuse_a_bomb_before_decoding_it() {
        let (pack, digest) = bomb(64 << 20);
        assert!(pack.len() < 8 << 10, "{}", pack.len());
        let small = Limits {
            max_blob: 16 << 20,
            max_total: 1 << 30,
        };
        match verify_pack(&pack, small) {
            Err(PackError::Blob { digest: d, reason }) => {
                assert_eq!(d, digest);
                assert!(
                    reason.contains("more than a packed blob may hold"),
                    "{reason}"
                );
            }
            other => panic!("{other:?}"),
        }
        let total = Limits {
            max_blob: 1 << 30,
            max_total: 32 << 20,
        };
        assert!(
            matches!(verify_pack(&pack, total), Err(PackError::Pack(r)) if r.contains("in all"))
        );
        // Within the limits it decodes (streaming) and checks.
        assert_eq!(verify_pack(&pack, ROOMY).unwrap()[0].digest, digest);
    }

    #[test]
    fn a_frame_asking_for_a_larger_window_is_refused() {
        let zeros = vec![0u8; 16 << 20];
        let mut compressor = zstd::bulk::Compressor::new(19).unwrap();
        compressor
            .set_parameter(zstd::zstd_safe::CParameter::WindowLog(27))
            .unwrap();
        let frame = compressor.compress(&zeros).unwrap();
        let (mut pack, _) = bomb(16 << 20);
        let old = pack.len() - HEADER_LEN - ENTRY_LEN - FOOTER_LEN;
        let tail = pack.split_off(HEADER_LEN + old);
        pack.truncate(HEADER_LEN);
        pack.extend_from_slice(&frame);
        pack.extend_from_slice(&tail);
        let entry_at = pack.len() - FOOTER_LEN - ENTRY_LEN;
        pack[entry_at + 32..entry_at + 36].copy_from_slice(&(frame.len() as u32).to_le_bytes());
        let trailer = pack[entry_at..entry_at + ENTRY_LEN].to_vec();
        let check_at = pack.len() - FOOTER_LEN + 8;
        pack[check_at..check_at + 8].copy_from_slice(&blake3::hash(&trailer).as_bytes()[..8]);
        match verify_pack(&pack, ROOMY) {
            Err(PackError::Blob { reason, .. }) => {
                assert!(reason.contains("does not decode"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_frame_decoding_past_its_entry_stops_there() {
        // The frame holds 4 MiB of zeros; the entry says 1 MiB.
        let (mut pack, _) = bomb(4 << 20);
        let entry_at = pack.len() - FOOTER_LEN - ENTRY_LEN;
        pack[entry_at + 36..entry_at + 40].copy_from_slice(&(1u32 << 20).to_le_bytes());
        let trailer = pack[entry_at..entry_at + ENTRY_LEN].to_vec();
        let check_at = pack.len() - FOOTER_LEN + 8;
        pack[check_at..check_at + 8].copy_from_slice(&blake3::hash(&trailer).as_bytes()[..8]);
        match verify_pack(&pack, ROOMY) {
            Err(PackError::Blob { reason, .. }) => {
                assert!(reason.contains("more than"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
    }
}
