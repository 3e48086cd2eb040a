"""The benchmark's scratch space, and the trash that keeps mass deletes out of timings.

Creating files right after deleting many is 7-10x slower on this machine's ext4
without a journal (deleted inodes are not reused for ~60 s; see BENCHMARKS.md),
and deleting itself costs ~0.4 ms a file (the filesystem is mounted with
``discard``). So trees a run is done with are *renamed* into a trash dir; the
trash is shrunk between tools only once it is big (trees of few big files first),
followed by a pause when many inodes went, so no timed create follows a mass
delete; the rest is deleted in the background after the report is written.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
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
        # Trees an earlier run left (interrupted, or still being deleted in the
        # background after it ended, by this benchmark or a sibling under the
        # same scratch dir): delete them now, then wait out the pause.
        inodes = finish_background_deletes(root.parent)
        if self.trash.exists():
            inodes += _size_of(self.trash)[1]
            shutil.rmtree(self.trash, ignore_errors=True)
        self._settle(inodes)
        self.trash.mkdir()

    def path(self, *parts: str) -> Path:
        return self.root.joinpath(*parts)

    def aside(self, *paths: Path) -> None:
        """Rename each existing path into the trash (never an unlink of a tree)."""
        for path in paths:
            if path.exists() or path.is_symlink():
                path.rename(self.trash / f"{next(self._names):06d}-{path.name}")

    def flush(self, *, force: bool = False) -> None:
        """Shrink the trash below the limit (or empty it, with ``force``).

        Deleting costs per inode here (ext4 mounted with ``discard``: ~0.4 ms a
        file), and only many deleted inodes slow later creates. So trees of few,
        big files go first; trees of many small files are deleted only if that is
        not enough, followed by the pause, and otherwise left for ``close``.
        """
        entries = [(path, *_size_of(path)) for path in self.trash.iterdir()]
        used = sum(size for _, size, _ in entries)
        if not force and used < self.trash_max_bytes:
            return
        print(f"   (shrinking the trash: {used / 1e6:,.0f} MB)", flush=True)
        # Fewest inodes per byte first.
        entries.sort(key=lambda e: e[2] / max(e[1], 1))
        inodes_deleted = 0
        for path, size, inodes in entries:
            if not force and used < self.trash_max_bytes / 2:
                break
            _remove(path)
            used -= size
            inodes_deleted += inodes
        self._settle(inodes_deleted)

    def close(self, *, background: bool = True) -> None:
        """Empty the trash at the end: nothing timed follows in this run. With
        ``background`` a detached ``rm -rf`` does it (deleting gigabytes can take
        minutes here); the next run finishes it and waits out the pause."""
        if not self.trash.exists():
            return
        inodes = _size_of(self.trash)[1]
        doomed = self.root / f"deleting-{time.time_ns()}"
        self.trash.rename(doomed)
        if background:
            # At the lowest CPU priority: whatever runs next (another benchmark,
            # ours or not) gets the cores first.
            subprocess.Popen(
                ["nice", "-n", "19", "rm", "-rf", str(doomed)], stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        else:
            shutil.rmtree(doomed, ignore_errors=True)
        self._deleted(inodes)

    def _settle(self, inodes: int) -> None:
        """After deleting ``inodes`` inodes, before the next timed create: the
        frees reach the disk (ext4 without a journal skips a deleted inode for
        60 s once its inode-table block is written, for 360 s while that block
        is dirty), and after many, the pause is waited out."""
        if inodes:
            os.sync()
        self._deleted(inodes)
        self._wait_out_last_flush()

    def _deleted(self, inodes: int) -> None:
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
            print(
                f"   (many inodes were deleted: waiting {remaining:.0f} s before timing creates)",
                flush=True,
            )
            time.sleep(remaining)


def finish_background_deletes(base: Path) -> int:
    """Delete, now, the trees earlier runs of any benchmark under ``base`` left
    to their background ``rm`` (``<root>/deleting-*``, see ``Scratch.close``),
    and return how many inodes went. A run timed while such a delete goes on
    measures it too: deleting a 100,000-file tree takes ~40 s of this
    machine's CPU, and the kernel's discards more."""
    inodes = 0
    for leftover in sorted(base.glob("*/deleting-*")):
        inodes += _size_of(leftover)[1]
        shutil.rmtree(leftover, ignore_errors=True)
    return inodes


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _size_of(root: Path) -> tuple[int, int]:
    """(bytes, inodes) of ``root`` and everything under it, never following symlinks."""
    if not root.is_dir() or root.is_symlink():
        return (root.lstat().st_size if root.is_file() else 0), 1
    total_bytes = inodes = 0
    stack = [root]
    while stack:
        # A leftover the previous run's background delete is still removing
        # loses entries while we count: what is gone is not counted.
        try:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    inodes += 1
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(Path(entry.path))
                    elif entry.is_file(follow_symlinks=False):
                        total_bytes += entry.stat(follow_symlinks=False).st_size
        except FileNotFoundError:
            continue
    return total_bytes, inodes
