"""Filesystem operations beneath a root that never follow a symlink (openat style).

Restore writes into a workspace that untrusted code controls, from a manifest that
may be hostile. A path like ``a/b/c`` is therefore never handed to the kernel as a
string: ``SafeRoot`` opens the root once and walks component by component with
``O_DIRECTORY | O_NOFOLLOW`` relative to the parent's descriptor, then acts on the
last name with the ``*at`` call (``dir_fd=``, ``follow_symlinks=False``). A symlink
or a file standing where a directory must be is either reported as absent (when
reading or deleting) or removed and replaced by a real directory (when creating):
the link itself is unlinked, never its target. So nothing outside the root is ever
created, changed or deleted, even if a directory is swapped for a symlink while
we work.

What this does not defend against: a directory that was already opened being
*renamed* out of the root by a concurrent process. Restore's rule is that nothing
else writes to the workspace while it runs; symlink tricks are the threat here.
"""

from __future__ import annotations

import errno
import os
import secrets as _random
import stat
from collections import OrderedDict

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a fifo swapped in where a file was expected must not hang the open.
_LEAF_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# errnos meaning "a symlink or a non-directory stands on the path".
_NOT_A_REAL_DIR = (errno.ELOOP, errno.ENOTDIR)
# Directory descriptors kept open for reuse; manifests are sorted, so locality is
# high and a small cache saves most re-walks without risking the fd limit.
_FD_CACHE_SIZE = 128

