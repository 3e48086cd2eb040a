"""A daemon killed with SIGKILL mid-capture, restarted on the same data dir, takes
back its own leases at once; any other writer still gets WRITER_CONFLICT, told
when the lease expires (ErrorInfo metadata and google.rpc.RetryInfo)."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from checkpointd import errors
from checkpointd.model import Checkpoint
from checkpointd.service.owner import OWNER_FILE, OwnedStore, load_owner_id
from checkpointd.service.status import DETAILS_KEY
from checkpointd.store import open_store
from checkpointd.v1 import checkpointd_pb2 as pb

from .conftest import Daemon, DaemonFactory, make_tree, tree_state

LEASE_MS = 120_000  # the daemon's default lease


def _big_workspace(root: Path) -> None:
    """Enough bytes that a capture is still hashing when the kill lands."""
    make_tree(root, seed=3, files=30)
    for n in range(12):
        (root / f"big-{n}.bin").write_bytes(os.urandom(3 << 20))


async def _kill_mid_capture(daemon: Daemon, thread_id: str) -> None:
    async with daemon.client() as client:
        call = client.stub.Capture(pb.CaptureRequest(thread_id=thread_id))
        async for event in call:
            if event.HasField("progress") and event.progress.phase in ("scan", "pin", "upload"):
                daemon.kill()  # the lease is held: it was taken before the scan
                break
        call.cancel()
    assert daemon.proc.returncode == -9


async def _assert_lease_left_live(store_url: str, thread_id: str) -> None:
    """The dead daemon's lease is still live for everyone else."""
    store = await open_store(store_url)
    try:
        with pytest.raises(errors.SandboxCheckpointWriterConflictError) as info:
            await store.acquire_writer(thread_id)
        assert int(info.value.details["retry_after_ms"]) > LEASE_MS // 2
    finally:
        await store.aclose()


async def _crash_and_restart(daemons: DaemonFactory, store: str | None) -> None:
    first = daemons.start(store=store)
    _big_workspace(first.workspace)
    expected = tree_state(first.workspace)
    await _kill_mid_capture(first, "t-crash")
    await _assert_lease_left_live(first.store, "t-crash")

    again = daemons.start(workspace=first.workspace, data_dir=first.data_dir, store=first.store)
    async with again.client() as client:
        began = time.monotonic()
        done = await client.capture("t-crash")  # first try: no WRITER_CONFLICT, no wait
        waited = time.monotonic() - began
        assert done.checkpoint.entry_count == len(expected)
        head = await client.get_head("t-crash")
        assert head == done.checkpoint.id
        # The lease came back with the capture's release: a restore runs too.
        (first.workspace / "big-0.bin").unlink()
        restored = await client.restore("t-crash")
        assert restored.restored
    assert tree_state(first.workspace) == expected
    print(f"restarted daemon's first capture took {waited:.2f}s, with 0 s waiting for the lease")


async def test_restarted_daemon_captures_at_once_sqlite(daemons: DaemonFactory) -> None:
    await _crash_and_restart(daemons, None)


@pytest.mark.postgres
async def test_restarted_daemon_captures_at_once_postgres(
    daemons: DaemonFactory, postgres_url: str
) -> None:
    await _crash_and_restart(daemons, postgres_url)


async def test_other_owner_conflict_carries_expiry_and_retry_info(daemon: Daemon) -> None:
    (daemon.workspace / "a.txt").write_text("a")
    store = await open_store(daemon.store)
    try:
        lease = await store.acquire_writer("t-held")
        async with daemon.client() as client:
            call = client.stub.Capture(pb.CaptureRequest(thread_id="t-held"))
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                async for _ in call:
                    pass
        assert caught.value.code() == grpc.StatusCode.ABORTED
        raw = dict(caught.value.trailing_metadata() or ())[DETAILS_KEY]
        status = status_pb2.Status.FromString(raw)
        info = error_details_pb2.ErrorInfo()
        retry = error_details_pb2.RetryInfo()
        kinds = set()
        for detail in status.details:
            if detail.Unpack(info):
                kinds.add("info")
            elif detail.Unpack(retry):
                kinds.add("retry")
        assert kinds == {"info", "retry"}
        assert info.reason == errors.SandboxCheckpointWriterConflictError.code
        assert int(info.metadata["expires_at_ms"]) == lease.expires_at
        retry_ms = int(info.metadata["retry_after_ms"])
        assert 0 < retry_ms <= LEASE_MS
        assert retry.retry_delay.ToMilliseconds() == retry_ms
        await lease.release()
    finally:
        await store.aclose()


