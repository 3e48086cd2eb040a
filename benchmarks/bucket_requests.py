"""Bucket requests, time and stored bytes against a real S3.

    .venv/bin/python -m benchmarks.bucket_requests [--files 100000] [--tools ours,daemon,restic]
        [--cold-runs 3] [--no-install]

One many-small corpus (``--files`` files, generated on demand into the scratch
dir, ``$CHECKPOINTD_BENCH_SCRATCH``, default ``/tmp/checkpointd-bench``), one
SeaweedFS S3 server on loopback (``tests/fixtures/s3.py``) and, in front of it,
an exact request counter (``tests/fixtures/bucket_counter.py``: a loopback proxy
that classifies every request: PUT, GET, HEAD, LIST, DELETE, multipart...).
Each tool works on its own copy of the corpus, with the same seeded edits:

- ``ours``: ``benchmarks.runner`` (``capture_checkpoint`` / ``restore_checkpoint``
  in a fresh process), SQLite store, blobs in ``s3://<bucket>/ours-…``;
- ``daemon``: the same operations as RPCs to ``checkpointd serve`` (one daemon
  on the work copy, one on the restore target, same store and bucket prefix
  ``daemon-…``) from a client that has seen it SERVING, as ``benchmarks.daemon``
  times the goals: start-up is neither timed nor counted;
- ``restic``: ``restic backup`` / ``restic restore`` to ``s3:<proxy>/<bucket>/restic-…``
  (its ``init`` is not counted); installed from Debian when missing, as
  ``python -m benchmarks`` does (``--no-install``: skipped instead).

Operations: a cold capture, a capture after 1% of the files changed, and a
restore into an empty directory. For each: wall seconds (the whole process, or
the RPC), the requests by kind, and the 1-minute load average when it started.
The cold capture runs ``--cold-runs`` times (default 3) per tool, each into a
fresh store, bucket prefix and data dir (restic: a fresh repository and
cache), and its row gives the median (BENCHMARKS.md: report medians; restic's
own time moved between 7.0 and 9.5 s from one run to the next); the 1% change
and the restore follow the last one. Stored
bytes: the objects under the tool's prefix (listed beside the proxy, so not
counted), plus, for ours, the SQLite file (the pack index and manifests live
there). Goals, for each of our rows: a cold capture in at most 100
requests; stored bytes at most 1.1x restic's; a cold capture at least 3x faster
than restic's.

Writes ``benchmarks/results/bucket_requests.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .corpus import CorpusSpec, ensure_corpus, mutate
from .peers import ensure_tools
from .scratch import Scratch

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
THREAD = "bench"
RESTIC_PASSWORD = "benchmark-only password\n"

COLD = "cold capture"
CHANGED = "capture after 1% changed"
RESTORE = "restore into an empty dir"
OPERATIONS = (COLD, CHANGED, RESTORE)

# The columns of the request table, in order; the rest are summed under "other".
KINDS = ("PUT", "GET", "HEAD", "LIST", "DELETE", "MULTIPART")
GOAL_COLD_REQUESTS = 100
GOAL_STORED_RATIO = 1.1
GOAL_COLD_SPEEDUP = 3.0

# Our two ways of running (rows of the tables): see run_ours and run_ours_daemon.
OURS_FRESH = "checkpointd"
OURS_DAEMON = "checkpointd (daemon, warm)"
OURS_TOOLS = {"ours": OURS_FRESH, "daemon": OURS_DAEMON}


@dataclass
class Row:
    tool: str
    operation: str
    seconds: float
    requests: dict[str, int]
    load_1min: float
    note: str = ""
    # Every timed run's seconds when the operation ran more than once
    # (``seconds`` is then their median).
    runs: list[float] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.requests.values())


@dataclass
class Result:
    files: int
    rows: list[Row] = field(default_factory=list)
    stored_bytes: dict[str, dict[str, int]] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)


def columns(requests: dict[str, int]) -> dict[str, int]:
    """Requests folded into KINDS (multipart parts and control requests together,
    DELETE of one key and of a batch together) plus ``other``."""
    out = dict.fromkeys(KINDS, 0)
    out["other"] = 0
    for kind, n in requests.items():
        if kind.startswith("MULTIPART_") and kind != "MULTIPART_LIST":
            out["MULTIPART"] += n
        elif kind in ("DELETE", "DELETE_MANY"):
            out["DELETE"] += n
        elif kind == "MULTIPART_LIST":
            out["LIST"] += n
        elif kind in out:
            out[kind] += n
        else:
            out["other"] += n
    return out


def _load() -> float:
    return os.getloadavg()[0]


def _timed(
    command: list[str], env: dict[str, str], proxy: Any, *, cwd: Path | None = None
) -> tuple[float, dict[str, int], float, str]:
    proxy.reset()
    load = _load()
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=cwd, check=False)
    seconds = time.perf_counter() - started
    requests = proxy.reset()
    if done.returncode != 0:
        raise RuntimeError(f"{command[:3]} failed ({done.returncode}): {done.stderr[-3000:]}")
    return seconds, requests, load, done.stdout


def _copy_tree(source: Path, dest: Path, scratch: Scratch) -> None:
    scratch.aside(dest)  # an earlier run's copy: renamed, deleted after the timings
    subprocess.run(["cp", "-a", str(source), str(dest)], check=True)


def _stored(server: Any, prefix: str) -> int:
    """Bytes of every object under ``prefix`` (asked of the server directly)."""

    async def total() -> int:
        blobs = server.open(prefix)
        return sum(info.size for info in await blobs.list(""))

    return asyncio.run(total())


@dataclass
class Run:
    """What each tool's run works with: the result it adds its rows to, the
    corpus, the scratch dir, the S3 server, the way to it through the request
    counter (``via``) and the counter, how many cold captures to time, and
    whether a missing restic may be installed."""

    result: Result
    corpus: Path
    scratch: Scratch
    server: Any
    via: Any
    proxy: Any
    cold_runs: int
    install: bool = True  # apt-get install restic when it is missing

    def fields(self) -> tuple[Result, Path, Scratch, Any, Any, Any]:
        return self.result, self.corpus, self.scratch, self.server, self.via, self.proxy


@dataclass
class OursLayout:
    """One run of ours: its work copy, restore target, data dirs, SQLite store
    and bucket prefix, made fresh (``name`` keeps the runs apart) in the
    scratch, whose trash takes what a run is done with."""

    scratch: Scratch
    work: Path
    target: Path
    data: Path
    restore_data: Path
    store: Path
    prefix: str

    @classmethod
    def fresh(cls, corpus: Path, scratch: Scratch, name: str) -> OursLayout:
        layout = cls(
            scratch=scratch,
            work=scratch.path(f"{name}-work"),
            target=scratch.path(f"{name}-restore"),
            data=scratch.path(f"{name}-data"),
            restore_data=scratch.path(f"{name}-restore-data"),
            store=scratch.path(f"{name}-store.db"),
            prefix="",
        )
        _copy_tree(corpus, layout.work, scratch)
        return layout.again()

    def again(self) -> OursLayout:
        """This layout emptied for another cold capture of the same work copy:
        no store, data dirs or restore target, and a new bucket prefix."""
        self.scratch.aside(self.data, self.restore_data, self.target)
        for leftover in self.store.parent.glob(f"{self.store.name}*"):
            leftover.unlink()
        self.data.mkdir()
        self.restore_data.mkdir()
        self.prefix = f"{self.work.name.removesuffix('-work')}-{uuid.uuid4().hex[:12]}"
        return self

    def stored(self, server: Any) -> dict[str, int]:
        """The bucket's bytes and the SQLite store's (the pack index and manifests)."""
        return {
            "bucket": _stored(server, self.prefix),
            "store_db": sum(
                p.stat().st_size for p in self.store.parent.glob(f"{self.store.name}*")
            ),
        }


def run_ours(run: Run) -> None:
    """Each operation in a fresh process (``benchmarks.runner``), as restic runs."""
    result, corpus, scratch, server, via, proxy = run.fields()
    ours = OursLayout.fresh(corpus, scratch, "ours")
    env = {
        **os.environ,
        **via.env(),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }

    def runner(operation: str, workspace: Path, data_dir: Path) -> list[str]:
        urls = ["--store", f"sqlite://{ours.store}", "--blobs", via.url(ours.prefix), "--thread", THREAD]  # fmt: skip
        return [sys.executable, "-m", "benchmarks.runner", operation,
                "--workspace", str(workspace), "--data-dir", str(data_dir), *urls]  # fmt: skip

    def timed(operation: str, command: list[str]) -> Row:
        seconds, requests, load, out = _timed(command, env, proxy)
        report = json.loads(out.strip().splitlines()[-1])
        note = f"engine {report['engine_seconds']:.2f} s"
        return Row(OURS_FRESH, operation, seconds, requests, load, note)

    colds = []
    for again in range(run.cold_runs):
        if again:
            ours.again()
        colds.append(timed(COLD, runner("capture", ours.work, ours.data)))
    result.rows.append(_median_row(colds))
    mutate(ours.work, fraction=0.01, seed=1)
    result.rows.append(timed(CHANGED, runner("capture", ours.work, ours.data)))
    result.rows.append(timed(RESTORE, runner("restore", ours.target, ours.restore_data)))
    for row in result.rows[-3:]:
        print(f"   {OURS_FRESH} {row.operation}: {row.seconds:.2f} s, {row.total} requests")
    result.stored_bytes[OURS_FRESH] = ours.stored(server)


def run_ours_daemon(run: Run) -> None:
    """Each operation as an RPC to a running ``checkpointd serve`` (the sidecar
    an orchestrator calls), from a client that has seen it SERVING: daemon and
    client start-up are not timed, nor counted (the proxy is reset after), the
    way ``benchmarks.daemon`` measures its goals."""
    result, corpus, scratch, server, via, proxy = run.fields()
    from checkpointd.service.client import Client

    from .daemon import START_TIMEOUT_S, Daemon

    ours = OursLayout.fresh(corpus, scratch, "daemon")
    env = {**os.environ, **via.env(), "PYTHONWARNINGS": "ignore"}

    def daemons() -> tuple[Daemon, Daemon]:
        """A capturing and a restoring daemon on the layout's store and prefix."""
        store, blobs = f"sqlite://{ours.store}", via.url(ours.prefix)
        logs = scratch.path("capture-daemon.log"), scratch.path("restore-daemon.log")
        return (
            Daemon(ours.work, store, blobs, ours.data, logs[0], env),
            Daemon(ours.target, store, blobs, ours.restore_data, logs[1], env),
        )

    async def timed_rpc(daemon: Daemon, operation: str) -> Row:
        async with Client(daemon.address, timeout=600) as client:
            await client.wait_serving(within=START_TIMEOUT_S)
            proxy.reset()
            load = _load()
            started = time.perf_counter()
            if operation == RESTORE:
                await client.restore(THREAD)
            else:
                await client.capture(THREAD)
            seconds = time.perf_counter() - started
            requests = proxy.reset()
        print(f"   {OURS_DAEMON} {operation}: {seconds:.2f} s, {sum(requests.values())} requests")
        return Row(OURS_DAEMON, operation, seconds, requests, load)

    capturer = restorer = None
    try:
        colds = []
        for _ in range(run.cold_runs):
            if capturer is not None:
                capturer.close()
                ours.again()
            capturer, restorer = daemons()
            capturer.start()
            colds.append(asyncio.run(timed_rpc(capturer, COLD)))
        result.rows.append(_median_row(colds))
        assert capturer is not None and restorer is not None
        mutate(ours.work, fraction=0.01, seed=1)
        result.rows.append(asyncio.run(timed_rpc(capturer, CHANGED)))
        capturer.stop()
        ours.target.mkdir()  # a daemon serves an existing workspace root
        restorer.start()
        result.rows.append(asyncio.run(timed_rpc(restorer, RESTORE)))
    finally:
        for daemon in (capturer, restorer):
            if daemon is not None:
                daemon.close()
    result.stored_bytes[OURS_DAEMON] = ours.stored(server)


