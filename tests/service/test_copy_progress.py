"""A large file's native copy into a file:// bucket reports its bytes while it
runs (the verifying reader's count, polled every progress interval), not only
when it ends: the upload phase's events through the gRPC Capture stream."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import blake3

from checkpointd.v1 import checkpointd_pb2 as pb

from .conftest import DaemonFactory

SIZE = 192 << 20  # copied and synced: many 5 ms intervals even on a fast disk
INTERVAL_S = 0.005


def _write_random(path: Path, size: int) -> str:
    """``size`` random bytes at ``path``; their BLAKE3 hex digest."""
    digest = blake3.blake3()
    with path.open("wb") as handle:
        for _ in range(size >> 20):
            chunk = os.urandom(1 << 20)
            digest.update(chunk)
            handle.write(chunk)
    return digest.hexdigest()


async def test_a_large_copy_reports_bytes_before_it_ends(daemons: DaemonFactory) -> None:
    daemon = daemons.start(env={"CHECKPOINTD_PROGRESS_INTERVAL_MS": str(int(INTERVAL_S * 1000))})
    hex_digest = _write_random(daemon.workspace / "big.bin", SIZE)
    # Past the filesystem's timestamp tick: a file changed within the first
    # scan's racy window is hashed again by the next scan, and this test
    # needs the stat cache to vouch for it.
    await asyncio.sleep(0.2)
    blob = Path(daemon.blobs.removeprefix("file://")) / "sandbox-files/blake3" / hex_digest
    async with daemon.client(timeout=300) as client:
        # The first capture hashes the file (the scan's feed copies it). With
        # that checkpoint and its blob gone, the next capture, whose stat cache
        # vouches for the hash, copies the file in its upload phase.
        first = await client.capture("t-copy-a")
        assert await client.delete_head("t-copy-a", first.checkpoint.id) is None
        assert blob.stat().st_size == SIZE
        blob.unlink()
        arrivals: list[pb.Progress] = []
        done = await client.capture(
            "t-copy-b",
            on_event=lambda e: arrivals.append(e.progress) if e.HasField("progress") else None,
        )
    assert done.stats.files_hashed == 0
    assert done.stats.bytes_uploaded == SIZE
    upload = [p for p in arrivals if p.phase_kind == pb.PROGRESS_PHASE_UPLOAD]
    assert upload and upload[-1].bytes_done == upload[-1].bytes_total == SIZE
    during = [p.bytes_done for p in upload if 0 < p.bytes_done < SIZE]
    assert during, [(p.bytes_done, p.bytes_total) for p in upload]
    assert during == sorted(during)


async def test_a_file_handed_over_by_a_cold_scan_reports_its_copy_as_it_goes(
    daemons: DaemonFactory,
) -> None:
    # One large file and nothing else: the scan hashes it, hands its open file
    # to the upload and ends while the copy has barely started.
    daemon = daemons.start(env={"CHECKPOINTD_PROGRESS_INTERVAL_MS": str(int(INTERVAL_S * 1000))})
    _write_random(daemon.workspace / "big.bin", SIZE)
    arrivals: list[pb.Progress] = []
    async with daemon.client(timeout=300) as client:
        done = await client.capture(
            "t-handover",
            on_event=lambda e: arrivals.append(e.progress) if e.HasField("progress") else None,
        )
    assert done.stats.files_hashed == 1
    assert done.stats.bytes_uploaded == SIZE
    # The phases keep their order, and each one's last event its totals.
    assert list(dict.fromkeys(p.phase for p in arrivals)) == [
        "lease",
        "scan",
        "pin",
        "upload",
        "append",
    ]
    scan = [p for p in arrivals if p.phase_kind == pb.PROGRESS_PHASE_SCAN]
    assert scan[-1].bytes_done == done.stats.bytes_hashed == SIZE
    upload = [p for p in arrivals if p.phase_kind == pb.PROGRESS_PHASE_UPLOAD]
    assert upload[-1].bytes_done == upload[-1].bytes_total == SIZE
    assert upload[-1].files_done == upload[-1].files_total == 1
    during = [p.bytes_done for p in upload if 0 < p.bytes_done < SIZE]
    assert len(set(during)) >= 2, [(p.bytes_done, p.bytes_total) for p in upload]
    assert during == sorted(during)
