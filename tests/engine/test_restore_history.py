"""Restore history in the engine (docs/restore-history.md): what the stash
keeps out, an interrupted undo resumed, the longest thread id's stash, and the
base record's rules. Real SQLite stores and blob directories."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from checkpointd.capture import CaptureOptions, capture_checkpoint
from checkpointd.history import HistoryRestore, restore_with_history, undo_restore
from checkpointd.model import stash_thread_id
from checkpointd.progress import Progress
from checkpointd.statcache_paths import resolve_data_dir, stat_cache_path
from checkpointd.validation import MAX_ID_BYTES
from checkpointd.workspace_base import read_base, record_base

from .conftest import snapshot_tree, store_named_by_param, write_tree

store = pytest.fixture(params=["sqlite"], name="store")(store_named_by_param)


@pytest.fixture
def bucket(tmp_path: Path) -> Any:
    from checkpointd.blobs import open_blobs

    return open_blobs(f"file://{tmp_path / 'blobs'}")


async def _two(workspace: Path, store: Any, bucket: Any, thread: str, data_dir: Path) -> str:
    write_tree(workspace, {"a.txt": b"first\n", "keep/b.txt": b"b\n"})
    first = await capture_checkpoint(
        workspace, store, bucket, thread, CaptureOptions(data_dir=data_dir)
    )
    write_tree(workspace, {"a.txt": b"second\n"})
    await capture_checkpoint(workspace, store, bucket, thread, CaptureOptions(data_dir=data_dir))
    return first.checkpoint.id


async def test_a_leftover_staging_directory_stays_out_of_the_stash(
    workspace: Path, store: Any, bucket: Any, data_dir: Path
) -> None:
    first = await _two(workspace, store, bucket, "t", data_dir)
    # What a restore killed mid-staging leaves at the top of the tree.
    write_tree(workspace, {".checkpointd-staging-x1/0123": b"staged", "a.txt": b"live\n"})
    edited = snapshot_tree(workspace, with_mtime=False)
    done = await restore_with_history(
        workspace, store, bucket, HistoryRestore("t", first), data_dir=data_dir
    )
    assert done.stashed is not None
    paths = [entry.path for entry in done.stashed.checkpoint.files]
    assert not [path for path in paths if path.startswith(".checkpointd")]
    await undo_restore(workspace, store, bucket, HistoryRestore("t"), data_dir=data_dir)
    now = snapshot_tree(workspace, with_mtime=False)
    assert now == {k: v for k, v in edited.items() if not k.startswith(".checkpointd")}


async def test_an_interrupted_undo_resumes_the_same_undo(
    workspace: Path, store: Any, bucket: Any, data_dir: Path
) -> None:
    first = await _two(workspace, store, bucket, "t", data_dir)
    write_tree(workspace, {"a.txt": b"the edit\n", "new.txt": b"new\n"})
    edited = snapshot_tree(workspace, with_mtime=False)
    done = await restore_with_history(
        workspace, store, bucket, HistoryRestore("t", first), data_dir=data_dir
    )
    assert done.stashed is not None

    def stop_at_apply(report: Progress) -> None:
        if report.phase == "apply":
            task.cancel()  # after the stash, before the first change

    task = asyncio.ensure_future(
        undo_restore(
            workspace, store, bucket, HistoryRestore("t"), data_dir=data_dir, progress=stop_at_apply
        )
    )
    with pytest.raises(asyncio.CancelledError):
        await task
    stash = await store.list(stash_thread_id("t"))
    assert len(stash) == 2  # the undo's own stash entry is committed
    resumed = await undo_restore(workspace, store, bucket, HistoryRestore("t"), data_dir=data_dir)
    # The same undo: the first stash entry, not the entry the undo just made.
    assert resumed.restored is not None and resumed.restored.id == done.stashed.checkpoint.id
    assert resumed.stashed is not None and resumed.stashed.resumed
    assert snapshot_tree(workspace, with_mtime=False) == edited
    assert len(await store.list(stash_thread_id("t"))) == 2


async def test_the_longest_thread_id_has_a_stash(
    workspace: Path, store: Any, bucket: Any, data_dir: Path
) -> None:
    thread = "t" * MAX_ID_BYTES
    first = await _two(workspace, store, bucket, thread, data_dir)
    write_tree(workspace, {"a.txt": b"live\n"})
    done = await restore_with_history(
        workspace, store, bucket, HistoryRestore(thread, first), data_dir=data_dir
    )
    assert done.stashed is not None
    assert done.stashed.checkpoint.thread_id == thread + "~stash"
    await undo_restore(workspace, store, bucket, HistoryRestore(thread), data_dir=data_dir)
    assert (workspace / "a.txt").read_bytes() == b"live\n"


async def test_the_base_is_kept_beside_the_stat_cache_for_its_own_directory(
    workspace: Path, store: Any, bucket: Any, data_dir: Path, tmp_path: Path
) -> None:
    write_tree(workspace, {"a.txt": b"a\n"})
    captured = await capture_checkpoint(
        workspace, store, bucket, "t", CaptureOptions(data_dir=data_dir)
    )
    cache = stat_cache_path(resolve_data_dir(workspace, data_dir), workspace)
    base = read_base(cache, str(workspace))
    assert base is not None and (base.thread_id, base.checkpoint_id) == (
        "t",
        captured.checkpoint.id,
    )
    # Another directory at the same path (a new sandbox) has no base.
    _replace_directory(workspace, tmp_path / "old-workspace")
    assert read_base(cache, str(workspace)) is None
    # An unreadable record is no base either.
    record_base(cache, str(workspace), "t", captured.checkpoint.id)
    _write(Path(cache[: -len(".cache")] + ".base"), "{not json")
    assert read_base(cache, str(workspace)) is None


def _replace_directory(path: Path, aside: Path) -> None:
    os.rename(path, aside)
    path.mkdir()


def _write(path: Path, text: str) -> None:
    path.write_text(text)


async def test_a_large_edited_file_comes_back_whole(
    workspace: Path, store: Any, bucket: Any, data_dir: Path
) -> None:
    big = os.urandom(3 << 20)
    write_tree(workspace, {"big.bin": big, "a.txt": b"a\n"})
    first = await capture_checkpoint(
        workspace, store, bucket, "t", CaptureOptions(data_dir=data_dir)
    )
    edited = big[: 1 << 20] + os.urandom(4096) + big[(1 << 20) + 4096 :] + b"tail"
    write_tree(workspace, {"big.bin": edited})
    done = await restore_with_history(
        workspace, store, bucket, HistoryRestore("t", first.checkpoint.id), data_dir=data_dir
    )
    assert done.stashed is not None and (workspace / "big.bin").read_bytes() == big
    await undo_restore(workspace, store, bucket, HistoryRestore("t"), data_dir=data_dir)
    assert (workspace / "big.bin").read_bytes() == edited
