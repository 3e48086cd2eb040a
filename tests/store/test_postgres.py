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
    # The short scheme names the same database.
    async with await open_store(postgres_url.replace("postgresql://", "postgres://", 1)) as same:
        assert isinstance(same, PostgresCheckpointStore)


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
    # puts U+FFFF before U+1F600 in some builds; the contract wants UTF-8 bytes.
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
    rows = await fetch(
        url,
        "SELECT (SELECT count(*) FROM checkpointd_lease_pins)"
        " + (SELECT count(*) FROM checkpointd_leases) AS n",
    )
    assert rows[0]["n"] == 0  # released leases leave no pins (nor lease ids) behind


async def test_condemn_waits_for_an_append_in_flight_of_a_pinning_thread(
    postgres_database_factory,
) -> None:
    # A capture pinned a key, then its lease ran out while its append was in
    # flight. The sweep must not judge the key before that append settles: it
    # waits on the thread's row, then sees the committed reference.
    url = postgres_database_factory()
    clock = ManualClock()
    options = {"now": clock, "lease_duration_ms": 100, "renew_after_ms": 25}
    async with (
        await open_postgres_store(url, **options) as capture,
        await open_postgres_store(url, **options) as sweep,
    ):
        lease = await capture.acquire_writer("t1")
        await capture.pin_blobs([file_key(1)], lease)
        clock.advance(500)  # the pin is dead from here on
        in_flight = await asyncpg.connect(url)
        try:
            append = in_flight.transaction()
            await append.start()
            await in_flight.execute(
                "SELECT 1 FROM checkpointd_threads WHERE thread_id = $1 FOR UPDATE", b"t1"
            )
            condemn = asyncio.create_task(sweep.condemn_blobs([file_key(1), file_key(2)], 50))
            await asyncio.sleep(0.3)
            assert not condemn.done(), "condemn judged the key while the append was in flight"
            await in_flight.execute(
                "INSERT INTO checkpointd_blob_counts (thread_id, key, refs) VALUES ($1, $2, 1)",
                b"t1",
                b"f" + bytes.fromhex(f"{1:064x}"),
            )
            await append.commit()
            assert await condemn == [file_key(2)]
        finally:
            await in_flight.close()


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


def chain_checkpoint(n: int, parent: str | None, thread: str = "t1") -> Checkpoint:
    """The n-th of a chain where each checkpoint changes 3 of 300 files (1%) and
    adds one conversation message."""
    files = [
        FileEntry(f"src/{i:04d}.py", file_key(i if i >= 3 else 1_000 * n + i), i)
        for i in range(300)
    ]
    conversation = [{"role": "user", "content": f"message {m}"} for m in range(n + 1)]
    return Checkpoint(
        id=f"c{n:03d}",
        thread_id=thread,
        parent_checkpoint_id=parent,
        created_at=n + 1,
        files=(DirEntry("src"), *files),
        conversation=tuple(conversation),
    )


async def stored_rows(url: str) -> dict[str, asyncpg.Record]:
    rows = await fetch(
        url,
        "SELECT convert_from(id, 'UTF8') AS id, convert_from(base_id, 'UTF8') AS base_id,"
        " thread_id, octet_length(document) AS size FROM checkpointd_checkpoints",
    )
    return {r["id"]: r for r in rows}


async def assert_counts_match(store: PostgresCheckpointStore, threads: list[str]) -> None:
    expected: dict[str, int] = {}
    for thread in threads:
        for checkpoint in await store.list(thread):
            for key in set(checkpoint.blob_keys()):
                expected[key] = expected.get(key, 0) + 1
    assert {r.key: r.references for r in await store.list_blob_references()} == expected


async def test_near_identical_checkpoints_are_stored_as_deltas(postgres_url: str) -> None:
    made: dict[str, Checkpoint] = {}
    async with await open_postgres_store(postgres_url) as store:
        lease = await store.acquire_writer("t1")
        parent = None
        for n in range(40):
            checkpoint = chain_checkpoint(n, parent)
            await store.append(checkpoint, parent, lease)
            made[checkpoint.id] = checkpoint
            parent = checkpoint.id
        rows = await stored_rows(postgres_url)
        keyframes = [r for r in rows.values() if r["base_id"] is None]
        deltas = [r for r in rows.values() if r["base_id"] is not None]
        assert 2 <= len(keyframes) <= 3  # a keyframe at least every MAX_DEPTH appends
        assert max(r["size"] for r in deltas) * 5 < min(r["size"] for r in keyframes)
        # Another store object (no cached contents) reads every one back exactly.
        async with await open_postgres_store(postgres_url) as reader:
            for checkpoint_id, checkpoint in made.items():
                assert await reader.get(checkpoint_id) == checkpoint
            assert await reader.list("t1") == list(made.values())

        # Pruning deletes the bases of the kept checkpoints: they become keyframes.
        deleted = await store.delete_checkpoints("t1", 5, lease)
        assert deleted == list(made)[:35]
        rows = await stored_rows(postgres_url)
        assert set(rows) == set(list(made)[35:])
        assert all(r["base_id"] is None or r["base_id"] in rows for r in rows.values())
        assert rows["c035"]["base_id"] is None
        for checkpoint_id in rows:
            assert await store.get(checkpoint_id) == made[checkpoint_id]
        await assert_counts_match(store, ["t1"])

        await store.delete_head("t1", "c039", lease)
        assert await store.get_head("t1") == "c038"
        assert await store.list("t1") == [made[f"c{n:03d}"] for n in range(35, 39)]
        await assert_counts_match(store, ["t1"])


async def test_a_reused_id_never_serves_a_stale_delta_base(postgres_url: str) -> None:
    async with await open_postgres_store(postgres_url) as store:
        lease = await store.acquire_writer("t1")
        first = chain_checkpoint(0, None)
        await store.append(first, None, lease)
        await store.delete_head("t1", first.id, lease)
        # Same id, different content: the store's cached content of the old row
        # must not be used as the base of the next delta.
        reused = chain_checkpoint(7, None)
        reused = Checkpoint(
            id=first.id,
            thread_id="t1",
            parent_checkpoint_id=None,
            created_at=1,
            files=reused.files,
            conversation=reused.conversation,
        )
        await store.append(reused, None, lease)
        child = chain_checkpoint(8, first.id)
        await store.append(child, first.id, lease)
        assert (await stored_rows(postgres_url))[child.id]["base_id"] == first.id
        async with await open_postgres_store(postgres_url) as reader:
            assert await reader.get(child.id) == child
            assert await reader.get(first.id) == reused


async def test_fork_of_a_delta_is_a_keyframe_of_its_own_thread(postgres_url: str) -> None:
    async with await open_postgres_store(postgres_url) as store:
        lease = await store.acquire_writer("t1")
        await store.append(chain_checkpoint(0, None), None, lease)
        await store.append(chain_checkpoint(1, "c000"), "c000", lease)
        other = await store.acquire_writer("t2")
        root = await store.fork_from_checkpoint("t1", "c001", "t2", "root", 50, other)
        rows = await stored_rows(postgres_url)
        assert rows["c001"]["base_id"] == "c000"
        assert rows["root"]["base_id"] is None
        # Deleting the source thread's checkpoints leaves the fork intact.
        await store.delete_head("t1", "c001", lease)
        await store.delete_head("t1", "c000", lease)
        assert await store.get("root") == root
        assert root.files == chain_checkpoint(1, None).files
        await assert_counts_match(store, ["t1", "t2"])
