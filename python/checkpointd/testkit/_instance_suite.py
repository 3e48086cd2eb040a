"""The instance-store conformance suite (docs/contract.md#checkpoint-store), as a pytest class factory.

``instance_store_conformance(make_store)`` returns a test class; ``make_store`` is
``async def make_store() -> store`` returning a fresh, EMPTY instance store each
call. The suite closes every store it made (``aclose()`` when the store has it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from ..store.base import InstanceRecord
from ._support import close_store

asyncio_test = pytest.mark.asyncio


def record(key: str = "k1", **overrides: Any) -> InstanceRecord:
    fields: dict[str, Any] = {
        "key": key,
        "provider": "docker",
        "provider_sandbox_id": "sbx-1",
        "thread_id": "thread-1",
        "updated_at": 1_000,
    }
    fields.update(overrides)
    return InstanceRecord(**fields)


class InstanceStoreConformance:
    """get / upsert (full replace) / delete (no-op when missing)."""

    _make_store: Callable[..., Awaitable[Any]]

    @asynccontextmanager
    async def opened(self) -> AsyncIterator[Any]:
        store = await type(self)._make_store()
        try:
            yield store
        finally:
            await close_store(store)

    @asyncio_test
    async def test_missing_key_is_none(self) -> None:
        async with self.opened() as store:
            assert await store.get("missing") is None

    @asyncio_test
    async def test_upsert_then_get(self) -> None:
        async with self.opened() as store:
            full = record(latest_snapshot_id="cp-9", latest_run_id="run-3")
            assert await store.upsert(full) is None
            got = await store.get("k1")
            assert got == full
            assert isinstance(got, InstanceRecord)
            assert isinstance(got.updated_at, int)

    @asyncio_test
    async def test_upsert_is_a_full_replace(self) -> None:
        async with self.opened() as store:
            await store.upsert(record(latest_snapshot_id="cp-9", latest_run_id="run-3"))
            replacement = record(provider="e2b", provider_sandbox_id="sbx-2", updated_at=2_000)
            await store.upsert(replacement)
            got = await store.get("k1")
            assert got == replacement
            assert got.latest_snapshot_id is None, "omitted optional fields are cleared"
            assert got.latest_run_id is None
            await store.upsert(record(latest_run_id="run-4", updated_at=3_000))
            assert await store.get("k1") == record(latest_run_id="run-4", updated_at=3_000)

    @asyncio_test
    async def test_delete(self) -> None:
        async with self.opened() as store:
            await store.upsert(record("k1"))
            await store.upsert(record("k2", thread_id="thread-2"))
            assert await store.delete("k1") is None
            assert await store.get("k1") is None
            assert await store.get("k2") == record("k2", thread_id="thread-2")
            await store.delete("k1")  # missing: a no-op
            await store.delete("never-there")
            assert await store.get("k2") == record("k2", thread_id="thread-2")
            await store.upsert(record("k1", updated_at=5))
            assert await store.get("k1") == record("k1", updated_at=5)

    @asyncio_test
    async def test_keys_are_independent_and_exact(self) -> None:
        async with self.opened() as store:
            keys = ["é", "e\u0301", "😀", "K", "k", "k "]
            for n, key in enumerate(keys):
                await store.upsert(record(key, updated_at=n))
            for n, key in enumerate(keys):
                assert await store.get(key) == record(key, updated_at=n)
            assert await store.get("kk") is None


def instance_store_conformance(
    make_store: Callable[..., Awaitable[Any]], *, name: str = "TestInstanceStoreConformance"
) -> type:
    """A pytest test class for an instance store; ``make_store()`` returns a fresh,
    empty store. Use it as ``TestMyInstances = instance_store_conformance(make)``."""
    if not callable(make_store):
        raise TypeError("make_store must be an async callable returning a fresh store")
    return type(name, (InstanceStoreConformance,), {"_make_store": staticmethod(make_store)})
