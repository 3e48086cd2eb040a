"""What an orchestrator asks for: threads, newest-first listings, a restore
preview, capture-if-changed, fork provenance, limits in GetServerInfo — through a
real daemon, and the CLI commands that expose them."""

from __future__ import annotations

import asyncio
import json
import os
import re
import time

import grpc
import pytest

from checkpointd.service.client import RpcError
from checkpointd.store import open_store
from checkpointd.v1 import checkpointd_pb2 as pb

from .conftest import Daemon, DaemonFactory
from .test_cli import cli


def ok_json(daemon: Daemon, *args: str) -> dict:
    result = cli(daemon, *args, "--json")
    assert result.returncode == 0, result.stderr + result.stdout
    return json.loads(result.stdout)


async def test_list_threads_pages_with_head_and_count(daemon: Daemon) -> None:
    (daemon.workspace / "a.txt").write_text("a")
    async with daemon.client() as client:
        heads = {}
        for index in range(7):
            for _ in range(index % 3 + 1):
                done = await client.capture(f"t-{index}")
            heads[f"t-{index}"] = done.checkpoint.id
        first = await client.stub.ListThreads(pb.ListThreadsRequest(page_size=3), timeout=10)
        assert len(first.threads) == 3 and first.next_page_token
        listed = [t async for t in client.list_threads(page_size=2)]
        with pytest.raises(RpcError) as caught:
            await client._unary(client.stub.ListThreads, pb.ListThreadsRequest(page_size=1001))
        assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(RpcError) as caught:
            await client._unary(
                client.stub.ListThreads, pb.ListThreadsRequest(page_token="garbage")
            )
        assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert [t.thread_id for t in listed] == sorted(heads)
    for thread in listed:
        assert thread.head_checkpoint_id == heads[thread.thread_id]
        index = int(thread.thread_id.removeprefix("t-"))
        assert thread.checkpoint_count == index % 3 + 1
        assert thread.newest_created_at > 0
    shown = ok_json(daemon, "threads")["threads"]
    assert [t["thread_id"] for t in shown] == sorted(heads)
    assert isinstance(shown[0]["checkpoint_count"], int)


async def test_newest_first_and_before(daemon: Daemon) -> None:
    async with daemon.client() as client:
        ids = []
        for index in range(12):
            (daemon.workspace / "n.txt").write_text(str(index))
            ids.append((await client.capture("t-order")).checkpoint.id)
        last_ten = await client.list_checkpoints("t-order", newest_first=True, limit=10)
        assert [s.id for s in last_ten] == ids[::-1][:10]
        paged = await client.list_checkpoints("t-order", newest_first=True, page_size=5)
        assert [s.id for s in paged] == ids[::-1]
        before = await client.list_checkpoints("t-order", newest_first=True, before=ids[5])
        assert [s.id for s in before] == ids[:5][::-1]
        oldest_before = await client.list_checkpoints("t-order", before=ids[5], page_size=2)
        assert [s.id for s in oldest_before] == ids[:5]
        with pytest.raises(RpcError) as caught:
            await client.list_checkpoints("t-order", before="no-such-checkpoint")
        assert caught.value.code == grpc.StatusCode.NOT_FOUND
        # A token from one order is refused in the other.
        page = await client.stub.ListCheckpoints(
            pb.ListCheckpointsRequest(thread_id="t-order", page_size=2, newest_first=True),
            timeout=10,
        )
        with pytest.raises(RpcError) as caught:
            await client._unary(
                client.stub.ListCheckpoints,
                pb.ListCheckpointsRequest(thread_id="t-order", page_token=page.next_page_token),
            )
        assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    newest = ok_json(daemon, "list", "t-order", "--newest-first", "--limit", "3")
    assert [c["id"] for c in newest["checkpoints"]] == ids[::-1][:3]
    assert isinstance(newest["checkpoints"][0]["created_at"], int)


