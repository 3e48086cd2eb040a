"""The gateway's upload pieces on their own: the byte budget that bounds how
many pack bytes are checked at once, and what an upload stream holds where."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import blake3
import pytest

from checkpointd.errors import SandboxCheckpointError, SandboxCheckpointInvalidArgumentError
from checkpointd.gateway import packs as pack_rules
from checkpointd.gateway import uploads
from checkpointd.v1 import gateway_pb2 as gpb


async def test_the_budget_holds_at_most_its_limit_and_lets_a_large_request_run_alone() -> None:
    budget = uploads.ByteBudget(100)
    events: list[str] = []

    async def hold(name: str, nbytes: int, gate: asyncio.Event) -> None:
        async with budget.hold(nbytes):
            events.append(f"+{name}")
            assert budget.held <= budget.limit
            await gate.wait()
            events.append(f"-{name}")

    gates = {name: asyncio.Event() for name in "abc"}
    a = asyncio.ensure_future(hold("a", 60, gates["a"]))
    await asyncio.sleep(0.01)
    b = asyncio.ensure_future(hold("b", 60, gates["b"]))  # 120 > 100: waits for a
    c = asyncio.ensure_future(hold("c", 500, gates["c"]))  # more than all: runs alone
    await asyncio.sleep(0.01)
    assert events == ["+a"]
    gates["a"].set()
    await asyncio.sleep(0.01)
    assert events[:2] == ["+a", "-a"] and len(events) == 3
    for gate in gates.values():
        gate.set()
    await asyncio.gather(a, b, c)
    assert budget.held == 0 and sorted(events) == sorted(["+a", "-a", "+b", "-b", "+c", "-c"])


async def _chunks(*messages: gpb.GatewayBlobChunk) -> AsyncIterator[gpb.GatewayBlobChunk]:
    for message in messages:
        yield message


def _key(data: bytes) -> str:
    return "sandbox-files/blake3/" + blake3.blake3(data).hexdigest()


async def test_small_blobs_stay_in_memory_large_ones_and_packs_are_spooled() -> None:
    receiver = uploads.Receiver(pack_rules.PackLimits())
    small, large = b"s" * 1000, b"L" * (uploads.SPOOL_BYTES + 1)
    half = len(large) // 2
    stream = _chunks(
        gpb.GatewayBlobChunk(key=_key(small), data=small, last=True),
        gpb.GatewayBlobChunk(key=_key(large), data=large[:half]),
        gpb.GatewayBlobChunk(key=_key(large), data=large[half:], last=True),
    )
    got = [upload async for upload in receiver.uploads(stream, lambda key: None)]
    assert [u.data is not None for u in got] == [True, False]
    assert got[0].body() == small
    body = got[1].body()
    assert not isinstance(body, bytes)
    assert b"".join([chunk async for chunk in body]) == large
    assert got[1].spool is not None and got[1].spool.closed

    with pytest.raises(SandboxCheckpointError) as caught:
        bad = _chunks(gpb.GatewayBlobChunk(key=_key(b"other"), data=small, last=True))
        [u async for u in receiver.uploads(bad, lambda key: None)]
    assert caught.value.code == "SANDBOX_SNAPSHOT_INVALID_BLOB"
    with pytest.raises(SandboxCheckpointInvalidArgumentError, match="without its last chunk"):
        cut = _chunks(gpb.GatewayBlobChunk(key=_key(small), data=small))
        [u async for u in receiver.uploads(cut, lambda key: None)]
    # A pack is spooled from its first byte and refused past the largest pack.
    too_big = pack_rules.MAX_PACK_BYTES + 1
    with pytest.raises(SandboxCheckpointError, match="larger than a gateway takes"):
        pack = _chunks(
            gpb.GatewayBlobChunk(key="sandbox-packs/blake3/" + "0" * 64, data=bytes(too_big))
        )
        [u async for u in receiver.uploads(pack, lambda key: None)]
