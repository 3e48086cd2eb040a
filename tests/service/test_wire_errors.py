"""Errors the daemon returns before (or beside) a handler: still with ErrorInfo.

Raw bytes on the wire (a hand-built serialized message whose string field holds
invalid UTF-8), a request over the 4 MiB message limit, a capture naming an
artifact never uploaded, and the retry hints of WRITER_CONFLICT.
"""

from __future__ import annotations

import grpc
from google.rpc import error_details_pb2, status_pb2

from checkpointd import errors
from checkpointd.service import status
from checkpointd.service.client import RpcError, rpc_error
from checkpointd.store import open_store
from checkpointd.v1 import checkpointd_pb2 as pb

from .conftest import Daemon
from .test_cli import cli

C = grpc.StatusCode
INVALID_UTF8 = b"\xff\xfe bad"


def _string_field(number: int, value: bytes) -> bytes:
    """A length-delimited field (wire type 2), value < 128 bytes."""
    assert len(value) < 128
    return bytes([number << 3 | 2, len(value)]) + value


def _target(daemon: Daemon) -> str:
    return daemon.address.replace("unix://", "unix:")


def _details(error: grpc.aio.AioRpcError) -> status_pb2.Status:
    for key, value in error.trailing_metadata() or ():
        if key == status.DETAILS_KEY:
            return status_pb2.Status.FromString(value)
    raise AssertionError(f"no {status.DETAILS_KEY} in the trailers of {error}")


async def test_invalid_utf8_on_the_wire_is_invalid_argument(daemon: Daemon) -> None:
    async with grpc.aio.insecure_channel(_target(daemon)) as channel:
        # Unary: GetHeadRequest.thread_id (field 1).
        get_head = channel.unary_unary("/checkpointd.v1.Checkpointd/GetHead")
        try:
            await get_head(_string_field(1, INVALID_UTF8), timeout=10)
            raise AssertionError("undecodable request accepted")
        except grpc.aio.AioRpcError as caught:
            error = rpc_error(caught)
        # An id field says which, as INVALID_ID (what any client's own check says).
        assert error.code == C.INVALID_ARGUMENT
        assert error.reason == errors.SandboxCheckpointInvalidIdError.code
        assert error.metadata["field"] == "thread_id"
        assert "UTF-8" in error.message
        # Server streaming: CaptureRequest.label (field 2).
        capture = channel.unary_stream("/checkpointd.v1.Checkpointd/Capture")
        call = capture(_string_field(1, b"t-wire") + _string_field(2, INVALID_UTF8), timeout=10)
        try:
            async for _ in call:
                raise AssertionError("capture started on an undecodable request")
        except grpc.aio.AioRpcError as caught:
            error = rpc_error(caught)
        assert error.code == C.INVALID_ARGUMENT
        assert error.reason == errors.SandboxCheckpointInvalidArgumentError.code
        assert error.metadata["message_type"] == "checkpointd.v1.CaptureRequest"
        assert "UTF-8" in error.message
        # Client streaming: UploadArtifactRequest.metadata.name.
        upload = channel.stream_unary("/checkpointd.v1.Checkpointd/UploadArtifact")
        metadata_part = _string_field(1, _string_field(1, INVALID_UTF8))
        try:
            await upload(iter([metadata_part]), timeout=10)
            raise AssertionError("undecodable upload accepted")
        except grpc.aio.AioRpcError as caught:
            error = rpc_error(caught)
        assert error.code == C.INVALID_ARGUMENT
        assert error.reason == errors.SandboxCheckpointInvalidArgumentError.code
    async with daemon.client() as client:
        assert await client.get_head("t-wire") is None  # nothing was captured


async def test_a_request_over_the_limit_is_resource_exhausted_with_the_limit(
    daemon: Daemon,
) -> None:
    async with daemon.client() as client:
        try:
            await client.capture("t-big", conversation=['"' + "x" * (5 * 1024 * 1024) + '"'])
            raise AssertionError("a 5 MiB request was accepted")
        except RpcError as error:
            assert error.code == C.RESOURCE_EXHAUSTED
            assert error.reason == status.MESSAGE_TOO_LARGE
            assert error.metadata["limit_bytes"] == str(4 * 1024 * 1024)
            assert int(error.metadata["size_bytes"]) > 5 * 1024 * 1024
        info = await client.server_info()
        assert info.capabilities.max_message_bytes == 4 * 1024 * 1024
        assert await client.get_head("t-big") is None
    # The CLI calls it bad input (2), not a full disk (9, RESOURCE_EXHAUSTED's usual code).
    big = daemon.data_dir.parent / "big-conversation.json"
    big.write_text('["' + "x" * (5 * 1024 * 1024) + '"]')
    shown = cli(daemon, "capture", "t-big", "--conversation", str(big))
    assert shown.returncode == 2, shown.stderr
    assert "SANDBOX_SNAPSHOT_MESSAGE_TOO_LARGE" in shown.stderr