STAGING_PREFIX = ".checkpointd-staging-"
_PROC_FD = "/proc/self/fd"


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
        self._proc_works: bool | None = None

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

    # -- queries --------------------------------------------------------------

    def lstat(self, rel: str) -> os.stat_result | None:
        """The entry's own stat (never its target's), or None when absent."""
        fd, name = self.parent_fd(rel)
        if fd is None:
            return None
        try:
            return os.stat(name, dir_fd=fd, follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError):
            return None

    # -- changes --------------------------------------------------------------

    def ensure_dir(self, rel: str) -> int:
        """Make ``rel`` a real directory (creating parents); returns its descriptor."""
        fd = self.dir_fd(rel, create=True)
        assert fd is not None
        return fd

    def remove(self, rel: str) -> None:
        """Remove whatever stands at ``rel`` (a whole tree for a directory).

        Missing is fine; a parent that is a symlink means the entry is not beneath
        the root, so nothing is done.
        """
        fd, name = self.parent_fd(rel)
        if fd is None:
            return
        self._forget(rel)
        _remove_at(fd, name)

    def remove_leaf(self, rel: str) -> None:
        """Unlink a file, symlink or special file at ``rel``; a directory stays."""
        fd, name = self.parent_fd(rel)
        if fd is None:
            return
        try:
            os.unlink(name, dir_fd=fd)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            pass

    def remove_dir_if_empty(self, rel: str) -> bool:
        """rmdir ``rel``; False when it holds something (e.g. excluded paths)."""
        fd, name = self.parent_fd(rel)
        if fd is None:
            return True
        self._forget(rel)
        try:
            os.rmdir(name, dir_fd=fd)
        except FileNotFoundError:
            return True
        except OSError as error:
            if error.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                return False
            raise
        return True

    def rename_into(self, src_dir_fd: int, src_name: str, rel: str) -> None:
        """Atomically move ``src_name`` (in ``src_dir_fd``) to ``rel``.

        Parents are created as needed; a directory standing at ``rel`` is removed
        first (rename cannot replace a directory with a file); a file or symlink
        there is replaced atomically.
        """
        fd, name = self.parent_fd(rel, create=True)
        assert fd is not None
        try:
            existing = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            existing = None
        if existing is not None and stat.S_ISDIR(existing.st_mode):
            self._forget(rel)
            _remove_at(fd, name)
        os.rename(src_name, name, src_dir_fd=src_dir_fd, dst_dir_fd=fd)

    def chmod(self, rel: str, mode: int, *, is_dir: bool) -> None:
        """Set the permission bits of the file or directory at ``rel``.

        The entry is opened with O_NOFOLLOW and changed through its descriptor, so
        a symlink swapped in is never followed; an entry of the wrong kind (or
        missing) is left alone.
        """
        if is_dir:
            fd = self.dir_fd(rel)
            if fd is not None:
                os.fchmod(fd, mode)
            return
        parent, name = self.parent_fd(rel)
        if parent is None:
            return
        try:
            leaf = os.open(name, _LEAF_FLAGS, dir_fd=parent)
        except FileNotFoundError:
            return
        except OSError as error:
            if error.errno in _NOT_A_REAL_DIR:
                return
            if error.errno != errno.EACCES:
                raise
            self._chmod_unreadable(parent, name, mode)
            return
        try:
            if stat.S_ISREG(os.fstat(leaf).st_mode):
                os.fchmod(leaf, mode)
        finally:
            os.close(leaf)

    @staticmethod
    def _chmod_unreadable(parent: int, name: str, mode: int) -> None:
        # A file we may not read (e.g. mode 0200 for a non-root user): an O_PATH
        # descriptor needs no permission, and /proc/self/fd/N names exactly that
        # inode, so chmod through it cannot reach anything else.
        leaf = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
        try:
            if stat.S_ISREG(os.fstat(leaf).st_mode):
                os.chmod(f"/proc/self/fd/{leaf}", mode)
        finally:
            os.close(leaf)

    def set_mtime(self, rel: str, mtime_ns: int) -> None:
        """Set the modification time of ``rel`` itself (a link is not followed)."""
        fd, name = self.parent_fd(rel)
        if fd is None:
            return
        try:
            current = os.stat(name, dir_fd=fd, follow_symlinks=False)
            os.utime(name, ns=(current.st_atime_ns, mtime_ns), dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            pass

    # -- handing a path to code that opens by name -----------------------------

    def pinned(self, rel: str) -> PinnedPath | None:
        """A path naming ``rel`` that stays beneath the root when opened by name.

        The native reader opens files by path (with O_NOFOLLOW on the last name
        only). Given ``/proc/self/fd/<parent fd>/<name>``, where the parent was
        reached without following symlinks, the kernel resolves exactly that
        directory, so a directory swapped for a link to ``/etc`` cannot redirect
        the read. None when a parent is missing or not a real directory. Without
        /proc the plain path is returned (then only the caller's content checks
        protect it). Close the result once the path was opened.
        """
        parent, name = split_parent(rel)
        fd = self.dir_fd(parent)
        if fd is None:
            return None
        own = os.dup(fd)  # the cached fd may be closed meanwhile; this one is ours
        if self._proc_works is None:
            self._proc_works = os.path.isdir(f"{_PROC_FD}/{own}")
        if not self._proc_works:
            os.close(own)
            return PinnedPath(-1, os.path.join(self._root_path, rel), name)
        return PinnedPath(own, f"{_PROC_FD}/{own}/{name}", name)

    # -- staging --------------------------------------------------------------

    def make_staging(self) -> tuple[str, int]:
        """A fresh private directory at the top of the root (same filesystem, so
        renames from it are atomic); returns (name, descriptor)."""
        name = STAGING_PREFIX + _random.token_hex(8)
        os.mkdir(name, 0o700, dir_fd=self._root_fd)
        return name, os.open(name, _DIR_FLAGS, dir_fd=self._root_fd)

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


class PinnedPath:
    """A path for ``open`` by name, pinned to a directory descriptor (see
    ``SafeRoot.pinned``); ``dir_fd`` is -1 when /proc is unavailable."""

    def __init__(self, dir_fd: int, path: str, name: str) -> None:
        self.dir_fd = dir_fd
        self.path = path
        self.name = name

    def lstat(self) -> os.stat_result:
        """The entry itself, through the pinned directory (never a link's target)."""
        if self.dir_fd < 0:
            return os.lstat(self.path)
        return os.stat(self.name, dir_fd=self.dir_fd, follow_symlinks=False)

    def close(self) -> None:
        if self.dir_fd >= 0:
            os.close(self.dir_fd)
            self.dir_fd = -1

    def __enter__(self) -> PinnedPath:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def create_file(dir_fd: int, name: str) -> int:
    """A new, private (0600) file ``name`` in ``dir_fd``, open for writing."""
    return os.open(name, _NEW_FILE_FLAGS, 0o600, dir_fd=dir_fd)


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