def run_restic(run: Run) -> None:
    result, corpus, scratch, server, via, proxy = run.fields()
    unavailable = ensure_tools({"restic"}, install=run.install).get("restic")
    if unavailable:
        print(f"   restic: skipped ({unavailable})")
        return
    work, target = scratch.path("restic-work"), scratch.path("restic-restore")
    cache, password = scratch.path("restic-cache"), scratch.path("restic-password")
    scratch.aside(target)
    _copy_tree(corpus, work, scratch)
    password.write_text(RESTIC_PASSWORD)

    def fresh_repository() -> tuple[str, dict[str, str]]:
        """A new repository (and cache), initialised: a backup into it is cold."""
        scratch.aside(cache)
        prefix = f"restic-{uuid.uuid4().hex[:12]}"
        env = {
            **os.environ,
            "AWS_ACCESS_KEY_ID": via.access_key_id,
            "AWS_SECRET_ACCESS_KEY": via.secret_access_key,
            "RESTIC_REPOSITORY": f"s3:{via.endpoint}/{via.bucket}/{prefix}",
            "RESTIC_PASSWORD_FILE": str(password),
            "RESTIC_CACHE_DIR": str(cache),
        }
        _timed(["restic", "init", "-q"], env, proxy)
        return prefix, env

    # Relative paths (as ours records them): back up from inside the work tree.
    backup = ["restic", "backup", "-q", "--host", "bench", "."]

    def timed(operation: str, command: list[str], env: dict[str, str], cwd: Path | None) -> Row:
        seconds, requests, load, _ = _timed(command, env, proxy, cwd=cwd)
        print(f"   restic {operation}: {seconds:.2f} s, {sum(requests.values())} requests")
        return Row("restic", operation, seconds, requests, load)

    colds = []
    for _ in range(run.cold_runs):
        prefix, env = fresh_repository()
        colds.append(timed(COLD, backup, env, work))
    result.rows.append(_median_row(colds))
    mutate(work, fraction=0.01, seed=1)
    result.rows.append(timed(CHANGED, backup, env, work))
    restore = ["restic", "restore", "-q", "latest", "--target", str(target)]
    result.rows.append(timed(RESTORE, restore, env, None))
    result.stored_bytes["restic"] = {"bucket": _stored(server, prefix)}


