"""Faults: a real process killed with SIGKILL at random points of a capture or a
restore leaves a consistent store, and running again completes the work."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from checkpointd.blobs import open_blobs
from checkpointd.blobs.packs import packed_blobs
from checkpointd.capture import CaptureOptions, capture_checkpoint
from checkpointd.errors import SandboxCheckpointWriterConflictError
from checkpointd.restore import RestoreOptions, restore_checkpoint
from checkpointd.store import open_store

from . import fault_worker
from .conftest import snapshot_tree, write_tree

REPO = Path(__file__).resolve().parents[2]
CAPTURE_KILLS = 20
RESTORE_KILLS = 5


def _start(
    mode: str, store_url: str, blobs_url: str, workspace: Path, data_dir: Path
) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.engine.fault_worker",
            mode,
            store_url,
            blobs_url,
            str(workspace),
            str(data_dir),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready"
    return process


def _wait_for_line(process: subprocess.Popen[str], wanted: str) -> None:
    """Read the worker's output up to the line ``wanted`` (or its end)."""
    assert process.stdout is not None
    for line in process.stdout:
        if line.strip() == wanted:
            return


def _kill(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=10)
    assert process.stdout is not None
    process.stdout.close()


async def _retry_while_leased(work: Any) -> Any:
    """Run ``work()``; a killed process's lease lasts until it expires."""
    deadline = time.monotonic() + fault_worker.LEASE_MS / 1000 * 5
    while True:
        try:
            return await work()
        except SandboxCheckpointWriterConflictError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


async def _assert_every_reference_present(store: Any, blobs: Any) -> None:
    for reference in await store.list_blob_references():
        assert await packed_blobs(blobs, store).head(reference.key) is not None, reference.key


@pytest.mark.timeout(90)
async def test_capture_killed_at_random_points(tmp_path: Path) -> None:
    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    blobs_url = f"file://{tmp_path / 'blobs'}"
    workspace, data_dir = tmp_path / "workspace", tmp_path / "data"
    workspace.mkdir()
    write_tree(workspace, {f"base/{n}.txt": os.urandom(2000) for n in range(50)})
    rng = random.Random(1234)
    store = await open_store(
        store_url, lease_duration_ms=fault_worker.LEASE_MS, renew_after_ms=fault_worker.RENEW_MS
    )
    blobs = open_blobs(blobs_url)
    try:
        for _ in range(CAPTURE_KILLS):
            process = _start("capture", store_url, blobs_url, workspace, data_dir)
            await asyncio.sleep(rng.uniform(0.0, 0.6))
            _kill(process)
            await _assert_every_reference_present(store, blobs)
        checkpoints = await store.list("faults")
        assert checkpoints, "no capture finished in any run: the kills came too early"
        # The last victim's lease expires; then a capture succeeds and restores.
        result = await _retry_while_leased(
            lambda: capture_checkpoint(
                workspace, store, blobs, "faults", CaptureOptions(data_dir=data_dir)
            )
        )
        assert result.checkpoint.parent_checkpoint_id == checkpoints[-1].id
        await _assert_every_reference_present(store, blobs)
        restored = tmp_path / "restored"
        await restore_checkpoint(
            restored, store, blobs, "faults", RestoreOptions(data_dir=data_dir)
        )
        assert snapshot_tree(restored) == snapshot_tree(workspace)
    finally:
        await store.aclose()


@pytest.mark.timeout(90)
async def test_restore_killed_then_run_again_completes(tmp_path: Path) -> None:
    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    blobs_url = f"file://{tmp_path / 'blobs'}"
    source, target, data_dir = tmp_path / "source", tmp_path / "target", tmp_path / "data"
    source.mkdir()
    files: dict[str, bytes | str] = {f"d{n % 10}/f{n}.txt": os.urandom(3000) for n in range(300)}
    files.update({f"large/{n}.bin": os.urandom(4 << 20) for n in range(4)})
    files["links/to-large"] = "../large/0.bin"
    write_tree(source, files)
    expected = snapshot_tree(source)
    store = await open_store(
        store_url, lease_duration_ms=fault_worker.LEASE_MS, renew_after_ms=fault_worker.RENEW_MS
    )
    blobs = open_blobs(blobs_url)
    rng = random.Random(99)
    try:
        await capture_checkpoint(source, store, blobs, "faults", CaptureOptions(data_dir=data_dir))
        interrupted = 0
        for attempt in range(RESTORE_KILLS):
            # Start from a different tree each time so there is much to change.
            write_tree(target, {f"d{n % 10}/f{n}.txt": b"old" for n in range(0, 300, 3)})
            process = _start("restore", store_url, blobs_url, target, data_dir)
            # A restore from a local bucket takes tens of milliseconds: every
            # other kill is aimed at the apply phase, the others land anywhere.
            if attempt % 2:
                _wait_for_line(process, "apply")
                await asyncio.sleep(rng.uniform(0.0, 0.01))
            else:
                await asyncio.sleep(rng.uniform(0.0, 0.08))
            _kill(process)
            if snapshot_tree(target) != expected:
                interrupted += 1  # killed before or while it changed the tree
            await _retry_while_leased(
                lambda: restore_checkpoint(
                    target, store, blobs, "faults", RestoreOptions(data_dir=data_dir)
                )
            )
            assert snapshot_tree(target) == expected
            assert not [n for n in os.listdir(target) if n.startswith(".checkpointd")]
        assert interrupted, "every kill came after the restore had finished"
    finally:
        await store.aclose()
