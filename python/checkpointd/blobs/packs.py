"""Packs: small blobs travel and rest in pack objects, compressed, with the
index in the checkpoint store (docs/packs.md).

Why: one object per small file is one PUT (and one HEAD) per file on a cold
capture and one GET per file on a restore; a bucket bills and delays each
request. Packed, a cold capture of 100,000 small files is a few dozen PUTs.

Layout in the bucket:

* ``sandbox-packs/blake3/<hex>``: a pack object, named by the BLAKE3 of its
  bytes (immutable, content-addressed). Its format is in ``rust/src/pack.rs``:
  an 8-byte header, one frame per blob (zstd level 1, or the raw bytes when
  that is not smaller), a trailer listing every blob (digest, stored length,
  raw length, codec) and a 24-byte footer, so a pack describes itself and the
  index can be rebuilt or checked from the bucket alone
  (``_native.read_pack_trailer``).
* ``sandbox-files/blake3/<hex>``: a single object, as before packs, for blobs
  above the threshold (``DEFAULT_PACK_THRESHOLD``, 1 MiB), for every blob
  written before packs existed, and for stores without a pack index.
* Logical keys do not change: manifests still name ``sandbox-files/blake3/<hex>``
  (the BLAKE3 of the uncompressed, zeroed bytes), counts stay per key.

The index lives in the checkpoint store (``store.base.PackIndex``): per key
the pack, offset, stored length, raw size and codec (``PackedBlob``). Rows are
written by ``append(..., packed_blobs=rows)`` in the transaction of the append
that first references the key, after the pack is durable, so a row never
points at a pack that is not there.

This module's ``PackedBlobStore`` is the one upload and fetch path the engines
use over any ``BlobStore`` and a store that keeps the index:

* reads (``get``, ``get_stream``, ``get_many``, ``head``, ``missing``) look the
  key up in the index: a packed key is read with one ranged GET per group of
  nearby blobs (``MERGE_GAP_BYTES`` apart in a bucket, ``LOCAL_MERGE_GAP_BYTES``
  in a local directory, where a read is a system call rather than a billed,
  delayed request), decoded and checked (size and BLAKE3) in
  Rust (a restore instead plans the reads of its whole plan with
  ``plan_pack_reads`` and streams each one, ``stream_pack_read``, into its
  staging frame by frame); a key with no row falls back to its single object (old stores stay
  readable, nothing is rewritten). A frame that does not decode to its key, or
  lies past the end of a truncated pack, is ``BlobCorruptError`` naming the
  blob and the pack;
* ``capture_session()`` gives a capture its own writer (``PackSession``):
  ``put_many`` compresses small blobs into the open pack (in Rust, GIL
  released) and uploads it once it reaches ``PACK_TARGET_BYTES`` (one
  ``put_many`` of the pack on the inner store: on a local directory one file and
  one sync); ``missing`` answers from the index and the store's reference
  counts, never from the bucket; ``flush()`` uploads the last pack, after which
  ``rows`` are the index rows to pass to the append.

Safety with the sweep (docs/contract.md#prune-and-sweep), pinned per pack, not per blob:

* A blob the capture packs itself needs no pin of its key: what must survive
  until the append is its pack, and the session pins the pack's key
  (``sandbox-packs/blake3/<hex>``, through the capture's ``pin``) after the
  pack is built and before it is uploaded. The sweep deletes a pack no row
  points at only after condemning the pack's key and every key in it
  (``_sweep_delete._delete_pack``); a live pin on the pack refuses that, and a pin
  made while a sweep holds the pack condemned (a pack of these very bytes
  being deleted) waits until the sweep lets go, so the delete is over before
  the upload starts. A cold capture of 100,000 small files so writes a handful
  of pins instead of 100,000.
* A key the store already has (a row, or a count for a single object) is
  pinned per key before the capture trusts it, then looked up again: a sweep
  may have dropped its row between the look and the pin (it drops rows only of
  condemned keys, and a pin waits out a condemnation), and a key that is gone
  by then is packed again.
* A key referenced by a checkpoint but not packed is a single object its
  count and the pin protect.

docs/design.md: an artifact is uploaded as a single object
(durable before the capture that names it, which has no lease or append to
record a row in yet); the first capture that names a small one reads it
(checked against its key), packs it with its files and records its row in its
append, and a later sweep deletes the single object. One row serves a digest's
file and artifact keys (the same bytes, ``store._packindex.row_key``). A blob
is packed when it is smaller than the threshold; a store
without a pack index (a user's own store, the remote store of a gateway older
than packs) keeps the one-object-per-key layout. Behind a gateway the rules that
keep tenants apart are the gateway's (``gateway/packs.py``): it checks a pack
whole before storing it, matches an append's rows against the pack's trailer,
and serves reads frame by frame (``_read_stream``).
"""

