"""``checkpointd migrate``: pack the small single-object blobs written before packs.

Optional: a store written before packs stays readable as it is (a key with no
pack index row is read from its single object). Migrating makes restores of old
checkpoints take a few ranged GETs instead of one GET per file, and lets a later
sweep free the single objects.

What it does, in batches (``migrate_to_packs``):

1. the keys the manifests use (``audit_blob_references`` with sizes), file
   blobs and artifacts, less blobs above the pack threshold and keys that
   already have a row (an artifact's row is its digest's, ``row_key``);
2. each remaining blob's single object is read and checked (size and BLAKE3
   against its key): a missing or damaged one is reported and left alone
   (``checkpointd check`` tells the rest);
3. the blobs go into packs (``PACK_TARGET_BYTES`` each); each pack is uploaded
   (durable) before ``add_packed_blobs`` records its rows, which the store does
   only for keys still referenced and still without a row.

Its packs are protected from the sweep as a capture's are, by pins: migrate
holds a writer lease of its own (thread ``MIGRATE_THREAD``, one per store: a
second migrate meanwhile is WRITER_CONFLICT) and pins each key before it reads
the key's single object, so before the pack holding it is uploaded; a sweep
deletes a pack no row points at only once it could condemn every key in it
(``PackMaintenance.condemn_unpinned_blobs``), which a live pin refuses, and a
key the sweep holds is waited for before it is read. The lease is renewed
while the pack is built and right before its rows are recorded; each pack
takes the lease again (a new fence), which drops the previous pack's pins.

So it is idempotent (a rerun skips keys that have a row) and safe to kill at
any point: a pack uploaded whose rows were never recorded is a pack no row
points at, which a sweep deletes once the killed run's lease (and its pins)
expired; nothing else changed. Nothing is rewritten
without need: a blob that is already packed or large stays as it is, and
single objects are not deleted here. A sweep deletes the single
object of a key that has a row once it is older than ``older_than_ms``
(see ``sweep``), so readers that found no row before the migration
finish first. Safe while captures run: it only adds rows for blobs whose bytes
it read and checked.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import blake3

from . import _native
from ._engine import LeaseKeeper
from .blobs.base import BlobNotFoundError, BlobStore, get_many, put_many
from .blobs.packs import DEFAULT_PACK_THRESHOLD, PACK_TARGET_BYTES, PackedBlobStore, pack_key
from .errors import SandboxCheckpointInvalidArgumentError, SandboxCheckpointWriterConflictError
from .model import FILE_KEY_PREFIX, WriterLease
from .store._packindex import row_key
from .store.base import (
    BlobAudit,
    BlobCount,
    BlobGuard,
    CheckpointStore,
    PackedBlob,
    PackIndex,
    PackMaintenance,
)

# Keys looked up and read per batch (small blobs: a batch is at most ~1 GiB
# only in theory; PACK_TARGET_BYTES bounds what is held in practice).
MIGRATE_BATCH = 256
# The thread whose writer lease migrate's pins live under (it never holds a
# checkpoint; one migrate per store at a time).
MIGRATE_THREAD = "checkpointd-migrate"
# Waits between pins of keys a sweep holds (as a capture's).
_PIN_RETRY_FIRST_S = 0.05
_PIN_RETRY_MAX_S = 1.0


@dataclass(frozen=True, slots=True)
class MigrateProgress:
    """A pack was written (or, in a dry run, would be)."""

    pack: str  # empty in a dry run
    blobs: int
    raw_bytes: int
    stored_bytes: int


@dataclass(frozen=True, slots=True)
class MigrateProblem:
    """A blob left as it is: its single object is missing or damaged."""

    key: str
    message: str


@dataclass(frozen=True, slots=True)
class MigrateSummary:
    candidates: int  # referenced small blobs (files, artifacts) without a row at the start
    packed: int  # of those, rows recorded now (a dry run: would be)
    already_packed: int  # referenced keys that had a row
    skipped_large: int  # referenced blobs above the threshold (stay single)
    problems: int
    packs_written: int
    raw_bytes: int
    stored_bytes: int
    dry_run: bool


MigrateEvent = MigrateProgress | MigrateProblem | MigrateSummary


def _check(store: CheckpointStore, blobs: BlobStore, dry_run: bool) -> BlobStore:
    if not isinstance(store, BlobAudit) or not isinstance(store, PackIndex):
        raise SandboxCheckpointInvalidArgumentError(
            f"{type(store).__name__} keeps no pack index; there is nothing to migrate to"
        )
    if not dry_run and not (isinstance(store, PackMaintenance) and isinstance(store, BlobGuard)):
        raise SandboxCheckpointInvalidArgumentError(
            f"{type(store).__name__} does not implement add_packed_blobs and pin_blobs"
        )
    return blobs.inner if isinstance(blobs, PackedBlobStore) else blobs


class _PackPins:
    """The writer lease migrate's pins live under (module docstring): taken
    again for each pack (``next_pack``), renewed in the background meanwhile."""

    def __init__(self, store: CheckpointStore) -> None:
        self.store = store
        self.owner = f"checkpointd-migrate-{uuid.uuid4()}"
        self.lease: WriterLease | None = None
        self.keeper: LeaseKeeper | None = None

    async def next_pack(self) -> None:
        """A new fence: the previous pack's pins go."""
        await self._stop_keeper()
        try:
            self.lease = await self.store.acquire_writer(MIGRATE_THREAD, owner=self.owner)
        except SandboxCheckpointWriterConflictError as error:
            raise SandboxCheckpointWriterConflictError(
                "another checkpointd migrate is running on this store (or was killed less "
                f"than a lease ago): {error}",
                details=error.details,
            ) from None
        self.keeper = LeaseKeeper(self.lease)
        await self.keeper.__aenter__()

    async def pin(self, keys: list[str]) -> None:
        """Pin ``keys``; wait while a sweep holds any of them (it may be deleting
        a pack of them: once it lets go, the pin holds)."""
        assert isinstance(self.store, BlobGuard) and self.lease is not None
        condemned = await self.store.pin_blobs(keys, self.lease)
        delay = _PIN_RETRY_FIRST_S
        while condemned:
            self.check()
            await asyncio.sleep(delay)
            delay = min(delay * 2, _PIN_RETRY_MAX_S)
            condemned = await self.store.pin_blobs(condemned, self.lease)

    def check(self) -> None:
        """WRITER_LOST once renewing found the lease lost."""
        if self.keeper is not None:
            self.keeper.check()

    async def renew(self) -> None:
        """Right before rows are recorded: the pins hold a full lease from here."""
        assert self.lease is not None
        self.check()
        await self.lease.renew()

    async def _stop_keeper(self) -> None:
        if self.keeper is not None:
            keeper, self.keeper = self.keeper, None
            await keeper.__aexit__(None, None, None)

    async def release(self) -> None:
        await self._stop_keeper()
        if self.lease is not None:
            lease, self.lease = self.lease, None
            with contextlib.suppress(Exception):  # it expires on its own
                await asyncio.shield(lease.release())


