"""Faults of the PostgreSQL store: bad URLs and credentials fail at open, and a
database that goes away mid-operation gives a clear error and no half-written state."""

from __future__ import annotations

import asyncio
import socket

import asyncpg
import pytest

from checkpointd.errors import (
    STORE_UNAVAILABLE,
    SandboxCheckpointError,
    SandboxCheckpointInvalidArgumentError,
)
from checkpointd.model import Checkpoint, FileEntry
from checkpointd.store import open_instance_store, open_store
from checkpointd.store.postgres import open_postgres_store
from tests.fixtures.postgres import ROLE_PASSWORD, PostgresServer

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(90)]


def file_key(n: int) -> str:
    return f"sandbox-files/blake3/{n:064x}"


def make_checkpoint(checkpoint_id: str, parent: str | None, keys: range) -> Checkpoint:
    return Checkpoint(
        id=checkpoint_id,
        thread_id="t1",
        parent_checkpoint_id=parent,
        created_at=1,
        files=tuple(FileEntry(f"f{n}", file_key(n), 1) for n in keys),
    )


def unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def assert_unavailable(error: SandboxCheckpointError, where: str) -> None:
    assert error.code == STORE_UNAVAILABLE
    assert where in str(error), str(error)
    assert ROLE_PASSWORD not in str(error)


async def test_wrong_password_fails_at_open(postgres_server: PostgresServer) -> None:
    url = postgres_server.create_database()
    bad = url.replace(ROLE_PASSWORD, "not-the-password")
    database = url.rsplit("/", 1)[1]
    for opener in (open_store, open_instance_store):
        with pytest.raises(SandboxCheckpointError) as info:
            await opener(bad)
        assert_unavailable(info.value, f"checkpointd@127.0.0.1:{postgres_server.port}/{database}")
        assert "password authentication failed" in str(info.value)
        assert "not-the-password" not in str(info.value)


async def test_wrong_port_fails_at_open(postgres_server: PostgresServer) -> None:
    port = unused_port()
    url = postgres_server.url("nowhere", port=port)
    with pytest.raises(SandboxCheckpointError) as info:
        await open_store(url)
    assert_unavailable(info.value, f"127.0.0.1:{port}/nowhere")


async def test_missing_database_fails_at_open(postgres_server: PostgresServer) -> None:
    with pytest.raises(SandboxCheckpointError) as info:
        await open_store(postgres_server.url("no_such_database"))
    assert_unavailable(info.value, "/no_such_database")
    assert "does not exist" in str(info.value)


async def test_malformed_url_is_an_argument_error() -> None:
    with pytest.raises(SandboxCheckpointInvalidArgumentError):
        await open_store("postgresql://user@127.0.0.1:notaport/db")


async def test_server_stopping_mid_append_leaves_nothing_half_written(
    private_postgres_server: PostgresServer,
) -> None:
    server = private_postgres_server
    url = server.create_database()
    where = f"127.0.0.1:{server.port}/{url.rsplit('/', 1)[1]}"
    store = await open_postgres_store(url)
    try:
        lease = await store.acquire_writer("t1")
        await store.append(make_checkpoint("c1", None, range(0, 50)), None, lease)
        before = [tuple(r) for r in await store.list_blob_references()]

        # Hold the thread's row lock from elsewhere so the append is provably in
        # the middle of its transaction when the server goes away.
        blocker = await asyncpg.connect(url)
        blocking = blocker.transaction()
        await blocking.start()
        await blocker.execute(
            "SELECT 1 FROM checkpointd_threads WHERE thread_id = $1 FOR UPDATE", b"t1"
        )
        append = asyncio.create_task(
            store.append(make_checkpoint("c2", "c1", range(25, 5_000)), "c1", lease)
        )
        await asyncio.sleep(0.5)
        assert not append.done()
        await asyncio.to_thread(server.stop, "immediate")

        with pytest.raises(SandboxCheckpointError) as info:
            await append
        assert_unavailable(info.value, where)
        assert "append failed" in str(info.value)
        with pytest.raises(SandboxCheckpointError) as info:
            await store.get_head("t1")  # still down: a clear error, quickly
        assert_unavailable(info.value, where)
        blocker.terminate()

        await asyncio.to_thread(server.start)
        # A write first: the pool still holds connections that died with the
        # server; one that fails before its transaction began is replaced.
        c3 = make_checkpoint("c3", "c1", range(40, 90))
        await store.append(c3, "c1", lease)  # the lease lives in the database
        assert await store.get_head("t1") == "c3"
        assert await store.get("c2") is None
        assert [c.id for c in await store.list("t1")] == ["c1", "c3"]
        expected = dict(before)
        for key in set(c3.blob_keys()):
            expected[key] = expected.get(key, 0) + 1
        assert dict(tuple(r) for r in await store.list_blob_references()) == expected
    finally:
        await store.aclose()


async def test_first_write_after_a_restart_replaces_a_dead_pooled_connection(
    private_postgres_server: PostgresServer,
) -> None:
    server = private_postgres_server
    store = await open_postgres_store(server.create_database())
    try:
        lease = await store.acquire_writer("t1")
        await store.append(make_checkpoint("c1", None, range(3)), None, lease)
        # Stop and start without yielding to the event loop: the pooled connection
        # is dead but the pool has not noticed. The write fails before its
        # transaction begins, so it is safe to run on a fresh connection.
        server.stop("immediate")
        server.start()
        await store.append(make_checkpoint("c2", "c1", range(3, 6)), "c1", lease)
        assert [c.id for c in await store.list("t1")] == ["c1", "c2"]
    finally:
        await store.aclose()
