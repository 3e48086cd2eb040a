"""Gateway mode with real parts: PostgreSQL and SeaweedFS S3 (tests/fixtures), two
`checkpointd gateway` processes over TLS, and SIDECARS `checkpointd serve
--gateway` daemons on loopback, each with its own workspace and a token for its
own thread prefix only.

SIDECARS is 20 (CHECKPOINTD_TEST_SIDECARS to change it); the tests run in file
order, the last one kills a gateway.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from checkpointd.gateway import tokens
from checkpointd.service.client import Client, RpcError
from checkpointd.service.request_ids import derive_checkpoint_id
from checkpointd.service.status import FORBIDDEN, UNAUTHENTICATED
from tests.fixtures.postgres import ROLE_PASSWORD, SUPERUSER_PASSWORD, PostgresServer
from tests.fixtures.s3 import S3Server
from tests.service.conftest import Daemon, clean_env, free_port, make_tree, tree_state
from tests.service.test_probes_and_tls import _certificate, _key, _pem, _write_key

pytestmark = [pytest.mark.postgres, pytest.mark.s3, pytest.mark.slow, pytest.mark.timeout(600)]

SIDECARS = int(os.environ.get("CHECKPOINTD_TEST_SIDECARS", "20"))
START_TIMEOUT_S = 120.0


@dataclass
class Gateway:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    metrics_port: int

    def metric(self, name: str) -> float:
        """One sample of the gateway's Prometheus metrics (0 when absent)."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as reply:
            for line in reply.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[-1])
        return 0.0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


@dataclass
class Fleet:
    base: Path
    keys_private: Path
    ca: Path
    gateways: list[Gateway]
    sidecars: list[Daemon]
    secrets: list[str]  # what must never reach a sidecar
    s3_prefix: str

    def thread(self, index: int) -> str:
        return f"sb-{index}/main"

    def mint(self, index: int, **kwargs: object) -> str:
        key = tokens.load_signing_key(self.keys_private)
        options: dict[str, object] = {
            "thread_prefixes": [f"sb-{index}/"],
            "ops": ["capture", "restore", "list", "fork", "prune"],
            "ttl_s": 3600,
        }
        options.update(kwargs)
        return tokens.mint(key, tokens.TokenGrant(**options))  # type: ignore[arg-type]

    def gateway_url(self, first: int = 0) -> str:
        order = self.gateways[first:] + self.gateways[:first]
        return "grpcs://" + ",".join(g.address for g in order)

    def start_sidecar(self, name: str, token: str, *, first: int = 0, wait: bool = True) -> Daemon:
        workspace = self.base / f"{name}-ws"
        workspace.mkdir(exist_ok=True)
        data_dir = self.base / f"{name}-data"
        token_file = self.base / f"{name}.token"
        token_file.write_text(token)
        address = f"unix://{data_dir / 'checkpointd.sock'}"
        args = [
            sys.executable,
            "-m",
            "checkpointd",
            "serve",
            "--workspace",
            str(workspace),
            "--data-dir",
            str(data_dir),
            "--listen",
            address,
            "--gateway",
            self.gateway_url(first),
            "--gateway-token-file",
            str(token_file),
            "--gateway-ca",
            str(self.ca),
            "--grace-period",
            "5s",
        ]
        log = self.base / f"{name}.log"
        # The sandbox's environment: nothing of the store's or the bucket's.
        env = {k: v for k, v in clean_env().items() if not k.startswith(("AWS_", "PG", "DATABASE"))}
        with log.open("wb") as handle:
            proc = subprocess.Popen(args, stdout=handle, stderr=subprocess.STDOUT, env=env)
        daemon = Daemon(proc, address, workspace, data_dir, "", "", log)
        self.sidecars.append(daemon)
        if wait:
            daemon.wait_serving(START_TIMEOUT_S)
        return daemon


