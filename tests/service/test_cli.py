"""The ``checkpointd`` command line: client commands, exit codes, the serve loop."""

from __future__ import annotations

import asyncio
import json
import os
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


# ---------------------------------------------------------------- references


def _three_checkpoints(daemon: Daemon, thread: str) -> list[str]:
    """Three checkpoints of ``thread`` (labels one, two and none), oldest first."""
    ids = []
    for step, label in enumerate(("one", "two", None)):
        (daemon.workspace / "a.txt").write_text(f"version {step}\n")
        ids.append(
            ok_json(daemon, "capture", thread, *(("--label", label) if label else ()))[
                "checkpoint"
            ]["id"]
        )
    return ids


def test_a_checkpoint_is_named_by_part_label_or_head_offset(daemon: Daemon) -> None:
    first, second, third = _three_checkpoints(daemon, "t-ref")

    def shown(reference: str) -> str:
        return str(ok_json(daemon, "show", reference)["checkpoint"]["id"])

    last_group = first.rsplit("-", 1)[1]
    assert shown(last_group[:6]) == first, "the start of the last group"
    assert shown(first[-5:]) == first, "the end of the id"
    assert shown(first) == first
    assert shown("t-ref:one") == first and shown("t-ref:two") == second
    assert shown("t-ref:head") == third and shown("t-ref:head~2") == first
    assert shown(f"t-ref:{second.rsplit('-', 1)[1][:8]}") == second

    # A command that names the thread takes the part after the colon.
    restored = ok_json(daemon, "restore", "t-ref", "--checkpoint", "head~2")
    assert restored["checkpoint"]["id"] == first
    assert (daemon.workspace / "a.txt").read_text() == "version 0\n"
    assert ok_json(daemon, "restore", "t-ref", "--checkpoint", "two")["checkpoint"]["id"] == second
    before = ok_json(daemon, "list", "t-ref", "--before", "head~1")["checkpoints"]
    assert [c["id"] for c in before] == [first]
    assert ok_json(daemon, "fork", "t-ref", "one", "t-ref-fork")["forked_from_checkpoint_id"] == (
        first
    )

    for missing in ("t-ref:head~3", "t-ref:three", "nope:head", "ffffffffffff"):
        result = cli(daemon, "show", missing)
        assert result.returncode == 3, (missing, result.stderr)
        assert "MISSING_CHECKPOINT" in result.stderr
    for bad in ("abc", "head", "t-other:head"):
        args = ("restore", "t-ref", "--checkpoint", bad) if bad.startswith("t-") else ("show", bad)
        result = cli(daemon, *args)
        assert result.returncode == 2, (bad, result.stderr)


def test_an_ambiguous_part_exits_2_listing_the_candidates(daemon: Daemon) -> None:
    ids = _three_checkpoints(daemon, "t-amb")
    # UUIDv7 ids begin with their time in ms: ids made seconds apart share a prefix.
    shared = os.path.commonprefix(ids)[:8]
    assert len(shared) >= 4, ids
    result = cli(daemon, "show", shared)
    assert result.returncode == 2, result.stderr
    assert "ambiguous" in result.stderr
    for checkpoint_id in ids:
        assert checkpoint_id in result.stderr
    assert cli(daemon, "restore", "t-amb", "--checkpoint", shared).returncode == 2
    assert (daemon.workspace / "a.txt").read_text() == "version 2\n", "nothing restored"


# ---------------------------------------------------------------- cat, ls, delete-thread


def test_cat_and_ls_read_a_checkpoint(daemon: Daemon) -> None:
    (daemon.workspace / "src" / "pkg").mkdir(parents=True)
    (daemon.workspace / "src" / "main.py").write_text("print('hi')\n")
    (daemon.workspace / "src" / "pkg" / "util.py").write_text("x = 1\n")
    payload = bytes(range(256)) * 4000  # binary, over one ReadFile chunk
    (daemon.workspace / "data.bin").write_bytes(payload)
    (daemon.workspace / "link").symlink_to("src/main.py")
    ok_json(daemon, "capture", "t-cat")
    (daemon.workspace / "data.bin").write_bytes(b"changed")

    result = subprocess.run(
        [sys.executable, "-m", "checkpointd", "cat", "t-cat:head", "data.bin"],
        env=clean_env(CHECKPOINTD_ADDRESS=daemon.address),
        capture_output=True,
        timeout=60,
    )
    assert result.returncode == 0 and result.stdout == payload, result.stderr
    assert cli(daemon, "cat", "t-cat:head", "./src/main.py").stdout == "print('hi')\n"
    missing = cli(daemon, "cat", "t-cat:head", "nope.txt")
    assert missing.returncode == 3 and "MISSING_ENTRY" in missing.stderr
    assert cli(daemon, "cat", "t-cat:head", "../etc/passwd").returncode == 2

    top = cli(daemon, "ls", "t-cat:head")
    assert top.returncode == 0, top.stderr
    names = [line.split("  ")[-1] for line in top.stdout.splitlines()]
    assert names == ["data.bin", "link -> src/main.py", "src"], top.stdout
    assert top.stdout.splitlines()[0].startswith(("-rw", "drwx", "lrwx"))
    inside = cli(daemon, "ls", "t-cat:head", "src")
    assert [line.split()[-1] for line in inside.stdout.splitlines()] == ["src/main.py", "src/pkg"]
    everything = ok_json(daemon, "ls", "t-cat:head", "-R")
    assert {e["path"] for e in everything["entries"]} >= {"src/pkg/util.py", "data.bin"}
    assert cli(daemon, "ls", "t-cat:head", "nope").returncode == 3