from __future__ import annotations

import asyncio
import builtins
from array import array
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Sequence,
)
from dataclasses import dataclass
from typing import Any

from .. import _native
from ..manifest import split_digests
from ..model import FILE_KEY_PREFIX
from ..store._packindex import (
    PackColumns,
    PackedRows,
    checked_digest,
    digest_of,
    file_key,
    row_key,
)
from ..store.base import IndexRow, PackedBlob, PackIndex
from .base import (
    BlobCorruptError,
    BlobInfo,
    BlobNotFoundError,
    BlobStore,
    VerifiedFile,
    _gather_bounded,
    get_many,
    get_range_stream,
    get_ranges,
    missing,
    put_learned,
    put_many,
)
from .object_store import local_dir_of

PACK_KEY_PREFIX = "sandbox-packs/blake3/"
# Blobs smaller than this go into packs (the default); larger ones are
# objects of their own. At this size a request costs little next to the bytes.
DEFAULT_PACK_THRESHOLD = 1 << 20
# A pack is closed and uploaded once it holds this much: 8-32 MiB keeps the
# request count low and one pack's upload short enough to retry.
PACK_TARGET_BYTES = 16 << 20
# Full packs a capture uploads at once while it goes on filling the next one:
# the bucket's latency overlaps the scan and the compression, and a session holds
# at most this many packs plus the open one in memory. A local dir writes a pack
# with one system call and no latency to hide: one at a time (16 MiB less held).
PACK_UPLOADS = 2
LOCAL_PACK_UPLOADS = 1
# Two blobs of one pack whose frames are at most this far apart are read with
# one ranged GET (the bytes between them are cheaper than a request), up to
# MAX_RANGE_BYTES per request.
MERGE_GAP_BYTES = 256 << 10
# From a local directory a read is a system call, not a request: only frames
# this close are read together (a 1% restore then reads about 1% of the packs).
LOCAL_MERGE_GAP_BYTES = 16 << 10
MAX_RANGE_BYTES = 16 << 20
# Keys per index lookup (a restore locates its whole plan: 100,000 keys in ten).
LOCATE_BATCH = 10_000
# Trailer bytes per blob in a pack (rust/src/pack.rs).
_ENTRY_BYTES = 42


def pack_key(hex_digest: str) -> str:
    return PACK_KEY_PREFIX + hex_digest


def packed_blobs(blobs: BlobStore, store: object, **options: int) -> BlobStore:
    """``blobs`` seen through the pack index of ``store``: a ``PackedBlobStore``
    when ``store`` keeps one (every store we ship), ``blobs`` itself otherwise
    (and when it already is one)."""
    if isinstance(blobs, PackedBlobStore) or not isinstance(store, PackIndex):
        return blobs
    return PackedBlobStore(blobs, store, **options)


async def _locate(index: PackIndex, keys: Sequence[str]) -> dict[str, PackedBlob | None]:
    found: dict[str, PackedBlob | None] = {}
    unique = list(dict.fromkeys(keys))
    for start in range(0, len(unique), LOCATE_BATCH):
        found.update(await index.locate_blobs(unique[start : start + LOCATE_BATCH]))
    return found


@dataclass(slots=True)
class PackRead:
    """One ranged GET of a pack, ``[start, end)``, and the blobs it holds."""

    pack: str
    start: int
    end: int
    rows: list[PackedBlob]


