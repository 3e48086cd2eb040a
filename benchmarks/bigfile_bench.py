"""Peak memory capturing one large file (under 100 MB for 2 GiB).

    .venv/bin/python -m benchmarks.bigfile_bench [--gib 2] [--runs 1] [--tools engine,daemon,restic,cp]

Two workspaces of one incompressible file each, generated on demand into the
scratch dir (``$CHECKPOINTD_BENCH_SCRATCH``, default ``/tmp/checkpointd-bench``;
never committed, reused while their size matches): ``plain`` and ``secrets``
(the same size with a secret every 64 MiB and across 1 MiB read boundaries,
captured with that secret, so every byte goes through the zeroing stream).
For each, a cold capture into a fresh SQLite store and ``file://`` blob dir:

- ``engine``: ``capture_checkpoint`` in a fresh ``python`` process under GNU
  time (its peak RSS, ``%M``);
- ``daemon``: ``checkpointd serve`` plus the CLI client; the daemon's peak RSS
  is its ``VmHWM`` right after the capture (a fresh daemon per run);
- ``restic``: ``restic backup`` of the same workspace (plain only), GNU time;
- ``cp``: the write floor, ``cp`` of the file into the blob dir's filesystem.

``--s3`` also captures each case (engine and daemon) into a SeaweedFS S3
server on loopback (the tests' fixture, ``tests/fixtures/s3.py``): multipart
uploads through obstore.

Prints one table (wall seconds, peak RSS MiB, the 1-minute load average when
each run started) and writes ``benchmarks/results/bigfile.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import blake3

from checkpointd import _native

from .daemon import CHECKPOINTD, THREAD, Daemon

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
GNU_TIME = "/usr/bin/time"
SECRET = b"bench-secret-7f3a9c"
SECRET_EVERY = 64 << 20
CHUNK = 16 << 20
GOAL_MIB = 100 * 1000 * 1000 / (1 << 20)  # "under 100 MB"

ENGINE_CAPTURE = """
import asyncio, json, sys
from checkpointd.blobs import open_blobs
from checkpointd.capture import CaptureOptions, capture_checkpoint
from checkpointd.store import open_store

workspace, store_url, blobs_url, data_dir, secret = sys.argv[1:6]

async def main():
    async with await open_store(store_url) as store:
        result = await capture_checkpoint(
            workspace, store, open_blobs(blobs_url), "bench",
            CaptureOptions(data_dir=data_dir, secrets=[secret.encode()] if secret else ()),
        )
    print(json.dumps({"bytes_uploaded": result.stats.bytes_uploaded,
                      "phases_ms": result.stats.phases_ms}))

asyncio.run(main())
"""


@dataclass
class Row:
    case: str
    tool: str
    seconds: float
    peak_rss_mib: float
    load_1min: float
    note: str = ""


def _generate(path: Path, size: int, with_secrets: bool) -> None:
    """Incompressible bytes from a seeded BLAKE3 stream (same file every time)."""
    if path.exists() and path.stat().st_size == size:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    source = blake3.blake3(b"checkpointd bigfile bench")
    with partial.open("wb") as out:
        for offset in range(0, size, CHUNK):
            piece = bytearray(source.digest(length=min(CHUNK, size - offset), seek=offset))
            if with_secrets:
                for at in range(1 << 20, len(piece), 1 << 20):
                    # Every 64 MiB: one across a 1 MiB read boundary, one just after.
                    if (offset + at) % SECRET_EVERY == 1 << 20:
                        piece[at - 5 : at - 5 + len(SECRET)] = SECRET
                        piece[at + 4096 : at + 4096 + len(SECRET)] = SECRET
            assert len(piece) == min(CHUNK, size - offset)
            out.write(piece)
    partial.rename(path)


def _gnu_time(command: list[str], env: dict[str, str] | None = None) -> tuple[float, float, str]:
    """(wall s, peak RSS MiB, stdout) of ``command`` under GNU time."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as report:
        started = time.perf_counter()
        done = subprocess.run(
            [GNU_TIME, "-f", "%M", "-o", report.name, *command],
            capture_output=True, text=True, env=env, check=False,
        )  # fmt: skip
        wall = time.perf_counter() - started
        if done.returncode != 0:
            raise RuntimeError(f"{command[0]} failed: {done.stderr[-2000:]}")
        peak_kib = int(Path(report.name).read_text().split()[-1])
    return wall, peak_kib / 1024, done.stdout


def _fresh(scratch: Path, name: str) -> Path:
    place = scratch / "runs" / name
    if place.exists():
        shutil.rmtree(place)
    place.mkdir(parents=True)
    return place


def _drop_run(place: Path) -> None:
    shutil.rmtree(place, ignore_errors=True)


def _engine(case: str, workspace: Path, secret: bytes, scratch: Path, s3: Any = None) -> Row:
    place = _fresh(scratch, f"engine-{case}")
    blobs = s3.url(f"bigfile-{uuid.uuid4().hex}") if s3 else f"file://{place / 'blobs'}"
    load = os.getloadavg()[0]
    wall, peak, out = _gnu_time(
        [sys.executable, "-c", ENGINE_CAPTURE, str(workspace),
         f"sqlite:///{place / 'store.db'}", blobs, str(place / "data"), secret.decode()],
    )  # fmt: skip
    stats = json.loads(out.strip().splitlines()[-1])
    _drop_run(place)
    return Row(case, "checkpointd (engine)", wall, peak, load, f"phases_ms {stats['phases_ms']}")


