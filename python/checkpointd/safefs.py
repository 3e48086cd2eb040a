"""Descriptor-relative access beneath a root that never follows a symlink.

The restore engine (native) does the restore's own writes; what Python still
does in the workspace goes through here: open a file for the secret write-back
(``parent_fd``), and remove the staging directories an interrupted restore left
at the top of the workspace (``remove_stale_staging``). A path like ``a/b/c`` is
never handed to the kernel as a string: ``SafeRoot`` opens the root once and walks
component by component with ``O_DIRECTORY | O_NOFOLLOW`` relative to the parent's
descriptor, so a symlink or a file standing where a directory must be is reported
as absent, and nothing outside the root is reached, even if a directory is
swapped for a symlink while we work.
"""

from __future__ import annotations

import errno
import os
import stat
from collections import OrderedDict

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# errnos meaning "a symlink or a non-directory stands on the path".
_NOT_A_REAL_DIR = (errno.ELOOP, errno.ENOTDIR)
# Directory descriptors kept open for reuse; manifests are sorted, so locality is
# high and a small cache saves most re-walks without risking the fd limit.
_FD_CACHE_SIZE = 128

STAGING_PREFIX = ".checkpointd-staging-"


def split_parent(rel: str) -> tuple[str, str]:
    """('a/b', 'c') for 'a/b/c'; ('', 'c') for 'c'."""
    parent, _, name = rel.rpartition("/")
    return parent, name


def _under(path: str, ancestor: str) -> bool:
    return path == ancestor or path.startswith(ancestor + "/")


class SafeRoot:
    """A directory tree reached only through descriptors beneath one root fd.

    Paths are workspace-relative, '/'-separated, already validated (no '..', no
    empty segment); ``""`` is the root itself. Not thread-safe: use from one
    thread (or the event loop) at a time. Close it (or use ``with``) to release
    the descriptors.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        # The root path itself comes from the operator, not the sandbox: it may be a
        # symlink (/workspace -> /data/ws); everything beneath it is untrusted.
        self._root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._root_path = os.fspath(root)
        self._fds: OrderedDict[str, int] = OrderedDict()

    @property
    def root_fd(self) -> int:
        return self._root_fd

    def close(self) -> None:
        self._forget("")
        if self._root_fd >= 0:
            os.close(self._root_fd)
            self._root_fd = -1

    def __enter__(self) -> SafeRoot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- descriptor walking ---------------------------------------------------

    def _remember(self, rel: str, fd: int) -> None:
        self._fds[rel] = fd
        while len(self._fds) > _FD_CACHE_SIZE:
            _, old = self._fds.popitem(last=False)
            os.close(old)

    def _forget(self, rel: str) -> None:
        """Close cached descriptors of ``rel`` and everything beneath it."""
        for key in [key for key in self._fds if rel == "" or _under(key, rel)]:
            os.close(self._fds.pop(key))

    def dir_fd(self, rel: str, *, create: bool = False) -> int | None:
        """A descriptor of directory ``rel`` beneath the root, or None if absent.

        Absent means missing, or a symlink or a non-directory stands on the path.
        With ``create`` missing directories are made (mode 0700, the final mode is
        applied later) and anything else standing in the way is removed first.
        The descriptor belongs to this object: do not close it.
        """
        if rel == "":
            return self._root_fd
        cached = self._fds.get(rel)
        if cached is not None:
            self._fds.move_to_end(rel)
            return cached
        # Start from the deepest cached ancestor, then walk down.
        parts = rel.split("/")
        start, fd = 0, self._root_fd
        for depth in range(len(parts) - 1, 0, -1):
            prefix = "/".join(parts[:depth])
            found = self._fds.get(prefix)
            if found is not None:
                self._fds.move_to_end(prefix)
                start, fd = depth, found
                break
        for depth in range(start, len(parts)):
            child = self._open_child_dir(fd, parts[depth], create)
            if child is None:
                return None
            fd = child
            self._remember("/".join(parts[: depth + 1]), fd)
        return fd

    def _open_child_dir(self, parent_fd: int, name: str, create: bool) -> int | None:
        for _ in range(8):  # bounded: a racing writer cannot keep us looping
            try:
                return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
            except FileNotFoundError:
                if not create:
                    return None
            except OSError as error:
                if error.errno not in _NOT_A_REAL_DIR:
                    raise
                if not create:
                    return None
                # A symlink or file where a directory must be: remove it (the link
                # itself, never what it points to).
                _remove_at(parent_fd, name)
            try:
                os.mkdir(name, 0o700, dir_fd=parent_fd)
            except FileExistsError:
                continue
        raise OSError(errno.EAGAIN, f"directory {name!r} keeps changing under the restore")

    def parent_fd(self, rel: str, *, create: bool = False) -> tuple[int | None, str]:
        parent, name = split_parent(rel)
        return self.dir_fd(parent, create=create), name

    # -- staging --------------------------------------------------------------

    def remove_top_level(self, name: str) -> None:
        """Remove a top-level entry (a staging directory) and all it holds."""
        _remove_at(self._root_fd, name)

    def stale_staging_names(self) -> list[str]:
        """Staging directories an interrupted restore left behind."""
        with os.scandir(self._root_fd) as entries:
            return [
                entry.name
                for entry in entries
                if entry.name.startswith(STAGING_PREFIX) and entry.is_dir(follow_symlinks=False)
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
    ``root`` (``STAGING_PREFIX``: a killed restore's, tens of MB that no
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
