"""A real `checkpointd gateway` process for tests: plaintext on loopback, a
SQLite store, the bucket given (SeaweedFS S3 in the tests that use it), and
its memory read from /proc."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.service.conftest import Daemon, clean_env, free_port

START_TIMEOUT_S = 60.0


def proc_status_kib(pid: int, field: str) -> int:
    """A ``VmRSS``/``VmHWM`` line of /proc/PID/status, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


@dataclass
class GatewayProcess:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def rss_mib(self) -> float:
        return proc_status_kib(self.proc.pid, "VmRSS") / 1024

    def peak_mib(self) -> float:
        return proc_status_kib(self.proc.pid, "VmHWM") / 1024

    def reset_peak(self) -> None:
        """Start VmHWM again from the RSS now (``clear_refs`` 5)."""
        Path(f"/proc/{self.proc.pid}/clear_refs").write_text("5")

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def start_gateway(
    base: Path,
    name: str,
    *,
    store: str,
    blobs: str,
    public_key: Path,
    env: dict[str, str] | None = None,
    extra: tuple[str, ...] = (),
    port: int | None = None,
) -> GatewayProcess:
    """Start a gateway (not waited for: ``wait_serving``)."""
    port = port or free_port()
    log = base / f"{name}.log"
    args = [
        *(sys.executable, "-m", "checkpointd", "gateway"),
        *("--listen", f"127.0.0.1:{port}", "--store", store, "--blobs", blobs),
        *("--token-key-file", str(public_key), "--grace-period", "2s"),
        *extra,
    ]
    with log.open("ab") as handle:
        proc = subprocess.Popen(
            args, stdout=handle, stderr=subprocess.STDOUT, env=clean_env(**(env or {}))
        )
    return GatewayProcess(proc, port, log)


def wait_serving(gateway: GatewayProcess, timeout: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if gateway.proc.poll() is not None:
            raise RuntimeError(f"gateway exited:\n{gateway.log_text()}")
        with grpc.insecure_channel(gateway.address) as channel:
            try:
                reply = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(), timeout=1.0
                )
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
        time.sleep(0.2)
    raise TimeoutError(gateway.log_text())


def start_sidecar(base: Path, gateway_address: str, token: str, *, name: str = "sidecar") -> Daemon:
    """``serve --gateway`` on plaintext loopback gateways (``a,b`` for several;
    not waited for). ``base`` must be short: the daemon's socket is under it."""
    workspace, data_dir = base / f"{name}-ws", base / f"{name}-data"
    workspace.mkdir()
    token_file = base / f"{name}.token"
    token_file.write_text(token)
    address = f"unix://{data_dir / 'checkpointd.sock'}"
    args = [
        *(sys.executable, "-m", "checkpointd", "serve", "--workspace", str(workspace)),
        *("--data-dir", str(data_dir), "--listen", address, "--grace-period", "5s"),
        *("--gateway", f"grpc://{gateway_address}", "--gateway-token-file", str(token_file)),
    ]
    log = base / f"{name}.log"
    with log.open("wb") as handle:
        proc = subprocess.Popen(args, stdout=handle, stderr=subprocess.STDOUT, env=clean_env())
    return Daemon(proc, address, workspace, data_dir, "", "", log)
