"""Timing one command in a child process: wall seconds and peak RSS.

The peak RSS is the largest resident set of the command or any descendant it
waited for (``tar | zstd`` under ``bash -c`` reports its biggest process). It is
read by GNU time (``/usr/bin/time -f %M``), not from our own ``wait4``: Linux
carries a process's high-water RSS across ``execve``, so a child forked from this
Python process would report at least our own ~20 MiB whatever it ran. Without
GNU time we fall back to ``wait4`` and the figure is an upper bound.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GNU_TIME = "/usr/bin/time"

# What a measured operation is, for ratios: ours, a peer doing the same job, or a
# floor (the least work any tool must do: stat, read+hash, write).
OURS, PEER, FLOOR = "ours", "peer", "floor"


@dataclass(frozen=True)
class TimedRun:
    seconds: float
    max_rss_kib: int
    returncode: int
    stdout: str
    stderr: str


def run_timed(
    command: Sequence[str] | str,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 3600.0,
) -> TimedRun:
    """Run ``command`` (argv, or a bash pipeline string with pipefail) and time it.

    Output goes to temporary files, not pipes, so the child never blocks on a full
    pipe while we sit in ``wait4``. A command over ``timeout`` seconds has its whole
    process group killed and returns code -9.
    """
    argv = ["bash", "-o", "pipefail", "-c", command] if isinstance(command, str) else list(command)
    with (
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
        tempfile.NamedTemporaryFile("r") as rss,
    ):
        if os.access(GNU_TIME, os.X_OK):  # checked per run: the harness may install it
            argv = [GNU_TIME, "-q", "-f", "%M", "-o", rss.name, *argv]
        started = time.perf_counter()
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,  # so a timeout can kill the whole pipeline
        )
        timer = threading.Timer(timeout, _kill_group, args=(proc.pid,))
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        seconds = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)  # Popen must not reap it again
        out.seek(0)
        err.seek(0)
        return TimedRun(
            seconds=seconds,
            max_rss_kib=_read_kib(rss.read()) or usage.ru_maxrss,
            returncode=proc.returncode,
            stdout=out.read().decode(errors="replace"),
            stderr=err.read().decode(errors="replace"),
        )


def _read_kib(text: str) -> int:
    """GNU time's %M (KiB); it prefixes a line when the command failed."""
    last = text.strip().splitlines()[-1:] or [""]
    return int(last[0]) if last[0].isdigit() else 0


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@dataclass
class Measurement:
    """Every timed run of one tool doing one operation on one corpus."""

    corpus: str
    op: str
    tool: str
    kind: str  # OURS | PEER | FLOOR
    command: str
    times: list[float] = field(default_factory=list)
    max_rss_kib: list[int] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    outputs: list[str] = field(default_factory=list, repr=False)  # stdout per timed run

    @property
    def median(self) -> float:
        return statistics.median(self.times) if self.times else float("nan")

    @property
    def minimum(self) -> float:
        return min(self.times) if self.times else float("nan")

    @property
    def peak_rss_mib(self) -> float:
        return max(self.max_rss_kib, default=0) / 1024

    def as_json(self) -> dict[str, Any]:
        return {
            "corpus": self.corpus,
            "op": self.op,
            "tool": self.tool,
            "kind": self.kind,
            "command": self.command,
            "runs": len(self.times),
            "times_s": [round(t, 6) for t in self.times],
            "median_s": round(self.median, 6) if self.times else None,
            "min_s": round(self.minimum, 6) if self.times else None,
            "peak_rss_mib": round(self.peak_rss_mib, 1),
            "notes": self.notes,
            "error": self.error,
        }
