"""One tenant cannot break another tenant's idempotent captures through the
gateway: the checkpoint id a request_id names is bound to its thread, so
another tenant can neither append a checkpoint under it nor mark it spent,
and no error names another tenant's thread. A real gateway (SQLite store,
SeaweedFS bucket), tenant A's real sidecar, tenant B as a hostile sandbox
holding its own token."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from checkpointd.errors import SandboxCheckpointError, SandboxCheckpointInvalidArgumentError
from checkpointd.gateway.remote import RemoteBlobStore, RemoteCheckpointStore
from checkpointd.ids import derive_request_id
from checkpointd.model import Checkpoint
from checkpointd.service.client import RpcError
from checkpointd.service.request_ids import SPENT_REQUEST_PREFIX
from checkpointd.service.status import FORBIDDEN
from checkpointd.store.sqlite import SqliteCheckpointStore

from .conftest import Keys
from .process import start_sidecar

pytestmark = [pytest.mark.s3]

THREAD_A, THREAD_B = "tenant-a/main", "tenant-b/main"
OPS = ("capture", "restore", "list", "fork", "prune")


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="cpd-gw-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def _hostile_b(gateway: Any, keys: Keys) -> tuple[RemoteCheckpointStore, RemoteBlobStore]:
    connection = gateway.connection(keys.mint(prefixes=["tenant-b/"], ops=OPS))
    return await RemoteCheckpointStore.open(connection), RemoteBlobStore(connection)


def _never_names_a(error: BaseException) -> None:
    assert THREAD_A not in str(error), error
    assert THREAD_A not in repr(getattr(error, "details", {})), error


async def test_another_tenant_cannot_take_or_spend_a_request_ids_checkpoint(
    keys: Keys, gateway_factory: Any, short_tmp: Path, s3_blobs: Any
) -> None:
    backing = await SqliteCheckpointStore.open(str(short_tmp / "store.db"))
    try:
        gateway = await gateway_factory(backing, s3_blobs)
        victim = derive_request_id(THREAD_A, "nightly-1")
        b_store, b_blobs = await _hostile_b(gateway, keys)
        try:
            # B appends, on its own thread, a checkpoint under A's future id.
            async with await b_store.acquire_writer(THREAD_B) as lease:
                with pytest.raises(SandboxCheckpointInvalidArgumentError) as caught:
                    await b_store.append(Checkpoint(victim, THREAD_B, None, 1), None, lease)
                assert caught.value.details["field"] == "checkpoint_id"
                _never_names_a(caught.value)
                # ... or forks into it.
                mine = str(uuid.uuid4())
                await b_store.append(Checkpoint(mine, THREAD_B, None, 2), None, lease)
            async with await b_store.acquire_writer("tenant-b/fork") as lease:
                with pytest.raises(SandboxCheckpointInvalidArgumentError):
                    await b_store.fork_from_checkpoint(
                        THREAD_B, mine, "tenant-b/fork", victim, 3, lease
                    )
            # B marks A's future id spent.
            with pytest.raises(SandboxCheckpointError) as marked:
                await b_blobs.put(SPENT_REQUEST_PREFIX + victim, b"deleted\n")
            assert marked.value.code == FORBIDDEN, marked.value
            _never_names_a(marked.value)
            assert await s3_blobs.head(SPENT_REQUEST_PREFIX + victim) is None
        finally:
            await b_store.aclose()

        # A's real sidecar captures with that request_id, and a retry replays it.
        token_a = keys.mint(prefixes=["tenant-a/"], ops=OPS)
        sidecar = start_sidecar(short_tmp, gateway.address, token_a, name="a")
        try:
            await asyncio.to_thread(sidecar.wait_serving)
            (sidecar.workspace / "notes.txt").write_text("tenant A's work")
            async with sidecar.client() as client:
                first = await client.capture(THREAD_A, request_id="nightly-1")
                again = await client.capture(THREAD_A, request_id="nightly-1")
                assert first.checkpoint.id == victim
                assert again.replayed and again.checkpoint.id == victim
                # B's checkpoint, asked for by id: refused without naming B's thread.
                with pytest.raises(RpcError) as refused:
                    await client.get_checkpoint(mine)
                assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED
                assert THREAD_B not in str(refused.value), refused.value
        finally:
            await asyncio.to_thread(sidecar.stop)
    finally:
        await backing.aclose()
