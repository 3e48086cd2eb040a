"""The one map from Python errors to gRPC statuses (docs/contract.md#the-grpc-service).

Every error leaves the daemon as a gRPC status whose ``grpc-status-details-bin``
trailer holds a ``google.rpc.Status`` with one ``google.rpc.ErrorInfo``:
``domain`` = ``checkpointd``, ``reason`` = the error's stable code, ``metadata``
= the thread, checkpoint, path or key involved (from the exception's
``details``), plus a ``google.rpc.RetryInfo`` when the error says how long to
wait (WRITER_CONFLICT and WRITER_LOST: ``retry_after_ms`` of the lease that
holds the thread, beside its ``expires_at_ms``). Clients read it back
with :func:`error_info_from_metadata`.

Codes the contract does not place are placed here, with the reason:

* ``INVALID_PATH`` → INVALID_ARGUMENT (a path the caller or a manifest gave is
  malformed);
* ``FORK_SOURCE_NOT_FOUND`` → NOT_FOUND; ``FORK_SOURCE_THREAD_MISMATCH`` and
  ``FORK_DESTINATION_NOT_EMPTY`` → FAILED_PRECONDITION (the state of the threads
  forbids it, like removing a non-empty directory);
* ``STORE_UNAVAILABLE`` → UNAVAILABLE (retry later);
* ``FILE_CHANGED`` → ABORTED (a file kept changing while it was read: a
  concurrency failure that a retry of the capture may get past);
* ``NO_SPACE`` → RESOURCE_EXHAUSTED (a full filesystem or quota: free space and
  retry); ``NAME_TOO_LONG``, ``CROSS_DEVICE`` and ``PERMISSION_DENIED`` →
  FAILED_PRECONDITION (the filesystem's state forbids it; the path is in the
  metadata). Any OSError the engines let through is mapped by
  ``errors.from_os_error`` first, so these never come out as INTERNAL;
* the service's own ``MISSING_ENTRY`` / ``MISSING_ARTIFACT`` (ReadFile of a path
  the checkpoint lacks, ReadArtifact of an unknown key) → NOT_FOUND;
* ``DRAINING`` → UNAVAILABLE, ``UNAUTHENTICATED`` → UNAUTHENTICATED;
  ``FORBIDDEN`` → PERMISSION_DENIED (a gateway token outside its scope);
* ``ARTIFACT_NOT_UPLOADED`` → FAILED_PRECONDITION (a capture names an artifact
  whose blob is not in the bucket: upload it first; no data was lost);
* ``UNKNOWN_SERVICE`` → NOT_FOUND (a health check of a service the daemon
  does not serve: grpc's own health servicer answers it without details);
* ``MESSAGE_TOO_LARGE`` → RESOURCE_EXHAUSTED (a request over the message
  limit; ``limit_bytes`` in the metadata), undecodable request bytes →
  ``INVALID_ARGUMENT`` (see ``guard.py``);
* anything unexpected → INTERNAL with reason ``SANDBOX_SNAPSHOT_INTERNAL`` (the
  message only names the exception type: internals are logged, not sent).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2

from .. import errors
from ..blobs.base import BlobNotFoundError, BlobStoreError

DOMAIN = "checkpointd"
DETAILS_KEY = "grpc-status-details-bin"

# Codes only the service raises (added to the SANDBOX_SNAPSHOT_* family).
MISSING_ENTRY = "SANDBOX_SNAPSHOT_MISSING_ENTRY"
MISSING_ARTIFACT = "SANDBOX_SNAPSHOT_MISSING_ARTIFACT"
DRAINING = "SANDBOX_SNAPSHOT_DRAINING"
UNAUTHENTICATED = "SANDBOX_SNAPSHOT_UNAUTHENTICATED"
# A gateway token that does not grant the thread or the operation (gateway/tokens.py).
FORBIDDEN = "SANDBOX_SNAPSHOT_FORBIDDEN"
INTERNAL = "SANDBOX_SNAPSHOT_INTERNAL"
# A request message over the daemon's message limit (guard.py).
MESSAGE_TOO_LARGE = "SANDBOX_SNAPSHOT_MESSAGE_TOO_LARGE"
# A method this daemon does not serve (an older daemon than the client's proto).
UNIMPLEMENTED = "SANDBOX_SNAPSHOT_UNIMPLEMENTED"
# A health check of a service name the daemon has no status for.
UNKNOWN_SERVICE = "SANDBOX_SNAPSHOT_UNKNOWN_SERVICE"

_C = grpc.StatusCode
STATUS_BY_REASON: dict[str, grpc.StatusCode] = {
    errors.SandboxCheckpointInvalidIdError.code: _C.INVALID_ARGUMENT,
    errors.SandboxCheckpointInvalidEntryError.code: _C.INVALID_ARGUMENT,
    errors.SandboxCheckpointInvalidArgumentError.code: _C.INVALID_ARGUMENT,
    errors.INVALID_PATH: _C.INVALID_ARGUMENT,
    errors.SandboxCheckpointConflictError.code: _C.ABORTED,
    errors.SandboxCheckpointParentMismatchError.code: _C.ABORTED,
    errors.SandboxCheckpointWriterConflictError.code: _C.ABORTED,
    errors.SandboxCheckpointWriterLostError.code: _C.ABORTED,
    errors.SandboxCheckpointDuplicateIdError.code: _C.ALREADY_EXISTS,
    errors.SandboxCheckpointNotHeadError.code: _C.FAILED_PRECONDITION,
    errors.UNSUPPORTED_ENTRY: _C.FAILED_PRECONDITION,
    errors.MISSING_CHECKPOINT: _C.NOT_FOUND,
    errors.MISSING_BLOB: _C.DATA_LOSS,
    errors.INVALID_BLOB: _C.DATA_LOSS,
    errors.FORK_SOURCE_NOT_FOUND: _C.NOT_FOUND,
    errors.FORK_SOURCE_THREAD_MISMATCH: _C.FAILED_PRECONDITION,
    errors.FORK_DESTINATION_NOT_EMPTY: _C.FAILED_PRECONDITION,
    errors.STORE_UNAVAILABLE: _C.UNAVAILABLE,
    errors.FILE_CHANGED: _C.ABORTED,
    errors.NO_SPACE: _C.RESOURCE_EXHAUSTED,
    errors.NAME_TOO_LONG: _C.FAILED_PRECONDITION,
    errors.CROSS_DEVICE: _C.FAILED_PRECONDITION,
    errors.PERMISSION_DENIED: _C.FAILED_PRECONDITION,
    MISSING_ENTRY: _C.NOT_FOUND,
    MISSING_ARTIFACT: _C.NOT_FOUND,
    DRAINING: _C.UNAVAILABLE,
    UNAUTHENTICATED: _C.UNAUTHENTICATED,
    FORBIDDEN: _C.PERMISSION_DENIED,
    errors.ARTIFACT_NOT_UPLOADED: _C.FAILED_PRECONDITION,
    MESSAGE_TOO_LARGE: _C.RESOURCE_EXHAUSTED,
    UNIMPLEMENTED: _C.UNIMPLEMENTED,
    UNKNOWN_SERVICE: _C.NOT_FOUND,
    INTERNAL: _C.INTERNAL,
}

# Reasons whose status carries google.rpc.RetryInfo: the retry_after_ms the
# store gave (the lease that holds the thread now; 0 when none does, so the
# work can be retried at once), else 0.
RETRYABLE_REASONS = (
    errors.SandboxCheckpointWriterConflictError.code,
    errors.SandboxCheckpointWriterLostError.code,
)

# Trailers share gRPC's default 8 KiB header budget: keep metadata small.
_MAX_VALUE_CHARS = 512
_MAX_LIST_ITEMS = 20
# A status message travels in the grpc-message trailer: keep every one short
# enough for any client library, whatever value an error echoes.
MAX_MESSAGE_CHARS = 2048


def _short_message(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS - 1] + "…"


_log = logging.getLogger(__name__)


class ServiceError(errors.SandboxCheckpointError):
    """An error the service itself raises, with one of the codes above."""

    def __init__(self, code: str, message: str, **details: Any) -> None:
        super().__init__(message, code=code, details=details)


def _metadata_value(value: Any) -> str:
    if isinstance(value, bytes):
        # Never echo raw bytes (they could be secrets); say how many there were.
        return f"<{len(value)} bytes>"
    if isinstance(value, (list, tuple)):
        items = [_metadata_value(item) for item in value[:_MAX_LIST_ITEMS]]
        more = len(value) - len(items)
        text = "\n".join(items) + (f"\n… {more} more" if more > 0 else "")
    else:
        text = str(value)
    return text if len(text) <= _MAX_VALUE_CHARS else text[:_MAX_VALUE_CHARS] + "…"


def error_metadata(details: Mapping[str, Any]) -> dict[str, str]:
    """ErrorInfo metadata from an exception's ``details`` (values made short strings)."""
    return {str(key): _metadata_value(value) for key, value in details.items() if value is not None}


