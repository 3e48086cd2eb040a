"""The workspace's base: the checkpoint it was last captured to or restored from.

A restore that would overwrite live changes saves them first (the stash,
docs/restore-history.md). It knows whether there are any by comparing the live
tree with the base: a workspace that still equals the checkpoint it came from
holds nothing the store lacks. The base is kept beside the tree's stat cache
(``statcache/<tree id>.base``, one per scanned tree, in the data directory that
code in the sandbox cannot write), written by every capture and restore once
they succeed.

The record is advice, never trusted for content: it names a checkpoint, and
the comparison is with that checkpoint's manifest. A record that is stale (a
crash between an append and its write, a failed write) can only make a restore
stash what the store already holds; one that cannot be read, or that was made
for another directory at the same path (the root's device and inode differ: a
new sandbox), is no base at all.

While a restore that stashed is applying, the record also names it
(``restoring``): rerun after a crash, the same restore does not stash its own
half-applied tree again, and an interrupted undo resumes the same undo.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from typing import Any

_log = logging.getLogger("checkpointd.workspace_base")

_VERSION = 1
_CACHE_SUFFIX = ".cache"


@dataclass(frozen=True, slots=True)
class PendingRestore:
    """A restore that stashed the live tree and had not finished applying."""

    thread_id: str
    checkpoint_id: str
    stash_checkpoint_id: str


@dataclass(frozen=True, slots=True)
class WorkspaceBase:
    """The checkpoint the tree was last captured to or restored from (None
    when only a pending restore is known), and the restore under way."""

    thread_id: str | None
    checkpoint_id: str | None
    restoring: PendingRestore | None = None


def base_path(cache_path: str) -> str:
    """The base record beside the stat cache at ``cache_path``."""
    stem = cache_path[: -len(_CACHE_SUFFIX)] if cache_path.endswith(_CACHE_SUFFIX) else cache_path
    return stem + ".base"


def _root_identity(root: str) -> list[int] | None:
    try:
        info = os.stat(root)
    except OSError:
        return None
    return [info.st_dev, info.st_ino]


def _optional_text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def read_base(cache_path: str, root: str) -> WorkspaceBase | None:
    """The base recorded for the tree at ``root``, or None (no record, an
    unreadable one, or one made for another directory at that path)."""
    try:
        with open(base_path(cache_path), "rb") as handle:
            document = json.loads(handle.read(64 * 1024))
    except (OSError, ValueError):
        return None
    if not isinstance(document, dict) or document.get("version") != _VERSION:
        return None
    identity = _root_identity(root)
    if identity is None or document.get("root") != identity:
        return None
    pending = document.get("restoring")
    restoring = None
    if isinstance(pending, dict):
        fields = [_optional_text(pending.get(k)) for k in ("thread", "checkpoint", "stash")]
        if all(fields):
            restoring = PendingRestore(*fields)  # type: ignore[arg-type]
    base = WorkspaceBase(
        _optional_text(document.get("thread")),
        _optional_text(document.get("checkpoint")),
        restoring,
    )
    if base.checkpoint_id is None and restoring is None:
        return None
    return base


def _write(cache_path: str, root: str, document: dict[str, Any]) -> None:
    """Replace the record atomically (rename); a failure is logged, not raised:
    without a record the next restore compares with an older base or none."""
    identity = _root_identity(root)
    if identity is None:
        return
    document = {"version": _VERSION, "root": identity, **document}
    path = base_path(cache_path)
    temporary = f"{path}.{os.getpid()}.tmp"
    try:
        with open(temporary, "w", encoding="utf-8") as handle:
            json.dump(document, handle, ensure_ascii=False)
        os.replace(temporary, path)
    except OSError as error:
        _log.warning("could not record the workspace's base in %s: %s", path, error)
        try:
            os.unlink(temporary)
        except OSError:
            pass


def record_base(cache_path: str, root: str, thread_id: str, checkpoint_id: str) -> None:
    """The tree at ``root`` now equals checkpoint ``checkpoint_id`` of ``thread_id``."""
    _write(cache_path, root, {"thread": thread_id, "checkpoint": checkpoint_id})


def record_restoring(
    cache_path: str, root: str, base: WorkspaceBase | None, pending: PendingRestore
) -> None:
    """A restore stashed the live tree and is about to change it: keep the
    base as it was and name the restore, until ``record_base`` replaces both."""
    _write(
        cache_path,
        root,
        {
            "thread": base.thread_id if base is not None else None,
            "checkpoint": base.checkpoint_id if base is not None else None,
            "restoring": {
                "thread": pending.thread_id,
                "checkpoint": pending.checkpoint_id,
                "stash": pending.stash_checkpoint_id,
            },
        },
    )


__all__ = [
    "PendingRestore",
    "WorkspaceBase",
    "base_path",
    "read_base",
    "record_base",
    "record_restoring",
]
