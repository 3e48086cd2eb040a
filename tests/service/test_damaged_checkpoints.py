"""Bit rot in the SQLite store file, through a real daemon: one bit flipped in a
stored checkpoint row while the daemon is down. Restore, ListEntries and Diff
of the damaged checkpoint and of the deltas stored against it are DATA_LOSS
naming them (never INTERNAL); ``checkpointd check`` names every damaged row,
goes on, and exits 6; the thread goes on (the next capture is a keyframe that
restores byte for byte), and prune and DeleteHead remove damaged checkpoints."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import grpc
import pytest

from checkpointd.service.client import RpcError

from ..fixtures.bitrot import flip_in_sqlite_file
from .conftest import DaemonFactory, make_tree, tree_state
from .test_cli import cli

INVALID_BLOB = "SANDBOX_SNAPSHOT_INVALID_BLOB"


def _store_path(store_url: str) -> Path:
    return Path(store_url.removeprefix("sqlite://"))


async def _three_captures(daemons: DaemonFactory) -> tuple[object, list[str]]:
    """A daemon and three checkpoints of one thread: a keyframe, then two
    deltas (one file of 40 changed each time)."""
    daemon = daemons.start()
    make_tree(daemon.workspace, files=40, max_size=4000)
    ids = []
    async with daemon.client() as client:
        for n in range(3):
            (daemon.workspace / "changing.txt").write_text(f"version {n}\n")
            done = await client.capture("t", conversation=[f'"message {n}"'])
            ids.append(done.checkpoint.id)
    return daemon, ids


def _row(path: Path, checkpoint_id: str) -> tuple[str | None, int]:
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        row = conn.execute(
            "SELECT base_id, depth FROM checkpoints WHERE id = ?", (checkpoint_id,)
        ).fetchone()
    return row[0], row[1]


async def _data_loss(call: object, checkpoint_id: str, damaged_id: str) -> RpcError:
    with pytest.raises(RpcError) as caught:
        await call  # type: ignore[misc]
    error = caught.value
    assert error.code == grpc.StatusCode.DATA_LOSS, error
    assert error.reason == INVALID_BLOB
    assert error.metadata["checkpoint_id"] == checkpoint_id
    assert error.metadata["damaged_checkpoint_id"] == damaged_id
    return error


@pytest.mark.parametrize("part", ["document", "manifest"])
async def test_a_flipped_bit_in_the_store_file_is_data_loss_and_the_thread_goes_on(
    daemons: DaemonFactory, part: str
) -> None:
    daemon, ids = await _three_captures(daemons)
    keyframe, middle, head = ids
    path = _store_path(daemon.store)
    assert _row(path, keyframe)[1] == 0 and _row(path, head)[0] == middle  # deltas
    daemon.stop()
    flip_in_sqlite_file(path, keyframe, part)

    daemon = daemons.start(workspace=daemon.workspace, data_dir=daemon.data_dir)
    async with daemon.client() as client:
        error = await _data_loss(client.restore("t", checkpoint_id=keyframe), keyframe, keyframe)
        assert "checksum" in error.message
        await _data_loss(client.restore("t"), head, keyframe)  # the head: a delta on it
        await _data_loss(client.list_entries(middle), middle, keyframe)
        await _data_loss(client.diff(keyframe, head), keyframe, keyframe)
        await _data_loss(client.diff(head), head, keyframe)

        # check names every damaged row and goes on to the blobs.
        result = cli(daemon, "check")
        assert result.returncode == 6, result.stdout + result.stderr
        for checkpoint_id in ids:
            assert f"damaged        {checkpoint_id}" in result.stdout, result.stdout
        assert "3 corrupt" in result.stdout

        # The thread goes on: a keyframe on the damaged head, restored exactly.
        (daemon.workspace / "new.txt").write_text("after the damage\n")
        done = await client.capture("t")
        assert _row(path, done.checkpoint.id) == (None, 0)
        expected = tree_state(daemon.workspace)
        (daemon.workspace / "new.txt").unlink()
        await client.restore("t")
        assert tree_state(daemon.workspace) == expected

        # Prune removes the damaged checkpoints; then check --repair sets the
        # counts their keys kept, and all is well.
        assert sorted(await client.prune("t", 1)) == sorted(ids)
        repaired = cli(daemon, "check", "--repair")
        assert repaired.returncode == 0, repaired.stdout + repaired.stderr
        clean = cli(daemon, "check")
        assert clean.returncode == 0 and "all good" in clean.stdout, clean.stdout


async def test_delete_head_removes_a_damaged_head(daemons: DaemonFactory) -> None:
    daemon, ids = await _three_captures(daemons)
    path = _store_path(daemon.store)
    daemon.stop()
    flip_in_sqlite_file(path, ids[2], "document")
    daemon = daemons.start(workspace=daemon.workspace, data_dir=daemon.data_dir)
    async with daemon.client() as client:
        await _data_loss(client.restore("t"), ids[2], ids[2])
        assert await client.delete_head("t", ids[2]) == ids[1]
        await client.restore("t")
        assert (daemon.workspace / "changing.txt").read_text() == "version 1\n"
    result = cli(daemon, "check")
    assert result.returncode == 0 and "all good" in result.stdout, result.stdout
