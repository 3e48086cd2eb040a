"""Bit rot in a stored checkpoint row (SQLite: a bit flipped in the database
file; PostgreSQL: in the stored value) is DATA_LOSS naming the checkpoint, for
it and for every delta stored against it; the store names every damaged row;
and the thread goes on: an append on a damaged head stores a keyframe,
delete_head and prune remove damaged checkpoints, and the counts stay safe
(never below the contract's) until ``repair_blob_references`` sets them, which it
refuses while a damaged row is stored. Rows written before checksums (``CKD3``)
are still read, and their damage found."""

from __future__ import annotations

import sqlite3
import struct
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from checkpointd.errors import INVALID_BLOB, SandboxCheckpointDamagedError
from checkpointd.model import Checkpoint, FileEntry
from checkpointd.store import SqliteCheckpointStore
from checkpointd.testkit._support import file_key

from ..fixtures.bitrot import flip_in_postgres, flip_in_sqlite_file, sqlite_document

PARTS = ["checksum", "document", "manifest"]


class Damageable:
    """A store that can be damaged in place: ``flip`` closes what must be
    closed, flips one bit of a row, and reopens."""

    def __init__(self, kind: str, url: str, path: Path | None) -> None:
        self.kind, self.url, self.path = kind, url, path
        self.store: Any = None

    async def open(self) -> Any:
        if self.kind == "sqlite":
            assert self.path is not None
            self.store = await SqliteCheckpointStore.open(str(self.path))
        else:
            from checkpointd.store.postgres import open_postgres_store

            self.store = await open_postgres_store(self.url)
        return self.store

    async def flip(self, checkpoint_id: str, part: str) -> Any:
        if self.kind == "sqlite":
            assert self.path is not None
            await self.store.aclose()
            flip_in_sqlite_file(self.path, checkpoint_id, part)
            return await self.open()
        await flip_in_postgres(self.url, checkpoint_id, part)
        await self.store.aclose()  # (its cache holds the row as it was)
        return await self.open()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def damageable(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Damageable]:
    if request.param == "sqlite":
        made = Damageable("sqlite", "", tmp_path / "rot.db")
    else:
        made = Damageable("postgres", request.getfixturevalue("postgres_url"), None)
    await made.open()
    yield made
    await made.store.aclose()


def _files(keys: range | set[int]) -> tuple[FileEntry, ...]:
    return tuple(FileEntry(f"f{n:04d}", file_key(n), n + 1) for n in sorted(keys))


async def _chain(store: Any, thread: str, count: int, first: int = 0) -> dict[str, set[int]]:
    """``count`` checkpoints of 200 files each, one file changed each time:
    a keyframe, then deltas against it. Returns id -> its file keys."""
    lease = await store.acquire_writer(thread)
    made: dict[str, set[int]] = {}
    head: str | None = None
    keys = set(range(first, first + 200))
    for n in range(count):
        if n:
            keys = (keys - {first + n}) | {first + 1000 + n}
        checkpoint_id = f"{thread}-c{n}"
        await store.append(
            Checkpoint(
                id=checkpoint_id,
                thread_id=thread,
                parent_checkpoint_id=head,
                created_at=n + 1,
                files=_files(keys),
                conversation=tuple(f"message {i}" for i in range(n + 3)),
            ),
            head,
            lease,
        )
        made[checkpoint_id], head = set(keys), checkpoint_id
    await lease.release()
    return made


def _counts(*checkpoints: set[int]) -> dict[str, int]:
    """the contract's counts of the given checkpoints' keys."""
    counted: Counter[str] = Counter()
    for keys in checkpoints:
        counted.update(file_key(n) for n in keys)
    return dict(counted)


async def _stored_counts(store: Any) -> dict[str, int]:
    return {ref.key: ref.references for ref in await store.list_blob_references()}


async def _damage(
    read: Callable[[], Awaitable[Any]], checkpoint_id: str, damaged_id: str
) -> SandboxCheckpointDamagedError:
    with pytest.raises(SandboxCheckpointDamagedError) as caught:
        await read()
    error = caught.value
    assert error.code == INVALID_BLOB  # DATA_LOSS on the wire
    assert error.details == {"checkpoint_id": checkpoint_id, "damaged_checkpoint_id": damaged_id}
    assert checkpoint_id in error.message and damaged_id in error.message
    return error


@pytest.mark.parametrize("part", PARTS)
async def test_a_damaged_keyframe_is_data_loss_for_it_and_its_deltas(
    damageable: Damageable, part: str
) -> None:
    store = damageable.store
    made = await _chain(store, "t", 3)
    other = await _chain(store, "u", 1, first=5000)
    store = await damageable.flip("t-c0", part)

    error = await _damage(lambda: store.get("t-c0"), "t-c0", "t-c0")
    assert "checksum" in error.reason
    await _damage(lambda: store.get("t-c2"), "t-c2", "t-c0")
    await _damage(lambda: store.list("t"), "t-c0", "t-c0")
    # Other threads read as before.
    assert {e.blob_key for e in (await store.get("u-c0")).files} == {
        file_key(n) for n in other["u-c0"]
    }
    damaged = await store.damaged_checkpoints()
    assert [(d.checkpoint_id, d.thread_id, d.damaged_checkpoint_id) for d in damaged] == [
        ("t-c0", "t", "t-c0"),
        ("t-c1", "t", "t-c0"),
        ("t-c2", "t", "t-c0"),
    ]
    # The audit goes on around them: their keys show as stored counts above
    # the manifests' (a sweep keeps such keys), never below.
    audit = {count.key: count for count in await store.audit_blob_references()}
    for key, stored in _counts(*made.values(), *other.values()).items():
        assert audit[key].stored == stored
        assert audit[key].manifests <= stored
    with pytest.raises(SandboxCheckpointDamagedError):
        await store.repair_blob_references()  # it cannot count the damaged rows' keys