class _Packer:
    """The pack being filled (module docstring, step 3) and the totals of the
    packs written so far."""

    def __init__(self, store: CheckpointStore, bucket: BlobStore, pins: _PackPins | None) -> None:
        self.store = store
        self.bucket = bucket
        self.pins = pins  # None: a dry run (nothing is uploaded or recorded)
        self.writer = _native.PackWriter()
        self.placed: list[tuple[str, tuple[int, int, int, int]]] = []
        self.packed = self.packs_written = self.raw_bytes = self.stored_bytes = 0

    async def add(self, good: list[tuple[str, bytes]]) -> None:
        """Put checked blobs (key, bytes) in the pack being filled."""
        items = [(_hex(key), data) for key, data in good]
        result = await asyncio.to_thread(self.writer.add_many, items)
        self.placed.extend((key, where) for (key, _), where in zip(good, result, strict=True))

    @property
    def full(self) -> bool:
        return self.writer.size >= PACK_TARGET_BYTES

    async def flush(self) -> MigrateProgress | None:
        """Finish the pack being filled (None when it is empty): upload it
        (durable) and record its rows, or in a dry run only count it."""
        if not self.placed:
            return None
        done, self.writer = self.writer, _native.PackWriter()
        rows_placed, self.placed = self.placed, []
        digest, body = await asyncio.to_thread(done.finish)
        name = pack_key(digest)
        raw = sum(p[1][2] for p in rows_placed)
        if self.pins is None:
            self.packed += len(rows_placed)
            self.raw_bytes += raw
            self.stored_bytes += len(body)
            return MigrateProgress("", len(rows_placed), raw, len(body))
        assert isinstance(self.store, PackMaintenance)
        await put_many(self.bucket, [(name, body)])  # durable before any row names it
        rows = [
            PackedBlob(row_key(key), name, offset, length, raw_size, codec)
            for key, (offset, length, raw_size, codec) in rows_placed
        ]
        await self.pins.renew()
        added = await self.store.add_packed_blobs(rows)
        self.packed += len(added)
        self.packs_written += 1
        self.raw_bytes += raw
        self.stored_bytes += len(body)
        return MigrateProgress(name, len(added), raw, len(body))


