"""The one Python → gRPC status map, through a real grpc.aio server and channel.

Every error code (also those no RPC can provoke on purpose, like STALE_HEAD or
WRITER_LOST) is raised in a handler and read back by a client: status code,
ErrorInfo domain, reason and metadata.
"""

from __future__ import annotations

import errno
from collections.abc import AsyncIterator

import grpc
import pytest

from checkpointd import _native, errors
from checkpointd.blobs.base import BlobNotFoundError, BlobStoreError
from checkpointd.service import status
from checkpointd.service.client import rpc_error

C = grpc.StatusCode
# docs/contract.md#the-grpc-service's mapping, written out again so a change to status.py has to be deliberate.
SPEC_MAPPING = {
    "SANDBOX_SNAPSHOT_INVALID_ID": C.INVALID_ARGUMENT,
    "SANDBOX_SNAPSHOT_INVALID_ENTRY": C.INVALID_ARGUMENT,
    "SANDBOX_SNAPSHOT_INVALID_ARGUMENT": C.INVALID_ARGUMENT,
    "SANDBOX_SNAPSHOT_STALE_HEAD": C.ABORTED,
    "SANDBOX_SNAPSHOT_PARENT_MISMATCH": C.ABORTED,
    "SANDBOX_SNAPSHOT_WRITER_CONFLICT": C.ABORTED,
    "SANDBOX_SNAPSHOT_WRITER_LOST": C.ABORTED,
    "SANDBOX_SNAPSHOT_DUPLICATE_ID": C.ALREADY_EXISTS,
    "SANDBOX_SNAPSHOT_NOT_HEAD": C.FAILED_PRECONDITION,
    "SANDBOX_SNAPSHOT_UNSUPPORTED_ENTRY": C.FAILED_PRECONDITION,
    "SANDBOX_SNAPSHOT_MISSING_CHECKPOINT": C.NOT_FOUND,
    "SANDBOX_SNAPSHOT_MISSING_BLOB": C.DATA_LOSS,
    "SANDBOX_SNAPSHOT_INVALID_BLOB": C.DATA_LOSS,
    # Placed by status.py (documented there).
    "SANDBOX_SNAPSHOT_INVALID_PATH": C.INVALID_ARGUMENT,
    "SANDBOX_SNAPSHOT_FORK_SOURCE_NOT_FOUND": C.NOT_FOUND,
    "SANDBOX_SNAPSHOT_FORK_SOURCE_THREAD_MISMATCH": C.FAILED_PRECONDITION,
    "SANDBOX_SNAPSHOT_FORK_DESTINATION_NOT_EMPTY": C.FAILED_PRECONDITION,
    "SANDBOX_SNAPSHOT_STORE_UNAVAILABLE": C.UNAVAILABLE,
    "SANDBOX_SNAPSHOT_FILE_CHANGED": C.ABORTED,
    "SANDBOX_SNAPSHOT_NO_SPACE": C.RESOURCE_EXHAUSTED,
    "SANDBOX_SNAPSHOT_NAME_TOO_LONG": C.FAILED_PRECONDITION,
    "SANDBOX_SNAPSHOT_CROSS_DEVICE": C.FAILED_PRECONDITION,
    "SANDBOX_SNAPSHOT_PERMISSION_DENIED": C.FAILED_PRECONDITION,
    "SANDBOX_SNAPSHOT_MISSING_ENTRY": C.NOT_FOUND,
    "SANDBOX_SNAPSHOT_MISSING_ARTIFACT": C.NOT_FOUND,
    "SANDBOX_SNAPSHOT_DRAINING": C.UNAVAILABLE,
    "SANDBOX_SNAPSHOT_UNAUTHENTICATED": C.UNAUTHENTICATED,
    "SANDBOX_SNAPSHOT_FORBIDDEN": C.PERMISSION_DENIED,
    "SANDBOX_SNAPSHOT_ARTIFACT_NOT_UPLOADED": C.FAILED_PRECONDITION,
    "SANDBOX_SNAPSHOT_MESSAGE_TOO_LARGE": C.RESOURCE_EXHAUSTED,
    "SANDBOX_SNAPSHOT_UNIMPLEMENTED": C.UNIMPLEMENTED,
    "SANDBOX_SNAPSHOT_UNKNOWN_SERVICE": C.NOT_FOUND,
    "SANDBOX_SNAPSHOT_INTERNAL": C.INTERNAL,
}

