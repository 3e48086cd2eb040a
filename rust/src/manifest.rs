//! The manifest in `checkpointd.codec`'s compact encoding: one UTF-8 JSON array
//! of rows `["f", path, hex, size, mode, mtime_ns]`, `["d", path, mode]`,
//! `["l", path, target]` (a file row where secrets were zeroed goes on with
//! `offset, length, secret index` triples), written byte-for-byte as Python's
//! `json.dumps(rows, separators=(",", ":"), ensure_ascii=False)` would.
//!
//! A file stored as content-defined chunks (`crate::chunk`) has its chunk list
//! as one string right after the mtime, before any secret triple:
//! `["f", path, hex, size, mode, mtime_ns, "<chunks>", ...]` (a secret triple
//! starts with a number, so a string there is always the chunk list). Its
//! `hex` stays the whole file's digest; its blobs are the chunks.

use crate::chunk::ChunkRef;
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
    /// `["f", path, hex, size, mode, mtime_ns, off, len, idx, ...]`).
    pub fn file_with_secrets(
        &mut self,
        path: impl JsonPath,
        hash: &[u8; 32],
        size: u64,
        mode: u32,
        mtime_ns: i64,
        secrets: &[SecretMatch],
    ) {
        self.file_fields(path, hash, size, mode, mtime_ns);
        self.secret_triples(secrets);
    }

    /// [`ManifestWriter::file_with_secrets`] of a file stored as the chunks
    /// `chunks` lists (`crate::chunk::encode_list`'s text, written as it is:
    /// it holds nothing JSON escapes), when given.
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

// ------------------------------------------------------------------ reading

/// A manifest that is not the codec's encoding (names the byte offset).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestError {
    pub offset: usize,
    pub reason: &'static str,
}

impl std::fmt::Display for ManifestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "malformed manifest at byte {}: {}",
            self.offset, self.reason
        )
    }
}

impl std::error::Error for ManifestError {}

fn bad(offset: usize, reason: &'static str) -> ManifestError {
    ManifestError { offset, reason }
}

/// The end (exclusive) of the JSON string starting at `start` (its opening quote).
fn string_end(data: &[u8], start: usize) -> Result<usize, ManifestError> {
    if data.get(start) != Some(&b'"') {
        return Err(bad(start, "expected a string"));
    }
    let mut i = start + 1;
    while let Some(found) = data
        .get(i..)
        .and_then(|rest| memchr::memchr2(b'"', b'\\', rest))
    {
        i += found;
        if data[i] == b'"' {
            return Ok(i + 1);
        }
        i += 2;
    }
    Err(bad(start, "unterminated string"))
}

/// Byte ranges of the rows (each `[...]`, no nesting) of a manifest array.
pub fn rows(data: &[u8]) -> Result<Vec<&[u8]>, ManifestError> {
    let mut out = Vec::new();
    let mut i = 0;
    if data.first() != Some(&b'[') {
        return Err(bad(0, "expected '['"));
    }
    i += 1;
    if data.get(i) == Some(&b']') {
        return if i + 1 == data.len() {
            Ok(out)
        } else {
            Err(bad(i + 1, "trailing bytes"))
        };
    }
    loop {
        if data.get(i) != Some(&b'[') {
            return Err(bad(i, "expected a row"));
        }
        let start = i;
        i += 1;
        loop {
            match data.get(i) {
                None => return Err(bad(start, "unterminated row")),
                Some(b'"') => i = string_end(data, i)?,
                Some(b']') => {
                    i += 1;
                    break;
                }
                Some(b'[') => return Err(bad(i, "nested array in a row")),
                Some(_) => i += 1,
            }
        }
        out.push(&data[start..i]);
        match data.get(i) {
            Some(b',') => i += 1,
            Some(b']') if i + 1 == data.len() => return Ok(out),
            _ => return Err(bad(i, "expected ',' or the closing ']'")),
        }
    }
}

/// What a file row says (paths stay JSON-escaped; `path_json` includes the quotes).
pub struct FileRow<'a> {
    pub path_json: &'a [u8],
    pub digest: [u8; 32],
    pub size: u64,
}

fn parse_u64(text: &[u8]) -> Option<u64> {
    if text.is_empty() || text.len() > 20 {
        return None;
    }
    let mut n: u64 = 0;
    for &b in text {
        if !b.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    Some(n)
}

/// The file row's fields, None for a dir or symlink row.
pub fn file_row(row: &[u8]) -> Result<Option<FileRow<'_>>, ManifestError> {
    if !row.starts_with(b"[\"f\",") {
        return Ok(None);
    }
    let path_start = 5;
    let path_end = string_end(row, path_start)?;
    let hex_start = path_end + 2; // `,"`
    let hex = row
        .get(hex_start..hex_start + 64)
        .ok_or(bad(hex_start, "short file row"))?;
    let digest =
        crate::hash::from_hex(std::str::from_utf8(hex).map_err(|_| bad(hex_start, "hex"))?)
            .ok_or(bad(hex_start, "not a 64-hex digest"))?;
    let size_start = hex_start + 66; // hex, `",`
    let size_len = row
        .get(size_start..)
        .and_then(|rest| rest.iter().position(|&b| b == b',' || b == b']'))
        .ok_or(bad(size_start, "short file row"))?;
    let size =
        parse_u64(&row[size_start..size_start + size_len]).ok_or(bad(size_start, "file size"))?;
    Ok(Some(FileRow {
        path_json: &row[path_start..path_end],
        digest,
        size,
    }))
}

