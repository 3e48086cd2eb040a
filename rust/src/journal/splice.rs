//! The parent manifest, read where a change lands and nowhere else: its rows
//! are sorted by path bytes, so a path's place is found by bisecting the
//! bytes; and the new manifest is the parent's bytes with the changed rows
//! put in (copied around them, never decoded).
//!
//! A row starts right after `],` with `["f",`, `["d",` or `["l",` and then
//! the path's opening quote: that run can only be a row boundary, since a
//! `"` inside a JSON string is always escaped, and after a string's closing
//! quote comes `,` or `]`, never a row tag.

use std::borrow::Cow;

use blake3::hazmat::{self, HasherExt};

use crate::manifest::{row_path, ManifestError};

/// A row-aligned byte range of the parent: from a row's start to the start
/// of the row after the last one (or the closing `]`).
pub type Span = (usize, usize);

/// The parent manifest's bytes, navigated by path.
pub struct Parent<'a> {
    data: &'a [u8],
}

fn bad(at: usize, what: &'static str) -> ManifestError {
    ManifestError {
        offset: at,
        reason: what,
    }
}

impl<'a> Parent<'a> {
    pub fn new(data: &'a [u8]) -> Result<Parent<'a>, ManifestError> {
        if data.len() < 2 || data[0] != b'[' || data[data.len() - 1] != b']' {
            return Err(bad(0, "expected a manifest array"));
        }
        Ok(Parent { data })
    }

    /// Where the rows end: the closing `]`.
    pub fn end(&self) -> usize {
        self.data.len() - 1
    }

    fn is_row_start(&self, at: usize) -> bool {
        let d = self.data;
        let tag = |at: usize| {
            d.get(at..at + 6).is_some_and(|t| {
                t[0] == b'['
                    && t[1] == b'"'
                    && matches!(t[2], b'f' | b'd' | b'l')
                    && &t[3..6] == b"\",\""
            })
        };
        if at == 1 {
            return at < self.end() && tag(1);
        }
        at >= 3 && &d[at - 2..at] == b"]," && tag(at)
    }

    /// The first row start at or after `at` (the end when none).
    pub fn next_row(&self, at: usize) -> usize {
        let end = self.end();
        if at <= 1 {
            return if self.is_row_start(1) { 1 } else { end };
        }
        let mut i = at.max(3);
        while i < end {
            // The row start's `[` follows `],`: find the next `],[`.
            match self.data[i - 2..end].windows(3).position(|w| w == b"],[") {
                None => return end,
                Some(found) => {
                    let start = i + found;
                    if self.is_row_start(start) {
                        return start;
                    }
                    i = start + 1;
                }
            }
        }
        end
    }

    /// The path of the row that starts at `start`.
    pub fn path_at(&self, start: usize) -> Result<Cow<'a, str>, ManifestError> {
        row_path(&self.data[start..]).map_err(|e| ManifestError {
            offset: start + e.offset,
            reason: e.reason,
        })
    }

    /// The row tag (`f`, `d` or `l`) of the row that starts at `start`.
    pub fn tag_at(&self, start: usize) -> u8 {
        self.data[start + 2]
    }