def _start_gateway(
    base: Path, name: str, store: str, blobs: str, s3_env: dict[str, str], public: Path, pki: dict
) -> Gateway:
    port, metrics_port = free_port(), free_port()
    log = base / f"{name}.log"
    args = [
        sys.executable,
        "-m",
        "checkpointd",
        "gateway",
        "--listen",
        f"127.0.0.1:{port}",
        "--store",
        store,
        "--blobs",
        blobs,
        "--token-key-file",
        str(public),
        "--tls-cert",
        str(pki["cert"]),
        "--tls-key",
        str(pki["key"]),
        "--pool-max-size",
        "4",
        "--grace-period",
        "5s",
        "--metrics-listen",
        f"127.0.0.1:{metrics_port}",
    ]
    with log.open("wb") as handle:
        proc = subprocess.Popen(
            args, stdout=handle, stderr=subprocess.STDOUT, env=clean_env(**s3_env)
        )
    return Gateway(proc, port, log, metrics_port)


def _wait_gateway(gateway: Gateway, ca: Path) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    credentials = grpc.ssl_channel_credentials(ca.read_bytes())
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if gateway.proc.poll() is not None:
            raise RuntimeError(f"gateway exited:\n{gateway.log.read_text(errors='replace')}")
        with grpc.secure_channel(gateway.address, credentials) as channel:
            try:
                reply = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(), timeout=1.0
                )
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
        time.sleep(0.2)
    raise TimeoutError(gateway.log.read_text(errors="replace"))


@pytest.fixture(scope="module")
def fleet(postgres_server: PostgresServer, s3_server: S3Server) -> Iterator[Fleet]:
    base = Path(tempfile.mkdtemp(prefix="cpd-gw-", dir="/tmp"))
    ca_key, server_key = _key(), _key()
    ca = _certificate("gateway test CA", ca_key, None, ca_key, ca=True)
    pki = {
        "ca": _pem(base / "ca.pem", ca),
        "cert": _pem(
            base / "gw.pem", _certificate("localhost", server_key, ca, ca_key, server=True)
        ),
        "key": _write_key(base / "gw.key", server_key),
    }
    public = tokens.generate_key(base / "orchestrator.pem")
    store = postgres_server.create_database()
    prefix = f"gateway-fleet-{os.getpid()}-{time.time_ns()}"
    fleet = Fleet(
        base=base,
        keys_private=base / "orchestrator.pem",
        ca=pki["ca"],
        gateways=[],
        sidecars=[],
        secrets=[
            ROLE_PASSWORD,
            SUPERUSER_PASSWORD,
            s3_server.secret_access_key,
            s3_server.access_key_id,
        ],
        s3_prefix=prefix,
    )
    try:
        for name in ("gw-a", "gw-b"):
            fleet.gateways.append(
                _start_gateway(
                    base, name, store, s3_server.url(prefix), s3_server.env(), public, pki
                )
            )
        for gateway in fleet.gateways:
            _wait_gateway(gateway, fleet.ca)
        for index in range(SIDECARS):
            fleet.start_sidecar(f"sc{index}", fleet.mint(index), first=index % 2, wait=False)
        for sidecar in fleet.sidecars:
            sidecar.wait_serving(START_TIMEOUT_S)
        yield fleet
    finally:
        for sidecar in fleet.sidecars:
            sidecar.stop(timeout=10)
        for gateway in fleet.gateways:
            gateway.stop()
        if not os.environ.get("CHECKPOINTD_KEEP_FLEET"):  # the logs, for a failed run
            shutil.rmtree(base, ignore_errors=True)


def _client(sidecar: Daemon) -> Client:
    return Client(sidecar.address, timeout=120)


async def _round_trip(fleet: Fleet, index: int) -> None:
    sidecar = fleet.sidecars[index]
    make_tree(sidecar.workspace, seed=index, files=12, max_size=30_000)
    before = tree_state(sidecar.workspace)
    async with _client(sidecar) as client:
        done = await client.capture(fleet.thread(index), request_id=f"first-{index}")
        shutil.rmtree(sidecar.workspace / "dir0", ignore_errors=True)
        (sidecar.workspace / "new.txt").write_text("written after the capture")
        await client.restore(fleet.thread(index), checkpoint_id=done.checkpoint.id)
        assert tree_state(sidecar.workspace) == before, index
        listed = await client.list_checkpoints(fleet.thread(index))
        assert [c.id for c in listed] == [done.checkpoint.id]


