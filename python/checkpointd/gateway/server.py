"""``checkpointd gateway``: the Gateway service in front of one store and one bucket.

Lifecycle, as ``serve``'s: listen (TLS; plaintext only on a loopback address
without a certificate, or with ``--insecure-plaintext``; mutual TLS with
``--tls-client-ca``), health
NOT_SERVING while the store and the bucket open, then SERVING; SIGTERM/SIGINT
drains: health NOT_SERVING, new calls refused (DRAINING, so sidecars move to
another gateway), running calls get ``grace_period`` seconds, the store closes.
Health and reflection answer without a token (probes); every Gateway call needs
one (``tokens.py``). Metrics (``--metrics-listen``, a local admin address) are in
the Prometheus text format: calls by method and status, their latency, and the
PostgreSQL pool's size and idle connections. ``--sweep-every`` runs the blob
sweep here, the only place that sees every thread's references.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from ..errors import SandboxCheckpointInvalidArgumentError
from ..service.reflection import enable_reflection
from ..service.server import backend_name, server_credentials
from ..store.base import CheckpointStore
from ..v1 import gateway_pb2, gateway_pb2_grpc
from . import wire
from .auth import GatewayAuthInterceptor
from .packs import MAX_PACK_DECODED_BYTES, MAX_PACKED_BLOB_BYTES, PackLimits
from .servicer import BackendNames, GatewayServicer
from .tokens import DEFAULT_AUDIENCE, TokenVerifier, load_verifying_key

SERVICE_NAME = gateway_pb2.DESCRIPTOR.services_by_name["Gateway"].full_name
_log = logging.getLogger("checkpointd.gateway")


@dataclass(frozen=True)
class GatewayConfig:
    listen: str  # host:port
    store: str
    blobs: str
    token_key: Path  # the Ed25519 public key (or the private key) tokens are checked with
    audience: str = DEFAULT_AUDIENCE
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    insecure_plaintext: bool = False
    grace_period: float = 10.0
    pool_max_size: int | None = None
    metrics_listen: str | None = None
    # The gateway-side sweep (sidecars never sweep): every sweep_every seconds,
    # delete unreferenced blobs uploaded at least sweep_older_than seconds ago.
    sweep_every: float | None = None
    sweep_older_than: float = 24 * 3600.0
    # ... and repack packs whose live blobs fill less than this percentage.
    sweep_repack_below: int = 50
    # What an uploaded pack may claim, decoded: per blob and in all (packs.PackLimits).
    max_packed_blob: int = MAX_PACKED_BLOB_BYTES
    max_pack_decoded: int = MAX_PACK_DECODED_BYTES

    @property
    def address(self) -> str:
        """``host:port`` for grpc (a ``tcp://`` prefix, as ``serve`` takes, removed)."""
        return self.listen.removeprefix("tcp://")

    @property
    def plaintext(self) -> bool:
        """No TLS: asked for, or no certificate and a loopback address (as ``serve``
        allows plaintext TCP with tokens; nothing leaves the machine)."""
        if self.insecure_plaintext:
            return True
        host = self.address.rpartition(":")[0].strip("[]")
        return self.tls_cert is None and host in ("127.0.0.1", "localhost", "::1")

    def check(self) -> None:
        if self.sweep_every is not None and not self.sweep_every > 0:
            raise SandboxCheckpointInvalidArgumentError("--sweep-every must be positive")
        if not self.sweep_older_than >= 0:
            raise SandboxCheckpointInvalidArgumentError("--sweep-older-than must be >= 0")
        from ..sweep import repack_below_percent

        repack_below_percent(self.sweep_repack_below)
        if self.insecure_plaintext and self.tls_cert is not None:
            raise SandboxCheckpointInvalidArgumentError(
                "--insecure-plaintext and --tls-cert contradict each other"
            )
        if not self.plaintext and self.tls_cert is None:
            raise SandboxCheckpointInvalidArgumentError(
                f"the gateway listens on {self.listen}, beyond loopback: it needs --tls-cert "
                "and --tls-key (tokens would cross the network in clear), or --insecure-plaintext"
            )
        if (self.tls_cert is None) != (self.tls_key is None):
            raise SandboxCheckpointInvalidArgumentError("--tls-cert and --tls-key go together")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise SandboxCheckpointInvalidArgumentError("--tls-client-ca needs --tls-cert")
        if not 1 <= self.max_packed_blob <= self.max_pack_decoded:
            raise SandboxCheckpointInvalidArgumentError(
                f"--max-packed-blob ({self.max_packed_blob}) must be at least 1 byte and at "
                f"most --max-pack-decoded ({self.max_pack_decoded})"
            )

    @property
    def pack_limits(self) -> PackLimits:
        return PackLimits(self.max_packed_blob, self.max_pack_decoded)


def build_gateway_server(
    config: GatewayConfig, servicer: GatewayServicer
) -> tuple[grpc.aio.Server, health.aio.HealthServicer, int]:
    """The server, bound but not started, and the port it bound."""
    interceptor = GatewayAuthInterceptor(
        servicer.authenticator, lambda: servicer.draining, servicer.observe
    )
    server = grpc.aio.server(
        interceptors=[interceptor],
        options=[*wire.SERVER_OPTIONS, ("grpc.so_reuseport", 0)],
    )
    gateway_pb2_grpc.add_GatewayServicer_to_server(servicer, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    enable_reflection((SERVICE_NAME, health.SERVICE_NAME), server)
    if config.plaintext:
        port = server.add_insecure_port(config.address)
    else:
        port = server.add_secure_port(config.address, server_credentials(config))  # type: ignore[arg-type]
    if port == 0:
        raise RuntimeError(f"cannot listen on {config.listen}")
    return server, health_servicer, port


async def _set_health(servicer: health.aio.HealthServicer, serving: bool) -> None:
    value = (
        health_pb2.HealthCheckResponse.SERVING
        if serving
        else health_pb2.HealthCheckResponse.NOT_SERVING
    )
    for name in ("", SERVICE_NAME):
        await servicer.set(name, value)


async def open_backends(config: GatewayConfig) -> tuple[CheckpointStore, Any]:
    from ..blobs import open_blobs
    from ..store import open_store

    if config.pool_max_size is not None and backend_name(config.store) == "postgresql":
        from ..store.postgres import open_postgres_store

        store = await open_postgres_store(config.store, pool_max_size=config.pool_max_size)
    else:
        store = await open_store(config.store)
    return store, open_blobs(config.blobs)


async def sweep_periodically(
    store: CheckpointStore,
    blobs: Any,
    every_s: float,
    older_than_s: float,
    repack_below_percent: int = 50,
) -> None:
    """The gateway's sweep job: the safe sweep of ``sweep.py`` (pins and
    condemnations in the store, so several gateways may run it at once), first
    after ``every_s``, then every ``every_s``; failures are logged, not fatal."""
    from ..sweep import sweep_blobs

    while True:
        await asyncio.sleep(every_s)
        try:
            report = await sweep_blobs(
                store, blobs, int(older_than_s * 1000), repack_below=repack_below_percent / 100
            )
        except Exception:  # noqa: BLE001 - the next round tries again
            _log.exception("sweep failed")
            continue
        _log.info(
            "sweep: %d deleted, %d kept, %d failures",
            len(report.deleted),
            len(report.kept),
            len(report.failures),
        )


async def run(config: GatewayConfig, *, ready: asyncio.Event | None = None) -> int:
    """Serve until SIGTERM/SIGINT; returns the exit code."""
    config.check()
    verifier = TokenVerifier(load_verifying_key(config.token_key), audience=config.audience)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    store, blobs = await open_backends(config)
    metrics = None
    if config.metrics_listen:
        from .metrics import GatewayMetrics

        metrics = GatewayMetrics(store)
        metrics.serve(config.metrics_listen)
    servicer = GatewayServicer(
        store,
        blobs,
        verifier,
        backend_names=BackendNames(backend_name(config.store), backend_name(config.blobs)),
        observe=metrics.observe if metrics is not None else None,
        pack_limits=config.pack_limits,
    )
    if metrics is not None:
        metrics.watch(servicer)
    server, health_servicer, port = build_gateway_server(config, servicer)
    await _set_health(health_servicer, False)
    await server.start()
    sweeper = (
        asyncio.ensure_future(
            sweep_periodically(
                store,
                blobs,
                config.sweep_every,
                config.sweep_older_than,
                config.sweep_repack_below,
            )
        )
        if config.sweep_every
        else None
    )
    try:
        await _set_health(health_servicer, True)
        _log.info(
            "gateway serving on %s (port %d; store %s, blobs %s)",
            config.listen,
            port,
            servicer.store_backend,
            servicer.blob_backend,
        )
        if ready is not None:
            ready.set()
        await stop.wait()
        _log.info("draining (grace %.1fs)", config.grace_period)
    finally:
        if sweeper is not None:
            sweeper.cancel()
            await asyncio.gather(sweeper, return_exceptions=True)
        await health_servicer.enter_graceful_shutdown()
        servicer.draining = True
        await server.stop(config.grace_period)
        await store.aclose()
        if metrics is not None:
            metrics.close()
        _log.info("stopped")
    return 0