def _median_row(rows: list[Row]) -> Row:
    """One row for several timed runs of one operation: the median seconds
    (the middle run's requests and load), every run's seconds in ``runs``."""
    ordered = sorted(rows, key=lambda row: row.seconds)
    middle = ordered[len(ordered) // 2]
    runs = [row.seconds for row in rows]
    if len(rows) == 1:
        return middle
    note = "; ".join(filter(None, [middle.note, f"median of {len(rows)}, min {ordered[0].seconds:.2f} s"]))  # fmt: skip
    return Row(
        middle.tool,
        middle.operation,
        statistics.median(runs),
        middle.requests,
        middle.load_1min,
        note,
        runs,
    )


def _stored_total(result: Result, tool: str) -> int | None:
    stored = result.stored_bytes.get(tool)
    return None if stored is None else sum(stored.values())


def goals(result: Result) -> list[tuple[str, str, bool | None]]:
    """(goal, what was measured, met?) for the issue's three goals, for each of
    our ways of running that ran (the daemon's is the one the goal states its
    goals for; the fresh process is restic's way)."""
    by = {(row.tool, row.operation): row for row in result.rows}
    restic_cold = by.get(("restic", COLD))
    theirs = _stored_total(result, "restic")
    out: list[tuple[str, str, bool | None]] = []
    for tool in OURS_TOOLS.values():
        cold = by.get((tool, COLD))
        if cold is not None:
            out.append(
                (
                    f"{tool}: cold capture in <= {GOAL_COLD_REQUESTS} requests",
                    f"{cold.total} requests",
                    cold.total <= GOAL_COLD_REQUESTS,
                )
            )
        ours = _stored_total(result, tool)
        if ours is not None and theirs:
            ratio = ours / theirs
            out.append(
                (
                    f"{tool}: stored bytes <= {GOAL_STORED_RATIO}x restic's",
                    f"{ratio:.2f}x ({ours:,} vs {theirs:,} bytes)",
                    ratio <= GOAL_STORED_RATIO,
                )
            )
        if cold is not None and restic_cold is not None:
            speedup = restic_cold.seconds / cold.seconds
            out.append(
                (
                    f"{tool}: cold capture >= {GOAL_COLD_SPEEDUP}x faster than restic (same S3)",
                    f"{speedup:.2f}x ({cold.seconds:.2f} s vs {restic_cold.seconds:.2f} s)",
                    speedup >= GOAL_COLD_SPEEDUP,
                )
            )
    return out


def render(result: Result) -> str:
    lines = [
        f"# Bucket requests: {result.files:,} small files, SeaweedFS S3 on loopback",
        "",
        "Written by `python -m benchmarks.bucket_requests`. Requests are counted exactly",
        "by a proxy in front of the bucket; seconds are whole processes (the daemon's",
        "rows: the RPC to a running daemon), and for a cold capture the median of its",
        "runs, each into a fresh store and prefix (every run's seconds are in the JSON);",
        "`load` is the 1-minute load average when the operation started (2 cores, shared).",
        "",
        "| tool | operation | seconds | " + " | ".join(KINDS) + " | other | total | load | note |",
        "|---|---|---:|" + "---:|" * (len(KINDS) + 3) + "---|",
    ]
    for row in result.rows:
        cols = columns(row.requests)
        counts = " | ".join(f"{cols[k]:,}" for k in (*KINDS, "other"))
        lines.append(
            f"| {row.tool} | {row.operation} | {row.seconds:.2f} | {counts} | {row.total:,} "
            f"| {row.load_1min:.1f} | {row.note} |"
        )
    lines += ["", "| tool | stored bytes |", "|---|---|"]
    for tool, parts in result.stored_bytes.items():
        detail = ", ".join(f"{name} {n:,}" for name, n in parts.items())
        lines.append(f"| {tool} | {sum(parts.values()):,} ({detail}) |")
    lines += ["", "| goal | measured | met |", "|---|---|---|"]
    for goal, measured, met in goals(result):
        lines.append(f"| {goal} | {measured} | {'yes' if met else 'no'} |")
    lines += ["", "Raw request kinds per row are in the JSON.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bucket_requests")
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--tools", default="ours,daemon,restic")
    parser.add_argument("--cold-runs", type=int, default=3)
    parser.add_argument(
        "--scratch",
        type=Path,
        default=Path(os.environ.get("CHECKPOINTD_BENCH_SCRATCH", "/tmp/checkpointd-bench")),
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "bucket_requests")
    parser.add_argument("--no-install", action="store_true", help="never apt-get install restic")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from tests.fixtures.bucket_counter import counted
    from tests.fixtures.s3 import run_seaweedfs

    # SIGTERM unwinds like Ctrl-C, so the SeaweedFS server is stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    corpus = ensure_corpus(
        CorpusSpec("many-small", "many-small", {"files": args.files}),
        args.scratch / "corpora" / f"many-small-{args.files}",
    )
    # The Scratch first finishes what earlier benchmark runs left deleting in
    # the background under the same scratch dir, then waits out the pause; the
    # trees this run is done with go to its trash, deleted after the timings.
    scratch = Scratch(args.scratch / "bucket-requests")
    result = Result(files=args.files, machine={"nproc": os.cpu_count()})
    with run_seaweedfs() as server, counted(server) as (via, proxy):
        cold_runs = max(1, args.cold_runs)
        run = Run(result, corpus, scratch, server, via, proxy, cold_runs, not args.no_install)
        if "ours" in tools:
            run_ours(run)
        if "daemon" in tools:
            run_ours_daemon(run)
        if "restic" in tools:
            run_restic(run)
    text = render(result)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text(text)
    payload = asdict(result)
    payload["goals"] = [{"goal": g, "measured": m, "met": met} for g, m, met in goals(result)]
    args.out.with_suffix(".json").write_text(json.dumps(payload, indent=2) + "\n")
    scratch.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