async def test_restore_dry_run_returns_the_plan_and_changes_nothing(daemon: Daemon) -> None:
    ws = daemon.workspace
    (ws / "keep.txt").write_text("same")
    (ws / "edit.txt").write_text("original")
    (ws / "sub").mkdir()
    (ws / "sub" / "gone.txt").write_text("12345")
    async with daemon.client() as client:
        captured = (await client.capture("t-plan")).checkpoint
        (ws / "edit.txt").write_text("edited")
        (ws / "sub" / "gone.txt").unlink()
        (ws / "extra.txt").write_text("new file")
        before = {p.name: p.read_bytes() for p in ws.rglob("*") if p.is_file()}
        events: list[pb.RestoreEvent] = []
        done = await client.restore("t-plan", dry_run=True, on_event=events.append)
        after = {p.name: p.read_bytes() for p in ws.rglob("*") if p.is_file()}
    assert after == before, "a dry run changes nothing"
    assert not done.restored and done.checkpoint.id == captured.id
    started = next(e.started for e in events if e.HasField("started"))
    assert started.checkpoint_id == captured.id  # the head is named
    written = [p for e in events if e.HasField("plan_paths") for p in e.plan_paths.written]
    deleted = [p for e in events if e.HasField("plan_paths") for p in e.plan_paths.deleted]
    assert sorted(written) == ["edit.txt", "sub/gone.txt"]
    assert deleted == ["extra.txt"]
    plan = done.plan
    assert (plan.files_written, plan.paths_deleted, plan.files_kept) == (2, 1, 1)
    assert plan.bytes_to_fetch == len("original") + len("12345")
    assert plan.blobs_to_fetch == 2
    shown = cli(daemon, "restore", "t-plan", "--dry-run")
    assert shown.returncode == 0, shown.stderr
    assert "would write 2 files, delete 1 paths, keep 1 files" in shown.stdout
    assert "delete extra.txt" in shown.stdout
    assert (ws / "extra.txt").exists()


async def test_restore_dry_run_takes_no_lease_and_touches_no_staging(daemon: Daemon) -> None:
    """A preview while another writer holds the thread (the serve loop's
    capture, another daemon's restore) answers instead of WRITER_CONFLICT, and
    since it holds no lease it must not touch what a running restore owns: a
    staging directory stays, none is made, the root is not even written to."""
    ws = daemon.workspace
    (ws / "a.txt").write_text("alpha")
    (ws / "link").symlink_to("a.txt")
    async with daemon.client() as client:
        captured = (await client.capture("t-preview")).checkpoint
        (ws / "a.txt").write_text("edited")
        (ws / "link").unlink()
        staging = ws / ".checkpointd-staging-0123456789abcdef"
        staging.mkdir()
        (staging / "w-0").write_text("a restore in progress stages this")
        root_before = os.lstat(ws)
        listing_before = sorted(os.listdir(ws))
        store = await open_store(daemon.store)
        try:
            lease = await store.acquire_writer("t-preview")  # another owner holds the thread
            done = await client.restore("t-preview", dry_run=True)
            with pytest.raises(RpcError) as caught:
                await client.restore("t-preview")
            assert caught.value.code == grpc.StatusCode.ABORTED
            assert caught.value.reason == "SANDBOX_SNAPSHOT_WRITER_CONFLICT"
            await lease.release()
        finally:
            await store.aclose()
        assert done.checkpoint.id == captured.id and not done.restored
        # The file and the symlink: both are written.
        assert done.plan.files_written == 2
        assert sorted(os.listdir(ws)) == listing_before
        assert (staging / "w-0").read_text() == "a restore in progress stages this"
        root_after = os.lstat(ws)
        assert (root_after.st_mtime_ns, root_after.st_ctime_ns) == (
            root_before.st_mtime_ns,
            root_before.st_ctime_ns,
        )
        # The real restore writes what the plan said (apply counts the same files).
        events: list[pb.RestoreEvent] = []
        assert (await client.restore("t-preview", on_event=events.append)).restored
    apply = [e.progress for e in events if e.HasField("progress") and e.progress.phase == "apply"]
    assert apply[-1].files_done == apply[-1].files_total == done.plan.files_written
    assert (ws / "a.txt").read_text() == "alpha" and os.readlink(ws / "link") == "a.txt"


