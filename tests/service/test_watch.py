"""The daemon's change journal (``serve --watch``), through real daemons.

A capture the journal directs examines what changed only and stores exactly
what a full scan would; the first capture of a fresh daemon, one after the
kernel's queue overflowed and one with watching off are full scans that say
why; a write through a shared ``mmap`` (no event reports it) is found by the
verifying scan; ``--capture-on-change`` captures once the workspace is quiet;
a flood of events leaves the daemon's memory bounded.

The overflow and watch-limit tests lower the kernel's inotify limits
(``/proc/sys/fs/inotify``) for the moment the daemon starts its journal and
put them back at once: they need root.
"""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpointd import _native
from checkpointd.store import open_store
from checkpointd.store._documents import MAX_DEPTH
from checkpointd.v1 import checkpointd_pb2 as pb

from .conftest import Daemon, DaemonFactory
from .test_cli import cli

THREAD = "t-watch"
# Events in the flood test (a million by hand: CHECKPOINTD_FLOOD_EVENTS=1000000).
FLOOD_EVENTS = int(os.environ.get("CHECKPOINTD_FLOOD_EVENTS", "200000"))


def make_tree(root: Path, dirs: int = 12, files: int = 8) -> None:
    for d in range(dirs):
        sub = root / f"dir{d:02d}" / "inner"
        sub.mkdir(parents=True, exist_ok=True)
        for f in range(files):
            (sub.parent / f"file{f}.txt").write_bytes(os.urandom(64) * (f + 1))
        (sub / "deep.txt").write_text(f"deep {d}\n")


def capture(daemon: Daemon) -> pb.CaptureDone:
    async def run() -> pb.CaptureDone:
        async with daemon.client() as client:
            return await client.capture(THREAD)

    return asyncio.run(run())


def stored(daemon: Daemon, checkpoint_id: str) -> bytes:
    """The checkpoint's manifest bytes, read from the daemon's store."""

    async def read() -> bytes:
        store = await open_store(daemon.store)
        try:
            checkpoint = await store.get(checkpoint_id)
            assert checkpoint is not None
            return bytes(checkpoint.files.data)  # type: ignore[attr-defined]
        finally:
            await store.aclose()

    return asyncio.run(read())


def full_scan(workspace: Path) -> bytes:
    """What a full scan of the workspace finds now (no stat cache)."""
    return _native.scan(str(workspace)).manifest


def server_info(daemon: Daemon) -> pb.Capabilities:
    async def run() -> pb.GetServerInfoResponse:
        async with daemon.client() as client:
            return await client.server_info()

    return asyncio.run(run()).capabilities


def until_journal(daemon: Daemon, *, attempts: int = 8) -> pb.CaptureDone:
    """Capture (touching a file each time) until the journal directs one:
    the first captures are full while the journal starts."""
    marker = daemon.workspace / "marker.txt"
    for attempt in range(attempts):
        marker.write_text(f"attempt {attempt}\n")
        done = capture(daemon)
        if done.stats.scan_mode == "journal":
            return done
        time.sleep(0.2)
    raise AssertionError(f"no journal capture after {attempts} tries:\n{daemon.log_text()}")


def start(daemons: DaemonFactory, *extra: str) -> Daemon:
    workspace = daemons.base / f"ws{len(daemons.daemons)}"
    make_tree(workspace)
    return daemons.start(workspace=workspace, extra=extra)


