"""Descriptor-relative removal beneath a root that never follows a symlink.

The restore engine (native) does the restore's own writes; what Python still
does in the workspace goes through here: remove the staging directories an
interrupted restore left at the top of the workspace (``remove_stale_staging``).
``SafeRoot`` opens the root once and removes relative to descriptors with
``O_DIRECTORY | O_NOFOLLOW``, so a symlink standing where a directory was is
unlinked, never followed, and nothing outside the root is reached.
"""

from __future__ import annotations

import errno
import os
import stat

from . import _native

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# errnos meaning "a symlink or a non-directory stands on the path".
_NOT_A_REAL_DIR = (errno.ELOOP, errno.ENOTDIR)


class SafeRoot:
    """A directory reached only through its descriptor. Not thread-safe:
    use from one thread at a time. Close it (or use ``with``) to release the
    descriptor.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        # The root path itself comes from the operator, not the sandbox: it may be a
        # symlink (/workspace -> /data/ws); everything beneath it is untrusted.
        self._root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def close(self) -> None:
        if self._root_fd >= 0:
            os.close(self._root_fd)
            self._root_fd = -1

    def __enter__(self) -> SafeRoot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def remove_top_level(self, name: str) -> None:
        """Remove a top-level entry (a staging directory) and all it holds."""
        _remove_at(self._root_fd, name)

    def stale_staging_names(self) -> list[str]:
        """Staging directories an interrupted restore left behind."""
        with os.scandir(self._root_fd) as entries:
            return [
                entry.name
                for entry in entries
                if entry.name.startswith(_native.STAGING_PREFIX)
                and entry.is_dir(follow_symlinks=False)
            ]


def _remove_at(parent_fd: int, name: str) -> None:
    """Remove ``name`` in ``parent_fd``: unlink a non-directory, or a whole tree."""
    try:
        info = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(info.st_mode):
        try:
            os.unlink(name, dir_fd=parent_fd)
        except FileNotFoundError:
            pass
        return
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError as error:
        if error.errno in _NOT_A_REAL_DIR:  # swapped for a link meanwhile: unlink it
            os.unlink(name, dir_fd=parent_fd)
            return
        raise
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) & 0o700 != 0o700:
            os.fchmod(fd, 0o700)  # so a non-root owner can list and empty it
        with os.scandir(fd) as entries:
            names = [entry.name for entry in entries]
        for child in names:
            _remove_at(fd, child)
    finally:
        os.close(fd)
    try:
        os.rmdir(name, dir_fd=parent_fd)
    except FileNotFoundError:
        pass


def remove_stale_staging(root: str | os.PathLike[str]) -> list[str]:
    """Remove the staging directories interrupted restores left at the top of
    ``root`` (``_native.STAGING_PREFIX``: a killed restore's, tens of MB that no
    capture holds and that only the next restore removed) and nothing else;
    a staging directory some process holds open (a restore running now) is
    left alone.
    Returns the names removed. Blocks: call it in a worker thread."""
    with SafeRoot(root) as safe:
        stale = safe.stale_staging_names()
        if not stale:
            return []
        base = os.path.realpath(root)
        held = _held_paths()
        removed = []
        for name in stale:
            path = os.path.join(base, name)
            if any(target == path or target.startswith(path + "/") for target in held):
                continue
            safe.remove_top_level(name)
            removed.append(name)
        return removed


def _held_paths() -> set[str]:
    """What the open descriptors of every process we may look at point to
    (``/proc/*/fd``): a restore holds its staging directory open throughout."""
    held: set[str] = set()
    try:
        pids = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return held
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue  # gone, or not ours to look at
        for fd in fds:
            try:
                held.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
            except OSError:
                continue
    return held
