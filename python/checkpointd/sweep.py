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
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from .blobs.base import BlobInfo, BlobStore, BlobStoreError
from .errors import SandboxCheckpointInvalidArgumentError
from .model import BlobReference
from .store._options import check_hold_ms, check_keep, list_order, plan_prune, valid_blob_key
from .store.base import BlobGuard, CheckpointStore
from .validation import check_id, is_int

SWEPT_PREFIXES = ("sandbox-files/", "sandbox-artifacts/")

# Reasons a listed key is kept (SweepReport.kept).
REFERENCED = "referenced"  # a checkpoint uses it
TOO_YOUNG = "too-young"  # uploaded less than older_than_ms ago
NOT_A_BLOB_KEY = "not-a-blob-key"  # not sandbox-{files,artifacts}/blake3/<64 hex>
IN_USE = "in-use"  # the store refused to condemn it: a new reference or a capture's pin
HOLD_EXPIRING = "hold-expiring"  # the batch ran out of time; the next sweep retries

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


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


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
    """
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

    listed, failures = await _list_blobs(blobs)
    if failures:
        return SweepReport(failures=failures, dry_run=dry_run)
    try:
        # Iterable, not list: store.base annotates with ``list`` inside a class
        # that has a ``list`` method, which mypy then cannot resolve.
        references: Iterable[BlobReference] = await store.list_blob_references()
        referenced = {reference.key for reference in references}
    except Exception as error:  # noqa: BLE001 - reported, and nothing is deleted
        return SweepReport(failures=[("<references>", _describe(error))], dry_run=dry_run)

    cutoff = (now or _wall_clock_ms)()
    kept: list[tuple[str, str]] = []
    candidates: list[str] = []
    for info in listed:
        if not valid_blob_key(info.key):
            kept.append((info.key, NOT_A_BLOB_KEY))
        elif info.key in referenced:
            kept.append((info.key, REFERENCED))
        elif cutoff - info.last_modified_ms < older_than_ms:
            kept.append((info.key, TOO_YOUNG))
        else:
            candidates.append(info.key)

    if dry_run:
        return SweepReport(deleted=candidates, kept=kept, dry_run=True)

    assert isinstance(store, BlobGuard)
    deleted: list[str] = []
    for start in range(0, len(candidates), batch_size):
        batch = candidates[start : start + batch_size]
        await _sweep_batch(store, blobs, batch, hold_ms, safety_margin_ms, deleted, kept, failures)
    return SweepReport(deleted=deleted, kept=kept, failures=failures)


async def _list_blobs(blobs: BlobStore) -> tuple[list[BlobInfo], list[tuple[str, str]]]:
    listed: list[BlobInfo] = []
    failures: list[tuple[str, str]] = []
    for prefix in SWEPT_PREFIXES:
        try:
            listed.extend(await blobs.list(prefix))
        except Exception as error:  # noqa: BLE001 - a listing failure is reported
            failures.append((prefix, _describe(error)))
    return listed, failures


async def _sweep_batch(
    store: BlobGuard,
    blobs: BlobStore,
    batch: list[str],
    hold_ms: int,
    safety_margin_ms: int,
    deleted: list[str],
    kept: list[tuple[str, str]],
    failures: list[tuple[str, str]],
) -> None:
    # Started before the condemn call: the store's hold ends at or after
    # started + hold_ms, so stopping at started + hold_ms - margin is safe.
    started = time.monotonic()
    try:
        condemned = await store.condemn_blobs(batch, hold_ms)
    except Exception as error:  # noqa: BLE001 - reported per key; nothing deleted
        message = _describe(error)
        failures.extend((key, message) for key in batch)
        return
    deadline = started + (hold_ms - safety_margin_ms) / 1000
    # A delete that started in time must still end before the hold does.
    hard_deadline = started + (hold_ms - safety_margin_ms / 2) / 1000
    chosen = set(condemned)
    kept.extend((key, IN_USE) for key in batch if key not in chosen)
    try:
        outcomes = await _delete_before(blobs, condemned, deadline, hard_deadline)
    finally:
        try:
            await store.release_condemned(condemned)
        except Exception:  # noqa: BLE001 - the hold expires on its own
            pass
    for key, outcome in zip(condemned, outcomes, strict=True):
        if outcome is None:
            deleted.append(key)
        elif outcome == HOLD_EXPIRING:
            kept.append((key, HOLD_EXPIRING))
        else:
            failures.append((key, outcome))


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
    "HOLD_EXPIRING",
    "IN_USE",
    "NOT_A_BLOB_KEY",
    "REFERENCED",
    "SWEPT_PREFIXES",
    "TOO_YOUNG",
    "SweepReport",
    "prune",
    "sweep_blobs",
]
