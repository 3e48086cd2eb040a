"""Capture → restore through a real S3 server (SeaweedFS on loopback)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from checkpointd.capture import CaptureOptions, capture_checkpoint
from checkpointd.restore import RestoreOptions, restore_checkpoint
from checkpointd.store import open_store

from .conftest import snapshot_tree, write_tree


@pytest.mark.s3
async def test_round_trip_through_s3(
    store: Any, s3_blobs: Any, tmp_path: Path, data_dir: Path
) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    write_tree(
        workspace,
        {
            "small.txt": b"small",
            "empty": b"",
            "large.bin": os.urandom((6 << 20) + 1),  # more than one multipart part
            "nested/dir/file.py": b"x = 1\n",
            "nested/link": "dir/file.py",
        },
    )
    before = snapshot_tree(workspace)
    first = await capture_checkpoint(
        workspace, store, s3_blobs, "s3-thread", CaptureOptions(data_dir=data_dir)
    )
    assert first.stats.blobs_uploaded == 4
    shutil.rmtree(workspace)
    await restore_checkpoint(
        workspace, store, s3_blobs, "s3-thread", RestoreOptions(data_dir=data_dir)
    )
    assert snapshot_tree(workspace) == before
    again = await capture_checkpoint(
        workspace, store, s3_blobs, "s3-thread", CaptureOptions(data_dir=data_dir)
    )
    assert (again.stats.blobs_uploaded, again.stats.files_hashed) == (0, 0)


@pytest.mark.s3
@pytest.mark.postgres
async def test_scale_out_round_trip_postgres_and_s3(
    postgres_url: str, s3_blobs: Any, tmp_path: Path, data_dir: Path
) -> None:
    """The scale-out setup: one sidecar captures, another restores elsewhere."""
    workspace = tmp_path / "sidecar-a"
    workspace.mkdir()
    write_tree(workspace, {"a.txt": b"a", "d/b.bin": os.urandom(100_000), "d/link": "b.bin"})
    before = snapshot_tree(workspace)
    async with await open_store(postgres_url) as store_a:
        await capture_checkpoint(
            workspace, store_a, s3_blobs, "shared", CaptureOptions(data_dir=data_dir)
        )
    async with await open_store(postgres_url) as store_b:
        elsewhere = tmp_path / "sidecar-b"
        restored = await restore_checkpoint(
            elsewhere, store_b, s3_blobs, "shared", RestoreOptions(data_dir=tmp_path / "data-b")
        )
        assert restored is not None
    assert snapshot_tree(elsewhere) == before
