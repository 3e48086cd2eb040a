//! Reading encoded rows in place: the row ranges of a manifest and the
//! fields of one row, without decoding the rows a caller does not need.

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

pub(super) fn bad(offset: usize, reason: &'static str) -> ManifestError {
    ManifestError { offset, reason }
}

/// The end (exclusive) of the JSON string starting at `start` (its opening quote).
pub(super) fn string_end(data: &[u8], start: usize) -> Result<usize, ManifestError> {
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

pub(super) fn parse_u64(text: &[u8]) -> Option<u64> {
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
pub(super) fn row_has_secrets(row: &[u8]) -> Result<bool, ManifestError> {
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
pub(super) fn after_mtime(row: &[u8]) -> Result<usize, ManifestError> {
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

/// The end (exclusive) of the row that starts at `start` (its `[`).
pub(super) fn row_end(data: &[u8], start: usize) -> Result<usize, ManifestError> {
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