def test_a_capture_after_a_few_edits_examines_them_and_stores_a_full_scan(
    daemons: DaemonFactory,
) -> None:
    daemon = start(daemons, "--watch", "inotify")
    first = capture(daemon)
    assert first.stats.scan_mode == "full"
    assert "fresh daemon" in first.stats.full_scan_reason
    assert first.stats.entries_examined >= 12 * 10
    until_journal(daemon)
    ws = daemon.workspace
    (ws / "dir03" / "file2.txt").write_bytes(b"edited")
    (ws / "dir07" / "inner" / "new.txt").write_text("new\n")
    (ws / "dir09" / "file0.txt").unlink()
    (ws / "dir11").rename(ws / "moved")
    done = capture(daemon)
    assert done.stats.scan_mode == "journal", done.stats
    assert done.stats.full_scan_reason == ""
    # The names the events named, their directories, and the moved subtree.
    assert 0 < done.stats.entries_examined <= 40, done.stats
    assert stored(daemon, done.checkpoint.id) == full_scan(ws)
    # Nothing changed: nothing is examined.
    same = capture(daemon)
    assert (same.stats.scan_mode, same.stats.entries_examined) == ("journal", 0)
    assert stored(daemon, same.checkpoint.id) == full_scan(ws)
    # The command line says both.
    printed = cli(daemon, "capture", THREAD)
    assert printed.returncode == 0, printed.stderr
    assert "; journal scan, 0 examined" in printed.stdout, printed.stdout
    # The blobs and the store's counts (worked out from the changes) are
    # right, for a blob two files hold as well: when one of them changes,
    # the other still holds it.
    (ws / "dir04" / "file1.txt").write_bytes(b"once more")
    (ws / "dir06" / "file1.txt").write_bytes(b"once more")
    (ws / "dir05" / "file1.txt").unlink()
    assert capture(daemon).stats.scan_mode == "journal"
    (ws / "dir04" / "file1.txt").write_bytes(b"and again")
    last = capture(daemon)
    assert last.stats.scan_mode == "journal"

    async def check() -> tuple[list[bytes], pb.CheckSummary]:
        async with daemon.client() as client:
            read = [
                await client.read_file(last.checkpoint.id, path)
                for path in ("dir04/file1.txt", "dir06/file1.txt")
            ]
            return read, await client.check(read_data=True)

    read, summary = asyncio.run(check())
    assert read == [b"and again", b"once more"]
    assert summary.ok and summary.count_mismatches == summary.missing == 0, summary


def test_captures_past_a_keyframe_stay_exact(daemons: DaemonFactory) -> None:
    """A long chain of directed captures: the store writes a keyframe every
    so many checkpoints and keeps a large one compressed, while the journal
    hands the next scan the bytes its capture held. Every capture, before,
    at and after the keyframe, stores what a full scan finds."""
    daemon = start(daemons, "--watch", "inotify")
    capture(daemon)
    until_journal(daemon)
    ws = daemon.workspace
    for step in range(MAX_DEPTH + 4):
        (ws / f"dir{step % 12:02d}" / "file3.txt").write_bytes(b"step %d\n" % step * (step + 1))
        if step % 5 == 0:
            (ws / f"dir{step % 12:02d}" / f"added{step}.txt").write_text("added\n")
        done = capture(daemon)
        assert done.stats.scan_mode == "journal", (step, done.stats)
        assert stored(daemon, done.checkpoint.id) == full_scan(ws), step


def test_server_info_says_how_the_daemon_watches(daemons: DaemonFactory) -> None:
    watching = start(daemons)
    caps = server_info(watching)
    # /tmp is not a filesystem of its own here: auto takes inotify.
    assert caps.watch_mode == "inotify", caps
    assert "shares its filesystem" in caps.watch_detail
    assert "watching inotify" in cli(watching, "info").stdout
    off = start(daemons, "--watch", "off")
    caps = server_info(off)
    assert (caps.watch_mode, caps.watch_detail) == ("off", "--watch off")
    done = capture(off)
    assert (done.stats.scan_mode, done.stats.full_scan_reason) == (
        "full",
        "watching is off: --watch off",
    )
    refused = daemons.start(extra=("--watch", "sometimes"), wait=False)
    assert refused.proc.wait(30) == 2
    assert "--watch must be one of auto, fanotify, inotify, off" in refused.log_text()


def test_a_restarted_daemon_scans_everything_first(daemons: DaemonFactory) -> None:
    daemon = start(daemons, "--watch", "inotify")
    until_journal(daemon)
    assert daemon.stop() == 0
    again = daemons.start(
        workspace=daemon.workspace,
        data_dir=daemon.data_dir,
        store=daemon.store,
        blobs=daemon.blobs,
        extra=("--watch", "inotify"),
    )
    (again.workspace / "dir00" / "file0.txt").write_text("changed while no daemon watched\n")
    done = capture(again)
    assert done.stats.scan_mode == "full"
    assert "fresh daemon" in done.stats.full_scan_reason
    assert stored(again, done.checkpoint.id) == full_scan(again.workspace)


