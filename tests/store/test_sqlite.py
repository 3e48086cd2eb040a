"""The conformance suites on the SQLite stores (a real file under tmp_path per store)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from checkpointd.store import SqliteCheckpointStore, SqliteInstanceStore
from checkpointd.testkit import checkpoint_store_conformance, instance_store_conformance

_counter = itertools.count()
_directories: list[Path] = []


@pytest.fixture(autouse=True)
def _database_directory(tmp_path: Path):
    _directories.append(tmp_path)
    yield
    _directories.pop()


async def make_store(*, now, lease_duration_ms, renew_after_ms):
    path = _directories[-1] / f"store-{next(_counter)}.db"
    return await SqliteCheckpointStore.open(
        str(path), now=now, lease_duration_ms=lease_duration_ms, renew_after_ms=renew_after_ms
    )


async def make_instances():
    return await SqliteInstanceStore.open(str(_directories[-1] / f"inst-{next(_counter)}.db"))


TestSqliteCheckpointStore = checkpoint_store_conformance(make_store)
TestSqliteInstanceStore = instance_store_conformance(make_instances)
