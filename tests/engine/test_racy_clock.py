"""The racy-clean window is measured on the workspace's filesystem.

A workspace on a filesystem with 1-second timestamps (ext4 with 128-byte
inodes), a data dir on one with nanosecond timestamps: a same-size rewrite in
the same second as the capture that cached the file must be hashed again, so
the next capture records the new bytes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpointd import CaptureOptions, capture_checkpoint, open_blobs, open_store
from checkpointd.blobs.packs import packed_blobs
from checkpointd.model import FileEntry

from ..fixtures.loopfs import coarse_ext4


@pytest.fixture
def coarse_workspace(tmp_path: Path) -> Iterator[Path]:
    with coarse_ext4(tmp_path) as mount_point:
        workspace = mount_point / "ws"
        workspace.mkdir()
        yield workspace


def _start_of_a_second() -> None:
    """Sleep until just after a second boundary (room for two captures)."""
    time.sleep(1 - time.time() % 1 + 0.01)


async def test_same_second_same_size_rewrite_is_recorded(
    coarse_workspace: Path, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"  # on the nanosecond filesystem
    target = coarse_workspace / "notes.txt"
    async with await open_store(f"sqlite:///{tmp_path / 's.db'}") as store:
        blobs = open_blobs(f"file://{tmp_path / 'blobs'}")
        for attempt in range(5):
            _start_of_a_second()
            second = int(time.time())
            target.write_bytes(b"version A %d" % attempt)
            first = await capture_checkpoint(
                coarse_workspace, store, blobs, "t", CaptureOptions(data_dir=data_dir)
            )
            with target.open("r+b") as handle:  # same inode, same size
                handle.write(b"version B %d" % attempt)
            if int(time.time()) != second:
                continue  # the machine was too slow for one second: try again
            assert os.stat(target).st_mtime_ns % 1_000_000_000 == 0  # coarse indeed
            again = await capture_checkpoint(
                coarse_workspace, store, blobs, "t", CaptureOptions(data_dir=data_dir)
            )
            (entry,) = [e for e in again.checkpoint.files if isinstance(e, FileEntry)]
            assert await packed_blobs(blobs, store).get(entry.blob_key) == b"version B %d" % attempt
            assert again.stats.files_hashed == 1
            (before,) = [e for e in first.checkpoint.files if isinstance(e, FileEntry)]
            assert before.blob_key != entry.blob_key
            return
        pytest.fail("could not rewrite within the capture's second in 5 tries")
