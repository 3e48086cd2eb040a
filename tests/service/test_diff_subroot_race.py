"""A live Diff of a sub-root raced with a symlink swap reads nothing outside.

The sandbox swaps ``a`` (a component of the sub-root ``a/sub``) with a symlink to
a private directory holding ``sub/`` too, in a ``renameat2(RENAME_EXCHANGE)``
loop, while live Diffs of ``a/sub`` run through the daemon: each either compares
the real ``a/sub`` (no change: it is as captured) or fails with INVALID_PATH;
none reports the private files, which differ from the captured ones.
"""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from checkpointd.service.client import rpc_error
from checkpointd.v1 import checkpointd_pb2 as pb
from tests.engine.test_subroot_race import _exchange

from .conftest import Daemon

ATTEMPTS = 40


async def test_live_diff_of_a_swapped_subroot_never_reads_outside(daemon: Daemon) -> None:
    ws = daemon.workspace
    private = daemon.data_dir.parent / "private"
    (private / "sub" / "deep").mkdir(parents=True)
    (private / "sub" / "notes.txt").write_bytes(b"TOP-SECRET outside")
    (private / "sub" / "deep" / "key.pem").write_bytes(b"TOP-SECRET key")
    (private / "sub" / "leak.txt").write_bytes(b"only outside")
    (ws / "a" / "sub" / "deep").mkdir(parents=True)
    (ws / "a" / "sub" / "notes.txt").write_bytes(b"inside notes")
    (ws / "a" / "sub" / "deep" / "key.pem").write_bytes(b"inside key")
    (ws / "swap").symlink_to(private)
    if not _exchange(ws / "a", ws / "swap") or not _exchange(ws / "a", ws / "swap"):
        pytest.skip("renameat2(RENAME_EXCHANGE) is not available here")

    outcomes = {"compared": 0, "refused": 0}
    async with daemon.client(timeout=60) as client:
        captured = (await client.capture("t-diff-race", workspace_subdir="a/sub")).checkpoint
        stop = threading.Event()

        def swapper() -> None:
            deadline = time.monotonic() + 30  # bounded, whatever happens
            while not stop.is_set() and time.monotonic() < deadline:
                _exchange(ws / "a", ws / "swap")

        thread = threading.Thread(target=swapper, daemon=True)
        thread.start()
        try:
            for _ in range(ATTEMPTS):
                request = pb.DiffRequest(from_checkpoint_id=captured.id)
                try:
                    changes = [
                        change
                        async for reply in client.stub.Diff(request, timeout=30)
                        for change in reply.changes
                    ]
                except grpc.aio.AioRpcError as error:
                    failure = rpc_error(error)
                    assert failure.code == grpc.StatusCode.INVALID_ARGUMENT, failure
                    assert failure.reason == "SANDBOX_SNAPSHOT_INVALID_PATH", failure
                    outcomes["refused"] += 1
                    continue
                assert changes == [], [(c.path, c.kind) for c in changes]
                outcomes["compared"] += 1
        finally:
            stop.set()
            thread.join()
    assert sum(outcomes.values()) == ATTEMPTS
    print(f"live diffs under a swap loop: {outcomes}")
