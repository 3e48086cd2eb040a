"""A large file restored over a live version that holds most of its chunks
is patched in place (docs/chunks.md): the same inode, only the changed chunks
written, the right bytes; never through a link to a file outside the
workspace. Real SQLite stores, blob directories and files."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from checkpointd.blobs import open_blobs
from checkpointd.blobs.base import BlobStore
from checkpointd.capture import CaptureOptions, capture_checkpoint
from checkpointd.errors import SandboxSnapshotError
from checkpointd.restore import RestoreOptions, restore_checkpoint
from checkpointd.store import open_store
from checkpointd.store.base import CheckpointStore

MIB = 1 << 20


@pytest.fixture
async def store(tmp_path: Path) -> CheckpointStore:
    async with await open_store(f"sqlite:///{tmp_path}/store.db") as opened:
        yield opened


@pytest.fixture
def bucket(tmp_path: Path) -> BlobStore:
    return open_blobs(f"file://{tmp_path}/blobs")


def noise(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


def scattered(data: bytes, seed: int, pages: int = 8) -> bytes:
    out = bytearray(data)
    rng = random.Random(seed)
    for _ in range(pages):
        at = rng.randrange(0, len(out) - 4096) & ~4095
        out[at : at + 4096] = rng.randbytes(4096)
    return bytes(out)


async def two_versions(ws: Path, store, bucket, data: Path, old: bytes, new: bytes):
    (ws / "big").write_bytes(old)
    first = await capture_checkpoint(ws, store, bucket, "t", CaptureOptions(data_dir=data))
    (ws / "big").write_bytes(new)
    second = await capture_checkpoint(ws, store, bucket, "t", CaptureOptions(data_dir=data))
    return first.checkpoint.id, second.checkpoint.id


async def restore(ws: Path, store, bucket, data: Path, checkpoint_id: str) -> None:
    await restore_checkpoint(
        ws,
        store,
        bucket,
        "t",
        RestoreOptions(checkpoint_id=checkpoint_id, data_dir=data),
    )


@pytest.mark.parametrize(
    "edit",
    [
        lambda old: scattered(old, 1),
        lambda old: old + noise(MIB, 2),  # grown
        lambda old: old[: len(old) * 3 // 4 + 1234],  # truncated
    ],
    ids=["scattered", "grown", "truncated"],
)
async def test_a_restore_patches_the_live_file_in_place(
    chunked, tmp_path: Path, store, bucket, edit
) -> None:
    ws, data = tmp_path / "ws", tmp_path / "data"
    ws.mkdir()
    old = noise(16 * MIB, 3)
    new = edit(old)
    first, second = await two_versions(ws, store, bucket, data, old, new)
    for want, checkpoint_id in [(old, first), (new, second), (old, first)]:
        inode = (ws / "big").stat().st_ino
        await restore(ws, store, bucket, data, checkpoint_id)
        assert (ws / "big").read_bytes() == want
        # Patched, not replaced: the inode the workspace had.
        assert (ws / "big").stat().st_ino == inode
    # The stat cache learned the patched file right: nothing changed since.
    again = await capture_checkpoint(ws, store, bucket, "t", CaptureOptions(data_dir=data))
    old_entry = next(e for e in (await store.get(first)).files if e.path == "big")
    assert next(e for e in again.checkpoint.files if e.path == "big") == old_entry


async def test_mode_and_mtime_follow_the_checkpoint(chunked, tmp_path: Path, store, bucket) -> None:
    ws, data = tmp_path / "ws", tmp_path / "data"
    ws.mkdir()
    old = noise(8 * MIB, 4)
    (ws / "big").write_bytes(old)
    os.chmod(ws / "big", 0o600)
    os.utime(ws / "big", ns=(1_600_000_000_000_000_000, 1_600_000_000_000_000_000))
    first = await capture_checkpoint(ws, store, bucket, "t", CaptureOptions(data_dir=data))
    (ws / "big").write_bytes(scattered(old, 5))
    os.chmod(ws / "big", 0o644)
    inode = (ws / "big").stat().st_ino
    await restore(ws, store, bucket, data, first.checkpoint.id)
    stat = (ws / "big").stat()
    assert (stat.st_ino, stat.st_mode & 0o777) == (inode, 0o600)
    assert stat.st_mtime_ns == 1_600_000_000_000_000_000
    assert (ws / "big").read_bytes() == old


async def test_a_file_linked_from_outside_is_replaced_not_patched(
    chunked, tmp_path: Path, store, bucket
) -> None:
    ws, data = tmp_path / "ws", tmp_path / "data"
    ws.mkdir()
    old = noise(8 * MIB, 6)
    new = scattered(old, 7)
    first, _second = await two_versions(ws, store, bucket, data, old, new)
    outside = tmp_path / "outside"
    os.link(ws / "big", outside)
    await restore(ws, store, bucket, data, first)
    assert (ws / "big").read_bytes() == old
    # The other name still holds what it held: its inode was never written.
    assert outside.read_bytes() == new
    assert (ws / "big").stat().st_ino != outside.stat().st_ino


async def test_a_shifted_file_is_rebuilt_whole(chunked, tmp_path: Path, store, bucket) -> None:
    """An insertion near the start moves every later chunk: too little stays
    where it is, and the file is built in staging and renamed in."""
    ws, data = tmp_path / "ws", tmp_path / "data"
    ws.mkdir()
    old = noise(8 * MIB, 8)
    new = old[:4096] + noise(4096, 9) + old[4096:]
    first, _second = await two_versions(ws, store, bucket, data, old, new)
    inode = (ws / "big").stat().st_ino
    await restore(ws, store, bucket, data, first)
    assert (ws / "big").read_bytes() == old
    assert (ws / "big").stat().st_ino != inode


async def test_a_file_written_after_the_plan_is_not_patched(
    chunked, tmp_path: Path, store, bucket
) -> None:
    """Code in the sandbox writes the file between the plan and the apply:
    the restore stops with the path, the file keeps the sandbox's bytes, and
    running the restore again finishes it."""
    ws, data = tmp_path / "ws", tmp_path / "data"
    ws.mkdir()
    old = noise(8 * MIB, 10)
    new = scattered(old, 11)
    first, _second = await two_versions(ws, store, bucket, data, old, new)
    written = bytearray(new)
    written[100:104] = b"EDIT"

    def write_edit() -> None:
        with open(ws / "big", "r+b") as f:
            f.seek(100)
            f.write(b"EDIT")

    async def sandbox_writes(_planned) -> None:
        write_edit()

    with pytest.raises(SandboxSnapshotError) as raised:
        await restore_checkpoint(
            ws,
            store,
            bucket,
            "t",
            RestoreOptions(checkpoint_id=first, data_dir=data, before_apply=sandbox_writes),
        )
    assert "big" in str(raised.value)
    assert (ws / "big").read_bytes() == bytes(written)
    await restore(ws, store, bucket, data, first)
    assert (ws / "big").read_bytes() == old
