//! Deltas between manifests: runs of a base's rows to copy and rows to insert.

use super::rows::{bad, row_end, row_path, rows, ManifestError};

// ------------------------------------------------------------------ deltas
//
// A delta says how to build a manifest from a base manifest: runs of the base's
// rows to copy and rows to insert, in order. Binary, little-endian:
// `C start:u32 count:u32` copies base rows [start, start+count);
// `A rows:u32 bytes:u32 <rows joined by ','>` inserts rows;
// `P row:u32 bytes:u32 <patch>` inserts base row `row` patched (`rowpatch`).

/// The delta from `base` to `new` and how many rows it inserts.
///
/// Both are sorted by path (as the scan writes them), and a capture after a
/// few edits shares nearly every byte with its parent: runs of equal bytes
/// are compared in blocks and their rows counted by their separators (a
/// `],["` occurs nowhere else: a `"` inside a JSON string is escaped), so
/// only the rows around a difference are parsed. There, the row of the
/// smaller path goes first: a new one is inserted, a base one dropped (the
/// same path: the new row replaces it). A row found nowhere is inserted, so
/// the delta rebuilds `new` exactly even from rows in another order (it is
/// then merely larger).
pub fn delta(base: &[u8], new: &[u8]) -> Result<(Vec<u8>, usize), ManifestError> {
    let mut b = Cursor::new(base)?;
    let mut n = Cursor::new(new)?;
    let separator = memchr::memmem::Finder::new(b"],[\"");
    let mut delta = DeltaWriter::default();
    let mut row = 0u32;
    loop {
        let same = common_prefix(b.rest(), n.rest());
        let (count, length) = b.equal_rows(same, &separator);
        if count > 0 {
            delta.copy_run(row, count);
            row += count;
            b.advance(length)?;
            n.advance(length)?;
        }
        match (b.done(), n.done()) {
            (_, true) => break,
            (true, false) => delta.add(n.take_row()?),
            (false, false) => {
                let (old, next) = (b.row()?, n.row()?);
                match row_path(old)?.cmp(&row_path(next)?) {
                    std::cmp::Ordering::Less => {
                        b.take_row()?;
                        row += 1;
                    }
                    std::cmp::Ordering::Equal => {
                        b.take_row()?;
                        row += 1;
                        delta.add(n.take_row()?);
                    }
                    std::cmp::Ordering::Greater => delta.add(n.take_row()?),
                }
            }
        }
    }
    Ok(delta.finish())
}

/// The length of the longest common prefix of `a` and `b`: compared in
/// blocks (a `memcmp` each), then byte by byte in the block that differs.
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    const BLOCK: usize = 4096;
    let n = a.len().min(b.len());
    let mut i = 0;
    while i + BLOCK <= n && a[i..i + BLOCK] == b[i..i + BLOCK] {
        i += BLOCK;
    }
    i + a[i..n]
        .iter()
        .zip(&b[i..n])
        .position(|(x, y)| x != y)
        .unwrap_or(n - i)
}

/// A position in a manifest's rows: at a row's start, or at the closing `]`.
struct Cursor<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn new(data: &'a [u8]) -> Result<Cursor<'a>, ManifestError> {
        if data.len() < 2 || data[0] != b'[' || data[data.len() - 1] != b']' {
            return Err(bad(0, "expected a manifest array"));
        }
        Ok(Cursor { data, at: 1 })
    }

    fn end(&self) -> usize {
        self.data.len() - 1
    }

    fn done(&self) -> bool {
        self.at >= self.end()
    }

    /// The rows from here, without the closing `]`.
    fn rest(&self) -> &'a [u8] {
        &self.data[self.at.min(self.end())..self.end()]
    }

    /// Of the first `same` bytes from here (equal in the other manifest),
    /// how many whole rows they hold and their length (to the end of the
    /// last one): a row is whole when its closing `]` is among them.
    fn equal_rows(&self, same: usize, separator: &memchr::memmem::Finder) -> (u32, usize) {
        let rest = self.rest();
        let searched = &rest[..(same + 3).min(rest.len())];
        let (mut count, mut length) = (0u32, 0usize);
        for found in separator.find_iter(searched) {
            if found >= same {
                break;
            }
            count += 1;
            length = found + 1;
        }
        if same == rest.len() && !rest.is_empty() {
            // The last row, closed right before the manifest's `]`.
            count += 1;
            length = rest.len();
        }
        (count, length)
    }

    /// Move past `length` bytes that end a row, and the comma after it.
    fn advance(&mut self, length: usize) -> Result<(), ManifestError> {
        self.at += length;
        self.skip_comma()
    }

    fn skip_comma(&mut self) -> Result<(), ManifestError> {
        match self.data.get(self.at) {
            Some(b',') if self.at < self.end() => {
                self.at += 1;
                Ok(())
            }
            _ if self.at == self.end() => Ok(()),
            _ => Err(bad(self.at, "expected ',' or ']' after a row")),
        }
    }

    fn row(&self) -> Result<&'a [u8], ManifestError> {
        if self.data[self.at] != b'[' {
            return Err(bad(self.at, "expected a row"));
        }
        Ok(&self.data[self.at..row_end(self.data, self.at)?])
    }

    fn take_row(&mut self) -> Result<&'a [u8], ManifestError> {
        let row = self.row()?;
        self.at += row.len();
        self.skip_comma()?;
        Ok(row)
    }
}

