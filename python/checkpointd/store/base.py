"""The checkpoint-store and instance-store protocols of docs/contract.md#checkpoint-store.

Every store we ship (memory, SQLite, PostgreSQL) implements these and passes the
suites in ``checkpointd.testkit``; users' own stores can too.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, Self, runtime_checkable

from ..model import BlobReference, Checkpoint, WriterLease, WriterLike


class ClosingStore:
    """A store that is its own async context manager: ``async with store:``
    closes it (``aclose``) on the way out."""

    async def aclose(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


Clock = Callable[[], int]
"""Returns the current time in milliseconds since the epoch."""

DEFAULT_LEASE_DURATION_MS = 120_000
DEFAULT_RENEW_AFTER_MS = 45_000


@dataclass(frozen=True, slots=True)
class ThreadSummary:
    """One thread as ``list_threads`` reports it."""

    thread_id: str
    head_checkpoint_id: str | None  # None when the head's chain was deleted
    checkpoint_count: int  # every checkpoint of the thread, on the head chain or not
    newest_created_at: int | float  # the largest created_at of its checkpoints


DEFAULT_THREAD_PAGE = 100


@runtime_checkable
class ThreadListing(Protocol):
    """Listing threads page by page (every store we ship; the daemon's ListThreads)."""

    async def list_threads(
        self, *, after: str | None = None, limit: int = DEFAULT_THREAD_PAGE
    ) -> builtins.list[ThreadSummary]:
        """At most ``limit`` (>= 1) threads holding at least one checkpoint,
        sorted by the UTF-8 bytes of their id, starting after ``after`` (a
        thread id from a previous page; None: from the first). Raises
        SandboxCheckpointInvalidArgumentError for a bad limit, InvalidId for a
        bad ``after``."""
        ...


@runtime_checkable
class CheckpointStore(Protocol):
    async def get(self, checkpoint_id: str) -> Checkpoint | None: ...

    async def list(self, thread_id: str) -> builtins.list[Checkpoint]: ...

    async def get_head(self, thread_id: str) -> str | None: ...

    async def append(
        self, checkpoint: Checkpoint, expected_head_id: str | None, writer: WriterLike
    ) -> str: ...

    async def delete_head(self, thread_id: str, checkpoint_id: str, writer: WriterLike) -> None: ...

    async def acquire_writer(self, thread_id: str, *, owner: str | None = None) -> WriterLease:
        """docs/contract.md#checkpoint-store; ``owner`` (optional, none = a random owner per call) names who
        acquires: the owner of a live lease may acquire it again, with a new fence."""
        ...

    async def list_blob_references(self) -> builtins.list[BlobReference]: ...

    async def delete_checkpoints(
        self, thread_id: str, keep: int, writer: WriterLike
    ) -> builtins.list[str]: ...

    async def fork_from_checkpoint(
        self,
        source_thread_id: str,
        source_checkpoint_id: str,
        destination_thread_id: str,
        destination_checkpoint_id: str,
        created_at: int,
        writer: WriterLike,
    ) -> Checkpoint: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True, slots=True)
class InstanceRecord:
    """Which provider sandbox serves a key (docs/contract.md#checkpoint-store, instance store)."""

    key: str
    provider: str
    provider_sandbox_id: str
    thread_id: str
    updated_at: int
    latest_snapshot_id: str | None = None
    latest_run_id: str | None = None


