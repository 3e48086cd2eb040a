//! A new manifest's blob digests worked out from its parent's and the
//! changes (see `journal::scan`), instead of read from every row.

use super::splice::{Edit, Parent};
use crate::manifest::{file_chunks, file_row, search, Counted};

/// A manifest's distinct digests and their counts, as [`Counted`] holds them.
pub type Known<'a> = (&'a [u8], &'a [u8]);

/// The new manifest's blob digests and their reference counts, from the
/// parent's (`known`) and the rows the edits remove and add: each count
/// less the removed rows' references plus the added rows', a digest left
/// with none dropped. None when `known` does not fit the edits (a removed
/// row's digest it does not count as often): the caller reads every row.
pub fn digests_after(parent: &Parent, edits: &[Edit], known: Known) -> Option<Counted> {
    if !Counted::fits(known.0, known.1) {
        return None;
    }
    let mut changes: Vec<([u8; 32], i64)> = Vec::new();
    for edit in edits {
        file_digests(parent.rows(edit.span), -1, &mut changes)?;
        file_digests(&edit.rows, 1, &mut changes)?;
    }
    changes.sort_unstable_by_key(|change| change.0);
    let mut net: Vec<([u8; 32], i64)> = Vec::with_capacity(changes.len());
    for (digest, by) in changes {
        match net.last_mut() {
            Some(last) if last.0 == digest => last.1 += by,
            _ => net.push((digest, by)),
        }
    }
    merged(known, &net)
}

/// `known` with each of `net` (sorted, distinct) added to its count: the
/// runs of `known` between them copied whole.
fn merged((digests, counts): Known, net: &[([u8; 32], i64)]) -> Option<Counted> {
    let mut out = Counted {
        digests: Vec::with_capacity(digests.len() + net.len() * 32),
        counts: Vec::with_capacity(counts.len() + net.len() * 4),
    };
    let mut from = 0;
    for (digest, by) in net {
        let found = search(digests, digest);
        let at = match found {
            Ok(at) | Err(at) => at,
        };
        out.digests
            .extend_from_slice(digests.get(from * 32..at * 32)?);
        out.counts.extend_from_slice(counts.get(from * 4..at * 4)?);
        match found {
            Ok(at) => {
                let count = u32::from_le_bytes(counts[at * 4..at * 4 + 4].try_into().ok()?);
                match u32::try_from(i64::from(count) + by).ok()? {
                    0 => {}
                    left => out.push(digest, left),
                }
                from = at + 1;
            }
            Err(at) => {
                out.push(digest, held(*by)?);
                from = at;
            }
        }
    }
    out.digests.extend_from_slice(&digests[from * 32..]);
    out.counts.extend_from_slice(&counts[from * 4..]);
    Some(out)
}

/// The count of a digest the parent did not reference: what the edits add
/// (None when they remove it, or add and remove it as often: the parent's
/// rows referenced it, and `known` says they did not).
fn held(by: i64) -> Option<u32> {
    u32::try_from(by).ok().filter(|&count| count > 0)
}

