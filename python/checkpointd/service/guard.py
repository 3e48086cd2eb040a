"""Requests that cannot be decoded, or are too large, still get a proper status.

Left to itself grpc turns a request whose bytes do not parse (a proto3 string
field holding invalid UTF-8, a truncated message) into UNKNOWN with no details,
and a message over the receive limit into RESOURCE_EXHAUSTED with no details.
This interceptor wraps every handler's deserializer, so both reach the handler as
a rejected request and leave as the usual statuses with ErrorInfo:

* undecodable bytes → INVALID_ARGUMENT, reason ``SANDBOX_SNAPSHOT_INVALID_ARGUMENT``,
  metadata ``method`` and ``message_type``;
* a message larger than ``MAX_MESSAGE_BYTES`` (4 MiB, gRPC's default) →
  RESOURCE_EXHAUSTED, reason ``SANDBOX_SNAPSHOT_MESSAGE_TOO_LARGE``, metadata
  ``limit_bytes`` and ``size_bytes``.

The transport itself accepts up to ``TRANSPORT_LIMIT_BYTES`` so that the 4 MiB
limit is enforced here, with details; only a message above that transport limit
is refused by grpc's core without ErrorInfo.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from ..errors import (
    SandboxCheckpointError,
    SandboxCheckpointInvalidArgumentError,
    SandboxCheckpointInvalidIdError,
)
from .status import MESSAGE_TOO_LARGE, UNIMPLEMENTED, abort

_log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 4 * 1024 * 1024
TRANSPORT_LIMIT_BYTES = 16 * 1024 * 1024


class _Rejected:
    """What the wrapped deserializer returns instead of raising."""

    __slots__ = ("error",)

    def __init__(self, method: str, error: SandboxCheckpointError) -> None:
        self.error = error
        # One WARNING per failed call, as the servicer logs its own failures.
        _log.warning("%s rejected: %s: %s", method, error.code, error.message)


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at += 1
        if not byte & 0x80:
            return value, at
        shift += 7


def _malformed_id_field(data: bytes, descriptor: Any) -> str | None:
    """The name of a top-level id field (``*_id``) of ``data`` whose bytes are
    not UTF-8, when that is why the message did not parse; else None.

    A walk of the top-level wire format only: any other damage is left to
    the caller's INVALID_ARGUMENT."""
    if descriptor is None:
        return None
    at = 0
    try:
        while at < len(data):
            tag, at = _varint(data, at)
            wire_type = tag & 7
            if wire_type == 0:
                _, at = _varint(data, at)
            elif wire_type == 1:
                at += 8
            elif wire_type == 5:
                at += 4
            elif wire_type == 2:
                length, at = _varint(data, at)
                value, at = data[at : at + length], at + length
                field = descriptor.fields_by_number.get(tag >> 3)
                if field is not None and field.type == field.TYPE_STRING:
                    try:
                        value.decode("utf-8")
                    except UnicodeDecodeError:
                        return field.name if field.name.endswith("_id") else None
            else:
                return None
    except ValueError:
        return None
    return None


def _guarded_deserializer(
    method: str, deserialize: Callable[[bytes], Any] | None
) -> Callable[[bytes], Any]:
    type_name = getattr(getattr(deserialize, "__self__", None), "DESCRIPTOR", None)
    message_type = type_name.full_name if type_name is not None else "request"

    def guarded(data: bytes) -> Any:
        if len(data) > MAX_MESSAGE_BYTES:
            return _Rejected(
                method,
                SandboxCheckpointError(
                    f"{method}: the request message is {len(data)} bytes, over the "
                    f"{MAX_MESSAGE_BYTES}-byte limit (stream large data in chunks; put large "
                    "payloads in artifacts)",
                    code=MESSAGE_TOO_LARGE,
                    details={"limit_bytes": MAX_MESSAGE_BYTES, "size_bytes": len(data)},
                ),
            )
        if deserialize is None:
            return data
        try:
            return deserialize(data)
        except Exception as exc:  # noqa: BLE001 - any parse failure is the caller's
            id_field = _malformed_id_field(data, type_name)
            if id_field is not None:
                return _Rejected(
                    method,
                    SandboxCheckpointInvalidIdError(
                        f"invalid {id_field}: not well-formed UTF-8 (ids are well-formed "
                        "Unicode strings)",
                        details={"field": id_field},
                    ),
                )
            return _Rejected(
                method,
                SandboxCheckpointInvalidArgumentError(
                    f"{method}: the request is not a valid {message_type} ({exc}); a string "
                    "field must hold well-formed UTF-8",
                    details={"method": method, "message_type": message_type},
                ),
            )

    return guarded


def _guard_handler(method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    deserializer = _guarded_deserializer(method, handler.request_deserializer)
    serializer = handler.response_serializer

    if handler.request_streaming:
        inner = handler.stream_stream if handler.response_streaming else handler.stream_unary

        async def checked_requests(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
            async for request in requests:
                if isinstance(request, _Rejected):
                    raise request.error
                yield request

        if handler.response_streaming:

            async def stream_stream(requests: Any, context: Any) -> AsyncIterator[Any]:
                async for reply in inner(checked_requests(requests), context):
                    yield reply

            return grpc.stream_stream_rpc_method_handler(stream_stream, deserializer, serializer)

        async def stream_unary(requests: Any, context: Any) -> Any:
            return await inner(checked_requests(requests), context)

        return grpc.stream_unary_rpc_method_handler(stream_unary, deserializer, serializer)

    if handler.response_streaming:
        inner = handler.unary_stream
        if inspect.isasyncgenfunction(inner):

            async def unary_stream_gen(request: Any, context: Any) -> AsyncIterator[Any]:
                if isinstance(request, _Rejected):
                    await abort(context, request.error)
                async for reply in inner(request, context):
                    yield reply

            return grpc.unary_stream_rpc_method_handler(unary_stream_gen, deserializer, serializer)

        async def unary_stream(request: Any, context: Any) -> Any:
            if isinstance(request, _Rejected):
                await abort(context, request.error)
            return await inner(request, context)

        return grpc.unary_stream_rpc_method_handler(unary_stream, deserializer, serializer)

    inner = handler.unary_unary

    async def unary_unary(request: Any, context: Any) -> Any:
        if isinstance(request, _Rejected):
            await abort(context, request.error)
        return await inner(request, context)

    return grpc.unary_unary_rpc_method_handler(unary_unary, deserializer, serializer)


class UnknownMethodHandler(grpc.GenericRpcHandler):
    """Registered last: a method no other handler serves is UNIMPLEMENTED with
    ErrorInfo (reason ``SANDBOX_SNAPSHOT_UNIMPLEMENTED``, metadata ``method``),
    not grpc's bare status, so a client built from a newer proto can tell."""

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method = handler_call_details.method

        async def refuse(_request: Any, context: Any) -> Any:
            _log.warning("%s refused: UNIMPLEMENTED (no such method here)", method)
            await abort(
                context,
                SandboxCheckpointError(
                    f"this daemon does not serve {method} (compare GetServerInfo's "
                    "protocol_version with your client's)",
                    code=UNIMPLEMENTED,
                    details={"method": method},
                ),
            )

        # Any request shape: the bytes are never read.
        return grpc.unary_unary_rpc_method_handler(refuse)


class RequestGuardInterceptor(grpc.aio.ServerInterceptor):
    """Turns undecodable and oversized requests into statuses with ErrorInfo."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        return _guard_handler(handler_call_details.method, handler)
