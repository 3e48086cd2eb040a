//! Long manifest rows stored as patches of the row they replace.
//!
//! A file stored as chunks carries its chunk list in its manifest row: 4,096
//! chunks (a 256 MiB file) make a row of about 290 KB. A small edit changes a
//! chunk or two, yet a delta that inserts the new row whole stores all of it
//! again. So a delta's inserted row longer than [`LONG_ROW`] that replaces a
//! row of the base with the same path is stored as a patch of that row (op
//! `P`): the byte ranges it shares with the old row, copied, and the bytes it
//! does not, given. A 4 KiB insertion in a 256 MiB file then adds about 200
//! bytes to the manifest instead of 290 KB.
//!
//! Encoding (little-endian), after the delta op byte `P`:
//! `base_row:u32 len:u32 <len bytes of patch>`; the patch is a sequence of
//! `c offset:u32 count:u32` (copy bytes of the old row) and
//! `i count:u32 <count bytes>` (insert bytes).

use std::collections::HashMap;

use super::delta::{for_each_op, DeltaWriter, Op};
use super::rows::{bad, row_path, rows, ManifestError};

/// Inserted rows at least this long are stored as patches when they can be.
pub const LONG_ROW: usize = 4096;

/// A piece of a new row at least this long is looked up in the old row (a
/// chunk list item is 65 to 75 bytes; shorter pieces are given).
const MIN_COPY: usize = 32;

/// The patch that makes `new` from `old`, when it is less than half as long
/// as `new`.
pub fn encode(old: &[u8], new: &[u8]) -> Option<Vec<u8>> {
    let mut at_in_old: HashMap<&[u8], usize> = HashMap::new();
    let mut offset = 0;
    for piece in old.split_inclusive(|&b| b == b',') {
        if piece.len() >= MIN_COPY {
            at_in_old.entry(piece).or_insert(offset);
        }
        offset += piece.len();
    }
    let mut out = PatchWriter::default();
    for piece in new.split_inclusive(|&b| b == b',') {
        if out.extends_copy(old, piece) {
            continue;
        }
        match at_in_old.get(piece) {
            Some(&at) if piece.len() >= MIN_COPY => out.copy(at, piece.len()),
            _ => out.insert(piece),
        }
    }
    let patch = out.finish();
    (patch.len() * 2 < new.len()).then_some(patch)
}

#[derive(Default)]
struct PatchWriter {
    out: Vec<u8>,
    copy: Option<(usize, usize)>,
    given: Vec<u8>,
}

impl PatchWriter {
    /// Grow the current copy when `piece` is what follows it in `old`.
    fn extends_copy(&mut self, old: &[u8], piece: &[u8]) -> bool {
        let Some((start, count)) = &mut self.copy else {
            return false;
        };
        let next = *start + *count;
        if old.get(next..next + piece.len()) == Some(piece) {
            *count += piece.len();
            return true;
        }
        false
    }

    fn copy(&mut self, start: usize, count: usize) {
        self.flush();
        self.copy = Some((start, count));
    }

    fn insert(&mut self, piece: &[u8]) {
        self.flush_copy();
        self.given.extend_from_slice(piece);
    }

    fn flush_copy(&mut self) {
        if let Some((start, count)) = self.copy.take() {
            self.out.push(b'c');
            self.out.extend_from_slice(&(start as u32).to_le_bytes());
            self.out.extend_from_slice(&(count as u32).to_le_bytes());
        }
    }

    fn flush(&mut self) {
        self.flush_copy();
        if !self.given.is_empty() {
            self.out.push(b'i');
            self.out
                .extend_from_slice(&(self.given.len() as u32).to_le_bytes());
            self.out.append(&mut self.given);
        }
    }

    fn finish(mut self) -> Vec<u8> {
        self.flush();
        self.out
    }
}

