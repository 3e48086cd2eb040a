//! A new manifest's blob digests worked out from its parent's and the
//! changes (see `journal::scan`), instead of read from every row.

use std::collections::HashSet;

use super::splice::{Edit, Parent};
use crate::manifest::{file_chunks, file_row};

/// The new manifest's blob digests (`new`, the parent with `edits` applied),
/// from the parent's (`known`): theirs, less those only the removed rows
/// held, plus the added rows' (None when a changed row is stored as chunks:
/// then they are read from `new` whole). Whether a removed row's digest is
/// still held by another row (a file's, or a chunk of a large one) is one
/// search of `new` for all such digests at once, each find confirmed by
/// parsing the row it lies in (a name could spell a digest).
pub fn digests_after(parent: &Parent, edits: &[Edit], known: &[u8], new: &[u8]) -> Option<Vec<u8>> {
    if known.len() % 32 != 0 {
        return None;
    }
    let (mut removed, mut added) = (Vec::new(), Vec::new());
    for edit in edits {
        file_digests(parent.rows(edit.span), &mut removed)?;
        file_digests(&edit.rows, &mut added)?;
    }
    added.sort_unstable();
    added.dedup();
    removed.sort_unstable();
    removed.dedup();
    removed.retain(|d| added.binary_search(d).is_err());
    let held = still_held(new, &removed)?;
    removed.retain(|d| !held.contains(d));
    Some(merged(known, &removed, &added))
}

/// Sorted, distinct `known` less `removed` plus `added` (both sorted and
/// distinct): one merge, written straight into the flat list.
fn merged(known: &[u8], removed: &[[u8; 32]], added: &[[u8; 32]]) -> Vec<u8> {
    let mut out = Vec::with_capacity(known.len() + added.len() * 32);
    let mut added = added.iter().peekable();
    let mut removed = removed.iter().peekable();
    for digest in known.chunks_exact(32) {
        while let Some(new) = added.next_if(|new| new.as_slice() < digest) {
            out.extend_from_slice(new);
        }
        added.next_if(|new| new.as_slice() == digest);
        while removed.next_if(|gone| gone.as_slice() < digest).is_some() {}
        if removed.next_if(|gone| gone.as_slice() == digest).is_none() {
            out.extend_from_slice(digest);
        }
    }
    for new in added {
        out.extend_from_slice(new);
    }
    out
}

/// The content digests of the file rows of `rows` (rows joined by commas),
/// into `out`; None when one is stored as chunks.
fn file_digests(rows: &[u8], out: &mut Vec<[u8; 32]>) -> Option<()> {
    if rows.is_empty() {
        return Some(());
    }
    let wrapped = [b"[".as_slice(), rows, b"]"].concat();
    for row in crate::manifest::rows(&wrapped).ok()? {
        if let Some(file) = file_row(row).ok()? {
            if file_chunks(row, &file).ok()?.is_some() {
                return None;
            }
            out.push(file.digest);
        }
    }
    Some(())
}

/// Which of `digests` a file row of `manifest` still holds as a blob (its
/// content, or one of its chunks): one pass that reads each file row's digest
/// field (after `["f","` and the path, the only place a raw `["f","` occurs:
/// a `"` inside a JSON string is escaped) and, for a row stored as chunks,
/// its chunk list.
fn still_held(manifest: &[u8], digests: &[[u8; 32]]) -> Option<HashSet<[u8; 32]>> {
    let mut held = HashSet::new();
    if digests.is_empty() {
        return Some(held);
    }
    let hexes: Vec<String> = digests.iter().map(crate::hash::to_hex).collect();
    // Leftmost-first lets the search run on its SIMD prefilter (Teddy): with
    // the default match kind ten digests were a byte-at-a-time automaton,
    // ~1 s over a million rows. (A field cannot start inside another find: a
    // `"` comes before it, and a find is hex digits alone.)
    let search = aho_corasick::AhoCorasick::builder()
        .match_kind(aho_corasick::MatchKind::LeftmostFirst)
        .build(&hexes)
        .ok()?;
    for found in search.find_iter(manifest) {
        let digest = digests[found.pattern().as_usize()];
        if !held.contains(&digest) && is_blob_field(manifest, found.start())? {
            held.insert(digest);
            if held.len() == digests.len() {
                break;
            }
        }
    }
    Some(held)
}

/// Whether the digest spelled at `at` is a file row's content digest or one
/// of its chunks (not a name, a link target, or part of one). The file row
/// it could lie in starts at the last `["f","` before it: that run occurs
/// nowhere else (a `"` inside a JSON string is escaped).
fn is_blob_field(manifest: &[u8], at: usize) -> Option<bool> {
    let Some(row) = memchr::memmem::rfind(&manifest[..at], b"[\"f\",\"") else {
        return Some(false);
    };
    let path_end = string_end(manifest, row + 5)?;
    if at == path_end + 2 {
        return Some(true);
    }
    if at < path_end {
        return Some(false);
    }
    // `",size,mode,mtime` and then, for a chunked file, `,"<list>"`.
    let mut i = path_end + 67;
    for _ in 0..3 {
        i += 1 + manifest
            .get(i + 1..)?
            .iter()
            .position(|b| !b.is_ascii_digit() && *b != b'-')?;
    }
    if manifest.get(i..i + 2) != Some(b",\"") {
        return Some(false);
    }
    let list_end = string_end(manifest, i + 1)?;
    let list_start = i + 2;
    Some(at >= list_start && at + 64 < list_end && (at == list_start || manifest[at - 1] == b','))
}

/// The end (exclusive) of the JSON string whose opening quote is at `start`.
fn string_end(data: &[u8], start: usize) -> Option<usize> {
    let mut i = start + 1;
    loop {
        i += memchr::memchr2(b'"', b'\\', data.get(i..)?)?;
        if data[i] == b'"' {
            return Some(i + 1);
        }
        i += 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::{FileFields, ManifestWriter};

    #[test]
    fn a_digest_is_held_by_a_file_row_or_a_chunk_never_by_a_name() {
        let (gone, chunk, named, spelled) = ([1u8; 32], [2u8; 32], [3u8; 32], [4u8; 32]);
        let list = crate::chunk::encode_list(&[
            crate::chunk::ChunkRef {
                digest: [9; 32],
                len: 7,
            },
            crate::chunk::ChunkRef {
                digest: chunk,
                len: 70_000,
            },
        ]);
        let mut w = ManifestWriter::with_capacity(0);
        // A name that spells a digest, and a link whose target does.
        w.file(
            crate::hash::to_hex(&spelled).as_str(),
            &[5; 32],
            1,
            0o644,
            1,
        );
        w.symlink("l", &crate::hash::to_hex(&gone));
        let fields = FileFields {
            hash: &[8; 32],
            size: 70_007,
            mode: 0o644,
            mtime_ns: -5,
            chunks: Some(&list),
        };
        w.file_with_chunks("big", &fields, &[]);
        w.file("held", &named, 3, 0o600, 12);
        let manifest = w.finish();
        let held = still_held(&manifest, &[gone, chunk, named, spelled]).unwrap();
        assert_eq!(held, [chunk, named].into_iter().collect());
    }
}
