//! The secret spans of a restore (docs/design.md): where capture zeroed a
//! secret, the manifest records the span ([`manifest::Span`]), never the
//! value. Restore leaves a live file alone when, with its spans zeroed, it
//! equals the checkpoint's bytes ([`holding`]: rewriting it would put zeros
//! over the real secrets), and after apply writes each secret the caller
//! gives into every such file that holds something else there ([`fill`]).
//!
//! The threat is the restore's own: code in the sandbox may swap a file for a
//! symlink, a hard link to a file outside, or a bind mount. Both steps open
//! the file beneath the restore root without following a symlink in any
//! component, and read or write only a regular file with one link, of the
//! recorded size, on the restore root's own mount.

use std::collections::HashSet;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;

use crate::fs;
use crate::manifest::{SecretRef, Span, SpannedFile};
use crate::restore::{RestoreError, Workspace};

/// Bytes read per `pread` while a file is hashed through its spans.
const READ_CHUNK: usize = 1 << 20;

/// The secrets a caller gives a restore: their values, and their names when
/// a mapping was given (its insertion order is the list an index refers to).
#[derive(Default)]
pub struct GivenSecrets {
    values: Vec<Vec<u8>>,
    names: Option<Vec<String>>,
}

impl GivenSecrets {
    pub fn new(values: Vec<Vec<u8>>, names: Option<Vec<String>>) -> GivenSecrets {
        GivenSecrets { values, names }
    }

    /// The secret a span held, when the caller gives it now with the span's
    /// length: a name is looked up among the names given, an index is the
    /// position in the caller's list. Anything else stays zeros.
    fn lookup(&self, span: &Span) -> Option<&[u8]> {
        let value = match &span.secret {
            SecretRef::Name(name) => {
                let at = self.names.as_ref()?.iter().position(|n| n == name)?;
                self.values.get(at)?
            }
            SecretRef::Index(index) => self.values.get(usize::try_from(*index).ok()?)?,
        };
        (value.len() as u64 == span.length).then_some(value.as_slice())
    }
}

/// The spanned files whose live bytes, their spans zeroed, are the
/// checkpoint's: they still hold their secrets, and the restore leaves them
/// as they are (paths relative to the restore root).
pub fn holding(ws: &Workspace, files: &[SpannedFile]) -> Result<HashSet<String>, RestoreError> {
    let mut held = HashSet::new();
    if files.is_empty() {
        return Ok(held);
    }
    let root_mount = fs::mount_id(ws.fd.as_raw_fd());
    for file in files {
        let Some(opened) = open_checked(ws, root_mount, file, libc::O_RDONLY) else {
            continue;
        };
        if read_through(&opened, &file.spans)
            .map_err(|e| failed(ws, file, "read", e))?
            .digest
            == file.digest
        {
            held.insert(file.path.clone());
        }
    }
    Ok(held)
}

/// Write each given secret where its restored file holds something else
/// (zeros), put the file's mtime back and sync it. Returns the paths left
/// with zeros where a secret was, sorted: a span whose secret is not given,
/// or a file that is no longer the checked regular file. A file whose bytes
/// through its spans are no longer the checkpoint's changed after the
/// restore wrote it: not ours to fill, nor to report.
pub fn fill(
    ws: &Workspace,
    files: &[SpannedFile],
    secrets: &GivenSecrets,
) -> Result<Vec<String>, RestoreError> {
    let mut unfilled = Vec::new();
    if files.is_empty() {
        return Ok(unfilled);
    }
    let flags = if secrets.values.is_empty() {
        libc::O_RDONLY
    } else {
        libc::O_RDWR
    };
    let root_mount = fs::mount_id(ws.fd.as_raw_fd());
    for file in files {
        let Some(opened) = open_checked(ws, root_mount, file, flags) else {
            unfilled.push(file.path.clone());
            continue;
        };
        let seen = read_through(&opened, &file.spans).map_err(|e| failed(ws, file, "read", e))?;
        if seen.digest != file.digest {
            continue;
        }
        let mut zeros = false;
        let mut fills = Vec::new();
        for (span, held) in file.spans.iter().zip(&seen.at_spans) {
            match secrets.lookup(span) {
                None => zeros |= held.iter().all(|&b| b == 0),
                Some(value) if held.as_slice() != value => fills.push((span.offset, value)),
                Some(_) => {}
            }
        }
        if !fills.is_empty() {
            write_fills(&opened, &fills).map_err(|e| failed(ws, file, "fill the secrets of", e))?;
        }
        if zeros {
            unfilled.push(file.path.clone());
        }
    }
    unfilled.sort_unstable();
    Ok(unfilled)
}

