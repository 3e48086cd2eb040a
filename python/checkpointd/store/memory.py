"""In-memory checkpoint and instance stores, on the one store core.

``InMemoryCheckpointStore`` is a ``_core.SqlCheckpointStore`` like the SQLite
and PostgreSQL stores: the writes of docs/contract.md#checkpoint-store (the append check order, deltas
and keyframes, delete_head, prune, fork), the count runs, spent ids, leases,
pins, ``release_condemned`` and the missing marks are the core's code, run over
``_MemoryTx``, a ``WriteTx`` on dicts. Its "dialect" is what the others' SQL
is: the tables (``_Tables``), one ``asyncio.Lock`` around every write and read
(the lock a database gives; a body may await a worker thread), and an undo
journal that puts back every change of a body that raises, so a failed check
changes nothing. Its reads, ``condemn_blobs``, the audit and the pack index are
its own, as they are each SQL store's.

Immutability: a checkpoint is kept as the core's stored document (bytes) and
rebuilt on every read (``documents.Content.checkpoint``), so neither the
caller's input nor a returned value can reach the stored state.
"""

from __future__ import annotations

import asyncio
import builtins
import dataclasses
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..errors import STORE_UNAVAILABLE, SandboxCheckpointError
from ..manifest import split_digests
from ..model import BlobReference, Checkpoint
from ..validation import check_id, utf8_key
from . import _documents as documents
from ._core import (
    AppendFacts,
    IdTaken,
    KeySet,
    RecentContents,
    Rows,
    RunChange,
    SqlCheckpointStore,
    StoredRow,
    ThreadState,
    audited,
    checkpoints_of,
    damaged_of,
    key_counts,
    offload,
    paused,
    repair_of,
)
from ._options import (
    LeaseRecord,
    StoreOptions,
    check_hold_ms,
    check_instance_record,
    check_thread_page,
    condemnable_keys,
    key_from_bytes,
    key_to_bytes,
    lease_is_current,
    read_clock,
    validate_store_options,
)
from ._packindex import artifact_twin, check_packed_blobs, file_key, index_rows
from .base import (
    DEFAULT_LEASE_DURATION_MS,
    DEFAULT_RENEW_AFTER_MS,
    DEFAULT_THREAD_PAGE,
    BlobCount,
    Clock,
    ClosingStore,
    DamagedCheckpoint,
    IndexRow,
    InstanceRecord,
    PackedBlob,
    ThreadSummary,
)

T = TypeVar("T")

# Contents kept decoded for the next append's delta (as the SQL stores do).
RECENT_CONTENTS = 4

_LeaseId = tuple[str, str, int]  # (thread_id, owner_token, fence)
_ABSENT = object()


@dataclass(frozen=True, slots=True)
class _Row:
    """One stored checkpoint: the columns of the SQL stores' row."""

    thread_id: str
    parent_id: str | None
    created_at: Any
    base_id: str | None
    depth: int
    data: bytes
    version: int


