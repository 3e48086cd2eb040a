"""Removing what interrupted restores left: only staging directories, never
through a symlink, never a running restore's."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from checkpointd import _native
from checkpointd._native import STAGING_PREFIX


def _tree(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def _snapshot(root: Path) -> dict[str, bytes | str]:
    out: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = "-> " + os.readlink(path)
        elif path.is_file():
            out[rel] = path.read_bytes()
        else:
            out[rel] = "dir"
    return out


def test_stale_staging_goes_and_nothing_else(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    _tree(outside, {"file": b"outside", "dir/inner": b"inner"})
    root = tmp_path / "root"
    _tree(root, {"real/file": b"inside", f"{STAGING_PREFIX}dead/t/a/b": b"half-restored"})
    (root / f"{STAGING_PREFIX}dead" / "t" / "a").chmod(0o500)  # emptied all the same
    (root / f"{STAGING_PREFIX}file").write_bytes(b"a file, not a staging dir")
    (root / f"{STAGING_PREFIX}link").symlink_to(outside)  # never followed
    (root / "linkdir").symlink_to(outside)
    before_outside = _snapshot(outside)

    assert _native.remove_stale_staging(root) == [f"{STAGING_PREFIX}dead"]

    assert not (root / f"{STAGING_PREFIX}dead").exists()
    assert (root / f"{STAGING_PREFIX}file").read_bytes() == b"a file, not a staging dir"
    assert (root / f"{STAGING_PREFIX}link").is_symlink()
    assert (root / "real" / "file").read_bytes() == b"inside"
    assert _snapshot(outside) == before_outside


def test_a_locked_staging_directory_is_a_running_restores(tmp_path: Path) -> None:
    held = tmp_path / f"{STAGING_PREFIX}running"
    _tree(held, {"t/file": b"being restored"})
    fd = os.open(held, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert _native.remove_stale_staging(tmp_path) == []
        assert (held / "t" / "file").read_bytes() == b"being restored"
    finally:
        os.close(fd)  # the restore ended (or died): its lock went with it
    assert _native.remove_stale_staging(tmp_path) == [held.name]
    assert not held.exists()


def test_a_missing_root_is_an_error_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    try:
        _native.remove_stale_staging(missing)
    except OSError as error:
        assert str(missing) in str(error)
    else:
        raise AssertionError("a missing root must raise")
