//! Secret zeroing: every occurrence of every secret, overlapping ones too,
//! replaced by as many zero bytes, in fixed memory while streaming.
//!
//! Matches are always found on the ORIGINAL bytes (zeroing one match never
//! hides or creates another), exactly like zeroing a whole buffer at once.
//! While streaming, the last `max_len - 1` bytes of each window are held back
//! (as original bytes) because a match starting there may end in the next read.
//!
//! Each match can also be reported as a [`SecretMatch`] (offset, length, index
//! of the secret in the caller's list — never the bytes), so a restore given the
//! secrets can write them back where they were. Writing every match's secret at
//! its offset rebuilds the original bytes, overlapping matches included, as each
//! is a copy of the original bytes there.

use std::io::{self, Read};

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};

/// Secrets shorter than this are refused: they would zero too much by accident.
pub const MIN_SECRET_LEN: usize = 4;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShortSecretError {
    pub index: usize,
    pub len: usize,
}

impl std::fmt::Display for ShortSecretError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "secret #{} is {} bytes; secrets must be at least {} bytes",
            self.index, self.len, MIN_SECRET_LEN
        )
    }
}

/// Where one secret was zeroed: `len` bytes at `offset` of the file held the
/// secret at index `secret` of the caller's list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct SecretMatch {
    pub offset: u64,
    pub len: u32,
    pub secret: u32,
}

/// A compiled secret set. Empty sets change nothing.
#[derive(Debug, Clone)]
pub struct SecretSet {
    matcher: Option<AhoCorasick>,
    max_len: usize,
    /// Some secret holds a `/`: only a whole path can show it.
    slash: bool,
}

/// What stands for a secret in a path shown to anyone (always three
/// characters, whatever the secret's length).
pub const MASK: &[u8] = b"***";

impl SecretSet {
    pub fn empty() -> SecretSet {
        SecretSet {
            matcher: None,
            max_len: 0,
            slash: false,
        }
    }

    /// Errors when a secret is shorter than [`MIN_SECRET_LEN`].
    pub fn new<S: AsRef<[u8]>>(secrets: &[S]) -> Result<SecretSet, ShortSecretError> {
        for (index, s) in secrets.iter().enumerate() {
            let len = s.as_ref().len();
            if len < MIN_SECRET_LEN {
                return Err(ShortSecretError { index, len });
            }
        }
        if secrets.is_empty() {
            return Ok(SecretSet::empty());
        }
        let max_len = secrets.iter().map(|s| s.as_ref().len()).max().unwrap_or(0);
        let matcher = AhoCorasickBuilder::new()
            .match_kind(MatchKind::Standard)
            .build(secrets)
            .expect("an Aho-Corasick automaton over a few secrets always builds");
        Ok(SecretSet {
            matcher: Some(matcher),
            max_len,
            slash: secrets.iter().any(|s| s.as_ref().contains(&b'/')),
        })
    }

    /// Whether some secret occurs in `bytes` (a name, a path, a link's target).
    pub fn occurs_in(&self, bytes: &[u8]) -> bool {
        self.matcher
            .as_ref()
            .is_some_and(|matcher| matcher.find(bytes).is_some())
    }

    /// Whether some secret holds a `/` (so a path can show one that none of
    /// its names holds).
    pub fn spans_names(&self) -> bool {
        self.slash
    }

    /// `bytes` with every occurrence of a secret replaced by [`MASK`]
    /// (overlapping and adjacent occurrences by one), to be shown.
    pub fn masked(&self, bytes: &[u8]) -> Vec<u8> {
        let Some(matcher) = &self.matcher else {
            return bytes.to_vec();
        };
        let mut spans: Vec<(usize, usize)> = matcher
            .find_overlapping_iter(bytes)
            .map(|m| (m.start(), m.end()))
            .collect();
        spans.sort_unstable();
        let mut out = Vec::with_capacity(bytes.len());
        let mut at = 0;
        let mut spans = spans.into_iter().peekable();
        while let Some((start, mut end)) = spans.next() {
            while let Some(&(next, next_end)) = spans.peek() {
                if next > end {
                    break;
                }
                end = end.max(next_end);
                spans.next();
            }
            out.extend_from_slice(&bytes[at..start]);
            out.extend_from_slice(MASK);
            at = end;
        }
        out.extend_from_slice(&bytes[at..]);
        out
    }

