//! The workspace's regular files that have more than one name.
//!
//! A write through one name is reported for that name's directory only (or
//! not at all, through a name outside the workspace), so every name of such a
//! file inside the workspace is looked at by every capture. That holds only
//! while the journal knows every inside name: when a name appears whose
//! inode has names the registry cannot account for (fewer known names that
//! still hold it than its link count), the others may be anywhere in the
//! tree, and only a walk of the whole tree finds them (until it ends, the
//! journal is not trusted).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::os::fd::AsRawFd;

use super::source::Source;
use super::{thousands, tree, Inner, State};

/// An inode: (dev, ino).
pub type Inode = (u64, u64);

#[derive(Debug, Default)]
pub struct Links {
    paths: BTreeMap<String, Inode>,
    inodes: HashMap<Inode, BTreeSet<String>>,
}

impl Links {
    pub fn len(&self) -> usize {
        self.paths.len()
    }

    pub fn contains(&self, path: &str) -> bool {
        self.paths.contains_key(path)
    }

    pub fn paths(&self) -> impl Iterator<Item = &String> {
        self.paths.keys()
    }

    /// The inodes it holds names of.
    pub fn inodes(&self) -> HashSet<Inode> {
        self.inodes.keys().copied().collect()
    }

    pub fn add(&mut self, path: String, inode: Inode) {
        if let Some(old) = self.paths.insert(path.clone(), inode) {
            if old != inode {
                self.drop_name(old, &path);
            }
        }
        self.inodes.entry(inode).or_default().insert(path);
    }

    fn drop_name(&mut self, inode: Inode, path: &str) {
        if let Some(names) = self.inodes.get_mut(&inode) {
            names.remove(path);
            if names.is_empty() {
                self.inodes.remove(&inode);
            }
        }
    }

    /// Whether the names it holds of `inode` that still name it beneath the
    /// root (`root_fd`) account for all `links` of them.
    pub fn complete(&self, inode: Inode, links: u64, root_fd: i32) -> bool {
        let held = self.inodes.get(&inode).map_or(0, |names| {
            names
                .iter()
                .filter(|p| tree::file_links(root_fd, p).is_some_and(|(_, i)| i == inode))
                .count()
        });
        held as u64 >= links
    }

    /// Forget the names that no longer name their file (renamed, deleted,
    /// replaced).
    pub fn prune(&mut self, root_fd: i32) {
        let stale: Vec<(String, Inode)> = self
            .paths
            .iter()
            .filter(|(p, inode)| tree::file_links(root_fd, p).map_or(true, |(_, i)| i != **inode))
            .map(|(p, i)| (p.clone(), *i))
            .collect();
        for (path, inode) in stale {
            self.paths.remove(&path);
            self.drop_name(inode, &path);
        }
    }
}

impl Inner {
    /// The files fanotify named by inode in the events just applied. One
    /// with a single name is examined where it is now (a write through a
    /// name that is gone by now, a hard link made, written through and
    /// removed, changed it). One with other names needs them all known: a
    /// walk of the whole tree finds them, and until it has, no trust.
    pub(super) fn check_objects(&self, state: &mut State, source: &Source) {
        if state.objects.is_empty() {
            return;
        }
        let mut seen: HashMap<Vec<u8>, Vec<String>> = HashMap::new();
        for (object, path) in std::mem::take(&mut state.objects) {
            seen.entry(object).or_default().extend(path);
        }
        let root_fd = self.root_fd.as_raw_fd();
        let limits = self.limits;
        for (object, paths) in seen {
            let Some((inode, links)) = source.inode_of(&object) else {
                continue; // gone: nothing of it is left to capture
            };
            let held: Vec<String> = paths
                .into_iter()
                .filter(|p| tree::file_links(root_fd, p).is_some_and(|(_, i)| i == inode))
                .collect();
            let now = if held.is_empty() || links >= 2 {
                source
                    .path_of(&object)
                    .and_then(|abs| self.relative_file(&abs))
            } else {
                None
            };
            if links < 2 {
                if let (true, Some(path)) = (held.is_empty(), now) {
                    let (dir, name) = super::dirty::split(&path);
                    state.touch(dir, name.as_bytes(), false, &limits);
                }
                continue;
            }
            for path in held.into_iter().chain(now) {
                self.add_linked(state, path, inode, None);
            }
            if !state.links.complete(inode, links, root_fd) {
                state.distrust(
                    "a file with several names was written or linked through a name the \
                     journal did not know"
                        .into(),
                );
                state.queue.push((String::new(), String::new()));
                *state.walking.entry(String::new()).or_insert(0) += 1;
            }
        }
    }

    /// A file that appeared: when it has other names, every capture looks at
    /// it; when some of those are not known, trust waits for a walk of the
    /// whole tree that finds them (see `links`).
    pub(super) fn note_links(&self, state: &mut State, path: &str) {
        let Some((links, inode)) = tree::file_links(self.root_fd.as_raw_fd(), path) else {
            return;
        };
        if links >= 2 {
            self.add_linked(state, path.to_string(), inode, Some(links));
        }
    }

    /// Note a hard-linked file; with its link count, check that its names
    /// are all known (a walk of the whole tree finds them all: None).
    pub(super) fn add_linked(
        &self,
        state: &mut State,
        path: String,
        inode: Inode,
        links: Option<u64>,
    ) {
        if state.links.len() >= self.limits.multi_links && !state.links.contains(&path) {
            let reason = format!(
                "more than {} hard-linked files, each of which every capture would look at",
                thousands(self.limits.multi_links as u64)
            );
            if state.untrust.as_deref() != Some(reason.as_str()) {
                state.distrust(reason);
            }
            return;
        }
        state.links.add(path.clone(), inode);
        let Some(links) = links else {
            return;
        };
        if !state.links.complete(inode, links, self.root_fd.as_raw_fd()) {
            state.distrust(format!(
                "a hard link {path:?} names a file whose other names the journal does not know"
            ));
            // (Again from the top when a walk runs already: it may be past them.)
            state.queue.push((String::new(), String::new()));
            *state.walking.entry(String::new()).or_insert(0) += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_complete_only_when_they_account_for_every_link() {
        let root = tempfile::tempdir().unwrap();
        let p = root.path();
        std::fs::write(p.join("a"), b"x").unwrap();
        std::fs::hard_link(p.join("a"), p.join("b")).unwrap();
        let fd = crate::fs::open_dir_path(p).unwrap();
        let fd = fd.as_raw_fd();
        let (links, inode) = tree::file_links(fd, "a").unwrap();
        let mut known = Links::default();
        known.add("b".into(), inode);
        assert!(!known.complete(inode, links, fd), "a is not known");
        known.add("a".into(), inode);
        assert!(known.complete(inode, links, fd));
        // a renamed: its old name no longer counts.
        std::fs::rename(p.join("a"), p.join("c")).unwrap();
        assert!(!known.complete(inode, links, fd));
        known.prune(fd);
        assert_eq!(known.paths().collect::<Vec<_>>(), ["b"]);
        assert_eq!(known.inodes(), HashSet::from([inode]));
    }
}
