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
"""

from __future__ import annotations

import asyncio
import builtins
import gc
import threading
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from .. import _native, ids
from ..errors import (
    NO_SPACE,
    SandboxCheckpointConflictError,
    SandboxCheckpointDamagedError,
    SandboxCheckpointDuplicateIdError,
    SandboxCheckpointError,
    SandboxCheckpointNotHeadError,
    SandboxCheckpointParentMismatchError,
)
from ..manifest import ManifestSummary, split_digests
from ..model import Checkpoint, WriterLease, WriterLike
from ..validation import check_checkpoint_body, check_checkpoint_ids, check_id
from . import _documents as documents
from ._options import (
    LeaseRecord,
    StoreOptions,
    audit_keys,
    blob_counts,
    check_fork_arguments,
    check_fork_source,
    check_keep,
    check_pin_keys,
    check_writer,
    condemnable_keys,
    destination_not_empty,
    key_to_bytes,
    lease_holder,
    lease_is_current,
    list_order,
    may_take_over,
    new_owner_token,
    plan_prune,
    renew_lost,
    writer_conflict,
    writer_fields,
)
from ._packindex import PackedRows, check_packed_blobs, check_packed_columns, checked_digest
from .base import BlobCount, DamagedCheckpoint

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


# ------------------------------------------------------------------------ spent ids


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


def is_request_derived(checkpoint_id: str) -> bool:
    """True for the ids the daemon derives from a request_id (``ids.is_request_derived``)."""
    return ids.is_request_derived(checkpoint_id)


def spent_ids(deleted: Iterable[str]) -> builtins.list[str]:
    """The deleted ids that become spent (the contract: a request_id never names new content)."""
    return [checkpoint_id for checkpoint_id in deleted if is_request_derived(checkpoint_id)]


# ------------------------------------------------------------------------ checks


def duplicate_id(checkpoint_id: str) -> SandboxCheckpointDuplicateIdError:
    return SandboxCheckpointDuplicateIdError(
        f"checkpoint id {checkpoint_id!r} is already used (or was, by a deleted "
        "checkpoint made under a request_id)",
        details={"checkpoint_id": checkpoint_id},
    )


def check_append_state(
    checkpoint: Checkpoint,
    expected_head_id: str | None,
    writer: WriterLike,
    *,
    lease: LeaseRecord | None,
    now: int,
    id_used: bool,
    head_id: str | None,
) -> None:
    """docs/contract.md#checkpoint-store append checks 3–6 against the state read under the thread's lock."""
    thread_id = checkpoint.thread_id
    check_writer(writer, thread_id, lease, now)
    if id_used:
        raise duplicate_id(checkpoint.id)
    if head_id != expected_head_id:
        raise SandboxCheckpointConflictError(
            f"the head of thread {thread_id!r} is {head_id!r}, not {expected_head_id!r}",
            details={"thread_id": thread_id, "checkpoint_id": checkpoint.id},
        )
    if checkpoint.parent_checkpoint_id != expected_head_id:
        raise SandboxCheckpointParentMismatchError(
            f"parent {checkpoint.parent_checkpoint_id!r} is not the expected head "
            f"{expected_head_id!r}",
            details={"thread_id": thread_id, "checkpoint_id": checkpoint.id},
        )


def not_head(thread_id: str, checkpoint_id: str) -> SandboxCheckpointNotHeadError:
    return SandboxCheckpointNotHeadError(
        f"{checkpoint_id!r} is not the head of thread {thread_id!r}",
        details={"thread_id": thread_id, "checkpoint_id": checkpoint_id},
    )


# ------------------------------------------------------------------------ the interface


@dataclass(frozen=True, slots=True)
class ThreadState:
    """A thread as its write transaction found it (after taking its lock)."""

    head_id: str | None
    ordinal: int  # the head ordinal of the count runs (0 for a thread without rows)
    lease: LeaseRecord | None


@dataclass(frozen=True, slots=True)
class StoredRow:
    """The columns of one checkpoint row the core needs. ``version`` tells a row
    from a later one that reuses its id (SQLite: serial; PostgreSQL: xmin)."""

    thread_id: str
    parent_id: str | None
    depth: int
    version: int


