"""The gateway's first check of every call: its token, on the headers alone.

``GatewayAuthInterceptor`` runs when a call's headers arrive, before grpc reads
its request. A Gateway call with no token, a token that does not verify, or
any call while the gateway drains is refused there, and by a handler that
reads no request: grpc's server reads a unary request whole before it hands it
to any handler, so the refusing handler takes the request as a stream it never
reads (the wire format is the same). A peer without a token thus costs the
gateway its headers, whatever it sends after them; the status reaches it while
it is still sending. Health and reflection answer without a token (probes).

``Authenticator`` verifies tokens (``tokens.TokenVerifier``) and keeps the
scopes of recent ones, so the handlers, which ask again for the scope they
check, find it at once.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import grpc

from ..service import status
from ..service.auth import AUTHORIZATION, SCHEME, is_probe
from . import wire
from .tokens import TokenScope, TokenVerifier

# Verified tokens kept (re-checked for expiry on every use).
TOKEN_CACHE_SIZE = 10_000
_log = logging.getLogger("checkpointd.gateway")

Observe = Callable[[str, grpc.StatusCode, float], None]


def bearer_token(metadata: Iterable[tuple[str, Any]] | None) -> str:
    """The bearer token of a call's metadata ("" when there is none)."""
    for key, value in metadata or ():
        if key == AUTHORIZATION:
            text = value if isinstance(value, str) else bytes(value).decode("latin-1")
            scheme, _, token = text.partition(" ")
            return token.strip() if scheme.lower() == SCHEME else ""
    return ""


class Authenticator:
    """Token → scope, verified once and kept (newest ``TOKEN_CACHE_SIZE``)."""

    def __init__(self, verifier: TokenVerifier, limit: int = TOKEN_CACHE_SIZE) -> None:
        self.verifier = verifier
        self._limit = limit
        self._scopes: OrderedDict[str, TokenScope] = OrderedDict()

    def scope(self, metadata: Iterable[tuple[str, Any]] | None) -> TokenScope:
        """The scope of the call's token; ServiceError(UNAUTHENTICATED) otherwise."""
        token = bearer_token(metadata)
        if not token:
            raise status.ServiceError(
                status.UNAUTHENTICATED, "gateway token refused: missing", why="missing"
            )
        scope = self._scopes.get(token)
        if scope is None:
            scope = self.verifier.verify(token)
            self._scopes[token] = scope
            while len(self._scopes) > self._limit:
                self._scopes.popitem(last=False)
        elif scope.expires_at + 60 <= time.time():
            del self._scopes[token]
            scope = self.verifier.verify(token)  # raises: expired
        return scope


def refusing_handler(handler: grpc.RpcMethodHandler, error: Exception) -> grpc.RpcMethodHandler:
    """A handler for ``handler``'s method that answers ``error`` and reads no
    request: it takes the request as a stream, which grpc leaves unread."""
    code, message, trailers = wire.error_trailers(error)

    async def refuse(_requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(code, message, trailing_metadata=trailers)

    if handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse)
    return grpc.stream_unary_rpc_method_handler(refuse)


class GatewayAuthInterceptor(grpc.aio.ServerInterceptor):
    """Refuses a Gateway call before its request is read when the gateway
    drains (DRAINING) or the call's token does not verify (UNAUTHENTICATED)."""

    def __init__(
        self,
        authenticator: Authenticator,
        draining: Callable[[], bool],
        observe: Observe | None = None,
    ) -> None:
        self._authenticator = authenticator
        self._draining = draining
        self._observe = observe

    def _refusal(self, details: grpc.HandlerCallDetails) -> Exception | None:
        if self._draining():
            return status.ServiceError(status.DRAINING, "the gateway is shutting down")
        try:
            self._authenticator.scope(details.invocation_metadata)
        except status.ServiceError as refused:
            return refused
        return None

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or is_probe(method):
            return handler
        refusal = self._refusal(handler_call_details)
        if refusal is None:
            return handler
        name = method.rpartition("/")[2]
        _log.debug("%s refused before its request was read: %s", name, refusal)
        if self._observe is not None:
            self._observe(name, wire.error_trailers(refusal)[0], 0.0)
        return refusing_handler(handler, refusal)


__all__ = [
    "Authenticator",
    "GatewayAuthInterceptor",
    "TOKEN_CACHE_SIZE",
    "bearer_token",
    "refusing_handler",
]
