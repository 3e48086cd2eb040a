"""One checkpointd operation in its own process, for the harness to time.

    python -m benchmarks.runner capture --workspace W --store URL --blobs URL \
        --data-dir D [--thread T]
    python -m benchmarks.runner restore --workspace W --store URL --blobs URL \
        --data-dir D [--thread T] [--checkpoint ID]

Prints one JSON line: ``engine_seconds`` (the call itself, without interpreter
start and imports) and the capture stats or the restored checkpoint's id and size.
A separate process per run keeps the timing honest (no warm caches left in this
interpreter) and lets the harness read the peak RSS of exactly this operation.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import time
from typing import Any


async def _capture(args: argparse.Namespace) -> dict[str, Any]:
    from checkpointd import CaptureOptions, capture_checkpoint, open_blobs, open_store

    blobs = open_blobs(args.blobs)
    async with await open_store(args.store) as store:
        started = time.perf_counter()
        result = await capture_checkpoint(
            args.workspace, store, blobs, args.thread, CaptureOptions(data_dir=args.data_dir)
        )
        seconds = time.perf_counter() - started
    stats = result.stats
    as_dict = dataclasses.asdict(stats) if dataclasses.is_dataclass(stats) else dict(vars(stats))
    return {
        "engine_seconds": seconds,
        "checkpoint_id": result.checkpoint.id,
        "entries": len(result.checkpoint.files),
        "stats": as_dict,
    }


async def _restore(args: argparse.Namespace) -> dict[str, Any]:
    from checkpointd import RestoreOptions, open_blobs, open_store, restore_checkpoint

    blobs = open_blobs(args.blobs)
    async with await open_store(args.store) as store:
        started = time.perf_counter()
        checkpoint = await restore_checkpoint(
            args.workspace,
            store,
            blobs,
            args.thread,
            RestoreOptions(checkpoint_id=args.checkpoint, data_dir=args.data_dir),
        )
        seconds = time.perf_counter() - started
    if checkpoint is None:
        raise SystemExit(f"thread {args.thread!r} has no checkpoint to restore")
    return {
        "engine_seconds": seconds,
        "checkpoint_id": checkpoint.id,
        "entries": len(checkpoint.files),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.runner")
    parser.add_argument("operation", choices=["capture", "restore"])
    parser.add_argument("--workspace", required=True)
    parser.add_argument("--store", required=True, help="checkpoint store URL")
    parser.add_argument("--blobs", required=True, help="blob store URL")
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--thread", default="bench")
    parser.add_argument("--checkpoint", default=None, help="restore this id, not the head")
    args = parser.parse_args(argv)
    operation = _capture if args.operation == "capture" else _restore
    print(json.dumps(asyncio.run(operation(args)), default=str))


if __name__ == "__main__":
    main()
