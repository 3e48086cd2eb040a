"""No-change captures at scale: ``python -m benchmarks.nochange_bench [--files N] [--runs R]``.

Issue 11's scale check without the rest of a full run (``--size million`` also
times cold captures, 1% changes and restores, which take many minutes at a
million files). On a many-small corpus of ``--files`` files (default 1,000,000;
made once and cached under the scratch dir like every corpus):

1. a daemon (``checkpointd serve``, SQLite store and blob dir under the scratch
   dir, kept across runs of this script) captures the corpus once if its thread
   has no checkpoint yet (untimed: the cold capture);
2. a FRESH daemon on the same store and data dir (so its peak RSS is of
   no-change captures alone, and its first capture reads the head from the
   store as a restarted sidecar would) takes one untimed warm-up and then
   ``--runs`` no-change captures over one gRPC channel, each timed;
3. the floor, ``find -printf`` of every path, size, mtime and mode, is timed
   ``--floor-runs`` times before and after, in the same session.

Reported: our median and minimum, the floor's, the ratio of the medians, the
daemon's peak RSS and its RSS between captures, the load average; the answer is
checked: every run hashed nothing and reused every file. Only ratios mean
something on a shared machine.

Per capture: its own peak RSS (``VmHWM`` reset before each capture, in MB =
10^6 bytes, the goal's unit, and MiB), when in the capture that peak came (a
sampler reads ``VmRSS`` every few ms), the RSS after it, and the row it
stored: its delta depth (0 is a keyframe) and its bytes. ``--runs`` defaults
to 8 so that a store kept across runs of this script soon passes a
``MAX_DEPTH`` keyframe (say ``--runs 40`` for a fresh store).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .corpus import release_many_small
from .daemon import THREAD, Daemon
from .harness import default_scratch


def _floor_seconds(corpus: Path, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(
            ["find", str(corpus), "-printf", "%p %s %T@ %m\n"],
            stdout=subprocess.DEVNULL,
            check=True,
        )
        times.append(time.perf_counter() - started)
    return times


MIB = 1 << 20
MB = 10**6
# How often the sampler reads the daemon's RSS during a capture.
SAMPLE_S = 0.005


def _status_bytes(pid: int, field: str) -> int | None:
    """A ``/proc/PID/status`` size field (``VmRSS``, ``VmHWM``) in bytes."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return None


def _sizes(value: int | None) -> str:
    """Bytes in the goal's MB (10^6) and in MiB."""
    if value is None:
        return "? MB"
    return f"{value / MB:.0f} MB ({value / MIB:.0f} MiB)"


class _RssSampler:
    """Reads a process's ``VmRSS`` every ``SAMPLE_S`` on a thread of its own and
    keeps the largest and when it came (seconds after ``start``)."""

    def __init__(self, pid: int) -> None:
        self._pid = pid
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.started = 0.0
        self.peak = 0
        self.peak_at = 0.0

    def __enter__(self) -> _RssSampler:
        self.started = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            rss = _status_bytes(self._pid, "VmRSS")
            if rss is not None and rss > self.peak:
                self.peak, self.peak_at = rss, time.perf_counter() - self.started


@dataclass(frozen=True)
class _Capture:
    seconds: float
    peak: int | None  # VmHWM over this capture alone (bytes)
    after: int | None  # VmRSS once it returned


def _head_row(database: Path) -> tuple[int, int] | None:
    """(depth, stored bytes) of the bench thread's head row, read-only."""
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as conn:
        row = conn.execute(
            "SELECT c.depth, length(c.document) FROM heads h"
            " JOIN checkpoints c ON c.id = h.head_id WHERE h.thread_id = ?",
            (THREAD,),
        ).fetchone()
    return None if row is None else (int(row[0]), int(row[1]))


