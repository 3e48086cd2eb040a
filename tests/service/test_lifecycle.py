"""Cancellation, deadlines and the reference API's crash story, with real daemon processes."""

from __future__ import annotations

import shutil

import grpc
import pytest

from checkpointd import errors
from checkpointd.service.client import RpcError
from checkpointd.v1 import checkpointd_pb2 as pb

from .conftest import Daemon, DaemonFactory, make_tree, tree_state


def _many_files(daemon: Daemon, count: int = 2000, size: int = 4096) -> None:
    for index in range(count):
        directory = daemon.workspace / f"d{index % 30:02d}"
        directory.mkdir(exist_ok=True)
        (directory / f"f{index:05d}").write_bytes(index.to_bytes(4, "big") * (size // 4))


async def test_cancelled_capture_releases_the_lease(daemon: Daemon) -> None:
    _many_files(daemon)
    async with daemon.client() as client:
        call = client.stub.Capture(pb.CaptureRequest(thread_id="t-cancel"))
        started_id = ""
        async for event in call:
            if event.HasField("started"):
                started_id = event.started.checkpoint_id
            elif event.HasField("progress") and event.progress.phase in ("scan", "pin", "upload"):
                call.cancel()
                break
        assert await call.code() == grpc.StatusCode.CANCELLED
        # The lease is free at once: a new capture of the thread succeeds.
        done = await client.capture("t-cancel")
        assert done.checkpoint.file_count == 2000
        assert started_id and started_id != done.checkpoint.id
        with pytest.raises(RpcError) as missing:
            await client.get_checkpoint(started_id)
        assert missing.value.reason == errors.MISSING_CHECKPOINT


async def test_deadline_stops_the_capture_and_releases_the_lease(daemon: Daemon) -> None:
    # Enough new files that a cold capture cannot finish inside the deadline
    # even on an idle machine (each one is a blob to create).
    _many_files(daemon, count=20_000)
    async with daemon.client() as client:
        request = pb.CaptureRequest(thread_id="t-deadline")
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for _ in client.stub.Capture(request, timeout=0.2):
                pass
        assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert await client.list_checkpoints("t-deadline") == []
        done = await client.capture("t-deadline")
        assert done.checkpoint.file_count == 20_000


async def test_crash_story(daemons: DaemonFactory) -> None:
    """Daemon A captures; kill -9 A and delete its workspace; daemon B on a new,
    empty workspace with the same store restores; the tree is identical."""
    a = daemons.start()
    make_tree(a.workspace, files=60)
    expected = tree_state(a.workspace)
    async with a.client() as client:
        done = await client.capture("t-crash", label="before the crash")
    a.kill()
    assert a.proc.returncode == -9
    shutil.rmtree(a.workspace)

    b = daemons.start()
    assert not any(b.workspace.iterdir())
    async with b.client() as client:
        restored = await client.restore("t-crash")
    assert restored.restored and restored.checkpoint.id == done.checkpoint.id
    assert tree_state(b.workspace) == expected


async def test_cancelled_restore_releases_the_lease_and_a_rerun_completes(daemon: Daemon) -> None:
    _many_files(daemon)
    expected = tree_state(daemon.workspace)
    async with daemon.client() as client:
        await client.capture("t-restore-cancel")
        shutil.rmtree(daemon.workspace)
        daemon.workspace.mkdir()
        call = client.stub.Restore(pb.RestoreRequest(thread_id="t-restore-cancel"))
        async for event in call:
            if event.HasField("progress") and event.progress.phase != "lease":
                call.cancel()
                break
        assert await call.code() == grpc.StatusCode.CANCELLED
        done = await client.restore("t-restore-cancel")
        assert done.restored
    assert tree_state(daemon.workspace) == expected
