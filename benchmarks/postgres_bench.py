"""PostgreSQL checkpoint store benchmark: ``python -m benchmarks.postgres_bench``.

Starts its own PostgreSQL 15 server (``tests.fixtures.postgres.PostgresServer``,
fsync and synchronous commit ON, so a commit costs what it costs in production)
and measures, each beside a floor from the same server in the same run:

1. appends/s with 1, 8 and 32 concurrent writers, each on its own thread
   (50-entry manifests, 49 shared keys); floor: bare one-row INSERT + COMMIT
   transactions/s with the same concurrency on the same pool size;
2. p50/p99 latency of ``append`` for a 10,000-entry manifest where consecutive
   checkpoints share 99% of their entries (100 new keys each time);
3. database bytes per checkpoint in that chain (growth of the checkpointd tables
   after VACUUM), beside the raw JSON manifest and the compressed document.

Answers are checked: every thread ends with exactly the appends it made, and the
blob counts match the keys used. Use ``--quick`` for a short run.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import statistics
import sys
import time
from typing import Any

import asyncpg

from checkpointd.codec import encode_checkpoint
from checkpointd.model import Checkpoint, DirEntry, FileEntry
from checkpointd.store.postgres import PostgresCheckpointStore, open_postgres_store
from tests.fixtures.postgres import PostgresServer


def file_key(n: int) -> str:
    """A realistic key: 64 hex digits that look random (real BLAKE3 hashes do),
    so compression is measured on incompressible hashes, not on runs of zeros."""
    return (
        "sandbox-files/blake3/"
        + hashlib.blake2b(n.to_bytes(8, "little"), digest_size=32).hexdigest()
    )


def manifest(first_unique: int, unique: int, shared: int) -> tuple[Any, ...]:
    """``shared`` entries every checkpoint has, plus ``unique`` new ones."""
    files: list[Any] = [DirEntry("src")]
    files += [FileEntry(f"src/shared/{n:06d}.py", file_key(n), 1000 + n) for n in range(shared)]
    files += [
        FileEntry(f"src/new/{n:09d}.py", file_key(10**9 + n), n)
        for n in range(first_unique, first_unique + unique)
    ]
    return tuple(files)


# ---------------------------------------------------------------------------- throughput


async def _writer(
    store: PostgresCheckpointStore, index: int, thread: str, stop_at: float, counter: list[int]
) -> int:
    lease = await store.acquire_writer(thread)
    head: str | None = None
    made = 0
    try:
        while time.perf_counter() < stop_at:
            checkpoint = Checkpoint(
                id=f"{thread}-{made}",
                thread_id=thread,
                parent_checkpoint_id=head,
                created_at=made + 1,
                files=manifest(index * 10**6 + made, 1, 49),
            )
            head = await store.append(checkpoint, head, lease)
            made += 1
            counter[0] += 1
    finally:
        await lease.release()
    return made


async def appends_per_second(url: str, writers: int, seconds: float) -> dict[str, Any]:
    store = await open_postgres_store(url, pool_max_size=writers)
    try:
        counter = [0]
        stop_at = time.perf_counter() + seconds
        started = time.perf_counter()
        threads = [f"w{writers}-{n}" for n in range(writers)]
        made = await asyncio.gather(
            *(_writer(store, i, t, stop_at, counter) for i, t in enumerate(threads))
        )
        elapsed = time.perf_counter() - started
        for thread, count in zip(threads, made, strict=True):  # check the answer
            assert len(await store.list(thread)) == count, thread
    finally:
        await store.aclose()
    return {"writers": writers, "appends": sum(made), "per_s": sum(made) / elapsed}


async def insert_floor_per_second(url: str, writers: int, seconds: float) -> float:
    """The floor: one-row INSERT + COMMIT transactions/s at the same concurrency."""
    pool = await asyncpg.create_pool(url, min_size=writers, max_size=writers)
    try:
        await pool.execute("CREATE TABLE IF NOT EXISTS floor_rows (id bigserial, body bytea)")
        stop_at = time.perf_counter() + seconds
        started = time.perf_counter()

        async def one() -> int:
            done = 0
            while time.perf_counter() < stop_at:
                async with pool.acquire() as conn, conn.transaction():
                    await conn.execute("INSERT INTO floor_rows (body) VALUES ($1)", b"x" * 200)
                done += 1
            return done

        total = sum(await asyncio.gather(*(one() for _ in range(writers))))
        return total / (time.perf_counter() - started)
    finally:
        await pool.close()


# ---------------------------------------------------------------------------- big manifests


async def relation_bytes(url: str, vacuum: bool) -> int:
    conn = await asyncpg.connect(url)
    try:
        if vacuum:
            await conn.execute("VACUUM")
        total = await conn.fetchval(
            "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c"
            " WHERE c.relkind = 'r' AND c.relname LIKE 'checkpointd_%'"
        )
        return int(total)
    finally:
        await conn.close()


async def big_manifest_chain(url: str, count: int) -> dict[str, Any]:
    entries, changed = 10_000, 100  # consecutive checkpoints share 99% of entries
    store = await open_postgres_store(url)
    latencies: list[float] = []
    raw_sizes: list[int] = []
    try:
        lease = await store.acquire_writer("big")
        head: str | None = None
        # The first checkpoint brings every shared key; measure the ones after it.
        for n in range(count + 1):
            files = manifest(n * changed, changed, entries - changed)
            checkpoint = Checkpoint(
                id=f"big-{n}",
                thread_id="big",
                parent_checkpoint_id=head,
                created_at=n + 1,
                files=files,
            )
            if n == 1:
                before_raw = await relation_bytes(url, vacuum=False)
                before = await relation_bytes(url, vacuum=True)
            started = time.perf_counter()
            head = await store.append(checkpoint, head, lease)
            if n >= 1:
                latencies.append(time.perf_counter() - started)
                raw_sizes.append(len(encode_checkpoint(checkpoint)))
        after_raw = await relation_bytes(url, vacuum=False)
        after = await relation_bytes(url, vacuum=True)
        started = time.perf_counter()
        fetched = await store.get(head)
        get_ms = (time.perf_counter() - started) * 1000
        assert fetched is not None and len(fetched.files) == entries + 1
        references = {r.key: r.references for r in await store.list_blob_references()}
        assert references[file_key(0)] == count + 1  # a shared key: in every checkpoint
        assert len(references) == (entries - changed) + (count + 1) * changed
        documents = await _document_sizes(url)
        await lease.release()
    finally:
        await store.aclose()
    latencies.sort()
    return {
        "entries": entries,
        "checkpoints_measured": count,
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000,
        "get_ms": get_ms,
        "db_bytes_per_checkpoint": (after - before) / count,
        "db_bytes_per_checkpoint_before_vacuum": (after_raw - before_raw) / count,
        "document_bytes": statistics.mean(documents),
        "raw_json_bytes": statistics.mean(raw_sizes),
    }


async def _document_sizes(url: str) -> list[int]:
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch("SELECT octet_length(document) AS n FROM checkpointd_checkpoints")
        return [row["n"] for row in rows]
    finally:
        await conn.close()


# ---------------------------------------------------------------------------- main


async def run(server: PostgresServer, seconds: float, big_count: int) -> dict[str, Any]:
    results: dict[str, Any] = {"throughput": []}
    for writers in (1, 8, 32):
        url = server.create_database()
        ours = await appends_per_second(url, writers, seconds)
        floor = await insert_floor_per_second(url, writers, seconds)
        ours["floor_per_s"] = floor
        ours["ratio_to_floor"] = ours["per_s"] / floor
        results["throughput"].append(ours)
        print(
            f"  {writers:>2} writers: {ours['per_s']:8.1f} appends/s "
            f"(floor {floor:8.1f} insert+commit/s, ratio {ours['ratio_to_floor']:.2f})",
            flush=True,
        )
    big = await big_manifest_chain(server.create_database(), big_count)
    results["big_manifest"] = big
    print(
        f"  10,000-entry append: p50 {big['p50_ms']:.1f} ms, p99 {big['p99_ms']:.1f} ms "
        f"over {big['checkpoints_measured']} appends; get {big['get_ms']:.1f} ms",
        flush=True,
    )
    print(
        f"  bytes per checkpoint (99% shared): {big['db_bytes_per_checkpoint']:,.0f} in the "
        f"database after VACUUM ({big['db_bytes_per_checkpoint_before_vacuum']:,.0f} before); "
        f"document {big['document_bytes']:,.0f}; raw JSON manifest "
        f"{big['raw_json_bytes']:,.0f} (ratio "
        f"{big['db_bytes_per_checkpoint'] / big['raw_json_bytes']:.2f})",
        flush=True,
    )
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.postgres_bench", description=__doc__
    )
    parser.add_argument("--quick", action="store_true", help="short runs (1 s, 20 big appends)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON too")
    args = parser.parse_args(argv)
    seconds, big_count = (1.0, 20) if args.quick else (5.0, 100)
    print(
        f"PostgreSQL store benchmark: throughput {seconds:.0f} s per setting with 50-entry "
        f"manifests; {big_count} appends of 10,000-entry manifests (99% shared)",
        flush=True,
    )
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(f"machine: {os.cpu_count()} CPUs, load average {load}", flush=True)
    server = PostgresServer(durable=True)
    try:
        server.start()
        results = asyncio.run(run(server, seconds, big_count))
    finally:
        server.close()
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
