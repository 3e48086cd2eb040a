"""The pack index's rules and row encoding, shared by every store we ship
(``store.base.PackIndex``; the pack layer is ``blobs/packs.py``).

Compact at scale: a SQL store keeps per packed key one row of the 32-byte
digest, a small integer naming the pack (each pack's 32-byte digest is stored
once, in a second table) and four integers, never the key or pack text.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..errors import SandboxCheckpointInvalidEntryError
from ..model import ARTIFACT_KEY_PREFIX, FILE_KEY_PREFIX
from .base import PackedBlob

PACK_KEY_PREFIX = "sandbox-packs/blake3/"
_HEX = re.compile(r"[0-9a-f]{64}")
_FILE_KEY = re.compile(re.escape(FILE_KEY_PREFIX) + "[0-9a-f]{64}")
_PACK_KEY = re.compile(re.escape(PACK_KEY_PREFIX) + "[0-9a-f]{64}")
# A frame starts after the pack's 8-byte header (rust/src/pack.rs).
_FIRST_FRAME = 8
# Offsets and lengths fit a signed 32-bit column (packs are far smaller).
_MAX_LENGTH = (1 << 31) - 1
CODECS = (0, 1)


def _hex_of(key: object, prefix: str) -> str | None:
    if not isinstance(key, str) or not key.startswith(prefix):
        return None
    tail = key[len(prefix) :]
    return tail if _HEX.fullmatch(tail) else None


def _row_problem(row: object) -> str | None:
    """What is wrong with one pack index row, None when nothing is."""
    if not isinstance(row, PackedBlob):
        return "not a PackedBlob"
    if _hex_of(row.key, FILE_KEY_PREFIX) is None:
        return f"key {row.key!r} is not a {FILE_KEY_PREFIX}<hex> key"
    if _hex_of(row.pack, PACK_KEY_PREFIX) is None:
        return f"pack {row.pack!r} is not a {PACK_KEY_PREFIX}<hex> key"
    if any(type(value) is not int for value in (row.offset, row.length, row.raw_size, row.codec)):
        return "offset, length, raw_size and codec must be ints"
    if not _FIRST_FRAME <= row.offset <= _MAX_LENGTH or not 0 <= row.length <= _MAX_LENGTH:
        return f"offset {row.offset} / length {row.length} out of range"
    if not 0 <= row.raw_size <= _MAX_LENGTH or row.codec not in CODECS:
        return f"raw_size {row.raw_size} / codec {row.codec} out of range"
    return None


def check_packed_blobs(
    rows: Iterable[PackedBlob], referenced: Callable[[str], bool] | None
) -> list[PackedBlob]:
    """The rows an append records: each checked (INVALID_ENTRY naming the row
    otherwise), keeping only keys the checkpoint references (the append that
    first references a key records where it is; None: every key), one per key.

    A cold capture of 100,000 small files appends 100,000 rows: the common
    case (a well-formed row) is one expression, each pack name checked once;
    ``_row_problem`` explains a row that fails it."""
    out: dict[str, PackedBlob] = {}
    good_packs: set[str] = set()
    file_key = _FILE_KEY.fullmatch
    for row in rows:
        if not (
            type(row) is PackedBlob
            and type(key := row.key) is str
            and file_key(key)
            and type(pack := row.pack) is str
            and (pack in good_packs or _pack_ok(pack, good_packs))
            and type(offset := row.offset) is int
            and type(length := row.length) is int
            and type(raw_size := row.raw_size) is int
            and type(row.codec) is int
            and _FIRST_FRAME <= offset <= _MAX_LENGTH
            and 0 <= length <= _MAX_LENGTH
            and 0 <= raw_size <= _MAX_LENGTH
            and row.codec in CODECS
        ):
            problem = _row_problem(row)
            if problem is not None:
                raise SandboxCheckpointInvalidEntryError(
                    f"invalid pack index row {row!r}: {problem}",
                    details={"key": str(getattr(row, "key", ""))},
                )
        if referenced is None or referenced(row.key):
            out[row.key] = row
    # In key order: concurrent upserts then lock rows in one order (no deadlock).
    return sorted(out.values(), key=lambda row: row.key)


def _pack_ok(pack: str, good_packs: set[str]) -> bool:
    if _PACK_KEY.fullmatch(pack):
        good_packs.add(pack)
        return True
    return False


def row_key(key: str) -> str:
    """The key a pack index row holds for the blob of ``key``.

    A row is per digest: an artifact's key (``sandbox-artifacts/blake3/<hex>``)
    is the BLAKE3 of its bytes, as a file blob's key is of the bytes stored, so
    an artifact and a file blob of one hash are the same bytes and one row
    serves both, under the file form. Its lifetime counts both: a row goes only
    when neither key is referenced (``artifact_twin``)."""
    if key.startswith(ARTIFACT_KEY_PREFIX):
        return FILE_KEY_PREFIX + key[len(ARTIFACT_KEY_PREFIX) :]
    return key


def artifact_twin(key: str) -> str:
    """The artifact key of a row's (file-form) key: the other key it serves."""
    return ARTIFACT_KEY_PREFIX + key[len(FILE_KEY_PREFIX) :]


def checked_digest(key: str) -> bytes:
    """The 32 digest bytes of a file key ``check_packed_blobs`` accepted."""
    return bytes.fromhex(key[len(FILE_KEY_PREFIX) :])


def digest_of(key: str) -> bytes | None:
    """The 32 raw digest bytes of a file key, None for a key of another shape."""
    tail = _hex_of(key, FILE_KEY_PREFIX)
    return bytes.fromhex(tail) if tail is not None else None


def pack_digest(pack: str) -> bytes:
    return bytes.fromhex(pack[len(PACK_KEY_PREFIX) :])


def file_key(digest: bytes) -> str:
    return FILE_KEY_PREFIX + bytes(digest).hex()


def pack_key(digest: bytes) -> str:
    return PACK_KEY_PREFIX + bytes(digest).hex()


def row_from_sql(
    digest: bytes, pack: bytes, offset: int, length: int, raw_size: int, codec: int
) -> PackedBlob:
    return PackedBlob(file_key(digest), pack_key(pack), offset, length, raw_size, codec)


def digests_of(keys: Sequence[str]) -> dict[bytes, str]:
    """digest → key for the file keys among ``keys`` (a restore asks for
    100,000 at once: one compiled match and one ``fromhex`` per key)."""
    out: dict[bytes, str] = {}
    is_file_key = _FILE_KEY.fullmatch
    fromhex = bytes.fromhex
    start = len(FILE_KEY_PREFIX)
    for key in keys:
        if type(key) is str and is_file_key(key):
            out[fromhex(key[start:])] = key
    return out


def located_rows(
    wanted: dict[bytes, str], rows: Iterable[Sequence[Any]], found: dict[str, PackedBlob | None]
) -> None:
    """Add to ``found`` the index rows a SQL store read for ``wanted`` (from
    ``digests_of``): each ``(digest, pack digest, offset, length, raw_size,
    codec)``. The key is the caller's own string and each pack's key is made
    once, so a read of 100,000 rows builds no string twice."""
    packs: dict[bytes, str] = {}
    for digest, pack, offset, length, raw_size, codec in rows:
        key = wanted.get(bytes(digest))
        if key is None:
            continue
        pack = bytes(pack)
        pack_name = packs.get(pack)
        if pack_name is None:
            pack_name = packs[pack] = pack_key(pack)
        found[key] = PackedBlob(key, pack_name, offset, length, raw_size, codec)
