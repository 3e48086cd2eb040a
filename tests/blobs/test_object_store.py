"""One BlobStore suite over memory, a local directory and a real S3 server."""

from __future__ import annotations

import random
import time
from collections.abc import AsyncIterator
from pathlib import Path

import blake3
import pytest

from checkpointd.blobs import (
    BlobInfo,
    BlobNotFoundError,
    BlobStore,
    BlobStoreError,
    open_blobs,
)
from checkpointd.blobs.object_store import MULTIPART_PART_SIZE, ObjectBlobStore

MiB = 1024 * 1024
FILE_KEY = "sandbox-files/blake3/" + "ab" * 32


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _seeded_bytes(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


async def _chunks(data: bytes, chunk_size: int) -> AsyncIterator[bytes]:
    for start in range(0, len(data), chunk_size):
        yield data[start : start + chunk_size]


async def _read_all(blobs: ObjectBlobStore, key: str, chunk_size: int = 1 << 20) -> bytes:
    return b"".join([chunk async for chunk in blobs.get_stream(key, chunk_size)])


def _assert_upload_time(info: BlobInfo, before_ms: int, after_ms: int) -> None:
    # S3 reports whole seconds; allow for that truncation and a little skew.
    assert before_ms - 2_000 <= info.last_modified_ms <= after_ms + 1_000, (
        info,
        before_ms,
        after_ms,
    )


async def test_implements_the_protocol(blobs: ObjectBlobStore) -> None:
    assert isinstance(blobs, BlobStore)
    assert "://" in blobs.url


async def test_put_get_head_round_trip(blobs: ObjectBlobStore) -> None:
    data = _seeded_bytes(100_000, seed=1)
    before = _now_ms()
    assert await blobs.put(FILE_KEY, data) is True
    after = _now_ms()
    assert await blobs.get(FILE_KEY) == data
    info = await blobs.head(FILE_KEY)
    assert info is not None
    assert (info.key, info.size) == (FILE_KEY, len(data))
    _assert_upload_time(info, before, after)


async def test_empty_blob(blobs: ObjectBlobStore) -> None:
    assert await blobs.put("sandbox-files/empty", b"") is True
    assert await blobs.get("sandbox-files/empty") == b""
    assert await _read_all(blobs, "sandbox-files/empty") == b""
    info = await blobs.head("sandbox-files/empty")
    assert info is not None and info.size == 0


async def test_if_absent_keeps_the_existing_blob(blobs: ObjectBlobStore) -> None:
    assert await blobs.put(FILE_KEY, b"first") is True
    assert await blobs.put(FILE_KEY, b"second") is False
    assert await blobs.get(FILE_KEY) == b"first"
    streamed = _chunks(b"third", 2)
    assert await blobs.put(FILE_KEY, streamed) is False
    assert await blobs.get(FILE_KEY) == b"first"


async def test_overwrite_when_not_if_absent(blobs: ObjectBlobStore) -> None:
    assert await blobs.put(FILE_KEY, b"first") is True
    assert await blobs.put(FILE_KEY, b"second", if_absent=False) is True
    assert await blobs.get(FILE_KEY) == b"second"


async def test_small_stream_and_buffer_types(blobs: ObjectBlobStore) -> None:
    data = _seeded_bytes(300_000, seed=2)
    assert await blobs.put("k/stream", _chunks(data, 7_000)) is True
    assert await blobs.get("k/stream") == data
    assert await blobs.put("k/view", memoryview(data)) is True
    assert await blobs.put("k/array", bytearray(data)) is True
    assert await blobs.get("k/view") == await blobs.get("k/array") == data


async def test_get_stream_yields_chunks(blobs: ObjectBlobStore) -> None:
    data = _seeded_bytes(3 * MiB + 5, seed=3)
    await blobs.put(FILE_KEY, data)
    chunks = [chunk async for chunk in blobs.get_stream(FILE_KEY, chunk_size=MiB)]
    assert b"".join(chunks) == data
    assert all(len(chunk) >= MiB for chunk in chunks[:-1])


@pytest.mark.timeout(120)
async def test_large_streamed_blob_goes_up_in_parts(blobs: ObjectBlobStore) -> None:
    size = 12 * MiB + 123
    assert size > 2 * MULTIPART_PART_SIZE
    data = _seeded_bytes(size, seed=4)
    key = "sandbox-files/blake3/" + blake3.blake3(data).hexdigest()
    assert await blobs.put(key, _chunks(data, 256 * 1024)) is True
    info = await blobs.head(key)
    assert info is not None and info.size == size
    hasher = blake3.blake3()
    async for chunk in blobs.get_stream(key):
        hasher.update(chunk)
    assert "sandbox-files/blake3/" + hasher.hexdigest() == key

    # An existing large blob is not uploaded again, and the source stream is
    # closed after the first part instead of being read to the end.
    consumed = 0
    closed = False

    async def source() -> AsyncIterator[bytes]:
        nonlocal consumed, closed
        try:
            for start in range(0, size, MiB):
                consumed += MiB
                yield data[start : start + MiB]
        finally:
            closed = True

    assert await blobs.put(key, source()) is False
    assert closed
    assert consumed <= MULTIPART_PART_SIZE + MiB


async def test_missing_keys(blobs: ObjectBlobStore) -> None:
    with pytest.raises(BlobNotFoundError) as caught:
        await blobs.get("sandbox-files/missing")
    assert caught.value.key == "sandbox-files/missing"
    assert isinstance(caught.value, KeyError)
    stream = blobs.get_stream("sandbox-files/missing")
    with pytest.raises(BlobNotFoundError):
        await anext(stream)
    assert await blobs.head("sandbox-files/missing") is None
    await blobs.delete("sandbox-files/missing")  # not an error


async def test_delete(blobs: ObjectBlobStore) -> None:
    await blobs.put(FILE_KEY, b"x")
    await blobs.put("sandbox-files/other", b"y")
    await blobs.delete(FILE_KEY)
    assert await blobs.head(FILE_KEY) is None
    with pytest.raises(BlobNotFoundError):
        await blobs.get(FILE_KEY)
    assert [info.key for info in await blobs.list("sandbox-files/")] == ["sandbox-files/other"]
    await blobs.delete(FILE_KEY)  # twice is fine
    assert await blobs.put(FILE_KEY, b"again") is True  # a deleted key can come back


async def test_list_with_deep_prefixes_and_upload_times(blobs: ObjectBlobStore) -> None:
    keys = {
        "sandbox-files/blake3/" + "0" * 64: b"a",
        "sandbox-files/blake3/" + "f" * 64: b"bb",
        "sandbox-files/deep/er/and/deeper/key": b"ccc",
        "sandbox-artifacts/blake3/" + "1" * 64: b"dddd",
        "sandbox-filesX/not-under-the-prefix": b"e",
        "elsewhere": b"f",
    }
    before = _now_ms()
    for key, data in keys.items():
        await blobs.put(key, data)
    after = _now_ms()

    listed = await blobs.list("sandbox-files/")
    assert sorted(info.key for info in listed) == sorted(
        key for key in keys if key.startswith("sandbox-files/")
    )
    for info in listed:
        assert info.size == len(keys[info.key])
        _assert_upload_time(info, before, after)
    # Prefixes match whole path segments, with or without the trailing slash.
    assert sorted(i.key for i in await blobs.list("sandbox-files")) == sorted(i.key for i in listed)
    assert [i.key for i in await blobs.list("sandbox-files/deep/er")] == [
        "sandbox-files/deep/er/and/deeper/key"
    ]
    assert [i.key for i in await blobs.list("sandbox-artifacts/")] == [
        "sandbox-artifacts/blake3/" + "1" * 64
    ]
    assert await blobs.list("nothing-here/") == []


async def test_list_many_pages(blobs: ObjectBlobStore) -> None:
    # More keys than one listing page (1000): every page is collected.
    keys = [f"sandbox-files/many/{index:05d}" for index in range(1_100)]
    for key in keys:
        await blobs.put(key, b"")
    assert sorted(info.key for info in await blobs.list("sandbox-files/many")) == keys


async def test_local_failure_names_store_and_key(tmp_path: Path) -> None:
    blobs = open_blobs(f"file://{tmp_path}")
    await blobs.put("plain", b"a file")
    # "plain" is a file, so nothing can be stored beneath it: a real failure of
    # the local backend, not a not-found.
    with pytest.raises(BlobStoreError) as caught:
        await blobs.put("plain/child", b"x")
    assert str(tmp_path) in str(caught.value)
    assert "plain/child" in str(caught.value)
    assert not isinstance(caught.value, BlobNotFoundError)


@pytest.mark.s3
async def test_s3_without_conditional_put_falls_back_to_head(s3_server) -> None:
    blobs = open_blobs(
        s3_server.url("no-conditional-put"),
        endpoint=s3_server.endpoint,
        region=s3_server.region,
        access_key_id=s3_server.access_key_id,
        secret_access_key=s3_server.secret_access_key,
        conditional_put="disabled",
    )
    assert await blobs.put(FILE_KEY, b"first") is True
    assert await blobs.put(FILE_KEY, b"second") is False
    assert await blobs.get(FILE_KEY) == b"first"
    assert await blobs.put("sandbox-files/other", b"new") is True
