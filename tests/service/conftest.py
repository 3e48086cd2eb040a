"""Real daemons for the service tests: ``python -m checkpointd serve`` subprocesses.

Each daemon gets a short directory under /tmp (Unix socket paths are limited to
107 bytes, longer than pytest's tmp_path allows), is waited on until its health
check says SERVING, and is stopped (SIGTERM, then SIGKILL) at teardown.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from checkpointd.service.client import Client

START_TIMEOUT_S = 30.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# Settings every test daemon keeps from the test process (tests/conftest.py
# stores files whole unless a test asks for chunks).
_KEPT_SETTINGS = ("CHECKPOINTD_CHUNK_THRESHOLD",)


def clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("CHECKPOINTD_") or k in _KEPT_SETTINGS
    }
    env.update(extra)
    return env


@dataclass
class Daemon:
    proc: subprocess.Popen[bytes]
    address: str
    workspace: Path
    data_dir: Path
    store: str
    blobs: str
    log: Path
    token: str | None = None
    args: list[str] = field(default_factory=list)

    def client(self, *, token: str | None = None, timeout: float | None = 30.0) -> Client:
        return Client(
            self.address, token=token if token is not None else self.token, timeout=timeout
        )

    def health(self) -> str | None:
        """SERVING / NOT_SERVING, or None when the daemon does not answer."""
        target = self.address.removeprefix("tcp://").replace("unix://", "unix:")
        metadata = (("authorization", f"Bearer {self.token}"),) if self.token else ()
        with grpc.insecure_channel(target) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0, metadata=metadata)
            except grpc.RpcError:
                return None
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)

    def wait_serving(self, timeout: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {self.proc.returncode}:\n{self.log_text()}")
            if self.health() == "SERVING":
                return
            time.sleep(0.05)
        raise TimeoutError(f"daemon not SERVING after {timeout}s:\n{self.log_text()}")

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM and wait; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL: the crash of the reference API's story."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class DaemonFactory:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.daemons: list[Daemon] = []
        self._count = 0

    def start(
        self,
        *,
        workspace: Path | None = None,
        data_dir: Path | None = None,
        store: str | None = None,
        blobs: str | None = None,
        tcp: bool = False,
        token: str | None = None,
        extra: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        wait: bool = True,
    ) -> Daemon:
        self._count += 1
        name = f"d{self._count}"
        workspace = workspace or self.base / f"{name}-ws"
        workspace.mkdir(parents=True, exist_ok=True)
        data_dir = data_dir or self.base / f"{name}-data"
        store = store or f"sqlite://{self.base / 'shared' / 'checkpoints.db'}"
        blobs = blobs or f"file://{self.base / 'shared' / 'blobs'}"
        (self.base / "shared" / "blobs").mkdir(parents=True, exist_ok=True)
        if tcp:
            address = f"tcp://127.0.0.1:{free_port()}"
        else:
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
            "--store",
            store,
            "--blobs",
            blobs,
            "--listen",
            address,
            "--grace-period",
            "5s",
            *extra,
        ]
        log = self.base / f"{name}.log"
        environment = clean_env(**(env or {}))
        if token:
            environment["CHECKPOINTD_TOKEN"] = token
        with log.open("wb") as handle:
            proc = subprocess.Popen(args, stdout=handle, stderr=subprocess.STDOUT, env=environment)
        daemon = Daemon(proc, address, workspace, data_dir, store, blobs, log, token, args)
        self.daemons.append(daemon)
        if wait:
            daemon.wait_serving()
        return daemon

    def close(self) -> None:
        for daemon in self.daemons:
            daemon.stop(timeout=10)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="cpd-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def daemons(short_tmp: Path) -> Iterator[DaemonFactory]:
    factory = DaemonFactory(short_tmp)
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture
def daemon(daemons: DaemonFactory) -> Daemon:
    """One daemon on the embedded default (SQLite + local blobs) over a Unix socket."""
    return daemons.start()


# ---------------------------------------------------------------- workspaces


def make_tree(root: Path, *, seed: int = 7, files: int = 40, max_size: int = 20_000) -> None:
    """A deterministic tree: nested dirs, an empty dir, odd modes, a symlink."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    dirs = [root]
    for index in range(6):
        d = rng.choice(dirs) / f"dir{index}"
        d.mkdir(exist_ok=True)
        dirs.append(d)
    (root / "empty").mkdir(exist_ok=True)
    for index in range(files):
        path = rng.choice(dirs) / f"file{index}.txt"
        path.write_bytes(rng.randbytes(rng.randint(0, max_size)))
        path.chmod(rng.choice([0o644, 0o600, 0o755]))
    (root / "dir0").chmod(0o750)
    (root / "link").symlink_to("dir0")
    (root / "ünïcode name.md").write_text("héllo\n")


def tree_state(root: Path) -> dict[str, tuple[str, int, str]]:
    """path → (kind, mode, sha256 of content or link target), reserved names left out."""
    out: dict[str, tuple[str, int, str]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath)
        if base == root:
            dirnames[:] = [d for d in dirnames if not d.startswith(".checkpointd")]
            filenames = [f for f in filenames if not f.startswith(".checkpointd")]
        for name in dirnames + filenames:
            path = base / name
            rel = path.relative_to(root).as_posix()
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("symlink", 0, os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode), "")
            else:
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
                out[rel] = ("file", stat.S_IMODE(st.st_mode), digest)
    return out
