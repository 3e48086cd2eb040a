"""Pack index rows in columns (``store._packindex.PackedRows``, what a capture's
pack session appends): every store records exactly what the same rows one by one
record, checked per pack (INVALID_ENTRY naming the pack, nothing changed),
keeping only the keys the checkpoint references, one row per key."""

from __future__ import annotations

from array import array
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from checkpointd import _native
from checkpointd.errors import SandboxCheckpointDuplicateIdError, SandboxCheckpointInvalidEntryError
from checkpointd.ids import new_uuid7
from checkpointd.model import Checkpoint, FileEntry
from checkpointd.store import InMemoryCheckpointStore, SqliteCheckpointStore
from checkpointd.store._core import OFFLOAD_ENTRIES
from checkpointd.store._packindex import PackColumns, PackedRows
from checkpointd.store.base import PackedBlob
from checkpointd.testkit._support import file_key

PACK_A = "sandbox-packs/blake3/" + "a" * 64
PACK_B = "sandbox-packs/blake3/" + "b" * 64


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    if request.param == "memory":
        opened: Any = InMemoryCheckpointStore()
    elif request.param == "sqlite":
        opened = await SqliteCheckpointStore.open(str(tmp_path / "columns.db"))
    else:
        from checkpointd.store.postgres import open_postgres_store

        opened = await open_postgres_store(request.getfixturevalue("postgres_url"))
    yield opened
    await opened.aclose()


def _digest(n: int) -> bytes:
    return n.to_bytes(32, "big")


def _columns(pack: str, numbers: list[int], *, first_offset: int = 8) -> PackColumns:
    numbers = sorted(numbers)
    return PackColumns(
        pack,
        b"".join(_digest(n) for n in numbers),
        array("I", (first_offset + 100 * i for i in range(len(numbers)))),
        array("I", (40 + n for n in numbers)),
        array("I", (60 + n for n in numbers)),
        bytes(n % 2 for n in numbers),
    )


async def _append(store: Any, keys: list[int], rows: Any) -> str:
    async with await store.acquire_writer("t") as lease:
        head = await store.get_head("t")
        checkpoint = Checkpoint(
            id=new_uuid7(),
            thread_id="t",
            parent_checkpoint_id=head,
            created_at=1_000,
            files=tuple(FileEntry(f"f{n}", file_key(n), 60 + n) for n in keys),
        )
        await store.append(checkpoint, head, lease, packed_blobs=rows)
        return checkpoint.id


async def test_columns_record_what_the_same_rows_record(store: Any) -> None:
    a, b = _columns(PACK_A, list(range(1, 300))), _columns(PACK_B, [400, 401, 402])
    rows = PackedRows([a, b])
    as_objects = list(rows)
    assert len(rows) == len(as_objects) == 302 and rows[-1] == as_objects[-1]
    assert rows[0] == PackedBlob(file_key(1), PACK_A, 8, 41, 61, 1)
    # Keys 2 and 401 are not in the checkpoint: their rows are not recorded.
    referenced = [n for n in [*range(1, 300), 400, 402] if n != 2]
    await _append(store, referenced, rows)
    located = await store.locate_blobs([file_key(n) for n in [*range(1, 300), 400, 401, 402]])
    expected = {row.key: row for row in as_objects if row.key not in {file_key(2), file_key(401)}}
    assert {key: row for key, row in located.items() if row is not None} == expected
    assert located.get(file_key(2)) is None and located.get(file_key(401)) is None
    assert await store.list_packed_blobs(limit=1_000) == sorted(
        expected.values(), key=lambda row: row.key
    )


async def test_a_key_in_two_packs_gets_one_row(store: Any) -> None:
    rows = PackedRows([_columns(PACK_A, [1, 2]), _columns(PACK_B, [2, 3])])
    await _append(store, [1, 2, 3], rows)
    listed = await store.list_packed_blobs()
    assert [row.key for row in listed] == [file_key(1), file_key(2), file_key(3)]


