"""The rules the SQL checkpoint stores share (docs/contract.md#checkpoint-store), over a small transaction interface.

``SqlCheckpointStore`` implements the writes of docs/contract.md#checkpoint-store once — ``append`` (the
check order 1–6, delta or keyframe), ``delete_head``, ``delete_checkpoints``
(prune), ``fork_from_checkpoint`` — together with the bookkeeping they carry
(blob reference counts, request-id spent marks and, next, the pack index), and
the lease rules (``acquire_writer``, renew, release), ``pin_blobs``,
``release_condemned`` and the missing marks. ``condemn_blobs``, the reads and
the audit stay with each dialect: their SQL and locks are the whole of them. A
dialect (``_sqlite_tx``, ``_postgres_tx``, ``memory``) supplies a ``WriteTx``:
its SQL, its locking (SQLite ``BEGIN IMMEDIATE``; PostgreSQL the thread's row
lock; the memory store one ``asyncio.Lock``) and its connection handling and
retries, through ``_write(operation, body)``, which runs ``body(tx)`` in one
transaction and rolls back whatever ``body`` raises (the memory store's
transaction is an undo journal over its dicts).

Reference counts: runs, so an append writes only what changed
---------------------------------------------------------------

The contract's count of a key is the number of stored checkpoints (all threads) that use
it. Writing +1 per key on every append makes a no-change capture of a million
files cost a million row updates. Instead, per (thread, key) the store keeps

* ``refs`` — the checkpoints of the thread using the key, where an open run
  counts as ONE, and
* ``open_since`` — the head ordinal at which the key's current run began (NULL
  when the head does not use the key),

and per thread the ``head ordinal`` (+1 per append, -1 per ``delete_head``).
The count is ``refs + (head_ordinal - open_since)`` summed over threads. Appends
are linear (the parent is the head), so an append writes rows only for the keys
that differ from its parent (a native merge of the two sorted digest lists):
added keys open a run (``refs + 1``), removed keys close theirs (``refs +=
head - open_since``), every other key is counted by the ordinal moving. A
no-change capture writes one thread row. ``delete_head`` touches only the keys
in which the head and its parent differ; prune subtracts the pruned checkpoints'
keys and moves runs that began before the oldest kept checkpoint up to it; fork
opens a run for every key of the new root. Invariant: a key has an open run in a
thread exactly when the thread's head uses it.

A store written before runs holds plain counts (every run closed). The dialects
migrate it on open by opening, for each head, a run at the thread's ordinal for
each of its keys: ``refs`` is untouched, so every stored count, right or wrong,
reads the same after the migration as before (``checkpointd check`` still sees
what it saw).

Spent request ids
-----------------

A checkpoint id the daemon derived from a ``request_id`` (``ids.derive_request_id``;
a UUIDv5 from earlier daemons) is spent once that checkpoint is
deleted, by whatever path (the daemon, the gateway, the Python API): the
deleting transaction records it, ``spent_checkpoint_ids`` reports it, and the id
counts as used for ``append`` (DUPLICATE_ID) and ``fork_from_checkpoint``, so it
never names new content.

Pack index (a note for the ``packs`` work)
----------------------------------------------------

``append(..., packed_blobs=rows)`` is keyword-only and carried unchanged to
``WriteTx.index_packed_blobs(rows)``, called inside the append's transaction right
after the counts, so a key's index row commits with the first checkpoint that
references it. Each dialect adds its table (a schema step: SQLite
``SCHEMA_VERSION`` + its ``_SCHEMA``/migration list; PostgreSQL a new
``_MIGRATIONS`` entry) and implements ``index_packed_blobs`` on its ``WriteTx``
(today they refuse a non-empty list); lookups ("which of these keys are
present, where") are plain reads of the dialect, and a repack's atomic switch is
one more ``_write`` body. ``count_change`` is the one place that decides which
keys an append adds: the keys that need an index row are a subset of ``added``.
A capture's pack session hands its rows over in columns (``_packindex.PackedRows``,
one ``PackColumns`` per pack): ``packed_rows`` checks each pack's columns at once
and keeps them as columns, which the SQLite dialect writes with one statement per
pack; any other reader takes them as the ``PackedBlob`` sequence they stand for.

Where it lives
--------------

``_keysets`` holds the offloading, the key sets and ``RecentContents``;
``_writetx`` the append checks and the ``WriteTx`` interface; ``_sqlstore``
``SqlCheckpointStore``; this module the reads and the audit and repair over one
snapshot, and every name the dialects import.
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Mapping
from dataclasses import dataclass

from ..model import Checkpoint
from . import _documents as documents
from ._keysets import (
    EMPTY,
    OFFLOAD_ENTRIES,
    KeySet,
    RecentContents,
    Rows,
    RunChange,
    count_change,
    key_counts,
    offload,
    paused,
)
from ._options import blob_counts, list_order
from ._sqlstore import SqlCheckpointStore
from ._writetx import (
    AppendFacts,
    IdTaken,
    StoredRow,
    ThreadState,
    WriteTx,
    check_append_state,
    duplicate_id,
    is_request_derived,
    not_head,
    spent_ids,
)
from .base import BlobCount, DamagedCheckpoint

# ------------------------------------------------------------------------ reads


async def checkpoints_of(rows: Rows) -> builtins.list[Checkpoint]:
    """Every checkpoint in ``rows`` (a thread's rows: every base is there), in
    ``list`` order: created_at, then the UTF-8 bytes of the id."""

    def build() -> builtins.list[Checkpoint]:
        memo: dict[str, documents.Content] = {}
        return [documents.materialize(i, rows, memo).checkpoint() for i in rows]

    checkpoints = await offload(sum(len(data) for _, data in rows.values()) // 16, build)
    checkpoints.sort(key=lambda c: list_order(c.created_at, c.id))
    return checkpoints


# ------------------------------------------------------------------------ audit and repair


async def audited(
    rows: Rows, stored: dict[bytes, int], *, with_sizes: bool = False
) -> builtins.list[BlobCount]:
    """``BlobAudit.audit_blob_references`` from one snapshot of every stored
    document and every key's stored count (each dialect reads those its own
    way): the manifests' counts, decoded in a worker thread, beside the stored.
    A damaged checkpoint's keys cannot be counted: they show as stored counts
    above the manifests', which a sweep keeps (``damaged_of`` names it)."""
    manifests, sizes = await asyncio.to_thread(
        paused,
        lambda: documents.count_manifest_keys(rows, with_sizes=with_sizes, damaged={}),
    )
    return blob_counts(stored, manifests, sizes)


