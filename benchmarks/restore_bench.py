"""Restore into an empty dir, alone: checkpointd's daemon beside ``tar | tar`` and restic.

    .venv/bin/python -m benchmarks.restore_bench [--size full] [--runs 3] [--no-restic]

The ``restore into empty dir`` row of ``python -m benchmarks`` without the
capture operations around it, so a change to restore can be measured in a few
minutes: one capture (through a ``checkpointd serve`` daemon on a fresh SQLite
store and ``file://`` blob dir, as ``benchmarks.daemon`` does) and one ``restic
backup``, then ``--runs`` rounds, each timing ``tar | tar``, a daemon restore
(a fresh daemon and data dir per run, the CLI client timed, as in
``benchmarks.daemon``) and ``restic restore`` back to back, so the three share
each round's load. Old trees are renamed aside, never deleted before a timed
create (``benchmarks.scratch``). Prints each run, the medians, the ratios
against ``tar | tar`` and restic, and the 1-minute load average of each round;
writes ``benchmarks/results/restore_<size>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from .context import CorpusRun
from .corpus import SIZES, ensure_corpus, tree_stats
from .daemon import Daemon
from .harness import default_scratch
from .scratch import Scratch
from .timing import run_timed

RESULTS = Path(__file__).resolve().parent / "results"
TAR, DAEMON, RESTIC = "tar | tar", "checkpointd (daemon)", "restic"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.restore_bench", description=__doc__)
    parser.add_argument("--size", choices=sorted(SIZES), default="full")
    parser.add_argument("--corpus", default="many-small")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-restic", action="store_true")
    parser.add_argument("--scratch", type=Path, default=default_scratch())
    args = parser.parse_args(argv)
    spec = next(s for s in SIZES[args.size] if s.name == args.corpus)
    pristine = ensure_corpus(spec, args.scratch / "corpora" / args.size / spec.name)
    scratch = Scratch(args.scratch / "restore-run")
    ctx = CorpusRun(spec, pristine, scratch, runs=1, warmups=0, timeout_s=1800, big_file=None)
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    # A fresh store and restic repository (an earlier run's are renamed aside).
    scratch.aside(ctx.tool_dir("checkpointd-daemon"), ctx.tool_dir("restic"))
    base = ctx.tool_dir("checkpointd-daemon")
    store_dir = base / "store"
    (store_dir / "blobs").mkdir(parents=True, exist_ok=True)
    store, blobs = f"sqlite://{store_dir}/checkpoints.db", f"file://{store_dir}/blobs"
    times: dict[str, list[float]] = {TAR: [], DAEMON: [], RESTIC: []}
    loads: list[float] = []
    problems: list[str] = []
    capturer = Daemon(ctx.work, store, blobs, base / "data", base / "capture.log")
    restorer = Daemon(ctx.target, store, blobs, base / "restore-data", base / "restore.log")
    try:
        ctx.fresh_work()
        capturer.start()
        done = run_timed(capturer.client("capture"), env=env)
        capturer.stop()
        if done.returncode != 0:
            print(done.stderr, file=sys.stderr)
            return 1
        print(f"captured in {done.seconds:.2f} s", flush=True)
        restic_env = None if args.no_restic else _restic_backup(ctx)
        parent, name = ctx.work.parent, ctx.work.name
        tar = f"tar -C {parent} -cf - {name} | tar -xf - -C {ctx.target}"
        expected = tree_stats(ctx.work)
        for run in range(args.runs):
            scratch.flush()
            loads.append(os.getloadavg()[0])
            ctx.fresh_target()
            _time(TAR, tar, env, times, ctx, expected, problems)
            restorer.stop()
            ctx.fresh_target()
            scratch.aside(restorer.data_dir)
            restorer.start()
            _time(DAEMON, restorer.client("restore"), env, times, ctx, expected, problems)
            restorer.stop()
            if restic_env is not None:
                ctx.fresh_target()
                restore = ["restic", "restore", "-q", "latest", "--target", str(ctx.target)]
                _time(RESTIC, restore, restic_env, times, ctx, expected, problems)
            print(f"   round {run + 1}: load {loads[-1]:.2f}", flush=True)
    finally:
        capturer.close()
        restorer.close()
        scratch.close(background=True)
    report = _report(args.size, times, loads, problems)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"restore_{args.size}.json").write_text(json.dumps(report, indent=2) + "\n")
    return 0 if not problems else 1


def _time(
    tool: str,
    command: list[str] | str,
    env: dict[str, str],
    times: dict[str, list[float]],
    ctx: CorpusRun,
    expected: dict[str, int],
    problems: list[str],
) -> None:
    result = run_timed(command, env=env)
    if result.returncode != 0:
        problems.append(f"{tool}: exit {result.returncode}: {result.stderr.strip()[-300:]}")
        return
    # tar restores the tree under its last component, restic under its absolute path.
    restored = {
        TAR: ctx.target / ctx.work.name,
        RESTIC: ctx.target / ctx.work.relative_to("/"),
    }.get(tool, ctx.target)
    stats = tree_stats(restored)
    if stats != expected:
        problems.append(f"{tool}: restored {stats}, expected {expected}")
    times[tool].append(result.seconds)
    engine = ""
    if tool == DAEMON:
        try:
            done = json.loads(result.stdout)
            engine = f"  (daemon's engine {int((done.get('stats') or done)['duration_ms']) / 1000:.3f} s)"
        except (ValueError, KeyError, TypeError):
            pass
    print(f"   {tool:<22} {result.seconds:7.3f} s{engine}", flush=True)


def _restic_backup(ctx: CorpusRun) -> dict[str, str] | None:
    base = ctx.tool_dir("restic")
    base.mkdir(parents=True, exist_ok=True)
    password = base / "password"
    password.write_text("benchmark-only password\n")
    env = {
        **os.environ,
        "RESTIC_REPOSITORY": str(base / "repo"),
        "RESTIC_CACHE_DIR": str(base / "cache"),
        "RESTIC_PASSWORD_FILE": str(password),
    }
    try:
        subprocess.run(["restic", "init", "-q"], env=env, check=True, stdout=subprocess.DEVNULL)
        subprocess.run(["restic", "backup", "-q", str(ctx.work)], env=env, check=True)
    except (OSError, subprocess.CalledProcessError) as error:
        print(f"restic skipped: {error}", flush=True)
        return None
    return env


def _report(
    size: str, times: dict[str, list[float]], loads: list[float], problems: list[str]
) -> dict[str, object]:
    medians = {tool: statistics.median(t) for tool, t in times.items() if t}
    print()
    for tool, median in medians.items():
        print(f"{tool:<22} median {median:7.3f} s  min {min(times[tool]):7.3f} s")
    ratios = {}
    ours = medians.get(DAEMON)
    if ours is not None:
        for peer in (TAR, RESTIC):
            if peer in medians:
                ratios[f"ours/{peer}"] = round(ours / medians[peer], 3)
    print(f"ratios (medians): {ratios}; load {loads}")
    for problem in problems:
        print(f"PROBLEM {problem}")
    return {
        "size": size,
        "times": times,
        "medians": medians,
        "ratios": ratios,
        "load_1min": loads,
        "problems": problems,
    }


if __name__ == "__main__":
    sys.exit(main())
