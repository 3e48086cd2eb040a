"""The scan phase reports its counts while it runs, through the
gRPC Capture stream: entries found, files hashed and bytes hashed, polled
from the native scanner's counters, ending at the scan's totals."""

from __future__ import annotations

import time

from checkpointd.v1 import checkpointd_pb2 as pb

from .conftest import DaemonFactory

# A cold scan reads and hashes every file: 12,000 files of 64 KiB take tens of
# ms even on an idle machine, many 5 ms report intervals (the daemon's
# CHECKPOINTD_PROGRESS_INTERVAL_MS; at the default 100 ms an idle machine can
# finish the scan inside one interval). One content for all, so the upload (and the teardown)
# stays cheap: the bucket gets one blob.
FILES = 12_000
CONTENT = bytes(range(256)) * 256
INTERVAL_S = 0.005


async def test_scan_progress_arrives_while_the_scan_runs(daemons: DaemonFactory) -> None:
    daemon = daemons.start(env={"CHECKPOINTD_PROGRESS_INTERVAL_MS": str(int(INTERVAL_S * 1000))})
    for d in range(60):
        directory = daemon.workspace / f"d{d:02}"
        directory.mkdir()
        for f in range(FILES // 60):
            (directory / f"f{f:03}.bin").write_bytes(CONTENT)
    arrivals: list[tuple[float, pb.Progress]] = []
    async with daemon.client(timeout=300) as client:
        started = time.monotonic()
        done = await client.capture(
            "t-scan-progress",
            on_event=lambda e: (
                arrivals.append((time.monotonic(), e.progress)) if e.HasField("progress") else None
            ),
        )
    scan = [(at, p) for at, p in arrivals if p.phase_kind == pb.PROGRESS_PHASE_SCAN]
    last = scan[-1][1]
    # The totals, in the phase's last event.
    assert last.files_done == last.files_total == done.stats.entries == FILES + 60
    assert last.bytes_done == last.bytes_total == done.stats.bytes_hashed > 0
    assert last.files_hashed == done.stats.files_hashed == FILES
    # Counts that arrived before the scan ended: part-way, and growing.
    running = [p for _at, p in scan[:-1] if p.files_done or p.files_hashed]
    assert running, f"no scan count before the end ({len(scan)} scan events)"
    assert any(0 < p.files_hashed < FILES and 0 < p.bytes_done < last.bytes_done for p in running)
    for earlier, later in zip(running, running[1:], strict=False):
        assert later.files_done >= earlier.files_done
        assert later.files_hashed >= earlier.files_hashed
        assert later.bytes_done >= earlier.bytes_done
    assert all(p.files_total == 0 for p in running)  # unknown until the end
    # They arrive spread over the scan, not in one burst at its end.
    times = [at for at, p in scan if p.files_done or p.files_hashed]
    assert times[-1] - times[0] >= 2 * INTERVAL_S, (times[0] - started, times[-1] - started)
    assert done.stats.phases_ms["scan"] > 2_000 * INTERVAL_S  # it outlasted two intervals
    # Other phases report no hashing counts.
    assert all(p.files_hashed == 0 for _at, p in arrivals if p.phase_kind != pb.PROGRESS_PHASE_SCAN)
