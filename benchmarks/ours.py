"""checkpointd's operations through the Python API, each run in a fresh process
(``benchmarks.runner``); daemon.py does the same through ``checkpointd serve``.

The store is the embedded default: SQLite plus a local blob directory. The stat
cache lives in a data dir outside the workspace, one per workspace (the capture's
and the restore target's), as a sidecar would keep it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import sys
from pathlib import Path

from .context import (
    APPEND_1MIB,
    CHANGED_1PCT,
    COLD,
    NO_CHANGE,
    RESTORE_EMPTY,
    RESTORE_OVER,
    CorpusRun,
)
from .corpus import disk_usage
from .timing import OURS, Measurement

API_TOOL = "checkpointd (API)"
THREAD = "bench"
REPO_ROOT = Path(__file__).resolve().parent.parent


def engine_available() -> str | None:
    """None when capture and restore can be imported, else why not."""
    for module in ("checkpointd.capture", "checkpointd.restore", "checkpointd.store"):
        try:
            if importlib.util.find_spec(module) is None:
                return f"{module} is not there yet"
        except ImportError as exc:
            return f"{module}: {exc}"
    return None


def api_suite(ctx: CorpusRun) -> None:
    """Every operation through the Python API (``capture_checkpoint``,
    ``restore_checkpoint``), one process per run."""
    missing = engine_available()
    if missing:
        print(f"   checkpointd API: skipped ({missing})")
        return
    base = ctx.tool_dir("checkpointd")
    store_dir, capture_data, restore_data = base / "store", base / "data", base / "restore-data"
    urls = [
        "--store",
        f"sqlite://{store_dir}/checkpoints.db",
        "--blobs",
        f"file://{store_dir}/blobs",
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
    }

    def runner(operation: str, workspace: Path, data_dir: Path) -> list[str]:
        return [sys.executable, "-m", "benchmarks.runner", operation, "--workspace", str(workspace),
                *urls, "--data-dir", str(data_dir), "--thread", THREAD]  # fmt: skip

    def fresh_store(_run: int) -> None:
        ctx.scratch.aside(store_dir, capture_data)
        (store_dir / "blobs").mkdir(parents=True)
        capture_data.mkdir()

    capture = runner("capture", ctx.work, capture_data)
    ctx.fresh_work()
    cold = ctx.bench(COLD, API_TOOL, OURS, capture, prepare=fresh_store, env=env)
    if cold.error:
        return
    _note_engine(cold)
    cold.notes["stored_bytes"] = disk_usage(store_dir)
    _note_engine(ctx.bench(NO_CHANGE, API_TOOL, OURS, capture, warmup=True, env=env))
    _note_engine(
        ctx.bench(
            CHANGED_1PCT, API_TOOL, OURS, capture,
            prepare=lambda run: ctx.mutate_work(CHANGED_1PCT, run), env=env,
        )
    )  # fmt: skip
    if ctx.big_file:
        _note_engine(
            ctx.bench(
                APPEND_1MIB, API_TOOL, OURS, capture,
                prepare=lambda run: ctx.append_work(APPEND_1MIB, run), env=env,
            )
        )  # fmt: skip

    def empty_target(_run: int) -> None:
        ctx.fresh_target(create=False)  # restore creates the root itself
        ctx.scratch.aside(restore_data)
        restore_data.mkdir(parents=True)

    restore = runner("restore", ctx.target, restore_data)
    into_empty = ctx.bench(RESTORE_EMPTY, API_TOOL, OURS, restore, prepare=empty_target, env=env)
    _note_engine(into_empty)
    ctx.verify_restore(into_empty)
    over = ctx.bench(
        RESTORE_OVER, API_TOOL, OURS, restore,
        prepare=lambda run: ctx.mutate_target(RESTORE_OVER, run), env=env,
    )  # fmt: skip
    _note_engine(over)
    ctx.verify_restore(over)


def _note_engine(measurement: Measurement) -> None:
    """Keep the runner's own view: the median engine seconds (the call alone, no
    interpreter start or imports) and the last run's stats."""
    reports = []
    for output in measurement.outputs:
        try:
            reports.append(json.loads(output.strip().splitlines()[-1]))
        except (IndexError, ValueError):
            continue
    engine = [r["engine_seconds"] for r in reports if "engine_seconds" in r]
    if engine:
        measurement.notes["engine_median_s"] = round(statistics.median(engine), 6)
    if reports and reports[-1].get("stats"):
        measurement.notes["stats"] = reports[-1]["stats"]
