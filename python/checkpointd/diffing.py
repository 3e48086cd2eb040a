"""What changed between two manifests: the one rule, used by capture (is
there anything new?), the Diff RPC and the serve loop.

A change is one of: added, deleted, modified (content, entry kind or symlink
target differ) or mode changed (only the mode differs). A file's mtime alone is
not a change: restore sets mtimes, and content is what a checkpoint promises.
Changes come out sorted by the UTF-8 bytes of the path, like manifests.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from .model import DirEntry, Entry, FileEntry, SymlinkEntry

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
