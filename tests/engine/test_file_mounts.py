"""A FILE bind-mounted into the workspace (``docker -v ./config.json:/ws/config.json``)
is a mount point like a mounted directory: statx's STATX_ATTR_MOUNT_ROOT says so
(``rust/src/fs.rs`` ``is_mount_point``). Capture refuses it as an unsupported
``mount-point`` entry unless the policy excludes it, and never reads it; restore
never changes its mode or mtime, never writes a secret into it and never tries
to delete it. Real ``mount --bind`` (root); skipped, with the reason, where
mounting is impossible."""

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

from .conftest import PAST_NS, write_tree

TOKEN = b"tok-5e1d0c99a7"


def _mount_points() -> set[str]:
    """Mount points of this mount namespace (field 5 of /proc/self/mountinfo)."""
    with open("/proc/self/mountinfo", encoding="utf-8") as handle:
        return {line.split()[4] for line in handle}


@contextlib.contextmanager
def bind_mount_file(source: Path, target: Path) -> Iterator[Path]:
    """``mount --bind source target`` of a file for the block (target created empty)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a bind mount needs root and mount(8)")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.touch()
    result = subprocess.run(
        ["mount", "--bind", str(source), str(target)], capture_output=True, text=True
    )
    if result.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {result.stderr.strip()}")
    try:
        # The same device as the workspace: only the mount root says it is one.
        assert target.stat().st_dev == target.parent.stat().st_dev
        assert str(target) in _mount_points()
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], check=False)


def _state(path: Path) -> tuple[bytes, int, int]:
    info = path.stat()
    return path.read_bytes(), info.st_mode, info.st_mtime_ns


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A file beside the workspace, on its filesystem, that nothing may touch."""
    path = tmp_path / "outside" / "host-config.json"
    path.parent.mkdir()
    path.write_bytes(b'{"host": true}')
    os.chmod(path, 0o644)
    return path


async def test_capture_refuses_a_mounted_file_unless_excluded(
    memory_store: Any, memory_blobs: Any, workspace: Path, data_dir: Path, outside: Path
) -> None:
    write_tree(workspace, {"ok.txt": b"fine", "etc/keep.txt": b"k"})
    with bind_mount_file(outside, workspace / "etc" / "config.json"):
        with pytest.raises(SandboxSnapshotError) as raised:
            await capture_checkpoint(
                workspace, memory_store, memory_blobs, "t", CaptureOptions(data_dir=data_dir)
            )
        assert raised.value.code == UNSUPPORTED_ENTRY
        assert raised.value.details["paths"] == ["etc/config.json"]
        assert "mount-point" in str(raised.value)
        result = await capture_checkpoint(
            workspace,
            memory_store,
            memory_blobs,
            "t",
            CaptureOptions(data_dir=data_dir, policy=Policy(exclude=("/etc/config.json",))),
        )
    paths = [e.path for e in result.checkpoint.files]
    assert paths == ["etc", "etc/keep.txt", "ok.txt"]


async def test_restore_never_sets_a_mounted_files_mode_or_mtime(
    memory_store: Any, memory_blobs: Any, workspace: Path, data_dir: Path, outside: Path
) -> None:
    # The checkpoint's file has the outside file's bytes, another mode and mtime.
    write_tree(workspace, {"config.json": outside.read_bytes(), "keep.txt": b"k"})  # noqa: ASYNC240
    os.chmod(workspace / "config.json", 0o600)
    await capture_checkpoint(
        workspace, memory_store, memory_blobs, "t", CaptureOptions(data_dir=data_dir)
    )
    os.unlink(workspace / "config.json")
    before = _state(outside)
    assert before[2] != PAST_NS
    with bind_mount_file(outside, workspace / "config.json"):
        await restore_checkpoint(
            workspace, memory_store, memory_blobs, "t", RestoreOptions(data_dir=data_dir)
        )
        assert _state(outside) == before
        assert str(workspace / "config.json") in _mount_points()
    assert _state(outside) == before


async def test_restore_leaves_a_mounted_file_the_checkpoint_lacks(
    memory_store: Any, memory_blobs: Any, workspace: Path, data_dir: Path, outside: Path
) -> None:
    write_tree(workspace, {"keep.txt": b"k"})
    await capture_checkpoint(
        workspace, memory_store, memory_blobs, "t", CaptureOptions(data_dir=data_dir)
    )
    (workspace / "keep.txt").write_bytes(b"changed")
    before = _state(outside)
    with bind_mount_file(outside, workspace / "dir" / "mounted.json"):
        await restore_checkpoint(
            workspace, memory_store, memory_blobs, "t", RestoreOptions(data_dir=data_dir)
        )
        assert str(workspace / "dir" / "mounted.json") in _mount_points()
        assert _state(outside) == before
    assert (workspace / "keep.txt").read_bytes() == b"k"


async def test_restore_writes_no_secret_into_a_mounted_file(
    memory_store: Any, memory_blobs: Any, workspace: Path, data_dir: Path, outside: Path
) -> None:
    write_tree(workspace, {"app.ini": b"token=" + TOKEN, "keep.txt": b"k"})
    await capture_checkpoint(
        workspace,
        memory_store,
        memory_blobs,
        "t",
        CaptureOptions(secrets={"TOKEN": TOKEN}, data_dir=data_dir),
    )
    # The outside file holds the checkpoint's bytes: zeros where the secret was.
    outside.write_bytes(b"token=" + bytes(len(TOKEN)))  # noqa: ASYNC240
    os.unlink(workspace / "app.ini")
    before = _state(outside)
    with bind_mount_file(outside, workspace / "app.ini"):
        await restore_checkpoint(
            workspace,
            memory_store,
            memory_blobs,
            "t",
            RestoreOptions(secrets={"TOKEN": TOKEN}, data_dir=data_dir),
        )
        assert _state(outside) == before
    assert TOKEN not in outside.read_bytes()  # noqa: ASYNC240
