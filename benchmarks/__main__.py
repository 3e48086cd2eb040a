"""``python -m benchmarks --size quick|full``: checkpointd beside its peers.

Writes benchmarks/results/<size>.md and .json (and .png with matplotlib). Needs a
release build of the native module (``make build``); installs restic, borg, b3sum
and zstd from Debian when missing and allowed (root, apt-get), else skips them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .corpus import SIZES
from .harness import ALL_FLOORS, ALL_TOOLS, RESULTS_DIR, Config, default_scratch, run
from .machine import DebugBuildError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--size", choices=sorted(SIZES), default="quick")
    parser.add_argument("--runs", type=int, default=None, help="timed runs per operation")
    parser.add_argument("--tools", default=",".join(ALL_TOOLS), help=f"subset of {','.join(ALL_TOOLS)}")  # fmt: skip
    parser.add_argument("--floors", default=",".join(ALL_FLOORS), help="subset of the floors")
    parser.add_argument("--corpus", action="append", default=[], help="only this corpus (repeat)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="where reports go")
    parser.add_argument("--scratch", type=Path, default=default_scratch(), help="corpora and work trees")  # fmt: skip
    parser.add_argument("--no-install", action="store_true", help="never apt-get install peers")
    parser.add_argument("--no-shared-corpus", action="store_true",
                        help="use our own generators even when ../shared/bench/make_corpus.py exists")  # fmt: skip
    parser.add_argument("--allow-debug", action="store_true", help="benchmark a debug build anyway")
    parser.add_argument("--pause", type=float, default=None,
                        help="seconds to wait after flushing a big trash (default 62)")  # fmt: skip
    args = parser.parse_args(argv)
    config = Config(
        size=args.size,
        runs=args.runs,
        tools=tuple(t for t in args.tools.split(",") if t),
        floors=tuple(f for f in args.floors.split(",") if f),
        corpora=tuple(args.corpus),
        out_dir=args.out,
        scratch=args.scratch,
        install=not args.no_install,
        use_shared_corpus_script=not args.no_shared_corpus,
        allow_debug=args.allow_debug,
    )
    if args.pause is not None:
        config.pause_s = args.pause
    unknown = set(config.tools) - set(ALL_TOOLS)
    if unknown:
        parser.error(f"unknown tools: {', '.join(sorted(unknown))}")
    try:
        run(config)
    except DebugBuildError as exc:
        print(f"refusing to benchmark: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
