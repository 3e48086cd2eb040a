"""A soak: captures, prune and sweep for a while, and what the store holds per
live byte over time: ``python -m benchmarks.soak [--minutes M] [--files N]``.

Not part of CI (it runs for as long as it is told: an hour by default). One
daemon (``checkpointd serve``: SQLite store, blob dir) serves a working copy
of a many-small corpus of ``--files`` files. Until the time is up:

* every ``--capture-every`` seconds ``--change`` of the files change (a line
  appended to each, ``corpus.mutate``), the daemon captures, and prunes the
  thread to its ``--keep`` newest checkpoints;
* every ``--sweep-every`` seconds the daemon sweeps with ``--older-than`` (in
  seconds: blobs and packs younger than that stay) and its default repack
  threshold (a pack whose live bytes are under half its frames is repacked);
* every ``--report-every`` seconds a line says: elapsed time, captures so far,
  the bucket's bytes and objects, the SQLite store's bytes and its WAL's, the
  live bytes (the distinct blobs the kept checkpoints use, by their sizes) and
  **stored bytes per live byte** (bucket and store together: the goal is a
  ratio that stays flat, at most 2x; the bucket's alone beside it).

At the end: the ratio's first, last, largest and its mean over the first and
last thirds of the run (flat when they are close), with the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .corpus import mutate, release_many_small
from .daemon import THREAD, Daemon
from .harness import default_scratch

MB = 10**6


@dataclass(frozen=True)
class _Sample:
    seconds: float
    captures: int
    bucket_bytes: int
    bucket_objects: int
    store_bytes: int
    wal_bytes: int
    live_bytes: int

    @property
    def ratio(self) -> float:
        stored = self.bucket_bytes + self.store_bytes + self.wal_bytes
        return stored / max(self.live_bytes, 1)

    @property
    def bucket_ratio(self) -> float:
        return self.bucket_bytes / max(self.live_bytes, 1)


def _bucket(root: Path) -> tuple[int, int]:
    """(bytes, objects) of the blob dir: every file in it, packs and single
    objects, staging leftovers too (they are stored bytes as well)."""
    total = count = 0
    for directory, _dirs, names in os.walk(root):
        for name in names:
            try:
                total += os.stat(os.path.join(directory, name)).st_size
            except FileNotFoundError:
                continue  # deleted by a sweep meanwhile
            count += 1
    return total, count


def _store_bytes(database: Path) -> tuple[int, int]:
    """(the database file's bytes, its WAL's and -shm's): the WAL grows up to
    the store's checkpoint threshold before it is copied back, so on a small
    corpus it is much of what the store holds."""
    sizes = []
    for suffixes in (("",), ("-wal", "-shm")):
        total = 0
        for suffix in suffixes:
            try:
                total += os.stat(f"{database}{suffix}").st_size
            except FileNotFoundError:
                pass
        sizes.append(total)
    return sizes[0], sizes[1]


async def _live_bytes(client: object) -> int:
    """The sizes of the distinct blobs the thread's checkpoints use."""
    sizes: dict[str, int] = {}
    for summary in await client.list_checkpoints(THREAD):  # type: ignore[attr-defined]
        for entry in await client.list_entries(summary.id):  # type: ignore[attr-defined]
            if entry.blob_key:
                sizes[entry.blob_key] = entry.size
    return sum(sizes.values())


async def _soak(args: argparse.Namespace, work: Path, base: Path) -> list[_Sample]:
    from checkpointd.service.client import Client

    blob_dir, database = base / "blobs", base / "checkpoints.db"
    blob_dir.mkdir(parents=True)
    daemon = Daemon(
        work, f"sqlite://{database}", f"file://{blob_dir}", base / "data", base / "daemon.log"
    )
    daemon.start()
    samples: list[_Sample] = []
    try:
        async with Client(daemon.address, timeout=3600) as client:
            began = time.monotonic()
            end = began + args.minutes * 60
            next_sweep = began + args.sweep_every
            next_report = began
            captures = 0
            while time.monotonic() < end:
                await asyncio.to_thread(mutate, work, fraction=args.change, seed=captures + 1)
                await client.capture(THREAD)
                await client.prune(THREAD, args.keep)
                captures += 1
                now = time.monotonic()
                if now >= next_sweep:
                    await client.sweep(older_than_ms=int(args.older_than * 1000))
                    next_sweep = now + args.sweep_every
                if now >= next_report:
                    sample = _Sample(
                        now - began,
                        captures,
                        *_bucket(blob_dir),
                        *_store_bytes(database),
                        await _live_bytes(client),
                    )
                    samples.append(sample)
                    print(
                        f"   {sample.seconds / 60:6.1f} min  {captures:5d} captures  bucket "
                        f"{sample.bucket_bytes / MB:8.1f} MB in {sample.bucket_objects:5d} objects"
                        f"  store {sample.store_bytes / MB:6.1f} MB + WAL "
                        f"{sample.wal_bytes / MB:5.1f} MB  live "
                        f"{sample.live_bytes / MB:8.1f} MB  stored/live {sample.ratio:5.2f}x"
                        f" (bucket alone {sample.bucket_ratio:4.2f}x)"
                        f"  load {os.getloadavg()[0]:.1f}",
                        flush=True,
                    )
                    next_report = now + args.report_every
                await asyncio.sleep(max(0.0, args.capture_every - (time.monotonic() - now)))
    finally:
        daemon.close()
    return samples


def _summary(samples: list[_Sample]) -> str:
    ratios = [sample.ratio for sample in samples]
    third = max(1, len(ratios) // 3)
    first, last = statistics.mean(ratios[:third]), statistics.mean(ratios[-third:])
    buckets = [sample.bucket_ratio for sample in samples]
    return (
        f"   stored/live: first {ratios[0]:.2f}x, last {ratios[-1]:.2f}x, largest "
        f"{max(ratios):.2f}x (goal: flat, <= 2x); mean of the first third {first:.2f}x, "
        f"of the last third {last:.2f}x ({(last / first - 1) * 100:+.0f}%); the bucket "
        f"alone: mean {statistics.mean(buckets[:third]):.2f}x then "
        f"{statistics.mean(buckets[-third:]):.2f}x; load {os.getloadavg()}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--files", type=int, default=5000)
    parser.add_argument("--change", type=float, default=0.02, help="fraction changed per capture")
    parser.add_argument("--keep", type=int, default=5)
    parser.add_argument("--capture-every", type=float, default=2.0, help="seconds")
    parser.add_argument("--sweep-every", type=float, default=30.0, help="seconds")
    parser.add_argument("--older-than", type=float, default=10.0, help="sweep age, seconds")
    parser.add_argument("--report-every", type=float, default=60.0, help="seconds")
    parser.add_argument("--scratch", type=Path, default=default_scratch())
    args = parser.parse_args(argv)
    corpus = release_many_small(args.scratch, args.files)
    if corpus is None:
        return 2
    base = args.scratch / f"soak-{os.getpid()}"
    work = base / "workspace"
    shutil.copytree(corpus, work, symlinks=True)
    print(
        f"### soak: {args.minutes:g} min, many-small {args.files:,} files, {args.change:.0%} "
        f"changed per capture every {args.capture_every:g} s, keep {args.keep}, sweep every "
        f"{args.sweep_every:g} s (older than {args.older_than:g} s); load {os.getloadavg()}",
        flush=True,
    )
    try:
        samples = asyncio.run(_soak(args, work, base / "daemon"))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if samples:
        print(_summary(samples))
    return 0


if __name__ == "__main__":
    sys.exit(main())
