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

# Free-space and inode deltas say how big the trash is without walking it.
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
        if self.trash.exists():  # left by an earlier run: empty it, then wait it out
            self._empty_trash()
            self._pause("trash left by an earlier run")
        self.trash.mkdir()
        self._mark()

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
        used_bytes, used_inodes = self._growth()
        if not force and used_bytes < self.trash_max_bytes:
            return
        self._empty_trash()
        if used_inodes > MANY_INODES:
            self._pause(f"flushed {used_bytes / 1e6:,.0f} MB, {used_inodes:,} inodes")
        self.trash.mkdir(exist_ok=True)
        self._mark()

    def close(self) -> None:
        """Empty the trash at the end (nothing timed follows)."""
        self._empty_trash()

    def _empty_trash(self) -> None:
        shutil.rmtree(self.trash, ignore_errors=True)
        os.sync()

    def _pause(self, why: str) -> None:
        if self.pause_s > 0:
            print(f"   ({why}: pausing {self.pause_s:.0f} s so deleted inodes can be reused)")
            time.sleep(self.pause_s)

    def _mark(self) -> None:
        st = os.statvfs(self.root)
        self._free_bytes = st.f_bavail * st.f_frsize
        self._free_inodes = st.f_favail

    def _growth(self) -> tuple[int, int]:
        st = os.statvfs(self.root)
        return (
            max(0, self._free_bytes - st.f_bavail * st.f_frsize),
            max(0, self._free_inodes - st.f_favail),
        )