def plan_pack_reads(rows: Sequence[PackedBlob], merge_gap: int = MERGE_GAP_BYTES) -> list[PackRead]:
    """Group rows by pack and merge nearby frames into few ranged reads (at
    most ``merge_gap`` apart, at most ``MAX_RANGE_BYTES`` each), in pack
    order. Given every row a restore needs, that is about one GET per pack."""
    numbers: dict[str, int] = {}
    frames = [(numbers.setdefault(row.pack, len(numbers)), row.offset, row.length) for row in rows]
    packs = list(numbers)
    return [
        PackRead(packs[pack], start, end, [rows[i] for i in held])
        for pack, start, end, held in _native.plan_pack_reads(frames, merge_gap, MAX_RANGE_BYTES)
    ]


class PackedBlobStore(BlobStore):
    """A ``BlobStore`` whose small blobs live in packs (see the module docstring).

    ``inner`` holds the objects (packs and single blobs), ``index`` is the
    checkpoint store keeping the pack index. ``threshold``: blobs smaller than
    this are packed by a capture session; ``target``: a pack's size before it
    is uploaded.
    """

    def __init__(
        self,
        inner: BlobStore,
        index: PackIndex,
        *,
        threshold: int = DEFAULT_PACK_THRESHOLD,
        target: int = PACK_TARGET_BYTES,
    ) -> None:
        if threshold < 1 or threshold > target or target >= 1 << 30:
            raise ValueError(
                f"pack threshold {threshold} must be between 1 and the pack size {target} (< 1 GiB)"
            )
        self.inner = inner
        self.index = index
        self.threshold = threshold
        self.target = target
        self.url = inner.url
        # Bytes between two frames of a pack below which one read of both
        # costs less than two reads (``plan_reads``).
        self.merge_gap = MERGE_GAP_BYTES if local_dir_of(inner) is None else LOCAL_MERGE_GAP_BYTES
        # Whether a restore may look its blobs up a slice of its plan at a time
        # and read each slice at once: a local dir reads a range with one
        # pread, so a pack read in a few pieces costs nothing; a bucket pays per
        # GET, so the whole plan is looked up first and each pack read about once.
        self.locate_in_slices = local_dir_of(inner) is not None
        self.uploads = PACK_UPLOADS if local_dir_of(inner) is None else LOCAL_PACK_UPLOADS
        # A store that serves packs only frame by frame (``_frame_reader``):
        # a read must name the frames it wants (``PackRead.rows``).
        self.reads_by_frame = _frame_reader(inner) is not None

    def __repr__(self) -> str:
        return f"PackedBlobStore({self.inner!r})"

    def capture_session(self, pin: PinPacks | None = None) -> PackSession:
        """A writer for one capture (see ``PackSession``; ``pin``: its pack pins)."""
        return PackSession(self, pin)

    # ------------------------------------------------------------ single objects

    async def put(
        self, key: str, data: bytes | AsyncIterable[bytes], *, if_absent: bool = True
    ) -> bool:
        """A single object (large blobs, artifacts): as the inner store."""
        return await self.inner.put(key, data, if_absent=if_absent)

    def list_pages(self, prefix: str) -> AsyncIterator[builtins.list[BlobInfo]]:
        return self.inner.list_pages(prefix)

    async def list(self, prefix: str) -> builtins.list[BlobInfo]:
        return await self.inner.list(prefix)

    async def delete(self, key: str) -> None:
        await self.inner.delete(key)

    # ------------------------------------------------------------------ reads

    async def locate(self, keys: Sequence[str]) -> dict[str, PackedBlob]:
        """The pack rows of those of ``keys`` that are packed (an artifact key
        through the row of its digest, ``store._packindex.row_key``)."""
        forms = {key: row_key(key) for key in keys}
        rows = await _locate(self.index, list(forms.values()))
        return {key: row for key, form in forms.items() if (row := rows.get(form)) is not None}

    async def locate_rows(self, digests: bytes) -> builtins.list[IndexRow]:
        """The index rows of those of ``digests`` (concatenated file digests)
        that are packed (``PackIndex.locate_rows``), LOCATE_BATCH at a time."""
        step = LOCATE_BATCH * 32
        rows: builtins.list[IndexRow] = []
        for start in range(0, len(digests), step):
            rows.extend(await self.index.locate_rows(digests[start : start + step]))
        return rows

    def plan_reads(self, rows: Sequence[PackedBlob]) -> builtins.list[PackRead]:
        """``plan_pack_reads`` with this store's merge gap."""
        return plan_pack_reads(rows, self.merge_gap)

    async def read_packed(self, rows: Sequence[PackedBlob]) -> builtins.list[bytes]:
        """The raw bytes of each packed blob, checked (size and BLAKE3), in
        order. Raises BlobCorruptError (naming blob and pack) for a frame that
        does not decode to its key or lies past the end of its pack,
        BlobNotFoundError when the pack itself is gone, BlobStoreError."""
        out: dict[str, bytes] = {}
        ranges = self.plan_reads(rows)
        by_pack: dict[str, list[PackRead]] = {}
        for one in ranges:
            if one.end > one.start:
                by_pack.setdefault(one.pack, []).append(one)
            else:
                for row in one.rows:  # empty blobs: nothing to read
                    out[row.key] = b""

        async def fetch(pack: str) -> None:
            wanted = by_pack[pack]
            try:
                parts = await self.read_pack_ranges(pack, wanted)
            except BlobNotFoundError:
                error = BlobNotFoundError(wanted[0].rows[0].key)
                error.pack = pack  # type: ignore[attr-defined]
                raise error from None
            for one, data in zip(wanted, parts, strict=True):
                items = [
                    (
                        row.key[len(FILE_KEY_PREFIX) :],
                        row.offset,
                        row.length,
                        row.raw_size,
                        row.codec,
                    )
                    for row in one.rows
                ]
                try:
                    decoded = await asyncio.to_thread(_native.unpack_many, data, one.start, items)
                except _native.PackedBlobInvalid as invalid:
                    digest, reason = invalid.args
                    raise BlobCorruptError(FILE_KEY_PREFIX + digest, pack, reason) from None
                for row, raw in zip(one.rows, decoded, strict=True):
                    out[row.key] = raw

        await _gather_bounded(list(by_pack), fetch)
        return [out[row.key] for row in rows]

    async def read_pack_ranges(self, pack: str, reads: Sequence[PackRead]) -> builtins.list[bytes]:
        """The bytes of each read of ``pack`` (shorter when the pack ends
        first): one ``get_ranges``, or from a store that serves packs frame by
        frame (the gateway's) the frames of each read's rows at their offsets,
        zeros between them (``_read_stream``). Raises BlobNotFoundError,
        BlobCorruptError, BlobStoreError."""
        if _frame_reader(self.inner) is None:
            return await get_ranges(self.inner, pack, [(read.start, read.end) for read in reads])

        async def one(read: PackRead) -> bytes:
            return b"".join([chunk async for chunk in _read_stream(self.inner, read, 1 << 20)])

        return await _gather_bounded(list(reads), one)

    def open_pack(self, pack: str) -> int | None:
        """A read-only descriptor of ``pack`` when it is a file in a local
        directory, for the restore to read natively (the caller closes it);
        None for any other store. Raises BlobNotFoundError (its ``pack``
        set) when the pack is gone, BlobStoreError."""
        local = local_dir_of(self.inner)
        if local is None:
            return None
        try:
            return local.open_for_reading(pack)
        except BlobNotFoundError:
            error = BlobNotFoundError(pack)
            error.pack = pack  # type: ignore[attr-defined]
            raise error from None

    async def stream_pack_read(
        self, read: PackRead, chunk_size: int = 1 << 20
    ) -> AsyncIterator[bytes]:
        """The bytes of ``read`` as they arrive (one ranged GET, streamed: the
        caller decodes frames as they complete, so memory holds a chunk, not the
        range); fewer bytes when the pack is truncated. Raises BlobNotFoundError
        (its ``pack`` set) when the pack is gone, BlobStoreError."""
        try:
            async for chunk in _read_stream(self.inner, read, chunk_size):
                yield chunk
        except BlobNotFoundError:
            error = BlobNotFoundError(read.rows[0].key if read.rows else read.pack)
            error.pack = read.pack  # type: ignore[attr-defined]
            raise error from None

    async def get(self, key: str) -> bytes:
        return (await self.get_many([key]))[0]

    async def get_many(self, keys: Sequence[str]) -> builtins.list[bytes]:
        """Packed keys from their packs (few ranged GETs), the rest from their
        single objects. Raises BlobNotFoundError, BlobCorruptError, BlobStoreError.

        A blob not found where the index said is looked up once more: a sweep
        may have moved it in between (a repacked pack deleted, or a migrated
        single object freed) and the index then names its new place."""
        try:
            return await self._get_many_once(keys)
        except BlobNotFoundError:
            return await self._get_many_once(keys)

    async def _get_many_once(self, keys: Sequence[str]) -> builtins.list[bytes]:
        located = await self.locate(keys)
        packed = list(dict.fromkeys(key for key in keys if key in located))
        single = [key for key in keys if key not in located]
        found: dict[str, bytes] = {}
        if packed:
            # By the asked key: an artifact's row names its digest's file form.
            rows = [located[key] for key in packed]
            for key, data in zip(packed, await self.read_packed(rows), strict=True):
                found[key] = data
        if single:
            for key, data in zip(single, await get_many(self.inner, single), strict=True):
                found[key] = data
        return [found[key] for key in keys]

    async def get_stream(self, key: str, chunk_size: int = 1 << 20) -> AsyncIterator[bytes]:
        """A packed blob (small: read whole, checked) in chunks, else the single
        object's stream."""
        row = (await self.locate([key])).get(key)
        if row is None:
            async for chunk in self.inner.get_stream(key, chunk_size):
                yield chunk
            return
        data = (await self.read_packed([row]))[0]
        for start in range(0, len(data), chunk_size):
            yield data[start : start + chunk_size]

    async def head(self, key: str) -> BlobInfo | None:
        """A packed blob's raw size and its pack's upload time; else the single object."""
        row = (await self.locate([key])).get(key)
        if row is None:
            return await self.inner.head(key)
        pack = await self.inner.head(row.pack)
        return None if pack is None else BlobInfo(key, row.raw_size, pack.last_modified_ms)

    async def missing(self, keys: Sequence[str]) -> builtins.list[str]:
        """Keys the bucket does not hold: packed keys whose pack object is gone
        (one HEAD per distinct pack), other keys whose single object is gone.
        This is ``check``'s question; a capture asks its session, which trusts
        the index and never asks the bucket."""
        located = await self.locate(keys)
        packs = list(dict.fromkeys(row.pack for row in located.values()))
        heads = await _gather_bounded(packs, self.inner.head)
        gone = {pack for pack, info in zip(packs, heads, strict=True) if info is None}
        rest = [key for key in keys if key not in located]
        absent = set(await missing(self.inner, rest)) if rest else set()
        absent.update(key for key, row in located.items() if row.pack in gone)
        return [key for key in keys if key in absent]