async def test_an_append_on_a_damaged_head_stores_a_keyframe(damageable: Damageable) -> None:
    store = damageable.store
    made = await _chain(store, "t", 3)
    store = await damageable.flip("t-c2", "manifest")
    lease = await store.acquire_writer("t")
    keys = made["t-c2"] | {7777}
    await store.append(
        Checkpoint(
            id="t-c3",
            thread_id="t",
            parent_checkpoint_id="t-c2",
            created_at=10,
            files=_files(keys),
            conversation=("after the damage",),
        ),
        "t-c2",
        lease,
    )
    assert await store.get_head("t") == "t-c3"
    assert {e.blob_key for e in (await store.get("t-c3")).files} == {file_key(n) for n in keys}
    assert [d.checkpoint_id for d in await store.damaged_checkpoints()] == ["t-c2"]
    if damageable.kind == "sqlite":
        assert damageable.path is not None
        with sqlite3.connect(damageable.path) as conn:
            row = conn.execute(
                "SELECT base_id, depth FROM checkpoints WHERE id = 't-c3'"
            ).fetchone()
        assert row == (None, 0)  # a keyframe: nothing read from the damaged row
    # the contract's counts, the damaged checkpoint's keys included (they were counted
    # when it was appended, and nothing it used was dropped).
    assert await _stored_counts(store) == _counts(*made.values(), keys)

    # Prune removes the damaged checkpoint and the ones before it; the keys
    # only it used stay counted once too often until the repair, never less.
    assert await store.delete_checkpoints("t", 1, lease) == ["t-c0", "t-c1", "t-c2"]
    assert await store.damaged_checkpoints() == []
    stored = await _stored_counts(store)
    expected = _counts(keys)
    assert all(stored.get(key, 0) >= n for key, n in expected.items())
    await store.repair_blob_references()
    assert await _stored_counts(store) == expected
    assert all(count.agrees for count in await store.audit_blob_references())
    await lease.release()


@pytest.mark.parametrize("damaged", ["head", "parent"])
async def test_delete_head_removes_a_damaged_checkpoint(
    damageable: Damageable, damaged: str
) -> None:
    store = damageable.store
    made = await _chain(store, "t", 3)
    store = await damageable.flip("t-c2" if damaged == "head" else "t-c1", "document")
    lease = await store.acquire_writer("t")
    await store.delete_head("t", "t-c2", lease)
    assert await store.get_head("t") == "t-c1"
    assert await _stored_counts(store) == _counts(made["t-c0"], made["t-c1"])
    if damaged == "head":
        assert await store.damaged_checkpoints() == []
        assert all(count.agrees for count in await store.audit_blob_references())
    else:
        # The damaged head goes too. It became the head with its keys unknown
        # (no runs), so they stay counted once too often until the repair.
        await store.delete_head("t", "t-c1", lease)
        assert await store.get_head("t") == "t-c0"
        assert await store.damaged_checkpoints() == []
        stored, expected = await _stored_counts(store), _counts(made["t-c0"])
        assert all(stored.get(key, 0) >= n for key, n in expected.items())
        await store.repair_blob_references()
        assert await _stored_counts(store) == expected
    await lease.release()


async def test_rows_written_before_checksums_are_read_and_their_damage_found(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.db"
    store = await SqliteCheckpointStore.open(str(path))
    made = await _chain(store, "t", 2)
    before = await store.get("t-c1")
    await store.aclose()
    # As the release before checksums wrote them: ``CKD3``, no checksum.
    with sqlite3.connect(path) as conn:
        for checkpoint_id in made:
            data = sqlite_document(path, checkpoint_id)
            (length,) = struct.unpack_from("<I", data, 4)
            old = b"CKD3" + struct.pack("<I", length) + data[40:]
            conn.execute("UPDATE checkpoints SET document = ? WHERE id = ?", (old, checkpoint_id))
    store = await SqliteCheckpointStore.open(str(path))
    assert await store.get("t-c1") == before
    assert await store.damaged_checkpoints() == []
    await store.aclose()

    data = bytearray(sqlite_document(path, "t-c0"))
    (length,) = struct.unpack_from("<I", data, 4)
    data[8 + length + 10] ^= 0x10  # in the keyframe's manifest section
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE checkpoints SET document = ? WHERE id = 't-c0'", (bytes(data),))
    store = await SqliteCheckpointStore.open(str(path))
    try:
        # Without a checksum the section is found damaged when it is inflated:
        # on first use (a read's manifest is inflated lazily), or by the audit.
        for checkpoint_id in made:
            read = await store.get(checkpoint_id)

            async def use(read: Checkpoint = read) -> None:
                list(read.files)

            error = await _damage(use, checkpoint_id, "t-c0")
            assert "does not decode" in error.reason
        assert [d.checkpoint_id for d in await store.damaged_checkpoints()] == ["t-c0", "t-c1"]
    finally:
        await store.aclose()
