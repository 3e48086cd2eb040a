"""Restore never trusts or touches what it did not write itself:

- the stat cache learns only the inodes the restore renamed in, so a file a
  tool rewrites during the restore with an old mtime (``cp -p``, ``touch -d``)
  is hashed again by the next capture;
- a hard link planted in the workspace to an outside file never lets restore
  change that file's mode or mtime;
- a mount point inside the workspace is never entered or emptied;
- a ``workspace_subdir`` raced with a symlink swap never makes restore read,
  write or delete anything outside.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from checkpointd import _native
from checkpointd.blobs.packs import packed_blobs
from checkpointd.capture import CaptureOptions, capture_checkpoint
from checkpointd.errors import INVALID_PATH, SandboxSnapshotError
from checkpointd.model import FileEntry
from checkpointd.progress import Progress
from checkpointd.restore import RestoreOptions, restore_checkpoint

from .conftest import (
    PAST_NS,
    settle_before_record,
    snapshot_tree,
    wait_out_racy_window,
    write_tree,
)


def _blob_of(checkpoint: Any, path: str) -> str:
    entry = next(e for e in checkpoint.files if e.path == path)
    assert isinstance(entry, FileEntry)
    return entry.blob_key


@pytest.mark.parametrize("rewrite", ["cp-p", "touch-d"])
async def test_a_file_rewritten_during_restore_with_an_old_mtime_is_hashed_again(
    memory_store: Any,
    memory_blobs: Any,
    workspace: Path,
    tmp_path: Path,
    data_dir: Path,
    rewrite: str,
) -> None:
    write_tree(workspace, {"notes.txt": b"version one", "other.txt": b"other"})
    first = await capture_checkpoint(
        workspace, memory_store, memory_blobs, "t", CaptureOptions(data_dir=data_dir)
    )
    (workspace / "notes.txt").write_bytes(b"version two")
    await capture_checkpoint(
        workspace, memory_store, memory_blobs, "t", CaptureOptions(data_dir=data_dir)
    )
    # Same size as what the restore writes, and the mtime the restore sets.
    source = tmp_path / "tool-output.txt"
    source.write_bytes(b"tool output")
    os.utime(source, ns=(PAST_NS, PAST_NS))
    rewritten: list[str] = []

    def rewrite_after_apply(report: Progress) -> None:
        # After the files were renamed in, before the stat cache is written.
        if report.phase == "record" and not rewritten:
            target = workspace / "notes.txt"
            if rewrite == "cp-p":
                subprocess.run(["cp", "-p", str(source), str(target)], check=True)
            else:
                target.write_bytes(b"tool output")
                subprocess.run(["touch", "-d", f"@{PAST_NS // 10**9}", str(target)], check=True)
            rewritten.append(rewrite)

    await restore_checkpoint(
        workspace,
        memory_store,
        memory_blobs,
        "t",
        RestoreOptions(
            checkpoint_id=first.checkpoint.id, data_dir=data_dir, progress=rewrite_after_apply
        ),
    )
    assert rewritten == [rewrite]
    info = (workspace / "notes.txt").stat()
    assert info.st_mtime_ns == PAST_NS and info.st_size == len(b"version one")
    again = await capture_checkpoint(
        workspace, memory_store, memory_blobs, "t", CaptureOptions(data_dir=data_dir)
    )
    # The tool's bytes are captured, not the hash of what restore had written.
    assert _blob_of(again.checkpoint, "notes.txt") != _blob_of(first.checkpoint, "notes.txt")
    assert (
        await packed_blobs(memory_blobs, memory_store).get(_blob_of(again.checkpoint, "notes.txt"))
        == b"tool output"
    )
    # The file nobody touched keeps its recorded hash: only one file was hashed.
    assert again.stats.files_hashed == 1


async def test_restored_files_are_recorded_from_the_restores_own_writes(
    memory_store: Any, memory_blobs: Any, workspace: Path, tmp_path: Path, data_dir: Path
) -> None:
    write_tree(workspace, {f"d/{n}.txt": f"file {n}".encode() for n in range(30)})
    await capture_checkpoint(
        workspace, memory_store, memory_blobs, "t", CaptureOptions(data_dir=data_dir)
    )
    fresh = tmp_path / "fresh"
    await restore_checkpoint(
        fresh,
        memory_store,
        memory_blobs,
        "t",
        RestoreOptions(data_dir=data_dir, progress=settle_before_record),
    )
    wait_out_racy_window()
    again = await capture_checkpoint(
        fresh, memory_store, memory_blobs, "t", CaptureOptions(data_dir=data_dir)
    )
    assert (again.stats.files_hashed, again.stats.files_reused) == (0, 30)


async def test_a_hard_link_to_an_outside_file_keeps_its_mode_and_mtime(
    memory_store: Any, memory_blobs: Any, workspace: Path, tmp_path: Path, data_dir: Path
) -> None:
    write_tree(workspace, {"config.txt": b"shared bytes", "keep.txt": b"k"})
    os.chmod(workspace / "config.txt", 0o600)
    await capture_checkpoint(
        workspace, memory_store, memory_blobs, "t", CaptureOptions(data_dir=data_dir)
    )
    # Outside: a file with the same bytes but another mode and mtime; the
    # sandbox replaces config.txt with a hard link to it.
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim.txt"
    victim.write_bytes(b"shared bytes")
    os.chmod(victim, 0o644)
    os.utime(victim, ns=(PAST_NS + 7, PAST_NS + 7))
    (workspace / "config.txt").unlink()
    os.link(victim, workspace / "config.txt")
    before = victim.stat()

    await restore_checkpoint(
        workspace, memory_store, memory_blobs, "t", RestoreOptions(data_dir=data_dir)
    )
    after = victim.stat()
    assert (after.st_mode, after.st_mtime_ns, victim.read_bytes()) == (
        before.st_mode,
        before.st_mtime_ns,
        b"shared bytes",
    )
    restored = (workspace / "config.txt").stat()
    assert restored.st_ino != after.st_ino and restored.st_nlink == 1
    assert (restored.st_mode & 0o777, restored.st_mtime_ns) == (0o600, PAST_NS)


def _can_mount() -> bool:
    return os.geteuid() == 0 and shutil.which("mount") is not None


@pytest.mark.skipif(not _can_mount(), reason="mounting a tmpfs needs root")
async def test_a_mount_point_inside_the_workspace_is_never_emptied(
    memory_store: Any,
    memory_blobs: Any,
    workspace: Path,
    data_dir: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    write_tree(workspace, {"keep.txt": b"k"})
    checkpoint = await capture_checkpoint(
        workspace, memory_store, memory_blobs, "t", CaptureOptions(data_dir=data_dir)
    )
    assert [e.path for e in checkpoint.checkpoint.files] == ["keep.txt"]
    mount_point = workspace / "mnt"
    mount_point.mkdir()
    result = subprocess.run(  # noqa: ASYNC221
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
    try:
        write_tree(mount_point, {"precious.txt": b"on another filesystem", "sub/x": b"x"})
        before = snapshot_tree(mount_point)
        with caplog.at_level("WARNING", logger="checkpointd.restore"):
            await restore_checkpoint(
                workspace, memory_store, memory_blobs, "t", RestoreOptions(data_dir=data_dir)
            )
        assert snapshot_tree(mount_point) == before
        assert os.path.ismount(mount_point)  # noqa: ASYNC240
        assert any("mnt" in record.getMessage() for record in caplog.records)
    finally:
        subprocess.run(["umount", str(mount_point)], check=False)  # noqa: ASYNC221


# -- a sub-root raced with a symlink swap ------------------------------------

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_SYS_RENAMEAT2 = 316  # x86_64


def _renameat2() -> Any:
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="renameat2 syscall number is for x86_64")
async def test_a_subdir_swapped_for_a_symlink_never_reaches_outside(
    memory_store: Any, memory_blobs: Any, workspace: Path, tmp_path: Path, data_dir: Path
) -> None:
    sub = workspace / "sub"
    write_tree(sub, {"a.txt": b"inside a", "d/b.txt": b"inside b"})
    await capture_checkpoint(
        sub, memory_store, memory_blobs, "t", CaptureOptions(data_dir=data_dir)
    )
    outside = tmp_path / "outside"
    write_tree(outside, {"a.txt": b"OUTSIDE a", "d/b.txt": b"OUTSIDE b", "victim.txt": b"v"})
    os.chmod(outside / "victim.txt", 0o640)
    before = snapshot_tree(outside)
    names = ("a.txt", "d/b.txt", "victim.txt")
    for name in names:
        # atime == mtime: any read of these files from now on moves the atime.
        os.utime(outside / name, ns=(PAST_NS, PAST_NS))
    (workspace / "link").symlink_to(outside)
    # The sandbox keeps changing the inside, through a descriptor of the real
    # directory (so its own writes never land outside), so restores have work.
    sub_fd = os.open(sub, os.O_RDONLY | os.O_DIRECTORY)
    libc = _renameat2()
    stop = threading.Event()
    swaps = [0]

    def swap_forever() -> None:
        a, b = os.fsencode(sub), os.fsencode(workspace / "link")
        while not stop.is_set():
            if libc.syscall(_SYS_RENAMEAT2, _AT_FDCWD, a, _AT_FDCWD, b, _RENAME_EXCHANGE) == 0:
                swaps[0] += 1

    swapper = threading.Thread(target=swap_forever, daemon=True)
    swapper.start()
    outcomes: list[str] = []
    try:
        for _ in range(30):
            fd = os.open("a.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=sub_fd)
            os.write(fd, b"changed")
            os.close(fd)
            try:
                await restore_checkpoint(
                    workspace,
                    memory_store,
                    memory_blobs,
                    "t",
                    RestoreOptions(data_dir=data_dir, workspace_subdir="sub"),
                )
                outcomes.append("restored")
            except SandboxSnapshotError as error:
                assert error.code == INVALID_PATH
                outcomes.append("refused")
    finally:
        stop.set()
        swapper.join()
        os.close(sub_fd)
    assert swaps[0] > 0
    # Put the real directory back where it belongs before looking.
    if sub.is_symlink():
        libc.syscall(
            _SYS_RENAMEAT2,
            _AT_FDCWD,
            os.fsencode(sub),
            _AT_FDCWD,
            os.fsencode(workspace / "link"),
            _RENAME_EXCHANGE,
        )
    # Nothing outside was read (atimes), written or deleted.
    assert {n: (outside / n).stat().st_atime_ns for n in names} == dict.fromkeys(names, PAST_NS)
    assert snapshot_tree(outside) == before
    assert not [n for n in os.listdir(outside) if n.startswith(".checkpointd")]
    assert "restored" in outcomes or "refused" in outcomes


def test_subdir_symlink_is_refused_natively(workspace: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (workspace / "sub").symlink_to(outside)
    with pytest.raises(OSError) as caught:
        _native.RestoreSession(str(workspace), b"[]", subdir="sub")
    assert caught.value.filename == "sub"
    assert os.listdir(outside) == []


async def test_new_directories_move_in_whole_with_shared_blobs_and_modes(
    memory_store: Any, memory_blobs: Any, workspace: Path, tmp_path: Path, data_dir: Path
) -> None:
    same = b"the same bytes in many places"
    write_tree(
        workspace,
        {
            "top.txt": same,
            "new/a.txt": same,
            "new/deep/b.txt": same,
            "new/deep/link": "b.txt",
            "locked/c.txt": b"c",
            "old/d.txt": same,
        },
    )
    os.chmod(workspace / "locked", 0o555)
    os.chmod(workspace / "new/deep/b.txt", 0o600)
    before = snapshot_tree(workspace)
    await capture_checkpoint(
        workspace, memory_store, memory_blobs, "t", CaptureOptions(data_dir=data_dir)
    )
    # The live tree lacks new/ and locked/; a file stands where new/ must go.
    os.chmod(workspace / "locked", 0o755)
    shutil.rmtree(workspace / "new")
    shutil.rmtree(workspace / "locked")
    (workspace / "new").write_bytes(b"a file where a directory belongs")
    await restore_checkpoint(
        workspace,
        memory_store,
        memory_blobs,
        "t",
        RestoreOptions(data_dir=data_dir, progress=settle_before_record),
    )
    assert snapshot_tree(workspace) == before
    assert not [n for n in os.listdir(workspace) if n.startswith(".checkpointd")]
    wait_out_racy_window()
    again = await capture_checkpoint(
        workspace, memory_store, memory_blobs, "t", CaptureOptions(data_dir=data_dir)
    )
    # Every file restore wrote is known to the stat cache.
    assert again.stats.files_hashed == 0
    os.chmod(workspace / "locked", 0o755)


@pytest.mark.skipif(not _can_mount(), reason="mounting a tmpfs needs root")
async def test_a_full_workspace_fails_cleanly_and_a_later_run_succeeds(
    memory_store: Any, memory_blobs: Any, workspace: Path, tmp_path: Path, data_dir: Path
) -> None:
    from checkpointd.errors import NO_SPACE

    write_tree(workspace, {f"big-{n}.bin": os.urandom(1 << 20) for n in range(6)})
    write_tree(workspace, {"small.txt": b"s"})
    expected = snapshot_tree(workspace)
    await capture_checkpoint(
        workspace, memory_store, memory_blobs, "t", CaptureOptions(data_dir=data_dir)
    )
    target = tmp_path / "small-disk"
    target.mkdir()
    mounted = subprocess.run(  # noqa: ASYNC221
        ["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(target)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        (target / "kept.txt").write_bytes(b"was here before")
        before = snapshot_tree(target)
        with pytest.raises(SandboxSnapshotError) as caught:
            await restore_checkpoint(
                target, memory_store, memory_blobs, "t", RestoreOptions(data_dir=data_dir)
            )
        assert caught.value.code == NO_SPACE
        assert str(target) in str(caught.value)
        # Nothing half-written: staging is gone and the workspace is as it was.
        assert snapshot_tree(target) == before
        subprocess.run(  # noqa: ASYNC221
            ["mount", "-o", "remount,size=32m", str(target)], check=True
        )
        await restore_checkpoint(
            target, memory_store, memory_blobs, "t", RestoreOptions(data_dir=data_dir)
        )
        assert snapshot_tree(target) == expected
    finally:
        subprocess.run(["umount", str(target)], check=False)  # noqa: ASYNC221


_RESTORE_SCRIPT = """
import asyncio, sys
from checkpointd import RestoreOptions, open_blobs, open_store, restore_checkpoint

