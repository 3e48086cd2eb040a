"""A gateway enforces its tokens on every call (in-process gateway, real SQLite,
a real blob directory, real gRPC on loopback)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import blake3
import grpc
import pytest

from checkpointd.blobs import open_blobs
from checkpointd.errors import SandboxCheckpointError
from checkpointd.gateway.remote import RemoteBlobStore, RemoteCheckpointStore
from checkpointd.model import FILE_KEY_PREFIX, Checkpoint, DirEntry, FileEntry, Writer
from checkpointd.service.status import FORBIDDEN, UNAUTHENTICATED, error_info_from_metadata
from checkpointd.store.sqlite import SqliteCheckpointStore
from checkpointd.v1 import gateway_pb2 as gpb
from checkpointd.v1 import gateway_pb2_grpc as gpb_grpc

from .conftest import Keys


def _key(data: bytes) -> str:
    return FILE_KEY_PREFIX + blake3.blake3(data).hexdigest()


def _checkpoint(checkpoint_id: str, thread: str, data: bytes, parent: str | None = None):
    return Checkpoint(
        id=checkpoint_id,
        thread_id=thread,
        parent_checkpoint_id=parent,
        created_at=1,
        reason="automatic",
        files=(DirEntry("src"), FileEntry("src/a.txt", _key(data), len(data))),
    )


@pytest.fixture
async def world(tmp_path: Path, keys: Keys, gateway_factory: Any) -> Any:
    store = await SqliteCheckpointStore.open(str(tmp_path / "store.db"))
    blobs = open_blobs(f"file://{tmp_path / 'blobs'}")
    gateway = await gateway_factory(store, blobs)
    # The other tenant's thread, written directly (as its own sidecar would have).
    secret = b"tenant B's secret file"
    await blobs.put(_key(secret), secret)
    lease = await store.acquire_writer("tenant-b")
    await store.append(_checkpoint("b1", "tenant-b", secret), None, lease)
    await lease.release()
    yield gateway, keys, secret
    await store.aclose()


async def _sidecar(gateway: Any, token: str) -> tuple[RemoteCheckpointStore, RemoteBlobStore]:
    connection = gateway.connection(token)
    return await RemoteCheckpointStore.open(connection), RemoteBlobStore(connection)


async def test_a_sidecar_works_on_its_own_thread(world: Any) -> None:
    gateway, keys, _ = world
    store, blobs = await _sidecar(gateway, keys.mint(threads=["tenant-a"]))
    data = b"my file"
    assert await blobs.put(_key(data), data)
    lease = await store.acquire_writer("tenant-a", owner="sidecar-1")
    assert await store.pin_blobs([_key(data)], lease) == []
    await store.append(_checkpoint("a1", "tenant-a", data), None, lease)
    await lease.renew()
    await lease.release()
    assert await store.get_head("tenant-a") == "a1"
    assert [c.id for c in await store.list("tenant-a")] == ["a1"]
    assert await blobs.get(_key(data)) == data
    assert await blobs.get_many([_key(data)]) == [data]
    assert await blobs.missing([_key(data), _key(b"never")]) == [_key(b"never")]
    await store.aclose()


async def _denied(call: Any, code: grpc.StatusCode, reason: str) -> dict[str, str]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        result = call()
        if hasattr(result, "__aiter__"):
            async for _ in result:
                pass
        else:
            await result
    assert caught.value.code() == code, caught.value
    info = error_info_from_metadata(caught.value.trailing_metadata())
    assert info is not None and info.reason == reason and info.domain == "checkpointd"
    return dict(info.metadata)


async def test_every_call_outside_the_token_is_permission_denied(world: Any) -> None:
    gateway, keys, secret = world
    token = keys.mint(threads=["tenant-a"], ops=["capture", "restore", "list", "fork", "prune"])
    metadata = (("authorization", f"Bearer {token}"),)
    channel = grpc.aio.insecure_channel(gateway.address)
    stub = gpb_grpc.GatewayStub(channel)
    writer = gpb.GatewayWriter(thread_id="tenant-b", owner_token="x", fence=1)
    doc = _checkpoint("evil", "tenant-b", b"x", parent="b1")
    from checkpointd.codec import encode_checkpoint

    calls = {
        "Get": lambda: stub.Get(gpb.GatewayGetRequest(checkpoint_id="b1"), metadata=metadata),
        "List": lambda: stub.List(
            gpb.GatewayThreadRequest(thread_id="tenant-b"), metadata=metadata
        ),
        "GetHead": lambda: stub.GetHead(
            gpb.GatewayThreadRequest(thread_id="tenant-b"), metadata=metadata
        ),
        "Append": lambda: stub.Append(
            gpb.GatewayAppendRequest(document=encode_checkpoint(doc), writer=writer),
            metadata=metadata,
        ),
        "AcquireWriter": lambda: stub.AcquireWriter(
            gpb.GatewayAcquireWriterRequest(thread_id="tenant-b"), metadata=metadata
        ),
        "RenewWriter": lambda: stub.RenewWriter(writer, metadata=metadata),
        "ReleaseWriter": lambda: stub.ReleaseWriter(writer, metadata=metadata),
        "DeleteHead": lambda: stub.DeleteHead(
            gpb.GatewayDeleteHeadRequest(thread_id="tenant-b", checkpoint_id="b1", writer=writer),
            metadata=metadata,
        ),
        "DeleteCheckpoints": lambda: stub.DeleteCheckpoints(
            gpb.GatewayDeleteCheckpointsRequest(thread_id="tenant-b", keep=0, writer=writer),
            metadata=metadata,
        ),
        "ForkInto": lambda: stub.ForkFromCheckpoint(
            gpb.GatewayForkRequest(
                source_thread_id="tenant-a",
                source_checkpoint_id="a1",
                destination_thread_id="tenant-b",
                destination_checkpoint_id="f1",
                created_at=1,
                writer=writer,
            ),
            metadata=metadata,
        ),
        "ForkFrom": lambda: stub.ForkFromCheckpoint(
            gpb.GatewayForkRequest(
                source_thread_id="tenant-b",
                source_checkpoint_id="b1",
                destination_thread_id="tenant-a",
                destination_checkpoint_id="f2",
                created_at=1,
                writer=gpb.GatewayWriter(thread_id="tenant-a", owner_token="x", fence=1),
            ),
            metadata=metadata,
        ),
        "PinBlobs": lambda: stub.PinBlobs(
            gpb.GatewayPinRequest(keys=[_key(secret)], writer=writer), metadata=metadata
        ),
        "BlobGet": lambda: stub.BlobGet(
            gpb.GatewayBlobGetRequest(key=_key(secret)), metadata=metadata
        ),
        "BlobGetMany": lambda: stub.BlobGetMany(
            gpb.GatewayKeys(keys=[_key(secret)]), metadata=metadata
        ),
        # Sweep and check are the gateway operator's (admin tokens only).
        "ListBlobReferences": lambda: stub.ListBlobReferences(
            gpb.GatewayEmpty(), metadata=metadata
        ),
        "CondemnBlobs": lambda: stub.CondemnBlobs(
            gpb.GatewayCondemnRequest(keys=[_key(secret)], hold_ms=1000), metadata=metadata
        ),
        "ReleaseCondemned": lambda: stub.ReleaseCondemned(gpb.GatewayKeys(), metadata=metadata),
        "AuditBlobReferences": lambda: stub.AuditBlobReferences(
            gpb.GatewayAuditRequest(), metadata=metadata
        ),
        "RepairBlobReferences": lambda: stub.RepairBlobReferences(
            gpb.GatewayEmpty(), metadata=metadata
        ),
        "MarkBlobsMissing": lambda: stub.MarkBlobsMissing(gpb.GatewayKeys(), metadata=metadata),
        "BlobList": lambda: stub.BlobList(gpb.GatewayBlobListRequest(prefix=""), metadata=metadata),
        "BlobDelete": lambda: stub.BlobDelete(
            gpb.GatewayBlobKey(key=_key(secret)), metadata=metadata
        ),
    }
    try:
        for name, call in calls.items():
            details = await _denied(call, grpc.StatusCode.PERMISSION_DENIED, FORBIDDEN)
            assert (
                details.get("thread_id") == "tenant-b"
                or "operation" in details
                or (details.get("key") == _key(secret))
                or (details.get("checkpoint_id") == "b1" and "thread_id" not in details)
            ), (name, details)
    finally:
        await channel.close()
    # Nothing of tenant B changed.
    store = gateway.store
    assert await store.get_head("tenant-b") == "b1"
    assert await gateway.servicer.blobs.get(_key(secret)) == secret


async def test_bytes_that_do_not_hash_to_their_key_are_refused(world: Any) -> None:
    gateway, keys, _ = world
    store, blobs = await _sidecar(gateway, keys.mint(threads=["tenant-a"]))
    planted = _key(b"what another tenant's file holds")
    with pytest.raises(SandboxCheckpointError) as caught:
        await blobs.put(planted, b"poison")
    assert caught.value.code == "SANDBOX_SNAPSHOT_INVALID_BLOB"
    with pytest.raises(SandboxCheckpointError):
        await blobs.put_many([(planted, b"poison")])
    assert await gateway.servicer.blobs.head(planted) is None
    await store.aclose()


async def test_missing_expired_and_tampered_tokens_are_unauthenticated(world: Any) -> None:
    gateway, keys, _ = world
    channel = grpc.aio.insecure_channel(gateway.address)
    stub = gpb_grpc.GatewayStub(channel)
    request = gpb.GatewayThreadRequest(thread_id="tenant-a")
    expired = keys.mint(threads=["tenant-a"], ttl_s=10, now=time.time() - 7200)
    good = keys.mint(threads=["tenant-a"])
    tampered = good[:-3] + ("x" if good[-3] != "x" else "y") + good[-2:]
    try:
        for token, why in ((expired, "expired"), (tampered, "bad signature")):
            metadata = (("authorization", f"Bearer {token}"),)
            details = await _denied(
                lambda m=metadata: stub.GetHead(request, metadata=m),
                grpc.StatusCode.UNAUTHENTICATED,
                UNAUTHENTICATED,
            )
            assert details["why"] == why
        await _denied(
            lambda: stub.GetHead(request), grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED
        )
        # The remote store raises the same error (the sidecar maps it to UNAUTHENTICATED).
        remote = RemoteCheckpointStore(gateway.connection(expired))
        with pytest.raises(SandboxCheckpointError) as caught:
            await remote.get_head("tenant-a")
        assert caught.value.code == UNAUTHENTICATED
        await remote.aclose()
    finally:
        await channel.close()


async def test_a_prefix_token_reaches_forks_under_its_prefix(world: Any) -> None:
    gateway, keys, _ = world
    store, _blobs = await _sidecar(gateway, keys.mint(prefixes=["sb-1/"], ops=["capture", "fork"]))
    lease = await store.acquire_writer("sb-1/main")
    await store.append(_checkpoint("m1", "sb-1/main", b"v1"), None, lease)
    await lease.release()
    dest = await store.acquire_writer("sb-1/fork")
    forked = await store.fork_from_checkpoint("sb-1/main", "m1", "sb-1/fork", "f1", 2, dest)
    await dest.release()
    assert forked.thread_id == "sb-1/fork"
    with pytest.raises(SandboxCheckpointError) as caught:
        await store.acquire_writer("sb-10/main")
    assert caught.value.code == FORBIDDEN
    with pytest.raises(SandboxCheckpointError) as caught:
        await store.delete_checkpoints("sb-1/main", 1, Writer("sb-1/main", "x", 1))
    assert caught.value.code == FORBIDDEN  # no prune op
    await store.aclose()


async def test_list_threads_shows_only_the_tokens_threads(world: Any) -> None:
    gateway, keys, _ = world
    admin_store, _ = await _sidecar(gateway, keys.mint(all_threads=True, ops=["admin", "capture"]))
    for thread in ("sb-1/a", "sb-1/b", "sb-2/a", "t-own", "zz"):
        lease = await admin_store.acquire_writer(thread)
        await admin_store.append(_checkpoint(f"c-{thread}", thread, b"x"), None, lease)
        await lease.release()
    everything = [t.thread_id for t in await admin_store.list_threads(limit=100)]
    assert everything == ["sb-1/a", "sb-1/b", "sb-2/a", "t-own", "tenant-b", "zz"]
    store, _ = await _sidecar(gateway, keys.mint(threads=["t-own"], prefixes=["sb-1/"]))
    page = await store.list_threads(limit=2)
    assert [t.thread_id for t in page] == ["sb-1/a", "sb-1/b"]
    assert page[0].head_checkpoint_id == "c-sb-1/a" and page[0].checkpoint_count == 1
    rest = await store.list_threads(after="sb-1/b", limit=10)
    assert [t.thread_id for t in rest] == ["t-own"]
    await store.aclose()
    await admin_store.aclose()


async def test_a_draining_or_dead_gateway_sends_the_sidecar_to_the_next(
    world: Any, tmp_path: Path, gateway_factory: Any
) -> None:
    from checkpointd.gateway.remote import GatewayConnection

    gateway, keys, _ = world
    second = await gateway_factory(gateway.store, gateway.servicer.blobs)
    token = keys.mint(threads=["tenant-a"])
    connection = GatewayConnection([gateway.address, second.address], lambda: token, tls=False)
    store = await RemoteCheckpointStore.open(connection)
    gateway.servicer.draining = True  # SIGTERM'd: refuses new calls with DRAINING
    # Refused before anything happened: even an acquire is sent to the next gateway.
    lease = await store.acquire_writer("tenant-a")
    assert connection.addresses[connection._current] == second.address
    await store.append(_checkpoint("a1", "tenant-a", b"v"), None, lease)
    await second.stop()  # a dead gateway: the reads go back to the first
    gateway.servicer.draining = False
    assert await store.get_head("tenant-a") == "a1"
    await lease.renew()
    await lease.release()
    await store.aclose()


async def test_a_document_that_does_not_decode_is_invalid_argument(world: Any) -> None:
    gateway, keys, _ = world
    channel = grpc.aio.insecure_channel(gateway.address)
    stub = gpb_grpc.GatewayStub(channel)
    metadata = (("authorization", f"Bearer {keys.mint(threads=['tenant-a'])}"),)
    try:
        await _denied(
            lambda: stub.Append(gpb.GatewayAppendRequest(document=b"{not json"), metadata=metadata),
            grpc.StatusCode.INVALID_ARGUMENT,
            "SANDBOX_SNAPSHOT_INVALID_ARGUMENT",
        )
    finally:
        await channel.close()


async def test_open_store_takes_a_gateway_url(world: Any, tmp_path: Path) -> None:
    from checkpointd.store import open_store

    gateway, keys, _ = world
    token_file = tmp_path / "token"
    token_file.write_text(keys.mint(threads=["tenant-a"]) + "\n")
    url = f"checkpointd+gateway://{gateway.address}?tls=false&token_file={token_file}"
    store = await open_store(url)
    try:
        assert isinstance(store, RemoteCheckpointStore)
        assert await store.get_head("tenant-a") is None
        assert store.lease_duration_ms == 120_000
    finally:
        await store.aclose()
    with pytest.raises(SandboxCheckpointError, match="token_file"):
        await open_store(f"checkpointd+gateway://{gateway.address}?tls=false")


async def test_the_gateways_sweep_deletes_only_what_no_thread_uses(world: Any) -> None:
    import asyncio

    from checkpointd.gateway.server import sweep_periodically

    gateway, _keys, secret = world
    blobs = gateway.servicer.blobs
    orphan = b"uploaded, never referenced"
    await blobs.put(_key(orphan), orphan)
    job = asyncio.ensure_future(sweep_periodically(gateway.store, blobs, 0.05, 0))
    try:
        for _ in range(200):
            if await blobs.head(_key(orphan)) is None:
                break
            await asyncio.sleep(0.05)
    finally:
        job.cancel()
        await asyncio.gather(job, return_exceptions=True)
    assert await blobs.head(_key(orphan)) is None
    assert await blobs.get(_key(secret)) == secret  # tenant B's checkpoint uses it


def test_the_gateways_sweep_repack_threshold_is_checked_at_start(tmp_path: Path) -> None:
    from checkpointd.gateway.server import GatewayConfig

    def config(percent: int) -> GatewayConfig:
        return GatewayConfig(
            listen="127.0.0.1:0",
            store=f"sqlite://{tmp_path / 'db'}",
            blobs=f"file://{tmp_path / 'blobs'}",
            token_key=tmp_path / "key.pub",
            sweep_repack_below=percent,
        )

    for good in (0, 50, 100):
        config(good).check()
    for bad in (-1, 101):
        with pytest.raises(SandboxCheckpointError, match="repack_below_percent") as caught:
            config(bad).check()
        assert caught.value.details["field"] == "repack_below_percent"


async def test_missing_marks_are_seen_and_cleared_only_for_the_tokens_keys(world: Any) -> None:
    gateway, keys, secret = world
    mine = b"my file, marked missing by a check"
    await gateway.store.mark_blobs_missing([_key(mine), _key(secret)])
    store, blobs = await _sidecar(gateway, keys.mint(threads=["tenant-a"]))
    await blobs.put(_key(mine), mine)
    lease = await store.acquire_writer("tenant-a")
    await store.append(_checkpoint("a1", "tenant-a", mine), None, lease)
    await lease.release()
    assert await store.list_missing_blobs() == [_key(mine)]
    await store.clear_missing_blobs([_key(mine), _key(secret)])
    assert await gateway.store.list_missing_blobs() == [_key(secret)]  # tenant B's mark stays
    await store.aclose()
