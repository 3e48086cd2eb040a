"""The checkpoint-store suite's reads and appends: the basics, the append check
order (docs/contract.md#checkpoint-store steps 1–6) and the list order."""

from __future__ import annotations

import dataclasses
import math
from functools import partial
from types import SimpleNamespace
from typing import Any

import pytest

from ..errors import (
    SandboxCheckpointConflictError,
    SandboxCheckpointDuplicateIdError,
    SandboxCheckpointError,
    SandboxCheckpointInvalidEntryError,
    SandboxCheckpointInvalidIdError,
    SandboxCheckpointParentMismatchError,
    SandboxCheckpointWriterLostError,
)
from ..model import (
    ARTIFACT_KEY_PREFIX,
    FILE_KEY_PREFIX,
    DirEntry,
    FileEntry,
    Policy,
    SymlinkEntry,
    Writer,
)
from ._checkpoint_world import (
    BAD_IDS,
    INVALID_ENTRY,
    INVALID_ID,
    NON_FINITE,
    STALE_HEAD,
    WRITER_LOST,
    SuiteBase,
    World,
    asyncio_test,
    utf8,
)
from ._support import (
    LEASE_DURATION_MS,
    artifact,
    artifact_key,
    checkpoint,
    expect_error,
    fentry,
    file_key,
)


