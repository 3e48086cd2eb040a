"""Capture's rules: leases, unsupported entries, data dir, ids, clocks, files that
change under the capture, cancellation."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import blake3
import pytest

from checkpointd import _native
from checkpointd.blobs import open_blobs
from checkpointd.blobs.packs import packed_blobs
from checkpointd.capture import FILE_CHANGED, CaptureOptions, capture_checkpoint
from checkpointd.errors import (
    MISSING_CHECKPOINT,
    UNSUPPORTED_ENTRY,
    SandboxCheckpointInvalidArgumentError,
    SandboxCheckpointInvalidIdError,
    SandboxCheckpointWriterConflictError,
    SandboxSnapshotError,
)
from checkpointd.model import FileEntry, Policy
from checkpointd.progress import Progress
from checkpointd.restore import RestoreOptions, restore_checkpoint
from checkpointd.store import open_store

from .conftest import write_tree
from .hooks import BeforeUpload


def _key(data: bytes) -> str:
    return "sandbox-files/blake3/" + blake3.blake3(data).hexdigest()


class SlowPuts:
    """The real blob store, with every put taking ``delay`` seconds longer."""

    def __init__(self, inner: Any, delay: float) -> None:
        self._inner = inner
        self._delay = delay
        self.url = inner.url
        self.put_started = asyncio.Event()

    async def put(self, key: str, data: Any, *, if_absent: bool = True) -> bool:
        self.put_started.set()
        await asyncio.sleep(self._delay)
        return bool(await self._inner.put(key, data, if_absent=if_absent))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


async def test_writer_conflict_fails_fast_for_capture_and_restore(
    store: Any, memory_blobs: Any, workspace: Path, data_dir: Path
) -> None:
    lease = await store.acquire_writer("t")
    try:
        with pytest.raises(SandboxCheckpointWriterConflictError):
            await capture_checkpoint(
                workspace, store, memory_blobs, "t", CaptureOptions(data_dir=data_dir)
            )
        with pytest.raises(SandboxCheckpointWriterConflictError):
            await restore_checkpoint(
                workspace, store, memory_blobs, "t", RestoreOptions(data_dir=data_dir)
            )
    finally:
        await lease.release()
    await capture_checkpoint(workspace, store, memory_blobs, "t", CaptureOptions(data_dir=data_dir))


async def test_unsupported_entries_are_all_listed_unless_excluded(
    memory_store: Any, memory_blobs: Any, workspace: Path, tmp_path: Path, data_dir: Path
) -> None:
    write_tree(workspace, {"ok.txt": b"ok", "links/out": "../../elsewhere", "links/abs": "/etc"})
    os.mkfifo(workspace / "pipe")
    with pytest.raises(SandboxSnapshotError) as caught:
        await capture_checkpoint(
            workspace, memory_store, memory_blobs, "t", CaptureOptions(data_dir=data_dir)
        )
    assert caught.value.code == UNSUPPORTED_ENTRY
    assert sorted(caught.value.details["paths"]) == ["links/abs", "links/out", "pipe"]
    for path in ("links/abs", "links/out", "pipe"):
        assert path in str(caught.value)
    assert await memory_store.get_head("t") is None

    policy = Policy(exclude=("links/", "pipe"))
    result = await capture_checkpoint(
        workspace, memory_store, memory_blobs, "t", CaptureOptions(policy=policy, data_dir=data_dir)
    )
    assert [entry.path for entry in result.checkpoint.files] == ["ok.txt"]


async def test_data_dir_inside_the_workspace_is_refused(
    memory_store: Any, memory_blobs: Any, workspace: Path, tmp_path: Path
) -> None:
    (tmp_path / "via-link").symlink_to(workspace)
    for data_dir in (workspace, workspace / "state", tmp_path / "via-link" / "state"):
        with pytest.raises(SandboxCheckpointInvalidArgumentError):
            await capture_checkpoint(
                workspace, memory_store, memory_blobs, "t", CaptureOptions(data_dir=data_dir)
            )
        with pytest.raises(SandboxCheckpointInvalidArgumentError):
            await restore_checkpoint(
                workspace, memory_store, memory_blobs, "t", RestoreOptions(data_dir=data_dir)
            )
    assert not (workspace / "state").exists()


@pytest.mark.parametrize("bad", ["", "\ud800"])
async def test_invalid_ids(
    memory_store: Any, memory_blobs: Any, workspace: Path, data_dir: Path, bad: str
) -> None:
    with pytest.raises(SandboxCheckpointInvalidIdError):
        await capture_checkpoint(
            workspace, memory_store, memory_blobs, bad, CaptureOptions(data_dir=data_dir)
        )
    with pytest.raises(SandboxCheckpointInvalidIdError):
        await restore_checkpoint(
            workspace, memory_store, memory_blobs, bad, RestoreOptions(data_dir=data_dir)
        )
    with pytest.raises(SandboxCheckpointInvalidIdError):
        await restore_checkpoint(
            workspace,
            memory_store,
            memory_blobs,
            "t",
            RestoreOptions(checkpoint_id=bad, data_dir=data_dir),
        )


async def test_missing_checkpoint_unknown_or_of_another_thread(
    memory_store: Any, memory_blobs: Any, workspace: Path, data_dir: Path
) -> None:
    other = await capture_checkpoint(
        workspace, memory_store, memory_blobs, "other", CaptureOptions(data_dir=data_dir)
    )
    for thread, checkpoint_id in (("t", "nope"), ("t", other.checkpoint.id), ("other", "nope")):
        with pytest.raises(SandboxSnapshotError) as caught:
            await restore_checkpoint(
                workspace,
                memory_store,
                memory_blobs,
                thread,
                RestoreOptions(checkpoint_id=checkpoint_id, data_dir=data_dir),
            )
        assert caught.value.code == MISSING_CHECKPOINT


async def test_ids_are_uuid7_and_created_at_never_below_the_parent(
    memory_store: Any, memory_blobs: Any, workspace: Path, data_dir: Path
) -> None:
    first = await capture_checkpoint(
        workspace,
        memory_store,
        memory_blobs,
        "t",
        CaptureOptions(data_dir=data_dir, now=lambda: 5_000),
    )
    assert first.checkpoint.created_at == 5_000
    assert first.checkpoint.id[14] == "7" and len(first.checkpoint.id) == 36
    # A clock that went backwards still yields a later checkpoint.
    second = await capture_checkpoint(
        workspace,
        memory_store,
        memory_blobs,
        "t",
        CaptureOptions(data_dir=data_dir, now=lambda: 1_000),
    )
    assert second.checkpoint.created_at == 5_001
    assert [c.id for c in await memory_store.list("t")] == [
        first.checkpoint.id,
        second.checkpoint.id,
    ]


async def test_a_retry_with_the_same_checkpoint_id_returns_the_first(
    memory_store: Any, memory_blobs: Any, workspace: Path, data_dir: Path
) -> None:
    write_tree(workspace, {"a": b"a"})
    first = await capture_checkpoint(
        workspace,
        memory_store,
        memory_blobs,
        "t",
        CaptureOptions(data_dir=data_dir, checkpoint_id="req-1"),
    )
    (workspace / "a").write_bytes(b"changed")
    again = await capture_checkpoint(
        workspace,
        memory_store,
        memory_blobs,
        "t",
        CaptureOptions(data_dir=data_dir, checkpoint_id="req-1"),
    )
    assert again.checkpoint == first.checkpoint
    assert again.stats.blobs_uploaded == 0
    assert await memory_store.get_head("t") == "req-1"
    assert len(await memory_store.list("t")) == 1


async def test_file_changed_during_upload_is_hashed_again_never_stored_torn(
    memory_store: Any, memory_blobs: Any, workspace: Path, tmp_path: Path, data_dir: Path
) -> None:
    # Every file is read once, by the scan: a small file's zeroed bytes, and a
    # large file's open fd, go to the upload. A later change cannot tear a small
    # file's stored bytes (the checkpoint holds them as they were read); a large
    # file rewritten before its upload read the fd again fails the fd's fstat
    # check, is hashed again, and never stored torn.
    small_old, big_old = b"small before", os.urandom(7 << 20)
    write_tree(workspace, {"small.txt": small_old, "big.bin": big_old, "gone.txt": b"gone"})
    small_new, big_new = b"small after the scan", os.urandom(7 << 20)

    def change_small(report: Progress) -> None:
        if report.phase == "upload" and (workspace / "small.txt").read_bytes() == small_old:
            (workspace / "small.txt").write_bytes(small_new)

    def change_big(keys: list[str]) -> None:
        if _key(big_old) in keys and (workspace / "big.bin").read_bytes() == big_old:
            (workspace / "big.bin").write_bytes(big_new)

    blobs = BeforeUpload(memory_blobs, change_big)
    result = await capture_checkpoint(
        workspace,
        memory_store,
        blobs,
        "t",
        CaptureOptions(data_dir=data_dir, progress=change_small),
    )
    files = {e.path: e for e in result.checkpoint.files if isinstance(e, FileEntry)}
    assert set(files) == {"small.txt", "big.bin", "gone.txt"}
    assert files["small.txt"].blob_key == _key(small_old)
    assert await packed_blobs(memory_blobs, memory_store).get(_key(small_old)) == small_old
    assert files["big.bin"].blob_key == _key(big_new)
    # The scanned large bytes no longer exist anywhere; nothing was stored under their key.
    assert await packed_blobs(memory_blobs, memory_store).head(_key(big_old)) is None
    restored = tmp_path / "restored"
    await restore_checkpoint(
        restored, memory_store, memory_blobs, "t", RestoreOptions(data_dir=data_dir)
    )
    assert (restored / "small.txt").read_bytes() == small_old
    assert (restored / "big.bin").read_bytes() == big_new


async def test_file_that_keeps_changing_is_reported(
    memory_store: Any, memory_blobs: Any, workspace: Path, data_dir: Path
) -> None:
    # Large: its upload reads the fd again (a small file is read once by the
    # scan, so a change after that cannot reach its stored bytes).
    write_tree(workspace, {"busy.log": b"x" * (2 << 20) + b"line 0\n"})
    lines = [0]

    def keep_writing(_keys: list[str]) -> None:
        lines[0] += 1
        with open(workspace / "busy.log", "ab") as handle:
            handle.write(f"line {lines[0]}\n".encode())

    blobs = BeforeUpload(memory_blobs, keep_writing)
    with pytest.raises(SandboxSnapshotError) as caught:
        await capture_checkpoint(
            workspace, memory_store, blobs, "t", CaptureOptions(data_dir=data_dir)
        )
    assert caught.value.code == FILE_CHANGED
    assert caught.value.details["paths"] == ["busy.log"]
    assert await memory_store.get_head("t") is None


async def test_lease_is_renewed_while_uploads_take_longer_than_it_lasts(
    tmp_path: Path, workspace: Path, data_dir: Path
) -> None:
    write_tree(workspace, {f"f{n}": f"content {n}".encode() for n in range(3)})
    async with await open_store(
        f"sqlite:///{tmp_path / 's.db'}", lease_duration_ms=1000, renew_after_ms=100
    ) as store:
        blobs = SlowPuts(open_blobs("memory://"), delay=1.5)
        result = await capture_checkpoint(
            workspace, store, blobs, "t", CaptureOptions(data_dir=data_dir)
        )
        assert result.stats.blobs_uploaded == 3
        assert result.stats.duration_ms >= 1500
        assert await store.get_head("t") == result.checkpoint.id


async def test_cancelled_capture_releases_its_lease_and_appends_nothing(
    memory_store: Any, workspace: Path, data_dir: Path
) -> None:
    write_tree(workspace, {"a": b"a"})
    blobs = SlowPuts(open_blobs("memory://"), delay=30)
    task = asyncio.create_task(
        capture_checkpoint(workspace, memory_store, blobs, "t", CaptureOptions(data_dir=data_dir))
    )
    await asyncio.wait_for(blobs.put_started.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await memory_store.get_head("t") is None
    lease = await memory_store.acquire_writer("t")  # not held any more
    await lease.release()


async def test_a_cancelled_token_stops_the_capture(
    memory_store: Any, memory_blobs: Any, workspace: Path, data_dir: Path
) -> None:
    write_tree(workspace, {f"f{n}": b"x" * n for n in range(50)})
    token = _native.CancelToken()
    token.cancel()
    with pytest.raises(_native.ScanCancelled):
        await capture_checkpoint(
            workspace,
            memory_store,
            memory_blobs,
            "t",
            CaptureOptions(data_dir=data_dir, cancel=token),
        )
    assert await memory_store.get_head("t") is None
    lease = await memory_store.acquire_writer("t")
    await lease.release()


async def test_progress_reports_every_phase_in_order(
    memory_store: Any, memory_blobs: Any, workspace: Path, tmp_path: Path, data_dir: Path
) -> None:
    write_tree(workspace, {"a.txt": b"a" * 10, "b/c.txt": b"c" * 20})
    reports: list[Progress] = []
    await capture_checkpoint(
        workspace,
        memory_store,
        memory_blobs,
        "t",
        CaptureOptions(data_dir=data_dir, progress=reports.append),
    )
    phases = list(dict.fromkeys(report.phase for report in reports))
    assert phases == ["lease", "scan", "pin", "upload", "append"]
    upload = next(report for report in reports if report.phase == "upload")
    assert (upload.files_total, upload.bytes_total) == (2, 30)

    reports.clear()
    await restore_checkpoint(
        tmp_path / "restored",
        memory_store,
        memory_blobs,
        "t",
        RestoreOptions(data_dir=data_dir, progress=reports.append),
    )
    await asyncio.sleep(0)  # reports made in worker threads reach the loop
    phases = list(dict.fromkeys(report.phase for report in reports))
    assert phases == ["lease", "resolve", "plan", "fetch", "apply", "record"]
    fetch = next(report for report in reports if report.phase == "fetch")
    assert (fetch.files_total, fetch.bytes_total) == (2, 30)


async def test_restore_apply_progress_counts_files_and_bytes_written(
    memory_store: Any, memory_blobs: Any, workspace: Path, data_dir: Path
) -> None:
    """Apply reports files (and symlinks) put in place and their bytes, with
    totals from its first event, never operations: deletions, directories and
    modes of files already right are not counted. Files that move in with a
    new directory count like files renamed in one by one."""
    write_tree(
        workspace,
        {
            "same.txt": b"s" * 7,
            "mode.txt": b"m" * 5,
            "old/a.txt": b"a" * 100,
            "old/b.txt": b"b" * 200,
            "fresh/x/y.txt": b"y" * 3000,
            "fresh/z.txt": b"z" * 40,
            "link": "same.txt",
        },
    )
    await capture_checkpoint(
        workspace, memory_store, memory_blobs, "t", CaptureOptions(data_dir=data_dir)
    )
    (workspace / "old/a.txt").write_bytes(b"changed")
    (workspace / "old/b.txt").unlink()
    (workspace / "mode.txt").chmod(0o600)
    (workspace / "link").unlink()
    (workspace / "extra.txt").write_bytes(b"deleted by the restore")
    for path in ("fresh/x/y.txt", "fresh/z.txt"):
        (workspace / path).unlink()
    (workspace / "fresh/x").rmdir()
    (workspace / "fresh").rmdir()

    reports: list[Progress] = []
    await restore_checkpoint(
        workspace,
        memory_store,
        memory_blobs,
        "t",
        RestoreOptions(data_dir=data_dir, progress=reports.append),
    )
    await asyncio.sleep(0)  # reports made in worker threads reach the loop
    apply = [report for report in reports if report.phase == "apply"]
    written = 100 + 200 + 3000 + 40  # old/a, old/b, fresh/x/y, fresh/z; the link has none
    assert (apply[0].files_done, apply[0].bytes_done) == (0, 0)
    assert (apply[0].files_total, apply[0].bytes_total) == (5, written)
    assert (apply[-1].files_done, apply[-1].bytes_done) == (5, written)
    for earlier, later in zip(apply, apply[1:], strict=False):
        assert earlier.files_done <= later.files_done <= 5
        assert earlier.bytes_done <= later.bytes_done <= written
    assert (workspace / "fresh/x/y.txt").read_bytes() == b"y" * 3000
    assert os.readlink(workspace / "link") == "same.txt"
    assert not (workspace / "extra.txt").exists()


async def test_default_data_dir_is_under_the_home_state_directory(
    memory_store: Any,
    memory_blobs: Any,
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    write_tree(workspace, {"a": b"a"})
    await capture_checkpoint(workspace, memory_store, memory_blobs, "t")
    # One stat cache (beside it, the workspace's base: docs/restore-history.md).
    caches = list((tmp_path / "home/.local/state/checkpointd/statcache").glob("*.cache"))
    assert len(caches) == 1 and caches[0].stat().st_size > 0


async def test_cancelling_during_the_scan_stops_it_and_releases_the_lease(
    memory_store: Any, memory_blobs: Any, workspace: Path, data_dir: Path
) -> None:
    write_tree(workspace, {f"f{n}.bin": bytes([n]) * (1 << 20) for n in range(64)})
    tasks: list[asyncio.Task[Any]] = []

    def cancel_when_scanning(report: Progress) -> None:
        if report.phase == "scan":
            tasks[0].cancel()

    tasks.append(
        asyncio.create_task(
            capture_checkpoint(
                workspace,
                memory_store,
                memory_blobs,
                "t",
                CaptureOptions(data_dir=data_dir, progress=cancel_when_scanning),
            )
        )
    )
    with pytest.raises(asyncio.CancelledError):
        await tasks[0]
    assert await memory_store.get_head("t") is None
    assert await memory_blobs.list("sandbox-files/") == []
    lease = await memory_store.acquire_writer("t")
    await lease.release()
