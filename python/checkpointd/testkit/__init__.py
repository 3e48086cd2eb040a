"""Conformance suites for checkpoint stores and instance stores (docs/contract.md#checkpoint-store).

One call in a test module runs every rule on your own store::

    from checkpointd.testkit import checkpoint_store_conformance, instance_store_conformance

    async def make_store(*, now, lease_duration_ms, renew_after_ms):
        return MyStore(await fresh_db(), now=now, lease_duration_ms=lease_duration_ms,
                       renew_after_ms=renew_after_ms)   # a fresh, EMPTY store

    TestMyStore = checkpoint_store_conformance(make_store)
    TestMyInstances = instance_store_conformance(my_async_instance_store_factory)

The tests are asyncio tests marked ``pytest.mark.asyncio`` (needs pytest and
pytest-asyncio; works in both ``strict`` and ``auto`` mode). The checkpoint suite
drives a clock by hand (starting at 1_000 ms) with ``lease_duration_ms=100`` and
``renew_after_ms=25``; every store it makes is closed with ``aclose()``.
"""

from __future__ import annotations

import pytest

# Plain ``assert`` statements in the suites get pytest's detailed messages.
pytest.register_assert_rewrite(
    "checkpointd.testkit._checkpoint_suite",
    "checkpointd.testkit._checkpoint_world",
    "checkpointd.testkit._checkpoint_appends",
    "checkpointd.testkit._checkpoint_values",
    "checkpointd.testkit._checkpoint_leases",
    "checkpointd.testkit._checkpoint_prune_fork",
    "checkpointd.testkit._checkpoint_blobs",
    "checkpointd.testkit._instance_suite",
    "checkpointd.testkit._support",
)

from ._checkpoint_suite import CheckpointStoreConformance, checkpoint_store_conformance  # noqa: E402
from ._instance_suite import InstanceStoreConformance, instance_store_conformance  # noqa: E402
from ._support import ManualClock  # noqa: E402

__all__ = [
    "CheckpointStoreConformance",
    "InstanceStoreConformance",
    "ManualClock",
    "checkpoint_store_conformance",
    "instance_store_conformance",
]