async def _captures(daemon: Daemon, runs: int, files: int, database: Path) -> list[_Capture]:
    from checkpointd.service.client import Client

    assert daemon._proc is not None
    pid = daemon._proc.pid
    done_runs: list[_Capture] = []
    async with Client(daemon.address, timeout=1800) as client:
        for index in range(runs + 1):
            daemon.reset_peak_rss()  # this capture's own peak
            with _RssSampler(pid) as sampler:
                started = time.perf_counter()
                done = await client.capture(THREAD)
                seconds = time.perf_counter() - started
            capture = _Capture(seconds, _status_bytes(pid, "VmHWM"), _status_bytes(pid, "VmRSS"))
            stats = done.stats
            if stats.files_hashed != 0 or stats.files_reused != files:
                raise SystemExit(
                    f"not a no-change capture: hashed {stats.files_hashed}, "
                    f"reused {stats.files_reused} of {files}"
                )
            head = _head_row(database)
            row = "?" if head is None else f"depth {head[0]}, {head[1]:,} B"
            label = "warm-up" if index == 0 else f"run {index}"
            print(
                f"   {label}: {seconds:.3f} s (engine {stats.duration_ms} ms, "
                f"phases {dict(stats.phases_ms)}), peak RSS {_sizes(capture.peak)}"
                f" at {sampler.peak_at:.2f} s, after {_sizes(capture.after)}; row {row}",
                flush=True,
            )
            done_runs.append(capture)
    return done_runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.nochange_bench", description=__doc__
    )
    parser.add_argument("--files", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument(
        "--floor-runs", type=int, default=5, help="find -printf runs before and after (each)"
    )
    parser.add_argument("--scratch", type=Path, default=default_scratch())
    args = parser.parse_args(argv)
    corpus = release_many_small(args.scratch, args.files)
    if corpus is None:
        return 2
    base = args.scratch / f"nochange-{args.files}"
    store_dir = base / "store"
    (store_dir / "blobs").mkdir(parents=True, exist_ok=True)
    database = store_dir / "checkpoints.db"
    store, blobs = f"sqlite://{database}", f"file://{store_dir}/blobs"
    daemon = Daemon(corpus, store, blobs, base / "data", base / "daemon.log")
    print(f"### many-small: {args.files:,} files at {corpus}; load {os.getloadavg()}", flush=True)
    floor_before = _floor_seconds(corpus, args.floor_runs)
    try:
        daemon.start()
        asyncio.run(_cold_once(daemon))
        daemon.stop()
        daemon.start()  # fresh: its peak is of no-change captures alone
        captures = asyncio.run(_captures(daemon, args.runs, args.files, database))
    finally:
        daemon.close()
    floor_after = _floor_seconds(corpus, args.floor_runs)
    floor = floor_before + floor_after
    ours = [capture.seconds for capture in captures[1:]]  # the warm-up is not timed
    peaks = [capture.peak for capture in captures if capture.peak is not None]
    between = [capture.after for capture in captures if capture.after is not None]
    ratio = statistics.median(ours) / statistics.median(floor)
    print(
        f"   no-change capture  checkpointd (daemon, warm)  median {statistics.median(ours):.3f} s"
        f"  min {min(ours):.3f} s  peak RSS {_sizes(max(peaks, default=None))}"
        f" (goal < 300 MB)  RSS between captures up to {_sizes(max(between, default=None))}"
    )
    print(
        f"   no-change capture  floor: find -printf         median {statistics.median(floor):.3f} s"
        f"  min {min(floor):.3f} s"
    )
    print(f"   ours / floor (medians): {ratio:.2f}x; load {os.getloadavg()}")
    return 0


async def _cold_once(daemon: Daemon) -> None:
    """The cold capture, unless an earlier run of this script left a head."""
    from checkpointd.service.client import Client

    async with Client(daemon.address, timeout=3600) as client:
        if await client.get_head(THREAD) is None:
            print("   cold capture (untimed) ...", flush=True)
            await client.capture(THREAD)


if __name__ == "__main__":
    sys.exit(main())
