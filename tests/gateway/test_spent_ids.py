"""Spent request ids through the gateway: the remote store asks the gateway's
store (``SpentCheckpointIds``), so a request_id whose checkpoint was deleted by
any path, not only by a daemon that left a bucket marker, is refused through a
``serve --gateway`` sidecar as it is on a local store (real SQLite, real gRPC on
loopback, a real daemon process)."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

import grpc
import pytest

from checkpointd.blobs import open_blobs
from checkpointd.errors import SandboxCheckpointDuplicateIdError, SandboxCheckpointError
from checkpointd.gateway.remote import RemoteCheckpointStore
from checkpointd.ids import derive_request_id
from checkpointd.model import Checkpoint
from checkpointd.service.client import RpcError
from checkpointd.service.status import FORBIDDEN
from checkpointd.store.base import SpentCheckpointIds
from checkpointd.store.sqlite import SqliteCheckpointStore

from .conftest import Keys
from .process import start_sidecar


def _derived(thread: str, request_id: str) -> str:
    return derive_request_id(thread, request_id)


@pytest.fixture
async def backing(tmp_path: Path) -> Any:
    store = await SqliteCheckpointStore.open(str(tmp_path / "store.db"))
    yield store
    await store.aclose()


async def test_the_remote_store_reports_ids_spent_behind_the_gateway(
    backing: Any, keys: Keys, gateway_factory: Any, tmp_path: Path
) -> None:
    gateway = await gateway_factory(backing, open_blobs(f"file://{tmp_path / 'blobs'}"))
    # Deleted on the store directly (the Python API): no daemon, no bucket marker.
    derived, pruned, plain = _derived("t", "r-1"), _derived("t", "r-2"), str(uuid.uuid4())
    async with await backing.acquire_writer("t") as lease:
        await backing.append(Checkpoint(pruned, "t", None, 1), None, lease)
        await backing.append(Checkpoint(plain, "t", pruned, 2), pruned, lease)
        await backing.append(Checkpoint(derived, "t", plain, 3), plain, lease)
        await backing.delete_head("t", derived, lease)
        assert await backing.delete_checkpoints("t", 1, lease) == [pruned]

    remote = await RemoteCheckpointStore.open(gateway.connection(keys.mint(threads=["t"])))
    try:
        assert isinstance(remote, SpentCheckpointIds)
        asked = [plain, pruned, "x", derived, pruned]
        assert await remote.spent_checkpoint_ids(asked) == [pruned, derived]
        assert await remote.spent_checkpoint_ids([]) == []
        async with await remote.acquire_writer("t") as lease:
            with pytest.raises(SandboxCheckpointDuplicateIdError):
                await remote.append(Checkpoint(derived, "t", plain, 4), plain, lease)
    finally:
        await remote.aclose()

    # A token that cannot capture may not ask.
    reader = await RemoteCheckpointStore.open(
        gateway.connection(keys.mint(threads=["t"], ops=["restore", "list"]))
    )
    try:
        with pytest.raises(SandboxCheckpointError) as caught:
            await reader.spent_checkpoint_ids([derived])
        assert caught.value.code == FORBIDDEN
    finally:
        await reader.aclose()


@pytest.fixture
def short_tmp() -> Any:
    # A Unix socket's path must stay short: not under pytest's tmp_path.
    path = Path(tempfile.mkdtemp(prefix="cpd-gw-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def test_a_sidecar_refuses_a_request_id_deleted_outside_it(
    backing: Any, keys: Keys, gateway_factory: Any, short_tmp: Path
) -> None:
    gateway = await gateway_factory(backing, open_blobs(f"file://{short_tmp / 'blobs'}"))
    sidecar = start_sidecar(short_tmp, gateway.address, keys.mint(threads=["t-gw"]))
    workspace = sidecar.workspace
    try:
        # The gateway runs in this event loop: wait for the sidecar off it.
        await asyncio.to_thread(sidecar.wait_serving)
        (workspace / "a.txt").write_text("a")
        async with sidecar.client() as client:
            first = await client.capture("t-gw", request_id="r-gone")
        assert first.checkpoint.id == _derived("t-gw", "r-gone")  # from the request_id
        async with await backing.acquire_writer("t-gw") as lease:
            await backing.delete_head("t-gw", first.checkpoint.id, lease)
        (workspace / "a.txt").write_text("new content")
        async with sidecar.client() as client:
            with pytest.raises(RpcError) as caught:
                await client.capture("t-gw", request_id="r-gone")
            assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT, caught.value
            assert caught.value.metadata["field"] == "request_id"
            assert await client.get_head("t-gw") is None
    finally:
        await asyncio.to_thread(sidecar.stop)
