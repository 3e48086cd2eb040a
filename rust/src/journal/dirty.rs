//! What changed since the last capture, as the change journal records it:
//! per directory (its path from the root, "" for the root), the names an
//! event touched and the names that appeared as directories (created, or
//! moved in from elsewhere: walked whole by the next capture).
//!
//! Bounded, whatever the sandbox does: past `names_per_dir` names a directory
//! is listed whole instead; past `deep_per_dir` new subdirectories every
//! subdirectory of it is walked whole; past `dirs` directories or `bytes` of
//! names and paths the whole workspace is scanned. Each step loses precision,
//! never a change.

use std::collections::{BTreeMap, BTreeSet};

/// The bounds of a [`Dirty`] set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Names kept per directory; past it the directory is listed whole.
    pub names_per_dir: usize,
    /// New subdirectories kept per directory; past it all of them are walked.
    pub deep_per_dir: usize,
    /// Directories kept; past it the next capture scans everything.
    pub dirs: usize,
    /// Bytes of paths and names kept; past it the next capture scans everything.
    pub bytes: usize,
    /// Hard-linked files whose other names may change them unseen (each is
    /// looked at by every capture); past it the journal is not trusted.
    pub multi_links: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            names_per_dir: 1024,
            deep_per_dir: 256,
            dirs: 16_384,
            bytes: 16 << 20,
            multi_links: 65_536,
        }
    }
}

/// Bytes a kept name or path costs beyond its own length (its node).
const OVERHEAD: usize = 48;

/// What changed in one directory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DirChanges {
    /// The names touched; None: more than the limit, list the directory whole.
    pub names: Option<BTreeSet<Box<[u8]>>>,
    /// Names that appeared as directories: walked whole.
    pub deep: BTreeSet<Box<[u8]>>,
    /// Too many new subdirectories to name: every subdirectory is walked whole.
    pub all_deep: bool,
}

impl DirChanges {
    /// Whether `name` is to be walked whole if it is a directory now.
    pub fn is_deep(&self, name: &[u8]) -> bool {
        self.all_deep || self.deep.contains(name)
    }
}

/// What changed in the workspace since the last capture (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Dirty {
    pub dirs: BTreeMap<String, DirChanges>,
    /// Why everything must be scanned (the set outgrew its bounds), if it must.
    pub everything: Option<String>,
    bytes: usize,
}

impl Dirty {
    /// Whether a change at `path` is examined by a capture directed by this set.
    pub fn covers(&self, path: &str) -> bool {
        if self.everything.is_some() {
            return true;
        }
        let (dir, name) = split(path);
        if let Some(changes) = self.dirs.get(dir) {
            if changes
                .names
                .as_ref()
                .map_or(true, |n| n.contains(name.as_bytes()))
            {
                return true;
            }
        }
        // Below a directory walked whole.
        let mut at = dir;
        while !at.is_empty() {
            let (parent, name) = split(at);
            if self
                .dirs
                .get(parent)
                .is_some_and(|c| c.is_deep(name.as_bytes()))
            {
                return true;
            }
            at = parent;
        }
        false
    }

    pub fn is_empty(&self) -> bool {
        self.dirs.is_empty() && self.everything.is_none()
    }

    /// Names kept, over all directories (a whole-listed directory counts one).
    pub fn len(&self) -> usize {
        self.dirs
            .values()
            .map(|d| d.names.as_ref().map_or(1, BTreeSet::len) + d.deep.len())
            .sum()
    }

    /// Record that `name` in the directory `dir` changed; `deep`: it appeared
    /// as a directory (walk it whole).
    pub fn touch(&mut self, dir: &str, name: &[u8], deep: bool, limits: &Limits) {
        if self.everything.is_some() {
            return;
        }
        if !self.dirs.contains_key(dir) {
            if self.dirs.len() >= limits.dirs {
                return self.overflow(format!(
                    "more than {} directories changed since the last capture",
                    limits.dirs
                ));
            }
            self.bytes += dir.len() + OVERHEAD;
            self.dirs.insert(
                dir.to_string(),
                DirChanges {
                    names: Some(BTreeSet::new()),
                    ..DirChanges::default()
                },
            );
        }
        let changes = self.dirs.get_mut(dir).expect("inserted above");
        let mut added = 0;
        if let Some(names) = &mut changes.names {
            if !names.contains(name) {
                if names.len() >= limits.names_per_dir {
                    // Listed whole from now on: the names are let go.
                    added -= names
                        .iter()
                        .map(|n| (n.len() + OVERHEAD) as isize)
                        .sum::<isize>();
                    changes.names = None;
                } else {
                    names.insert(name.into());
                    added += (name.len() + OVERHEAD) as isize;
                }
            }
        }
        if deep && !changes.all_deep && !changes.deep.contains(name) {
            if changes.deep.len() >= limits.deep_per_dir {
                added -= changes
                    .deep
                    .iter()
                    .map(|n| (n.len() + OVERHEAD) as isize)
                    .sum::<isize>();
                changes.deep.clear();
                changes.all_deep = true;
            } else {
                changes.deep.insert(name.into());
                added += (name.len() + OVERHEAD) as isize;
            }
        }
        self.bytes = (self.bytes as isize + added).max(0) as usize;
        if self.bytes > limits.bytes {
            self.overflow(format!(
                "the changes since the last capture outgrew the journal's {} MiB",
                limits.bytes >> 20
            ));
        }
    }

