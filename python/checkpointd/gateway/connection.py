"""The sidecar's connection to its gateways: one channel per address, the token.

Several gateways: the connection sends each call to the current gateway; when
that one cannot be reached (connection refused or reset, or it is draining) it
moves to the next. Calls that are safe to repeat (reads, lease renew/release,
pins, content-addressed uploads of bytes) are repeated on the next gateway at
once, and so is any call that had no effect: one a draining gateway refused, or
one that never left (no connection could be made: ``wire.never_sent``). The
others (append, acquire, delete, fork), lost after they went out, raise
STORE_UNAVAILABLE and the caller retries: a capture retried with the same
``request_id`` finds the checkpoint the first attempt may have stored, so
nothing is lost or duplicated.

The token is read from its file on every call whose file changed since the last
read (the orchestrator may rotate it in place).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import grpc
from google.protobuf.message import Message

from ..errors import SandboxCheckpointInvalidArgumentError
from ..service import status
from ..service.auth import bearer_metadata
from ..v1 import gateway_pb2_grpc as gpb_grpc
from . import wire

SCHEMES = ("grpcs", "grpc")


class TokenFile:
    """The token in a file, read again whenever the file changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._token = ""
        self.read()

    def read(self) -> str:
        try:
            info = os.stat(self.path)
            stamp = (info.st_mtime_ns, info.st_size)
            if stamp != self._stamp:
                token = self.path.read_text(encoding="ascii").strip()
                if not token:
                    raise SandboxCheckpointInvalidArgumentError(
                        f"the gateway token file {self.path} is empty",
                        details={"path": str(self.path)},
                    )
                self._token, self._stamp = token, stamp
        except (OSError, UnicodeDecodeError) as exc:
            if self._token:
                return self._token  # keep the last good token while the file is replaced
            raise SandboxCheckpointInvalidArgumentError(
                f"cannot read the gateway token file {self.path}: {exc}",
                details={"path": str(self.path)},
            ) from None
        return self._token


