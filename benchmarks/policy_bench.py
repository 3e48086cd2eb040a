"""Policy matcher benchmark: a pattern that makes backtracking matchers stall.

    .venv/bin/python -m benchmarks.policy_bench [--depth 600] [--git-depths 50,100,200]

The tree is a chain of ``--depth`` directories named ``a`` with a file ``b`` at
the bottom; the exclude policy is ``**/a*/**/a*/**/b``. Every path in the chain
makes a backtracking matcher try every split of the path between the three
``**``: git's own wildmatch needs about d³ steps per path, and checkpointd's
matcher before it was memoised took 58 s at depth 600.

Printed, each against a floor or a peer in the same run:

- a full capture (``capture_checkpoint``, memory store and blobs) with the
  policy, against the same capture with no pattern (the floor: walk, hash,
  commit; at this depth mostly the store's path checks, which are O(d²) in
  Python, not the policy);
- the native scan alone, with and without the pattern;
- ``git ls-files --others --exclude-standard`` with the same line in a
  ``.gitignore``, at the smaller ``--git-depths`` only (git's cost grows as
  about d³·⁵; at depth 600 it takes minutes), beside our scan at those depths.

Each answer is checked: ``b`` is excluded, every directory is kept. Refuses
debug builds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from checkpointd import _native
from checkpointd.blobs import open_blobs
from checkpointd.capture import CaptureOptions, capture_checkpoint
from checkpointd.codec import decode_entries
from checkpointd.model import Policy
from checkpointd.store import open_store

PATTERN = "**/a*/**/a*/**/b"


def refuse_debug_build() -> None:
    profile = getattr(_native, "BUILD_PROFILE", "unknown")
    if profile != "release":
        sys.exit(f"checkpointd._native is a {profile} build: run `make build` first")


def make_chain(root: Path, depth: int) -> Path:
    """``root/a/a/.../a/b`` with ``depth`` directories; returns the bottom dir."""
    root.mkdir(parents=True)
    bottom = root.joinpath(*["a"] * depth)
    bottom.mkdir(parents=True)
    (bottom / "b").write_bytes(b"b")
    return bottom


def best_of(rounds: int, action: Callable[[], object]) -> tuple[float, float]:
    """(best, median) wall seconds over ``rounds`` runs."""
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return min(times), statistics.median(times)


def check_scan(root: Path, depth: int, exclude: list[str]) -> None:
    entries = decode_entries(_native.scan(str(root), exclude=exclude).manifest)
    paths = [entry.path for entry in entries]
    want = depth if exclude else depth + 1
    assert len(paths) == want, (len(paths), want)
    assert any(p.endswith("/b") for p in paths) == (not exclude)


def scan_with_pattern(root: Path) -> Callable[[], object]:
    return lambda: _native.scan(str(root), exclude=[PATTERN])


def capture_once(root: Path, data_dir: Path, policy: Policy) -> float:
    async def run() -> float:
        store = await open_store("memory://")
        try:
            started = time.perf_counter()
            result = await capture_checkpoint(
                root,
                store,
                open_blobs("memory://"),
                "bench",
                CaptureOptions(policy=policy, data_dir=data_dir),
            )
            elapsed = time.perf_counter() - started
            paths = [entry.path for entry in result.checkpoint.files]
            assert any(p.endswith("/b") for p in paths) == (not policy.exclude)
            return elapsed
        finally:
            await store.aclose()

    shutil.rmtree(data_dir, ignore_errors=True)
    return asyncio.run(run())


def git_ls_files(root: Path, home: Path) -> Callable[[], None]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_DIR": str(root.parent / (root.name + ".git")),
        "GIT_WORK_TREE": str(root),
    }
    subprocess.run(["git", "init", "-q"], env=env, check=True, cwd=root.parent)
    (root / ".gitignore").write_text(PATTERN + "\n")

    def run() -> None:
        out = subprocess.run(
            ["git", "ls-files", "--others", "--exclude-standard"],
            env=env,
            cwd=root,
            check=True,
            capture_output=True,
        ).stdout
        assert out.split() == [b".gitignore"], out[:200]

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depth", type=int, default=600)
    parser.add_argument("--git-depths", default="50,100,200")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    refuse_debug_build()
    git_depths = [int(d) for d in args.git_depths.split(",") if d]

    with tempfile.TemporaryDirectory(prefix="ckpd-policy-bench-") as scratch:
        base = Path(scratch)
        root = base / "chain"
        make_chain(root, args.depth)
        check_scan(root, args.depth, [PATTERN])
        check_scan(root, args.depth, [])
        print(f"tree: a chain of {args.depth} directories `a` and a file `b`; exclude {PATTERN!r}")

        policy = Policy(exclude=(PATTERN,))
        with_pattern, floor = [], []
        for _ in range(args.rounds):
            # Interleaved, so that noise from other work hits both alike.
            with_pattern.append(capture_once(root, base / "data", policy))
            floor.append(capture_once(root, base / "data", Policy()))
        print(
            f"capture, depth {args.depth}: {min(with_pattern) * 1000:.1f} ms with the pattern, "
            f"{min(floor) * 1000:.1f} ms without (floor); "
            f"ratio {min(with_pattern) / min(floor):.2f}x (best of {args.rounds})"
        )
        scan_with, _ = best_of(args.rounds, lambda: _native.scan(str(root), exclude=[PATTERN]))
        scan_floor, _ = best_of(args.rounds, lambda: _native.scan(str(root)))
        print(
            f"scan, depth {args.depth}: {scan_with * 1000:.1f} ms with the pattern, "
            f"{scan_floor * 1000:.1f} ms without; "
            f"{scan_with / (args.depth + 1) * 1e6:.1f} us per path"
        )

        if shutil.which("git") is None:
            print("git: not installed, peer skipped")
            return
        home = base / "home"
        home.mkdir()
        for depth in git_depths:
            small = base / f"chain-{depth}"
            make_chain(small, depth)
            ours, _ = best_of(args.rounds, scan_with_pattern(small))
            theirs, _ = best_of(min(args.rounds, 3), git_ls_files(small, home))
            print(
                f"depth {depth}: our scan {ours * 1000:.1f} ms, git ls-files {theirs * 1000:.1f} ms "
                f"(git / ours = {theirs / ours:.1f}x)"
            )


if __name__ == "__main__":
    main()
