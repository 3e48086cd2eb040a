"""`serve --gateway`: no store URL beside it, a token file required, backends reported."""

from __future__ import annotations

from pathlib import Path

import pytest

from checkpointd.errors import SandboxCheckpointInvalidArgumentError
from checkpointd.gateway.remote import parse_gateway_url
from checkpointd.service.config import resolve
from checkpointd.service.server import backend_name


def test_gateway_replaces_the_store_and_the_blobs(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t")
    flags = {"gateway": "grpcs://gw-a:7443,gw-b:7443", "gateway_token_file": str(token)}
    config = resolve(flags, environ={})
    assert config.gateway == "grpcs://gw-a:7443,gw-b:7443"
    assert config.gateway_token_file == token
    assert backend_name(config.store) == backend_name(config.blobs) == "gateway"
    for extra in ({"store": "postgresql://u:p@db/x"}, {"blobs": "s3://bucket/p"}):
        with pytest.raises(SandboxCheckpointInvalidArgumentError, match="replaces"):
            resolve({**flags, **extra}, environ={})
    with pytest.raises(SandboxCheckpointInvalidArgumentError, match="token-file"):
        resolve({"gateway": "grpcs://gw:1"}, environ={})


@pytest.mark.parametrize(
    ("url", "addresses", "tls"),
    [
        ("grpcs://gw:7443", ["gw:7443"], True),
        ("grpc://127.0.0.1:1,127.0.0.1:2", ["127.0.0.1:1", "127.0.0.1:2"], False),
        ("checkpointd+gateway://gw:1?tls=false", ["gw:1"], False),
        ("checkpointd+gateway://gw:1", ["gw:1"], True),
    ],
)
def test_gateway_urls(url: str, addresses: list[str], tls: bool) -> None:
    assert parse_gateway_url(url) == (addresses, tls)


@pytest.mark.parametrize("url", ["https://gw:1", "grpcs://", "grpcs://gw", "grpcs://gw:1/path"])
def test_bad_gateway_urls(url: str) -> None:
    with pytest.raises(SandboxCheckpointInvalidArgumentError):
        parse_gateway_url(url)
