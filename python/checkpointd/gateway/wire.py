"""What both ends of the gateway agree on: errors with typed details, writers, limits.

An error leaves the gateway as the daemon's status (``service.status.to_status``:
ErrorInfo with the reason) plus a trailer ``checkpointd-details-json-bin`` with
the exception's details as JSON, so the remote store raises the same class with
the same details (``retry_after_ms`` stays an int) as the store behind the
gateway did: the conformance suite checks them.
"""

from __future__ import annotations

import json
import uuid
from array import array
from collections.abc import Iterable, Sequence
from typing import Any

import grpc

from .. import errors
from ..blobs.base import BlobNotFoundError
from ..codec import decode_checkpoint
from ..ids import names_another_thread
from ..model import Checkpoint, Writer
from ..service import status
from ..store._options import writer_fields
from ..store._packindex import PackColumns, PackedRows, file_key
from ..store.base import PackedBlob
from ..v1 import gateway_pb2 as gpb

DETAILS_JSON_KEY = "checkpointd-details-json-bin"
# The largest message the gateway sends (a checkpoint document: a large
# workspace's is tens of MiB) and a sidecar accepts from it.
MAX_MESSAGE_BYTES = 512 * 1024 * 1024
# The largest request message the gateway reads, once the call's token has
# verified (``auth.py``): an Append's document (about 120 bytes per file, so
# a million files fit). grpc's server keeps one limit for every method; every
# other request is far smaller (blobs travel in BLOB_CHUNK_BYTES chunks, key
# lists in batches), and a message above it is refused from its length prefix,
# before it is read.
MAX_REQUEST_BYTES = 128 * 1024 * 1024
BLOB_CHUNK_BYTES = 1 << 20
SERVER_OPTIONS = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_REQUEST_BYTES),
)
CHANNEL_OPTIONS = (
    ("grpc.max_send_message_length", MAX_REQUEST_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
)

# reason → exception class, for every class that carries a fixed code.
_CLASSES: dict[str, type[errors.SandboxCheckpointError]] = {
    cls.code: cls
    for cls in (
        errors.SandboxCheckpointConflictError,
        errors.SandboxCheckpointDuplicateIdError,
        errors.SandboxCheckpointInvalidIdError,
        errors.SandboxCheckpointInvalidEntryError,
        errors.SandboxCheckpointParentMismatchError,
        errors.SandboxCheckpointNotHeadError,
        errors.SandboxCheckpointWriterConflictError,
        errors.SandboxCheckpointWriterLostError,
        errors.SandboxCheckpointInvalidArgumentError,
    )
}


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(item) for item in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return str(value)


def error_trailers(
    exc: BaseException,
) -> tuple[grpc.StatusCode, str, tuple[tuple[str, bytes], ...]]:
    """The status for ``exc`` and its trailers (ErrorInfo and the typed details)."""
    code, message, trailers = status.to_status(exc)
    details: dict[str, Any] = {}
    if isinstance(exc, errors.SandboxCheckpointError):
        details = {k: _jsonable(v) for k, v in exc.details.items()}
    elif isinstance(exc, BlobNotFoundError):
        details = {"key": exc.key}
    payload = json.dumps(details, ensure_ascii=False).encode("utf-8", "surrogatepass")
    return code, message, (*trailers, (DETAILS_JSON_KEY, payload))


def _details(trailers: Iterable[tuple[str, Any]] | None) -> dict[str, Any]:
    for key, value in trailers or ():
        if key == DETAILS_JSON_KEY and isinstance(value, bytes):
            try:
                loaded = json.loads(value.decode("utf-8", "surrogatepass"))
            except ValueError:
                return {}
            return loaded if isinstance(loaded, dict) else {}
    return {}


def error_from_rpc(error: grpc.aio.AioRpcError, *, where: str) -> Exception:
    """The exception the gateway's store (or bucket) raised, rebuilt from the
    status; a gateway that cannot be reached is STORE_UNAVAILABLE naming ``where``."""
    trailers = error.trailing_metadata()
    info = status.error_info_from_metadata(trailers)  # type: ignore[arg-type]
    message = error.details() or error.code().name
    if info is None:
        return errors.SandboxCheckpointError(
            f"gateway {where}: {error.code().name}: {message}",
            code=errors.STORE_UNAVAILABLE
            if error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
            else status.INTERNAL,
            details={"gateway": where},
        )
    details = _details(trailers) or dict(info.metadata)
    reason = info.reason
    if reason == errors.MISSING_BLOB and "key" in details:
        return BlobNotFoundError(str(details["key"]))
    cls = _CLASSES.get(reason)
    if cls is not None:
        return cls(message, details=details)
    return errors.SandboxCheckpointError(message, code=reason, details=details)


# How grpc's channel says a call found no connection to send it on (it never
# left the client: the gateway cannot have acted on it).
_NEVER_SENT = ("failed to connect to all addresses", "connections to all backends failing")


def never_sent(error: grpc.aio.AioRpcError) -> bool:
    """Whether a failed call never reached the gateway: UNAVAILABLE because no
    connection could be made (refused, unreachable, TLS handshake failed), not
    one lost after the request went out."""
    details = (error.details() or "").lower()
    return error.code() == grpc.StatusCode.UNAVAILABLE and details.startswith(_NEVER_SENT)


def is_unreachable(exc: BaseException) -> bool:
    """Whether a rebuilt error says the gateway itself could not be reached."""
    return (
        isinstance(exc, errors.SandboxCheckpointError)
        and exc.code == errors.STORE_UNAVAILABLE
        and "gateway" in exc.details
    )


def writer_to_proto(writer: object) -> gpb.GatewayWriter:
    """The writer's fields (WRITER_LOST, as the stores say, for a non-writer)."""
    thread_id, owner_token, fence = writer_fields(writer)
    return gpb.GatewayWriter(thread_id=thread_id, owner_token=owner_token, fence=fence)


def writer_from_proto(message: gpb.GatewayWriter) -> Writer:
    return Writer(message.thread_id, message.owner_token, message.fence)


# ------------------------------------------------------------------ pack rows


def columns_to_proto(columns: PackColumns) -> gpb.GatewayPackRows:
    return gpb.GatewayPackRows(
        pack=columns.pack,
        digests=columns.digests,
        offsets=columns.offsets.tolist(),
        lengths=columns.lengths.tolist(),
        raw_sizes=columns.raw_sizes.tolist(),
        codecs=columns.codecs,
    )


def rows_to_proto(rows: Sequence[PackedBlob]) -> list[gpb.GatewayPackRows]:
    """Index rows as one message per pack: a pack session's columns as they
    are, any other rows grouped by pack (one row per key, digest order)."""
    if isinstance(rows, PackedRows):
        return [columns_to_proto(group) for group in rows.groups]
    by_pack: dict[str, dict[bytes, PackedBlob]] = {}
    for row in rows:
        by_pack.setdefault(row.pack, {})[bytes.fromhex(row.key[-64:])] = row
    out = []
    for pack, group in by_pack.items():
        order = sorted(group)
        out.append(
            gpb.GatewayPackRows(
                pack=pack,
                digests=b"".join(order),
                offsets=[group[d].offset for d in order],
                lengths=[group[d].length for d in order],
                raw_sizes=[group[d].raw_size for d in order],
                codecs=bytes(group[d].codec for d in order),
            )
        )
    return out


def columns_from_proto(message: gpb.GatewayPackRows) -> PackColumns:
    """The columns of a message (INVALID_ENTRY naming the pack when their
    lengths disagree or a value is out of range)."""
    columns = PackColumns(
        message.pack,
        bytes(message.digests),
        array("I", message.offsets),
        array("I", message.lengths),
        array("I", message.raw_sizes),
        bytes(message.codecs),
    )
    problem = columns.problem()
    if problem is not None:
        raise errors.SandboxCheckpointInvalidEntryError(
            f"invalid pack index rows of {message.pack!r}: {problem}",
            details={"key": message.pack},
        )
    return columns


def located_from_proto(message: gpb.GatewayLocated) -> dict[str, PackedBlob | None]:
    """key → row (None: known, no row) of a LocateBlobs or ListPackedBlobs reply."""
    found: dict[str, PackedBlob | None] = {key: None for key in message.unpacked}
    for group in message.packs:
        digests = bytes(group.digests)
        for i, codec in enumerate(bytes(group.codecs)):
            key = file_key(digests[32 * i : 32 * i + 32])
            found[key] = PackedBlob(
                key, group.pack, group.offsets[i], group.lengths[i], group.raw_sizes[i], codec
            )
    return found


def is_uuid(text: str) -> bool:
    """Whether ``text`` is a UUID in its canonical form."""
    try:
        return str(uuid.UUID(text)) == text
    except ValueError:
        return False


def refuse_foreign_id(checkpoint_id: str, thread_id: str) -> None:
    """INVALID_ARGUMENT for a request-derived checkpoint id bound to another
    thread (``ids.names_another_thread``): a tenant cannot take the id another
    tenant's request_id names. The error names only the caller's thread."""
    if names_another_thread(checkpoint_id, thread_id):
        raise errors.SandboxCheckpointInvalidArgumentError(
            f"checkpoint id {checkpoint_id!r} is derived from a request_id of another thread"
            f" than {thread_id!r}: a request_id's id is bound to its thread",
            details={"field": "checkpoint_id", "checkpoint_id": checkpoint_id},
        )


def decoded_checkpoint(document: bytes) -> Checkpoint:
    """The checkpoint a sidecar sent; a document that does not decode is the
    caller's error (the store validates the fields of one that does)."""
    try:
        return decode_checkpoint(document)
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise errors.SandboxCheckpointInvalidArgumentError(
            f"the checkpoint document does not decode ({type(exc).__name__}: {exc})"
        ) from None
