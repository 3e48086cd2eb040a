"""Prune a thread's old checkpoints and sweep blobs no checkpoint uses (docs/contract.md#prune-and-sweep).

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

Packs (``blobs/packs.py``; the index is ``store.base.PackIndex``). Small blobs
live in pack objects under ``sandbox-packs/``, found through index rows in the
store; the logical keys and this contract do not change. A capture pins its
keys before it looks them up in the index and trusts a row it finds, so:

* A packed key no checkpoint uses (and whose pack is old enough) is deleted by
  dropping its row (``PackMaintenance.drop_packed_blobs``), which the store
  does only while the key is condemned and unreferenced: a capture that pins it
  afterwards is told it is condemned, waits, finds no row and packs the bytes
  again. The report lists it in ``deleted`` like a single object.
* A pack no row points at (an unfinished or killed capture's, or a killed
  ``checkpointd migrate``'s) is deleted once its own key and every key it
  holds are condemned (``PackMaintenance.condemn_unpinned_blobs``: references
  aside, only live pins and condemnations refuse): the writer of a pack pins
  before the upload and until its rows are recorded — a capture the pack's
  key (one pin per pack), migrate the keys in it — so a condemned set means
  nobody can still point a row at the pack, and a writer that pins the pack
  or one of the keys meanwhile waits until the delete is done. Before
  the delete the store retires the pack for the hold (``retire_pack``, only
  while no row points at it) and deletes it within the hold, and a repack
  switches rows to its new pack only within half the safety margin after the
  upload, so a concurrent repack that wrote a pack of the same bytes cannot
  switch rows to the pack being deleted. The pack itself is in ``deleted``.
* A pack whose live bytes fall below ``repack_below`` (default 50%) of its
  frames is repacked: its live blobs are read (checked), written into a new
  pack with other repacked blobs, uploaded (durable), and the index switched in
  one transaction (``switch_packed_blobs``: only rows still in the old pack
  move). Both copies are valid, so a reader holding an old row still reads
  correct bytes; the old pack, now without rows, is deleted by a later sweep
  (kept here as ``repacked``), which is the hold readers get.
* A damaged pack (unreadable trailer) is never deleted or repacked by a sweep:
  it is a failure for ``checkpointd check`` to explain.
* The single object of a used key that also has a row (``checkpointd
  migrate`` packed it, or the first capture naming a small artifact did) is
  deleted once older than ``older_than_ms``: readers take the row, which stays
  while the key is used. That is storage, not a key: the key is reported kept,
  as the index walk finds it. One row serves a digest's file and artifact keys
  (``store._packindex.row_key``): it is live while either is referenced.

Staging leftovers: a blob directory's staging files (``<file>#<digits>``, a
killed writer's) and an S3 bucket's unfinished multipart uploads under the
store's prefix are removed once older than both ``older_than_ms`` and the hold
(``blobs/staging.py``); they appear in ``deleted`` as ``<key>#<digits>`` and
``<key>?uploadId=<id>``. An upload running longer than that is aborted and its
capture fails cleanly (nothing references a blob that never completed).

This module plans a sweep (the audit, the listings, the index walk, what to
condemn); ``_sweep_delete`` condemns, deletes, repacks and reports.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypedDict, Unpack

from ._keywords import check_keywords
from ._sweep_delete import (
    COUNT_MISMATCH,
    HOLD_EXPIRING,
    IN_USE,
    INDEX_PAGE,
    NOT_A_BLOB_KEY,
    REFERENCED,
    REPACKED,
    TOO_YOUNG,
    SweepBatch,
    SweepReport,
    _delete_before,
    _delete_pack,
    _describe,
    _drop_rows,
    _Repacker,
    _sweep_batch,
    _sweep_staging,
)
from .blobs.base import BlobInfo, BlobStore
from .blobs.packs import PACK_KEY_PREFIX, PackedBlobStore
from .errors import SandboxCheckpointInvalidArgumentError
from .store._options import check_hold_ms, check_keep, list_order, plan_prune, valid_blob_key
from .store._packindex import artifact_twin, row_key
from .store.base import (
    BlobAudit,
    BlobCount,
    BlobGuard,
    CheckpointStore,
    PackedBlob,
    PackIndex,
    PackMaintenance,
)
from .validation import check_id, is_int

SWEPT_PREFIXES = ("sandbox-files/", "sandbox-artifacts/")

# Repack a pack once its live bytes are below this fraction of its frames.
DEFAULT_REPACK_BELOW = 0.5
# Pack header, footer and per-blob trailer entry (rust/src/pack.rs).
_PACK_OVERHEAD = 8 + 24
_PACK_ENTRY = 42

DEFAULT_HOLD_MS = 120_000
DEFAULT_SAFETY_MARGIN_MS = 30_000
DEFAULT_BATCH_SIZE = 256


def repack_below_percent(percent: int | None) -> float:
    """The ``repack_below`` fraction of a percentage (SweepBlobs'
    ``repack_below_percent``, ``checkpointd sweep --repack-below``): None gives
    the default, 50%. Outside 0-100: SandboxCheckpointInvalidArgumentError
    naming the field."""
    if percent is None:
        return DEFAULT_REPACK_BELOW
    if not is_int(percent) or not 0 <= percent <= 100:
        raise SandboxCheckpointInvalidArgumentError(
            f"repack_below_percent must be an integer in [0, 100], got {percent!r}",
            details={"field": "repack_below_percent", "value": str(percent)},
        )
    return percent / 100


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class SweepOptions(TypedDict, total=False):
    """The keywords of ``sweep_blobs`` and ``iter_sweep_blobs`` (their docstrings)."""

    now: Callable[[], int] | None
    dry_run: bool
    hold_ms: int
    safety_margin_ms: int
    batch_size: int
    repack_below: float


@dataclass(frozen=True, slots=True)
class _Settings:
    """A sweep's arguments, the defaults filled in."""

    older_than_ms: int
    now: Callable[[], int] | None = None
    dry_run: bool = False
    hold_ms: int = DEFAULT_HOLD_MS
    safety_margin_ms: int = DEFAULT_SAFETY_MARGIN_MS
    batch_size: int = DEFAULT_BATCH_SIZE
    repack_below: float = DEFAULT_REPACK_BELOW


