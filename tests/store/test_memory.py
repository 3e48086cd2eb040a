"""The conformance suites on the in-memory stores."""

from __future__ import annotations

from checkpointd.store import InMemoryCheckpointStore, InMemoryInstanceStore
from checkpointd.testkit import checkpoint_store_conformance, instance_store_conformance


async def make_store(*, now, lease_duration_ms, renew_after_ms):
    return InMemoryCheckpointStore(
        now=now, lease_duration_ms=lease_duration_ms, renew_after_ms=renew_after_ms
    )


async def make_instances():
    return InMemoryInstanceStore()


TestInMemoryCheckpointStore = checkpoint_store_conformance(make_store)
TestInMemoryInstanceStore = instance_store_conformance(make_instances)