@dataclass(frozen=True, slots=True)
class AppendFacts:
    """What an append checks, read in one go after the thread's lock (PostgreSQL:
    one round trip): the clock, whether the id is used (or spent), and the row of
    the expected head."""

    now: int
    id_used: bool
    head_row: StoredRow | None


class IdTaken(Exception):
    """Raised by ``WriteTx.publish`` when the id was taken after the check (by a
    concurrent append in another thread; the database's unique key decided)."""


class WriteTx(Protocol):
    """One open write transaction of a dialect. Every method runs SQL in it."""

    async def lock_thread(self, thread_id: str) -> ThreadState:
        """Take the thread's write lock (SQLite holds the database's already) and
        read its head, ordinal and lease."""
        ...

    async def now(self) -> int:
        """The store's clock (call after ``lock_thread``)."""
        ...

    async def id_used(self, checkpoint_id: str) -> bool:
        """A stored checkpoint has the id, or a deleted one whose id is spent."""
        ...

    async def row(self, checkpoint_id: str) -> StoredRow | None: ...

    async def append_facts(self, checkpoint_id: str, head_id: str | None) -> AppendFacts:
        """``now()``, ``id_used(checkpoint_id)`` and ``row(head_id)`` together."""
        ...

    async def fork_source(self, checkpoint_id: str) -> StoredRow | None:
        """The row, protected from deletion until commit (PostgreSQL: FOR SHARE)."""
        ...

    async def thread_has_checkpoints(self, thread_id: str) -> bool: ...

    async def fetch_chains(self, checkpoint_ids: Sequence[str], rows: Rows) -> None:
        """Add to ``rows`` each checkpoint and its bases down to a keyframe."""
        ...

    async def thread_checkpoints(
        self, thread_id: str
    ) -> builtins.list[tuple[str, str | None, Any]]:
        """``(id, parent_id, created_at)`` of every checkpoint of the thread."""
        ...

    async def publish(
        self, content: documents.Content, stored: documents.Stored, change: RunChange
    ) -> int:
        """Insert the row, make it the head at ``change.new_ordinal``, apply the
        run change; returns the row's version. Raises IdTaken."""
        ...

    async def delete_rows(self, checkpoint_ids: Sequence[str]) -> Rows:
        """Delete the rows; returns what they held."""
        ...

    async def dependents(self, removed: Sequence[str]) -> Rows:
        """The rows whose delta base is one of ``removed``."""
        ...

    async def rewrite_keyframe(self, checkpoint_id: str, data: bytes) -> None: ...

    async def set_head(self, thread_id: str, head_id: str | None, ordinal: int) -> None: ...

    async def drop_runs(self, thread_id: str, keys: KeySet, ordinal: int) -> None:
        """The head at ``ordinal`` goes and its parent lacks ``keys``: each is
        counted once less and its run ends (``refs += ordinal - open_since - 1``)."""
        ...

    async def close_all_runs(self, thread_id: str, ordinal: int) -> None:
        """End every run of the thread at ``ordinal`` (``refs += ordinal - open_since``)."""
        ...

    async def reopen_runs(self, thread_id: str, keys: KeySet, old: int, new: int) -> None:
        """The parent at ``new`` becomes the head and uses ``keys``, which the old
        head lacked: open their runs at ``new``, counts unchanged."""
        ...

    async def subtract_counts(
        self, thread_id: str, counts: Mapping[bytes, int], cutoff: int
    ) -> None:
        """Prune: ``refs -= n`` per key, after moving a run that began before
        ``cutoff`` (the oldest kept ordinal) up to it."""
        ...

    async def forget_zero_counts(self, thread_id: str, keys: KeySet) -> None:
        """Drop count rows of these keys that count nothing (no run, refs <= 0)."""
        ...

    async def mark_spent(self, checkpoint_ids: Sequence[str]) -> None: ...

    async def index_packed_blobs(self, rows: Sequence[Any]) -> None:
        """The pack index rows of an append (see the module docstring)."""
        ...

    # leases and the blob guard

    async def lease_for_acquire(self, thread_id: str) -> tuple[LeaseRecord | None, int]:
        """Lock (creating when missing) the thread's lease state: its lease and
        the last fence handed out."""
        ...

    async def write_lease(self, thread_id: str, record: LeaseRecord) -> None:
        """Store ``record`` as the thread's lease and its fence as the last one."""
        ...

    async def set_lease_expiry(self, thread_id: str, expires_at: int) -> None: ...

    async def remove_lease(self, thread_id: str, token: str, fence: int) -> None:
        """Remove the lease only when it is still this one."""
        ...

    async def drop_pins(self, thread_id: str, token: str, fence: int) -> None: ...

    async def pin(
        self, thread_id: str, token: str, fence: int, keys: Sequence[bytes]
    ) -> set[bytes]:
        """Record the pins; return those of ``keys`` condemned right now (PostgreSQL
        share-locks their mark rows first, so a condemnation in flight finishes)."""
        ...

    async def release_condemned(self, keys: Sequence[bytes]) -> None: ...

    async def mark_missing(self, keys: Sequence[bytes], now: int) -> None: ...

    async def clear_missing(self, keys: Sequence[bytes]) -> None: ...


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
        self._items[row] = documents.held_lightly(content)
        self._items.move_to_end(row)
        held = sum(item.manifest.held_bytes() for item in self._items.values())
        while len(self._items) > self._size or (len(self._items) > 1 and held > self._budget):
            _, dropped = self._items.popitem(last=False)
            held -= dropped.manifest.held_bytes()