class AppendRules(SuiteBase):
    """Reads, appends in their check order, and the list order."""

    # ================================================================ basics

    @asyncio_test
    async def test_empty_store(self) -> None:
        async with self.world() as w:
            assert await w.store.get("missing") is None
            assert await w.store.list("t1") == []
            assert await w.store.get_head("t1") is None
            assert list(await w.store.list_blob_references()) == []

    @asyncio_test
    async def test_append_get_list_head(self) -> None:
        async with self.world() as w:
            lease = await w.lease("t1")
            root = checkpoint(
                "c1",
                "t1",
                None,
                10,
                artifacts=[artifact("art-1", 5)],
                conversation=[{"role": "user", "content": "hi"}, [1, 2.5, None, True], "x"],
                reason="named",
                label="first",
                source_run_id="run-1",
            )
            assert await w.store.append(root, None, lease) == "c1"
            assert await w.store.get("c1") == root
            assert await w.store.get_head("t1") == "c1"
            assert await w.store.list("t1") == [root]
            child = checkpoint("c2", "t1", "c1", 11, files=[fentry("b.txt", 2, size=0)])
            assert await w.store.append(child, "c1", lease) == "c2"
            assert await w.store.get_head("t1") == "c2"
            assert await w.store.list("t1") == [root, child]
            got = await w.store.get("c2")
            assert got == child
            assert got.parent_checkpoint_id == "c1"
            assert isinstance(got.files[0], FileEntry)

    @asyncio_test
    async def test_entry_kinds_and_order_round_trip(self) -> None:
        async with self.world() as w:
            lease = await w.lease("t1")
            files = [
                fentry("z.txt", 3, size=10, mode=0o755),
                DirEntry("a", mode=0o700),
                SymlinkEntry("a/link", "../z.txt"),
                fentry("a/b.txt", 4, size=0, mode=0),
                DirEntry("empty", mode=0o777),
                fentry("é/😀.txt", 5),
            ]
            cp = checkpoint("c1", "t1", files=files)
            await w.add(cp, lease)
            got = await w.store.get("c1")
            assert list(got.files) == files, "entries must come back in the order given"
            assert got.files[0].mtime_ns == 7

    @asyncio_test
    async def test_how_it_was_taken_round_trips(self) -> None:
        """The recorded policy and sub-root come back as given (docs/design.md), an
        unrecorded policy comes back None, and a fork keeps both."""
        async with self.world() as w:
            lease = await w.lease("t1")
            policy = Policy(exclude=("build/", "*.log", "!keep.log"), default_excludes=False)
            recorded = dataclasses.replace(
                checkpoint("c1", "t1", files=[fentry("app/a.txt", 1)]),
                policy=policy,
                workspace_subdir="app",
            )
            await w.add(recorded, lease)
            got = await w.store.get("c1")
            assert got == recorded
            assert got.policy == policy and got.workspace_subdir == "app"
            plain = checkpoint("c2", "t1", "c1", 11)
            await w.add(plain, lease)
            got = await w.store.get("c2")
            assert got.policy is None and got.workspace_subdir == ""
            await w.rejects(
                SandboxCheckpointInvalidEntryError,
                INVALID_ENTRY,
                lambda: w.store.append(
                    dataclasses.replace(checkpoint("c3", "t1", "c2", 12), workspace_subdir="../x"),
                    "c2",
                    lease,
                ),
                ids=["c3"],
            )
            if callable(getattr(w.store, "fork_from_checkpoint", None)):
                l3 = await w.lease("t3")
                fork = await w.store.fork_from_checkpoint("t1", "c1", "t3", "f1", 50, l3)
                w.track(ids=["f1"])
                assert fork.policy == policy and fork.workspace_subdir == "app"
                again = await w.store.get("f1")
                assert again.policy == policy and again.workspace_subdir == "app"

    @asyncio_test
    async def test_reads_reject_invalid_ids(self) -> None:
        async with self.world() as w:
            for bad in BAD_IDS:
                for call in (w.store.get, w.store.list, w.store.get_head):
                    with pytest.raises(SandboxCheckpointError) as info:
                        await call(bad)
                    expect_error(info.value, SandboxCheckpointInvalidIdError, INVALID_ID)

    # ================================================================ append check order

    async def _order_world(self, w: World) -> tuple[Any, Any]:
        """t1: c1 (keys 1, 2); t2: d1 (key 2). Returns the leases of t1 and t2."""
        l1 = await w.lease("t1")
        l2 = await w.lease("t2")
        await w.add(
            checkpoint("c1", "t1", files=[fentry("a", 1), fentry("b", 2)]), l1, expected=None
        )
        await w.add(checkpoint("d1", "t2", files=[fentry("a", 2)]), l2, expected=None)
        return l1, l2

    @asyncio_test
    async def test_append_step1_invalid_ids_come_first(self) -> None:
        async with self.world() as w:
            l1, _ = await self._order_world(w)
            stale = Writer("t1", "not-the-token", 99)
            everything_else_wrong: dict[str, Any] = {
                "created_at": math.nan,
                "files": [fentry("../escape", "bad-key")],
            }
            for bad in BAD_IDS:
                cases = [
                    checkpoint(bad, "t1", "c1", **everything_else_wrong),
                    checkpoint("new", bad, "c1", **everything_else_wrong),
                    checkpoint("new", "t1", bad, **everything_else_wrong),
                ]
                for cp in cases:
                    await w.rejects(
                        SandboxCheckpointInvalidIdError,
                        INVALID_ID,
                        partial(w.store.append, cp, "d1", stale),
                    )
                cp = checkpoint("d1", "t1", "zzz", **everything_else_wrong)
                await w.rejects(
                    SandboxCheckpointInvalidIdError,
                    INVALID_ID,
                    partial(w.store.append, cp, bad, stale),
                )
            # An invalid parent with a valid writer and head is still INVALID_ID.
            await w.rejects(
                SandboxCheckpointInvalidIdError,
                INVALID_ID,
                lambda: w.store.append(checkpoint("new", "t1", "\ud800"), "c1", l1),
            )

    @asyncio_test
    async def test_append_step2_invalid_entries_before_writer(self) -> None:
        async with self.world() as w:
            await self._order_world(w)
            stale = Writer("t1", "not-the-token", 99)
            for value in NON_FINITE:
                cp = checkpoint("d1", "t1", "zzz", created_at=value)
                await w.rejects(
                    SandboxCheckpointInvalidEntryError,
                    INVALID_ENTRY,
                    partial(w.store.append, cp, "wrong", stale),
                )
            cp = checkpoint("d1", "t1", "zzz", files=[fentry("a//b")])
            await w.rejects(
                SandboxCheckpointInvalidEntryError,
                INVALID_ENTRY,
                lambda: w.store.append(cp, "wrong", stale),
            )

    @asyncio_test
    async def test_append_step3_writer_before_duplicate_id(self) -> None:
        async with self.world() as w:
            l1, l2 = await self._order_world(w)
            cp = checkpoint("d1", "t1", "zzz")  # duplicate id, stale head, wrong parent
            for writer in (
                Writer("t1", "not-the-token", l1.fence),
                Writer("t1", l1.owner_token, l1.fence + 1),
                l2,  # a live lease of another thread
                SimpleNamespace(thread_id="t2", owner_token=l2.owner_token, fence=l2.fence),
            ):
                await w.rejects(
                    SandboxCheckpointWriterLostError,
                    WRITER_LOST,
                    partial(w.store.append, cp, "wrong", writer),
                )
            # No lease at all on a thread.
            cp3 = checkpoint("d1", "t3", "zzz")
            await w.rejects(
                SandboxCheckpointWriterLostError,
                WRITER_LOST,
                lambda: w.store.append(cp3, "wrong", Writer("t3", "nobody", 1)),
            )
            # An expired lease.
            w.clock.advance(LEASE_DURATION_MS)
            await w.rejects(
                SandboxCheckpointWriterLostError,
                WRITER_LOST,
                lambda: w.store.append(cp, "wrong", l1),
            )

    @asyncio_test
    async def test_append_step4_duplicate_id_in_any_thread(self) -> None:
        async with self.world() as w:
            l1, _ = await self._order_world(w)
            for dup in ("d1", "c1"):
                cp = checkpoint(dup, "t1", "zzz")
                await w.rejects(
                    SandboxCheckpointDuplicateIdError,
                    SandboxCheckpointDuplicateIdError.code,
                    partial(w.store.append, cp, "wrong", l1),
                )
                cp = checkpoint(dup, "t1", "c1")
                await w.rejects(
                    SandboxCheckpointDuplicateIdError,
                    SandboxCheckpointDuplicateIdError.code,
                    partial(w.store.append, cp, "c1", l1),
                )

    @asyncio_test
    async def test_append_step5_stale_head_before_parent(self) -> None:
        async with self.world() as w:
            l1, _ = await self._order_world(w)
            for expected in (None, "d1", "zzz"):
                cp = checkpoint("new", "t1", "other")
                error = await w.rejects(
                    SandboxCheckpointConflictError,
                    STALE_HEAD,
                    partial(w.store.append, cp, expected, l1),
                    ids=["new"],
                )
                assert error.code == "SANDBOX_SNAPSHOT_STALE_HEAD"
            # An empty thread's head is None: expecting anything else is stale.
            l3 = await w.lease("t3")
            await w.rejects(
                SandboxCheckpointConflictError,
                STALE_HEAD,
                lambda: w.store.append(checkpoint("new", "t3", "c1"), "c1", l3),
                ids=["new"],
            )

    @asyncio_test
    async def test_append_step6_parent_must_be_expected_head(self) -> None:
        async with self.world() as w:
            l1, _ = await self._order_world(w)
            for parent in (None, "d1", "zzz"):
                cp = checkpoint("new", "t1", parent)
                await w.rejects(
                    SandboxCheckpointParentMismatchError,
                    SandboxCheckpointParentMismatchError.code,
                    partial(w.store.append, cp, "c1", l1),
                    ids=["new"],
                )
            l3 = await w.lease("t3")
            await w.rejects(
                SandboxCheckpointParentMismatchError,
                SandboxCheckpointParentMismatchError.code,
                lambda: w.store.append(checkpoint("new", "t3", "c1"), None, l3),
                ids=["new"],
            )

    @asyncio_test
    async def test_append_is_a_compare_and_swap(self) -> None:
        async with self.world() as w:
            lease = await w.lease("t1")
            await w.add(checkpoint("c1", "t1"), lease)
            first = checkpoint("c2a", "t1", "c1", 2)
            second = checkpoint("c2b", "t1", "c1", 2)
            await w.add(first, lease, expected="c1")
            await w.rejects(
                SandboxCheckpointConflictError,
                STALE_HEAD,
                lambda: w.store.append(second, "c1", lease),
                ids=["c2b"],
            )
            assert await w.store.get_head("t1") == "c2a"
            assert await w.store.get("c2b") is None

    @asyncio_test
    async def test_duplicate_ids_across_threads(self) -> None:
        async with self.world() as w:
            l1, l2 = await w.lease("t1"), await w.lease("t2")
            await w.add(checkpoint("same", "t1"), l1)
            await w.rejects(
                SandboxCheckpointDuplicateIdError,
                SandboxCheckpointDuplicateIdError.code,
                lambda: w.store.append(checkpoint("same", "t2"), None, l2),
            )
            assert await w.store.get_head("t2") is None
            assert (await w.store.get("same")).thread_id == "t1"

    @asyncio_test
    async def test_thread_isolation(self) -> None:
        async with self.world() as w:
            l1, l2 = await w.lease("t1"), await w.lease("t2")
            await w.chain("t1", ["a1", "a2"], l1)
            await w.chain("t2", ["b1"], l2, start=10)
            assert [c.id for c in await w.store.list("t1")] == ["a1", "a2"]
            assert [c.id for c in await w.store.list("t2")] == ["b1"]
            assert await w.store.get_head("t1") == "a2"
            assert await w.store.get_head("t2") == "b1"
            # A lease of t1 cannot write t2, nor delete there.
            await w.rejects(
                SandboxCheckpointWriterLostError,
                WRITER_LOST,
                lambda: w.store.append(checkpoint("b2", "t2", "b1"), "b1", l1),
                ids=["b2"],
            )
            await w.rejects(
                SandboxCheckpointWriterLostError,
                WRITER_LOST,
                lambda: w.store.delete_head("t2", "b1", l1),
            )
            # Writing t1 leaves t2 alone.
            await w.store.delete_head("t1", "a2", l1)
            assert [c.id for c in await w.store.list("t2")] == ["b1"]
            assert await w.store.get_head("t2") == "b1"
            assert await w.store.list("t1-other") == []

    # ================================================================ ordering

    @asyncio_test
    async def test_list_order_created_at_then_utf8_bytes_of_id(self) -> None:
        async with self.world() as w:
            lease = await w.lease("order")
            # Appended as one chain with equal created_at for the middle five; list
            # order must be by created_at, then by the UTF-8 bytes of the id (not by
            # UTF-16 units, not by a locale collation).
            appended = [
                ("y", 9),
                ("é", 5),
                ("a", 5),
                ("B", 5),
                ("😀", 5),
                ("\ue000", 5),
                ("z", 1),
                ("m", -3),
            ]
            parent = None
            for checkpoint_id, created_at in appended:
                cp = checkpoint(checkpoint_id, "order", parent, created_at, files=[])
                await w.add(cp, lease)
                parent = checkpoint_id
            ids = [c.id for c in await w.store.list("order")]
            assert ids == ["m", "z", "B", "a", "é", "\ue000", "😀", "y"]
            assert await w.store.get_head("order") == "m"

    @asyncio_test
    async def test_blob_references_sorted_by_utf8_bytes(self) -> None:
        async with self.world() as w:
            lease = await w.lease("t1")
            keys = [0xFF << 248, 0xA0 << 248, 0x0A << 248, 1, 0x99 << 248]
            files = [fentry(f"f{i}", k) for i, k in enumerate(keys)]
            arts = [artifact("x", 7), artifact("y", 0xF0 << 248)]
            await w.add(checkpoint("c1", "t1", files=files, artifacts=arts), lease)
            got = [r.key for r in await w.store.list_blob_references()]
            expected = sorted(
                [file_key(k) for k in keys] + [artifact_key(7), artifact_key(0xF0 << 248)],
                key=utf8,
            )
            assert got == expected
            assert got[0].startswith(ARTIFACT_KEY_PREFIX)
            assert got[-1].startswith(FILE_KEY_PREFIX)
            refs = await w.store.list_blob_references()
            assert all(r.references == 1 for r in refs)
            key, count = refs[0]
            assert (key, count) == (expected[0], 1)
