"""A directory chain deeper than a checkpoint goes (``rust/src/walk.rs``
MAX_DEPTH): capture refuses it as UNSUPPORTED_ENTRY ``too-deep`` naming the
path, and restore leaves it alone (with a warning) instead of walking it."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from checkpointd.capture import CaptureOptions, capture_checkpoint
from checkpointd.errors import UNSUPPORTED_ENTRY, SandboxSnapshotError
from checkpointd.restore import RestoreOptions, restore_checkpoint

from ..native.test_deep_trees import (
    MAX_DEPTH,
    MAX_PATH_BYTES,
    chain_path,
    make_chain,
    remove_chain,
)
from .conftest import write_tree


async def test_capture_refuses_a_chain_deeper_than_the_limit(
    memory_store: Any, memory_blobs: Any, workspace: Path, data_dir: Path
) -> None:
    write_tree(workspace, {"ok.txt": b"fine"})
    make_chain(workspace, MAX_DEPTH + 20)
    try:
        with pytest.raises(SandboxSnapshotError) as raised:
            await capture_checkpoint(
                workspace, memory_store, memory_blobs, "t", CaptureOptions(data_dir=data_dir)
            )
    finally:
        remove_chain(workspace)
    assert raised.value.code == UNSUPPORTED_ENTRY
    assert raised.value.details["paths"] == [chain_path(MAX_DEPTH + 1)]
    assert "too-deep" in str(raised.value)


async def test_capture_names_a_path_too_long_in_a_short_message(
    memory_store: Any, memory_blobs: Any, workspace: Path, data_dir: Path
) -> None:
    long = "n" * 250
    make_chain(workspace, 20, name=long)
    try:
        with pytest.raises(SandboxSnapshotError) as raised:
            await capture_checkpoint(
                workspace, memory_store, memory_blobs, "t", CaptureOptions(data_dir=data_dir)
            )
    finally:
        remove_chain(workspace, name=long)
    deepest = next(n for n in range(1, 21) if len(chain_path(n, long)) > MAX_PATH_BYTES)
    assert raised.value.code == UNSUPPORTED_ENTRY
    assert raised.value.details["paths"] == [chain_path(deepest, long)]
    # The path itself is over 4 KiB: the message shows its end.
    assert "path-too-long" in str(raised.value) and len(str(raised.value)) < 1024


async def test_restore_leaves_a_chain_deeper_than_the_limit_alone(
    memory_store: Any,
    memory_blobs: Any,
    workspace: Path,
    data_dir: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    write_tree(workspace, {"ok.txt": b"fine"})
    await capture_checkpoint(
        workspace, memory_store, memory_blobs, "t", CaptureOptions(data_dir=data_dir)
    )
    (workspace / "ok.txt").write_bytes(b"changed")
    make_chain(workspace, MAX_DEPTH + 20)
    try:
        with caplog.at_level(logging.WARNING, logger="checkpointd.restore"):
            await restore_checkpoint(
                workspace, memory_store, memory_blobs, "t", RestoreOptions(data_dir=data_dir)
            )
        assert (workspace / "ok.txt").read_bytes() == b"fine"
        # The chain's directories hold what lies too deep: they all stay.
        assert (workspace / chain_path(MAX_DEPTH + 20) / "bottom.txt").exists()
        assert "deeper than a checkpoint goes" in caplog.text
    finally:
        remove_chain(workspace)
