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
   ``--runs`` times before and after, in the same session.

Reported: our median and minimum, the floor's, the ratio of the medians, the
daemon's peak RSS (``VmHWM``, reset before the warm-up) and its RSS between
captures, the load average; the answer is checked: every run hashed nothing and
reused every file. Only ratios mean something on a shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from .corpus import CorpusSpec, ensure_corpus
from .daemon import THREAD, Daemon
from .harness import default_scratch
from .machine import DebugBuildError, check_native_build


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


def _rss_mib(daemon: Daemon) -> float | None:
    assert daemon._proc is not None
    for line in Path(f"/proc/{daemon._proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return None


async def _captures(daemon: Daemon, runs: int, files: int) -> list[float]:
    from checkpointd.service.client import Client

    times: list[float] = []
    async with Client(daemon.address, timeout=1800) as client:
        for index in range(runs + 1):
            started = time.perf_counter()
            done = await client.capture(THREAD)
            seconds = time.perf_counter() - started
            stats = done.stats
            if stats.files_hashed != 0 or stats.files_reused != files:
                raise SystemExit(
                    f"not a no-change capture: hashed {stats.files_hashed}, "
                    f"reused {stats.files_reused} of {files}"
                )
            label = "warm-up" if index == 0 else f"run {index}"
            print(
                f"   {label}: {seconds:.3f} s (engine {stats.duration_ms} ms, "
                f"phases {dict(stats.phases_ms)}), peak RSS {daemon.peak_rss_mib():.0f} MiB",
                flush=True,
            )
            if index:
                times.append(seconds)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.nochange_bench", description=__doc__
    )
    parser.add_argument("--files", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--scratch", type=Path, default=default_scratch())
    args = parser.parse_args(argv)
    try:
        build = check_native_build(args.scratch)
    except DebugBuildError as exc:
        print(f"refusing to benchmark: {exc}", file=sys.stderr)
        return 2
    print(f"native build: {build.get('profile')} ({build.get('how')})")
    corpus = ensure_corpus(
        CorpusSpec("many-small", "many-small", {"files": args.files}),
        args.scratch / "corpora" / f"many-small-{args.files}",
    )
    base = args.scratch / f"nochange-{args.files}"
    store_dir = base / "store"
    (store_dir / "blobs").mkdir(parents=True, exist_ok=True)
    store, blobs = f"sqlite://{store_dir}/checkpoints.db", f"file://{store_dir}/blobs"
    daemon = Daemon(corpus, store, blobs, base / "data", base / "daemon.log")
    print(f"### many-small: {args.files:,} files at {corpus}; load {os.getloadavg()}", flush=True)
    floor_before = _floor_seconds(corpus, args.runs)
    try:
        daemon.start()
        asyncio.run(_cold_once(daemon))
        daemon.stop()
        daemon.start()  # fresh: its peak is of no-change captures alone
        daemon.reset_peak_rss()
        ours = asyncio.run(_captures(daemon, args.runs, args.files))
        peak, between = daemon.peak_rss_mib(), _rss_mib(daemon)
    finally:
        daemon.close()
    floor_after = _floor_seconds(corpus, args.runs)
    floor = floor_before + floor_after
    ratio = statistics.median(ours) / statistics.median(floor)
    print(
        f"   no-change capture  checkpointd (daemon, warm)  median {statistics.median(ours):.3f} s"
        f"  min {min(ours):.3f} s  peak RSS {peak:.0f} MiB  RSS between captures {between:.0f} MiB"
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
