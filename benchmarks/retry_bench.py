"""Captures retried after a failure, against a cold capture of the same tree:
``python -m benchmarks.retry_bench [--files N] [--runs R]`` (root: it mounts a tmpfs).

A capture that fails after its scan has hashed the workspace (a full blob
directory, a daemon killed with SIGKILL) is retried by its caller. The retry
must cost what a cold capture costs: its scan reads every file and hands the
bytes to the upload, which packs them in batches. (It used to trust the hashes
the failed capture left in the stat cache, read none of the files in the scan,
and read each one again in the upload through a call per file: ~10x a cold
capture.) Per run, on one many-small corpus of ``--files`` files, through a
daemon (``checkpointd serve``, SQLite store, blob dir) and a warm gRPC client,
each scenario on a store, blob dir and data dir of its own:

* ``cold``: a fresh daemon captures the corpus (the floor);
* ``after NO_SPACE``: the blob dir is a tmpfs of half the cold capture's blob
  bytes, the capture fails with RESOURCE_EXHAUSTED; the tmpfs is grown and the
  same daemon captures again (timed);
* ``after kill -9``: the daemon is killed once the capture is past its scan,
  started again on the same data dir (it takes its lease back), and captures
  again (timed).

Checked: every retry hashed every file (``files_hashed``), stored the cold
capture's entry count, and the bucket got the same blob bytes. Reported: each
scenario's median and minimum, and the retries' ratios to the cold capture
(goal: at most 1.2x), with the load average: only ratios mean anything on a
shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .corpus import disk_usage, release_many_small
from .daemon import THREAD, Daemon
from .harness import default_scratch

MIB = 1 << 20
# Phases of a capture that come after its scan (a kill there is "past the scan").
PAST_THE_SCAN = ("pin", "upload", "append")


@dataclass(frozen=True)
class _Done:
    seconds: float
    entries: int
    files_hashed: int
    files_reused: int


def _done(seconds: float, done: object) -> _Done:
    stats = done.stats  # type: ignore[attr-defined]
    return _Done(
        seconds,
        int(done.checkpoint.entry_count),  # type: ignore[attr-defined]
        int(stats.files_hashed),
        int(stats.files_reused),
    )


class _Scenario:
    """A store, blob dir, data dir and daemon of one scenario of one run."""

    def __init__(self, base: Path, corpus: Path, blobs_dir: Path | None = None) -> None:
        base.mkdir(parents=True)
        self.base = base
        self.blobs_dir = blobs_dir if blobs_dir is not None else base / "blobs"
        self.blobs_dir.mkdir(parents=True, exist_ok=True)
        self.daemon = Daemon(
            corpus,
            f"sqlite://{base / 'checkpoints.db'}",
            f"file://{self.blobs_dir}",
            base / "data",
            base / "daemon.log",
        )

    async def capture(self, on_phase: object = None) -> _Done:
        from checkpointd.service.client import Client

        def on_event(event: object) -> None:
            if on_phase is not None and event.HasField("progress"):  # type: ignore[attr-defined]
                on_phase(event.progress.phase)  # type: ignore[attr-defined,operator]

        async with Client(self.daemon.address, timeout=3600) as client:
            started = time.perf_counter()
            done = await client.capture(THREAD, on_event=on_event)
            return _done(time.perf_counter() - started, done)


async def _cold(scenario: _Scenario) -> _Done:
    scenario.daemon.start()
    try:
        return await scenario.capture()
    finally:
        scenario.daemon.close()


async def _after_no_space(scenario: _Scenario, mount: Path) -> _Done:
    from checkpointd.service.client import RpcError

    scenario.daemon.start()
    try:
        try:
            await scenario.capture()
        except RpcError as error:
            if error.reason != "SANDBOX_SNAPSHOT_NO_SPACE":
                raise
        else:
            raise SystemExit("the capture into the small tmpfs did not fail: make it smaller")
        await _run("mount", "-o", "remount,size=4g", str(mount))
        return await scenario.capture()
    finally:
        scenario.daemon.close()


async def _after_kill(scenario: _Scenario) -> _Done:
    from checkpointd.service.client import RpcError

    daemon = scenario.daemon
    daemon.start()
    killed = False

    def on_phase(phase: str) -> None:
        nonlocal killed
        if phase in PAST_THE_SCAN and not killed:
            killed = True
            daemon.kill()

    try:
        await scenario.capture(on_phase)
    except RpcError:
        pass  # the stream broke with the daemon
    if not killed:
        daemon.close()
        raise SystemExit("the capture finished before its scan was seen to end: use more files")
    daemon.start()  # the same data dir: it takes its lease back at once
    try:
        return await scenario.capture()
    finally:
        daemon.close()


async def _run(*command: str) -> None:
    await asyncio.to_thread(subprocess.run, command, check=True)


def _check(name: str, done: _Done, cold: _Done) -> None:
    """A retry stored what the cold capture stored, and read every file its
    scan read (none trusted from the failed capture's hashes)."""
    if (done.entries, done.files_hashed, done.files_reused) != (
        cold.entries,
        cold.files_hashed,
        0,
    ):
        raise SystemExit(
            f"{name}: {done.entries} entries (cold {cold.entries}), hashed "
            f"{done.files_hashed} files (cold {cold.files_hashed}), reused "
            f"{done.files_reused}: not the cold capture's path"
        )


async def _one_run(run: Path, corpus: Path) -> dict[str, _Done]:
    cold_scenario = _Scenario(run / "cold", corpus)
    cold = await _cold(cold_scenario)
    if cold.files_reused:
        raise SystemExit(f"cold: {cold.files_reused} files reused from a stat cache")
    stored = disk_usage(cold_scenario.blobs_dir)
    times = {"cold": cold}
    mount = run / "small"
    mount.mkdir()
    await _run("mount", "-t", "tmpfs", "-o", f"size={max(stored // 2, MIB)}", "tmpfs", str(mount))
    try:
        times["after NO_SPACE"] = await _after_no_space(
            _Scenario(run / "nospace", corpus, mount / "blobs"), mount
        )
        if disk_usage(mount / "blobs") < stored:
            raise SystemExit("the retry after NO_SPACE stored fewer blob bytes than the cold one")
    finally:
        await asyncio.to_thread(subprocess.run, ["umount", "-l", str(mount)], check=False)
    times["after kill -9"] = await _after_kill(_Scenario(run / "kill", corpus))
    for name in ("after NO_SPACE", "after kill -9"):
        _check(name, times[name], cold)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.retry_bench", description=__doc__)
    parser.add_argument("--files", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--scratch", type=Path, default=default_scratch())
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("the NO_SPACE scenario mounts a tmpfs: run as root", file=sys.stderr)
        return 2
    corpus = release_many_small(args.scratch, args.files)
    if corpus is None:
        return 2
    base = args.scratch / f"retry-{args.files}-{os.getpid()}"
    print(f"### many-small: {args.files:,} files at {corpus}; load {os.getloadavg()}", flush=True)
    results: dict[str, list[float]] = {}
    try:
        for index in range(args.runs):
            times = asyncio.run(_one_run(base / f"run{index}", corpus))
            line = ", ".join(f"{name} {done.seconds:.3f} s" for name, done in times.items())
            print(f"   run {index + 1}: {line}; load {os.getloadavg()}", flush=True)
            for name, done in times.items():
                results.setdefault(name, []).append(done.seconds)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    cold = results["cold"]
    for name, seconds in results.items():
        ratio = "" if name == "cold" else (
            f"  ratio to cold: median {statistics.median(seconds) / statistics.median(cold):.2f}x,"
            f" min {min(seconds) / min(cold):.2f}x (goal <= 1.2x)"
        )  # fmt: skip
        print(
            f"   {name:<15} median {statistics.median(seconds):.3f} s"
            f"  min {min(seconds):.3f} s{ratio}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
