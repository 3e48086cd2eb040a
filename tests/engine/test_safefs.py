"""safefs: descriptor-relative access that never follows a symlink."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from checkpointd.safefs import STAGING_PREFIX, SafeRoot, remove_stale_staging

from .conftest import snapshot_tree, write_tree


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    path = tmp_path / "outside"
    write_tree(path, {"file": b"outside", "dir/inner": b"inner"})
    return path


@pytest.fixture
def root(tmp_path: Path, outside: Path) -> Path:
    path = tmp_path / "root"
    write_tree(path, {"real/file": b"inside"})
    (path / "linkdir").symlink_to(outside)
    (path / "linkfile").symlink_to(outside / "file")
    return path


def test_paths_through_a_symlinked_directory_are_absent(root: Path, outside: Path) -> None:
    with SafeRoot(root) as safe:
        assert safe.dir_fd("linkdir") is None
        assert safe.dir_fd("linkdir/dir") is None
        assert safe.parent_fd("linkdir/file") == (None, "file")
        assert safe.dir_fd("linkfile") is None  # a link to a file is no directory
        fd, name = safe.parent_fd("real/file")
        assert fd is not None and name == "file"
        assert os.stat(name, dir_fd=fd, follow_symlinks=False).st_size == len(b"inside")


def test_stale_staging_goes_and_nothing_else(root: Path, outside: Path) -> None:
    before_outside = snapshot_tree(outside)
    (root / f"{STAGING_PREFIX}dead").mkdir()
    write_tree(root / f"{STAGING_PREFIX}dead", {"a/b": b"half-restored"})
    (root / f"{STAGING_PREFIX}file").write_bytes(b"a file, not a staging dir")
    (root / f"{STAGING_PREFIX}link").symlink_to(outside)  # never followed
    assert remove_stale_staging(root) == [f"{STAGING_PREFIX}dead"]
    assert not (root / f"{STAGING_PREFIX}dead").exists()
    assert (root / f"{STAGING_PREFIX}file").is_file()
    assert (root / f"{STAGING_PREFIX}link").is_symlink()
    assert (root / "real" / "file").read_bytes() == b"inside"
    assert snapshot_tree(outside) == before_outside


def test_many_directories_do_not_exhaust_descriptors(tmp_path: Path) -> None:
    root = tmp_path / "root"
    for n in range(600):
        (root / f"d{n % 30}" / f"e{n}" / "f").mkdir(parents=True)
    before = len(os.listdir("/proc/self/fd"))
    with SafeRoot(root) as safe:
        for n in range(600):
            assert safe.dir_fd(f"d{n % 30}/e{n}/f") is not None
        assert len(os.listdir("/proc/self/fd")) < before + 200
    assert len(os.listdir("/proc/self/fd")) == before