@runtime_checkable
class InstanceStore(Protocol):
    async def get(self, key: str) -> InstanceRecord | None: ...

    async def upsert(self, record: InstanceRecord) -> None: ...

    async def delete(self, key: str) -> None: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class BlobGuard(Protocol):
    """Pin/condemn: what makes ``sweep_blobs`` safe while captures run (docs/contract.md#prune-and-sweep).

    Every store we ship implements it. The proof, in short:

    * A capture pins every key it will reference (``pin_blobs``) *before* it asks
      the bucket whether the blob exists. A pin lives while the writer lease that
      made it is current (same thread, same owner_token, not expired); releasing
      the lease drops its pins. After the append, the reference count protects
      the key.
    * A sweep condemns keys (``condemn_blobs``) before deleting them. Condemning
      is one transaction that skips any key with a reference or a live pin, and
      marks the rest condemned until ``now + hold_ms``.
    * ``pin_blobs`` records pins on all keys but returns the keys that are
      condemned right now; the capture must not trust the bucket for those and
      retries the pin until they are no longer condemned (the sweep released
      them or the hold expired), then checks the bucket and uploads if missing.
    * The sweep stops issuing deletes for a batch once its hold is about to
      expire (a safety margin), so a delete never lands after a capture's pin
      could have succeeded.
    """

    async def pin_blobs(self, keys: builtins.list[str], writer: WriterLike) -> builtins.list[str]:
        """Pin ``keys`` for ``writer`` (checked first: WRITER_LOST when not current).

        Returns the subset of ``keys`` that are condemned by a sweep right now.
        Invalid keys → SandboxCheckpointInvalidEntryError. Idempotent.
        """
        ...

    async def condemn_blobs(self, keys: builtins.list[str], hold_ms: int) -> builtins.list[str]:
        """Condemn each key that has no reference, no live pin and no live
        condemnation; returns the condemned keys (in the given order)."""
        ...

    async def release_condemned(self, keys: builtins.list[str]) -> None:
        """Drop condemnations (after the sweep deleted or gave up on the keys)."""
        ...


@dataclass(frozen=True, slots=True)
class BlobCount:
    """One key as the store counts it and as the manifests use it."""

    key: str
    stored: int  # the store's reference count (0 when it keeps none)
    manifests: int  # stored checkpoints whose files or artifacts use the key
    size: int | None = None  # with_sizes: the size the manifests give the blob

    @property
    def agrees(self) -> bool:
        return self.stored == self.manifests


@runtime_checkable
class BlobAudit(Protocol):
    """What ``checkpointd check`` and a safe sweep ask of a store beyond docs/contract.md#checkpoint-store:
    the counts recomputed from the manifests, their repair, and the keys a check
    found missing from the bucket. Every store we ship implements it.

    * ``audit_blob_references`` compares, in one consistent snapshot, each
      key's stored count with the number of stored checkpoints whose manifest
      uses it. Sweep keeps every key either side names (``count-mismatch`` when
      they disagree), so one damaged count row cannot make it delete a blob a
      checkpoint uses.
    * ``repair_blob_references`` sets every count to what the manifests say, in
      one transaction that writers wait for.
    * Missing marks: ``check`` marks referenced keys whose blob is gone; a
      capture does not trust its parent for a marked key (it checks the bucket
      and uploads the file again when it still has those bytes), then clears
      the mark.
    """

    async def audit_blob_references(self, *, with_sizes: bool = False) -> builtins.list[BlobCount]:
        """Every key with a stored count or a manifest use, sorted by UTF-8 bytes
        (``with_sizes``: also the size the manifests give each blob, which costs
        decoding every entry)."""
        ...

    async def repair_blob_references(self) -> builtins.list[BlobCount]:
        """Make the stored counts equal the manifests'; returns the keys that
        were wrong (with the values found), sorted by UTF-8 bytes."""
        ...

    async def mark_blobs_missing(self, keys: builtins.list[str]) -> None:
        """Record that these keys' blobs are gone (keys of another shape: ignored)."""
        ...

    async def clear_missing_blobs(self, keys: builtins.list[str]) -> None:
        """Forget the marks of these keys (their blobs are back)."""
        ...

    async def list_missing_blobs(self) -> builtins.list[str]:
        """Every key marked missing, sorted by UTF-8 bytes."""
        ...


@dataclass(frozen=True, slots=True)
class DamagedCheckpoint:
    """A stored checkpoint that cannot be read (``DocumentAudit``)."""

    checkpoint_id: str
    thread_id: str
    damaged_checkpoint_id: str  # itself, or the row it is stored against that is damaged
    reason: str  # what is wrong with that row


