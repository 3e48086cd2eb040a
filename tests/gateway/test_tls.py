"""The gateway over TLS and mutual TLS, as `serve` (real certificates, loopback)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from checkpointd.blobs import open_blobs
from checkpointd.errors import SandboxCheckpointError
from checkpointd.gateway import tokens
from checkpointd.gateway.remote import RemoteCheckpointStore, connection_from_options
from checkpointd.gateway.server import GatewayConfig, build_gateway_server
from checkpointd.gateway.servicer import GatewayServicer
from checkpointd.store.sqlite import SqliteCheckpointStore
from tests.service.conftest import short_tmp  # noqa: F401 - fixture of the pki fixture
from tests.service.test_probes_and_tls import Pki, pki  # noqa: F401 - the fixture

from .conftest import Keys


async def _serve(tmp_path: Path, keys: Keys, **tls: Any) -> tuple[Any, int, Any]:
    store = await SqliteCheckpointStore.open(str(tmp_path / "s.db"))
    verifier = tokens.TokenVerifier(tokens.load_verifying_key(keys.public))
    servicer = GatewayServicer(store, open_blobs(f"file://{tmp_path / 'b'}"), verifier)
    config = GatewayConfig(listen="127.0.0.1:0", store="", blobs="", token_key=keys.public, **tls)
    config.check()
    server, _health, port = build_gateway_server(config, servicer)
    await server.start()
    return server, port, store


async def test_mutual_tls_lets_in_only_certified_sidecars(
    pki: Pki,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
    keys: Keys,
) -> None:
    server, port, store = await _serve(
        tmp_path,
        keys,
        tls_cert=pki.server_cert,
        tls_key=pki.server_key,
        tls_client_ca=pki.ca,
    )
    token_file = tmp_path / "token"
    token_file.write_text(keys.mint(threads=["t1"]))
    try:
        good = connection_from_options(
            f"grpcs://127.0.0.1:{port}",
            token_file,
            ca_file=pki.ca,
            cert_file=pki.client_cert,
            key_file=pki.client_key,
        )
        remote = await RemoteCheckpointStore.open(good)
        assert await remote.get_head("t1") is None
        await remote.aclose()
        for cert, key in ((None, None), (pki.other_client_cert, pki.other_client_key)):
            intruder = connection_from_options(
                f"grpcs://127.0.0.1:{port}",
                token_file,
                ca_file=pki.ca,
                cert_file=cert,
                key_file=key,
            )
            with pytest.raises(SandboxCheckpointError) as caught:
                await RemoteCheckpointStore.open(intruder)
            assert caught.value.code == "SANDBOX_SNAPSHOT_STORE_UNAVAILABLE"
            await intruder.aclose()
        # A sidecar that does not trust the gateway's CA does not talk to it.
        untrusting = connection_from_options(f"grpcs://127.0.0.1:{port}", token_file)
        with pytest.raises(SandboxCheckpointError):
            await RemoteCheckpointStore.open(untrusting)
        await untrusting.aclose()
    finally:
        await server.stop(None)
        await store.aclose()


def test_the_gateway_refuses_to_listen_without_tls_unless_told(keys: Keys) -> None:
    from checkpointd.errors import SandboxCheckpointInvalidArgumentError

    def config(listen: str, **options: Any) -> GatewayConfig:
        return GatewayConfig(listen=listen, store="", blobs="", token_key=keys.public, **options)

    with pytest.raises(SandboxCheckpointInvalidArgumentError, match="tls-cert"):
        config("0.0.0.0:7443").check()
    with pytest.raises(SandboxCheckpointInvalidArgumentError, match="tls-cert"):
        config("tcp://gw.internal:7443").check()
    config("0.0.0.0:7443", insecure_plaintext=True).check()
    for loopback in ("127.0.0.1:7443", "tcp://localhost:7443", "[::1]:7443"):
        assert config(loopback).plaintext
    assert config("tcp://127.0.0.1:7443").address == "127.0.0.1:7443"
