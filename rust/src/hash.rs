//! BLAKE3 of a file's bytes after secret zeroing, in fixed memory.
//!
//! Small files (the common case) are read whole into a per-thread scratch
//! buffer: one `read` plus the one that sees EOF. Larger ones stream in
//! [`STREAM_CHUNK`] pieces through [`ZeroingStream`]; each piece is hashed with
//! BLAKE3's multi-threaded `update_rayon` when `parallel` is set, so one huge
//! file still uses every core of the scan's pool. We never mmap: a file
//! truncated by the sandbox while mapped would kill the daemon with SIGBUS.

use std::fs::File;
use std::io::{self, Read};

use crate::cancel::Cancel;
use crate::redact::{SecretMatch, SecretSet, ZeroingStream};

/// Files up to this size are read whole into the scratch buffer.
pub const WHOLE_READ_LIMIT: usize = 1 << 20;
/// Piece size for streaming larger files: big enough for `update_rayon` to
/// split across threads (it pays off above ~128 KiB), small enough for fixed memory.
pub const STREAM_CHUNK: usize = 1 << 20;

/// A hash table's hash of a BLAKE3 digest: its first 8 bytes. Digests are
/// already uniform (making many share a prefix is a 2^64 search each), so
/// SipHash's pass over all 32 bytes buys nothing; a capture and a restore of
/// 100,000 files look digests up several times each. For digest keys only
/// (`[u8; 32]` or a 32-byte slice): [`DigestMap`], [`DigestSet`].
#[derive(Debug, Default, Clone, Copy)]
pub struct DigestHasher(u64);

impl std::hash::Hasher for DigestHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut prefix = [0u8; 8];
        let n = bytes.len().min(8);
        prefix[..n].copy_from_slice(&bytes[..n]);
        self.0 ^= u64::from_ne_bytes(prefix);
    }

    /// The length a slice hashes first: the same for every digest.
    fn write_usize(&mut self, _: usize) {}

    fn finish(&self) -> u64 {
        self.0
    }
}

pub type DigestBuild = std::hash::BuildHasherDefault<DigestHasher>;
pub type DigestMap<V> = std::collections::HashMap<[u8; 32], V, DigestBuild>;
pub type DigestSet = std::collections::HashSet<[u8; 32], DigestBuild>;

#[derive(Debug)]
pub enum HashError {
    Io(io::Error),
    Cancelled,
}

impl From<io::Error> for HashError {
    fn from(e: io::Error) -> Self {
        HashError::Io(e)
    }
}

/// Hash result: the digest and the number of bytes read.
pub type Digest = ([u8; 32], u64);

/// Hash everything `reader` yields from its current position.
///
/// `expected_size` (from an fstat just before) lets a small file be read with
/// one `read` instead of two: once that many bytes arrived we stop without
/// waiting for the EOF read. A file that grew meanwhile is the caller's to
/// catch (the scan compares fstat before and after).
pub fn hash_reader<R: Read>(
    reader: R,
    expected_size: Option<u64>,
    secrets: &SecretSet,
    cancel: &Cancel,
    parallel: bool,
    scratch: &mut Vec<u8>,
) -> Result<Digest, HashError> {
    let mut found = Vec::new();
    let options = HashOptions {
        secrets,
        cancel,
        parallel,
    };
    hash_reader_recording(reader, expected_size, options, scratch, &mut found)
}

/// How [`hash_reader_recording`] hashes: the secrets zeroed in the bytes,
/// the cancel flag checked between reads, and whether bytes past the
/// whole-read limit are hashed on every core.
#[derive(Clone, Copy)]
pub struct HashOptions<'a> {
    pub secrets: &'a SecretSet,
    pub cancel: &'a Cancel,
    pub parallel: bool,
}

