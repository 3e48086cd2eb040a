"""A file that changes between the scan and its upload is read once more, not
twice (once to hash it again, once more to upload): the pass that hashes a
small file again hands its zeroed bytes to the upload. Counted with the kernel's
own tally of bytes this process read (``rchar`` in /proc/self/io, every thread),
around a real capture to a real bucket directory."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import blake3
import pytest

from checkpointd import open_blobs, open_store
from checkpointd.blobs.packs import packed_blobs
from checkpointd.capture import capture_checkpoint
from checkpointd.model import FileEntry
from checkpointd.progress import Progress
from checkpointd.restore import restore_checkpoint

from .conftest import snapshot_tree, write_tree

SIZE = 900 << 10  # small (read whole), and large next to everything else read


def _key(data: bytes) -> str:
    return "sandbox-files/blake3/" + blake3.blake3(data).hexdigest()


def _bytes_read() -> int:
    with open("/proc/self/io", encoding="ascii") as handle:
        fields = dict(line.split(": ") for line in handle.read().splitlines())
    return int(fields["rchar"])


async def _warm_stat_cache(workspace: Path, data_dir: Path) -> None:
    """The next scan then trusts every hash and reads no file: the upload reads
    the files the bucket lacks itself, and meets the change."""
    async with await open_store("memory://") as elsewhere:
        await capture_checkpoint(
            workspace, elsewhere, open_blobs("memory://"), "warm", data_dir=data_dir
        )


@pytest.mark.parametrize(
    "new_size", [SIZE, 600 << 10, 3 << 20], ids=["same-size", "smaller", "now-large"]
)
async def test_a_file_changed_before_its_upload_is_read_once_more(
    memory_store: Any, workspace: Path, tmp_path: Path, data_dir: Path, new_size: int
) -> None:
    blobs = open_blobs(f"file://{tmp_path / 'blobs'}")
    old, new = os.urandom(SIZE), os.urandom(new_size)
    write_tree(workspace, {"big-ish.bin": old, "calm.txt": b"calm"})
    await _warm_stat_cache(workspace, data_dir)

    changed: list[bool] = []

    def change(report: Progress) -> None:
        if report.phase == "upload" and not changed:
            (workspace / "big-ish.bin").write_bytes(new)
            changed.append(True)

    before = _bytes_read()
    result = await capture_checkpoint(
        workspace, memory_store, blobs, "t", data_dir=data_dir, progress=change
    )
    read = _bytes_read() - before
    assert changed
    files = {e.path: e for e in result.checkpoint.files if isinstance(e, FileEntry)}
    assert files["big-ish.bin"].blob_key == _key(new)
    assert await packed_blobs(blobs, memory_store).head(_key(old)) is None
    if new_size < 1 << 20:
        # Read once: the pass that hashed the new bytes uploaded them
        # (before: once to hash, once more to upload).
        assert new_size <= read < 1.5 * new_size, read
    else:
        # Large now: hashed, then streamed through a verifying reader (the key
        # must be known before the first byte goes up); never a third time.
        assert 2 * new_size <= read < 2.5 * new_size, read
    restored = tmp_path / "restored"
    await restore_checkpoint(restored, memory_store, blobs, "t", data_dir=data_dir)
    assert snapshot_tree(restored, with_mtime=False) == snapshot_tree(workspace, with_mtime=False)
