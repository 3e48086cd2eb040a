"""What every tool's suite gets: the corpus, its working copies, and ``bench``.

A suite (ours, restic, borg, git, tar | zstd, the floors) runs the operations
below in the same order on a fresh copy of the same pristine corpus, with the
same seeded edits between runs, so their timings are comparable.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .corpus import CorpusSpec, append_mib, mutate, tree_stats, walk_regular_files
from .scratch import Scratch
from .timing import Measurement, run_timed

COLD = "cold capture"
NO_CHANGE = "no-change capture"
CHANGED_1PCT = "capture after 1% change"
APPEND_1MIB = "capture after 1 MiB append"
RESTORE_EMPTY = "restore into empty dir"
RESTORE_OVER = "restore over 1%-changed tree"
OPERATIONS = (COLD, NO_CHANGE, CHANGED_1PCT, APPEND_1MIB, RESTORE_EMPTY, RESTORE_OVER)

Command = Sequence[str] | str
CommandFor = Command | Callable[[int], Command]


@dataclass
class CorpusRun:
    """One corpus during a benchmark: paths, run counts, and the results so far.

    ``pristine`` is never written; ``work`` is the copy every tool captures and the
    edits land in; ``target`` is where restores go.
    """

    spec: CorpusSpec
    pristine: Path
    scratch: Scratch
    runs: int
    warmups: int
    timeout_s: float
    big_file: str | None  # relative path of the file that gets the 1 MiB append
    results: list[Measurement] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # for the report's notes

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def work(self) -> Path:
        return self.scratch.path("work", self.name)

    @property
    def target(self) -> Path:
        return self.scratch.path("restore", self.name)

    @property
    def apply_excludes(self) -> bool:
        return self.spec.has_excluded_paths

    def tool_dir(self, tool: str) -> Path:
        """A per-tool directory outside the workspace (repositories, caches)."""
        return self.scratch.path("tools", self.name, tool)

    def fresh_work(self) -> None:
        """Reset the working copy to the pristine corpus (old one renamed away) and
        read it once, so every tool starts with the same warm page cache."""
        self.scratch.aside(self.work)
        self.work.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cp", "-a", str(self.pristine), str(self.work)], check=True)
        for rel, _ in walk_regular_files(self.work, apply_excludes=False):
            with (self.work / rel).open("rb") as f:
                while f.read(1 << 20):
                    pass

    def fresh_target(self, *, create: bool = True) -> None:
        """Move the last restore target aside; ``create`` makes an empty one."""
        self.scratch.aside(self.target)
        self.target.parent.mkdir(parents=True, exist_ok=True)
        if create:
            self.target.mkdir()

    def seed(self, op: str, run: int) -> int:
        """The same seed for the same (corpus, op, run) whatever the tool, so every
        tool sees identical edits."""
        digest = hashlib.blake2b(f"{self.spec.seed}/{self.name}/{op}/{run}".encode()).digest()
        return int.from_bytes(digest[:4], "big")

    def mutate_work(self, op: str, run: int) -> None:
        mutate(self.work, fraction=0.01, seed=self.seed(op, run))

    def mutate_target(self, op: str, run: int) -> None:
        mutate(self.target, fraction=0.01, seed=self.seed(op, run))

    def append_work(self, op: str, run: int) -> None:
        assert self.big_file is not None
        append_mib(self.work / self.big_file, seed=self.seed(op, run))

    def verify_restore(self, measurement: Measurement) -> None:
        """Record whether the restore target holds as many files and bytes as the
        tree that was captured last (every tool captures the same edits)."""
        if measurement.error:
            return
        expected = tree_stats(self.work, apply_excludes=self.apply_excludes)
        restored = tree_stats(self.target, apply_excludes=self.apply_excludes)
        measurement.notes["restored"] = restored
        measurement.notes["verified"] = restored == expected

    def bench(
        self,
        op: str,
        tool: str,
        kind: str,
        command: CommandFor,
        *,
        prepare: Callable[[int], object] | None = None,
        warmup: bool = False,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        runs: int | None = None,
    ) -> Measurement:
        """Time ``command`` ``runs`` times (after ``self.warmups`` untimed runs when
        ``warmup``), calling ``prepare(run)`` untimed before each. A failing run
        stops the measurement and is recorded as its error, never raised."""
        total_runs = self.runs if runs is None else runs
        warmups = self.warmups if warmup else 0
        shown = command(0) if callable(command) else command
        measurement = Measurement(
            self.name, op, tool, kind, shown if isinstance(shown, str) else " ".join(shown)
        )
        for index in range(warmups + total_runs):
            run = index - warmups
            if prepare is not None:
                prepare(run)
            argv = command(run) if callable(command) else command
            result = run_timed(argv, env=env or dict(os.environ), cwd=cwd, timeout=self.timeout_s)
            if result.returncode != 0:
                tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
                lines = [line.strip()[:300] for line in tail]
                measurement.error = f"exit {result.returncode}: " + " | ".join(lines)
                break
            if run >= 0:
                measurement.times.append(result.seconds)
                measurement.max_rss_kib.append(result.max_rss_kib)
                measurement.outputs.append(result.stdout)
        self.results.append(measurement)
        print_line(measurement)
        return measurement


def print_line(m: Measurement) -> None:
    if m.error:
        print(f"   {m.op:<30} {m.tool:<24} FAILED {m.error[:300]}", flush=True)
    else:
        print(
            f"   {m.op:<30} {m.tool:<24} median {m.median:8.3f} s  min {m.minimum:8.3f} s"
            f"  rss {m.peak_rss_mib:7.1f} MiB",
            flush=True,
        )
