"""The daemon: ``build_server`` assembles the grpc.aio server, ``run`` runs it.

Lifecycle, in this fixed order:

1. Listen (Unix socket created with mode 0600; TCP only with a bearer token or
   mutual TLS, optionally TLS; health and reflection answer without the token
   unless ``auth_probes``, see ``auth.py``). Health says NOT_SERVING.
2. Open the checkpoint store and the blob store.
3. With ``--restore-on-start``: restore the thread's newest checkpoint into an
   empty workspace, or capture a non-empty one that differs (``before-restore``)
   and leave it (nothing else can write yet: the service still refuses calls).
4. Health says SERVING; calls are accepted. With ``--capture-every`` the capture
   loop starts (see ``loop.py``).
5. SIGTERM/SIGINT: health says NOT_SERVING, new calls are refused, running calls
   get ``grace_period`` seconds to finish and are then cancelled and awaited (the
   engines release their leases as they unwind); the loop, if it served, makes
   its final capture (exit code 1 when it fails); the stores are closed; the
   socket file is removed. A
   SIGTERM while the stores open or the first restore runs stops at once.

A workspace root that does not exist is refused before listening (exit 2): it is
never created. A store that cannot open, or a failed restore-on-start, ends the
daemon with the error's exit code (see ``checkpointd --help``) and no capture.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import socket
import stat
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from .. import _native, chunks
from ..errors import SandboxCheckpointInvalidArgumentError
from ..v1 import checkpointd_pb2, checkpointd_pb2_grpc
from .auth import BearerTokenInterceptor
from .config import ServeConfig, chunk_settings, grpc_address
from .guard import (
    MAX_MESSAGE_BYTES,
    TRANSPORT_LIMIT_BYTES,
    RequestGuardInterceptor,
    UnknownMethodHandler,
)
from .reflection import enable_reflection
from .servicer import CheckpointdServicer
from .state import ServiceState
from .status import UNKNOWN_SERVICE, ServiceError, abort
from .watch import Verifier, start_journal

if TYPE_CHECKING:
    from ..journal import WorkspaceJournal
    from .loop import CaptureLoop

SERVICE_NAME = checkpointd_pb2.DESCRIPTOR.services_by_name["Checkpointd"].full_name
# Upper bound on waiting for cancelled engine calls to release their leases.
UNWIND_TIMEOUT_S = 30.0

_log = logging.getLogger("checkpointd.server")


def backend_name(url: str) -> str:
    """``sqlite``, ``postgresql``, ``file``, ``s3``… from a store or blob URL."""
    scheme = urlsplit(url).scheme.lower()
    if scheme in ("grpcs", "grpc", "checkpointd+gateway"):
        return "gateway"  # serve --gateway: both stores are the gateway's
    return "postgresql" if scheme == "postgres" else scheme


@contextlib.contextmanager
def _private_umask() -> Iterator[None]:
    # grpc creates the socket file when binding: with umask 0177 it is born 0600,
    # so there is no moment when another user could connect.
    previous = os.umask(0o177)
    try:
        yield
    finally:
        os.umask(previous)


def _claim_socket(path: Path) -> None:
    """Remove a stale socket file left by a daemon that died; refuse a live one.

    grpc would silently unlink and rebind the path, stealing it from a daemon
    that still runs, so a second daemon on the same socket must fail instead.
    Raises RuntimeError when something answers on the socket.
    """
    if not path.exists():
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(os.fspath(path))
    except OSError:
        path.unlink(missing_ok=True)  # nobody listens: left over from a crash
        return
    finally:
        probe.close()
    raise RuntimeError(f"another process is serving on {path}")


class _Health(health.aio.HealthServicer):
    """grpc's health servicer, whose one error (Check of a service name with no
    status) carries ErrorInfo like every other error the daemon returns."""

    async def Check(
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> health_pb2.HealthCheckResponse:
        if request.service not in self._server_status:
            _log.warning("health check of unknown service %r: NOT_FOUND", request.service)
            await abort(
                context,
                ServiceError(
                    UNKNOWN_SERVICE,
                    f"no health status for service {request.service!r} (ask for "
                    f"{SERVICE_NAME!r} or the server as a whole, '')",
                    service=request.service,
                ),
            )
        return await super().Check(request, context)


def build_server(
    config: ServeConfig, state: ServiceState
) -> tuple[grpc.aio.Server, health.aio.HealthServicer]:
    """The server with the checkpointd service, health and reflection, bound to
    ``config.listen`` but not started. Raises RuntimeError when it cannot bind."""
    # The token check first: a denied call is answered without decoding it.
    interceptors: list[grpc.aio.ServerInterceptor] = (
        [BearerTokenInterceptor(config.token, auth_probes=config.auth_probes)]
        if config.is_tcp and config.token
        else []
    )
    interceptors.append(RequestGuardInterceptor())
    server = grpc.aio.server(
        interceptors=interceptors,
        options=[
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            # The 4 MiB limit on requests is enforced by RequestGuardInterceptor,
            # which answers with ErrorInfo; the transport only stops abuse.
            ("grpc.max_receive_message_length", TRANSPORT_LIMIT_BYTES),
            # One daemon per socket: do not share a port with a stale process.
            ("grpc.so_reuseport", 0),
        ],
    )
    checkpointd_pb2_grpc.add_CheckpointdServicer_to_server(CheckpointdServicer(state), server)
    health_servicer = _Health()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    enable_reflection((SERVICE_NAME, health.SERVICE_NAME), server)
    server.add_generic_rpc_handlers((UnknownMethodHandler(),))  # last: the fallback
    socket_path = config.socket_path
    if socket_path is not None:
        socket_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        _claim_socket(socket_path)
        with _private_umask():
            server.add_insecure_port(grpc_address(config.listen))
    elif config.tls:
        server.add_secure_port(grpc_address(config.listen), server_credentials(config))
    else:
        # Plain-text TCP with a bearer token: meant for loopback or a private
        # network; use --tls-cert/--tls-key for anything else.
        server.add_insecure_port(grpc_address(config.listen))
    return server, health_servicer


def _read_pem(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise SandboxCheckpointInvalidArgumentError(
            f"cannot read the {what} {path}: {exc.strerror}", details={"path": str(path)}
        ) from exc


def server_credentials(config: ServeConfig) -> grpc.ServerCredentials:
    """TLS credentials; with a client CA every client must present a certificate
    it signed (mutual TLS)."""
    assert config.tls_cert is not None and config.tls_key is not None
    chain = _read_pem(config.tls_cert, "TLS certificate (--tls-cert)")
    key = _read_pem(config.tls_key, "TLS key (--tls-key)")
    client_ca = (
        _read_pem(config.tls_client_ca, "client CA (--tls-client-ca)")
        if config.tls_client_ca is not None
        else None
    )
    return grpc.ssl_server_credentials(
        [(key, chain)], root_certificates=client_ca, require_client_auth=client_ca is not None
    )


async def _set_health(servicer: health.aio.HealthServicer, serving: bool) -> None:
    status = (
        health_pb2.HealthCheckResponse.SERVING
        if serving
        else health_pb2.HealthCheckResponse.NOT_SERVING
    )
    for name in ("", SERVICE_NAME):
        await servicer.set(name, status)


async def _unwind(state: ServiceState) -> None:
    """Cancel the calls (and engine tasks) still running and wait until they finished
    unwinding: their ``finally`` blocks release the writer leases, which must
    happen before the stores close (grpc abandons cancelled handlers without
    waiting for them)."""
    tasks = set(state.running) | set(state.calls)
    for task in tasks:
        task.cancel()
    if tasks:
        _log.info("cancelling %d calls still running after the grace period", len(tasks))
        await asyncio.wait(tasks, timeout=UNWIND_TIMEOUT_S)


async def _unless_stopped(work: Coroutine[Any, Any, None], stop: asyncio.Event) -> bool:
    """Run ``work`` unless ``stop`` is set first (then cancel it); True when it
    finished. Raises what ``work`` raises."""
    task = asyncio.ensure_future(work)
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if task.done():
        task.result()
        return True
    task.cancel()
    await asyncio.wait({task})
    return False


# Opens the stores of a daemon that reaches them through a gateway
# (``gateway.remote.open_gateway_stores``): the command line passes it in, so
# the daemon's service never imports the gateway package that sits above it.
RemoteOpener = Callable[[ServeConfig], Awaitable[tuple[Any, Any]]]


async def open_stores(
    config: ServeConfig, state: ServiceState, open_remote: RemoteOpener | None = None
) -> None:
    """Open the stores named by the config into ``state``.

    Raises what ``open_store``/``open_blobs`` raise (bad URL, database down...).
    """
    from ..blobs import open_blobs
    from ..blobs.packs import packed_blobs
    from ..store import open_store
    from .owner import OwnedStore, load_owner_id

    owner = load_owner_id(state.data_dir)  # a restarted daemon takes back its leases
    store: Any
    blobs: Any
    if config.gateway is not None:
        if open_remote is None:
            raise SandboxCheckpointInvalidArgumentError(
                "this daemon was started without a way to reach a gateway"
            )
        store, blobs = await open_remote(config)
    else:
        blobs = open_blobs(config.blobs)
        store = await open_store(config.store)
    state.store = OwnedStore(store, owner)
    # Every handler (capture, restore, ReadFile, ReadArtifact, check) reads and
    # writes small blobs through the store's pack index (blobs/packs.py).
    state.blobs = packed_blobs(blobs, state.store, threshold=config.pack_threshold)
    settings = chunk_settings(config)
    chunks.configure(None if isinstance(settings, str) else settings)
    state.store_backend = backend_name(config.store)
    state.blob_backend = backend_name(config.blobs)


PRIVATE_UMASK = 0o077
# Files of the embedded default store that an older version left 0644.
_EMBEDDED_FILES = ("checkpoints.db", "checkpoints.db-wal", "checkpoints.db-shm")


def _check_private_data_dir(data_dir: Path) -> None:
    """Refuse a data dir others may write (they could swap the store, the stat
    cache or the socket under the daemon); tighten what an older version left
    readable. Raises SandboxCheckpointInvalidArgumentError."""
    mode = stat.S_IMODE(data_dir.stat().st_mode)
    if mode & 0o022:
        raise SandboxCheckpointInvalidArgumentError(
            f"data dir {data_dir} is group- or world-writable (mode {mode:04o}): another user "
            f"could replace the store or the stat cache; chmod 700 {data_dir}",
            details={"path": str(data_dir), "mode": f"{mode:04o}"},
        )
    if mode & 0o077:
        data_dir.chmod(0o700)
    for name in _EMBEDDED_FILES:
        path = data_dir / name
        with contextlib.suppress(FileNotFoundError):
            if stat.S_IMODE(path.lstat().st_mode) & 0o077 and not path.is_symlink():
                path.chmod(0o600)
    blobs = data_dir / "blobs"
    with contextlib.suppress(FileNotFoundError):
        if not blobs.is_symlink() and stat.S_IMODE(blobs.lstat().st_mode) & 0o077:
            blobs.chmod(0o700)


async def run(
    config: ServeConfig,
    *,
    ready: asyncio.Event | None = None,
    open_remote: RemoteOpener | None = None,
) -> int:
    """Serve until SIGTERM/SIGINT; returns the process exit code."""
    from .loop import CaptureLoop

    state = await _prepare(config)
    # Watching starts first: its walk of the tree overlaps the stores' opening.
    journal = state.journal = start_journal(config)
    server, health_servicer = build_server(config, state)
    await _set_health(health_servicer, False)
    await server.start()
    if config.socket_path is not None:
        os.chmod(config.socket_path, 0o600)
    _log.info("listening on %s (workspace %s)", config.listen, config.workspace)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    capture_loop = (
        CaptureLoop(config, state, functools.partial(_set_service_health, health_servicer))
        if config.thread
        else None
    )
    daemon = _Daemon(config, state, server, health_servicer, journal, capture_loop)
    try:
        await daemon.serve(stop, ready, open_remote)
        _log.info("draining (grace %.1fs)", config.grace_period)
    finally:
        exit_code = await daemon.shut_down()
    return exit_code


async def _prepare(config: ServeConfig) -> ServiceState:
    """Check the workspace and the data dir, clear what an interrupted restore
    left; the service's state. Raises SandboxCheckpointInvalidArgumentError."""
    from ..statcache_paths import resolve_data_dir

    if not config.workspace.is_dir():
        # Never created: a typo'd --workspace would otherwise be captured as an
        # empty checkpoint, and a later --restore-on-start would wipe the real one.
        raise SandboxCheckpointInvalidArgumentError(
            f"workspace root {config.workspace} does not exist or is not a directory; "
            "create it first or fix --workspace",
            details={"path": str(config.workspace)},
        )
    # Everything the daemon creates from here on (the SQLite store, local blobs,
    # stat caches, the socket) is born 0600 / 0700: only its own user reads the
    # checkpoints. Restore sets workspace modes explicitly, from the manifest.
    os.umask(PRIVATE_UMASK)
    # Refuses a data dir inside the workspace (sandbox code could forge the stat cache).
    data_dir = resolve_data_dir(config.workspace, config.data_dir)
    _check_private_data_dir(data_dir)
    # A restore killed with the daemon left its staging directory in the
    # workspace (a capture never holds it): removed before anything runs.
    for name in await asyncio.to_thread(_native.remove_stale_staging, config.workspace):
        _log.info("removed %s, left in the workspace by an interrupted restore", name)
    return ServiceState(
        workspace_root=config.workspace,
        data_dir=data_dir,
        auth_mode=config.auth_mode,
        tls=config.tls,
        mutual_tls=config.mutual_tls,
        auth_probes=config.auth_probes,
        stash_keep=config.stash_keep,
    )