/// The file at `file.path` beneath the restore root, opened with `flags`,
/// when it is a regular file with one link, of the recorded size, on the
/// root's mount (never a file bind-mounted into the workspace, nor one
/// beneath a mounted directory: its inode is not ours); None otherwise.
fn open_checked(
    ws: &Workspace,
    root_mount: Option<u64>,
    file: &SpannedFile,
    flags: libc::c_int,
) -> Option<File> {
    let flags = flags | libc::O_NONBLOCK | libc::O_NOCTTY;
    let fd = fs::open_beneath(ws.fd.as_raw_fd(), file.path.as_bytes(), flags).ok()?;
    let (stat, links) = fs::fstat_links(fd.as_raw_fd()).ok()?;
    let ours = stat.is_file()
        && links == 1
        && stat.size == file.size
        && fs::mount_id(fd.as_raw_fd()) == root_mount;
    ours.then(|| File::from(fd))
}

/// A live file seen through a checkpoint's spans: the BLAKE3 of its bytes
/// with the spans zeroed, and its bytes at each span.
struct SeenThrough {
    digest: [u8; 32],
    at_spans: Vec<Vec<u8>>,
}

/// Hash `file` from offset 0 with `spans` zeroed, in fixed memory, keeping
/// the bytes each span covers.
fn read_through(file: &File, spans: &[Span]) -> io::Result<SeenThrough> {
    let mut hasher = blake3::Hasher::new();
    let mut at_spans = vec![Vec::new(); spans.len()];
    let mut buf = vec![0u8; READ_CHUNK];
    let mut position = 0u64;
    loop {
        let read = match file.read_at(&mut buf, position) {
            Ok(0) => break,
            Ok(read) => read,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let end = position + read as u64;
        let within = |span: &Span| {
            let start = span.offset.max(position);
            let stop = span.offset.saturating_add(span.length).min(end);
            (start < stop).then(|| (start - position) as usize..(stop - position) as usize)
        };
        // Every span's bytes are kept before any is zeroed (spans may overlap).
        for (span, held) in spans.iter().zip(at_spans.iter_mut()) {
            if let Some(range) = within(span) {
                held.extend_from_slice(&buf[range]);
            }
        }
        for span in spans {
            if let Some(range) = within(span) {
                buf[range].fill(0);
            }
        }
        hasher.update(&buf[..read]);
        position = end;
    }
    Ok(SeenThrough {
        digest: *hasher.finalize().as_bytes(),
        at_spans,
    })
}

/// Write the secrets at their offsets, put the mtime back, and make the
/// bytes durable (restore reports success only after its data is synced).
fn write_fills(file: &File, fills: &[(u64, &[u8])]) -> io::Result<()> {
    let mtime_ns = fs::fstat(file.as_raw_fd())?.mtime_ns;
    for (offset, value) in fills {
        file.write_all_at(value, *offset)?;
    }
    fs::set_mtime(file.as_raw_fd(), mtime_ns)?;
    file.sync_all()
}

fn failed(ws: &Workspace, file: &SpannedFile, op: &'static str, source: io::Error) -> RestoreError {
    RestoreError::Io {
        path: ws.path.join(&file.path).to_string_lossy().into_owned(),
        op,
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &[u8] = b"key=SECRET!;rest";

    fn zeroed_digest() -> [u8; 32] {
        let mut zeroed = TEXT.to_vec();
        zeroed[4..11].fill(0);
        *blake3::hash(&zeroed).as_bytes()
    }

    fn spanned(path: &str, secret: SecretRef) -> SpannedFile {
        SpannedFile {
            path: path.into(),
            digest: zeroed_digest(),
            size: TEXT.len() as u64,
            spans: vec![Span {
                offset: 4,
                length: 7,
                secret,
            }],
        }
    }

    fn given(names: Option<&[&str]>) -> GivenSecrets {
        GivenSecrets::new(
            vec![b"SECRET!".to_vec()],
            names.map(|n| n.iter().map(|s| s.to_string()).collect()),
        )
    }

    #[test]
    fn a_span_finds_its_secret_by_index_or_name_and_length() {
        let span = |length, secret| Span {
            offset: 0,
            length,
            secret,
        };
        let by_index = given(None);
        assert!(by_index.lookup(&span(7, SecretRef::Index(0))).is_some());
        assert!(by_index.lookup(&span(7, SecretRef::Index(1))).is_none());
        assert!(by_index.lookup(&span(8, SecretRef::Index(0))).is_none());
        assert!(by_index
            .lookup(&span(7, SecretRef::Name("k".into())))
            .is_none());
        let by_name = given(Some(&["k"]));
        assert!(by_name
            .lookup(&span(7, SecretRef::Name("k".into())))
            .is_some());
        assert!(by_name
            .lookup(&span(7, SecretRef::Name("j".into())))
            .is_none());
        // An index counts in a mapping's insertion order.
        assert!(by_name.lookup(&span(7, SecretRef::Index(0))).is_some());
    }

    #[test]
    fn reading_through_spans_zeroes_them_across_reads_and_keeps_their_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big");
        let mut data: Vec<u8> = (0..READ_CHUNK + 100).map(|i| (i % 251) as u8 + 1).collect();
        std::fs::write(&path, &data).unwrap();
        let across = Span {
            offset: READ_CHUNK as u64 - 3,
            length: 6,
            secret: SecretRef::Index(0),
        };
        let inside = Span {
            offset: READ_CHUNK as u64 - 1,
            length: 4,
            secret: SecretRef::Index(1),
        };
        let seen = read_through(&File::open(&path).unwrap(), &[across, inside]).unwrap();
        let at = READ_CHUNK - 3;
        assert_eq!(seen.at_spans[0], data[at..at + 6]);
        assert_eq!(seen.at_spans[1], data[at + 2..at + 6]);
        data[at..at + 6].fill(0);
        assert_eq!(seen.digest, *blake3::hash(&data).as_bytes());
    }

    #[test]
    fn a_file_holding_its_secrets_is_kept_and_a_zeroed_one_filled() {
        let dir = tempfile::tempdir().unwrap();
        let ws = Workspace::open(dir.path(), "").unwrap();
        std::fs::write(dir.path().join("held"), TEXT).unwrap();
        let mut zeroed = TEXT.to_vec();
        zeroed[4..11].fill(0);
        std::fs::write(dir.path().join("zeroed"), &zeroed).unwrap();
        std::fs::write(dir.path().join("changed"), b"key=SECRET!;REST").unwrap();
        let files = [
            spanned("changed", SecretRef::Index(0)),
            spanned("held", SecretRef::Index(0)),
            spanned("zeroed", SecretRef::Name("k".into())),
        ];
        let held = holding(&ws, &files).unwrap();
        assert_eq!(held, HashSet::from(["held".into(), "zeroed".into()]));

        let zeroed_path = dir.path().join("zeroed");
        let before = std::fs::metadata(&zeroed_path).unwrap().modified().unwrap();
        // Not given (an index where the caller gave names): left with zeros.
        assert_eq!(fill(&ws, &files, &given(None)).unwrap(), ["zeroed"]);
        assert_eq!(std::fs::read(&zeroed_path).unwrap(), zeroed);
        assert_eq!(
            fill(&ws, &files, &given(Some(&["k"]))).unwrap(),
            Vec::<String>::new()
        );
        assert_eq!(std::fs::read(&zeroed_path).unwrap(), TEXT);
        assert_eq!(
            std::fs::read(dir.path().join("changed")).unwrap(),
            b"key=SECRET!;REST"
        );
        let after = std::fs::metadata(&zeroed_path).unwrap().modified().unwrap();
        assert_eq!(before, after);
    }

    #[test]
    fn a_symlink_or_a_shared_inode_is_never_read_nor_filled() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let mut zeroed = TEXT.to_vec();
        zeroed[4..11].fill(0);
        let target = outside.path().join("target");
        std::fs::write(&target, &zeroed).unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join("link")).unwrap();
        std::fs::hard_link(&target, dir.path().join("hard")).unwrap();
        let ws = Workspace::open(dir.path(), "").unwrap();
        let files = [
            spanned("hard", SecretRef::Index(0)),
            spanned("link", SecretRef::Index(0)),
        ];
        assert!(holding(&ws, &files).unwrap().is_empty());
        assert_eq!(fill(&ws, &files, &given(None)).unwrap(), ["hard", "link"]);
        assert_eq!(std::fs::read(&target).unwrap(), zeroed);
    }
}