def _settings(
    function: str, store: CheckpointStore, older_than_ms: int, options: SweepOptions
) -> _Settings:
    """The arguments of a sweep, checked. Raises TypeError for an unknown
    keyword and SandboxCheckpointInvalidArgumentError for a bad value or a
    store a sweep cannot use."""
    check_keywords(function, options, SweepOptions)
    settings = _Settings(older_than_ms, **options)
    if not is_int(older_than_ms) or older_than_ms < 0:
        raise SandboxCheckpointInvalidArgumentError(
            f"older_than_ms must be an integer >= 0, got {older_than_ms!r}"
        )
    hold_ms, safety_margin_ms = settings.hold_ms, settings.safety_margin_ms
    check_hold_ms(hold_ms)
    if not is_int(safety_margin_ms) or not 0 <= safety_margin_ms < hold_ms:
        raise SandboxCheckpointInvalidArgumentError(
            f"safety_margin_ms must be an integer in [0, hold_ms), got {safety_margin_ms!r}"
        )
    if not is_int(settings.batch_size) or settings.batch_size < 1:
        raise SandboxCheckpointInvalidArgumentError(
            f"batch_size must be an integer >= 1, got {settings.batch_size!r}"
        )
    repack_below = settings.repack_below
    if (
        isinstance(repack_below, bool)
        or not isinstance(repack_below, int | float)
        or not 0 <= repack_below <= 1
    ):
        raise SandboxCheckpointInvalidArgumentError(
            f"repack_below must be a fraction in [0, 1], got {repack_below!r}",
            details={"field": "repack_below", "value": str(repack_below)},
        )
    _check_store(store, settings.dry_run)
    return settings


