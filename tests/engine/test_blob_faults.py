"""Missing, truncated and corrupted blobs fail the restore before any change."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import blake3
import pytest

from checkpointd.capture import CaptureOptions, capture_checkpoint
from checkpointd.errors import INVALID_BLOB, MISSING_BLOB, SandboxSnapshotError
from checkpointd.model import Checkpoint, FileEntry
from checkpointd.restore import RestoreOptions, restore_checkpoint
from checkpointd.store.base import PackIndex

from .conftest import snapshot_tree, write_tree


def _damage(kind: str, data: bytes) -> bytes | None:
    if kind == "truncated":
        return data[:-1]
    if kind == "corrupted":
        return bytes([data[0] ^ 0xFF]) + data[1:]
    if kind == "longer":
        return data + b"extra"
    return None  # missing


@pytest.mark.parametrize(
    ("damage", "code"),
    [
        ("missing", MISSING_BLOB),
        ("truncated", INVALID_BLOB),
        ("corrupted", INVALID_BLOB),
        ("longer", INVALID_BLOB),
    ],
)
async def test_bad_blob_fails_restore_and_leaves_workspace_untouched(
    store: Any, blobs: Any, workspace: Path, data_dir: Path, damage: str, code: str
) -> None:
    write_tree(
        workspace,
        {"a.txt": b"version one of a", "dir/b.bin": os.urandom(5000), "same.txt": b"same"},
    )
    captured = await capture_checkpoint(
        workspace, store, blobs, "t", CaptureOptions(data_dir=data_dir)
    )
    # The live workspace moves on: a changed file, a new file, a deleted one.
    (workspace / "a.txt").write_bytes(b"version two of a, longer")
    (workspace / "new.txt").write_bytes(b"new")
    (workspace / "dir/b.bin").unlink()
    before = snapshot_tree(workspace)

    victim = next(
        e for e in captured.checkpoint.files if isinstance(e, FileEntry) and e.path == "a.txt"
    )
    # A small blob lives in a pack when the store keeps a pack index: damage
    # its frame there (or the pack), else its single object.
    row = None
    if isinstance(store, PackIndex):
        row = (await store.locate_blobs([victim.blob_key])).get(victim.blob_key)
        assert row is not None
    holder = victim.blob_key if row is None else row.pack
    original = await blobs.get(holder)
    if row is None:
        replacement = _damage(damage, original)
    else:
        frame = original[row.offset : row.offset + row.length]
        if damage == "truncated":  # the pack ends inside the frame
            replacement = original[: row.offset + row.length - 1]
        elif damage == "missing":
            replacement = None
        else:  # a frame of other bytes in its place
            changed = _damage(damage, frame)
            assert changed is not None
            replacement = (
                original[: row.offset] + changed[: row.length] + original[row.offset + row.length :]
            )
            if damage == "longer":  # the pack's frame is a prefix of more bytes
                replacement = (
                    original[: row.offset] + frame[1:] + b"x" + original[row.offset + row.length :]
                )
    if replacement is None:
        await blobs.delete(holder)
    else:
        await blobs.put(holder, replacement, if_absent=False)

    with pytest.raises(SandboxSnapshotError) as caught:
        await restore_checkpoint(workspace, store, blobs, "t", RestoreOptions(data_dir=data_dir))
    assert caught.value.code == code
    if row is not None and damage == "missing":
        # The whole pack is gone: any blob the restore needs from it is named.
        needed = {e.blob_key for e in captured.checkpoint.files if isinstance(e, FileEntry)}
        needed.discard(next(e.blob_key for e in captured.checkpoint.files if e.path == "same.txt"))
        assert caught.value.details["key"] in needed
    else:
        assert caught.value.details["key"] == victim.blob_key
    if row is not None:  # the error names the pack too
        assert caught.value.details["pack"] == row.pack
        assert row.pack in str(caught.value)
    assert snapshot_tree(workspace) == before  # byte for byte, staging gone too

    # The lease was released: once the blob is back, the restore succeeds.
    await blobs.put(holder, original, if_absent=False)
    await restore_checkpoint(workspace, store, blobs, "t", RestoreOptions(data_dir=data_dir))
    assert (workspace / "a.txt").read_bytes() == b"version one of a"
    assert not (workspace / "new.txt").exists()


async def test_entries_disagreeing_on_a_blob_size_are_refused(
    memory_store: Any, memory_blobs: Any, workspace: Path, data_dir: Path
) -> None:
    data = b"twelve bytes"
    key = "sandbox-files/blake3/" + blake3.blake3(data).hexdigest()
    await memory_blobs.put(key, data)
    lease = await memory_store.acquire_writer("t")
    corrupt = Checkpoint(
        id="corrupt",
        thread_id="t",
        parent_checkpoint_id=None,
        created_at=1,
        files=(FileEntry("a", key, len(data)), FileEntry("b", key, len(data) + 1)),
    )
    await memory_store.append(corrupt, None, lease)
    await lease.release()
    write_tree(workspace, {"existing": b"stays"})
    before = snapshot_tree(workspace)
    with pytest.raises(SandboxSnapshotError) as caught:
        await restore_checkpoint(
            workspace, memory_store, memory_blobs, "t", RestoreOptions(data_dir=data_dir)
        )
    assert caught.value.code == INVALID_BLOB
    assert snapshot_tree(workspace) == before
