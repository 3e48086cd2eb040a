//! Encoding: rows appended to a sink exactly as Python's `json.dumps` writes
//! them, into a growing buffer, a byte counter or a buffer sized once.

use crate::redact::SecretMatch;

/// Where encoded bytes go: a growing `Vec`, a [`Counter`] that only adds up
/// lengths (so a buffer can be sized exactly before anything is written), or a
/// [`SliceWriter`] filling a buffer allocated once. One encoder over all
/// three, so the length computed is the length written.
pub trait Sink {
    fn bytes(&mut self, bytes: &[u8]);

    fn byte(&mut self, byte: u8) {
        self.bytes(&[byte]);
    }

    /// A decimal integer (i128 so that every u64 and i64 fits).
    fn int(&mut self, value: i128) {
        let (digits, at) = format_int(value);
        self.bytes(&digits[at..]);
    }
}

impl Sink for Vec<u8> {
    fn bytes(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }

    fn byte(&mut self, byte: u8) {
        self.push(byte);
    }
}

/// Counts the bytes an encoding takes, writing nothing.
#[derive(Default)]
pub struct Counter(pub usize);

impl Sink for Counter {
    fn bytes(&mut self, bytes: &[u8]) {
        self.0 += bytes.len();
    }

    fn byte(&mut self, _byte: u8) {
        self.0 += 1;
    }

    fn int(&mut self, value: i128) {
        let mut n = value.unsigned_abs();
        let mut digits = 1;
        while n >= 10 {
            n /= 10;
            digits += 1;
        }
        self.0 += digits + usize::from(value < 0);
    }
}

/// Fills a buffer of the exact size from its start.
pub struct SliceWriter<'a> {
    pub buf: &'a mut [u8],
    pub at: usize,
}

impl Sink for SliceWriter<'_> {
    fn bytes(&mut self, bytes: &[u8]) {
        self.buf[self.at..self.at + bytes.len()].copy_from_slice(bytes);
        self.at += bytes.len();
    }

    fn byte(&mut self, byte: u8) {
        self.buf[self.at] = byte;
        self.at += 1;
    }
}

/// A file row's fields after its path ([`ManifestWriter::file_with_chunks`]).
pub struct FileFields<'a> {
    pub hash: &'a [u8; 32],
    pub size: u64,
    pub mode: u32,
    pub mtime_ns: i64,
    pub chunks: Option<&'a str>,
}

/// Appends rows to a sink; `finish` closes the array.
pub struct ManifestWriter<S: Sink = Vec<u8>> {
    out: S,
    rows: usize,
}

impl ManifestWriter<Vec<u8>> {
    pub fn with_capacity(bytes: usize) -> ManifestWriter {
        let mut out = Vec::with_capacity(bytes.max(2));
        out.push(b'[');
        ManifestWriter { out, rows: 0 }
    }

    pub fn finish(mut self) -> Vec<u8> {
        self.out.push(b']');
        self.out
    }

    /// A writer of rows for the middle of a manifest (no brackets), so that
    /// runs of rows can be encoded apart and joined in order by [`ManifestWriter::join`].
    pub fn fragment(bytes: usize) -> ManifestWriter {
        ManifestWriter::rows_into(Vec::with_capacity(bytes))
    }

    /// The fragment's bytes (rows separated by commas, none around them).
    pub fn into_fragment(self) -> Vec<u8> {
        self.out
    }

    /// One manifest from fragments, in order (empty ones hold no rows). Each
    /// fragment is freed once copied, so the peak is about one manifest plus
    /// one fragment.
    pub fn join(fragments: impl IntoIterator<Item = Vec<u8>>) -> Vec<u8> {
        let fragments: Vec<Vec<u8>> = fragments.into_iter().filter(|f| !f.is_empty()).collect();
        let total: usize = fragments.iter().map(|f| f.len() + 1).sum();
        let mut out = Vec::with_capacity(total + 2);
        out.push(b'[');
        for (i, fragment) in fragments.into_iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(&fragment);
        }
        out.push(b']');
        out
    }
}

impl<S: Sink> ManifestWriter<S> {
    /// Rows (comma-separated, no brackets) into `out`.
    pub fn rows_into(out: S) -> ManifestWriter<S> {
        ManifestWriter { out, rows: 0 }
    }

    /// The sink, once the rows are written.
    pub fn into_sink(self) -> S {
        self.out
    }

    fn begin_row(&mut self, tag: u8) {
        if self.rows > 0 {
            self.out.byte(b',');
        }
        self.rows += 1;
        self.out.bytes(&[b'[', b'"', tag, b'"', b',']);
    }

    fn file_fields(
        &mut self,
        path: impl JsonPath,
        hash: &[u8; 32],
        size: u64,
        mode: u32,
        mtime_ns: i64,
    ) {
        self.begin_row(b'f');
        path.write_json(&mut self.out);
        self.out.bytes(b",\"");
        self.out.bytes(&hex_text(hash));
        self.out.bytes(b"\",");
        self.out.int(size as i128);
        self.out.byte(b',');
        self.out.int(mode as i128);
        self.out.byte(b',');
        self.out.int(mtime_ns as i128);
    }

    pub fn file(
        &mut self,
        path: impl JsonPath,
        hash: &[u8; 32],
        size: u64,
        mode: u32,
        mtime_ns: i64,
    ) {
        self.file_fields(path, hash, size, mode, mtime_ns);
        self.out.byte(b']');
    }

