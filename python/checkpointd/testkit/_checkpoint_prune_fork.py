"""The checkpoint-store suite's ``delete_checkpoints`` (prune) and
``fork_from_checkpoint`` rules."""

from __future__ import annotations

import math
from functools import partial
from typing import Any

from ..errors import (
    FORK_DESTINATION_NOT_EMPTY,
    FORK_SOURCE_NOT_FOUND,
    FORK_SOURCE_THREAD_MISMATCH,
    SandboxCheckpointError,
    SandboxCheckpointInvalidArgumentError,
    SandboxCheckpointInvalidEntryError,
    SandboxCheckpointInvalidIdError,
    SandboxCheckpointWriterLostError,
)
from ..model import Checkpoint, DirEntry, SymlinkEntry, Writer
from ._checkpoint_world import (
    BAD_IDS,
    INVALID_ENTRY,
    INVALID_ID,
    NON_FINITE,
    WRITER_LOST,
    SuiteBase,
    World,
    asyncio_test,
)
from ._support import LEASE_DURATION_MS, artifact, artifact_key, checkpoint, fentry, file_key


class PruneForkRules(SuiteBase):
    """Prune and fork (each skipped when the store lacks it)."""

    # ================================================================ prune

    @asyncio_test
    async def test_delete_checkpoints_keeps_head_and_nearest_ancestors(self) -> None:
        async with self.world() as w:
            self.need(w.store, "delete_checkpoints")
            l1, l2 = await w.lease("t1"), await w.lease("t2")
            await w.chain("t1", ["c1", "c2", "c3", "c4", "c5"], l1)
            await w.chain("t2", ["d1"], l2, start=100)
            deleted = await w.store.delete_checkpoints("t1", 2, l1)
            assert deleted == ["c1", "c2", "c3"]
            assert [c.id for c in await w.store.list("t1")] == ["c4", "c5"]
            assert await w.store.get_head("t1") == "c5"
            assert await w.store.get("c1") is None
            refs = {r.key: r.references for r in await w.store.list_blob_references()}
            assert refs == {file_key(1000): 3, file_key(4): 1, file_key(5): 1, file_key(100): 1}
            assert await w.store.delete_checkpoints("t1", 2, l1) == []
            assert await w.store.delete_checkpoints("t1", 10, l1) == []
            assert await w.store.delete_checkpoints("t1", 1, l1) == ["c4"]
            # The head's parent is gone now: deleting the head empties the thread.
            await w.store.delete_head("t1", "c5", l1)
            assert await w.store.get_head("t1") is None
            assert [c.id for c in await w.store.list("t2")] == ["d1"]
            l3 = await w.lease("t3")
            assert await w.store.delete_checkpoints("t3", 1, l3) == []

    @asyncio_test
    async def test_delete_checkpoints_returns_list_order(self) -> None:
        async with self.world() as w:
            self.need(w.store, "delete_checkpoints")
            lease = await w.lease("t1")
            parent = None
            for checkpoint_id, created_at in (("é", 1), ("b", 1), ("A", 1), ("😀", 0), ("h", 5)):
                await w.add(checkpoint(checkpoint_id, "t1", parent, created_at), lease)
                parent = checkpoint_id
            assert await w.store.delete_checkpoints("t1", 1, lease) == ["😀", "A", "b", "é"]

    @asyncio_test
    async def test_delete_checkpoints_check_order(self) -> None:
        async with self.world() as w:
            self.need(w.store, "delete_checkpoints")
            lease = await w.lease("t1")
            await w.chain("t1", ["c1", "c2", "c3"], lease)
            stale = Writer("t1", "nope", 5)
            for bad in BAD_IDS:
                await w.rejects(
                    SandboxCheckpointInvalidIdError,
                    INVALID_ID,
                    partial(w.store.delete_checkpoints, bad, 0, stale),
                )
            for keep in (0, -1, 1.5, "2", None, True, math.nan):
                for writer in (lease, stale):
                    error = await w.rejects(
                        SandboxCheckpointInvalidArgumentError,
                        SandboxCheckpointInvalidArgumentError.code,
                        partial(w.store.delete_checkpoints, "t1", keep, writer),
                    )
                    assert isinstance(error, ValueError)
            await w.rejects(
                SandboxCheckpointWriterLostError,
                WRITER_LOST,
                lambda: w.store.delete_checkpoints("t1", 1, stale),
            )

    # ================================================================ fork

    async def _fork_world(self, w: World) -> tuple[Any, Any, Any]:
        l1, l2, l3 = await w.lease("t1"), await w.lease("t2"), await w.lease("t3")
        await w.add(checkpoint("c1", "t1", files=[fentry("a", 1)]), l1)
        source = checkpoint(
            "c2",
            "t1",
            "c1",
            2,
            files=[DirEntry("d"), fentry("d/a", 1), fentry("d/b", 2), SymlinkEntry("s", "d")],
            artifacts=[artifact("art", 9)],
            conversation=[{"role": "user", "content": "fork me"}],
            reason="named",
            label="v1",
            source_run_id="run-7",
        )
        await w.add(source, l1)
        await w.add(checkpoint("d1", "t2", files=[fentry("z", 3)]), l2)
        return l1, l2, l3

    @asyncio_test
    async def test_fork(self) -> None:
        async with self.world() as w:
            self.need(w.store, "fork_from_checkpoint")
            _, _, l3 = await self._fork_world(w)
            source = await w.store.get("c2")
            fork = await w.store.fork_from_checkpoint("t1", "c2", "t3", "f1", 50, l3)
            w.track(ids=["f1"])
            expected = Checkpoint(
                id="f1",
                thread_id="t3",
                parent_checkpoint_id=None,
                created_at=50,
                reason="fork-root",
                files=source.files,
                conversation=source.conversation,
                artifacts=source.artifacts,
                label=None,
                source_run_id=None,
                # Fork provenance: where the root came from.
                forked_from_thread_id="t1",
                forked_from_checkpoint_id="c2",
            )
            assert fork == expected
            assert await w.store.get("f1") == expected
            assert await w.store.get_head("t3") == "f1"
            assert await w.store.list("t3") == [expected]
            assert await w.store.get("c2") == source
            assert await w.store.get_head("t1") == "c2"
            refs = {r.key: r.references for r in await w.store.list_blob_references()}
            assert refs == {
                artifact_key(9): 2,
                file_key(1): 3,
                file_key(2): 2,
                file_key(3): 1,
            }
            # The returned value is a copy.
            fork.conversation[0]["content"] = "changed"
            assert await w.store.get("f1") == expected
            # The fork is a normal root: the thread goes on from it.
            await w.add(checkpoint("f2", "t3", "f1", 51), l3)
            assert [c.id for c in await w.store.list("t3")] == ["f1", "f2"]

    @asyncio_test
    async def test_fork_errors(self) -> None:
        async with self.world() as w:
            self.need(w.store, "fork_from_checkpoint")
            _, l2, l3 = await self._fork_world(w)
            fork = w.store.fork_from_checkpoint
            stale = Writer("t3", "nope", 9)
            await fork_refuses_bad_values(w, fork, stale)
            # 3. source thread must differ from the destination (before "not found")
            error = await w.rejects(
                SandboxCheckpointError,
                FORK_SOURCE_THREAD_MISMATCH,
                lambda: fork("t1", "missing", "t1", "f1", 50, stale),
                ids=["f1"],
            )
            assert isinstance(error, SandboxCheckpointError)
            # 4. source exists (before the writer)
            await w.rejects(
                SandboxCheckpointError,
                FORK_SOURCE_NOT_FOUND,
                lambda: fork("t1", "missing", "t3", "f1", 50, stale),
                ids=["f1", "missing"],
            )
            # 5. source belongs to source_thread_id (before the writer)
            await w.rejects(
                SandboxCheckpointError,
                FORK_SOURCE_THREAD_MISMATCH,
                lambda: fork("t1", "d1", "t3", "f1", 50, stale),
                ids=["f1"],
            )
            # 6. the writer is the destination's and current (before "not empty")
            for writer in (stale, l2, Writer("t1", l3.owner_token, l3.fence)):
                await w.rejects(
                    SandboxCheckpointWriterLostError,
                    WRITER_LOST,
                    partial(fork, "t1", "c2", "t3", "f1", 50, writer),
                    ids=["f1"],
                )
            await w.rejects(
                SandboxCheckpointWriterLostError,
                WRITER_LOST,
                lambda: fork("t1", "c2", "t2", "d1", 50, l3),
            )
            # 7. destination empty and the id unused anywhere
            await w.rejects(
                SandboxCheckpointError,
                FORK_DESTINATION_NOT_EMPTY,
                lambda: fork("t1", "c2", "t2", "f1", 50, l2),
                ids=["f1"],
            )
            for used in ("c1", "c2", "d1"):
                await w.rejects(
                    SandboxCheckpointError,
                    FORK_DESTINATION_NOT_EMPTY,
                    partial(fork, "t1", "c2", "t3", used, 50, l3),
                )
            # 8. an expired destination lease is lost too
            w.clock.advance(LEASE_DURATION_MS)
            await w.rejects(
                SandboxCheckpointWriterLostError,
                WRITER_LOST,
                lambda: fork("t1", "c2", "t3", "f1", 50, l3),
                ids=["f1"],
            )


async def fork_refuses_bad_values(w: World, fork: Any, stale: Writer) -> None:
    """Steps 1 and 2 of a fork's check order: the ids, then a finite created_at."""
    # 1. ids, before anything else
    for bad in BAD_IDS:
        for args in (
            (bad, "c2", "t3", "f1"),
            ("t1", bad, "t3", "f1"),
            ("t1", "c2", bad, "f1"),
            ("t1", "c2", "t3", bad),
        ):
            await w.rejects(
                SandboxCheckpointInvalidIdError,
                INVALID_ID,
                partial(fork, *args, math.nan, stale),
                ids=["f1"],
            )
    # 2. created_at finite, before the thread checks
    for value in NON_FINITE:
        await w.rejects(
            SandboxCheckpointInvalidEntryError,
            INVALID_ENTRY,
            partial(fork, "t1", "missing", "t1", "f1", value, stale),
            ids=["f1"],
        )