async def iter_migrate(
    store: CheckpointStore,
    blobs: BlobStore,
    *,
    threshold: int = DEFAULT_PACK_THRESHOLD,
    dry_run: bool = False,
) -> AsyncIterator[MigrateEvent]:
    """Pack the referenced small single-object blobs (module docstring); yields
    a MigrateProgress per pack, a MigrateProblem per blob left alone, then one
    MigrateSummary. Store and bucket failures raise as they are (whatever was
    recorded before stays valid)."""
    bucket = _check(store, blobs, dry_run)
    candidates, already, large = await _candidates(store, threshold)
    problems = 0
    pins = None if dry_run else _PackPins(store)
    packer = _Packer(store, bucket, pins)
    try:
        for start in range(0, len(candidates), MIGRATE_BATCH):
            keys = candidates[start : start + MIGRATE_BATCH]
            if pins is not None:
                if not packer.placed:
                    await pins.next_pack()
                # Before the read, so before the pack's upload (the pack holds
                # the keys' digests: their file forms, row_key).
                await pins.pin(list(dict.fromkeys(map(row_key, keys))))
            good: list[tuple[str, bytes]] = []
            async for problem in _read_checked(bucket, keys, good):
                problems += 1
                yield problem
            if not good:
                continue
            await packer.add(good)
            if packer.full:
                progress = await packer.flush()
                if progress is not None:
                    yield progress
        progress = await packer.flush()
        if progress is not None:
            yield progress
    finally:
        if pins is not None:
            await pins.release()
    yield MigrateSummary(
        candidates=len(candidates),
        packed=packer.packed,
        already_packed=already,
        skipped_large=large,
        problems=problems,
        packs_written=packer.packs_written,
        raw_bytes=packer.raw_bytes,
        stored_bytes=packer.stored_bytes,
        dry_run=dry_run,
    )


async def _candidates(store: CheckpointStore, threshold: int) -> tuple[list[str], int, int]:
    """The keys to pack (module docstring, step 1), the referenced keys that
    have a row already and the number of referenced blobs above ``threshold``."""
    assert isinstance(store, BlobAudit) and isinstance(store, PackIndex)
    audit: Sequence[BlobCount] = await store.audit_blob_references(with_sizes=True)
    used = [c for c in audit if c.manifests > 0]  # file blobs and artifacts
    small = [c.key for c in used if c.size is not None and c.size <= threshold]
    large = len(used) - len(small)
    del audit, used

    # A digest's file and artifact keys share one row (row_key): one candidate each.
    candidates: list[str] = []
    forms: set[str] = set()
    already = 0
    for start in range(0, len(small), MIGRATE_BATCH):
        keys = small[start : start + MIGRATE_BATCH]
        located = await store.locate_blobs(list(dict.fromkeys(map(row_key, keys))))
        for key in keys:
            if located.get(row_key(key)) is not None:
                already += 1
            elif row_key(key) not in forms:
                forms.add(row_key(key))
                candidates.append(key)
    return candidates, already, large


