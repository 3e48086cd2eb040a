"""A capture retried after a failure past its scan (a full disk at the append,
a SIGKILL) takes the cold capture's path: its scan reads and hands over every
file the failed one hashed (``files_hashed``), rather than trusting hashes the
failed capture left in the stat cache and reading each file again in the
upload, one at a time (measured in benchmarks/retry_bench.py). A committed
capture's hashes are trusted as before."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from checkpointd.blobs import open_blobs
from checkpointd.capture import CaptureOptions, capture_checkpoint
from checkpointd.errors import NO_SPACE, SandboxCheckpointWriterConflictError, SandboxSnapshotError
from checkpointd.restore import RestoreOptions, restore_checkpoint
from checkpointd.store import open_store

from ..fixtures.tmpfs import small_tmpfs
from . import capture_worker
from .conftest import snapshot_tree, write_tree

REPO = Path(__file__).resolve().parents[2]
FILES = 3000


def _tree(count: int, salt: str) -> dict[str, bytes | str]:
    return {f"d{n % 30}/f{n}.txt": f"{salt} file {n}\n".encode() * 20 for n in range(count)}


async def test_a_retry_after_no_space_at_the_append_scans_like_a_cold_capture(
    tmp_path: Path, workspace: Path, data_dir: Path
) -> None:
    write_tree(workspace, _tree(FILES, "first"))
    blobs = open_blobs(f"file://{tmp_path / 'blobs'}")
    with small_tmpfs(tmp_path / "full", size="1m") as full:
        store = await open_store(f"sqlite://{full / 'store.db'}")
        try:
            with pytest.raises(SandboxSnapshotError) as caught:
                await capture_checkpoint(
                    workspace, store, blobs, "t", CaptureOptions(data_dir=data_dir)
                )
            assert caught.value.code == NO_SPACE  # the store's file, past the scan
            await asyncio.to_thread(
                subprocess.run, ["mount", "-o", "remount,size=64m", str(full)], check=True
            )

            retry = await capture_checkpoint(
                workspace, store, blobs, "t", CaptureOptions(data_dir=data_dir)
            )
            # Every file read by the scan (and handed to the upload), none
            # trusted from the failed capture's hashes.
            assert (retry.stats.files_hashed, retry.stats.files_reused) == (FILES, 0)
            again = await capture_checkpoint(
                workspace, store, blobs, "t", CaptureOptions(data_dir=data_dir)
            )
            assert (again.stats.files_hashed, again.stats.files_reused) == (0, FILES)
            restored = tmp_path / "restored"
            await restore_checkpoint(
                restored, store, blobs, "t", RestoreOptions(data_dir=tmp_path / "d2")
            )
            assert snapshot_tree(restored) == snapshot_tree(workspace)
        finally:
            await store.aclose()


def _kill_past_the_scan(store_url: str, blobs_url: str, workspace: Path, data_dir: Path) -> bool:
    """Run one capture in a process of its own and SIGKILL it once its scan is
    over (at the ``pin`` phase); False when it finished first."""
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.engine.capture_worker",
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
    finished = True
    for line in process.stdout:
        if line.strip() == "pin":
            process.send_signal(signal.SIGKILL)
            finished = False
            break
    process.wait(timeout=30)
    process.stdout.close()
    return finished or process.returncode == 0


@pytest.mark.timeout(120)
async def test_a_retry_after_a_kill_past_the_scan_scans_like_a_cold_capture(
    tmp_path: Path, workspace: Path, data_dir: Path
) -> None:
    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    blobs_url = f"file://{tmp_path / 'blobs'}"
    store = await open_store(
        store_url,
        lease_duration_ms=capture_worker.LEASE_MS,
        renew_after_ms=capture_worker.RENEW_MS,
    )
    blobs = open_blobs(blobs_url)
    try:
        for attempt in range(5):
            write_tree(workspace, _tree(FILES * 4, f"attempt {attempt}"))
            if not _kill_past_the_scan(store_url, blobs_url, workspace, data_dir):
                break
        else:
            pytest.fail("every capture finished before the kill")
        deadline = time.monotonic() + 10
        while True:  # the killed capture's lease runs out first
            try:
                retry = await capture_checkpoint(
                    workspace, store, blobs, "retry", CaptureOptions(data_dir=data_dir)
                )
                break
            except SandboxCheckpointWriterConflictError:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
        assert (retry.stats.files_hashed, retry.stats.files_reused) == (FILES * 4, 0)
        # The killed capture's pending stat cache went with the retry's start.
        leftovers = [p for p in os.listdir(data_dir / "statcache") if ".pending-" in p]
        assert leftovers == []
        restored = tmp_path / "restored"
        await restore_checkpoint(
            restored, store, blobs, "retry", RestoreOptions(data_dir=tmp_path / "d2")
        )
        assert snapshot_tree(restored) == snapshot_tree(workspace)
    finally:
        await store.aclose()
