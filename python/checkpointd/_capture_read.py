"""The capture's reads of files beneath the held root fd, after its scan.

The upload (``_capture_upload``) reads a file the scan did not hand over, or
one that changed under the capture, here: opened beneath the root fd the
capture holds, never following a symlink in any component, verified against
the scanned digest and fstat (``_native.VerifyingReader``), or hashed again as
it is now (``_native.rehash_beneath``, many files in one call).
"""

from __future__ import annotations

import stat
from dataclasses import dataclass

from . import _native
from .errors import FILE_CHANGED, SandboxSnapshotError
from .model import FILE_KEY_PREFIX, FileEntry, SecretSpan


class FileChanged(Exception):
    """The file's bytes no longer match what the scan hashed."""


class NowLarge(Exception):
    """A file the scan found small is large now (not read: it is streamed)."""


@dataclass(frozen=True, slots=True)
class Kept:
    """A changed small file's zeroed bytes, from the pass that hashed it again,
    and the fstat they were read under: next round they are uploaded as they
    are while the file's fstat is still ``stamp`` (a look, not a read)."""

    key: str
    data: bytes
    stamp: _native.Stamp


def open_verified(
    root_fd: int, entry: FileEntry, secrets: tuple[bytes, ...]
) -> _native.VerifyingReader:
    """The native verifying reader on the entry's file, opened beneath the
    held root fd without following a symlink in any component: code in the
    sandbox that swaps a directory for a link to /etc must not get /etc's files
    read (and uploaded) in the workspace's name. Raises FileChanged when the
    file or a parent is gone or no longer what the scan saw."""
    try:
        return _native.VerifyingReader.open(
            root_fd, entry.path, entry.blob_key[len(FILE_KEY_PREFIX) :], entry.size, secrets
        )
    except _native.FileChangedError:
        raise FileChanged(entry.path) from None


def read_verified(
    root_fd: int, entry: FileEntry, secrets: tuple[bytes, ...], token: _native.CancelToken
) -> bytes:
    """All of a small file's verified bytes (blocks: call it in a worker
    thread). Raises FileChanged."""
    reader = open_verified(root_fd, entry, secrets)
    try:
        return reader.read_all(token)
    except _native.FileChangedError:
        raise FileChanged(entry.path) from None
    finally:
        reader.close()


# What ``rehash_in`` gives: the file's entry as it is now and its kept bytes.
Rehashed = tuple[FileEntry | None, Kept | None]


def rehash_in(
    root_fd: int,
    entry: FileEntry,
    secrets: tuple[bytes, ...],
    token: _native.CancelToken,
    *,
    keep_small: bool = False,
    unread_above: int | None = None,
) -> Rehashed:
    """The file's entry as it is now (None when it is gone) and, with
    ``keep_small``, the zeroed bytes that pass hashed when the file is under
    1 MiB (else None), so a changed small file is read once more in all (blocks:
    call it in a worker thread). Opened beneath the held root fd like every upload
    read. Raises SandboxSnapshotError(FILE_CHANGED) when the file can no longer
    be read (a symlink now, unreadable, changing on every read) or stopped being
    a regular file. With ``unread_above``, a file larger than that is not read:
    NowLarge."""
    (found,) = rehash_each(
        root_fd, [entry], secrets, token, keep_small=keep_small, unread_above=unread_above
    )
    if isinstance(found, Exception):
        raise found
    return found


def rehash_each(
    root_fd: int,
    entries: list[FileEntry],
    secrets: tuple[bytes, ...],
    token: _native.CancelToken,
    *,
    keep_small: bool = False,
    unread_above: int | None = None,
) -> list[Rehashed | SandboxSnapshotError | NowLarge]:
    """``rehash_in`` of each entry, in one native call (one trip without the
    GIL for them all): per entry what it returns, or the error it raises.
    Raises ScanCancelled."""
    found = _native.rehash_beneath(
        root_fd, [entry.path for entry in entries], secrets, token, keep_small, unread_above
    )
    out: list[Rehashed | SandboxSnapshotError | NowLarge] = []
    for entry, item in zip(entries, found, strict=True):
        try:
            out.append(_rehashed(entry, item))
        except (SandboxSnapshotError, NowLarge) as error:
            out.append(error)
    return out


def _rehashed(entry: FileEntry, found: _native.Rehashed | OSError | None) -> Rehashed:
    if isinstance(found, OSError):
        raise SandboxSnapshotError(
            FILE_CHANGED,
            f"{entry.path} changed while it was captured and can no longer be read: {found}",
            details={"path": entry.path},
        ) from None
    if found is None:
        return None, None
    hex_hash, size, spans, mode, mtime_ns, kept = found
    if not hex_hash and stat.S_ISREG(mode):
        raise NowLarge(entry.path)
    if not stat.S_ISREG(mode):
        raise SandboxSnapshotError(
            FILE_CHANGED,
            f"{entry.path} stopped being a regular file while it was captured",
            details={"path": entry.path},
        )
    fresh = FileEntry(
        entry.path,
        FILE_KEY_PREFIX + hex_hash,
        size,
        stat.S_IMODE(mode) & 0o777,
        mtime_ns,
        tuple(SecretSpan(*span) for span in spans),
    )
    return fresh, None if kept is None else Kept(fresh.blob_key, *kept)
