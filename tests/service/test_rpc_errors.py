"""Error paths of real RPCs: status code, ErrorInfo reason and metadata.

Codes no RPC can provoke on purpose (STALE_HEAD, PARENT_MISMATCH, WRITER_LOST,
DUPLICATE_ID, DRAINING) are covered through a real server in test_status_map.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import grpc
import pytest

from checkpointd import errors
from checkpointd.service import status
from checkpointd.service.client import Client, RpcError
from checkpointd.store import open_store
from checkpointd.v1 import checkpointd_pb2 as pb

from .conftest import Daemon

C = grpc.StatusCode


async def _fails(call, code: grpc.StatusCode, reason: str) -> RpcError:
    with pytest.raises(RpcError) as caught:
        await call
    assert (caught.value.code, caught.value.reason) == (code, reason), str(caught.value)
    return caught.value


def _blob_path(daemon: Daemon, key: str) -> Path:
    return Path(daemon.blobs.removeprefix("file://")) / key


async def test_invalid_input(daemon: Daemon) -> None:
    async with daemon.client() as client:
        await _fails(
            client.get_head(""), C.INVALID_ARGUMENT, errors.SandboxCheckpointInvalidIdError.code
        )
        await _fails(
            client.capture(""), C.INVALID_ARGUMENT, errors.SandboxCheckpointInvalidIdError.code
        )
        error = await _fails(
            client.capture("t", secrets=[b"abc"]),
            C.INVALID_ARGUMENT,
            errors.SandboxCheckpointInvalidArgumentError.code,
        )
        assert "abc" not in error.message
        await _fails(
            client.prune("t", 0),
            C.INVALID_ARGUMENT,
            errors.SandboxCheckpointInvalidArgumentError.code,
        )
        await _fails(
            client.capture("t", conversation=["{not json"]),
            C.INVALID_ARGUMENT,
            errors.SandboxCheckpointInvalidArgumentError.code,
        )
        with pytest.raises(grpc.aio.AioRpcError) as raw:
            await client.stub.ListCheckpoints(
                pb.ListCheckpointsRequest(thread_id="t", page_token="%%%")
            )
        assert raw.value.code() == C.INVALID_ARGUMENT
        bogus = pb.Artifact(
            artifact_id="a", name="n", mime_type="m", size=1, blob_key="nope", created_at=1
        )
        await _fails(
            client.capture("t", artifacts=[bogus]),
            C.INVALID_ARGUMENT,
            errors.SandboxCheckpointInvalidEntryError.code,
        )
        await _fails(
            client.read_artifact("sandbox-files/blake3/" + "0" * 64),
            C.INVALID_ARGUMENT,
            errors.SandboxCheckpointInvalidArgumentError.code,
        )


async def test_requests_cannot_reach_outside_the_workspace(daemon: Daemon, short_tmp: Path) -> None:
    outside = short_tmp / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("do not capture")
    (daemon.workspace / "escape").symlink_to(outside)
    async with daemon.client() as client:
        for subdir in ("../outside", "/etc", "a/../../x", "escape"):
            error = await _fails(
                client.capture("t", workspace_subdir=subdir),
                C.INVALID_ARGUMENT,
                errors.INVALID_PATH,
            )
            assert error.metadata["path"] == subdir
            await _fails(
                client.restore("t", workspace_subdir=subdir),
                C.INVALID_ARGUMENT,
                errors.INVALID_PATH,
            )


async def test_writer_conflict_is_aborted(daemon: Daemon) -> None:
    (daemon.workspace / "a.txt").write_text("a")
    store = await open_store(daemon.store)
    try:
        lease = await store.acquire_writer("t-busy")
        async with daemon.client() as client:
            error = await _fails(
                client.capture("t-busy"),
                C.ABORTED,
                errors.SandboxCheckpointWriterConflictError.code,
            )
            assert error.metadata.get("thread_id") == "t-busy"
            await _fails(
                client.restore("t-busy"),
                C.ABORTED,
                errors.SandboxCheckpointWriterConflictError.code,
            )
            await lease.release()
            assert (await client.capture("t-busy")).checkpoint.thread_id == "t-busy"
    finally:
        await store.aclose()


async def test_unsupported_entry_is_failed_precondition(daemon: Daemon) -> None:
    os.mkfifo(daemon.workspace / "pipe")
    async with daemon.client() as client:
        error = await _fails(
            client.capture("t-fifo"), C.FAILED_PRECONDITION, errors.UNSUPPORTED_ENTRY
        )
        assert "pipe" in str(error.metadata) + error.message
        policy = pb.Policy(exclude=["pipe"])
        assert (await client.capture("t-fifo", policy=policy)).checkpoint.entry_count == 0


async def test_not_found_codes(daemon: Daemon) -> None:
    (daemon.workspace / "a.txt").write_text("a")
    async with daemon.client() as client:
        checkpoint = (await client.capture("t-nf")).checkpoint.id
        error = await _fails(
            client.restore("t-nf", checkpoint_id="no-such-checkpoint"),
            C.NOT_FOUND,
            errors.MISSING_CHECKPOINT,
        )
        assert error.metadata["checkpoint_id"] == "no-such-checkpoint"
        # A checkpoint of another thread is missing from this one.
        await _fails(
            client.restore("t-other", checkpoint_id=checkpoint),
            C.NOT_FOUND,
            errors.MISSING_CHECKPOINT,
        )
        await _fails(client.get_checkpoint("nope"), C.NOT_FOUND, errors.MISSING_CHECKPOINT)
        await _fails(client.list_entries("nope"), C.NOT_FOUND, errors.MISSING_CHECKPOINT)
        await _fails(client.diff("nope"), C.NOT_FOUND, errors.MISSING_CHECKPOINT)
        error = await _fails(
            client.read_file(checkpoint, "b.txt"), C.NOT_FOUND, status.MISSING_ENTRY
        )
        assert error.metadata == {"checkpoint_id": checkpoint, "path": "b.txt"}
        await _fails(
            client.read_artifact("sandbox-artifacts/blake3/" + "0" * 64),
            C.NOT_FOUND,
            status.MISSING_ARTIFACT,
        )


async def test_fork_errors(daemon: Daemon) -> None:
    (daemon.workspace / "a.txt").write_text("a")
    async with daemon.client() as client:
        source = (await client.capture("t-src")).checkpoint.id
        await _fails(
            client.fork("t-src", "nope", "t-dst"), C.NOT_FOUND, errors.FORK_SOURCE_NOT_FOUND
        )
        await _fails(
            client.fork("t-src", source, "t-src"),
            C.FAILED_PRECONDITION,
            errors.FORK_SOURCE_THREAD_MISMATCH,
        )
        await _fails(
            client.fork("t-elsewhere", source, "t-dst"),
            C.FAILED_PRECONDITION,
            errors.FORK_SOURCE_THREAD_MISMATCH,
        )
        await client.fork("t-src", source, "t-dst")
        await _fails(
            client.fork("t-src", source, "t-dst"),
            C.FAILED_PRECONDITION,
            errors.FORK_DESTINATION_NOT_EMPTY,
        )


async def test_delete_head_of_a_non_head_is_failed_precondition(daemon: Daemon) -> None:
    async with daemon.client() as client:
        first = (await client.capture("t-dh")).checkpoint.id
        (daemon.workspace / "b.txt").write_text("b")
        await client.capture("t-dh")
        await _fails(
            client.delete_head("t-dh", first),
            C.FAILED_PRECONDITION,
            errors.SandboxCheckpointNotHeadError.code,
        )


async def test_missing_and_corrupt_blobs_are_data_loss(daemon: Daemon) -> None:
    (daemon.workspace / "a.txt").write_text("precious")
    async with daemon.client() as client:
        checkpoint = (await client.capture("t-loss")).checkpoint.id
        [entry] = await client.list_entries(checkpoint)
        # The small blob rests in the one pack, stored raw (too short to compress).
        root = _blob_path(daemon, entry.blob_key).parents[2]
        [blob] = [p for p in (root / "sandbox-packs").rglob("*") if p.is_file()]
        pack = blob.read_bytes()
        assert pack.count(b"precious") == 1

        blob.write_bytes(pack.replace(b"precious", b"tampered"))
        (daemon.workspace / "a.txt").unlink()
        error = await _fails(client.restore("t-loss"), C.DATA_LOSS, errors.INVALID_BLOB)
        assert error.metadata
        assert not (daemon.workspace / "a.txt").exists(), "a failed restore changes nothing"

        blob.unlink()
        await _fails(client.restore("t-loss"), C.DATA_LOSS, errors.MISSING_BLOB)
        await _fails(client.read_file(checkpoint, "a.txt"), C.DATA_LOSS, errors.MISSING_BLOB)


async def test_upload_artifact_must_start_with_metadata(daemon: Daemon) -> None:
    async with daemon.client() as client:

        async def chunks_only():
            yield pb.UploadArtifactRequest(chunk=b"data")

        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await client.stub.UploadArtifact(chunks_only())
        assert caught.value.code() == C.INVALID_ARGUMENT


async def test_unreachable_daemon_is_unavailable(short_tmp: Path) -> None:
    async with Client(f"unix://{short_tmp}/nobody.sock", timeout=2) as client:
        with pytest.raises(RpcError) as caught:
            await client.get_head("t")
        assert caught.value.code == C.UNAVAILABLE