    pub fn is_empty(&self) -> bool {
        self.matcher.is_none()
    }

    /// Bytes to hold back between windows so a match across reads is found.
    pub fn overlap(&self) -> usize {
        self.max_len.saturating_sub(1)
    }

    /// Zero every occurrence in `buf` (found on the original bytes).
    pub fn zero_in_place(&self, buf: &mut [u8]) {
        self.zero_in_place_before(buf, 0);
    }

    /// Zero every occurrence in `buf` and return the furthest end of the matches
    /// that START before `boundary` (0 when none). The stream uses it to zero
    /// held-back bytes that a match from an earlier window reaches into.
    pub fn zero_in_place_before(&self, buf: &mut [u8], boundary: usize) -> usize {
        self.zero_recording(buf, boundary, 0, None)
    }

    /// Zero every occurrence in `buf` and append to `found` each match that
    /// starts before `boundary`, at `base + start` (matches starting later are
    /// found again in the next window, so each is reported once).
    pub fn zero_in_place_recording(&self, buf: &mut [u8], base: u64, found: &mut Vec<SecretMatch>) {
        let boundary = buf.len();
        self.zero_recording(buf, boundary, base, Some(found));
    }

    fn zero_recording(
        &self,
        buf: &mut [u8],
        boundary: usize,
        base: u64,
        mut found: Option<&mut Vec<SecretMatch>>,
    ) -> usize {
        let Some(matcher) = &self.matcher else {
            return 0;
        };
        // Collect first, zero after: zeroing while searching would change what later matches see.
        let ranges: Vec<(usize, usize, usize)> = matcher
            .find_overlapping_iter(&*buf)
            .map(|m| (m.start(), m.end(), m.pattern().as_usize()))
            .collect();
        let mut furthest = 0;
        for (start, end, secret) in ranges {
            buf[start..end].fill(0);
            if start < boundary {
                furthest = furthest.max(end);
                if let Some(found) = found.as_deref_mut() {
                    found.push(SecretMatch {
                        offset: base + start as u64,
                        len: (end - start) as u32,
                        secret: secret as u32,
                    });
                }
            }
        }
        furthest
    }
}

/// A reader adapter yielding the bytes of `inner` with secrets zeroed.
///
/// Memory: one buffer of `chunk + overlap` bytes, whatever the input size.
pub struct ZeroingStream<R> {
    inner: R,
    secrets: SecretSet,
    chunk: usize,
    /// Original (un-zeroed) bytes held back from the previous window.
    carry: Vec<u8>,
    /// How many leading bytes of `carry` a match in an earlier window covered.
    carry_zero: usize,
    window: Vec<u8>,
    eof: bool,
    /// Total bytes read from `inner`.
    pub bytes_read: u64,
    /// Bytes handed out so far: the offset of the window's first byte.
    emitted: u64,
    /// Every match so far, in offset order per window (see [`Self::matches`]).
    matches: Vec<SecretMatch>,
}

impl<R: Read> ZeroingStream<R> {
    pub fn new(inner: R, secrets: SecretSet, chunk: usize) -> ZeroingStream<R> {
        let chunk = chunk.max(1);
        ZeroingStream {
            inner,
            carry: Vec::with_capacity(secrets.overlap()),
            carry_zero: 0,
            window: Vec::new(),
            secrets,
            chunk,
            eof: false,
            bytes_read: 0,
            emitted: 0,
            matches: Vec::new(),
        }
    }