async def damaged_of(rows: Rows, threads: Mapping[str, str]) -> builtins.list[DamagedCheckpoint]:
    """``DocumentAudit.damaged_checkpoints`` from every stored row
    (``threads``: each row's thread), checked in a worker thread, sorted by
    thread and id."""
    found = await asyncio.to_thread(paused, documents.verify_rows, rows)
    return sorted(
        (
            DamagedCheckpoint(
                checkpoint_id,
                threads.get(checkpoint_id, ""),
                error.damaged_checkpoint_id,
                error.reason,
            )
            for checkpoint_id, error in found.items()
        ),
        key=lambda damaged: (damaged.thread_id.encode(), damaged.checkpoint_id.encode()),
    )


@dataclass(frozen=True, slots=True)
class Repair:
    """What ``repair_blob_references`` sets, from one snapshot (a dialect
    writes it its own way): every key's count from the manifests, each
    thread's head keys for its runs, and the keys whose stored count was wrong."""

    wrong: builtins.list[BlobCount]
    refs: dict[bytes, int]  # key -> count, keys counted at all
    head_keys: dict[str, KeySet]  # thread -> its head's keys


async def repair_of(rows: Rows, stored: dict[bytes, int], heads: Mapping[str, str]) -> Repair:
    """The repair of a whole store's counts (see ``Repair``; decoded in a
    worker thread)."""
    manifests, sizes = await asyncio.to_thread(paused, documents.count_manifest_keys, rows)
    key_sets = await asyncio.to_thread(paused, head_key_sets, heads, rows)
    wrong = [c for c in blob_counts(stored, manifests, sizes) if not c.agrees]
    return Repair(wrong, {key: n for key, n in manifests.items() if n > 0}, key_sets)


def head_key_sets(heads: Mapping[str, str], rows: Rows) -> dict[str, KeySet]:
    """thread -> the keys of its head checkpoint (for runs: migration, repair)."""
    memo: dict[str, documents.Content] = {}
    out: dict[str, KeySet] = {}
    for thread_id, head_id in heads.items():
        if head_id in rows:
            out[thread_id] = KeySet.of_content(documents.materialize(head_id, rows, memo))
            memo.clear()
    return out


def counted(refs: int, open_since: int | None, ordinal: int | None) -> int:
    """The count one (thread, key) row stands for."""
    if open_since is None or ordinal is None:
        return refs
    return refs + ordinal - open_since


__all__ = [
    "EMPTY",
    "OFFLOAD_ENTRIES",
    "AppendFacts",
    "IdTaken",
    "KeySet",
    "RecentContents",
    "Repair",
    "Rows",
    "RunChange",
    "SqlCheckpointStore",
    "StoredRow",
    "ThreadState",
    "WriteTx",
    "audited",
    "check_append_state",
    "checkpoints_of",
    "count_change",
    "counted",
    "damaged_of",
    "duplicate_id",
    "head_key_sets",
    "is_request_derived",
    "key_counts",
    "not_head",
    "offload",
    "paused",
    "repair_of",
    "spent_ids",
]
