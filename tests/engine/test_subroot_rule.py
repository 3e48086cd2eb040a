"""One sub-root rule: every operation spells ``workspace_subdir`` the same way
and opens it beneath the workspace's fd, one component at a time."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from checkpointd import (
    CaptureOptions,
    RestoreOptions,
    _native,
    capture_checkpoint,
    open_blobs,
    open_store,
    restore_checkpoint,
)
from checkpointd.capture import check_subroot
from checkpointd.errors import INVALID_PATH, SandboxSnapshotError
from checkpointd.validation import checked_subdir

from .conftest import write_tree


@pytest.mark.parametrize("spelled", ["", ".", "./", ".//", "/", "//"])
def test_every_spelling_of_the_whole_workspace_is_the_root(spelled: str) -> None:
    assert checked_subdir(spelled) == ""


def test_a_sub_root_loses_only_its_trailing_slashes() -> None:
    assert checked_subdir("a/b") == "a/b"
    assert checked_subdir("a/b//") == "a/b"


@pytest.mark.parametrize(
    "bad", ["../x", "/etc", "a/../b", "a//b", "./a", "a/./b", "a\\b", "a\x00b"]
)
def test_a_path_that_is_not_workspace_relative_is_refused_by_name(bad: str) -> None:
    with pytest.raises(SandboxSnapshotError) as caught:
        checked_subdir(bad)
    assert caught.value.code == INVALID_PATH
    assert caught.value.details["path"] == bad


async def test_capture_and_restore_read_dot_slash_slash_alike(tmp_path: Path) -> None:
    """Capture once refused ".//" while restore took it for the whole workspace."""
    workspace = tmp_path / "ws"
    write_tree(workspace, {"a.txt": b"a", "sub/b.txt": b"b"})
    async with await open_store("memory://") as store:
        blobs = open_blobs(f"file://{tmp_path / 'blobs'}")
        options = CaptureOptions(workspace_subdir=".//", data_dir=tmp_path / "data")
        result = await capture_checkpoint(workspace, store, blobs, "t", options)
        assert result.checkpoint.workspace_subdir == ""
        assert {entry.path for entry in result.checkpoint.files} >= {"a.txt", "sub/b.txt"}
        (workspace / "a.txt").write_bytes(b"changed")
        restored = await restore_checkpoint(
            workspace,
            store,
            blobs,
            "t",
            RestoreOptions(workspace_subdir=".//", data_dir=tmp_path / "data"),
        )
        assert restored is not None
        assert (workspace / "a.txt").read_bytes() == b"a"


def test_a_symlink_or_a_file_on_the_way_is_refused_early(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    outside = tmp_path / "outside"
    write_tree(workspace, {"dir/inner/x": b"x", "file.txt": b"f"})
    outside.mkdir()
    (workspace / "dir" / "link").symlink_to(outside)
    for requested in ("dir/link", "dir/link/deeper", "file.txt/x"):
        with pytest.raises(SandboxSnapshotError) as caught:
            check_subroot(str(workspace), requested)
        assert caught.value.code == INVALID_PATH
        assert caught.value.details["path"] == requested


def test_a_real_or_missing_sub_root_passes_the_early_check(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    write_tree(workspace, {"dir/inner/x": b"x"})
    for requested in ("dir", "dir/inner/", "dir/new", "missing/deeper", "."):
        check_subroot(str(workspace), requested)


def test_open_beneath_makes_only_the_last_component(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    root = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd = _native.open_beneath(root, "a/b", create=True)
        os.close(fd)
        assert (tmp_path / "a" / "b").is_dir()
        with pytest.raises(FileNotFoundError) as caught:
            _native.open_beneath(root, "c/d", create=True)
        assert caught.value.filename == "c/d"
        assert not (tmp_path / "c").exists()
        with pytest.raises(OSError) as dotted:
            _native.open_beneath(root, "a/../a")
        assert dotted.value.errno == errno.EXDEV
    finally:
        os.close(root)
