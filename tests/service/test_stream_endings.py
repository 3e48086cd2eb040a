"""A long-work stream read to its result is a success in the daemon's log, however
the client closes it: no ``WARNING ... failed: CANCELLED`` once ``done`` (Capture,
Restore) or the ``summary`` (SweepBlobs, Check) went out; a call cancelled before
its result is still logged as the failure it is."""

from __future__ import annotations

import asyncio
import time

import grpc

from checkpointd.service.config import grpc_address
from checkpointd.v1 import checkpointd_pb2 as pb
from checkpointd.v1 import checkpointd_pb2_grpc as pb_grpc

from .conftest import Daemon, make_tree

# The daemon logs a cancellation within milliseconds; give it this long.
LOG_WAIT_S = 1.5


async def _read_until(call: object, final: str) -> None:
    """Read the stream until its ``final`` event, then close it (cancel)."""
    async for event in call:  # type: ignore[attr-defined]
        if event.HasField(final):
            break
    call.cancel()  # type: ignore[attr-defined]


def _cancelled_lines(daemon: Daemon) -> list[str]:
    return [line for line in daemon.log_text().splitlines() if "failed: CANCELLED" in line]


async def test_closing_the_stream_after_its_result_logs_no_failure(daemon: Daemon) -> None:
    make_tree(daemon.workspace, files=30)
    async with grpc.aio.insecure_channel(grpc_address(daemon.address)) as channel:
        stub = pb_grpc.CheckpointdStub(channel)
        for _ in range(5):
            await _read_until(stub.Capture(pb.CaptureRequest(thread_id="t-close")), "done")
            await _read_until(stub.Restore(pb.RestoreRequest(thread_id="t-close")), "done")
        request = pb.SweepBlobsRequest(dry_run=True, older_than_ms=0)
        await _read_until(stub.SweepBlobs(request), "summary")
        await _read_until(stub.Check(pb.CheckRequest()), "summary")
    # And the Python client, which reads every stream to its end.
    async with daemon.client() as client:
        for _ in range(5):
            await client.capture("t-close-client")
            await client.restore("t-close-client")
        await client.sweep(0, dry_run=True)
        await client.check()
    await asyncio.sleep(LOG_WAIT_S)
    assert _cancelled_lines(daemon) == [], daemon.log_text()


async def test_a_call_cancelled_before_its_result_is_still_a_failure(daemon: Daemon) -> None:
    make_tree(daemon.workspace, files=3000, max_size=2000)
    async with grpc.aio.insecure_channel(grpc_address(daemon.address)) as channel:
        stub = pb_grpc.CheckpointdStub(channel)
        call = stub.Capture(pb.CaptureRequest(thread_id="t-cancel"))
        async for event in call:
            assert event.HasField("started"), event
            call.cancel()  # at the first event: long before the 3,000 files are in
            break
    deadline = time.monotonic() + 15
    while not any("Capture failed: CANCELLED" in line for line in _cancelled_lines(daemon)):
        assert time.monotonic() < deadline, daemon.log_text()
        await asyncio.sleep(0.05)
