"""What the gateway checks before a sidecar's pack, or a pack index row, is trusted.

A pack can hold several tenants' blobs once captures deduplicate across them:
a row for key K that another tenant's capture finds in the index makes that
capture skip its upload and trust the frame the row names. So a sidecar (which
runs next to arbitrary code) may never point a row at bytes that are not K's,
at a pack that is not there, or at a pack a sweep is deleting. The rules:

* **Uploads** (BlobPut/BlobPutMany of ``sandbox-packs/blake3/<hex>``): the
  whole pack is checked before it is stored, as a single blob is hashed: its
  BLAKE3 is its key, its trailer reads, every frame decodes to its digest
  (``_native.verify_pack_file``). A pack is spooled to a file as it arrives
  and checked from there, frame by frame, each decoded streaming in a bounded
  window and hashed as it decodes: no frame is decoded past its entry's size,
  and a trailer claiming more than ``PackLimits`` (per blob, in all) is refused
  before anything is decoded, so a few kilobytes of zstd frames that claim
  gigabytes cost the gateway nothing. So every pack in the bucket (written through a gateway
  or by the operator's own sweep and migrate) holds exactly what its trailer
  says. The gateway remembers each pack it stored (``VerifiedPacks``) with the
  time it was durable.
* **Rows** (``Append``'s ``packed_blobs``): the pack's own key must have
  been pinned through this gateway by the appending writer (``Pins``: a
  capture pins each pack before it uploads it, ``blobs/packs.py`` "Safety"),
  every row must be an entry of its pack's trailer (``rows_problem``), and the
  pack must stay until the append commits. A sweep deletes a pack only once
  its key (and every key in it) is condemned, and a live pin refuses a
  condemnation; the append checks the writer's fence, so its pins are still
  live, and a pack that existed after its pin was taken is there at commit.
  Fast path: the gateway stored the pack after the writer pinned it. Else
  (another gateway took the upload) it reads the pack's trailer from the
  bucket, which proves both the rows and that the pack is there after the pin.
  A writer whose pin another gateway took is refused with ``details.unpinned``:
  the remote store pins the rows' packs again through this gateway and repeats
  the append once (nothing was written).
* **Locating** (``LocateBlobs``): only keys the token may read (BlobGet's
  rule) or that it pinned through this gateway; the others are left out, so a
  capture packs its own copy (a capture asks before it pins: another tenant's
  copy of the same bytes is not revealed, the newest row wins and a repack
  reclaims the older frame).
* **Reading** (``ReadPackFrames``): only frames of keys the token may read,
  each the store's current row of its key, sent as stored; never the bytes
  between or around them. The sidecar decodes and checks each frame (size and
  BLAKE3), as it does reading a bucket itself.
"""

from __future__ import annotations

import time
from array import array
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from .. import _native
from ..blobs.packs import PACK_TARGET_BYTES
from ..errors import INVALID_BLOB, SandboxCheckpointError, SandboxCheckpointInvalidEntryError
from ..store._packindex import PackColumns
from ..store.base import PackedBlob
from .tokens import TokenScope

# The largest pack a gateway takes: its writer closes one near 16 MiB
# (blobs/packs.py), one blob past that at most.
MAX_PACK_BYTES = 64 << 20
# What a pack's trailer may claim before any frame is decoded (``PackLimits``):
# a packed blob is below its writer's pack threshold, at most the pack size.
MAX_PACKED_BLOB_BYTES = PACK_TARGET_BYTES
MAX_PACK_DECODED_BYTES = 1 << 30
# Rows of the packs remembered as stored (about 45 bytes each).
VERIFIED_PACK_ROWS = 2_000_000
# Keys remembered as pinned through this gateway, and writers per key (the
# newest kept): captures of several tenants pin common content at once.
PIN_MEMORY_KEYS = 1_000_000
PIN_WRITERS_PER_KEY = 8

WriterKey = tuple[str, str, int]  # (thread, owner token, fence)


def u32s(data: bytes) -> array[int]:
    """A native-endian u32 column (``_native`` gives them as bytes)."""
    column = array("I")
    column.frombytes(data)
    return column


@dataclass(frozen=True, slots=True)
class PackLimits:
    """The decoded sizes an uploaded pack may claim: per blob, and in all."""

    max_blob: int = MAX_PACKED_BLOB_BYTES
    max_total: int = MAX_PACK_DECODED_BYTES


def verified_pack(key: str, fd: int, size: int, limits: PackLimits) -> PackColumns:
    """The index rows of a pack an untrusted writer uploaded, the ``size``
    bytes of the file ``fd``, once the whole pack checks within ``limits``
    (``_native.verify_pack_file``: nothing decoded past an entry's size or a
    limit, frames decoded streaming): INVALID_BLOB naming the pack (and the
    blob) otherwise. The caller checks that the pack's bytes hash to ``key``."""
    if size > MAX_PACK_BYTES:
        raise refuse_pack(key, f"it is {size} bytes, more than a gateway takes ({MAX_PACK_BYTES})")
    try:
        digests, offsets, lengths, raw_sizes, codecs = _native.verify_pack_file(
            fd, size, limits.max_blob, limits.max_total
        )
    except _native.PackedBlobInvalid as invalid:
        digest, reason = invalid.args
        raise refuse_pack(key, f"its blob {digest} is invalid: {reason}", blob=digest) from None
    except _native.PackInvalid as invalid:
        raise refuse_pack(key, invalid.args[0]) from None
    return PackColumns(key, digests, u32s(offsets), u32s(lengths), u32s(raw_sizes), codecs)