def _daemon(case: str, workspace: Path, secret: bytes, scratch: Path, s3: Any = None) -> Row:
    place = _fresh(scratch, f"daemon-{case}")
    blobs = s3.url(f"bigfile-{uuid.uuid4().hex}") if s3 else f"file://{place / 'blobs'}"
    daemon = Daemon(
        workspace, f"sqlite:///{place / 'store.db'}", blobs, place / "data", place / "daemon.log"
    )
    # The client sends the secret with the request (--secret-env names its variable).
    env = {**os.environ, "BENCH_SECRET": secret.decode()}
    daemon.start()
    try:
        before = daemon.peak_rss_mib() or 0.0
        load = os.getloadavg()[0]
        command = daemon.client("capture")
        if secret:
            command += ["--secret-env", "BENCH_SECRET"]
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
        if done.returncode != 0:
            log = (place / "daemon.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"capture through the daemon failed: {done.stdout}{log}")
        wall = time.perf_counter() - started
        peak = daemon.peak_rss_mib() or 0.0
    finally:
        daemon.close()
    _drop_run(place)
    return Row(case, "checkpointd (daemon)", wall, peak, load, f"idle daemon {before:.1f} MiB")


def _restic(case: str, workspace: Path, scratch: Path) -> Row:
    place = _fresh(scratch, f"restic-{case}")
    env = {**os.environ, "RESTIC_PASSWORD": "bench", "RESTIC_REPOSITORY": str(place / "repo")}
    subprocess.run(["restic", "init", "-q"], check=True, env=env, capture_output=True)
    load = os.getloadavg()[0]
    wall, peak, _ = _gnu_time(["restic", "backup", "-q", str(workspace)], env=env)
    _drop_run(place)
    return Row(case, "restic backup", wall, peak, load)


def _cp(case: str, workspace: Path, scratch: Path) -> Row:
    place = _fresh(scratch, f"cp-{case}")
    load = os.getloadavg()[0]
    wall, peak, _ = _gnu_time(
        ["sh", "-c", f"cp {workspace}/big.bin {place}/ && sync -f {place}/big.bin"]
    )
    _drop_run(place)
    return Row(case, "cp + sync (write floor)", wall, peak, load)


def _markdown(rows: list[Row], gib: float) -> str:
    lines = [
        f"# Capturing one {gib:g} GiB file (cold, SQLite + file:// blobs)",
        "",
        f"Goal: peak RSS under 100 MB ({GOAL_MIB:.1f} MiB) for the daemon or engine process.",
        "",
        "| case | tool | wall s | peak RSS MiB | load (1 min) | note |",
        "|---|---|---:|---:|---:|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row.case} | {row.tool} | {row.seconds:.2f} | {row.peak_rss_mib:.1f} | "
            f"{row.load_1min:.2f} | {row.note} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bigfile_bench", description=__doc__)
    parser.add_argument("--gib", type=float, default=2.0, help="file size in GiB")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--tools", default="engine,daemon,restic,cp")
    parser.add_argument("--cases", default="plain,secrets")
    parser.add_argument("--scratch", type=Path,
                        default=Path(os.environ.get("CHECKPOINTD_BENCH_SCRATCH", "/tmp/checkpointd-bench")))  # fmt: skip
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--s3", action="store_true", help="also capture into SeaweedFS (S3)")
    args = parser.parse_args(argv)
    if getattr(_native, "BUILD_PROFILE", "") != "release":
        print("refusing to benchmark a debug build (make build)", file=sys.stderr)
        return 2
    tools = set(args.tools.split(","))
    size = int(args.gib * (1 << 30))
    scratch = args.scratch / "bigfile"
    rows: list[Row] = []
    _run_cases(args, tools, size, scratch, rows)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bigfile.json").write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")
    (args.out / "bigfile.md").write_text(_markdown(rows, args.gib))
    print(_markdown(rows, args.gib))
    return 0


@contextlib.contextmanager
def seaweedfs() -> Iterator[Any]:
    """The tests' SeaweedFS server, with its credentials in our environment
    (the daemon and the engine processes inherit them)."""
    from tests.fixtures import s3 as fixture

    servers = fixture.s3_server._get_wrapped_function()()
    server = next(servers)
    saved = dict(os.environ)
    os.environ.update(server.env())
    try:
        yield server
    finally:
        os.environ.clear()
        os.environ.update(saved)
        next(servers, None)


def _run_cases(
    args: argparse.Namespace, tools: set[str], size: int, scratch: Path, rows: list[Row]
) -> None:
    for case in args.cases.split(","):
        workspace = scratch / f"ws-{case}"
        secret = SECRET if case == "secrets" else b""
        _generate(workspace / "big.bin", size, with_secrets=bool(secret))
        subprocess.run(["cat", str(workspace / "big.bin")], stdout=subprocess.DEVNULL, check=True)
        for _ in range(args.runs):
            first = len(rows)
            if "engine" in tools:
                rows.append(_engine(case, workspace, secret, scratch))
            if "daemon" in tools:
                rows.append(_daemon(case, workspace, secret, scratch))
            for measure in (_engine, _daemon) if args.s3 else ():
                # A fresh server each time: SeaweedFS frees deleted space only
                # when it compacts, and the test server holds a few GiB.
                with seaweedfs() as s3:
                    row = measure(f"{case}, s3", workspace, secret, scratch, s3)
                rows.append(dataclasses.replace(row, tool=row.tool + " to S3"))
            if "restic" in tools and not secret and shutil.which("restic"):
                rows.append(_restic(case, workspace, scratch))
            if "cp" in tools and not secret:
                rows.append(_cp(case, workspace, scratch))
            for row in rows[first:]:
                print(f"{row.case:12} {row.tool:32} {row.seconds:7.2f} s {row.peak_rss_mib:7.1f} MiB "
                      f"load {row.load_1min:.2f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["CHECKPOINTD", "THREAD", "main"]
