//! The walk's rows in the order of their full paths, and which directories
//! an include list keeps.

use std::collections::HashSet;

use rayon::prelude::*;

use crate::walk::{Batch, FileSlot, Kind};

/// A manifest row in the making: an entry of a walk batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct RowRef {
    pub(super) batch: u32,
    pub(super) entry: u32,
}

/// The walk's batches, and their entries in the order of their full paths.
pub(super) struct Rows {
    pub(super) batches: Vec<Batch>,
    pub(super) order: Vec<RowRef>,
}

/// File rows of the manifest (every kept file that did not vanish).
pub(super) fn file_rows(batches: &[Batch]) -> u64 {
    batches
        .iter()
        .flat_map(|b| b.entries.iter())
        .filter(|e| matches!(&e.kind, Kind::File(slot) if !slot.vanished))
        .count() as u64
}

impl Rows {
    /// Batches whose rows are never encoded nor cached (a witnessed scan's):
    /// no order is made, so `order` stays empty.
    pub(super) fn unordered(batches: Vec<Batch>) -> Rows {
        Rows {
            batches,
            order: Vec::new(),
        }
    }

    /// Every file slot, in no particular order.
    pub(super) fn files_mut(&mut self) -> impl Iterator<Item = &mut FileSlot> {
        self.batches
            .iter_mut()
            .flat_map(|b| b.entries.iter_mut())
            .filter_map(|e| match &mut e.kind {
                Kind::File(slot) => Some(slot),
                _ => None,
            })
    }

    pub(super) fn path(&self, r: RowRef, out: &mut String) {
        let batch = &self.batches[r.batch as usize];
        join_path(
            &batch.dir,
            batch.name(&batch.entries[r.entry as usize]),
            out,
        );
    }
}

/// `dir/name` (`name` in the root) into `out`.
pub(super) fn join_path(dir: &str, name: &str, out: &mut String) {
    out.clear();
    if !dir.is_empty() {
        out.push_str(dir);
        out.push('/');
    }
    out.push_str(name);
}

/// The walk's per-directory batches with the order of their entries by
/// full path bytes, without comparing whole paths: each directory's children
/// are sorted by name, a subdirectory taking two places, its own row at
/// `name` and its subtree at `name/` (every path below it starts with
/// `name/`, and `/` sorts where it sorts in the full paths), and the subtrees
/// are expanded depth first. (A global sort of 100k deep paths spent most of
/// its time in `memcmp` over their shared prefixes.) No entry moves: the
/// order is a list of indexes.
pub(super) fn in_path_order(mut batches: Vec<Batch>) -> Rows {
    batches.par_sort_unstable_by(|a, b| a.dir.cmp(&b.dir));
    let find = |dir: &str| {
        batches
            .binary_search_by(|b| b.dir.as_str().cmp(dir))
            .ok()
            .map(|i| i as u32)
    };
    // Every batch's plan, on every core: its rows and subtrees in order, each
    // subtree with its batch found (an empty or vanished directory has none).
    let plans: Vec<Vec<Item>> = batches
        .par_iter()
        .map(|batch| {
            let mut child = String::new();
            sorted(batch)
                .filter_map(|(entry, subtree)| {
                    if !subtree {
                        return Some(Item::Row(entry));
                    }
                    join_path(
                        &batch.dir,
                        batch.name(&batch.entries[entry as usize]),
                        &mut child,
                    );
                    find(&child).map(Item::Below)
                })
                .collect()
        })
        .collect();
    // Then only the expansion, depth first, is sequential.
    let total = batches.iter().map(|b| b.entries.len()).sum();
    let mut order: Vec<RowRef> = Vec::with_capacity(total);
    let mut stack: Vec<(u32, usize)> = find("").map(|b| (b, 0)).into_iter().collect();
    while let Some((batch, at)) = stack.last_mut() {
        let batch = *batch;
        let Some(&item) = plans[batch as usize].get(*at) else {
            stack.pop();
            continue;
        };
        *at += 1;
        match item {
            Item::Row(entry) => order.push(RowRef { batch, entry }),
            Item::Below(below) => stack.push((below, 0)),
        }
    }
    drop(plans);
    let rows = Rows { batches, order };
    debug_assert!(
        {
            let (mut a, mut b) = (String::new(), String::new());
            rows.order.windows(2).all(|w| {
                rows.path(w[0], &mut a);
                rows.path(w[1], &mut b);
                a < b
            })
        },
        "rows in path order"
    );
    rows
}

/// `name` (+ "/" for a subtree) compared as bytes.
fn cmp_keys(a: (&[u8], bool), b: (&[u8], bool)) -> std::cmp::Ordering {
    use std::cmp::Ordering::{Equal, Greater, Less};
    let common = a.0.len().min(b.0.len());
    match a.0[..common].cmp(&b.0[..common]) {
        Equal => {}
        other => return other,
    }
    // One name is a prefix of the other (names hold no "/"): what follows
    // the shorter one is its subtree's "/" or nothing.
    match a.0.len().cmp(&b.0.len()) {
        Equal => a.1.cmp(&b.1),
        Less if a.1 => b'/'.cmp(&b.0[common]),
        Less => Less,
        Greater if b.1 => a.0[common].cmp(&b'/'),
        Greater => Greater,
    }
}

/// A batch's rows and subtrees in order: (entry index, is the subtree).
fn sorted(batch: &Batch) -> std::vec::IntoIter<(u32, bool)> {
    let mut items = Vec::with_capacity(batch.entries.len() + batch.entries.len() / 8);
    for (i, entry) in batch.entries.iter().enumerate() {
        if matches!(entry.kind, Kind::Dir { .. }) {
            items.push((i as u32, true));
        }
        items.push((i as u32, false));
    }
    let key =
        |&(i, subtree): &(u32, bool)| (batch.name(&batch.entries[i as usize]).as_bytes(), subtree);
    items.sort_unstable_by(|a, b| cmp_keys(key(a), key(b)));
    items.into_iter()
}

/// An item of a batch's plan: a row (its entry), or the subtree below a
/// directory entry (the batch listing it).
#[derive(Clone, Copy)]
enum Item {
    Row(u32),
    Below(u32),
}

/// With a non-empty include list: keep a directory only if the list takes it
/// or it holds a kept entry. `rows` is sorted, so a parent precedes its children.
pub(super) fn keep_dirs_holding_entries(rows: &mut Rows) {
    let mut needed: HashSet<String> = HashSet::new();
    let mut path = String::new();
    for &r in &rows.order {
        let keeps = match rows.batches[r.batch as usize].entries[r.entry as usize].kind {
            Kind::Dir { included, .. } => included,
            _ => true,
        };
        if !keeps {
            continue;
        }
        rows.path(r, &mut path);
        let mut current = path.as_str();
        while let Some(slash) = current.rfind('/') {
            current = &current[..slash];
            if !needed.insert(current.to_string()) {
                break;
            }
        }
    }
    let Rows { batches, order } = rows;
    order.retain(|r| {
        let batch = &batches[r.batch as usize];
        let entry = &batch.entries[r.entry as usize];
        match entry.kind {
            Kind::Dir { included, .. } => {
                let mut path = String::new();
                join_path(&batch.dir, batch.name(entry), &mut path);
                included || needed.contains(&path)
            }
            _ => true,
        }
    });
}
