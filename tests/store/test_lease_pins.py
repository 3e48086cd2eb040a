"""Pins kept by lease id (SQLite schema 4, PostgreSQL migration 7): a store
written with pins that repeat the thread and owner token in every row opens with
every pin, count and pack index row as it was; the live lease's pins still hold
against a sweep and go with its release, a dead lease's pins stay dead."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from checkpointd.model import Checkpoint, FileEntry
from checkpointd.store import SqliteCheckpointStore
from checkpointd.store.base import PackedBlob
from checkpointd.store.sqlite import SCHEMA_VERSION as SQLITE_SCHEMA_VERSION
from checkpointd.testkit import ManualClock
from checkpointd.testkit._support import file_key

PACK = "sandbox-packs/blake3/" + "ab" * 32
OPTIONS: dict[str, Any] = {"lease_duration_ms": 60_000, "renew_after_ms": 20_000}


def _checkpoint(keys: range) -> Checkpoint:
    files = tuple(FileEntry(f"f{n:04d}", file_key(n), 60) for n in keys)
    return Checkpoint("c1", "t", None, 1, files=files)


def _rows(keys: range) -> list[PackedBlob]:
    return [PackedBlob(file_key(n), PACK, 8 + 50 * i, 50, 60, 1) for i, n in enumerate(keys)]


async def _fill(store: Any) -> tuple[Any, dict[str, int], dict[str, Any]]:
    """A checkpoint of keys 1-20 (packed), then a live lease pinning 21-30."""
    lease = await store.acquire_writer("t")
    await store.pin_blobs([file_key(n) for n in range(1, 21)], lease)
    await store.append(_checkpoint(range(1, 21)), None, lease, packed_blobs=_rows(range(1, 21)))
    await lease.release()
    live = await store.acquire_writer("t")
    assert await store.pin_blobs([file_key(n) for n in range(21, 31)], live) == []
    counts = {r.key: r.references for r in await store.list_blob_references()}
    located = await store.locate_blobs([file_key(n) for n in range(1, 31)])
    return live, counts, located


async def _check_after(
    store: Any, live: Any, counts: dict[str, int], located: Any, clock: ManualClock
) -> None:
    assert {r.key: r.references for r in await store.list_blob_references()} == counts
    assert await store.locate_blobs([file_key(n) for n in range(1, 31)]) == located
    # The live lease's pins still hold: a sweep condemns only the unpinned key.
    wanted = [file_key(n) for n in range(21, 32)]
    assert await store.condemn_blobs(wanted, 1_000) == [file_key(31)]
    # The lease keeps pinning under its (migrated) id, then lets go of it all.
    assert await store.pin_blobs([file_key(32)], live) == []
    # (``live`` belongs to the store object closed before the migration.) Its
    # expiry lets the next acquire take over, which drops its pins.
    clock.advance(OPTIONS["lease_duration_ms"] + 1)
    taken = await store.acquire_writer("t")
    await taken.release()
    assert await store.condemn_blobs([file_key(n) for n in range(21, 24)], 1_000) == [
        file_key(21),
        file_key(22),
        file_key(23),
    ]


# ------------------------------------------------------------------------ SQLite


def _sqlite_pins(path: Path) -> list[tuple[Any, ...]]:
    raw = sqlite3.connect(str(path))
    try:
        return sorted(
            raw.execute(
                "SELECT p.key, l.thread_id, l.owner_token, l.fence FROM lease_pins p"
                " JOIN leases l ON l.id = p.lease_id"
            ).fetchall()
        )
    finally:
        raw.close()


def _downgrade_sqlite_to_version_3(path: Path, dead_pin: tuple[Any, ...]) -> None:
    """What schema 3 wrote: one ``blob_pins`` row per (key, thread, token, fence)."""
    raw = sqlite3.connect(str(path))
    with raw:
        raw.execute(
            "CREATE TABLE blob_pins (key BLOB NOT NULL, thread_id TEXT NOT NULL,"
            " owner_token TEXT NOT NULL, fence INTEGER NOT NULL,"
            " PRIMARY KEY (key, thread_id, owner_token, fence)) WITHOUT ROWID"
        )
        raw.execute("CREATE INDEX blob_pins_by_lease ON blob_pins (thread_id, owner_token, fence)")
        raw.execute(
            "INSERT INTO blob_pins SELECT p.key, l.thread_id, l.owner_token, l.fence"
            " FROM lease_pins p JOIN leases l ON l.id = p.lease_id"
        )
        raw.execute("INSERT INTO blob_pins VALUES (?, ?, ?, ?)", dead_pin)
        raw.execute("DROP TABLE lease_pins")
        raw.execute("DROP TABLE leases")
        raw.execute("UPDATE checkpointd_meta SET value = '3' WHERE name = 'schema_version'")
    raw.close()


async def test_a_version_3_sqlite_file_keeps_every_pin_count_and_index_row(
    tmp_path: Path,
) -> None:
    path = tmp_path / "v3.db"
    clock = ManualClock()
    store = await SqliteCheckpointStore.open(str(path), now=clock, **OPTIONS)
    live, counts, located = await _fill(store)
    await store.aclose()
    before = _sqlite_pins(path)
    assert len(before) == 10
    # A pin of a lease that is gone (a killed capture's, taken over since).
    dead = (b"f" + (40).to_bytes(32, "big"), "t", "gone-token", 1)
    _downgrade_sqlite_to_version_3(path, dead)

    store = await SqliteCheckpointStore.open(str(path), now=clock, **OPTIONS)
    try:
        assert _sqlite_pins(path) == sorted([*before, dead])
        raw = sqlite3.connect(str(path))
        version = raw.execute(
            "SELECT value FROM checkpointd_meta WHERE name = 'schema_version'"
        ).fetchone()
        tables = {row[0] for row in raw.execute("SELECT name FROM sqlite_master")}
        raw.close()
        assert version == (str(SQLITE_SCHEMA_VERSION),) and "blob_pins" not in tables
        # The dead lease's pin blocks nothing.
        assert await store.condemn_blobs([file_key(40)], 1_000) == [file_key(40)]
        await _check_after(store, live, counts, located, clock)
        assert _sqlite_pins(path) == [dead]  # the released lease left nothing behind
    finally:
        await store.aclose()


PACK = "sandbox-packs/blake3/" + "ab" * 32


async def _pins_a_pack(store: Any) -> None:
    """A pack key pins and condemns like a blob key (kind p; schema 5 / 8)."""
    lease = await store.acquire_writer("packer")
    assert await store.pin_blobs([PACK], lease) == []
    assert await store.condemn_unpinned_blobs([PACK], 1_000) == []
    await lease.release()
    assert await store.condemn_unpinned_blobs([PACK], 1_000) == [PACK]
    await store.release_condemned([PACK])


async def test_a_version_4_sqlite_file_opens_at_5_with_its_pins_and_pins_packs(
    tmp_path: Path,
) -> None:
    path = tmp_path / "v4.db"
    clock = ManualClock()
    store = await SqliteCheckpointStore.open(str(path), now=clock, **OPTIONS)
    live, counts, located = await _fill(store)
    await store.aclose()
    before = _sqlite_pins(path)
    raw = sqlite3.connect(str(path))
    with raw:
        raw.execute("UPDATE checkpointd_meta SET value = '4' WHERE name = 'schema_version'")
    raw.close()
    store = await SqliteCheckpointStore.open(str(path), now=clock, **OPTIONS)
    try:
        raw = sqlite3.connect(str(path))
        version = raw.execute(
            "SELECT value FROM checkpointd_meta WHERE name = 'schema_version'"
        ).fetchone()
        raw.close()
        assert version == (str(SQLITE_SCHEMA_VERSION),) == ("5",)
        assert _sqlite_pins(path) == before
        await _pins_a_pack(store)
        await _check_after(store, live, counts, located, clock)
    finally:
        await store.aclose()


async def test_pins_are_one_small_row_per_key(tmp_path: Path) -> None:
    """A pin row holds the key and the lease id, nothing else; the lease once."""
    path = tmp_path / "pins.db"
    async with await SqliteCheckpointStore.open(str(path)) as store:
        lease = await store.acquire_writer("a-rather-long-thread-id-" + "x" * 40)
        await store.pin_blobs([file_key(n) for n in range(500)], lease)
        await store.pin_blobs([file_key(n) for n in range(250, 750)], lease)
        raw = sqlite3.connect(str(path))
        try:
            assert raw.execute("SELECT count(*) FROM leases").fetchone() == (1,)
            assert raw.execute("SELECT count(*) FROM lease_pins").fetchone() == (750,)
            columns = [row[1] for row in raw.execute("PRAGMA table_info(lease_pins)")]
            assert columns == ["lease_id", "key"]
        finally:
            raw.close()
        await lease.release()


# ------------------------------------------------------------------------ PostgreSQL


@pytest.mark.postgres
async def test_a_version_6_postgres_database_keeps_every_pin_count_and_index_row(
    postgres_url: str,
) -> None:
    import asyncpg

    from checkpointd.store.postgres import SCHEMA_VERSION, open_postgres_store

    clock = ManualClock()
    store = await open_postgres_store(postgres_url, now=clock, **OPTIONS)
    live, counts, located = await _fill(store)
    await store.aclose()
    pins_sql = (
        "SELECT p.key, l.thread_id, l.owner_token, l.fence FROM checkpointd_lease_pins p"
        " JOIN checkpointd_leases l ON l.id = p.lease_id ORDER BY 1, 2, 3, 4"
    )
    dead = (b"f" + (40).to_bytes(32, "big"), b"t", "gone-token", 1)
    conn = await asyncpg.connect(postgres_url)
    try:
        before = [tuple(row) for row in await conn.fetch(pins_sql)]
        assert len(before) == 10
        await conn.execute(  # what migration 6 left: pins that repeat their lease
            "CREATE TABLE checkpointd_blob_pins (thread_id bytea NOT NULL,"
            " owner_token text NOT NULL, fence bigint NOT NULL, key bytea NOT NULL,"
            " PRIMARY KEY (thread_id, owner_token, fence, key));"
            " CREATE INDEX checkpointd_blob_pins_key ON checkpointd_blob_pins (key);"
            " INSERT INTO checkpointd_blob_pins SELECT l.thread_id, l.owner_token, l.fence,"
            " p.key FROM checkpointd_lease_pins p JOIN checkpointd_leases l ON l.id = p.lease_id;"
            " DROP TABLE checkpointd_lease_pins; DROP TABLE checkpointd_leases;"
            " UPDATE checkpointd_schema SET version = 6"
        )
        await conn.execute(
            "INSERT INTO checkpointd_blob_pins VALUES ($2, $3, $4, $1)",
            *dead,
        )
    finally:
        await conn.close()

    store = await open_postgres_store(postgres_url, now=clock, **OPTIONS)
    try:
        conn = await asyncpg.connect(postgres_url)
        try:
            after = [tuple(row) for row in await conn.fetch(pins_sql)]
            assert await conn.fetchval("SELECT version FROM checkpointd_schema") == SCHEMA_VERSION
            assert await conn.fetchval("SELECT to_regclass('checkpointd_blob_pins')") is None
        finally:
            await conn.close()
        assert after == sorted([*before, dead])
        assert await store.condemn_blobs([file_key(40)], 1_000) == [file_key(40)]
        await _check_after(store, live, counts, located, clock)
    finally:
        await store.aclose()


@pytest.mark.postgres
async def test_a_version_7_postgres_database_opens_at_8_and_pins_packs(
    postgres_url: str,
) -> None:
    import asyncpg

    from checkpointd.store.postgres import SCHEMA_VERSION, open_postgres_store

    store = await open_postgres_store(postgres_url, **OPTIONS)
    await store.aclose()
    conn = await asyncpg.connect(postgres_url)
    try:
        await conn.execute("COMMENT ON TABLE checkpointd_lease_pins IS NULL")
        await conn.execute("UPDATE checkpointd_schema SET version = 7")
    finally:
        await conn.close()
    store = await open_postgres_store(postgres_url, **OPTIONS)
    try:
        conn = await asyncpg.connect(postgres_url)
        try:
            assert await conn.fetchval("SELECT version FROM checkpointd_schema") == SCHEMA_VERSION
            assert SCHEMA_VERSION == 8
            comment = await conn.fetchval(
                "SELECT obj_description('checkpointd_lease_pins'::regclass, 'pg_class')"
            )
            assert comment is not None and "p (pack)" in comment
        finally:
            await conn.close()
        await _pins_a_pack(store)
    finally:
        await store.aclose()


async def test_a_large_append_leaves_no_large_wal_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The append checkpoints a WAL over the limit, the next write starts it over
    cut back to WAL_KEPT_BYTES: the store's bytes on disk are not its pages twice."""
    from checkpointd.store import _sqlite_db
    from checkpointd.store import sqlite as sqlite_store

    monkeypatch.setattr(_sqlite_db, "WAL_KEPT_BYTES", 64 << 10)
    monkeypatch.setattr(sqlite_store, "WAL_CHECKPOINT_BYTES", 256 << 10)
    path = tmp_path / "wal.db"
    keys = range(1, 20_001)
    async with await SqliteCheckpointStore.open(str(path)) as store:
        lease = await store.acquire_writer("t")
        await store.pin_blobs([file_key(n) for n in keys], lease)
        await store.append(_checkpoint(keys), None, lease, packed_blobs=_rows(keys))
        await lease.release()  # a write after the checkpoint: the WAL starts over
        wal = (tmp_path / "wal.db-wal").stat().st_size
        database = path.stat().st_size
        # What is left is the release's own pages (its 20,000 pins gone), not the
        # append's again.
        assert wal < database / 3, (wal, database)
        assert len(await store.list_blob_references()) == 20_000
