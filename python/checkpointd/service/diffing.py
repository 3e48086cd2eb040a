"""Diff two manifests, or a manifest and the live workspace (the Diff RPC).

A change is one of: added, deleted, modified (content, entry kind or symlink
target differ) or mode changed (only the mode differs). A file's mtime alone is
not a change: restore sets mtimes, and content is what a checkpoint promises.
Changes come out sorted by the UTF-8 bytes of the path, like manifests.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..model import DirEntry, Entry, FileEntry, Policy, SymlinkEntry
from ..statcache_paths import stat_cache_path

ChangeKind = Literal["added", "deleted", "modified", "mode_changed"]


@dataclass(frozen=True, slots=True)
class Change:
    path: str
    kind: ChangeKind
    old: Entry | None
    new: Entry | None


def _compare(old: Entry, new: Entry) -> ChangeKind | None:
    if type(old) is not type(new):
        return "modified"
    if isinstance(old, FileEntry) and isinstance(new, FileEntry):
        if old.blob_key != new.blob_key or old.size != new.size:
            return "modified"
        return "mode_changed" if old.mode != new.mode else None
    if isinstance(old, SymlinkEntry) and isinstance(new, SymlinkEntry):
        return "modified" if old.target != new.target else None
    if isinstance(old, DirEntry) and isinstance(new, DirEntry):
        return "mode_changed" if old.mode != new.mode else None
    return None


def diff_entries(old: Sequence[Entry], new: Sequence[Entry]) -> Iterator[Change]:
    """The changes that turn manifest ``old`` into manifest ``new``."""
    before = {entry.path: entry for entry in old}
    after = {entry.path: entry for entry in new}
    for path in sorted(
        before.keys() | after.keys(), key=lambda p: p.encode("utf-8", "surrogateescape")
    ):
        was, now = before.get(path), after.get(path)
        if was is None:
            yield Change(path, "added", None, now)
        elif now is None:
            yield Change(path, "deleted", was, None)
        else:
            kind = _compare(was, now)
            if kind is not None:
                yield Change(path, kind, was, now)


async def scan_live(
    workspace_root: Path,
    subdir: str,
    policy: Policy | None,
    secrets: Sequence[bytes],
    data_dir: Path,
) -> tuple[Entry, ...]:
    """The live manifest of ``subdir`` ("" for the whole workspace), scanned
    natively off the event loop.

    The sub-root is held by fd exactly as capture holds it (``capture._SubRoot``:
    opened from the workspace root one component at a time with O_NOFOLLOW), so
    sandbox code that swaps a component for a symlink gets INVALID_PATH or the
    directory we opened, never an outside directory diffed in the workspace's
    name. Shares capture's stat cache (so unchanged files are not read again).
    Entries capture would refuse (fifos, escaping links...) are left out.
    Cancelling the caller stops the scan. Raises what ``scanner.scan_workspace``
    raises (SandboxCheckpointInvalidArgumentError for a bad secret, pattern or
    root) and SandboxSnapshotError(INVALID_PATH) for a sub-root that is not a
    real directory beneath the root.
    """
    from .. import _native
    from .._engine import run_in_thread
    from ..capture import _SubRoot
    from ..scanner import scan_workspace

    workspace = os.path.abspath(workspace_root)  # noqa: ASYNC240 - no I/O
    root = os.path.join(workspace, subdir) if subdir else workspace
    cache = stat_cache_path(data_dir, workspace, subdir)
    token = _native.CancelToken()

    def scan() -> tuple[Entry, ...]:
        subroot = _SubRoot.open(workspace, subdir)
        try:
            return scan_workspace(root, policy, secrets, cache, token, root_fd=subroot.fd).entries
        finally:
            subroot.close()

    return await run_in_thread(scan, token.cancel)