ERROR_CLASSES = [
    errors.SandboxCheckpointConflictError,
    errors.SandboxCheckpointDuplicateIdError,
    errors.SandboxCheckpointInvalidIdError,
    errors.SandboxCheckpointInvalidEntryError,
    errors.SandboxCheckpointParentMismatchError,
    errors.SandboxCheckpointNotHeadError,
    errors.SandboxCheckpointWriterConflictError,
    errors.SandboxCheckpointWriterLostError,
    errors.SandboxCheckpointInvalidArgumentError,
]

RAISED: dict[str, BaseException] = {}


def _register(name: str, exc: BaseException) -> str:
    RAISED[name] = exc
    return name


@pytest.fixture
async def raiser() -> AsyncIterator[grpc.aio.Channel]:
    async def handler(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        try:
            raise RAISED[request.decode()]
        except Exception as exc:  # noqa: BLE001 - the map under test takes any exception
            await status.abort(context, exc)
        return b""

    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "test.Raiser", {"Raise": grpc.unary_unary_rpc_method_handler(handler)}
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield channel
    finally:
        await channel.close()
        await server.stop(None)


async def _call(channel: grpc.aio.Channel, name: str):
    method = channel.unary_unary("/test.Raiser/Raise")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await method(name.encode(), timeout=10)
    return rpc_error(caught.value)


def test_the_table_is_the_spec_mapping() -> None:
    assert status.STATUS_BY_REASON == SPEC_MAPPING


def test_the_proto_publishes_every_reason_with_its_code() -> None:
    """enum ErrorReason in the .proto lists exactly the reasons of the map, each
    under a comment starting with its status code."""
    import re
    from pathlib import Path

    from checkpointd.v1 import checkpointd_pb2 as pb

    published = {v.name for v in pb.ErrorReason.DESCRIPTOR.values} - {"ERROR_REASON_UNSPECIFIED"}
    assert published == set(status.STATUS_BY_REASON), (
        "add the reason to enum ErrorReason in proto/checkpointd/v1/checkpointd.proto",
        published ^ set(status.STATUS_BY_REASON),
    )
    proto = Path(__file__).resolve().parents[2] / "proto/checkpointd/v1/checkpointd.proto"
    commented = dict(
        (name, code)
        for code, name in re.findall(
            r"// ([A-Z_]+): [^\n]*\n\s+(SANDBOX_SNAPSHOT_\w+) =", proto.read_text()
        )
    )
    assert commented == {reason: code.name for reason, code in status.STATUS_BY_REASON.items()}


def test_every_code_in_errors_is_mapped() -> None:
    codes = {getattr(errors, name) for name in errors.__all__ if name.isupper()}
    codes |= {cls.code for cls in ERROR_CLASSES}
    assert codes <= set(status.STATUS_BY_REASON), codes - set(status.STATUS_BY_REASON)


@pytest.mark.parametrize("reason", sorted(SPEC_MAPPING))
async def test_every_code_travels_as_status_and_error_info(
    raiser: grpc.aio.Channel, reason: str
) -> None:
    details = {"thread_id": "thread-1", "checkpoint_id": "cp-1", "path": "src/a.py"}
    name = _register(
        reason, errors.SandboxCheckpointError(f"boom {reason}", code=reason, details=details)
    )
    error = await _call(raiser, name)
    assert error.code == SPEC_MAPPING[reason]
    assert error.reason == reason
    assert error.message == f"boom {reason}"
    assert error.metadata == details


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda c: c.__name__)
async def test_error_classes_carry_their_code(
    raiser: grpc.aio.Channel, cls: type[errors.SandboxCheckpointError]
) -> None:
    name = _register(cls.__name__, cls("x", details={"thread_id": "t"}))
    error = await _call(raiser, name)
    assert error.reason == cls.code
    assert error.code == SPEC_MAPPING[cls.code]