def _check_store(store: CheckpointStore, dry_run: bool) -> None:
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
    **options: Unpack[SweepOptions],
) -> SweepReport:
    """Delete every blob no checkpoint uses that was uploaded at least
    ``older_than_ms`` ago (``now() - uploaded >= older_than_ms``; a packed
    blob's upload time is its pack's), and repack packs whose live bytes are
    below ``repack_below`` of their frames (module docstring).

    Keywords (``SweepOptions``): ``now`` returns ms since the epoch (default:
    the wall clock) and is compared with the objects' last-modified times.
    ``dry_run`` (default False) reports the candidates without condemning,
    deleting or repacking anything. ``hold_ms`` (default 120 s), how long a
    batch's condemnations hold; ``safety_margin_ms`` (default 30 s), how long
    before that deletes stop; ``batch_size`` (default 256) keys per batch;
    ``repack_below`` (default 0.5). ``store`` must implement BlobGuard (every
    store we ship does). Raises TypeError for an unknown keyword and
    SandboxCheckpointInvalidArgumentError for a bad argument; backend failures
    are reported per key in the result, and a failure to list the blobs, the
    packs, the index or the references deletes nothing.

    The whole report in memory: for a bucket of millions of keys use
    ``iter_sweep_blobs``, which hands out the same results batch by batch.
    """
    report = SweepReport(dry_run=options.get("dry_run", False))
    settings = _settings("sweep_blobs", store, older_than_ms, options)
    async for batch in _Sweep(store, blobs, settings).run():
        report.deleted.extend(batch.deleted)
        report.kept.extend(batch.kept)
        report.failures.extend(batch.failures)
    return report


@dataclass(slots=True)
class _PackTally:
    """What the index says about one pack while the sweep walks it."""

    rows: int = 0  # rows pointing at the pack now
    live_bytes: int = 0  # stored bytes of those rows
    seen: int = 0  # rows found pointing at it (trailer entries at least)


def _valid_pack_key(key: str) -> bool:
    tail = key[len(PACK_KEY_PREFIX) :] if key.startswith(PACK_KEY_PREFIX) else ""
    return len(tail) == 64 and all(c in "0123456789abcdef" for c in tail)


def _inner(blobs: BlobStore) -> BlobStore:
    """The bucket itself: packs and single objects are its objects."""
    return blobs.inner if isinstance(blobs, PackedBlobStore) else blobs


async def iter_sweep_blobs(
    store: CheckpointStore,
    blobs: BlobStore,
    older_than_ms: int,
    **options: Unpack[SweepOptions],
) -> AsyncIterator[SweepBatch]:
    """``sweep_blobs`` as a stream of SweepBatch, each yielded as soon as it is
    known (same arguments, same rules, same errors).

    Memory: the referenced keys, the delete candidates (key strings and dead
    index rows) and a few counters per pack are held, because no key may be
    deleted before the whole bucket and index have been listed (a listing
    failure deletes nothing); the listings themselves are walked a page at a
    time and kept keys are handed out per page, never gathered. A caller that
    stops iterating stops the sweep after the batch in flight (its
    condemnations are released).
    """
    settings = _settings("iter_sweep_blobs", store, older_than_ms, options)
    async for batch in _Sweep(store, blobs, settings).run():
        yield batch


