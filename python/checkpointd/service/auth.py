"""Bearer-token check for a daemon listening on TCP.

On a Unix socket the file mode (0600) is the access control. On TCP anyone who
can reach the port could capture, restore or read files, so every call — health
and reflection included — must carry ``authorization: Bearer <token>``; a call
without it ends with UNAUTHENTICATED before any handler runs. The comparison is
constant-time so the token cannot be guessed byte by byte from response timing.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from .status import DETAILS_KEY, UNAUTHENTICATED, rpc_status_for

AUTHORIZATION = "authorization"


def bearer_metadata(token: str) -> tuple[tuple[str, str], ...]:
    """Call metadata that authenticates with ``token``."""
    return ((AUTHORIZATION, f"Bearer {token}"),)


def _denying_handler(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    status = rpc_status_for(
        grpc.StatusCode.UNAUTHENTICATED,
        UNAUTHENTICATED,
        "missing or wrong bearer token",
        {},
    )
    trailers = ((DETAILS_KEY, status.SerializeToString()),)

    async def deny(_request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(
            grpc.StatusCode.UNAUTHENTICATED, status.message, trailing_metadata=trailers
        )

    # Keep the method's streaming shape so grpc reads and answers it correctly.
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(deny)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(deny)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(deny)
    return grpc.unary_unary_rpc_method_handler(deny)


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):
    """Lets a call through only when its metadata carries the right bearer token."""

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("an empty token would let every caller in")
        self._expected = f"Bearer {token}".encode()

    def _authorized(self, metadata: Any) -> bool:
        for key, value in metadata or ():
            if key == AUTHORIZATION:
                given = value.encode() if isinstance(value, str) else bytes(value)
                return hmac.compare_digest(given, self._expected)
        return False

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or self._authorized(handler_call_details.invocation_metadata):
            return handler
        return _denying_handler(handler)
