//! What a verifying scan compares: the paths whose rows differ between the
//! manifest the journal's changes are relative to and a full scan's.
//!
//! The verifying scan runs without the captures' secrets (it never holds
//! them), so a file row that recorded zeroed secrets is compared on its size,
//! mode and mtime only: its digest is of other bytes.

use crate::manifest::{decode, ManifestRow};

/// The paths whose rows differ between `base` and `now` (present in one
/// only, or different), in path order, at most `limit` of them.
pub fn differences(base: &[u8], now: &[u8], limit: usize) -> Result<Vec<String>, String> {
    let (base, now) = (decode(base)?, decode(now)?);
    let mut out = Vec::new();
    let (mut i, mut j) = (0, 0);
    while (i < base.len() || j < now.len()) && out.len() < limit {
        let order = match (base.get(i), now.get(j)) {
            (Some(a), Some(b)) => a.path().as_bytes().cmp(b.path().as_bytes()),
            (Some(_), None) => std::cmp::Ordering::Less,
            _ => std::cmp::Ordering::Greater,
        };
        match order {
            std::cmp::Ordering::Less => {
                out.push(base[i].path().to_string());
                i += 1;
            }
            std::cmp::Ordering::Greater => {
                out.push(now[j].path().to_string());
                j += 1;
            }
            std::cmp::Ordering::Equal => {
                if !same(&base[i], &now[j]) {
                    out.push(base[i].path().to_string());
                }
                i += 1;
                j += 1;
            }
        }
    }
    Ok(out)
}

fn same(base: &ManifestRow, now: &ManifestRow) -> bool {
    match (base, now) {
        (
            ManifestRow::File {
                size,
                mode,
                mtime_ns,
                secrets: true,
                ..
            },
            ManifestRow::File {
                size: s,
                mode: m,
                mtime_ns: t,
                ..
            },
        ) => (size, mode, mtime_ns) == (s, m, t),
        _ => base == now,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::{FileFields, ManifestWriter};

    #[test]
    fn rows_that_differ_are_named_once() {
        let mut a = ManifestWriter::with_capacity(0);
        a.dir("d", 0o755);
        a.file("d/f", &[1; 32], 3, 0o644, 7);
        a.file("d/g", &[2; 32], 3, 0o644, 7);
        let fields = FileFields {
            hash: &[3; 32],
            size: 9,
            mode: 0o600,
            mtime_ns: 7,
            chunks: None,
        };
        a.file_with_chunks(
            "s",
            &fields,
            &[crate::redact::SecretMatch {
                offset: 1,
                len: 4,
                secret: 0,
            }],
        );
        let a = a.finish();
        let mut b = ManifestWriter::with_capacity(0);
        b.dir("d", 0o700);
        b.file("d/f", &[1; 32], 3, 0o644, 7);
        b.file("d/h", &[2; 32], 3, 0o644, 7);
        b.file("s", &[9; 32], 9, 0o600, 7); // other bytes: no secrets in this scan
        let b = b.finish();
        assert_eq!(differences(&a, &b, 100).unwrap(), ["d", "d/g", "d/h"]);
        assert_eq!(differences(&a, &b, 2).unwrap(), ["d", "d/g"]);
        assert!(differences(&a, &a, 100).unwrap().is_empty());
    }
}