@contextlib.contextmanager
def inotify_limit(name: str, value: int) -> Iterator[None]:
    """The kernel's ``fs.inotify.<name>`` set to ``value`` for the block."""
    if os.geteuid() != 0:
        pytest.skip("changing the kernel's inotify limits needs root")
    path = Path("/proc/sys/fs/inotify") / name
    before = path.read_text()
    path.write_text(str(value))
    try:
        yield
    finally:
        path.write_text(before)


def test_an_overflowed_queue_makes_the_next_capture_full(daemons: DaemonFactory) -> None:
    # The queue's bound is taken when the journal starts: 16 events.
    with inotify_limit("max_queued_events", 16):
        daemon = start(daemons, "--watch", "inotify")
    until_journal(daemon)
    # Stopped, the daemon cannot drain the kernel's queue as it fills: the
    # burst overflows it however fast the machine is.
    daemon.proc.send_signal(signal.SIGSTOP)
    try:
        for i in range(100):
            (daemon.workspace / f"burst{i}").write_bytes(b"x")
    finally:
        daemon.proc.send_signal(signal.SIGCONT)
    done = capture(daemon)
    assert done.stats.scan_mode == "full", done.stats
    assert "overflowed" in done.stats.full_scan_reason, done.stats.full_scan_reason
    assert stored(daemon, done.checkpoint.id) == full_scan(daemon.workspace)
    # And it is trusted again after that full scan.
    assert until_journal(daemon).stats.scan_mode == "journal"


def test_a_watch_limit_turns_watching_off_and_says_so(daemons: DaemonFactory) -> None:
    with inotify_limit("max_user_watches", 8):
        daemon = start(daemons, "--watch", "inotify")
        # Until the journal has hit the limit (its walk runs in the background).
        deadline = time.monotonic() + 20
        while server_info(daemon).watch_mode != "off" and time.monotonic() < deadline:
            time.sleep(0.05)
    caps = server_info(daemon)
    assert caps.watch_mode == "off", caps
    assert caps.watch_detail.startswith("watch limit 8 < "), caps.watch_detail
    done = capture(daemon)
    assert done.stats.scan_mode == "full"
    assert done.stats.full_scan_reason.startswith("watching is off: watch limit 8")
    assert stored(daemon, done.checkpoint.id) == full_scan(daemon.workspace)


def test_a_shared_mmap_write_is_found_by_the_verifying_scan(daemons: DaemonFactory) -> None:
    daemon = start(daemons, "--watch", "inotify", "--watch-verify-every", "500ms")
    until_journal(daemon)
    target = daemon.workspace / "dir05" / "file3.txt"
    with target.open("r+b") as handle, mmap.mmap(handle.fileno(), 0) as shared:
        shared[0:5] = b"MMAP!"
        shared.flush()
    deadline = time.monotonic() + 30
    while "verifying scan found" not in daemon.log_text():
        assert time.monotonic() < deadline, daemon.log_text()
        time.sleep(0.1)
    done = capture(daemon)
    assert done.stats.scan_mode == "full"
    assert "the verifying scan found 1 change(s) the journal missed" in done.stats.full_scan_reason
    assert "dir05/file3.txt" in done.stats.full_scan_reason
    assert stored(daemon, done.checkpoint.id) == full_scan(daemon.workspace)


def test_capture_on_change_captures_once_the_workspace_is_quiet(
    daemons: DaemonFactory,
) -> None:
    daemon = start(
        daemons,
        "--watch",
        "inotify",
        "--thread",
        THREAD,
        "--capture-on-change",
        "300ms",
        "--watch-verify-every",
        "0",
    )

    async def checkpoints() -> list[pb.CheckpointSummary]:
        async with daemon.client() as client:
            with contextlib.suppress(Exception):  # no thread yet
                return await client.list_checkpoints(THREAD)
            return []

    def wait_for(count: int) -> list[pb.CheckpointSummary]:
        deadline = time.monotonic() + 30
        while len(found := asyncio.run(checkpoints())) < count:
            assert time.monotonic() < deadline, daemon.log_text()
            time.sleep(0.1)
        return found

    # The fresh daemon's journal is not trusted: its first capture comes at once.
    wait_for(1)
    (daemon.workspace / "agent-wrote.txt").write_text("a tool call's output\n")
    after = wait_for(2)
    assert stored(daemon, after[-1].id) == full_scan(daemon.workspace)
    # Quiet, unchanged: no capture.
    time.sleep(1.5)
    assert len(asyncio.run(checkpoints())) == 2, daemon.log_text()


