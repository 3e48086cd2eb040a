"""upload_artifact (docs/contract.md#data-model, docs/contract.md#capture) and the UUIDv7 ids it makes."""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import AsyncIterator

import blake3
import pytest

from checkpointd.artifacts import SPOOL_MEMORY_BYTES, upload_artifact
from checkpointd.blobs import ObjectBlobStore, open_blobs
from checkpointd.errors import (
    SandboxCheckpointInvalidArgumentError,
    SandboxCheckpointInvalidIdError,
)
from checkpointd.ids import new_uuid7
from checkpointd.model import Checkpoint
from checkpointd.store import open_store


@pytest.fixture(params=["memory", pytest.param("s3", marks=pytest.mark.s3)])
def blobs(request: pytest.FixtureRequest) -> ObjectBlobStore:
    if request.param == "memory":
        return open_blobs("memory://")
    return request.getfixturevalue("s3_blobs")


async def chunks(data: bytes, size: int) -> AsyncIterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


async def test_bytes_artifact(blobs: ObjectBlobStore) -> None:
    data = b"# report\nall green\n"
    artifact = await upload_artifact(blobs, "report.md", "text/markdown", data, now=lambda: 1234)
    assert artifact.blob_key == "sandbox-artifacts/blake3/" + blake3.blake3(data).hexdigest()
    assert (artifact.name, artifact.mime_type, artifact.size) == ("report.md", "text/markdown", 19)
    assert artifact.created_at == 1234
    assert uuid.UUID(artifact.artifact_id).version == 7
    assert await blobs.get(artifact.blob_key) == data


async def test_streamed_artifact_larger_than_the_memory_spool(blobs: ObjectBlobStore) -> None:
    data = random.Random(7).randbytes(SPOOL_MEMORY_BYTES + 3 * 1024 * 1024 + 17)
    artifact = await upload_artifact(
        blobs, "trace.bin", "application/octet-stream", chunks(data, 65_536)
    )
    assert artifact.size == len(data)
    assert artifact.blob_key == "sandbox-artifacts/blake3/" + blake3.blake3(data).hexdigest()
    assert await blobs.get(artifact.blob_key) == data


async def test_small_stream_and_empty_artifact(blobs: ObjectBlobStore) -> None:
    streamed = await upload_artifact(blobs, "a.txt", "text/plain", chunks(b"hello world", 3))
    direct = await upload_artifact(blobs, "b.txt", "text/plain", b"hello world")
    assert streamed.blob_key == direct.blob_key and streamed.size == 11
    assert streamed.artifact_id != direct.artifact_id
    empty = await upload_artifact(blobs, "empty", "text/plain", chunks(b"", 1))
    assert empty.size == 0
    assert empty.blob_key == "sandbox-artifacts/blake3/" + blake3.blake3(b"").hexdigest()
    assert await blobs.get(empty.blob_key) == b""


async def test_equal_bytes_are_not_uploaded_again() -> None:
    blobs = open_blobs("memory://")
    first = await upload_artifact(blobs, "x", "text/plain", b"same bytes")
    before = await blobs.head(first.blob_key)
    await asyncio.sleep(0.01)
    second = await upload_artifact(blobs, "y", "text/plain", chunks(b"same bytes", 4))
    assert second.blob_key == first.blob_key
    assert await blobs.head(first.blob_key) == before  # same upload time: not rewritten


async def test_defaults_and_given_id() -> None:
    blobs = open_blobs("memory://")
    before = time.time_ns() // 1_000_000
    artifact = await upload_artifact(blobs, "x", "text/plain", b"x", artifact_id="my-id")
    after = time.time_ns() // 1_000_000
    assert artifact.artifact_id == "my-id"
    assert before <= artifact.created_at <= after


async def test_artifact_is_accepted_by_a_store() -> None:
    store = await open_store("memory://")
    artifact = await upload_artifact(open_blobs("memory://"), "r", "text/plain", b"r")
    async with await store.acquire_writer("t") as lease:
        checkpoint = Checkpoint(
            id=new_uuid7(),
            thread_id="t",
            parent_checkpoint_id=None,
            created_at=1,
            artifacts=(artifact,),
        )
        await store.append(checkpoint, None, lease)
    stored = await store.get(checkpoint.id)
    assert stored is not None and stored.artifacts == (artifact,)
    assert [tuple(ref) for ref in await store.list_blob_references()] == [(artifact.blob_key, 1)]


@pytest.mark.parametrize(
    ("name", "mime_type"),
    [("", "text/plain"), ("n", ""), (None, "text/plain"), ("n", 5), ("bad\ud800", "text/plain")],
)
async def test_invalid_name_or_mime_type(name: object, mime_type: object) -> None:
    blobs = open_blobs("memory://")
    with pytest.raises(SandboxCheckpointInvalidArgumentError):
        await upload_artifact(blobs, name, mime_type, b"x")  # type: ignore[arg-type]
    assert await blobs.list("sandbox-artifacts/") == []


async def test_invalid_data_and_id() -> None:
    blobs = open_blobs("memory://")
    with pytest.raises(SandboxCheckpointInvalidArgumentError):
        await upload_artifact(blobs, "n", "text/plain", "text, not bytes")  # type: ignore[arg-type]

    async def bad_chunks() -> AsyncIterator[object]:
        yield b"ok"
        yield "not bytes"

    with pytest.raises(SandboxCheckpointInvalidArgumentError):
        await upload_artifact(blobs, "n", "text/plain", bad_chunks())  # type: ignore[arg-type]
    with pytest.raises(SandboxCheckpointInvalidIdError):
        await upload_artifact(blobs, "n", "text/plain", b"x", artifact_id="")
    assert await blobs.list("sandbox-artifacts/") == []