/// The blob references of the file rows of `rows` (rows joined by commas):
/// each file's content digest, or its chunks' for a file stored as chunks,
/// pushed with `by`. None when a row does not parse.
fn file_digests(rows: &[u8], by: i64, out: &mut Vec<([u8; 32], i64)>) -> Option<()> {
    if rows.is_empty() {
        return Some(());
    }
    let wrapped = [b"[".as_slice(), rows, b"]"].concat();
    for row in crate::manifest::rows(&wrapped).ok()? {
        if let Some(file) = file_row(row).ok()? {
            match file_chunks(row, &file).ok()? {
                Some(chunks) => out.extend(chunks.iter().map(|c| (c.digest, by))),
                None => out.push((file.digest, by)),
            }
        }
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::splice;
    use crate::manifest::{digests_counted, FileFields, ManifestWriter};

    /// A writer's rows without the brackets: what an edit inserts.
    fn rows(write: impl FnOnce(&mut ManifestWriter)) -> Vec<u8> {
        let mut w = ManifestWriter::with_capacity(0);
        write(&mut w);
        let data = w.finish();
        data[1..data.len() - 1].to_vec()
    }

    fn chunked(w: &mut ManifestWriter, path: &str, chunks: &[[u8; 32]]) {
        let refs: Vec<_> = chunks
            .iter()
            .map(|&digest| crate::chunk::ChunkRef {
                digest,
                len: 70_000,
            })
            .collect();
        let list = crate::chunk::encode_list(&refs);
        let fields = FileFields {
            hash: &[0xee; 32],
            size: 70_000 * chunks.len() as u64,
            mode: 0o644,
            mtime_ns: 1,
            chunks: Some(&list),
        };
        w.file_with_chunks(path, &fields, &[]);
    }

    fn parent() -> Vec<u8> {
        let mut w = ManifestWriter::with_capacity(0);
        w.file("a", &[1; 32], 1, 0o644, 1);
        w.file("b", &[1; 32], 1, 0o644, 1);
        chunked(&mut w, "big", &[[9; 32], [2; 32], [9; 32]]);
        w.file("c", &[2; 32], 1, 0o644, 1);
        w.symlink("l", &crate::hash::to_hex(&[3; 32]));
        w.file("z", &[3; 32], 1, 0o644, 1);
        w.finish()
    }

    fn edit(parent: &Parent, path: &str, new: Vec<u8>) -> Edit {
        let span = match parent.find(path).unwrap() {
            Some((span, _)) => span,
            None => {
                let at = parent.lower_bound(path.as_bytes()).unwrap();
                (at, at)
            }
        };
        Edit {
            span,
            key: path.into(),
            rows: new,
        }
    }

    #[test]
    fn counts_follow_the_edits_as_a_count_of_every_row_would() {
        let data = parent();
        let parent = Parent::new(&data).unwrap();
        let known = digests_counted(&data).unwrap();
        let mut edits = vec![
            // One of two references to [1] goes: it stays.
            edit(&parent, "a", rows(|w| w.file("a", &[4; 32], 1, 0o644, 2))),
            // The big file loses both references to [9]; [2] keeps c's.
            edit(
                &parent,
                "big",
                rows(|w| chunked(w, "big", &[[5; 32], [2; 32]])),
            ),
            // The only file row of [3] goes (a link spelling it is no reference).
            edit(&parent, "z", Vec::new()),
            // A new file shares a chunk's digest.
            edit(&parent, "m", rows(|w| w.file("m", &[5; 32], 1, 0o644, 2))),
        ];
        let after = digests_after(&parent, &edits, (&known.digests, &known.counts)).unwrap();
        splice::sort_edits(&mut edits);
        let pieces = splice::pieces(&parent, &edits).unwrap();
        let mut new = vec![0; splice::joined_len(&pieces)];
        splice::join_into(&pieces, &mut new);
        assert_eq!(after, digests_counted(&new).unwrap());
        let distinct: Vec<[u8; 32]> = after
            .digests
            .chunks_exact(32)
            .map(|d| d.try_into().unwrap())
            .collect();
        assert_eq!(distinct, vec![[1; 32], [2; 32], [4; 32], [5; 32]]);
        let counts: Vec<u32> = after
            .counts
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(counts, vec![1, 2, 1, 2]);
    }

    #[test]
    fn counts_that_do_not_fit_the_edits_are_refused() {
        let data = parent();
        let parent = Parent::new(&data).unwrap();
        let mut known = digests_counted(&data).unwrap();
        let edits = vec![edit(&parent, "z", Vec::new())];
        // [3] counted as never referenced: its row's removal does not fit.
        let at = known
            .digests
            .chunks_exact(32)
            .position(|d| d == [3; 32])
            .unwrap();
        known.counts[at * 4..at * 4 + 4].copy_from_slice(&0u32.to_le_bytes());
        assert_eq!(
            digests_after(&parent, &edits, (&known.digests, &known.counts)),
            None
        );
        known.counts.pop();
        assert_eq!(
            digests_after(&parent, &edits, (&known.digests, &known.counts)),
            None
        );
    }
}