async def _read_checked(
    bucket: BlobStore, keys: list[str], good: list[tuple[str, bytes]]
) -> AsyncIterator[MigrateProblem]:
    """Read the single objects of ``keys`` (module docstring, step 2): each
    whose bytes are its key's goes into ``good``, each missing or damaged one
    is yielded."""
    try:
        found = await get_many(bucket, keys)
        pairs = list(zip(keys, found, strict=True))
    except BlobNotFoundError:
        pairs = []
        for key in keys:  # find which: one at a time
            try:
                pairs.append((key, await bucket.get(key)))
            except BlobNotFoundError:
                yield MigrateProblem(key, "its single object is not in the bucket")
    for key, data in pairs:
        if blake3.blake3(data).hexdigest() != _hex(key):
            yield MigrateProblem(key, "its single object's BLAKE3 is not the key's")
        else:
            good.append((key, data))


def _hex(key: str) -> str:
    return row_key(key)[len(FILE_KEY_PREFIX) :]


async def migrate_to_packs(
    store: CheckpointStore,
    blobs: BlobStore,
    *,
    threshold: int = DEFAULT_PACK_THRESHOLD,
    dry_run: bool = False,
) -> MigrateSummary:
    """``iter_migrate`` to its summary."""
    summary: MigrateSummary | None = None
    async for event in iter_migrate(store, blobs, threshold=threshold, dry_run=dry_run):
        if isinstance(event, MigrateSummary):
            summary = event
    assert summary is not None
    return summary


# --------------------------------------------------------------------------- command line


def _urls(args: argparse.Namespace) -> tuple[str, str]:
    store = args.store or os.environ.get("CHECKPOINTD_STORE")
    blobs = args.blobs or os.environ.get("CHECKPOINTD_BLOBS")
    data_dir = args.data_dir or os.environ.get("CHECKPOINTD_DATA_DIR")
    if (store is None or blobs is None) and data_dir is None:
        raise SandboxCheckpointInvalidArgumentError(
            "give --store and --blobs, or --data-dir (CHECKPOINTD_DATA_DIR)"
        )
    root = Path(os.path.abspath(data_dir or "."))
    return (
        store or f"sqlite://{root / 'checkpoints.db'}",
        blobs or f"file://{root / 'blobs'}",
    )


async def _run(args: argparse.Namespace) -> int:
    from .blobs import open_blobs
    from .store import open_store

    store_url, blobs_url = _urls(args)
    blobs = open_blobs(blobs_url)
    async with await open_store(store_url) as store:
        summary: MigrateSummary | None = None
        async for event in iter_migrate(store, blobs, dry_run=args.dry_run):
            if isinstance(event, MigrateSummary):
                summary = event
            if args.json:
                print(json.dumps({type(event).__name__: asdict(event)}), flush=True)
            elif isinstance(event, MigrateProblem):
                print(f"  left as it is: {event.key}: {event.message}", flush=True)
            elif isinstance(event, MigrateProgress) and event.pack:
                print(
                    f"  {event.pack}: {event.blobs} blobs, {event.stored_bytes} bytes", flush=True
                )
    assert summary is not None
    if not args.json:
        verb = "would pack" if summary.dry_run else "packed"
        print(
            f"{verb} {summary.packed} of {summary.candidates} single-object blobs into "
            f"{summary.packs_written} packs ({summary.raw_bytes} bytes raw, "
            f"{summary.stored_bytes} stored); {summary.already_packed} already packed, "
            f"{summary.skipped_large} above the threshold, {summary.problems} left as they are"
        )
    return 0 if summary.problems == 0 else 6


def run(args: argparse.Namespace) -> int:
    """``checkpointd migrate``'s exit code: 0, 6 when some blob was missing or
    damaged (left as it is), 2 for bad input, 7 when the store or bucket fails."""
    from .blobs.base import BlobStoreError
    from .errors import SandboxCheckpointError

    try:
        return asyncio.run(_run(args))
    except SandboxCheckpointInvalidArgumentError as error:
        print(f"checkpointd migrate: {error}", file=sys.stderr)
        return 2
    except (SandboxCheckpointError, BlobStoreError, OSError) as error:
        print(f"checkpointd migrate: {error}", file=sys.stderr)
        return 7


__all__ = [
    "MIGRATE_THREAD",
    "MigrateEvent",
    "MigrateProblem",
    "MigrateProgress",
    "MigrateSummary",
    "iter_migrate",
    "migrate_to_packs",
]