@dataclass
class _Tables:
    """The store's state, one dict per SQL table (keys in the 33-byte form)."""

    rows: dict[str, _Row] = field(default_factory=dict)
    thread_rows: dict[str, dict[str, None]] = field(default_factory=dict)
    heads: dict[str, tuple[str, int]] = field(default_factory=dict)  # (head id, ordinal)
    refs: dict[bytes, int] = field(default_factory=dict)
    runs: dict[str, dict[bytes, int]] = field(default_factory=dict)  # thread -> open_since
    spent: dict[str, None] = field(default_factory=dict)
    leases: dict[str, LeaseRecord] = field(default_factory=dict)
    fences: dict[str, int] = field(default_factory=dict)  # last fence handed out
    pins: dict[_LeaseId, dict[bytes, None]] = field(default_factory=dict)
    pinned_by: dict[bytes, dict[_LeaseId, None]] = field(default_factory=dict)
    condemned: dict[bytes, int] = field(default_factory=dict)  # until (ms)
    missing: dict[bytes, int] = field(default_factory=dict)  # marked at (ms)
    packed: dict[str, PackedBlob] = field(default_factory=dict)  # store.base.PackIndex
    retired_packs: dict[str, int] = field(default_factory=dict)  # until (ms)
    serial: int = 0  # the next row version

    def count(self, key: bytes) -> int:
        """the contract's count of a key: its refs plus each open run's length beyond one."""
        total = self.refs.get(key, 0)
        for thread_id, runs in self.runs.items():
            open_since = runs.get(key)
            if open_since is not None:
                total += self.heads[thread_id][1] - open_since
        return total

    def counts(self) -> dict[bytes, int]:
        counts = dict(self.refs)
        for thread_id, runs in self.runs.items():
            ordinal = self.heads[thread_id][1]
            for key, open_since in runs.items():
                counts[key] = counts.get(key, 0) + ordinal - open_since
        return counts

    def referenced(self, key: bytes) -> bool:
        return self.refs.get(key, 0) > 0 or any(key in runs for runs in self.runs.values())

    def chains(self, checkpoint_ids: Iterable[str], rows: Rows) -> None:
        """Add each checkpoint and its bases down to a keyframe to ``rows``."""
        for checkpoint_id in checkpoint_ids:
            current: str | None = checkpoint_id
            while current is not None and current not in rows and current in self.rows:
                row = self.rows[current]
                rows[current] = (row.base_id, row.data)
                current = row.base_id

    def live_pin(self, key: bytes, now: int) -> bool:
        return any(
            lease_is_current(self.leases.get(thread_id), token, fence, now)
            for thread_id, token, fence in self.pinned_by.get(key, ())
        )

    def live_condemned(self, key: bytes, now: int) -> bool:
        until = self.condemned.get(key)
        return until is not None and now < until


