"""Errors keep their meaning: a full disk, a name too long, a file appended to
during capture each end as their own checkpointd error naming the path, never a
bare OSError (gRPC INTERNAL)."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import blake3
import pytest

from checkpointd import errors
from checkpointd.blobs import open_blobs
from checkpointd.blobs.base import BlobStoreError
from checkpointd.capture import CaptureOptions, capture_checkpoint
from checkpointd.errors import SandboxSnapshotError
from checkpointd.model import Checkpoint, DirEntry, FileEntry
from checkpointd.restore import RestoreOptions, restore_checkpoint
from checkpointd.service.status import classify
from checkpointd.store import open_store

from ..fixtures.tmpfs import small_tmpfs
from .conftest import snapshot_tree, write_tree


async def test_restore_into_a_full_filesystem_is_no_space(
    memory_store: Any, memory_blobs: Any, tmp_path: Path, data_dir: Path
) -> None:
    workspace = tmp_path / "ws"
    write_tree(workspace, {"big.bin": os.urandom(3 << 20), "small.txt": b"small"})
    await capture_checkpoint(
        workspace, memory_store, memory_blobs, "t", CaptureOptions(data_dir=data_dir)
    )
    with small_tmpfs(tmp_path / "full") as full:
        (full / "keep.txt").write_bytes(b"already here")
        before = snapshot_tree(full)
        with pytest.raises(SandboxSnapshotError) as caught:
            await restore_checkpoint(
                full, memory_store, memory_blobs, "t", RestoreOptions(data_dir=data_dir)
            )
        assert caught.value.code == errors.NO_SPACE
        assert str(full) in caught.value.details["path"]
        assert str(full) in str(caught.value)
        # The blobs are staged before any change: the workspace is as it was.
        assert snapshot_tree(full) == before


async def test_capture_into_a_full_bucket_is_no_space(
    memory_store: Any, tmp_path: Path, data_dir: Path
) -> None:
    workspace = tmp_path / "ws"
    write_tree(workspace, {"big.bin": os.urandom(3 << 20)})
    with small_tmpfs(tmp_path / "bucket") as bucket:
        blobs = open_blobs(f"file://{bucket}")
        # The engine raises the bucket's error (BlobStoreError, as documented);
        # the daemon's one status map tells a full disk from an outage.
        with pytest.raises(BlobStoreError) as caught:
            await capture_checkpoint(
                workspace, memory_store, blobs, "t", CaptureOptions(data_dir=data_dir)
            )
    code, reason, message, metadata = classify(caught.value)
    assert (code.name, reason) == ("RESOURCE_EXHAUSTED", errors.NO_SPACE), message
    assert str(bucket) in metadata["path"]
    assert await memory_store.get_head("t") is None


async def test_a_name_too_long_is_refused_before_any_change(
    memory_store: Any, memory_blobs: Any, tmp_path: Path, data_dir: Path
) -> None:
    data = b"content"
    key = "sandbox-files/blake3/" + blake3.blake3(data).hexdigest()
    await memory_blobs.put(key, data)
    long_path = "dir/" + "n" * 300
    lease = await memory_store.acquire_writer("t")
    await memory_store.append(
        Checkpoint(
            id="c1",
            thread_id="t",
            parent_checkpoint_id=None,
            created_at=1,
            files=(DirEntry("dir"), FileEntry(long_path, key, len(data))),
        ),
        None,
        lease,
    )
    await lease.release()
    workspace = tmp_path / "ws"
    write_tree(workspace, {"old.txt": b"old"})
    before = snapshot_tree(workspace)
    with pytest.raises(SandboxSnapshotError) as caught:
        await restore_checkpoint(
            workspace, memory_store, memory_blobs, "t", RestoreOptions(data_dir=data_dir)
        )
    assert caught.value.code == errors.NAME_TOO_LONG
    assert caught.value.details["path"] == long_path
    assert snapshot_tree(workspace) == before


@pytest.mark.parametrize("run", range(3))
async def test_a_file_appended_to_during_capture_is_file_changed(
    tmp_path: Path, data_dir: Path, run: int
) -> None:
    workspace = tmp_path / "ws"
    write_tree(workspace, {"busy.log": os.urandom(24 << 20), "quiet.txt": b"q"})
    stop = threading.Event()

    def append_forever() -> None:
        with open(workspace / "busy.log", "ab", buffering=0) as handle:
            while not stop.is_set():
                handle.write(b"another line\n")
                stop.wait(0.0005)

    writer = threading.Thread(target=append_forever)
    writer.start()
    store = await open_store(f"sqlite:///{tmp_path / 'store.db'}")
    try:
        with pytest.raises(SandboxSnapshotError) as caught:
            await capture_checkpoint(
                workspace,
                store,
                open_blobs(f"file://{tmp_path / 'b'}"),
                "t",
                CaptureOptions(data_dir=data_dir),
            )
        assert caught.value.code == errors.FILE_CHANGED
        named = caught.value.details.get("paths") or [caught.value.details.get("path")]
        assert any(str(path).endswith("busy.log") for path in named), caught.value.details
        assert await store.get_head("t") is None
    finally:
        stop.set()
        writer.join()
        await store.aclose()
