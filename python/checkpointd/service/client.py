"""A small asyncio client of the daemon, used by the CLI (and handy in tests).

Addresses: ``unix:///abs/path.sock`` (or ``unix:/abs/path``) and
``tcp://host:port`` (or ``host:port``), over TLS when given certificates. With a
token every call carries ``authorization: Bearer <token>``. Failed calls raise :class:`RpcError`, which
carries the status code and the ErrorInfo reason and metadata.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict, TypeVar, Unpack

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from .._keywords import check_keywords
from ..v1 import checkpointd_pb2 as pb
from ..v1 import checkpointd_pb2_grpc as pb_grpc
from .auth import bearer_metadata
from .config import grpc_address
from .status import error_info_from_metadata

T = TypeVar("T")
UPLOAD_CHUNK = 256 * 1024


@dataclass
class RpcError(Exception):
    """A failed call: gRPC status plus the daemon's ErrorInfo (when it sent one)."""

    code: grpc.StatusCode
    message: str
    reason: str = ""
    metadata: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        reason = f" [{self.reason}]" if self.reason else ""
        return f"{self.code.name}{reason}: {self.message}"


def rpc_error(error: grpc.aio.AioRpcError) -> RpcError:
    info = error_info_from_metadata(error.trailing_metadata())
    return RpcError(
        code=error.code(),
        message=error.details() or "",
        reason=info.reason if info is not None else "",
        metadata=dict(info.metadata) if info is not None else {},
    )


class TlsOptions(TypedDict, total=False):
    """The TLS keywords of ``Client`` (its docstring)."""

    tls_ca: bytes | None
    tls_cert: bytes | None
    tls_key: bytes | None
    tls_server_name: str | None


class CaptureRequestOptions(TypedDict, total=False):
    """The keywords of ``Client.capture``: the CaptureRequest fields (None: not set)."""

    label: str | None
    policy: pb.Policy | None
    secrets: Sequence[bytes]
    conversation: Sequence[str]
    artifacts: Sequence[pb.Artifact]
    workspace_subdir: str
    request_id: str | None
    source_run_id: str | None
    skip_if_unchanged: bool
    secret_names: Sequence[str]


class UndoRequestOptions(TypedDict, total=False):
    """The keywords of ``Client.undo``: the UndoRequest fields."""

    workspace_subdir: str
    dry_run: bool
    record: bool
    secrets: Sequence[bytes]
    secret_names: Sequence[str]


class RestoreRequestOptions(UndoRequestOptions, total=False):
    """The keywords of ``Client.restore``: the RestoreRequest fields (None: not set)."""

    checkpoint_id: str | None
    policy: pb.Policy | None
    discard_live_changes: bool


