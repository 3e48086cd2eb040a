"""Restore over a tree that differs from the checkpoint in a few places: every
kind of difference is put right, and the work (bytes read from the packs) is
about what differs, not the whole tree (restore.py, rust/src/restore/plan.rs
``plan_encoded``, the short pack reads of ``_restore_fetch._pack_jobs``)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from checkpointd.blobs.packs import PACK_KEY_PREFIX
from checkpointd.capture import CaptureOptions, capture_checkpoint
from checkpointd.progress import Progress
from checkpointd.restore import RestoreOptions, restore_checkpoint
from checkpointd.statcache_paths import stat_cache_path

from .conftest import (
    BUCKETS,
    bucket_named_by_param,
    settle_before_record,
    snapshot_tree,
    wait_out_racy_window,
    write_tree,
)

bucket = pytest.fixture(params=BUCKETS, name="bucket")(bucket_named_by_param)


def _tree(files: int) -> dict[str, bytes | str]:
    # Incompressible, so the frames of a pack lie far apart.
    tree: dict[str, bytes | str] = {
        f"d{n % 40}/sub{n % 7}/f{n:04}.bin": os.urandom(3000 + n % 2000) for n in range(files)
    }
    tree["became-dir"] = b"a file in the checkpoint"
    tree["became-file/inner.txt"] = b"a directory in the checkpoint"
    tree["link"] = "d0/sub0/f0000.bin"
    tree["mode-only.sh"] = b"#!/bin/sh\n"
    tree["same-size.txt"] = b"0123456789"
    return tree


def _read_bytes() -> int:
    """Bytes this process has read through read(2)/pread(2) so far."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


async def test_a_restore_over_a_few_differences_puts_each_right_and_reads_little(
    store: Any, bucket: Any, tmp_path: Path, data_dir: Path
) -> None:
    workspace = tmp_path / "workspace"
    write_tree(workspace, _tree(3000))
    os.chmod(workspace / "mode-only.sh", 0o755)
    await capture_checkpoint(workspace, store, bucket, "t", CaptureOptions(data_dir=data_dir))
    expected = snapshot_tree(workspace)
    target = tmp_path / "target"
    restore_data = tmp_path / "restore-data"
    await restore_checkpoint(target, store, bucket, "t", RestoreOptions(data_dir=restore_data))
    assert snapshot_tree(target) == expected

    # One of each kind of difference.
    (target / "same-size.txt").write_bytes(b"9876543210")  # same size, other bytes
    os.chmod(target / "mode-only.sh", 0o644)  # mode only
    os.utime(target / "d1/sub1/f0001.bin", ns=(1, 1))  # mtime only
    (target / "became-dir").unlink()
    (target / "became-dir").mkdir()
    (target / "became-dir" / "stray.txt").write_bytes(b"not in the checkpoint")
    shutil.rmtree(target / "became-file")
    (target / "became-file").write_bytes(b"a file where a directory was")
    (target / "link").unlink()
    (target / "link").symlink_to("elsewhere")
    (target / "d2/sub2/f0002.bin").unlink()
    (target / "d3/extra.txt").write_bytes(b"not in the checkpoint either")
    # 5% of the files, every 20th in path order (the pack order): their
    # frames lie some 80 KB apart.
    for path in sorted(target.glob("d*/sub*/f*.bin"))[::20]:
        with path.open("ab") as appended:
            appended.write(b"appended")

    before = _read_bytes()
    await restore_checkpoint(target, store, bucket, "t", RestoreOptions(data_dir=restore_data))
    read = _read_bytes() - before
    assert snapshot_tree(target) == expected
    if not str(bucket.url).startswith("file://"):
        return
    # 150 blobs were needed out of 3,000 (~12 MB of packs): short reads
    # of about their frames, not the packs (the stat cache and the store
    # account for most of what was read).
    packs = sum(info.size for info in await bucket.list(PACK_KEY_PREFIX))
    assert packs > 10_000_000
    assert read < packs // 4, (read, packs)


async def test_a_restore_over_an_identical_tree_changes_nothing(
    store: Any, bucket: Any, tmp_path: Path, data_dir: Path
) -> None:
    workspace = tmp_path / "workspace"
    write_tree(workspace, _tree(200))
    await capture_checkpoint(workspace, store, bucket, "t", CaptureOptions(data_dir=data_dir))
    target = tmp_path / "target"
    await restore_checkpoint(
        target, store, bucket, "t", RestoreOptions(data_dir=tmp_path / "restore-data")
    )
    inodes = {path: os.lstat(path).st_ino for path in target.rglob("*")}
    await restore_checkpoint(
        target, store, bucket, "t", RestoreOptions(data_dir=tmp_path / "restore-data")
    )
    assert {path: os.lstat(path).st_ino for path in target.rglob("*")} == inodes
    assert snapshot_tree(target) == snapshot_tree(workspace)


async def test_a_restore_over_a_changed_tree_saves_the_stat_cache_once_with_what_it_saw_and_wrote(
    store: Any, bucket: Any, tmp_path: Path, data_dir: Path
) -> None:
    # The live scan keeps its stat cache in memory and the restore saves it
    # once, after the last write, with the writes merged in: the file is
    # untouched until then, and a capture right after trusts both the files
    # the restore left alone (seen by its live scan) and those it wrote.
    workspace = tmp_path / "workspace"
    write_tree(workspace, _tree(300))
    await capture_checkpoint(workspace, store, bucket, "t", CaptureOptions(data_dir=data_dir))
    target = tmp_path / "target"
    restore_data = tmp_path / "restore-data"
    await restore_checkpoint(
        target,
        store,
        bucket,
        "t",
        RestoreOptions(data_dir=restore_data, progress=settle_before_record),
    )
    changed = sorted(target.glob("d*/sub*/f*.bin"))[::30]
    for path in changed:
        with path.open("ab") as appended:
            appended.write(b"appended")
    (target / "d3/extra.txt").write_bytes(b"not in the checkpoint")
    wait_out_racy_window()
    cache = stat_cache_path(restore_data, target)
    before = os.stat(cache)
    seen: dict[str, os.stat_result] = {}

    def hook(report: Progress) -> None:
        if report.phase in ("apply", "record") and report.phase not in seen:
            seen[report.phase] = os.stat(cache)
        settle_before_record(report)

    await restore_checkpoint(
        target, store, bucket, "t", RestoreOptions(data_dir=restore_data, progress=hook)
    )
    assert snapshot_tree(target) == snapshot_tree(workspace)
    for phase in ("apply", "record"):
        kept = (seen[phase].st_ino, seen[phase].st_mtime_ns)
        assert kept == (before.st_ino, before.st_mtime_ns), phase
    assert os.stat(cache).st_ino != before.st_ino
    wait_out_racy_window()
    again = await capture_checkpoint(
        target, store, bucket, "t", CaptureOptions(data_dir=restore_data)
    )
    assert again.stats.files_hashed == 0
    assert again.stats.files_reused == len(_tree(300)) - 1  # all but the symlink
