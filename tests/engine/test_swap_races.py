"""Captures, scans and restores raced by path swaps end FILE_CHANGED, never
INTERNAL: a process swaps names between a symlink, a file and a directory (each
swap one rename) while they run, for a bounded time. Before, a symlink turned
into a file between the walk's lstat and its readlink failed with a bare
OSError (readlink EINVAL), and a restore whose deletion or rename met a path
that changed kind failed with one too (rmdir ENOTDIR, rename ENOTEMPTY)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from checkpointd import _native
from checkpointd.capture import CaptureOptions, capture_checkpoint
from checkpointd.errors import FILE_CHANGED, SandboxCheckpointError
from checkpointd.restore import RestoreOptions, restore_checkpoint

from .conftest import write_tree

SWAPPED = 16
RACE_BUDGET_S = 10.0

# Each name s<n> becomes in turn a symlink, a file, a directory holding a
# file, and a symlink to a directory, one rename at a time (a directory that
# stands in the way is moved aside first, then removed).
_SWAPPER = textwrap.dedent(
    f"""
    import os, shutil, sys
    root, ready, stop = sys.argv[1], sys.argv[2], sys.argv[3]
    open(ready, "w").close()
    turn = 0
    while not os.path.exists(stop):
        for n in range({SWAPPED}):
            kind = (turn + n) % 4
            new = os.path.join(root, f".new{{n}}")
            old = os.path.join(root, f".old{{n}}")
            name = os.path.join(root, f"s{{n}}")
            try:
                if kind == 0:
                    os.symlink("target.txt", new)
                elif kind == 1:
                    with open(new, "wb") as out:
                        out.write(b"x" * (n + 1))
                elif kind == 2:
                    os.mkdir(new)
                    open(os.path.join(new, "in.txt"), "wb").close()
                else:
                    os.symlink("sub", new)
                try:
                    os.rename(new, name)
                except OSError:
                    os.rename(name, old)
                    os.rename(new, name)
                    if os.path.isdir(old) and not os.path.islink(old):
                        shutil.rmtree(old)
                    else:
                        os.unlink(old)
            except OSError:
                pass
        turn += 1
    """
)


@contextlib.contextmanager
def _swapping(workspace: Path, scratch: Path) -> Iterator[None]:
    scratch.mkdir()
    ready, stop = scratch / "ready", scratch / "stop"
    process = subprocess.Popen(
        [sys.executable, "-c", _SWAPPER, str(workspace), str(ready), str(stop)]
    )
    try:
        while not ready.exists() and process.poll() is None:
            time.sleep(0.005)
        yield
    finally:
        stop.touch()
        process.wait(timeout=30)


def _tree() -> dict[str, bytes | str]:
    tree: dict[str, bytes | str] = {"target.txt": b"t", "sub/in.txt": b"i"}
    for n in range(SWAPPED):
        if n % 2:
            tree[f"s{n}/in.txt"] = b"z" * n
            tree[f"s{n}/deep/x.txt"] = b"x"
        else:
            tree[f"s{n}"] = b"w" * (n + 3)
    return tree


async def test_path_swaps_end_in_file_changed_never_internal(
    memory_store: Any, memory_blobs: Any, workspace: Path, tmp_path: Path, data_dir: Path
) -> None:
    write_tree(workspace, _tree())
    first = await capture_checkpoint(
        workspace, memory_store, memory_blobs, "t", CaptureOptions(data_dir=data_dir)
    )
    outcomes: Counter[str] = Counter()
    others: list[str] = []
    with _swapping(workspace, tmp_path / "swapper"):
        deadline = time.monotonic() + RACE_BUDGET_S
        while time.monotonic() < deadline:
            for what in ("scan", "capture", "restore"):
                try:
                    if what == "scan":
                        _native.scan(str(workspace))
                    elif what == "capture":
                        await capture_checkpoint(
                            workspace,
                            memory_store,
                            memory_blobs,
                            "t",
                            CaptureOptions(data_dir=data_dir),
                        )
                    else:
                        await restore_checkpoint(
                            workspace,
                            memory_store,
                            memory_blobs,
                            "t",
                            RestoreOptions(checkpoint_id=first.checkpoint.id, data_dir=data_dir),
                        )
                    outcomes[f"{what} ok"] += 1
                except _native.FileChangedError:
                    outcomes[f"{what} changed"] += 1
                except SandboxCheckpointError as error:
                    if getattr(error, "code", None) != FILE_CHANGED:
                        others.append(f"{what}: {error!r}")
                    outcomes[f"{what} changed"] += 1
                except Exception as error:  # the failure this test is about
                    others.append(f"{what}: {error!r}")
    assert others == [], f"{outcomes}: {others[:5]}"
    assert sum(outcomes.values()) >= 10, outcomes