class Client:
    """``async with Client(address, token=...) as client: await client.capture(...)``."""

    def __init__(
        self,
        address: str,
        *,
        token: str | None = None,
        timeout: float | None = None,
        **tls: Unpack[TlsOptions],
    ) -> None:
        """TLS is used when any of ``tls_ca`` (PEM roots to verify the daemon;
        None: the system's), ``tls_cert``/``tls_key`` (a client certificate for
        mutual TLS) is given. ``tls_server_name`` overrides the name checked in
        the daemon's certificate. TypeError for an unknown keyword."""
        check_keywords("Client", tls, TlsOptions)
        self.address = address
        self._metadata = bearer_metadata(token) if token else ()
        self._timeout = timeout
        options: list[tuple[str, Any]] = [("grpc.max_receive_message_length", 4 * 1024 * 1024)]
        tls_server_name = tls.get("tls_server_name")
        if tls_server_name:
            options.append(("grpc.ssl_target_name_override", tls_server_name))
        tls_ca, tls_cert = tls.get("tls_ca"), tls.get("tls_cert")
        if tls_ca is not None or tls_cert is not None:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=tls_ca, private_key=tls.get("tls_key"), certificate_chain=tls_cert
            )
            self._channel = grpc.aio.secure_channel(grpc_address(address), credentials, options)
        else:
            self._channel = grpc.aio.insecure_channel(grpc_address(address), options=options)
        self.stub = pb_grpc.CheckpointdStub(self._channel)
        self.health_stub = health_pb2_grpc.HealthStub(self._channel)

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    def _kw(self) -> dict[str, Any]:
        return {"metadata": self._metadata, "timeout": self._timeout}

    async def _unary(self, method: Any, request: Any) -> Any:
        try:
            return await method(request, **self._kw())
        except grpc.aio.AioRpcError as error:
            raise rpc_error(error) from None

    async def _stream(self, method: Any, request: Any) -> AsyncIterator[Any]:
        """The stream's messages. A consumer that stops early cancels the call;
        one that reads to the end (see ``_until_final``) lets it finish, so the
        daemon sees a completed call, not a cancelled one."""
        call = method(request, **self._kw())
        try:
            async for message in call:
                yield message
        except grpc.aio.AioRpcError as error:
            raise rpc_error(error) from None
        finally:
            call.cancel()

    async def _until_final(
        self,
        method: Any,
        request: Any,
        final: str,
        on_event: Callable[[Any], None] | None = None,
    ) -> Any:
        """Read a long-work stream to its end (never cancelling it once the
        ``final`` event came) and return that event's message; ``on_event``
        sees every event, the final one too. RpcError when the stream ends
        without it."""
        found = None
        async for event in self._stream(method, request):
            if on_event is not None:
                on_event(event)
            if event.HasField(final):
                found = getattr(event, final)
        if found is None:
            raise RpcError(grpc.StatusCode.UNKNOWN, f"the stream ended without its {final} event")
        return found

    # ---------------------------------------------------------------- long work

    async def capture(
        self,
        thread_id: str,
        *,
        on_event: Callable[[pb.CaptureEvent], None] | None = None,
        **fields: Unpack[CaptureRequestOptions],
    ) -> pb.CaptureDone:
        """Capture; ``on_event`` sees every event. Returns the done event.
        ``fields``: ``label``, ``policy``, ``secrets``, ``secret_names``,
        ``conversation``, ``artifacts``, ``workspace_subdir``, ``request_id``,
        ``source_run_id``, ``skip_if_unchanged`` (CaptureRequestOptions).
        TypeError for an unknown keyword."""
        check_keywords("capture", fields, CaptureRequestOptions)
        request = pb.CaptureRequest(thread_id=thread_id, **fields)
        done: pb.CaptureDone = await self._until_final(self.stub.Capture, request, "done", on_event)
        return done

    async def restore(
        self,
        thread_id: str,
        *,
        on_event: Callable[[pb.RestoreEvent], None] | None = None,
        **fields: Unpack[RestoreRequestOptions],
    ) -> pb.RestoreDone:
        """Restore (``dry_run``: plan only; ``on_event`` sees the plan_paths
        chunks). Returns the done event. ``fields``: ``checkpoint_id``,
        ``policy``, ``workspace_subdir``, ``dry_run``, ``secrets``,
        ``secret_names``, ``discard_live_changes``, ``record``
        (RestoreRequestOptions). TypeError for an unknown keyword."""
        check_keywords("restore", fields, RestoreRequestOptions)
        request = pb.RestoreRequest(thread_id=thread_id, **fields)
        done: pb.RestoreDone = await self._until_final(self.stub.Restore, request, "done", on_event)
        return done

    async def undo(
        self,
        thread_id: str,
        *,
        on_event: Callable[[pb.RestoreEvent], None] | None = None,
        **fields: Unpack[UndoRequestOptions],
    ) -> pb.RestoreDone:
        """Restore the newest entry of the thread's stash (undo the last
        restore). Returns the done event, as ``restore`` does. ``fields``:
        ``workspace_subdir``, ``dry_run``, ``record``, ``secrets``,
        ``secret_names`` (UndoRequestOptions). TypeError for an unknown keyword."""
        check_keywords("undo", fields, UndoRequestOptions)
        request = pb.UndoRequest(thread_id=thread_id, **fields)
        done: pb.RestoreDone = await self._until_final(self.stub.Undo, request, "done", on_event)
        return done

    # ---------------------------------------------------------------- reading

    async def get_checkpoint(
        self, checkpoint_id: str, *, include_conversation: bool = False
    ) -> pb.GetCheckpointResponse:
        return await self._unary(
            self.stub.GetCheckpoint,
            pb.GetCheckpointRequest(
                checkpoint_id=checkpoint_id, include_conversation=include_conversation
            ),
        )

    async def list_checkpoints(
        self,
        thread_id: str,
        *,
        page_size: int = 0,
        newest_first: bool = False,
        before: str | None = None,
        limit: int | None = None,
        stash: bool = False,
    ) -> list[pb.CheckpointSummary]:
        """The thread's checkpoints (all pages, or the first ``limit``), oldest
        first or ``newest_first``, only those before ``before`` when given;
        ``stash``: the thread's stash instead."""
        out: list[pb.CheckpointSummary] = []
        token = ""
        while True:
            request = pb.ListCheckpointsRequest(
                thread_id=thread_id,
                page_size=page_size if limit is None else min(limit - len(out), 1000),
                page_token=token,
                newest_first=newest_first,
                stash=stash,
            )
            if before is not None:
                request.before = before
            page = await self._unary(self.stub.ListCheckpoints, request)
            out.extend(page.checkpoints)
            token = page.next_page_token
            if not token or (limit is not None and len(out) >= limit):
                return out if limit is None else out[:limit]

    async def list_checkpoints_page(
        self,
        thread_id: str,
        *,
        page_size: int,
        page_token: str = "",
        newest_first: bool = False,
    ) -> pb.ListCheckpointsResponse:
        """One page of the thread's checkpoints (``next_page_token`` empty on the last)."""
        request = pb.ListCheckpointsRequest(
            thread_id=thread_id,
            page_size=page_size,
            page_token=page_token,
            newest_first=newest_first,
        )
        page: pb.ListCheckpointsResponse = await self._unary(self.stub.ListCheckpoints, request)
        return page

    async def list_threads(self, *, page_size: int = 0) -> AsyncIterator[pb.ThreadSummary]:
        """Every thread that holds checkpoints, page by page."""
        token = ""
        while True:
            page = await self._unary(
                self.stub.ListThreads, pb.ListThreadsRequest(page_size=page_size, page_token=token)
            )
            for thread in page.threads:
                yield thread
            token = page.next_page_token
            if not token:
                return

    async def get_head(self, thread_id: str) -> str | None:
        response = await self._unary(self.stub.GetHead, pb.GetHeadRequest(thread_id=thread_id))
        return response.checkpoint_id if response.HasField("checkpoint_id") else None

    async def list_entries(self, checkpoint_id: str, *, path_prefix: str = "") -> list[pb.Entry]:
        out: list[pb.Entry] = []
        request = pb.ListEntriesRequest(checkpoint_id=checkpoint_id, path_prefix=path_prefix)
        async for message in self._stream(self.stub.ListEntries, request):
            out.extend(message.entries)
        return out

    async def diff(
        self,
        from_checkpoint_id: str,
        to_checkpoint_id: str | None = None,
        *,
        policy: pb.Policy | None = None,
        secrets: Sequence[bytes] = (),
        workspace_subdir: str = "",
        secret_names: Sequence[str] = (),
    ) -> list[pb.Change]:
        """Changes from one checkpoint to another, or (``to`` None) to the live workspace."""
        request = pb.DiffRequest(
            from_checkpoint_id=from_checkpoint_id,
            secrets=list(secrets),
            secret_names=list(secret_names),
            workspace_subdir=workspace_subdir,
        )
        if to_checkpoint_id is not None:
            request.to_checkpoint_id = to_checkpoint_id
        if policy is not None:
            request.policy.CopyFrom(policy)
        out: list[pb.Change] = []
        async for message in self._stream(self.stub.Diff, request):
            out.extend(message.changes)
        return out

    async def read_file(self, checkpoint_id: str, path: str, *, chunk_size: int = 0) -> bytes:
        return b"".join(
            [chunk async for chunk in self.iter_file(checkpoint_id, path, chunk_size=chunk_size)]
        )

    async def iter_file(
        self, checkpoint_id: str, path: str, *, chunk_size: int = 0
    ) -> AsyncIterator[bytes]:
        """A file of a checkpoint, chunk by chunk (``chunk_size`` 0: the daemon's 256 KiB)."""
        request = pb.ReadFileRequest(checkpoint_id=checkpoint_id, path=path, chunk_size=chunk_size)
        async for message in self._stream(self.stub.ReadFile, request):
            if message.data:
                yield message.data

    async def upload_artifact(
        self, name: str, mime_type: str, data: bytes | AsyncIterable[bytes]
    ) -> pb.Artifact:
        async def messages() -> AsyncIterator[pb.UploadArtifactRequest]:
            yield pb.UploadArtifactRequest(
                metadata=pb.UploadArtifactMetadata(name=name, mime_type=mime_type)
            )
            if isinstance(data, bytes):
                for start in range(0, len(data), UPLOAD_CHUNK):
                    yield pb.UploadArtifactRequest(chunk=data[start : start + UPLOAD_CHUNK])
            else:
                async for chunk in data:
                    yield pb.UploadArtifactRequest(chunk=chunk)

        try:
            response = await self.stub.UploadArtifact(messages(), **self._kw())
        except grpc.aio.AioRpcError as error:
            raise rpc_error(error) from None
        return response.artifact

    async def read_artifact(self, blob_key: str) -> bytes:
        parts = []
        async for message in self._stream(
            self.stub.ReadArtifact, pb.ReadArtifactRequest(blob_key=blob_key)
        ):
            parts.append(message.data)
        return b"".join(parts)

    # ---------------------------------------------------------------- writing

    async def fork(
        self, source_thread_id: str, source_checkpoint_id: str, destination_thread_id: str
    ) -> pb.CheckpointSummary:
        response = await self._unary(
            self.stub.Fork,
            pb.ForkRequest(
                source_thread_id=source_thread_id,
                source_checkpoint_id=source_checkpoint_id,
                destination_thread_id=destination_thread_id,
            ),
        )
        return response.checkpoint

    async def delete_head(self, thread_id: str, checkpoint_id: str) -> str | None:
        response = await self._unary(
            self.stub.DeleteHead,
            pb.DeleteHeadRequest(thread_id=thread_id, checkpoint_id=checkpoint_id),
        )
        return response.head_checkpoint_id if response.HasField("head_checkpoint_id") else None

    async def prune(self, thread_id: str, keep: int, *, dry_run: bool = False) -> list[str]:
        """The deleted ids (at most the first 10,000; ``prune_response`` has the count)."""
        response = await self.prune_response(thread_id, keep, dry_run=dry_run)
        return list(response.deleted_checkpoint_ids)

    async def prune_response(
        self, thread_id: str, keep: int, *, dry_run: bool = False
    ) -> pb.PruneResponse:
        return await self._unary(  # type: ignore[no-any-return]
            self.stub.Prune, pb.PruneRequest(thread_id=thread_id, keep=keep, dry_run=dry_run)
        )

    async def sweep(
        self,
        older_than_ms: int | None = None,
        *,
        dry_run: bool = False,
        repack_below_percent: int | None = None,
        on_batch: Callable[[pb.SweepBlobsBatch], None] | None = None,
    ) -> pb.SweepBlobsSummary:
        """Sweep (``older_than_ms`` None: the server default; ``repack_below_percent``
        None: 50); ``on_batch`` sees every batch of keys as it arrives. Returns the
        summary. A sweep that fails part-way raises RpcError after ``on_batch`` saw
        every key it deleted (``metadata["deleted_count"]`` says how many)."""
        request = pb.SweepBlobsRequest(dry_run=dry_run)
        if older_than_ms is not None:
            request.older_than_ms = older_than_ms
        if repack_below_percent is not None:
            request.repack_below_percent = repack_below_percent

        def on_event(event: pb.SweepBlobsEvent) -> None:
            if on_batch is not None and event.HasField("batch"):
                on_batch(event.batch)

        summary: pb.SweepBlobsSummary = await self._until_final(
            self.stub.SweepBlobs, request, "summary", on_event
        )
        return summary

    async def check(
        self,
        *,
        read_data: bool = False,
        repair: bool = False,
        on_event: Callable[[pb.CheckEvent], None] | None = None,
    ) -> pb.CheckSummary:
        """``checkpointd check``; ``on_event`` sees every finding and progress
        event as it arrives. Returns the summary."""
        request = pb.CheckRequest(read_data=read_data, repair=repair)

        def on_finding(event: pb.CheckEvent) -> None:
            if on_event is not None and not event.HasField("summary"):
                on_event(event)

        summary: pb.CheckSummary = await self._until_final(
            self.stub.Check, request, "summary", on_finding
        )
        return summary

    async def server_info(self) -> pb.GetServerInfoResponse:
        return await self._unary(self.stub.GetServerInfo, pb.GetServerInfoRequest())

    # ---------------------------------------------------------------- health

    async def health(self, service: str = "") -> str:
        """The health status name (SERVING, NOT_SERVING...)."""
        response = await self._unary(
            self.health_stub.Check, health_pb2.HealthCheckRequest(service=service)
        )
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)

    async def wait_serving(self, *, within: float) -> None:
        """Poll health until SERVING. Raises TimeoutError after ``within`` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while True:
            try:
                if await self.health() == "SERVING":
                    return
            except RpcError as error:
                if error.code == grpc.StatusCode.UNAUTHENTICATED:
                    raise
            if loop.time() >= deadline:
                raise TimeoutError(f"daemon at {self.address} not SERVING after {within}s")
            await asyncio.sleep(0.05)
