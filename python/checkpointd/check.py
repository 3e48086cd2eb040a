"""``checkpointd check``: is the repository whole? (restic's ``check``, docs/design.md).

``iter_check`` works on any store that implements ``BlobAudit`` and any blob
store:

1. recompute every key's count from the stored manifests and compare it with the
   stored count (``audit_blob_references``, one snapshot): each key where they
   differ is a ``count-mismatch`` finding (sweep already keeps such keys);
2. confirm that every blob a manifest uses is in the bucket, in batches
   (``missing``); with ``read_data`` read each one and verify its size and
   BLAKE3 against its key and the manifests (``corrupt``);
3. record what it found in the store: keys whose blob is gone are marked missing
   (a capture then does not trust its parent for them and uploads the file
   again when the workspace still has those bytes); marks of keys found
   present again, or used by no manifest any more, are cleared (``found``);
4. with ``repair``, set every stored count to the manifests'
   (``repair_blob_references``, one transaction): a ``repaired`` finding per key.

Packs (``blobs/packs.py``): a referenced key with a pack index row is checked
against its pack instead of a single object. Every pack some row names must be
in the bucket (else each of its keys is ``missing``), its trailer must be
readable and list each row's blob at the row's offset, length, size and codec
(else ``corrupt``, naming the blob and the pack); with ``read_data`` each
packed blob is read with ranged GETs, decoded and hashed (``corrupt`` naming
blob and pack when it does not decode to its key). Keys without a row are
single objects, checked as before. The rows of a pack that is gone (not
listed, and a HEAD confirms it) are removed in the transaction that marks their
keys missing (``PackMaintenance.forget_lost_packed_blobs``): a row that stayed
would keep telling captures the blob is present, and a capture would then
commit a checkpoint naming bytes that no longer exist. Without the row the key
is a lost single object: marked, so the next capture that still has the bytes
uploads them again (into a new pack, with a new row). A damaged pack keeps its
rows (``corrupt``): its other blobs may still read, and check never deletes.

Stored checkpoints: every stored document carries a checksum
(``store.base.DocumentAudit``); a checkpoint whose row fails it or does not
decode, or that is stored as a delta against such a row, is a ``damaged``
finding naming it (``key`` is the checkpoint id), counted with the corrupt
blobs. Check reports every one and goes on: the audit counts the keys of the
readable checkpoints only (so a damaged one's keys show as stored counts above
the manifests', which a sweep keeps), and ``repair`` leaves the counts alone
while a damaged checkpoint is stored (prune or delete-head removes it first).

Repair of a damaged pack (``blobs/pack_repair.py``): with ``repair``, each pack
that holds a ``corrupt`` blob (a frame that does not decode to its key, found
with ``read_data``; or a trailer that does not list what the index says) has
its readable frames copied into a new pack and their rows switched to it, and
the rows of its damaged frames dropped with their keys marked missing, so the
next capture that holds those bytes uploads them again. ``repaired`` findings
say which keys were marked and where the healthy blobs went; a later sweep
deletes the old pack.

Findings are yielded as they are known and the summary comes last, so a caller
(the daemon's Check stream) never holds them all. Check never deletes a blob: a
corrupt single object is reported, and must be removed by hand before a capture
can store it again (uploads never overwrite an existing key).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field

import blake3

from . import _native
from .blobs.base import BlobCorruptError, BlobInfo, BlobNotFoundError, BlobStore, missing
from .blobs.pack_listing import PackEntry, PackTrailerError, read_pack_entries
from .blobs.pack_repair import PackRepair, frame_reader, repair_packs
from .blobs.packs import PACK_KEY_PREFIX, PackedBlobStore
from .errors import SandboxCheckpointInvalidArgumentError
from .manifest import manifest_of, split_digests
from .model import ARTIFACT_KEY_PREFIX, FILE_KEY_PREFIX, Checkpoint
from .store._packindex import row_key
from .store.base import (
    BlobAudit,
    BlobCount,
    CheckpointStore,
    DamagedCheckpoint,
    DocumentAudit,
    PackedBlob,
    PackIndex,
    PackMaintenance,
)

# Finding kinds.
COUNT_MISMATCH = "count-mismatch"  # stored count != manifests using the key
MISSING = "missing"  # a manifest uses the key; the bucket does not hold it
CORRUPT = "corrupt"  # read_data: the blob's size or BLAKE3 is not the key's
FOUND = "found"  # marked missing by an earlier check, present (or unused) now
REPAIRED = "repaired"  # repair set the stored count, or mended a damaged pack
# A stored checkpoint that cannot be read (``key``: its id): its document fails
# its checksum or does not decode, or it is stored against one that does.
DAMAGED = "damaged"

# Keys per existence batch (also the progress step), blobs read at once.
EXISTS_BATCH = 1024
# Rows of lost packs forgotten per store transaction.
FORGET_BATCH = 10_000
READ_CONCURRENCY = 8
READ_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class CheckFinding:
    kind: str
    key: str
    stored: int = 0  # count-mismatch / repaired: the stored count found
    manifests: int = 0  # ... and the number of manifests using the key
    message: str = ""


@dataclass(frozen=True, slots=True)
class CheckProgress:
    """Referenced blobs checked so far, of ``blobs_total``."""

    blobs_checked: int
    blobs_total: int
    bytes_read: int


@dataclass(frozen=True, slots=True)
class CheckSummary:
    keys: int  # keys a count or a manifest names
    blobs_checked: int  # referenced blobs looked up (read with read_data)
    bytes_read: int
    count_mismatches: int
    missing: int
    corrupt: int
    found: int
    repaired: int
    read_data: bool
    repair: bool
    duration_ms: int
    # Stored checkpoints that cannot be read (also counted in ``corrupt``: the
    # wire's summary has no field of its own for them).
    damaged_checkpoints: int = 0
    # ``repaired`` findings of the pack repair (keys marked missing, packs whose
    # healthy blobs were copied); ``repaired`` counts the counts set.
    packs_repaired: int = 0

    @property
    def ok(self) -> bool:
        """True when nothing is wrong now (repaired counts are right)."""
        unrepaired = 0 if self.repair and not self.damaged_checkpoints else self.count_mismatches
        return unrepaired == 0 and self.missing == 0 and self.corrupt == 0


@dataclass
class CheckReport:
    findings: list[CheckFinding] = field(default_factory=list)
    summary: CheckSummary | None = None


CheckEvent = CheckFinding | CheckProgress | CheckSummary


async def check_store(
    store: CheckpointStore, blobs: BlobStore, *, read_data: bool = False, repair: bool = False
) -> CheckReport:
    """``iter_check`` gathered into one report (every finding in memory)."""
    report = CheckReport()
    async for event in iter_check(store, blobs, read_data=read_data, repair=repair):
        if isinstance(event, CheckFinding):
            report.findings.append(event)
        elif isinstance(event, CheckSummary):
            report.summary = event
    return report


@dataclass
class _Tally:
    """What a check found so far (the summary's counts and what later steps need)."""

    checked: int = 0
    bytes_read: int = 0
    corrupt: int = 0
    repaired: int = 0  # counts set by the repair
    mended: int = 0  # keys marked missing and packs copied by the pack repair
    gone: list[str] = field(default_factory=list)  # referenced keys not in the bucket
    lost: list[PackedBlob] = field(default_factory=list)  # rows of packs that are gone
    damaged_packs: list[str] = field(default_factory=list)  # packs holding a corrupt blob


async def iter_check(
    store: CheckpointStore,
    blobs: BlobStore,
    *,
    read_data: bool = False,
    repair: bool = False,
) -> AsyncIterator[CheckEvent]:
    """Check the store's documents and counts and the bucket's blobs (module
    docstring); yields findings and progress as they come, then one CheckSummary.

    Raises SandboxCheckpointInvalidArgumentError when the store does not
    implement BlobAudit; store and bucket failures raise as they are.
    """
    if not isinstance(store, BlobAudit):
        raise SandboxCheckpointInvalidArgumentError(
            f"{type(store).__name__} does not implement audit_blob_references; it cannot be checked"
        )
    began = time.monotonic()
    damaged: Sequence[DamagedCheckpoint] = (
        await store.damaged_checkpoints() if isinstance(store, DocumentAudit) else []
    )
    for checkpoint in damaged:
        yield _damaged_finding(checkpoint, repair)
    audit: Sequence[BlobCount] = await store.audit_blob_references(with_sizes=read_data)
    mismatches = 0
    for count in audit:
        if not count.agrees:
            mismatches += 1
            yield _count_finding(COUNT_MISMATCH, count)

    referenced = [count for count in audit if count.manifests > 0]
    tally = _Tally(corrupt=len(damaged))
    async for event in _check_blobs(store, blobs, referenced, read_data, tally):
        yield event
    found = 0
    async for finding in _record_marks(store, referenced, tally):
        found += 1
        yield finding

    if repair and tally.damaged_packs:
        async for finding in _repair_packs(store, blobs, tally):
            yield finding
    if repair and not damaged:
        # (While a checkpoint is damaged its keys cannot be counted: left alone.)
        fixed: Sequence[BlobCount] = await store.repair_blob_references()
        for count in fixed:
            tally.repaired += 1
            yield _count_finding(REPAIRED, count)

    yield CheckSummary(
        keys=len(audit),
        blobs_checked=tally.checked,
        bytes_read=tally.bytes_read,
        count_mismatches=mismatches,
        missing=len(tally.gone),
        corrupt=tally.corrupt,
        found=found,
        repaired=tally.repaired,
        read_data=read_data,
        repair=repair,
        duration_ms=int((time.monotonic() - began) * 1000),
        damaged_checkpoints=len(damaged),
        packs_repaired=tally.mended,
    )


async def _check_blobs(
    store: CheckpointStore,
    blobs: BlobStore,
    referenced: list[BlobCount],
    read_data: bool,
    tally: _Tally,
) -> AsyncIterator[CheckEvent]:
    """Every referenced blob: single objects in batches, then packed ones pack
    by pack (``_check_pack``)."""
    total = len(referenced)
    index = store if isinstance(store, PackIndex) else None
    bucket = blobs.inner if isinstance(blobs, PackedBlobStore) else blobs
    # pack -> the index rows of referenced keys in it (checked after the singles)
    by_pack: dict[str, list[PackedBlob]] = {}
    yield CheckProgress(0, total, 0)
    for start in range(0, total, EXISTS_BATCH):
        batch = referenced[start : start + EXISTS_BATCH]
        if index is not None:
            # An artifact's packed copy is its digest's row (row_key), which a
            # file of those bytes shares: each row is checked once.
            forms = {count.key: row_key(count.key) for count in batch}
            located = await index.locate_blobs(list(dict.fromkeys(forms.values())))
            packed = {key: row for key, form in forms.items() if (row := located.get(form))}
            for row in {row.key: row for row in packed.values()}.values():
                by_pack.setdefault(row.pack, []).append(row)
            batch = [count for count in batch if count.key not in packed]
            tally.checked += len(packed)
        if read_data:
            outcomes = await _read_all(bucket, batch)
            for count, (problem, size) in zip(batch, outcomes, strict=True):
                tally.bytes_read += size
                if problem is None:
                    continue
                if problem == MISSING:
                    tally.gone.append(count.key)
                    yield CheckFinding(MISSING, count.key, message="not in the bucket")
                else:
                    tally.corrupt += 1
                    yield CheckFinding(CORRUPT, count.key, message=problem)
        else:
            for key in await missing(bucket, [count.key for count in batch]):
                tally.gone.append(key)
                yield CheckFinding(MISSING, key, message="not in the bucket")
        tally.checked += len(batch)
        yield CheckProgress(tally.checked, total, tally.bytes_read)
    if not by_pack:
        return
    # Rows of referenced keys whose pack is gone from the bucket.
    sizes: dict[str, BlobInfo] = {}
    async for page in bucket.list_pages(PACK_KEY_PREFIX):
        sizes.update((info.key, info) for info in page)
    for pack, rows in by_pack.items():
        info = sizes.get(pack)
        if info is None:
            info = await bucket.head(pack)  # not listed: gone, or written since
        async for finding, size in _check_pack(bucket, pack, info, rows, read_data, tally.lost):
            tally.bytes_read += size
            if finding is None:
                continue
            if finding.kind == MISSING:
                tally.gone.append(finding.key)
            else:
                tally.corrupt += 1
                if pack not in tally.damaged_packs:
                    tally.damaged_packs.append(pack)
            yield finding
        yield CheckProgress(tally.checked, total, tally.bytes_read)


async def _record_marks(
    store: BlobAudit, referenced: list[BlobCount], tally: _Tally
) -> AsyncIterator[CheckFinding]:
    """Record in the store what the check found: keys gone are marked missing
    (the rows of lost packs go with their marks), marks of keys present again
    or unused are cleared (a ``found`` finding each)."""
    used = {count.key for count in referenced}
    marked: Iterable[str] = await store.list_missing_blobs()
    missing_now = set(tally.gone)
    cleared = [key for key in marked if key not in missing_now]
    if tally.lost and isinstance(store, PackMaintenance):
        # The rows go with their marks, in one transaction each batch: a row
        # of a lost pack would keep telling captures the blob is there.
        forgotten = {row.key for row in tally.lost}
        for start in range(0, len(tally.lost), FORGET_BATCH):
            await store.forget_lost_packed_blobs(tally.lost[start : start + FORGET_BATCH])
    else:
        forgotten = set()
    unmarked = [key for key in tally.gone if key not in forgotten]
    if unmarked:
        await store.mark_blobs_missing(unmarked)
    if cleared:
        await store.clear_missing_blobs(cleared)
        for key in cleared:
            why = "present in the bucket again" if key in used else "no manifest uses it"
            yield CheckFinding(FOUND, key, message=f"was marked missing; {why}")


async def _repair_packs(
    store: CheckpointStore, blobs: BlobStore, tally: _Tally
) -> AsyncIterator[CheckFinding]:
    """``repair`` of the packs holding corrupt blobs (``blobs/pack_repair.py``):
    a ``repaired`` finding per key marked missing and per pack mended."""
    if not isinstance(store, PackIndex) or not isinstance(store, PackMaintenance):
        return
    bucket = blobs.inner if isinstance(blobs, PackedBlobStore) else blobs
    async for outcome in repair_packs(store, bucket, tally.damaged_packs):
        for key in outcome.dropped:
            tally.mended += 1
            yield CheckFinding(
                REPAIRED,
                key,
                message=f"its frame in pack {outcome.pack} is damaged: marked missing and its "
                "index row dropped; the next capture that holds these bytes uploads them again",
            )
        tally.mended += 1
        yield CheckFinding(REPAIRED, outcome.pack, message=_pack_repair_message(outcome))


def _pack_repair_message(outcome: PackRepair) -> str:
    if outcome.failure is not None:
        return (
            f"its healthy blobs could not be copied ({outcome.failure}); they stay in it, "
            "readable: run check --repair again"
        )
    if outcome.moved_to is None:
        return "no blob of it reads any more; a sweep deletes it"
    return (
        f"{len(outcome.healthy)} healthy blobs copied to pack {outcome.moved_to} and their "
        "rows switched there; a sweep deletes this pack"
    )


def _damaged_finding(checkpoint: DamagedCheckpoint, repair: bool) -> CheckFinding:
    where = f"checkpoint of thread {checkpoint.thread_id!r}"
    if checkpoint.damaged_checkpoint_id == checkpoint.checkpoint_id:
        what = f"{where} is damaged: {checkpoint.reason}"
    else:
        what = (
            f"{where} is stored against checkpoint {checkpoint.damaged_checkpoint_id!r}, "
            f"which is damaged: {checkpoint.reason}"
        )
    message = (
        what + "; its restore, entries and diff fail with DATA_LOSS; prune or delete-head "
        "removes it, and the thread's next capture is stored whole"
    )
    if repair:
        message += "; counts are not repaired while it is stored"
    return CheckFinding(DAMAGED, checkpoint.checkpoint_id, message=message)


def _count_finding(kind: str, count: BlobCount) -> CheckFinding:
    verb = "was" if kind == REPAIRED else "is"
    return CheckFinding(
        kind,
        count.key,
        stored=count.stored,
        manifests=count.manifests,
        message=f"stored count {verb} {count.stored}, {count.manifests} manifests use the key",
    )


async def _read_all(blobs: BlobStore, batch: Sequence[BlobCount]) -> list[tuple[str | None, int]]:
    """Per key: (None when intact, MISSING, or what is wrong; bytes read)."""
    slots = asyncio.Semaphore(READ_CONCURRENCY)

    async def one(count: BlobCount) -> tuple[str | None, int]:
        async with slots:
            return await _verify(blobs, count)

    return list(await asyncio.gather(*(one(count) for count in batch)))


async def _verify(blobs: BlobStore, count: BlobCount) -> tuple[str | None, int]:
    hasher = blake3.blake3()
    size = 0
    try:
        async for chunk in blobs.get_stream(count.key, READ_CHUNK_BYTES):
            hasher.update(chunk)
            size += len(chunk)
    except BlobNotFoundError:
        return MISSING, size
    expected = _hash_of(count.key)
    if count.size is not None and size != count.size:
        return f"{size} bytes, the manifests say {count.size}", size
    if hasher.hexdigest() != expected:
        return f"BLAKE3 of the bytes is {hasher.hexdigest()}, not the key's", size
    return None, size


async def _check_pack(
    bucket: BlobStore,
    pack: str,
    info: BlobInfo | None,
    rows: list[PackedBlob],
    read_data: bool,
    lost: list[PackedBlob],
) -> AsyncIterator[tuple[CheckFinding | None, int]]:
    """Findings for the referenced rows of one pack, with the bytes read; the
    rows of a pack that is gone are added to ``lost``."""
    if info is None:
        lost.extend(rows)
        for row in rows:
            yield CheckFinding(MISSING, row.key, message=f"its pack {pack} is not in the bucket"), 0
        return
    try:
        entries = await read_pack_entries(bucket, pack, info.size)
    except BlobNotFoundError:
        lost.extend(rows)
        for row in rows:
            yield CheckFinding(MISSING, row.key, message=f"its pack {pack} is not in the bucket"), 0
        return
    except PackTrailerError as error:
        for row in rows:
            yield _corrupt(row, f"the pack is damaged: {error}"), 0
        return
    listed: dict[str, PackEntry] = {entry.key: entry for entry in entries}
    sound: list[PackedBlob] = []
    for row in rows:
        entry = listed.get(row.key)
        if entry is None:
            yield _corrupt(row, "the pack's trailer does not list it"), 0
        elif (entry.offset, entry.length, entry.raw_size, entry.codec) != (
            row.offset,
            row.length,
            row.raw_size,
            row.codec,
        ):
            yield (
                _corrupt(
                    row,
                    f"the index says offset {row.offset}, {row.length} stored bytes, "
                    f"{row.raw_size} raw, codec {row.codec}; the trailer says {entry.offset}, "
                    f"{entry.length}, {entry.raw_size}, {entry.codec}",
                ),
                0,
            )
        elif row.offset + row.length > info.size:
            yield _corrupt(row, f"its frame ends past the pack's {info.size} bytes"), 0
        else:
            sound.append(row)
    if not read_data or not sound:
        return
    reader = frame_reader(bucket)
    sound.sort(key=lambda row: row.offset)
    for start in range(0, len(sound), EXISTS_BATCH):
        chunk = sound[start : start + EXISTS_BATCH]
        read = sum(row.length for row in chunk)
        try:
            await reader.read_packed(chunk)
            yield None, read
            continue
        except (BlobCorruptError, BlobNotFoundError):
            pass
        # Something in the chunk is bad: find every bad blob, one at a time.
        for row in chunk:
            try:
                await reader.read_packed([row])
                yield None, row.length
            except BlobCorruptError as error:
                yield _corrupt(row, error.reason), row.length
            except BlobNotFoundError:
                yield CheckFinding(MISSING, row.key, message=f"its pack {pack} is gone"), 0


def _corrupt(row: PackedBlob, reason: str) -> CheckFinding:
    return CheckFinding(
        CORRUPT, row.key, message=f"blob {row.key} in pack {row.pack} is invalid: {reason}"
    )


def _hash_of(key: str) -> str:
    for prefix in (FILE_KEY_PREFIX, ARTIFACT_KEY_PREFIX):
        if key.startswith(prefix):
            return key[len(prefix) :]
    return ""


__all__ = [
    "CORRUPT",
    "COUNT_MISMATCH",
    "DAMAGED",
    "FOUND",
    "MISSING",
    "REPAIRED",
    "CheckEvent",
    "CheckFinding",
    "CheckProgress",
    "CheckReport",
    "CheckSummary",
    "check_store",
    "iter_check",
]


# --------------------------------------------------------------------------- capture's side


async def missing_marks(store: CheckpointStore) -> set[str]:
    """The keys a check marked missing (usually none). A capture normally trusts
    that the blobs its parent uses are in the bucket; for these it asks the
    bucket instead, and uploads the file again when the workspace still holds
    the bytes."""
    if not isinstance(store, BlobAudit):
        return set()
    marked: Iterable[str] = await store.list_missing_blobs()
    return set(marked)


def without_marked(digests: bytes, marked: set[str]) -> bytes:
    """Sorted file digests (``Manifest.digests``) less those of marked keys."""
    gone = sorted(
        bytes.fromhex(key[len(FILE_KEY_PREFIX) :])
        for key in marked
        if key.startswith(FILE_KEY_PREFIX)
    )
    if not gone or not digests:
        return digests
    return _native.digest_difference(digests, b"".join(gone))


async def forget_found_keys(
    store: CheckpointStore, marked: set[str], checkpoint: Checkpoint
) -> None:
    """After the append: clear the marks of the keys the new checkpoint uses (the
    capture found each in the bucket or uploaded it again). A failure only
    leaves a mark behind: the next capture looks the key up again."""
    if not marked or not isinstance(store, BlobAudit):
        return
    used = set(split_digests(manifest_of(checkpoint.files).digests()))
    found = [
        key
        for key in marked
        if key.startswith(FILE_KEY_PREFIX) and bytes.fromhex(key[len(FILE_KEY_PREFIX) :]) in used
    ]
    found.extend(a.blob_key for a in checkpoint.artifacts if a.blob_key in marked)
    if not found:
        return
    try:
        await store.clear_missing_blobs(sorted(set(found)))
    except Exception:  # noqa: BLE001 - the checkpoint is committed; the mark is only a hint
        pass
