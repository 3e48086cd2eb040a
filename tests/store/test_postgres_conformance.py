"""The conformance suites, unchanged, on the PostgreSQL stores (a fresh database each)."""

from __future__ import annotations

import pytest

from checkpointd.store.postgres import open_postgres_instance_store, open_postgres_store
from checkpointd.testkit import checkpoint_store_conformance, instance_store_conformance
from tests.fixtures.postgres import fresh_database_url


async def make_store(*, now, lease_duration_ms, renew_after_ms):
    return await open_postgres_store(
        fresh_database_url(),
        now=now,
        lease_duration_ms=lease_duration_ms,
        renew_after_ms=renew_after_ms,
    )


async def make_instances():
    return await open_postgres_instance_store(fresh_database_url())


TestPostgresCheckpointStore = pytest.mark.postgres(checkpoint_store_conformance(make_store))
TestPostgresInstanceStore = pytest.mark.postgres(instance_store_conformance(make_instances))