/// A delta in [`apply`]'s encoding, written as its rows come: copy runs of
/// the base's rows, runs of inserted rows, patched rows.
#[derive(Default)]
pub struct DeltaWriter<'a> {
    out: Vec<u8>,
    /// The inserted run being written: pieces of rows joined by commas, and
    /// how many rows they hold.
    added: Vec<&'a [u8]>,
    added_rows: u32,
    added_total: usize,
    start: u32,
    count: u32,
}

impl<'a> DeltaWriter<'a> {
    pub fn copy(&mut self, position: u32) {
        self.copy_run(position, 1);
    }

    /// Copy `count` base rows from `start` (after what was written).
    pub fn copy_run(&mut self, start: u32, count: u32) {
        if count == 0 {
            return;
        }
        if self.count > 0 && start == self.start + self.count {
            self.count += count;
            return;
        }
        self.flush_add();
        self.flush_copy();
        (self.start, self.count) = (start, count);
    }

    pub fn add(&mut self, row: &'a [u8]) {
        self.add_joined(row, 1);
    }

    /// Insert `rows` rows given joined by commas.
    pub fn add_joined(&mut self, joined: &'a [u8], rows: u32) {
        if rows == 0 {
            return;
        }
        self.flush_copy();
        self.added.push(joined);
        self.added_rows += rows;
        self.added_total += rows as usize;
    }

    /// Base row `row` with the row patch `patch` applied.
    pub(super) fn patch(&mut self, row: u32, patch: &[u8]) {
        self.flush_add();
        self.flush_copy();
        self.out.push(b'P');
        self.out.extend_from_slice(&row.to_le_bytes());
        self.out
            .extend_from_slice(&(patch.len() as u32).to_le_bytes());
        self.out.extend_from_slice(patch);
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
            self.out.extend_from_slice(&self.added_rows.to_le_bytes());
            self.out
                .extend_from_slice(&(joined.len() as u32).to_le_bytes());
            self.out.extend_from_slice(&joined);
            self.added.clear();
            self.added_rows = 0;
        }
    }

    pub fn finish(mut self) -> (Vec<u8>, usize) {
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
    let mut patches = 0;
    for ops in chain {
        let mut runs = Vec::new();
        for_each_op(ops, |op| {
            match op {
                Op::Insert(joined) => runs.push([b"[".as_slice(), joined, b"]"].concat()),
                Op::Patch(..) => patches += 1,
                Op::Copy(..) => {}
            }
            Ok(())
        })?;
        wrapped.push(runs);
    }
    // The rows patches make, one slot per patch op: filled as the chain is
    // applied, borrowed like the rest.
    let made: Vec<std::cell::OnceCell<Vec<u8>>> =
        (0..patches).map(|_| std::cell::OnceCell::new()).collect();
    let mut slots = made.iter();
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
                Op::Patch(row, patch, at) => {
                    let old = current
                        .get(row)
                        .ok_or(bad(at, "patch of a row beyond the base"))?;
                    let row = super::rowpatch::apply(old, patch)?;
                    let slot = slots.next().ok_or(bad(at, "more patches than counted"))?;
                    next.push(slot.get_or_init(|| row));
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

/// The rows a delta inserts, as a manifest of their own (`[row,...]`), or
/// None when it patches rows of its base (their bytes are not in the
/// delta). Every row of the manifest the delta makes that is not among
/// these is a row of the base, copied.
pub fn inserted_rows(ops: &[u8]) -> Result<Option<Vec<u8>>, ManifestError> {
    let mut out = vec![b'['];
    let mut patched = false;
    for_each_op(ops, |op| {
        match op {
            Op::Insert(joined) => {
                if out.len() > 1 {
                    out.push(b',');
                }
                out.extend_from_slice(joined);
            }
            Op::Patch(..) => patched = true,
            Op::Copy(..) => {}
        }
        Ok(())
    })?;
    out.push(b']');
    Ok((!patched).then_some(out))
}

/// One operation of a delta: copy `count` rows from row `start` of the base
/// (the op at byte `at`), insert rows (joined by commas; maybe none), or
/// insert base row `row` with a row patch applied (the op at byte `at`).
pub(super) enum Op<'a> {
    Copy(usize, usize, usize),
    Insert(&'a [u8]),
    Patch(usize, &'a [u8], usize),
}

pub(super) fn for_each_op<'a>(
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
            b'P' => {
                let row = read_u32(ops, i + 1)? as usize;
                let len = read_u32(ops, i + 5)? as usize;
                let patch = ops.get(i + 9..i + 9 + len).ok_or(bad(i, "short patch"))?;
                each(Op::Patch(row, patch, i))?;
                i += 9 + len;
            }
            _ => return Err(bad(i, "unknown delta operation")),
        }
    }
    Ok(())
}
