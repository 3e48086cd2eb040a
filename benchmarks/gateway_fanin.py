"""Connection fan-in: N simulated sidecars capturing through one gateway vs each
holding its own PostgreSQL pool (docs/gateway.md).

    python -m benchmarks.gateway_fanin --sidecars 100 --captures 5 --processes 4

A simulated sidecar is what a real one does per capture, without its own gRPC
daemon: ``capture_checkpoint`` of a small workspace (one file changed each time)
into its own thread, with a store and a blob store. Direct: each sidecar opens
its own ``PostgresCheckpointStore`` (a pool of up to 5 connections, as every
real sidecar would) and writes the blobs itself. Gateway: each sidecar has a
``RemoteCheckpointStore`` + ``RemoteBlobStore`` to one ``checkpointd gateway``
(plaintext on loopback, ``--pool-max-size`` connections). The bucket is a local
directory in both setups, so the numbers compare the store path. The sidecars
run as concurrent tasks in ``--processes`` worker processes; they start together
and each makes ``--captures`` captures. Reported: captures per second over the
whole run, p50/p99 latency, the peak number of PostgreSQL connections (polled
from pg_stat_activity), captures that failed, and the blob bytes that went
through the gateway (streamed; presigned URLs are not built yet).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

FILES_PER_WORKSPACE = 20
FILE_BYTES = 4096
# A capture that takes longer counts as failed (a hang shows as errors, not silence).
CAPTURE_TIMEOUT_S = 120.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _sidecar(
    index: int, mode: str, url: str, base: Path, captures: int, token: str, start_at: float
) -> dict[str, Any]:
    from checkpointd.blobs import open_blobs
    from checkpointd.capture import CaptureOptions, capture_checkpoint

    workspace = base / f"ws-{index}"
    data_dir = base / f"data-{index}"
    workspace.mkdir(parents=True, exist_ok=True)
    data_dir.mkdir(parents=True, exist_ok=True)
    for n in range(FILES_PER_WORKSPACE):
        (workspace / f"f{n}.txt").write_bytes(os.urandom(FILE_BYTES))
    if mode == "direct":
        from checkpointd.store.postgres import open_postgres_store

        store: Any = await open_postgres_store(url)
        blobs: Any = open_blobs(f"file://{base / 'bucket'}")
    else:
        from checkpointd.gateway.remote import (
            GatewayConnection,
            RemoteBlobStore,
            RemoteCheckpointStore,
        )

        connection = GatewayConnection([url], lambda: token, tls=False)
        store = await RemoteCheckpointStore.open(connection)
        blobs = RemoteBlobStore(connection)
    latencies: list[float] = []
    errors: list[str] = []
    await asyncio.sleep(max(0.0, start_at - time.time()))
    try:
        for k in range(captures):
            (workspace / "f0.txt").write_bytes(os.urandom(FILE_BYTES))
            began = time.perf_counter()
            try:
                await asyncio.wait_for(
                    capture_checkpoint(
                        workspace,
                        store,
                        blobs,
                        f"sb-{index}/main",
                        CaptureOptions(data_dir=data_dir),
                    ),
                    CAPTURE_TIMEOUT_S,
                )
                latencies.append(time.perf_counter() - began)
            except Exception as error:  # noqa: BLE001 - counted and reported
                errors.append(f"{type(error).__name__}: {str(error)[:160]}")
            del k
    finally:
        await store.aclose()
    return {"latencies": latencies, "errors": errors}


async def _worker(args: argparse.Namespace) -> None:
    import concurrent.futures

    # Each simulated sidecar stands for a process of its own, with its own
    # default executor: one shared 6-thread executor (2 cores) deadlocks 8 or more
    # concurrent captures in one process on main as of this commit (capture blocks
    # an executor thread on work queued behind it).
    asyncio.get_running_loop().set_default_executor(
        concurrent.futures.ThreadPoolExecutor(max_workers=6 * args.count)
    )
    base = Path(args.base)
    results = await asyncio.gather(
        *(
            _sidecar(i, args.mode, args.url, base, args.captures, args.token, args.start_at)
            for i in range(args.first, args.first + args.count)
        )
    )
    latencies = [x for r in results for x in r["latencies"]]
    errors = [e for r in results for e in r["errors"]]
    document = json.dumps({"latencies": latencies, "errors": errors})
    await asyncio.to_thread(Path(args.out).write_text, document)


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _poll_connections(url: str, stop: asyncio.Event) -> int:
    import asyncpg

    conn = await asyncpg.connect(url)
    peak = 0
    try:
        while not stop.is_set():
            count = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'"
            )
            peak = max(peak, int(count) - 1)  # without this poller
            await asyncio.sleep(0.05)
    finally:
        await conn.close()
    return peak


async def _run_setup(
    mode: str, url: str, poll_url: str, base: Path, args: argparse.Namespace, token: str
) -> dict[str, Any]:
    per = -(-args.sidecars // args.processes)
    start_at = time.time() + 3.0 + 0.02 * args.sidecars  # all sidecars connected by then
    procs = []
    outs = []
    for p in range(args.processes):
        first = p * per
        count = min(per, args.sidecars - first)
        if count <= 0:
            break
        out = base / f"{mode}-{p}.json"
        outs.append(out)
        procs.append(
            subprocess.Popen(  # noqa: ASYNC220 - a fork; the run is timed after all started
                [
                    sys.executable,
                    "-m",
                    "benchmarks.gateway_fanin",
                    "--worker",
                    "--mode",
                    mode,
                    "--url",
                    url,
                    "--base",
                    str(base / mode),
                    "--first",
                    str(first),
                    "--count",
                    str(count),
                    "--captures",
                    str(args.captures),
                    "--token",
                    token,
                    "--start-at",
                    str(start_at),
                    "--out",
                    str(out),
                ]
            )
        )
    print(f"{mode}: {len(procs)} workers started", file=sys.stderr, flush=True)
    stop = asyncio.Event()
    poller = asyncio.ensure_future(_poll_connections(poll_url, stop))
    await asyncio.sleep(max(0.0, start_at - time.time()))
    began = time.time()
    for proc in procs:
        await asyncio.to_thread(proc.wait)
    wall = time.time() - began
    print(f"{mode}: done in {wall:.1f}s", file=sys.stderr, flush=True)
    stop.set()
    peak = await poller
    latencies: list[float] = []
    errors: list[str] = []
    for out in outs:
        data = json.loads(out.read_text())
        latencies += data["latencies"]
        errors += data["errors"]
    return {
        "captures": len(latencies),
        "failed": len(errors),
        "first_errors": sorted(set(errors))[:3],
        "captures_per_s": round(len(latencies) / wall, 1),
        "p50_ms": round(_percentile(latencies, 0.50) * 1000, 1),
        "p99_ms": round(_percentile(latencies, 0.99) * 1000, 1),
        "peak_postgres_connections": peak,
    }


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    from checkpointd.gateway import tokens
    from tests.fixtures.postgres import PostgresServer

    base = Path(tempfile.mkdtemp(prefix="cpd-fanin-", dir="/tmp"))
    server = PostgresServer(durable=True)
    results: dict[str, Any] = {
        "sidecars": args.sidecars,
        "captures_each": args.captures,
        "processes": args.processes,
        "gateway_pool_max_size": args.pool_max_size,
        "cpus": os.cpu_count(),
    }
    gateway = None
    try:
        server.start()
        poll_url = server.url("postgres", password=server_password())
        direct_url = server.create_database()
        results["direct"] = await _run_setup("direct", direct_url, poll_url, base, args, "")

        gateway_url = server.create_database()
        public = tokens.generate_key(base / "key.pem")
        token = tokens.mint(
            tokens.load_signing_key(base / "key.pem"),
            tokens.TokenGrant(thread_prefixes=["sb-"], ops=["capture"], ttl_s=3600),
        )
        port = _free_port()
        log = (base / "gateway.log").open("wb")
        gateway = subprocess.Popen(  # noqa: ASYNC220 - started once, before the timing
            [
                sys.executable,
                "-m",
                "checkpointd",
                "gateway",
                "--listen",
                f"127.0.0.1:{port}",
                "--store",
                gateway_url,
                "--blobs",
                f"file://{base / 'gateway-bucket'}",
                "--token-key-file",
                str(public),
                "--insecure-plaintext",
                "--pool-max-size",
                str(args.pool_max_size),
                "--log-level",
                "WARNING",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        await _wait_port(port)
        results["gateway"] = await _run_setup(
            "gateway", f"127.0.0.1:{port}", poll_url, base, args, token
        )
        results["bytes_through_gateway_streamed"] = _bucket_bytes(base / "gateway-bucket")
        d, g = results["direct"], results["gateway"]
        if d["captures_per_s"] and g["captures_per_s"]:
            results["ratio_gateway_over_direct_captures_per_s"] = round(
                g["captures_per_s"] / d["captures_per_s"], 2
            )
            results["ratio_gateway_over_direct_p99"] = round(g["p99_ms"] / d["p99_ms"], 2)
    finally:
        if gateway is not None and gateway.poll() is None:
            gateway.send_signal(signal.SIGTERM)
            gateway.wait(30)
        server.close()
        shutil.rmtree(base, ignore_errors=True)
    return results


def server_password() -> str:
    from tests.fixtures.postgres import ROLE_PASSWORD

    return ROLE_PASSWORD


def _bucket_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


async def _wait_port(port: int, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            _reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            await asyncio.sleep(0.2)
    raise TimeoutError(f"gateway not listening on {port}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sidecars", type=int, default=100)
    parser.add_argument("--captures", type=int, default=5)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--pool-max-size", type=int, default=10)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    for name in ("--mode", "--url", "--base", "--token", "--out"):
        parser.add_argument(name, default="", help=argparse.SUPPRESS)
    parser.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--start-at", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        asyncio.run(_worker(args))
        return
    print(json.dumps(asyncio.run(bench(args)), indent=2))


if __name__ == "__main__":
    main()
