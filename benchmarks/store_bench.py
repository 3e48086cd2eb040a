"""SQLite checkpoint store benchmark: ``python -m benchmarks.store_bench [--entries N]``.

Measures, on a fresh database file under a temporary directory:

1. one checkpoint of 100,000 file entries: ``append``, ``get`` and ``list``
   (milliseconds, median and minimum of ``--runs``) and database bytes per checkpoint;
   (reads through a second store object on the file, so nothing is cached);
2. ten consecutive checkpoints of one thread sharing 99% of their entries (each
   changes 1% of the files: new content, new blob key, new size): ``append`` of
   each, ``get`` of the last, ``list`` of all ten, and database bytes per
   checkpoint (total, and the growth per checkpoint after the first).

Every number has a floor beside it, measured in the same run on the same data:
encoding the checkpoint document (``codec.encode_checkpoint`` + zlib), decoding it,
and a bare ``sqlite3`` INSERT + COMMIT of the same document bytes. Answers are
checked: ``get`` returns the entries appended, ``list`` the ten checkpoints in
order, and the blob counts match the keys used. Database bytes are the main file
after a WAL checkpoint (TRUNCATE), so the WAL is not counted twice.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
import zlib
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from checkpointd.codec import decode_checkpoint, encode_checkpoint
from checkpointd.model import Checkpoint, DirEntry, FileEntry
from checkpointd.store import SqliteCheckpointStore
from checkpointd.store import _documents as documents

FILES_PER_DIR = 50


def file_key(n: int, version: int = 0) -> str:
    """64 hex digits that look random, as real BLAKE3 hashes do (so compression is
    measured on incompressible hashes, not on runs of zeros)."""
    seed = n.to_bytes(8, "little") + version.to_bytes(4, "little")
    return "sandbox-files/blake3/" + hashlib.blake2b(seed, digest_size=32).hexdigest()


def manifest(entries: int, versions: dict[int, int] | None = None) -> tuple[Any, ...]:
    """``entries`` files in directories of 50, sorted by path like a capture makes
    them; ``versions`` maps a file number to its content version."""
    versions = versions or {}
    files: list[Any] = []
    for d in range(0, entries, FILES_PER_DIR):
        directory = f"src/pkg_{d // 1000:03d}/mod_{d // FILES_PER_DIR:05d}"
        files.append(DirEntry(directory, 0o755))
        for n in range(d, min(d + FILES_PER_DIR, entries)):
            version = versions.get(n, 0)
            files.append(
                FileEntry(
                    f"{directory}/file_{n:06d}.py",
                    file_key(n, version),
                    size=1_000 + n % 4_000 + version,
                    mode=0o644,
                    mtime_ns=1_700_000_000_000_000_000 + n * 1_000 + version,
                )
            )
    files.sort(key=lambda e: e.path.encode())
    return tuple(files)


def db_bytes(path: str) -> int:
    """Size of the database after folding the WAL into the main file."""
    connection = sqlite3.connect(path)
    connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    connection.close()
    total = os.path.getsize(path)
    for suffix in ("-wal", "-shm"):
        if os.path.exists(path + suffix) and suffix == "-wal":
            total += os.path.getsize(path + suffix)
    return total


async def timed(action: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
    started = time.perf_counter()
    result = await action()
    return (time.perf_counter() - started) * 1000, result


def stats(values: list[float]) -> str:
    return f"median {statistics.median(values):8.1f} ms  min {min(values):8.1f} ms"


def floors(checkpoint: Checkpoint, directory: str) -> dict[str, float]:
    """Encode, decode and a bare sqlite INSERT of the same document (with the
    cyclic GC paused, as the store pauses it while it builds manifests)."""
    gc.disable()
    try:
        return _floors(checkpoint, directory)
    finally:
        gc.enable()


def _floors(checkpoint: Checkpoint, directory: str) -> dict[str, float]:
    started = time.perf_counter()
    raw = encode_checkpoint(checkpoint)
    document = zlib.compress(raw, documents.ZLIB_LEVEL)
    encode_ms = (time.perf_counter() - started) * 1000
    started = time.perf_counter()
    decode_checkpoint(zlib.decompress(document))
    decode_ms = (time.perf_counter() - started) * 1000
    path = os.path.join(directory, "floor.db")
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute("PRAGMA journal_mode = WAL")
    connection.execute("PRAGMA synchronous = FULL")
    connection.execute("CREATE TABLE IF NOT EXISTS t (id TEXT PRIMARY KEY, doc BLOB)")
    started = time.perf_counter()
    connection.execute("BEGIN IMMEDIATE")
    connection.execute("INSERT INTO t VALUES (?, ?)", (checkpoint.id + str(started), document))
    connection.execute("COMMIT")
    insert_ms = (time.perf_counter() - started) * 1000
    connection.close()
    return {
        "encode_ms": encode_ms,
        "decode_ms": decode_ms,
        "insert_ms": insert_ms,
        "json_bytes": len(raw),
        "document_bytes": len(document),
    }


async def single(entries: int, runs: int, directory: str) -> dict[str, Any]:
    files = manifest(entries)
    append_ms, get_ms, list_ms, sizes, floor_runs = [], [], [], [], []
    cached_get_ms: list[float] = []
    for run in range(runs):
        path = os.path.join(directory, f"single-{run}.db")
        store = await SqliteCheckpointStore.open(path)
        empty = db_bytes(path)
        lease = await store.acquire_writer("t")
        checkpoint = Checkpoint(
            id=f"c{run}", thread_id="t", parent_checkpoint_id=None, created_at=1, files=files
        )
        ms, _ = await timed(partial(store.append, checkpoint, None, lease))
        append_ms.append(ms)
        # Reads through another store object: nothing cached, as in a new sandbox.
        reader = await SqliteCheckpointStore.open(path)
        ms, got = await timed(partial(reader.get, checkpoint.id))
        get_ms.append(ms)
        assert got is not None and got.files == files, "get returned other entries"
        ms, listed = await timed(partial(reader.list, "t"))
        list_ms.append(ms)
        assert [c.id for c in listed] == [checkpoint.id]
        ms, _ = await timed(partial(store.get, checkpoint.id))
        cached_get_ms.append(ms)
        await reader.aclose()
        refs = await store.list_blob_references()
        assert len(refs) == entries and all(r.references == 1 for r in refs)
        await lease.release()
        await store.aclose()
        sizes.append(db_bytes(path) - empty)
        floor_runs.append(floors(checkpoint, directory))
    return {
        "append_ms": append_ms,
        "get_ms": get_ms,
        "list_ms": list_ms,
        "cached_get_ms": cached_get_ms,
        "bytes_per_checkpoint": statistics.median(sizes),
        "floors": floor_runs,
    }


async def shared_chain(entries: int, count: int, directory: str) -> dict[str, Any]:
    """``count`` checkpoints; each changes 1% of the files of the one before."""
    path = os.path.join(directory, "chain.db")
    store = await SqliteCheckpointStore.open(path)
    empty = db_bytes(path)
    lease = await store.acquire_writer("t")
    versions: dict[int, int] = {}
    changed_per_step = max(1, entries // 100)
    append_ms, sizes, keys = [], [], set()
    parent = None
    last = None
    for step in range(count):
        if step:
            start = (step * 7_919 * changed_per_step) % entries
            for k in range(changed_per_step):
                n = (start + k * 97) % entries
                versions[n] = versions.get(n, 0) + 1
        files = manifest(entries, versions)
        keys.update(e.blob_key for e in files if isinstance(e, FileEntry))
        checkpoint = Checkpoint(
            id=f"c{step:02d}",
            thread_id="t",
            parent_checkpoint_id=parent,
            created_at=step + 1,
            files=files,
        )
        ms, _ = await timed(lambda cp=checkpoint, p=parent: store.append(cp, p, lease))
        append_ms.append(ms)
        await lease.renew()
        parent, last = checkpoint.id, checkpoint
        sizes.append(db_bytes(path) - empty)
    assert last is not None
    get_ms, list_ms = [], []
    await lease.release()
    await store.aclose()
    reader = await SqliteCheckpointStore.open(path)  # cold reads: nothing cached
    for _ in range(3):
        ms, got = await timed(partial(reader.get, last.id))
        get_ms.append(ms)
        assert got is not None and got.files == last.files
        ms, listed = await timed(partial(reader.list, "t"))
        list_ms.append(ms)
        assert [c.id for c in listed] == [f"c{i:02d}" for i in range(count)]
    refs = await reader.list_blob_references()
    assert {r.key for r in refs} == keys, "blob counts do not match the keys used"
    await reader.aclose()
    total = db_bytes(path) - empty
    connection = sqlite3.connect(path)
    stored = connection.execute(
        "SELECT base_id IS NULL, length(document) FROM checkpoints ORDER BY serial"
    ).fetchall()
    connection.close()
    growth = [b - a for a, b in zip(sizes, sizes[1:], strict=False)]
    return {
        "append_ms": append_ms,
        "get_ms": get_ms,
        "list_ms": list_ms,
        "total_bytes": total,
        "bytes_per_checkpoint": total / count,
        "first_checkpoint_bytes": sizes[0],
        "growth_after_first": statistics.median(growth) if growth else 0,
        "changed_per_step": changed_per_step,
        "documents": [{"keyframe": bool(k), "bytes": n} for k, n in stored],
    }


def report(entries: int, count: int, one: dict[str, Any], chain: dict[str, Any]) -> str:
    floor = one["floors"]
    encode = statistics.median(f["encode_ms"] for f in floor)
    decode = statistics.median(f["decode_ms"] for f in floor)
    insert = statistics.median(f["insert_ms"] for f in floor)
    json_bytes = floor[0]["json_bytes"]
    document_bytes = floor[0]["document_bytes"]
    append = statistics.median(one["append_ms"])
    get = statistics.median(one["get_ms"])
    lines = [
        f"SQLite checkpoint store, {entries:,} file entries per checkpoint "
        f"(+{entries // FILES_PER_DIR:,} dirs), python {sys.version.split()[0]}",
        "",
        "One checkpoint:",
        f"  append  {stats(one['append_ms'])}   floor encode+insert "
        f"{encode + insert:7.1f} ms  ratio {append / (encode + insert):.2f}x",
        f"  get     {stats(one['get_ms'])}   floor decode {decode:7.1f} ms  "
        f"ratio {get / decode:.2f}x",
        f"  list    {stats(one['list_ms'])}",
        f"  get from the appending store object (its content cache) {stats(one['cached_get_ms'])}",
        f"  database bytes per checkpoint {one['bytes_per_checkpoint']:,.0f}  "
        f"(manifest JSON {json_bytes:,}, zlib document {document_bytes:,}, "
        f"{entries:,} keys x 33 B = {entries * 33:,})",
        "",
        f"{count} consecutive checkpoints sharing 99% of entries "
        f"({chain['changed_per_step']:,} files change per step):",
        f"  append  {stats(chain['append_ms'])}",
        f"  get     {stats(chain['get_ms'])}   (the last checkpoint)",
        f"  list    {stats(chain['list_ms'])}   (all {count})",
        f"  database bytes per checkpoint {chain['bytes_per_checkpoint']:,.0f} "
        f"(total {chain['total_bytes']:,}; first {chain['first_checkpoint_bytes']:,}; "
        f"each later one adds {chain['growth_after_first']:,.0f})",
        "  stored documents: "
        + ", ".join(
            f"{'keyframe' if d['keyframe'] else 'delta'} {d['bytes']:,}" for d in chain["documents"]
        ),
    ]
    return "\n".join(lines)


async def main_async(entries: int, count: int, runs: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="checkpointd-store-bench-") as directory:
        print(
            f"input: {entries:,} file entries; chain of {count}; {runs} runs; scratch {directory}",
            flush=True,
        )
        one = await single(entries, runs, directory)
        chain = await shared_chain(entries, count, directory)
    print(report(entries, count, one, chain))
    return {"entries": entries, "count": count, "single": one, "chain": chain}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--count", type=int, default=10)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", help="also write the raw numbers to this file")
    args = parser.parse_args(argv)
    result = asyncio.run(main_async(args.entries, args.count, args.runs))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
