"""Nothing outside the workspace is ever created, changed or deleted by a restore:
hostile manifests, directories swapped for symlinks before or during the restore,
and links that point outside."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import blake3
import pytest

from checkpointd.blobs.packs import packed_blobs
from checkpointd.capture import CaptureOptions, capture_checkpoint
from checkpointd.errors import INVALID_PATH, SandboxSnapshotError
from checkpointd.model import Checkpoint, DirEntry, FileEntry, SymlinkEntry
from checkpointd.progress import Progress
from checkpointd.restore import RestoreOptions, restore_checkpoint

from .conftest import lexists, snapshot_tree, write_tree

PAYLOAD = b"written by a hostile manifest"
PAYLOAD_KEY = "sandbox-files/blake3/" + blake3.blake3(PAYLOAD).hexdigest()


class HostileStore:
    """A real store, except that the thread's head is a checkpoint the store
    itself would refuse (stores validate on append, so it must be served here)."""

    def __init__(self, inner: Any, hostile: Checkpoint) -> None:
        self._inner = inner
        self._hostile = hostile

    async def get_head(self, thread_id: str) -> str | None:
        return self._hostile.id

    async def get(self, checkpoint_id: str) -> Checkpoint | None:
        return self._hostile if checkpoint_id == self._hostile.id else None

    async def acquire_writer(self, thread_id: str) -> Any:
        return await self._inner.acquire_writer(thread_id)


def _outside_state(outside: Path) -> tuple[Any, ...]:
    info = outside.lstat()
    return (info.st_mode, info.st_mtime_ns, snapshot_tree(outside))


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory next to the workspace that must never change."""
    path = tmp_path / "outside"
    write_tree(path, {"x": b"outside x", "victim.txt": b"do not touch", "sub/stale.txt": b"s"})
    os.chmod(path / "victim.txt", 0o644)
    return path


@pytest.mark.parametrize(
    "bad_path",
    [
        "../x",
        "/etc/x",
        "a/../../x",
        "../outside/victim.txt",
        "a/./b",
        "a//b",
        "a\\..\\x",
        ".checkpointd-staging-x/f",
    ],
)
async def test_hostile_paths_are_refused_before_anything_changes(
    memory_store: Any,
    memory_blobs: Any,
    tmp_path: Path,
    outside: Path,
    data_dir: Path,
    bad_path: str,
) -> None:
    workspace = tmp_path / "deep" / "workspace"
    workspace.mkdir(parents=True)
    write_tree(workspace, {"keep.txt": b"keep"})
    await memory_blobs.put(PAYLOAD_KEY, PAYLOAD)
    hostile = Checkpoint(
        id="evil",
        thread_id="t",
        parent_checkpoint_id=None,
        created_at=1,
        files=(
            DirEntry("a"),
            FileEntry("ok.txt", PAYLOAD_KEY, len(PAYLOAD)),
            FileEntry(bad_path, PAYLOAD_KEY, len(PAYLOAD)),
        ),
    )
    before_outside, before_ws = _outside_state(outside), snapshot_tree(workspace)
    with pytest.raises(SandboxSnapshotError) as caught:
        await restore_checkpoint(
            workspace,
            HostileStore(memory_store, hostile),
            memory_blobs,
            "t",
            RestoreOptions(data_dir=data_dir),
        )
    assert caught.value.code == INVALID_PATH
    assert _outside_state(outside) == before_outside
    assert snapshot_tree(workspace) == before_ws
    assert not (tmp_path / "x").exists() and not (tmp_path / "deep" / "x").exists()
    # The lease was released.
    lease = await memory_store.acquire_writer("t")
    await lease.release()


async def test_directory_swapped_for_symlink_before_restore(
    memory_store: Any, memory_blobs: Any, workspace: Path, outside: Path, data_dir: Path
) -> None:
    write_tree(workspace, {"sub/x": b"inside x", "sub/deeper/y": b"y", "top.txt": b"t"})
    await capture_checkpoint(
        workspace, memory_store, memory_blobs, "t", CaptureOptions(data_dir=data_dir)
    )
    # The sandbox replaces sub/ with a link to a directory outside, and adds one.
    for name in ("sub",):
        for child in sorted((workspace / name).rglob("*"), reverse=True):
            child.unlink() if child.is_file() else child.rmdir()
        (workspace / name).rmdir()
    (workspace / "sub").symlink_to(outside)
    (workspace / "extra").symlink_to(outside / "sub")
    before = _outside_state(outside)

    await restore_checkpoint(
        workspace, memory_store, memory_blobs, "t", RestoreOptions(data_dir=data_dir)
    )
    assert _outside_state(outside) == before
    assert not (workspace / "sub").is_symlink() and (workspace / "sub").is_dir()
    assert (workspace / "sub/x").read_bytes() == b"inside x"
    assert (workspace / "sub/deeper/y").read_bytes() == b"y"
    assert not lexists(workspace / "extra")