@runtime_checkable
class DocumentAudit(Protocol):
    """What ``checkpointd check`` asks of a store about its own rows: every
    stored document carries a checksum (``_documents``, older rows their zlib
    streams' Adler-32), and this checks them all. Every store we ship
    implements it.

    A damaged checkpoint reads as SandboxCheckpointDamagedError (DATA_LOSS),
    and so does every delta stored against it; the store goes on around it: an
    append on a damaged head stores a keyframe, ``delete_head`` and prune remove
    it (its keys' counts then stay one too high until ``check --repair``, which
    refuses while a damaged checkpoint is stored: it cannot count its keys)."""

    async def damaged_checkpoints(self) -> builtins.list[DamagedCheckpoint]:
        """Every stored checkpoint that cannot be read, sorted by thread, then id."""
        ...


@runtime_checkable
class SpentCheckpointIds(Protocol):
    """Checkpoint ids that must never name new content (every store we ship).

    A checkpoint whose id the daemon derived from a ``request_id`` (a UUIDv5) is
    spent once deleted, by any path: the deleting transaction records it (the
    rule lives in ``store._core``), and ``append``/``fork_from_checkpoint`` treat
    the id as used.
    """

    async def spent_checkpoint_ids(self, checkpoint_ids: builtins.list[str]) -> builtins.list[str]:
        """The given ids that are spent, in the given order (duplicates once)."""
        ...


@dataclass(frozen=True, slots=True)
class PackedBlob:
    """Where a small blob lives: one row of the pack index (``blobs/packs.py``).

    ``key`` is the blob's logical key (``sandbox-files/blake3/<hex>``), ``pack``
    the pack object's key (``sandbox-packs/blake3/<hex>``); the blob's stored
    bytes are ``length`` bytes at ``offset`` in the pack, decoding (``codec`` 0
    raw, 1 zstd) to ``raw_size`` bytes whose BLAKE3 is the key's hash.
    """

    key: str
    pack: str
    offset: int
    length: int
    raw_size: int
    codec: int


# A pack index row as a restore plans its reads from it (natively,
# ``RestoreSession.plan_pack_reads``): (digest, pack digest, offset,
# stored_len, raw_len, codec).
IndexRow = tuple[bytes, bytes, int, int, int, int]


@runtime_checkable
class PackIndex(Protocol):
    """The pack index kept in the checkpoint store (the stores we ship).

    * Rows are written only by ``append(..., packed_blobs=rows)``, in the
      append's own transaction, and only for keys that checkpoint references:
      a row exists only once its pack is durable and a checkpoint counts the
      key. A capture writes rows only for keys it uploaded (the index lacked
      them, or ``check`` found their pack gone), and the newest row of a key
      wins: every row names a durable copy, and a racing capture's older copy
      is dead weight a repack reclaims.
    * A row outlives its key's count (a later capture reuses the packed blob
      without uploading it again); only a pack-aware sweep, after condemning
      the key, removes rows.
    * ``locate_blobs`` is "is this blob present?" without a bucket request.
    """

    async def locate_blobs(self, keys: builtins.list[str]) -> dict[str, PackedBlob | None]:
        """For each of ``keys`` the store knows: its pack row, or None when no
        pack holds it but a checkpoint references it (a single object: written
        before packs, or above the pack threshold). Unknown keys are absent."""
        ...

    async def locate_rows(self, digests: bytes) -> builtins.list[IndexRow]:
        """The pack rows of those file blobs of ``digests`` (32-byte digests,
        concatenated) that a pack holds, as tuples: ``locate_blobs`` for the
        100,000 blobs of a restore, without an object per row."""
        ...

    async def list_packed_blobs(
        self, *, after: str | None = None, limit: int = 1000
    ) -> builtins.list[PackedBlob]:
        """At most ``limit`` rows sorted by key, starting after ``after``."""
        ...


