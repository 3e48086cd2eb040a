"""Packs (blobs/packs.py, rust/src/pack.rs): small blobs rest in compressed pack
objects, the index in the checkpoint store; round trips through a local dir and
real S3, an old one-object-per-blob store after the upgrade, damaged packs, and
the bucket requests of a cold capture."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import blake3
import pytest

from checkpointd import _native, _restore_fetch
from checkpointd.blobs import open_blobs
from checkpointd.blobs.base import BlobCorruptError
from checkpointd.blobs.packs import PACK_KEY_PREFIX, PackedBlobStore, packed_blobs, plan_pack_reads
from checkpointd.capture import CaptureOptions, capture_checkpoint
from checkpointd.errors import INVALID_BLOB, SandboxSnapshotError
from checkpointd.model import FileEntry
from checkpointd.restore import RestoreOptions, restore_checkpoint
from checkpointd.store.base import PackIndex

from ..fixtures.bucket_counter import CountingProxy, counted
from .conftest import (
    BUCKETS,
    EVERY_STORE,
    bucket_named_by_param,
    snapshot_tree,
    store_named_by_param,
    write_tree,
)

FILE_PREFIX = "sandbox-files/blake3/"


# Every store we ship keeps the pack index.
store = pytest.fixture(params=EVERY_STORE, name="store")(store_named_by_param)


def _key(data: bytes) -> str:
    return FILE_PREFIX + blake3.blake3(data).hexdigest()


def _mixed_tree() -> dict[str, bytes | str]:
    """Below and at the 1 MiB threshold, empty, incompressible, duplicates."""
    text = b"".join(b"line %d of a source file\n" % n for n in range(400))
    return {
        "empty": b"",
        "also-empty": b"",
        "tiny.txt": b"hi",
        "src/a.py": text,
        "src/copy-of-a.py": text,  # same bytes: one blob
        "src/b.py": text + b"# changed\n",
        "random.bin": os.urandom(20_000),  # incompressible: stored raw
        "below-threshold.bin": os.urandom((1 << 20) - 1),  # still packed
        "large.bin": os.urandom(1 << 20),  # the threshold: a single object
        "large-text.log": text * 200,  # above the threshold, compressible: single
        "dir/nested/deep.txt": b"deep",
        "dir/link": "nested/deep.txt",
    }


# ------------------------------------------------------------- the format


def test_pack_format_round_trips_and_describes_itself() -> None:
    blobs = [b"", b"x", b"compressible " * 500, os.urandom(3000)]
    writer = _native.PackWriter()
    placed = writer.add_many([(blake3.blake3(b).hexdigest(), b) for b in blobs])
    hex_digest, pack = writer.finish()
    assert hex_digest == blake3.blake3(pack).hexdigest()
    assert pack[:4] == b"CKPK" and pack[-4:] == b"CKPK"
    codecs = [codec for _offset, _length, _raw, codec in placed]
    assert codecs == [0, 0, 1, 0]  # zstd only where it helps
    assert placed[2][1] < len(blobs[2]) // 10
    # The trailer alone lists every blob, so an index can be rebuilt from the bucket.
    tail_len = _native.pack_trailer_len(pack[-_native.PACK_FOOTER_LEN :]) + _native.PACK_FOOTER_LEN
    listed = _native.read_pack_trailer(pack[-tail_len:], len(pack))
    assert [(d, o, n, r, c) for d, o, n, r, c, _kind in listed] == [
        (blake3.blake3(b).hexdigest(), *p) for b, p in zip(blobs, placed, strict=True)
    ]
    # One blob from one ranged read.
    digest, offset, length, raw, codec, _ = listed[2]
    frame = pack[offset : offset + length]
    assert _native.unpack_many(frame, offset, [(digest, offset, length, raw, codec)]) == [blobs[2]]
    with pytest.raises(_native.PackedBlobInvalid) as caught:
        _native.unpack_many(frame[:-1], offset, [(digest, offset, length, raw, codec)])
    assert caught.value.args[0] == digest and "truncated" in caught.value.args[1]
    with pytest.raises(_native.PackInvalid):
        _native.read_pack_trailer(pack[:-1], len(pack) - 1)


def test_a_pack_larger_than_one_copy_piece_is_whole_and_in_order() -> None:
    """A pack of many MiB reaches Python moved piece by piece from its end:
    every byte in place, and each blob reads back from its offset."""
    blobs = [os.urandom(700_000) for _ in range(15)]  # about 10 MiB, incompressible
    writer = _native.PackWriter()
    placed = writer.add_many([(blake3.blake3(b).hexdigest(), b) for b in blobs])
    hex_digest, pack, *_columns = writer.finish_with_rows()
    assert len(pack) > 8 << 20
    assert hex_digest == blake3.blake3(pack).hexdigest()
    assert pack[:4] == b"CKPK" and pack[-4:] == b"CKPK"
    for blob, (offset, length, raw, codec) in zip(blobs, placed, strict=True):
        item = (blake3.blake3(blob).hexdigest(), offset, length, raw, codec)
        assert _native.unpack_many(pack[offset : offset + length], offset, [item]) == [blob]


# ------------------------------------------------------------- round trips


bucket = pytest.fixture(params=BUCKETS, name="bucket")(bucket_named_by_param)


async def _objects(blobs: Any) -> dict[str, int]:
    return {
        info.key: info.size
        for prefix in ("sandbox-files/", "sandbox-packs/")
        for info in await blobs.list(prefix)
    }


async def test_mixed_sizes_round_trip_through_packs(
    store: Any, bucket: Any, tmp_path: Path, data_dir: Path
) -> None:
    workspace = tmp_path / "workspace"
    tree = _mixed_tree()
    write_tree(workspace, tree)
    before = snapshot_tree(workspace)
    first = await capture_checkpoint(
        workspace, store, bucket, "t", CaptureOptions(data_dir=data_dir)
    )
    contents = {data for data in tree.values() if isinstance(data, bytes)}
    assert first.stats.blobs_uploaded == len(contents)

    objects = await _objects(bucket)
    packs = [key for key in objects if key.startswith(PACK_KEY_PREFIX)]
    singles = {key for key in objects if key.startswith(FILE_PREFIX)}
    assert isinstance(store, PackIndex)
    assert len(packs) == 1
    # Only blobs above the threshold are objects of their own.
    assert singles == {_key(tree["large.bin"]), _key(tree["large-text.log"])}  # type: ignore[arg-type]
    # Compressed: the pack is smaller than the small blobs it holds.
    small = sum(len(d) for d in contents if len(d) < 1 << 20)
    assert objects[packs[0]] < small
    rows = await store.locate_blobs([_key(d) for d in contents])
    assert {k for k, row in rows.items() if row is not None} == {
        _key(d) for d in contents if len(d) < 1 << 20
    }

    shutil.rmtree(workspace)
    await restore_checkpoint(workspace, store, bucket, "t", RestoreOptions(data_dir=data_dir))
    assert snapshot_tree(workspace) == before

    # Another thread of the same contents uploads nothing: the index says present.
    again = await capture_checkpoint(
        workspace, store, bucket, "u", CaptureOptions(data_dir=data_dir)
    )
    assert again.stats.blobs_uploaded == 0
    assert await _objects(bucket) == objects

    # Reads by key go through the index (ReadFile / ReadArtifact / check use these).
    view = packed_blobs(bucket, store)
    for data in contents:
        assert await view.get(_key(data)) == data
        assert b"".join([c async for c in view.get_stream(_key(data), 1000)]) == data
        info = await view.head(_key(data))
        assert info is not None and info.size == len(data)
    assert await view.missing([_key(b"never stored"), _key(b"hi")]) == [_key(b"never stored")]


async def test_a_capture_writes_packs_of_the_target_size(
    memory_store: Any, tmp_path: Path, data_dir: Path
) -> None:
    blobs = PackedBlobStore(
        open_blobs(f"file://{tmp_path / 'blobs'}"), memory_store, threshold=4096, target=64 << 10
    )
    workspace = tmp_path / "workspace"
    write_tree(workspace, {f"d{n % 7}/f{n}": os.urandom(1000) for n in range(300)})
    await capture_checkpoint(workspace, memory_store, blobs, "t", CaptureOptions(data_dir=data_dir))
    packs = await blobs.inner.list(PACK_KEY_PREFIX)
    # 300 KB of incompressible blobs in packs closed at 64 KiB: five or six packs.
    assert 4 <= len(packs) <= 6
    assert all(info.size < (64 << 10) + 2000 for info in packs)
    restored = tmp_path / "restored"
    await restore_checkpoint(restored, memory_store, blobs, "t", RestoreOptions(data_dir=data_dir))
    assert snapshot_tree(restored) == snapshot_tree(workspace)


async def test_a_capture_packs_small_fed_files_and_puts_larger_ones_alone(
    store: Any, tmp_path: Path, data_dir: Path
) -> None:
    # The feed hands over files up to 1 MiB; with a lower threshold the ones
    # at or above it go up as single objects, and repeated content once.
    blobs = PackedBlobStore(
        open_blobs(f"file://{tmp_path / 'blobs'}"), store, threshold=4096, target=64 << 10
    )
    workspace = tmp_path / "workspace"
    small = {f"s/f{n}": os.urandom(1000) for n in range(200)}
    large = {f"l/f{n}": os.urandom(4096 + n) for n in range(5)}
    same = {"s/again": small["s/f3"], "l/again": large["l/f1"]}
    write_tree(workspace, {**small, **large, **same})
    result = await capture_checkpoint(
        workspace, store, blobs, "t", CaptureOptions(data_dir=data_dir)
    )
    assert result.stats.blobs_uploaded == 205
    singles = {info.key for info in await blobs.inner.list("sandbox-files/")}
    assert singles == {_key(data) for data in large.values()}
    located = await blobs.locate([_key(data) for data in small.values()])
    assert len(located) == 200
    restored = tmp_path / "restored"
    await restore_checkpoint(restored, store, blobs, "t", RestoreOptions(data_dir=data_dir))
    assert snapshot_tree(restored) == snapshot_tree(workspace)


# ---------------------------------------------------------------- migration


class _StoreBeforePacks:
    """A store as it was before packs: everything but the pack index."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        if name in ("locate_blobs", "list_packed_blobs"):
            raise AttributeError(name)
        return getattr(self._inner, name)


