"""list_threads (ListThreads' store method) on memory, SQLite and PostgreSQL.

Pages in UTF-8 byte order of the thread id, with the head and the count of each
thread, across threads with off-chain checkpoints and a deleted head.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from checkpointd.errors import (
    SandboxCheckpointInvalidArgumentError,
    SandboxCheckpointInvalidIdError,
)
from checkpointd.model import Checkpoint
from checkpointd.store import ThreadListing, ThreadSummary, open_store


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    if request.param == "memory":
        url = "memory://"
    elif request.param == "sqlite":
        url = f"sqlite://{tmp_path / 'threads.db'}"
    else:
        url = request.getfixturevalue("postgres_url")
    opened = await open_store(url)
    try:
        yield opened
    finally:
        await opened.aclose()


async def _append(store: Any, thread: str, checkpoint_id: str, created_at: int) -> None:
    async with await store.acquire_writer(thread) as lease:
        head = await store.get_head(thread)
        await store.append(
            Checkpoint(
                id=checkpoint_id,
                thread_id=thread,
                parent_checkpoint_id=head,
                created_at=created_at,
            ),
            head,
            lease,
        )


async def _all_pages(store: Any, limit: int) -> list[ThreadSummary]:
    out: list[ThreadSummary] = []
    after = None
    while True:
        page = await store.list_threads(after=after, limit=limit)
        assert len(page) <= limit
        out.extend(page)
        if len(page) < limit:
            return out
        after = page[-1].thread_id


async def test_pages_of_threads_with_head_and_count(store: Any) -> None:
    assert isinstance(store, ThreadListing)
    assert await store.list_threads() == []
    # UTF-8 byte order differs from code-point order for these (U+FF5E vs U+1F600).
    threads = ["b", "a", "a-2", "\uff5e", "\U0001f600", "Z"]
    for index, thread in enumerate(threads):
        for n in range(index + 1):
            await _append(store, thread, f"{thread}-cp{n}", 1000 * index + n)
    # A thread whose head was deleted back to its parent, then to nothing.
    await _append(store, "gone", "gone-cp0", 5)
    async with await store.acquire_writer("gone") as lease:
        await store.delete_head("gone", "gone-cp0", lease)

    expected_order = sorted(threads, key=lambda t: t.encode())
    for limit in (1, 2, 100):
        listed = await _all_pages(store, limit)
        assert [s.thread_id for s in listed] == expected_order
    by_id = {s.thread_id: s for s in await store.list_threads(limit=100)}
    for index, thread in enumerate(threads):
        summary = by_id[thread]
        assert summary.checkpoint_count == index + 1
        assert summary.head_checkpoint_id == f"{thread}-cp{index}"
        assert summary.newest_created_at == 1000 * index + index
    assert "gone" not in by_id  # no checkpoint left: not a thread any more
    after_a = await store.list_threads(after="a", limit=2)
    assert [s.thread_id for s in after_a] == expected_order[
        expected_order.index("a") + 1 : expected_order.index("a") + 3
    ]


async def test_bad_arguments(store: Any) -> None:
    for limit in (0, -1, 1.5, "10"):
        with pytest.raises(SandboxCheckpointInvalidArgumentError):
            await store.list_threads(limit=limit)
    with pytest.raises(SandboxCheckpointInvalidIdError):
        await store.list_threads(after="")
