"""Chunked files under SIGKILL and a concurrent sweep: a capture or a restore
killed at any point leaves the store consistent (check finds nothing), and
running again completes the work. Real processes, SQLite, a blob directory."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from checkpointd.blobs import open_blobs
from checkpointd.blobs.packs import packed_blobs
from checkpointd.capture import CaptureOptions, capture_checkpoint
from checkpointd.check import check_store
from checkpointd.restore import RestoreOptions, restore_checkpoint
from checkpointd.store import open_store
from checkpointd.sweep import sweep_blobs

REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20
KILLS = 6
# Short leases: a killed worker's lease expires soon after.
LEASE = {"lease_duration_ms": 300, "renew_after_ms": 100}

# Captures (each after an edit of the big file) or restores, in a loop, with
# chunking on (the default outside the tests' fixture).
WORKER = """
import asyncio, random, sys
from checkpointd.blobs import open_blobs
from checkpointd.capture import CaptureOptions, capture_checkpoint
from checkpointd.errors import SandboxCheckpointWriterConflictError
from checkpointd.restore import RestoreOptions, restore_checkpoint
from checkpointd.store import open_store
mode, store_url, blobs_url, ws, data = sys.argv[1:6]
async def main():
    async with await open_store(store_url, **LEASE) as store:
        blobs = open_blobs(blobs_url)
        print("ready", flush=True)
        while True:
            try:
                if mode == "capture":
                    with open(ws + "/big", "r+b") as f:
                        f.seek(random.randrange(0, 8 << 20))
                        f.write(random.randbytes(4096))
                    await capture_checkpoint(ws, store, blobs, "t", CaptureOptions(data_dir=data))
                else:
                    await restore_checkpoint(ws, store, blobs, "t", RestoreOptions(data_dir=data))
            except SandboxCheckpointWriterConflictError:
                await asyncio.sleep(0.05)  # the previous victim's lease has not expired yet
asyncio.run(main())
"""


def _start(mode: str, tmp_path: Path, ws: Path, data: Path) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"LEASE = {LEASE!r}\n" + WORKER,
            mode,
            f"sqlite:///{tmp_path}/store.db",
            f"file://{tmp_path}/blobs",
            str(ws),
            str(data),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready"
    return process


def _kill_after(process: subprocess.Popen[str], seconds: float) -> None:
    time.sleep(seconds)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert process.stdout is not None
    process.stdout.close()
    time.sleep(LEASE["lease_duration_ms"] / 1000)  # its lease expires


def _edit(path: Path, rng: random.Random) -> None:
    with open(path, "r+b") as f:
        f.seek(rng.randrange(0, 8 * MIB))
        f.write(rng.randbytes(4096))


def _prepare(ws: Path) -> None:
    ws.mkdir()
    (ws / "big").write_bytes(random.Random(1).randbytes(8 * MIB))
    (ws / "small").write_bytes(b"small file")


async def _consistent(tmp_path: Path) -> None:
    async with await open_store(f"sqlite:///{tmp_path}/store.db", **LEASE) as store:
        report = await check_store(
            store, packed_blobs(open_blobs(f"file://{tmp_path}/blobs"), store)
        )
        assert report.findings == []


@pytest.mark.slow
async def test_a_chunked_capture_killed_anywhere_leaves_a_consistent_store(
    chunked, tmp_path: Path
) -> None:
    ws, data = tmp_path / "ws", tmp_path / "data"
    _prepare(ws)
    rng = random.Random(7)
    for _ in range(KILLS):
        process = _start("capture", tmp_path, ws, data)
        await asyncio.to_thread(_kill_after, process, rng.uniform(0.05, 1.5))
        await _consistent(tmp_path)
    # Running again completes: the workspace as it is now round-trips.
    async with await open_store(f"sqlite:///{tmp_path}/store.db", **LEASE) as store:
        blobs = open_blobs(f"file://{tmp_path}/blobs")
        await capture_checkpoint(ws, store, blobs, "t", CaptureOptions(data_dir=data))
        await restore_checkpoint(
            tmp_path / "out", store, blobs, "t", RestoreOptions(data_dir=tmp_path / "d2")
        )
    assert (tmp_path / "out" / "big").read_bytes() == (ws / "big").read_bytes()
    await _consistent(tmp_path)


@pytest.mark.slow
async def test_a_chunked_restore_killed_anywhere_completes_when_run_again(
    chunked, tmp_path: Path
) -> None:
    ws, data = tmp_path / "ws", tmp_path / "data"
    _prepare(ws)
    want = (ws / "big").read_bytes()
    async with await open_store(f"sqlite:///{tmp_path}/store.db", **LEASE) as store:
        await capture_checkpoint(ws, store, open_blobs(f"file://{tmp_path}/blobs"), "t")
    target = tmp_path / "target"
    target.mkdir()
    rng = random.Random(8)
    for round_ in range(KILLS):
        # The target holds some other version each time.
        (target / "big").write_bytes(random.Random(round_).randbytes(8 * MIB))
        process = _start("restore", tmp_path, target, data)
        await asyncio.to_thread(_kill_after, process, rng.uniform(0.05, 1.0))
    async with await open_store(f"sqlite:///{tmp_path}/store.db", **LEASE) as store:
        await restore_checkpoint(target, store, open_blobs(f"file://{tmp_path}/blobs"), "t")
    assert (target / "big").read_bytes() == want
    assert not [p for p in os.listdir(target) if p.startswith(".checkpointd")]
    await _consistent(tmp_path)


async def test_a_sweep_during_chunked_captures_never_loses_a_chunk(chunked, tmp_path: Path) -> None:
    """Sweeps of any age run while captures of an edited chunked file go on:
    every checkpoint stays restorable and check finds nothing."""
    ws = tmp_path / "ws"
    _prepare(ws)
    rng = random.Random(9)
    async with await open_store(f"sqlite:///{tmp_path}/store.db", **LEASE) as store:
        blobs = packed_blobs(open_blobs(f"file://{tmp_path}/blobs"), store)
        ids = []
        for _ in range(4):
            _edit(ws / "big", rng)
            capture = asyncio.ensure_future(
                capture_checkpoint(
                    ws, store, blobs, "t", CaptureOptions(data_dir=tmp_path / "data")
                )
            )
            while not capture.done():
                await sweep_blobs(store, blobs, 0)
            ids.append((await capture).checkpoint.id)
        await sweep_blobs(store, blobs, 0)
        for checkpoint_id in ids:
            out = tmp_path / f"out-{checkpoint_id}"
            await restore_checkpoint(
                out,
                store,
                blobs,
                "t",
                RestoreOptions(checkpoint_id=checkpoint_id, data_dir=tmp_path / "d2"),
            )
    await _consistent(tmp_path)