async def test_directory_swapped_for_symlink_during_restore(
    memory_store: Any, memory_blobs: Any, workspace: Path, outside: Path, data_dir: Path
) -> None:
    write_tree(
        workspace,
        {"sub/x": b"inside x", "sub/deeper/y": b"y", "sub/mode.txt": b"m", "top.txt": b"t"},
    )
    os.chmod(workspace / "sub/mode.txt", 0o600)
    os.chmod(workspace / "sub", 0o750)
    await capture_checkpoint(
        workspace, memory_store, memory_blobs, "t", CaptureOptions(data_dir=data_dir)
    )
    # Changes the restore will plan to undo inside sub/: a rewrite, a deletion
    # (outside has a stale.txt too), a mode and a directory mode.
    (workspace / "sub/x").write_bytes(b"changed")
    (workspace / "sub/stale.txt").write_bytes(b"stale")
    (workspace / "sub/deeper/new").write_bytes(b"new")
    os.chmod(workspace / "sub/mode.txt", 0o644)
    os.chmod(workspace / "sub", 0o755)
    write_tree(outside, {"mode.txt": b"m", "deeper/new": b"outside new"})
    os.chmod(outside / "mode.txt", 0o644)
    before = _outside_state(outside)
    swapped: list[str] = []

    def swap_when_apply_starts(report: Progress) -> None:
        # Runs after every blob was fetched and verified, before the first change.
        if report.phase == "apply" and not swapped:
            os.rename(workspace / "sub", workspace / "sub-moved")
            (workspace / "sub").symlink_to(outside)
            swapped.append("sub")

    await restore_checkpoint(
        workspace,
        memory_store,
        memory_blobs,
        "t",
        RestoreOptions(data_dir=data_dir, progress=swap_when_apply_starts),
    )
    assert swapped == ["sub"]
    assert _outside_state(outside) == before
    # The link standing where a directory must be was replaced by a real one and
    # the planned rewrite landed in it; what the plan took as unchanged is not
    # there (a restore assumes nobody writes meanwhile), and a second run fixes it.
    assert not (workspace / "sub").is_symlink()
    assert (workspace / "sub/x").read_bytes() == b"inside x"
    await restore_checkpoint(
        workspace, memory_store, memory_blobs, "t", RestoreOptions(data_dir=data_dir)
    )
    assert _outside_state(outside) == before
    assert (workspace / "sub/deeper/y").read_bytes() == b"y"
    assert (workspace / "sub/mode.txt").stat().st_mode & 0o777 == 0o600


async def test_checkpoint_with_links_pointing_outside(
    memory_store: Any, memory_blobs: Any, workspace: Path, outside: Path, data_dir: Path
) -> None:
    # First a normal checkpoint where d/link is a real directory.
    write_tree(workspace, {"d/link/file.txt": b"real dir content", "d/victim.txt": b"v"})
    normal = await capture_checkpoint(
        workspace, memory_store, memory_blobs, "t", CaptureOptions(data_dir=data_dir)
    )
    # Then one (made by hand: capture refuses such links) with links leaving the root.
    lease = await memory_store.acquire_writer("t")
    escaping = Checkpoint(
        id="escaping",
        thread_id="t",
        parent_checkpoint_id=normal.checkpoint.id,
        created_at=normal.checkpoint.created_at + 1,
        files=(
            DirEntry("d"),
            SymlinkEntry("d/link", "../../outside"),
            SymlinkEntry("d/victim.txt", str(outside / "victim.txt")),
            SymlinkEntry("abs", str(outside)),
        ),
    )
    await memory_store.append(escaping, normal.checkpoint.id, lease)
    await lease.release()
    before = _outside_state(outside)

    await restore_checkpoint(
        workspace, memory_store, memory_blobs, "t", RestoreOptions(data_dir=data_dir)
    )
    assert os.readlink(workspace / "d/link") == "../../outside"
    assert os.readlink(workspace / "d/victim.txt") == str(outside / "victim.txt")
    assert _outside_state(outside) == before

    # Back to the normal checkpoint: the links are replaced, never followed.
    await restore_checkpoint(
        workspace,
        memory_store,
        memory_blobs,
        "t",
        RestoreOptions(checkpoint_id=normal.checkpoint.id, data_dir=data_dir),
    )
    assert _outside_state(outside) == before
    assert (workspace / "d/link/file.txt").read_bytes() == b"real dir content"
    assert (workspace / "d/victim.txt").read_bytes() == b"v"
    assert not lexists(workspace / "abs")


async def test_capture_never_reads_outside_through_a_directory_swapped_mid_capture(
    memory_store: Any, memory_blobs: Any, workspace: Path, tmp_path: Path, data_dir: Path
) -> None:
    secret_place = tmp_path / "private"
    private = b"TOP-SECRET outside the workspace " * 50_000  # large: a streamed upload
    write_tree(secret_place, {"notes.txt": b"TOP-SECRET small", "big.bin": private})
    write_tree(
        workspace,
        {"sub/notes.txt": b"inside small", "sub/big.bin": b"i" * len(private), "top.txt": b"t"},
    )
    swapped: list[bool] = []

    def swap_before_uploads(report: Progress) -> None:
        # The scan read the real files; now sub/ points at a private directory
        # holding files of the same names.
        if report.phase == "upload" and not swapped:
            os.rename(workspace / "sub", tmp_path / "sub-moved")
            (workspace / "sub").symlink_to(secret_place)
            swapped.append(True)

    result = await capture_checkpoint(
        workspace,
        memory_store,
        memory_blobs,
        "t",
        CaptureOptions(data_dir=data_dir, progress=swap_before_uploads),
    )
    assert swapped
    stored = packed_blobs(memory_blobs, memory_store)
    keys = [info.key for info in await memory_blobs.list("sandbox-files/")]
    keys += [row.key for row in await memory_store.list_packed_blobs()]  # small blobs in packs
    assert keys
    for key in keys:
        assert b"TOP-SECRET" not in await stored.get(key)
    # Both files were read once, by the scan, before the swap: the small one's
    # bytes and the large one's open fd (of the file inside, whatever its
    # directory became) went to the upload.
    entries = {entry.path: entry for entry in result.checkpoint.files}
    assert "top.txt" in entries
    big = entries["sub/big.bin"]
    assert isinstance(big, FileEntry)
    assert await memory_blobs.get(big.blob_key) == b"i" * len(private)
    notes = entries["sub/notes.txt"]
    assert isinstance(notes, FileEntry)
    assert await packed_blobs(memory_blobs, memory_store).get(notes.blob_key) == b"inside small"