/// The row `patch` makes from `old`.
pub fn apply(old: &[u8], patch: &[u8]) -> Result<Vec<u8>, ManifestError> {
    let mut out = Vec::with_capacity(old.len() + 64);
    let mut i = 0;
    while i < patch.len() {
        let word = |at: usize| -> Result<usize, ManifestError> {
            let bytes = patch.get(at..at + 4).ok_or(bad(at, "short row patch"))?;
            Ok(u32::from_le_bytes(bytes.try_into().expect("4 bytes")) as usize)
        };
        match patch[i] {
            b'c' => {
                let (start, count) = (word(i + 1)?, word(i + 5)?);
                let copied = old
                    .get(start..start + count)
                    .ok_or(bad(i, "row patch copies beyond the old row"))?;
                out.extend_from_slice(copied);
                i += 9;
            }
            b'i' => {
                let count = word(i + 1)?;
                let given = patch
                    .get(i + 5..i + 5 + count)
                    .ok_or(bad(i, "short row patch insert"))?;
                out.extend_from_slice(given);
                i += 5 + count;
            }
            _ => return Err(bad(i, "unknown row patch operation")),
        }
    }
    Ok(out)
}

/// Whether the delta `ops` inserts a row of at least [`LONG_ROW`] bytes (then
/// [`compact_delta`] may shorten it).
pub fn delta_inserts_long_rows(ops: &[u8]) -> Result<bool, ManifestError> {
    let mut long = false;
    for_each_op(ops, |op| {
        if let Op::Insert(joined) = op {
            long |= joined.len() >= LONG_ROW && longest_row(joined)? >= LONG_ROW;
        }
        Ok(())
    })?;
    Ok(long)
}

fn longest_row(joined: &[u8]) -> Result<usize, ManifestError> {
    let wrapped = [b"[".as_slice(), joined, b"]"].concat();
    Ok(rows(&wrapped)?.iter().map(|r| r.len()).max().unwrap_or(0))
}

/// The delta `ops` (against the manifest `base`) with each inserted row of
/// at least [`LONG_ROW`] bytes that replaces a base row of the same path,
/// the rows skipped between its copy runs, stored as a patch of that row
/// when shorter. Returns the new delta and the rows it still inserts whole.
pub fn compact_delta(base: &[u8], ops: &[u8]) -> Result<(Vec<u8>, usize), ManifestError> {
    let base_rows = rows(base)?;
    let mut parsed = Vec::new();
    for_each_op(ops, |op| {
        parsed.push(op);
        Ok(())
    })?;
    // Each inserted run wrapped as a manifest, so `rows` reads it.
    let runs: Vec<Vec<u8>> = parsed
        .iter()
        .filter_map(|op| match op {
            Op::Insert(joined) => Some([b"[".as_slice(), joined, b"]"].concat()),
            _ => None,
        })
        .collect();
    let mut runs = runs.iter();
    let mut out = DeltaWriter::default();
    let mut next_base = 0usize;
    for (i, op) in parsed.iter().enumerate() {
        match op {
            Op::Copy(start, count, _) => {
                out.copy_run(*start as u32, *count as u32);
                next_base = start + count;
            }
            Op::Patch(row, patch, _) => {
                out.patch(*row as u32, patch);
                next_base = next_base.max(row + 1);
            }
            Op::Insert(_) => {
                // The base rows this run replaces: up to the next copy.
                let skipped_end = parsed[i + 1..]
                    .iter()
                    .find_map(|op| match op {
                        Op::Copy(start, _, _) => Some(*start),
                        _ => None,
                    })
                    .unwrap_or(base_rows.len())
                    .max(next_base);
                let replaced = long_rows_by_path(&base_rows, next_base..skipped_end)?;
                let run = runs.next().expect("one wrapped run per insert");
                for row in rows(run)? {
                    let patch = match replaced.get(&row_path(row)?) {
                        Some(&at) if row.len() >= LONG_ROW => {
                            encode(base_rows[at], row).map(|patch| (at, patch))
                        }
                        _ => None,
                    };
                    match patch {
                        Some((at, patch)) => out.patch(at as u32, &patch),
                        None => out.add(row),
                    }
                }
            }
        }
    }
    Ok(out.finish())
}

