//! What each directory entry is, for the manifest: file, dir, symlink that stays
//! in the workspace, or one of the unsupported kinds of docs/contract.md#capture.

/// Why an entry cannot be captured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Unsupported {
    SymlinkEscapes,
    Fifo,
    Socket,
    BlockDevice,
    CharDevice,
    NonUtf8Name,
    /// A name holding `\`, which docs/contract.md#data-model refuses in a path.
    BackslashName,
    /// A directory on another filesystem: the scan never crosses a device boundary.
    MountPoint,
    /// Deeper than `walk::MAX_DEPTH` directories below the root.
    TooDeep,
    /// A path longer than `walk::MAX_PATH_BYTES` bytes.
    PathTooLong,
    /// A name (or path) holding one of the capture's secrets: its path is
    /// given with the secret masked (`redact::MASK`).
    SecretInName,
    /// A symlink whose target holds one of the capture's secrets.
    SecretInTarget,
    Unknown,
}

impl Unsupported {
    /// The kind string of the Python contract (`ScanResult.unsupported`).
    pub fn as_str(self) -> &'static str {
        match self {
            Unsupported::SymlinkEscapes => "symlink-escapes",
            Unsupported::Fifo => "fifo",
            Unsupported::Socket => "socket",
            Unsupported::BlockDevice => "block-device",
            Unsupported::CharDevice => "char-device",
            Unsupported::NonUtf8Name => "non-utf8-name",
            Unsupported::BackslashName => "backslash-name",
            Unsupported::MountPoint => "mount-point",
            Unsupported::TooDeep => "too-deep",
            Unsupported::PathTooLong => "path-too-long",
            Unsupported::SecretInName => "secret-in-name",
            Unsupported::SecretInTarget => "secret-in-target",
            Unsupported::Unknown => "unknown",
        }
    }

    /// The unsupported kind of a special file's `st_mode` (None for file/dir/link).
    pub fn from_mode(mode: u32) -> Option<Unsupported> {
        match mode & libc::S_IFMT {
            libc::S_IFREG | libc::S_IFDIR | libc::S_IFLNK => None,
            libc::S_IFIFO => Some(Unsupported::Fifo),
            libc::S_IFSOCK => Some(Unsupported::Socket),
            libc::S_IFBLK => Some(Unsupported::BlockDevice),
            libc::S_IFCHR => Some(Unsupported::CharDevice),
            _ => Some(Unsupported::Unknown),
        }
    }
}

/// Whether a symlink at `link_path` (workspace-relative, '/'-separated) with
/// `target` stays inside the workspace, judged lexically without touching the
/// filesystem: a relative target is resolved against the link's directory and
/// must never climb above the root; an absolute one must lie under one of
/// `roots` (the root as given and as the kernel resolves it).
pub fn symlink_stays_inside(link_path: &str, target: &[u8], roots: &[&[u8]]) -> bool {
    if target.is_empty() {
        return false;
    }
    if target[0] == b'/' {
        let normalised = match normalise(&[], target) {
            Some(parts) => parts,
            None => return false,
        };
        return roots.iter().any(|root| {
            let root_parts: Vec<&[u8]> = root
                .split(|&b| b == b'/')
                .filter(|p| !p.is_empty())
                .collect();
            normalised.len() >= root_parts.len() && normalised[..root_parts.len()] == root_parts[..]
        });
    }
    let mut base: Vec<&[u8]> = link_path
        .as_bytes()
        .split(|&b| b == b'/')
        .filter(|p| !p.is_empty())
        .collect();
    base.pop(); // the link's own name
    normalise(&base, target).is_some()
}

/// Apply `path`'s components to `base`; None when `..` climbs above the start.
fn normalise<'a>(base: &[&'a [u8]], path: &'a [u8]) -> Option<Vec<&'a [u8]>> {
    let mut parts: Vec<&[u8]> = base.to_vec();
    for part in path.split(|&b| b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => {
                parts.pop()?;
            }
            other => parts.push(other),
        }
    }
    Some(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROOTS: &[&[u8]] = &[b"/ws", b"/real/ws"];

    #[test]
    fn relative_targets() {
        assert!(symlink_stays_inside("a/l", b"b", ROOTS));
        assert!(symlink_stays_inside("a/l", b"../b", ROOTS));
        assert!(symlink_stays_inside("a/l", b"..", ROOTS));
        assert!(!symlink_stays_inside("a/l", b"../../b", ROOTS));
        assert!(!symlink_stays_inside("l", b"../ws/x", ROOTS));
        assert!(symlink_stays_inside("a/b/l", b"./../../c/./d", ROOTS));
        assert!(!symlink_stays_inside("a/l", b"x/../../../y", ROOTS));
    }

    #[test]
    fn absolute_targets() {
        assert!(symlink_stays_inside("l", b"/ws/x", ROOTS));
        assert!(symlink_stays_inside("l", b"/ws", ROOTS));
        assert!(symlink_stays_inside("l", b"/real/ws/y", ROOTS));
        assert!(!symlink_stays_inside("l", b"/wsx/y", ROOTS));
        assert!(!symlink_stays_inside("l", b"/ws/../etc", ROOTS));
        assert!(!symlink_stays_inside("l", b"/etc/passwd", ROOTS));
    }
}