async def test_an_old_single_object_store_restores_after_the_upgrade(
    store: Any, bucket: Any, tmp_path: Path, data_dir: Path
) -> None:
    assert isinstance(store, PackIndex)
    workspace = tmp_path / "workspace"
    write_tree(workspace, {"old.txt": b"written before packs", "shared.txt": b"in both"})
    old = await capture_checkpoint(
        workspace, _StoreBeforePacks(store), bucket, "t", CaptureOptions(data_dir=data_dir)
    )
    assert old.stats.blobs_uploaded == 2
    assert set(await _objects(bucket)) == {_key(b"written before packs"), _key(b"in both")}

    # After the upgrade: a new capture packs only what is new; old blobs stay
    # where they are (nothing rewritten) and a restore reads both layouts.
    (workspace / "new.txt").write_bytes(b"written with packs")
    new = await capture_checkpoint(workspace, store, bucket, "t", CaptureOptions(data_dir=data_dir))
    assert new.stats.blobs_uploaded == 1
    objects = await _objects(bucket)
    assert {k for k in objects if k.startswith(FILE_PREFIX)} == {
        _key(b"written before packs"),
        _key(b"in both"),
    }
    assert len([k for k in objects if k.startswith(PACK_KEY_PREFIX)]) == 1
    # Another thread with the old contents: the referenced single objects are
    # present by the store's counts (no re-upload, no bucket HEAD).
    other = await capture_checkpoint(
        workspace, store, bucket, "u", CaptureOptions(data_dir=data_dir)
    )
    assert other.stats.blobs_uploaded == 0
    for checkpoint in (old.checkpoint, new.checkpoint):
        target = tmp_path / f"restored-{checkpoint.id}"
        await restore_checkpoint(
            target,
            store,
            bucket,
            "t",
            RestoreOptions(checkpoint_id=checkpoint.id, data_dir=data_dir),
        )
        assert {e.path for e in checkpoint.files if isinstance(e, FileEntry)} == {
            p.name for p in target.iterdir()
        }
    assert (target / "old.txt").read_bytes() == b"written before packs"
    assert (target / "new.txt").read_bytes() == b"written with packs"


