"""The serve loop never loses work: its own policy and secrets, health that says
when captures fail, a failed final capture exits non-zero, and --restore-on-start
that restores only into an empty workspace."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from checkpointd.errors import SandboxCheckpointInvalidArgumentError
from checkpointd.model import Policy
from checkpointd.service.config import resolve

from .conftest import Daemon, DaemonFactory, clean_env, tree_state
from .test_cli import cli, ok_json

SERVICE = "checkpointd.v1.Checkpointd"


def _venv_workspace(root: Path) -> None:
    """A project with an ordinary virtualenv: bin/python3 links outside."""
    (root / "src").mkdir(parents=True, exist_ok=True)
    (root / "src" / "app.py").write_text("print('app')\n")
    (root / ".venv" / "bin").mkdir(parents=True)
    os.symlink(sys.executable, root / ".venv" / "bin" / "python3")
    (root / ".venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")


def _service_health(daemon: Daemon) -> str | None:
    result = cli(daemon, "health", "--json")
    if result.returncode not in (0, 7):
        return None
    return json.loads(result.stdout)["status"]


def _wait(predicate, daemon: Daemon, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, daemon.log_text()
        time.sleep(0.1)


def test_failing_captures_turn_health_not_serving_and_sigterm_exits_non_zero(
    daemons: DaemonFactory, short_tmp: Path
) -> None:
    workspace = short_tmp / "venv-ws"
    _venv_workspace(workspace)
    looped = daemons.start(
        workspace=workspace, extra=("--thread", "t-venv", "--capture-every", "0.2s")
    )
    _wait(lambda: _service_health(looped) == "NOT_SERVING", looped)
    log = looped.log_text()
    assert "SANDBOX_SNAPSHOT_UNSUPPORTED_ENTRY" in log and ".venv/bin/python3" in log
    assert "health NOT_SERVING" in log
    assert looped.health() == "SERVING"  # the server as a whole still answers
    assert looped.stop() != 0, looped.log_text()
    assert "the final capture failed" in looped.log_text()


def test_the_loop_captures_with_its_policy_and_secrets(
    daemons: DaemonFactory, short_tmp: Path
) -> None:
    workspace = short_tmp / "venv-ws"
    _venv_workspace(workspace)
    (workspace / "config.ini").write_text("token=s3cr3t-value\n")
    looped = daemons.start(
        workspace=workspace,
        extra=(
            "--thread",
            "t-venv-ok",
            "--capture-every",
            "0.2s",
            "--exclude",
            ".venv/",
            "--secret-env",
            "APP_TOKEN",
        ),
        env={"APP_TOKEN": "s3cr3t-value"},
    )
    # (An unknown thread lists as exit 3 until the first capture lands.)
    _wait(lambda: cli(looped, "list", "t-venv-ok", "--json").returncode == 0, looped)
    assert _service_health(looped) == "SERVING"
    listing = ok_json(looped, "list", "t-venv-ok")
    head = listing["checkpoints"][-1]
    assert head["policy"]["exclude"] == [".venv/"]
    entries = ok_json(looped, "show", head["id"], "--entries")["entries"]
    assert {e["path"] for e in entries} == {"config.ini", "src", "src/app.py"}
    assert "s3cr3t-value" not in looped.log_text()
    assert looped.stop() == 0, looped.log_text()

    reader = daemons.start()

    async def read() -> bytes:
        async with reader.client() as client:
            return await client.read_file(head["id"], "config.ini")

    assert asyncio.run(read()) == b"token=" + b"\0" * len("s3cr3t-value") + b"\n"


def test_restore_on_start_captures_a_workspace_that_differs_and_leaves_it(
    daemons: DaemonFactory,
) -> None:
    seed = daemons.start()
    (seed.workspace / "a.txt").write_text("captured")
    first = ok_json(seed, "capture", "t-keep")["checkpoint"]["id"]
    (seed.workspace / "a.txt").write_text("uncaptured work")
    (seed.workspace / "new.txt").write_text("also new")
    before = tree_state(seed.workspace)
    seed.stop()

    looped = daemons.start(
        workspace=seed.workspace,
        extra=("--thread", "t-keep", "--restore-on-start", "--capture-every", "1h"),
    )
    assert tree_state(looped.workspace) == before
    listing = ok_json(looped, "list", "t-keep")
    assert [c["id"] for c in listing["checkpoints"]][0] == first
    assert len(listing["checkpoints"]) == 2
    newest = listing["checkpoints"][-1]
    assert newest["label"] == "before-restore" and listing["head"] == newest["id"]
    assert "capturing it as 'before-restore'" in looped.log_text()
    assert looped.stop() == 0

    # Started again on the same (now captured) workspace: nothing to do.
    again = daemons.start(
        workspace=seed.workspace,
        extra=("--thread", "t-keep", "--restore-on-start", "--capture-every", "1h"),
    )
    assert tree_state(again.workspace) == before
    assert len(ok_json(again, "list", "t-keep")["checkpoints"]) == 2
    assert "nothing to restore" in again.log_text()


def test_restore_on_start_restores_into_an_empty_workspace(daemons: DaemonFactory) -> None:
    seed = daemons.start()
    (seed.workspace / "b.txt").write_text("saved")
    (seed.workspace / "build").mkdir()
    (seed.workspace / "build" / "x.o").write_text("obj")
    ok_json(seed, "capture", "t-empty", "--exclude", "build/")
    seed.stop()
    fresh = daemons.start(extra=("--thread", "t-empty", "--restore-on-start"))
    assert (fresh.workspace / "b.txt").read_text() == "saved"
    assert not (fresh.workspace / "build").exists()


def test_serve_policy_and_secret_settings(tmp_path: Path) -> None:
    toml = tmp_path / "serve.toml"
    toml.write_text(
        '[serve]\nexclude = ["build/", "*.log"]\ndefault_excludes = false\nsecret_env = ["K"]\n'
    )
    config = resolve({"data_dir": str(tmp_path)}, environ={"K": "key-value"}, config_file=toml)
    assert config.policy == Policy(exclude=("build/", "*.log"), default_excludes=False)
    assert config.secrets == (b"key-value",)
    assert "key-value" not in repr(config)
    flags = resolve(
        {"data_dir": str(tmp_path), "include": ["src/"], "secret_env": None}, environ={}
    )
    assert flags.policy == Policy(include=("src/",)) and flags.secrets == ()
    assert resolve({"data_dir": str(tmp_path)}, environ={}).policy is None
    env = resolve({"data_dir": str(tmp_path)}, environ={"CHECKPOINTD_EXCLUDE": "a/,b/"})
    assert env.policy == Policy(exclude=("a/", "b/"))
    with pytest.raises(SandboxCheckpointInvalidArgumentError, match="MISSING"):
        resolve({"data_dir": str(tmp_path), "secret_env": ["MISSING"]}, environ={})
    with pytest.raises(SandboxCheckpointInvalidArgumentError, match="SHORT"):
        resolve({"data_dir": str(tmp_path), "secret_env": ["SHORT"]}, environ={"SHORT": "ab"})


def test_serve_refuses_an_unset_secret_variable(short_tmp: Path) -> None:
    (short_tmp / "ws").mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "checkpointd", "serve", "--workspace", str(short_tmp / "ws")]
        + ["--data-dir", str(short_tmp / "d"), "--secret-env", "NOT_SET_ANYWHERE"],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "NOT_SET_ANYWHERE" in result.stderr
