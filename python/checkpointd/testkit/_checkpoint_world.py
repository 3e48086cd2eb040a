"""The checkpoint-store suite's shared parts: its constants, ``World`` (one fresh store
and what exists in it) and ``SuiteBase``, which every group of its rules extends."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from ..errors import (
    SandboxCheckpointConflictError,
    SandboxCheckpointError,
    SandboxCheckpointInvalidEntryError,
    SandboxCheckpointInvalidIdError,
    SandboxCheckpointWriterLostError,
)
from ..model import Checkpoint
from ._support import (
    LEASE_DURATION_MS,
    RENEW_AFTER_MS,
    START_MS,
    ManualClock,
    checkpoint,
    close_store,
    expect_error,
    fentry,
    state,
)

asyncio_test = pytest.mark.asyncio

BAD_IDS: tuple[Any, ...] = ("", "\ud800", "a\udfffb", 42, b"bytes")
NON_FINITE = (math.nan, math.inf, -math.inf)
INVALID_ID = SandboxCheckpointInvalidIdError.code
INVALID_ENTRY = SandboxCheckpointInvalidEntryError.code
WRITER_LOST = SandboxCheckpointWriterLostError.code
STALE_HEAD = SandboxCheckpointConflictError.code


def utf8(value: str) -> bytes:
    return value.encode("utf-8")


class World:
    """One fresh store, its clock, and helpers that remember what exists."""

    def __init__(self, store: Any, clock: ManualClock) -> None:
        self.store = store
        self.clock = clock
        self.threads: dict[str, None] = dict.fromkeys(("t1", "t2", "t3"))
        self.ids: dict[str, None] = {}

    def track(self, *, threads: Iterable[str] = (), ids: Iterable[str] = ()) -> None:
        self.threads.update(dict.fromkeys(threads))
        self.ids.update(dict.fromkeys(ids))

    async def lease(self, thread_id: str) -> Any:
        self.track(threads=[thread_id])
        return await self.store.acquire_writer(thread_id)

    async def add(self, cp: Checkpoint, writer: Any, expected: Any = "parent") -> str:
        """Append ``cp`` expecting its parent as the head (unless told otherwise)."""
        expected_head = cp.parent_checkpoint_id if expected == "parent" else expected
        result = await self.store.append(cp, expected_head, writer)
        assert result == cp.id, f"append returned {result!r}, expected {cp.id!r}"
        self.track(threads=[cp.thread_id], ids=[cp.id])
        return result

    async def chain(
        self, thread_id: str, ids: Iterable[str], writer: Any, *, keys: bool = True, start: int = 1
    ) -> list[Checkpoint]:
        """Append a chain of checkpoints; checkpoint n uses keys n and 1000 (shared)."""
        made = []
        parent = await self.store.get_head(thread_id)
        for n, checkpoint_id in enumerate(ids, start=start):
            files = [fentry("shared.txt", 1000), fentry(f"own-{n}.txt", n)] if keys else []
            cp = checkpoint(checkpoint_id, thread_id, parent, created_at=n, files=files)
            await self.add(cp, writer)
            made.append(cp)
            parent = checkpoint_id
        return made

    async def snapshot(self, ids: Iterable[str] = ()) -> Any:
        return await state(self.store, self.threads, [*self.ids, *ids])

    async def rejects(
        self,
        cls: type[SandboxCheckpointError],
        code: str | None,
        action: Callable[[], Awaitable[Any]],
        *,
        ids: Iterable[str] = (),
    ) -> SandboxCheckpointError:
        """``action`` raises ``cls`` with ``code`` and changes nothing observable."""
        before = await self.snapshot(ids)
        with pytest.raises(SandboxCheckpointError) as info:
            await action()
        expect_error(info.value, cls, code)
        after = await self.snapshot(ids)
        assert after == before, "a failed write changed the store"
        return info.value


class SuiteBase:
    """Makes a ``World`` from the ``make_store`` the suite was built with, and skips a
    test whose optional methods the store lacks."""

    _make_store: Callable[..., Awaitable[Any]]

    @asynccontextmanager
    async def world(self) -> AsyncIterator[World]:
        clock = ManualClock(START_MS)
        factory = type(self)._make_store
        store = await factory(
            now=clock, lease_duration_ms=LEASE_DURATION_MS, renew_after_ms=RENEW_AFTER_MS
        )
        try:
            yield World(store, clock)
        finally:
            await close_store(store)

    @staticmethod
    def need(store: Any, *methods: str) -> None:
        missing = [m for m in methods if not callable(getattr(store, m, None))]
        if missing:
            pytest.skip(f"the store has no {', '.join(missing)}")