async def main(store_url, blobs_url, target, data_dir):
    store = await open_store(store_url)
    try:
        await restore_checkpoint(
            target, store, open_blobs(blobs_url), "t", RestoreOptions(data_dir=data_dir)
        )
    finally:
        await store.aclose()
    print("restored", flush=True)

asyncio.run(main(*sys.argv[1:5]))
"""


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace to watch the syscalls")
async def test_restored_data_is_synced_once_before_success(tmp_path: Path) -> None:
    import sys

    from checkpointd.blobs import open_blobs
    from checkpointd.store import open_store

    store_url, blobs_url = f"sqlite:///{tmp_path / 'store.db'}", f"file://{tmp_path / 'blobs'}"
    source, data_dir = tmp_path / "source", tmp_path / "data"
    write_tree(source, {f"d{n % 5}/f{n}.txt": os.urandom(100) for n in range(50)})
    write_tree(source, {"top.txt": b"top"})
    store = await open_store(store_url)
    try:
        await capture_checkpoint(
            source, store, open_blobs(blobs_url), "t", CaptureOptions(data_dir=data_dir)
        )
    finally:
        await store.aclose()
    trace = tmp_path / "trace.txt"
    target = tmp_path / "target"
    done = subprocess.run(  # noqa: ASYNC221
        ["strace", "-f", "-qq", "--seccomp-bpf", "-e", "trace=syncfs,renameat,renameat2"]
        + ["-o", str(trace)]
        + [sys.executable, "-c", _RESTORE_SCRIPT, store_url, blobs_url, str(target), str(data_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert snapshot_tree(target, with_mtime=False) == snapshot_tree(source, with_mtime=False)
    calls = [line for line in trace.read_text().splitlines() if "resumed" not in line]
    syncs = [i for i, line in enumerate(calls) if "syncfs(" in line]
    # (the stat cache, saved after the sync, is renamed into the data dir)
    renames = [i for i, line in enumerate(calls) if "rename" in line and str(data_dir) not in line]
    # One sync of the workspace's filesystem per restore (not one per file),
    # after the last file moved in.
    assert len(syncs) == 1
    assert renames and syncs[0] > max(renames)
