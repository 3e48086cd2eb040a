"""Native scanner benchmark: every number is a ratio to a peer or a floor, same run.

    .venv/bin/python -m benchmarks.scan_bench --files 20000 [--rss-files 100000]

On a ``many-small`` corpus from ``../shared/bench/make_corpus.py`` (warm page cache):

- cold scan (no stat cache; hashes every file, writes the cache) vs
  ``find DIR -type f -print0 | xargs -0 b3sum --num-threads 2`` (read+hash floor);
- no-change rescan vs ``find DIR -printf '%s %T@\\n'`` (stat floor) and vs
  ``git status`` (untracked cache on) on the same tree;
- rescan after 1% of the files changed (``make_corpus.py mutate``) vs the no-change
  rescan and vs ``git add -A && git commit``;
- peak RSS of a cold scan of a 100,000-file corpus, in a child process (GNU time).

Rounds are interleaved (ours, then each peer) so machine noise hits all alike;
medians and minimums are printed. Our scans run in-process (no interpreter start);
peers are child processes (a few ms of exec each). Refuses debug builds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checkpointd import _native

REPO = Path(__file__).resolve().parent.parent
MAKE_CORPUS = REPO.parent / "shared" / "bench" / "make_corpus.py"
GNU_TIME = "/usr/bin/time"


@dataclass
class Series:
    """Wall seconds of one operation over the rounds."""

    name: str
    seconds: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def best(self) -> float:
        return min(self.seconds)


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def shell(command: str, cwd: Path | None = None) -> Callable[[], None]:
    def run() -> None:
        subprocess.run(command, shell=True, check=True, cwd=cwd, stdout=subprocess.DEVNULL)

    return run


def refuse_debug_build() -> None:
    profile = getattr(_native, "BUILD_PROFILE", "unknown")
    if profile != "release":
        sys.exit(
            f"checkpointd._native is a {profile} build: benchmarks need "
            "`.venv/bin/maturin develop --release` (make build)"
        )


def require_tools(install: bool) -> None:
    missing = [tool for tool in ("b3sum", "find", "git", "xargs") if shutil.which(tool) is None]
    if missing and install and "b3sum" in missing and shutil.which("apt-get"):
        subprocess.run(["apt-get", "install", "-y", "-q", "b3sum"], check=False)
        missing = [tool for tool in missing if shutil.which(tool) is None]
    if missing:
        sys.exit(f"missing tools: {', '.join(missing)} (apt-get install -y b3sum git findutils)")


def ensure_corpus(scratch: Path, files: int, make_corpus: Path) -> Path:
    """A many-small corpus of ``files`` files (seed 1), made once and reused."""
    root = scratch / "corpora" / f"many-small-{files}"
    stamp = scratch / "corpora" / f"many-small-{files}.json"
    if root.is_dir() and stamp.is_file():
        return root
    if not make_corpus.is_file():
        sys.exit(f"corpus generator not found: {make_corpus} (pass --make-corpus)")
    print(f"making corpus {root} ({files} files)...", flush=True)
    root.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, str(make_corpus), "many-small", str(root)]
    command += ["--files", str(files), "--seed", "1", "--force"]
    made = subprocess.run(command, check=True, capture_output=True, text=True)
    stamp.write_text(made.stdout)
    return root


def corpus_stats(root: Path, make_corpus: Path) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, str(make_corpus), "stats", str(root)],
        check=True,
        capture_output=True,
        text=True,
    )
    stats: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return stats


def warm_page_cache(root: Path) -> None:
    shell(f"find {root} -type f -print0 | xargs -0 cat >/dev/null")()


def git_env(git_dir: Path, root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        GIT_DIR=str(git_dir),
        GIT_WORK_TREE=str(root),
        GIT_AUTHOR_NAME="bench",
        GIT_AUTHOR_EMAIL="bench@example.invalid",
        GIT_COMMITTER_NAME="bench",
        GIT_COMMITTER_EMAIL="bench@example.invalid",
    )
    return env


def git_command(env: dict[str, str], command: str) -> Callable[[], None]:
    def run() -> None:
        subprocess.run(command, shell=True, check=True, env=env, stdout=subprocess.DEVNULL)

    return run


def prepare_git(scratch: Path, root: Path) -> dict[str, str]:
    """A git repo whose work tree is the corpus; the .git dir lives outside it,
    so the corpus (and what find and our scan see) stays the same."""
    git_dir = scratch / "git" / (root.name + ".git")
    env = git_env(git_dir, root)
    if not git_dir.is_dir():
        print(f"committing {root} into {git_dir}...", flush=True)
        git_dir.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "init", "-q"], check=True, env=env)
        git_command(env, "git add -A && git commit -q -m corpus")()
    else:
        git_command(env, "git add -A && git commit -q --allow-empty -m sync")()
    # Populate the untracked cache and refresh the index's stat data.
    for _ in range(2):
        git_command(env, "git -c core.untrackedCache=true status --porcelain")()
    return env


def ratio(ours: Series, peer: Series) -> str:
    return f"{ours.median / peer.median:.2f}x (min {ours.best / peer.best:.2f}x)"


def bench_scans(args: argparse.Namespace, root: Path, scratch: Path) -> dict[str, Any]:
    cache_dir = Path(tempfile.mkdtemp(prefix="scan-bench-cache-", dir=scratch))
    cache = str(cache_dir / "statcache.bin")
    threads = args.threads
    env = prepare_git(scratch, root)

    cold, b3sum = Series("ours cold scan"), Series("b3sum --num-threads 2")
    nochange, find = Series("ours no-change rescan"), Series("find -printf '%s %T@'")
    git_status = Series("git status (untracked cache)")
    one_pct, git_commit = Series("ours rescan after 1% changed"), Series("git add -A && commit")
    hashed_after_change: list[int] = []

    def cold_scan() -> None:
        if os.path.exists(cache):
            os.unlink(cache)
        _native.scan(str(root), cache_path=cache, threads=threads)

    def timed_scan() -> tuple[float, _native.ScanResult]:
        started = time.perf_counter()
        result = _native.scan(str(root), cache_path=cache, threads=threads)
        return time.perf_counter() - started, result

    b3 = shell(f"find {root} -type f -print0 | xargs -0 b3sum --num-threads 2 >/dev/null")
    stat_floor = shell(f"find {root} -printf '%s %T@\\n' >/dev/null")
    status = git_command(env, "git -c core.untrackedCache=true status --porcelain >/dev/null")
    commit = git_command(env, "git add -A && git commit -q -m change")

    for round_ in range(args.runs):
        cold.seconds.append(timed(cold_scan))
        b3sum.seconds.append(timed(b3))

        _native.scan(str(root), cache_path=cache, threads=threads)  # settle the cache
        seconds, result = timed_scan()
        nochange.seconds.append(seconds)
        if result.files_hashed != 0:
            sys.exit(f"no-change rescan hashed {result.files_hashed} files: cache broken?")
        find.seconds.append(timed(stat_floor))
        git_status.seconds.append(timed(status))

        subprocess.run(
            [sys.executable, str(args.make_corpus), "mutate", str(root)]
            + ["--fraction", "0.01", "--seed", str(1000 + round_)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        seconds, result = timed_scan()
        one_pct.seconds.append(seconds)
        hashed_after_change.append(result.files_hashed)
        git_commit.seconds.append(timed(commit))
        print(f"  round {round_ + 1}/{args.runs} done", flush=True)

    shutil.rmtree(cache_dir)
    rows = [cold, b3sum, nochange, find, git_status, one_pct, git_commit]
    print()
    print(f"{'operation':40} {'median s':>10} {'min s':>10}")
    for series in rows:
        print(f"{series.name:40} {series.median:10.4f} {series.best:10.4f}")
    print()
    ratios = {
        "cold scan / b3sum (goal <= 1.2)": ratio(cold, b3sum),
        "no-change rescan / find (goal <= 1.5)": ratio(nochange, find),
        "no-change rescan / git status": ratio(nochange, git_status),
        "1% rescan / no-change rescan": ratio(one_pct, nochange),
        "1% rescan / git add+commit": ratio(one_pct, git_commit),
    }
    for name, value in ratios.items():
        print(f"{name:45} {value}")
    print(f"files hashed after each 1% change: {hashed_after_change}")
    return {
        "series": {s.name: s.seconds for s in rows},
        "ratios": ratios,
        "files_hashed_after_1pct": hashed_after_change,
    }


def peak_rss(root: Path, scratch: Path, threads: int) -> dict[str, Any]:
    """Peak RSS (KiB) of a child that cold-scans ``root``, and of a bare import."""
    if not os.access(GNU_TIME, os.X_OK):
        print(f"{GNU_TIME} missing: peak RSS not measured")
        return {}
    cache = scratch / "rss-statcache.bin"

    def measure(code: str) -> tuple[int, float]:
        started = time.perf_counter()
        out = subprocess.run(
            [GNU_TIME, "-f", "%M", sys.executable, "-c", code],
            check=True,
            capture_output=True,
            text=True,
        )
        seconds = time.perf_counter() - started
        return int(out.stderr.strip().splitlines()[-1]), seconds

    baseline, _ = measure("import checkpointd._native")
    scan_code = (
        "import os, checkpointd._native as n\n"
        f"cache = {str(cache)!r}\n"
        "os.path.exists(cache) and os.unlink(cache)\n"
        f"r = n.scan({str(root)!r}, cache_path=cache, threads={threads})\n"
        "assert r.entries > 0\n"
    )
    cold_kib, cold_s = measure(scan_code)
    rescan_kib, rescan_s = measure(
        scan_code.replace("os.path.exists(cache) and os.unlink(cache)\n", "")
    )
    if cache.exists():
        cache.unlink()
    print()
    print(f"peak RSS, {root.name}: bare import {baseline / 1024:.1f} MiB; ")
    print(
        f"  cold scan {cold_kib / 1024:.1f} MiB ({(cold_kib - baseline) / 1024:.1f} MiB over import, {cold_s:.2f} s with start-up)"
    )
    print(
        f"  no-change rescan {rescan_kib / 1024:.1f} MiB ({(rescan_kib - baseline) / 1024:.1f} MiB over import, {rescan_s:.2f} s with start-up)"
    )
    return {
        "baseline_kib": baseline,
        "cold_scan_kib": cold_kib,
        "rescan_kib": rescan_kib,
        "cold_seconds_with_startup": cold_s,
        "rescan_seconds_with_startup": rescan_s,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", type=int, default=20_000, help="files in the timed corpus")
    parser.add_argument(
        "--rss-files", type=int, default=100_000, help="files in the peak-RSS corpus (0: skip)"
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="scan threads (0: one per core)")
    parser.add_argument(
        "--scratch",
        type=Path,
        default=Path(os.environ.get("CHECKPOINTD_BENCH_SCRATCH", "/tmp/checkpointd-scan-bench")),
    )
    parser.add_argument("--make-corpus", type=Path, default=MAKE_CORPUS)
    parser.add_argument(
        "--install-tools", action="store_true", help="apt-get install b3sum if missing"
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)

    refuse_debug_build()
    require_tools(args.install_tools)
    args.scratch.mkdir(parents=True, exist_ok=True)
    root = ensure_corpus(args.scratch, args.files, args.make_corpus)
    stats = corpus_stats(root, args.make_corpus)
    print(f"corpus {root}: {stats}; threads={args.threads or os.cpu_count()}; runs={args.runs}")
    warm_page_cache(root)
    results: dict[str, Any] = {"corpus": stats, "threads": args.threads, "runs": args.runs}
    results["timings"] = bench_scans(args, root, args.scratch)
    if args.rss_files:
        rss_root = ensure_corpus(args.scratch, args.rss_files, args.make_corpus)
        warm_page_cache(rss_root)
        results["peak_rss"] = peak_rss(rss_root, args.scratch, args.threads)
        results["peak_rss"]["corpus"] = corpus_stats(rss_root, args.make_corpus)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