def test_a_restore_the_daemon_applies_keeps_captures_exact(daemons: DaemonFactory) -> None:
    daemon = start(daemons, "--watch", "inotify")
    base = until_journal(daemon)
    (daemon.workspace / "dir01" / "file1.txt").write_text("later work\n")
    (daemon.workspace / "dir02").rename(daemon.workspace / "dir02-renamed")
    capture(daemon)

    async def restore() -> None:
        async with daemon.client() as client:
            await client.restore(THREAD, checkpoint_id=base.checkpoint.id)

    asyncio.run(restore())
    done = capture(daemon)
    assert done.stats.scan_mode == "journal", done.stats
    assert stored(daemon, done.checkpoint.id) == full_scan(daemon.workspace)
    assert stored(daemon, done.checkpoint.id) == stored(daemon, base.checkpoint.id)


def test_a_sub_root_capture_leaves_the_journal_to_whole_workspace_captures(
    daemons: DaemonFactory,
) -> None:
    daemon = start(daemons, "--watch", "inotify")
    until_journal(daemon)
    (daemon.workspace / "dir08" / "file0.txt").write_text("outside the sub-root\n")

    async def sub() -> pb.CaptureDone:
        async with daemon.client() as client:
            return await client.capture("t-sub", workspace_subdir="dir01")

    done = asyncio.run(sub())
    assert done.stats.scan_mode == "full"
    assert "sub-root" in done.stats.full_scan_reason
    whole = capture(daemon)
    assert whole.stats.scan_mode == "journal", whole.stats
    assert stored(daemon, whole.checkpoint.id) == full_scan(daemon.workspace)


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_a_flood_of_events_keeps_the_daemon_memory_bounded(daemons: DaemonFactory) -> None:
    daemon = start(daemons, "--watch", "inotify")
    until_journal(daemon)
    before = _rss(daemon.proc.pid)
    flood = daemon.workspace / "flood"
    dirs = [flood / f"d{i:03d}" for i in range(100)]
    for d in dirs:
        d.mkdir(parents=True)
    # Distinct names: each a create, a write and a delete (three events).
    made = 0
    while made < FLOOD_EVENTS:
        for d in dirs:
            name = d / f"n{made}"
            name.write_bytes(b"x")
            name.unlink()
            made += 3
    peak = _rss(daemon.proc.pid)
    done = capture(daemon)
    assert done.stats.scan_mode in ("journal", "full")
    assert stored(daemon, done.checkpoint.id) == full_scan(daemon.workspace)
    # Bounded: the names collapse to their directories (a few MB at most).
    assert peak - before < 64 << 20, (before, peak)


def test_the_watch_settings_are_checked(tmp_path: Path) -> None:
    from checkpointd.errors import SandboxCheckpointInvalidArgumentError
    from checkpointd.service.config import resolve

    base = {"workspace": str(tmp_path), "data_dir": str(tmp_path / "data")}
    config = resolve(base, environ={})
    assert (config.watch, config.watch_verify_every, config.capture_on_change) == (
        "auto",
        600.0,
        None,
    )
    config = resolve(
        {**base, "watch": "fanotify", "watch_verify_every": "0", "thread": "t"},
        environ={"CHECKPOINTD_CAPTURE_ON_CHANGE": "2s"},
    )
    assert (config.watch, config.watch_verify_every, config.capture_on_change) == (
        "fanotify",
        0.0,
        2.0,
    )
    for flags, message in [
        ({"watch": "sometimes"}, "--watch must be one of"),
        ({"capture_on_change": "2s"}, "--capture-on-change needs --thread"),
        ({"capture_on_change": "0s", "thread": "t"}, "must be a positive duration"),
        ({"watch_verify_every": "soon"}, "not a duration"),
    ]:
        with pytest.raises(SandboxCheckpointInvalidArgumentError, match=message):
            resolve({**base, **flags}, environ={})
