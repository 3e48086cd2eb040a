"""Blob durability before the append (docs/design.md), on a real S3 server.

What capture relies on for an object store: a PUT, or a multipart upload's
completion, that returned success is durable and the object appears only
complete; so it appends only after every upload it started has returned, and
a failed or cancelled capture waits for its uploads to stop and appends
nothing. These tests check that ordering, and that a capture killed with
SIGKILL mid-upload never leaves a committed checkpoint pointing at a missing
or short blob."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import blake3
import pytest

from checkpointd.blobs import BlobStoreError, open_blobs
from checkpointd.blobs.packs import packed_blobs
from checkpointd.capture import CaptureOptions, capture_checkpoint
from checkpointd.chunks import iter_chunks
from checkpointd.errors import SandboxCheckpointWriterConflictError
from checkpointd.model import FileEntry
from checkpointd.progress import Progress
from checkpointd.restore import RestoreOptions, restore_checkpoint
from checkpointd.store import open_store

from . import fault_worker
from .conftest import snapshot_tree, write_tree

REPO = Path(__file__).resolve().parents[2]
KILLS = 8


class Tracked:
    """The real blob store, counting the puts in flight; ``fail`` makes the
    put of a key it accepts fail once the large uploads are under way."""

    def __init__(self, inner: Any, fail: Callable[[str], bool] | None = None) -> None:
        self._inner = inner
        self.url = inner.url
        self.in_flight = 0
        self.most_in_flight = 0
        self.fail = fail
        self.large_started = asyncio.Event()

    async def put(self, key: str, data: Any, *, if_absent: bool = True) -> bool:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if not isinstance(data, bytes):
                self.large_started.set()
            elif self.fail is not None and self.fail(key):
                await self.large_started.wait()
                raise BlobStoreError(f"put {key!r} on {self.url} failed: injected")
            return bool(await self._inner.put(key, data, if_absent=if_absent))
        finally:
            self.in_flight -= 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _key(data: bytes) -> str:
    return "sandbox-files/blake3/" + blake3.blake3(data).hexdigest()


@pytest.mark.s3
async def test_the_append_comes_after_every_upload_returned(
    store: Any, s3_blobs: Any, workspace: Path, data_dir: Path
) -> None:
    write_tree(
        workspace,
        {**{f"big/{n}.bin": os.urandom((6 << 20) + n) for n in range(3)}, "small.txt": b"s"},
    )
    blobs = Tracked(s3_blobs)
    at_append: list[int] = []

    def watch(report: Progress) -> None:
        if report.phase == "append" and not at_append:
            at_append.append(blobs.in_flight)

    result = await capture_checkpoint(
        workspace, store, blobs, "t", CaptureOptions(data_dir=data_dir, progress=watch)
    )
    assert at_append == [0]
    assert blobs.most_in_flight >= 1
    stored = packed_blobs(s3_blobs, store)  # small blobs are in a pack
    for entry in result.checkpoint.files:
        if isinstance(entry, FileEntry):
            info = await stored.head(entry.blob_key)
            assert info is not None and info.size == entry.size, entry.path


@pytest.mark.s3
async def test_a_failed_upload_stops_the_others_before_the_capture_fails(
    store: Any, s3_blobs: Any, workspace: Path, data_dir: Path
) -> None:
    small = b"the put of this one fails"
    write_tree(workspace, {"big.bin": os.urandom(24 << 20), "small.txt": small})
    # The put holding the small file fails: its own, or its pack's.
    blobs = Tracked(
        s3_blobs, fail=lambda key: key == _key(small) or key.startswith("sandbox-packs/")
    )
    with pytest.raises(BlobStoreError, match="injected"):
        await capture_checkpoint(workspace, store, blobs, "t", CaptureOptions(data_dir=data_dir))
    # Nothing still uploading behind the caller's back, nothing appended.
    assert blobs.in_flight == 0
    assert await store.get_head("t") is None


def _start_worker(
    env: dict[str, str], store_url: str, blobs_url: str, workspace: Path, data_dir: Path
) -> subprocess.Popen[str]:
    """A process capturing the changing workspace in a loop, once it is ready."""
    worker = subprocess.Popen(
        [sys.executable, "-m", "tests.engine.fault_worker", "capture", store_url, blobs_url,
         str(workspace), str(data_dir)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert worker.stdout is not None
    assert worker.stdout.readline().strip() == "ready"
    return worker


@pytest.mark.s3
@pytest.mark.parametrize("backend", ["s3", "file"])
async def test_a_cancelled_capture_waits_for_its_large_uploads_to_stop(
    backend: str, store: Any, s3_server: Any, workspace: Path, tmp_path: Path, data_dir: Path
) -> None:
    big = os.urandom(64 << 20)
    write_tree(workspace, {"big.bin": big})
    inner = (
        s3_server.open(f"cancel-{uuid.uuid4().hex}")
        if backend == "s3"
        else open_blobs(f"file://{tmp_path / 'blobs'}")
    )
    blobs = Tracked(inner)
    capture = asyncio.ensure_future(
        capture_checkpoint(workspace, store, blobs, "t", CaptureOptions(data_dir=data_dir))
    )
    await asyncio.wait_for(blobs.large_started.wait(), 30)
    capture.cancel()
    with pytest.raises(asyncio.CancelledError):
        await capture
    # Every upload it started has stopped (cancelled at once, not left to run
    # to its end), nothing was appended, and nothing appears later.
    assert blobs.in_flight == 0
    assert await store.get_head("t") is None
    assert await inner.head(_key(big)) is None
    await asyncio.sleep(1.0)
    assert await inner.head(_key(big)) is None
    if backend == "file":
        leftovers = [p for p in (tmp_path / "blobs").rglob("*") if p.is_file()]
        assert all(p.stat().st_size == len(big) for p in leftovers), leftovers


def _stored_parts(entry: FileEntry) -> list[tuple[str, int]]:
    """(key, size) of each blob a file is stored as: its chunks, or itself."""
    if entry.chunks:
        return [(chunk.key, chunk.length) for chunk in iter_chunks(entry.chunks)]
    return [(entry.blob_key, entry.size)]


async def _check_committed(store: Any, blobs: Any, verified: set[str]) -> int:
    """Every file of every committed checkpoint has every blob it is stored as
    (size and BLAKE3 checked once per key). Returns how many checkpoints there are."""
    checkpoints = await store.list("faults")
    blobs = packed_blobs(blobs, store)  # small blobs are read out of their packs
    for checkpoint in checkpoints:
        for entry in checkpoint.files:
            if not isinstance(entry, FileEntry):
                continue
            for key, size in _stored_parts(entry):
                if key in verified:
                    continue
                info = await blobs.head(key)
                assert info is not None, f"{checkpoint.id} names missing {key} ({entry.path})"
                assert info.size == size, f"{key}: {info.size} != {size}"
                assert _key(await blobs.get(key)) == key
                verified.add(key)
    return len(checkpoints)


@pytest.mark.s3
@pytest.mark.timeout(180)
async def test_capture_killed_mid_upload_never_commits_a_missing_or_short_blob(
    s3_server: Any, tmp_path: Path
) -> None:
    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    prefix = f"kill-{uuid.uuid4().hex}"
    blobs_url = s3_server.url(prefix)
    workspace, data_dir = tmp_path / "workspace", tmp_path / "data"
    workspace.mkdir()
    # Large files (multipart uploads of several parts) change every round.
    write_tree(workspace, {f"base/{n}.bin": os.urandom(12 << 20) for n in range(2)})
    env = {**os.environ, **s3_server.env()}
    rng = random.Random(4321)
    blobs = s3_server.open(prefix)
    verified: set[str] = set()
    store = await open_store(
        store_url, lease_duration_ms=fault_worker.LEASE_MS, renew_after_ms=fault_worker.RENEW_MS
    )
    try:
        for _ in range(KILLS):
            worker = _start_worker(env, store_url, blobs_url, workspace, data_dir)
            await asyncio.sleep(rng.uniform(0.2, 2.5))
            worker.send_signal(signal.SIGKILL)
            await asyncio.to_thread(worker.wait, 10)
            worker.stdout.close()
            await _check_committed(store, blobs, verified)
        assert await store.list("faults"), "no capture finished in any run: kills too early"
        # Big rewrites each round: a capture of the whole tree after the kills
        # (the last victim's lease expires first) completes and restores.
        for name in ("base/0.bin", "base/1.bin"):
            (workspace / name).write_bytes(os.urandom(12 << 20))
        deadline = asyncio.get_running_loop().time() + fault_worker.LEASE_MS / 1000 * 5
        while True:
            try:
                await capture_checkpoint(
                    workspace, store, blobs, "faults", CaptureOptions(data_dir=data_dir)
                )
                break
            except SandboxCheckpointWriterConflictError:
                # The killed worker's lease has not expired yet.
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.1)
        assert await _check_committed(store, blobs, verified) >= 1
        restored = tmp_path / "restored"
        await restore_checkpoint(
            restored, store, blobs, "faults", RestoreOptions(data_dir=data_dir)
        )
        assert snapshot_tree(restored) == snapshot_tree(workspace)
    finally:
        await store.aclose()