def refuse_pack(key: str, problem: str, **details: str) -> SandboxCheckpointError:
    """INVALID_BLOB naming the pack: the upload is refused, nothing is stored."""
    return SandboxCheckpointError(
        f"pack {key!r} refused: {problem}",
        code=INVALID_BLOB,
        details={"key": key, "pack": key, **details},
    )


def columns_of_entries(pack: str, entries: Iterable[PackedBlob]) -> PackColumns:
    """A trailer's entries as index columns (one row per digest, its first
    frame, digest order), as ``verify_pack_file`` and the pack writer give them."""
    first: dict[bytes, PackedBlob] = {}
    for entry in entries:
        first.setdefault(bytes.fromhex(entry.key[-64:]), entry)
    order = sorted(first)
    return PackColumns(
        pack,
        b"".join(order),
        array("I", (first[d].offset for d in order)),
        array("I", (first[d].length for d in order)),
        array("I", (first[d].raw_size for d in order)),
        bytes(first[d].codec for d in order),
    )


def rows_problem(sent: PackColumns, trailer: PackColumns) -> str | None:
    """Why ``sent`` (an append's rows of one pack) are not entries of the pack's
    trailer, None when every row is. A capture sends its writer's columns as
    they are, which compare whole."""
    if (
        sent.digests == trailer.digests
        and sent.offsets == trailer.offsets
        and sent.lengths == trailer.lengths
        and sent.raw_sizes == trailer.raw_sizes
        and sent.codecs == trailer.codecs
    ):
        return None
    where = {trailer.digests[32 * i : 32 * i + 32]: i for i in range(len(trailer))}
    for i in range(len(sent)):
        digest = sent.digests[32 * i : 32 * i + 32]
        j = where.get(digest)
        if j is None:
            return f"the pack holds no blob {digest.hex()}"
        if (sent.offsets[i], sent.lengths[i], sent.raw_sizes[i], sent.codecs[i]) != (
            trailer.offsets[j],
            trailer.lengths[j],
            trailer.raw_sizes[j],
            trailer.codecs[j],
        ):
            return f"the row of blob {digest.hex()} is not where the pack's trailer puts it"
    return None


def refuse_rows(pack: str, problem: str, **details: str) -> SandboxCheckpointInvalidEntryError:
    return SandboxCheckpointInvalidEntryError(
        f"pack index rows of {pack!r} refused: {problem}",
        details={"key": pack, "pack": pack, **details},
    )


@dataclass(frozen=True, slots=True)
class VerifiedPack:
    columns: PackColumns
    seen_at: float  # time.monotonic() when the pack was known to be in the bucket


class VerifiedPacks:
    """pack → its rows and when it was last known durable (bounded, newest kept)."""

    def __init__(self, limit_rows: int = VERIFIED_PACK_ROWS) -> None:
        self._limit = limit_rows
        self._rows = 0
        self._packs: OrderedDict[str, VerifiedPack] = OrderedDict()

    def remember(self, columns: PackColumns, seen_at: float | None = None) -> None:
        old = self._packs.pop(columns.pack, None)
        if old is not None:
            self._rows -= len(old.columns)
        self._packs[columns.pack] = VerifiedPack(
            columns, time.monotonic() if seen_at is None else seen_at
        )
        self._rows += len(columns)
        while self._rows > self._limit and len(self._packs) > 1:
            _, dropped = self._packs.popitem(last=False)
            self._rows -= len(dropped.columns)

    def get(self, pack: str) -> VerifiedPack | None:
        return self._packs.get(pack)


class Pins:
    """key → the writers that pinned it through this gateway, and when (their
    first pin: a pin lasts as long as its lease)."""

    def __init__(self, limit: int = PIN_MEMORY_KEYS) -> None:
        self._limit = limit
        self._pins: OrderedDict[str, tuple[tuple[WriterKey, float], ...]] = OrderedDict()

    def remember(self, keys: Iterable[str], writer: WriterKey) -> None:
        at = time.monotonic()  # after the pin committed
        pins = self._pins
        for key in keys:
            held = pins.get(key)
            if held is None:
                pins[key] = ((writer, at),)
                continue
            if not any(w == writer for w, _ in held):
                pins[key] = (*held[1 - PIN_WRITERS_PER_KEY :], (writer, at))
            pins.move_to_end(key)
        while len(pins) > self._limit:
            pins.popitem(last=False)

    def granted(self, scope: TokenScope, key: str) -> bool:
        return any(scope.covers(w[0]) for w, _ in self._pins.get(key, ()))

    def first_unpinned(self, keys: Iterable[str], writer: WriterKey) -> tuple[str | None, float]:
        """The first of ``keys`` ``writer`` has not pinned through this gateway
        (None: it pinned them all), and the earliest time it pinned one."""
        earliest = float("inf")
        pins = self._pins
        for key in keys:
            for w, at in pins.get(key, ()):
                if w == writer:
                    earliest = min(earliest, at)
                    break
            else:
                return key, earliest
        return None, earliest


__all__ = [
    "MAX_PACKED_BLOB_BYTES",
    "MAX_PACK_BYTES",
    "MAX_PACK_DECODED_BYTES",
    "PackLimits",
    "Pins",
    "VerifiedPack",
    "VerifiedPacks",
    "columns_of_entries",
    "refuse_pack",
    "refuse_rows",
    "rows_problem",
    "u32s",
    "verified_pack",
]