def classify(exc: BaseException) -> tuple[grpc.StatusCode, str, str, dict[str, str]]:
    """(status code, reason, message, metadata) for an exception."""
    if isinstance(exc, errors.SandboxCheckpointError):
        # An unmapped code is a bug in this table, not the caller's fault.
        return (
            STATUS_BY_REASON.get(exc.code, _C.INTERNAL),
            exc.code,
            _short_message(exc.message),
            error_metadata(exc.details),
        )
    if isinstance(exc, BlobNotFoundError):
        return _C.DATA_LOSS, errors.MISSING_BLOB, _short_message(str(exc)), {"key": exc.key}
    if isinstance(exc, OSError):
        mapped = errors.from_os_error(exc)
        if mapped is not None:
            return classify(mapped)
    if isinstance(exc, BlobStoreError):
        # A local bucket on a full disk is no outage: say so (NO_SPACE...).
        mapped = _blob_os_error(exc)
        if mapped is not None:
            return classify(mapped)
    if isinstance(exc, (BlobStoreError, ConnectionError, TimeoutError)):
        return _C.UNAVAILABLE, errors.STORE_UNAVAILABLE, _short_message(str(exc)), {}
    _log.exception("unexpected error in a call", exc_info=exc)
    return _C.INTERNAL, INTERNAL, f"internal error ({type(exc).__name__})", {}