async def test_capture_skip_if_unchanged(daemon: Daemon) -> None:
    (daemon.workspace / "a.txt").write_text("a")
    async with daemon.client() as client:
        first = await client.capture("t-skip", skip_if_unchanged=True)
        assert not first.unchanged  # no head yet: a capture
        again = await client.capture("t-skip", skip_if_unchanged=True)
        assert again.unchanged and again.checkpoint.id == first.checkpoint.id
        # mtime alone is no change; content is.
        (daemon.workspace / "a.txt").touch()
        assert (await client.capture("t-skip", skip_if_unchanged=True)).unchanged
        talk = await client.capture("t-skip", skip_if_unchanged=True, conversation=['{"m":1}'])
        assert not talk.unchanged
        (daemon.workspace / "a.txt").write_text("b")
        changed = await client.capture("t-skip", skip_if_unchanged=True, conversation=['{"m":1}'])
        assert not changed.unchanged and changed.checkpoint.id != talk.checkpoint.id
        labelled = await client.capture(
            "t-skip", skip_if_unchanged=True, conversation=['{"m":1}'], label="named"
        )
        assert not labelled.unchanged
        assert len(await client.list_checkpoints("t-skip")) == 4
    skipped = ok_json(daemon, "capture", "t-skip", "--skip-if-unchanged")
    assert skipped["unchanged"] is False  # the head has a conversation; this one none
    skipped = ok_json(daemon, "capture", "t-skip", "--skip-if-unchanged")
    assert skipped["unchanged"] is True


async def test_fork_root_says_where_it_came_from(daemon: Daemon) -> None:
    (daemon.workspace / "a.txt").write_text("a")
    async with daemon.client() as client:
        source = (await client.capture("t-src")).checkpoint
        fork = await client.fork("t-src", source.id, "t-forked")
        assert fork.forked_from_thread_id == "t-src"
        assert fork.forked_from_checkpoint_id == source.id
        again = (await client.get_checkpoint(fork.id)).checkpoint
        assert again.forked_from_checkpoint_id == source.id
        assert not source.HasField("forked_from_checkpoint_id")
    shown = cli(daemon, "list", "t-forked")
    assert f"forked from t-src/{source.id}" in shown.stdout


async def test_server_info_reports_limits(daemon: Daemon) -> None:
    async with daemon.client() as client:
        caps = (await client.server_info()).capabilities
    assert caps.max_message_bytes == 4 * 1024 * 1024
    assert caps.lease_duration_ms == 120_000
    assert caps.max_page_size == 1000
    assert caps.auth_mode == "unix-socket" and not caps.tls
    info = ok_json(daemon, "info")
    assert info["capabilities"]["lease_duration_ms"] == 120_000


async def test_prune_reports_a_count(daemon: Daemon) -> None:
    async with daemon.client() as client:
        for index in range(4):
            (daemon.workspace / "p.txt").write_text(str(index))
            await client.capture("t-prune")
        response = await client.prune_response("t-prune", 1)
    assert response.deleted_count == 3 and not response.ids_truncated
    assert len(response.deleted_checkpoint_ids) == 3


