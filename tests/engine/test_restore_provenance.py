"""A restore vouches in the stat cache only for bytes it saw in place.

Code in the sandbox may rewrite any file while a restore runs, keeping its size
and putting its old mtime back (``cp -p``, ``touch -d``): a file just renamed
in, or one still in the staging directory (which lies inside the workspace).
The next capture must record what the file holds, never the checkpoint's hash
on the restore's word. A rewriter process races every restore of a few rounds
(bounded in time); after each, a capture's manifest must name each file's
actual bytes.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from checkpointd import _native
from checkpointd.capture import CaptureOptions, capture_checkpoint
from checkpointd.model import FileEntry
from checkpointd.restore import RestoreOptions, restore_checkpoint

from .conftest import PAST_NS, settle_before_record, wait_out_racy_window, write_tree

# The rewriter: each file it finds under the workspace (the staging directory
# too) gets, once per inode, other bytes of the same size and its mtime set
# back, in a loop until the stop file appears. (A file rewritten again after
# the restore's last look would show a new ctime: once is the attack.)
_REWRITER = textwrap.dedent(
    """
    import os, sys
    root, ready, stop, past = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    done = set()
    open(ready, "w").close()
    while not os.path.exists(stop):
        for directory, _dirs, names in os.walk(root):
            for name in names:
                path = os.path.join(directory, name)
                try:
                    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
                except OSError:
                    continue
                try:
                    info = os.fstat(fd)
                    if (info.st_dev, info.st_ino) not in done:
                        done.add((info.st_dev, info.st_ino))
                        os.pwrite(fd, b"X" * info.st_size, 0)
                        os.utime(fd, ns=(past, past))
                except OSError:
                    pass
                finally:
                    os.close(fd)
    """
)

ROUND_BUDGET_S = 12.0
FILES_PER_DIR = 40


def _tree(version: bytes) -> dict[str, bytes | str]:
    tree: dict[str, bytes | str] = {}
    for d in range(4):
        for n in range(FILES_PER_DIR):
            tree[f"d{d}/f{n:03}.txt"] = version + f" {d}/{n}".encode()
    for n in range(FILES_PER_DIR):
        tree[f"top{n:03}.txt"] = version + f" top {n}".encode()
    return tree


@contextlib.contextmanager
def _rewriter(workspace: Path, scratch: Path) -> Iterator[None]:
    """The rewriter, running (past its start) for the block."""
    scratch.mkdir()
    ready, stop = scratch / "ready", scratch / "stop"
    process = subprocess.Popen(
        [sys.executable, "-c", _REWRITER, str(workspace), str(ready), str(stop), str(PAST_NS)]
    )
    try:
        while not ready.exists() and process.poll() is None:
            time.sleep(0.005)
        yield
    finally:
        stop.touch()
        process.wait(timeout=30)


def _lies(checkpoint: Any, root: Path) -> list[str]:
    """The file entries whose hash is not that of the file's bytes now."""
    wrong = []
    for entry in checkpoint.files:
        if isinstance(entry, FileEntry):
            actual, _size = _native.hash_file(str(root / entry.path))
            if not entry.blob_key.endswith(actual):
                wrong.append(entry.path)
    return wrong


async def test_a_rewrite_racing_the_restore_is_never_recorded_as_the_checkpoints(
    memory_store: Any, memory_blobs: Any, workspace: Path, tmp_path: Path, data_dir: Path
) -> None:
    write_tree(workspace, _tree(b"checkpoint"))
    first = await capture_checkpoint(
        workspace, memory_store, memory_blobs, "t", CaptureOptions(data_dir=data_dir)
    )
    deadline = time.monotonic() + ROUND_BUDGET_S
    rounds = 0
    lies: list[str] = []
    while time.monotonic() < deadline and not lies:
        rounds += 1
        # Every file differs from the checkpoint (same sizes): each is written
        # again, top-level ones renamed in one by one, d3's with its directory.
        for rel, content in _tree(b"livework0").items():
            path = workspace / rel
            if path.exists():
                assert isinstance(content, bytes)
                path.write_bytes(content)
        for name in os.listdir(workspace / "d3"):
            os.unlink(workspace / "d3" / name)
        os.rmdir(workspace / "d3")
        with _rewriter(workspace, tmp_path / f"round-{rounds}"):
            await restore_checkpoint(
                workspace,
                memory_store,
                memory_blobs,
                "t",
                RestoreOptions(
                    checkpoint_id=first.checkpoint.id,
                    data_dir=data_dir,
                    progress=settle_before_record,
                ),
            )
        wait_out_racy_window()
        again = await capture_checkpoint(
            workspace, memory_store, memory_blobs, "t", CaptureOptions(data_dir=data_dir)
        )
        lies = _lies(again.checkpoint, workspace)
    assert lies == [], f"round {rounds}: the cache vouched for bytes it never saw"
    assert rounds >= 2
