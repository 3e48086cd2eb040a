"""The pack index's rules and row encoding, shared by every store we ship
(``store.base.PackIndex``; the pack layer is ``blobs/packs.py``).

Compact at scale: a SQL store keeps per packed key one row of the 32-byte
digest, a small integer naming the pack (each pack's 32-byte digest is stored
once, in a second table) and four integers, never the key or pack text.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, overload

from .. import _native
from ..errors import SandboxCheckpointInvalidEntryError
from ..manifest import split_digests
from ..model import ARTIFACT_KEY_PREFIX, FILE_KEY_PREFIX
from .base import IndexRow, PackedBlob

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


def index_rows(found: Mapping[str, PackedBlob | None]) -> list[IndexRow]:
    """``PackIndex.locate_rows`` from a ``locate_blobs`` answer, for an index
    without a query of its own for it."""
    return [
        (
            checked_digest(row.key),
            pack_digest(row.pack),
            row.offset,
            row.length,
            row.raw_size,
            row.codec,
        )
        for row in found.values()
        if row is not None
    ]


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


# ------------------------------------------------------------------------ columns


@dataclass(frozen=True, slots=True)
class PackColumns:
    """One pack's index rows in columns, as its writer reports them
    (``_native.PackWriter.finish_with_rows``): the digests sorted, distinct and
    concatenated (32 bytes each), then per row the frame offset, stored length
    and raw size (``array('I')``) and the codec (one byte). A cold capture of
    100,000 small files appends 100,000 rows in a handful of packs: as columns
    they are checked and written per pack, with no Python object per row."""

    pack: str
    digests: bytes
    offsets: array[int]
    lengths: array[int]
    raw_sizes: array[int]
    codecs: bytes

    def __post_init__(self) -> None:
        """Columns of one length or none at all (INVALID_ENTRY naming the pack)."""
        problem = self._shape_problem()
        if problem is not None:
            raise SandboxCheckpointInvalidEntryError(
                f"invalid pack index rows of {self.pack!r}: {problem}",
                details={"key": str(self.pack)},
            )

    def _shape_problem(self) -> str | None:
        n = len(self.codecs) if isinstance(self.codecs, bytes) else -1
        if n < 0:
            return "codecs must be bytes"
        if not isinstance(self.digests, bytes) or len(self.digests) != 32 * n:
            return f"{n} rows need {32 * n} digest bytes"
        if any(
            not isinstance(column, array) or column.typecode != "I" or len(column) != n
            for column in (self.offsets, self.lengths, self.raw_sizes)
        ):
            return f"offsets, lengths and raw sizes must be {n} unsigned ints each"
        return None

    def __len__(self) -> int:
        return len(self.codecs)

    def row(self, i: int) -> PackedBlob:
        return PackedBlob(
            file_key(self.digests[32 * i : 32 * i + 32]),
            self.pack,
            self.offsets[i],
            self.lengths[i],
            self.raw_sizes[i],
            self.codecs[i],
        )

    def problem(self) -> str | None:
        """What is wrong with the columns (``_row_problem``'s rules, whole
        columns at a time), None when nothing is."""
        if _hex_of(self.pack, PACK_KEY_PREFIX) is None:
            return f"pack {self.pack!r} is not a {PACK_KEY_PREFIX}<hex> key"
        if not len(self):
            return None
        # Bounds natively: a cold capture's 100,000 rows make no int each.
        low, high = _native.u32_bounds(self.offsets.tobytes()) or (_FIRST_FRAME, 0)
        if not _FIRST_FRAME <= low or high > _MAX_LENGTH:
            return "an offset is out of range"
        sizes = (_native.u32_bounds(column.tobytes()) for column in (self.lengths, self.raw_sizes))
        if any(bounds is not None and bounds[1] > _MAX_LENGTH for bounds in sizes):
            return "a length or raw size is out of range"
        if not set(self.codecs) <= set(CODECS):
            return "a codec is unknown"
        return None

    def only(self, unwanted: bytes) -> PackColumns:
        """These columns without the rows of ``unwanted`` (sorted digests)."""
        drop = set(split_digests(unwanted))
        keep = [i for i in range(len(self)) if self.digests[32 * i : 32 * i + 32] not in drop]
        return PackColumns(
            self.pack,
            b"".join(self.digests[32 * i : 32 * i + 32] for i in keep),
            array("I", (self.offsets[i] for i in keep)),
            array("I", (self.lengths[i] for i in keep)),
            array("I", (self.raw_sizes[i] for i in keep)),
            bytes(self.codecs[i] for i in keep),
        )


class PackedRows(Sequence[PackedBlob]):
    """Index rows of one or more packs (``PackColumns`` each): what a capture's
    pack session hands to ``append(..., packed_blobs=)``. Any reader may take it
    as the sequence of ``PackedBlob`` it stands for; ``check_packed_columns``
    and the SQLite store take the columns as they are."""

    __slots__ = ("groups", "_starts")

    def __init__(self, groups: Iterable[PackColumns] = ()) -> None:
        self.groups = tuple(group for group in groups if len(group))
        starts, total = [], 0
        for group in self.groups:
            starts.append(total)
            total += len(group)
        self._starts = (*starts, total)

    def __len__(self) -> int:
        return self._starts[-1]

    @overload
    def __getitem__(self, index: int) -> PackedBlob: ...
    @overload
    def __getitem__(self, index: slice) -> list[PackedBlob]: ...
    def __getitem__(self, index: int | slice) -> PackedBlob | list[PackedBlob]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        for group, start in zip(self.groups, self._starts, strict=False):
            if index < start + len(group):
                return group.row(index - start)
        raise IndexError(index)  # pragma: no cover - the bounds were checked

    def __iter__(self) -> Iterator[PackedBlob]:
        for group in self.groups:
            for i in range(len(group)):
                yield group.row(i)


def check_packed_columns(rows: PackedRows, referenced: bytes) -> PackedRows | list[PackedBlob]:
    """``check_packed_blobs`` for rows in columns: each pack's columns checked
    at once (INVALID_ENTRY naming the pack otherwise), keeping only the digests
    in ``referenced`` (the checkpoint's, sorted). Columns whose digests are not
    sorted and distinct (a writer's always are), or packs that list a key twice
    between them, take ``check_packed_blobs``'s row-by-row path (one row per key)."""
    for group in rows.groups:
        problem = group.problem()
        if problem is not None:
            raise SandboxCheckpointInvalidEntryError(
                f"invalid pack index rows of {group.pack!r}: {problem}",
                details={"key": str(group.pack)},
            )
    distinct = all(_native.digests_sorted_distinct(group.digests) for group in rows.groups)
    if distinct and len(rows.groups) > 1:
        every = b"".join(group.digests for group in rows.groups)
        distinct = len(_native.sort_digests(every)) == len(every)
    if not distinct:
        digests = set(split_digests(referenced))
        return check_packed_blobs(rows, lambda key: checked_digest(key) in digests)
    kept = []
    for group in rows.groups:
        unreferenced = _native.digest_difference(group.digests, referenced)
        kept.append(group.only(unreferenced) if unreferenced else group)
    return PackedRows(kept)
