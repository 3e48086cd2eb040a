"""Sweep does not trust the counters alone: a damaged count row (a SQL UPDATE on
the counts table, SQLite and PostgreSQL) never makes it delete a blob that a
stored manifest uses; the key is kept as ``count-mismatch``."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from checkpointd.blobs import open_blobs
from checkpointd.capture import CaptureOptions, capture_checkpoint
from checkpointd.restore import RestoreOptions, restore_checkpoint
from checkpointd.store import open_store
from checkpointd.store._options import key_to_bytes
from checkpointd.sweep import COUNT_MISMATCH, REFERENCED, sweep_blobs

from .conftest import snapshot_tree

# How a count row gets damaged: zeroed, negative, or one flipped byte in its key
# (the real key loses its row, a key nobody uses gains one).
DAMAGE = ["zeroed", "negative", "key-flipped"]


def _flipped(raw: bytes) -> bytes:
    return raw[:-1] + bytes([raw[-1] ^ 0x01])


async def _damage_sqlite(url: str, key: str, how: str) -> None:
    raw = key_to_bytes(key)
    with sqlite3.connect(url.removeprefix("sqlite://")) as db:
        if how == "zeroed":
            done = db.execute("UPDATE blob_references SET refs = 0 WHERE key = ?", (raw,))
        elif how == "negative":
            done = db.execute("UPDATE blob_references SET refs = -1 WHERE key = ?", (raw,))
        else:
            done = db.execute(
                "UPDATE blob_references SET key = ? WHERE key = ?", (_flipped(raw), raw)
            )
        assert done.rowcount == 1


async def _damage_postgres(url: str, key: str, how: str) -> None:
    raw = key_to_bytes(key)
    conn = await asyncpg.connect(url)
    try:
        if how == "zeroed":
            done = await conn.execute(
                "UPDATE checkpointd_blob_counts SET refs = 0 WHERE key = $1", raw
            )
        elif how == "negative":
            done = await conn.execute(
                "UPDATE checkpointd_blob_counts SET refs = -1 WHERE key = $1", raw
            )
        else:
            done = await conn.execute(
                "UPDATE checkpointd_blob_counts SET key = $2 WHERE key = $1", raw, _flipped(raw)
            )
        assert done != "UPDATE 0"
    finally:
        await conn.close()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    if request.param == "sqlite":
        yield f"sqlite://{tmp_path / 'store.db'}"
    else:
        yield request.getfixturevalue("postgres_url")


def _damager(url: str) -> Any:
    return _damage_sqlite if url.startswith("sqlite") else _damage_postgres


@pytest.mark.parametrize("how", DAMAGE)
async def test_a_damaged_count_never_deletes_a_used_blob(
    store_url: str, how: str, tmp_path: Path
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    # 1 MiB and more: single objects, which this sweep lists (it never deletes
    # a blob resting in a pack; the pack-aware sweep comes with repacking).
    (workspace / "shared.txt").write_text("used by two checkpoints" * 50_000)
    (workspace / "first.txt").write_text("only in the first" * 70_000)
    blobs = open_blobs(f"file://{tmp_path / 'blobs'}")
    store = await open_store(store_url)
    try:
        data_dir = tmp_path / "data"
        first = await capture_checkpoint(
            workspace, store, blobs, "t", CaptureOptions(data_dir=data_dir)
        )
        (workspace / "first.txt").unlink()
        second = await capture_checkpoint(
            workspace, store, blobs, "t", CaptureOptions(data_dir=data_dir)
        )
        expected = snapshot_tree(workspace)
        shared = next(e.blob_key for e in second.checkpoint.files if e.path == "shared.txt")
        await _damager(store_url)(store_url, shared, how)

        report = await sweep_blobs(store, blobs, 0)
        assert shared not in report.deleted
        assert (shared, COUNT_MISMATCH) in report.kept
        assert await blobs.head(shared) is not None
        used = {e.blob_key for e in first.checkpoint.files if hasattr(e, "blob_key")}
        assert {key for key, reason in report.kept if reason == REFERENCED} == used - {shared}
        assert report.deleted == [] and report.failures == []

        # Every checkpoint still restores.
        for done in (first, second):
            target = tmp_path / f"restore-{done.checkpoint.id}"
            await restore_checkpoint(
                target,
                store,
                blobs,
                "t",
                RestoreOptions(checkpoint_id=done.checkpoint.id, data_dir=data_dir),
            )
        assert snapshot_tree(tmp_path / f"restore-{second.checkpoint.id}") == expected
    finally:
        await store.aclose()