# obstore reports the OS error of a local bucket only in its text: "(os error 28)".
_OS_ERROR_TEXT = re.compile(r"\(os error (\d+)\)")
# The blob stores' messages read "<operation> '<key>' on <url> failed: ...".
_BUCKET_URL_TEXT = re.compile(r" on (\S+) failed:")


def _blob_os_error(exc: BlobStoreError) -> errors.SandboxCheckpointError | None:
    """The checkpointd error for a bucket failure caused by the local filesystem
    (a full disk, a read-only mount), naming the bucket; None for other failures."""
    cause = exc.__cause__
    if isinstance(cause, OSError) and cause.filename is not None:
        return errors.from_os_error(cause)
    match = _OS_ERROR_TEXT.search(str(exc))
    number = cause.errno if isinstance(cause, OSError) else None
    if number is None and match is not None:
        number = int(match.group(1))
    if number is None:
        return None
    url = _BUCKET_URL_TEXT.search(str(exc))
    return errors.from_os_error(OSError(number, os.strerror(number), url.group(1) if url else None))


def rpc_status_for(
    code: grpc.StatusCode, reason: str, message: str, metadata: Mapping[str, str]
) -> status_pb2.Status:
    """The google.rpc.Status: ErrorInfo always, and RetryInfo when the metadata
    says how long to wait (``retry_after_ms``: a lease held by another owner)."""
    info = error_details_pb2.ErrorInfo(reason=reason, domain=DOMAIN, metadata=dict(metadata))
    detail = any_pb2.Any()
    detail.Pack(info)
    details = [detail]
    retry_after_ms = metadata.get("retry_after_ms", "")
    if not retry_after_ms.isdigit() and reason in RETRYABLE_REASONS:
        retry_after_ms = "0"
    if retry_after_ms.isdigit():
        retry = error_details_pb2.RetryInfo()
        retry.retry_delay.FromMilliseconds(int(retry_after_ms))
        retry_detail = any_pb2.Any()
        retry_detail.Pack(retry)
        details.append(retry_detail)
    return status_pb2.Status(code=code.value[0], message=message, details=details)


def to_status(exc: BaseException) -> tuple[grpc.StatusCode, str, tuple[tuple[str, bytes], ...]]:
    """(status code, message, trailing metadata carrying the google.rpc.Status)."""
    code, reason, message, metadata = classify(exc)
    status = rpc_status_for(code, reason, message, metadata)
    return code, message, ((DETAILS_KEY, status.SerializeToString()),)


async def abort(context: grpc.aio.ServicerContext[Any, Any], exc: BaseException) -> None:
    """End the call with the status for ``exc`` (raises grpc.aio.AbortError)."""
    code, message, trailers = to_status(exc)
    await context.abort(code, message, trailing_metadata=trailers)


def error_info_from_metadata(
    trailing_metadata: Iterable[tuple[str, str | bytes]] | None,
) -> error_details_pb2.ErrorInfo | None:
    """The ErrorInfo in a failed call's trailers, or None."""
    for key, value in trailing_metadata or ():
        if key != DETAILS_KEY or not isinstance(value, bytes):
            continue
        status = status_pb2.Status.FromString(value)
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                return info
    return None
