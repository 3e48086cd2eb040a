"""A restore never loses work (docs/restore-history.md), through a real daemon:
live changes a restore would overwrite are stashed first, Undo brings them back
byte for byte (and an undo of an undo is a redo), the head moves only when
asked (``record``), and TanStack AI's ``@tanstack/ai-sandbox`` restore semantics
stay the default."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from checkpointd.service.client import Client, RpcError
from checkpointd.v1 import checkpointd_pb2 as pb

from .conftest import Daemon, DaemonFactory, make_tree, tree_state


def _live_edit(root: Path) -> None:
    """An edit of every kind: new bytes, a mode, a symlink's target, a
    deletion, a new file in a new directory, an emptied directory."""
    (root / "dir0" / "notes.txt").write_bytes(b"edited by the agent\n" * 50)
    (root / "ünïcode name.md").write_text("changed\n")
    os.chmod(root / "ünïcode name.md", 0o600)
    (root / "link").unlink()
    (root / "link").symlink_to("empty")
    victim = next(p for p in sorted(root.rglob("file*.txt")))
    victim.unlink()
    (root / "brand-new" / "deep").mkdir(parents=True)
    (root / "brand-new" / "deep" / "made.bin").write_bytes(os.urandom(5000))
    os.chmod(root / "brand-new" / "deep" / "made.bin", 0o755)


async def _two_checkpoints(client: Client, root: Path, thread: str) -> tuple[str, str]:
    make_tree(root, files=30)
    (root / "dir0" / "notes.txt").write_text("first\n")
    first = (await client.capture(thread)).checkpoint.id
    (root / "dir0" / "notes.txt").write_text("second\n")
    (root / "later.txt").write_text("only in the second\n")
    second = (await client.capture(thread)).checkpoint.id
    return first, second


async def _stash(client: Client, thread: str) -> list[pb.CheckpointSummary]:
    return await client.list_checkpoints(thread, stash=True)


async def test_undo_brings_back_every_byte_of_the_edit(daemon: Daemon) -> None:
    root = daemon.workspace
    async with daemon.client(timeout=120) as client:
        first, second = await _two_checkpoints(client, root, "t-undo")
        at_first = None
        _live_edit(root)
        edited = tree_state(root)

        done = await client.restore("t-undo", checkpoint_id=first)
        assert done.restored and done.checkpoint.id == first
        at_first = tree_state(root)
        assert "later.txt" not in at_first and "brand-new" not in at_first
        saved = done.saved_before_restore
        assert saved.checkpoint.reason == "stash"
        assert saved.checkpoint.stash_of_thread_id == "t-undo"
        assert saved.checkpoint.thread_id == "t-undo~stash"
        assert saved.blobs_uploaded >= 2  # the edited bytes and the new file
        assert not done.HasField("recorded")
        assert await client.get_head("t-undo") == second  # the head did not move

        stash = await _stash(client, "t-undo")
        assert [entry.id for entry in stash] == [saved.checkpoint.id]
        threads = [thread.thread_id async for thread in client.list_threads()]
        assert "t-undo" in threads and "t-undo~stash" not in threads

        undone = await client.undo("t-undo")
        assert undone.restored and undone.checkpoint.id == saved.checkpoint.id
        assert tree_state(root) == edited
        # The undo stashed what it overwrote (the first checkpoint's tree).
        assert undone.saved_before_restore.checkpoint.id != saved.checkpoint.id
        assert await client.get_head("t-undo") == second

        redone = await client.undo("t-undo")
        assert redone.checkpoint.id == undone.saved_before_restore.checkpoint.id
        assert tree_state(root) == at_first
        again = await client.undo("t-undo")
        assert tree_state(root) == edited
        assert again.checkpoint.id == redone.saved_before_restore.checkpoint.id
        assert len(await _stash(client, "t-undo")) == 4


async def test_a_new_sandbox_and_an_unchanged_tree_stash_nothing(
    daemons: DaemonFactory, short_tmp: Path
) -> None:
    first_daemon = daemons.start()
    async with first_daemon.client(timeout=120) as client:
        first, second = await _two_checkpoints(client, first_daemon.workspace, "t-fresh")
        # The head over a tree that still equals it: nothing to write, nothing stashed.
        head = await client.restore("t-fresh")
        assert head.checkpoint.id == second and not head.HasField("saved_before_restore")
        # The first checkpoint over an unchanged tree: it changes the tree, but
        # the tree is the head's, which the thread holds: nothing stashed.
        older = await client.restore("t-fresh", checkpoint_id=first)
        assert not older.HasField("saved_before_restore")
        assert await _stash(client, "t-fresh") == []
    # A new sandbox (its own workspace and data dir) holding files of its own:
    # it has no base, so the thread could lose nothing.
    fresh = daemons.start(workspace=short_tmp / "fresh-ws", data_dir=short_tmp / "fresh-data")
    (fresh.workspace / "someone-elses.txt").write_text("not the thread's\n")
    async with fresh.client(timeout=120) as client:
        done = await client.restore("t-fresh")
        assert done.checkpoint.id == second
        assert not done.HasField("saved_before_restore") and not done.HasField("recorded")
        assert not (fresh.workspace / "someone-elses.txt").exists()
        assert await _stash(client, "t-fresh") == []
        assert [c.id for c in await client.list_checkpoints("t-fresh")] == [first, second]


async def test_the_head_moves_only_when_asked(daemon: Daemon) -> None:
    root = daemon.workspace
    async with daemon.client(timeout=120) as client:
        first, second = await _two_checkpoints(client, root, "t-head")
        await client.restore("t-head", checkpoint_id=first)
        # TanStack's contract: a restore without an id brings back the newest.
        newest = await client.restore("t-head")
        assert newest.checkpoint.id == second
        assert (root / "later.txt").exists()

        recorded = await client.restore("t-head", checkpoint_id=first, record=True)
        appended = recorded.recorded
        assert appended.reason == "restore"
        assert appended.restored_from_checkpoint_id == first
        assert appended.parent_checkpoint_id == second
        assert appended.entry_count == recorded.checkpoint.entry_count
        assert await client.get_head("t-head") == appended.id
        after_record = tree_state(root)
        # Now the newest is the rewound tree: a crash comes back to it.
        head = await client.restore("t-head")
        assert head.checkpoint.id == appended.id
        assert tree_state(root) == after_record
        # A recording restore of the head appends nothing.
        again = await client.restore("t-head", record=True)
        assert not again.HasField("recorded")
        listed = await client.list_checkpoints("t-head")
        assert [c.id for c in listed] == [first, second, appended.id]


async def test_discard_and_dry_run(daemon: Daemon) -> None:
    root = daemon.workspace
    async with daemon.client(timeout=120) as client:
        first, _second = await _two_checkpoints(client, root, "t-plan")
        (root / "dir0" / "notes.txt").write_text("live edit\n")
        (root / "untracked.txt").write_text("new\n")
        before = tree_state(root)
        chunks: list[pb.RestorePlanPaths] = []
        plan = await client.restore(
            "t-plan",
            checkpoint_id=first,
            dry_run=True,
            on_event=lambda e: chunks.append(e.plan_paths) if e.HasField("plan_paths") else None,
        )
        stashed = sorted(path for chunk in chunks for path in chunk.stashed)
        # later.txt differs from the first checkpoint but is the base's: not a live change.
        assert stashed == ["dir0/notes.txt", "untracked.txt"]
        assert plan.plan.paths_stashed == 2
        assert plan.plan.bytes_stashed == len("live edit\n") + len("new\n")
        written = {path for chunk in chunks for path in chunk.written}
        deleted = {path for chunk in chunks for path in chunk.deleted}
        assert "dir0/notes.txt" in written and {"untracked.txt", "later.txt"} <= deleted
        discarding = await client.restore(
            "t-plan", checkpoint_id=first, dry_run=True, discard_live_changes=True
        )
        assert discarding.plan.paths_stashed == 0
        assert tree_state(root) == before and await _stash(client, "t-plan") == []

        done = await client.restore("t-plan", checkpoint_id=first, discard_live_changes=True)
        assert not done.HasField("saved_before_restore")
        assert await _stash(client, "t-plan") == []
        with pytest.raises(RpcError) as caught:
            await client.undo("t-plan")
        assert caught.value.reason == "SANDBOX_SNAPSHOT_MISSING_CHECKPOINT"


def _delete_blob(daemon: Daemon, key: str) -> None:
    Path(daemon.blobs.removeprefix("file://"), key).unlink()


async def test_a_restore_that_fails_verification_changes_nothing(daemons: DaemonFactory) -> None:
    # Every blob its own object (no packs), so one can go missing alone.
    daemon = daemons.start(extra=("--pack-threshold", "1"))
    root = daemon.workspace
    async with daemon.client(timeout=120) as client:
        (root / "only-in-the-first.bin").write_bytes(os.urandom(100_000))
        (root / "small.txt").write_text("one\n")
        first = (await client.capture("t-missing")).checkpoint.id
        (root / "only-in-the-first.bin").unlink()
        await client.capture("t-missing")
        (root / "small.txt").write_text("a live edit\n")
        before = tree_state(root)
        entries = await client.list_entries(first)
        key = next(e.blob_key for e in entries if e.path == "only-in-the-first.bin")
        _delete_blob(daemon, key)

        with pytest.raises(RpcError) as caught:
            await client.restore("t-missing", checkpoint_id=first)
        assert caught.value.reason == "SANDBOX_SNAPSHOT_MISSING_BLOB"
        assert tree_state(root) == before
        assert await _stash(client, "t-missing") == []


async def test_secrets_are_zeroed_in_the_stash_and_written_back_by_undo(daemon: Daemon) -> None:
    root = daemon.workspace
    secret = b"sk-live-0123456789abcdef"
    async with daemon.client(timeout=120) as client:
        (root / "config.txt").write_bytes(b"token=" + secret + b"\n")
        (root / "code.py").write_text("print(1)\n")
        first = (
            await client.capture("t-secret", secrets=[secret], secret_names=["KEY"])
        ).checkpoint
        (root / "code.py").write_text("print(2)\n")
        (root / "config.txt").write_bytes(b"token=" + secret + b"\nmore=1\n")
        edited = tree_state(root)

        done = await client.restore(
            "t-secret", checkpoint_id=first.id, secrets=[secret], secret_names=["KEY"]
        )
        saved = done.saved_before_restore.checkpoint.id
        stored = await client.read_file(saved, "config.txt")
        assert secret not in stored and stored == b"token=" + b"\0" * len(secret) + b"\nmore=1\n"
        assert (root / "config.txt").read_bytes() == b"token=" + secret + b"\n"

        await client.undo("t-secret", secrets=[secret], secret_names=["KEY"])
        assert tree_state(root) == edited
        # Undone without the secret: zeros where it was, and the reply says so.
        await client.undo("t-secret", secrets=[secret], secret_names=["KEY"])
        bare = await client.undo("t-secret")
        assert list(bare.unfilled_secret_paths) == ["config.txt"]
        assert (root / "config.txt").read_bytes() == b"token=" + b"\0" * len(secret) + b"\nmore=1\n"


async def test_the_stash_keeps_its_newest_and_survives_sweep_and_check(
    daemons: DaemonFactory,
) -> None:
    daemon = daemons.start(env={"CHECKPOINTD_STASH_KEEP": "2"})
    root = daemon.workspace
    async with daemon.client(timeout=120) as client:
        first, _second = await _two_checkpoints(client, root, "t-keep")
        for round_ in range(3):
            (root / "edited.txt").write_text(f"round {round_}\n")
            await client.restore("t-keep", checkpoint_id=first)
            await client.restore("t-keep")
        stash = await _stash(client, "t-keep")
        assert len(stash) == 2
        # A sweep deletes what no checkpoint uses: the stash's blobs stay.
        await client.sweep(older_than_ms=0)
        findings: list[pb.CheckEvent] = []
        summary = await client.check(read_data=True, on_event=findings.append)
        assert summary.ok, findings
        await client.undo("t-keep")
        assert (root / "edited.txt").read_text() == "round 2\n"


async def test_a_recorded_undo_with_one_stash_entry_kept_keeps_its_blobs(
    daemons: DaemonFactory,
) -> None:
    """An undo restores a stash entry that its own trim deletes (one kept):
    the head it records still names every blob, through a sweep."""
    daemon = daemons.start(env={"CHECKPOINTD_STASH_KEEP": "1"})
    root = daemon.workspace
    async with daemon.client(timeout=120) as client:
        first, _second = await _two_checkpoints(client, root, "t-one")
        (root / "edited.txt").write_text("only in the stash\n" * 50)
        await client.restore("t-one", checkpoint_id=first)
        done = await client.undo("t-one", record=True)
        assert done.HasField("recorded")
        assert (root / "edited.txt").read_text() == "only in the stash\n" * 50
        assert len(await _stash(client, "t-one")) == 1
        await client.sweep(older_than_ms=0)
        findings: list[pb.CheckEvent] = []
        summary = await client.check(read_data=True, on_event=findings.append)
        assert summary.ok, findings
        (root / "edited.txt").unlink()
        await client.restore("t-one")
        assert (root / "edited.txt").read_text() == "only in the stash\n" * 50


async def test_kill_between_the_stash_and_the_apply(daemons: DaemonFactory) -> None:
    daemon = daemons.start()
    root = daemon.workspace
    async with daemon.client(timeout=120) as client:
        first, second = await _two_checkpoints(client, root, "t-kill")
        with_first = await _restored_elsewhere(daemons, daemon, first)
        # Enough to write that the apply is still running when the kill lands.
        for index in range(2000):
            (root / "bulk" / f"{index % 20}").mkdir(parents=True, exist_ok=True)
            (root / "bulk" / f"{index % 20}" / f"{index}.txt").write_text(f"live {index}\n")
        (root / "dir0" / "notes.txt").write_text("live edit\n")
        edited = tree_state(root)

        killed = asyncio.Event()

        def on_event(event: pb.RestoreEvent) -> None:
            if event.HasField("progress") and event.progress.phase == "apply":
                if not killed.is_set():
                    daemon.kill()
                    killed.set()

        with pytest.raises(RpcError):
            await client.restore("t-kill", checkpoint_id=first, on_event=on_event)
    assert killed.is_set()
    # Each path is the live tree's or the first checkpoint's (a rename is atomic).
    for path, value in tree_state(root).items():
        assert value in (edited.get(path), with_first.get(path)), path

    again = daemons.start(workspace=root, data_dir=daemon.data_dir)
    async with again.client(timeout=120) as client:
        stash = await _stash(client, "t-kill")
        assert len(stash) == 1  # committed before the first change
        rerun = await client.restore("t-kill", checkpoint_id=first)
        if rerun.HasField("saved_before_restore"):
            assert rerun.saved_before_restore.resumed
            assert rerun.saved_before_restore.checkpoint.id == stash[0].id
        assert tree_state(root) == with_first
        assert len(await _stash(client, "t-kill")) == 1
        await client.undo("t-kill")
        assert tree_state(root) == edited
        assert await client.get_head("t-kill") == second


async def _restored_elsewhere(
    daemons: DaemonFactory, daemon: Daemon, checkpoint: str
) -> dict[str, tuple[str, int, str]]:
    """The tree ``checkpoint`` restores to, restored by another daemon into a
    workspace of its own (sharing ``daemon``'s store and bucket)."""
    other = daemons.start(workspace=daemon.workspace.parent / "expected-ws")
    async with other.client(timeout=120) as client:
        await client.restore("t-kill", checkpoint_id=checkpoint)
    state = tree_state(other.workspace)
    other.stop()
    return state