/// The path of an encoded row (`["f",`, `["d",` or `["l",` then the path):
/// borrowed from the row, decoded only when it holds an escape.
pub fn row_path(row: &[u8]) -> Result<std::borrow::Cow<'_, str>, ManifestError> {
    if !(row.starts_with(b"[\"f\",") || row.starts_with(b"[\"d\",") || row.starts_with(b"[\"l\","))
    {
        return Err(bad(0, "expected a row tag f, d or l"));
    }
    let end = string_end(row, 5)?;
    let literal = &row[5..end];
    if literal.contains(&b'\\') {
        return json_string(literal).map(std::borrow::Cow::Owned);
    }
    std::str::from_utf8(&literal[1..literal.len() - 1])
        .map(std::borrow::Cow::Borrowed)
        .map_err(|_| bad(5, "not UTF-8"))
}

/// Whether a file row carries secret positions (fields after its mtime and
/// its chunk list).
fn row_has_secrets(row: &[u8]) -> Result<bool, ManifestError> {
    if !row.starts_with(b"[\"f\",") {
        return Ok(false);
    }
    let mut at = after_mtime(row)?;
    if row.get(at..at + 2) == Some(b",\"") {
        at = string_end(row, at + 1)?;
    }
    match row.get(at) {
        Some(b',') => Ok(true),
        Some(b']') if at + 1 == row.len() => Ok(false),
        _ => Err(bad(at, "expected ',' or ']' after the mtime")),
    }
}

/// The chunk list's text (between its quotes) of a file row stored as
/// chunks, None for any other row.
pub fn row_chunks(row: &[u8]) -> Result<Option<&[u8]>, ManifestError> {
    if !row.starts_with(b"[\"f\",") {
        return Ok(None);
    }
    let at = after_mtime(row)?;
    if row.get(at..at + 2) != Some(b",\"") {
        return Ok(None);
    }
    let end = string_end(row, at + 1)?;
    Ok(Some(&row[at + 2..end - 1]))
}

