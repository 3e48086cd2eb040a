"""checkpointd's operations through the daemon: ``checkpointd serve`` plus its CLI.

A daemon serves one workspace, so captures go to a daemon on the working copy and
restores to a second one on the restore target; both share one SQLite store and
blob dir, as sidecars sharing a store would. Each timed run is the CLI client
(``python -m checkpointd capture|restore THREAD --json``), i.e. what an
orchestrator's shell-out costs end to end; daemon start-up is never timed.

Every operation is also timed through a warm gRPC client (``checkpointd
(daemon, warm)``), as an orchestrator holding a connection to its sidecar would,
so the time is the RPC's (the daemon's work plus the stream), without an
interpreter start per run; the issues' goals are stated for this client, and
the report's ratios are taken against its rows. Captures after the first and
the restore over a 1%-changed tree use one channel kept open across runs (the
goal "restore over 1% ≤ 2× no-change capture" compares these two rows); a cold
capture and a restore into an empty dir need a fresh daemon per run, so the
client opens its channel to each one and waits for SERVING before the timer
starts. Its row carries the daemon's peak RSS and the store bytes each
checkpoint added.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from .context import (
    APPEND_1MIB,
    CHANGED_1PCT,
    COLD,
    NO_CHANGE,
    RESTORE_EMPTY,
    RESTORE_OVER,
    CorpusRun,
    print_line,
)
from .corpus import disk_usage
from .timing import OURS, Measurement

DAEMON_TOOL = "checkpointd (daemon)"
WARM_TOOL = "checkpointd (daemon, warm)"
THREAD = "bench"
CHECKPOINTD = [sys.executable, "-m", "checkpointd"]
START_TIMEOUT_S = 60.0


class DaemonError(RuntimeError):
    """The daemon did not start serving; carries the tail of its log."""


class Daemon:
    """One ``checkpointd serve`` process that we started, stopped by its pid."""

    def __init__(
        self,
        workspace: Path,
        store: str,
        blobs: str,
        data_dir: Path,
        log: Path,
        env: dict[str, str] | None = None,
    ) -> None:
        self.workspace, self.store, self.blobs, self.data_dir, self.log = (
            workspace, store, blobs, data_dir, log,
        )  # fmt: skip
        # None: this process's environment (a bucket's credentials come this way).
        self.env = env
        # Unix socket paths are limited to ~107 bytes: keep it short, outside the scratch.
        self._socket_dir = Path(tempfile.mkdtemp(prefix="cpb-"))
        self.address = f"unix://{self._socket_dir / 'd.sock'}"
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None

    def start(self) -> None:
        """Start serving and wait for SERVING. Raises DaemonError when it does not."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._log_file = self.log.open("ab")
        self._proc = subprocess.Popen(
            [*CHECKPOINTD, "serve", "--workspace", str(self.workspace),
             "--data-dir", str(self.data_dir), "--store", self.store, "--blobs", self.blobs,
             "--listen", self.address, "--log-level", "WARNING"],
            stdin=subprocess.DEVNULL, stdout=self._log_file, stderr=subprocess.STDOUT,
            start_new_session=True, env=self.env,
        )  # fmt: skip
        health = subprocess.run(
            [*CHECKPOINTD, "health", "--address", self.address, "--wait", str(START_TIMEOUT_S)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if health.returncode != 0 or self._proc.poll() is not None:
            self.stop()
            tail = self.log.read_text(errors="replace").strip().splitlines()[-5:]
            raise DaemonError(f"checkpointd serve did not start: {' | '.join(tail)}")

    def stop(self) -> None:
        """SIGTERM our daemon (it drains and closes its stores), SIGKILL if it hangs."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def kill(self) -> None:
        """SIGKILL our daemon: a crash (no drain; its leases and half-done work
        stay in the store). ``start`` again to restart it on the same data dir."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self.stop()

    def close(self) -> None:
        self.stop()
        for leftover in self._socket_dir.iterdir():
            leftover.unlink()
        self._socket_dir.rmdir()

    def peak_rss_mib(self) -> float | None:
        """The daemon's high-water RSS since it started (VmHWM), if it runs."""
        if self._proc is None:
            return None
        try:
            status = Path(f"/proc/{self._proc.pid}/status").read_text()
        except OSError:
            return None
        for line in status.splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return None

    def reset_peak_rss(self) -> None:
        """Start the high-water mark afresh (``clear_refs`` 5, Linux 4.0+; needs
        to own the process or be root), so a later peak is of what ran since,
        not of the cold capture before it. Best effort: left as is when refused."""
        if self._proc is None:
            return
        try:
            Path(f"/proc/{self._proc.pid}/clear_refs").write_text("5")
        except OSError:
            pass

    def client(self, operation: str) -> list[str]:
        return [*CHECKPOINTD, operation, THREAD, "--address", self.address, "--json"]


def note_run(measurement: Measurement, daemon: Daemon) -> None:
    """Keep the daemon's own view of each run (``duration_ms`` of the engine, from
    the client's JSON) and the daemon's peak RSS; the timed RSS is the client's."""
    engine, stats = [], None
    for output in measurement.outputs:
        try:
            done = json.loads(output)
        except ValueError:
            continue
        stats = done.get("stats") or stats
        duration = (done.get("stats") or done).get("duration_ms")
        if duration is not None:
            engine.append(int(duration) / 1000)  # protobuf int64 arrives as a string
    if engine:
        measurement.notes["engine_median_s"] = round(statistics.median(engine), 6)
    if stats:
        measurement.notes["stats"] = {k: int(v) for k, v in stats.items() if str(v).isdigit()}
    peak = daemon.peak_rss_mib()
    if peak is not None:
        measurement.notes["daemon_peak_rss_mib"] = round(peak, 1)


def warm_bench(
    ctx: CorpusRun,
    op: str,
    daemon: Daemon,
    store_dir: Path,
    *,
    prepare: Callable[[int], object] | None = None,
    warmup: bool = False,
    restore: bool = False,
    restarts: bool = False,
) -> Measurement:
    """Time ``ctx.runs`` captures (``restore``: restores) over ONE gRPC channel
    to ``daemon`` (after ``ctx.warmups`` untimed ones when ``warmup``),
    ``prepare(run)`` untimed before each. The RSS column is the daemon's peak
    (VmHWM) during these runs alone, the client being this process;
    ``stored_bytes_per_run`` is the store's growth per timed run.

    ``restarts``: ``prepare`` starts a fresh daemon (a cold capture, a restore
    into a new sandbox), so each run opens its channel after it and waits for
    SERVING, untimed: the time is still the RPC's alone."""
    from checkpointd.service.client import Client

    what = "Restore" if restore else "Capture"
    channel = "a channel opened per fresh daemon" if restarts else "one channel"
    measurement = Measurement(ctx.name, op, WARM_TOOL, OURS, f"{what} over {channel} to {daemon.address}")  # fmt: skip
    warmups = ctx.warmups if warmup else 0

    daemon.reset_peak_rss()

    async def go() -> None:
        stored_before = 0
        client: Client | None = None
        for index in range(warmups + ctx.runs):
            run = index - warmups
            if prepare is not None:
                prepare(run)
            if run == 0:
                stored_before = disk_usage(store_dir)
            if restarts or client is None:
                if client is not None:
                    await client.close()
                client = Client(daemon.address, timeout=ctx.timeout_s)
                await client.wait_serving(within=START_TIMEOUT_S)
            started = time.perf_counter()
            if restore:
                restored = await client.restore(THREAD)
                seconds = time.perf_counter() - started
                if run >= 0:
                    measurement.times.append(seconds)
                    measurement.max_rss_kib.append(int((daemon.peak_rss_mib() or 0) * 1024))
                    duration = {"duration_ms": restored.duration_ms, "phases_ms": {}}
                    measurement.outputs.append(json.dumps({"stats": duration}))
                continue
            done = await client.capture(THREAD)
            seconds = time.perf_counter() - started
            if run < 0:
                continue
            measurement.times.append(seconds)
            measurement.max_rss_kib.append(int((daemon.peak_rss_mib() or 0) * 1024))
            stats = {
                "duration_ms": done.stats.duration_ms,
                "entries": done.stats.entries,
                "files_hashed": done.stats.files_hashed,
                "files_reused": done.stats.files_reused,
                "bytes_hashed": done.stats.bytes_hashed,
                "blobs_uploaded": done.stats.blobs_uploaded,
                "phases_ms": dict(done.stats.phases_ms),
            }
            measurement.outputs.append(json.dumps({"stats": stats}))
        if client is not None:
            await client.close()
        measurement.notes["stored_bytes_per_run"] = (disk_usage(store_dir) - stored_before) // max(
            ctx.runs, 1
        )

    try:
        asyncio.run(go())
    except Exception as exc:  # recorded as the row's error, like a failing command
        measurement.error = f"{type(exc).__name__}: {exc}"[:300]
    if measurement.outputs:
        phases = [json.loads(o)["stats"]["phases_ms"] for o in measurement.outputs]
        measurement.notes["phases_ms_median"] = {
            name: statistics.median(p.get(name, 0) for p in phases) for name in phases[-1]
        }
    ctx.results.append(measurement)
    print_line(measurement)
    return measurement


def cli_available() -> str | None:
    """None when ``checkpointd serve`` can run here, else why not."""
    probe = subprocess.run([*CHECKPOINTD, "serve", "--help"], capture_output=True, check=False)
    return None if probe.returncode == 0 else "`python -m checkpointd serve` is not there yet"


def daemon_suite(ctx: CorpusRun) -> None:
    """Every operation through the daemon and its CLI client, one client per run."""
    missing = cli_available()
    if missing:
        print(f"   checkpointd daemon: skipped ({missing})")
        return
    base = ctx.tool_dir("checkpointd-daemon")
    store_dir = base / "store"
    store, blobs = f"sqlite://{store_dir}/checkpoints.db", f"file://{store_dir}/blobs"
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    capturer = Daemon(ctx.work, store, blobs, base / "data", base / "capture-daemon.log")
    restorer = Daemon(ctx.target, store, blobs, base / "restore-data", base / "restore-daemon.log")
    try:
        ctx.fresh_work()
        base.mkdir(parents=True, exist_ok=True)

        def fresh_store(_run: int) -> None:
            capturer.stop()
            ctx.scratch.aside(store_dir, capturer.data_dir)
            (store_dir / "blobs").mkdir(parents=True)
            capturer.start()

        capture = capturer.client("capture")
        cold = ctx.bench(COLD, DAEMON_TOOL, OURS, capture, prepare=fresh_store, env=env)
        note_run(cold, capturer)
        if cold.error:
            return
        cold.notes["stored_bytes"] = disk_usage(store_dir)
        # From a held client (a fresh daemon and store per run, as for the CLI runs).
        warm_cold = warm_bench(ctx, COLD, capturer, store_dir, prepare=fresh_store, restarts=True)
        note_run(warm_cold, capturer)
        if not warm_cold.error:
            warm_cold.notes["stored_bytes"] = disk_usage(store_dir)
        note_run(ctx.bench(NO_CHANGE, DAEMON_TOOL, OURS, capture, warmup=True, env=env), capturer)
        # A fresh daemon (its stat cache stays on disk), so its peak RSS is of
        # no-change captures, not of the cold one before (Python keeps its heap).
        capturer.stop()
        capturer.start()
        note_run(warm_bench(ctx, NO_CHANGE, capturer, store_dir, warmup=True), capturer)
        changed = ctx.bench(
            CHANGED_1PCT, DAEMON_TOOL, OURS, capture,
            prepare=lambda run: ctx.mutate_work(CHANGED_1PCT, run), env=env,
        )  # fmt: skip
        note_run(changed, capturer)
        # Other edits than the CLI runs' (same size: 1% of the files), same for every run.
        warm_changed = warm_bench(
            ctx, CHANGED_1PCT, capturer, store_dir,
            prepare=lambda run: ctx.mutate_work(CHANGED_1PCT, 1000 + run),
        )  # fmt: skip
        note_run(warm_changed, capturer)
        if ctx.big_file:
            appended = ctx.bench(
                APPEND_1MIB, DAEMON_TOOL, OURS, capture,
                prepare=lambda run: ctx.append_work(APPEND_1MIB, run), env=env,
            )  # fmt: skip
            note_run(appended, capturer)
        capturer.stop()

        def empty_target(_run: int) -> None:
            restorer.stop()
            ctx.fresh_target()
            ctx.scratch.aside(restorer.data_dir)
            restorer.start()

        restore = restorer.client("restore")
        empty = ctx.bench(RESTORE_EMPTY, DAEMON_TOOL, OURS, restore, prepare=empty_target, env=env)
        note_run(empty, restorer)
        ctx.verify_restore(empty)
        # The same restore from an orchestrator holding a client (a fresh
        # daemon and an empty target per run, as for a new sandbox).
        warm_empty = warm_bench(
            ctx, RESTORE_EMPTY, restorer, store_dir, prepare=empty_target, restore=True,
            restarts=True,
        )  # fmt: skip
        note_run(warm_empty, restorer)
        ctx.verify_restore(warm_empty)
        if not empty.error:
            over = ctx.bench(
                RESTORE_OVER, DAEMON_TOOL, OURS, restore,
                prepare=lambda run: ctx.mutate_target(RESTORE_OVER, run), env=env,
            )  # fmt: skip
            note_run(over, restorer)
            ctx.verify_restore(over)
            # Other edits than the CLI runs' (same size: 1% of the files), over
            # one channel, as the warm no-change capture it is compared with.
            warm_over = warm_bench(
                ctx, RESTORE_OVER, restorer, store_dir,
                prepare=lambda run: ctx.mutate_target(RESTORE_OVER, 1000 + run), restore=True,
            )  # fmt: skip
            note_run(warm_over, restorer)
            ctx.verify_restore(warm_over)
    except DaemonError as exc:
        print(f"   checkpointd daemon: stopped ({exc})")
        ctx.problems.append(f"{ctx.name}: the daemon suite stopped early: {exc}")
    finally:
        capturer.close()
        restorer.close()