/// [`hash_reader`], also appending where each secret was zeroed to `found`
/// (sorted by offset), for the manifest's secret spans.
pub fn hash_reader_recording<R: Read>(
    mut reader: R,
    expected_size: Option<u64>,
    options: HashOptions<'_>,
    scratch: &mut Vec<u8>,
    found: &mut Vec<SecretMatch>,
) -> Result<Digest, HashError> {
    let HashOptions {
        secrets,
        cancel,
        parallel,
    } = options;
    // Whole-read fast path: fill the scratch buffer up to the limit.
    if scratch.len() < WHOLE_READ_LIMIT {
        scratch.resize(WHOLE_READ_LIMIT, 0);
    }
    let mut filled = 0;
    let mut eof = false;
    while filled < WHOLE_READ_LIMIT {
        match reader.read(&mut scratch[filled..WHOLE_READ_LIMIT]) {
            Ok(0) => {
                eof = true;
                break;
            }
            Ok(n) => {
                filled += n;
                if expected_size == Some(filled as u64) && filled < WHOLE_READ_LIMIT {
                    eof = true;
                    break;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    if cancel.is_cancelled() {
        return Err(HashError::Cancelled);
    }
    if eof {
        let data = &mut scratch[..filled];
        if !secrets.is_empty() {
            let first = found.len();
            secrets.zero_in_place_recording(data, 0, found);
            found[first..].sort_unstable();
        }
        return Ok((*blake3::hash(data).as_bytes(), filled as u64));
    }
    // Larger than the limit: stream the bytes already read, then the rest.
    let head = io::Cursor::new(&scratch[..filled]);
    let mut stream = ZeroingStream::new(head.chain(reader), secrets.clone(), STREAM_CHUNK);
    let mut hasher = blake3::Hasher::new();
    while let Some(chunk) = stream.next_chunk()? {
        if cancel.is_cancelled() {
            return Err(HashError::Cancelled);
        }
        if parallel {
            hasher.update_rayon(chunk);
        } else {
            hasher.update(chunk);
        }
    }
    found.extend(stream.matches());
    Ok((*hasher.finalize().as_bytes(), stream.bytes_read))
}

/// Hash an open file from its current position (see [`hash_reader`]).
pub fn hash_file(
    file: &File,
    expected_size: Option<u64>,
    secrets: &SecretSet,
    cancel: &Cancel,
    parallel: bool,
    scratch: &mut Vec<u8>,
) -> Result<Digest, HashError> {
    hash_reader(file, expected_size, secrets, cancel, parallel, scratch)
}

/// A file's bytes from offset 0, as `read` would give them, except that a
/// hole (`lseek` SEEK_DATA / SEEK_HOLE) is given as zeros without a system
/// call: a sparse file's holes are never read. Reads with `pread`, so the
/// file's offset is not its position. `size` (from an `fstat` before) is
/// where a trailing hole ends; a file whose extents the filesystem does not
/// report is read whole. What changed meanwhile is the caller's to catch
/// (the scan compares `fstat`s before and after, and the bytes counted).
pub struct HoleSkipping<'f> {
    file: &'f File,
    size: u64,
    at: u64,
    /// The data extent `at` lies in ends here (exclusive); none known: 0.
    data_end: u64,
    /// The hole `at` lies in ends here (exclusive); none known: 0.
    hole_end: u64,
    /// The filesystem does not report holes: plain reads.
    plain: bool,
}

impl<'f> HoleSkipping<'f> {
    pub fn new(file: &'f File, size: u64) -> HoleSkipping<'f> {
        HoleSkipping::starting_at(file, size, 0)
    }

    /// A reader of `file` (`size` bytes) from offset `start`.
    pub fn starting_at(file: &'f File, size: u64, start: u64) -> HoleSkipping<'f> {
        HoleSkipping {
            file,
            size,
            at: start,
            data_end: 0,
            hole_end: 0,
            plain: false,
        }
    }

    /// Learn the extent `self.at` lies in.
    fn locate(&mut self) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let fd = self.file.as_raw_fd();
        match crate::fs::seek_extent(fd, self.at, false) {
            // Past the last data: a hole to the end of the file.
            Ok(None) => self.hole_end = self.size.max(self.at),
            Ok(Some(data)) if data > self.at => self.hole_end = data,
            Ok(Some(_)) => {
                self.data_end = match crate::fs::seek_extent(fd, self.at, true)? {
                    Some(hole) if hole > self.at => hole,
                    _ => u64::MAX,
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => self.plain = true,
            Err(e) => return Err(e),
        }
        Ok(())
    }
}

impl Read for HoleSkipping<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        use std::os::unix::fs::FileExt;
        if buf.is_empty() {
            return Ok(0);
        }
        if !self.plain && self.at >= self.data_end && self.at >= self.hole_end {
            self.locate()?;
        }
        if !self.plain && self.at < self.hole_end {
            let n = buf.len().min((self.hole_end - self.at) as usize);
            buf[..n].fill(0);
            self.at += n as u64;
            return Ok(n);
        }
        let want = if self.plain {
            buf.len()
        } else {
            // (Past the end, no extent is ahead: nothing is read.)
            buf.len()
                .min(self.data_end.saturating_sub(self.at).min(usize::MAX as u64) as usize)
        };
        let n = self.file.read_at(&mut buf[..want], self.at)?;
        if n == 0 {
            // The extent ended sooner than it said: the file shrank.
            self.data_end = self.at;
            self.plain = self.plain || self.at >= self.size;
        }
        self.at += n as u64;
        Ok(n)
    }
}

/// What a scan reads a file's bytes through: a file of at least
/// [`WHOLE_READ_LIMIT`] bytes through [`HoleSkipping`] from offset 0 (a
/// sparse file's holes are not read), a smaller one plainly from the file's
/// offset (its two `lseek`s would cost more than any hole saves).
pub enum FileBytes<'f> {
    Plain(&'f File),
    Sparse(HoleSkipping<'f>),
}

impl<'f> FileBytes<'f> {
    /// `file`, of `size` bytes by an `fstat` before.
    pub fn of(file: &'f File, size: u64) -> FileBytes<'f> {
        if size >= WHOLE_READ_LIMIT as u64 {
            FileBytes::Sparse(HoleSkipping::new(file, size))
        } else {
            FileBytes::Plain(file)
        }
    }
}

impl Read for FileBytes<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            FileBytes::Plain(file) => file.read(buf),
            FileBytes::Sparse(holes) => holes.read(buf),
        }
    }
}

/// Whether the open file `fd` holds exactly `size` bytes whose BLAKE3 is
/// `hash`, read through the fd from offset 0 with `pread` (its position is
/// left alone): what a restore checks of a file it wrote before it vouches
/// for it. With `bytes` (the blob itself, already verified against `hash`)
/// the file is compared with them instead of hashed. Bytes past `size` are
/// not read: the caller's `fstat`, taken before, said how long the file was
/// (a file extended since has a newer ctime than that stat).
pub fn file_holds(
    fd: std::os::fd::RawFd,
    size: u64,
    hash: &[u8; 32],
    bytes: Option<&[u8]>,
) -> io::Result<bool> {
    if bytes.is_some_and(|b| b.len() as u64 != size) {
        return Ok(false);
    }
    // Borrowed, not owned: the caller keeps the fd.
    // SAFETY: `fd` is open for the call; ManuallyDrop never closes it.
    let file =
        std::mem::ManuallyDrop::new(unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) });
    if bytes.is_none() && size >= SPLIT_READ_MIN {
        return Ok(hash_in_halves(&file, size)?.is_some_and(|digest| digest == *hash));
    }
    let mut hasher = blake3::Hasher::new();
    let mut same = true;
    let read_all = read_range(&file, size, (0, size), |read, at| match bytes {
        Some(expected) => {
            same = expected[at as usize..at as usize + read.len()] == *read;
            same
        }
        None if read.len() >= 1 << 17 => {
            hasher.update_rayon(read);
            true
        }
        None => {
            hasher.update(read);
            true
        }
    })?;
    Ok(read_all && same && (bytes.is_some() || hasher.finalize().as_bytes() == hash))
}

/// Files at least this long are read back by two threads, each hashing its
/// own half of BLAKE3's tree (`blake3::hazmat`): the kernel's copies and the
/// hashing then both use two cores, not one for the copies.
const SPLIT_READ_MIN: u64 = 64 << 20;

/// The BLAKE3 of the first `size` bytes of `file` (holes, and any bytes
/// past its end, read as zeros; None when a read comes up short), its two
/// top subtrees read and hashed on two threads. `size` is more than one
/// BLAKE3 chunk.
pub fn hash_in_halves(file: &File, size: u64) -> io::Result<Option<[u8; 32]>> {
    use blake3::hazmat::{left_subtree_len, merge_subtrees_root, HasherExt, Mode};
    let middle = left_subtree_len(size);
    let subtree = |start: u64, end: u64| -> io::Result<Option<[u8; 32]>> {
        let mut hasher = blake3::Hasher::new();
        hasher.set_input_offset(start);
        Ok(hash_range(file, size, (start, end), &mut hasher)?.then(|| hasher.finalize_non_root()))
    };
    let (left, right) = std::thread::scope(|scope| {
        let right = scope.spawn(|| subtree(middle, size));
        let left = subtree(0, middle);
        let right = right
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("a hashing thread panicked")));
        (left, right)
    });
    Ok(match (left?, right?) {
        (Some(l), Some(r)) => Some(*merge_subtrees_root(&l, &r, Mode::Hash).as_bytes()),
        _ => None,
    })
}

