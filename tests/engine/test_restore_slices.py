"""Restore looks the pack index up a slice of its plan at a time when the
blobs are in a local dir (``_restore_fetch._locate_slices``), and reads each slice
while the next is looked up; a bucket's plan is looked up whole."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import blake3

from checkpointd import _restore_fetch
from checkpointd.blobs import open_blobs
from checkpointd.blobs.packs import PackedBlobStore
from checkpointd.capture import CaptureOptions, capture_checkpoint
from checkpointd.errors import INVALID_BLOB, SandboxSnapshotError
from checkpointd.restore import RestoreOptions, restore_checkpoint

from .conftest import snapshot_tree, write_tree

COUNT = _restore_fetch.LOCATE_FIRST * 5 + 300  # three slices: 1024, 4096, the rest


def _files() -> dict[str, bytes]:
    files = {f"d{n % 37}/f{n:05}.txt": b"slice file %d\n" % n * (1 + n % 9) for n in range(COUNT)}
    files["zz/last.txt"] = b"the last file"  # short: stored raw
    return files


def _key(data: bytes) -> str:
    return "sandbox-files/blake3/" + blake3.blake3(data).hexdigest()


def test_a_local_dir_is_looked_up_in_growing_slices_a_bucket_at_once(
    memory_store: Any, tmp_path: Path
) -> None:
    digests = b"".join(n.to_bytes(32, "big") for n in range(COUNT))
    local = PackedBlobStore(open_blobs(f"file://{tmp_path / 'blobs'}"), memory_store)
    slices = _restore_fetch._locate_slices(local, digests)
    assert [len(part) // 32 for part in slices] == [1024, 4096, COUNT - 5120]
    assert b"".join(slices) == digests
    bucket = PackedBlobStore(open_blobs("memory://"), memory_store)
    assert _restore_fetch._locate_slices(bucket, digests) == [digests]
    assert _restore_fetch._locate_slices(local, b"") == []


async def test_many_slices_round_trip_and_a_bad_frame_in_the_last_changes_nothing(
    memory_store: Any, workspace: Path, tmp_path: Path, data_dir: Path
) -> None:
    blobs = open_blobs(f"file://{tmp_path / 'blobs'}")
    files = _files()
    write_tree(workspace, files)
    await capture_checkpoint(workspace, memory_store, blobs, "t", CaptureOptions(data_dir=data_dir))
    restored = tmp_path / "restored"
    await restore_checkpoint(restored, memory_store, blobs, "t", RestoreOptions(data_dir=data_dir))
    assert snapshot_tree(restored) == snapshot_tree(workspace)

    # The last path is written last: its blob is in the last slice, read
    # after the first slices were staged. Same size, other bytes.
    last = "zz/last.txt"
    assert last == max(files, key=lambda path: path.encode())
    damaged = _key(files[last])
    row = (await memory_store.locate_blobs([damaged]))[damaged]
    pack = await blobs.get(row.pack)
    frame = pack[row.offset : row.offset + row.length]
    assert frame == files[last]  # stored raw: too short to compress
    await blobs.put(
        row.pack,
        pack[: row.offset] + frame.upper() + pack[row.offset + row.length :],
        if_absent=False,
    )
    target = tmp_path / "target"
    write_tree(target, {"keep.txt": b"untouched"})
    before = snapshot_tree(target)
    try:
        await restore_checkpoint(
            target, memory_store, blobs, "t", RestoreOptions(data_dir=data_dir)
        )
    except SandboxSnapshotError as error:
        assert error.code == INVALID_BLOB
        assert error.details["key"] == damaged
    else:
        raise AssertionError("a damaged frame restored")
    assert snapshot_tree(target) == before
    assert sorted(os.listdir(target)) == ["keep.txt"]
