"""Bearer-token check for a daemon listening on TCP.

On a Unix socket the file mode (0600) is the access control. On TCP anyone who
can reach the port could capture, restore or read files, so every call of the
checkpointd service must carry ``authorization: Bearer <token>``; a call
without it ends with UNAUTHENTICATED before any handler runs. The scheme is
case-insensitive (RFC 6750 / RFC 9110: ``bearer`` and ``BEARER`` work too); the
token itself is compared exactly, in constant time, so it cannot be guessed byte
by byte from response timing.

Probes are exempt: ``grpc.health.v1.Health`` and server reflection (v1 and
v1alpha) answer without a token, because Kubernetes' gRPC probe and
grpc_health_probe cannot send headers, and neither service reveals more than
"serving or not" and the public schema. ``--auth-probes`` (``auth_probes``)
requires the token for them too.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from .status import DETAILS_KEY, UNAUTHENTICATED, rpc_status_for

_log = logging.getLogger(__name__)

AUTHORIZATION = "authorization"
SCHEME = "bearer"
# Services a probe or a schema tool calls; open unless auth_probes is set.
PROBE_SERVICES = (
    "grpc.health.v1.Health",
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
)


def bearer_metadata(token: str) -> tuple[tuple[str, str], ...]:
    """Call metadata that authenticates with ``token``."""
    return ((AUTHORIZATION, f"Bearer {token}"),)


def is_probe(method: str) -> bool:
    """Whether ``/pkg.Service/Method`` belongs to health or reflection."""
    service = method.lstrip("/").partition("/")[0]
    return service in PROBE_SERVICES


def _denying_handler(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    status = rpc_status_for(
        grpc.StatusCode.UNAUTHENTICATED,
        UNAUTHENTICATED,
        "missing or wrong bearer token",
        {},
    )
    trailers = ((DETAILS_KEY, status.SerializeToString()),)

    async def deny(_requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(
            grpc.StatusCode.UNAUTHENTICATED, status.message, trailing_metadata=trailers
        )

    # grpc reads a unary request whole before any handler runs; a handler that
    # takes the request as a stream (the same wire format) and never reads it
    # answers on the headers alone, whatever the caller sends after them.
    if handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(deny)
    return grpc.stream_unary_rpc_method_handler(deny)


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):
    """Lets a call through only when its metadata carries the right bearer token
    (probes too when ``auth_probes``)."""

    def __init__(self, token: str, *, auth_probes: bool = False) -> None:
        if not token:
            raise ValueError("an empty token would let every caller in")
        self._expected = token.encode()
        self._auth_probes = auth_probes

    def _authorized(self, metadata: Any) -> bool:
        for key, value in metadata or ():
            if key != AUTHORIZATION:
                continue
            given = value.encode() if isinstance(value, str) else bytes(value)
            scheme, _, credentials = given.partition(b" ")
            if scheme.lower() != SCHEME.encode():
                return False
            return hmac.compare_digest(credentials.strip(b" "), self._expected)
        return False

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        if not self._auth_probes and is_probe(handler_call_details.method):
            return handler
        if self._authorized(handler_call_details.invocation_metadata):
            return handler
        # Never the token given: only that the call was refused.
        _log.warning(
            "%s refused: UNAUTHENTICATED (missing or wrong bearer token)",
            handler_call_details.method,
        )
        return _denying_handler(handler)
