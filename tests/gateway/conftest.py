"""An in-process gateway on loopback, and tokens for it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from checkpointd.gateway import tokens
from checkpointd.gateway.remote import GatewayConnection, RemoteCheckpointStore
from checkpointd.gateway.server import GatewayConfig, build_gateway_server
from checkpointd.gateway.servicer import BackendNames, GatewayServicer


@dataclass
class Keys:
    private: Path
    public: Path

    def mint(
        self,
        *,
        threads: Iterable[str] = (),
        prefixes: Iterable[str] = (),
        ops: Iterable[str] = tokens.DEFAULT_OPS,
        ttl_s: float = 3600,
        **kwargs: Any,
    ) -> str:
        return tokens.mint(
            tokens.load_signing_key(self.private),
            tokens.TokenGrant(
                threads=threads, thread_prefixes=prefixes, ops=ops, ttl_s=ttl_s, **kwargs
            ),
        )


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    private = tmp_path / "token-key.pem"
    public = tokens.generate_key(private)
    return Keys(private, public)


class InProcessGateway:
    """A Gateway service on 127.0.0.1 in this event loop (plaintext: loopback)."""

    def __init__(self, store: Any, blobs: Any, public_key: Path, observe: Any = None) -> None:
        verifier = tokens.TokenVerifier(tokens.load_verifying_key(public_key))
        self.servicer = GatewayServicer(
            store, blobs, verifier, backend_names=BackendNames(store="test"), observe=observe
        )
        config = GatewayConfig(
            listen="127.0.0.1:0",
            store="",
            blobs="",
            token_key=public_key,
            insecure_plaintext=True,
        )
        self.server, self.health, self.port = build_gateway_server(config, self.servicer)
        self.store = store

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> InProcessGateway:
        await self.server.start()
        return self

    async def stop(self) -> None:
        await self.server.stop(None)

    def connection(self, token: str) -> GatewayConnection:
        return GatewayConnection([self.address], lambda: token, tls=False)


class GatewayBackedStore(RemoteCheckpointStore):
    """A remote store that also stops its gateway and closes the store behind it."""

    gateway: InProcessGateway

    async def aclose(self) -> None:
        await super().aclose()
        await self.gateway.stop()
        await self.gateway.store.aclose()


async def remote_store_over(store: Any, blobs: Any, keys: Keys) -> GatewayBackedStore:
    gateway = await InProcessGateway(store, blobs, keys.public).start()
    admin = keys.mint(all_threads=True, ops=tokens.OPS)
    remote = await GatewayBackedStore.open(gateway.connection(admin))
    remote.gateway = gateway
    return remote  # type: ignore[return-value]


@pytest.fixture
async def gateway_factory(keys: Keys) -> AsyncIterator[Any]:
    started: list[InProcessGateway] = []

    async def make(store: Any, blobs: Any, observe: Any = None) -> InProcessGateway:
        gateway = await InProcessGateway(store, blobs, keys.public, observe).start()
        started.append(gateway)
        return gateway

    yield make
    for gateway in started:
        await gateway.stop()