class _MemoryTx:
    """``_core.WriteTx`` on the tables, each change journaled so that
    ``rollback`` puts everything back (the store holds its lock throughout)."""

    def __init__(self, tables: _Tables, options: StoreOptions) -> None:
        self.t = tables
        self._options = options
        self._undo: list[tuple[dict[Any, Any], Any, Any]] = []

    # journaled changes -------------------------------------------------------

    def _set(self, table: dict[Any, Any], key: Any, value: Any) -> None:
        self._undo.append((table, key, table.get(key, _ABSENT)))
        table[key] = value

    def _delete(self, table: dict[Any, Any], key: Any) -> None:
        if key in table:
            self._undo.append((table, key, table[key]))
            del table[key]

    def _inner(self, table: dict[Any, dict[Any, Any]], key: Any) -> dict[Any, Any]:
        inner = table.get(key)
        if inner is None:
            inner = {}
            self._set(table, key, inner)
        return inner

    def _drop_if_empty(self, table: dict[Any, dict[Any, Any]], key: Any) -> None:
        if key in table and not table[key]:
            self._delete(table, key)

    def rollback(self) -> None:
        for table, key, value in reversed(self._undo):
            if value is _ABSENT:
                table.pop(key, None)
            else:
                table[key] = value
        self._undo.clear()

    # the WriteTx interface ------------------------------------------------------

    async def lock_thread(self, thread_id: str) -> ThreadState:
        head = self.t.heads.get(thread_id)
        return ThreadState(
            None if head is None else head[0],
            0 if head is None else head[1],
            self.t.leases.get(thread_id),
        )

    async def now(self) -> int:
        return read_clock(self._options)

    async def id_used(self, checkpoint_id: str) -> bool:
        return checkpoint_id in self.t.rows or checkpoint_id in self.t.spent

    async def row(self, checkpoint_id: str) -> StoredRow | None:
        row = self.t.rows.get(checkpoint_id)
        if row is None:
            return None
        return StoredRow(row.thread_id, row.parent_id, row.depth, row.version)

    async def append_facts(self, checkpoint_id: str, head_id: str | None) -> AppendFacts:
        return AppendFacts(
            await self.now(),
            await self.id_used(checkpoint_id),
            None if head_id is None else await self.row(head_id),
        )

    async def fork_source(self, checkpoint_id: str) -> StoredRow | None:
        return await self.row(checkpoint_id)

    async def thread_has_checkpoints(self, thread_id: str) -> bool:
        return bool(self.t.thread_rows.get(thread_id))

    async def fetch_chains(self, checkpoint_ids: Sequence[str], rows: Rows) -> None:
        self.t.chains(checkpoint_ids, rows)

    async def thread_checkpoints(
        self, thread_id: str
    ) -> builtins.list[tuple[str, str | None, Any]]:
        return [
            (i, self.t.rows[i].parent_id, self.t.rows[i].created_at)
            for i in self.t.thread_rows.get(thread_id, ())
        ]

    async def publish(
        self, content: documents.Content, stored: documents.Stored, change: RunChange
    ) -> int:
        document = content.document
        checkpoint_id, thread_id = document["id"], document["thread_id"]
        if checkpoint_id in self.t.rows:
            raise IdTaken
        version = self.t.serial
        self.t.serial += 1  # never reused, rolled back or not
        row = _Row(
            thread_id,
            document["parent_checkpoint_id"],
            document["created_at"],
            stored.base_id,
            stored.depth,
            stored.data,
            version,
        )
        self._set(self.t.rows, checkpoint_id, row)
        self._set(self._inner(self.t.thread_rows, thread_id), checkpoint_id, None)
        await self.set_head(thread_id, checkpoint_id, change.new_ordinal)
        if change.close:
            self._close(thread_id, change.close, change.old_ordinal)
        if change.open:
            runs = self._inner(self.t.runs, thread_id)
            for key in change.open.keys():
                self._set(self.t.refs, key, self.t.refs.get(key, 0) + 1)
                self._set(runs, key, change.new_ordinal)
        return version

    def _close(self, thread_id: str, keys: KeySet, ordinal: int, extra: int = 0) -> None:
        """refs += ordinal - open_since + extra for each key's run, then drop the runs."""
        runs = self.t.runs.get(thread_id, {})
        for key in keys.keys():
            open_since = runs.get(key)
            ran = 0 if open_since is None else ordinal - open_since
            self._set(self.t.refs, key, self.t.refs.get(key, 0) + ran + extra)
            self._delete(runs, key)
        self._drop_if_empty(self.t.runs, thread_id)

    async def delete_rows(self, checkpoint_ids: Sequence[str]) -> Rows:
        rows: Rows = {}
        for checkpoint_id in checkpoint_ids:
            row = self.t.rows.get(checkpoint_id)
            if row is None:
                continue
            rows[checkpoint_id] = (row.base_id, row.data)
            self._delete(self.t.rows, checkpoint_id)
            self._delete(self.t.thread_rows[row.thread_id], checkpoint_id)
            self._drop_if_empty(self.t.thread_rows, row.thread_id)
        return rows

    async def dependents(self, removed: Sequence[str]) -> Rows:
        gone = set(removed)
        return {i: (row.base_id, row.data) for i, row in self.t.rows.items() if row.base_id in gone}

    async def rewrite_keyframe(self, checkpoint_id: str, data: bytes) -> None:
        row = self.t.rows[checkpoint_id]
        self._set(
            self.t.rows,
            checkpoint_id,
            dataclasses.replace(row, base_id=None, depth=0, data=data),
        )

    async def set_head(self, thread_id: str, head_id: str | None, ordinal: int) -> None:
        if head_id is None:
            self._delete(self.t.heads, thread_id)
        else:
            self._set(self.t.heads, thread_id, (head_id, ordinal))

    async def drop_runs(self, thread_id: str, keys: KeySet, ordinal: int) -> None:
        if keys:
            self._close(thread_id, keys, ordinal, -1)

    async def close_all_runs(self, thread_id: str, ordinal: int) -> None:
        runs = self.t.runs.get(thread_id)
        if runs:
            self._close(thread_id, KeySet.of(builtins.list(runs)), ordinal)

    async def reopen_runs(self, thread_id: str, keys: KeySet, old: int, new: int) -> None:
        if not keys:
            return
        self._close(thread_id, keys, old)
        runs = self._inner(self.t.runs, thread_id)
        for key in keys.keys():
            self._set(runs, key, new)

    async def subtract_counts(self, thread_id: str, deleted: Sequence[KeySet], cutoff: int) -> None:
        counts = key_counts(deleted)
        runs = self.t.runs.get(thread_id, {})
        for key, n in counts.items():
            open_since = runs.get(key)
            moved = 0 if open_since is None else max(cutoff - open_since, 0)
            if key in self.t.refs:
                self._set(self.t.refs, key, self.t.refs[key] - n + moved)
            if open_since is not None and open_since < cutoff:
                self._set(runs, key, cutoff)

    async def forget_zero_counts(self, thread_id: str, keys: KeySet) -> None:
        for key in keys.keys():
            if self.t.refs.get(key, 1) <= 0 and not any(
                key in runs for runs in self.t.runs.values()
            ):
                self._delete(self.t.refs, key)

    async def mark_spent(self, checkpoint_ids: Sequence[str]) -> None:
        for checkpoint_id in checkpoint_ids:
            self._set(self.t.spent, checkpoint_id, None)

    async def index_packed_blobs(self, rows: Sequence[Any]) -> None:
        for row in rows:
            self._set(self.t.packed, row.key, row)  # the newest upload of the key wins

    async def lease_for_acquire(self, thread_id: str) -> tuple[LeaseRecord | None, int]:
        return self.t.leases.get(thread_id), self.t.fences.get(thread_id, 0)

    async def write_lease(self, thread_id: str, record: LeaseRecord) -> None:
        self._set(self.t.fences, thread_id, record.fence)
        self._set(self.t.leases, thread_id, record)

    async def set_lease_expiry(self, thread_id: str, expires_at: int) -> None:
        record = self.t.leases[thread_id]
        self._set(self.t.leases, thread_id, dataclasses.replace(record, expires_at=expires_at))

    async def remove_lease(self, thread_id: str, token: str, fence: int) -> None:
        record = self.t.leases.get(thread_id)
        if record is not None and (record.owner_token, record.fence) == (token, fence):
            self._delete(self.t.leases, thread_id)

    async def drop_pins(self, thread_id: str, token: str, fence: int) -> None:
        lease_id = (thread_id, token, fence)
        for key in builtins.list(self.t.pins.get(lease_id, ())):
            holders = self.t.pinned_by[key]
            self._delete(holders, lease_id)
            self._drop_if_empty(self.t.pinned_by, key)
        self._delete(self.t.pins, lease_id)

    async def pin(
        self, thread_id: str, token: str, fence: int, keys: Sequence[bytes]
    ) -> set[bytes]:
        lease_id = (thread_id, token, fence)
        mine = self._inner(self.t.pins, lease_id)
        for key in keys:
            self._set(mine, key, None)
            self._set(self._inner(self.t.pinned_by, key), lease_id, None)
        now = read_clock(self._options)
        return {key for key in keys if self.t.live_condemned(key, now)}

    async def release_condemned(self, keys: Sequence[bytes]) -> None:
        for key in keys:
            self._delete(self.t.condemned, key)

    async def mark_missing(self, keys: Sequence[bytes], now: int) -> None:
        for key in keys:
            if key not in self.t.missing:
                self._set(self.t.missing, key, now)

    async def clear_missing(self, keys: Sequence[bytes]) -> None:
        for key in keys:
            self._delete(self.t.missing, key)


