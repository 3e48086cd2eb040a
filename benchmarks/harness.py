"""The benchmark run: corpora, then every tool's suite on each, then the report.

Order per corpus: checkpointd through the API (and the daemon, when it exists),
the floors, git, tar | zstd, restic, borg. Each suite starts from a fresh copy of
the pristine corpus read once into the page cache, and the trash is flushed
between suites (see scratch.py) so no timed create follows a mass delete.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import daemon, ours, peers
from .context import CorpusRun
from .corpus import SIZES, ensure_corpus, largest_file, tree_stats
from .machine import check_native_build, machine_facts
from .report import RunReport, write_report
from .scratch import DEFAULT_TRASH_MAX_BYTES, INODE_REUSE_PAUSE_S, Scratch

ALL_TOOLS = ("ours", "daemon", "floors", "git", "tar-zstd", "restic", "borg")
ALL_FLOORS = ("find", "cat", "b3sum", "cp -a", "tar|tar")
RESULTS_DIR = Path(__file__).resolve().parent / "results"
RUNS = {"tiny": 1, "quick": 3, "full": 3, "million": 3}
# A quick run never shrinks its trash mid-run (it stays well under this); a full one
# does, between suites: mostly the large-file trees, which are cheap to delete.
TRASH_MAX_BYTES = {
    "tiny": DEFAULT_TRASH_MAX_BYTES,
    "quick": 16 << 30,
    "full": 16 << 30,
    "million": 32 << 30,
}


@dataclass
class Config:
    size: str = "quick"
    runs: int | None = None  # None: RUNS[size]
    warmups: int = 1  # untimed runs before read-only operations
    tools: tuple[str, ...] = ALL_TOOLS
    floors: tuple[str, ...] = ALL_FLOORS
    corpora: tuple[str, ...] = ()  # empty: every corpus of the size
    out_dir: Path = RESULTS_DIR
    scratch: Path = field(default_factory=lambda: Path(tempfile.gettempdir()) / "checkpointd-bench")
    install: bool = True  # apt-get install missing peers
    use_shared_corpus_script: bool = True
    allow_debug: bool = False
    timeout_s: float = 1800.0
    trash_max_bytes: int | None = None  # None: TRASH_MAX_BYTES[size]
    pause_s: float = INODE_REUSE_PAUSE_S
    delete_in_background: bool = True  # the trash, once the report is written


def run(config: Config) -> list[Path]:
    """Run the benchmark and write its report; returns the files written.

    Raises machine.DebugBuildError for a debug build of the native module (unless
    ``allow_debug``) and KeyError for an unknown size or corpus name.
    """
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    specs = [s for s in SIZES[config.size] if not config.corpora or s.name in config.corpora]
    if config.corpora and not specs:
        raise KeyError(f"no corpus named {config.corpora} in size {config.size!r}")
    runs = config.runs or RUNS[config.size]
    trash_max = config.trash_max_bytes or TRASH_MAX_BYTES[config.size]
    scratch = Scratch(config.scratch / "run", trash_max_bytes=trash_max, pause_s=config.pause_s)
    native = check_native_build(scratch.root, allow_debug=config.allow_debug)
    print(f"native build: {native.get('profile')} ({native.get('how')})", flush=True)
    notes, suites = _suites(config)
    for note in notes:
        print(note, flush=True)

    measurements = []
    corpora = {}
    try:
        for spec in specs:
            pristine = ensure_corpus(
                spec, config.scratch / "corpora" / config.size / spec.name,
                use_shared=config.use_shared_corpus_script,
            )  # fmt: skip
            stats = tree_stats(pristine)
            captured = tree_stats(pristine, apply_excludes=spec.has_excluded_paths)
            corpora[spec.name] = {"spec": asdict(spec), "stats": stats, "captured": captured}
            print(f"### {spec.name}: {stats['files']:,} files, {stats['bytes'] / 1e6:,.1f} MB", flush=True)  # fmt: skip
            ctx = CorpusRun(
                spec=spec, pristine=pristine, scratch=scratch, runs=runs,
                warmups=config.warmups, timeout_s=config.timeout_s,
                big_file=largest_file(pristine),
            )  # fmt: skip
            for suite in suites:
                suite(ctx)
                scratch.flush()
            scratch.aside(ctx.work, ctx.target, scratch.path("tools", spec.name))
            measurements += ctx.results
            notes += ctx.problems
        report = RunReport(
            size=config.size, started_utc=started, runs=runs,
            machine=machine_facts(config.scratch), native=native,
            versions=peers.tool_versions(), corpora=corpora, measurements=measurements,
            notes=notes,
        )  # fmt: skip
        written = write_report(report, config.out_dir)
    finally:
        scratch.close(background=config.delete_in_background)
    for path in written:
        print(f"wrote {path}")
    return written


def _suites(config: Config) -> tuple[list[str], list[Callable[[CorpusRun], None]]]:
    """The suites to run, after installing what they need; notes say what is skipped."""
    wanted = set(config.tools)
    binaries: set[str] = {"time"}
    for tool in wanted & set(peers.NEEDS):
        binaries |= set(peers.NEEDS[tool])
    if "floors" in wanted and "b3sum" in config.floors:
        binaries.add("b3sum")
    unavailable = peers.ensure_tools(binaries, install=config.install)
    notes = [f"skipped {b}: {why}" for b, why in sorted(unavailable.items())]
    suites: list[Callable[[CorpusRun], None]] = []
    if "ours" in wanted:
        missing = ours.engine_available()
        if missing:
            notes.append(f"checkpointd API skipped: {missing}")
        suites.append(ours.api_suite)
    if "daemon" in wanted:
        suites.append(daemon.daemon_suite)
    if "floors" in wanted:
        floors = tuple(f for f in config.floors if not (f == "b3sum" and "b3sum" in unavailable))
        suites.append(lambda ctx: peers.floor_suite(ctx, floors=floors))
    for tool in ("git", "tar-zstd", "restic", "borg"):
        if tool in wanted and not set(peers.NEEDS[tool]) & set(unavailable):
            suites.append(peers.suite_for(tool))
    return notes, suites


def default_scratch() -> Path:
    """Scratch dir: $CHECKPOINTD_BENCH_SCRATCH, else <tmp>/checkpointd-bench."""
    env = os.environ.get("CHECKPOINTD_BENCH_SCRATCH")
    return Path(env) if env else Path(tempfile.gettempdir()) / "checkpointd-bench"
