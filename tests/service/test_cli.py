"""The ``checkpointd`` command line: client commands, exit codes, the serve loop."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

from checkpointd.cli import EPILOG, build_parser
from checkpointd.store import open_store

from .conftest import Daemon, DaemonFactory, clean_env, make_tree, tree_state


def cli(
    daemon: Daemon | None, *args: str, address: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    env = clean_env(CHECKPOINTD_ADDRESS=address or (daemon.address if daemon else ""))
    return subprocess.run(
        [sys.executable, "-m", "checkpointd", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def ok_json(daemon: Daemon, *args: str) -> dict:
    result = cli(daemon, *args, "--json")
    assert result.returncode == 0, result.stderr + result.stdout
    return json.loads(result.stdout)


def test_building_the_parser_leaves_the_heavy_modules_unimported() -> None:
    """Every command, a one-shot ``checkpointd capture`` client too, builds the
    whole parser first: it must not pay for the token crypto, the store or the
    pack writer, which only ``gateway``, ``token``, ``migrate`` and ``serve`` use."""
    probe = (
        "import sys\n"
        "from checkpointd.cli import build_parser\n"
        "build_parser().parse_args(['capture', 't'])\n"
        "heavy = ('jwt', 'cryptography', 'checkpointd.store', 'checkpointd.blobs.packs',"
        " 'checkpointd.migrate', 'checkpointd.gateway.tokens')\n"
        "print(sorted(m for m in sys.modules if m.startswith(heavy)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "[]", result.stdout


def test_help_documents_exit_codes() -> None:
    text = build_parser().format_help()
    for line in ("2  bad input", "3  not found", "4  conflict", "7  unavailable"):
        assert line in text and line in EPILOG
    result = subprocess.run(
        [sys.executable, "-m", "checkpointd", "--help"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and "4  conflict" in result.stdout


async def test_client_commands(daemon: Daemon, short_tmp: Path) -> None:
    make_tree(daemon.workspace, files=8)
    conversation = short_tmp / "conversation.json"
    conversation.write_text(json.dumps([{"role": "user", "content": "hello"}]))
    report = short_tmp / "report.txt"
    report.write_text("report")
    first = ok_json(
        daemon,
        "capture",
        "t-cli",
        "--label",
        "one",
        "--conversation",
        str(conversation),
        "--artifact",
        f"{report}:text/plain",
    )
    first_id = first["checkpoint"]["id"]
    assert first["checkpoint"]["label"] == "one" and first["checkpoint"]["artifact_count"] == 1
    (daemon.workspace / "new.txt").write_text("new")
    diff = ok_json(daemon, "diff", first_id)
    assert [(c["path"], c["kind"]) for c in diff["changes"]] == [("new.txt", "added")]
    assert ok_json(daemon, "diff", "--thread", "t-cli") == diff
    human = cli(daemon, "diff", "--thread", "t-cli")
    assert human.returncode == 0 and human.stdout.strip() == "A new.txt"
    assert cli(daemon, "diff").returncode == 2
    second_id = ok_json(daemon, "capture", "t-cli")["checkpoint"]["id"]
    listing = ok_json(daemon, "list", "t-cli")
    assert listing["head"] == second_id
    assert [c["id"] for c in listing["checkpoints"]] == [first_id, second_id]
    shown = ok_json(daemon, "show", first_id, "--entries", "--conversation")
    assert json.loads(shown["conversation"][0]) == {"role": "user", "content": "hello"}
    assert len(shown["entries"]) == int(shown["checkpoint"]["entry_count"])
    (daemon.workspace / "new.txt").unlink()
    restored = ok_json(daemon, "restore", "t-cli")
    assert restored["restored"] and (daemon.workspace / "new.txt").read_text() == "new"
    fork = ok_json(daemon, "fork", "t-cli", first_id, "t-cli-fork")
    assert fork["reason"] == "fork-root"
    assert ok_json(daemon, "prune", "t-cli", "--keep", "1", "--dry-run")["deleted"] == [first_id]
    assert ok_json(daemon, "prune", "t-cli", "--keep", "1")["deleted"] == [first_id]
    sweep = ok_json(daemon, "sweep", "--older-than", "0s", "--dry-run")
    assert sweep["summary"]["dry_run"] is True
    assert ok_json(daemon, "health")["status"] == "SERVING"
    human = cli(daemon, "list", "t-cli")
    assert human.returncode == 0 and second_id in human.stdout


async def test_exit_codes_tell_errors_apart(daemon: Daemon, short_tmp: Path) -> None:
    assert cli(daemon, "show", "no-such-checkpoint").returncode == 3
    assert cli(daemon, "prune", "t", "--keep", "0").returncode == 2
    bad = cli(daemon, "show", "no-such-checkpoint", "--json")
    assert json.loads(bad.stdout)["error"]["reason"] == "SANDBOX_SNAPSHOT_MISSING_CHECKPOINT"
    store = await open_store(daemon.store)
    try:
        async with await store.acquire_writer("t-held"):
            conflict = cli(daemon, "capture", "t-held")
        assert conflict.returncode == 4, conflict.stderr
        assert "SANDBOX_SNAPSHOT_WRITER_CONFLICT" in conflict.stderr
    finally:
        await store.aclose()
    (daemon.workspace / "a").write_text("a")
    first = json.loads(cli(daemon, "capture", "t-nh", "--json").stdout)["checkpoint"]["id"]
    cli(daemon, "capture", "t-nh")
    # Not the head → failed precondition is told apart from conflict.
    assert cli(daemon, "fork", "t-nh", first, "t-nh").returncode == 5
    assert cli(None, "health", address=f"unix://{short_tmp}/none.sock").returncode == 7


def test_serve_loop_restores_captures_on_change_and_on_sigterm(daemons: DaemonFactory) -> None:
    seed = daemons.start()
    make_tree(seed.workspace, files=12)
    expected = tree_state(seed.workspace)
    assert ok_json(seed, "capture", "t-loop")["checkpoint"]["id"]
    seed.stop()

    looped = daemons.start(
        extra=("--thread", "t-loop", "--restore-on-start", "--capture-every", "0.5s")
    )
    # Restored before serving: SERVING implies the tree is back.
    assert tree_state(looped.workspace) == expected
    time.sleep(1.6)  # ticks with nothing changed make no checkpoint
    assert len(ok_json(looped, "list", "t-loop")["checkpoints"]) == 1
    (looped.workspace / "edited.txt").write_text("edited")
    deadline = time.monotonic() + 15
    while len(ok_json(looped, "list", "t-loop")["checkpoints"]) < 2:
        assert time.monotonic() < deadline, looped.log_text()
        time.sleep(0.2)
    (looped.workspace / "final.txt").write_text("final")
    count_before = len(ok_json(looped, "list", "t-loop")["checkpoints"])
    assert looped.stop() == 0, looped.log_text()

    reader = daemons.start()
    listing = ok_json(reader, "list", "t-loop")
    assert len(listing["checkpoints"]) >= count_before
    head_entries = ok_json(reader, "show", listing["head"], "--entries")["entries"]
    assert "final.txt" in {e["path"] for e in head_entries}, looped.log_text()


async def test_serve_loop_skips_a_tick_while_another_writer_holds_the_thread(
    daemons: DaemonFactory,
) -> None:
    looped = daemons.start(
        extra=("--thread", "t-held-loop", "--capture-every", "0.3s", "--log-level", "DEBUG")
    )
    store = await open_store(looped.store)
    try:
        async with await store.acquire_writer("t-held-loop"):
            (looped.workspace / "a.txt").write_text("a")
            deadline = time.monotonic() + 15
            while "another writer holds thread t-held-loop" not in looped.log_text():
                assert time.monotonic() < deadline, looped.log_text()
                await asyncio.sleep(0.1)
            assert await store.list("t-held-loop") == []
        deadline = time.monotonic() + 15
        while not await store.list("t-held-loop"):
            assert time.monotonic() < deadline, looped.log_text()
            await asyncio.sleep(0.1)
    finally:
        await store.aclose()


def test_a_failed_restore_on_start_stops_the_daemon_without_capturing(
    daemons: DaemonFactory,
) -> None:
    seed = daemons.start()
    (seed.workspace / "a.txt").write_text("precious")
    ok_json(seed, "capture", "t-lost")
    seed.stop()
    blob_root = Path(seed.blobs.removeprefix("file://"))
    for folder in ("sandbox-files", "sandbox-packs"):  # single objects and packs
        for blob in (blob_root / folder).rglob("*"):
            if blob.is_file():
                blob.unlink()
    looped = daemons.start(
        extra=("--thread", "t-lost", "--restore-on-start", "--capture-every", "0.2s"), wait=False
    )
    assert looped.proc.wait(60) == 6, looped.log_text()  # DATA_LOSS
    reader = daemons.start()
    assert len(ok_json(reader, "list", "t-lost")["checkpoints"]) == 1
