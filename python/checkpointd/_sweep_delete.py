"""What a sweep reports (``SweepBatch``, ``SweepReport``, the kept reasons) and how it
deletes: condemn a batch, delete or drop its rows before the hold runs out, release; delete
a dead pack, repack sparse ones, remove staging leftovers (``sweep`` has the rules)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import _native
from .blobs.base import BlobInfo, BlobNotFoundError, BlobStore, BlobStoreError, put_many
from .blobs.pack_listing import PackTrailerError, read_pack_entries
from .blobs.packs import PACK_TARGET_BYTES, PackedBlobStore, pack_key
from .blobs.staging import StagingLeftover, list_staging, remove_staging
from .model import FILE_KEY_PREFIX
from .store.base import (
    BlobGuard,
    CheckpointStore,
    PackedBlob,
    PackIndex,
    PackMaintenance,
)

# Reasons a listed key is kept (SweepReport.kept).
REFERENCED = "referenced"  # a checkpoint uses it
TOO_YOUNG = "too-young"  # uploaded less than older_than_ms ago
NOT_A_BLOB_KEY = "not-a-blob-key"  # not sandbox-{files,artifacts}/blake3/<64 hex>
IN_USE = "in-use"  # the store refused to condemn it: a new reference or a capture's pin
HOLD_EXPIRING = "hold-expiring"  # the batch ran out of time; the next sweep retries
# The stored count and the manifests disagree about the key (kept either way).
COUNT_MISMATCH = "count-mismatch"
# A pack whose live blobs this sweep copied into a new pack (a dry run: would
# copy); a later sweep deletes it.
REPACKED = "repacked"

# Index rows per page while the sweep walks the index.
INDEX_PAGE = 1000
DELETE_CONCURRENCY = 16


@dataclass(frozen=True)
class SweepReport:
    """What a sweep did: deleted keys, kept keys with a reason, failures per key.

    A listing failure is reported as ``(prefix, message)`` in ``failures`` and
    nothing is deleted. In a dry run ``deleted`` lists what would be deleted.
    """

    deleted: list[str] = field(default_factory=list)
    kept: list[tuple[str, str]] = field(default_factory=list)
    failures: list[tuple[str, str]] = field(default_factory=list)
    dry_run: bool = False


@dataclass(frozen=True, slots=True)
class SweepBatch:
    """One step of a sweep's results, handed out as soon as it is known.

    ``iter_sweep_blobs`` yields these so a caller (the daemon's SweepBlobs
    stream) never holds the results of a whole bucket: kept keys come a listing
    page at a time, deleted keys a delete batch at a time. A key appears in at
    most one batch of a sweep.
    """

    deleted: tuple[str, ...] = ()
    kept: tuple[tuple[str, str], ...] = ()
    failures: tuple[tuple[str, str], ...] = ()
    # Keys listed in the bucket page this batch reports on (0 for delete batches).
    listed: int = 0


async def _drop_rows(
    store: CheckpointStore,
    rows: list[PackedBlob],
    hold_ms: int,
    safety_margin_ms: int,
) -> tuple[SweepBatch, list[PackedBlob]]:
    """Condemn the dead packed keys, drop their rows while condemned, release."""
    assert isinstance(store, BlobGuard) and isinstance(store, PackMaintenance)
    started = time.monotonic()
    keys = [row.key for row in rows]
    try:
        condemned = await _condemned(store, store.condemn_blobs(keys, hold_ms))
    except Exception as error:  # noqa: BLE001 - reported per key; nothing dropped
        message = _describe(error)
        return SweepBatch(failures=tuple((key, message) for key in keys)), []
    chosen = set(condemned)
    dropped: list[str] = []
    failure: str | None = None
    try:
        # The store re-checks the condemnation inside its transaction; the
        # deadline only avoids a drop it would refuse anyway.
        if time.monotonic() < started + (hold_ms - safety_margin_ms) / 1000:
            dropped = await store.drop_packed_blobs([row for row in rows if row.key in chosen])
    except Exception as error:  # noqa: BLE001 - reported per key
        failure = _describe(error)
    finally:
        await _release(store, condemned)
    gone = set(dropped)
    kept: list[tuple[str, str]] = []
    failures: list[tuple[str, str]] = []
    for key in keys:
        if key in gone:
            continue
        if key not in chosen:
            kept.append((key, IN_USE))
        elif failure is not None:
            failures.append((key, failure))
        else:
            kept.append((key, HOLD_EXPIRING))
    batch = SweepBatch(deleted=tuple(dropped), kept=tuple(kept), failures=tuple(failures))
    return batch, [row for row in rows if row.key in gone]


# Condemnations that commit after their sweep was cancelled, and their
# releases: held here so the loop does not drop the tasks half-way.
_RELEASING_AFTER_CANCEL: set[asyncio.Future[Any]] = set()


async def _condemned(store: BlobGuard, condemning: Awaitable[list[str]]) -> list[str]:
    """The keys a condemn call condemned. A sweep cancelled while the store's
    transaction runs (a client's deadline) cannot stop it committing: its keys
    are released once it has, so no capture or later sweep waits out the hold
    of a sweep that is gone (they would see the keys as in use)."""
    condemn = asyncio.ensure_future(condemning)
    try:
        return await asyncio.shield(condemn)
    except asyncio.CancelledError:
        _RELEASING_AFTER_CANCEL.add(condemn)

        def release(done: asyncio.Future[list[str]]) -> None:
            _RELEASING_AFTER_CANCEL.discard(done)
            if done.cancelled() or done.exception() is not None:
                return
            follow = asyncio.ensure_future(_release(store, done.result()))
            _RELEASING_AFTER_CANCEL.add(follow)
            follow.add_done_callback(_RELEASING_AFTER_CANCEL.discard)

        condemn.add_done_callback(release)
        raise


async def _release(store: BlobGuard, keys: list[str]) -> None:
    if not keys:
        return
    try:
        # Shielded: a second cancellation must not leave the keys condemned,
        # where captures would wait up to hold_ms for them.
        await asyncio.shield(store.release_condemned(keys))
    except Exception:  # noqa: BLE001 - the hold expires on its own
        pass


async def _delete_pack(
    store: CheckpointStore,
    bucket: BlobStore,
    pack: str,
    info: BlobInfo,
    hold_ms: int,
    safety_margin_ms: int,
) -> SweepBatch:
    """Delete a pack no row points at, once every key it holds is condemned
    and the pack retired (module docstring)."""
    assert isinstance(store, BlobGuard) and isinstance(store, PackIndex)
    assert isinstance(store, PackMaintenance)
    try:
        entries = await read_pack_entries(bucket, pack, info.size)
    except BlobNotFoundError:
        return SweepBatch()  # gone already
    except PackTrailerError as error:
        return SweepBatch(failures=((pack, f"damaged pack, kept: {error}"),))
    except Exception as error:  # noqa: BLE001 - reported
        return SweepBatch(failures=((pack, _describe(error)),))
    # The pack's own key first: a capture pins the pack it uploads (one pin
    # per pack, blobs/packs.py "Safety"), migrate pins the keys in it.
    keys = [pack, *dict.fromkeys(entry.key for entry in entries)]
    # Started before the condemnation: its hold ends at or after started + hold_ms.
    started = time.monotonic()
    condemned: list[str] = []
    try:
        located = await _locate(store, keys[1:])
        if any(row is not None and row.pack == pack for row in located.values()):
            return SweepBatch(kept=((pack, IN_USE),))  # a capture indexed it since
        # The pack and every key, referenced or not: the writer of the pack (a
        # capture pins the pack, migrate, whose keys a checkpoint references
        # already, its keys) holds its pins until its rows are recorded, and a
        # key with a row in another pack may still get one here (the newest
        # row wins).
        condemned = await _condemned(store, store.condemn_unpinned_blobs(keys, hold_ms))
    except Exception as error:  # noqa: BLE001 - reported; nothing deleted
        await _release(store, condemned)
        return SweepBatch(failures=((pack, _describe(error)),))
    try:
        if len(condemned) < len(keys):
            return SweepBatch(kept=((pack, IN_USE),))
        # Retired: no row points at it, and while the retirement holds no
        # repack switch points one at it; a writer that would append or add
        # rows for it holds pins, which the condemnation saw. The delete must
        # end within both holds (the retirement's began later).
        if not await store.retire_pack(pack, hold_ms):
            return SweepBatch(kept=((pack, IN_USE),))
        outcome = (
            await _delete_before(
                bucket,
                [pack],
                started + (hold_ms - safety_margin_ms) / 1000,
                started + (hold_ms - safety_margin_ms / 2) / 1000,
            )
        )[0]
        if outcome == HOLD_EXPIRING:
            return SweepBatch(kept=((pack, HOLD_EXPIRING),))
        if outcome is not None:
            return SweepBatch(failures=((pack, outcome),))
        return SweepBatch(deleted=(pack,))
    except Exception as error:  # noqa: BLE001 - reported per pack
        return SweepBatch(failures=((pack, _describe(error)),))
    finally:
        await _release(store, condemned)


async def _locate(index: PackIndex, keys: list[str]) -> dict[str, PackedBlob | None]:
    found: dict[str, PackedBlob | None] = {}
    for start in range(0, len(keys), INDEX_PAGE):
        found.update(await index.locate_blobs(keys[start : start + INDEX_PAGE]))
    return found


class _Repacker:
    """Copies the live blobs of sparse packs into new packs (several old packs
    into one new pack up to PACK_TARGET_BYTES), then switches the index."""

    def __init__(
        self, store: CheckpointStore, bucket: BlobStore, hold_ms: int, safety_margin_ms: int
    ) -> None:
        assert isinstance(store, PackIndex) and isinstance(store, PackMaintenance)
        self.store = store
        self.switch_within_s = max(safety_margin_ms, 1) / 2000
        self.bucket = bucket
        self.reader = PackedBlobStore(bucket, store)
        self.writer = _native.PackWriter()
        self.placed: list[tuple[PackedBlob, tuple[int, int, int, int]]] = []
        self.sources: list[str] = []

    async def add(self, pack: str, info: BlobInfo) -> AsyncIterator[SweepBatch]:
        try:
            entries = await read_pack_entries(self.bucket, pack, info.size)
            keys = list(dict.fromkeys(entry.key for entry in entries))
            located = await _locate(self.store, keys)
            rows = [row for row in located.values() if row is not None and row.pack == pack]
            if not rows:
                yield SweepBatch(kept=((pack, IN_USE),))  # emptied meanwhile: a later sweep
                return
            data = await self.reader.read_packed(rows)
        except PackTrailerError as error:
            yield SweepBatch(failures=((pack, f"damaged pack, kept: {error}"),))
            return
        except Exception as error:  # noqa: BLE001 - reported; the pack stays as it is
            yield SweepBatch(failures=((pack, _describe(error)),))
            return
        items = [
            (row.key[len(FILE_KEY_PREFIX) :], raw) for row, raw in zip(rows, data, strict=True)
        ]
        placed = await asyncio.to_thread(self.writer.add_many, items)
        self.placed.extend(zip(rows, placed, strict=True))
        self.sources.append(pack)
        if self.writer.size >= PACK_TARGET_BYTES:
            async for result in self.finish():
                yield result

    async def finish(self) -> AsyncIterator[SweepBatch]:
        if not self.placed:
            return
        writer, placed, sources = self.writer, self.placed, self.sources
        self.writer, self.placed, self.sources = _native.PackWriter(), [], []
        try:
            digest, body = await asyncio.to_thread(writer.finish)
            new_pack = pack_key(digest)
            await put_many(self.bucket, [(new_pack, body)])  # durable before the switch
            # A concurrent sweep may be deleting a pack of these very bytes: it
            # retired it first, for a hold, so a switch soon after the upload
            # is refused while it could land; a late one is not attempted.
            switch_by = time.monotonic() + self.switch_within_s
            by_source: dict[str, list[PackedBlob]] = {}
            for row, (offset, length, raw_size, codec) in placed:
                by_source.setdefault(row.pack, []).append(
                    PackedBlob(row.key, new_pack, offset, length, raw_size, codec)
                )
            for source in sources:
                if time.monotonic() >= switch_by:
                    raise TimeoutError("the index switch came too late after the upload")
                await self.store.switch_packed_blobs(source, by_source.get(source, []))
        except Exception as error:  # noqa: BLE001 - the old packs stay indexed and valid
            message = _describe(error)
            yield SweepBatch(failures=tuple((source, message) for source in sources))
            return
        yield SweepBatch(kept=tuple((source, REPACKED) for source in sources))


async def _sweep_staging(
    bucket: BlobStore, cutoff: int, older_than_ms: int, hold_ms: int, dry_run: bool
) -> AsyncIterator[SweepBatch]:
    """Staging leftovers older than both ``older_than_ms`` and the hold."""
    age = max(older_than_ms, hold_ms)
    try:
        leftovers: list[StagingLeftover] = await list_staging(bucket)
    except Exception as error:  # noqa: BLE001 - reported; nothing removed
        yield SweepBatch(failures=(("<staging>", _describe(error)),))
        return
    old = [item for item in leftovers if cutoff - item.started_ms >= age]
    if not old:
        return
    if dry_run:
        yield SweepBatch(deleted=tuple(item.name for item in old))
        return
    deleted: list[str] = []
    failures: list[tuple[str, str]] = []
    for item in old:
        try:
            await remove_staging(bucket, item)
            deleted.append(item.name)
        except Exception as error:  # noqa: BLE001 - reported per leftover
            failures.append((item.name, _describe(error)))
    yield SweepBatch(deleted=tuple(deleted), failures=tuple(failures))


async def _sweep_batch(
    store: BlobGuard,
    blobs: BlobStore,
    batch: list[str],
    hold_ms: int,
    safety_margin_ms: int,
) -> SweepBatch:
    # Started before the condemn call: the store's hold ends at or after
    # started + hold_ms, so stopping at started + hold_ms - margin is safe.
    started = time.monotonic()
    try:
        condemned = await _condemned(store, store.condemn_blobs(batch, hold_ms))
    except Exception as error:  # noqa: BLE001 - reported per key; nothing deleted
        message = _describe(error)
        return SweepBatch(failures=tuple((key, message) for key in batch))
    deadline = started + (hold_ms - safety_margin_ms) / 1000
    # A delete that started in time must still end before the hold does.
    hard_deadline = started + (hold_ms - safety_margin_ms / 2) / 1000
    chosen = set(condemned)
    kept = [(key, IN_USE) for key in batch if key not in chosen]
    deleted: list[str] = []
    failures: list[tuple[str, str]] = []
    try:
        outcomes = await _delete_before(blobs, condemned, deadline, hard_deadline)
    finally:
        try:
            # Shielded: a second cancellation (a client that gives up while
            # the first one unwinds) must not leave the keys condemned, where
            # captures would wait up to hold_ms for them.
            await asyncio.shield(store.release_condemned(condemned))
        except Exception:  # noqa: BLE001 - the hold expires on its own
            pass
    for key, outcome in zip(condemned, outcomes, strict=True):
        if outcome is None:
            deleted.append(key)
        elif outcome == HOLD_EXPIRING:
            kept.append((key, HOLD_EXPIRING))
        else:
            failures.append((key, outcome))
    return SweepBatch(deleted=tuple(deleted), kept=tuple(kept), failures=tuple(failures))


async def _delete_before(
    blobs: BlobStore, keys: Sequence[str], deadline: float, hard_deadline: float | None = None
) -> list[str | None]:
    """Delete ``keys`` with bounded concurrency, none started after ``deadline``
    and none still running at ``hard_deadline`` (monotonic seconds).

    Returns per key: None when deleted, HOLD_EXPIRING when skipped for time, or
    the failure message. A delete still running at ``hard_deadline`` is
    cancelled (obstore drops the request, so no retry lands later) and reported
    as a failure.
    """
    limit = asyncio.Semaphore(DELETE_CONCURRENCY)
    if hard_deadline is None:
        hard_deadline = deadline

    async def delete_one(key: str) -> str | None:
        async with limit:
            if time.monotonic() >= deadline:
                return HOLD_EXPIRING
            try:
                async with asyncio.timeout_at(_loop_time(hard_deadline)):
                    await blobs.delete(key)
            except TimeoutError:
                return "delete cancelled: the condemnation hold was about to expire"
            except Exception as error:  # noqa: BLE001 - reported per key
                return _describe(error)
            return None

    return list(await asyncio.gather(*(delete_one(key) for key in keys)))


def _loop_time(monotonic_deadline: float) -> float:
    """The event loop's clock value at a ``time.monotonic()`` deadline."""
    loop = asyncio.get_running_loop()
    return loop.time() + (monotonic_deadline - time.monotonic())


def _describe(error: BaseException) -> str:
    if isinstance(error, BlobStoreError):
        return str(error)
    return f"{type(error).__name__}: {error}"
