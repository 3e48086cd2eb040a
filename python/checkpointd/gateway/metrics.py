"""The gateway's metrics in the Prometheus text format (``--metrics-listen``).

One registry per gateway (not the process-global one, so tests can run several
gateways in one process):

* ``checkpointd_gateway_requests_total{method, code}`` — calls by gRPC status;
* ``checkpointd_gateway_request_seconds{method}`` — their latency;
* ``checkpointd_gateway_blob_bytes{direction}`` — blob bytes streamed through
  the gateway (``in``: uploads; ``out``: reads not served by presigned URLs);
* ``checkpointd_gateway_pool_connections`` / ``…_pool_idle_connections`` — the
  PostgreSQL pool's size and idle connections (absent for other stores).

The listener is an admin port: bind it to 127.0.0.1 (or a private interface);
it needs no token and shows no thread ids.
"""

from __future__ import annotations

from typing import Any

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


def _pool(store: Any) -> Any:
    return getattr(store, "_pool", None) or getattr(getattr(store, "_db", None), "_pool", None)


class GatewayMetrics:
    def __init__(self, store: Any) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "checkpointd_gateway_requests",
            "Gateway calls by method and gRPC status",
            ["method", "code"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "checkpointd_gateway_request_seconds",
            "Gateway call latency",
            ["method"],
            registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        pool = _pool(store)
        if pool is not None and hasattr(pool, "get_size"):
            size = Gauge(
                "checkpointd_gateway_pool_connections",
                "PostgreSQL connections the pool holds",
                registry=self.registry,
            )
            size.set_function(lambda: float(pool.get_size()))
            idle = Gauge(
                "checkpointd_gateway_pool_idle_connections",
                "PostgreSQL connections idle in the pool",
                registry=self.registry,
            )
            idle.set_function(lambda: float(pool.get_idle_size()))
        self._server: Any = None

    def watch(self, servicer: Any) -> None:
        """Export the blob bytes that crossed ``servicer`` (presigned reads do not)."""
        crossed = Gauge(
            "checkpointd_gateway_blob_bytes",
            "Blob bytes streamed through the gateway (in: uploads, out: reads)",
            ["direction"],
            registry=self.registry,
        )
        crossed.labels("in").set_function(lambda: float(servicer.bytes_in))
        crossed.labels("out").set_function(lambda: float(servicer.bytes_out))

    def observe(self, method: str, code: grpc.StatusCode, seconds: float) -> None:
        self.requests.labels(method, code.name).inc()
        self.latency.labels(method).observe(seconds)

    def serve(self, address: str) -> int:
        """Start the HTTP listener on ``host:port``; returns the port."""
        host, _, port = address.rpartition(":")
        self._server, _thread = start_http_server(
            int(port), addr=host.strip("[]") or "127.0.0.1", registry=self.registry
        )
        return int(self._server.server_port)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