/// Feed bytes `start..end` of `file` (`size` bytes) to `hasher`; false when
/// the file ends sooner.
fn hash_range(
    file: &File,
    size: u64,
    range: (u64, u64),
    hasher: &mut blake3::Hasher,
) -> io::Result<bool> {
    read_range(file, size, range, |read, _at| {
        hasher.update(read);
        true
    })
}

/// Read bytes `start..end` of `file` (`size` bytes; holes read as zeros)
/// in pieces of up to [`STREAM_CHUNK`], each given to `each` with its offset
/// until it says stop. False when the file ends sooner or `each` stopped.
fn read_range(
    file: &File,
    size: u64,
    (start, end): (u64, u64),
    mut each: impl FnMut(&[u8], u64) -> bool,
) -> io::Result<bool> {
    let mut buffer = vec![0u8; STREAM_CHUNK.min((end - start) as usize).max(1)];
    let mut reader = HoleSkipping::starting_at(file, size, start);
    let mut at = start;
    while at < end {
        let want = buffer.len().min((end - at) as usize);
        let n = match reader.read(&mut buffer[..want]) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if n == 0 || !each(&buffer[..n], at) {
            return Ok(false);
        }
        at += n as u64;
    }
    Ok(true)
}

/// Lowercase hex of a digest.
pub fn to_hex(digest: &[u8; 32]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(64);
    for b in digest {
        out.push(HEX[(b >> 4) as usize] as char);
        out.push(HEX[(b & 15) as usize] as char);
    }
    out
}

