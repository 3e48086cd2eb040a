"""The sweep lists and aborts S3 multipart leftovers with the credentials obstore
itself uses, not only static keys: a store's credential_provider, the container
credentials endpoint and the instance metadata service (IMDSv2), each serving
the real SeaweedFS keys from a real HTTP endpoint on loopback, as the AWS agents
do. In each case obstore reads and writes with that configuration too."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from obstore.store import S3Store

from checkpointd.blobs import ObjectBlobStore, open_blobs
from checkpointd.blobs.staging import StagingUnavailableError, list_staging, remove_staging
from tests.engine.test_pack_sweep import _key, _kill_mid_multipart

pytestmark = pytest.mark.s3

_AWS_VARIABLES = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_TOKEN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_ROLE_ARN",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
    "AWS_METADATA_ENDPOINT",
    "AWS_IMDSV1_FALLBACK",
)


@pytest.fixture
def no_static_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _AWS_VARIABLES:
        monkeypatch.delenv(name, raising=False)


class _CredentialEndpoint:
    """The AWS credential endpoints a container or an instance has, serving the
    test server's keys (what an ECS agent or the metadata service would hand
    out), and counting who asked for what."""

    def __init__(self, s3_server: Any, authorization: str) -> None:
        self.s3 = s3_server
        self.authorization = authorization
        self.asked: list[str] = []
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_PUT(self) -> None:  # noqa: N802 - http.server's name
                endpoint.asked.append(f"PUT {self.path}")
                if self.path == "/latest/api/token":
                    self._send(200, b"imds-session-token")
                else:
                    self._send(404, b"")

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                endpoint.asked.append(f"GET {self.path}")
                base = "/latest/meta-data/iam/security-credentials/"
                if self.path.startswith(base):
                    if self.headers.get("X-aws-ec2-metadata-token") != "imds-session-token":
                        self._send(401, b"")
                    elif self.path == base:
                        self._send(200, b"sandbox-role")
                    else:
                        self._send(200, endpoint.credentials())
                elif self.path == "/container-credentials":
                    if self.headers.get("Authorization") != endpoint.authorization:
                        self._send(403, b"")
                    else:
                        self._send(200, endpoint.credentials())
                else:
                    self._send(404, b"")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def credentials(self) -> bytes:
        expires = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
        return json.dumps(
            {
                "Code": "Success",
                "Type": "AWS-HMAC",
                "AccessKeyId": self.s3.access_key_id,
                "SecretAccessKey": self.s3.secret_access_key,
                "Token": "",
                "Expiration": expires,
                "LastUpdated": expires,
            }
        ).encode()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def credential_endpoint(s3_server: Any) -> Iterator[_CredentialEndpoint]:
    endpoint = _CredentialEndpoint(s3_server, f"Bearer {uuid.uuid4().hex}")
    try:
        yield endpoint
    finally:
        endpoint.close()


async def _leftover_round_trip(s3_server: Any, blobs: Any, prefix: str) -> None:
    """obstore works with ``blobs``' configuration; a killed multipart upload is
    listed and aborted with the same configuration."""
    await blobs.put("sandbox-files/probe", b"written with these credentials")
    assert await blobs.get("sandbox-files/probe") == b"written with these credentials"
    key = _key(uuid.uuid4().bytes)
    await asyncio.to_thread(_kill_mid_multipart, s3_server, prefix, key)
    [left] = await list_staging(blobs)
    assert left.key == f"{prefix}/{key}" and left.name.startswith(f"{key}?uploadId=")
    await remove_staging(blobs, left)
    assert await list_staging(blobs) == []


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_a_credential_provider_lists_and_aborts(
    s3_server: Any, no_static_keys: None, kind: str
) -> None:
    calls: list[str] = []

    def credentials() -> dict[str, Any]:
        calls.append(kind)
        return {
            "access_key_id": s3_server.access_key_id,
            "secret_access_key": s3_server.secret_access_key,
            "token": None,
            "expires_at": datetime.now(UTC) + timedelta(hours=1),
        }

    async def credentials_async() -> dict[str, Any]:
        return credentials()

    prefix = f"provider-{uuid.uuid4().hex}"
    store = S3Store(
        s3_server.bucket,
        prefix=prefix,
        config={"endpoint": s3_server.endpoint, "region": s3_server.region},
        client_options={"allow_http": True},
        credential_provider=credentials if kind == "sync" else credentials_async,  # type: ignore[arg-type]
    )
    blobs = ObjectBlobStore(store, s3_server.url(prefix))
    await _leftover_round_trip(s3_server, blobs, prefix)
    assert calls, "the provider was never asked"


async def test_the_container_credentials_endpoint_lists_and_aborts(
    s3_server: Any,
    no_static_keys: None,
    credential_endpoint: _CredentialEndpoint,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(credential_endpoint.authorization)  # obstore sends it as it is
    monkeypatch.setenv(
        "AWS_CONTAINER_CREDENTIALS_FULL_URI", credential_endpoint.url + "/container-credentials"
    )
    monkeypatch.setenv("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", str(token_file))
    prefix = f"container-{uuid.uuid4().hex}"
    blobs = open_blobs(s3_server.url(prefix), endpoint=s3_server.endpoint, region=s3_server.region)
    await _leftover_round_trip(s3_server, blobs, prefix)
    assert "GET /container-credentials" in credential_endpoint.asked


async def test_the_instance_metadata_service_lists_and_aborts(
    s3_server: Any,
    no_static_keys: None,
    credential_endpoint: _CredentialEndpoint,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_METADATA_ENDPOINT", credential_endpoint.url)
    prefix = f"imds-{uuid.uuid4().hex}"
    blobs = open_blobs(s3_server.url(prefix), endpoint=s3_server.endpoint, region=s3_server.region)
    await _leftover_round_trip(s3_server, blobs, prefix)
    assert "PUT /latest/api/token" in credential_endpoint.asked
    assert (
        "GET /latest/meta-data/iam/security-credentials/sandbox-role" in credential_endpoint.asked
    )


async def test_without_any_credentials_the_sweep_says_why(
    s3_server: Any,
    no_static_keys: None,
    credential_endpoint: _CredentialEndpoint,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A metadata service that has no role for this machine: nothing answers.
    monkeypatch.setenv("AWS_METADATA_ENDPOINT", credential_endpoint.url + "/nothing-here")
    blobs = open_blobs(
        s3_server.url(f"none-{uuid.uuid4().hex}"),
        endpoint=s3_server.endpoint,
        region=s3_server.region,
    )
    with pytest.raises(StagingUnavailableError, match="AbortIncompleteMultipartUpload"):
        await list_staging(blobs)
