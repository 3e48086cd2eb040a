"""A SQLite store on a full filesystem (a real, tiny tmpfs): the write fails with
NO_SPACE naming the file (RESOURCE_EXHAUSTED on the wire, as a full blob
directory), changes nothing, and works once there is room again."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from checkpointd.errors import NO_SPACE, SandboxSnapshotError
from checkpointd.model import Checkpoint, FileEntry
from checkpointd.store import SqliteCheckpointStore
from checkpointd.testkit._support import file_key

from ..fixtures.tmpfs import small_tmpfs

FILES = 20_000


def _checkpoint(n: int, parent: str | None) -> Checkpoint:
    first = n * FILES
    return Checkpoint(
        id=f"c{n}",
        thread_id="t",
        parent_checkpoint_id=parent,
        created_at=n + 1,
        files=tuple(FileEntry(f"f{k:06d}", file_key(first + k), k) for k in range(FILES)),
    )


async def test_a_full_filesystem_is_no_space_naming_the_file(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "full", size="3m") as full:
        path = full / "store.db"
        store = await SqliteCheckpointStore.open(str(path))
        try:
            lease = await store.acquire_writer("t")
            head: str | None = None
            error: SandboxSnapshotError | None = None
            for n in range(20):  # each append adds ~1 MB of rows
                try:
                    await store.append(_checkpoint(n, head), head, lease)
                except SandboxSnapshotError as caught:
                    error = caught
                    break
                head = f"c{n}"
            assert error is not None, "the filesystem never filled"
            assert error.code == NO_SPACE
            assert error.details["path"] == str(path)
            assert str(path) in error.message and "free space" in error.message
            # Nothing of the failed append was kept.
            assert await store.get_head("t") == head
            assert await store.get(f"c{n}") is None

            await asyncio.to_thread(
                subprocess.run, ["mount", "-o", "remount,size=64m", str(full)], check=True
            )
            await store.append(_checkpoint(n, head), head, lease)
            assert await store.get_head("t") == f"c{n}"
            assert len((await store.get(f"c{n}")).files) == FILES
            await lease.release()
        finally:
            await store.aclose()


async def test_a_store_that_cannot_even_be_created_is_no_space(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "tiny", size="200k") as tiny:
        with pytest.raises(SandboxSnapshotError) as caught:
            await SqliteCheckpointStore.open(str(tiny / "store.db"))
        assert caught.value.code == NO_SPACE
        assert caught.value.details["path"] == str(tiny / "store.db")
