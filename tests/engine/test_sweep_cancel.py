"""A sweep cancelled while its condemnation commits (a client's deadline) leaves
no key condemned: the store's transaction finishes after the cancel, and the
sweep releases what it condemned, so the next sweep is not told the keys are in
use and captures do not wait out the hold."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from checkpointd.blobs import open_blobs
from checkpointd.store.sqlite import SqliteCheckpointStore
from checkpointd.sweep import IN_USE, sweep_blobs

ORPHANS = 40


class CondemnsLate(SqliteCheckpointStore):
    """The real SQLite store, whose condemnation commits only after ``go`` is
    set: the window in which a client's deadline cancels the sweep."""

    entered: asyncio.Event
    go: asyncio.Event

    async def condemn_blobs(self, keys: list[str], hold_ms: int) -> list[str]:
        # Shielded: like aiosqlite's worker thread, the transaction goes on
        # when the caller is cancelled.
        return await asyncio.shield(self._condemn_late(keys, hold_ms))

    async def _condemn_late(self, keys: list[str], hold_ms: int) -> list[str]:
        self.entered.set()
        await self.go.wait()
        return await super().condemn_blobs(keys, hold_ms)


def _orphans(blob_dir: Path) -> list[str]:
    directory = blob_dir / "sandbox-files" / "blake3"
    directory.mkdir(parents=True)
    stamp = time.time() - 7200
    keys = []
    for index in range(ORPHANS):
        path = directory / f"{index:064x}"
        path.write_bytes(b"")
        os.utime(path, (stamp, stamp))
        keys.append(f"sandbox-files/blake3/{index:064x}")
    return keys


@pytest.mark.timeout(60)
async def test_a_cancelled_sweep_releases_what_it_condemned_after_the_cancel(
    tmp_path: Path,
) -> None:
    store = await CondemnsLate.open(str(tmp_path / "store.db"))
    assert isinstance(store, CondemnsLate)
    store.entered, store.go = asyncio.Event(), asyncio.Event()
    try:
        blobs = open_blobs(f"file://{tmp_path / 'blobs'}")
        keys = _orphans(tmp_path / "blobs")
        sweep = asyncio.create_task(sweep_blobs(store, blobs, 0, batch_size=ORPHANS))
        await store.entered.wait()
        sweep.cancel()
        with pytest.raises(asyncio.CancelledError):
            await sweep
        store.go.set()  # the condemnation commits now, after its sweep has gone
        for _ in range(100):
            await asyncio.sleep(0.01)  # its release follows on the loop
        # A second sweep condemns and deletes every orphan: none is left held.
        store.entered.clear()
        rest = await sweep_blobs(store, blobs, 0, batch_size=ORPHANS)
        assert [key for key, reason in rest.kept if reason == IN_USE] == []
        assert sorted(rest.deleted) == sorted(keys)
    finally:
        await store.aclose()
