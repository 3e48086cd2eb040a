"""A process the fault tests kill with SIGKILL at random points.

``python -m tests.engine.fault_worker capture STORE_URL BLOBS_URL WORKSPACE DATA_DIR``
changes the workspace and captures it, forever; ``… restore …`` restores the
thread's head once. Both print ``ready`` when their stores are open; restore
then prints each phase's name as it starts, so a test can aim its kill.
"""

from __future__ import annotations

import asyncio
import os
import sys

from checkpointd.blobs import open_blobs
from checkpointd.capture import CaptureOptions, capture_checkpoint
from checkpointd.errors import (
    SandboxCheckpointWriterConflictError,
    SandboxCheckpointWriterLostError,
)
from checkpointd.progress import Progress
from checkpointd.restore import RestoreOptions, restore_checkpoint
from checkpointd.store import open_store

LEASE_MS = 1000
RENEW_MS = 200


def _change(workspace: str, counter: int) -> None:
    """New bytes every round, some large enough to go up as multipart."""
    with open(os.path.join(workspace, f"file-{counter % 7}.bin"), "wb") as handle:
        handle.write(os.urandom(64 << 10 if counter % 3 else 6 << 20))


async def main(mode: str, store_url: str, blobs_url: str, workspace: str, data_dir: str) -> None:
    store = await open_store(store_url, lease_duration_ms=LEASE_MS, renew_after_ms=RENEW_MS)
    blobs = open_blobs(blobs_url)
    print("ready", flush=True)
    if mode == "restore":
        phases: list[str] = []

        def print_phase(report: Progress) -> None:
            if not phases or phases[-1] != report.phase:
                phases.append(report.phase)
                print(report.phase, flush=True)

        while True:
            try:
                await restore_checkpoint(
                    workspace,
                    store,
                    blobs,
                    "faults",
                    RestoreOptions(data_dir=data_dir, progress=print_phase),
                )
                break
            except SandboxCheckpointWriterConflictError:
                await asyncio.sleep(0.05)  # the previous victim's lease has not expired yet
        print("done", flush=True)
        return
    counter = 0
    while True:
        counter += 1
        _change(workspace, counter)
        try:
            await capture_checkpoint(
                workspace, store, blobs, "faults", CaptureOptions(data_dir=data_dir)
            )
        except SandboxCheckpointWriterConflictError:
            await asyncio.sleep(0.05)  # the previous victim's lease has not expired yet
        except SandboxCheckpointWriterLostError:
            pass  # a heavily loaded machine renewed too late: try again


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
