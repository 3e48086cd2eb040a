"""safefs: descriptor-relative operations that never follow a symlink."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from checkpointd.safefs import SafeRoot, create_file

from .conftest import snapshot_tree, write_tree


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    path = tmp_path / "outside"
    write_tree(path, {"file": b"outside", "dir/inner": b"inner"})
    os.chmod(path / "file", 0o644)
    return path


@pytest.fixture
def root(tmp_path: Path, outside: Path) -> Path:
    path = tmp_path / "root"
    write_tree(path, {"real/file": b"inside"})
    (path / "linkdir").symlink_to(outside)
    (path / "linkfile").symlink_to(outside / "file")
    return path


def test_paths_through_a_symlinked_directory_are_absent(root: Path, outside: Path) -> None:
    before = snapshot_tree(outside)
    with SafeRoot(root) as safe:
        assert safe.dir_fd("linkdir") is None
        assert safe.lstat("linkdir/file") is None
        safe.remove("linkdir/file")
        safe.remove("linkdir/dir")
        safe.remove_leaf("linkdir/file")
        assert safe.remove_dir_if_empty("linkdir/dir")
        safe.chmod("linkdir/file", 0o777, is_dir=False)
        safe.chmod("linkdir/dir", 0o777, is_dir=True)
        safe.chmod("linkfile", 0o777, is_dir=False)
        safe.set_mtime("linkdir/file", 0)
        safe.set_mtime("linkfile", 0)  # the link's own time, not its target's
        lstat = safe.lstat("real/file")
        assert lstat is not None and lstat.st_size == 6
    assert snapshot_tree(outside) == before


def test_creating_beneath_a_symlink_replaces_the_link_not_its_target(
    root: Path, outside: Path
) -> None:
    before = snapshot_tree(outside)
    with SafeRoot(root) as safe:
        safe.ensure_dir("linkdir/new/deeper")
        staging, staging_fd = safe.make_staging()
        fd = create_file(staging_fd, "f")
        os.write(fd, b"new bytes")
        os.close(fd)
        safe.rename_into(staging_fd, "f", "linkfile")
        os.close(staging_fd)
        safe.remove_top_level(staging)
    assert snapshot_tree(outside) == before
    assert (root / "linkdir").is_dir() and not (root / "linkdir").is_symlink()
    assert (root / "linkdir/new/deeper").is_dir()
    assert (root / "linkfile").read_bytes() == b"new bytes"
    assert not (root / "linkfile").is_symlink()


def test_rename_over_a_directory_and_remove_trees(root: Path) -> None:
    write_tree(root, {"victim/a/b/c": b"c", "victim/d": b"d"})
    os.chmod(root / "victim/a", 0o500)
    with SafeRoot(root) as safe:
        staging, staging_fd = safe.make_staging()
        os.close(create_file(staging_fd, "f"))
        safe.rename_into(staging_fd, "f", "victim")
        assert safe.remove_dir_if_empty("real") is False  # holds a file
        safe.remove("real")
        os.close(staging_fd)
        assert safe.stale_staging_names() == [staging]
        safe.remove_top_level(staging)
        assert safe.stale_staging_names() == []
    assert (root / "victim").is_file()
    assert not (root / "real").exists()


def test_many_directories_do_not_exhaust_descriptors(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    before = len(os.listdir("/proc/self/fd"))
    with SafeRoot(root) as safe:
        for n in range(600):
            safe.ensure_dir(f"d{n % 30}/e{n}/f")
        assert len(os.listdir("/proc/self/fd")) < before + 200
    assert len(os.listdir("/proc/self/fd")) == before
    assert len(list(root.glob("*/*/f"))) == 600