async def _set_service_health(servicer: health.aio.HealthServicer, serving: bool) -> None:
    await servicer.set(
        SERVICE_NAME,
        health_pb2.HealthCheckResponse.SERVING
        if serving
        else health_pb2.HealthCheckResponse.NOT_SERVING,
    )


@dataclass
class _Daemon:
    """A listening daemon's parts: ``serve`` until stopped, then ``shut_down``
    in the order of the module docstring."""

    config: ServeConfig
    state: ServiceState
    server: grpc.aio.Server
    health_servicer: health.aio.HealthServicer
    journal: WorkspaceJournal
    capture_loop: CaptureLoop | None
    verifier: Verifier | None = None
    # Only a loop that served makes the final capture: after a failed or
    # interrupted restore-on-start the workspace is not the thread's.
    looping: bool = False

    async def serve(
        self, stop: asyncio.Event, ready: asyncio.Event | None, open_remote: RemoteOpener | None
    ) -> None:
        """Open the stores (and restore on start), say SERVING, start the
        verifier and the capture loop, and wait for ``stop``."""
        config, state = self.config, self.state
        # A SIGTERM while the stores open or the first restore runs ends the wait.
        ready_to_serve = await _unless_stopped(open_stores(config, state, open_remote), stop)
        if ready_to_serve and self.capture_loop is not None and config.restore_on_start:
            ready_to_serve = await _unless_stopped(self.capture_loop.restore_on_start(), stop)
        if not ready_to_serve:
            return
        await _set_health(self.health_servicer, True)
        _log.info("serving (store %s, blobs %s)", state.store_backend, state.blob_backend)
        if ready is not None:
            ready.set()
        if config.watch_verify_every > 0 and state.store is not None:
            self.verifier = Verifier(
                self.journal, state.store, config, state.data_dir, config.watch_verify_every
            )
            self.verifier.start()
        if self.capture_loop is not None and (config.capture_every or config.capture_on_change):
            self.capture_loop.start()
            self.looping = True
        await stop.wait()

    async def shut_down(self) -> int:
        """Drain and stop; the exit code (1 when the final capture failed)."""
        exit_code = 0
        await self.health_servicer.enter_graceful_shutdown()
        if self.capture_loop is not None:
            await self.capture_loop.stop()
        if self.verifier is not None:
            await self.verifier.stop()
        self.state.draining = True
        # Refuses new calls at once; cancels the calls still running after the grace.
        await self.server.stop(self.config.grace_period)
        await _unwind(self.state)
        if (
            self.capture_loop is not None
            and self.looping
            and not await self.capture_loop.final_capture()
        ):
            _log.error("the final capture failed: the last changes may not be saved")
            exit_code = 1
        if self.state.store is not None:
            await self.state.store.aclose()
        self.journal.close()
        socket_path = self.config.socket_path
        if socket_path is not None:
            with contextlib.suppress(FileNotFoundError):
                socket_path.unlink()
        _log.info("stopped")
        return exit_code