def test_unknown_threads_exit_3_everywhere(daemon: Daemon) -> None:
    for args in (
        ("restore", "t-none"),
        ("restore", "t-none", "--dry-run"),
        ("list", "t-none"),
        ("diff", "--thread", "t-none"),
        ("prune", "t-none", "--keep", "1"),
    ):
        result = cli(daemon, *args)
        assert result.returncode == 3, (args, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr
        assert "thread t-none has no checkpoints" in result.stderr and not result.stdout
        shown = cli(daemon, *args, "--json")
        assert shown.returncode == 3
        error = json.loads(shown.stdout)["error"]
        assert (error["code"], error["metadata"]) == ("NOT_FOUND", {"thread_id": "t-none"})
    # A checkpoint, file or source that does not exist is 3 as well.
    for args in (("show", "no-such"), ("fork", "t-none", "no-such", "t-other")):
        assert cli(daemon, *args).returncode == 3, args


def test_durations_and_data_dir(daemon: Daemon) -> None:
    assert cli(daemon, "sweep", "--older-than", "7d", "--dry-run").returncode == 0
    bad = cli(daemon, "sweep", "--older-than", "5x")
    assert bad.returncode == 2 and "not a duration" in bad.stderr
    assert "Traceback" not in bad.stderr
    # --data-dir finds the daemon's socket (no --address, no environment).
    found = cli(None, "health", "--data-dir", str(daemon.data_dir), address="")
    assert found.returncode == 0 and found.stdout.strip() == "SERVING", found.stderr


async def test_the_conversation_is_stored_byte_for_byte(daemon: Daemon) -> None:
    first = ['{"n": 1e3,  "a" : [1, 2.50]}', '"caf\\u00e9"']
    second = [*first, '{ "z":1, "a":2 }']
    (daemon.workspace / "a.txt").write_text("a")
    async with daemon.client() as client:
        one = (await client.capture("t-verbatim", conversation=first)).checkpoint
        two = (await client.capture("t-verbatim", conversation=second)).checkpoint
        fork = await client.fork("t-verbatim", two.id, "t-verbatim-fork")
        for checkpoint_id, sent in ((one.id, first), (two.id, second), (fork.id, second)):
            got = await client.get_checkpoint(checkpoint_id, include_conversation=True)
            assert list(got.conversation) == sent
    # And the values, for the Python API, are the parsed messages.
    from checkpointd.store import open_store

    store = await open_store(daemon.store)
    try:
        stored = await store.get(two.id)
    finally:
        await store.aclose()
    assert stored is not None and stored.conversation[0] == {"n": 1000.0, "a": [1, 2.5]}
    assert stored.conversation_text == tuple(second)
    # The CLI sends each message of its file as written, not re-serialised.
    conversation_file = daemon.data_dir.parent / "conversation.json"
    conversation_file.write_text("[\n  " + ",\n  ".join(second) + "\n]\n")
    captured = ok_json(daemon, "capture", "t-verbatim", "--conversation", str(conversation_file))
    shown = ok_json(daemon, "show", captured["checkpoint"]["id"], "--conversation")
    assert shown["conversation"] == second
    conversation_file.write_text("[1, ")
    bad = cli(daemon, "capture", "t-verbatim", "--conversation", str(conversation_file))
    assert bad.returncode == 2 and "not JSON" in bad.stderr and "Traceback" not in bad.stderr


async def test_one_log_line_per_operation_and_a_warning_per_failure(daemon: Daemon) -> None:
    (daemon.workspace / "a.txt").write_text("a")
    async with daemon.client() as client:
        done = await client.capture("t-log", secrets=[b"s3cr3t-value"])
        (daemon.workspace / "a.txt").unlink()
        await client.restore("t-log")
        await client.prune("t-log", 1)
        await client.sweep(0, dry_run=True)
        with pytest.raises(RpcError):
            await client.get_checkpoint("no-such-checkpoint")
    log = daemon.log_text()
    assert f"INFO checkpointd.service.servicer: capture {done.checkpoint.id} of thread t-log" in log
    assert (
        f"restore {done.checkpoint.id} of thread t-log: 1 entries, 1 files written (1 bytes)" in log
    )
    assert "prune of thread t-log (keep 1): 0 checkpoints" in log
    assert "sweep (dry run): listed" in log
    assert "WARNING checkpointd.service.servicer: GetCheckpoint failed: NOT_FOUND" in log
    assert "checkpoint_id=no-such-checkpoint" in log
    assert "s3cr3t-value" not in log
    assert re.search(r"prune of thread t-log \(keep 1\): 0 checkpoints in \d+ ms", log)


async def test_every_failure_is_logged_even_before_a_handler(daemons: DaemonFactory) -> None:
    """Replays log their line; refusals before any handler (undecodable bytes,
    no token, an unknown method) and cancelled calls log a WARNING each, and
    never the token."""
    daemon = daemons.start(tcp=True, token="log-test-token")
    target = daemon.address.removeprefix("tcp://")
    (daemon.workspace / "a.txt").write_text("a")
    async with daemon.client() as client:
        first = await client.capture("t-logged", request_id="r-1")
        await client.capture("t-logged", request_id="r-1")
    async with grpc.aio.insecure_channel(target) as channel:
        auth = (("authorization", "Bearer log-test-token"),)
        get_head = channel.unary_unary("/checkpointd.v1.Checkpointd/GetHead")
        with pytest.raises(grpc.aio.AioRpcError):
            await get_head(b"\x0a\x02\xff\xfe", timeout=10, metadata=auth)  # invalid UTF-8
        with pytest.raises(grpc.aio.AioRpcError):
            await get_head(b"", timeout=10)  # no token
        unknown = channel.unary_unary("/checkpointd.v1.Checkpointd/NoSuchMethod")
        with pytest.raises(grpc.aio.AioRpcError):
            await unknown(b"", timeout=10, metadata=auth)
    for index in range(3000):
        (daemon.workspace / f"f{index}.txt").write_text(str(index))
    async with daemon.client() as client:
        call = client.stub.Capture(pb.CaptureRequest(thread_id="t-cancelled"), metadata=auth)
        async for event in call:
            assert event.HasField("started")
            call.cancel()  # the client goes away while the capture works
            break
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # logged once the call has unwound
        if "Capture failed: CANCELLED" in daemon.log_text():
            break
        await asyncio.sleep(0.05)
    log = daemon.log_text()
    assert f"capture {first.checkpoint.id} of thread t-logged: replayed (request_id r-1)" in log
    assert "WARNING checkpointd.service.guard: /checkpointd.v1.Checkpointd/GetHead rejected" in log
    assert (
        "WARNING checkpointd.service.auth: /checkpointd.v1.Checkpointd/GetHead refused: "
        "UNAUTHENTICATED" in log
    )
    assert "/checkpointd.v1.Checkpointd/NoSuchMethod refused: UNIMPLEMENTED" in log
    assert "WARNING checkpointd.service.servicer: Capture failed: CANCELLED" in log
    assert "log-test-token" not in log


def test_the_progress_bar_counts_files_on_a_terminal(daemon: Daemon) -> None:
    import shlex
    import subprocess
    import sys

    from .conftest import clean_env

    for index in range(300):
        (daemon.workspace / f"f{index}.txt").write_text(str(index))
    command = shlex.join([sys.executable, "-m", "checkpointd", "capture", "t-bar"])
    result = subprocess.run(
        ["script", "-qec", command, "/dev/null"],
        env=clean_env(CHECKPOINTD_ADDRESS=daemon.address, COLUMNS="120"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "captured" in result.stdout and "files" in result.stdout
    assert "Traceback" not in result.stdout


def test_the_bar_counts_files_in_scan_and_apply_bytes_in_upload_and_fetch() -> None:
    from checkpointd.cli import human_rate, progress_view

    apply = pb.Progress(phase="apply", files_done=5, files_total=10, bytes_done=3 << 20)
    apply.bytes_total = 6 << 20
    assert progress_view(apply, 2000) == (5, 10, "5/10 files, 3.0 MiB/6.0 MiB, 1.5 MiB/s")
    fetch = pb.Progress(phase="fetch", files_done=1, files_total=2, bytes_done=10, bytes_total=40)
    assert progress_view(fetch, 1000)[:2] == (10, 40)
    scan = pb.Progress(phase="scan", files_done=3000)
    assert progress_view(scan, 1500) == (3000, 0, "3000 files, 2,000 files/s")
    scan.files_hashed, scan.bytes_done = 20, 1 << 20
    assert progress_view(scan, 1000) == (3000, 0, "3000 files (20 hashed), 1.0 MiB, 1.0 MiB/s")
    assert human_rate(2048, 1000) == "2.0 KiB/s"
    assert human_rate(1_000_000, 500, "keys") == "2,000,000 keys/s"
