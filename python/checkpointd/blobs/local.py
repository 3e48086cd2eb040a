"""Plain-``os`` access to the blobs of a ``file://`` store, for batch work.

Going through obstore costs one asyncio round trip (and a hop to its own thread
pool) per blob, which dominates when a workspace is thousands of small files.
The engines instead hand a batch of blobs to one worker thread that calls this
class directly. It writes exactly what obstore's ``LocalStore`` reads and lists,
so both paths can share one directory:

* a key ``a/b/c`` is the file ``<root>/a/b/c``. Only keys made of plain
  characters (letters, digits, ``._-``) take this path; obstore percent-encodes
  anything else, so such keys return None from ``path`` and callers fall back
  to the store's async API;
* a blob appears only complete: its bytes go to an unnamed ``O_TMPFILE`` in
  the key's directory, which is then linked to the final name (through
  ``/proc/self/fd``); the link fails when the key exists. A killed writer
  leaves nothing at all. Where ``O_TMPFILE`` or ``/proc`` is missing, the bytes
  go to ``<file>#<digits>`` instead (the name obstore uses for its own staging
  files, which its listings hide, so the sweep never sees one), hard-linked to
  the final name and then removed: a killed writer leaves at most a hidden
  staging file, never a truncated blob;
* the file's mtime is the upload time the sweep reads from ``list``.

The batch methods (``put_many``, ``missing``, ``get_many``) run natively
(``checkpointd._native.BlobDir``: fd-relative, GIL released, one filesystem
sync per batch that wrote anything, so blobs are durable before the append that
references them). An OSError there becomes BlobStoreError naming the blob's
path; ENOSPC leaves no partial blob (unnamed files until complete).

Every method blocks; call them from a worker thread.
"""

from __future__ import annotations

import errno
import os
import random
import re
import stat

from .. import _native
from .base import BlobNotFoundError, BlobStoreError, VerifiedFile

# Keys obstore maps to a path unchanged (no percent-encoding).
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*(/[A-Za-z0-9_-][A-Za-z0-9._-]*)*")
_READ_FLAGS = os.O_RDONLY | os.O_CLOEXEC
_STAGING_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
_O_TMPFILE = getattr(os, "O_TMPFILE", 0)
# What open(O_TMPFILE) or the /proc link fail with where they are not available:
# the filesystem refuses it, the kernel predates it (EISDIR), no /proc (ENOENT).
_NO_TMPFILE = (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.ENOENT, errno.EXDEV)
# Attempts at a fresh staging name (another writer may hold one by chance).
_STAGING_ATTEMPTS = 8
_random = random.SystemRandom()