def _frame_reader(inner: BlobStore) -> Any:
    """A store's ``read_pack_frames``, when it serves packs only frame by frame:
    the gateway's (``gateway/remote.py``), which must never hand a sidecar the
    bytes of another tenant's frames that lie between or around its own."""
    return getattr(inner, "read_pack_frames", None)


def _read_stream(inner: BlobStore, read: PackRead, chunk_size: int) -> AsyncIterator[bytes]:
    """The bytes of ``read`` from ``inner``: one ranged GET, or from a store that
    serves packs frame by frame the frames of ``read.rows`` at their offsets
    (the bytes between them zeros: only frames are ever decoded)."""
    frames = _frame_reader(inner)
    if frames is not None:
        stream: AsyncIterator[bytes] = frames(
            read.pack, read.start, read.end, read.rows, chunk_size
        )
        return stream
    return get_range_stream(inner, read.pack, read.start, read.end, chunk_size)


# Pins pack keys for the capture's lease until they are not condemned (the
# capture's ``_pin``): a PackSession calls it for each pack before its upload.
PinPacks = Callable[[builtins.list[str]], Awaitable[None]]


@dataclass(slots=True)
class _OpenPack:
    writer: _native.PackWriter


class PackSession(BlobStore):
    """One capture's writer (see the module docstring).

    ``put_many`` is durable only after ``flush()``: the capture flushes before
    its append and passes ``rows`` to it. Used by one capture's tasks on one
    event loop.
    """

    def __init__(self, packed: PackedBlobStore, pin: PinPacks | None = None) -> None:
        self.packed = packed
        self._pin = pin
        self.url = packed.url
        self._columns: builtins.list[PackColumns] = []  # of each uploaded pack
        self.packs_written = 0
        # Digests in an open or uploading pack, or uploaded (file keys' digests).
        self._taken = _native.DigestSet()
        self._distrusted: set[str] = set()  # keys ``check`` found gone: ask the bucket
        self._open = _OpenPack(_native.PackWriter())
        self._adding = asyncio.Lock()  # one add at a time on the open writer
        self._uploads: set[asyncio.Task[None]] = set()  # packs uploading (``_start_upload``)
        self._upload_slots = asyncio.Semaphore(packed.uploads)
        self._abandoned = False

    async def put(
        self, key: str, data: bytes | AsyncIterable[bytes], *, if_absent: bool = True
    ) -> bool:
        """A blob below the threshold joins the open pack (a scanned file handed
        over open is read whole: it is small); anything else is a single object."""
        if if_absent and key.startswith(FILE_KEY_PREFIX):
            if isinstance(data, VerifiedFile) and data.reader.size < self.packed.threshold:
                data = b"".join([chunk async for chunk in data])
            if (
                isinstance(data, bytes | bytearray | memoryview)
                and len(data) < self.packed.threshold
            ):
                return (await self.put_many([(key, bytes(data))]))[0]
        return await self.packed.put(key, data, if_absent=if_absent)

    async def put_learned(
        self, beside: str, source: VerifiedFile, *, unless_beside: bool = False
    ) -> tuple[str, bool] | None:
        """A large file named by its bytes (``base.put_learned``): a single object."""
        return await put_learned(self.packed.inner, beside, source, unless_beside=unless_beside)

    async def get(self, key: str) -> bytes:
        return await self.packed.get(key)

    def get_stream(self, key: str, chunk_size: int = 1 << 20) -> AsyncIterator[bytes]:
        return self.packed.get_stream(key, chunk_size)

    async def get_many(self, keys: Sequence[str]) -> builtins.list[bytes]:
        return await self.packed.get_many(keys)

    async def head(self, key: str) -> BlobInfo | None:
        return await self.packed.head(key)

    def list_pages(self, prefix: str) -> AsyncIterator[builtins.list[BlobInfo]]:
        return self.packed.list_pages(prefix)

    async def list(self, prefix: str) -> builtins.list[BlobInfo]:
        return await self.packed.list(prefix)

    async def delete(self, key: str) -> None:
        await self.packed.delete(key)

    def distrust(self, keys: Iterable[str]) -> None:
        """``missing`` asks the bucket about these keys (``check`` marked them
        gone: their pack or object may be lost) instead of trusting the index."""
        self._distrusted.update(keys)

    def _is_taken(self, key: str) -> bool:
        digest = digest_of(key)
        return digest is not None and digest in self._taken

    async def missing(self, keys: Sequence[str]) -> builtins.list[str]:
        """Keys neither packed, nor referenced by a checkpoint (a single object
        the count and the capture's pin protect), nor written by this session.
        Asks the store, never the bucket (but for distrusted keys)."""
        asked = [k for k in keys if not self._is_taken(k)]
        doubted = [k for k in asked if k in self._distrusted]
        trusted = [k for k in asked if k not in self._distrusted]
        located = await _locate(self.packed.index, trusted) if trusted else {}
        absent = {key for key in trusted if key not in located}
        if doubted:
            absent.update(await self.packed.missing(doubted))
        return [key for key in keys if key in absent]

    async def missing_digests(self, digests: bytes) -> bytes:
        """``missing`` for file blobs by raw digest (32 bytes each,
        concatenated, in and out): what a feed batch asks, with no Python
        object per blob (``PackIndex.known_digests`` where the store has it)."""
        asked = self._taken.without(digests)
        if not asked:
            return b""
        if self._distrusted:  # rare: ``check`` marked keys gone; ask as keys
            keys = [file_key(digest) for digest in split_digests(asked)]
            return b"".join(checked_digest(key) for key in await self.missing(keys))
        return _native.digests_without(asked, await known_digests(self.packed.index, asked))

    async def put_fed(self, batch: _native.FedBatch, wanted: bytes) -> tuple[int, int]:
        """Pack the blobs of a feed batch whose digests are in ``wanted``
        (each once, and none this session took already) straight from the
        batch (``PackWriter.extend_fed``); returns how many blobs and bytes it
        took. A blob at or above the threshold goes up as a single object.
        Durable at ``flush``."""
        wanted = self._taken.take_new(wanted)
        if not wanted:
            return 0, 0
        blobs = nbytes = 0
        full: builtins.list[_OpenPack] = []
        async with self._adding:
            start = 0
            while start < len(batch):
                pack = self._open
                start, added, added_bytes = await asyncio.to_thread(
                    pack.writer.extend_fed, batch, start, wanted, self.packed.target,
                    self.packed.threshold,
                )  # fmt: skip
                blobs += added
                nbytes += added_bytes
                if pack.writer.size >= self.packed.target:
                    full.append(pack)
                    self._open = _OpenPack(_native.PackWriter())
        for pack in full:
            await self._start_upload(pack)
        if blobs < len(wanted) // 32:
            # Blobs at or above the threshold (only when it is below the feed's
            # largest file): single objects, as ``put_many`` does.
            chosen = _native.DigestSet()
            chosen.take_new(wanted)
            large = [
                (file_key(digest), data)
                for digest, data in batch.items()
                if len(data) >= self.packed.threshold and digest in chosen
            ]
            large = list(dict(large).items())
            for (_key, data), done in zip(
                large, await put_many(self.packed.inner, large), strict=True
            ):
                if done:
                    blobs += 1
                    nbytes += len(data)
        return blobs, nbytes

    async def put_many(self, items: Sequence[tuple[str, bytes]]) -> builtins.list[bool]:
        """Small blobs into the open pack (uploaded once full), larger ones as
        single objects; per item whether this call took it. Durable at ``flush``."""
        threshold = self.packed.threshold
        large: builtins.list[tuple[str, bytes]] = []
        small: dict[str, bytes] = {}
        for key, data in items:
            if len(data) >= threshold or not key.startswith(FILE_KEY_PREFIX):
                large.append((key, data))
            elif not self._is_taken(key):
                small.setdefault(key, data)
        written_large: dict[str, bool] = {}
        if large:
            for (key, _), done in zip(large, await put_many(self.packed.inner, large), strict=True):
                written_large[key] = done
        if small:
            self._taken.take_new(b"".join(checked_digest(key) for key in small))
            full: builtins.list[_OpenPack] = []
            async with self._adding:
                for chunk in self._chunks(list(small.items())):
                    pack = self._open
                    batch = [(key[len(FILE_KEY_PREFIX) :], data) for key, data in chunk]
                    await asyncio.to_thread(pack.writer.extend, batch)
                    if pack.writer.size >= self.packed.target:
                        full.append(pack)
                        self._open = _OpenPack(_native.PackWriter())
            for pack in full:
                await self._start_upload(pack)
        return [
            written_large.get(key, False) if key in written_large else key in small
            for key, _ in items
        ]

    def _chunks(
        self, items: builtins.list[tuple[str, bytes]]
    ) -> Iterator[builtins.list[tuple[str, bytes]]]:
        """``items`` cut where the open pack would reach its target (by raw
        size: compression only makes a pack smaller), so a pack overshoots the
        target by at most one blob. Runs under ``_adding``: ``_open`` is current."""
        chunk: builtins.list[tuple[str, bytes]] = []
        room = self.packed.target - self._open.writer.size
        for item in items:
            chunk.append(item)
            room -= len(item[1]) + _ENTRY_BYTES
            if room <= 0:
                yield chunk
                chunk = []
                room = self.packed.target - self._open.writer.size
        if chunk:
            yield chunk

    @property
    def rows(self) -> PackedRows:
        """The index rows of every blob this session uploaded (in columns, one
        ``PackColumns`` per pack: no Python object per blob)."""
        return PackedRows(self._columns)

    async def _upload(self, pack: _OpenPack) -> None:
        hex_digest, data, digests, offsets, lengths, raw_sizes, codecs = await asyncio.to_thread(
            pack.writer.finish_with_rows
        )
        key = pack_key(hex_digest)
        if self._pin is not None:
            # Before the pack exists: a sweep then finds it pinned (or had
            # condemned a pack of these very bytes, and we wait until its
            # delete is over). See the module docstring, "Safety".
            await self._pin([key])
        await put_many(self.packed.inner, [(key, data)])  # durable on return
        self.packs_written += 1
        self._columns.append(
            PackColumns(key, digests, _u32s(offsets), _u32s(lengths), _u32s(raw_sizes), codecs)
        )

    async def _start_upload(self, pack: _OpenPack) -> None:
        """Upload ``pack`` in the background, once fewer than ``packed.uploads`` are
        in flight; ``flush`` waits for it and raises what it raised."""
        await self._upload_slots.acquire()
        if self._abandoned:
            self._upload_slots.release()
            raise asyncio.CancelledError("the capture abandoned its pack uploads")

        async def upload() -> None:
            try:
                await self._upload(pack)
            finally:
                self._upload_slots.release()

        self._uploads.add(asyncio.ensure_future(upload()))

    async def flush(self) -> None:
        """Upload the open pack (if it holds anything) and wait for every upload:
        every blob this session took is durable on return, and ``rows`` lists
        where each one is. Raises what a failed upload raised."""
        async with self._adding:
            pack, self._open = self._open, _OpenPack(_native.PackWriter())
        if pack.writer.count:
            await self._start_upload(pack)
        uploads, self._uploads = list(self._uploads), set()
        failures = [
            outcome
            for outcome in await asyncio.gather(*uploads, return_exceptions=True)
            if isinstance(outcome, BaseException)
        ]
        if failures:
            raise failures[0]

    async def abandon(self) -> None:
        """Stop the uploads still running (a failed or cancelled capture must not
        leave them going) and wait until they have stopped."""
        self._abandoned = True
        uploads, self._uploads = list(self._uploads), set()
        for upload in uploads:
            upload.cancel()
        await asyncio.gather(*uploads, return_exceptions=True)


async def known_digests(index: PackIndex, digests: bytes) -> bytes:
    """Those of ``digests`` (raw file digests, concatenated) the index knows:
    packed, or referenced as single objects. ``index.known_digests`` when the
    store has it (SQLite: two statements, nothing per blob), else its
    ``locate_blobs``."""
    native = getattr(index, "known_digests", None)
    if native is not None:
        found: bytes = await native(digests)
        return found
    located = await _locate(index, [file_key(digest) for digest in split_digests(digests)])
    return b"".join(checked_digest(key) for key in located)


def _u32s(data: bytes) -> array[int]:
    """A native-endian u32 column of ``PackWriter.finish_with_rows``."""
    column = array("I")
    column.frombytes(data)
    return column


__all__ = [
    "DEFAULT_PACK_THRESHOLD",
    "PACK_KEY_PREFIX",
    "PACK_TARGET_BYTES",
    "PackRead",
    "PackSession",
    "PackedBlobStore",
    "pack_key",
    "packed_blobs",
    "plan_pack_reads",
]
