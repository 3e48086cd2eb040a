"""Large files stored as content-defined chunks (docs/chunks.md): round trips
around every size boundary, edits that store only the chunks near them,
secrets across chunk boundaries, counts, check, and damaged chunks.

Real SQLite stores, real blob directories, real files."""

from __future__ import annotations

import os
import random
import sqlite3
from pathlib import Path

import pytest

from checkpointd import chunks
from checkpointd.blobs import open_blobs
from checkpointd.blobs.base import BlobStore
from checkpointd.blobs.packs import packed_blobs
from checkpointd.capture import CaptureOptions, capture_checkpoint
from checkpointd.check import check_store
from checkpointd.errors import SandboxSnapshotError
from checkpointd.model import FileEntry
from checkpointd.restore import RestoreOptions, restore_checkpoint
from checkpointd.service.convert import entry_to_proto
from checkpointd.store import open_store
from checkpointd.store.base import CheckpointStore

from .conftest import settle_before_record, write_tree

MIN, AVG, MAX = 16 << 10, 64 << 10, 256 << 10
MIB = 1 << 20


def noise(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


@pytest.fixture
async def store(tmp_path: Path) -> CheckpointStore:
    async with await open_store(f"sqlite:///{tmp_path}/store.db") as opened:
        yield opened


@pytest.fixture
def bucket(tmp_path: Path) -> BlobStore:
    return open_blobs(f"file://{tmp_path}/blobs")


def _sparse(path: Path, size: int, at: int, data: bytes) -> None:
    with open(path, "wb") as f:
        f.truncate(size)
        f.seek(at)
        f.write(data)


def _read_at(path: Path, at: int, n: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(at)
        return f.read(n)


def _stored_objects(root: Path) -> list[bytes]:
    return [
        Path(folder, name).read_bytes() for folder, _dirs, names in os.walk(root) for name in names
    ]


def entry_of(result, path: str) -> FileEntry:
    found = next(e for e in result.checkpoint.files if e.path == path)
    assert isinstance(found, FileEntry)
    return found


def chunk_keys(entry: FileEntry) -> set[str]:
    return {chunk.key for chunk in chunks.iter_chunks(entry.chunks)}


async def capture(ws: Path, store, bucket, data: Path, **kwargs):
    return await capture_checkpoint(ws, store, bucket, "t", CaptureOptions(data_dir=data, **kwargs))


@pytest.mark.parametrize(
    "size",
    [0, MIN - 1, MIN, AVG, MAX, MAX + 1, MIB - 1, MIB, MIB + 1, 3 * MIB + 12345],
)
async def test_files_round_trip_around_every_boundary(
    chunked, tmp_path: Path, store, bucket, size: int
) -> None:
    ws, out = tmp_path / "ws", tmp_path / "out"
    ws.mkdir()
    (ws / "f").write_bytes(noise(size, size))
    result = await capture(ws, store, bucket, tmp_path / "data")
    entry = entry_of(result, "f")
    # Files above the threshold (1 MiB) are stored as chunks, the rest whole.
    assert bool(entry.chunks) == (size > MIB)
    if entry.chunks:
        lengths = [c.length for c in chunks.iter_chunks(entry.chunks)]
        assert sum(lengths) == size
        assert all(MIN <= n <= MAX for n in lengths[:-1])
    await restore_checkpoint(out, store, bucket, "t", RestoreOptions(data_dir=tmp_path / "data2"))
    assert (out / "f").read_bytes() == (ws / "f").read_bytes()


async def test_a_multi_gib_sparse_file_round_trips_and_stays_sparse(
    chunked, tmp_path: Path, store, bucket
) -> None:
    ws, out = tmp_path / "ws", tmp_path / "out"
    ws.mkdir()
    size = 3 << 30
    _sparse(ws / "disk.img", size, 1 << 30, b"data in the middle" * 1000)
    result = await capture(ws, store, bucket, tmp_path / "data")
    entry = entry_of(result, "disk.img")
    # The zeros are one chunk key, stored once.
    assert len(chunk_keys(entry)) < 10
    assert result.stats.bytes_uploaded < 2 * MIB
    await restore_checkpoint(out, store, bucket, "t", RestoreOptions(data_dir=tmp_path / "data2"))
    restored = out / "disk.img"
    assert restored.stat().st_size == size
    assert restored.stat().st_blocks * 512 < 64 * MIB  # holes stay holes
    assert _read_at(restored, 1 << 30, 18) == b"data in the middle"


@pytest.mark.parametrize("edit", ["in_place", "append", "truncate", "insert"])
async def test_an_edit_stores_only_the_chunks_near_it(
    chunked, tmp_path: Path, store, bucket, edit: str
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    original = noise(16 * MIB, 7)
    (ws / "big").write_bytes(original)
    first = await capture(ws, store, bucket, tmp_path / "data")
    before = chunk_keys(entry_of(first, "big"))
    middle = len(original) // 2
    changed = {
        "in_place": original[:middle] + b"X" * 4096 + original[middle + 4096 :],
        "append": original + noise(MIB, 8),
        "truncate": original[: middle + 12345],
        "insert": original[:middle] + noise(4096, 9) + original[middle:],
    }[edit]
    (ws / "big").write_bytes(changed)
    second = await capture(ws, store, bucket, tmp_path / "data")
    after = chunk_keys(entry_of(second, "big"))
    new = after - before
    # CDC re-syncs: a few chunks around the edit are new, the rest are shared.
    assert len(new) <= {"in_place": 3, "append": 20, "truncate": 1, "insert": 3}[edit], len(new)
    assert second.stats.bytes_uploaded <= len(new) * MAX
    await restore_checkpoint(
        ws, store, bucket, "t", RestoreOptions(checkpoint_id=first.checkpoint.id)
    )
    assert (ws / "big").read_bytes() == original
    await restore_checkpoint(
        ws, store, bucket, "t", RestoreOptions(checkpoint_id=second.checkpoint.id)
    )
    assert (ws / "big").read_bytes() == changed


async def test_secrets_across_chunk_boundaries_are_zeroed_and_written_back(
    chunked, tmp_path: Path, store, bucket
) -> None:
    ws, out = tmp_path / "ws", tmp_path / "out"
    ws.mkdir()
    secret = b"sk-live-0123456789abcdef"
    data = bytearray(noise(4 * MIB, 11))
    # A secret every 10,007 bytes: many straddle a chunk boundary.
    for at in range(0, len(data) - len(secret), 10_007):
        data[at : at + len(secret)] = secret
    (ws / "f").write_bytes(bytes(data))
    result = await capture(ws, store, bucket, tmp_path / "data", secrets=[secret])
    entry = entry_of(result, "f")
    assert entry.chunks and len(entry.secrets) == len(range(0, len(data) - len(secret), 10_007))
    # No stored object holds the secret.
    assert not any(secret in stored for stored in _stored_objects(tmp_path / "blobs"))
    await restore_checkpoint(
        out, store, bucket, "t", RestoreOptions(data_dir=tmp_path / "d2", secrets=[secret])
    )
    assert (out / "f").read_bytes() == bytes(data)


async def test_counts_and_check_see_every_chunk(chunked, tmp_path: Path, store, bucket) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a").write_bytes(noise(3 * MIB, 21))
    (ws / "b").write_bytes(noise(3 * MIB, 21))  # the same bytes: the same chunks
    result = await capture(ws, store, bucket, tmp_path / "data")
    keys = chunk_keys(entry_of(result, "a"))
    assert keys == chunk_keys(entry_of(result, "b"))
    counted = {key for key, _count in await store.list_blob_references()}
    assert keys <= counted
    assert entry_of(result, "a").blob_key not in counted  # the whole file is no blob
    report = await check_store(store, packed_blobs(bucket, store), read_data=True)
    assert report.findings == [], report.findings


async def test_a_warm_cache_into_an_empty_store_uploads_what_the_store_lacks(
    chunked, tmp_path: Path, bucket
) -> None:
    """The chunk cache says an earlier capture stored the file's chunks, so
    the scan does not feed them: the capture finds the ones the new store
    lacks and reads them from the file, checked."""
    ws, out = tmp_path / "ws", tmp_path / "out"
    ws.mkdir()
    (ws / "big").write_bytes(noise(5 * MIB, 31))
    async with await open_store(f"sqlite:///{tmp_path}/one.db") as one:
        await capture(ws, one, bucket, tmp_path / "data")
    other = open_blobs(f"file://{tmp_path}/other")
    async with await open_store(f"sqlite:///{tmp_path}/two.db") as two:
        again = await capture(ws, two, other, tmp_path / "data")
        assert again.stats.bytes_uploaded == 5 * MIB
        await restore_checkpoint(out, two, other, "t", RestoreOptions(data_dir=tmp_path / "d2"))
    assert (out / "big").read_bytes() == (ws / "big").read_bytes()


async def test_a_chunked_file_the_stat_cache_vouches_for_is_not_read_again(
    chunked, tmp_path: Path, store, bucket
) -> None:
    """The chunk cache is committed with the stat cache: the next capture
    takes the file's hash and chunk list without reading it, and a capture
    leaves no pending cache behind."""
    ws, data = tmp_path / "ws", tmp_path / "data"
    write_tree(ws, {"big": noise(5 * MIB, 41)})
    first = await capture(ws, store, bucket, data)
    assert first.stats.files_hashed == 1
    again = await capture(ws, store, bucket, data)
    assert (again.stats.files_hashed, again.stats.files_reused) == (0, 1)
    assert entry_of(again, "big").chunks == entry_of(first, "big").chunks
    names = sorted(p.name for p in data.rglob("*") if p.is_file() and "pending" in p.name)
    assert names == []


async def test_a_restored_chunked_file_is_not_read_by_the_next_capture(
    chunked, tmp_path: Path, store, bucket
) -> None:
    ws, out = tmp_path / "ws", tmp_path / "out"
    write_tree(ws, {"big": noise(5 * MIB, 43)})
    first = await capture(ws, store, bucket, tmp_path / "data")
    options = RestoreOptions(data_dir=tmp_path / "d2", progress=settle_before_record)
    await restore_checkpoint(out, store, bucket, "t", options)
    again = await capture_checkpoint(
        out, store, bucket, "t2", CaptureOptions(data_dir=tmp_path / "d2")
    )
    assert (again.stats.files_hashed, again.stats.files_reused) == (0, 1)
    assert entry_of(again, "big").chunks == entry_of(first, "big").chunks


def _one_pack(tmp_path: Path) -> Path:
    packs = [p for p in (tmp_path / "blobs").rglob("*") if p.is_file() and "packs" in str(p)]
    assert len(packs) == 1, packs
    return packs[0]


@pytest.mark.parametrize("damage", ["corrupt", "missing"])
async def test_a_damaged_chunk_fails_the_restore_and_changes_nothing(
    chunked, tmp_path: Path, store, bucket, damage: str
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "big").write_bytes(noise(3 * MIB, 41))
    first = await capture(ws, store, bucket, tmp_path / "data")
    (ws / "big").write_bytes(noise(3 * MIB, 42))
    (ws / "other").write_bytes(b"keep me")
    pack = _one_pack(tmp_path)
    if damage == "missing":
        pack.unlink()
    else:
        raw = bytearray(pack.read_bytes())
        raw[len(raw) // 3] ^= 0xFF
        pack.write_bytes(bytes(raw))
    live = (ws / "big").read_bytes()
    with pytest.raises(SandboxSnapshotError) as raised:
        await restore_checkpoint(
            ws, store, bucket, "t", RestoreOptions(checkpoint_id=first.checkpoint.id)
        )
    code = {"corrupt": "SANDBOX_SNAPSHOT_INVALID_BLOB", "missing": "SANDBOX_SNAPSHOT_MISSING_BLOB"}
    assert raised.value.code == code[damage]
    key = raised.value.details["key"]
    assert key in chunk_keys(entry_of(first, "big"))
    assert (ws / "big").read_bytes() == live
    assert (ws / "other").read_bytes() == b"keep me"
    assert not [p for p in ws.iterdir() if p.name.startswith(".checkpointd")]


@pytest.mark.parametrize("damage", ["truncated", "missing"])
async def test_a_long_pack_read_from_a_local_dir_fails_whole_on_a_damaged_pack(
    chunked, tmp_path: Path, store, bucket, damage: str
) -> None:
    """A file's chunks lie side by side in one pack, read in one long read
    (natively, from a blob directory): a pack cut short names a chunk it
    lacks, a pack gone names a chunk too, and the target is left as it was."""
    ws, out = tmp_path / "ws", tmp_path / "out"
    ws.mkdir()
    (ws / "big").write_bytes(noise(6 * MIB, 71))
    first = await capture(ws, store, bucket, tmp_path / "data")
    pack = _one_pack(tmp_path)
    if damage == "missing":
        pack.unlink()
    else:
        os.truncate(pack, pack.stat().st_size // 2)
    out.mkdir()
    (out / "mine").write_bytes(b"keep me")
    with pytest.raises(SandboxSnapshotError) as raised:
        await restore_checkpoint(out, store, bucket, "t", RestoreOptions(data_dir=tmp_path / "d2"))
    code = {
        "truncated": "SANDBOX_SNAPSHOT_INVALID_BLOB",
        "missing": "SANDBOX_SNAPSHOT_MISSING_BLOB",
    }
    assert raised.value.code == code[damage], raised.value
    assert raised.value.details["key"] in chunk_keys(entry_of(first, "big"))
    assert sorted(p.name for p in out.iterdir()) == ["mine"]


async def test_chunked_and_whole_checkpoints_both_stay_readable(
    tmp_path: Path, store, bucket
) -> None:
    """A checkpoint taken with chunking off (whole-file blobs) restores under
    chunking, and the next capture stores the file as chunks."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "big").write_bytes(noise(3 * MIB, 51))
    whole = await capture(ws, store, bucket, tmp_path / "data")
    assert not entry_of(whole, "big").chunks
    chunks.configure(chunks.ChunkSettings())
    (ws / "big").write_bytes(noise(3 * MIB, 52))
    chunked_result = await capture(ws, store, bucket, tmp_path / "data")
    assert entry_of(chunked_result, "big").chunks
    await restore_checkpoint(
        ws, store, bucket, "t", RestoreOptions(checkpoint_id=whole.checkpoint.id)
    )
    assert (ws / "big").read_bytes() == noise(3 * MIB, 51)
    await restore_checkpoint(
        ws, store, bucket, "t", RestoreOptions(checkpoint_id=chunked_result.checkpoint.id)
    )
    assert (ws / "big").read_bytes() == noise(3 * MIB, 52)


async def test_entry_details_carry_the_chunk_count(chunked, tmp_path: Path, store, bucket) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "big").write_bytes(noise(3 * MIB, 61))
    (ws / "small").write_bytes(b"x")
    result = await capture(ws, store, bucket, tmp_path / "data")
    big = entry_of(result, "big")
    assert entry_to_proto(big).chunk_count == chunks.chunk_count(big.chunks) > 1
    assert entry_to_proto(entry_of(result, "small")).chunk_count == 0


async def test_a_small_edit_stores_a_small_manifest_delta(
    chunked, tmp_path: Path, store, bucket
) -> None:
    """The chunk list lives in the file's manifest row; after an insertion the
    new row is stored as a patch of the old one, not whole again."""
    ws = tmp_path / "ws"
    ws.mkdir()
    original = noise(64 * MIB, 12)
    (ws / "big").write_bytes(original)
    first = await capture(ws, store, bucket, tmp_path / "data")
    middle = len(original) // 2
    (ws / "big").write_bytes(original[:middle] + noise(4096, 13) + original[middle:])
    second = await capture(ws, store, bucket, tmp_path / "data")
    with sqlite3.connect(tmp_path / "store.db") as db:
        sizes = dict(db.execute("select id, length(document) from checkpoints"))
    # About 1,000 chunks: the keyframe holds their list, the delta a few of them.
    assert sizes[first.checkpoint.id] > 30_000
    assert sizes[second.checkpoint.id] < 3_000, sizes
    out = tmp_path / "out"
    await restore_checkpoint(out, store, bucket, "t", RestoreOptions(data_dir=tmp_path / "d2"))
    assert (out / "big").read_bytes() == (ws / "big").read_bytes()