    /// A file row followed, when secrets were zeroed in it, by one flat
    /// `offset, length, secret index` triple per match (rows stay flat arrays:
    /// `["f", path, hex, size, mode, mtime_ns, off, len, idx, ...]`), and of a
    /// file stored as the chunks `file.chunks` lists (`crate::chunk::encode_list`'s
    /// text, written as it is: it holds nothing JSON escapes), when given, with
    /// that list right after the mtime.
    pub fn file_with_chunks(
        &mut self,
        path: impl JsonPath,
        file: &FileFields<'_>,
        secrets: &[SecretMatch],
    ) {
        self.file_fields(path, file.hash, file.size, file.mode, file.mtime_ns);
        if let Some(chunks) = file.chunks {
            self.out.bytes(b",\"");
            self.out.bytes(chunks.as_bytes());
            self.out.byte(b'"');
        }
        self.secret_triples(secrets);
    }

    fn secret_triples(&mut self, secrets: &[SecretMatch]) {
        for m in secrets {
            self.out.byte(b',');
            self.out.int(m.offset as i128);
            self.out.byte(b',');
            self.out.int(m.len as i128);
            self.out.byte(b',');
            self.out.int(m.secret as i128);
        }
        self.out.byte(b']');
    }

    pub fn dir(&mut self, path: impl JsonPath, mode: u32) {
        self.begin_row(b'd');
        path.write_json(&mut self.out);
        self.out.byte(b',');
        self.out.int(mode as i128);
        self.out.byte(b']');
    }

    pub fn symlink(&mut self, path: impl JsonPath, target: &str) {
        self.begin_row(b'l');
        path.write_json(&mut self.out);
        self.out.byte(b',');
        write_json_string(&mut self.out, target);
        self.out.byte(b']');
    }

    pub fn rows(&self) -> usize {
        self.rows
    }
}

/// Lowercase hex of a digest (no temporary String per row).
fn hex_text(digest: &[u8; 32]) -> [u8; 64] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut text = [0u8; 64];
    for (i, b) in digest.iter().enumerate() {
        text[2 * i] = HEX[(b >> 4) as usize];
        text[2 * i + 1] = HEX[(b & 15) as usize];
    }
    text
}

/// A decimal integer's digits (with its sign) in `digits[at..]`. Takes i128
/// so that every u64 and i64 fits, but converts in 64-bit arithmetic (a
/// 128-bit division per digit made this the manifest's hot spot: 19 digits
/// per mtime).
fn format_int(value: i128) -> ([u8; 21], usize) {
    let magnitude = value.unsigned_abs();
    let mut n = u64::try_from(magnitude).unwrap_or(u64::MAX);
    debug_assert_eq!(u128::from(n), magnitude, "manifest integers fit in 64 bits");
    let mut digits = [0u8; 21];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    if value < 0 {
        at -= 1;
        digits[at] = b'-';
    }
    (digits, at)
}

/// A JSON string as Python's `json` module writes it with `ensure_ascii=False`:
/// `"` and `\\` escaped, `\n \r \t \b \f` short forms, other control characters
/// below U+0020 as `\u00xx` (lowercase hex), everything else verbatim.
pub fn write_json_string<S: Sink>(out: &mut S, text: &str) {
    out.byte(b'"');
    write_escaped(out, text);
    out.byte(b'"');
}

/// The inside of [`write_json_string`] (escaping is per byte, so the
/// escaping of a concatenation is the concatenation of the escapings).
fn write_escaped<S: Sink>(out: &mut S, text: &str) {
    let bytes = text.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if !NEEDS_ESCAPE[b as usize] {
            continue;
        }
        out.bytes(&bytes[start..i]);
        match b {
            b'"' => out.bytes(b"\\\""),
            b'\\' => out.bytes(b"\\\\"),
            b'\n' => out.bytes(b"\\n"),
            b'\r' => out.bytes(b"\\r"),
            b'\t' => out.bytes(b"\\t"),
            0x08 => out.bytes(b"\\b"),
            0x0c => out.bytes(b"\\f"),
            _ => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.bytes(b"\\u00");
                out.byte(HEX[(b >> 4) as usize]);
                out.byte(HEX[(b & 15) as usize]);
            }
        }
        start = i + 1;
    }
    out.bytes(&bytes[start..]);
}

/// A manifest path, written as one JSON string: a whole path, or a
/// directory and a name within it (`dir/name`, or `name` in the root), so
/// a scan never joins them into a String of its own.
pub trait JsonPath {
    fn write_json<S: Sink>(&self, out: &mut S);
}

impl JsonPath for &str {
    fn write_json<S: Sink>(&self, out: &mut S) {
        write_json_string(out, self);
    }
}

impl JsonPath for (&str, &str) {
    fn write_json<S: Sink>(&self, out: &mut S) {
        out.byte(b'"');
        if !self.0.is_empty() {
            write_escaped(out, self.0);
            out.byte(b'/');
        }
        write_escaped(out, self.1);
        out.byte(b'"');
    }
}

/// Bytes that JSON (as Python writes it) escapes: `"`, `\`, and below U+0020.
static NEEDS_ESCAPE: [bool; 256] = {
    let mut table = [false; 256];
    let mut i = 0;
    while i < 0x20 {
        table[i] = true;
        i += 1;
    }
    table[b'"' as usize] = true;
    table[b'\\' as usize] = true;
    table
};
