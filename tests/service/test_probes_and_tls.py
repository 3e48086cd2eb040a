"""Probes, reflection and TLS over TCP, with the ecosystem's own clients.

* ``grpc-health-probe`` (what Kubernetes-style probes run; it cannot send a
  token) must get SERVING over TCP without the bearer token, and be refused with
  ``--auth-probes``.
* ``grpcurl`` lists the services through reflection v1 (it asks v1 first).
* TLS and mutual TLS round trips with certificates made here (``cryptography``).

The Go tools are installed by ``.ci/run`` into ``$CHECKPOINTD_TOOLS`` (default
``~/.cache/checkpointd-tools``) and looked up there or on PATH.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc

from checkpointd.service.client import Client, RpcError

from .conftest import Daemon, DaemonFactory

TOKEN = "probe-test-token"


def _tool(name: str) -> str:
    tools = os.environ.get("CHECKPOINTD_TOOLS", os.path.expanduser("~/.cache/checkpointd-tools"))
    found = shutil.which(name, path=f"{tools}{os.pathsep}{os.environ.get('PATH', '')}")
    assert found, f"{name} is needed: .ci/run installs it with go install into {tools}"
    return found


# ---------------------------------------------------------------- certificates


@dataclass
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_client_cert: Path
    other_client_key: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> Path:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return path


def _certificate(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Certificate | None,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    server: bool = False,
    ca: bool = False,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer.subject if issuer else name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        ).add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    elif not ca:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
    return builder.sign(issuer_key, hashes.SHA256())


def _pem(path: Path, certificate: x509.Certificate) -> Path:
    path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return path


@pytest.fixture
def pki(short_tmp: Path) -> Pki:
    directory = short_tmp / "pki"
    directory.mkdir()
    ca_key = _key()
    ca = _certificate("checkpointd test CA", ca_key, None, ca_key, ca=True)
    server_key, client_key, other_key = _key(), _key(), _key()
    other_ca_key = _key()
    other_ca = _certificate("another CA", other_ca_key, None, other_ca_key, ca=True)
    return Pki(
        ca=_pem(directory / "ca.pem", ca),
        server_cert=_pem(
            directory / "server.pem",
            _certificate("localhost", server_key, ca, ca_key, server=True),
        ),
        server_key=_write_key(directory / "server.key", server_key),
        client_cert=_pem(directory / "client.pem", _certificate("client", client_key, ca, ca_key)),
        client_key=_write_key(directory / "client.key", client_key),
        other_client_cert=_pem(
            directory / "other.pem", _certificate("intruder", other_key, other_ca, other_ca_key)
        ),
        other_client_key=_write_key(directory / "other.key", other_key),
    )


def _wait_serving(daemon: Daemon, credentials: grpc.ChannelCredentials) -> None:
    target = daemon.address.removeprefix("tcp://")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if daemon.proc.poll() is not None:
            raise RuntimeError(f"daemon exited:\n{daemon.log_text()}")
        with grpc.secure_channel(target, credentials) as channel:
            try:
                reply = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(), timeout=1.0
                )
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
        time.sleep(0.1)
    raise TimeoutError(daemon.log_text())


# ---------------------------------------------------------------- probes


def test_grpc_health_probe_needs_no_token_over_tcp(daemons: DaemonFactory) -> None:
    probe = _tool("grpc-health-probe")
    daemon = daemons.start(tcp=True, token=TOKEN)
    address = daemon.address.removeprefix("tcp://")
    for service in ("", "checkpointd.v1.Checkpointd"):
        result = subprocess.run(
            [probe, f"-addr={address}", f"-service={service}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert "SERVING" in result.stdout + result.stderr


def test_auth_probes_puts_health_behind_the_token(daemons: DaemonFactory) -> None:
    probe = _tool("grpc-health-probe")
    daemon = daemons.start(tcp=True, token=TOKEN, extra=("--auth-probes",))
    address = daemon.address.removeprefix("tcp://")
    denied = subprocess.run([probe, f"-addr={address}"], capture_output=True, text=True, timeout=60)
    assert denied.returncode != 0
    assert "Unauthenticated" in denied.stdout + denied.stderr or "UNAUTHENTICATED" in (
        denied.stdout + denied.stderr
    )
    allowed = subprocess.run(
        [probe, f"-addr={address}", "-rpc-header", f"authorization: Bearer {TOKEN}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr


def test_grpcurl_lists_through_reflection_v1_without_a_token(daemons: DaemonFactory) -> None:
    grpcurl = _tool("grpcurl")
    daemon = daemons.start(tcp=True, token=TOKEN)
    address = daemon.address.removeprefix("tcp://")
    # -use-reflection with grpcurl 1.9 tries v1 first; -v1 style is checked by
    # asking the v1 service directly below.
    listing = subprocess.run(
        [grpcurl, "-plaintext", address, "list"], capture_output=True, text=True, timeout=60
    )
    assert listing.returncode == 0, listing.stderr
    services = listing.stdout.split()
    assert "checkpointd.v1.Checkpointd" in services
    assert "grpc.health.v1.Health" in services
    assert "grpc.reflection.v1.ServerReflection" in services
    methods = subprocess.run(
        [grpcurl, "-plaintext", address, "describe", "checkpointd.v1.Checkpointd"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert methods.returncode == 0, methods.stderr
    assert "rpc SweepBlobs" in methods.stdout and "stream" in methods.stdout
    # A method by its own name (Service.Method), as grpcurl and Postman ask.
    for method, shown in (
        ("checkpointd.v1.Checkpointd.ListThreads", "rpc ListThreads"),
        ("grpc.health.v1.Health.Check", "rpc Check"),
    ):
        described = subprocess.run(
            [grpcurl, "-plaintext", address, "describe", method],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert described.returncode == 0, described.stderr
        assert shown in described.stdout
    # The checkpointd service itself still wants the token...
    denied = subprocess.run(
        [grpcurl, "-plaintext", address, "checkpointd.v1.Checkpointd/GetServerInfo"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert denied.returncode != 0 and "Unauthenticated" in denied.stderr
    # ...and a lower-case scheme is a valid bearer token (RFC 6750 is case-insensitive).
    allowed = subprocess.run(
        [
            grpcurl,
            "-plaintext",
            "-H",
            f"authorization: bearer {TOKEN}",
            address,
            "checkpointd.v1.Checkpointd/GetServerInfo",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert allowed.returncode == 0, allowed.stderr
    assert '"protocol_version": 2' in allowed.stdout


async def test_reflection_v1_answers_directly(daemons: DaemonFactory) -> None:
    """The v1 service by its own name (not through v1alpha fallback)."""
    from grpc_reflection.v1alpha import reflection_pb2

    daemon = daemons.start(tcp=True, token=TOKEN)
    async with grpc.aio.insecure_channel(daemon.address.removeprefix("tcp://")) as channel:
        call = channel.stream_stream(
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
        )
        requests = [
            reflection_pb2.ServerReflectionRequest(list_services=""),
            reflection_pb2.ServerReflectionRequest(
                file_containing_symbol="grpc.reflection.v1.ServerReflection"
            ),
        ]
        replies = [reply async for reply in call(iter(requests), timeout=10)]
    names = {s.name for s in replies[0].list_services_response.service}
    assert {"checkpointd.v1.Checkpointd", "grpc.reflection.v1alpha.ServerReflection"} <= names
    assert replies[1].file_descriptor_response.file_descriptor_proto


# ---------------------------------------------------------------- TLS


async def test_tls_round_trip_with_token(daemons: DaemonFactory, pki: Pki) -> None:
    daemon = daemons.start(
        tcp=True,
        token=TOKEN,
        wait=False,
        extra=("--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key)),
    )
    _wait_serving(daemon, grpc.ssl_channel_credentials(pki.ca.read_bytes()))
    (daemon.workspace / "a.txt").write_text("over TLS")
    async with Client(daemon.address, token=TOKEN, tls_ca=pki.ca.read_bytes()) as client:
        done = await client.capture("t-tls")
        (daemon.workspace / "a.txt").write_text("changed")
        assert (await client.restore("t-tls")).restored
        info = await client.server_info()
    assert (daemon.workspace / "a.txt").read_text() == "over TLS"
    assert done.checkpoint.file_count == 1
    assert info.capabilities.tls and not info.capabilities.mutual_tls
    assert info.capabilities.auth_mode == "bearer-token"
    # TLS does not replace the token: without it the call is refused.
    async with Client(daemon.address, tls_ca=pki.ca.read_bytes()) as client:
        with pytest.raises(RpcError) as caught:
            await client.get_head("t-tls")
    assert caught.value.code == grpc.StatusCode.UNAUTHENTICATED
    # A plain-text client cannot talk to a TLS port.
    async with Client(daemon.address, token=TOKEN, timeout=3) as client:
        with pytest.raises(RpcError) as caught:
            await client.get_head("t-tls")
    assert caught.value.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


async def test_mutual_tls_round_trip(daemons: DaemonFactory, pki: Pki) -> None:
    daemon = daemons.start(
        tcp=True,
        wait=False,
        extra=(
            "--tls-cert",
            str(pki.server_cert),
            "--tls-key",
            str(pki.server_key),
            "--tls-client-ca",
            str(pki.ca),
        ),
    )
    ca = pki.ca.read_bytes()
    _wait_serving(
        daemon,
        grpc.ssl_channel_credentials(ca, pki.client_key.read_bytes(), pki.client_cert.read_bytes()),
    )
    (daemon.workspace / "m.txt").write_text("mutual")
    async with Client(
        daemon.address,
        tls_ca=ca,
        tls_cert=pki.client_cert.read_bytes(),
        tls_key=pki.client_key.read_bytes(),
    ) as client:
        done = await client.capture("t-mtls")
        assert await client.get_head("t-mtls") == done.checkpoint.id
        info = await client.server_info()
    assert info.capabilities.mutual_tls and info.capabilities.auth_mode == "mutual-tls"
    # No client certificate, or one from another CA: the handshake fails.
    for cert, key in ((None, None), (pki.other_client_cert, pki.other_client_key)):
        async with Client(
            daemon.address,
            timeout=3,
            tls_ca=ca,
            tls_cert=cert.read_bytes() if cert else None,
            tls_key=key.read_bytes() if key else None,
        ) as client:
            with pytest.raises(RpcError) as caught:
                await client.get_head("t-mtls")
        assert caught.value.code in (
            grpc.StatusCode.UNAVAILABLE,
            grpc.StatusCode.DEADLINE_EXCEEDED,
        )


def test_cli_over_mutual_tls(daemons: DaemonFactory, pki: Pki) -> None:
    import json
    import sys

    from .conftest import clean_env

    daemon = daemons.start(
        tcp=True,
        wait=False,
        extra=(
            "--tls-cert",
            str(pki.server_cert),
            "--tls-key",
            str(pki.server_key),
            "--tls-client-ca",
            str(pki.ca),
        ),
    )
    ca = pki.ca.read_bytes()
    _wait_serving(
        daemon,
        grpc.ssl_channel_credentials(ca, pki.client_key.read_bytes(), pki.client_cert.read_bytes()),
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "checkpointd",
            "info",
            "--json",
            "--address",
            daemon.address,
            "--tls-ca",
            str(pki.ca),
            "--tls-cert",
            str(pki.client_cert),
            "--tls-key",
            str(pki.client_key),
        ],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["capabilities"]["mutual_tls"] is True


def test_tls_settings_are_checked(tmp_path: Path) -> None:
    from checkpointd.errors import SandboxCheckpointInvalidArgumentError
    from checkpointd.service.config import resolve

    base = {"workspace": str(tmp_path), "data_dir": str(tmp_path / "d")}
    tcp = {**base, "listen": "tcp://127.0.0.1:1"}
    cases = [
        ({**tcp, "token": "t", "tls_cert": "c.pem"}, "go together"),
        ({**tcp, "token": "t", "tls_client_ca": "ca.pem"}, "needs --tls-cert"),
        ({**base, "tls_cert": "c.pem", "tls_key": "k.pem"}, "TLS is for TCP"),
        ({**tcp, "tls_cert": "c.pem", "tls_key": "k.pem"}, "without a bearer token"),
    ]
    for flags, message in cases:
        with pytest.raises(SandboxCheckpointInvalidArgumentError, match=message):
            resolve(flags, environ={})
    mutual = resolve(
        {**tcp, "tls_cert": "c.pem", "tls_key": "k.pem", "tls_client_ca": "ca.pem"}, environ={}
    )
    assert mutual.auth_mode == "mutual-tls" and mutual.tls_cert == Path.cwd() / "c.pem"
    both = resolve(
        {**tcp, "token": "t", "tls_client_ca": "ca.pem", "tls_cert": "c", "tls_key": "k"},
        environ={},
    )
    assert both.auth_mode == "mutual-tls+bearer-token"
    assert resolve(base, environ={}).auth_mode == "unix-socket"