OS_ERRORS = [
    pytest.param(
        OSError(errno.ENOSPC, "No space left on device", "/ws/big.bin"),
        "SANDBOX_SNAPSHOT_NO_SPACE",
        C.RESOURCE_EXHAUSTED,
        id="ENOSPC",
    ),
    pytest.param(
        OSError(errno.EDQUOT, "Disk quota exceeded", "/ws/big.bin"),
        "SANDBOX_SNAPSHOT_NO_SPACE",
        C.RESOURCE_EXHAUSTED,
        id="EDQUOT",
    ),
    pytest.param(
        OSError(errno.ENAMETOOLONG, "File name too long", "/ws/" + "n" * 300),
        "SANDBOX_SNAPSHOT_NAME_TOO_LONG",
        C.FAILED_PRECONDITION,
        id="ENAMETOOLONG",
    ),
    pytest.param(
        OSError(errno.EXDEV, "Invalid cross-device link", "/ws/mnt/x"),
        "SANDBOX_SNAPSHOT_CROSS_DEVICE",
        C.FAILED_PRECONDITION,
        id="EXDEV",
    ),
    pytest.param(
        PermissionError(errno.EACCES, "Permission denied", "/ws/secret"),
        "SANDBOX_SNAPSHOT_PERMISSION_DENIED",
        C.FAILED_PRECONDITION,
        id="EACCES",
    ),
    pytest.param(
        _native.FileChangedError(errno.EAGAIN, "kept changing", "/ws/log.txt"),
        "SANDBOX_SNAPSHOT_FILE_CHANGED",
        C.ABORTED,
        id="native-file-changed",
    ),
    pytest.param(
        _native.NoSpaceError(errno.ENOSPC, "No space", "/ws/big.bin"),
        "SANDBOX_SNAPSHOT_NO_SPACE",
        C.RESOURCE_EXHAUSTED,
        id="native-no-space",
    ),
    pytest.param(
        _native.RootInvalidError(errno.ENOTDIR, "not a directory", "/ws"),
        "SANDBOX_SNAPSHOT_INVALID_ARGUMENT",
        C.INVALID_ARGUMENT,
        id="native-root-invalid",
    ),
    pytest.param(
        BlobStoreError("put failed"),
        "SANDBOX_SNAPSHOT_STORE_UNAVAILABLE",
        C.UNAVAILABLE,
        id="blob-store-outage",
    ),
]


@pytest.mark.parametrize(("exc", "reason", "code"), OS_ERRORS)
async def test_os_errors_keep_their_meaning(
    raiser: grpc.aio.Channel, exc: BaseException, reason: str, code: grpc.StatusCode
) -> None:
    """No space, a long name, a cross-device rename, a changed file: each its own
    code naming the path, never INTERNAL."""
    name = _register(f"os-{reason}-{id(exc)}", exc)
    error = await _call(raiser, name)
    assert (error.reason, error.code) == (reason, code)
    if isinstance(exc, OSError):
        assert error.metadata["path"] == exc.filename
        assert exc.filename in error.message


async def test_a_full_local_bucket_is_no_space(raiser: grpc.aio.Channel) -> None:
    try:
        raise BlobStoreError("put 'k' on file:///b failed") from OSError(
            errno.ENOSPC, "No space left on device", "/b/sandbox-files/x"
        )
    except BlobStoreError as exc:
        name = _register("full-bucket", exc)
    error = await _call(raiser, name)
    assert (error.reason, error.code) == ("SANDBOX_SNAPSHOT_NO_SPACE", C.RESOURCE_EXHAUSTED)
    assert error.metadata["path"] == "/b/sandbox-files/x"


async def test_other_exceptions(raiser: grpc.aio.Channel) -> None:
    missing = await _call(
        raiser, _register("missing", BlobNotFoundError("sandbox-files/blake3/" + "0" * 64))
    )
    assert (missing.code, missing.reason) == (C.DATA_LOSS, errors.MISSING_BLOB)
    assert missing.metadata == {"key": "sandbox-files/blake3/" + "0" * 64}
    down = await _call(raiser, _register("down", BlobStoreError("bucket unreachable")))
    assert (down.code, down.reason) == (C.UNAVAILABLE, errors.STORE_UNAVAILABLE)
    internal = await _call(raiser, _register("bug", RuntimeError("secret internals")))
    assert (internal.code, internal.reason) == (C.INTERNAL, status.INTERNAL)
    assert "secret internals" not in internal.message


async def test_metadata_is_kept_small(raiser: grpc.aio.Channel) -> None:
    paths = [f"dir/fifo-{i}" for i in range(500)]
    exc = errors.SandboxSnapshotError(
        errors.UNSUPPORTED_ENTRY, "unsupported", details={"paths": paths, "secret": b"abcd"}
    )
    error = await _call(raiser, _register("many", exc))
    assert error.code == C.FAILED_PRECONDITION
    assert error.metadata["paths"].startswith("dir/fifo-0\n")
    assert len(error.metadata["paths"]) <= 520
    assert error.metadata["secret"] == "<4 bytes>"
