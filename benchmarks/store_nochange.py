"""No-change appends: ``python -m benchmarks.store_nochange [--entries N ...] [--postgres]``.

What a capture that changed nothing costs the store ("a no-change
capture appends a delta with no rows; its store cost does not grow with the
number of entries"). For each size, on a fresh SQLite file (and with
``--postgres`` on a fresh database of its own durable PostgreSQL server):

1. append one checkpoint of N file entries (N distinct keys), untimed;
2. append ``--count`` checkpoints with the same entries, each the child of the
   last, and time each ``append`` (the manifest object is the same one a
   no-change capture hands over);
3. report the median and minimum append time, the database bytes each
   no-change checkpoint added (SQLite: the main file after a WAL checkpoint,
   which grows by whole pages, so a few small rows may add 0; PostgreSQL: the
   checkpointd tables after VACUUM) and the mean stored document of those
   checkpoints, then check the answer: every key is counted ``count + 1`` times.

Run it with another checkout's interpreter (``/work/main/.venv/bin/python -m
benchmarks.store_nochange`` from this directory) to compare before and after in
one session.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from typing import Any

from checkpointd.model import Checkpoint, FileEntry
from checkpointd.store import open_store

FILES_PER_DIR = 50


def file_key(n: int) -> str:
    seed = n.to_bytes(8, "little")
    return "sandbox-files/blake3/" + hashlib.blake2b(seed, digest_size=32).hexdigest()


def entries(count: int) -> tuple[FileEntry, ...]:
    return tuple(
        FileEntry(f"src/d{n // FILES_PER_DIR:06d}/f{n:07d}.py", file_key(n), 100 + n % 997)
        for n in range(count)
    )


def sqlite_bytes(path: str) -> int:
    connection = sqlite3.connect(path)
    try:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        connection.close()
    return os.path.getsize(path)


async def postgres_bytes(url: str) -> int:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        await conn.execute("VACUUM")
        total = await conn.fetchval(
            "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c"
            " WHERE c.relkind = 'r' AND c.relname LIKE 'checkpointd_%'"
        )
        return int(total)
    finally:
        await conn.close()


async def measure(url: str, size: int, count: int) -> dict[str, Any]:
    files = entries(size)
    store = await open_store(url)
    try:
        lease = await store.acquire_writer("t")
        first = Checkpoint(
            id="c0000", thread_id="t", parent_checkpoint_id=None, created_at=1, files=files
        )
        await store.append(first, None, lease)
        # The checkpoint a no-change capture appends carries its parent's manifest.
        manifest = (await store.get("c0000")).files  # type: ignore[union-attr]
        before = await _bytes(url)
        times: list[float] = []
        parent = "c0000"
        for step in range(1, count + 1):
            checkpoint = Checkpoint(
                id=f"c{step:04d}",
                thread_id="t",
                parent_checkpoint_id=parent,
                created_at=step + 1,
                files=manifest,
            )
            await lease.renew()
            start = time.perf_counter()
            await store.append(checkpoint, parent, lease)
            times.append((time.perf_counter() - start) * 1000)
            parent = checkpoint.id
        after = await _bytes(url)
        document = await _document_bytes(url)
        references = await store.list_blob_references()
        assert len(references) == size, (len(references), size)
        assert all(r.references == count + 1 for r in references), "wrong counts"
        await lease.release()
    finally:
        await store.aclose()
    return {
        "entries": size,
        "appends": count,
        "append_ms_median": statistics.median(times),
        "append_ms_min": min(times),
        "bytes_per_checkpoint": (after - before) / count,
        "document_bytes": document,
    }


async def _document_bytes(url: str) -> float:
    """The mean stored document of the no-change checkpoints (their row payload)."""
    if url.startswith("sqlite://"):
        connection = sqlite3.connect(url.removeprefix("sqlite://"))
        try:
            (mean,) = connection.execute(
                "SELECT avg(length(document)) FROM checkpoints WHERE id != 'c0000'"
            ).fetchone()
        finally:
            connection.close()
        return float(mean)
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        mean = await conn.fetchval(
            "SELECT avg(length(document)) FROM checkpointd_checkpoints WHERE id != $1",
            b"c0000",
        )
    finally:
        await conn.close()
    return float(mean)


async def _bytes(url: str) -> int:
    if url.startswith("sqlite://"):
        return sqlite_bytes(url.removeprefix("sqlite://"))
    return await postgres_bytes(url)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.store_nochange")
    parser.add_argument("--entries", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--count", type=int, default=10)
    parser.add_argument("--postgres", action="store_true", help="also on PostgreSQL")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    results: list[dict[str, Any]] = []
    server = None
    if args.postgres:
        sys.path.insert(0, os.getcwd())
        from tests.fixtures.postgres import PostgresServer

        server = PostgresServer(durable=True)
        server.start()
    try:
        with tempfile.TemporaryDirectory(prefix="ckd-nochange-") as directory:
            for size in args.entries:
                urls = [("sqlite", f"sqlite://{directory}/n{size}.db")]
                if server is not None:
                    urls.append(("postgres", server.create_database()))
                for backend, url in urls:
                    result = {"backend": backend, **asyncio.run(measure(url, size, args.count))}
                    results.append(result)
                    print(
                        f"{backend:8} {size:>9,} entries: no-change append "
                        f"median {result['append_ms_median']:.1f} ms "
                        f"(min {result['append_ms_min']:.1f}), "
                        f"{result['bytes_per_checkpoint']:,.0f} bytes per checkpoint "
                        f"(document {result['document_bytes']:,.0f} bytes)",
                        flush=True,
                    )
    finally:
        if server is not None:
            server.close()
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