# ------------------------------------------------------------------------ the store


@dataclass
class _Loaded:
    """Contents materialized in one transaction (rows + memo for deltas)."""

    rows: Rows = field(default_factory=dict)
    memo: dict[str, documents.Content] = field(default_factory=dict)


class SqlCheckpointStore:
    """The docs/contract.md#checkpoint-store writes of a SQL checkpoint store, its leases, pins and missing
    marks; a dialect subclasses it and provides ``_options``, ``_recent``,
    ``_write`` and ``_is_closed`` (and its own reads, ``_condemn`` and the
    audit, whose SQL is the whole of their logic)."""

    _options: StoreOptions
    _recent: RecentContents

    @property
    def lease_duration_ms(self) -> int:
        return self._options.lease_duration_ms

    @property
    def renew_after_ms(self) -> int:
        return self._options.renew_after_ms

    async def _write(self, operation: str, body: Callable[[WriteTx], Awaitable[T]]) -> T:
        raise NotImplementedError

    def _is_closed(self) -> bool:
        raise NotImplementedError

    async def _row_version(self, checkpoint_id: str) -> int | None:
        """The stored row's version (None: no such row)."""
        raise NotImplementedError

    async def _read_chain(self, checkpoint_id: str) -> tuple[int, Rows] | None:
        """The row's version and the rows of it and its bases down to a
        keyframe, read together (None: no such row)."""
        raise NotImplementedError

    async def get(self, checkpoint_id: str) -> Checkpoint | None:
        """The checkpoint or None (a missing id never raises; an invalid one is
        INVALID_ID). Its content comes from the store's cache when that holds
        its current row, and is kept there like an appended one: the head a
        capture reads is the parent its append diffs against next."""
        check_id(checkpoint_id, "checkpoint id")
        version = await self._row_version(checkpoint_id)
        if version is None:
            return None
        content = self._recent.get(checkpoint_id, version)
        if content is None:
            read = await self._read_chain(checkpoint_id)
            if read is None:  # deleted since the version was read
                return None
            version, rows = read
            content = await offload(
                sum(len(data) for _, data in rows.values()) // 16,
                documents.materialize,
                checkpoint_id,
                rows,
                {},
            )
            self._recent.put(checkpoint_id, version, content)
        return await offload(content_size(content), content.checkpoint)

    async def cached_manifest_summary(self, checkpoint_id: str) -> ManifestSummary | None:
        """The manifest summary of a stored checkpoint when this store's cache
        holds its current row's content (one small read of the row's version,
        no document read), else None: ask ``get``. A capture compares its scan
        with this before it needs the parent itself."""
        version = await self._row_version(checkpoint_id)
        if version is None:
            return None
        content = self._recent.get(checkpoint_id, version, summary_will_do=True)
        return None if content is None else content.manifest.known_summary()

    async def _content(
        self, tx: WriteTx, checkpoint_id: str, version: int, *, summary_will_do: bool = False
    ) -> documents.Content:
        """The content of a stored checkpoint (cached by its row version; see
        ``RecentContents.get`` for ``summary_will_do``)."""
        content = self._recent.get(checkpoint_id, version, summary_will_do=summary_will_do)
        if content is None:
            rows: Rows = {}
            await tx.fetch_chains([checkpoint_id], rows)
            content = await asyncio.to_thread(
                paused, documents.materialize, checkpoint_id, rows, {}
            )
            self._recent.put(checkpoint_id, version, content)
        return content

    async def _content_or_none(
        self, tx: WriteTx, checkpoint_id: str, version: int
    ) -> documents.Content | None:
        """``_content`` with its keys at hand, or None when it is damaged."""
        try:
            content = await self._content(tx, checkpoint_id, version)
            await offload(content_size(content), content.digests)
        except SandboxCheckpointDamagedError:
            return None
        return content

    async def _readable_parent(
        self, tx: WriteTx, parent_id: str, version: int, content: documents.Content
    ) -> documents.Content | None:
        """The parent an append diffs against (its summary alone when that
        will do), or None when it is damaged: the thread goes on with a
        keyframe rather than a delta on a row nobody can read."""
        try:
            parent = await self._content(tx, parent_id, version, summary_will_do=True)
            if documents.is_summary_only(parent) and not content.manifest.same_bytes(
                parent.manifest
            ):
                # Not the parent's files: the delta needs the parent's bytes.
                parent = await self._content(tx, parent_id, version)
            if not content.manifest.same_bytes(parent.manifest):
                # An older row's manifest inflates here (a newer one's checksum
                # was checked as it was read), not in the delta or the diff.
                await offload(content_size(parent), parent.digests)
        except SandboxCheckpointDamagedError:
            return None
        return parent

    async def _rewrite_dependents(
        self, tx: WriteTx, removed: Sequence[str], loaded: _Loaded
    ) -> None:
        """Store every remaining checkpoint whose base is in ``removed`` as a
        keyframe, so no delta names a lost base. ``loaded`` must still hold the
        removed checkpoints' rows."""
        for dependent_id, row in (await tx.dependents(removed)).items():
            loaded.rows[dependent_id] = row
            try:
                content = await asyncio.to_thread(
                    paused, documents.materialize, dependent_id, loaded.rows, loaded.memo
                )
            except SandboxCheckpointDamagedError:
                # Unreadable already (it or its base is damaged): it stays as
                # it is, and reads go on saying so. Nothing else can be saved.
                continue
            stored = await offload(content_size(content), documents.keyframe, content)
            await tx.rewrite_keyframe(dependent_id, stored.data)

    # ------------------------------------------------------------------ append

    async def append(
        self,
        checkpoint: Checkpoint,
        expected_head_id: str | None,
        writer: WriterLike,
        *,
        packed_blobs: Sequence[Any] = (),
    ) -> str:
        """Publish ``checkpoint`` as the new head (docs/contract.md#checkpoint-store check order 1–6), in one
        transaction with its counts (and ``packed_blobs``, the pack index rows of
        its keys). Raises InvalidId, InvalidEntry, WriterLost, DuplicateId,
        Conflict (STALE_HEAD), ParentMismatch in that order; nothing changes when
        it raises."""
        check_checkpoint_ids(checkpoint, expected_head_id)
        check_checkpoint_body(checkpoint)
        writer_fields(writer)
        thread_id = checkpoint.thread_id
        content = await offload(len(checkpoint.files), documents.Content.of, checkpoint)
        # Rows for keys this checkpoint references, checked (INVALID_ENTRY).
        packed = packed_rows(packed_blobs, content) if packed_blobs else []
        # A checkpoint with no parent is a keyframe whatever the transaction
        # finds, so a large one is encoded in a worker thread while the
        # transaction writes its index rows (a cold capture: ~0.15 s of zlib
        # beside ~0.2 s of SQL for 100,000 files, on two cores at once).
        early: asyncio.Future[documents.Stored] | None = None
        if expected_head_id is None and content_size(content) > OFFLOAD_ENTRIES:
            early = asyncio.ensure_future(
                offload(content_size(content), documents.keyframe, content)
            )

        async def body(tx: WriteTx) -> tuple[int, documents.Stored]:
            state = await tx.lock_thread(thread_id)
            facts = await tx.append_facts(checkpoint.id, expected_head_id)
            check_append_state(
                checkpoint,
                expected_head_id,
                writer,
                lease=state.lease,
                now=facts.now,
                id_used=facts.id_used,
                head_id=state.head_id,
            )
            parent: documents.Content | None = None
            depth = 0
            if expected_head_id is not None:
                row = facts.head_row
                assert row is not None, "a head always names a stored checkpoint"
                parent = await self._readable_parent(tx, expected_head_id, row.version, content)
                depth = row.depth
                if parent is None:
                    # A damaged head: its keys are unknown, so every run of the
                    # thread ends at the old ordinal (each count stays what it
                    # was) and this checkpoint, a keyframe, opens its own.
                    await tx.close_all_runs(thread_id, state.ordinal)
            if packed:
                # Before the document (the same transaction either way): the
                # early keyframe encodes meanwhile.
                await tx.index_packed_blobs(packed)
            if early is not None:
                stored = await asyncio.shield(early)  # a retried body awaits it again
            elif parent is None:
                stored = await offload(content_size(content), documents.keyframe, content)
            else:
                stored = await offload(
                    content_size(content),
                    documents.encode,
                    content,
                    expected_head_id,
                    parent,
                    depth,
                )
            change = await offload(
                content_size(content), count_change, parent, content, state.ordinal
            )
            try:
                version = await tx.publish(content, stored, change)
            except IdTaken:
                raise duplicate_id(checkpoint.id) from None
            return version, stored

        try:
            version, stored = await self._write("append", body)
        finally:
            if early is not None and not early.cancel() and not early.cancelled():
                # Done: a failed append leaves no unretrieved error behind.
                early.exception()
        # (A keyframe is kept over its row: the caller keeps the manifest it gave.)
        self._recent.put(checkpoint.id, version, documents.unloaded(content, stored))
        return checkpoint.id

    # ------------------------------------------------------------------ delete_head

    async def delete_head(self, thread_id: str, checkpoint_id: str, writer: WriterLike) -> None:
        """Remove the head; the head moves to its parent (None when the parent is
        gone). Raises InvalidId, WriterLost, NotHead (in that order)."""
        check_id(thread_id, "thread id")
        check_id(checkpoint_id, "checkpoint id")
        writer_fields(writer)

        async def body(tx: WriteTx) -> None:
            state = await tx.lock_thread(thread_id)
            check_writer(writer, thread_id, state.lease, await tx.now())
            if state.head_id != checkpoint_id:
                raise not_head(thread_id, checkpoint_id)
            row = await tx.row(checkpoint_id)
            assert row is not None, "a head always names a stored checkpoint"
            # Either may be damaged (None here): the head still goes, and the
            # thread's head moves to the parent while it is stored.
            head = await self._content_or_none(tx, checkpoint_id, row.version)
            parent_row = None if row.parent_id is None else await tx.row(row.parent_id)
            if parent_row is not None and parent_row.thread_id != thread_id:
                parent_row = None
            parent = (
                None
                if parent_row is None or row.parent_id is None
                else await self._content_or_none(tx, row.parent_id, parent_row.version)
            )
            new_head = None if parent_row is None else row.parent_id
            loaded = _Loaded()
            if head is not None:
                loaded.memo[checkpoint_id] = head  # what its dependents (if any) are based on
            await tx.delete_rows([checkpoint_id])
            await self._rewrite_dependents(tx, [checkpoint_id], loaded)
            if head is None:
                # Its keys are unknown: every run of the thread ends one
                # ordinal back (each key the head used is counted once less),
                # and a readable parent opens runs for its own keys.
                await tx.close_all_runs(thread_id, state.ordinal - 1)
                if parent is not None:
                    keys = KeySet.of_content(parent)
                    await tx.reopen_runs(thread_id, keys, state.ordinal - 1, state.ordinal - 1)
            elif parent is None:
                head_keys = KeySet.of_content(head)
                await tx.drop_runs(thread_id, head_keys, state.ordinal)
                await tx.close_all_runs(thread_id, state.ordinal)
                await tx.forget_zero_counts(thread_id, head_keys)
            else:
                head_keys, parent_keys = KeySet.of_content(head), KeySet.of_content(parent)
                dropped = head_keys.minus(parent_keys)
                await tx.drop_runs(thread_id, dropped, state.ordinal)
                await tx.reopen_runs(
                    thread_id, parent_keys.minus(head_keys), state.ordinal, state.ordinal - 1
                )
                await tx.forget_zero_counts(thread_id, dropped)
            await tx.set_head(thread_id, new_head, state.ordinal - 1)
            await tx.mark_spent(spent_ids([checkpoint_id]))

        await self._write("delete_head", body)

    # ------------------------------------------------------------------ prune

    async def delete_checkpoints(
        self, thread_id: str, keep: int, writer: WriterLike
    ) -> builtins.list[str]:
        """Keep the head and its ``keep - 1`` nearest ancestors; delete the rest of
        the thread in one transaction. Returns the deleted ids in list order.
        Raises InvalidId, InvalidArgument (keep), WriterLost (in that order)."""
        check_id(thread_id, "thread id")
        check_keep(keep)
        writer_fields(writer)

        async def body(tx: WriteTx) -> builtins.list[str]:
            state = await tx.lock_thread(thread_id)
            check_writer(writer, thread_id, state.lease, await tx.now())
            kept, ordered = await _prune_plan(tx, thread_id, state.head_id, keep)
            if not ordered:
                return []
            loaded = _Loaded()
            loaded.rows.update(await tx.delete_rows(ordered))
            kept_bases = {b for b, _ in loaded.rows.values() if b is not None} - set(loaded.rows)
            await tx.fetch_chains(sorted(kept_bases), loaded.rows)

            def count_keys() -> Counter[bytes]:
                counts: Counter[bytes] = Counter()
                for checkpoint_id in ordered:
                    try:
                        content = documents.materialize(checkpoint_id, loaded.rows, loaded.memo)
                        keys = content.blob_keys()
                    except SandboxCheckpointDamagedError:
                        # Its keys are unknown: their counts stay one too high
                        # (a sweep keeps them; `check --repair` sets them).
                        continue
                    counts.update(keys)
                return counts

            counts = await asyncio.to_thread(paused, count_keys)
            await self._rewrite_dependents(tx, ordered, loaded)
            # Every kept checkpoint is on the head chain: ordinals ordinal-kept+1..ordinal.
            cutoff = state.ordinal - kept + 1
            await tx.subtract_counts(thread_id, counts, cutoff)
            await tx.forget_zero_counts(thread_id, KeySet.of(counts))
            await tx.mark_spent(spent_ids(ordered))
            return ordered

        return await self._write("delete_checkpoints", body)

    async def planned_prune(self, thread_id: str, keep: int) -> builtins.list[str]:
        """What ``delete_checkpoints(thread_id, keep, …)`` would delete now, in
        list order, from the rows' ids alone (no document is read: a damaged
        one is pruned like any other). A dry run of prune; it changes nothing."""
        check_id(thread_id, "thread id")
        check_keep(keep)

        async def body(tx: WriteTx) -> builtins.list[str]:
            state = await tx.lock_thread(thread_id)
            return (await _prune_plan(tx, thread_id, state.head_id, keep))[1]

        return await self._write("planned_prune", body)

    # ------------------------------------------------------------------ fork

    async def fork_from_checkpoint(
        self,
        source_thread_id: str,
        source_checkpoint_id: str,
        destination_thread_id: str,
        destination_checkpoint_id: str,
        created_at: int,
        writer: WriterLike,
    ) -> Checkpoint:
        """Copy a checkpoint into a new root of an empty thread (docs/contract.md#checkpoint-store fork
        checks, in order: ids, created_at, threads differ, source exists, source
        thread, writer, destination empty and id unused)."""
        check_fork_arguments(
            source_thread_id,
            source_checkpoint_id,
            destination_thread_id,
            destination_checkpoint_id,
            created_at,
        )

        async def body(tx: WriteTx) -> tuple[int, documents.Content]:
            # Lock order as everywhere: the (destination) thread first, then rows.
            state = await tx.lock_thread(destination_thread_id)
            source_row = await tx.fork_source(source_checkpoint_id)
            check_fork_source(
                None if source_row is None else source_row.thread_id,
                source_thread_id,
                source_checkpoint_id,
            )
            assert source_row is not None
            check_writer(writer, destination_thread_id, state.lease, await tx.now())
            if state.head_id is not None or await tx.thread_has_checkpoints(destination_thread_id):
                raise destination_not_empty(
                    destination_thread_id, destination_checkpoint_id, "the thread has checkpoints"
                )
            id_used = destination_not_empty(
                destination_thread_id, destination_checkpoint_id, "the id is already used"
            )
            if await tx.id_used(destination_checkpoint_id):
                raise id_used
            source = await self._content(tx, source_checkpoint_id, source_row.version)
            # The new root: the source's files, conversation and artifacts, how it
            # was taken and where it came from (``_options.fork_checkpoint``'s fields).
            root = documents.Content(
                {
                    **source.document,
                    "id": destination_checkpoint_id,
                    "thread_id": destination_thread_id,
                    "parent_checkpoint_id": None,
                    "created_at": created_at,
                    "reason": "fork-root",
                    "label": None,
                    "source_run_id": None,
                    "forked_from_thread_id": source_thread_id,
                    "forked_from_checkpoint_id": source_checkpoint_id,
                },
                source.manifest,
            )
            stored = await offload(content_size(root), documents.keyframe, root)
            change = count_change(None, root, state.ordinal)
            try:
                return await tx.publish(root, stored, change), root
            except IdTaken:
                raise id_used from None

        version, root = await self._write("fork_from_checkpoint", body)
        self._recent.put(destination_checkpoint_id, version, root)
        return await offload(content_size(root), root.checkpoint)

    # ------------------------------------------------------------------ leases

    async def acquire_writer(self, thread_id: str, *, owner: str | None = None) -> WriterLease:
        """Take the thread's writer lease without waiting.

        A live lease raises WRITER_CONFLICT (with ``expires_at_ms`` and
        ``retry_after_ms`` in its details) unless ``owner`` acquired it: the same
        owner takes it back with a new fence, and the old writer is lost.
        """
        check_id(thread_id, "thread id")
        holder = lease_holder(owner)

        async def body(tx: WriteTx) -> LeaseRecord:
            current, last_fence = await tx.lease_for_acquire(thread_id)
            now = await tx.now()
            if not may_take_over(current, holder, now):
                assert current is not None
                raise writer_conflict(thread_id, current, now)
            if current is not None:
                await tx.drop_pins(thread_id, current.owner_token, current.fence)
            record = LeaseRecord(
                new_owner_token(), last_fence + 1, now + self._options.lease_duration_ms, holder
            )
            await tx.write_lease(thread_id, record)
            return record

        record = await self._write("acquire_writer", body)
        return WriterLease(
            thread_id=thread_id,
            owner_token=record.owner_token,
            fence=record.fence,
            expires_at=record.expires_at,
            renew_after_ms=self._options.renew_after_ms,
            renew=self._renew,
            release=self._release,
        )

    async def _renew(self, lease: WriterLease) -> int:
        thread_id, token, fence = writer_fields(lease)

        async def body(tx: WriteTx) -> int:
            state = await tx.lock_thread(thread_id)
            now = await tx.now()
            if not lease_is_current(state.lease, token, fence, now):
                raise renew_lost(thread_id, fence, state.lease, now)
            expires_at = now + self._options.lease_duration_ms
            await tx.set_lease_expiry(thread_id, expires_at)
            return expires_at

        return await self._write("renew", body)

    async def _release(self, lease: WriterLease) -> None:
        """Remove the lease's own record and its pins; never raises on a closed store."""
        if self._is_closed():
            return
        thread_id, token, fence = writer_fields(lease)

        async def body(tx: WriteTx) -> None:
            await tx.remove_lease(thread_id, token, fence)
            await tx.drop_pins(thread_id, token, fence)

        try:
            await self._write("release", body)
        except SandboxCheckpointError as error:
            if error.code != NO_SPACE:
                raise
            # A full disk has no room for the delete of a cold capture's pins
            # (~100,000 rows): the thread is given back all the same (one small
            # row), and its pins stay behind, dead with their lease (a sweep
            # honours only the pins of a live lease).
            await self._write("release", lambda tx: tx.remove_lease(thread_id, token, fence))

    # ------------------------------------------------------------------ blob guard

    async def pin_blobs(self, keys: builtins.list[str], writer: WriterLike) -> builtins.list[str]:
        """Pin ``keys`` for the writer's lease (WRITER_LOST first when not current;
        INVALID_ENTRY for a bad key). Returns the keys condemned right now."""
        thread_id, token, fence = writer_fields(writer)

        async def body(tx: WriteTx) -> builtins.list[str]:
            state = await tx.lock_thread(thread_id)
            check_writer(writer, thread_id, state.lease, await tx.now())
            wanted = check_pin_keys(keys)
            if not wanted:
                return []
            binary = {key: key_to_bytes(key) for key in wanted}
            condemned = await tx.pin(thread_id, token, fence, sorted(set(binary.values())))
            return [key for key in wanted if binary[key] in condemned]

        return await self._write("pin_blobs", body)

    async def condemn_blobs(self, keys: builtins.list[str], hold_ms: int) -> builtins.list[str]:
        """Condemn each key with no reference, no live pin and no live
        condemnation, until now + hold_ms; returns the condemned keys in the
        given order. Keys of another shape are never condemned.

        Raises InvalidArgument (hold_ms, keys not a list), STORE_UNAVAILABLE.
        """
        return await self._condemn(keys, hold_ms, referenced_too=False)

    async def condemn_unpinned_blobs(
        self, keys: builtins.list[str], hold_ms: int
    ) -> builtins.list[str]:
        """See ``base.PackMaintenance``: as condemn_blobs, references aside."""
        return await self._condemn(keys, hold_ms, referenced_too=True)

    async def _condemn(
        self, keys: builtins.list[str], hold_ms: int, *, referenced_too: bool
    ) -> builtins.list[str]:
        """The dialect's condemnation (its SQL is the whole of its logic)."""
        raise NotImplementedError

    async def release_condemned(self, keys: builtins.list[str]) -> None:
        """Drop condemnations (after the sweep deleted or gave up on the keys)."""
        binary = sorted({key_to_bytes(key) for key in condemnable_keys(keys)})
        if binary:
            await self._write("release_condemned", lambda tx: tx.release_condemned(binary))

    # ------------------------------------------------------------------ missing marks

    async def mark_blobs_missing(self, keys: builtins.list[str]) -> None:
        """Record that these keys' blobs are gone (keys of another shape: ignored)."""
        binary = sorted({key_to_bytes(key) for key in audit_keys(keys)})

        async def body(tx: WriteTx) -> None:
            if binary:
                await tx.mark_missing(binary, await tx.now())

        await self._write("mark_blobs_missing", body)

    async def clear_missing_blobs(self, keys: builtins.list[str]) -> None:
        """Forget the marks of these keys (their blobs are back)."""
        binary = sorted({key_to_bytes(key) for key in audit_keys(keys)})
        if binary:
            await self._write("clear_missing_blobs", lambda tx: tx.clear_missing(binary))


async def _prune_plan(
    tx: WriteTx, thread_id: str, head_id: str | None, keep: int
) -> tuple[int, builtins.list[str]]:
    """(how many checkpoints of the thread stay, the ids prune deletes in list
    order): the head and its ``keep - 1`` nearest ancestors stay."""
    listed = await tx.thread_checkpoints(thread_id)
    doomed = plan_prune([(i, p) for i, p, _ in listed], head_id, keep)
    ordered = [
        checkpoint_id
        for _, checkpoint_id in sorted(
            ((created_at, i) for i, _, created_at in listed if i in doomed),
            key=lambda pair: list_order(pair[0], pair[1]),
        )
    ]
    return len(listed) - len(doomed), ordered


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
    "not_head",
    "offload",
    "paused",
    "repair_of",
    "spent_ids",
]
