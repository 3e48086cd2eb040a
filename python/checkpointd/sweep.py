"""Prune a thread's old checkpoints and sweep blobs no checkpoint uses (SPEC §6).

``sweep_blobs`` is safe while captures run, through the store's BlobGuard
(``checkpointd.store.base``): a capture pins the keys it will reference before
it trusts the bucket, and the sweep deletes a key only after condemning it in
the store. Condemning skips any key with a reference, a live pin or another
sweep's live condemnation, in one transaction; a capture that pins a condemned
key is told so and waits until the condemnation is released or expires. So a
key is deleted only while no capture can be relying on it. Two rules keep that
true in time:

* Deletes of a batch stop ``safety_margin_ms`` before the batch's hold runs out
  (measured on a monotonic clock started *before* the condemn call, so the
  store's hold can only end later), so no delete lands after a capture could
  have pinned the key and found the blob in the bucket.
* Condemnations are released when the batch is done, deleted or not, in every
  case (also on cancellation), so captures wait at most one batch.

The counters are not trusted alone: before anything is deleted the sweep reads
the store's audit (``BlobAudit.audit_blob_references``: each key's stored count
beside the number of stored manifests that use it, in one snapshot) and keeps
every key either side names. A key where the two disagree is kept with the
reason ``count-mismatch`` (``checkpointd check --repair`` fixes the counts), so
one damaged count row can never make a sweep delete a blob a checkpoint uses.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field

from .blobs.base import BlobStore, BlobStoreError
from .errors import SandboxCheckpointInvalidArgumentError
from .store._options import check_hold_ms, check_keep, list_order, plan_prune, valid_blob_key
from .store.base import BlobAudit, BlobCount, BlobGuard, CheckpointStore
from .validation import check_id, is_int

SWEPT_PREFIXES = ("sandbox-files/", "sandbox-artifacts/")

# Reasons a listed key is kept (SweepReport.kept).
REFERENCED = "referenced"  # a checkpoint uses it
TOO_YOUNG = "too-young"  # uploaded less than older_than_ms ago
NOT_A_BLOB_KEY = "not-a-blob-key"  # not sandbox-{files,artifacts}/blake3/<64 hex>
IN_USE = "in-use"  # the store refused to condemn it: a new reference or a capture's pin
HOLD_EXPIRING = "hold-expiring"  # the batch ran out of time; the next sweep retries
# The stored count and the manifests disagree about the key (kept either way).
COUNT_MISMATCH = "count-mismatch"

DEFAULT_HOLD_MS = 120_000
DEFAULT_SAFETY_MARGIN_MS = 30_000
DEFAULT_BATCH_SIZE = 256
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


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def _check_arguments(
    store: CheckpointStore,
    older_than_ms: int,
    dry_run: bool,
    hold_ms: int,
    safety_margin_ms: int,
    batch_size: int,
) -> None:
    if not is_int(older_than_ms) or older_than_ms < 0:
        raise SandboxCheckpointInvalidArgumentError(
            f"older_than_ms must be an integer >= 0, got {older_than_ms!r}"
        )
    check_hold_ms(hold_ms)
    if not is_int(safety_margin_ms) or not 0 <= safety_margin_ms < hold_ms:
        raise SandboxCheckpointInvalidArgumentError(
            f"safety_margin_ms must be an integer in [0, hold_ms), got {safety_margin_ms!r}"
        )
    if not is_int(batch_size) or batch_size < 1:
        raise SandboxCheckpointInvalidArgumentError(
            f"batch_size must be an integer >= 1, got {batch_size!r}"
        )
    if not dry_run and not isinstance(store, BlobGuard):
        raise SandboxCheckpointInvalidArgumentError(
            f"{type(store).__name__} does not implement pin_blobs/condemn_blobs; "
            "sweeping it would not be safe while captures run"
        )
    if not isinstance(store, BlobAudit):
        raise SandboxCheckpointInvalidArgumentError(
            f"{type(store).__name__} does not implement audit_blob_references; "
            "a sweep must check the manifests, not the counts alone"
        )


async def sweep_blobs(
    store: CheckpointStore,
    blobs: BlobStore,
    older_than_ms: int,
    *,
    now: Callable[[], int] | None = None,
    dry_run: bool = False,
    hold_ms: int = DEFAULT_HOLD_MS,
    safety_margin_ms: int = DEFAULT_SAFETY_MARGIN_MS,
    batch_size: int = DEFAULT_BATCH_SIZE,
) -> SweepReport:
    """Delete every blob no checkpoint uses that was uploaded at least
    ``older_than_ms`` ago (``now() - uploaded >= older_than_ms``).

    ``now`` returns ms since the epoch (default: the wall clock) and is compared
    with the objects' last-modified times. ``dry_run`` reports the candidates
    without condemning or deleting anything. ``store`` must implement BlobGuard
    (every store we ship does). Raises SandboxCheckpointInvalidArgumentError for
    a bad argument; backend failures are reported per key in the result, and a
    failure to list the blobs or the references deletes nothing.

    The whole report in memory: for a bucket of millions of keys use
    ``iter_sweep_blobs``, which hands out the same results batch by batch.
    """
    report = SweepReport(dry_run=dry_run)
    async for batch in iter_sweep_blobs(
        store,
        blobs,
        older_than_ms,
        now=now,
        dry_run=dry_run,
        hold_ms=hold_ms,
        safety_margin_ms=safety_margin_ms,
        batch_size=batch_size,
    ):
        report.deleted.extend(batch.deleted)
        report.kept.extend(batch.kept)
        report.failures.extend(batch.failures)
    return report


async def iter_sweep_blobs(
    store: CheckpointStore,
    blobs: BlobStore,
    older_than_ms: int,
    *,
    now: Callable[[], int] | None = None,
    dry_run: bool = False,
    hold_ms: int = DEFAULT_HOLD_MS,
    safety_margin_ms: int = DEFAULT_SAFETY_MARGIN_MS,
    batch_size: int = DEFAULT_BATCH_SIZE,
) -> AsyncIterator[SweepBatch]:
    """``sweep_blobs`` as a stream of SweepBatch, each yielded as soon as it is
    known (same arguments, same rules, same errors).

    Memory: the referenced keys and the delete candidates (key strings) are held,
    because no key may be deleted before the whole bucket has been listed (a
    listing failure deletes nothing); the listing itself is walked a page at a
    time and kept keys are handed out per page, never gathered. A caller that
    stops iterating stops the sweep after the batch in flight (its condemnations
    are released).
    """
    _check_arguments(store, older_than_ms, dry_run, hold_ms, safety_margin_ms, batch_size)
    assert isinstance(store, BlobAudit)
    try:
        # Iterable, not list: store.base annotates with ``list`` inside a class
        # that has a ``list`` method, which mypy then cannot resolve.
        audit: Iterable[BlobCount] = await store.audit_blob_references()
        # key -> kept reason: every key a count or a manifest names is kept.
        referenced = {c.key: REFERENCED if c.agrees else COUNT_MISMATCH for c in audit}
    except Exception as error:  # noqa: BLE001 - reported, and nothing is deleted
        yield SweepBatch(failures=(("<references>", _describe(error)),))
        return
    del audit

    cutoff = (now or _wall_clock_ms)()
    candidates: list[str] = []
    listing_failed = False
    for prefix in SWEPT_PREFIXES:
        try:
            async for page in blobs.list_pages(prefix):
                kept: list[tuple[str, str]] = []
                for info in page:
                    if not valid_blob_key(info.key):
                        kept.append((info.key, NOT_A_BLOB_KEY))
                    elif info.key in referenced:
                        kept.append((info.key, referenced[info.key]))
                    elif cutoff - info.last_modified_ms < older_than_ms:
                        kept.append((info.key, TOO_YOUNG))
                    else:
                        candidates.append(info.key)
                yield SweepBatch(kept=tuple(kept), listed=len(page))
        except Exception as error:  # noqa: BLE001 - a listing failure is reported
            listing_failed = True
            yield SweepBatch(failures=((prefix, _describe(error)),))
    del referenced
    if listing_failed:
        return

    for start in range(0, len(candidates), batch_size):
        batch = candidates[start : start + batch_size]
        if dry_run:
            yield SweepBatch(deleted=tuple(batch))
        else:
            assert isinstance(store, BlobGuard)
            yield await _sweep_batch(store, blobs, batch, hold_ms, safety_margin_ms)


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
        condemned = await store.condemn_blobs(batch, hold_ms)
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


async def prune(
    store: CheckpointStore, thread_id: str, keep: int, *, dry_run: bool = False
) -> list[str]:
    """Keep the thread's head and its ``keep - 1`` nearest ancestors, delete the
    rest; returns the deleted ids in list order (SPEC §3 ``delete_checkpoints``).

    Takes the thread's writer lease (WRITER_CONFLICT while a capture or restore
    runs) and releases it in every case. ``dry_run`` returns what would be
    deleted and changes nothing. Raises SandboxCheckpointInvalidIdError for a bad
    thread id and SandboxCheckpointInvalidArgumentError for ``keep`` < 1.
    """
    check_id(thread_id, "thread id")
    check_keep(keep)
    lease = await store.acquire_writer(thread_id)
    try:
        if not dry_run:
            return await store.delete_checkpoints(thread_id, keep, lease)
        # Under the lease nobody appends or deletes, so this is exactly what
        # delete_checkpoints would do now.
        checkpoints = await store.list(thread_id)
        pairs = [(c.id, c.parent_checkpoint_id) for c in checkpoints]
        doomed = plan_prune(pairs, await store.get_head(thread_id), keep)
        ordered = sorted(
            (c for c in checkpoints if c.id in doomed), key=lambda c: list_order(c.created_at, c.id)
        )
        return [c.id for c in ordered]
    finally:
        await lease.release()


__all__ = [
    "COUNT_MISMATCH",
    "HOLD_EXPIRING",
    "IN_USE",
    "NOT_A_BLOB_KEY",
    "REFERENCED",
    "SWEPT_PREFIXES",
    "TOO_YOUNG",
    "SweepBatch",
    "SweepReport",
    "iter_sweep_blobs",
    "prune",
    "sweep_blobs",
]
