"""Captures of one thread that arrive together: every caller gets either a
checkpoint or WRITER_CONFLICT, never WRITER_LOST (a second call of the same
daemon must not take the lease the first is still acquiring)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import grpc

from checkpointd import errors
from checkpointd.service.owner import OwnedStore
from checkpointd.store import open_store
from checkpointd.v1 import checkpointd_pb2 as pb

from .conftest import Daemon, make_tree

ROUNDS = 10
CALLERS = 3


async def test_calls_released_together_get_one_lease(tmp_path: Path) -> None:
    store = OwnedStore(await open_store(f"sqlite://{tmp_path / 'c.db'}"), "daemon-1")
    try:
        for round_ in range(ROUNDS):
            thread = f"t{round_}"
            results = await asyncio.gather(
                *(store.acquire_writer(thread) for _ in range(CALLERS)), return_exceptions=True
            )
            leases = [r for r in results if not isinstance(r, BaseException)]
            refused = [r for r in results if isinstance(r, BaseException)]
            assert len(leases) == 1, results
            assert all(
                isinstance(r, errors.SandboxCheckpointWriterConflictError) for r in refused
            ), refused
            for error in refused:
                assert 0 < int(error.details["retry_after_ms"]) <= 5_000
            await leases[0].renew()  # still the live lease: nobody fenced it
            await leases[0].release()
            again = await store.acquire_writer(thread)  # the slot is free again
            await again.release()
    finally:
        await store.aclose()


async def _capture(stub: object, thread_id: str) -> str:
    """'ok' or the status code and message of one Capture call."""
    try:
        async for event in stub.Capture(
            pb.CaptureRequest(thread_id=thread_id, request_id=uuid.uuid4().hex)
        ):  # type: ignore[attr-defined]
            if event.HasField("done"):
                return "ok"
    except grpc.aio.AioRpcError as error:
        return f"{error.code().name}: {error.details()}"
    return "no done event"


async def test_three_captures_of_one_thread_through_the_daemon(daemon: Daemon) -> None:
    """Three orchestrator connections (as three SDK clients would open)."""
    make_tree(daemon.workspace, files=30)
    async with daemon.client() as a, daemon.client() as b, daemon.client() as c:
        for round_ in range(ROUNDS):
            (daemon.workspace / "round.txt").write_text(str(round_))
            outcomes = await asyncio.gather(*(_capture(x.stub, "race") for x in (a, b, c)))
            assert "ok" in outcomes, outcomes
            for outcome in outcomes:
                assert outcome == "ok" or outcome.startswith("ABORTED"), outcomes
                assert "lost" not in outcome.lower(), outcomes
