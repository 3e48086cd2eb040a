//! Blob digests of a manifest: the set it references, set differences of
//! digest lists, and the file rows that hold given digests.

use super::files::file_chunks;
use super::rows::{file_row, json_string, row_end, rows, ManifestError};

/// The distinct blob digests of the file rows, sorted: a file's content
/// digest, or for a file stored as chunks, its chunks' digests.
pub fn digests(data: &[u8]) -> Result<Vec<[u8; 32]>, ManifestError> {
    let mut out = every_digest(data)?;
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// [`digests`] with how many times each is referenced (by file rows and
/// chunks of chunked files).
pub fn digests_counted(data: &[u8]) -> Result<Counted, ManifestError> {
    let mut out = every_digest(data)?;
    out.sort_unstable();
    Ok(Counted::of_sorted(&out))
}

/// Every blob digest the file rows reference, in row order, repeats kept.
fn every_digest(data: &[u8]) -> Result<Vec<[u8; 32]>, ManifestError> {
    let mut out = Vec::new();
    for row in rows(data)? {
        if let Some(f) = file_row(row)? {
            match file_chunks(row, &f)? {
                Some(chunks) => out.extend(chunks.iter().map(|c| c.digest)),
                None => out.push(f.digest),
            }
        }
    }
    Ok(out)
}

/// A manifest's distinct blob digests (sorted, flat, 32 bytes each) and,
/// beside them, how many references each has (`u32` little-endian, one per
/// digest): with the counts, the digests of a manifest a few rows away are
/// worked out from the rows alone (see `journal::digests`).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Counted {
    pub digests: Vec<u8>,
    pub counts: Vec<u8>,
}

impl Counted {
    /// Of `sorted` digests, repeats kept.
    pub fn of_sorted(sorted: &[[u8; 32]]) -> Counted {
        let mut out = Counted::default();
        let mut rest = sorted;
        while let Some(first) = rest.first() {
            let run = rest.iter().take_while(|d| *d == first).count();
            out.push(first, run as u32);
            rest = &rest[run..];
        }
        out
    }

    pub fn push(&mut self, digest: &[u8; 32], count: u32) {
        self.digests.extend_from_slice(digest);
        self.counts.extend_from_slice(&count.to_le_bytes());
    }

    /// Whether `counts` has one count per digest of `digests`.
    pub fn fits(digests: &[u8], counts: &[u8]) -> bool {
        digests.len() % 32 == 0 && counts.len() * 8 == digests.len()
    }
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
            if !contains(b, x.try_into().expect("32 bytes")) {
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

/// What a manifest adds to a set of known digests.
pub struct NewFiles {
    /// The distinct digests of the file rows (a file's, or the chunks' of a
    /// file stored as chunks) in neither `known` nor `fed`, sorted, flat.
    pub digests: Vec<u8>,
    /// `(path, digest, size)` of each file stored whole whose digest is new.
    pub files: Vec<(String, [u8; 32], u64)>,
}

/// The digests and files of `data` new to `known` and `fed` (each a sorted
/// flat list of 32-byte digests), in one pass over the rows: what
/// [`digests`], two [`difference`]s and [`files_with_digests`] give, without
/// a list of every digest of the manifest.
pub fn new_files(data: &[u8], known: &[u8], fed: &[u8]) -> Result<NewFiles, ManifestError> {
    let is_new = |d: &[u8; 32]| !contains(known, d) && !contains(fed, d);
    let mut digests: Vec<[u8; 32]> = Vec::new();
    let mut files = Vec::new();
    for row in rows(data)? {
        let Some(f) = file_row(row)? else { continue };
        match file_chunks(row, &f)? {
            Some(chunks) => digests.extend(chunks.iter().map(|c| c.digest).filter(is_new)),
            None if is_new(&f.digest) => {
                digests.push(f.digest);
                files.push((json_string(f.path_json)?, f.digest, f.size));
            }
            None => {}
        }
    }
    digests.sort_unstable();
    digests.dedup();
    Ok(NewFiles {
        digests: digests.concat(),
        files,
    })
}

/// Whether the sorted flat list of 32-byte digests `list` holds `digest`.
fn contains(list: &[u8], digest: &[u8; 32]) -> bool {
    search(list, digest).is_ok()
}

/// Where `digest` is in the sorted flat list of 32-byte digests `list`:
/// `Ok(index)`, or `Err(index)` where it would go.
pub fn search(list: &[u8], digest: &[u8; 32]) -> Result<usize, usize> {
    let (mut lo, mut hi) = (0, list.len() / 32);
    while lo < hi {
        let mid = (lo + hi) / 2;
        match list[mid * 32..mid * 32 + 32].cmp(digest.as_slice()) {
            std::cmp::Ordering::Less => lo = mid + 1,
            std::cmp::Ordering::Greater => hi = mid,
            std::cmp::Ordering::Equal => return Ok(mid),
        }
    }
    Err(lo)
}
