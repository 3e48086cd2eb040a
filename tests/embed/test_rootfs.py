"""The image artefacts in brand-new Debian root filesystems (root only; `-m rootfs`).

(1) The manylinux2014 wheel, pip-installed with the rootfs's own Debian python3 (its
    dependencies from PyPI), serves a capture -> restore round trip on a Unix socket.
    In the oldest suite whose python3 is >= 3.11 (bookworm): older Debian python3s
    cannot install checkpointd at all.
(2) The single binary does the same in the oldest suite the mirror serves (bullseye,
    glibc 2.31), a minbase rootfs with no Python, running as an unprivileged user.

Each rootfs is unpacked fresh from a tarball cached outside the repository
(packaging/rootfs.py); every command runs chrooted in its own mount namespace.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from .conftest import rootfs

pytestmark = [pytest.mark.rootfs, pytest.mark.slow, pytest.mark.timeout(1800)]

WORKSPACE = "/srv/workspace"
DATA_DIR = "/srv/checkpointd"
NOBODY = 65534


def _tree(root: Path) -> dict[str, tuple[str, ...]]:
    """Every entry beneath root: kind, mode bits, content or link target."""
    entries: dict[str, tuple[str, ...]] = {}
    for path in sorted(root.rglob("*")):
        name = str(path.relative_to(root))
        info = path.lstat()
        mode = oct(stat.S_IMODE(info.st_mode))
        if stat.S_ISLNK(info.st_mode):
            entries[name] = ("link", os.readlink(path))
        elif stat.S_ISDIR(info.st_mode):
            entries[name] = ("dir", mode)
        else:
            entries[name] = ("file", mode, path.read_bytes().hex())
    return entries


def _fill_workspace(workspace: Path) -> None:
    (workspace / "src" / "pkg").mkdir(parents=True)
    (workspace / "src" / "main.py").write_text("print('hi')\n")
    (workspace / "src" / "pkg" / "util.py").write_text("def f():\n    return 1\n")
    (workspace / "run.sh").write_text("#!/bin/sh\necho run\n")
    (workspace / "run.sh").chmod(0o755)
    (workspace / "data.bin").write_bytes(os.urandom(1 << 20))
    (workspace / "latest").symlink_to("src/main.py")


def _change_workspace(workspace: Path) -> None:
    (workspace / "src" / "main.py").write_text("print('bye')\n")
    (workspace / "src" / "pkg" / "util.py").unlink()
    (workspace / "notes.txt").write_text("not in the checkpoint\n")
    (workspace / "data.bin").write_bytes(b"truncated")
    (workspace / "run.sh").chmod(0o644)


class Daemon:
    """`checkpointd serve` inside a rootfs, and its CLI run as the same user."""

    def __init__(self, box: rootfs.Rootfs, executable: str, uid: int = 0) -> None:
        self.box = box
        self.uid = uid
        run_as = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"] if uid else []
        self.command = [*run_as, executable]
        self.env = {"CHECKPOINTD_DATA_DIR": DATA_DIR}
        self.process: subprocess.Popen[bytes] | None = None
        self.log = box.root.parent / "serve.log"

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = self.box.run([*self.command, *args], self.env, timeout=120)
        if check and done.returncode != 0:
            raise AssertionError(
                f"checkpointd {' '.join(args)} exited {done.returncode}:\n"
                f"{done.stdout}{done.stderr}\n--- serve log:\n{self._serve_log()}"
            )
        return done

    def _serve_log(self) -> str:
        # A CLI call made before `serving` (such as --version) has no serve log yet.
        return self.log.read_text() if self.log.exists() else "(not serving)"

    @contextlib.contextmanager
    def serving(self) -> Iterator[Daemon]:
        with self.log.open("wb") as log:
            self.process = self.box.popen(
                [*self.command, "serve", "--workspace", WORKSPACE, "--data-dir", DATA_DIR],
                self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            deadline = time.monotonic() + 60
            while self.cli("health", check=False).returncode != 0:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"the daemon never served:\n{self.log.read_text()}")
                time.sleep(0.5)
            yield self
        finally:
            # unshare, sh, chroot and env exec one another: the pid is the daemon's.
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _round_trip(daemon: Daemon) -> float:
    """Capture, change, restore, compare; returns how long one `checkpointd health` took."""
    workspace = daemon.box.host_path(WORKSPACE)
    _fill_workspace(workspace)
    _chown_tree(workspace, daemon.uid)
    captured = _tree(workspace)
    with daemon.serving():
        started = time.monotonic()
        assert daemon.cli("health").stdout.strip() == "SERVING"
        health_seconds = time.monotonic() - started
        out = json.loads(daemon.cli("capture", "image-test", "--label", "first", "--json").stdout)
        assert out, "capture printed no checkpoint"
        _change_workspace(workspace)
        assert _tree(workspace) != captured
        daemon.cli("restore", "image-test")
        assert _tree(workspace) == captured
        listed = daemon.cli("list", "image-test").stdout
        assert "first" in listed, listed
    # A start-up budget a probe can live with (a new process each time: interpreter,
    # imports, and for the binary its unpacking).
    assert health_seconds < 10, f"checkpointd health took {health_seconds:.1f}s"
    return health_seconds


def _chown_tree(root: Path, uid: int) -> None:
    os.lchown(root, uid, uid)
    for path in root.rglob("*"):
        os.lchown(path, uid, uid)


def _prepare_dirs(box: rootfs.Rootfs, owner: int = 0) -> None:
    for inside in (WORKSPACE, DATA_DIR):
        path = box.host_path(inside)
        path.mkdir(parents=True)
        os.chown(path, owner, owner)


@pytest.fixture
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("rootfs")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_wheel_with_debian_python3(rootfs_usable: None, wheel: Path, scratch: Path) -> None:
    suite = rootfs.oldest_served("bookworm")
    with rootfs.fresh(suite, ("python3", "python3-venv"), parent=scratch) as box:
        env: Mapping[str, str] = box.add_host_ca()
        shutil.copyfile(wheel, box.host_path(f"/tmp/{wheel.name}"))
        box.check(["python3", "-m", "venv", "/opt/checkpointd"])
        box.check(
            ["/opt/checkpointd/bin/pip", "install", "-q", "--disable-pip-version-check",
             "--only-binary=:all:", f"/tmp/{wheel.name}"],
            env,
        )  # fmt: skip
        _prepare_dirs(box)
        health = _round_trip(Daemon(box, "/opt/checkpointd/bin/checkpointd"))
        print(f"wheel in {suite}: checkpointd health in {health:.2f}s")


def test_binary_without_python(rootfs_usable: None, binary: Path, scratch: Path) -> None:
    suite = rootfs.oldest_served()
    with rootfs.fresh(suite, parent=scratch) as box:
        for python in ("python3", "python"):
            assert box.run(["sh", "-c", f"command -v {python}"]).returncode != 0, (
                f"the {suite} rootfs has a {python}"
            )
        shutil.copy2(binary, box.host_path("/usr/local/bin/checkpointd"))
        _prepare_dirs(box, owner=NOBODY)
        daemon = Daemon(box, "/usr/local/bin/checkpointd", uid=NOBODY)
        started = time.monotonic()
        version = daemon.cli("--version")
        cold = time.monotonic() - started
        assert version.stdout.startswith("checkpointd "), version.stdout
        health = _round_trip(daemon)
        print(f"binary in {suite}: first run (--version) {cold:.2f}s, health {health:.2f}s")