    /// Record that the directory `dir` must be listed whole.
    pub fn touch_all(&mut self, dir: &str, limits: &Limits) {
        if self.everything.is_some() {
            return;
        }
        self.touch(dir, b"", false, limits);
        if let Some(changes) = self.dirs.get_mut(dir) {
            if let Some(names) = changes.names.take() {
                self.bytes = self
                    .bytes
                    .saturating_sub(names.iter().map(|n| n.len() + OVERHEAD).sum());
            }
        }
    }

    /// Everything is to be scanned, for `reason`: the names are let go.
    pub fn overflow(&mut self, reason: String) {
        if self.everything.is_none() {
            self.everything = Some(reason);
        }
        self.dirs.clear();
        self.bytes = 0;
    }

    /// Add what `other` holds (a capture that failed gives its set back).
    pub fn merge(&mut self, other: Dirty, limits: &Limits) {
        if let Some(reason) = other.everything {
            return self.overflow(reason);
        }
        for (dir, changes) in other.dirs {
            match changes.names {
                None => self.touch_all(&dir, limits),
                Some(names) => {
                    for name in names {
                        self.touch(&dir, &name, false, limits);
                    }
                }
            }
            for name in changes.deep {
                self.touch(&dir, &name, true, limits);
            }
            if changes.all_deep {
                if let Some(mine) = self.dirs.get_mut(&dir) {
                    mine.deep.clear();
                    mine.all_deep = true;
                }
            }
        }
    }

    /// The full paths of the directories to be walked whole (of `deep` names),
    /// and the directories all of whose subdirectories are.
    pub fn deep_paths(&self) -> impl Iterator<Item = (String, bool)> + '_ {
        self.dirs.iter().flat_map(|(dir, changes)| {
            let named = changes.deep.iter().map(move |name| {
                let name = String::from_utf8_lossy(name);
                (join(dir, &name), false)
            });
            let all = changes.all_deep.then(|| (dir.clone(), true));
            named.chain(all)
        })
    }
}

/// `dir/name` ("" is the root).
pub fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

/// The parent of `path` and its last name (`path` not the root).
pub fn split(path: &str) -> (&str, &str) {
    match path.rfind('/') {
        Some(at) => (&path[..at], &path[at + 1..]),
        None => ("", path),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> Limits {
        Limits {
            names_per_dir: 3,
            deep_per_dir: 2,
            dirs: 4,
            bytes: 1 << 20,
            multi_links: 8,
        }
    }

    #[test]
    fn names_collapse_to_their_directory_then_to_everything() {
        let limits = small();
        let mut dirty = Dirty::default();
        for name in ["a", "b", "c"] {
            dirty.touch("d", name.as_bytes(), false, &limits);
        }
        assert_eq!(dirty.dirs["d"].names.as_ref().unwrap().len(), 3);
        dirty.touch("d", b"a", false, &limits); // already there: no growth
        assert!(dirty.dirs["d"].names.is_some());
        dirty.touch("d", b"z", false, &limits);
        assert_eq!(dirty.dirs["d"].names, None, "listed whole past the limit");
        for name in ["x", "y", "z"] {
            dirty.touch("e", name.as_bytes(), true, &limits);
        }
        assert!(dirty.dirs["e"].all_deep);
        assert!(dirty.dirs["e"].deep.is_empty());
        for dir in ["f", "g"] {
            dirty.touch(dir, b"n", false, &limits);
        }
        assert!(dirty.everything.is_none());
        dirty.touch("h", b"n", false, &limits);
        assert!(dirty.everything.is_some(), "past the directory limit");
        assert!(dirty.dirs.is_empty(), "its names are let go");
        dirty.touch("i", b"n", false, &limits);
        assert!(dirty.dirs.is_empty());
    }

    #[test]
    fn a_byte_budget_bounds_long_names() {
        let limits = Limits {
            bytes: 4096,
            ..Limits::default()
        };
        let mut dirty = Dirty::default();
        let long = vec![b'n'; 255];
        for i in 0..100u8 {
            let mut name = long.clone();
            name[0] = i;
            dirty.touch("d", &name, false, &limits);
        }
        assert!(dirty.everything.is_some());
    }

    #[test]
    fn merging_gives_back_what_a_failed_capture_took() {
        let limits = Limits::default();
        let mut taken = Dirty::default();
        taken.touch("a", b"x", true, &limits);
        taken.touch_all("b", &limits);
        let mut now = Dirty::default();
        now.touch("a", b"y", false, &limits);
        now.merge(taken, &limits);
        let a = &now.dirs["a"];
        assert_eq!(a.names.as_ref().unwrap().len(), 2);
        assert!(a.is_deep(b"x") && !a.is_deep(b"y"));
        assert_eq!(now.dirs["b"].names, None);
        let deep: Vec<_> = now.deep_paths().collect();
        assert_eq!(deep, vec![("a/x".to_string(), false)]);
        let mut all = Dirty::default();
        all.overflow("flood".into());
        now.merge(all, &limits);
        assert_eq!(now.everything.as_deref(), Some("flood"));
    }
}