def test_delete_thread_asks_for_yes_and_leaves_blobs_to_the_sweep(daemon: Daemon) -> None:
    ids = _three_checkpoints(daemon, "t-del")
    ok_json(daemon, "capture", "t-keep")
    blob_root = Path(daemon.blobs.removeprefix("file://"))
    blobs_before = sorted(p for p in blob_root.rglob("*") if p.is_file())

    refused = cli(daemon, "delete-thread", "t-del")
    assert refused.returncode == 2, refused.stderr
    assert "--yes" in refused.stderr and "3 checkpoints" in refused.stderr
    assert [c["id"] for c in ok_json(daemon, "list", "t-del")["checkpoints"]] == ids

    # A restore over a live edit saves the edit in the thread's stash.
    (daemon.workspace / "a.txt").write_text("a live edit\n")
    ok_json(daemon, "restore", "t-del", "--checkpoint", ids[0])
    assert len(ok_json(daemon, "list", "t-del", "--stash")["checkpoints"]) == 1
    blobs_before = sorted(p for p in blob_root.rglob("*") if p.is_file())

    deleted = ok_json(daemon, "delete-thread", "t-del", "--yes")
    assert deleted == {"thread_id": "t-del", "deleted_count": 3, "stash_deleted_count": 1}
    assert cli(daemon, "list", "t-del").returncode == 3
    assert cli(daemon, "list", "t-del", "--stash").returncode == 3
    assert [t["thread_id"] for t in ok_json(daemon, "threads")["threads"]] == ["t-keep"]
    assert sorted(p for p in blob_root.rglob("*") if p.is_file()) == blobs_before
    assert cli(daemon, "delete-thread", "t-del", "--yes").returncode == 3


# ---------------------------------------------------------------- pipes, finding the daemon


def test_a_closed_pipe_ends_quietly_with_exit_0(daemon: Daemon) -> None:
    make_tree(daemon.workspace, files=2000, max_size=10)
    ok_json(daemon, "capture", "t-pipe")
    env = clean_env(CHECKPOINTD_ADDRESS=daemon.address)
    command = f"{sys.executable} -m checkpointd show t-pipe:head --entries | head -n 1"
    piped = subprocess.run(
        ["bash", "-o", "pipefail", "-c", command],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert piped.returncode == 0, piped.stderr
    assert piped.stderr == "" and len(piped.stdout.splitlines()) == 1
    # A reader that is gone before the first byte: every write fails with EPIPE.
    for args in (("list", "t-pipe"), ("ls", "-R", "t-pipe:head"), ("threads",)):
        reader, writer = os.pipe()
        os.close(reader)
        try:
            closed = subprocess.run(
                [sys.executable, "-m", "checkpointd", *args],
                env=env,
                stdout=writer,
                stderr=subprocess.PIPE,
                text=True,
                timeout=60,
            )
        finally:
            os.close(writer)
        assert (closed.returncode, closed.stderr) == (0, ""), args


def test_no_daemon_says_where_it_looked_and_how_to_point_it(short_tmp: Path) -> None:
    home = short_tmp / "home"
    env = {k: v for k, v in clean_env().items() if k != "HOME"} | {"HOME": str(home)}
    result = subprocess.run(
        [sys.executable, "-m", "checkpointd", "list", "t"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 7, result.stderr
    socket = home / ".local/state/checkpointd/checkpointd.sock"
    assert f"no daemon at unix://{socket}: the socket file does not exist" in result.stderr
    for hint in ("the default data dir", "--data-dir", "CHECKPOINTD_DATA_DIR", "--address"):
        assert hint in result.stderr
    elsewhere = short_tmp / "elsewhere"
    as_json = subprocess.run(
        [sys.executable, "-m", "checkpointd", "threads", "--json"],
        env=env | {"CHECKPOINTD_DATA_DIR": str(elsewhere)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    error = json.loads(as_json.stdout)["error"]
    assert as_json.returncode == 7 and error["code"] == "UNAVAILABLE"
    assert str(elsewhere / "checkpointd.sock") in error["message"]
    assert error["metadata"]["looked there because of"] == f"CHECKPOINTD_DATA_DIR={elsewhere}"


def test_make_run_serves_where_the_client_looks() -> None:
    """`make run`'s daemon and a client given no flags meet: both use the data dir
    `serve` defaults to (or CHECKPOINTD_DATA_DIR), and `--help` says which."""
    repo = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in clean_env().items() if k != "HOME"} | {"HOME": "/home/someone"}
    dry = subprocess.run(
        ["make", "-n", "-C", str(repo), "run"], env=env, capture_output=True, text=True, timeout=60
    )
    assert "--data-dir /home/someone/.local/state/checkpointd" in dry.stdout, dry.stdout
    dry = subprocess.run(
        ["make", "-n", "-C", str(repo), "run"],
        env=env | {"CHECKPOINTD_DATA_DIR": "/srv/cp"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "--data-dir /srv/cp" in dry.stdout, dry.stdout
    text = build_parser().format_help()
    assert "~/.local/state/checkpointd" in text and "make run" in text


def test_tables_are_aligned_and_help_says_what_restore_does(daemon: Daemon) -> None:
    for thread in ("t", "a-much-longer-thread-name"):
        ok_json(daemon, "capture", thread)
    lines = cli(daemon, "threads").stdout.splitlines()
    assert lines[0].split() == ["THREAD", "CHECKPOINTS", "HEAD", "NEWEST"]
    heads = {line.index(line.split()[2]) for line in lines}
    assert len(heads) == 1, lines  # the HEAD column starts at one offset in every row
    restore_help = subprocess.run(
        [sys.executable, "-m", "checkpointd", "restore", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    flat = " ".join(restore_help.split())
    assert "also capture" not in flat
    assert "also restore .git, node_modules, .env*" in flat