async def test_columns_in_any_order_stand_for_their_rows(store: Any) -> None:
    good = _columns(PACK_A, [1, 2, 3])
    unsorted = PackColumns(
        PACK_A,
        _digest(3) + _digest(1) + _digest(3),
        good.offsets,
        good.lengths,
        good.raw_sizes,
        good.codecs,
    )
    await _append(store, [1, 3], PackedRows([unsorted]))
    listed = await store.list_packed_blobs()
    assert [(row.key, row.offset) for row in listed] == [(file_key(1), 108), (file_key(3), 208)]


async def test_a_large_cold_append_records_its_rows_and_a_refused_one_none(store: Any) -> None:
    """Above OFFLOAD_ENTRIES a parentless append encodes its keyframe while its
    transaction writes the index rows: what it records is the same, and an
    append refused there (its id taken) leaves no row and no stray error."""
    many = list(range(1, OFFLOAD_ENTRIES + 500))
    first = await _append(store, many, PackedRows([_columns(PACK_A, many)]))
    assert [e.blob_key for e in (await store.get(first)).files] == [file_key(n) for n in many]
    assert len(await store.list_packed_blobs(limit=10_000)) == len(many)
    others = list(range(20_000, 20_000 + OFFLOAD_ENTRIES + 500))
    async with await store.acquire_writer("u") as lease:
        taken = Checkpoint(
            id=first,
            thread_id="u",
            parent_checkpoint_id=None,
            created_at=1_000,
            files=tuple(FileEntry(f"f{n}", file_key(n), 60 + n) for n in others),
        )
        with pytest.raises(SandboxCheckpointDuplicateIdError):
            await store.append(
                taken, None, lease, packed_blobs=PackedRows([_columns(PACK_B, others)])
            )
    located = await store.locate_blobs([file_key(n) for n in others[:50]])
    assert all(row is None for row in located.values())
    assert len(await store.list_packed_blobs(limit=10_000)) == len(many)
    assert await store.get_head("u") is None


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        ({"pack": "sandbox-packs/blake3/xyz"}, "is not a sandbox-packs"),
        ({"offsets": array("I", [8, 7])}, "offset is out of range"),
        ({"lengths": array("I", [1, 1 << 31])}, "length or raw size is out of range"),
        ({"codecs": b"\x01\x07"}, "codec is unknown"),
        ({"digests": _digest(1)}, "need 64 digest bytes"),
        ({"raw_sizes": array("I", [1])}, "2 unsigned ints each"),
    ],
)
async def test_bad_columns_are_refused_and_change_nothing(
    store: Any, damage: dict[str, Any], why: str
) -> None:
    good = _columns(PACK_A, [1, 2])
    fields = {
        name: getattr(good, name)
        for name in ("pack", "digests", "offsets", "lengths", "raw_sizes", "codecs")
    }
    with pytest.raises(SandboxCheckpointInvalidEntryError) as refused:
        # Columns of different lengths cannot even be made.
        await _append(store, [1, 2], PackedRows([PackColumns(**{**fields, **damage})]))
    if not isinstance(store, InMemoryCheckpointStore):  # (its own row-by-row words)
        assert why in str(refused.value) and damage.get("pack", PACK_A) in str(refused.value)
    assert await store.get_head("t") is None
    assert await store.list_packed_blobs() == []


def test_a_writer_reports_its_rows_as_sorted_distinct_columns() -> None:
    writer = _native.PackWriter()
    blobs = [(bytes([n]) * 32, bytes([n]) * (10 + n)) for n in (5, 3, 9)]
    writer.extend([(digest.hex(), data) for digest, data in blobs])
    writer.extend([(blobs[0][0].hex(), blobs[0][1])])  # the same blob again
    _hex, pack, digests, offsets, lengths, raw_sizes, codecs = writer.finish_with_rows()
    columns = [array("I") for _ in range(3)]
    for column, data in zip(columns, (offsets, lengths, raw_sizes), strict=True):
        column.frombytes(data)
    assert digests == b"".join(sorted(digest for digest, _ in blobs))
    assert _native.digests_sorted_distinct(digests)
    assert list(columns[2]) == [13, 15, 19] and len(codecs) == 3
    trailer = _native.read_pack_trailer(pack, len(pack))
    first_frame = {entry[0]: entry[1] for entry in reversed(trailer)}
    assert list(columns[0]) == [first_frame[digest.hex()] for digest in sorted(d for d, _ in blobs)]
