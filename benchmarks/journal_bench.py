"""What the change journal buys: ``python -m benchmarks.journal_bench [--files N]``.

On a many-small corpus of ``--files`` files (default 100,000; made once and
cached under the scratch dir like every corpus), in one session:

1. ``git status`` with the untracked cache (``core.untrackedCache``, index
   refreshed) on a committed copy of the same tree: the peer;
2. a daemon watching the workspace (``--watch``, default inotify): after its
   cold capture (untimed) and the captures that make its journal trusted, a
   warm gRPC client times no-change captures and captures after editing
   ``--edits`` files (10), with ``entries_examined`` and the append phase
   (warm: the daemon has made one untimed capture after edits, which reads
   its head's manifest back from the store);
3. the same daemon with ``--watch off``: the same two captures, full scans;
   each daemon also times captures right after ``git checkout -f`` switched
   the workspace between two branches of a repository whose git dir lies
   outside it (a tenth of the files differ; made once, untimed);
4. cold captures (a fresh daemon, an empty store, no stat cache) watching
   and not, two of each in alternating order;
5. a ``--small-files`` corpus (10,000): a capture after one edit, end to end,
   once the large corpus's load has settled (``settle``).

Reported: medians and minimums, every ratio against ``git status`` (and
"watching off: 10 edits / no change", the checkout captures journal over
watching off, the cold captures watching over not) from this run, and the answers are
checked (each timed journal capture hashes only what was edited). Results go
to ``benchmarks/results/journal-<files>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .corpus import CorpusSpec, ensure_corpus
from .daemon import THREAD, Daemon
from .harness import default_scratch
from .machine import DebugBuildError, check_native_build

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass
class Series:
    """One timed operation: seconds per run and what each capture said."""

    name: str
    seconds: list[float] = field(default_factory=list)
    examined: list[int] = field(default_factory=list)
    append_ms: list[int] = field(default_factory=list)
    modes: list[str] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    def line(self) -> str:
        extra = ""
        if self.examined:
            extra = (
                f"  examined {statistics.median(self.examined):.0f}"
                f" (max {max(self.examined)})  append {statistics.median(self.append_ms):.0f} ms"
                f"  {'/'.join(sorted(set(self.modes)))}"
            )
        return (
            f"   {self.name:<44} median {self.median * 1e3:9.1f} ms"
            f"  min {min(self.seconds) * 1e3:9.1f} ms{extra}"
        )

    def add(self, seconds: float, done: Any) -> None:
        """One timed capture: its seconds and what its ``CaptureDone`` said."""
        self.seconds.append(seconds)
        self.examined.append(int(done.stats.entries_examined))
        self.append_ms.append(int(done.stats.phases_ms.get("append", 0)))
        self.modes.append(done.stats.scan_mode)

    def to_json(self) -> dict[str, object]:
        return {
            "median_s": self.median,
            "min_s": min(self.seconds),
            "runs": self.seconds,
            "entries_examined": self.examined,
            "append_ms": self.append_ms,
            "scan_modes": self.modes,
        }


def git_status(corpus: Path, copy: Path, runs: int) -> Series:
    """``git status`` with the untracked cache on a committed copy of the corpus."""
    if not (copy / ".git").is_dir():
        print("   committing a copy for git (untimed) ...", flush=True)
        subprocess.run(["cp", "-a", str(corpus), str(copy)], check=True)
        git = ["git", "-C", str(copy), "-c", "user.name=b", "-c", "user.email=b@b"]
        subprocess.run([*git, "init", "-q"], check=True)
        subprocess.run([*git, "config", "core.untrackedCache", "true"], check=True)
        subprocess.run([*git, "add", "-A"], check=True)
        subprocess.run([*git, "commit", "-q", "-m", "corpus"], check=True)
    git = ["git", "-C", str(copy)]
    subprocess.run([*git, "update-index", "--untracked-cache", "--refresh"], check=False)
    for _ in range(2):  # warm: the untracked cache fills, the index is refreshed
        subprocess.run([*git, "status", "--porcelain"], check=True, stdout=subprocess.DEVNULL)
    series = Series("git status (untracked cache), no change")
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run([*git, "status", "--porcelain"], check=True, stdout=subprocess.DEVNULL)
        series.seconds.append(time.perf_counter() - started)
    return series


def edit(corpus: Path, files: list[Path], count: int, rng: random.Random) -> None:
    """Rewrite ``count`` files with other bytes of about their size."""
    for path in rng.sample(files, count):
        path.write_bytes(rng.randbytes(max(1, path.stat().st_size)))


def corpus_files(corpus: Path) -> list[Path]:
    out: list[Path] = []
    for base, _dirs, names in os.walk(corpus):
        out.extend(Path(base) / n for n in names if not (Path(base) / n).is_symlink())
    return out


def branch_repo(corpus: Path, base: Path) -> list[str]:
    """A git repository of the corpus, its git dir outside the workspace, with
    branch ``main`` (the corpus) and ``other`` (every tenth file rewritten):
    made once, kept under ``base``. Returns the git command that works on it."""
    git_dir = base / "branch.git"
    git = ["git", f"--git-dir={git_dir}", f"--work-tree={corpus}",
           "-c", "user.name=b", "-c", "user.email=b@b"]  # fmt: skip
    if (git_dir / "made").is_file():
        return git
    print("   making branches main and other for git checkout (untimed) ...", flush=True)
    shutil.rmtree(git_dir, ignore_errors=True)
    base.mkdir(parents=True, exist_ok=True)
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    copy_objects = base / "git-copy" / ".git" / "objects"
    if copy_objects.is_dir():  # the git status copy holds most of the blobs
        (git_dir / "objects" / "info" / "alternates").write_text(f"{copy_objects}\n")
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "main"], check=True)
    subprocess.run([*git, "checkout", "-q", "-b", "other"], check=True)
    rng = random.Random(10)
    for path in sorted(corpus_files(corpus))[::10]:
        path.write_bytes(rng.randbytes(max(1, path.stat().st_size)))
    subprocess.run([*git, "commit", "-q", "-a", "-m", "other"], check=True)
    subprocess.run([*git, "checkout", "-q", "main"], check=True)
    (git_dir / "made").write_text("main, and other with every tenth file rewritten\n")
    return git


async def checkout(git: list[str], branch: str) -> None:
    """``git checkout -f branch`` (the edits of the other series are discarded)."""
    command = [*git, "checkout", "-q", "-f", branch]
    await asyncio.to_thread(subprocess.run, command, check=True)


async def checkout_series(daemon: Daemon, git: list[str], runs: int, label: str) -> Series:
    """Captures right after ``git checkout`` switched the workspace between
    ``main`` and ``other`` (a tenth of the files differ): the checkout is
    untimed, the capture timed."""
    from checkpointd.service.client import Client

    series = Series(f"{label}: capture after git checkout (10%)")
    async with Client(daemon.address, timeout=3600) as client:
        await checkout(git, "main")
        await client.capture(THREAD)
        for run in range(runs * 2):
            branch = "other" if run % 2 == 0 else "main"
            await checkout(git, branch)
            started = time.perf_counter()
            done = await client.capture(THREAD)
            series.add(time.perf_counter() - started, done)
        await checkout(git, "main")
    return series


def cold_capture(corpus: Path, base: Path, watch: str) -> float:
    """Seconds of the first capture by a fresh daemon into an empty store (no
    stat cache), watching as ``watch`` says; its store is removed after."""
    from checkpointd.service.client import Client

    cold = base / f"cold-{watch}"
    shutil.rmtree(cold, ignore_errors=True)
    daemon = with_watch(corpus, cold, watch)

    async def one() -> float:
        async with Client(daemon.address, timeout=3600) as client:
            started = time.perf_counter()
            await client.capture(THREAD)
            return time.perf_counter() - started

    try:
        daemon.start()
        return asyncio.run(one())
    finally:
        daemon.close()
        shutil.rmtree(cold, ignore_errors=True)


async def daemon_series(
    daemon: Daemon, runs: int, edits: int, files: list[Path], label: str
) -> tuple[Series, Series]:
    """No-change captures and captures after ``edits`` edits, warm client."""
    from checkpointd.service.client import Client

    rng = random.Random(7)
    async with Client(daemon.address, timeout=3600) as client:
        if await client.get_head(THREAD) is None:
            print(f"   {label}: cold capture (untimed) ...", flush=True)
            await client.capture(THREAD)
        # Until the journal directs captures (a fresh daemon scans everything
        # first), and two more: files edited within the racy window of the
        # last scan are hashed once more by the next full scan.
        for _ in range(10):
            done = await client.capture(THREAD)
            if done.stats.scan_mode == "journal" or "off" in done.stats.full_scan_reason:
                break
            await asyncio.sleep(0.5)
        for _ in range(2):
            await asyncio.sleep(1.0)
            await client.capture(THREAD)
        # One capture after edits, untimed: a daemon reads its head's manifest
        # back from the store on the first capture that changes something
        # (at 1,000,000 files about 3 s), once per daemon.
        edit(daemon.workspace, files, edits, rng)
        await client.capture(THREAD)
        still = Series(f"{label}: no-change capture")
        edited = Series(f"{label}: capture after {edits} edits")
        for _ in range(runs):
            for series, changes in ((still, 0), (edited, edits)):
                if changes:
                    edit(daemon.workspace, files, changes, rng)
                started = time.perf_counter()
                done = await client.capture(THREAD)
                series.add(time.perf_counter() - started, done)
                if done.stats.scan_mode == "journal" and done.stats.files_hashed > changes:
                    raise SystemExit(f"{series.name}: hashed {done.stats.files_hashed} files")
    return still, edited


def with_watch(corpus: Path, base: Path, watch: str) -> Daemon:
    store_dir = base / "store"
    (store_dir / "blobs").mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "CHECKPOINTD_WATCH": watch, "CHECKPOINTD_WATCH_VERIFY_EVERY": "0"}
    return Daemon(
        corpus,
        f"sqlite://{store_dir / 'checkpoints.db'}",
        f"file://{store_dir / 'blobs'}",
        base / f"data-{watch}",
        base / f"daemon-{watch}.log",
        env=env,
    )


# Each daemon's peak RSS (MiB) over its whole run, cold capture included,
# by "<files>/<watch>".
PEAK_RSS_MIB: dict[str, float] = {}


# After the large corpus: its daemons' exit and its page cache's writeback
# load the machine for a while; the small corpus's milliseconds wait for it.
SETTLE_LOAD, SETTLE_MAX_S = 1.0, 120.0
# The disk counts as idle below this share of a 2-second window spent on I/O
# (deletions with synchronous discards and writeback outlast the load average).
SETTLE_DISK_BUSY = 0.05


def disk_busy_share(window_s: float = 2.0) -> float:
    """The largest share of ``window_s`` any disk spent doing I/O (0.0 where
    /proc/diskstats cannot be read)."""

    def ticks() -> dict[str, int]:
        try:
            lines = Path("/proc/diskstats").read_text().splitlines()
        except OSError:
            return {}
        # Whole disks only (field 13: milliseconds spent doing I/O).
        return {
            f[2]: int(f[12])
            for f in (line.split() for line in lines)
            if len(f) > 12 and not f[2].startswith(("loop", "ram")) and f[1] == "0"
        }

    before = ticks()
    time.sleep(window_s)
    after = ticks()
    return max(
        ((after[d] - before[d]) / (window_s * 1000) for d in after if d in before), default=0.0
    )


def settle() -> None:
    """Flush dirty pages, then wait until the 1-minute load average is below
    SETTLE_LOAD and the disks are idle (at most SETTLE_MAX_S), and say how
    long that took."""
    started = time.perf_counter()
    os.sync()
    while time.perf_counter() - started < SETTLE_MAX_S:
        if os.getloadavg()[0] < SETTLE_LOAD and disk_busy_share() < SETTLE_DISK_BUSY:
            break
        time.sleep(2.0)
    print(
        f"   settled {time.perf_counter() - started:.0f} s (load {os.getloadavg()[0]:.2f})",
        flush=True,
    )


def run_corpus(args: argparse.Namespace, files: int, watch: str) -> dict[str, Series]:
    corpus = ensure_corpus(
        CorpusSpec("many-small", "many-small", {"files": files}),
        args.scratch / "corpora" / f"many-small-{files}",
    )
    base = args.scratch / f"journal-{files}"
    print(f"### many-small: {files:,} files at {corpus}; load {os.getloadavg()}", flush=True)
    listed = corpus_files(corpus)
    out: dict[str, Series] = {}
    git = branch_repo(corpus, base)
    settle()
    for mode in (watch, "off"):
        daemon = with_watch(corpus, base, mode)
        try:
            daemon.start()
            still, edited = asyncio.run(
                daemon_series(daemon, args.runs, args.edits, listed, f"--watch {mode}")
            )
            out[f"{mode}/no-change"], out[f"{mode}/edits"] = still, edited
            if mode == watch:
                one = asyncio.run(daemon_series(daemon, args.runs, 1, listed, f"--watch {mode}"))
                out[f"{mode}/one-edit"] = one[1]
                one[1].name = f"--watch {mode}: capture after 1 edit"
            out[f"{mode}/checkout"] = asyncio.run(
                checkout_series(daemon, git, max(1, args.runs // 2), f"--watch {mode}")
            )
            PEAK_RSS_MIB[f"{files}/{mode}"] = daemon.peak_rss_mib() or 0.0
        finally:
            daemon.close()
        for series in out.values():
            if series.name.startswith(f"--watch {mode}"):
                print(series.line(), flush=True)
    # Cold captures in both orders, so neither always finds a warmer cache,
    # after an untimed one: the first after the series above ran up to 6x
    # slower than the rest, watching or not (the disk still busy with them).
    settle()
    cold_capture(corpus, base, "off")
    cold: dict[str, list[float]] = {watch: [], "off": []}
    for mode in (watch, "off", "off", watch):
        cold[mode].append(cold_capture(corpus, base, mode))
    for mode, seconds in cold.items():
        out[f"{mode}/cold"] = Series(f"--watch {mode}: cold capture", seconds)
        print(out[f"{mode}/cold"].line(), flush=True)
    # git status last, so its copy's page cache does not evict the corpus.
    out["git"] = git_status(corpus, base / "git-copy", args.runs)
    print(out["git"].line(), flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.journal_bench", description=__doc__)
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--small-files", type=int, default=10_000)
    parser.add_argument("--edits", type=int, default=10)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--watch", default="inotify", choices=("auto", "inotify", "fanotify"))
    parser.add_argument("--scratch", type=Path, default=default_scratch())
    args = parser.parse_args(argv)
    try:
        build = check_native_build(args.scratch)
    except DebugBuildError as exc:
        print(f"refusing to benchmark: {exc}", file=sys.stderr)
        return 2
    print(f"native build: {build.get('profile')} ({build.get('how')}); git {shutil.which('git')}")
    big = run_corpus(args, args.files, args.watch)
    settle()
    small = run_corpus(args, args.small_files, args.watch)
    w = args.watch
    git = big["git"].median
    ratios = {
        f"{args.files:,} files: no-change capture / git status": big[f"{w}/no-change"].median / git,
        f"{args.files:,} files: capture after {args.edits} edits / git status": big[
            f"{w}/edits"
        ].median
        / git,
        f"{args.files:,} files, watching off: {args.edits} edits / no change": big[
            "off/edits"
        ].median
        / big["off/no-change"].median,
        f"{args.files:,} files, watching off: no-change capture / git status": big[
            "off/no-change"
        ].median
        / git,
        f"{args.files:,} files: capture after git checkout (10%), journal / watching off": big[
            f"{w}/checkout"
        ].median
        / big["off/checkout"].median,
        f"{args.files:,} files: cold capture, watching / watching off": big[f"{w}/cold"].median
        / big["off/cold"].median,
        f"{args.small_files:,} files: capture after 1 edit (ms)": small[f"{w}/one-edit"].median
        * 1e3,
        f"{args.small_files:,} files: no-change capture / git status": small[
            f"{w}/no-change"
        ].median
        / small["git"].median,
    }
    print("### ratios (this run)")
    for name, value in ratios.items():
        print(f"   {name}: {value:.3f}")
    RESULTS.mkdir(exist_ok=True)
    report = {
        "files": args.files,
        "small_files": args.small_files,
        "edits": args.edits,
        "watch": w,
        "load": os.getloadavg(),
        "series": {
            str(n): {k: s.to_json() for k, s in r.items()}
            for n, r in ((args.files, big), (args.small_files, small))
        },
        "ratios": ratios,
        "peak_rss_mib": PEAK_RSS_MIB,
    }
    name = f"journal-{args.files // 1000}k"
    (RESULTS / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = ["# The change journal (benchmarks/journal_bench.py)", ""]
    for n, r in ((args.files, big), (args.small_files, small)):
        lines += [f"## {n:,} files", "", "```", *(s.line() for s in r.values()), "```", ""]
    lines += ["## Ratios", "", *(f"- {k}: {v:.3f}" for k, v in ratios.items()), ""]
    lines += [
        "## Daemon peak RSS (MiB, cold capture included)",
        "",
        *(f"- {k}: {v:.0f}" for k, v in PEAK_RSS_MIB.items()),
        "",
    ]
    (RESULTS / f"{name}.md").write_text("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