    /// The first row whose path is at or after `target` (bytes order): its
    /// start, or the end.
    pub fn lower_bound(&self, target: &[u8]) -> Result<usize, ManifestError> {
        let (mut lo, mut hi) = (self.next_row(1), self.end());
        // Rows before `lo` are before the target, rows from `hi` on are not.
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let probe = self.next_row(mid.max(lo + 1)).min(hi);
            if probe == hi {
                // No row starts in [mid, hi): step from `lo`.
                if self.path_at(lo)?.as_bytes() >= target {
                    return Ok(lo);
                }
                lo = self.next_row(lo + 1).min(hi);
            } else if self.path_at(probe)?.as_bytes() >= target {
                hi = probe;
            } else {
                lo = self.next_row(probe + 1).min(hi);
            }
        }
        Ok(lo)
    }

    /// The row of exactly `path`: its span and tag.
    pub fn find(&self, path: &str) -> Result<Option<(Span, u8)>, ManifestError> {
        let start = self.lower_bound(path.as_bytes())?;
        if start == self.end() || self.path_at(start)? != path {
            return Ok(None);
        }
        Ok(Some((
            (start, self.next_row(start + 1)),
            self.tag_at(start),
        )))
    }

    /// The empty span where `path`'s row would go.
    pub fn place(&self, path: &str) -> Result<Span, ManifestError> {
        let at = self.lower_bound(path.as_bytes())?;
        Ok((at, at))
    }

    /// The rows strictly below the directory `dir` ("" is the root).
    pub fn below(&self, dir: &str) -> Result<Span, ManifestError> {
        if dir.is_empty() {
            return Ok((self.next_row(1), self.end()));
        }
        // Every path below `dir` starts with `dir/`, and `0` follows `/`.
        let start = self.lower_bound(format!("{dir}/").as_bytes())?;
        let stop = self.lower_bound(format!("{dir}0").as_bytes())?;
        Ok((start, stop.max(start)))
    }

    /// The names of the rows directly in `dir`, with their tags (each
    /// subdirectory's own rows skipped by bisection).
    pub fn children(&self, dir: &str) -> Result<Vec<(String, u8)>, ManifestError> {
        let (mut at, stop) = self.below(dir)?;
        let prefix = if dir.is_empty() { 0 } else { dir.len() + 1 };
        let mut out = Vec::new();
        while at < stop {
            let path = self.path_at(at)?;
            match path[prefix..].find('/') {
                // Inside a subdirectory: skip to the end of its rows.
                Some(slash) => {
                    let child = &path[..prefix + slash];
                    at = self
                        .lower_bound(format!("{child}0").as_bytes())?
                        .max(self.next_row(at + 1));
                }
                None => {
                    out.push((path[prefix..].to_string(), self.tag_at(at)));
                    at = self.next_row(at + 1);
                }
            }
        }
        Ok(out)
    }

    /// The rows of `span`, joined by commas (no brackets).
    pub fn rows(&self, span: Span) -> &'a [u8] {
        let (start, stop) = span;
        if start >= stop {
            return &[];
        }
        // Up to the next row's start less its comma (or up to the `]`).
        let stop = if stop == self.end() { stop } else { stop - 1 };
        &self.data[start..stop]
    }
}

/// One change of the parent: the rows of `span` replaced by `rows` (encoded
/// rows joined by commas, possibly none); `key` is the first path those rows
/// may hold, which orders edits that start at one place.
#[derive(Debug)]
pub struct Edit {
    pub span: Span,
    pub key: String,
    pub rows: Vec<u8>,
}

/// Put `edits` in the order [`pieces`] and [`delta`] take them: by where
/// they start in the parent, then by the first path their rows may hold.
pub fn sort_edits(edits: &mut [Edit]) {
    edits.sort_by(|a, b| (a.span.0, a.key.as_bytes()).cmp(&(b.span.0, b.key.as_bytes())));
}

/// The pieces of the new manifest, in order: the parent's rows between the
/// edits (sorted by [`sort_edits`]) and the edits' rows (None when two edits
/// overlap: the parent was read inconsistently).
pub fn pieces<'p>(parent: &Parent<'p>, edits: &'p [Edit]) -> Option<Vec<&'p [u8]>> {
    let mut out: Vec<&[u8]> = Vec::with_capacity(edits.len() * 2 + 1);
    let mut at = parent.next_row(1);
    for edit in edits.iter() {
        let (start, stop) = edit.span;
        if start < at {
            return None;
        }
        out.push(parent.rows((at, start)));
        out.push(&edit.rows);
        at = stop.max(start);
    }
    out.push(parent.rows((at, parent.end())));
    out.retain(|p| !p.is_empty());
    Some(out)
}

/// The rows of the parent from `start` up to `stop` (a row-aligned span).
fn rows_in(parent: &Parent, (start, stop): Span) -> u32 {
    if start >= stop {
        return 0;
    }
    // Each row after the first starts right after `],` with a row tag: one
    // pass for `],["`, then the tag and the path's quote are checked.
    let bytes = &parent.data[start..stop];
    let later = memchr::memmem::find_iter(bytes, b"],[\"")
        .filter(|&at| {
            bytes
                .get(at + 4..at + 8)
                .is_some_and(|t| matches!(t[0], b'f' | b'd' | b'l') && &t[1..] == b"\",\"")
        })
        .count();
    1 + later as u32
}

