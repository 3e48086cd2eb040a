"""Two daemons sharing one PostgreSQL store and one S3 bucket (SeaweedFS).

Different threads are served concurrently; the same thread from both gives one
capture and one ABORTED with reason SANDBOX_SNAPSHOT_WRITER_CONFLICT.
"""

from __future__ import annotations

import asyncio
import uuid

import grpc
import pytest

from checkpointd import errors
from checkpointd.service.client import RpcError
from checkpointd.v1 import checkpointd_pb2 as pb

from .conftest import DaemonFactory, make_tree, tree_state

pytestmark = [pytest.mark.postgres, pytest.mark.s3]


def _pair(daemons: DaemonFactory, postgres_url: str, s3_server):
    blobs = s3_server.url(f"daemons-{uuid.uuid4().hex}")
    env = s3_server.env()
    first = daemons.start(store=postgres_url, blobs=blobs, env=env)
    second = daemons.start(store=postgres_url, blobs=blobs, env=env)
    return first, second


async def test_two_daemons_serve_different_threads_and_see_each_other(
    daemons: DaemonFactory, postgres_url: str, s3_server
) -> None:
    a, b = _pair(daemons, postgres_url, s3_server)
    make_tree(a.workspace, seed=1, files=30)
    make_tree(b.workspace, seed=2, files=30)
    expected_a, expected_b = tree_state(a.workspace), tree_state(b.workspace)
    async with a.client() as ca, b.client() as cb:
        info = await ca.server_info()
        assert (info.capabilities.store_backend, info.capabilities.blob_backend) == (
            "postgresql",
            "s3",
        )
        done_a, done_b = await asyncio.gather(ca.capture("thread-a"), cb.capture("thread-b"))
        assert (
            done_a.checkpoint.thread_id == "thread-a" and done_b.checkpoint.thread_id == "thread-b"
        )
        # Each daemon sees the other's checkpoint and can restore it into its workspace.
        assert await cb.get_head("thread-a") == done_a.checkpoint.id
        (a.workspace / "sub").mkdir()
        (b.workspace / "sub").mkdir()
        await asyncio.gather(
            ca.restore("thread-b", workspace_subdir="sub"),
            cb.restore("thread-a", workspace_subdir="sub"),
        )
    assert tree_state(a.workspace / "sub") == expected_b
    assert tree_state(b.workspace / "sub") == expected_a


async def test_same_thread_from_both_daemons_conflicts(
    daemons: DaemonFactory, postgres_url: str, s3_server
) -> None:
    a, b = _pair(daemons, postgres_url, s3_server)
    for index in range(800):
        (a.workspace / f"f{index:04d}").write_bytes(index.to_bytes(4, "big") * 256)
    (b.workspace / "other.txt").write_text("b")
    async with a.client() as ca, b.client() as cb:
        call = ca.stub.Capture(pb.CaptureRequest(thread_id="shared-thread"))
        events = call.__aiter__()
        # Once a's capture reports a phase after "lease", it holds the thread's lease.
        while True:
            event = await events.__anext__()
            if event.HasField("progress") and event.progress.phase != "lease":
                break
        with pytest.raises(RpcError) as caught:
            await cb.capture("shared-thread")
        assert caught.value.code == grpc.StatusCode.ABORTED
        assert caught.value.reason == errors.SandboxCheckpointWriterConflictError.code
        assert caught.value.metadata.get("thread_id") == "shared-thread"
        done = None
        async for event in events:
            if event.HasField("done"):
                done = event.done
        assert done is not None and done.checkpoint.file_count == 800
        assert [s.id for s in await cb.list_checkpoints("shared-thread")] == [done.checkpoint.id]
        # With a's lease released, b captures the thread on top of a's checkpoint.
        second = await cb.capture("shared-thread")
        assert second.checkpoint.parent_checkpoint_id == done.checkpoint.id
