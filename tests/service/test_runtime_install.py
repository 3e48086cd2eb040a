"""`make run` installs checkpointd with its runtime dependencies alone (no extra):
everything a user runs, `checkpointd mcp` included, must work with exactly those.

The check builds a fresh virtual environment holding only the dependencies
pyproject.toml declares for the package itself (what `maturin develop` without
--extras installs), runs this checkout's package in it, and talks MCP to it."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from .conftest import Daemon, clean_env
from .test_mcp import TOOLS, raw_stdio

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_make_run_installs_no_extra() -> None:
    dry = subprocess.run(
        ["make", "-n", "-C", str(REPO), "run"],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    installs = [line for line in dry.stdout.splitlines() if "maturin develop" in line]
    assert len(installs) == 1, dry.stdout
    assert "--extras" not in installs[0], installs[0]


def test_mcp_runs_with_the_runtime_dependencies_alone(daemon: Daemon, short_tmp: Path) -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    venv = short_tmp / "runtime-venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    installed = subprocess.run(
        [str(venv / "bin/pip"), "install", "-q", *project["dependencies"]],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert installed.returncode == 0, installed.stderr
    python = str(venv / "bin/python")
    env = {"PYTHONPATH": str(REPO / "python")}
    helped = subprocess.run(
        [python, "-m", "checkpointd", "mcp", "--help"],
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert helped.returncode == 0 and "--thread" in helped.stdout, helped.stderr
    (daemon.workspace / "a.txt").write_text("a")
    with raw_stdio(daemon, "t-runtime", python, **env) as session:
        session.send('{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}')
        assert {t["name"] for t in session.reply()["result"]["tools"]} == TOOLS
        save = {"name": "save_checkpoint", "arguments": {"label": "from the runtime venv"}}
        session.send(
            json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": save})
        )
        result = session.reply()["result"]
        assert result["isError"] is False, result
        assert result["structuredContent"]["threadId"] == "t-runtime"