/// Parse 64 lowercase or uppercase hex digits.
pub fn from_hex(text: &str) -> Option<[u8; 32]> {
    let bytes = text.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    // One table lookup per digit, one check per digest (a manifest parses
    // one digest per file row).
    let mut out = [0u8; 32];
    let mut bad = 0u8;
    for (i, pair) in bytes.chunks_exact(2).enumerate() {
        let (high, low) = (HEX_VALUE[pair[0] as usize], HEX_VALUE[pair[1] as usize]);
        bad |= high | low;
        out[i] = (high << 4) | (low & 0x0f);
    }
    (bad & 0xf0 == 0).then_some(out)
}

/// The value of each hex digit, upper or lower case; 0xff for anything else.
const HEX_VALUE: [u8; 256] = {
    let mut table = [0xffu8; 256];
    let mut c = 0;
    while c < 10 {
        table[b'0' as usize + c] = c as u8;
        c += 1;
    }
    let mut c = 0;
    while c < 6 {
        table[b'a' as usize + c] = 10 + c as u8;
        table[b'A' as usize + c] = 10 + c as u8;
        c += 1;
    }
    table
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streaming_equals_one_shot() {
        let data: Vec<u8> = (0..(3 * WHOLE_READ_LIMIT + 12_345))
            .map(|i| (i * 7 % 253) as u8)
            .collect();
        let mut scratch = Vec::new();
        let cancel = Cancel::new();
        for parallel in [false, true] {
            let (digest, size) = hash_reader(
                &data[..],
                None,
                &SecretSet::empty(),
                &cancel,
                parallel,
                &mut scratch,
            )
            .unwrap();
            assert_eq!(size, data.len() as u64);
            assert_eq!(digest, *blake3::hash(&data).as_bytes());
        }
        let secrets = SecretSet::new(&[[3u8, 10, 17, 24]]).unwrap();
        let (digest, _) =
            hash_reader(&data[..], None, &secrets, &cancel, true, &mut scratch).unwrap();
        let zeroed = crate::redact::zero_all(&data, &secrets);
        assert_ne!(zeroed, data);
        assert_eq!(digest, *blake3::hash(&zeroed).as_bytes());
    }

    #[test]
    fn expected_size_stops_early_but_never_truncates() {
        let data = b"0123456789";
        let cancel = Cancel::new();
        let mut scratch = Vec::new();
        let want = *blake3::hash(data).as_bytes();
        for expected in [None, Some(10), Some(4), Some(99)] {
            let got = hash_reader(
                &data[..],
                expected,
                &SecretSet::empty(),
                &cancel,
                false,
                &mut scratch,
            );
            assert_eq!(got.unwrap(), (want, 10), "expected {expected:?}");
        }
    }

    #[test]
    fn file_holds_compares_or_hashes_exactly_size_bytes() {
        use std::os::fd::AsRawFd;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..(STREAM_CHUNK + 77)).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let file = File::open(&path).unwrap();
        let fd = file.as_raw_fd();
        let want = *blake3::hash(&data).as_bytes();
        let size = data.len() as u64;
        assert!(file_holds(fd, size, &want, None).unwrap());
        assert!(file_holds(fd, size, &want, Some(&data)).unwrap());
        let other = *blake3::hash(b"other").as_bytes();
        assert!(!file_holds(fd, size, &other, None).unwrap());
        let mut changed = data.clone();
        changed[STREAM_CHUNK + 3] ^= 1;
        assert!(!file_holds(fd, size, &want, Some(&changed)).unwrap());
        // Longer than the file: it does not hold those bytes.
        assert!(!file_holds(fd, size + 1, &want, None).unwrap());
    }

    /// A sparse file reads as its bytes through `HoleSkipping`, in any
    /// piece sizes, and its holes are never read (only its data extents).
    #[test]
    fn hole_skipping_reads_a_sparse_file_as_its_bytes() {
        use std::os::unix::fs::FileExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sparse");
        let file = File::create_new(&path).unwrap();
        let size = 8 * STREAM_CHUNK as u64 + 123;
        file.write_all_at(b"head", 0).unwrap();
        file.write_all_at(&[9u8; 5000], 3 * STREAM_CHUNK as u64 + 11)
            .unwrap();
        file.write_all_at(b"tail", size - 4).unwrap();
        let want = std::fs::read(&path).unwrap();
        assert_eq!(want.len() as u64, size);
        for piece in [1usize, 4096, 77_777, STREAM_CHUNK] {
            let mut reader = HoleSkipping::new(&file, size);
            let mut got = Vec::new();
            let mut buf = vec![0u8; piece];
            loop {
                let n = reader.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            assert!(got == want, "piece {piece}");
        }
        let hash = *blake3::hash(&want).as_bytes();
        assert!(file_holds(std::os::fd::AsRawFd::as_raw_fd(&file), size, &hash, None).unwrap());
        // A trailing hole (the file ends in zeros) reads to the end.
        file.set_len(size + 3 * STREAM_CHUNK as u64).unwrap();
        let mut all = Vec::new();
        HoleSkipping::new(&file, size + 3 * STREAM_CHUNK as u64)
            .read_to_end(&mut all)
            .unwrap();
        assert_eq!(all.len() as u64, size + 3 * STREAM_CHUNK as u64);
        assert!(all[size as usize..].iter().all(|&b| b == 0));
    }

    #[test]
    fn hex_roundtrip() {
        let d = *blake3::hash(b"x").as_bytes();
        assert_eq!(from_hex(&to_hex(&d)), Some(d));
        assert_eq!(from_hex("zz"), None);
        assert_eq!(from_hex(&to_hex(&d).to_uppercase()), Some(d));
        // Every byte value in every position of a digit pair: a digit or not.
        let valid = |c: u8| c.is_ascii_hexdigit();
        let base = to_hex(&d).into_bytes();
        for at in [0, 1, 62, 63] {
            for c in 0..=255u8 {
                let mut text = base.clone();
                text[at] = c;
                let Ok(text) = String::from_utf8(text) else {
                    continue;
                };
                let parsed = from_hex(&text);
                assert_eq!(parsed.is_some(), valid(c), "byte {c:#x} at {at}");
                if let Some(parsed) = parsed {
                    let digit = (c as char).to_digit(16).unwrap() as u8;
                    let byte = parsed[at / 2];
                    let got = if at % 2 == 0 { byte >> 4 } else { byte & 0x0f };
                    assert_eq!(got, digit, "byte {c:#x} at {at}");
                }
            }
        }
        assert_eq!(from_hex(&to_hex(&d)[..63]), None);
        assert_eq!(from_hex(&format!("{}0", to_hex(&d))), None);
    }

    #[test]
    fn hashing_in_halves_is_blake3_of_the_whole() {
        use std::io::{Seek, SeekFrom, Write};
        for size in [
            1025u64,
            2048,
            3 * 1024 + 5,
            64 * 1024,
            (1 << 20) + 7,
            5 << 20,
        ] {
            let mut file = tempfile::tempfile().unwrap();
            let data: Vec<u8> = (0..size).map(|i| (i * 7 + i / 1000) as u8).collect();
            file.write_all(&data).unwrap();
            let digest = hash_in_halves(&file, size).unwrap();
            assert_eq!(digest, Some(*blake3::hash(&data).as_bytes()), "{size}");
            // Past its end a file reads as a hole: never the bytes' hash.
            let longer = hash_in_halves(&file, size + 1).unwrap();
            assert_ne!(longer, Some(*blake3::hash(&data).as_bytes()));
        }
        // Holes read as zeros.
        let mut sparse = tempfile::tempfile().unwrap();
        sparse.seek(SeekFrom::Start(3 << 20)).unwrap();
        sparse.write_all(b"after a hole").unwrap();
        let mut whole = vec![0u8; 3 << 20];
        whole.extend_from_slice(b"after a hole");
        let size = whole.len() as u64;
        assert_eq!(
            hash_in_halves(&sparse, size).unwrap(),
            Some(*blake3::hash(&whole).as_bytes())
        );
    }
}
