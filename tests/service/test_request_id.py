"""Capture request_id edge cases: a retry is a retry, never a new
capture under an old name."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from checkpointd.service.client import RpcError
from checkpointd.v1 import checkpointd_pb2 as pb

from .conftest import Daemon


async def test_a_replay_with_other_parameters_names_the_field(daemon: Daemon) -> None:
    (daemon.workspace / "a.txt").write_text("a")
    async with daemon.client() as client:
        first = await client.capture("t-rid", request_id="r-1", label="one")
        same = await client.capture("t-rid", request_id="r-1", label="one")
        assert same.replayed and same.checkpoint.id == first.checkpoint.id
        for kwargs, field in (
            ({"label": "two"}, "label"),
            ({"label": "one", "conversation": ['{"x":1}']}, "conversation"),
            ({"label": "one", "source_run_id": "run-9"}, "source_run_id"),
        ):
            with pytest.raises(RpcError) as caught:
                await client.capture("t-rid", request_id="r-1", **kwargs)
            assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
            assert caught.value.metadata["field"] == field
        assert len(await client.list_checkpoints("t-rid")) == 1


async def test_a_retry_while_the_first_attempt_runs_waits_for_it(daemon: Daemon) -> None:
    # Enough files that the first capture is still running when the retry comes.
    for index in range(4000):
        (daemon.workspace / f"f{index:05d}.txt").write_text(f"file {index}\n" * 20)
    async with daemon.client(timeout=120) as client:
        started = asyncio.Event()

        def on_event(event: pb.CaptureEvent) -> None:
            if event.HasField("progress"):
                started.set()

        first = asyncio.create_task(
            client.capture("t-wait", request_id="r-wait", on_event=on_event)
        )
        await asyncio.wait_for(started.wait(), 60)
        assert not first.done()
        retry = await client.capture("t-wait", request_id="r-wait")
        original = await first
    assert retry.replayed and not original.replayed
    assert retry.checkpoint.id == original.checkpoint.id
    async with daemon.client() as client:
        assert len(await client.list_checkpoints("t-wait")) == 1


async def test_a_request_id_is_never_reused_for_new_content(daemon: Daemon) -> None:
    (daemon.workspace / "a.txt").write_text("a")
    async with daemon.client() as client:
        first = await client.capture("t-spent", request_id="r-spent")
        assert await client.delete_head("t-spent", first.checkpoint.id) is None
        (daemon.workspace / "a.txt").write_text("new content")
        with pytest.raises(RpcError) as caught:
            await client.capture("t-spent", request_id="r-spent")
        assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert caught.value.metadata["field"] == "request_id"
        assert await client.get_head("t-spent") is None
        # Pruned ones are spent too.
        kept = await client.capture("t-spent", request_id="r-a")
        await client.capture("t-spent", request_id="r-b")
        assert await client.prune("t-spent", 1) == [kept.checkpoint.id]
        with pytest.raises(RpcError) as caught:
            await client.capture("t-spent", request_id="r-a")
        assert caught.value.metadata["field"] == "request_id"
        fresh = await client.capture("t-spent", request_id="r-new")
        assert not fresh.replayed


async def test_a_request_id_deleted_through_the_python_api_is_spent(daemon: Daemon) -> None:
    """Issue 12: the spent mark is a store rule, so a delete that bypasses the
    daemon (the Python API on the same store) spends the request_id too."""
    from checkpointd import open_store

    (daemon.workspace / "a.txt").write_text("a")
    async with daemon.client() as client:
        oldest = await client.capture("t-api", request_id="r-oldest")
        kept = await client.capture("t-api", request_id="r-kept")
        await client.capture("t-api", request_id="r-head")
    store = await open_store(daemon.store)
    try:
        async with await store.acquire_writer("t-api") as lease:
            head = await store.get_head("t-api")
            assert head is not None
            await store.delete_head("t-api", head, lease)
            assert await store.delete_checkpoints("t-api", 1, lease) == [oldest.checkpoint.id]
        assert await store.get_head("t-api") == kept.checkpoint.id
    finally:
        await store.aclose()
    (daemon.workspace / "a.txt").write_text("new content")
    async with daemon.client() as client:
        for request_id in ("r-oldest", "r-head"):
            with pytest.raises(RpcError) as caught:
                await client.capture("t-api", request_id=request_id)
            assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
            assert caught.value.metadata["field"] == "request_id"
        again = await client.capture("t-api", request_id="r-kept")
        assert again.replayed and again.checkpoint.id == kept.checkpoint.id


async def test_only_a_marked_retry_waits_for_another_writer(daemon: Daemon) -> None:
    """A first attempt with a request_id still fails fast on a live lease (the
    the reference API's WRITER_CONFLICT); a retry marked ``checkpointd-attempt: 2`` (as the SDKs
    send) waits for the other writer instead, then captures."""
    from checkpointd import open_store
    from checkpointd.service.status import error_info_from_metadata

    (daemon.workspace / "a.txt").write_text("a")
    store = await open_store(daemon.store)
    try:
        lease = await store.acquire_writer("t-marked")
        async with daemon.client() as client:
            with pytest.raises(RpcError) as caught:
                await asyncio.wait_for(client.capture("t-marked", request_id="r-m"), 10)
            assert caught.value.reason == "SANDBOX_SNAPSHOT_WRITER_CONFLICT"
            request = pb.CaptureRequest(thread_id="t-marked", request_id="r-m")
            call = client.stub.Capture(request, metadata=(("checkpointd-attempt", "2"),))
            events = asyncio.ensure_future(_collect(call))
            await asyncio.sleep(1.0)
            assert not events.done(), "the marked retry waits while the lease is held"
            await lease.release()
            try:
                done = (await asyncio.wait_for(events, 30))[-1].done
            except grpc.aio.AioRpcError as error:
                raise AssertionError(error_info_from_metadata(error.trailing_metadata())) from None
        assert done.checkpoint.id and not done.replayed
    finally:
        await store.aclose()


async def _collect(call: object) -> list[pb.CaptureEvent]:
    return [event async for event in call]  # type: ignore[attr-defined]
