"""How a checkpoint was taken travels with it (docs/design.md), and serve never creates
the workspace root."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .conftest import Daemon, clean_env
from .test_cli import cli, ok_json


def test_plain_restore_keeps_what_the_capture_excluded(daemon: Daemon) -> None:
    ws = daemon.workspace
    (ws / "src").mkdir()
    (ws / "src" / "app.py").write_text("v1\n")
    (ws / "build").mkdir()
    (ws / "build" / "out.bin").write_bytes(b"\x00\x01")
    (ws / "debug.log").write_text("trace\n")
    captured = ok_json(daemon, "capture", "t-pol", "--exclude", "build/", "--exclude", "*.log")
    checkpoint_id = captured["checkpoint"]["id"]
    assert captured["checkpoint"]["policy"]["exclude"] == ["build/", "*.log"]

    (ws / "src" / "app.py").write_text("v2\n")
    restored = cli(daemon, "restore", "t-pol")
    assert restored.returncode == 0, restored.stderr
    assert (ws / "src" / "app.py").read_text() == "v1\n"
    assert (ws / "build" / "out.bin").read_bytes() == b"\x00\x01"
    assert (ws / "debug.log").read_text() == "trace\n"

    # diff uses the recorded policy too: nothing changed.
    assert ok_json(daemon, "diff", checkpoint_id)["changes"] == []

    shown = cli(daemon, "show", checkpoint_id)
    assert shown.returncode == 0, shown.stderr
    assert "policy: exclude=['build/', '*.log'] include=[] default_excludes=true" in shown.stdout
    assert "workspace_subdir: (whole workspace)" in shown.stdout
    listed = ok_json(daemon, "list", "t-pol")
    assert listed["checkpoints"][0]["policy"]["exclude"] == ["build/", "*.log"]


async def test_restore_without_subdir_uses_the_recorded_sub_root(daemon: Daemon) -> None:
    ws = daemon.workspace
    for index in range(20):
        (ws / f"top-{index}.txt").write_text(str(index))
    (ws / "app" / "pkg").mkdir(parents=True)
    (ws / "app" / "pkg" / "m.py").write_text("m = 1\n")
    async with daemon.client() as client:
        done = await client.capture("t-subroot", workspace_subdir="app/")
        assert done.checkpoint.workspace_subdir == "app"
        got = await client.get_checkpoint(done.checkpoint.id)
        assert got.checkpoint.workspace_subdir == "app"
        (ws / "app" / "pkg" / "m.py").write_text("m = 2\n")
        restored = await client.restore("t-subroot")
        assert restored.restored
        # Restored into app/, not over the whole workspace.
        assert (ws / "app" / "pkg" / "m.py").read_text() == "m = 1\n"
        assert sorted(p.name for p in ws.glob("top-*.txt")) == sorted(
            f"top-{index}.txt" for index in range(20)
        )
        assert not (ws / "pkg").exists()
        # Diff against the live workspace also looks at app/.
        assert await client.diff(done.checkpoint.id) == []
        # "." names the whole workspace explicitly.
        (ws / "elsewhere").mkdir()
        await client.restore("t-subroot", workspace_subdir="elsewhere")
        assert (ws / "elsewhere" / "pkg" / "m.py").read_text() == "m = 1\n"


def test_serve_refuses_a_missing_workspace(short_tmp: Path) -> None:
    missing = short_tmp / "typo-workspace"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "checkpointd",
            "serve",
            "--workspace",
            str(missing),
            "--data-dir",
            str(short_tmp / "data"),
            "--thread",
            "t",
            "--capture-every",
            "1s",
        ],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert str(missing) in result.stderr
    assert not missing.exists()


def test_serve_refuses_a_file_as_workspace(short_tmp: Path) -> None:
    not_a_dir = short_tmp / "file"
    not_a_dir.write_text("x")
    result = subprocess.run(
        [sys.executable, "-m", "checkpointd", "serve", "--workspace", str(not_a_dir)]
        + ["--data-dir", str(short_tmp / "data")],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and str(not_a_dir) in result.stderr