async def test_each_sidecar_captures_and_restores_its_own_thread(fleet: Fleet) -> None:
    await asyncio.gather(*(_round_trip(fleet, i) for i in range(len(fleet.sidecars))))
    # Uploads stream through the gateways (hashed, packs checked whole there).
    # Restores read single objects through presigned URLs, and packed blobs
    # frame by frame through the gateways (a presigned URL would open the whole
    # pack): what comes out is the frames restored, no more than went in.
    uploaded = sum(
        g.metric('checkpointd_gateway_blob_bytes{direction="in"}') for g in fleet.gateways
    )
    read = sum(g.metric('checkpointd_gateway_blob_bytes{direction="out"}') for g in fleet.gateways)
    print(f"blob bytes through the gateways: {uploaded:.0f} in (uploads), {read:.0f} out (reads)")
    assert uploaded > 0
    assert 0 < read <= uploaded


def test_no_sidecar_holds_a_database_or_bucket_secret(fleet: Fleet) -> None:
    for sidecar in fleet.sidecars:
        for name in ("environ", "cmdline"):
            data = Path(f"/proc/{sidecar.proc.pid}/{name}").read_bytes()
            for secret in fleet.secrets:
                assert secret.encode() not in data, (sidecar.address, name)
        assert b"postgresql://" not in Path(f"/proc/{sidecar.proc.pid}/cmdline").read_bytes()


async def _forbidden(call: object) -> None:
    with pytest.raises(RpcError) as caught:
        await call  # type: ignore[misc]
    assert caught.value.code == grpc.StatusCode.PERMISSION_DENIED, caught.value
    assert caught.value.reason == FORBIDDEN, caught.value


async def test_a_sidecar_cannot_touch_another_thread(fleet: Fleet) -> None:
    mine, theirs = 0, 1
    other = fleet.thread(theirs)
    async with _client(fleet.sidecars[theirs]) as client:
        their_head = await client.get_head(other)
        assert their_head is not None
        their_file = next(e.path for e in await client.list_entries(their_head) if e.blob_key)
    async with _client(fleet.sidecars[mine]) as client:
        await _forbidden(client.capture(other))
        await _forbidden(client.restore(other))
        await _forbidden(client.list_checkpoints(other))
        await _forbidden(client.get_head(other))
        await _forbidden(client.get_checkpoint(their_head))
        await _forbidden(client.list_entries(their_head))
        await _forbidden(client.read_file(their_head, their_file))
        await _forbidden(client.fork(other, their_head, f"sb-{mine}/stolen"))
        mine_head = await client.get_head(fleet.thread(mine))
        assert mine_head is not None
        await _forbidden(client.fork(fleet.thread(mine), mine_head, f"sb-{theirs}/planted"))
        await _forbidden(client.delete_head(other, their_head))
        await _forbidden(client.prune(other, 1))
        await _forbidden(client.sweep(older_than_ms=0))  # sweeping is the gateway's job
        # Its own thread it may prune: a request_id checkpoint deleted stays spent
        # (the daemon's marker goes through the gateway too).
        extra = await client.capture(fleet.thread(mine), request_id="to-delete", label="x")
        assert await client.delete_head(fleet.thread(mine), extra.checkpoint.id) == mine_head
        with pytest.raises(RpcError) as caught:
            await client.capture(fleet.thread(mine), request_id="to-delete", label="x")
        assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT, caught.value
        assert await client.prune(fleet.thread(mine), 1) == []
        threads = [t.thread_id async for t in client.list_threads()]
        assert threads and all(t.startswith(f"sb-{mine}/") for t in threads), threads
    async with _client(fleet.sidecars[theirs]) as client:
        assert await client.get_head(other) == their_head
        assert [c.id for c in await client.list_checkpoints(other)] == [their_head]