class LocalBlobDir:
    """The directory behind a ``file://`` blob store (see the module docstring).

    ``url`` names the store in errors (no credentials: a local path).
    """

    def __init__(self, root: str, url: str) -> None:
        self.root = root
        self.url = url
        # Cleared at the first sign that unnamed temporary files do not work here.
        self.use_tmpfile = bool(_O_TMPFILE)
        self._native: _native.BlobDir | None = None

    def _batches(self) -> _native.BlobDir:
        """The native directory handle (opened, and the directory created, on first use)."""
        if self._native is None:
            try:
                self._native = _native.BlobDir(self.root)
            except OSError as error:
                raise BlobStoreError(
                    f"open blob directory {self.root!r} of {self.url} failed: "
                    f"{error.strerror or error}"
                ) from error
        return self._native

    def _batch_error(self, error: OSError) -> BlobStoreError:
        """The native OSError as BlobStoreError naming the blob's path and the store."""
        what = error.args[1] if len(error.args) > 1 else str(error)  # "put 'key': ..."
        what = what.split(":", 1)[0]
        if error.errno == errno.ENOSPC:
            reason = "no space left on device (no blob was half-written; free space and retry)"
        else:
            reason = error.strerror or str(error)
        return BlobStoreError(f"{what} at {error.filename} on {self.url} failed: {reason}")

    def put_many(self, items: list[tuple[str, bytes]]) -> list[bool]:
        """Store each plain-keyed ``(key, bytes)`` unless the key exists; per item
        whether it was written. Durable on return. Raises BlobStoreError."""
        try:
            return self._batches().put_many(items)
        except OSError as error:
            raise self._batch_error(error) from error

    def put_verified(self, key: str, source: VerifiedFile) -> bool:
        """Stream a verified file into the plain ``key`` natively (unless it
        exists: False); durable on return. ``source.on_bytes`` is the caller's
        to drive (``object_store._copy_natively`` polls the reader's
        ``bytes_verified`` while this runs). Raises the reader's
        FileChangedError (nothing stored; ``source.changed`` set),
        ScanCancelled, or BlobStoreError."""
        try:
            written = self._batches().put_verified(key, source.reader, source.cancel)
        except _native.FileChangedError:
            source.changed = True
            raise
        except OSError as error:
            raise self._batch_error(error) from error
        return written

    def put_learned(
        self, beside: str, source: VerifiedFile, unless_beside: bool = False
    ) -> tuple[str, bool]:
        """Stream an unhashed reader's file natively into the directory of the
        plain key ``beside``, named by the digest its bytes had: (that key,
        whether written); ``(beside, False)``, nothing read, when
        ``unless_beside`` and that blob exists. Raises as ``put_verified``."""
        try:
            return self._batches().put_learned(beside, source.reader, source.cancel, unless_beside)
        except _native.FileChangedError:
            source.changed = True
            raise
        except OSError as error:
            raise self._batch_error(error) from error

    def put_durably(self, key: str, data: bytes | memoryview) -> bool:
        """``put_if_absent``, then ``sync`` when written: durable on return
        (one file's sync, not the filesystem's). Raises BlobStoreError."""
        written = self.put_if_absent(key, data)
        if written:
            self.sync(key)
        return written

    def sync(self, key: str) -> None:
        """Make a blob obstore's ``LocalStore`` wrote durable (it does not sync):
        its bytes, then its directory entry. Raises BlobStoreError."""
        path = self._path(key)
        try:
            for target, flags in ((path, _READ_FLAGS), (os.path.dirname(path), _READ_FLAGS)):
                fd = os.open(target, flags)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        except OSError as error:
            raise self._error("sync", key, error) from error

    def missing(self, keys: list[str]) -> list[str]:
        """The plain keys that are not there, in order. Raises BlobStoreError."""
        try:
            return [keys[i] for i in self._batches().missing(keys)]
        except OSError as error:
            raise self._batch_error(error) from error

    def get_many(self, keys: list[str]) -> list[bytes]:
        """Each plain key's bytes. Raises BlobNotFoundError, BlobStoreError."""
        try:
            found = self._batches().get_many(keys)
        except OSError as error:
            raise self._batch_error(error) from error
        out: list[bytes] = []
        for key, data in zip(keys, found, strict=True):
            if data is None:
                raise BlobNotFoundError(key)
            out.append(data)
        return out

    def get_ranges(self, key: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        """The bytes ``[start, end)`` of each range of the plain ``key``, read
        through one descriptor (short past the end of the file). Raises
        BlobNotFoundError, BlobStoreError."""
        fd = self.open_for_reading(key)
        try:
            return [_pread_fully(fd, end - start, start) for start, end in ranges]
        except OSError as error:
            raise self._error("get", key, error) from error
        finally:
            os.close(fd)

    def __repr__(self) -> str:
        return f"LocalBlobDir({self.root!r})"

    def path(self, key: str) -> str | None:
        """The file holding ``key``, or None when the key needs obstore's encoding."""
        if _PLAIN_KEY.fullmatch(key) is None:
            return None
        return f"{self.root}/{key}"

    def _path(self, key: str) -> str:
        path = self.path(key)
        if path is None:
            raise ValueError(f"blob key {key!r} has no plain local path")
        return path

    def _error(self, operation: str, key: str, error: OSError) -> BlobStoreError:
        return BlobStoreError(f"{operation} {key!r} on {self.url} failed: {error}")

    def exists(self, key: str) -> bool:
        """Whether the blob is there (a regular file, as obstore's ``head`` sees it).

        Raises BlobStoreError when the directory cannot be read.
        """
        try:
            info = os.stat(self._path(key))
        except (FileNotFoundError, NotADirectoryError):
            return False
        except OSError as error:
            raise self._error("head", key, error) from error
        return stat.S_ISREG(info.st_mode)

    def put_if_absent(self, key: str, data: bytes | memoryview) -> bool:
        """Store ``data`` under ``key`` unless the key exists; True when written.

        Raises BlobStoreError when the directory refuses the write.
        """
        final = self._path(key)
        if self.use_tmpfile:
            try:
                written = self._put_unnamed(final, data)
            except OSError as error:
                if error.errno not in _NO_TMPFILE:
                    raise self._error("put", key, error) from error
                self.use_tmpfile = False
            else:
                return written
        try:
            staging, fd = self._create_staging(final)
        except OSError as error:
            raise self._error("put", key, error) from error
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
            try:
                os.link(staging, final)
            except FileExistsError:
                return False  # content-addressed: what is there is these bytes
            return True
        except OSError as error:
            raise self._error("put", key, error) from error
        finally:
            try:
                os.unlink(staging)
            except FileNotFoundError:
                pass

    def _put_unnamed(self, final: str, data: bytes | memoryview) -> bool:
        """Write an unnamed file next to ``final`` and link it there; True when
        linked, False when the key exists; OSError(ENOENT...) when unsupported."""
        directory = os.path.dirname(final)
        flags = _O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC
        try:
            fd = os.open(directory, flags, 0o666)
        except FileNotFoundError:
            os.makedirs(directory, exist_ok=True)
            fd = os.open(directory, flags, 0o666)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            try:
                # Python calls linkat(AT_SYMLINK_FOLLOW), which links the open
                # file itself, only when a dir fd is given; an absolute source
                # path makes the kernel ignore it, so the file's own fd serves.
                os.link(f"/proc/self/fd/{fd}", final, src_dir_fd=fd, follow_symlinks=True)
            except FileExistsError:
                return False  # content-addressed: what is there is these bytes
            return True
        finally:
            os.close(fd)

    def _create_staging(self, final: str) -> tuple[str, int]:
        for attempt in range(_STAGING_ATTEMPTS):
            staging = f"{final}#{_random.randrange(10**12, 10**13)}"
            try:
                return staging, os.open(staging, _STAGING_FLAGS, 0o666)
            except FileNotFoundError:
                if attempt:
                    raise
                os.makedirs(os.path.dirname(final), exist_ok=True)
            except FileExistsError:
                continue
        raise FileExistsError(f"no free staging name next to {final}")

    def open_for_reading(self, key: str) -> int:
        """A read-only descriptor of the blob (the caller closes it).

        Raises BlobNotFoundError when it is missing, BlobStoreError when it
        cannot be opened.
        """
        try:
            fd = os.open(self._path(key), _READ_FLAGS)
        except (FileNotFoundError, NotADirectoryError):
            raise BlobNotFoundError(key) from None
        except OSError as error:
            raise self._error("get", key, error) from error
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise BlobNotFoundError(key)  # a directory: obstore reports it missing
        except BaseException:
            os.close(fd)
            raise
        return fd


def _pread_fully(fd: int, length: int, offset: int) -> bytes:
    """``length`` bytes at ``offset``, fewer only at the end of the file."""
    if length <= 0:
        return b""
    data = os.pread(fd, length, offset)
    if len(data) == length or not data:
        return data
    parts = [data]
    got = len(data)
    while got < length:
        more = os.pread(fd, length - got, offset + got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


__all__ = ["LocalBlobDir"]