class _Sweep:
    """One sweep, phase by phase (``run``): what a phase learns is kept here
    for the next, and dropped once no later phase needs it."""

    def __init__(self, store: CheckpointStore, blobs: BlobStore, settings: _Settings) -> None:
        self.store = store
        self.bucket = _inner(blobs)
        self.settings = settings
        # Packs are swept where the store can change its index; elsewhere only
        # the single objects are (a pack is then never touched).
        self.index = (
            store if isinstance(store, PackIndex) and isinstance(store, PackMaintenance) else None
        )
        self.cutoff = 0
        # key -> kept reason: every key a count or a manifest names is kept.
        self.referenced: dict[str, str] = {}
        self.listing_failed = False
        self.candidates: list[str] = []
        # (key, pack): a used key whose blob is also packed (``checkpointd migrate``).
        self.maybe_superseded: list[tuple[str, str]] = []
        self.superseded: list[str] = []
        self.packs: dict[str, BlobInfo] = {}
        self.tallies: dict[str, _PackTally] = {}
        self.dead_rows: list[PackedBlob] = []
        # Keys deleted as single objects (not reported again for their rows).
        self.single: set[str] = set()

    def _young(self, info: BlobInfo) -> bool:
        return self.cutoff - info.last_modified_ms < self.settings.older_than_ms

    async def run(self) -> AsyncIterator[SweepBatch]:
        """Read, list and walk everything first; delete only when nothing failed."""
        assert isinstance(self.store, BlobAudit)
        try:
            # Iterable, not list: store.base annotates with ``list`` inside a class
            # that has a ``list`` method, which mypy then cannot resolve.
            audit: Iterable[BlobCount] = await self.store.audit_blob_references()
            self.referenced = {c.key: REFERENCED if c.agrees else COUNT_MISMATCH for c in audit}
        except Exception as error:  # noqa: BLE001 - reported, and nothing is deleted
            yield SweepBatch(failures=(("<references>", _describe(error)),))
            return
        del audit
        self.cutoff = (self.settings.now or _wall_clock_ms)()
        for prefix in SWEPT_PREFIXES:
            async for batch in self._list_blobs(prefix):
                yield batch
        async for batch in self._list_packs():
            yield batch
        async for batch in self._walk_index():
            yield batch
        self.referenced = {}
        if self.listing_failed:
            return
        phases = (
            self._keep_young_unlisted_packs,
            self._delete_single_objects,
            self._delete_superseded,
            self._drop_dead_rows,
        )
        for phase in phases:
            async for batch in phase():
                yield batch
        if self.index is None:
            return
        async for batch in self._sweep_packs():
            yield batch
        async for batch in _sweep_staging(
            self.bucket,
            self.cutoff,
            self.settings.older_than_ms,
            self.settings.hold_ms,
            self.settings.dry_run,
        ):
            yield batch

    # ------------------------------------------------------------- listing

    async def _list_blobs(self, prefix: str) -> AsyncIterator[SweepBatch]:
        """The single objects under ``prefix``: kept, a delete candidate, or
        (used, and packed too) maybe superseded by its row."""
        try:
            async for page in self.bucket.list_pages(prefix):
                kept: list[tuple[str, str]] = []
                used: list[BlobInfo] = []
                for info in page:
                    if not valid_blob_key(info.key):
                        kept.append((info.key, NOT_A_BLOB_KEY))
                    elif info.key in self.referenced:
                        if self.index is not None:
                            used.append(info)
                        else:
                            kept.append((info.key, self.referenced[info.key]))
                    elif self._young(info):
                        kept.append((info.key, TOO_YOUNG))
                    else:
                        self.candidates.append(info.key)
                if used:
                    kept.extend(await self._used(used))
                yield SweepBatch(kept=tuple(kept), listed=len(page))
        except Exception as error:  # noqa: BLE001 - a listing failure is reported
            self.listing_failed = True
            yield SweepBatch(failures=((prefix, _describe(error)),))

    async def _used(self, used: list[BlobInfo]) -> list[tuple[str, str]]:
        """The used single objects of a page kept as keys (the others the index
        walk reports); each old one that is also packed may be superseded."""
        assert self.index is not None
        kept: list[tuple[str, str]] = []
        # An artifact's packed copy is its digest's row (row_key).
        located = await self.index.locate_blobs([row_key(info.key) for info in used])
        for info in used:
            row = located.get(row_key(info.key))
            if row is None or row.key != info.key:
                # (An artifact: the index walk names its row's file form.)
                kept.append((info.key, self.referenced[info.key]))
            if row is not None and not self._young(info):
                self.maybe_superseded.append((info.key, row.pack))
            # else: also packed, and the index walk reports it
        return kept

    async def _list_packs(self) -> AsyncIterator[SweepBatch]:
        if self.index is not None and not self.listing_failed:
            try:
                async for page in self.bucket.list_pages(PACK_KEY_PREFIX):
                    kept = []
                    for info in page:
                        if _valid_pack_key(info.key):
                            self.packs[info.key] = info
                        else:
                            kept.append((info.key, NOT_A_BLOB_KEY))
                    yield SweepBatch(kept=tuple(kept), listed=len(page))
            except Exception as error:  # noqa: BLE001 - a listing failure is reported
                self.listing_failed = True
                yield SweepBatch(failures=((PACK_KEY_PREFIX, _describe(error)),))
        # Readers take the pack, so the single object goes once its pack is there
        # (storage, not a key: the key stays, and the index walk reports it).
        self.superseded = [key for key, pack in self.maybe_superseded if pack in self.packs]
        self.maybe_superseded = []

    async def _walk_index(self) -> AsyncIterator[SweepBatch]:
        """Tally each pack's rows; a row no checkpoint uses, in an old pack, is dead."""
        if self.index is None or self.listing_failed:
            return
        try:
            async for rows_page in _index_pages(self.index):
                kept = []
                for row in rows_page:
                    tally = self.tallies.setdefault(row.pack, _PackTally())
                    tally.rows += 1
                    tally.seen += 1
                    tally.live_bytes += row.length
                    pack = self.packs.get(row.pack)
                    # The row serves the digest's artifact key too (row_key).
                    names = _referenced_names(row.key, self.referenced)
                    if names:
                        kept.extend(names)
                    elif pack is not None and self._young(pack):
                        kept.append((row.key, TOO_YOUNG))
                    else:
                        # Also a row whose pack is gone: dropping it is harmless.
                        self.dead_rows.append(row)
                yield SweepBatch(kept=tuple(kept))
        except Exception as error:  # noqa: BLE001 - a listing failure is reported
            self.listing_failed = True
            yield SweepBatch(failures=(("<pack index>", _describe(error)),))

    # ------------------------------------------------------------- deleting

    async def _keep_young_unlisted_packs(self) -> AsyncIterator[SweepBatch]:
        """A row whose pack the listing did not show: its pack is gone, or it was
        uploaded since (UploadArtifact packs an artifact no checkpoint names yet
        and records its row at once). A HEAD tells which: a young one keeps its rows."""
        dead_rows = self.dead_rows
        unlisted = list(dict.fromkeys(row.pack for row in dead_rows if row.pack not in self.packs))
        young: set[str] = set()
        for pack_name in unlisted:
            try:
                found = await self.bucket.head(pack_name)
            except Exception as error:  # noqa: BLE001 - reported; its rows are kept
                young.add(pack_name)
                yield SweepBatch(failures=((pack_name, _describe(error)),))
                continue
            if found is not None and self._young(found):
                young.add(pack_name)
        if young:
            yield SweepBatch(
                kept=tuple((row.key, TOO_YOUNG) for row in dead_rows if row.pack in young)
            )
            self.dead_rows = [row for row in dead_rows if row.pack not in young]

    async def _delete_single_objects(self) -> AsyncIterator[SweepBatch]:
        # A key deleted as a single object is reported there, not again for its row.
        self.single = set(self.candidates) if self.dead_rows else set()
        settings = self.settings
        for start in range(0, len(self.candidates), settings.batch_size):
            batch = self.candidates[start : start + settings.batch_size]
            if settings.dry_run:
                yield SweepBatch(deleted=tuple(batch))
            else:
                assert isinstance(self.store, BlobGuard)
                yield await _sweep_batch(
                    self.store, self.bucket, batch, settings.hold_ms, settings.safety_margin_ms
                )
        self.candidates = []

    async def _delete_superseded(self) -> AsyncIterator[SweepBatch]:
        batch_size = self.settings.batch_size
        for start in range(0, len(self.superseded), batch_size):
            batch = self.superseded[start : start + batch_size]
            if self.settings.dry_run:
                yield SweepBatch(deleted=tuple(batch))
                continue
            # No condemnation: the key is used, its row stays while it is (rows go
            # only for condemned, unreferenced keys), and every reader prefers it.
            outcomes = await _delete_before(self.bucket, batch, float("inf"))
            failed = [
                (key, why) for key, why in zip(batch, outcomes, strict=True) if why is not None
            ]
            if failed:
                yield SweepBatch(
                    failures=tuple((f"{key} (single object)", why) for key, why in failed)
                )
        self.superseded = []

    async def _drop_dead_rows(self) -> AsyncIterator[SweepBatch]:
        settings, single = self.settings, self.single
        for start in range(0, len(self.dead_rows), settings.batch_size):
            rows = self.dead_rows[start : start + settings.batch_size]
            if settings.dry_run:
                gone = rows
                result = SweepBatch(deleted=tuple(row.key for row in rows))
            else:
                result, gone = await _drop_rows(
                    self.store, rows, settings.hold_ms, settings.safety_margin_ms
                )
            if single:
                result = SweepBatch(
                    deleted=tuple(key for key in result.deleted if key not in single),
                    kept=tuple(item for item in result.kept if item[0] not in single),
                    failures=tuple(item for item in result.failures if item[0] not in single),
                )
            yield result
            for row in gone:
                tally = self.tallies[row.pack]
                tally.rows -= 1
                tally.live_bytes -= row.length
        self.dead_rows = []

    async def _sweep_packs(self) -> AsyncIterator[SweepBatch]:
        """Keep, repack or delete each listed pack by its tally."""
        settings = self.settings
        repack = (
            None
            if settings.dry_run
            else _Repacker(self.store, self.bucket, settings.hold_ms, settings.safety_margin_ms)
        )
        kept: list[tuple[str, str]] = []
        # Dead packs go after the repacks: a repack may rewrite a pack of the same
        # bytes as one a killed sweep left behind, and then points rows at it.
        dead_packs: list[tuple[str, BlobInfo]] = []
        for key, info in self.packs.items():
            tally = self.tallies.get(key, _PackTally())
            if self._young(info):
                kept.append((key, TOO_YOUNG))
            elif tally.rows <= 0:
                dead_packs.append((key, info))
            elif tally.live_bytes < settings.repack_below * _frame_bytes(info.size, tally.seen):
                if repack is None:
                    kept.append((key, REPACKED))
                else:
                    async for result in repack.add(key, info):
                        yield result
            else:
                kept.append((key, REFERENCED))
            if len(kept) >= settings.batch_size:
                yield SweepBatch(kept=tuple(kept))
                kept = []
        if kept:
            yield SweepBatch(kept=tuple(kept))
        if repack is not None:
            async for result in repack.finish():
                yield result
        for key, info in dead_packs:
            if settings.dry_run:
                yield SweepBatch(deleted=(key,))
            else:
                yield await _delete_pack(
                    self.store, self.bucket, key, info, settings.hold_ms, settings.safety_margin_ms
                )


