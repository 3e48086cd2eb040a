"""A deep chain of directories costs a scan memory for at most MAX_DEPTH
paths of at most MAX_PATH_BYTES each (``rust/src/walk.rs``): a deeper entry is
refused as ``too-deep`` and a longer path as ``path-too-long``, naming the path,
and neither is entered. Before, a scan of 10,000 levels peaked at hundreds of
MB (every directory kept its whole path, and the paths grow with the depth)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpointd import _native
from checkpointd.codec import decode_entries

MAX_DEPTH = 256
MAX_PATH_BYTES = 4095


def make_chain(root: Path, depth: int, name: str = "d") -> None:
    """``name/name/.../name`` (``depth`` levels) beneath ``root``, made through
    directory fds (the path outgrows PATH_MAX), with a file at the bottom."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir(name, dir_fd=fd)
            child = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        os.close(os.open("bottom.txt", os.O_WRONLY | os.O_CREAT, dir_fd=fd))
    finally:
        os.close(fd)


def remove_chain(root: Path, name: str = "d") -> None:
    """Remove a chain ``make_chain`` made, one level at a time from the top
    (shutil.rmtree recurses once per level and fails past Python's limit)."""
    spare = f"{name}.next"
    while os.path.lexists(root / name):
        top = root / name
        for entry in os.listdir(top):
            if entry == name:
                os.rename(top / name, root / spare)
            else:
                os.unlink(top / entry)
        os.rmdir(top)
        if os.path.lexists(root / spare):
            os.rename(root / spare, root / name)


def chain_path(depth: int, name: str = "d") -> str:
    return "/".join([name] * depth)


@pytest.fixture
def chained(workspace: Path) -> Iterator[Path]:
    """A workspace for a chain: on tmpfs where /dev/shm is one (a disk's
    journal makes 10,000 levels take a minute to make and remove)."""
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        root = Path(tempfile.mkdtemp(prefix="checkpointd-chain-", dir="/dev/shm"))
    else:
        root = workspace
    try:
        yield root
    finally:
        remove_chain(root)
        if root != workspace:
            shutil.rmtree(root)


def test_an_entry_deeper_than_the_limit_is_refused_and_not_entered(chained: Path) -> None:
    make_chain(chained, MAX_DEPTH + 40)
    result = _native.scan(str(chained))
    assert result.unsupported == [(chain_path(MAX_DEPTH + 1), "too-deep")]
    dirs = [e.path for e in decode_entries(result.manifest)]
    assert dirs == [chain_path(n) for n in range(1, MAX_DEPTH + 1)]


def test_a_path_longer_than_the_limit_is_refused_and_not_entered(chained: Path) -> None:
    long = "d" * 250  # 251 bytes a level with its "/": 17 levels are 4,266 bytes
    make_chain(chained, 30, name=long)
    try:
        result = _native.scan(str(chained))
        deepest = next(n for n in range(1, 31) if len(chain_path(n, long)) > MAX_PATH_BYTES)
        assert result.unsupported == [(chain_path(deepest, long), "path-too-long")]
        kept = [e.path for e in decode_entries(result.manifest)]
        assert kept == [chain_path(n, long) for n in range(1, deepest)]
    finally:
        remove_chain(chained, name=long)


# A scan of a 10,000-level chain in a process of its own: its peak RSS.
_SCAN_PEAK = """
import resource, sys
from checkpointd import _native
result = _native.scan(sys.argv[1])
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024, result.unsupported)
"""


def test_a_deep_chain_costs_the_scan_little_memory(chained: Path) -> None:
    make_chain(chained, 10_000)
    empty = chained / "empty"
    empty.mkdir()
    baseline = subprocess.run(
        [sys.executable, "-c", _SCAN_PEAK, str(empty)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    deep = subprocess.run(
        [sys.executable, "-c", _SCAN_PEAK, str(chained)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    idle_mb = int(baseline.stdout.split()[0])
    peak_mb = int(deep.stdout.split()[0])
    assert repr([(chain_path(MAX_DEPTH + 1), "too-deep")]) in deep.stdout
    assert peak_mb - idle_mb < 40, (idle_mb, peak_mb)
