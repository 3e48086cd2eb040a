"""The checkpoint-store conformance suite (docs/contract.md#checkpoint-store), as a pytest class factory.

``checkpoint_store_conformance(make_store)`` returns a test class. ``make_store`` is
``async def make_store(*, now, lease_duration_ms, renew_after_ms) -> store`` and must
return a fresh, EMPTY store each call. The suite passes a clock it moves by hand
(starting at 1_000 ms), ``lease_duration_ms=100`` and ``renew_after_ms=25``, and
closes every store it made (``aclose()`` when the store has it).

``delete_checkpoints``, ``fork_from_checkpoint`` and the blob guard
(``pin_blobs``/``condemn_blobs``/``release_condemned``) are optional for a user's
store: their tests are skipped when the store lacks the method, and so are the
owner rules when ``acquire_writer`` takes no ``owner`` keyword (the owner of a
live lease acquires it again with a new fence; anyone else gets WRITER_CONFLICT
with ``expires_at_ms`` and ``retry_after_ms`` in its details). Every store
checkpointd ships has them all.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from functools import partial
from types import SimpleNamespace
from typing import Any

import pytest

from ..errors import (
    FORK_DESTINATION_NOT_EMPTY,
    FORK_SOURCE_NOT_FOUND,
    FORK_SOURCE_THREAD_MISMATCH,
    SandboxCheckpointConflictError,
    SandboxCheckpointDuplicateIdError,
    SandboxCheckpointError,
    SandboxCheckpointInvalidArgumentError,
    SandboxCheckpointInvalidEntryError,
    SandboxCheckpointInvalidIdError,
    SandboxCheckpointNotHeadError,
    SandboxCheckpointParentMismatchError,
    SandboxCheckpointWriterConflictError,
    SandboxCheckpointWriterLostError,
)
from ..model import (
    ARTIFACT_KEY_PREFIX,
    FILE_KEY_PREFIX,
    Checkpoint,
    DirEntry,
    FileEntry,
    Policy,
    SymlinkEntry,
    Writer,
)
from ._support import (
    LEASE_DURATION_MS,
    RENEW_AFTER_MS,
    START_MS,
    ManualClock,
    artifact,
    artifact_key,
    checkpoint,
    close_store,
    expect_error,
    fentry,
    file_key,
    state,
)

asyncio_test = pytest.mark.asyncio

BAD_IDS: tuple[Any, ...] = ("", "\ud800", "a\udfffb", 42, b"bytes")
NON_FINITE = (math.nan, math.inf, -math.inf)
INVALID_ID = SandboxCheckpointInvalidIdError.code
INVALID_ENTRY = SandboxCheckpointInvalidEntryError.code
WRITER_LOST = SandboxCheckpointWriterLostError.code
STALE_HEAD = SandboxCheckpointConflictError.code


def _utf8(value: str) -> bytes:
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


class CheckpointStoreConformance:
    """Every rule of docs/contract.md#checkpoint-store for a checkpoint store (see the module docstring)."""

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
                key=_utf8,
            )
            assert got == expected
            assert got[0].startswith(ARTIFACT_KEY_PREFIX)
            assert got[-1].startswith(FILE_KEY_PREFIX)
            refs = await w.store.list_blob_references()
            assert all(r.references == 1 for r in refs)
            key, count = refs[0]
            assert (key, count) == (expected[0], 1)

    # ================================================================ bad values

    @asyncio_test
    async def test_malformed_unicode_ids_and_keys(self) -> None:
        async with self.world() as w:
            lease = await w.lease("t1")
            await w.add(checkpoint("c1", "t1"), lease)
            lone = "\ud800"
            for cp, expected in (
                (checkpoint(lone, "t1", "c1"), "c1"),
                (checkpoint("c2" + lone, "t1", "c1"), "c1"),
                (checkpoint("c2", lone, "c1"), "c1"),
                (checkpoint("c2", "t1", lone), "c1"),
                (checkpoint("c2", "t1", "c1"), lone),
            ):
                await w.rejects(
                    SandboxCheckpointInvalidIdError,
                    INVALID_ID,
                    partial(w.store.append, cp, expected, lease),
                    ids=["c2"],
                )
            bad_bodies: list[dict[str, Any]] = [
                {"files": [fentry("a", FILE_KEY_PREFIX + lone * 64)]},
                {"files": [fentry("a" + lone, 1)]},
                {"files": [SymlinkEntry("l", "x" + lone)]},
                {"artifacts": [artifact("a", 1, blob_key=ARTIFACT_KEY_PREFIX + lone * 64)]},
                {"artifacts": [artifact("a" + lone, 1)]},
                {"artifacts": [artifact("a", 1, name=lone)]},
                {"label": lone},
                {"source_run_id": lone},
                {"conversation": [{"text": lone}]},
                {"conversation": [{lone: 1}]},
            ]
            for body in bad_bodies:
                cp = checkpoint("c2", "t1", "c1", **body)
                await w.rejects(
                    SandboxCheckpointInvalidEntryError,
                    INVALID_ENTRY,
                    partial(w.store.append, cp, "c1", lease),
                    ids=["c2"],
                )
            for call in (
                lambda: w.store.delete_head(lone, "c1", lease),
                lambda: w.store.delete_head("t1", lone, lease),
                lambda: w.store.acquire_writer(lone),
            ):
                await w.rejects(SandboxCheckpointInvalidIdError, INVALID_ID, call)

    @asyncio_test
    async def test_non_finite_created_at(self) -> None:
        async with self.world() as w:
            lease = await w.lease("t1")
            await w.add(checkpoint("c1", "t1"), lease)
            for value in (*NON_FINITE, None, "5"):
                cp = checkpoint("c2", "t1", "c1", created_at=value)
                await w.rejects(
                    SandboxCheckpointInvalidEntryError,
                    INVALID_ENTRY,
                    partial(w.store.append, cp, "c1", lease),
                    ids=["c2"],
                )
                cp = checkpoint("c2", "t1", "c1", artifacts=[artifact(created_at=value)])
                await w.rejects(
                    SandboxCheckpointInvalidEntryError,
                    INVALID_ENTRY,
                    partial(w.store.append, cp, "c1", lease),
                    ids=["c2"],
                )

    @asyncio_test
    async def test_bad_entries_change_nothing(self) -> None:
        async with self.world() as w:
            lease = await w.lease("t1")
            await w.add(checkpoint("c1", "t1"), lease)
            hex64 = "ab" * 32
            bad_paths = [
                "..",
                "../a",
                "a/..",
                "a/../b",
                ".",
                "./a",
                "a/./b",
                "/abs",
                "/",
                "\\a",
                "a\\b",
                "a//b",
                "a/",
                "",
                "a\x00b",
            ]
            bad_files: list[list[Any]] = [[fentry(p, 1)] for p in bad_paths]
            bad_files += [[DirEntry(p)] for p in ("..", "/abs", "a\\b", "a//b", "")]
            bad_files += [[SymlinkEntry(p, "t")] for p in ("..", "/abs", "a\\b")]
            bad_files += [
                # beneath a file or a symlink, in either order
                [fentry("f", 1), fentry("f/x", 2)],
                [DirEntry("f/x"), fentry("f", 1)],
                [fentry("f", 1), DirEntry("f/d"), fentry("f/d/x", 2)],
                [SymlinkEntry("l", "target"), fentry("l/x", 2)],
                [SymlinkEntry("l", "target"), DirEntry("l/d")],
                # duplicates
                [fentry("a", 1), fentry("a", 2)],
                [DirEntry("d"), fentry("d", 1)],
                [DirEntry("d"), DirEntry("d")],
                [SymlinkEntry("s", "x"), DirEntry("s")],
                # blob keys of the wrong shape
                [fentry("a", "")],
                [fentry("a", FILE_KEY_PREFIX + hex64.upper())],
                [fentry("a", FILE_KEY_PREFIX + hex64[:-1])],
                [fentry("a", FILE_KEY_PREFIX + hex64 + "0")],
                [fentry("a", FILE_KEY_PREFIX + "g" * 64)],
                [fentry("a", ARTIFACT_KEY_PREFIX + hex64)],
                [fentry("a", "sandbox-files/sha256/" + hex64)],
                [fentry("a", hex64)],
                [fentry("a", " " + FILE_KEY_PREFIX + hex64)],
                [FileEntry("a", 5, 1)],  # type: ignore[arg-type]
                # sizes
                [fentry("a", 1, size=-1)],
                [FileEntry("a", file_key(1), 1.5)],  # type: ignore[arg-type]
                [FileEntry("a", file_key(1), True)],
                [FileEntry("a", file_key(1), "1")],  # type: ignore[arg-type]
                [FileEntry("a", file_key(1), None)],  # type: ignore[arg-type]
                # modes
                [fentry("a", 1, mode=-1)],
                [fentry("a", 1, mode=0o1000)],
                [fentry("a", 1, mode=0o4755)],
                [FileEntry("a", file_key(1), 1, 420.0)],  # type: ignore[arg-type]
                [FileEntry("a", file_key(1), 1, "644")],  # type: ignore[arg-type]
                [DirEntry("d", mode=0o1777)],
                [DirEntry("d", mode=-1)],
                [DirEntry("d", mode=None)],  # type: ignore[arg-type]
                [FileEntry("a", file_key(1), 1, 0o644, 1.5)],  # type: ignore[arg-type]
                # symlink targets
                [SymlinkEntry("l", "")],
                [SymlinkEntry("l", "a\x00b")],
                [SymlinkEntry("l", None)],  # type: ignore[arg-type]
                # not an entry
                [{"path": "a", "kind": "file"}],
                ["a"],
            ]
            bad_artifacts = [
                [artifact("")],
                [artifact(42)],
                [artifact(name="")],
                [artifact(mime_type="")],
                [artifact(size=-1)],
                [artifact(size=2.5)],
                [artifact(blob_key=file_key(1))],
                [artifact(blob_key=ARTIFACT_KEY_PREFIX + "AB" * 32)],
                [artifact(created_at=math.nan)],
                [{"artifact_id": "x"}],
            ]
            cases: list[dict[str, Any]] = [{"files": f} for f in bad_files]
            cases += [{"artifacts": a} for a in bad_artifacts]
            cases += [
                {"reason": "bogus"},
                {"reason": None},
                {"conversation": [{1, 2}]},
                {"conversation": [math.nan]},
                {"conversation": [{"x": math.inf}]},
                {"conversation": [object()]},
            ]
            for body in cases:
                cp = checkpoint("c2", "t1", "c1", **body)
                await w.rejects(
                    SandboxCheckpointInvalidEntryError,
                    INVALID_ENTRY,
                    partial(w.store.append, cp, "c1", lease),
                    ids=["c2"],
                )
            # Valid edge cases are accepted.
            edge = checkpoint(
                "c2",
                "t1",
                "c1",
                files=[
                    fentry("...", 1),
                    fentry(".hidden", 2),
                    fentry("a..b/c", 3, mode=0o777),
                    fentry("zero", 4, size=0, mode=0),
                    SymlinkEntry("abs-link", "/etc/passwd"),
                    DirEntry("d", mode=0),
                ],
            )
            await w.add(edge, lease)

    # ================================================================ immutability

    @asyncio_test
    async def test_stored_and_returned_values_are_copies(self) -> None:
        async with self.world() as w:
            lease = await w.lease("t1")
            message = {"role": "user", "content": ["hi", {"n": 1}]}
            files = [fentry("a", 1)]
            arts = [artifact("art", 2)]
            cp = Checkpoint(
                id="c1",
                thread_id="t1",
                parent_checkpoint_id=None,
                created_at=1,
                files=files,  # type: ignore[arg-type]
                conversation=[message],  # type: ignore[arg-type]
                artifacts=arts,  # type: ignore[arg-type]
            )
            await w.store.append(cp, None, lease)
            expected = checkpoint(
                "c1",
                "t1",
                files=[fentry("a", 1)],
                artifacts=[artifact("art", 2)],
                conversation=[{"role": "user", "content": ["hi", {"n": 1}]}],
            )
            # Changing the caller's values after append does not change the store.
            message["role"] = "changed"
            message["content"][1]["n"] = 2  # type: ignore[index]
            files.append(fentry("b", 3))
            arts.clear()
            got = await w.store.get("c1")
            assert got == expected
            # Changing a returned value does not change the store either.
            got.conversation[0]["role"] = "mutated"
            got.conversation[0]["content"].append("more")
            listed = await w.store.list("t1")
            listed[0].conversation[0]["content"][1]["n"] = 99
            listed.append(got)
            refs = await w.store.list_blob_references()
            refs.clear()
            assert await w.store.get("c1") == expected
            assert await w.store.list("t1") == [expected]
            assert len(await w.store.list_blob_references()) == 2
            again = await w.store.get("c1")
            assert again is not got
            assert again.conversation[0] is not got.conversation[0]

    # ================================================================ blob counts

    @asyncio_test
    async def test_one_count_per_distinct_key(self) -> None:
        async with self.world() as w:
            lease = await w.lease("t1")
            cp = checkpoint(
                "c1",
                "t1",
                files=[fentry("a", 1), fentry("b", 1), fentry("c", 2), DirEntry("d")],
                artifacts=[artifact("x", 1), artifact("y", 1)],
            )
            await w.add(cp, lease)
            refs = [(r.key, r.references) for r in await w.store.list_blob_references()]
            assert refs == [(artifact_key(1), 1), (file_key(1), 1), (file_key(2), 1)]

    @asyncio_test
    async def test_shared_keys_across_checkpoints_and_threads(self) -> None:
        async with self.world() as w:
            l1, l2 = await w.lease("t1"), await w.lease("t2")
            await w.add(checkpoint("c1", "t1", files=[fentry("a", 1), fentry("b", 2)]), l1)
            await w.add(checkpoint("c2", "t1", "c1", 2, files=[fentry("a", 1), fentry("c", 3)]), l1)
            await w.add(checkpoint("d1", "t2", files=[fentry("z", 1)]), l2)

            async def refs() -> dict[str, int]:
                return {r.key: r.references for r in await w.store.list_blob_references()}

            assert await refs() == {file_key(1): 3, file_key(2): 1, file_key(3): 1}
            await w.store.delete_head("t1", "c2", l1)
            assert await refs() == {file_key(1): 2, file_key(2): 1}
            await w.store.delete_head("t2", "d1", l2)
            assert await refs() == {file_key(1): 1, file_key(2): 1}
            await w.store.delete_head("t1", "c1", l1)
            assert await refs() == {}
            assert list(await w.store.list_blob_references()) == []

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

    # ================================================================ blob audit

    @asyncio_test
    async def test_audit_counts_keys_from_the_manifests(self) -> None:
        async with self.world() as w:
            self.need(w.store, "audit_blob_references", "repair_blob_references")
            assert list(await w.store.audit_blob_references()) == []
            lease = await w.lease("t1")
            await w.chain("t1", ["c1", "c2", "c3"], lease)
            other = await w.lease("t2")
            await w.add(
                checkpoint(
                    "d1",
                    "t2",
                    files=[fentry("x", 1000), fentry("y", 1000)],
                    artifacts=[artifact("art-1", 7)],
                ),
                other,
            )
            audit = {c.key: c for c in await w.store.audit_blob_references(with_sizes=True)}
            assert list(audit) == sorted(audit, key=_utf8)
            assert (audit[file_key(1000)].stored, audit[file_key(1000)].manifests) == (4, 4)
            assert audit[file_key(1000)].size == 3
            for n in (1, 2, 3):
                assert (audit[file_key(n)].stored, audit[file_key(n)].manifests) == (1, 1)
            assert (audit[artifact_key(7)].manifests, audit[artifact_key(7)].size) == (1, 5)
            assert all(c.agrees for c in audit.values())
            references = {(r.key, r.references) for r in await w.store.list_blob_references()}
            assert references == {(c.key, c.stored) for c in audit.values()}
            await w.store.delete_head("t1", "c3", lease)
            after = {c.key: c for c in await w.store.audit_blob_references()}
            assert file_key(3) not in after
            assert after[file_key(1000)].manifests == 3
            # A store whose counts agree has nothing to repair.
            before = await w.snapshot()
            assert list(await w.store.repair_blob_references()) == []
            assert await w.snapshot() == before

    @asyncio_test
    async def test_missing_marks(self) -> None:
        async with self.world() as w:
            self.need(w.store, "mark_blobs_missing", "clear_missing_blobs", "list_missing_blobs")
            assert list(await w.store.list_missing_blobs()) == []
            keys = [file_key(2), artifact_key(1), file_key(1)]
            await w.store.mark_blobs_missing([*keys, "not-a-key", file_key(2)])
            assert list(await w.store.list_missing_blobs()) == sorted(keys, key=_utf8)
            await w.store.mark_blobs_missing([file_key(1)])  # idempotent
            await w.store.clear_missing_blobs([file_key(1), file_key(99), "not-a-key"])
            assert list(await w.store.list_missing_blobs()) == [artifact_key(1), file_key(2)]
            await w.store.clear_missing_blobs([])
            await w.store.clear_missing_blobs(keys)
            assert list(await w.store.list_missing_blobs()) == []

    # ================================================================ blob guard

    @asyncio_test
    async def test_pin_and_condemn(self) -> None:
        async with self.world() as w:
            self.need(w.store, "pin_blobs", "condemn_blobs", "release_condemned")
            s = w.store
            l1, l2 = await w.lease("t1"), await w.lease("t2")
            k = {n: file_key(n) for n in range(1, 10)}
            await w.add(checkpoint("c1", "t1", files=[fentry("a", 1)]), l1)
            assert await s.pin_blobs([k[2]], l1) == []
            assert await s.pin_blobs([k[2], k[2]], l1) == []  # idempotent
            other = "other-prefix/" + "ab" * 32
            got = await s.condemn_blobs([k[4], k[1], k[2], k[3], k[3], other], 50)
            assert got == [k[4], k[3]], "referenced, pinned and odd keys are skipped"
            assert await s.condemn_blobs([k[3]], 50) == [], "already condemned"
            # A pin of a condemned key is recorded and reports it condemned.
            assert await s.pin_blobs([k[5], k[3]], l1) == [k[3]]
            assert await s.pin_blobs([k[3]], l1) == [k[3]]
            await s.release_condemned([k[3]])
            assert await s.pin_blobs([k[3]], l1) == []
            assert await s.condemn_blobs([k[3]], 50) == [], "now pinned"
            # Condemnations end at now + hold_ms.
            assert await s.condemn_blobs([k[6]], 10) == [k[6]]
            w.clock.advance(9)
            assert await s.condemn_blobs([k[6]], 10) == []
            w.clock.advance(1)
            assert await s.condemn_blobs([k[6]], 10) == [k[6]]
            # Releasing the lease drops its pins.
            await l1.release()
            assert await s.condemn_blobs([k[2], k[5], k[1]], 10) == [k[2], k[5]]
            # Pins of an expired lease are dead too.
            assert await s.pin_blobs([k[7]], l2) == []
            assert await s.condemn_blobs([k[7]], 10) == []
            w.clock.advance(LEASE_DURATION_MS)
            assert await s.condemn_blobs([k[7]], 10) == [k[7]]
            # A key becomes condemnable when its last reference goes.
            l1b = await w.lease("t1")
            await s.delete_head("t1", "c1", l1b)
            assert await s.condemn_blobs([k[1]], 10) == [k[1]]
            await s.release_condemned([k[1], k[8]])  # unknown keys are fine

    @asyncio_test
    async def test_pin_checks(self) -> None:
        async with self.world() as w:
            self.need(w.store, "pin_blobs", "condemn_blobs", "release_condemned")
            s = w.store
            lease = await w.lease("t1")
            stale = Writer("t1", "nope", 3)
            with pytest.raises(SandboxCheckpointWriterLostError):
                await s.pin_blobs([file_key(1)], stale)
            with pytest.raises(SandboxCheckpointWriterLostError):
                await s.pin_blobs(["not a key"], stale)  # the writer is checked first
            for bad in ("not a key", FILE_KEY_PREFIX + "\ud800" * 64, file_key(1).upper(), 5):
                with pytest.raises(SandboxCheckpointInvalidEntryError):
                    await s.pin_blobs([file_key(1), bad], lease)
            assert await s.pin_blobs([artifact_key(1), file_key(1)], lease) == []
            for hold in (0, -1, 1.5, None):
                with pytest.raises(SandboxCheckpointInvalidArgumentError):
                    await s.condemn_blobs([file_key(2)], hold)
            w.clock.advance(LEASE_DURATION_MS)
            with pytest.raises(SandboxCheckpointWriterLostError):
                await s.pin_blobs([file_key(1)], lease)


def checkpoint_store_conformance(
    make_store: Callable[..., Awaitable[Any]], *, name: str = "TestCheckpointStoreConformance"
) -> type:
    """A pytest test class checking every docs/contract.md#checkpoint-store rule on stores from ``make_store``.

    ``make_store`` is ``async def make_store(*, now, lease_duration_ms,
    renew_after_ms)`` returning a fresh, empty store. Use it as
    ``TestMyStore = checkpoint_store_conformance(make_store)`` in a test module.
    Tests are marked ``pytest.mark.asyncio`` (pytest-asyncio, strict or auto mode).
    """
    if not callable(make_store):
        raise TypeError("make_store must be an async callable returning a fresh store")
    return type(name, (CheckpointStoreConformance,), {"_make_store": staticmethod(make_store)})