def _status_details(error: grpc.aio.AioRpcError) -> tuple[Any, Any]:
    """(ErrorInfo, RetryInfo or None) of a failed call."""
    raw = dict(error.trailing_metadata() or ())[DETAILS_KEY]
    info, retry = error_details_pb2.ErrorInfo(), error_details_pb2.RetryInfo()
    found_retry = None
    for detail in status_pb2.Status.FromString(raw).details:
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            detail.Unpack(retry)
            found_retry = retry
        else:
            detail.Unpack(info)
    return info, found_retry


async def test_writer_lost_carries_the_expiry_of_the_lease_that_took_over(daemon: Daemon) -> None:
    """A second process of the daemon's identity (a restart beside a hung one)
    takes the lease back mid-capture: the capture ends WRITER_LOST, told when
    the lease that holds the thread now expires, with RetryInfo, over the socket."""
    for n in range(16):
        (daemon.workspace / f"big-{n}.bin").write_bytes(os.urandom(4 << 20))
    owner = load_owner_id(daemon.data_dir)
    store = await open_store(daemon.store)
    taken = None
    try:
        async with daemon.client() as client:
            call = client.stub.Capture(pb.CaptureRequest(thread_id="t-lost"))
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                async for event in call:
                    if taken is None and event.HasField("progress"):
                        if event.progress.phase == "scan":
                            taken = await store.acquire_writer("t-lost", owner=owner)
        assert taken is not None, "the capture ended before the lease was taken over"
        assert caught.value.code() == grpc.StatusCode.ABORTED
        info, retry = _status_details(caught.value)
        assert info.reason == errors.SandboxCheckpointWriterLostError.code
        assert info.metadata["thread_id"] == "t-lost"
        assert int(info.metadata["expires_at_ms"]) == taken.expires_at
        retry_ms = int(info.metadata["retry_after_ms"])
        assert 0 < retry_ms <= LEASE_MS
        assert retry is not None and retry.retry_delay.ToMilliseconds() == retry_ms
        assert await store.get_head("t-lost") is None
    finally:
        if taken is not None:
            await taken.release()
        await store.aclose()


