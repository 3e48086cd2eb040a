"""Gateway failover with real kills: two `checkpointd gateway` processes over
one SQLite store and one SeaweedFS bucket, a real `serve --gateway` sidecar
listing gateway A first. After A is killed (SIGKILL), the sidecar's next calls
find no connection to A: they never left, so every one of them, a capture's
lease and append too, moves to B at once instead of failing UNAVAILABLE."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpointd.gateway import tokens
from tests.fixtures.s3 import S3Server
from tests.service.conftest import make_tree, tree_state

from .process import GatewayProcess, start_gateway, start_sidecar, wait_serving

pytestmark = [pytest.mark.s3, pytest.mark.timeout(300)]

THREAD = "failover/main"


@pytest.fixture
def base() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="cpd-fo-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def test_a_sidecar_moves_to_the_next_gateway_when_the_first_is_killed(
    base: Path, s3_server: S3Server
) -> None:
    public = tokens.generate_key(base / "key.pem")
    shared = {
        "store": f"sqlite:///{base / 'store.db'}",
        "blobs": s3_server.url(f"failover-{uuid.uuid4().hex}"),
        "public_key": public,
        "env": s3_server.env(),
    }
    gateways: list[GatewayProcess] = [
        start_gateway(base, name, **shared)  # type: ignore[arg-type]
        for name in ("gw-a", "gw-b")
    ]
    token = tokens.mint(
        tokens.load_signing_key(base / "key.pem"),
        tokens.TokenGrant(
            thread_prefixes=["failover/"],
            ops=["capture", "restore", "list", "prune"],
            ttl_s=600,
        ),
    )
    sidecar = None
    try:
        for gateway in gateways:
            await asyncio.to_thread(wait_serving, gateway)
        sidecar = start_sidecar(base, ",".join(g.address for g in gateways), token)
        await asyncio.to_thread(sidecar.wait_serving)
        make_tree(sidecar.workspace, seed=7, files=20, max_size=40_000)
        async with sidecar.client(timeout=60) as client:
            first = await client.capture(THREAD)  # through A
            gateways[0].kill()
            # Every call of these finds A gone: each must go to B, the first time.
            (sidecar.workspace / "after.txt").write_text("written after A died")
            second = await client.capture(THREAD)
            before = tree_state(sidecar.workspace)
            (sidecar.workspace / "after.txt").unlink()
            await client.restore(THREAD, checkpoint_id=second.checkpoint.id)
            assert tree_state(sidecar.workspace) == before
            listed = await client.list_checkpoints(THREAD)
            assert [c.id for c in listed] == [first.checkpoint.id, second.checkpoint.id]
        assert gateways[1].proc.poll() is None
    finally:
        if sidecar is not None:
            await asyncio.to_thread(sidecar.stop)
        for gateway in gateways:
            gateway.stop()
