"""The batch operations of the BlobStore protocol: put_many, missing, get_many.

Every backend (memory and S3 take the protocol's defaults, a directory its native
batch) gives the same answers; a duck-typed store without the methods gets the
defaults through the module functions; a full disk is a clear error that leaves
no half-written blob.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import AsyncIterable, AsyncIterator, Iterator
from pathlib import Path

import pytest

from checkpointd.blobs import (
    BlobInfo,
    BlobNotFoundError,
    BlobStoreError,
    ObjectBlobStore,
    open_blobs,
)
from checkpointd.blobs import base as blob_base


def _key(n: int) -> str:
    return f"sandbox-files/blake3/{n:064x}"


async def test_put_many_missing_get_many(blobs: ObjectBlobStore) -> None:
    items = [(_key(n), bytes([n]) * n) for n in range(1, 40)]
    keys = [key for key, _ in items]
    assert await blobs.missing(keys) == keys
    assert await blobs.put_many(items[:10]) == [True] * 10
    # Already there: not written again; the rest are.
    assert await blobs.put_many(items) == [False] * 10 + [True] * 29
    assert await blobs.missing(keys + [_key(999)]) == [_key(999)]
    assert await blobs.get_many(list(reversed(keys))) == [data for _, data in reversed(items)]
    for key, data in items:
        assert await blobs.get(key) == data
    assert {info.key for info in await blobs.list("sandbox-files")} == set(keys)


async def test_get_many_of_a_missing_key_raises(blobs: ObjectBlobStore) -> None:
    await blobs.put_many([(_key(1), b"one")])
    with pytest.raises(BlobNotFoundError) as raised:
        await blobs.get_many([_key(1), _key(2)])
    assert raised.value.key == _key(2)


async def test_empty_batches(blobs: ObjectBlobStore) -> None:
    assert await blobs.put_many([]) == []
    assert await blobs.missing([]) == []
    assert await blobs.get_many([]) == []


class _DuckStore:
    """A BlobStore by shape only: single-key methods, no batch methods."""

    url = "duck://"

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    async def put(
        self, key: str, data: bytes | AsyncIterable[bytes], *, if_absent: bool = True
    ) -> bool:
        assert isinstance(data, bytes)
        if if_absent and key in self.data:
            return False
        self.data[key] = data
        return True

    async def get(self, key: str) -> bytes:
        if key not in self.data:
            raise BlobNotFoundError(key)
        return self.data[key]

    def get_stream(self, key: str, chunk_size: int = 1 << 20) -> AsyncIterator[bytes]:
        raise NotImplementedError

    async def head(self, key: str) -> BlobInfo | None:
        return BlobInfo(key, len(self.data[key]), 0) if key in self.data else None

    async def list(self, prefix: str) -> list[BlobInfo]:
        return []

    async def delete(self, key: str) -> None:
        self.data.pop(key, None)


async def test_module_functions_serve_a_store_without_batch_methods() -> None:
    store = _DuckStore()
    assert await blob_base.put_many(store, [(_key(1), b"a"), (_key(2), b"b")]) == [True, True]  # type: ignore[arg-type]
    assert await blob_base.put_many(store, [(_key(1), b"a")]) == [False]  # type: ignore[arg-type]
    assert await blob_base.missing(store, [_key(1), _key(3)]) == [_key(3)]  # type: ignore[arg-type]
    assert await blob_base.get_many(store, [_key(2), _key(1)]) == [b"b", b"a"]  # type: ignore[arg-type]


async def test_local_batch_leaves_only_complete_blobs(tmp_path: Path) -> None:
    blobs = open_blobs(f"file://{tmp_path / 'blobs'}")
    await blobs.put_many([(_key(n), os.urandom(100)) for n in range(50)])
    names = os.listdir(tmp_path / "blobs" / "sandbox-files" / "blake3")
    assert sorted(names) == sorted(f"{n:064x}" for n in range(50))


@pytest.fixture
def tiny_filesystem(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs: a real filesystem that runs out of space."""
    mount_point = tmp_path / "tiny"
    mount_point.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {result.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


async def test_enospc_is_a_clear_error_and_writes_nothing_partial(tiny_filesystem: Path) -> None:
    blobs = open_blobs(f"file://{tiny_filesystem / 'blobs'}")
    items = [(_key(n), os.urandom(64 << 10)) for n in range(8)]  # 512 KiB > 256 KiB
    with pytest.raises(BlobStoreError) as raised:
        await blobs.put_many(items)
    message = str(raised.value)
    assert str(tiny_filesystem / "blobs") in message
    assert "no space" in message.lower()
    blob_dir = tiny_filesystem / "blobs" / "sandbox-files" / "blake3"
    kept = {name: (blob_dir / name).read_bytes() for name in os.listdir(blob_dir)}
    by_name = {key.rsplit("/", 1)[1]: data for key, data in items}
    # Whatever is there is a complete blob (no staging file, no truncated bytes).
    assert all(by_name.get(name) == data for name, data in kept.items())
    # A later run with room succeeds.
    for name in kept:
        (blob_dir / name).unlink()
    assert await blobs.put_many(items[:2]) == [True, True]