async def test_an_artifact_never_uploaded_is_a_client_mistake(daemon: Daemon) -> None:
    (daemon.workspace / "a.txt").write_text("a")
    never = pb.Artifact(
        artifact_id="art-1",
        name="report.txt",
        mime_type="text/plain",
        size=3,
        blob_key="sandbox-artifacts/blake3/" + "ab" * 32,
        created_at=1,
    )
    async with daemon.client() as client:
        try:
            await client.capture("t-art", artifacts=[never])
            raise AssertionError("capture with an unknown artifact succeeded")
        except RpcError as error:
            assert error.code == C.FAILED_PRECONDITION
            assert error.reason == errors.ARTIFACT_NOT_UPLOADED
            assert error.metadata["key"] == never.blob_key
        assert await client.get_head("t-art") is None


async def test_writer_conflict_says_when_to_retry(daemon: Daemon) -> None:
    store = await open_store(daemon.store)
    try:
        lease = await store.acquire_writer("t-retry")
        async with grpc.aio.insecure_channel(_target(daemon)) as channel:
            prune = channel.unary_unary(
                "/checkpointd.v1.Checkpointd/Prune",
                request_serializer=pb.PruneRequest.SerializeToString,
                response_deserializer=pb.PruneResponse.FromString,
            )
            try:
                await prune(pb.PruneRequest(thread_id="t-retry", keep=1), timeout=10)
                raise AssertionError("prune ran under another writer's lease")
            except grpc.aio.AioRpcError as caught:
                details = _details(caught)
        await lease.release()
    finally:
        await store.aclose()
    infos = [d for d in details.details if d.Is(error_details_pb2.ErrorInfo.DESCRIPTOR)]
    retries = [d for d in details.details if d.Is(error_details_pb2.RetryInfo.DESCRIPTOR)]
    assert len(infos) == 1 and len(retries) == 1
    info, retry = error_details_pb2.ErrorInfo(), error_details_pb2.RetryInfo()
    infos[0].Unpack(info)
    retries[0].Unpack(retry)
    assert info.reason == errors.SandboxCheckpointWriterConflictError.code
    assert int(info.metadata["expires_at_ms"]) > 0
    delay_ms = retry.retry_delay.ToMilliseconds()
    assert 0 < delay_ms <= int(info.metadata["retry_after_ms"]) + 1000


def test_writer_lost_carries_a_retry_hint() -> None:
    lost = errors.SandboxCheckpointWriterLostError("lease lost", details={"thread_id": "t"})
    code, _, trailers = status.to_status(lost)
    assert code == C.ABORTED
    rpc_status = status_pb2.Status.FromString(trailers[0][1])
    assert any(d.Is(error_details_pb2.RetryInfo.DESCRIPTOR) for d in rpc_status.details)


async def test_a_reply_over_the_limit_is_refused_with_the_limit(daemon: Daemon) -> None:
    """A checkpoint made through the Python API may hold more conversation than
    one message: GetCheckpoint says so (with ErrorInfo) instead of failing in the
    transport, and answers without the conversation."""
    from checkpointd.model import Checkpoint

    store = await open_store(daemon.store)
    try:
        async with await store.acquire_writer("t-huge") as lease:
            await store.append(
                Checkpoint(
                    id="cp-huge",
                    thread_id="t-huge",
                    parent_checkpoint_id=None,
                    created_at=1,
                    conversation=tuple("x" * 1024 * 1024 for _ in range(5)),
                ),
                None,
                lease,
            )
    finally:
        await store.aclose()
    async with daemon.client() as client:
        try:
            await client.get_checkpoint("cp-huge", include_conversation=True)
            raise AssertionError("a 5 MiB reply was sent")
        except RpcError as error:
            assert error.code == C.RESOURCE_EXHAUSTED
            assert error.reason == status.MESSAGE_TOO_LARGE
            assert error.metadata["limit_bytes"] == str(4 * 1024 * 1024)
        summary = await client.get_checkpoint("cp-huge")
        assert summary.checkpoint.conversation_count == 5


async def test_an_unknown_method_is_unimplemented_with_error_info(daemon: Daemon) -> None:
    async with grpc.aio.insecure_channel(_target(daemon)) as channel:
        for method in ("/checkpointd.v1.Checkpointd/NoSuchMethod", "/other.Service/Call"):
            call = channel.unary_unary(method)
            try:
                await call(b"", timeout=10)
                raise AssertionError(f"{method} answered")
            except grpc.aio.AioRpcError as caught:
                error = rpc_error(caught)
            assert error.code == C.UNIMPLEMENTED
            assert error.reason == status.UNIMPLEMENTED
            assert error.metadata["method"] == method
    async with daemon.client() as client:
        assert await client.health() == "SERVING"  # real services still answer


async def test_a_health_check_of_an_unknown_service_carries_error_info(daemon: Daemon) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    async with grpc.aio.insecure_channel(_target(daemon)) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        served = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert served.status == health_pb2.HealthCheckResponse.SERVING
        try:
            await stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=10)
            raise AssertionError("an unknown service was answered")
        except grpc.aio.AioRpcError as caught:
            error = rpc_error(caught)
    assert error.code == C.NOT_FOUND
    assert error.reason == status.UNKNOWN_SERVICE
    assert error.metadata["service"] == "no.such.Service"
