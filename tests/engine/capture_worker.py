"""A process a test kills with SIGKILL partway through one capture.

``python -m tests.engine.capture_worker STORE_URL BLOBS_URL WORKSPACE DATA_DIR``
prints ``ready`` once its stores are open, then captures the workspace once
into thread ``retry``, printing each phase's name as it starts (so a test can
aim its kill past the scan) and ``done`` at the end.
"""

from __future__ import annotations

import asyncio
import sys

from checkpointd.blobs import open_blobs
from checkpointd.capture import CaptureOptions, capture_checkpoint
from checkpointd.progress import Progress
from checkpointd.store import open_store

LEASE_MS = 1000
RENEW_MS = 200


async def main(store_url: str, blobs_url: str, workspace: str, data_dir: str) -> None:
    store = await open_store(store_url, lease_duration_ms=LEASE_MS, renew_after_ms=RENEW_MS)
    blobs = open_blobs(blobs_url)
    print("ready", flush=True)
    phases: list[str] = []

    def print_phase(report: Progress) -> None:
        if not phases or phases[-1] != report.phase:
            phases.append(report.phase)
            print(report.phase, flush=True)

    await capture_checkpoint(
        workspace, store, blobs, "retry", CaptureOptions(data_dir=data_dir, progress=print_phase)
    )
    print("done", flush=True)
    await store.aclose()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