# ----------------------------------------------------------- damaged packs


@pytest.mark.parametrize("damage", ["truncated", "corrupted"])
async def test_a_damaged_pack_fails_restore_naming_blob_and_pack(
    store: Any, bucket: Any, tmp_path: Path, data_dir: Path, damage: str
) -> None:
    assert isinstance(store, PackIndex)
    workspace = tmp_path / "workspace"
    files = {f"f{n:03}.txt": b"content of file %d\n" % n * 20 for n in range(50)}
    write_tree(workspace, files)
    await capture_checkpoint(workspace, store, bucket, "t", CaptureOptions(data_dir=data_dir))
    [pack_info] = await bucket.list(PACK_KEY_PREFIX)
    pack = await bucket.get(pack_info.key)
    victim = _key(files["f042.txt"])
    row = (await store.locate_blobs([victim]))[victim]
    assert row is not None and row.codec == 1  # compressed
    if damage == "truncated":
        # The pack ends inside the victim's frame (and loses what follows).
        cut = row.offset + row.length // 2
        damaged = pack[:cut]
    else:
        at = row.offset + row.length // 2
        damaged = pack[:at] + bytes([pack[at] ^ 0x55]) + pack[at + 1 :]
    await bucket.put(pack_info.key, damaged, if_absent=False)

    target = tmp_path / "target"
    write_tree(target, {"f042.txt": b"the live version", "keep.txt": b"untouched"})
    before = snapshot_tree(target)
    with pytest.raises(SandboxSnapshotError) as caught:
        await restore_checkpoint(target, store, bucket, "t", RestoreOptions(data_dir=data_dir))
    assert caught.value.code == INVALID_BLOB
    assert caught.value.details["pack"] == pack_info.key
    assert pack_info.key in str(caught.value)
    if damage == "corrupted":
        assert caught.value.details["key"] == victim
    else:  # every blob from the cut on is lost: the first one is named
        lost = {
            _key(data)
            for data in files.values()
            if (await store.locate_blobs([_key(data)]))[_key(data)].offset >= row.offset  # type: ignore[union-attr]
        }
        assert caught.value.details["key"] in lost
    assert snapshot_tree(target) == before  # unchanged, staging gone

    view = packed_blobs(bucket, store)
    with pytest.raises(BlobCorruptError):
        await view.get(victim)
    # Once the pack is whole again, the restore completes.
    await bucket.put(pack_info.key, pack, if_absent=False)
    await restore_checkpoint(target, store, bucket, "t", RestoreOptions(data_dir=data_dir))
    assert (target / "f042.txt").read_bytes() == files["f042.txt"]