/// The offset just past a file row's mtime.
fn after_mtime(row: &[u8]) -> Result<usize, ManifestError> {
    // `,"<64 hex>",size,mode,mtime` follow the path.
    let mut at = string_end(row, 5)? + 2 + 64 + 1;
    for _ in 0..3 {
        if row.get(at) != Some(&b',') {
            return Err(bad(at, "short file row"));
        }
        at += 1;
        if row.get(at) == Some(&b'-') {
            at += 1;
        }
        let digits = row[at.min(row.len())..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        if digits == 0 {
            return Err(bad(at, "a number"));
        }
        at += digits;
    }
    Ok(at)
}

/// Entry count, file count and total file bytes.
pub fn totals(data: &[u8]) -> Result<(u64, u64, u64), ManifestError> {
    let rows = rows(data)?;
    let mut files = 0u64;
    let mut bytes = 0u64;
    for row in &rows {
        if let Some(f) = file_row(row)? {
            files += 1;
            bytes += f.size;
        }
    }
    Ok((rows.len() as u64, files, bytes))
}

/// The chunks a file row stored as chunks lists (None for any other row).
pub fn file_chunks(row: &[u8], f: &FileRow<'_>) -> Result<Option<Vec<ChunkRef>>, ManifestError> {
    // Only files above the smallest chunking threshold can be chunked.
    if f.size <= crate::chunk::MIN_THRESHOLD {
        return Ok(None);
    }
    let Some(text) = row_chunks(row)? else {
        return Ok(None);
    };
    let chunks = crate::chunk::parse_list(text).ok_or(bad(0, "malformed chunk list"))?;
    if chunks.iter().map(|c| u64::from(c.len)).sum::<u64>() != f.size {
        return Err(bad(0, "chunk lengths do not add up to the file size"));
    }
    Ok(Some(chunks))
}

/// The distinct blob digests of the file rows, sorted: a file's content
/// digest, or for a file stored as chunks, its chunks' digests.
pub fn digests(data: &[u8]) -> Result<Vec<[u8; 32]>, ManifestError> {
    let mut out = Vec::new();
    for row in rows(data)? {
        if let Some(f) = file_row(row)? {
            match file_chunks(row, &f)? {
                Some(chunks) => out.extend(chunks.iter().map(|c| c.digest)),
                None => out.push(f.digest),
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// Sorted `a` minus sorted `b` (both distinct), each a flat list of 32-byte
/// digests. Works on the bytes as they are: no copy of either list. When one
/// list is much the shorter (a capture's few new digests against a parent's
/// million), each of its digests is looked up in the other by bisection.
pub fn difference(a: &[u8], b: &[u8]) -> Vec<u8> {
    const D: usize = 32;
    let (na, nb) = (a.len() / D, b.len() / D);
    let digest = |i: usize| &b[i * D..(i + 1) * D];
    let mut out = Vec::new();
    if na.saturating_mul(32) < nb {
        for x in a.chunks_exact(D) {
            let (mut lo, mut hi) = (0, nb);
            while lo < hi {
                let mid = (lo + hi) / 2;
                if digest(mid) < x {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            if lo == nb || digest(lo) != x {
                out.extend_from_slice(x);
            }
        }
        return out;
    }
    let mut j = 0;
    for x in a.chunks_exact(D) {
        while j < nb && digest(j) < x {
            j += 1;
        }
        if j < nb && digest(j) == x {
            continue;
        }
        out.extend_from_slice(x);
    }
    out
}

/// Decode a JSON string literal (with quotes) as Python's `json` reads it.
pub fn json_string(literal: &[u8]) -> Result<String, ManifestError> {
    let inner = &literal[1..literal.len() - 1];
    if !inner.contains(&b'\\') {
        return String::from_utf8(inner.to_vec()).map_err(|_| bad(0, "not UTF-8"));
    }
    let mut out: Vec<u8> = Vec::with_capacity(inner.len());
    let mut i = 0;
    let hex4 = |at: usize| -> Result<u32, ManifestError> {
        let text = inner.get(at..at + 4).ok_or(bad(at, "short \\u escape"))?;
        u32::from_str_radix(
            std::str::from_utf8(text).map_err(|_| bad(at, "escape"))?,
            16,
        )
        .map_err(|_| bad(at, "bad \\u escape"))
    };
    while i < inner.len() {
        let b = inner[i];
        if b != b'\\' {
            out.push(b);
            i += 1;
            continue;
        }
        let esc = *inner.get(i + 1).ok_or(bad(i, "dangling escape"))?;
        i += 2;
        let ch = match esc {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let mut code = hex4(i)?;
                i += 4;
                if (0xD800..0xDC00).contains(&code) && inner.get(i..i + 2) == Some(b"\\u") {
                    let low = hex4(i + 2)?;
                    if (0xDC00..0xE000).contains(&low) {
                        code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
                        i += 6;
                    }
                }
                char::from_u32(code).ok_or(bad(i, "lone surrogate"))?
            }
            _ => return Err(bad(i, "unknown escape")),
        };
        let mut buf = [0u8; 4];
        out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
    }
    String::from_utf8(out).map_err(|_| bad(0, "not UTF-8"))
}

/// A file stored as chunks, as its manifest row says: path, whole-file
/// digest, size, and its chunks in order.
pub struct ChunkedFile {
    pub path: String,
    pub digest: [u8; 32],
    pub size: u64,
    pub chunks: Vec<ChunkRef>,
}

/// Every file row stored as chunks, in manifest order.
pub fn chunked_files(data: &[u8]) -> Result<Vec<ChunkedFile>, ManifestError> {
    let mut out = Vec::new();
    for row in rows(data)? {
        if let Some(f) = file_row(row)? {
            if let Some(chunks) = file_chunks(row, &f)? {
                out.push(ChunkedFile {
                    path: json_string(f.path_json)?,
                    digest: f.digest,
                    size: f.size,
                    chunks,
                });
            }
        }
    }
    Ok(out)
}

/// How a secret span names its secret: its index in the caller's list (a
/// mapping's insertion order counts as its list), or its name when capture
/// was given a mapping.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SecretRef {
    Index(u64),
    Name(String),
}

/// Where capture zeroed a secret in a file: `length` bytes at `offset`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Span {
    pub offset: u64,
    pub length: u64,
    pub secret: SecretRef,
}

/// A file row where capture zeroed secrets: path, digest of the zeroed
/// bytes (the whole file's, for one stored as chunks), size and its spans.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpannedFile {
    pub path: String,
    pub digest: [u8; 32],
    pub size: u64,
    pub spans: Vec<Span>,
}

/// Every file row that carries secret spans, in manifest order (rows
/// without any are only scanned, not decoded).
pub fn spanned_files(data: &[u8]) -> Result<Vec<SpannedFile>, ManifestError> {
    let mut out = Vec::new();
    for row in rows(data)? {
        if !row_has_secrets(row)? {
            continue;
        }
        let Some(f) = file_row(row)? else {
            continue;
        };
        out.push(SpannedFile {
            path: json_string(f.path_json)?,
            digest: f.digest,
            size: f.size,
            spans: row_spans(row)?,
        });
    }
    Ok(out)
}

/// The `offset, length, secret` triples after a file row's mtime and chunk list.
fn row_spans(row: &[u8]) -> Result<Vec<Span>, ManifestError> {
    let mut at = after_mtime(row)?;
    if row.get(at..at + 2) == Some(b",\"") {
        at = string_end(row, at + 1)?;
    }
    let mut spans = Vec::new();
    while row.get(at) == Some(&b',') {
        let number = |at: usize| -> Result<(u64, usize), ManifestError> {
            let digits = row[at..].iter().take_while(|b| b.is_ascii_digit()).count();
            let value =
                parse_u64(&row[at..at + digits]).ok_or(bad(at, "a span offset or length"))?;
            match row.get(at + digits) {
                Some(b',') => Ok((value, at + digits + 1)),
                _ => Err(bad(at + digits, "a secret span triple")),
            }
        };
        let (offset, next) = number(at + 1)?;
        let (length, next) = number(next)?;
        let (secret, end) = if row.get(next) == Some(&b'"') {
            let end = string_end(row, next)?;
            (SecretRef::Name(json_string(&row[next..end])?), end)
        } else {
            let digits = row[next..]
                .iter()
                .take_while(|b| b.is_ascii_digit())
                .count();
            let index = parse_u64(&row[next..next + digits]).ok_or(bad(next, "a secret index"))?;
            (SecretRef::Index(index), next + digits)
        };
        spans.push(Span {
            offset,
            length,
            secret,
        });
        at = end;
    }
    if at + 1 != row.len() {
        return Err(bad(at, "expected ']' after the secret spans"));
    }
    Ok(spans)
}

/// `(path, digest, size)` of each file row whose digest is in `wanted` (sorted).
pub fn files_with_digests(
    data: &[u8],
    wanted: &[[u8; 32]],
) -> Result<Vec<(String, [u8; 32], u64)>, ManifestError> {
    let mut out = Vec::new();
    if wanted.is_empty() {
        return Ok(out);
    }
    // One digest (a capture's one new file): a single-needle search of the
    // bytes, ~1 ms per 100,000 rows, reading only the file rows a find lies
    // in (the hex may spell a name: the row's own digest decides). For more,
    // a multi-pattern search's prefilter matches every hex digit of a
    // manifest and ran 2-4x slower than reading every row (~35 ms).
    let [digest] = wanted else {
        for row in rows(data)? {
            if let Some(f) = file_row(row)? {
                if wanted.binary_search(&f.digest).is_ok() {
                    out.push((json_string(f.path_json)?, f.digest, f.size));
                }
            }
        }
        return Ok(out);
    };
    let hex = crate::hash::to_hex(digest);
    let mut last_row = None;
    for found in memchr::memmem::find_iter(data, hex.as_bytes()) {
        let Some(start) = memchr::memmem::rfind(&data[..found], b"[\"f\",\"") else {
            continue;
        };
        let row = &data[start..row_end(data, start)?];
        if last_row == Some(start) || start + row.len() < found + hex.len() {
            continue;
        }
        if let Some(f) = file_row(row)? {
            if f.digest == *digest {
                out.push((json_string(f.path_json)?, f.digest, f.size));
                last_row = Some(start);
            }
        }
    }
    Ok(out)
}

/// The end (exclusive) of the row that starts at `start` (its `[`).
fn row_end(data: &[u8], start: usize) -> Result<usize, ManifestError> {
    let mut i = start + 1;
    loop {
        match data.get(i) {
            None => return Err(bad(start, "unterminated row")),
            Some(b'"') => i = string_end(data, i)?,
            Some(b']') => return Ok(i + 1),
            Some(_) => i += 1,
        }
    }
}

// ------------------------------------------------------------------ deltas
//
// A delta says how to build a manifest from a base manifest: runs of the base's
// rows to copy and rows to insert, in order. Binary, little-endian:
// `C start:u32 count:u32` copies base rows [start, start+count);
// `A rows:u32 bytes:u32 <rows joined by ','>` inserts rows.

/// The delta from `base` to `new` and how many rows it inserts.
pub fn delta(base: &[u8], new: &[u8]) -> Result<(Vec<u8>, usize), ManifestError> {
    let base_rows = rows(base)?;
    let new_rows = rows(new)?;
    let mut delta = DeltaWriter::default();
    // Both are sorted by path (as the scan writes them): one merge finds
    // each new row's place in the base. A row found nowhere is inserted, so
    // the delta rebuilds `new` exactly even from rows in another order (it is
    // then merely larger).
    let mut at = 0;
    for row in &new_rows {
        if base_rows.get(at) != Some(row) {
            let path = row_path(row)?;
            while let Some(earlier) = base_rows.get(at) {
                if row_path(earlier)? >= path {
                    break;
                }
                at += 1;
            }
        }
        if base_rows.get(at) == Some(row) {
            delta.copy(at as u32);
            at += 1;
        } else {
            delta.add(row);
        }
    }
    Ok(delta.finish())
}

/// A delta in [`apply`]'s encoding, written as its rows come: copy runs of
/// the base's rows and runs of inserted rows.
#[derive(Default)]
struct DeltaWriter<'a> {
    out: Vec<u8>,
    added: Vec<&'a [u8]>,
    added_total: usize,
    start: u32,
    count: u32,
}

impl<'a> DeltaWriter<'a> {
    fn copy(&mut self, position: u32) {
        if self.count > 0 && position == self.start + self.count {
            self.count += 1;
            return;
        }
        self.flush_add();
        self.flush_copy();
        (self.start, self.count) = (position, 1);
    }

    fn add(&mut self, row: &'a [u8]) {
        self.flush_copy();
        self.added.push(row);
        self.added_total += 1;
    }

    fn flush_copy(&mut self) {
        if self.count > 0 {
            self.out.push(b'C');
            self.out.extend_from_slice(&self.start.to_le_bytes());
            self.out.extend_from_slice(&self.count.to_le_bytes());
            self.count = 0;
        }
    }

    fn flush_add(&mut self) {
        if !self.added.is_empty() {
            let joined = self.added.join(&b","[..]);
            self.out.push(b'A');
            self.out
                .extend_from_slice(&(self.added.len() as u32).to_le_bytes());
            self.out
                .extend_from_slice(&(joined.len() as u32).to_le_bytes());
            self.out.extend_from_slice(&joined);
            self.added.clear();
        }
    }

    fn finish(mut self) -> (Vec<u8>, usize) {
        self.flush_add();
        self.flush_copy();
        (self.out, self.added_total)
    }
}

fn read_u32(ops: &[u8], at: usize) -> Result<u32, ManifestError> {
    let bytes = ops.get(at..at + 4).ok_or(bad(at, "short delta"))?;
    Ok(u32::from_le_bytes(bytes.try_into().expect("4 bytes")))
}

/// The manifest `delta` describes on top of `base`.
pub fn apply(base: &[u8], ops: &[u8]) -> Result<Vec<u8>, ManifestError> {
    apply_chain(base, &[ops])
}

/// A chain of deltas applied in turn to `base` (each [`apply`]'s `ops`
/// against the manifest the one before made), with one copy of the bytes at
/// the end: the rows in between are references into `base` and the deltas,
/// never joined. Loading the head of a chain of 31 deltas from its keyframe
/// is then one parse and one copy, not 31 of each.
pub fn apply_chain(base: &[u8], chain: &[&[u8]]) -> Result<Vec<u8>, ManifestError> {
    // Each delta's inserted runs, wrapped as manifests so `rows` reads them.
    let mut wrapped: Vec<Vec<Vec<u8>>> = Vec::with_capacity(chain.len());
    for ops in chain {
        let mut runs = Vec::new();
        for_each_op(ops, |op| {
            if let Op::Insert(joined) = op {
                runs.push([b"[".as_slice(), joined, b"]"].concat());
            }
            Ok(())
        })?;
        wrapped.push(runs);
    }
    let mut current: Vec<&[u8]> = rows(base)?;
    for (ops, runs) in chain.iter().zip(&wrapped) {
        let mut next: Vec<&[u8]> = Vec::with_capacity(current.len());
        let mut inserted = runs.iter();
        for_each_op(ops, |op| {
            match op {
                Op::Copy(start, count, at) => next.extend_from_slice(
                    current
                        .get(start..start + count)
                        .ok_or(bad(at, "copy beyond the base"))?,
                ),
                Op::Insert(_) => {
                    let run = inserted.next().expect("one wrapped run per insert");
                    next.extend(rows(run)?);
                }
            }
            Ok(())
        })?;
        current = next;
    }
    let size = current.iter().map(|r| r.len() + 1).sum::<usize>() + 1;
    let mut out = Vec::with_capacity(size.max(2));
    out.push(b'[');
    for (i, row) in current.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(row);
    }
    out.push(b']');
    Ok(out)
}

/// One operation of a delta: copy `count` rows from row `start` of the base
/// (the op at byte `at`), or insert rows (joined by commas; maybe none).
enum Op<'a> {
    Copy(usize, usize, usize),
    Insert(&'a [u8]),
}

fn for_each_op<'a>(
    ops: &'a [u8],
    mut each: impl FnMut(Op<'a>) -> Result<(), ManifestError>,
) -> Result<(), ManifestError> {
    let mut i = 0;
    while i < ops.len() {
        match ops[i] {
            b'C' => {
                let start = read_u32(ops, i + 1)? as usize;
                let count = read_u32(ops, i + 5)? as usize;
                each(Op::Copy(start, count, i))?;
                i += 9;
            }
            b'A' => {
                let len = read_u32(ops, i + 5)? as usize;
                let joined = ops.get(i + 9..i + 9 + len).ok_or(bad(i, "short insert"))?;
                if !joined.is_empty() {
                    each(Op::Insert(joined))?;
                }
                i += 9 + len;
            }
            _ => return Err(bad(i, "unknown delta operation")),
        }
    }
    Ok(())
}

/// One decoded manifest row (the inverse of [`ManifestWriter`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ManifestRow {
    File {
        path: String,
        hash: [u8; 32],
        size: u64,
        mode: u32,
        mtime_ns: i64,
        /// Capture zeroed secrets in it (the row carries their positions).
        secrets: bool,
    },
    Dir {
        path: String,
        mode: u32,
    },
    Symlink {
        path: String,
        target: String,
    },
}