/// The store's delta (`manifest::delta`'s encoding: copy runs of the
/// parent's rows, inserted rows) from the parent to the manifest `edits`
/// (sorted by [`sort_edits`]) make, and how many rows it inserts:
/// what the store would work out by indexing every row of both.
pub fn delta(parent: &Parent, edits: &[Edit]) -> (Vec<u8>, usize) {
    let mut out = crate::manifest::DeltaWriter::default();
    let (mut row, mut at) = (0u32, parent.next_row(1));
    for edit in edits {
        let kept = rows_in(parent, (at, edit.span.0));
        out.copy_run(row, kept);
        row += kept + rows_in(parent, edit.span);
        at = edit.span.1.max(edit.span.0);
        if !edit.rows.is_empty() {
            let wrapped = [b"[".as_slice(), &edit.rows, b"]"].concat();
            let added = crate::manifest::rows(&wrapped).map_or(0, |r| r.len());
            out.add_joined(&edit.rows, added as u32);
        }
    }
    out.copy_run(row, rows_in(parent, (at, parent.end())));
    out.finish()
}

/// The manifest of `pieces`: `[`, the pieces joined by commas, `]`, written
/// into `out` (exactly [`joined_len`] bytes) the plain way: what the tests
/// hold [`join_hashed`] and the splices to.
#[cfg(test)]
pub fn join_into(pieces: &[&[u8]], out: &mut [u8]) {
    out[0] = b'[';
    let mut at = 1;
    for (i, piece) in pieces.iter().enumerate() {
        if i > 0 {
            out[at] = b',';
            at += 1;
        }
        out[at..at + piece.len()].copy_from_slice(piece);
        at += piece.len();
    }
    out[at] = b']';
}

pub fn joined_len(pieces: &[&[u8]]) -> usize {
    2 + pieces.iter().map(|p| p.len()).sum::<usize>() + pieces.len().saturating_sub(1)
}

/// The bytes one thread copies and then hashes at a time: a subtree of the
/// BLAKE3 tree, hashed while its bytes are in that thread's cache.
const LEAF: usize = 1 << 20;

/// The manifest of `pieces` (`[`, the pieces joined by commas, `]`) written
/// into `out` (exactly [`joined_len`] bytes) and its BLAKE3 hash, in one pass on the
/// current rayon pool: the output is split along BLAKE3's own subtree
/// boundaries, each leaf copied and then hashed by one thread, and the
/// leaves' chaining values merged up to the root (`blake3::hazmat`). So the
/// parent's bytes (~180 MB at a million entries) are read from memory once,
/// not once to copy and again to hash.
pub fn join_hashed(pieces: &[&[u8]], out: &mut [u8]) -> [u8; 32] {
    let source = Joined::new(pieces);
    debug_assert_eq!(source.len, out.len());
    if out.len() <= LEAF {
        source.copy(0, out);
        return *blake3::hash(out).as_bytes();
    }
    let split = hazmat::left_subtree_len(out.len() as u64) as usize;
    let (left, right) = out.split_at_mut(split);
    let (l, r) = rayon::join(
        || subtree(&source, 0, left),
        || subtree(&source, split, right),
    );
    *hazmat::merge_subtrees_root(&l, &r, hazmat::Mode::Hash).as_bytes()
}

/// The chaining value of the subtree of the joined bytes at `at`, `out`
/// long (a valid BLAKE3 subtree), copied into `out` on the way.
fn subtree(source: &Joined, at: usize, out: &mut [u8]) -> hazmat::ChainingValue {
    if out.len() <= LEAF {
        source.copy(at, out);
        return blake3::Hasher::new()
            .set_input_offset(at as u64)
            .update(out)
            .finalize_non_root();
    }
    let split = hazmat::left_subtree_len(out.len() as u64) as usize;
    let (left, right) = out.split_at_mut(split);
    let (l, r) = rayon::join(
        || subtree(source, at, left),
        || subtree(source, at + split, right),
    );
    hazmat::merge_subtrees_non_root(&l, &r, hazmat::Mode::Hash)
}

/// The manifest of some pieces (`[`, the pieces joined by commas, `]`), as
/// the parts its bytes come from: what [`join_hashed`] copies.
struct Joined<'a> {
    parts: Vec<&'a [u8]>,
    /// Where each part begins in the joined bytes.
    starts: Vec<usize>,
    len: usize,
}

