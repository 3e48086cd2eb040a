"""SIGTERM: health turns NOT_SERVING, running calls finish within the grace
period, calls still running after it are cancelled and their leases released."""

from __future__ import annotations

import asyncio
import signal
import socket
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2

from checkpointd.store import open_store
from checkpointd.v1 import checkpointd_pb2 as pb

from .conftest import Daemon, DaemonFactory


def _many_files(daemon: Daemon, count: int) -> None:
    for index in range(count):
        (daemon.workspace / f"f{index:05d}").write_bytes(index.to_bytes(4, "big") * 1024)


async def test_sigterm_lets_a_running_capture_finish(daemons: DaemonFactory) -> None:
    daemon = daemons.start(extra=("--grace-period", "60s"))
    _many_files(daemon, 800)
    async with daemon.client() as client:
        watch = client.health_stub.Watch(health_pb2.HealthCheckRequest())
        statuses = watch.__aiter__()
        assert (await statuses.__anext__()).status == health_pb2.HealthCheckResponse.SERVING
        events = client.stub.Capture(pb.CaptureRequest(thread_id="t-drain")).__aiter__()
        assert (await events.__anext__()).HasField("started")
        daemon.proc.send_signal(signal.SIGTERM)
        assert (await statuses.__anext__()).status == health_pb2.HealthCheckResponse.NOT_SERVING
        with_done = [event async for event in events if event.HasField("done")]
        assert with_done and with_done[0].done.checkpoint.file_count == 800
    assert await asyncio.to_thread(daemon.proc.wait, 30) == 0
    assert "draining" in daemon.log_text()


async def test_calls_past_the_grace_period_are_cancelled_and_release_their_lease(
    daemons: DaemonFactory,
) -> None:
    daemon = daemons.start(extra=("--grace-period", "0.2s"))
    # Enough new files that the capture outlives the grace period on an idle machine.
    _many_files(daemon, 20_000)
    async with daemon.client() as client:
        call = client.stub.Capture(pb.CaptureRequest(thread_id="t-cut"))
        events = call.__aiter__()
        while (
            not (event := await events.__anext__()).HasField("progress")
            or event.progress.phase == "lease"
        ):
            pass
        daemon.proc.send_signal(signal.SIGTERM)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for _ in events:
                pass
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert await asyncio.to_thread(daemon.proc.wait, 30) == 0
    store = await open_store(daemon.store)
    try:
        assert await store.list("t-cut") == []
        lease = await store.acquire_writer("t-cut")  # would raise WRITER_CONFLICT if leaked
        await lease.release()
    finally:
        await store.aclose()


def test_not_serving_until_the_stores_open(daemons: DaemonFactory) -> None:
    # A "database" that accepts connections and never answers: opening the store hangs.
    silent = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    port = silent.getsockname()[1]
    try:
        daemon = daemons.start(store=f"postgresql://u:p@127.0.0.1:{port}/db", wait=False)
        deadline = time.monotonic() + 20
        while daemon.health() is None:
            assert time.monotonic() < deadline and daemon.proc.poll() is None, daemon.log_text()
            time.sleep(0.05)
        assert daemon.health() == "NOT_SERVING"
        time.sleep(0.5)
        assert daemon.health() == "NOT_SERVING"
    finally:
        silent.close()
    # The store cannot open: the daemon gives up with "unavailable" and never served.
    assert daemon.proc.wait(60) == 7, daemon.log_text()
    assert "serving (store" not in daemon.log_text()


def test_sigterm_while_the_stores_open_stops_at_once(daemons: DaemonFactory) -> None:
    silent = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        daemon = daemons.start(
            store=f"postgresql://u:p@127.0.0.1:{silent.getsockname()[1]}/db", wait=False
        )
        deadline = time.monotonic() + 20
        while daemon.health() != "NOT_SERVING":
            assert time.monotonic() < deadline and daemon.proc.poll() is None, daemon.log_text()
            time.sleep(0.05)
        daemon.proc.send_signal(signal.SIGTERM)
        assert daemon.proc.wait(15) == 0, daemon.log_text()
    finally:
        silent.close()