impl ManifestRow {
    pub fn path(&self) -> &str {
        match self {
            ManifestRow::File { path, .. }
            | ManifestRow::Dir { path, .. }
            | ManifestRow::Symlink { path, .. } => path,
        }
    }
}

/// Parse a manifest in the codec's encoding (any JSON whitespace accepted, as
/// Python's `json.dumps` may have produced it with other separators). Errors
/// name the byte offset and what was expected.
pub fn decode(data: &[u8]) -> Result<Vec<ManifestRow>, String> {
    let mut p = Parser { data, pos: 0 };
    let mut rows = Vec::new();
    p.expect(b'[')?;
    if !p.eat(b']') {
        loop {
            rows.push(p.row()?);
            if p.eat(b']') {
                break;
            }
            p.expect(b',')?;
        }
    }
    p.skip_ws();
    if p.pos != data.len() {
        return Err(p.error("end of the manifest"));
    }
    Ok(rows)
}

struct Parser<'a> {
    data: &'a [u8],
    pos: usize,
}

impl Parser<'_> {
    fn error(&self, expected: &str) -> String {
        format!("manifest: expected {expected} at byte {}", self.pos)
    }

    fn skip_ws(&mut self) {
        while matches!(self.data.get(self.pos), Some(b' ' | b'\n' | b'\r' | b'\t')) {
            self.pos += 1;
        }
    }

    fn eat(&mut self, byte: u8) -> bool {
        self.skip_ws();
        if self.data.get(self.pos) == Some(&byte) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, byte: u8) -> Result<(), String> {
        if self.eat(byte) {
            Ok(())
        } else {
            Err(self.error(&format!("{:?}", byte as char)))
        }
    }

    fn row(&mut self) -> Result<ManifestRow, String> {
        self.expect(b'[')?;
        let tag = self.string()?;
        self.expect(b',')?;
        let path = self.string()?;
        self.expect(b',')?;
        let row = match tag.as_str() {
            "f" => {
                let hex = self.string()?;
                let hash =
                    crate::hash::from_hex(&hex).ok_or_else(|| self.error("a 64-hex digest"))?;
                self.expect(b',')?;
                let size = self.int()?;
                self.expect(b',')?;
                let mode = self.int()?;
                self.expect(b',')?;
                let mtime_ns = self.int()?;
                // Secret positions (flat offset, length, index-or-name triples):
                // the restore plan only needs to know there are some
                // (`spanned_files` reads them for `crate::spans`).
                let mut secrets = false;
                let mut first = true;
                while self.eat(b',') {
                    self.skip_ws();
                    let text = self.data.get(self.pos) == Some(&b'"');
                    if std::mem::take(&mut first) && text {
                        // The chunk list of a file stored as chunks.
                        self.string()?;
                        continue;
                    }
                    secrets = true;
                    if text {
                        self.string()?;
                    } else {
                        self.int()?;
                    }
                }
                ManifestRow::File {
                    path,
                    hash,
                    size: u64::try_from(size).map_err(|_| self.error("a size >= 0"))?,
                    mode: u32::try_from(mode).map_err(|_| self.error("a mode"))?,
                    mtime_ns: i64::try_from(mtime_ns).map_err(|_| self.error("an mtime"))?,
                    secrets,
                }
            }
            "d" => {
                let mode = self.int()?;
                ManifestRow::Dir {
                    path,
                    mode: u32::try_from(mode).map_err(|_| self.error("a mode"))?,
                }
            }
            "l" => ManifestRow::Symlink {
                path,
                target: self.string()?,
            },
            _ => return Err(self.error("a row tag f, d or l")),
        };
        self.expect(b']')?;
        Ok(row)
    }

    fn int(&mut self) -> Result<i128, String> {
        self.skip_ws();
        let start = self.pos;
        if self.data.get(self.pos) == Some(&b'-') {
            self.pos += 1;
        }
        while matches!(self.data.get(self.pos), Some(b'0'..=b'9')) {
            self.pos += 1;
        }
        std::str::from_utf8(&self.data[start..self.pos])
            .ok()
            .and_then(|text| text.parse::<i128>().ok())
            .ok_or_else(|| self.error("an integer"))
    }

    fn hex4(&mut self) -> Result<u32, String> {
        let digits = self
            .data
            .get(self.pos..self.pos + 4)
            .and_then(|d| std::str::from_utf8(d).ok())
            .and_then(|d| u32::from_str_radix(d, 16).ok())
            .ok_or_else(|| self.error("4 hex digits"))?;
        self.pos += 4;
        Ok(digits)
    }

    fn string(&mut self) -> Result<String, String> {
        self.expect(b'"')?;
        let mut out: Vec<u8> = Vec::new();
        loop {
            let start = self.pos;
            while let Some(&b) = self.data.get(self.pos) {
                if b == b'"' || b == b'\\' {
                    break;
                }
                self.pos += 1;
            }
            out.extend_from_slice(&self.data[start..self.pos]);
            match self.data.get(self.pos) {
                Some(b'"') => {
                    self.pos += 1;
                    return String::from_utf8(out).map_err(|_| self.error("UTF-8 text"));
                }
                Some(_) => {
                    self.pos += 1;
                    let escaped = *self
                        .data
                        .get(self.pos)
                        .ok_or_else(|| self.error("an escape"))?;
                    self.pos += 1;
                    let simple = match escaped {
                        b'"' => Some(b'"'),
                        b'\\' => Some(b'\\'),
                        b'/' => Some(b'/'),
                        b'b' => Some(0x08),
                        b'f' => Some(0x0c),
                        b'n' => Some(b'\n'),
                        b'r' => Some(b'\r'),
                        b't' => Some(b'\t'),
                        b'u' => None,
                        _ => return Err(self.error("a JSON escape")),
                    };
                    if let Some(byte) = simple {
                        out.push(byte);
                        continue;
                    }
                    let mut code = self.hex4()?;
                    if (0xd800..0xdc00).contains(&code) {
                        // A surrogate pair: the low half must follow.
                        if self.data.get(self.pos..self.pos + 2) != Some(b"\\u") {
                            return Err(self.error("the low half of a surrogate pair"));
                        }
                        self.pos += 2;
                        let low = self.hex4()?;
                        if !(0xdc00..0xe000).contains(&low) {
                            return Err(self.error("the low half of a surrogate pair"));
                        }
                        code = 0x10000 + ((code - 0xd800) << 10) + (low - 0xdc00);
                    }
                    let ch = char::from_u32(code).ok_or_else(|| self.error("a Unicode scalar"))?;
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                }
                None => return Err(self.error("a closing quote")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(text: &str) -> String {
        let mut out = Vec::new();
        write_json_string(&mut out, text);
        String::from_utf8(out).unwrap()
    }

    /// Found by searching for a few digests or by reading every row, the
    /// same files: each row whose content has a wanted digest, once, never
    /// a row whose name only spells one.
    #[test]
    fn files_with_digests_search_as_rows_say() {
        let (a, b, c) = ([0xa1u8; 32], [0xb2u8; 32], [0xc3u8; 32]);
        let mut w = ManifestWriter::with_capacity(0);
        w.file(crate::hash::to_hex(&a).as_str(), &a, 1, 0o644, 1);
        w.file("d/\"x", &b, 2, 0o644, 1);
        w.dir(crate::hash::to_hex(&c).as_str(), 0o755);
        w.file("e", &a, 3, 0o644, 1);
        w.file(
            format!("f{}", crate::hash::to_hex(&c)).as_str(),
            &b,
            4,
            0o644,
            1,
        );
        let data = w.finish();
        let mut wanted = vec![a, c];
        wanted.sort();
        let found = files_with_digests(&data, &wanted).unwrap();
        let names: Vec<&str> = found.iter().map(|(p, _, _)| p.as_str()).collect();
        assert_eq!(names, [crate::hash::to_hex(&a).as_str(), "e"]);
        let many: Vec<[u8; 32]> = (0..=64u8).map(|n| [n; 32]).collect();
        let mut all = many.clone();
        all.extend([a, b]);
        all.sort();
        let read = files_with_digests(&data, &all).unwrap();
        assert_eq!(read.len(), 4);
        let searched = files_with_digests(&data, &[b]).unwrap();
        assert_eq!(searched.iter().map(|f| f.2).collect::<Vec<_>>(), [2, 4]);
    }

    /// The merged delta rebuilds the new manifest and inserts exactly the
    /// rows the base lacks; rows out of path order still rebuild it.
    #[test]
    fn a_delta_rebuilds_the_new_manifest_and_inserts_only_new_rows() {
        let build = |rows: &[(&str, u8)]| {
            let mut w = ManifestWriter::with_capacity(0);
            for (name, version) in rows {
                w.file(*name, &[*version; 32], u64::from(*version), 0o644, 1);
            }
            w.finish()
        };
        let base = build(&[("a", 1), ("b", 1), ("c", 1), ("d/e", 1), ("f", 1), ("g", 1)]);
        let cases: [(Vec<(&str, u8)>, usize); 5] = [
            (
                vec![("a", 1), ("b", 2), ("c", 1), ("d/e", 1), ("f", 1), ("g", 1)],
                1,
            ),
            (vec![("0", 1), ("a", 1), ("c", 1), ("f", 1), ("h", 3)], 2),
            (vec![("g", 1), ("a", 1), ("f", 1)], 2),
            (vec![], 0),
            (
                vec![("a", 1), ("b", 1), ("c", 1), ("d/e", 1), ("f", 1), ("g", 1)],
                0,
            ),
        ];
        for (rows, inserted) in cases {
            let new = build(&rows);
            let (ops, added) = delta(&base, &new).unwrap();
            assert_eq!(apply(&base, &ops).unwrap(), new, "{rows:?}");
            assert_eq!(added, inserted, "{rows:?}");
        }
    }

    /// A chain of deltas applied at once gives what applying each in turn
    /// gives: rows inserted by one delta and copied or dropped by the next.
    #[test]
    fn a_chain_of_deltas_applies_as_each_in_turn() {
        let version = |names: &[&str]| {
            let mut w = ManifestWriter::with_capacity(0);
            for (i, name) in names.iter().enumerate() {
                if i % 3 == 0 {
                    w.dir(*name, 0o755);
                } else {
                    w.file(*name, &[i as u8; 32], i as u64, 0o644, 7);
                }
            }
            w.finish()
        };
        let versions = [
            version(&["a", "b", "c", "d"]),
            version(&["a", "b,x", "c", "d", "e"]),
            version(&["b,x", "c", "e", "f"]),
            version(&[]),
            version(&["z"]),
        ];
        let deltas: Vec<Vec<u8>> = versions
            .windows(2)
            .map(|w| delta(&w[0], &w[1]).unwrap().0)
            .collect();
        for end in 1..versions.len() {
            let chain: Vec<&[u8]> = deltas[..end].iter().map(Vec::as_slice).collect();
            assert_eq!(apply_chain(&versions[0], &chain).unwrap(), versions[end]);
            assert_eq!(
                apply(&versions[end - 1], chain[end - 1]).unwrap(),
                versions[end]
            );
        }
        assert!(apply_chain(&versions[0], &[b"C\x00\x00\x00\x00\x09\x00\x00\x00"]).is_err());
    }

    /// Both ways of `difference` (a merge; bisection for a short `a`) give
    /// what a set difference gives.
    #[test]
    fn difference_is_the_set_difference() {
        let digest = |n: u32| {
            let mut d = [0u8; 32];
            d[..4].copy_from_slice(&n.to_be_bytes());
            d[31] = (n % 7) as u8;
            d
        };
        let flat = |ns: &[u32]| ns.iter().flat_map(|&n| digest(n)).collect::<Vec<u8>>();
        let b: Vec<u32> = (0..4000).filter(|n| n % 3 != 0).collect();
        for a in [
            vec![0, 1, 2, 3, 3999, 4000, 5000],
            (0..4100).filter(|n| n % 5 != 0).collect::<Vec<u32>>(),
            vec![],
        ] {
            let want: Vec<u32> = a.iter().copied().filter(|n| !b.contains(n)).collect();
            assert_eq!(difference(&flat(&a), &flat(&b)), flat(&want));
            assert_eq!(difference(&flat(&b), &flat(&a)).len() % 32, 0);
        }
        assert_eq!(difference(&flat(&[1, 2]), &[]), flat(&[1, 2]));
    }

    #[test]
    fn spans_are_read_from_the_rows_that_carry_them() {
        let mut plain = ManifestWriter::with_capacity(0);
        plain.file("a,]\"b", &[1; 32], 3, 0o644, -5);
        plain.dir("d", 0o755);
        plain.symlink("l", "x");
        let plain = plain.finish();
        assert_eq!(spanned_files(&plain), Ok(vec![]));
        let mut spanned = ManifestWriter::with_capacity(0);
        spanned.file("a", &[1; 32], 3, 0o644, 5);
        spanned.file_with_secrets(
            "b",
            &[2; 32],
            9,
            0o644,
            5,
            &[SecretMatch {
                offset: 1,
                len: 4,
                secret: 0,
            }],
        );
        let spanned = spanned.finish();
        let span = |offset, secret| Span {
            offset,
            length: 4,
            secret,
        };
        assert_eq!(
            spanned_files(&spanned),
            Ok(vec![SpannedFile {
                path: "b".into(),
                digest: [2; 32],
                size: 9,
                spans: vec![span(1, SecretRef::Index(0))],
            }])
        );
        // Names (a mapping's secrets) and a chunk list before the triples.
        let hex = "03".repeat(32);
        let named = format!(r#"[["f","c","{hex}",12,420,-1,"x",0,4,"t\u00e9",8,4,1]]"#);
        let found = spanned_files(named.as_bytes()).unwrap();
        assert_eq!(
            found[0].spans,
            vec![
                span(0, SecretRef::Name("t\u{e9}".into())),
                span(8, SecretRef::Index(1))
            ]
        );
        assert!(spanned_files(b"[[\"f\",\"a\"]]").is_err());
        let short = format!(r#"[["f","c","{hex}",12,420,-1,0,4]]"#);
        assert!(spanned_files(short.as_bytes()).is_err());
        assert_eq!(
            row_path(br#"["d","a\"b\u00e9",493]"#).unwrap(),
            "a\"b\u{e9}"
        );
    }

    #[test]
    fn fragments_join_into_the_same_bytes() {
        let write = |w: &mut ManifestWriter, i: u64| {
            w.file(
                format!("f{i}").as_str(),
                &[i as u8; 32],
                i,
                0o644,
                -(i as i64),
            );
            w.dir(format!("d{i}").as_str(), 0o755);
        };
        let mut whole = ManifestWriter::with_capacity(0);
        (0..7).for_each(|i| write(&mut whole, i));
        let whole = whole.finish();
        let mut parts = Vec::new();
        for range in [0..3, 3..3, 3..6, 6..7] {
            let mut w = ManifestWriter::fragment(0);
            range.for_each(|i| write(&mut w, i));
            parts.push(w.into_fragment());
        }
        assert_eq!(ManifestWriter::join(parts), whole);
        assert_eq!(ManifestWriter::join(Vec::new()), b"[]");
        assert_eq!(rows(&whole).unwrap().len(), 14);
    }

    #[test]
    fn rows_deltas_and_keys() {
        let mut w = ManifestWriter::with_capacity(0);
        w.dir("a", 0o755);
        w.file("a/\"q]", &[1u8; 32], 3, 0o644, 7);
        w.file("a/b", &[2u8; 32], 4, 0o644, 7);
        w.symlink("a/l", "b");
        let base = w.finish();
        assert_eq!(rows(&base).unwrap().len(), 4);
        assert_eq!(totals(&base).unwrap(), (4, 2, 7));
        assert_eq!(digests(&base).unwrap(), vec![[1u8; 32], [2u8; 32]]);
        let mut w = ManifestWriter::with_capacity(0);
        w.dir("a", 0o755);
        w.file("a/\"q]", &[1u8; 32], 3, 0o644, 7);
        w.file("a/c", &[3u8; 32], 5, 0o644, 8);
        w.symlink("a/l", "b");
        let new = w.finish();
        let (ops, added) = delta(&base, &new).unwrap();
        assert_eq!(added, 1);
        assert_eq!(apply(&base, &ops).unwrap(), new);
        let (same, none) = delta(&base, &base).unwrap();
        assert_eq!((same.len(), none), (9, 0));
        assert_eq!(apply(&base, &same).unwrap(), base);
        let empty = ManifestWriter::with_capacity(0).finish();
        let (ops, _) = delta(&base, &empty).unwrap();
        assert_eq!(apply(&base, &ops).unwrap(), empty);
        let files = files_with_digests(&new, &[[3u8; 32]]).unwrap();
        assert_eq!(files, vec![("a/c".to_string(), [3u8; 32], 5)]);
        let files = files_with_digests(&new, &[[1u8; 32]]).unwrap();
        assert_eq!(files[0].0, "a/\"q]");
        assert_eq!(
            json_string(b"\"\\u00e9\\ud83d\\ude00\\n\"").unwrap(),
            "é😀\n"
        );
        assert!(rows(b"[[\"d\",\"a\",1]").is_err());
    }

    #[test]
    fn counted_sliced_and_grown_encodings_agree() {
        fn rows<S: Sink>(sink: S) -> S {
            let mut w = ManifestWriter::rows_into(sink);
            w.dir(("", "d\"q"), 0o755);
            w.file(("d\"q", "f\n\u{1}é"), &[9u8; 32], 0, 0o644, i64::MIN + 1);
            let found = [SecretMatch {
                offset: 10,
                len: 4,
                secret: 1,
            }];
            w.file_with_secrets("d/s", &[1u8; 32], u64::MAX, 0o600, -1, &found);
            w.symlink(("a/b", "l"), "../t\\x");
            w.into_sink()
        }
        let grown = rows(Vec::new());
        assert_eq!(rows(Counter::default()).0, grown.len());
        let mut buf = vec![0u8; grown.len()];
        let written = rows(SliceWriter {
            buf: &mut buf,
            at: 0,
        })
        .at;
        assert_eq!((written, &buf), (grown.len(), &grown));
        let text = String::from_utf8(grown).unwrap();
        assert!(text.starts_with("[\"d\",\"d\\\"q\",493],[\"f\",\"d\\\"q/f\\n\\u0001é\""));
        assert!(text.contains(",-9223372036854775807]"), "{text}");
        assert!(
            text.contains(",18446744073709551615,384,-1,10,4,1]"),
            "{text}"
        );
        assert!(text.ends_with("[\"l\",\"a/b/l\",\"../t\\\\x\"]"), "{text}");
    }

    #[test]
    fn escaping_matches_python() {
        assert_eq!(json("plain"), "\"plain\"");
        assert_eq!(json("q\"b\\s"), "\"q\\\"b\\\\s\"");
        assert_eq!(json("a\nb\tc\r\u{8}\u{c}"), "\"a\\nb\\tc\\r\\b\\f\"");
        assert_eq!(json("\u{1}\u{1f}\u{7f}"), "\"\\u0001\\u001f\u{7f}\"");
        assert_eq!(json("é→😀\u{2028}"), "\"é→😀\u{2028}\"");
    }

    #[test]
    fn writer_rows() {
        let mut w = ManifestWriter::with_capacity(0);
        w.dir("d", 0o755);
        w.file("d/f", &[0u8; 32], 3, 0o644, -5);
        w.symlink("d/l", "f");
        assert_eq!(w.rows(), 3);
        let text = String::from_utf8(w.finish()).unwrap();
        let zeros = "0".repeat(64);
        assert_eq!(
            text,
            format!(
                "[[\"d\",\"d\",493],[\"f\",\"d/f\",\"{zeros}\",3,420,-5],[\"l\",\"d/l\",\"f\"]]"
            )
        );
        assert_eq!(
            String::from_utf8(ManifestWriter::with_capacity(0).finish()).unwrap(),
            "[]"
        );
    }

    #[test]
    fn decode_inverts_the_writer() {
        let mut w = ManifestWriter::with_capacity(0);
        w.dir("d", 0o755);
        w.file("d/f \"q\"\n\u{1}é😀", &[7u8; 32], 3, 0o644, -5);
        w.symlink("d/l", "f\\x");
        let rows = decode(&w.finish()).unwrap();
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[1].path(), "d/f \"q\"\n\u{1}é😀");
        assert_eq!(
            rows[1],
            ManifestRow::File {
                path: "d/f \"q\"\n\u{1}é😀".into(),
                hash: [7u8; 32],
                size: 3,
                mode: 0o644,
                mtime_ns: -5,
                secrets: false
            }
        );
        assert_eq!(
            rows[2],
            ManifestRow::Symlink {
                path: "d/l".into(),
                target: "f\\x".into()
            }
        );
        // Python's json with default separators and \u escapes of a pair.
        let spaced = br#"[ ["d", "a", 448], ["l", "\ud83d\ude00", "\u00e9"] ]"#;
        let rows = decode(spaced).unwrap();
        assert_eq!(rows[1].path(), "😀");
        assert_eq!(decode(b"[]").unwrap(), vec![]);
        for bad in [
            &b"["[..],
            b"[[\"x\",\"a\",1]]",
            b"[[\"d\",\"a\",-1]]",
            b"[] x",
            b"[[\"f\",\"a\",\"00\",1,1,1]]",
        ] {
            assert!(decode(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }
}