/// The rows of `range` at least [`LONG_ROW`] long, by path.
fn long_rows_by_path<'a>(
    rows: &[&'a [u8]],
    range: std::ops::Range<usize>,
) -> Result<HashMap<std::borrow::Cow<'a, str>, usize>, ManifestError> {
    let mut out = HashMap::new();
    for at in range {
        if let Some(row) = rows.get(at).filter(|r| r.len() >= LONG_ROW) {
            out.insert(row_path(row)?, at);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(items: &[u32]) -> Vec<u8> {
        let text: Vec<String> = items
            .iter()
            .map(|n| format!("{}{}", crate::hash::to_hex(&[*n as u8; 32]), 65536 + n))
            .collect();
        format!(
            "[\"f\",\"big\",\"{}\",1,420,5,\"{}\"]",
            "ab".repeat(32),
            text.join(",")
        )
        .into_bytes()
    }

    #[test]
    fn an_insertion_costs_its_own_bytes() {
        let old = list(&(0..200).collect::<Vec<_>>());
        let mut items: Vec<u32> = (0..200).collect();
        items.insert(100, 250);
        let new = list(&items);
        let patch = encode(&old, &new).expect("a patch");
        assert!(patch.len() < 120, "{}", patch.len());
        assert_eq!(apply(&old, &patch).unwrap(), new);
    }

    #[test]
    fn scattered_changes_truncation_and_growth_round_trip() {
        let old = list(&(0..300).collect::<Vec<_>>());
        let mut scattered: Vec<u32> = (0..300).collect();
        for at in [3, 77, 150, 299] {
            scattered[at] = 1000 + at as u32;
        }
        let shorter: Vec<u32> = (0..180).collect();
        let longer: Vec<u32> = (0..320).collect();
        for items in [scattered, shorter, longer] {
            let new = list(&items);
            let patch = encode(&old, &new).expect("a patch");
            assert_eq!(apply(&old, &patch).unwrap(), new);
        }
    }

    #[test]
    fn an_unrelated_row_is_not_patched() {
        let old = list(&(0..100).collect::<Vec<_>>());
        let new = list(&(100..200).collect::<Vec<_>>());
        assert!(encode(&old, &new).is_none());
    }

    #[test]
    fn a_damaged_patch_is_an_error() {
        let old = list(&(0..10).collect::<Vec<_>>());
        assert!(apply(&old, b"c\xff\xff\x00\x00\x01\x00\x00\x00").is_err());
        assert!(apply(&old, b"i\x09\x00\x00\x00ab").is_err());
        assert!(apply(&old, b"x").is_err());
    }

    /// Rows `a`, `big` (the chunk list of `big`) and `z`.
    fn manifest(big: &[u32]) -> Vec<u8> {
        let small = |path: &str| format!(r#"["f","{path}","{}",1,420,5]"#, "ab".repeat(32));
        let big = String::from_utf8(list(big)).unwrap();
        format!("[{},{big},{}]", small("a"), small("z")).into_bytes()
    }

    #[test]
    fn a_delta_stores_a_changed_long_row_as_a_patch_and_applies_it() {
        let v1 = manifest(&(0..200).collect::<Vec<_>>());
        let mut items: Vec<u32> = (0..200).collect();
        items.insert(120, 777);
        let v2 = manifest(&items);
        items.truncate(150);
        let v3 = manifest(&items);
        let (ops12, added) = crate::manifest::delta(&v1, &v2).unwrap();
        assert_eq!(added, 1);
        assert!(delta_inserts_long_rows(&ops12).unwrap());
        let (compact12, added) = compact_delta(&v1, &ops12).unwrap();
        assert_eq!(added, 0);
        assert!(compact12.len() < 300, "{}", compact12.len());
        assert_eq!(crate::manifest::apply(&v1, &compact12).unwrap(), v2);
        let (ops23, _) = crate::manifest::delta(&v2, &v3).unwrap();
        let (compact23, _) = compact_delta(&v2, &ops23).unwrap();
        let chain = [compact12.as_slice(), compact23.as_slice()];
        assert_eq!(crate::manifest::apply_chain(&v1, &chain).unwrap(), v3);
    }

    #[test]
    fn a_new_long_row_or_a_short_change_is_inserted_whole() {
        let v1 = manifest(&(0..3).collect::<Vec<_>>());
        let v2 = manifest(&(0..200).collect::<Vec<_>>());
        let (ops, _) = crate::manifest::delta(&v1, &v2).unwrap();
        // The old row is short: nothing to patch from.
        let (compact, added) = compact_delta(&v1, &ops).unwrap();
        assert_eq!((compact.as_slice(), added), (ops.as_slice(), 1));
        let (ops, _) = crate::manifest::delta(&v2, &v1).unwrap();
        assert!(!delta_inserts_long_rows(&ops).unwrap());
    }
}
