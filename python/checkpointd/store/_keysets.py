"""Offloading document work, the key sets of the count runs and the contents cache of the
SQL checkpoint stores (see ``_core`` for the rules they serve)."""

from __future__ import annotations

import asyncio
import builtins
import gc
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from .. import _native
from ..manifest import split_digests
from . import _documents as documents
from ._packindex import PackedRows, check_packed_blobs, check_packed_columns, checked_digest

T = TypeVar("T")

# Documents of more entries than this are encoded/decoded in a worker thread.
OFFLOAD_ENTRIES = 2_000

Rows = dict[str, tuple[str | None, bytes]]  # id -> (base_id, stored document)


# ------------------------------------------------------------------------ offloading


class _GcPause:
    """Pauses the cyclic garbage collector while manifests are built.

    Decoding a 100k-entry manifest allocates about a million lists, tuples and
    entry objects; the collector would rescan the growing heap again and again
    (measured: ``list`` of ten such checkpoints 5.0 s with it, 1.9 s without).
    None of these objects form cycles, so reference counting frees them all the
    same. Re-entrant across threads: the collector comes back (if it was on)
    when the last pause ends.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0
        self._reenable = False

    def __enter__(self) -> None:
        with self._lock:
            if self._depth == 0:
                self._reenable = gc.isenabled()
                gc.disable()
            self._depth += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth == 0 and self._reenable:
                gc.enable()


_GC_PAUSE = _GcPause()


def paused(function: Callable[..., T], *args: Any) -> T:
    with _GC_PAUSE:
        return function(*args)


async def offload(size: int, function: Callable[..., T], *args: Any) -> T:
    """Run CPU-heavy document work in a worker thread (collector paused) when it is
    large, so the event loop keeps serving other calls (gRPC health, progress)."""
    if size > OFFLOAD_ENTRIES:
        return await asyncio.to_thread(paused, function, *args)
    return function(*args)


def content_size(content: documents.Content) -> int:
    """About the entries a content's work touches, for ``offload``: from the
    bytes its manifest holds (~180 per entry loaded, fewer compressed), so a
    manifest its store has not loaded is never loaded to decide."""
    return content.manifest.held_bytes() // 16


# ------------------------------------------------------------------------ keys


@dataclass(frozen=True, slots=True)
class KeySet:
    """Distinct blob keys in the stores' 33-byte form, kept the way SQL can take
    them in one parameter: the file keys as their sorted raw digests
    concatenated (32 bytes each, kind ``f`` implied), the artifact keys apart."""

    digests: bytes = b""
    artifacts: tuple[bytes, ...] = ()

    @classmethod
    def of(cls, keys: Iterable[bytes]) -> KeySet:
        files: list[bytes] = []
        artifacts: list[bytes] = []
        for key in keys:
            (files if key[:1] == b"f" else artifacts).append(key)
        return cls(b"".join(sorted(key[1:] for key in files)), tuple(sorted(artifacts)))

    @classmethod
    def of_content(cls, content: documents.Content) -> KeySet:
        return cls(content.digests(), tuple(sorted(content.artifact_keys())))

    @classmethod
    def of_artifacts(cls, content: documents.Content) -> KeySet:
        """The content's artifact keys alone (its files' are left out)."""
        return cls(b"", tuple(sorted(content.artifact_keys())))

    @classmethod
    def union(cls, sets: Sequence[KeySet]) -> KeySet:
        """Every key of any of ``sets`` (the file part natively)."""
        if len(sets) == 1:
            return sets[0]
        digests = _native.sort_digests(b"".join(keys.digests for keys in sets))
        return cls(digests, tuple(sorted({key for keys in sets for key in keys.artifacts})))

    def __bool__(self) -> bool:
        return bool(self.digests or self.artifacts)

    def __len__(self) -> int:
        return len(self.digests) // 32 + len(self.artifacts)

    def minus(self, other: KeySet) -> KeySet:
        """The keys of ``self`` that ``other`` lacks (the file part natively)."""
        if not self:
            return self
        if self.digests == other.digests:  # a memcmp: the common no-change case
            digests = b""
        else:
            digests = _native.digest_difference(self.digests, other.digests)
        taken = set(other.artifacts)
        return KeySet(digests, tuple(key for key in self.artifacts if key not in taken))

    def keys(self) -> builtins.list[bytes]:
        """Every key (33 bytes), sorted like the UTF-8 text keys (``a`` < ``f``)."""
        return [*self.artifacts, *(b"f" + digest for digest in split_digests(self.digests))]

    def artifact_blob(self) -> bytes:
        return b"".join(self.artifacts)


EMPTY = KeySet()


def key_counts(sets: Sequence[KeySet]) -> dict[bytes, int]:
    """How many of ``sets`` hold each key (33-byte form)."""
    counts: dict[bytes, int] = {}
    for keys in sets:
        for key in keys.keys():
            counts[key] = counts.get(key, 0) + 1
    return counts


@dataclass(frozen=True, slots=True)
class RunChange:
    """What an append (or a fork) does to the counts of its thread, applied by
    ``WriteTx.publish`` with the insert: ``close`` keys end their run at
    ``old_ordinal`` (``refs += old_ordinal - open_since``), ``open`` keys are
    counted once more and begin a run at ``new_ordinal``."""

    old_ordinal: int
    new_ordinal: int
    close: KeySet = EMPTY
    open: KeySet = EMPTY


def count_change(
    parent: documents.Content | None, new: documents.Content, ordinal: int
) -> RunChange:
    """The run change of appending ``new`` on top of ``parent`` (the head, or None)."""
    if parent is None:
        return RunChange(ordinal, ordinal + 1, EMPTY, KeySet.of_content(new))
    if new.manifest.same_bytes(parent.manifest):
        # The same files (by fingerprint): only artifacts can differ, and
        # neither manifest's digests (nor bytes) are needed.
        keys, before = KeySet.of_artifacts(new), KeySet.of_artifacts(parent)
    else:
        keys, before = KeySet.of_content(new), KeySet.of_content(parent)
    return RunChange(ordinal, ordinal + 1, before.minus(keys), keys.minus(before))


def packed_rows(rows: Iterable[Any], content: documents.Content) -> Sequence[Any]:
    """The pack index rows an append records (``_packindex.check_packed_blobs``):
    rows of the files' digests and of the artifacts' (one row serves both keys
    of a digest, ``_packindex.row_key``). A pack session's rows in columns stay
    columns (``check_packed_columns``)."""
    artifacts = {bytes(key[1:]) for key in content.artifact_keys()}
    if isinstance(rows, PackedRows):
        referenced = content.digests()
        if artifacts:
            referenced = b"".join(sorted(artifacts.union(split_digests(referenced))))
        return check_packed_columns(rows, referenced)
    digests = set(split_digests(content.digests()))
    digests.update(artifacts)
    return check_packed_blobs(rows, lambda key: checked_digest(key) in digests)


# ------------------------------------------------------------------------ contents cache


# Manifest bytes RecentContents may hold beyond the newest content (100k
# entries are ~17 MB each, 1M entries ~180 MB; a manifest its store has not
# loaded counts its compressed row, ~60 MB at 1M).
RECENT_CONTENTS_BUDGET = 256 << 20


class RecentContents:
    """Contents of recently appended or read checkpoints by (id, row version), so
    the next append of a thread makes its delta and key diff without reading its
    parent back. At most ``size`` of them, and more than one only while their
    manifests hold at most ``budget_bytes`` (``Manifest.held_bytes``): a
    million-entry manifest is ~180 MB, and a daemon holding the one before its
    head as well would keep twice that resident between captures (the newest
    is always kept: it is the head the next append is based on)."""

    def __init__(self, size: int, budget_bytes: int = RECENT_CONTENTS_BUDGET) -> None:
        self._size = size
        self._budget = budget_bytes
        self._items: OrderedDict[tuple[str, int], documents.Content] = OrderedDict()

    def get(
        self, checkpoint_id: str, version: int, *, summary_will_do: bool = False
    ) -> documents.Content | None:
        """The cached content; a large one kept by its summary alone
        (``documents.held_lightly``) only when ``summary_will_do``."""
        content = self._items.get((checkpoint_id, version))
        if content is None or (not summary_will_do and documents.is_summary_only(content)):
            return None
        return content

    def put(self, checkpoint_id: str, version: int, content: documents.Content) -> None:
        row = (checkpoint_id, version)
        replaced = self._items.get(row)
        if replaced is not None:
            # The same row read again: what was known of its bytes still holds.
            documents.keep_digests(replaced.manifest, content.manifest)
        self._items[row] = documents.held_lightly(content)
        self._items.move_to_end(row)
        held = sum(item.manifest.held_bytes() for item in self._items.values())
        while len(self._items) > self._size or (len(self._items) > 1 and held > self._budget):
            _, dropped = self._items.popitem(last=False)
            held -= dropped.manifest.held_bytes()
