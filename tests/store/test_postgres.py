"""PostgreSQL store behaviour beyond the conformance suite: schema, clock, storage,
pin/condemn across store objects, and races between store objects on one database."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from checkpointd.errors import (
    SandboxCheckpointDuplicateIdError,
    SandboxCheckpointError,
    SandboxCheckpointWriterConflictError,
    SandboxCheckpointWriterLostError,
)
from checkpointd.model import Checkpoint, DirEntry, FileEntry
from checkpointd.store import open_instance_store, open_store
from checkpointd.store.base import BlobGuard, CheckpointStore, InstanceRecord
from checkpointd.store.postgres import (
    SCHEMA_VERSION,
    PostgresCheckpointStore,
    PostgresInstanceStore,
    open_postgres_store,
)
from checkpointd.testkit import ManualClock

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(60)]


def file_key(n: int) -> str:
    return f"sandbox-files/blake3/{n:064x}"


def make_checkpoint(
    checkpoint_id: str,
    thread_id: str = "t1",
    parent: str | None = None,
    created_at: int = 1,
    keys: range | list[int] = range(1, 3),
) -> Checkpoint:
    files = tuple(FileEntry(f"f{n}.txt", file_key(n), 10) for n in keys)
    return Checkpoint(
        id=checkpoint_id,
        thread_id=thread_id,
        parent_checkpoint_id=parent,
        created_at=created_at,
        files=(DirEntry("d"), *files),
    )


async def fetch(url: str, sql: str, *args: object) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(url)
    try:
        return list(await conn.fetch(sql, *args))
    finally:
        await conn.close()


async def test_open_store_by_url_gives_postgres_stores(postgres_url: str) -> None:
    store = await open_store(postgres_url)
    instances = await open_instance_store(postgres_url)
    try:
        assert isinstance(store, PostgresCheckpointStore)
        assert isinstance(store, CheckpointStore)
        assert isinstance(store, BlobGuard)
        assert isinstance(instances, PostgresInstanceStore)
    finally:
        await store.aclose()
        await instances.aclose()


async def test_concurrent_opens_migrate_once_and_reopen_keeps_data(postgres_url: str) -> None:
    stores = await asyncio.gather(*(open_postgres_store(postgres_url) for _ in range(6)))
    try:
        lease = await stores[0].acquire_writer("t1")
        await stores[1].append(make_checkpoint("c1"), None, lease)
    finally:
        for store in stores:
            await store.aclose()
    rows = await fetch(postgres_url, "SELECT version FROM checkpointd_schema")
    assert [r["version"] for r in rows] == [SCHEMA_VERSION]
    async with await open_postgres_store(postgres_url) as reopened:
        assert await reopened.get_head("t1") == "c1"
        assert [r.key for r in await reopened.list_blob_references()] == [
            file_key(1),
            file_key(2),
        ]


async def test_newer_schema_is_refused_at_open(postgres_url: str) -> None:
    await (await open_postgres_store(postgres_url)).aclose()
    await fetch(postgres_url, "UPDATE checkpointd_schema SET version = version + 1")
    with pytest.raises(SandboxCheckpointError, match="newer than this checkpointd") as info:
        await open_postgres_store(postgres_url)
    assert info.value.code == "SANDBOX_SNAPSHOT_STORE_UNAVAILABLE"


async def test_default_clock_is_the_database_server_clock(postgres_url: str) -> None:
    async with await open_postgres_store(
        postgres_url, lease_duration_ms=400, renew_after_ms=100
    ) as store:
        (db_now,) = [
            r[0]
            for r in await fetch(
                postgres_url, "SELECT (extract(epoch from clock_timestamp()) * 1000)::bigint"
            )
        ]
        lease = await store.acquire_writer("t1")
        assert db_now + 400 <= lease.expires_at <= db_now + 400 + 5_000
        with pytest.raises(SandboxCheckpointWriterConflictError):
            await store.acquire_writer("t1")
        await asyncio.sleep(0.5)
        with pytest.raises(SandboxCheckpointWriterLostError):
            await store.append(make_checkpoint("late"), None, lease)
        with pytest.raises(SandboxCheckpointWriterLostError):
            await lease.renew()
        successor = await store.acquire_writer("t1")
        assert successor.fence == lease.fence + 1
        assert await store.append(make_checkpoint("c1"), None, successor) == "c1"


async def test_stores_with_skewed_clocks_agree_through_the_database(
    postgres_database_factory,
) -> None:
    # Two sidecars on one database: neither passes ``now``, so both judge the
    # lease by the server's clock — whatever their own clocks say.
    url = postgres_database_factory()
    async with (
        await open_postgres_store(url, lease_duration_ms=300, renew_after_ms=100) as a,
        await open_postgres_store(url, lease_duration_ms=300, renew_after_ms=100) as b,
    ):
        lease = await a.acquire_writer("t1")
        with pytest.raises(SandboxCheckpointWriterConflictError):
            await b.acquire_writer("t1")
        await asyncio.sleep(0.4)
        taken = await b.acquire_writer("t1")
        with pytest.raises(SandboxCheckpointWriterLostError):
            await a.append(make_checkpoint("c1"), None, lease)
        assert await b.append(make_checkpoint("c1"), None, taken) == "c1"


async def test_manifest_is_one_compressed_row(postgres_url: str) -> None:
    async with await open_postgres_store(postgres_url) as store:
        lease = await store.acquire_writer("t1")
        big = make_checkpoint("c1", keys=range(1, 2001))
        await store.append(big, None, lease)
        assert await store.get("c1") == big
    rows = await fetch(
        postgres_url,
        "SELECT count(*) AS n, max(octet_length(document)) AS size FROM checkpointd_checkpoints",
    )
    assert rows[0]["n"] == 1
    # 2,000 entries of ~110 bytes of JSON each; zlib keeps it well below that.
    assert rows[0]["size"] < 2000 * 110 * 0.7


async def test_ids_with_nul_and_astral_characters_round_trip(postgres_url: str) -> None:
    async with await open_postgres_store(postgres_url) as store:
        thread = "t\x00😀"
        lease = await store.acquire_writer(thread)
        await store.append(make_checkpoint("a\x00b", thread), None, lease)
        await store.append(
            make_checkpoint("\uffff", thread, "a\x00b", created_at=2), "a\x00b", lease
        )
        assert [c.id for c in await store.list(thread)] == ["a\x00b", "\uffff"]
        assert await store.get_head(thread) == "\uffff"
    async with await open_instance_store(postgres_url) as instances:
        record = InstanceRecord("k\x00", "p", "sb\x00", thread, 5, latest_snapshot_id="\uffff")
        await instances.upsert(record)
        assert await instances.get("k\x00") == record
        assert await instances.get("k") is None


async def test_list_orders_by_utf8_bytes_not_the_database_collation(postgres_url: str) -> None:
    # The test server's default collation is ICU en-US, which sorts "a" < "B" and
    # puts U+FFFF before U+1F600 in some builds; SPEC wants UTF-8 bytes.
    ids = ["a", "B", "é", "😀", "\uffff", "Z", "_"]
    async with await open_postgres_store(postgres_url) as store:
        parent = None
        lease = await store.acquire_writer("t")
        for checkpoint_id in ids:
            await store.append(make_checkpoint(checkpoint_id, "t", parent), parent, lease)
            parent = checkpoint_id
        listed = [c.id for c in await store.list("t")]
        assert listed == sorted(ids, key=lambda i: i.encode("utf-8"))


async def test_pins_and_condemnations_are_shared_between_store_objects(
    postgres_database_factory,
) -> None:
    url = postgres_database_factory()
    clock = ManualClock()
    options = {"now": clock, "lease_duration_ms": 100, "renew_after_ms": 25}
    async with (
        await open_postgres_store(url, **options) as capture,
        await open_postgres_store(url, **options) as sweep,
    ):
        lease = await capture.acquire_writer("t1")
        assert await capture.pin_blobs([file_key(1), file_key(2)], lease) == []
        # Pinned by a live lease in another store object: not condemnable.
        assert await sweep.condemn_blobs([file_key(1), file_key(3)], 50) == [file_key(3)]
        # A pin on a condemned key reports it.
        assert await capture.pin_blobs([file_key(3)], lease) == [file_key(3)]
        clock.advance(60)  # the condemnation's hold ran out
        await lease.renew()
        assert await capture.pin_blobs([file_key(3)], lease) == []
        clock.advance(200)  # the lease expired: its pins are dead
        assert await sweep.condemn_blobs([file_key(1)], 50) == [file_key(1)]
        await sweep.release_condemned([file_key(1)])
        fresh = await capture.acquire_writer("t1")
        await capture.pin_blobs([file_key(1)], fresh)
        await capture.append(make_checkpoint("c1", keys=[1]), None, fresh)
        await fresh.release()
        clock.advance(1_000)
        assert await sweep.condemn_blobs([file_key(1)], 50) == []  # referenced now
    rows = await fetch(url, "SELECT count(*) AS n FROM checkpointd_blob_pins")
    assert rows[0]["n"] == 0  # released leases leave no pins behind


async def test_append_whose_lease_expires_under_it_is_refused(postgres_url: str) -> None:
    # The lease is current at the writer check but has expired by the time the
    # count rows are locked: a sweep may already have condemned those keys.
    ticks = iter(range(1_000, 10_000_000, 80))

    async with await open_postgres_store(
        postgres_url, now=lambda: next(ticks), lease_duration_ms=100, renew_after_ms=25
    ) as store:
        lease = await store.acquire_writer("t1")  # expires at 1_100; checks read 1_080
        with pytest.raises(SandboxCheckpointWriterLostError, match="expired while"):
            await store.append(make_checkpoint("c1"), None, lease)
        assert await store.get("c1") is None
        assert await store.list_blob_references() == []


async def test_same_id_appended_concurrently_in_two_threads(postgres_database_factory) -> None:
    url = postgres_database_factory()
    async with (
        await open_postgres_store(url) as a,
        await open_postgres_store(url) as b,
    ):
        for round_number in range(10):
            checkpoint_id = f"shared-{round_number}"
            la = await a.acquire_writer(f"ta{round_number}")
            lb = await b.acquire_writer(f"tb{round_number}")
            results = await asyncio.gather(
                a.append(make_checkpoint(checkpoint_id, f"ta{round_number}"), None, la),
                b.append(make_checkpoint(checkpoint_id, f"tb{round_number}"), None, lb),
                return_exceptions=True,
            )
            winners = [r for r in results if r == checkpoint_id]
            losers = [r for r in results if isinstance(r, SandboxCheckpointDuplicateIdError)]
            assert (len(winners), len(losers)) == (1, 1), results
        # Only the winners' keys are counted: 10 checkpoints × 2 keys, shared.
        assert [(r.key, r.references) for r in await a.list_blob_references()] == [
            (file_key(1), 10),
            (file_key(2), 10),
        ]


async def test_concurrent_acquires_hand_out_one_lease(postgres_database_factory) -> None:
    url = postgres_database_factory()
    stores = [await open_postgres_store(url) for _ in range(4)]
    try:
        results = await asyncio.gather(
            *(store.acquire_writer("t1") for store in stores), return_exceptions=True
        )
        leases = [r for r in results if not isinstance(r, BaseException)]
        conflicts = [r for r in results if isinstance(r, SandboxCheckpointWriterConflictError)]
        assert (len(leases), len(conflicts)) == (1, 3), results
        assert leases[0].fence == 1
    finally:
        for store in stores:
            await store.aclose()


async def test_closed_store_raises_store_unavailable(postgres_url: str) -> None:
    store = await open_postgres_store(postgres_url)
    await store.aclose()
    with pytest.raises(SandboxCheckpointError) as info:
        await store.get_head("t1")
    assert info.value.code == "SANDBOX_SNAPSHOT_STORE_UNAVAILABLE"
    assert "127.0.0.1" in str(info.value)
