"""Restore history on the command line (docs/restore-history.md): ``restore
--dry-run`` names what it would stash, ``restore`` says what it stashed,
``list --stash`` shows the stash, ``undo`` brings the live tree back,
``--record`` moves the head and ``--discard`` loses the live changes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .conftest import Daemon, clean_env
from .test_cli import cli, ok_json


def _two_checkpoints(daemon: Daemon) -> str:
    root = daemon.workspace
    (root / "notes.txt").write_text("first\n")
    first = ok_json(daemon, "capture", "t-cli")["checkpoint"]["id"]
    (root / "notes.txt").write_text("second\n")
    ok_json(daemon, "capture", "t-cli")
    return str(first)


def test_restore_stashes_and_undo_brings_the_edit_back(daemon: Daemon) -> None:
    root = daemon.workspace
    first = _two_checkpoints(daemon)
    (root / "notes.txt").write_text("the agent's edit\n")
    (root / "scratch.txt").write_text("new\n")

    plan = cli(daemon, "restore", "t-cli", "--checkpoint", first, "--dry-run")
    assert plan.returncode == 0, plan.stderr
    assert "first save the live changes of 2 paths" in plan.stdout
    assert "  stash  notes.txt" in plan.stdout and "  stash  scratch.txt" in plan.stdout
    planned = ok_json(daemon, "restore", "t-cli", "--checkpoint", first, "--dry-run")
    assert planned["stashed"] == ["notes.txt", "scratch.txt"]
    assert (root / "notes.txt").read_text() == "the agent's edit\n"

    restored = cli(daemon, "restore", "t-cli", "--checkpoint", first)
    assert restored.returncode == 0, restored.stderr
    assert "saved the live changes first" in restored.stdout
    assert "checkpointd undo brings them back" in restored.stdout
    assert (root / "notes.txt").read_text() == "first\n" and not (root / "scratch.txt").exists()
    stash = ok_json(daemon, "list", "t-cli", "--stash")["checkpoints"]
    assert [entry["reason"] for entry in stash] == ["stash"]
    assert stash[0]["stash_of_thread_id"] == "t-cli"

    undone = cli(daemon, "undo", "t-cli")
    assert undone.returncode == 0, undone.stderr
    assert f"restored {stash[0]['id']}" in undone.stdout
    assert (root / "notes.txt").read_text() == "the agent's edit\n"
    assert (root / "scratch.txt").read_text() == "new\n"


def test_record_moves_the_head_and_discard_stashes_nothing(daemon: Daemon) -> None:
    root = daemon.workspace
    first = _two_checkpoints(daemon)
    (root / "notes.txt").write_text("thrown away\n")
    discarded = ok_json(daemon, "restore", "t-cli", "--checkpoint", first, "--discard")
    assert "saved_before_restore" not in discarded
    assert ok_json(daemon, "list", "t-cli", "--stash")["checkpoints"] == []

    (root / "notes.txt").write_text("second\n")
    recorded = cli(daemon, "restore", "t-cli", "--checkpoint", first, "--record")
    assert recorded.returncode == 0, recorded.stderr
    assert "the thread's new head" in recorded.stdout
    listing = ok_json(daemon, "list", "t-cli")
    newest = listing["checkpoints"][-1]
    assert listing["head"] == newest["id"]
    assert newest["reason"] == "restore" and newest["restored_from_checkpoint_id"] == first


def test_undo_with_an_empty_stash_and_a_bad_stash_keep(daemon: Daemon, tmp_path: Path) -> None:
    nothing = cli(daemon, "undo", "t-none")
    assert nothing.returncode != 0 and "nothing to undo" in nothing.stderr
    refused = subprocess.run(
        [sys.executable, "-m", "checkpointd", "serve", "--workspace", str(tmp_path / "ws")]
        + ["--data-dir", str(tmp_path / "data"), "--stash-keep", "0"],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2, refused.stderr
    assert "--stash-keep must be a whole number of at least 1" in refused.stderr