def parse_gateway_url(url: str) -> tuple[list[str], bool]:
    """(``host:port`` addresses, TLS?) from ``grpcs://h:p[,h2:p2]`` or ``grpc://…``
    (also ``checkpointd+gateway://…``, which is TLS unless ``?tls=false``)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "checkpointd+gateway":
        tls = parse_qs(parts.query).get("tls", ["true"])[-1].lower() not in ("0", "false", "no")
    elif scheme in SCHEMES:
        tls = scheme == "grpcs"
    else:
        raise SandboxCheckpointInvalidArgumentError(
            f"not a gateway URL: {url!r} (use grpcs://host:port[,host:port…])"
        )
    addresses = [a.strip() for a in parts.netloc.split(",") if a.strip()]
    if not addresses or any(":" not in a for a in addresses) or parts.path not in ("", "/"):
        raise SandboxCheckpointInvalidArgumentError(
            f"gateway URL {url!r} must list host:port addresses (grpcs://host:port[,host:port…])"
        )
    return addresses, tls


class GatewayConnection:
    """Channels to one or more gateways and the token sent on every call."""

    def __init__(
        self,
        addresses: Sequence[str],
        token: Callable[[], str],
        *,
        tls: bool = True,
        root_certificates: bytes | None = None,
        client_certificate: tuple[bytes, bytes] | None = None,  # (key, chain): mutual TLS
        server_name: str | None = None,
    ) -> None:
        if not addresses:
            raise SandboxCheckpointInvalidArgumentError("no gateway address")
        self.addresses = list(addresses)
        self._token = token
        options: list[tuple[str, Any]] = list(wire.CHANNEL_OPTIONS)
        if server_name:
            options.append(("grpc.ssl_target_name_override", server_name))
        self._channels: list[grpc.aio.Channel] = []
        for address in self.addresses:
            if tls:
                key, chain = client_certificate or (None, None)
                credentials = grpc.ssl_channel_credentials(root_certificates, key, chain)
                channel = grpc.aio.secure_channel(address, credentials, options=options)
            else:
                channel = grpc.aio.insecure_channel(address, options=options)
            self._channels.append(channel)
        self._stubs = [gpb_grpc.GatewayStub(channel) for channel in self._channels]
        self._current = 0

    @property
    def url(self) -> str:
        return "checkpointd+gateway://" + ",".join(self.addresses)

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        return bearer_metadata(self._token())

    def _failed(self, index: int, error: grpc.aio.AioRpcError) -> Exception:
        exc = wire.error_from_rpc(error, where=self.addresses[index])
        reason = getattr(exc, "code", None)
        if wire.is_unreachable(exc) or reason == status.DRAINING:
            # Next call goes to the next gateway (unless another call moved on already).
            if self._current == index:
                self._current = (index + 1) % len(self._stubs)
            exc.failover = True  # type: ignore[attr-defined]
            # A draining gateway refused the call before doing anything, or the
            # call never left: any call may be repeated elsewhere.
            exc.refused = reason == status.DRAINING or wire.never_sent(error)  # type: ignore[attr-defined]
        return exc

    async def call(self, method: str, request: Any, *, repeatable: bool) -> Any:
        """One unary (or stream-unary: ``request`` is then a factory of the
        request iterator) call; repeated on the next gateway when this one is
        unreachable and ``repeatable``."""
        # A request stream made once cannot be sent again (a factory can).
        rebuildable = callable(request) or isinstance(request, Message)
        for attempt in range(len(self._stubs)):
            index = self._current
            stub = getattr(self._stubs[index], method)
            body = request() if callable(request) else request
            try:
                return await stub(body, metadata=self._metadata())
            except grpc.aio.AioRpcError as error:
                exc = self._failed(index, error)
                again = getattr(exc, "failover", False) and (
                    repeatable or (rebuildable and getattr(exc, "refused", False))
                )
                if not again or attempt == len(self._stubs) - 1:
                    raise exc from None
        raise AssertionError("unreachable")

    async def stream(self, method: str, request: Any, *, repeatable: bool = True) -> list[Any]:
        """A server-streaming call's messages, all of them."""
        for attempt in range(len(self._stubs)):
            index = self._current
            stub = getattr(self._stubs[index], method)
            try:
                return [message async for message in stub(request, metadata=self._metadata())]
            except grpc.aio.AioRpcError as error:
                exc = self._failed(index, error)
                again = getattr(exc, "failover", False) and (
                    repeatable or getattr(exc, "refused", False)
                )
                if not again or attempt == len(self._stubs) - 1:
                    raise exc from None
        raise AssertionError("unreachable")

    async def stream_iter(self, method: str, request: Any) -> AsyncIterator[Any]:
        """A server-streaming call's messages as they come (moves to the next
        gateway only before the first one)."""
        for attempt in range(len(self._stubs)):
            index = self._current
            call = getattr(self._stubs[index], method)(request, metadata=self._metadata())
            started = False
            try:
                async for message in call:
                    started = True
                    yield message
                return
            except grpc.aio.AioRpcError as error:
                exc = self._failed(index, error)
                if (
                    started
                    or not getattr(exc, "failover", False)
                    or attempt == len(self._stubs) - 1
                ):
                    raise exc from None

    async def aclose(self) -> None:
        for channel in self._channels:
            await channel.close()


def connection_from_options(
    url: str,
    token_file: Path,
    *,
    ca_file: Path | None = None,
    cert_file: Path | None = None,
    key_file: Path | None = None,
    server_name: str | None = None,
) -> GatewayConnection:
    """A connection from the CLI's / URL's options (files read now)."""
    addresses, tls = parse_gateway_url(url)

    def read(path: Path | None, what: str) -> bytes | None:
        if path is None:
            return None
        try:
            return path.read_bytes()
        except OSError as exc:
            raise SandboxCheckpointInvalidArgumentError(
                f"cannot read the {what} {path}: {exc.strerror}", details={"path": str(path)}
            ) from None

    client = None
    if cert_file is not None or key_file is not None:
        if cert_file is None or key_file is None:
            raise SandboxCheckpointInvalidArgumentError(
                "a gateway client certificate needs both --gateway-cert and --gateway-key"
            )
        client = (read(key_file, "gateway client key"), read(cert_file, "gateway client cert"))
    tokens = TokenFile(token_file)
    return GatewayConnection(
        addresses,
        tokens.read,
        tls=tls,
        root_certificates=read(ca_file, "gateway CA"),
        client_certificate=client,  # type: ignore[arg-type]
        server_name=server_name,
    )


__all__ = [
    "SCHEMES",
    "GatewayConnection",
    "TokenFile",
    "connection_from_options",
    "parse_gateway_url",
]