async def _index_pages(index: PackIndex) -> AsyncIterator[list[PackedBlob]]:
    after: str | None = None
    while True:
        page: Sequence[PackedBlob] = await index.list_packed_blobs(after=after, limit=INDEX_PAGE)
        if not page:
            return
        yield list(page)
        if len(page) < INDEX_PAGE:
            return
        after = page[-1].key


def _frame_bytes(size: int, entries: int) -> int:
    """A pack's frame bytes: its size less header, footer and trailer (the
    trailer counted from the rows seen, so at most the true frame bytes)."""
    return max(1, size - _PACK_OVERHEAD - _PACK_ENTRY * entries)


def _referenced_names(key: str, referenced: dict[str, str]) -> list[tuple[str, str]]:
    """(key, kept reason) for each name of a pack row's digest that a
    checkpoint uses: the file key, its artifact twin, or both."""
    names = []
    for name in (key, artifact_twin(key)):
        why = referenced.get(name)
        if why is not None:
            names.append((name, why))
    return names


async def prune(
    store: CheckpointStore, thread_id: str, keep: int, *, dry_run: bool = False
) -> list[str]:
    """Keep the thread's head and its ``keep - 1`` nearest ancestors, delete the
    rest; returns the deleted ids in list order (docs/contract.md#checkpoint-store ``delete_checkpoints``).

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
        # delete_checkpoints would do now (a store that plans from its rows'
        # ids alone reads no document, so a damaged one is planned too).
        planned_prune = getattr(store, "planned_prune", None)
        if planned_prune is not None:
            planned: list[str] = await planned_prune(thread_id, keep)
            return planned
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
    "REPACKED",
    "SWEPT_PREFIXES",
    "TOO_YOUNG",
    "SweepBatch",
    "SweepOptions",
    "SweepReport",
    "iter_sweep_blobs",
    "prune",
    "repack_below_percent",
    "sweep_blobs",
]
