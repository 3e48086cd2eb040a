"""Where the stat cache lives: a data directory outside the workspace (docs/contract.md#capture).

The stat cache lets a capture trust a file's previous hash without reading it.
If code in the sandbox could write it, that code could make a capture store a
stale hash for a changed file; so the data directory must not lie inside the
workspace, and ``resolve_data_dir`` refuses one that does.

A capture's scan writes its cache beside the live one (``PendingStatCache``),
which it replaces only once the checkpoint is committed. A file whose hash the
cache vouches for is not read by the scan, so its bytes are not handed to the
upload as they are read (the batched, packed path); the upload reads it again
itself, a file at a time. That costs nothing when the blob is stored already,
which is what a committed capture's cache stands for. A capture that failed
after its scan (a full disk, a kill) stored nothing of the files it hashed:
with their hashes in the live cache, its retry would read every one of them
the slow way (10x a cold capture). Left out, the retry scans them as a cold
capture does.
"""

from __future__ import annotations

import contextlib
import glob
import os
import uuid
from pathlib import Path

import blake3

from . import _native
from .errors import SandboxCheckpointInvalidArgumentError

DEFAULT_DATA_DIR = "~/.local/state/checkpointd"


def _is_within(path: str, ancestor: str) -> bool:
    return path == ancestor or path.startswith(ancestor.rstrip("/") + "/")


def resolve_data_dir(
    workspace_root: str | os.PathLike[str], data_dir: str | os.PathLike[str] | None
) -> Path:
    """The absolute data directory, created if missing (mode 0700).

    Raises SandboxCheckpointInvalidArgumentError when it is the workspace or lies
    inside it (symlinks resolved on both sides, so a link cannot sneak it in).
    """
    chosen = Path(
        os.path.expanduser(os.fspath(data_dir) if data_dir is not None else DEFAULT_DATA_DIR)
    )
    resolved_data = os.path.realpath(chosen)
    resolved_root = os.path.realpath(workspace_root)
    if _is_within(resolved_data, resolved_root):
        raise SandboxCheckpointInvalidArgumentError(
            f"data_dir {os.fspath(chosen)!r} lies inside the workspace {os.fspath(workspace_root)!r}; "
            "code in the sandbox could forge the stat cache",
            details={"data_dir": os.fspath(chosen)},
        )
    path = Path(resolved_data)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def stat_cache_path(
    data_dir: Path, workspace_root: str | os.PathLike[str], subdir: str = ""
) -> str:
    """The stat-cache file of one scanned tree: one per resolved workspace root and
    (checked, normalised) sub-root. Only the operator's root is resolved: a path
    through the sandbox (the sub-root) is never resolved, since the sandbox can
    swap it for a symlink between two system calls."""
    tree = os.path.realpath(workspace_root)
    if subdir:
        tree = os.path.join(tree, subdir)
    root_id = blake3.blake3(os.fsencode(tree)).hexdigest()[:32]
    directory = data_dir / "statcache"
    directory.mkdir(mode=0o700, exist_ok=True)
    return os.fspath(directory / f"{root_id}.cache")


class PendingStatCache:
    """The stat cache a capture's scan loads and saves (``path``): a hard link
    of the live cache (``live``) until the scan saves, which replaces the link
    by a new file; ``commit`` makes it the live cache once the checkpoint is
    committed, ``discard`` drops it (a failed capture: the live cache stays as
    it was). The chunk cache beside each (its name plus
    ``CHUNK_CACHE_SUFFIX``) goes with it. A killed capture leaves its files
    behind; the next one removes them (each is named by the process that made
    it)."""

    def __init__(self, live: str) -> None:
        self.live = live
        self.path = f"{live}{_PENDING}{os.getpid()}-{uuid.uuid4().hex[:12]}"
        _remove_orphans(live)
        for pending, current in self._pairs():
            with contextlib.suppress(FileNotFoundError):  # none yet: the scan starts empty
                os.link(current, pending)

    def _pairs(self) -> tuple[tuple[str, str], ...]:
        """(pending, live) for the stat cache and for its chunk cache."""
        suffix = _native.CHUNK_CACHE_SUFFIX
        return ((self.path, self.live), (self.path + suffix, self.live + suffix))

    def commit(self) -> None:
        """Make the scan's caches the live ones (a no-op for one the scan did
        not save: its pending file is then the live one, linked)."""
        try:
            for pending, current in self._pairs():
                with contextlib.suppress(FileNotFoundError):
                    # (None written, or an orphan sweep took it: the live one stands.)
                    if not _same_file(pending, current):
                        os.replace(pending, current)
        finally:
            self.discard()

    def discard(self) -> None:
        for pending, _current in self._pairs():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(pending)


_PENDING = ".pending-"


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except FileNotFoundError:
        return False


def _remove_orphans(live: str) -> None:
    """Pending caches of ``live`` whose process is gone (killed mid-capture)."""
    for orphan in glob.glob(glob.escape(live + _PENDING) + "*"):
        pid = orphan[len(live) + len(_PENDING) :].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(orphan)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
