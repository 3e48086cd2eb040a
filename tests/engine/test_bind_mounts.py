"""A bind mount inside the workspace of a directory on the SAME filesystem: its
st_dev is the workspace's, so only statx's STATX_ATTR_MOUNT_ROOT tells it is a
mount point (``rust/src/fs.rs`` ``is_mount_point``). Capture reports it as an
unsupported entry unless the policy excludes it; restore never writes into it and
never deletes through it. Real ``mount --bind`` (root); skipped, with the reason,
where mounting is impossible."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from checkpointd.capture import CaptureOptions, capture_checkpoint
from checkpointd.errors import UNSUPPORTED_ENTRY, SandboxSnapshotError
from checkpointd.model import Policy
from checkpointd.restore import RestoreOptions, restore_checkpoint

from .conftest import snapshot_tree, write_tree


def _mount_points() -> set[str]:
    """Mount points of this mount namespace (field 5 of /proc/self/mountinfo)."""
    with open("/proc/self/mountinfo", encoding="utf-8") as handle:
        return {line.split()[4] for line in handle}


@contextlib.contextmanager
def bind_mount(source: Path, target: Path) -> Iterator[Path]:
    """``mount --bind source target`` for the block (target created)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a bind mount needs root and mount(8)")
    target.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        ["mount", "--bind", str(source), str(target)], capture_output=True, text=True
    )
    if result.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {result.stderr.strip()}")
    try:
        # What makes the case: the same device, so st_dev alone cannot tell.
        assert target.stat().st_dev == target.parent.stat().st_dev
        assert str(target) in _mount_points()
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], check=False)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory beside the workspace, on its filesystem, that nothing may touch."""
    root = tmp_path / "outside"
    write_tree(root, {"precious.txt": b"outside the workspace", "sub/deep.txt": b"deep"})
    return root


async def test_capture_reports_a_bind_mount_unless_excluded(
    memory_store: Any, memory_blobs: Any, workspace: Path, data_dir: Path, outside: Path
) -> None:
    write_tree(workspace, {"ok.txt": b"fine", "dir/keep.txt": b"k"})
    with bind_mount(outside, workspace / "dir" / "bound"):
        with pytest.raises(SandboxSnapshotError) as raised:
            await capture_checkpoint(
                workspace, memory_store, memory_blobs, "t", CaptureOptions(data_dir=data_dir)
            )
        assert raised.value.code == UNSUPPORTED_ENTRY
        assert raised.value.details["paths"] == ["dir/bound"]
        assert "mount-point" in str(raised.value)
        result = await capture_checkpoint(
            workspace,
            memory_store,
            memory_blobs,
            "t",
            CaptureOptions(data_dir=data_dir, policy=Policy(exclude=("/dir/bound",))),
        )
    paths = [e.path for e in result.checkpoint.files]
    assert paths == ["dir", "dir/keep.txt", "ok.txt"]


async def test_restore_never_deletes_through_a_bind_mount(
    memory_store: Any, memory_blobs: Any, workspace: Path, data_dir: Path, outside: Path
) -> None:
    write_tree(workspace, {"keep.txt": b"k"})
    await capture_checkpoint(
        workspace, memory_store, memory_blobs, "t", CaptureOptions(data_dir=data_dir)
    )
    # Paths the checkpoint lacks: a bind mount at the top, and one beneath a
    # directory the restore deletes (remove_tree's walk).
    write_tree(workspace, {"doomed/other.txt": b"goes"})
    before = snapshot_tree(outside)
    with (
        bind_mount(outside, workspace / "bound"),
        bind_mount(outside, workspace / "doomed" / "inner"),
    ):
        await restore_checkpoint(
            workspace, memory_store, memory_blobs, "t", RestoreOptions(data_dir=data_dir)
        )
        assert snapshot_tree(outside) == before
        assert snapshot_tree(workspace / "bound") == before
        assert not (workspace / "doomed" / "other.txt").exists()
        assert str(workspace / "doomed" / "inner") in _mount_points()
    assert snapshot_tree(outside) == before
    assert (workspace / "keep.txt").read_bytes() == b"k"


async def test_restore_never_writes_into_a_bind_mount(
    memory_store: Any, memory_blobs: Any, workspace: Path, data_dir: Path, outside: Path
) -> None:
    # The checkpoint holds a directory where the bind mount will stand.
    write_tree(workspace, {"bound/precious.txt": b"the checkpoint's", "bound/new.txt": b"n"})
    await capture_checkpoint(
        workspace, memory_store, memory_blobs, "t", CaptureOptions(data_dir=data_dir)
    )
    shutil.rmtree(workspace / "bound")
    before = snapshot_tree(outside)
    with bind_mount(outside, workspace / "bound"):
        await restore_checkpoint(
            workspace, memory_store, memory_blobs, "t", RestoreOptions(data_dir=data_dir)
        )
        assert snapshot_tree(outside) == before
    assert snapshot_tree(outside) == before