@pytest.mark.parametrize(
    "kind", ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
async def test_writer_lost_names_the_lease_holding_the_thread(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Renew and append of a replaced writer say when the lease that replaced it
    expires; once no lease holds the thread, retry_after_ms is 0 and there is no
    expiry to give."""
    url = {"memory": "memory://", "sqlite": f"sqlite:///{tmp_path / 'c.db'}"}.get(kind)
    url = url or request.getfixturevalue("postgres_url")
    clock = [1_000_000]
    store = await open_store(url, now=lambda: clock[0])
    try:
        old = await store.acquire_writer("t", owner="daemon")
        new = await store.acquire_writer("t", owner="daemon")  # taken back: old is lost
        clock[0] += 500
        with pytest.raises(errors.SandboxCheckpointWriterLostError) as renewing:
            await old.renew()
        checkpoint = Checkpoint(id="c1", thread_id="t", parent_checkpoint_id=None, created_at=1)
        with pytest.raises(errors.SandboxCheckpointWriterLostError) as appending:
            await store.append(checkpoint, None, old)
        for lost in (renewing.value, appending.value):
            assert lost.details["expires_at_ms"] == new.expires_at
            assert lost.details["retry_after_ms"] == new.expires_at - clock[0]
        await new.release()
        with pytest.raises(errors.SandboxCheckpointWriterLostError) as free:
            await old.renew()
        assert free.value.details["retry_after_ms"] == 0
        assert "expires_at_ms" not in free.value.details
    finally:
        await store.aclose()


def test_owner_id_is_made_once_with_mode_0600(tmp_path: Path) -> None:
    owner = load_owner_id(tmp_path)
    path = tmp_path / OWNER_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_owner_id(tmp_path) == owner
    other = tmp_path / "other"
    other.mkdir()
    assert load_owner_id(other) != owner


@pytest.mark.parametrize("content", [b"", b"\n", b"x" * 1000, b"bad\x00id"], ids=repr)
def test_a_damaged_owner_file_is_refused(tmp_path: Path, content: bytes) -> None:
    (tmp_path / OWNER_FILE).write_bytes(content)
    with pytest.raises(errors.SandboxCheckpointInvalidArgumentError, match=OWNER_FILE):
        load_owner_id(tmp_path)


def test_an_owner_file_symlink_is_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("someone-else\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / OWNER_FILE).symlink_to(target)
    with pytest.raises(errors.SandboxCheckpointInvalidArgumentError, match="symlink"):
        load_owner_id(tmp_path / "data")


async def test_owned_store_keeps_its_own_calls_apart(tmp_path: Path) -> None:
    """Within one process a second lease on a thread conflicts; a new process
    (a second OwnedStore, same owner) takes the live lease back."""
    url = f"sqlite://{tmp_path / 'c.db'}"
    first = OwnedStore(await open_store(url), "daemon-1")
    second = OwnedStore(await open_store(url), "daemon-1")
    stranger = await open_store(url)
    try:
        lease = await first.acquire_writer("t")
        with pytest.raises(errors.SandboxCheckpointWriterConflictError) as info:
            await first.acquire_writer("t")
        assert "retry_after_ms" in info.value.details
        with pytest.raises(errors.SandboxCheckpointWriterConflictError):
            await stranger.acquire_writer("t")
        taken = await second.acquire_writer("t")  # the "restarted" process
        assert taken.fence == lease.fence + 1
        with pytest.raises(errors.SandboxCheckpointWriterLostError):
            await lease.renew()
        await lease.release()  # the stale release frees the first process's slot only
        again = await first.acquire_writer("t")  # same owner, new process slot free
        assert again.fence == taken.fence + 1
        await again.release()
        await taken.release()
        assert (await stranger.acquire_writer("t")).fence == again.fence + 1
    finally:
        for store in (first, second, stranger):
            await store.aclose()


async def test_restore_on_start_after_a_kill_does_not_wait_for_the_old_lease(
    daemons: DaemonFactory,
) -> None:
    """``serve --thread T --restore-on-start``: the restart's first act takes the
    lease its killed predecessor left live, so the daemon serves at once."""
    first = daemons.start(extra=("--thread", "t-loop"))
    make_tree(first.workspace, seed=5, files=10)
    async with first.client() as client:
        done = await client.capture("t-loop")
    for n in range(12):
        (first.workspace / f"big-{n}.bin").write_bytes(os.urandom(3 << 20))
    await _kill_mid_capture(first, "t-loop")
    await _assert_lease_left_live(first.store, "t-loop")

    began = time.monotonic()
    again = daemons.start(
        workspace=first.workspace,
        data_dir=first.data_dir,
        store=first.store,
        extra=("--thread", "t-loop", "--restore-on-start"),
    )
    serving_after = time.monotonic() - began
    async with again.client() as client:
        head = await client.get_head("t-loop")
        assert head is not None
        # Nothing was lost: the workspace (which differs from the head) was kept,
        # captured first or left as it is.
        assert (first.workspace / "big-0.bin").exists()
        listed = await client.list_checkpoints("t-loop")
        assert [c.id for c in listed][0] == done.checkpoint.id
        # The restart captured the differing workspace under the old lease's thread.
        assert head != done.checkpoint.id and listed[-1].label == "before-restore"
    assert serving_after < 30
