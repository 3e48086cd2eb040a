"""The checkpoint-store suite's bad values (ids, keys, created_at, entries) and the
copies a store keeps and returns."""

from __future__ import annotations

import math
from functools import partial
from typing import Any

from ..errors import SandboxCheckpointInvalidEntryError, SandboxCheckpointInvalidIdError
from ..model import (
    ARTIFACT_KEY_PREFIX,
    FILE_KEY_PREFIX,
    Checkpoint,
    DirEntry,
    FileEntry,
    SymlinkEntry,
)
from ._checkpoint_world import INVALID_ENTRY, INVALID_ID, NON_FINITE, SuiteBase, asyncio_test
from ._support import artifact, checkpoint, fentry, file_key


class ValueRules(SuiteBase):
    """Bad values change nothing; stored and returned values are copies."""

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
            for body in bad_bodies():
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


def bad_entry_lists() -> list[list[Any]]:
    """Entry lists an append refuses with INVALID_ENTRY."""
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
    return bad_files


def bad_bodies() -> list[dict[str, Any]]:
    """Checkpoint fields (``checkpoint(**body)``) an append refuses with INVALID_ENTRY."""
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
    cases: list[dict[str, Any]] = [{"files": f} for f in bad_entry_lists()]
    cases += [{"artifacts": a} for a in bad_artifacts]
    cases += [
        {"reason": "bogus"},
        {"reason": None},
        {"conversation": [{1, 2}]},
        {"conversation": [math.nan]},
        {"conversation": [{"x": math.inf}]},
        {"conversation": [object()]},
    ]
    return cases
