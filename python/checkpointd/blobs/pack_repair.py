"""``checkpointd check --repair`` of a pack with damaged frames: keep what still reads.

A pack holds hundreds of small blobs, often the only copy of each. When some
of its frames do not decode to their keys (bit rot, a torn write), deleting
the pack would lose every blob in it; leaving it alone leaves its damaged
rows in the index, and a capture that holds those bytes again would trust
the row and upload nothing. So, per damaged pack:

1. every index row that points at the pack is read (``PackIndex``, all of
   them: referenced or not), frame by frame where a batch fails, each frame
   decoded and hashed against its key;
2. the frames that read are copied into a new pack, uploaded (durable), and
   their rows switched to it (``PackMaintenance.switch_packed_blobs``: only
   rows still in the old pack move, as a sweep's repack does);
3. the rows of the damaged frames are dropped and their keys marked missing
   in one transaction (``PackMaintenance.forget_lost_packed_blobs``): the
   next capture that still holds those bytes finds the key absent and
   uploads it again, and a restore of a checkpoint that uses it then reads
   the new copy.

The damaged pack is left with no row pointing at it: a later sweep deletes it
once it is old enough, as any pack without rows. Nothing here deletes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from .. import _native
from ..model import FILE_KEY_PREFIX
from ..store.base import IndexRow, PackedBlob, PackIndex, PackMaintenance
from .base import BlobCorruptError, BlobNotFoundError, BlobStore, put_many
from .packs import PackedBlobStore, pack_key

# Index rows per page while the rows of the damaged packs are looked for, and
# blobs read at once (a batch with a damaged frame is read again one by one).
INDEX_PAGE = 10_000
READ_BATCH = 256


@dataclass(frozen=True)
class PackRepair:
    """What the repair of one damaged pack did."""

    pack: str
    healthy: list[PackedBlob] = field(default_factory=list)  # rows moved to ``moved_to``
    moved_to: str | None = None  # the new pack (None: nothing read, or the copy failed)
    dropped: list[str] = field(default_factory=list)  # keys marked missing, rows dropped
    failure: str | None = None  # why healthy blobs stayed in the damaged pack


async def repair_packs(
    store: PackIndex, bucket: BlobStore, packs: Sequence[str]
) -> AsyncIterator[PackRepair]:
    """Repair each of ``packs`` (see the module docstring), one at a time.
    ``store`` must implement ``PackMaintenance`` too; ``bucket`` is the store
    holding the packs (not a ``PackedBlobStore``). Raises what the store
    raises; a failed copy is reported in ``PackRepair.failure``."""
    assert isinstance(store, PackMaintenance)
    rows_by_pack = await _rows_in(store, set(packs))
    reader = frame_reader(bucket)
    for pack in packs:
        healthy, damaged = await _read_frames(reader, rows_by_pack.get(pack, []))
        moved_to: str | None = None
        failure: str | None = None
        moved: list[PackedBlob] = []
        if healthy:
            try:
                moved_to, moved = await _copy(store, bucket, pack, healthy)
            except Exception as error:  # noqa: BLE001 - reported; the rows stay valid where they are
                failure = f"{type(error).__name__}: {error}"
        dropped = await store.forget_lost_packed_blobs(damaged) if damaged else []
        yield PackRepair(pack, moved, moved_to, dropped, failure)


async def _rows_in(index: PackIndex, packs: set[str]) -> dict[str, list[PackedBlob]]:
    """Every index row that points at one of ``packs``, by pack (one walk of
    the index: repair is rare, and the trailer of a damaged pack may itself
    be unreadable)."""
    found: dict[str, list[PackedBlob]] = {}
    after: str | None = None
    while True:
        page = await index.list_packed_blobs(after=after, limit=INDEX_PAGE)
        for row in page:
            if row.pack in packs:
                found.setdefault(row.pack, []).append(row)
        if len(page) < INDEX_PAGE:
            return found
        after = page[-1].key


async def _read_frames(
    reader: PackedBlobStore, rows: list[PackedBlob]
) -> tuple[list[tuple[PackedBlob, bytes]], list[PackedBlob]]:
    """(rows whose frame reads, with its bytes; rows whose frame does not),
    each frame checked against its key."""
    healthy: list[tuple[PackedBlob, bytes]] = []
    damaged: list[PackedBlob] = []
    ordered = sorted(rows, key=lambda row: row.offset)
    for start in range(0, len(ordered), READ_BATCH):
        batch = ordered[start : start + READ_BATCH]
        try:
            healthy.extend(zip(batch, await reader.read_packed(batch), strict=True))
            continue
        except (BlobCorruptError, BlobNotFoundError):
            pass
        for row in batch:
            try:
                [data] = await reader.read_packed([row])
            except (BlobCorruptError, BlobNotFoundError):
                damaged.append(row)
                continue
            healthy.append((row, data))
    return healthy, damaged


async def _copy(
    store: PackMaintenance,
    bucket: BlobStore,
    pack: str,
    healthy: list[tuple[PackedBlob, bytes]],
) -> tuple[str, list[PackedBlob]]:
    """Write the healthy blobs into a new pack, upload it, switch their rows
    to it; returns the new pack and the rows that moved."""
    writer = _native.PackWriter()
    items = [(row.key[len(FILE_KEY_PREFIX) :], data) for row, data in healthy]
    placed = await asyncio.to_thread(writer.add_many, items)
    digest, body = await asyncio.to_thread(writer.finish)
    new_pack = pack_key(digest)
    await put_many(bucket, [(new_pack, body)])  # durable before the switch
    rows = [
        PackedBlob(row.key, new_pack, offset, length, raw_size, codec)
        for (row, _), (offset, length, raw_size, codec) in zip(healthy, placed, strict=True)
    ]
    switched = set(await store.switch_packed_blobs(pack, rows))
    return new_pack, [row for row in rows if row.key in switched]


def frame_reader(bucket: BlobStore) -> PackedBlobStore:
    """A reader of the frames whose index rows the caller gives
    (``PackedBlobStore.read_packed``): it never looks a key up itself."""
    return PackedBlobStore(bucket, _RowsGiven())


class _RowsGiven:
    """A PackedBlobStore's index for ``read_packed`` alone (rows are given)."""

    async def locate_blobs(self, keys: list[str]) -> dict[str, PackedBlob | None]:
        return {}

    async def locate_rows(self, digests: bytes) -> list[IndexRow]:
        return []

    async def list_packed_blobs(
        self, *, after: str | None = None, limit: int = 1000
    ) -> list[PackedBlob]:
        return []


__all__ = ["PackRepair", "frame_reader", "repair_packs"]
