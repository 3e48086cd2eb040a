"""A thread's stash comes with the thread in a gateway token's scope
(docs/restore-history.md): a sidecar whose token names its thread exactly can
stash, undo and list its stash; another tenant's stash stays out of reach."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from checkpointd.blobs import open_blobs
from checkpointd.capture import CaptureOptions, capture_checkpoint
from checkpointd.gateway import tokens
from checkpointd.gateway.remote import RemoteBlobStore, RemoteCheckpointStore
from checkpointd.history import HistoryRestore, restore_with_history, undo_restore
from checkpointd.store.sqlite import SqliteCheckpointStore

from .conftest import Keys


def test_an_exact_grant_covers_the_threads_stash_only(keys: Keys) -> None:
    verifier = tokens.TokenVerifier(tokens.load_verifying_key(keys.public))
    scope = verifier.verify(keys.mint(threads=["tenant-a"], prefixes=["sb-7/"]))
    assert scope.covers("tenant-a~stash") and scope.covers("sb-7/run-1~stash")
    assert not scope.covers("tenant-b~stash") and not scope.covers("tenant-a~stash~stash")
    assert not scope.covers("~stash")


async def test_a_sidecar_stashes_and_undoes_through_the_gateway(
    tmp_path: Path, keys: Keys, gateway_factory: Any
) -> None:
    backing = await SqliteCheckpointStore.open(str(tmp_path / "store.db"))
    gateway = await gateway_factory(backing, open_blobs(f"file://{tmp_path / 'blobs'}"))
    connection = gateway.connection(keys.mint(threads=["tenant-a"]))
    store, blobs = await RemoteCheckpointStore.open(connection), RemoteBlobStore(connection)
    workspace, data = tmp_path / "ws", tmp_path / "data"
    workspace.mkdir()
    try:
        (workspace / "a.txt").write_text("first\n")
        first = await capture_checkpoint(
            workspace, store, blobs, "tenant-a", CaptureOptions(data_dir=data)
        )
        (workspace / "a.txt").write_text("second\n")
        await capture_checkpoint(workspace, store, blobs, "tenant-a", CaptureOptions(data_dir=data))
        (workspace / "a.txt").write_text("the agent's edit\n")

        restored = await restore_with_history(
            workspace, store, blobs, HistoryRestore("tenant-a", first.checkpoint.id), data_dir=data
        )
        assert restored.stashed is not None
        assert restored.stashed.checkpoint.thread_id == "tenant-a~stash"
        assert (workspace / "a.txt").read_text() == "first\n"
        assert [c.id for c in await store.list("tenant-a~stash")] == [
            restored.stashed.checkpoint.id
        ]
        await undo_restore(workspace, store, blobs, HistoryRestore("tenant-a"), data_dir=data)
        assert (workspace / "a.txt").read_text() == "the agent's edit\n"
    finally:
        await store.aclose()
        await backing.aclose()
