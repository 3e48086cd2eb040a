"""Many captures at once in one process (a daemon serving many threads).

Each capture's scan feeds its uploads through a bounded native queue; the scan
and the consumers waiting on that queue must never compete for the event loop's
shared, small default executor, or enough concurrent captures fill it with
waiters whose producers never get a thread (a deadlock).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from checkpointd import (
    CaptureOptions,
    RestoreOptions,
    capture_checkpoint,
    open_blobs,
    open_store,
    restore_checkpoint,
)

CAPTURES = 12


@pytest.mark.timeout(120)
async def test_a_dozen_concurrent_captures_all_finish(tmp_path: Path) -> None:
    store = await open_store(f"sqlite:///{tmp_path / 'store.db'}")
    blobs = open_blobs(f"file://{tmp_path / 'blobs'}")
    try:
        roots = []
        for index in range(CAPTURES):
            root = tmp_path / f"ws{index}"
            for name in range(40):
                directory = root / f"d{name % 4}"
                directory.mkdir(parents=True, exist_ok=True)
                (directory / f"f{name}").write_bytes(f"{index}-{name}".encode() * 100)
            roots.append(root)
        results = await asyncio.wait_for(
            asyncio.gather(
                *(
                    capture_checkpoint(
                        root,
                        store,
                        blobs,
                        f"t{index}",
                        CaptureOptions(data_dir=tmp_path / f"data{index}"),
                    )
                    for index, root in enumerate(roots)
                )
            ),
            timeout=90,
        )
        assert [len(r.checkpoint.files) for r in results] == [44] * CAPTURES
        target = tmp_path / "restored"
        await restore_checkpoint(
            target, store, blobs, f"t{CAPTURES - 1}", RestoreOptions(data_dir=tmp_path / "d")
        )
        assert (target / "d3" / "f39").read_bytes() == f"{CAPTURES - 1}-39".encode() * 100
    finally:
        await store.aclose()
