"""A large restore starts writing its staged data back while it stages (a native
thread calling ``syncfs`` on the workspace's filesystem, ``Writeback`` in
``rust/src/restore/writeback.rs``), and that thread ends with the restore, whether the
restore succeeds or fails."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from checkpointd.capture import CaptureOptions, capture_checkpoint
from checkpointd.errors import MISSING_BLOB, SandboxSnapshotError
from checkpointd.progress import Progress
from checkpointd.restore import RestoreOptions, restore_checkpoint

from .conftest import snapshot_tree, write_tree

# The thread's name as /proc shows it (15 bytes at most).
THREAD = "restore-writeba"
# Over the 32 MiB below which a restore leaves the whole sync to its end.
LARGE = {f"d{n}/blob{n}.bin": os.urandom(3 << 20) for n in range(12)}
SMALL = {f"small/{n}.txt": f"small {n}\n" for n in range(200)}


def _threads_named(name: str) -> int:
    count = 0
    for task in os.listdir("/proc/self/task"):
        try:
            comm = Path(f"/proc/self/task/{task}/comm").read_text().strip()
        except FileNotFoundError:
            continue  # ended while we listed
        count += comm == name
    return count


async def test_a_large_restore_writes_back_while_it_applies_and_stops_after(
    store: Any, blobs: Any, workspace: Path, tmp_path: Path, data_dir: Path
) -> None:
    write_tree(workspace, {**LARGE, **SMALL})
    await capture_checkpoint(workspace, store, blobs, "t", CaptureOptions(data_dir=data_dir))
    during: dict[str, int] = {}

    def progress(report: Progress) -> None:
        if report.phase in ("apply", "record") and report.phase not in during:
            during[report.phase] = _threads_named(THREAD)

    restored = tmp_path / "restored"
    await restore_checkpoint(
        restored, store, blobs, "t", RestoreOptions(data_dir=data_dir, progress=progress)
    )
    assert snapshot_tree(restored) == snapshot_tree(workspace)
    assert during == {"apply": 1, "record": 1}
    assert _threads_named(THREAD) == 0


async def test_a_small_restore_starts_no_writeback(
    store: Any, blobs: Any, workspace: Path, tmp_path: Path, data_dir: Path
) -> None:
    write_tree(workspace, SMALL)
    await capture_checkpoint(workspace, store, blobs, "t", CaptureOptions(data_dir=data_dir))
    seen: list[int] = []

    def progress(report: Progress) -> None:
        if report.phase == "apply":
            seen.append(_threads_named(THREAD))

    await restore_checkpoint(
        tmp_path / "restored",
        store,
        blobs,
        "t",
        RestoreOptions(data_dir=data_dir, progress=progress),
    )
    assert seen and set(seen) == {0}


@pytest.mark.parametrize("blobs", ["file"], indirect=True)
async def test_a_failed_large_restore_stops_its_writeback(
    store: Any, blobs: Any, workspace: Path, tmp_path: Path, data_dir: Path
) -> None:
    write_tree(workspace, LARGE)
    await capture_checkpoint(workspace, store, blobs, "t", CaptureOptions(data_dir=data_dir))
    # One large blob gone from the bucket: MISSING_BLOB after staging began.
    victim = next(info.key for info in await blobs.list("sandbox-files/"))
    await blobs.delete(victim)
    restored = tmp_path / "restored"
    with pytest.raises(SandboxSnapshotError) as caught:
        await restore_checkpoint(restored, store, blobs, "t", RestoreOptions(data_dir=data_dir))
    assert caught.value.code == MISSING_BLOB
    assert _threads_named(THREAD) == 0
    assert list(restored.iterdir()) == []  # nothing moved in, staging removed