async def test_expired_or_tampered_tokens_are_unauthenticated(fleet: Fleet) -> None:
    expired = fleet.mint(0, ttl_s=5, now=time.time() - 3600)
    good = fleet.mint(0)
    tampered = good[:-4] + ("AAAA" if not good.endswith("AAAA") else "BBBB")
    for name, token in (("expired", expired), ("tampered", tampered)):
        sidecar = fleet.start_sidecar(f"bad-{name}", token, wait=False)
        assert sidecar.proc.wait(START_TIMEOUT_S) != 0
        assert "UNAUTHENTICATED" in sidecar.log_text() or "token refused" in sidecar.log_text()
    # A running sidecar whose token file is replaced by a tampered token.
    sidecar = fleet.sidecars[2]
    (fleet.base / "sc2.token").write_text(tampered)
    try:
        async with _client(sidecar) as client:
            with pytest.raises(RpcError) as caught:
                await client.capture(fleet.thread(2))
            assert caught.value.code == grpc.StatusCode.UNAUTHENTICATED, caught.value
            assert caught.value.reason == UNAUTHENTICATED
    finally:
        (fleet.base / "sc2.token").write_text(fleet.mint(2))


async def test_killing_a_gateway_mid_capture_loses_and_duplicates_nothing(fleet: Fleet) -> None:
    index = 0  # gateway A first
    sidecar = fleet.sidecars[index]
    thread = fleet.thread(index)
    big = sidecar.workspace / "big"
    big.mkdir(exist_ok=True)
    for n in range(60):
        (big / f"blob{n}.bin").write_bytes(os.urandom(256 * 1024))
    before = tree_state(sidecar.workspace)
    request_id = "capture-across-a-gateway-crash"
    attempts = 0
    progressed = asyncio.Event()
    async with _client(sidecar) as client:
        prior = [c.id for c in await client.list_checkpoints(thread)]

        def seen(event: object) -> None:
            if getattr(event, "HasField", None) and event.HasField("progress"):  # type: ignore[attr-defined]
                progressed.set()

        async def kill_when_uploading() -> None:
            await progressed.wait()
            fleet.gateways[0].kill()

        killer = asyncio.ensure_future(kill_when_uploading())
        done = None
        while done is None and attempts < 5:
            attempts += 1
            try:
                done = await client.capture(thread, request_id=request_id, on_event=seen)
            except RpcError as error:
                assert error.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED), error
                await asyncio.sleep(0.5)
        killer.cancel()
        assert fleet.gateways[0].proc.poll() is not None, "gateway A was not killed mid-capture"
        assert done is not None
        assert done.checkpoint.id == derive_checkpoint_id(thread, request_id)
        after = [c.id for c in await client.list_checkpoints(thread)]
        assert after == [*prior, done.checkpoint.id]  # exactly one new checkpoint
        shutil.rmtree(big)
        await client.restore(thread, checkpoint_id=done.checkpoint.id)
        assert tree_state(sidecar.workspace) == before
    print(f"capture finished after {attempts} attempt(s) across the gateway crash")


async def test_a_gateway_drains_on_sigterm_and_sidecars_report_unavailable(fleet: Fleet) -> None:
    survivor = fleet.gateways[1]  # gateway A was killed by the test before
    survivor.proc.send_signal(signal.SIGTERM)
    assert survivor.proc.wait(30) == 0
    assert "stopped" in survivor.log.read_text(errors="replace")
    async with _client(fleet.sidecars[3]) as client:
        with pytest.raises(RpcError) as caught:
            await client.get_head(fleet.thread(3))
        assert caught.value.code == grpc.StatusCode.UNAVAILABLE, caught.value
        assert caught.value.reason == "SANDBOX_SNAPSHOT_STORE_UNAVAILABLE"
