"""The gateway's Prometheus metrics: calls by method and status, latency, pool use."""

from __future__ import annotations

import asyncio
import urllib.request
from typing import Any

import pytest

from checkpointd.blobs import open_blobs
from checkpointd.errors import SandboxCheckpointError
from checkpointd.gateway.metrics import GatewayMetrics
from checkpointd.gateway.remote import RemoteCheckpointStore
from checkpointd.store.postgres import open_postgres_store

from .conftest import Keys


@pytest.mark.postgres
async def test_metrics_count_calls_errors_and_pool_connections(
    postgres_url: str, keys: Keys, gateway_factory: Any, tmp_path: Any
) -> None:
    store = await open_postgres_store(postgres_url, pool_max_size=3)
    metrics = GatewayMetrics(store)
    port = metrics.serve("127.0.0.1:0")
    try:
        gateway = await gateway_factory(
            store, open_blobs(f"file://{tmp_path / 'b'}"), metrics.observe
        )
        remote = await RemoteCheckpointStore.open(gateway.connection(keys.mint(threads=["t1"])))
        assert await remote.get_head("t1") is None
        with pytest.raises(SandboxCheckpointError):
            await remote.get_head("t2")
        await remote.aclose()

        def scrape() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
                return reply.read().decode()

        text = await asyncio.to_thread(scrape)
        assert 'checkpointd_gateway_requests_total{code="OK",method="GetHead"} 1.0' in text
        assert (
            'checkpointd_gateway_requests_total{code="PERMISSION_DENIED",method="GetHead"} 1.0'
            in text
        )
        assert 'checkpointd_gateway_request_seconds_count{method="GetStoreInfo"} 1.0' in text
        pool_line = next(
            line
            for line in text.splitlines()
            if line.startswith("checkpointd_gateway_pool_connections ")
        )
        assert 1.0 <= float(pool_line.split()[1]) <= 3.0
        assert "checkpointd_gateway_pool_idle_connections" in text
    finally:
        metrics.close()
        await store.aclose()
