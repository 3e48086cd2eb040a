"""The benchmark's scratch space, and the trash that keeps mass deletes out of timings.

Creating files right after deleting many is 7-10x slower on this machine's ext4
without a journal (deleted inodes are not reused for ~60 s; see BENCHMARKS.md).
So trees a run is done with are *renamed* into a trash dir, and the trash is only
emptied between tools once it is big, followed by a pause when it held many
inodes, so that no timed create follows a mass delete.
"""

from __future__ import annotations

import itertools
import os
import shutil
import time
from pathlib import Path

DEFAULT_TRASH_MAX_BYTES = 5_000_000_000
MANY_INODES = 5000
INODE_REUSE_PAUSE_S = 62.0


class Scratch:
    """Paths under one root, plus ``aside`` (rename into the trash) and ``flush``."""

    def __init__(
        self,
        root: Path,
        *,
        trash_max_bytes: int = DEFAULT_TRASH_MAX_BYTES,
        pause_s: float = INODE_REUSE_PAUSE_S,
    ) -> None:
        self.root = root
        self.trash = root / "trash"
        self.trash_max_bytes = trash_max_bytes
        self.pause_s = pause_s
        self._names = itertools.count()
        root.mkdir(parents=True, exist_ok=True)
        self._last_flush = root / "last-mass-delete"
        if self.trash.exists():  # left by an earlier run that was interrupted
            self._empty_trash(_size_of(self.trash)[1])
        self._wait_out_last_flush()
        self.trash.mkdir()

    def path(self, *parts: str) -> Path:
        return self.root.joinpath(*parts)

    def aside(self, *paths: Path) -> None:
        """Rename each existing path into the trash (never an unlink of a tree)."""
        for path in paths:
            if path.exists() or path.is_symlink():
                path.rename(self.trash / f"{next(self._names):06d}-{path.name}")

    def flush(self, *, force: bool = False) -> None:
        """Empty the trash if it grew past the limit (or ``force``); pause afterwards
        when it held many inodes, so the next timed create is not penalised."""
        used_bytes, used_inodes = _size_of(self.trash)
        if not force and used_bytes < self.trash_max_bytes:
            return
        print(f"   (emptying the trash: {used_bytes / 1e6:,.0f} MB, {used_inodes:,} inodes)")
        self._empty_trash(used_inodes)
        self._wait_out_last_flush()
        self.trash.mkdir(exist_ok=True)

    def close(self) -> None:
        """Empty the trash at the end; nothing timed follows in this run, and the
        next run waits out the rest of the pause (see ``_wait_out_last_flush``)."""
        self._empty_trash(_size_of(self.trash)[1] if self.trash.exists() else 0)

    def _empty_trash(self, inodes: int) -> None:
        shutil.rmtree(self.trash, ignore_errors=True)
        os.sync()
        if inodes > MANY_INODES:
            self._last_flush.write_text(f"{time.time()}\n")

    def _wait_out_last_flush(self) -> None:
        """Sleep until ``pause_s`` has passed since the last mass delete, if any."""
        try:
            deleted_at = float(self._last_flush.read_text())
        except (OSError, ValueError):
            return
        remaining = deleted_at + self.pause_s - time.time()
        if remaining > 0:
            print(f"   (many inodes were deleted: waiting {remaining:.0f} s before timing creates)")
            time.sleep(remaining)


def _size_of(root: Path) -> tuple[int, int]:
    """(bytes, inodes) under ``root``, never following symlinks."""
    total_bytes = inodes = 0
    stack = [root]
    while stack:
        with os.scandir(stack.pop()) as it:
            for entry in it:
                inodes += 1
                if entry.is_dir(follow_symlinks=False):
                    stack.append(Path(entry.path))
                elif entry.is_file(follow_symlinks=False):
                    total_bytes += entry.stat(follow_symlinks=False).st_size
    return total_bytes, inodes