impl<'a> Joined<'a> {
    fn new(pieces: &[&'a [u8]]) -> Joined<'a> {
        let mut parts: Vec<&'a [u8]> = Vec::with_capacity(pieces.len() * 2 + 1);
        parts.push(b"[");
        for (i, piece) in pieces.iter().enumerate() {
            if i > 0 {
                parts.push(b",");
            }
            parts.push(piece);
        }
        parts.push(b"]");
        let mut starts = Vec::with_capacity(parts.len());
        let mut len = 0;
        for part in &parts {
            starts.push(len);
            len += part.len();
        }
        Joined { parts, starts, len }
    }

    /// Copy the joined bytes from `at` on into the whole of `out`.
    fn copy(&self, at: usize, out: &mut [u8]) {
        let mut i = self.starts.partition_point(|&start| start <= at) - 1;
        let mut done = 0;
        while done < out.len() {
            let part = self.parts[i];
            let from = at + done - self.starts[i];
            let n = (part.len() - from).min(out.len() - done);
            out[done..done + n].copy_from_slice(&part[from..from + n]);
            done += n;
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one-pass join writes what `join_into` writes and hashes it as
    /// `blake3::hash` does, around every leaf and subtree boundary.
    #[test]
    fn a_hashed_join_is_the_join_and_its_hash() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        let bytes: Vec<u8> = (0..(7 * LEAF + 4099) as u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for total in [
            0,
            1,
            1023,
            1024,
            1025,
            LEAF - 3,
            LEAF - 2,
            LEAF + 5,
            2 * LEAF,
            7 * LEAF + 4097,
        ] {
            for cuts in [1, 2, 5] {
                let step = (total / cuts).max(1);
                let pieces: Vec<&[u8]> = (0..cuts)
                    .map(|i| &bytes[(i * step).min(total)..((i + 1) * step).min(total)])
                    .filter(|p| !p.is_empty())
                    .collect();
                let len = joined_len(&pieces);
                let (mut plain, mut hashed) = (vec![0u8; len], vec![1u8; len]);
                join_into(&pieces, &mut plain);
                let fingerprint = pool.install(|| join_hashed(&pieces, &mut hashed));
                assert!(plain == hashed, "{total} bytes in {cuts} pieces");
                assert_eq!(&fingerprint, blake3::hash(&plain).as_bytes());
            }
        }
    }
    use crate::manifest::ManifestWriter;

    fn manifest(rows: &[(&str, u8)]) -> Vec<u8> {
        let mut w = ManifestWriter::with_capacity(0);
        for (path, tag) in rows {
            match tag {
                b'd' => w.dir(*path, 0o755),
                b'l' => w.symlink(*path, "t"),
                _ => w.file(*path, &[1; 32], 1, 0o644, 5),
            }
        }
        w.finish()
    }

    /// Paths whose byte order differs from a tree walk's, and names that
    /// hold the row boundary's own bytes.
    const TREE: &[(&str, u8)] = &[
        ("a", b'd'),
        ("a-b", b'f'),
        ("a.c", b'l'),
        ("a/],[\"f\",\"x", b'f'),
        ("a/b", b'd'),
        ("a/b/c", b'f'),
        ("a/z", b'f'),
        ("a0", b'f'),
        ("b", b'f'),
        ("é\"q", b'f'),
    ];

    #[test]
    fn bisection_finds_every_row_and_every_gap() {
        let data = manifest(TREE);
        let parent = Parent::new(&data).unwrap();
        let all = crate::manifest::rows(&data).unwrap();
        let mut starts = Vec::new();
        let mut at = parent.next_row(1);
        while at < parent.end() {
            starts.push(at);
            at = parent.next_row(at + 1);
        }
        assert_eq!(starts.len(), all.len());
        for ((path, tag), start) in TREE.iter().zip(&starts) {
            assert_eq!(
                parent.find(path).unwrap(),
                Some(((*start, parent.next_row(start + 1)), *tag))
            );
            assert_eq!(parent.path_at(*start).unwrap(), *path);
        }
        assert_eq!(parent.find("a/a").unwrap(), None);
        assert_eq!(parent.place("a/a").unwrap().0, starts[4]); // after "a/]"
        assert_eq!(parent.place("zz").unwrap().0, starts[9]); // before "é"
        assert_eq!(parent.place("\u{10ffff}").unwrap().0, parent.end());
        assert_eq!(parent.below("a").unwrap(), (starts[3], starts[7]));
        assert_eq!(parent.below("a/b").unwrap(), (starts[5], starts[6]));
        assert_eq!(parent.below("b").unwrap().0, parent.below("b").unwrap().1);
        let names: Vec<String> = parent
            .children("")
            .unwrap()
            .into_iter()
            .map(|c| c.0)
            .collect();
        assert_eq!(names, ["a", "a-b", "a.c", "a0", "b", "é\"q"]);
        let names: Vec<String> = parent
            .children("a")
            .unwrap()
            .into_iter()
            .map(|c| c.0)
            .collect();
        assert_eq!(names, ["],[\"f\",\"x", "b", "z"]);
    }

    #[test]
    fn a_splice_equals_the_manifest_written_whole() {
        let data = manifest(TREE);
        let parent = Parent::new(&data).unwrap();
        let row = |path: &str, tag: u8| {
            let m = manifest(&[(path, tag)]);
            m[1..m.len() - 1].to_vec()
        };
        let (b_row, _) = parent.find("a/b").unwrap().unwrap();
        let mut edits = vec![
            // a/b becomes a file: its row and its subtree go.
            Edit {
                span: b_row,
                key: "a/b".into(),
                rows: row("a/b", b'f'),
            },
            Edit {
                span: parent.below("a/b").unwrap(),
                key: "a/b/".into(),
                rows: Vec::new(),
            },
            Edit {
                span: parent.place("a/aa").unwrap(),
                key: "a/aa".into(),
                rows: row("a/aa", b'f'),
            },
            Edit {
                span: parent.find("b").unwrap().unwrap().0,
                key: "b".into(),
                rows: Vec::new(),
            },
            Edit {
                span: parent.place("zz").unwrap(),
                key: "zz".into(),
                rows: row("zz", b'l'),
            },
        ];
        sort_edits(&mut edits);
        let parts = pieces(&parent, &edits).unwrap();
        let mut out = vec![0; joined_len(&parts)];
        join_into(&parts, &mut out);
        let mut expected: Vec<(&str, u8)> = TREE
            .iter()
            .copied()
            .filter(|(p, _)| !matches!(*p, "a/b" | "a/b/c" | "b"))
            .collect();
        expected.extend([("a/b", b'f'), ("a/aa", b'f'), ("zz", b'l')]);
        expected.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        assert_eq!(
            String::from_utf8(out.clone()).unwrap(),
            String::from_utf8(manifest(&expected)).unwrap()
        );
        // The store's delta says the same: applied to the parent it gives
        // the spliced manifest, as the store's own delta does.
        let (ops, added) = delta(&parent, &edits);
        assert_eq!(added, 3);
        assert_eq!(crate::manifest::apply(&data, &ops).unwrap(), out);
        let (_, store_added) = crate::manifest::delta(&data, &out).unwrap();
        assert_eq!(store_added, added);
    }

    #[test]
    fn splices_of_everything_and_of_nothing_and_overlaps() {
        let data = manifest(TREE);
        let parent = Parent::new(&data).unwrap();
        let row = |path: &str, tag: u8| {
            let m = manifest(&[(path, tag)]);
            m[1..m.len() - 1].to_vec()
        };
        // Everything removed, and nothing at all.
        let gone = vec![Edit {
            span: parent.below("").unwrap(),
            key: String::new(),
            rows: Vec::new(),
        }];
        assert_eq!(joined_len(&pieces(&parent, &gone).unwrap()), 2);
        let empty = manifest(&[]);
        let parent = Parent::new(&empty).unwrap();
        assert_eq!(parent.next_row(1), parent.end());
        assert_eq!(parent.children("").unwrap(), vec![]);
        let mut overlap = vec![
            Edit {
                span: (1, 1),
                key: "b".into(),
                rows: row("b", b'f'),
            },
            Edit {
                span: (1, 1),
                key: "a".into(),
                rows: row("a", b'f'),
            },
        ];
        sort_edits(&mut overlap);
        let joined = pieces(&parent, &overlap).unwrap().concat();
        assert_eq!(
            joined,
            [row("a", b'f'), row("b", b'f')].concat(),
            "in path order"
        );
        let data = manifest(TREE);
        let parent = Parent::new(&data).unwrap();
        let mut overlap = vec![
            Edit {
                span: parent.below("a").unwrap(),
                key: "a/".into(),
                rows: Vec::new(),
            },
            Edit {
                span: parent.find("a/b").unwrap().unwrap().0,
                key: "a/b".into(),
                rows: Vec::new(),
            },
        ];
        sort_edits(&mut overlap);
        assert!(pieces(&parent, &overlap).is_none());
    }
}
