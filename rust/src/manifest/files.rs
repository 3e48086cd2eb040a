//! What file rows say beyond their digest: totals, chunk lists and the
//! secret spans capture zeroed.

use crate::chunk::ChunkRef;

use super::rows::{
    after_mtime, bad, file_row, json_string, parse_u64, row_chunks, row_has_secrets, rows,
    string_end, FileRow, ManifestError,
};

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
