"""Configuration: flags over CHECKPOINTD_* environment over the TOML file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from checkpointd.errors import SandboxCheckpointInvalidArgumentError
from checkpointd.service.config import grpc_address, parse_duration, resolve

from .conftest import clean_env


def test_defaults_are_the_embedded_setup(tmp_path: Path) -> None:
    config = resolve(
        {"data_dir": str(tmp_path / "d"), "workspace": str(tmp_path / "w")}, environ={}
    )
    assert config.store == f"sqlite://{tmp_path}/d/checkpoints.db"
    assert config.blobs == f"file://{tmp_path}/d/blobs"
    assert config.listen == f"unix://{tmp_path}/d/checkpointd.sock"
    assert config.socket_path == tmp_path / "d" / "checkpointd.sock"
    assert grpc_address(config.listen) == f"unix:{tmp_path}/d/checkpointd.sock"
    assert config.grace_period == 10.0 and config.capture_every is None


def test_flags_beat_environment_beat_file(tmp_path: Path) -> None:
    toml = tmp_path / "checkpointd.toml"
    toml.write_text(
        '[serve]\nstore = "memory://"\nblobs = "memory://"\ngrace_period = "3s"\nthread = "from-file"\n'
    )
    env = {
        "CHECKPOINTD_CONFIG": str(toml),
        "CHECKPOINTD_GRACE_PERIOD": "250ms",
        "CHECKPOINTD_THREAD": "from-env",
    }
    config = resolve({"thread": "from-flag", "data_dir": str(tmp_path)}, environ=env)
    assert (config.store, config.blobs) == ("memory://", "memory://")
    assert config.grace_period == 0.25
    assert config.thread == "from-flag"
    assert resolve({"data_dir": str(tmp_path)}, environ=env).thread == "from-env"


def test_bad_settings_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SandboxCheckpointInvalidArgumentError, match="bearer token"):
        resolve({"listen": "tcp://127.0.0.1:5000", "data_dir": str(tmp_path)}, environ={})
    token_file = tmp_path / "token"
    token_file.write_text("abc\n")
    config = resolve({"listen": "tcp://127.0.0.1:5000", "token_file": str(token_file)}, environ={})
    assert (
        config.token == "abc" and config.is_tcp and grpc_address(config.listen) == "127.0.0.1:5000"
    )
    with pytest.raises(SandboxCheckpointInvalidArgumentError, match="need --thread"):
        resolve({"capture_every": "60s", "data_dir": str(tmp_path)}, environ={})
    bad_toml = tmp_path / "bad.toml"
    bad_toml.write_text('stor = "typo"\n')
    with pytest.raises(SandboxCheckpointInvalidArgumentError, match="unknown keys"):
        resolve({}, environ={}, config_file=bad_toml)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("60s", 60.0), ("5m", 300.0), ("250ms", 0.25), ("1h", 3600.0), ("2", 2.0), (1.5, 1.5)],
)
def test_durations(text: str | float, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_bad_duration() -> None:
    with pytest.raises(SandboxCheckpointInvalidArgumentError):
        parse_duration("soon")


def test_serve_refuses_a_data_dir_inside_the_workspace(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "checkpointd",
            "serve",
            "--workspace",
            str(workspace),
            "--data-dir",
            str(workspace / "data"),
        ],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "lies inside the workspace" in result.stderr
