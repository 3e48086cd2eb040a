"""Presigned reads: blob bytes straight from the bucket (SeaweedFS S3), not through
the gateway; only of keys the token may read; streamed when the bucket cannot sign."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from checkpointd.blobs import open_blobs
from checkpointd.errors import SandboxCheckpointError
from checkpointd.gateway.remote import RemoteBlobStore, RemoteCheckpointStore
from checkpointd.service.status import FORBIDDEN
from checkpointd.store.sqlite import SqliteCheckpointStore
from checkpointd.v1 import gateway_pb2 as gpb

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


def _fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - the test's bucket
        return bytes(response.read())


@pytest.mark.s3
async def test_a_presigned_url_expires_with_the_token_that_asked(
    s3_blobs: Any, tmp_path: Path, keys: Keys, gateway_factory: Any
) -> None:
    backing = await SqliteCheckpointStore.open(str(tmp_path / "s.db"))
    gateway = await gateway_factory(backing, s3_blobs)
    token = keys.mint(threads=["t1"], ops=["capture", "restore"], ttl_s=3)
    connection = gateway.connection(token)
    store = await RemoteCheckpointStore.open(connection)
    try:
        data = b"short-lived " * 1000
        key = await _stored(store, RemoteBlobStore(connection), data)
        request = gpb.GatewayBlobSignRequest(keys=[key], expires_in_s=3600)
        reply = await connection.call("BlobSignGet", request, repeatable=True)
        [url] = reply.urls
        expires = int(parse_qs(urlsplit(url).query)["X-Amz-Expires"][0])
        assert 1 <= expires <= 3, url
        assert await asyncio.to_thread(_fetch, url) == data
        await asyncio.sleep(expires + 1.5)
        with pytest.raises(urllib.error.HTTPError) as caught:
            await asyncio.to_thread(_fetch, url)
        assert caught.value.code == 403
    finally:
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