class InMemoryCheckpointStore(SqlCheckpointStore, ClosingStore):
    """A checkpoint store in process memory (tests, the daemon's ``memory://``).

    Options as docs/contract.md#checkpoint-store: ``now`` (callable returning ms), ``lease_duration_ms``,
    ``renew_after_ms``; bad options raise SandboxCheckpointInvalidArgumentError.
    """

    def __init__(
        self,
        *,
        now: Clock | None = None,
        lease_duration_ms: int = DEFAULT_LEASE_DURATION_MS,
        renew_after_ms: int = DEFAULT_RENEW_AFTER_MS,
    ) -> None:
        self._options: StoreOptions = validate_store_options(now, lease_duration_ms, renew_after_ms)
        self._recent = RecentContents(RECENT_CONTENTS)
        self._tables = _Tables()
        self._lock = asyncio.Lock()
        self._closed = False

    # ------------------------------------------------------------------ lifecycle

    async def aclose(self) -> None:
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxCheckpointError("the checkpoint store is closed", code=STORE_UNAVAILABLE)

    def _is_closed(self) -> bool:
        return self._closed

    def _now(self) -> int:
        return read_clock(self._options)

    async def _write(self, operation: str, body: Callable[[Any], Awaitable[T]]) -> T:
        """Run ``body`` on a journaled transaction under the store's lock; undo
        everything it changed when it raises."""
        self._check_open()
        async with self._lock:
            tx = _MemoryTx(self._tables, self._options)
            try:
                return await body(tx)
            except BaseException:
                tx.rollback()
                raise

    # ------------------------------------------------------------------ reads

    async def _row_version(self, checkpoint_id: str) -> int | None:
        self._check_open()
        check_id(checkpoint_id, "checkpoint id")
        row = self._tables.rows.get(checkpoint_id)
        return None if row is None else row.version

    async def _checkpoint(self, checkpoint_id: str) -> Checkpoint | None:
        row = self._tables.rows.get(checkpoint_id)
        if row is None:
            return None
        cached = self._recent.get(checkpoint_id, row.version)
        if cached is not None:
            return await offload(cached.entry_count(), cached.checkpoint)
        rows: Rows = {}
        self._tables.chains([checkpoint_id], rows)

        def build() -> Checkpoint:
            return documents.materialize(checkpoint_id, rows, {}).checkpoint()

        return await offload(sum(len(data) for _, data in rows.values()) // 16, paused, build)

    async def get(self, checkpoint_id: str) -> Checkpoint | None:
        """The checkpoint or None (a missing id never raises; an invalid one is INVALID_ID)."""
        self._check_open()
        check_id(checkpoint_id, "checkpoint id")
        async with self._lock:
            return await self._checkpoint(checkpoint_id)

    async def list(self, thread_id: str) -> builtins.list[Checkpoint]:
        """Every checkpoint of the thread by created_at, then UTF-8 bytes of the id."""
        self._check_open()
        check_id(thread_id, "thread id")
        async with self._lock:
            rows: Rows = {}
            self._tables.chains(self._tables.thread_rows.get(thread_id, ()), rows)
            return await checkpoints_of(rows)

    async def get_head(self, thread_id: str) -> str | None:
        self._check_open()
        check_id(thread_id, "thread id")
        head = self._tables.heads.get(thread_id)
        return None if head is None else head[0]

    async def list_threads(
        self, *, after: str | None = None, limit: int = DEFAULT_THREAD_PAGE
    ) -> builtins.list[ThreadSummary]:
        """See ``base.ThreadListing``."""
        self._check_open()
        after, limit = check_thread_page(after, limit)
        tables = self._tables
        names = sorted(tables.thread_rows, key=utf8_key)
        if after is not None:
            names = [name for name in names if utf8_key(name) > utf8_key(after)]
        return [
            ThreadSummary(
                thread_id=name,
                head_checkpoint_id=tables.heads[name][0] if name in tables.heads else None,
                checkpoint_count=len(tables.thread_rows[name]),
                newest_created_at=max(tables.rows[i].created_at for i in tables.thread_rows[name]),
            )
            for name in names[:limit]
        ]

    async def spent_checkpoint_ids(self, checkpoint_ids: builtins.list[str]) -> builtins.list[str]:
        """Which of these ids belonged to deleted request_id checkpoints (``_core``)."""
        self._check_open()
        return [i for i in dict.fromkeys(checkpoint_ids) if i in self._tables.spent]

    async def list_blob_references(self) -> builtins.list[BlobReference]:
        self._check_open()
        async with self._lock:
            counts = self._tables.counts()
        return [BlobReference(key_from_bytes(k), n) for k, n in sorted(counts.items()) if n > 0]

    # ------------------------------------------------------------------ pack index

    def _referenced(self, key: str) -> bool:
        return self._tables.referenced(key_to_bytes(key))

    def _live_condemned(self, key: str, now: int) -> bool:
        return self._tables.live_condemned(key_to_bytes(key), now)

    async def locate_blobs(self, keys: builtins.list[str]) -> dict[str, PackedBlob | None]:
        """See ``store.base.PackIndex``."""
        self._check_open()
        found: dict[str, PackedBlob | None] = {}
        for key in keys:
            row = self._tables.packed.get(key)
            if row is not None:
                found[key] = row
            elif self._referenced(key):
                found[key] = None
        return found

    async def locate_rows(self, digests: bytes) -> builtins.list[IndexRow]:
        """See ``store.base.PackIndex``."""
        return index_rows(await self.locate_blobs([file_key(d) for d in split_digests(digests)]))

    async def list_packed_blobs(
        self, *, after: str | None = None, limit: int = 1000
    ) -> builtins.list[PackedBlob]:
        """See ``store.base.PackIndex``."""
        self._check_open()
        packed = self._tables.packed
        keys = sorted(key for key in packed if after is None or key > after)
        return [packed[key] for key in keys[: max(limit, 0)]]

    async def drop_packed_blobs(self, rows: builtins.list[PackedBlob]) -> builtins.list[str]:
        """See ``store.base.PackMaintenance``."""
        self._check_open()
        async with self._lock:
            now = self._now()
            packed = self._tables.packed
            dropped: builtins.list[str] = []
            for row in check_packed_blobs(rows, None):
                if (
                    packed.get(row.key) == row
                    and self._live_condemned(row.key, now)
                    and not self._referenced(row.key)
                    # One row serves a digest's file and artifact keys (row_key).
                    and not self._referenced(artifact_twin(row.key))
                ):
                    del packed[row.key]
                    dropped.append(row.key)
            return dropped

    async def switch_packed_blobs(
        self, old_pack: str, rows: builtins.list[PackedBlob]
    ) -> builtins.list[str]:
        """See ``store.base.PackMaintenance``."""
        self._check_open()
        async with self._lock:
            packed = self._tables.packed
            switched: builtins.list[str] = []
            for row in check_packed_blobs(rows, None):
                current = packed.get(row.key)
                if (
                    current is not None
                    and current.pack == old_pack
                    and row.pack != old_pack
                    and not self._pack_retired(row.pack)
                ):
                    packed[row.key] = row
                    switched.append(row.key)
            return switched

    def _pack_retired(self, pack: str) -> bool:
        return self._tables.retired_packs.get(pack, 0) > self._now()

    async def retire_pack(self, pack: str, hold_ms: int) -> bool:
        """See ``store.base.PackMaintenance``."""
        self._check_open()
        hold = check_hold_ms(hold_ms)
        async with self._lock:
            if any(row.pack == pack for row in self._tables.packed.values()):
                return False
            self._tables.retired_packs[pack] = self._now() + hold
            return True

    async def forget_lost_packed_blobs(self, rows: builtins.list[PackedBlob]) -> builtins.list[str]:
        """See ``store.base.PackMaintenance``."""
        self._check_open()
        async with self._lock:
            packed = self._tables.packed
            gone: builtins.list[str] = []
            for row in check_packed_blobs(rows, None):
                current = packed.get(row.key)
                if current is not None and (current.pack, current.offset) == (row.pack, row.offset):
                    del packed[row.key]
                    gone.append(row.key)
            now = self._now()
            for key in gone:
                self._tables.missing.setdefault(key_to_bytes(key), now)
            return sorted(gone)

    async def add_packed_blobs(
        self, rows: builtins.list[PackedBlob], *, unreferenced: bool = False
    ) -> builtins.list[str]:
        """See ``store.base.PackMaintenance``."""
        self._check_open()
        async with self._lock:
            packed = self._tables.packed
            added: builtins.list[str] = []
            for row in check_packed_blobs(rows, None):
                # Referenced as a file or as an artifact (_packindex.row_key).
                if row.key not in packed and (
                    unreferenced
                    or self._referenced(row.key)
                    or self._referenced(artifact_twin(row.key))
                ):
                    packed[row.key] = row
                    added.append(row.key)
            return added

    # ------------------------------------------------------------------ blob guard

    async def _condemn(
        self, keys: builtins.list[str], hold_ms: int, *, referenced_too: bool
    ) -> builtins.list[str]:
        self._check_open()
        hold = check_hold_ms(hold_ms)
        candidates = condemnable_keys(keys)
        async with self._lock:
            tables = self._tables
            now = self._now()
            condemned: builtins.list[str] = []
            for key in candidates:
                raw = key_to_bytes(key)
                if not referenced_too and tables.referenced(raw):
                    continue
                if tables.live_pin(raw, now) or tables.live_condemned(raw, now):
                    continue
                tables.condemned[raw] = now + hold
                condemned.append(key)
            return condemned

    # ------------------------------------------------------------------ blob audit

    def _all_rows(self) -> Rows:
        return {i: (row.base_id, row.data) for i, row in self._tables.rows.items()}

    async def audit_blob_references(self, *, with_sizes: bool = False) -> builtins.list[BlobCount]:
        """Stored counts beside the counts the manifests give (BlobAudit)."""
        self._check_open()
        async with self._lock:
            rows, stored = self._all_rows(), self._tables.counts()
        return await audited(rows, stored, with_sizes=with_sizes)

    async def damaged_checkpoints(self) -> builtins.list[DamagedCheckpoint]:
        """See ``base.DocumentAudit`` (its rows are bytes, as a database's are)."""
        self._check_open()
        async with self._lock:
            rows = self._all_rows()
            threads = {i: row.thread_id for i, row in self._tables.rows.items()}
        return await damaged_of(rows, threads)

    async def repair_blob_references(self) -> builtins.list[BlobCount]:
        """Set every count to the manifests' (as the SQL stores do: one run per
        head key at its thread's ordinal, so each key's ``refs`` is its count);
        returns the keys that were wrong. Writers wait for it."""
        self._check_open()
        async with self._lock:
            tables = self._tables
            heads = {thread_id: head for thread_id, (head, _) in tables.heads.items()}
            repair = await repair_of(self._all_rows(), tables.counts(), heads)
            tables.runs = {
                thread_id: dict.fromkeys(keys.keys(), tables.heads[thread_id][1])
                for thread_id, keys in repair.head_keys.items()
                if keys
            }
            tables.refs = repair.refs
            return repair.wrong

    async def list_missing_blobs(self) -> builtins.list[str]:
        self._check_open()
        return [key_from_bytes(key) for key in sorted(self._tables.missing)]


class InMemoryInstanceStore(ClosingStore):
    """Instance records in process memory (docs/contract.md#checkpoint-store instance store)."""

    def __init__(self) -> None:
        self._records: dict[str, InstanceRecord] = {}

    async def get(self, key: str) -> InstanceRecord | None:
        """The record or None; an invalid key is INVALID_ID."""
        check_id(key, "instance key")
        return self._records.get(key)

    async def upsert(self, record: InstanceRecord) -> None:
        """Replace the whole record (optional fields left out are cleared)."""
        # InstanceRecord is frozen; the validated copy keeps a subclass out.
        checked = check_instance_record(record)
        self._records[checked.key] = checked

    async def delete(self, key: str) -> None:
        """Forget the key; a missing key is not an error."""
        check_id(key, "instance key")
        self._records.pop(key, None)

    async def aclose(self) -> None:
        pass
