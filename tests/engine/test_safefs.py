"""safefs: descriptor-relative removal that never follows a symlink."""

from __future__ import annotations

from pathlib import Path

import pytest

from checkpointd._native import STAGING_PREFIX
from checkpointd.safefs import remove_stale_staging

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
