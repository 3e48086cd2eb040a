"""A capture of a sub-root raced with a symlink swap reads nothing outside.

The sandbox swaps ``sub`` with a symlink to a private directory in a
``renameat2(RENAME_EXCHANGE)`` loop while captures of ``workspace_subdir="sub"``
run: each capture either records the real ``sub`` or fails with INVALID_PATH;
no blob ever holds the private bytes.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from pathlib import Path

import pytest

from checkpointd import CaptureOptions, capture_checkpoint, open_blobs, open_store
from checkpointd.errors import INVALID_PATH, SandboxSnapshotError

from .conftest import write_tree

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_libc = ctypes.CDLL(None, use_errno=True)


def _exchange(a: Path, b: Path) -> bool:
    renameat2 = getattr(_libc, "renameat2", None)
    if renameat2 is None:
        return False
    return renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0


async def test_subroot_swapped_for_a_symlink_never_reads_outside(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    private = tmp_path / "private"
    write_tree(private, {"notes.txt": b"TOP-SECRET outside", "deep/key.pem": b"TOP-SECRET key"})
    write_tree(workspace, {"sub/notes.txt": b"inside notes", "sub/deep/key.pem": b"inside key"})
    (workspace / "swap").symlink_to(private)
    if not _exchange(workspace / "sub", workspace / "swap") or not _exchange(
        workspace / "sub", workspace / "swap"
    ):
        pytest.skip("renameat2(RENAME_EXCHANGE) is not available here")

    stop = threading.Event()

    def swapper() -> None:
        deadline = time.monotonic() + 20  # bounded, whatever happens
        while not stop.is_set() and time.monotonic() < deadline:
            _exchange(workspace / "sub", workspace / "swap")

    thread = threading.Thread(target=swapper, daemon=True)
    outcomes = {"captured": 0, "refused": 0}
    async with await open_store("memory://") as store:
        blobs = open_blobs(f"file://{tmp_path / 'blobs'}")
        thread.start()
        try:
            for attempt in range(30):
                try:
                    result = await capture_checkpoint(
                        workspace,
                        store,
                        blobs,
                        f"t{attempt}",
                        CaptureOptions(data_dir=tmp_path / "data", workspace_subdir="sub"),
                    )
                except SandboxSnapshotError as error:
                    assert error.code == INVALID_PATH, error
                    outcomes["refused"] += 1
                    continue
                outcomes["captured"] += 1
                paths = {entry.path for entry in result.checkpoint.files}
                assert paths <= {"notes.txt", "deep", "deep/key.pem"}
        finally:
            stop.set()
            thread.join()
        for info in await blobs.list("sandbox-files/"):
            assert b"TOP-SECRET" not in await blobs.get(info.key)
    assert sum(outcomes.values()) == 30
