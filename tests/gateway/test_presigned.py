"""Presigned reads: blob bytes straight from the bucket (SeaweedFS S3), not through
the gateway; only of keys the token may read; streamed when the bucket cannot sign."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from checkpointd.blobs import open_blobs
from checkpointd.errors import SandboxCheckpointError
from checkpointd.gateway.remote import RemoteBlobStore, RemoteCheckpointStore
from checkpointd.service.status import FORBIDDEN
from checkpointd.store.sqlite import SqliteCheckpointStore

from .conftest import Keys
from .test_scope import _checkpoint, _key


async def _stored(store: RemoteCheckpointStore, blobs: RemoteBlobStore, data: bytes) -> str:
    key = _key(data)
    await blobs.put(key, data)
    lease = await store.acquire_writer("t1")
    await store.append(_checkpoint("c1", "t1", data), None, lease)
    await lease.release()
    return key


@pytest.mark.s3
async def test_reads_come_from_the_bucket_not_the_gateway(
    s3_blobs: Any, tmp_path: Path, keys: Keys, gateway_factory: Any
) -> None:
    backing = await SqliteCheckpointStore.open(str(tmp_path / "s.db"))
    gateway = await gateway_factory(backing, s3_blobs)
    connection = gateway.connection(keys.mint(threads=["t1"]))
    store = await RemoteCheckpointStore.open(connection)
    blobs = RemoteBlobStore(connection)
    data = b"presigned bytes " * 10_000
    key = await _stored(store, blobs, data)
    assert gateway.servicer.bytes_in == len(data)  # uploads stream (and are hashed)
    assert await blobs.get(key) == data
    assert await blobs.get_many([key, key]) == [data, data]
    assert b"".join([c async for c in blobs.get_stream(key, 4096)]) == data
    assert gateway.servicer.bytes_out == 0
    # The gateway signs only what the token may read.
    other = _key(b"someone else's")
    await s3_blobs.put(other, b"someone else's")
    with pytest.raises(SandboxCheckpointError) as caught:
        await blobs.get(other)
    assert caught.value.code == FORBIDDEN
    await store.aclose()
    await backing.aclose()


async def test_a_bucket_that_cannot_sign_streams_through_the_gateway(
    tmp_path: Path, keys: Keys, gateway_factory: Any
) -> None:
    backing = await SqliteCheckpointStore.open(str(tmp_path / "s.db"))
    gateway = await gateway_factory(backing, open_blobs(f"file://{tmp_path / 'b'}"))
    connection = gateway.connection(keys.mint(threads=["t1"]))
    store = await RemoteCheckpointStore.open(connection)
    blobs = RemoteBlobStore(connection)
    data = b"streamed bytes"
    key = await _stored(store, blobs, data)
    assert await blobs.get(key) == data
    assert await blobs.get_many([key]) == [data]
    assert gateway.servicer.bytes_out == 2 * len(data)
    await store.aclose()
    await backing.aclose()
