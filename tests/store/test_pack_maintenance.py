"""PackMaintenance (``store.base``) on every store we ship: what the sweep and
``checkpointd migrate`` change in the pack index, and only under their rules."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from checkpointd.ids import new_uuid7
from checkpointd.model import Checkpoint, FileEntry
from checkpointd.store import InMemoryCheckpointStore, SqliteCheckpointStore
from checkpointd.store.base import PackedBlob, PackMaintenance
from checkpointd.testkit._support import file_key

PACK_A = "sandbox-packs/blake3/" + "a" * 64
PACK_B = "sandbox-packs/blake3/" + "b" * 64
PACK_C = "sandbox-packs/blake3/" + "c" * 64


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    if request.param == "memory":
        opened: Any = InMemoryCheckpointStore()
    elif request.param == "sqlite":
        opened = await SqliteCheckpointStore.open(str(tmp_path / "packs.db"))
    else:
        from checkpointd.store.postgres import open_postgres_store

        opened = await open_postgres_store(request.getfixturevalue("postgres_url"))
    assert isinstance(opened, PackMaintenance)
    yield opened
    await opened.aclose()


def _row(n: int, pack: str = PACK_A, offset: int | None = None) -> PackedBlob:
    return PackedBlob(file_key(n), pack, 8 + 100 * n if offset is None else offset, 50, 60, 1)


async def _append(store: Any, thread: str, keys: list[int], rows: list[PackedBlob]) -> str:
    async with await store.acquire_writer(thread) as lease:
        head = await store.get_head(thread)
        checkpoint = Checkpoint(
            id=new_uuid7(),
            thread_id=thread,
            parent_checkpoint_id=head,
            created_at=1_000,
            files=tuple(FileEntry(f"f{n}", file_key(n), 60) for n in keys),
        )
        await store.append(checkpoint, head, lease, packed_blobs=rows)
        return checkpoint.id


async def _drop_thread(store: Any, thread: str) -> None:
    async with await store.acquire_writer(thread) as lease:
        await store.delete_head(thread, await store.get_head(thread), lease)


async def _rows(store: Any) -> dict[str, PackedBlob]:
    return {row.key: row for row in await store.list_packed_blobs(limit=10_000)}


async def test_a_row_is_dropped_only_while_condemned_and_unreferenced(store: Any) -> None:
    await _append(store, "t", [1, 2, 3], [_row(1), _row(2), _row(3)])
    # Referenced: neither condemnable nor droppable.
    assert await store.condemn_blobs([file_key(1)], 60_000) == []
    assert await store.drop_packed_blobs([_row(1)]) == []
    await _drop_thread(store, "t")
    # Unreferenced but not condemned: kept.
    assert await store.drop_packed_blobs([_row(1)]) == []
    assert set(await store.condemn_blobs([file_key(1), file_key(2)], 60_000)) == {
        file_key(1),
        file_key(2),
    }
    # A row that is not the key's row any more (another pack, another offset): kept.
    assert await store.drop_packed_blobs([_row(2, PACK_B), _row(1, offset=7777)]) == []
    assert set(await store.drop_packed_blobs([_row(1), _row(2), _row(3)])) == {
        file_key(1),
        file_key(2),
    }
    assert set(await _rows(store)) == {file_key(3)}
    # The condemnation released: a dropped key is unknown, not present.
    await store.release_condemned([file_key(1), file_key(2)])
    assert await store.locate_blobs([file_key(1)]) == {}


async def test_an_expired_condemnation_drops_nothing(store: Any) -> None:
    await _append(store, "t", [1], [_row(1)])
    await _drop_thread(store, "t")
    assert await store.condemn_blobs([file_key(1)], 1) == [file_key(1)]
    await asyncio.sleep(0.05)
    assert await store.drop_packed_blobs([_row(1)]) == []
    assert set(await _rows(store)) == {file_key(1)}


async def test_a_switch_moves_only_rows_still_in_the_old_pack(store: Any) -> None:
    await _append(store, "t", [1, 2, 3], [_row(1), _row(2), _row(3, PACK_B)])
    moved = await store.switch_packed_blobs(
        PACK_A, [_row(1, PACK_C, 8), _row(2, PACK_C, 200), _row(3, PACK_C, 400)]
    )
    assert set(moved) == {file_key(1), file_key(2)}
    rows = await _rows(store)
    assert (rows[file_key(1)].pack, rows[file_key(1)].offset) == (PACK_C, 8)
    assert (rows[file_key(2)].pack, rows[file_key(2)].offset) == (PACK_C, 200)
    assert rows[file_key(3)].pack == PACK_B
    located = await store.locate_blobs([file_key(2)])
    assert located[file_key(2)] == rows[file_key(2)]


async def test_add_records_rows_for_referenced_keys_without_one(store: Any) -> None:
    await _append(store, "t", [1, 2], [_row(2)])  # 1 is a single object
    added = await store.add_packed_blobs([_row(1, PACK_B), _row(2, PACK_B), _row(9, PACK_B)])
    assert added == [file_key(1)]  # 2 has a row, 9 is referenced by nothing
    rows = await _rows(store)
    assert rows[file_key(1)].pack == PACK_B and rows[file_key(2)].pack == PACK_A
    assert file_key(9) not in rows
    assert await store.add_packed_blobs([_row(1, PACK_C)]) == []  # idempotent: first wins


async def test_a_retired_pack_gets_no_rows_while_retired(store: Any) -> None:
    await _append(store, "t", [1, 2, 3], [_row(1)])
    assert not await store.retire_pack(PACK_A, 60_000)  # a row points at it
    assert await store.retire_pack(PACK_C, 60_000)
    assert await store.retire_pack(PACK_C, 60_000)
    assert await store.switch_packed_blobs(PACK_A, [_row(1, PACK_C)]) == []
    assert {row.pack for row in (await _rows(store)).values()} == {PACK_A}
    # Migrate's add and a capture's append are not refused: their writers pin
    # the keys before the upload, which the sweep's condemnation respects.
    assert await store.add_packed_blobs([_row(2, PACK_C)]) == [file_key(2)]
    await _append(store, "u", [3], [_row(3, PACK_C)])
    assert (await _rows(store))[file_key(3)].pack == PACK_C
    # Once the retirement is over, a pack of those bytes may be pointed at again.
    assert await store.retire_pack(PACK_C, 60_000) is False  # rows point at C now
    fresh = "sandbox-packs/blake3/" + "d" * 64
    assert await store.retire_pack(fresh, 1)
    await asyncio.sleep(0.05)
    assert await store.switch_packed_blobs(PACK_A, [_row(1, fresh)]) == [file_key(1)]


async def test_invalid_rows_are_refused_naming_the_row(store: Any) -> None:
    from checkpointd.errors import SandboxCheckpointInvalidEntryError

    bad = PackedBlob("sandbox-files/blake3/nothex", PACK_A, 8, 1, 1, 1)
    for method in (store.drop_packed_blobs, store.add_packed_blobs):
        with pytest.raises(SandboxCheckpointInvalidEntryError, match="nothex"):
            await method([bad])
    with pytest.raises(SandboxCheckpointInvalidEntryError, match="nothex"):
        await store.switch_packed_blobs(PACK_A, [bad])


async def test_condemn_unpinned_skips_only_pins_and_condemnations(store: Any) -> None:
    """What a sweep asks before it deletes a pack no row points at: every key
    it holds, referenced or not, condemned unless a live pin or another
    condemnation holds it; a writer that pins a held key is told so."""
    await _append(store, "t", [1, 2], [_row(1)])  # 1 packed, 2 a single object
    writer = await store.acquire_writer("w")
    await store.pin_blobs([file_key(3)], writer)
    assert await store.condemn_blobs([file_key(1), file_key(2)], 60_000) == []  # referenced
    got = await store.condemn_unpinned_blobs(
        [file_key(2), file_key(1), file_key(3), file_key(4), "not-a-key"], 60_000
    )
    assert got == [file_key(2), file_key(1), file_key(4)]  # 3 is pinned
    assert await store.condemn_unpinned_blobs([file_key(4)], 60_000) == []  # held already
    assert await store.condemn_blobs([file_key(4)], 60_000) == []
    # A pin of a held key, referenced or not, is told it is condemned.
    assert await store.pin_blobs([file_key(2), file_key(4)], writer) == [
        file_key(2),
        file_key(4),
    ]
    # References and rows are untouched: a referenced key's row never drops.
    assert await store.drop_packed_blobs([_row(1)]) == []
    assert set(await _rows(store)) == {file_key(1)}
    await store.release_condemned([file_key(1), file_key(2), file_key(4)])
    assert await store.pin_blobs([file_key(2), file_key(4)], writer) == []
    # Pinned now: no longer condemnable; the pins go with the lease.
    assert await store.condemn_unpinned_blobs([file_key(2), file_key(4)], 60_000) == []
    await writer.release()
    assert await store.condemn_unpinned_blobs([file_key(3), file_key(4)], 60_000) == [
        file_key(3),
        file_key(4),
    ]


async def test_a_row_lives_while_its_digests_artifact_key_is_referenced(store: Any) -> None:
    """One row serves a digest's file and artifact keys (_packindex.row_key):
    an append naming only the artifact records it, and it is not dropped while
    the artifact is referenced."""
    from checkpointd.model import ARTIFACT_KEY_PREFIX, Artifact
    from checkpointd.store._packindex import artifact_twin

    artifact_key = artifact_twin(file_key(5))
    assert artifact_key.startswith(ARTIFACT_KEY_PREFIX)
    async with await store.acquire_writer("t") as lease:
        checkpoint = Checkpoint(
            id=new_uuid7(),
            thread_id="t",
            parent_checkpoint_id=None,
            created_at=1_000,
            files=(FileEntry("f1", file_key(1), 60),),
            artifacts=(Artifact("a1", "report.txt", "text/plain", 60, artifact_key, 1),),
        )
        # Rows of keys it does not name (9) are left out, as before.
        await store.append(checkpoint, None, lease, packed_blobs=[_row(5), _row(1), _row(9)])
    assert set(await _rows(store)) == {file_key(1), file_key(5)}
    assert await store.condemn_blobs([file_key(5)], 60_000) == [file_key(5)]
    assert await store.drop_packed_blobs([_row(5)]) == []  # the artifact uses it
    await store.release_condemned([file_key(5)])
    await _drop_thread(store, "t")
    assert await store.condemn_blobs([file_key(5)], 60_000) == [file_key(5)]
    assert await store.drop_packed_blobs([_row(5)]) == [file_key(5)]
