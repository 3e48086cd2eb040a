"""Ids have a documented maximum length, and no error echoes a huge value: a
64 KiB id gets INVALID_ID naming the limit, in trailers any client accepts."""

from __future__ import annotations

import grpc
import pytest

from checkpointd import errors
from checkpointd.service.status import DETAILS_KEY, MAX_MESSAGE_CHARS
from checkpointd.v1 import checkpointd_pb2 as pb
from checkpointd.validation import MAX_ID_BYTES, check_id

from .conftest import Daemon

HUGE = "x" * 65536
INVALID_ID = errors.SandboxCheckpointInvalidIdError.code


def test_the_limit_is_on_utf8_bytes() -> None:
    assert check_id("a" * MAX_ID_BYTES) == "a" * MAX_ID_BYTES
    with pytest.raises(errors.SandboxCheckpointInvalidIdError, match=f"{MAX_ID_BYTES}-byte"):
        check_id("a" * (MAX_ID_BYTES + 1))
    # Two bytes a character: half as many characters fit.
    with pytest.raises(errors.SandboxCheckpointInvalidIdError) as info:
        check_id("é" * (MAX_ID_BYTES // 2 + 1))
    assert info.value.details["size_bytes"] == MAX_ID_BYTES + 2
    assert len(info.value.message) < 300


def _assert_short_refusal(error: grpc.aio.AioRpcError) -> None:
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
    trailers = dict(error.trailing_metadata() or ())
    assert len(error.details() or "") <= MAX_MESSAGE_CHARS
    assert len(trailers[DETAILS_KEY]) < 4096
    assert INVALID_ID.encode() in trailers[DETAILS_KEY]


async def test_huge_ids_are_refused_briefly(daemon: Daemon) -> None:
    async with daemon.client() as client:
        stub = client.stub
        calls = [
            stub.GetCheckpoint(pb.GetCheckpointRequest(checkpoint_id=HUGE)),
            stub.GetHead(pb.GetHeadRequest(thread_id=HUGE)),
            stub.ListCheckpoints(pb.ListCheckpointsRequest(thread_id=HUGE)),
        ]
        for call in calls:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call
            _assert_short_refusal(caught.value)
        for stream in (
            stub.Capture(pb.CaptureRequest(thread_id=HUGE)),
            stub.Restore(pb.RestoreRequest(thread_id="t", checkpoint_id=HUGE)),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                async for _ in stream:
                    pass
            _assert_short_refusal(caught.value)
        # The connection still serves after the refusals.
        head = await stub.GetHead(pb.GetHeadRequest(thread_id="t"))
        assert not head.HasField("checkpoint_id")
