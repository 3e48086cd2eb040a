"""The checkpoint-store suite's ``delete_head`` and writer-lease rules (fences,
expiry, renew, release, owners)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from functools import partial
from types import SimpleNamespace
from typing import Any

import pytest

from ..errors import (
    SandboxCheckpointError,
    SandboxCheckpointInvalidArgumentError,
    SandboxCheckpointInvalidIdError,
    SandboxCheckpointNotHeadError,
    SandboxCheckpointWriterConflictError,
    SandboxCheckpointWriterLostError,
)
from ..model import Writer
from ._checkpoint_world import BAD_IDS, INVALID_ID, WRITER_LOST, SuiteBase, asyncio_test
from ._support import LEASE_DURATION_MS, RENEW_AFTER_MS, START_MS, checkpoint, expect_error


class LeaseRules(SuiteBase):
    """``delete_head`` and the writer leases."""

    # ================================================================ delete_head

    @asyncio_test
    async def test_delete_head_only_on_the_head(self) -> None:
        async with self.world() as w:
            l1, l2 = await w.lease("t1"), await w.lease("t2")
            await w.chain("t1", ["c1", "c2", "c3"], l1)
            await w.chain("t2", ["d1"], l2, start=10)
            for thread_id, checkpoint_id, writer in (
                ("t1", "c2", l1),
                ("t1", "c1", l1),
                ("t1", "missing", l1),
                ("t1", "d1", l1),
                ("t2", "c3", l2),
                ("t3", "c3", await w.lease("t3")),
            ):
                await w.rejects(
                    SandboxCheckpointNotHeadError,
                    SandboxCheckpointNotHeadError.code,
                    partial(w.store.delete_head, thread_id, checkpoint_id, writer),
                )
            assert await w.store.delete_head("t1", "c3", l1) is None
            assert await w.store.get_head("t1") == "c2"
            assert await w.store.get("c3") is None
            assert [c.id for c in await w.store.list("t1")] == ["c1", "c2"]
            await w.store.delete_head("t1", "c2", l1)
            await w.store.delete_head("t1", "c1", l1)
            assert await w.store.get_head("t1") is None
            assert await w.store.list("t1") == []
            # The thread can start again from an empty head.
            await w.add(checkpoint("again", "t1"), l1)
            assert await w.store.get_head("t1") == "again"

    @asyncio_test
    async def test_delete_head_check_order(self) -> None:
        async with self.world() as w:
            l1 = await w.lease("t1")
            await w.chain("t1", ["c1", "c2"], l1)
            stale = Writer("t1", "nope", 77)
            for bad in BAD_IDS:
                await w.rejects(
                    SandboxCheckpointInvalidIdError,
                    INVALID_ID,
                    partial(w.store.delete_head, bad, "c1", stale),
                )
                await w.rejects(
                    SandboxCheckpointInvalidIdError,
                    INVALID_ID,
                    partial(w.store.delete_head, "t1", bad, stale),
                )
            # The writer is checked before the head.
            await w.rejects(
                SandboxCheckpointWriterLostError,
                WRITER_LOST,
                lambda: w.store.delete_head("t1", "c1", stale),
            )
            await w.rejects(
                SandboxCheckpointWriterLostError,
                WRITER_LOST,
                lambda: w.store.delete_head("t1", "c2", stale),
            )

    # ================================================================ leases

    @asyncio_test
    async def test_acquire_writer_fields_and_no_waiting(self) -> None:
        async with self.world() as w:
            lease = await w.store.acquire_writer("t1")
            assert lease.thread_id == "t1"
            assert lease.fence == 1
            assert isinstance(lease.owner_token, str) and lease.owner_token
            assert lease.expires_at == START_MS + LEASE_DURATION_MS
            assert lease.renew_after_ms == RENEW_AFTER_MS
            # A second acquire fails at once (no waiting for the lease to end).
            with pytest.raises(SandboxCheckpointError) as info:
                await asyncio.wait_for(w.store.acquire_writer("t1"), timeout=5)
            expect_error(
                info.value,
                SandboxCheckpointWriterConflictError,
                SandboxCheckpointWriterConflictError.code,
            )
            w.clock.advance(LEASE_DURATION_MS - 1)
            with pytest.raises(SandboxCheckpointWriterConflictError):
                await asyncio.wait_for(w.store.acquire_writer("t1"), timeout=5)
            # Other threads have their own leases and fences.
            other = await w.store.acquire_writer("t2")
            assert other.fence == 1
            assert other.owner_token != lease.owner_token
            for bad in BAD_IDS:
                with pytest.raises(SandboxCheckpointInvalidIdError):
                    await w.store.acquire_writer(bad)

    @asyncio_test
    async def test_fences_grow_and_survive_release(self) -> None:
        async with self.world() as w:
            tokens = set()
            fences = []
            for _ in range(3):
                lease = await w.store.acquire_writer("t1")
                fences.append(lease.fence)
                tokens.add(lease.owner_token)
                with pytest.raises(SandboxCheckpointWriterConflictError):
                    await w.store.acquire_writer("t1")
                await lease.release()
            # Takeover after expiry (no release) also takes the next fence.
            lease = await w.store.acquire_writer("t1")
            fences.append(lease.fence)
            tokens.add(lease.owner_token)
            w.clock.advance(LEASE_DURATION_MS)
            taken = await w.store.acquire_writer("t1")
            fences.append(taken.fence)
            tokens.add(taken.owner_token)
            assert fences == [1, 2, 3, 4, 5]
            assert len(tokens) == 5
            # Deleting everything in the thread does not reset the fence.
            await w.add(checkpoint("c1", "t1"), taken)
            await w.store.delete_head("t1", "c1", taken)
            await taken.release()
            assert (await w.store.acquire_writer("t1")).fence == 6
            assert (await w.store.acquire_writer("t2")).fence == 1

    @asyncio_test
    async def test_expiry(self) -> None:
        async with self.world() as w:
            lease = await w.lease("t1")
            w.clock.advance(LEASE_DURATION_MS - 1)  # still current at expires_at - 1
            await w.add(checkpoint("c1", "t1"), lease)
            w.clock.advance(1)  # now == expires_at: no longer current
            await w.rejects(
                SandboxCheckpointWriterLostError,
                WRITER_LOST,
                lambda: w.store.append(checkpoint("c2", "t1", "c1"), "c1", lease),
                ids=["c2"],
            )
            await w.rejects(
                SandboxCheckpointWriterLostError,
                WRITER_LOST,
                lambda: w.store.delete_head("t1", "c1", lease),
            )
            taken = await w.store.acquire_writer("t1")
            assert taken.fence == lease.fence + 1
            assert taken.expires_at == w.clock() + LEASE_DURATION_MS

    @asyncio_test
    async def test_renew(self) -> None:
        async with self.world() as w:
            lease = await w.lease("t1")
            w.clock.advance(50)
            expires_at = await lease.renew()
            assert expires_at == START_MS + 50 + LEASE_DURATION_MS
            assert lease.expires_at == expires_at
            assert isinstance(expires_at, int)
            w.clock.set(START_MS + LEASE_DURATION_MS + 20)  # past the first expiry
            await w.add(checkpoint("c1", "t1"), lease)
            with pytest.raises(SandboxCheckpointWriterConflictError):
                await w.store.acquire_writer("t1")
            # Renewing at exactly expires_at is too late.
            w.clock.set(expires_at)
            with pytest.raises(SandboxCheckpointError) as info:
                await lease.renew()
            expect_error(info.value, SandboxCheckpointWriterLostError, WRITER_LOST)
            assert lease.expires_at == expires_at
            # A released lease cannot be renewed.
            fresh = await w.store.acquire_writer("t1")
            await fresh.release()
            with pytest.raises(SandboxCheckpointWriterLostError):
                await fresh.renew()

    @asyncio_test
    async def test_renew_of_a_replaced_lease(self) -> None:
        async with self.world() as w:
            old = await w.lease("t1")
            w.clock.advance(LEASE_DURATION_MS)
            new = await w.store.acquire_writer("t1")
            with pytest.raises(SandboxCheckpointWriterLostError):
                await old.renew()
            # The failed renew did not disturb the new lease.
            await w.add(checkpoint("c1", "t1"), new)
            assert await new.renew() == w.clock() + LEASE_DURATION_MS

    @asyncio_test
    async def test_stale_lease_cannot_release_a_replacement(self) -> None:
        async with self.world() as w:
            old = await w.lease("t1")
            w.clock.advance(LEASE_DURATION_MS + 5)
            new = await w.store.acquire_writer("t1")
            assert await old.release() is None  # never raises
            assert await old.release() is None
            with pytest.raises(SandboxCheckpointWriterConflictError):
                await w.store.acquire_writer("t1")
            await w.add(checkpoint("c1", "t1"), new)
            await new.release()
            await new.release()  # twice is fine
            again = await w.store.acquire_writer("t1")
            assert again.fence == new.fence + 1

    @asyncio_test
    async def test_stale_lease_can_neither_append_nor_delete_after_takeover(self) -> None:
        async with self.world() as w:
            old = await w.lease("t1")
            await w.chain("t1", ["c1", "c2"], old)
            w.clock.advance(LEASE_DURATION_MS)
            new = await w.store.acquire_writer("t1")
            actions: list[Callable[[], Awaitable[Any]]] = [
                lambda: w.store.append(checkpoint("c3", "t1", "c2", 3), "c2", old),
                lambda: w.store.delete_head("t1", "c2", old),
            ]
            if callable(getattr(w.store, "delete_checkpoints", None)):
                actions.append(lambda: w.store.delete_checkpoints("t1", 1, old))
            for action in actions:
                await w.rejects(SandboxCheckpointWriterLostError, WRITER_LOST, action, ids=["c3"])
            # Even a lease that still looks unexpired to its holder is replaced.
            old.expires_at = w.clock() + 10_000
            await w.rejects(
                SandboxCheckpointWriterLostError,
                WRITER_LOST,
                lambda: w.store.append(checkpoint("c3", "t1", "c2", 3), "c2", old),
                ids=["c3"],
            )
            await w.add(checkpoint("c3", "t1", "c2", 3), new)

    @asyncio_test
    async def test_async_with_releases(self) -> None:
        async with self.world() as w:
            async with await w.store.acquire_writer("t1") as lease:
                assert lease.fence == 1
                await w.add(checkpoint("c1", "t1"), lease)
                with pytest.raises(SandboxCheckpointWriterConflictError):
                    await w.store.acquire_writer("t1")
            again = await w.store.acquire_writer("t1")
            assert again.fence == 2
            with pytest.raises(SandboxCheckpointWriterLostError):
                await w.store.delete_head("t1", "c1", lease)

    @staticmethod
    def need_owner(store: Any) -> None:
        """Skip unless ``acquire_writer`` takes the optional ``owner`` keyword."""
        try:
            parameters = inspect.signature(store.acquire_writer).parameters
        except (TypeError, ValueError):
            return
        if "owner" not in parameters and not any(
            p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
        ):
            pytest.skip("the store's acquire_writer takes no owner")

    @asyncio_test
    async def test_conflict_says_when_the_lease_expires(self) -> None:
        async with self.world() as w:
            lease = await w.lease("t1")
            w.clock.advance(30)
            with pytest.raises(SandboxCheckpointWriterConflictError) as info:
                await w.store.acquire_writer("t1")
            details = info.value.details
            assert details.get("thread_id") == "t1"
            assert details.get("expires_at_ms") == lease.expires_at
            assert details.get("retry_after_ms") == LEASE_DURATION_MS - 30
            # A renewed lease moves the expiry the error reports.
            await lease.renew()
            with pytest.raises(SandboxCheckpointWriterConflictError) as info:
                await w.store.acquire_writer("t1")
            assert info.value.details.get("expires_at_ms") == lease.expires_at
            assert info.value.details.get("retry_after_ms") == LEASE_DURATION_MS

    @asyncio_test
    async def test_same_owner_takes_its_live_lease_back(self) -> None:
        async with self.world() as w:
            self.need_owner(w.store)
            w.track(threads=["t1"])
            old = await w.store.acquire_writer("t1", owner="daemon-a")
            await w.chain("t1", ["c1", "c2"], old)
            w.clock.advance(10)  # the old lease is still live: a process restarted
            new = await w.store.acquire_writer("t1", owner="daemon-a")
            assert new.fence == old.fence + 1
            assert new.owner_token != old.owner_token
            assert new.expires_at == w.clock() + LEASE_DURATION_MS
            # The dead process's writer is fenced off.
            with pytest.raises(SandboxCheckpointWriterLostError):
                await old.renew()
            actions: list[Callable[[], Awaitable[Any]]] = [
                lambda: w.store.append(checkpoint("c3", "t1", "c2", 3), "c2", old),
                lambda: w.store.delete_head("t1", "c2", old),
            ]
            if callable(getattr(w.store, "delete_checkpoints", None)):
                actions.append(lambda: w.store.delete_checkpoints("t1", 1, old))
            for action in actions:
                await w.rejects(SandboxCheckpointWriterLostError, WRITER_LOST, action, ids=["c3"])
            await old.release()  # the stale release leaves the new lease alone
            await w.add(checkpoint("c3", "t1", "c2", 3), new)
            assert await new.renew() == w.clock() + LEASE_DURATION_MS

    @asyncio_test
    async def test_another_owner_still_conflicts(self) -> None:
        async with self.world() as w:
            self.need_owner(w.store)
            w.track(threads=["t1"])
            held = await w.store.acquire_writer("t1", owner="daemon-a")
            w.clock.advance(40)
            for attempt in (
                lambda: w.store.acquire_writer("t1", owner="daemon-b"),
                lambda: w.store.acquire_writer("t1"),
            ):
                with pytest.raises(SandboxCheckpointError) as info:
                    await attempt()
                expect_error(
                    info.value,
                    SandboxCheckpointWriterConflictError,
                    SandboxCheckpointWriterConflictError.code,
                )
                assert info.value.details.get("expires_at_ms") == held.expires_at
                assert info.value.details.get("retry_after_ms") == LEASE_DURATION_MS - 40
            # A lease taken without an owner is no one's to take back.
            anonymous = await w.store.acquire_writer("t2")
            with pytest.raises(SandboxCheckpointWriterConflictError):
                await w.store.acquire_writer("t2", owner="daemon-a")
            # The holder is unaffected, and once it expires anyone may acquire.
            await w.add(checkpoint("c1", "t1"), held)
            w.clock.advance(LEASE_DURATION_MS)
            taken = await w.store.acquire_writer("t1", owner="daemon-b")
            assert taken.fence == held.fence + 1
            with pytest.raises(SandboxCheckpointWriterConflictError):
                await w.store.acquire_writer("t1", owner="daemon-a")
            assert anonymous.fence == 1
            for bad in ("", 42, b"daemon-a"):
                with pytest.raises(SandboxCheckpointInvalidArgumentError):
                    await w.store.acquire_writer("t3", owner=bad)

    @asyncio_test
    async def test_any_writer_like_object_is_accepted(self) -> None:
        async with self.world() as w:
            lease = await w.lease("t1")
            plain = Writer(lease.thread_id, lease.owner_token, lease.fence)
            await w.add(checkpoint("c1", "t1"), plain)
            ns = SimpleNamespace(thread_id="t1", owner_token=lease.owner_token, fence=lease.fence)
            await w.add(checkpoint("c2", "t1", "c1", 2), ns)
            for writer in (
                Writer("t1", lease.owner_token, lease.fence + 1),
                Writer("t1", lease.owner_token + "x", lease.fence),
                Writer("t2", lease.owner_token, lease.fence),
                object(),
            ):
                await w.rejects(
                    SandboxCheckpointWriterLostError,
                    WRITER_LOST,
                    partial(w.store.append, checkpoint("c3", "t1", "c2", 3), "c2", writer),
                    ids=["c3"],
                )
