"""What restore history costs: ``python -m benchmarks.restore_history_bench [--files N] [--runs R]``.

A restore saves the live changes it would overwrite to the thread's stash
first (docs/restore-history.md). On a many-small corpus of ``--files`` files
(default 100,000; made once and cached under the scratch dir) in a working
copy served by one ``checkpointd serve`` daemon (SQLite store and blob dir of
its own), timed through a warm gRPC client as an orchestrator holding its
sidecar's connection would call it:

1. untimed: a cold capture (C1), 1% of the files changed, a capture (C2);
2. each run: the tree reset to C2 (a restore that discards), 1% of the files
   changed again (other files each time: fresh bytes the stash must upload),
   then a restore of C1 **with the stash**; then the same with fresh edits and
   ``discard_live_changes`` (**without**), back to back in alternating order,
   so both share each run's load;
3. each run: an **undo** right after the stash restore (it restores the stash
   entry and stashes the tree it replaces), beside a **no-change capture** of
   the tree it left (a second capture of a thread whose head already holds it).
   The daemon keeps 2 stash entries (``--stash-keep``), so every timed
   restore that stashes also drops the oldest entry, as each does in a
   long-lived sandbox whose stash is full.
   The daemon runs with ``--watch off`` by default (``--watch auto`` to give it
   its change journal): a no-change capture is then a walk of the tree, the
   cost the stash was designed against; with the journal it costs next to
   nothing, while an undo, a restore, still writes what it changes.

Reported: each run, the medians, and the goals' ratios: restore with the stash
over without (goal at most 1.3x) and undo over a no-change capture (goal at
most 2x); the answer is checked (after the undo the edited files hold their
edits again). Results go to ``benchmarks/results/restore_history.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

from checkpointd.service.client import Client

from .corpus import CorpusSpec, ensure_corpus, mutate
from .daemon import THREAD, Daemon
from .harness import default_scratch
from .machine import DebugBuildError, check_native_build

RESULTS = Path(__file__).resolve().parent / "results"
NOCHANGE_THREAD = THREAD + "-nochange"
STASH_GOAL, UNDO_GOAL = 1.3, 2.0


async def _timed(call: Awaitable[Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    result = await call
    return time.perf_counter() - started, result


class _Phases:
    """When each progress phase of one restore began (the client's clock):
    ``stash_s`` is the stash phase's length (0 when nothing was stashed)."""

    def __init__(self) -> None:
        self.began: dict[str, float] = {}

    def __call__(self, event: Any) -> None:
        if event.HasField("progress"):
            self.began.setdefault(event.progress.phase, time.perf_counter())

    @property
    def stash_s(self) -> float:
        if "stash" not in self.began or "apply" not in self.began:
            return 0.0
        return self.began["apply"] - self.began["stash"]

    def lengths(self, ended: float) -> dict[str, float]:
        """Each phase's length, up to the next phase or ``ended`` (the reply)."""
        order = sorted(self.began.items(), key=lambda item: item[1])
        ends = [began for _, began in order[1:]] + [ended]
        return {name: end - began for (name, began), end in zip(order, ends, strict=True)}


class _Bench:
    """The daemon's client and the two checkpoints every run restores between."""

    def __init__(self, client: Client, work: Path) -> None:
        self.client, self.work = client, work
        self.first = self.second = ""
        self.seed = 1000
        self.edits: dict[str, bytes] = {}
        self.phases = _Phases()
        # kind of restore -> its phase -> that phase's length in each run
        self.phase_times: dict[str, dict[str, list[float]]] = {}

    async def setup(self) -> None:
        self.first = (await self.client.capture(THREAD)).checkpoint.id
        mutate(self.work, fraction=0.01, seed=1)
        self.second = (await self.client.capture(THREAD)).checkpoint.id

    async def edited(self) -> dict[str, int]:
        """The tree reset to the second checkpoint, then 1% of it edited afresh."""
        await self.client.restore(THREAD, checkpoint_id=self.second, discard_live_changes=True)
        self.seed += 1
        return mutate(self.work, fraction=0.01, seed=self.seed)

    async def restore(self, *, stash: bool) -> tuple[float, Any]:
        await self.edited()
        if stash:
            self.edits = await self._edited_bytes()
        self.phases = _Phases()
        timed = await _timed(
            self.client.restore(
                THREAD,
                checkpoint_id=self.first,
                discard_live_changes=not stash,
                on_event=self.phases,
            )
        )
        self._keep_phases("stash" if stash else "discard")
        return timed

    def _keep_phases(self, kind: str) -> None:
        for name, seconds in self.phases.lengths(time.perf_counter()).items():
            self.phase_times.setdefault(kind, {}).setdefault(name, []).append(seconds)

    async def _edited_bytes(self) -> dict[str, bytes]:
        """The live bytes of the files that differ from the second checkpoint."""
        paths: list[str] = []

        def on_event(event: Any) -> None:
            if event.HasField("plan_paths"):
                paths.extend(event.plan_paths.written)

        await self.client.restore(
            THREAD, checkpoint_id=self.second, dry_run=True, on_event=on_event
        )
        return {path: (self.work / path).read_bytes() for path in paths}

    async def undo_and_nochange(self) -> tuple[float, float]:
        """An undo of the stash restore just made (checked: the edits are back),
        then a no-change capture of the tree it left (its first capture untimed)."""
        self.phases = _Phases()
        undo_s, done = await _timed(self.client.undo(THREAD, on_event=self.phases))
        self._keep_phases("undo")
        if not done.restored or not self.edits:
            raise RuntimeError("undo restored nothing")
        for path, data in self.edits.items():
            if (self.work / path).read_bytes() != data:
                raise RuntimeError(f"undo did not bring back the edit of {path}")
        await self.client.capture(NOCHANGE_THREAD)
        capture_s, again = await _timed(self.client.capture(NOCHANGE_THREAD))
        if int(again.stats.files_hashed) != 0:
            raise RuntimeError(f"the no-change capture hashed {again.stats.files_hashed} files")
        return undo_s, capture_s


async def _run(bench: _Bench, runs: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {
        "stash": [],
        "discard": [],
        "undo": [],
        "nochange": [],
        "stash_phase_of_restore": [],
        "stash_phase_of_undo": [],
    }
    await bench.setup()
    for run in range(runs):
        order = (True, False) if run % 2 == 0 else (False, True)
        for stash in order:
            seconds, done = await bench.restore(stash=stash)
            if stash != done.HasField("saved_before_restore"):
                raise RuntimeError(f"run {run}: stash={stash} but {done}")
            times["stash" if stash else "discard"].append(seconds)
            if stash:
                times["stash_phase_of_restore"].append(bench.phases.stash_s)
                undo_s, nochange_s = await bench.undo_and_nochange()
                times["undo"].append(undo_s)
                times["stash_phase_of_undo"].append(bench.phases.stash_s)
                times["nochange"].append(nochange_s)
        print(
            f"run {run + 1}: restore with stash {times['stash'][-1]:.3f} s, without "
            f"{times['discard'][-1]:.3f} s (its stash phase "
            f"{times['stash_phase_of_restore'][-1]:.3f} s); undo {times['undo'][-1]:.3f} s "
            f"(stash phase {times['stash_phase_of_undo'][-1]:.3f} s), no-change "
            f"capture {times['nochange'][-1]:.3f} s (load {os.getloadavg()[0]:.2f})",
            flush=True,
        )
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.restore_history_bench", description=__doc__
    )
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--scratch", type=Path, default=default_scratch())
    parser.add_argument("--watch", choices=("off", "auto"), default="off")
    # A long-lived sandbox's stash is full: every restore that stashes also
    # drops the oldest entry. With 2 kept, every timed one does.
    parser.add_argument("--stash-keep", type=int, default=2)
    args = parser.parse_args(argv)
    try:
        check_native_build(args.scratch)
    except DebugBuildError as error:
        print(error)
        return 2
    spec = CorpusSpec("many-small", "many-small", {"files": args.files})
    pristine = ensure_corpus(spec, args.scratch / "corpora" / f"history-{args.files}" / spec.name)
    base = args.scratch / "restore-history"
    if base.exists():
        shutil.rmtree(base)  # before anything is timed
    work = base / "work"
    base.mkdir(parents=True)
    subprocess.run(["cp", "-a", str(pristine), str(work)], check=True)
    (base / "store" / "blobs").mkdir(parents=True)
    daemon = Daemon(
        work,
        f"sqlite://{base / 'store' / 'checkpoints.db'}",
        f"file://{base / 'store' / 'blobs'}",
        base / "data",
        base / "daemon.log",
        env={
            **os.environ,
            "CHECKPOINTD_WATCH": args.watch,
            "CHECKPOINTD_STASH_KEEP": str(args.stash_keep),
        },
    )
    daemon.start()
    try:

        async def session() -> tuple[dict[str, list[float]], dict[str, dict[str, list[float]]]]:
            async with Client(daemon.address, timeout=600) as client:
                bench = _Bench(client, work)
                return await _run(bench, args.runs), bench.phase_times

        times, phase_times = asyncio.run(session())
    finally:
        daemon.close()
    return _report(times, phase_times, args.files, args.watch)


def _report(
    times: dict[str, list[float]],
    phase_times: dict[str, dict[str, list[float]]],
    files: int,
    watch: str,
) -> int:
    medians = {name: statistics.median(values) for name, values in times.items()}
    phases = {
        kind: {name: round(statistics.median(values), 4) for name, values in named.items()}
        for kind, named in phase_times.items()
    }
    stash_ratio = medians["stash"] / medians["discard"]
    undo_ratio = medians["undo"] / medians["nochange"]
    # Each run's own pair (the two restores shared its load), then their median.
    paired = statistics.median(a / b for a, b in zip(times["stash"], times["discard"], strict=True))
    print(
        f"\nmedians over {len(times['stash'])} runs, {files:,} files, 1% live edits, "
        f"--watch {watch}:\n"
        f"  restore of an older checkpoint with the stash {medians['stash']:.3f} s, without "
        f"{medians['discard']:.3f} s: {stash_ratio:.2f}x (goal at most {STASH_GOAL}x; "
        f"the median of each run's ratio {paired:.2f}x)\n"
        f"  undo {medians['undo']:.3f} s, no-change capture {medians['nochange']:.3f} s: "
        f"{undo_ratio:.2f}x (goal at most {UNDO_GOAL}x)\n"
        f"  the stash phase: {medians['stash_phase_of_restore']:.3f} s of the restore, "
        f"{medians['stash_phase_of_undo']:.3f} s of the undo"
    )
    for kind, named in phases.items():
        print(
            f"  {kind} by phase (median s): " + ", ".join(f"{n} {s:.3f}" for n, s in named.items())
        )
    RESULTS.mkdir(exist_ok=True)
    result = {
        "files": files,
        "watch": watch,
        "runs": times,
        "medians_s": medians,
        "phase_medians_s": phases,
        "stash_over_discard": round(stash_ratio, 3),
        "stash_over_discard_paired": round(paired, 3),
        "undo_over_nochange_capture": round(undo_ratio, 3),
        "load_1m": os.getloadavg()[0],
    }
    (RESULTS / "restore_history.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