# ----------------------------------------------------------- request counts


@pytest.fixture
def counting_s3(s3_server: Any) -> Iterator[tuple[CountingProxy, Any]]:
    with counted(s3_server) as (through_proxy, proxy):
        yield proxy, through_proxy.open(f"counted-{os.urandom(6).hex()}")


@pytest.mark.s3
async def test_a_cold_capture_of_thousands_of_small_files_is_a_handful_of_requests(
    store: Any, counting_s3: tuple[CountingProxy, Any], tmp_path: Path, data_dir: Path
) -> None:
    assert isinstance(store, PackIndex)
    proxy, blobs = counting_s3
    workspace = tmp_path / "workspace"
    files = {f"d{n % 50}/f{n}.txt": b"small file number %d\n" % n * (n % 40) for n in range(3000)}
    write_tree(workspace, files)
    proxy.reset()
    await capture_checkpoint(workspace, store, blobs, "t", CaptureOptions(data_dir=data_dir))
    captured = proxy.reset()
    # Was one PUT and one HEAD per file (6,000 requests); now a few packs.
    assert 0 < sum(captured.values()) < 100, captured
    assert captured.get("HEAD", 0) < 10, captured

    restored = tmp_path / "restored"
    await restore_checkpoint(restored, store, blobs, "t", RestoreOptions(data_dir=data_dir))
    assert snapshot_tree(restored) == snapshot_tree(workspace)
    restoring = proxy.reset()
    assert 0 < sum(restoring.values()) < 100, restoring


