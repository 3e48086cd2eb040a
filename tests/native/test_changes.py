"""Every kind of change between two scans is seen, and only changed files are re-hashed."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import blake3
import pytest

from checkpointd import _native
from checkpointd.codec import decode_entries
from checkpointd.model import DirEntry, FileEntry, SecretSpan, SymlinkEntry

from .reference import age_tree


def make_tree(root: Path) -> None:
    (root / "src").mkdir()
    (root / "src" / "main.py").write_bytes(b"print('hello')\n")
    (root / "src" / "util.py").write_bytes(b"def f():\n    return 1\n")
    (root / "docs").mkdir()
    (root / "docs" / "readme.md").write_bytes(b"# readme\n")
    (root / "empty").mkdir()
    (root / "tool.sh").write_bytes(b"#!/bin/sh\necho hi\n")
    (root / "tool.sh").chmod(0o755)


def entries_by_path(result: _native.ScanResult) -> dict[str, object]:
    return {entry.path: entry for entry in decode_entries(result.manifest)}


def scan_pair(
    root: Path, cache: str, change: Callable[[Path], object]
) -> tuple[_native.ScanResult, _native.ScanResult]:
    make_tree(root)
    age_tree(str(root))
    first = _native.scan(str(root), cache_path=cache)
    assert first.files_hashed == 4
    change(root)
    second = _native.scan(str(root), cache_path=cache)
    return first, second


def same_size_same_mtime_content(root: Path) -> None:
    path = root / "src" / "main.py"
    before = path.stat()
    path.write_bytes(b"print('HELLO')\n")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_size == before.st_size
    assert path.stat().st_mtime_ns == before.st_mtime_ns


def test_content_with_same_size_and_mtime_is_detected_by_ctime(
    workspace: Path, cache_path: str
) -> None:
    first, second = scan_pair(workspace, cache_path, same_size_same_mtime_content)
    before, after = entries_by_path(first), entries_by_path(second)
    assert isinstance(after["src/main.py"], FileEntry)
    assert after["src/main.py"].blob_key.endswith(blake3.blake3(b"print('HELLO')\n").hexdigest())
    assert after["src/main.py"] != before["src/main.py"]
    assert second.files_hashed == 1
    assert second.files_reused == 3


def test_mode_change(workspace: Path, cache_path: str) -> None:
    first, second = scan_pair(workspace, cache_path, lambda r: (r / "src" / "util.py").chmod(0o700))
    after = entries_by_path(second)["src/util.py"]
    assert isinstance(after, FileEntry) and after.mode == 0o700
    assert entries_by_path(first)["src/util.py"].mode == 0o644  # type: ignore[attr-defined]


def test_directory_mode_change_drops_special_bits(workspace: Path, cache_path: str) -> None:
    _, second = scan_pair(workspace, cache_path, lambda r: (r / "empty").chmod(0o3711))
    assert entries_by_path(second)["empty"] == DirEntry("empty", 0o711)


def test_new_file(workspace: Path, cache_path: str) -> None:
    _, second = scan_pair(
        workspace, cache_path, lambda r: (r / "docs" / "new.txt").write_bytes(b"new")
    )
    assert "docs/new.txt" in entries_by_path(second)
    assert second.files_hashed == 1
    assert second.bytes_hashed == 3


def test_deleted_file(workspace: Path, cache_path: str) -> None:
    _, second = scan_pair(workspace, cache_path, lambda r: (r / "docs" / "readme.md").unlink())
    assert "docs/readme.md" not in entries_by_path(second)
    assert second.files_hashed == 0


def file_to_dir(root: Path) -> None:
    (root / "tool.sh").unlink()
    (root / "tool.sh").mkdir()
    (root / "tool.sh" / "inner").write_bytes(b"x")


def test_file_becomes_directory(workspace: Path, cache_path: str) -> None:
    _, second = scan_pair(workspace, cache_path, file_to_dir)
    after = entries_by_path(second)
    assert isinstance(after["tool.sh"], DirEntry)
    assert isinstance(after["tool.sh/inner"], FileEntry)


def dir_to_symlink(root: Path) -> None:
    for child in (root / "docs").iterdir():
        child.unlink()
    (root / "docs").rmdir()
    os.symlink("src", root / "docs")


def test_directory_becomes_symlink(workspace: Path, cache_path: str) -> None:
    _, second = scan_pair(workspace, cache_path, dir_to_symlink)
    after = entries_by_path(second)
    assert after["docs"] == SymlinkEntry("docs", "src")
    assert not any(path.startswith("docs/") for path in after)


def test_unchanged_rescan_hashes_nothing_and_keeps_the_cache_file(
    workspace: Path, cache_path: str
) -> None:
    make_tree(workspace)
    age_tree(str(workspace))
    first = _native.scan(str(workspace), cache_path=cache_path)
    stamp = os.stat(cache_path).st_mtime_ns
    second = _native.scan(str(workspace), cache_path=cache_path)
    assert (second.files_hashed, second.files_reused, second.bytes_hashed) == (0, 4, 0)
    assert second.manifest == first.manifest
    # Nothing changed, so the cache was not rewritten.
    assert os.stat(cache_path).st_mtime_ns == stamp


def test_racily_clean_file_is_hashed_again(workspace: Path, cache_path: str) -> None:
    make_tree(workspace)
    age_tree(str(workspace))
    future = workspace / "src" / "main.py"
    far = os.stat(workspace).st_mtime_ns + 10 * 3600 * 1_000_000_000
    os.utime(future, ns=(far, far))
    _native.scan(str(workspace), cache_path=cache_path)
    second = _native.scan(str(workspace), cache_path=cache_path)
    # Its mtime is after the cache's reference time: never trusted.
    assert second.files_hashed == 1
    assert second.files_reused == 3


@pytest.mark.parametrize("garbage", [b"", b"not a cache", b"CKPDSTC1" + bytes(100)])
def test_corrupt_cache_is_an_empty_cache(workspace: Path, cache_path: str, garbage: bytes) -> None:
    make_tree(workspace)
    age_tree(str(workspace))
    os.makedirs(os.path.dirname(cache_path), exist_ok=True)
    with open(cache_path, "wb") as handle:
        handle.write(garbage)
    first = _native.scan(str(workspace), cache_path=cache_path)
    assert first.files_hashed == 4
    assert _native.scan(str(workspace), cache_path=cache_path).files_hashed == 0


def test_other_secrets_invalidate_the_cache(workspace: Path, cache_path: str) -> None:
    make_tree(workspace)
    age_tree(str(workspace))
    _native.scan(str(workspace), cache_path=cache_path)
    with_secret = _native.scan(str(workspace), cache_path=cache_path, secrets=[b"hello"])
    assert with_secret.files_hashed == 4
    again = _native.scan(str(workspace), cache_path=cache_path, secrets=[b"hello"])
    # Only the file holding the secret is hashed again: the cache keeps no secret
    # positions, so such files are never taken from it.
    assert (again.files_hashed, again.files_reused) == (1, 3)
    main = entries_by_path(with_secret)["src/main.py"]
    zeroed = b"print('\0\0\0\0\0')\n"
    assert isinstance(main, FileEntry) and main.blob_key.endswith(blake3.blake3(zeroed).hexdigest())
    assert main.secrets == (SecretSpan(7, 5, 0),)
    assert entries_by_path(again)["src/main.py"] == main
