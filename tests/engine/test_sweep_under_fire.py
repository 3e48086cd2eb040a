"""Sweep under fire: sweeps with older_than_ms=0 run in a loop while several threads
capture, prune and reuse old content; afterwards every checkpoint restores."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

import pytest

from checkpointd.blobs import open_blobs
from checkpointd.blobs.packs import packed_blobs
from checkpointd.capture import CaptureOptions, capture_checkpoint
from checkpointd.restore import RestoreOptions, restore_checkpoint
from checkpointd.store import open_store
from checkpointd.sweep import prune, sweep_blobs

from .conftest import snapshot_tree

THREADS = 3
DURATION_S = 5.0
# A small pool of contents shared by all threads, so captures keep reusing blobs
# that pruning has just made unreferenced: exactly what a sweep wants to delete.
POOL = [bytes([n]) * (100 + n) for n in range(7)] + [bytes(range(256)) * 8192]


class SlowToAnswer:
    """The real blob store, but ``head`` answers "present" late: it widens the
    window in which an unsafe capture would trust a blob a sweep is deleting."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.url = inner.url

    async def head(self, key: str) -> Any:
        info = await self._inner.head(key)
        await asyncio.sleep(0.02)
        return info

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@pytest.mark.timeout(60)
async def test_sweeps_in_a_loop_never_break_concurrent_captures(tmp_path: Path) -> None:
    store = await open_store(f"sqlite:///{tmp_path / 'store.db'}")
    blobs = SlowToAnswer(open_blobs(f"file://{tmp_path / 'blobs'}"))
    deadline = time.monotonic() + DURATION_S
    expected: dict[str, dict[str, Any]] = {}  # checkpoint id → the tree it captured
    sweeps = {"runs": 0, "deleted": 0}

    async def capture_loop(thread: str) -> None:
        rng = random.Random(thread)
        workspace, data_dir = tmp_path / thread, tmp_path / f"data-{thread}"
        workspace.mkdir()
        rounds = 0
        while time.monotonic() < deadline:
            rounds += 1
            for name in ("a.txt", "b.txt", "c/d.bin"):
                path = workspace / name
                path.parent.mkdir(exist_ok=True)
                path.write_bytes(rng.choice(POOL))
            result = await capture_checkpoint(
                workspace, store, blobs, thread, CaptureOptions(data_dir=data_dir)
            )
            expected[result.checkpoint.id] = snapshot_tree(workspace, with_mtime=False)
            # Checked at once, before a later capture could upload a lost blob again.
            for key in result.checkpoint.blob_keys():
                assert await packed_blobs(blobs, store).head(key) is not None, (
                    f"{key} swept while referenced"
                )
            if rounds % 3 == 0:
                await prune(store, thread, 1)

    async def sweep_loop() -> None:
        while time.monotonic() < deadline:
            report = await sweep_blobs(store, blobs, 0)
            assert not report.failures
            sweeps["runs"] += 1
            sweeps["deleted"] += len(report.deleted)
            await asyncio.sleep(0)

    try:
        await asyncio.gather(
            *(capture_loop(f"thread-{n}") for n in range(THREADS)), sweep_loop(), sweep_loop()
        )
        assert sweeps["runs"] > 5 and sweeps["deleted"] > 0, sweeps
        (tmp_path / "restore").mkdir()
        survivors = [c for n in range(THREADS) for c in await store.list(f"thread-{n}")]
        assert survivors
        for checkpoint in survivors:
            target = tmp_path / "restore" / checkpoint.id
            await restore_checkpoint(
                target,
                store,
                blobs,
                checkpoint.thread_id,
                RestoreOptions(checkpoint_id=checkpoint.id, data_dir=tmp_path / "data-restore"),
            )
            assert snapshot_tree(target, with_mtime=False) == expected[checkpoint.id]
    finally:
        await store.aclose()
