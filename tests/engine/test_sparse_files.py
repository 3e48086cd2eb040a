"""Sparse files: a scan never reads a hole (``lseek`` SEEK_DATA / SEEK_HOLE:
its zeros are hashed without a read), and a restore leaves the blocks of
zeros it writes as holes, so a sparse file comes back sparse. (The blob
itself still holds the file's apparent size: see ``rust/src/hash.rs``.)"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from checkpointd import _native
from checkpointd.capture import CaptureOptions, capture_checkpoint
from checkpointd.restore import RestoreOptions, restore_checkpoint

from .conftest import PAST_NS, wait_out_racy_window

MIB = 1 << 20


def _sparse(path: Path, size: int, data: dict[int, bytes]) -> None:
    """A file of ``size`` bytes that holds ``data`` (offset → bytes) and holes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as out:
        out.truncate(size)
        for offset, chunk in data.items():
            out.seek(offset)
            out.write(chunk)
    os.utime(path, ns=(PAST_NS, PAST_NS))


def _bytes_read() -> int:
    """What this process has read through read(2) and friends (rchar)."""
    with open("/proc/self/io", encoding="ascii") as io:
        return next(int(line.split()[1]) for line in io if line.startswith("rchar:"))


def test_a_scan_hashes_a_sparse_file_without_reading_its_holes(workspace: Path) -> None:
    size = 512 * MIB
    _sparse(workspace / "disk.img", size, {0: b"boot", 300 * MIB: b"x" * 5000, size - 3: b"end"})
    expected = _native.hash_file(str(workspace / "disk.img"))  # reads the holes: the reference
    before = _bytes_read()
    result = _native.scan(str(workspace))
    read = _bytes_read() - before
    assert result.bytes_hashed == size
    assert expected[0] in result.manifest.decode()
    assert read < 4 * MIB, f"the scan read {read} bytes of a file with ~9 KB of data"


async def test_a_sparse_file_is_restored_sparse(
    memory_store: Any, memory_blobs: Any, workspace: Path, tmp_path: Path, data_dir: Path
) -> None:
    # One large blob (streamed into staging) and one small (staged whole).
    sizes = {"large.bin": 64 * MIB, "small.bin": 512 * 1024}
    for name, size in sizes.items():
        _sparse(
            workspace / name, size, {10: b"head", size // 2 + 1: b"mid" * 2000, size - 4: b"tail"}
        )
    _sparse(workspace / "dense.bin", 3 * MIB + 5, {0: os.urandom(3 * MIB + 5)})
    wait_out_racy_window()
    await capture_checkpoint(
        workspace, memory_store, memory_blobs, "t", CaptureOptions(data_dir=data_dir)
    )
    fresh = tmp_path / "fresh"
    await restore_checkpoint(
        fresh, memory_store, memory_blobs, "t", RestoreOptions(data_dir=data_dir)
    )
    for name in (*sizes, "dense.bin"):
        assert _native.hash_file(str(fresh / name)) == _native.hash_file(str(workspace / name))
    for name, size in sizes.items():
        restored = os.stat(fresh / name)
        assert restored.st_size == size
        allocated = restored.st_blocks * 512
        assert allocated <= 64 * 1024, f"{name}: {allocated} of {size} bytes allocated"
