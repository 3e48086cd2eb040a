"""A checkpoint records how it was taken (docs/design.md): restore uses its policy when
the caller gives none; an explicit policy still wins."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from checkpointd.capture import CaptureOptions, capture_checkpoint
from checkpointd.model import Policy
from checkpointd.restore import RestoreOptions, restore_checkpoint


def _workspace(root: Path) -> None:
    (root / "src").mkdir(parents=True)
    (root / "src" / "main.py").write_text("print('hi')\n")
    (root / "build").mkdir()
    (root / "build" / "out.o").write_bytes(b"\x7fELF")
    (root / "debug.log").write_text("log line\n")


async def test_restore_without_policy_uses_the_recorded_one(
    store: Any, blobs: Any, tmp_path: Path, data_dir: Path
) -> None:
    workspace = tmp_path / "ws"
    _workspace(workspace)
    policy = Policy(exclude=("build/", "*.log"))
    result = await capture_checkpoint(
        workspace, store, blobs, "t", CaptureOptions(policy=policy, data_dir=data_dir)
    )
    assert result.checkpoint.policy == policy
    assert {e.path for e in result.checkpoint.files} == {"src", "src/main.py"}
    stored = await store.get(result.checkpoint.id)
    assert stored.policy == policy

    (workspace / "src" / "main.py").write_text("changed\n")
    await restore_checkpoint(workspace, store, blobs, "t", RestoreOptions(data_dir=data_dir))
    assert (workspace / "src" / "main.py").read_text() == "print('hi')\n"
    # The capture left them out, so the plain restore leaves them alone.
    assert (workspace / "build" / "out.o").read_bytes() == b"\x7fELF"
    assert (workspace / "debug.log").read_text() == "log line\n"

    # An explicit policy wins: the default one selects build/ and debug.log.
    await restore_checkpoint(
        workspace, store, blobs, "t", RestoreOptions(policy=Policy(), data_dir=data_dir)
    )
    assert not (workspace / "build").exists()
    assert not (workspace / "debug.log").exists()


async def test_capture_without_policy_records_the_default(
    store: Any, blobs: Any, tmp_path: Path, data_dir: Path
) -> None:
    workspace = tmp_path / "ws"
    _workspace(workspace)
    result = await capture_checkpoint(
        workspace, store, blobs, "t", CaptureOptions(data_dir=data_dir)
    )
    assert result.checkpoint.policy == Policy()
    assert result.checkpoint.workspace_subdir == ""
    assert (await store.get(result.checkpoint.id)).policy == Policy()
