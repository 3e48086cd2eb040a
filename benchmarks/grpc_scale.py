"""The gRPC contract at scale: SweepBlobs over a big bucket, ListThreads
over many threads, through a real daemon.

    .venv/bin/python -m benchmarks.grpc_scale sweep --keys 1000000
    .venv/bin/python -m benchmarks.grpc_scale threads --threads 10000

``sweep`` writes N unreferenced blob keys straight into a local blob directory
(empty files aged two hours: the sweep lists, condemns and deletes, it never
reads), then times a dry run and a real sweep through SweepBlobs and reads the
daemon's peak RSS (VmHWM). The floor is the unary reply of protocol 1, which
failed past ~44,000 keys (4 MiB). ``threads`` appends one checkpoint per thread
to SQLite and to a PostgreSQL 15 server of its own, then times listing every
thread through ListThreads (page sizes 100 and 1000) against GetHead per thread
(what a client without ListThreads could do, knowing the names).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from checkpointd.model import Checkpoint
from checkpointd.service.client import Client
from checkpointd.store import open_store


def _peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


class _Daemon:
    def __init__(self, base: Path, store: str, blobs: str) -> None:
        self.base = base
        (base / "ws").mkdir(exist_ok=True)
        self.socket = base / "data" / "checkpointd.sock"
        env = {k: v for k, v in os.environ.items() if not k.startswith("CHECKPOINTD_")}
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "checkpointd", "serve",
                "--workspace", str(base / "ws"), "--data-dir", str(base / "data"),
                "--store", store, "--blobs", blobs, "--log-level", "WARNING",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.address = f"unix://{self.socket}"

    async def ready(self) -> None:
        async with Client(self.address, timeout=5) as client:
            await client.wait_serving(within=60)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def _write_keys(blob_dir: Path, count: int) -> None:
    directory = blob_dir / "sandbox-files" / "blake3"
    directory.mkdir(parents=True, exist_ok=True)
    stamp = time.time() - 7200
    for index in range(count):
        path = directory / f"{index:064x}"
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
        os.utime(path, (stamp, stamp))


async def bench_sweep(keys: int) -> dict[str, Any]:
    base = Path(tempfile.mkdtemp(prefix="cpd-bench-", dir="/tmp"))
    try:
        blob_dir = base / "blobs"
        began = time.monotonic()
        _write_keys(blob_dir, keys)
        made_s = time.monotonic() - began
        daemon = _Daemon(base, f"sqlite://{base / 'checkpoints.db'}", f"file://{blob_dir}")
        try:
            await daemon.ready()
            rss_idle = _peak_rss_kib(daemon.proc.pid)
            messages = 0
            largest = 0

            def count(batch: Any) -> None:
                nonlocal messages, largest
                messages += 1
                largest = max(largest, batch.ByteSize())

            async with Client(daemon.address, timeout=3600) as client:
                began = time.monotonic()
                dry = await client.sweep(0, dry_run=True, on_batch=count)
                dry_s = time.monotonic() - began
                rss_dry = _peak_rss_kib(daemon.proc.pid)
                began = time.monotonic()
                real = await client.sweep(0, on_batch=count)
                real_s = time.monotonic() - began
            rss_peak = _peak_rss_kib(daemon.proc.pid)
        finally:
            daemon.stop()
        left = sum(1 for _ in (blob_dir / "sandbox-files" / "blake3").iterdir())
        assert dry.deleted_count == keys and real.deleted_count == keys and left == 0
        return {
            "keys": keys,
            "make_keys_s": round(made_s, 1),
            "dry_run_s": round(dry_s, 1),
            "sweep_s": round(real_s, 1),
            "keys_per_s": round(keys / real_s),
            "messages": messages,
            "largest_message_bytes": largest,
            "daemon_peak_rss_mib": {
                "idle": round(rss_idle / 1024),
                "after_dry_run": round(rss_dry / 1024),
                "after_sweep": round(rss_peak / 1024),
            },
            "unary_floor": "protocol 1 failed past ~44,000 keys (reply > 4 MiB)",
        }
    finally:
        shutil.rmtree(base, ignore_errors=True)


async def _fill_threads(url: str, threads: int) -> None:
    store = await open_store(url)
    try:
        for index in range(threads):
            thread = f"thread-{index:06d}"
            async with await store.acquire_writer(thread) as lease:
                await store.append(
                    Checkpoint(id=f"cp-{index:06d}", thread_id=thread,
                               parent_checkpoint_id=None, created_at=index + 1),
                    None,
                    lease,
                )  # fmt: skip
    finally:
        await store.aclose()


async def _time_listing(address: str, threads: int) -> dict[str, float]:
    out: dict[str, float] = {}
    async with Client(address, timeout=600) as client:
        for page_size in (100, 1000):
            began = time.monotonic()
            listed = [t async for t in client.list_threads(page_size=page_size)]
            out[f"list_threads_page_{page_size}_s"] = round(time.monotonic() - began, 3)
            assert len(listed) == threads
        began = time.monotonic()
        for index in range(threads):
            await client.get_head(f"thread-{index:06d}")
        out["get_head_each_s"] = round(time.monotonic() - began, 3)
    out["ratio_get_head_each_over_list_page_1000"] = round(
        out["get_head_each_s"] / out["list_threads_page_1000_s"], 1
    )
    return out


async def bench_threads(threads: int) -> dict[str, Any]:
    from tests.fixtures.postgres import PostgresServer  # run from the repository root

    results: dict[str, Any] = {"threads": threads}
    base = Path(tempfile.mkdtemp(prefix="cpd-bench-", dir="/tmp"))
    server = PostgresServer(durable=True)
    try:
        server.start()
        for name, url in (
            ("sqlite", f"sqlite://{base / 'threads.db'}"),
            ("postgresql", server.create_schema()),
        ):
            began = time.monotonic()
            await _fill_threads(url, threads)
            fill_s = time.monotonic() - began
            run_dir = base / name
            run_dir.mkdir()
            daemon = _Daemon(run_dir, url, f"file://{run_dir / 'blobs'}")
            try:
                await daemon.ready()
                results[name] = {
                    "fill_s": round(fill_s, 1),
                    **await _time_listing(daemon.address, threads),
                }
            finally:
                daemon.stop()
    finally:
        server.close()
        shutil.rmtree(base, ignore_errors=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("sweep").add_argument("--keys", type=int, default=1_000_000)
    sub.add_parser("threads").add_argument("--threads", type=int, default=10_000)
    args = parser.parse_args()
    if args.what == "sweep":
        result = asyncio.run(bench_sweep(args.keys))
    else:
        result = asyncio.run(bench_threads(args.threads))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
