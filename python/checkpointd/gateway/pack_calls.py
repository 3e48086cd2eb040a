"""The gateway's pack calls behind the servicer: the rows an append may carry,
where packed blobs are (LocateBlobs), and their frames (ReadPackFrames).
``packs.py`` has the rules and why."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any

from ..blobs.base import BlobNotFoundError, BlobStore, get_ranges
from ..blobs.pack_listing import PackTrailerError, read_pack_entries
from ..blobs.packs import LOCATE_BATCH, plan_pack_reads
from ..errors import SandboxCheckpointInvalidArgumentError
from ..store._packindex import PackColumns, PackedRows
from ..store.base import CheckpointStore, PackedBlob, PackIndex
from ..v1 import gateway_pb2 as gpb
from . import packs as pack_rules
from . import wire
from .access import ReadAccess
from .tokens import TokenScope


def located(found: dict[str, PackedBlob | None]) -> gpb.GatewayLocated:
    """A LocateBlobs reply: rows grouped by pack, and the keys known unpacked."""
    by_pack: dict[str, list[PackedBlob]] = {}
    unpacked: list[str] = []
    for key, row in found.items():
        if row is None:
            unpacked.append(key)
        else:
            by_pack.setdefault(row.pack, []).append(row)
    return gpb.GatewayLocated(
        packs=wire.rows_to_proto([row for rows in by_pack.values() for row in rows]),
        unpacked=unpacked,
    )


def _index(store: CheckpointStore) -> PackIndex:
    if not isinstance(store, PackIndex):
        raise SandboxCheckpointInvalidArgumentError(
            f"the gateway's store ({type(store).__name__}) keeps no pack index"
        )
    return store


class PackCalls:
    """Pack rows, lookups and frame reads for one gateway."""

    def __init__(
        self,
        store: CheckpointStore,
        blobs: BlobStore,
        access: ReadAccess,
        *,
        on_bytes_out: Callable[[int], None] = lambda n: None,
    ) -> None:
        self.store = store
        self.blobs = blobs
        self.access = access
        self.packs = pack_rules.VerifiedPacks()  # packs stored through this gateway
        self._on_bytes_out = on_bytes_out

    async def locate(self, scope: TokenScope, keys: Sequence[str]) -> gpb.GatewayLocated:
        """Where the keys the token may locate are (the others are left out)."""
        if not isinstance(self.store, PackIndex):
            return gpb.GatewayLocated()
        wanted = list(dict.fromkeys(keys))
        allowed = [key for key in wanted if self.access.locatable(scope, key)]
        if len(allowed) < len(wanted) and scope.threads:
            await self.access.learn(scope)
            allowed = [key for key in wanted if self.access.locatable(scope, key)]
        found: dict[str, PackedBlob | None] = {}
        for start in range(0, len(allowed), LOCATE_BATCH):
            found.update(await self.store.locate_blobs(allowed[start : start + LOCATE_BATCH]))
        return located(found)

    async def trusted_rows(
        self, messages: Iterable[gpb.GatewayPackRows], writer: Any
    ) -> PackedRows:
        """An append's rows: in packs this writer pinned through this gateway,
        each an entry of its pack's trailer, in packs that stay until the
        append commits (``gateway/packs.py``); INVALID_ENTRY naming the pack
        otherwise (with ``unpinned`` when its pin was not taken here)."""
        if not isinstance(self.store, PackIndex):
            raise SandboxCheckpointInvalidArgumentError(
                f"{type(self.store).__name__} keeps no pack index: append without pack rows"
            )
        me = (writer.thread_id, writer.owner_token, writer.fence)
        groups: list[PackColumns] = []
        for message in messages:
            sent = wire.columns_from_proto(message)
            if not len(sent):
                continue
            unpinned, pinned_at = self.access.pins.first_unpinned([sent.pack], me)
            if unpinned is not None:
                raise pack_rules.refuse_rows(
                    sent.pack,
                    "the pack was not pinned by this writer through this gateway",
                    unpinned=unpinned,
                )
            known = self.packs.get(sent.pack)
            if known is None or known.seen_at < pinned_at:
                known = await self._pack_in_bucket(sent.pack)
            problem = pack_rules.rows_problem(sent, known.columns)
            if problem is not None:
                raise pack_rules.refuse_rows(sent.pack, problem)
            groups.append(sent)
        return PackedRows(groups)

    async def _pack_in_bucket(self, pack: str) -> pack_rules.VerifiedPack:
        """The pack's trailer, read from the bucket now (after the writer's
        pin of it, so the pack stays): every pack in the bucket was checked whole
        when it was stored, so its trailer says where its frames are."""
        seen_at = time.monotonic()
        info = await self.blobs.head(pack)
        if info is None:
            raise pack_rules.refuse_rows(pack, "the pack is not in the bucket")
        try:
            entries = await read_pack_entries(self.blobs, pack, info.size)
        except (PackTrailerError, BlobNotFoundError) as error:
            raise pack_rules.refuse_rows(pack, f"its trailer does not read: {error}") from None
        columns = pack_rules.columns_of_entries(
            pack,
            (PackedBlob(e.key, pack, e.offset, e.length, e.raw_size, e.codec) for e in entries),
        )
        self.packs.remember(columns, seen_at)
        return pack_rules.VerifiedPack(columns, seen_at)

    async def read_frames(
        self, scope: TokenScope, request: gpb.GatewayPackRows
    ) -> AsyncIterator[gpb.GatewayPackFrame]:
        """The frames of the rows asked for: each a key the token may read and
        the key's current row (BlobNotFoundError for one a repack moved)."""
        index = _index(self.store)
        sent = wire.columns_from_proto(request)
        rows = list({row.key: row for row in map(sent.row, range(len(sent)))}.values())
        for row in rows:
            await self.access.may_read_row(scope, row.key)
        current = await index.locate_blobs([row.key for row in rows])
        for row in rows:
            if current.get(row.key) != row:
                # Moved by a repack (or never there): the sidecar looks it up again.
                raise BlobNotFoundError(row.key)
        async for frame in self._frames(sent.pack, rows):
            yield frame

    async def _frames(
        self, pack: str, rows: list[PackedBlob]
    ) -> AsyncIterator[gpb.GatewayPackFrame]:
        """The stored bytes of exactly ``rows``' frames, as the bucket holds
        them; adjacent frames travel together. Not decoded here: every pack
        was checked whole when it was stored (``VerifiedPacks``), and the
        sidecar decodes and checks each frame it receives (size and BLAKE3)
        as it stages it, so a frame damaged in the bucket since is still
        INVALID_BLOB there, naming the blob and the pack; decoding here too
        would spend the shared gateway's CPU on every sidecar's restore."""
        reads = [read for read in plan_pack_reads(rows) if read.end > read.start]
        try:
            datas = await get_ranges(self.blobs, pack, [(read.start, read.end) for read in reads])
        except BlobNotFoundError:
            raise BlobNotFoundError(rows[0].key) from None
        for read, data in zip(reads, datas, strict=True):
            start = end = -1
            pieces: list[bytes] = []
            for row in sorted(read.rows, key=lambda row: row.offset):
                if not row.length:
                    continue  # an empty blob: no bytes (its offset may be a neighbour's)
                if row.offset != end or end - start >= wire.BLOB_CHUNK_BYTES:
                    if pieces:
                        yield self._frame(start, pieces)
                    start, end, pieces = row.offset, row.offset, []
                pieces.append(data[row.offset - read.start : row.offset - read.start + row.length])
                end += row.length
            if pieces:
                yield self._frame(start, pieces)

    def _frame(self, offset: int, pieces: list[bytes]) -> gpb.GatewayPackFrame:
        data = b"".join(pieces)
        self._on_bytes_out(len(data))
        return gpb.GatewayPackFrame(offset=offset, data=data)


__all__ = ["PackCalls", "located"]