@pytest.mark.s3
async def test_a_restore_reads_each_pack_about_once_whatever_its_file_count(
    store: Any, counting_s3: tuple[CountingProxy, Any], tmp_path: Path, data_dir: Path
) -> None:
    """Restore groups the blobs of the whole plan by pack (it was one set of
    ranged GETs per batch of 512 files: 24+ GETs here, 453 for 100,000 files)."""
    proxy, inner = counting_s3
    blobs = PackedBlobStore(inner, store, threshold=4096, target=96 << 10)
    workspace = tmp_path / "workspace"
    files = {f"d{n % 60}/f{n}.txt": b"file %d " % n * (1 + n % 30) for n in range(12_000)}
    write_tree(workspace, files)
    await capture_checkpoint(workspace, store, blobs, "t", CaptureOptions(data_dir=data_dir))
    packs = await inner.list(PACK_KEY_PREFIX)
    assert len(packs) >= 3  # the plan spans several packs
    proxy.reset()
    restored = tmp_path / "restored"
    await restore_checkpoint(restored, store, blobs, "t", RestoreOptions(data_dir=data_dir))
    restoring = proxy.reset()
    assert snapshot_tree(restored) == snapshot_tree(workspace)
    # About one ranged GET per pack, and nothing else asked of the bucket.
    assert 0 < restoring.get("GET", 0) <= len(packs) + 1, restoring
    assert sum(restoring.values()) == restoring["GET"], restoring


class _TrickleBlobs(PackedBlobStore):
    """A pack store whose ranged reads arrive in tiny chunks, splitting every
    frame across chunk boundaries (a real bucket's stream may do the same)."""

    async def stream_pack_read(self, read: Any, chunk_size: int = 1 << 20) -> AsyncIterator[bytes]:
        async for chunk in super().stream_pack_read(read, chunk_size):
            for start in range(0, len(chunk), 7):
                yield chunk[start : start + 7]


async def test_a_pack_read_is_staged_as_it_streams_in_whatever_its_chunks(
    store: Any, tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert isinstance(store, PackIndex)
    # Every read longer than 4 KiB streams (shorter ones are read whole, in batches).
    monkeypatch.setattr(_restore_fetch, "FETCH_CHUNK_BYTES", 4096)
    blobs = _TrickleBlobs(open_blobs(f"file://{tmp_path / 'blobs'}"), store)
    workspace = tmp_path / "workspace"
    tree = _mixed_tree()
    tree.pop("below-threshold.bin")  # a megabyte in 7-byte chunks is slow, not harder
    write_tree(workspace, tree)
    await capture_checkpoint(workspace, store, blobs, "t", CaptureOptions(data_dir=data_dir))
    restored = tmp_path / "restored"
    await restore_checkpoint(restored, store, blobs, "t", RestoreOptions(data_dir=data_dir))
    assert snapshot_tree(restored) == snapshot_tree(workspace)


async def test_a_corrupted_frame_inside_one_merged_read_fails_and_changes_nothing(
    store: Any, bucket: Any, tmp_path: Path, data_dir: Path
) -> None:
    """Blobs before the damaged frame in the same ranged read are staged, never
    put in place: INVALID_BLOB names the blob and its pack, the workspace is as
    it was, and nothing of the staging directory is left."""
    assert isinstance(store, PackIndex)
    workspace = tmp_path / "workspace"
    files = {f"d{n % 4}/f{n:03}.txt": b"content of file %d\n" % n * 30 for n in range(300)}
    write_tree(workspace, files)
    await capture_checkpoint(workspace, store, bucket, "t", CaptureOptions(data_dir=data_dir))
    [pack_info] = await bucket.list(PACK_KEY_PREFIX)
    rows = await store.locate_blobs([_key(data) for data in files.values()])
    located = [row for row in rows.values() if row is not None]
    [read] = plan_pack_reads(located)  # one merged ranged read for all 300 blobs
    victim = sorted(located, key=lambda row: row.offset)[len(located) // 2]
    pack = await bucket.get(pack_info.key)
    at = victim.offset + victim.length // 2
    await bucket.put(
        pack_info.key, pack[:at] + bytes([pack[at] ^ 0x55]) + pack[at + 1 :], if_absent=False
    )
    target = tmp_path / "target"
    write_tree(target, {"d1/f001.txt": b"the live version", "keep.txt": b"untouched"})
    before = snapshot_tree(target)
    with pytest.raises(SandboxSnapshotError) as caught:
        await restore_checkpoint(target, store, bucket, "t", RestoreOptions(data_dir=data_dir))
    assert caught.value.code == INVALID_BLOB
    assert caught.value.details == {"key": victim.key, "pack": pack_info.key}
    assert victim.key in str(caught.value) and pack_info.key in str(caught.value)
    assert snapshot_tree(target) == before
    assert read.start <= victim.offset < read.end