    /// Where secrets were zeroed in the chunks handed out so far, sorted.
    pub fn matches(&mut self) -> Vec<SecretMatch> {
        let mut found = std::mem::take(&mut self.matches);
        found.sort_unstable();
        found
    }

    /// The next chunk (at most `chunk` bytes, exactly `chunk` except at the
    /// end), or `None` at end of input. The slice is valid until the next call.
    pub fn next_chunk(&mut self) -> io::Result<Option<&[u8]>> {
        let overlap = self.secrets.overlap();
        let want = self.chunk + overlap;
        if self.window.len() != want {
            // Allocated (and zero-filled) once; reused for every chunk.
            self.window.resize(want, 0);
        }
        let carried = self.carry.len();
        self.window[..carried].copy_from_slice(&self.carry);
        let mut filled = carried;
        // Fill the window up to `want` bytes or EOF.
        while !self.eof && filled < want {
            match self.inner.read(&mut self.window[filled..want]) {
                Ok(0) => self.eof = true,
                Ok(n) => {
                    filled += n;
                    self.bytes_read += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if filled == 0 {
            return Ok(None);
        }
        // Before EOF the last `overlap` bytes wait for the next read; at EOF
        // whatever exceeds one chunk is emitted by the next call.
        let emit = if self.eof {
            filled.min(self.chunk)
        } else {
            filled - overlap
        };
        self.carry.clear();
        self.carry.extend_from_slice(&self.window[emit..filled]);
        // Matches reaching into `carry` from earlier windows (their start is gone).
        let held_zero = self.carry_zero.min(carried);
        let window = &mut self.window[..filled];
        let found = if self.secrets.is_empty() {
            None
        } else {
            Some(&mut self.matches)
        };
        let furthest = self
            .secrets
            .zero_recording(window, emit, self.emitted, found);
        window[..held_zero].fill(0);
        self.emitted += emit as u64;
        // Both kinds of reach can extend past this chunk into the next carry.
        self.carry_zero = furthest.max(held_zero).saturating_sub(emit);
        Ok(Some(&self.window[..emit]))
    }
}

/// Zero a whole in-memory buffer (the reference behaviour of the stream).
pub fn zero_all(data: &[u8], secrets: &SecretSet) -> Vec<u8> {
    let mut out = data.to_vec();
    secrets.zero_in_place(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_masked_path_shows_no_part_of_a_secret() {
        let set = SecretSet::new(&[&b"abcd"[..], b"cdef", b"x/yz"]).unwrap();
        assert!(set.occurs_in(b"dir/abcd.txt") && !set.occurs_in(b"dir/abc.txt"));
        assert!(set.spans_names());
        assert_eq!(set.masked(b"dir/abcd.txt"), b"dir/***.txt");
        // Overlapping and adjacent occurrences are one mask.
        assert_eq!(set.masked(b"1abcdef2"), b"1***2");
        assert_eq!(set.masked(b"abcdabcd-abcd"), b"***-***");
        assert_eq!(set.masked(b"x/yz/plain"), b"***/plain");
        assert_eq!(set.masked(b"plain"), b"plain");
        assert_eq!(SecretSet::empty().masked(b"abcd"), b"abcd");
        assert!(!SecretSet::new(&[b"abcd"]).unwrap().spans_names());
    }

    /// Naive reference: every occurrence of every secret, on the original bytes.
    fn reference(data: &[u8], secrets: &[&[u8]]) -> Vec<u8> {
        let mut out = data.to_vec();
        for s in secrets {
            if s.len() > data.len() {
                continue;
            }
            for i in 0..=data.len() - s.len() {
                if &data[i..i + s.len()] == *s {
                    out[i..i + s.len()].fill(0);
                }
            }
        }
        out
    }

    fn stream_all(data: &[u8], secrets: &[&[u8]], chunk: usize) -> Vec<u8> {
        let set = SecretSet::new(secrets).unwrap();
        let mut stream = ZeroingStream::new(data, set, chunk);
        let mut out = Vec::new();
        while let Some(c) = stream.next_chunk().unwrap() {
            assert!(c.len() <= chunk);
            out.extend_from_slice(c);
        }
        out
    }

    #[test]
    fn overlapping_matches() {
        let set = SecretSet::new(&[b"abab"]).unwrap();
        assert_eq!(zero_all(b"xababab", &set), b"x\0\0\0\0\0\0");
        let set = SecretSet::new(&[b"aaaa", b"aaab"]).unwrap();
        assert_eq!(zero_all(b"aaaaab", &set), b"\0\0\0\0\0\0");
    }

    #[test]
    fn short_secret_rejected() {
        assert_eq!(
            SecretSet::new(&[b"abc"]).unwrap_err(),
            ShortSecretError { index: 0, len: 3 }
        );
    }

    #[test]
    fn matches_across_every_boundary() {
        let secrets: &[&[u8]] = &[b"SECRET", b"CRETIN", b"zzzz", b"ETETET"];
        let mut data = Vec::new();
        let mut seed = 7u32;
        for i in 0..600 {
            seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            match seed % 9 {
                0 => data.extend_from_slice(b"SECRETIN"),
                1 => data.extend_from_slice(b"zzzzz"),
                2 => data.extend_from_slice(b"ETETETET"),
                _ => data.push(b'a' + (i % 26) as u8),
            }
        }
        let want = reference(&data, secrets);
        for chunk in [1, 2, 3, 5, 6, 7, 8, 13, 64, 4096] {
            assert_eq!(stream_all(&data, secrets, chunk), want, "chunk {chunk}");
        }
        let set = SecretSet::new(secrets).unwrap();
        assert_eq!(zero_all(&data, &set), want);
    }

    /// Writing each match's secret at its offset into the zeroed bytes gives
    /// back the original, whatever the chunk size; each match is reported once.
    #[test]
    fn matches_rebuild_the_original() {
        let secrets: &[&[u8]] = &[b"SECRET", b"CRETIN", b"zzzz", b"ETETET"];
        let mut data = Vec::new();
        let mut seed = 11u32;
        for i in 0..700 {
            seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            match seed % 7 {
                0 => data.extend_from_slice(b"SECRETIN"),
                1 => data.extend_from_slice(b"zzzzzz"),
                2 => data.extend_from_slice(b"ETETETET"),
                _ => data.push(b'a' + (i % 26) as u8),
            }
        }
        let set = SecretSet::new(secrets).unwrap();
        let mut whole = data.clone();
        let mut reference = Vec::new();
        set.zero_in_place_recording(&mut whole, 0, &mut reference);
        reference.sort_unstable();
        for chunk in [1, 3, 5, 8, 13, 64, 4096] {
            let mut stream = ZeroingStream::new(&data[..], set.clone(), chunk);
            let mut zeroed = Vec::new();
            while let Some(c) = stream.next_chunk().unwrap() {
                zeroed.extend_from_slice(c);
            }
            let found = stream.matches();
            assert_eq!(found, reference, "chunk {chunk}");
            let mut rebuilt = zeroed.clone();
            for m in &found {
                let secret = secrets[m.secret as usize];
                assert_eq!(secret.len(), m.len as usize);
                let at = m.offset as usize;
                rebuilt[at..at + secret.len()].copy_from_slice(secret);
            }
            assert_eq!(rebuilt, data, "chunk {chunk}");
        }
    }

    #[test]
    fn no_secrets_is_identity_and_chunks_are_full() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        assert_eq!(stream_all(&data, &[], 1000), data);
        let set = SecretSet::new::<&[u8]>(&[]).unwrap();
        let mut stream = ZeroingStream::new(&data[..], set, 1000);
        let mut sizes = Vec::new();
        while let Some(c) = stream.next_chunk().unwrap() {
            sizes.push(c.len());
        }
        assert_eq!(sizes, vec![1000; 10]);
        assert_eq!(stream_all(b"", &[b"abcd"], 8), b"");
    }
}