@runtime_checkable
class PackMaintenance(Protocol):
    """What the pack-aware sweep and ``checkpointd migrate`` change in the pack
    index (``sweep.py``, ``migrate.py``); every store we ship implements it.
    Each method is one transaction.

    * ``drop_packed_blobs``: a key's row goes only while a sweep's
      condemnation of the key is live and nothing references it; a capture
      pins before it looks a key up, so no capture is then relying on the row.
    * ``switch_packed_blobs``: a repack points keys at their copies in a new,
      durable pack; both copies are valid, so readers holding the old row still
      read correct bytes until the old pack goes (a later sweep).
    * ``add_packed_blobs``: migrate records rows for referenced keys that have
      none (their single objects stay readable until a sweep removes them).
      Like an append it is protected by pins: migrate pins the keys before it
      uploads their pack and renews its lease right before the add.
      ``unreferenced=True`` (UploadArtifact's small artifact, in a pack of its
      own) records the row of a key no checkpoint uses yet: the row then
      stands where the single object would, young as its pack is, and a sweep
      drops it like any unreferenced row once its pack is old.
    * ``retire_pack``: before a sweep deletes a pack no row points at, it
      retires it for ``hold_ms`` and deletes it within that time; no switch
      points a row at a pack while it is retired, so a concurrent repack that
      wrote a pack of the same bytes cannot switch rows to the pack being
      deleted (a repack switches right after its upload, well within a hold).
      Appends and adds are not affected: their writers' pins protect their packs.
    * ``forget_lost_packed_blobs``: ``check`` drops the rows of a pack that is
      gone, or of frames that no longer decode to their keys (``check
      --repair``, ``blobs/pack_repair.py``), marking their keys missing.
    * ``condemn_unpinned_blobs``: before a sweep deletes a pack no row points
      at, it condemns the pack's own key (``sandbox-packs/blake3/<hex>``) and
      every key the pack holds, referenced or not, unless a live pin or
      another condemnation holds it. A writer pins before it uploads the pack
      and keeps the pins until its rows are recorded — a capture the pack's
      key (one pin per pack), ``checkpointd migrate`` the keys it packs — so a
      pack a live writer is about to point rows at is never deleted; a writer
      that pins while the sweep holds the key is told it is condemned and
      waits, as with ``condemn_blobs``. ``pin_blobs`` and the condemn calls
      take pack keys beside blob keys (stored with kind ``p``; never counted). A referenced key's condemnation only delays pins of it:
      rows of referenced keys are never dropped.
    """

    async def forget_lost_packed_blobs(self, rows: builtins.list[PackedBlob]) -> builtins.list[str]:
        """``check`` found these rows' blobs gone from the bucket (their pack
        is, or their frames are damaged): in one
        transaction remove each row that is still the key's row (same pack and
        offset) and mark its key missing, so no capture dedups against a blob
        that is gone (the next one that has the bytes uploads them again; the
        key is a lost single object until then). Returns the keys whose rows
        went, sorted."""
        ...

    async def condemn_unpinned_blobs(
        self, keys: builtins.list[str], hold_ms: int
    ) -> builtins.list[str]:
        """Condemn each key with no live pin and no live condemnation (whether or
        not a checkpoint references it) until now + ``hold_ms``; returns the
        condemned keys in the given order. Keys of another shape are never
        condemned."""
        ...

    async def retire_pack(self, pack: str, hold_ms: int) -> bool:
        """When no row points at ``pack``, mark it retired until now +
        ``hold_ms`` and return True; else False."""
        ...

    async def drop_packed_blobs(self, rows: builtins.list[PackedBlob]) -> builtins.list[str]:
        """Remove each row that is still the key's row (same pack and offset)
        when the key is condemned right now and has no reference; returns the
        keys whose rows went, sorted."""
        ...

    async def switch_packed_blobs(
        self, old_pack: str, rows: builtins.list[PackedBlob]
    ) -> builtins.list[str]:
        """For each new row whose key's row is in ``old_pack``, make it the
        key's row; keys whose row is elsewhere (or gone) and rows naming a
        pack retired right now are left alone. Returns the keys switched, sorted."""
        ...

    async def add_packed_blobs(
        self, rows: builtins.list[PackedBlob], *, unreferenced: bool = False
    ) -> builtins.list[str]:
        """Record each row whose key (or its digest's artifact key,
        ``_packindex.row_key``) a checkpoint references (any key with
        ``unreferenced``) and has no row yet;
        returns the keys recorded, sorted. The caller pins the keys (under a
        current lease) before it uploads their pack, and keeps the pins until
        this returns."""
        ...
