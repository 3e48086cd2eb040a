"""What a pack object says it holds: its trailer, read with ranged GETs.

A pack describes itself (format in ``rust/src/pack.rs``): the last
``PACK_FOOTER_LEN`` bytes announce the trailer's length, and the trailer lists
every blob in the pack (digest, offset, stored length, raw length, codec). The
sweep reads it to find the keys a pack holds beyond its index rows (dead copies,
or an unfinished capture's blobs), ``check`` to verify the index against it.

One ranged GET of the pack's last ``TAIL_GUESS_BYTES`` covers the trailer of a
pack of up to ~1,500 blobs; a larger trailer costs a second GET.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import _native
from ..model import FILE_KEY_PREFIX
from .base import BlobStore, get_ranges

TAIL_GUESS_BYTES = 64 << 10


@dataclass(frozen=True, slots=True)
class PackEntry:
    """One blob a pack's trailer lists."""

    key: str  # sandbox-files/blake3/<hex>
    offset: int
    length: int  # stored bytes
    raw_size: int
    codec: int


class PackTrailerError(ValueError):
    """The pack's footer or trailer is damaged, or the pack is shorter than it says."""


async def read_pack_entries(blobs: BlobStore, pack: str, size: int) -> list[PackEntry]:
    """The blobs ``pack`` (``size`` bytes long) lists. Raises PackTrailerError
    for a damaged or truncated pack, BlobNotFoundError when it is gone,
    BlobStoreError when the bucket fails."""
    footer_len = _native.PACK_FOOTER_LEN
    if size < footer_len:
        raise PackTrailerError(f"{size} bytes is shorter than a pack footer")
    start = max(0, size - TAIL_GUESS_BYTES)
    [tail] = await get_ranges(blobs, pack, [(start, size)])
    if len(tail) != size - start:
        raise PackTrailerError(f"the pack holds {start + len(tail)} bytes, the listing says {size}")
    try:
        trailer_len = _native.pack_trailer_len(tail[-footer_len:])
        if trailer_len + footer_len > len(tail) and start > 0:
            start = max(0, size - footer_len - trailer_len)
            [tail] = await get_ranges(blobs, pack, [(start, size)])
        listed = _native.read_pack_trailer(tail, size)
    except _native.PackInvalid as invalid:
        raise PackTrailerError(str(invalid.args[0] if invalid.args else invalid)) from None
    return [
        PackEntry(FILE_KEY_PREFIX + digest, offset, length, raw, codec)
        for digest, offset, length, raw, codec, _kind in listed
    ]


__all__ = ["PackEntry", "PackTrailerError", "read_pack_entries"]
