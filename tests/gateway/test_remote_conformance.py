"""The conformance suite, unchanged, on the remote store: a gateway (in this
process, on loopback gRPC) in front of SQLite, and in front of PostgreSQL."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from checkpointd.blobs import open_blobs
from checkpointd.gateway import tokens
from checkpointd.store.postgres import open_postgres_store
from checkpointd.store.sqlite import SqliteCheckpointStore
from checkpointd.testkit import checkpoint_store_conformance
from tests.fixtures.postgres import fresh_database_url

from .conftest import Keys, remote_store_over

_KEYS_DIR = Path(tempfile.mkdtemp(prefix="gateway-keys-"))
_KEYS = Keys(_KEYS_DIR / "key.pem", tokens.generate_key(_KEYS_DIR / "key.pem"))


async def make_sqlite_backed(*, now, lease_duration_ms, renew_after_ms):
    path = Path(tempfile.mkdtemp(prefix="gateway-store-")) / "store.db"
    store = await SqliteCheckpointStore.open(
        str(path), now=now, lease_duration_ms=lease_duration_ms, renew_after_ms=renew_after_ms
    )
    return await remote_store_over(store, open_blobs("memory://"), _KEYS)


async def make_postgres_backed(*, now, lease_duration_ms, renew_after_ms):
    store = await open_postgres_store(
        fresh_database_url(),
        now=now,
        lease_duration_ms=lease_duration_ms,
        renew_after_ms=renew_after_ms,
    )
    return await remote_store_over(store, open_blobs("memory://"), _KEYS)


TestRemoteStoreOverSqlite = checkpoint_store_conformance(make_sqlite_backed)
TestRemoteStoreOverPostgres = pytest.mark.postgres(
    checkpoint_store_conformance(make_postgres_backed)
)
