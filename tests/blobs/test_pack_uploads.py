"""A capture's pack session uploads full packs in the background (at most
PACK_UPLOADS at once) while it goes on packing: ``flush`` waits for them all and
raises what one raised; ``abandon`` stops them (a failed capture leaves none
running). On a real blob directory, the uploads held or failed at the pack PUT."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from pathlib import Path

import blake3
import pytest

from checkpointd.blobs import open_blobs
from checkpointd.blobs.packs import PACK_KEY_PREFIX, PACK_UPLOADS, PackedBlobStore
from checkpointd.store import InMemoryCheckpointStore


class HeldPacks:
    """A real blob directory whose pack PUTs wait for ``release`` (or fail)."""

    def __init__(self, root: Path, *, fail: bool = False) -> None:
        self.inner = open_blobs(f"file://{root}")
        self.url = self.inner.url
        self.fail = fail
        self.release = asyncio.Event()
        self.in_flight = 0
        self.most_in_flight = 0
        self.cancelled = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    async def put_many(self, items: Sequence[tuple[str, bytes]]) -> list[bool]:
        if not any(key.startswith(PACK_KEY_PREFIX) for key, _ in items):
            return list(await self.inner.put_many(items))
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await self.release.wait()
            if self.fail:
                raise OSError("the bucket refused the pack")
            return list(await self.inner.put_many(items))
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.in_flight -= 1


def _blobs(n: int) -> list[tuple[str, bytes]]:
    out = []
    for i in range(n):
        data = os.urandom(600) + i.to_bytes(4, "big")
        out.append(("sandbox-files/blake3/" + blake3.blake3(data).hexdigest(), data))
    return out


async def _fill(session: object, blobs: list[tuple[str, bytes]]) -> None:
    for start in range(0, len(blobs), 4):
        await session.put_many(blobs[start : start + 4])  # type: ignore[attr-defined]


async def test_full_packs_upload_while_packing_goes_on(tmp_path: Path) -> None:
    bucket = HeldPacks(tmp_path)
    packed = PackedBlobStore(bucket, InMemoryCheckpointStore(), threshold=1024, target=4096)  # type: ignore[arg-type]
    session = packed.capture_session()
    blobs = _blobs(40)  # ~6 blobs a pack: several full packs
    filling = asyncio.ensure_future(_fill(session, blobs))
    for _ in range(200):
        if bucket.in_flight == PACK_UPLOADS:
            break
        await asyncio.sleep(0.01)
    # Uploads run beside the packing, never more than PACK_UPLOADS at once.
    assert bucket.in_flight == PACK_UPLOADS and not filling.done()
    bucket.release.set()
    await filling
    await session.flush()
    assert bucket.most_in_flight == PACK_UPLOADS and bucket.in_flight == 0
    assert session.packs_written >= 6
    rows = list(session.rows)
    assert sorted(row.key for row in rows) == sorted(key for key, _ in blobs)
    read = await packed.read_packed(rows)
    assert dict(zip((row.key for row in rows), read, strict=True)) == dict(blobs)


async def test_a_failed_upload_fails_the_flush(tmp_path: Path) -> None:
    bucket = HeldPacks(tmp_path, fail=True)
    bucket.release.set()
    packed = PackedBlobStore(bucket, InMemoryCheckpointStore(), threshold=1024, target=4096)  # type: ignore[arg-type]
    session = packed.capture_session()
    await _fill(session, _blobs(20))
    with pytest.raises(OSError, match="refused the pack"):
        await session.flush()
    assert list(session.rows) == []


async def test_abandon_stops_the_uploads_still_running(tmp_path: Path) -> None:
    bucket = HeldPacks(tmp_path)
    packed = PackedBlobStore(bucket, InMemoryCheckpointStore(), threshold=1024, target=4096)  # type: ignore[arg-type]
    session = packed.capture_session()
    filling = asyncio.ensure_future(_fill(session, _blobs(40)))
    for _ in range(200):  # full packs held at their PUT, the packing waiting
        if bucket.in_flight == PACK_UPLOADS:
            break
        await asyncio.sleep(0.01)
    assert bucket.in_flight == PACK_UPLOADS
    await session.abandon()
    assert bucket.in_flight == 0 and bucket.cancelled == PACK_UPLOADS
    # Packing that goes on afterwards starts no upload.
    with pytest.raises(asyncio.CancelledError):
        await filling
    assert bucket.in_flight == 0
    assert await bucket.inner.list(PACK_KEY_PREFIX) == []  # no pack was written
