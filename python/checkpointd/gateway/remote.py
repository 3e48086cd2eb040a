"""The sidecar's side of gateway mode: a CheckpointStore and a BlobStore over gRPC.

``GatewayConnection`` holds one channel per gateway address and the token file;
``RemoteCheckpointStore`` and ``RemoteBlobStore`` turn each protocol method into
one Gateway call. They check their arguments with the stores' own validators
first (so a bad id or writer fails the same way, and in the same order, as on a
local store, and never reaches the wire), and rebuild the store's exception
from the status the gateway returns (``wire.error_from_rpc``).

Several gateways: the connection sends each call to the current gateway; when
that one cannot be reached (connection refused or reset, or it is draining) it
moves to the next. Calls that are safe to repeat (reads, lease renew/release,
pins, content-addressed uploads of bytes) are repeated on the next gateway at
once, and so is any call that had no effect: one a draining gateway refused, or
one that never left (no connection could be made: ``wire.never_sent``). The
others (append, acquire, delete, fork), lost after they went out, raise
STORE_UNAVAILABLE and the caller retries: a capture retried with the same
``request_id`` finds the checkpoint the first attempt may have stored, so
nothing is lost or duplicated.

The token is read from its file on every call whose file changed since the last
read (the orchestrator may rotate it in place).

Packs: against a gateway whose store keeps a pack index (``GetStoreInfo.packs``)
``RemoteCheckpointStore.open`` gives a ``PackedRemoteCheckpointStore``, so the
engines pack small blobs as with a local store (``blobs/packs.py``): packs are
uploaded like blobs (the gateway checks each whole), the append carries the
rows, ``locate_blobs`` is ``LocateBlobs`` and ``RemoteBlobStore.read_pack_frames``
the ranged read, frame by frame (``gateway/packs.py`` has the gateway's rules).
"""

from __future__ import annotations

import asyncio
import builtins
import os
import urllib.error
import urllib.request
from collections.abc import AsyncIterable, AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import grpc
from google.protobuf.message import Message

from ..blobs.base import BlobCorruptError, BlobInfo, BlobNotFoundError, BlobStore, BlobStoreError
from ..codec import decode_checkpoint, encode_checkpoint
from ..errors import (
    INVALID_BLOB,
    STORE_UNAVAILABLE,
    SandboxCheckpointError,
    SandboxCheckpointInvalidArgumentError,
)
from ..manifest import split_digests
from ..model import BlobReference, Checkpoint, WriterLease, WriterLike
from ..service import status
from ..service.auth import bearer_metadata
from ..store._options import (
    audit_keys,
    check_fork_arguments,
    check_hold_ms,
    check_keep,
    check_pin_keys,
    check_thread_page,
    condemnable_keys,
    lease_holder,
)
from ..store._packindex import PackedRows, file_key, index_rows
from ..store.base import DEFAULT_THREAD_PAGE, BlobCount, IndexRow, PackedBlob, ThreadSummary
from ..v1 import gateway_pb2 as gpb
from ..v1 import gateway_pb2_grpc as gpb_grpc
from ..validation import check_checkpoint_body, check_checkpoint_ids, check_id
from . import wire

SCHEMES = ("grpcs", "grpc")
# Presigned reads: how long one may take, how many run at once.
PRESIGNED_TIMEOUT_S = 300.0
PRESIGNED_CONCURRENCY = 16


class TokenFile:
    """The token in a file, read again whenever the file changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._token = ""
        self.read()

    def read(self) -> str:
        try:
            info = os.stat(self.path)
            stamp = (info.st_mtime_ns, info.st_size)
            if stamp != self._stamp:
                token = self.path.read_text(encoding="ascii").strip()
                if not token:
                    raise SandboxCheckpointInvalidArgumentError(
                        f"the gateway token file {self.path} is empty",
                        details={"path": str(self.path)},
                    )
                self._token, self._stamp = token, stamp
        except (OSError, UnicodeDecodeError) as exc:
            if self._token:
                return self._token  # keep the last good token while the file is replaced
            raise SandboxCheckpointInvalidArgumentError(
                f"cannot read the gateway token file {self.path}: {exc}",
                details={"path": str(self.path)},
            ) from None
        return self._token


def parse_gateway_url(url: str) -> tuple[list[str], bool]:
    """(``host:port`` addresses, TLS?) from ``grpcs://h:p[,h2:p2]`` or ``grpc://…``
    (also ``checkpointd+gateway://…``, which is TLS unless ``?tls=false``)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "checkpointd+gateway":
        tls = parse_qs(parts.query).get("tls", ["true"])[-1].lower() not in ("0", "false", "no")
    elif scheme in SCHEMES:
        tls = scheme == "grpcs"
    else:
        raise SandboxCheckpointInvalidArgumentError(
            f"not a gateway URL: {url!r} (use grpcs://host:port[,host:port…])"
        )
    addresses = [a.strip() for a in parts.netloc.split(",") if a.strip()]
    if not addresses or any(":" not in a for a in addresses) or parts.path not in ("", "/"):
        raise SandboxCheckpointInvalidArgumentError(
            f"gateway URL {url!r} must list host:port addresses (grpcs://host:port[,host:port…])"
        )
    return addresses, tls


class GatewayConnection:
    """Channels to one or more gateways and the token sent on every call."""

    def __init__(
        self,
        addresses: Sequence[str],
        token: Callable[[], str],
        *,
        tls: bool = True,
        root_certificates: bytes | None = None,
        client_certificate: tuple[bytes, bytes] | None = None,  # (key, chain): mutual TLS
        server_name: str | None = None,
    ) -> None:
        if not addresses:
            raise SandboxCheckpointInvalidArgumentError("no gateway address")
        self.addresses = list(addresses)
        self._token = token
        options: list[tuple[str, Any]] = list(wire.CHANNEL_OPTIONS)
        if server_name:
            options.append(("grpc.ssl_target_name_override", server_name))
        self._channels: list[grpc.aio.Channel] = []
        for address in self.addresses:
            if tls:
                key, chain = client_certificate or (None, None)
                credentials = grpc.ssl_channel_credentials(root_certificates, key, chain)
                channel = grpc.aio.secure_channel(address, credentials, options=options)
            else:
                channel = grpc.aio.insecure_channel(address, options=options)
            self._channels.append(channel)
        self._stubs = [gpb_grpc.GatewayStub(channel) for channel in self._channels]
        self._current = 0

    @property
    def url(self) -> str:
        return "checkpointd+gateway://" + ",".join(self.addresses)

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        return bearer_metadata(self._token())

    def _failed(self, index: int, error: grpc.aio.AioRpcError) -> Exception:
        exc = wire.error_from_rpc(error, where=self.addresses[index])
        reason = getattr(exc, "code", None)
        if wire.is_unreachable(exc) or reason == status.DRAINING:
            # Next call goes to the next gateway (unless another call moved on already).
            if self._current == index:
                self._current = (index + 1) % len(self._stubs)
            exc.failover = True  # type: ignore[attr-defined]
            # A draining gateway refused the call before doing anything, or the
            # call never left: any call may be repeated elsewhere.
            exc.refused = reason == status.DRAINING or wire.never_sent(error)  # type: ignore[attr-defined]
        return exc

    async def call(self, method: str, request: Any, *, repeatable: bool) -> Any:
        """One unary (or stream-unary: ``request`` is then a factory of the
        request iterator) call; repeated on the next gateway when this one is
        unreachable and ``repeatable``."""
        # A request stream made once cannot be sent again (a factory can).
        rebuildable = callable(request) or isinstance(request, Message)
        for attempt in range(len(self._stubs)):
            index = self._current
            stub = getattr(self._stubs[index], method)
            body = request() if callable(request) else request
            try:
                return await stub(body, metadata=self._metadata())
            except grpc.aio.AioRpcError as error:
                exc = self._failed(index, error)
                again = getattr(exc, "failover", False) and (
                    repeatable or (rebuildable and getattr(exc, "refused", False))
                )
                if not again or attempt == len(self._stubs) - 1:
                    raise exc from None
        raise AssertionError("unreachable")

    async def stream(self, method: str, request: Any, *, repeatable: bool = True) -> list[Any]:
        """A server-streaming call's messages, all of them."""
        for attempt in range(len(self._stubs)):
            index = self._current
            stub = getattr(self._stubs[index], method)
            try:
                return [message async for message in stub(request, metadata=self._metadata())]
            except grpc.aio.AioRpcError as error:
                exc = self._failed(index, error)
                again = getattr(exc, "failover", False) and (
                    repeatable or getattr(exc, "refused", False)
                )
                if not again or attempt == len(self._stubs) - 1:
                    raise exc from None
        raise AssertionError("unreachable")

    async def stream_iter(self, method: str, request: Any) -> AsyncIterator[Any]:
        """A server-streaming call's messages as they come (moves to the next
        gateway only before the first one)."""
        for attempt in range(len(self._stubs)):
            index = self._current
            call = getattr(self._stubs[index], method)(request, metadata=self._metadata())
            started = False
            try:
                async for message in call:
                    started = True
                    yield message
                return
            except grpc.aio.AioRpcError as error:
                exc = self._failed(index, error)
                if (
                    started
                    or not getattr(exc, "failover", False)
                    or attempt == len(self._stubs) - 1
                ):
                    raise exc from None

    async def aclose(self) -> None:
        for channel in self._channels:
            await channel.close()


def connection_from_options(
    url: str,
    token_file: Path,
    *,
    ca_file: Path | None = None,
    cert_file: Path | None = None,
    key_file: Path | None = None,
    server_name: str | None = None,
) -> GatewayConnection:
    """A connection from the CLI's / URL's options (files read now)."""
    addresses, tls = parse_gateway_url(url)

    def read(path: Path | None, what: str) -> bytes | None:
        if path is None:
            return None
        try:
            return path.read_bytes()
        except OSError as exc:
            raise SandboxCheckpointInvalidArgumentError(
                f"cannot read the {what} {path}: {exc.strerror}", details={"path": str(path)}
            ) from None

    client = None
    if cert_file is not None or key_file is not None:
        if cert_file is None or key_file is None:
            raise SandboxCheckpointInvalidArgumentError(
                "a gateway client certificate needs both --gateway-cert and --gateway-key"
            )
        client = (read(key_file, "gateway client key"), read(cert_file, "gateway client cert"))
    tokens = TokenFile(token_file)
    return GatewayConnection(
        addresses,
        tokens.read,
        tls=tls,
        root_certificates=read(ca_file, "gateway CA"),
        client_certificate=client,  # type: ignore[arg-type]
        server_name=server_name,
    )


def _writer(writer: object) -> gpb.GatewayWriter:
    return wire.writer_to_proto(writer)


class RemoteCheckpointStore:
    """A CheckpointStore (and BlobGuard, BlobAudit) served by gateways."""

    def __init__(
        self,
        connection: GatewayConnection,
        *,
        lease_duration_ms: int = 0,
        renew_after_ms: int = 0,
        owns_connection: bool = True,
    ) -> None:
        self._connection = connection
        self.lease_duration_ms = lease_duration_ms
        self.renew_after_ms = renew_after_ms
        self._owns = owns_connection
        self.store_backend = ""

    @classmethod
    async def open(
        cls, connection: GatewayConnection, *, owns_connection: bool = True
    ) -> RemoteCheckpointStore:
        """Ask a gateway for the store's settings (checks the token too). A
        gateway whose store keeps a pack index gives a ``PackedRemoteCheckpointStore``
        (the sidecar then packs its small blobs); an older gateway, this class."""
        info = await connection.call("GetStoreInfo", gpb.GatewayStoreInfoRequest(), repeatable=True)
        kind = PackedRemoteCheckpointStore if info.packs and cls is RemoteCheckpointStore else cls
        store = kind(connection, owns_connection=owns_connection)
        store.lease_duration_ms = info.lease_duration_ms
        store.renew_after_ms = info.renew_after_ms
        store.store_backend = info.store_backend
        return store

    @property
    def url(self) -> str:
        return self._connection.url

    async def __aenter__(self) -> RemoteCheckpointStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._owns:
            await self._connection.aclose()

    # ------------------------------------------------------------ SPEC §3

    async def get(self, checkpoint_id: str) -> Checkpoint | None:
        check_id(checkpoint_id, "checkpoint id")
        reply = await self._connection.call(
            "Get", gpb.GatewayGetRequest(checkpoint_id=checkpoint_id), repeatable=True
        )
        return decode_checkpoint(reply.document) if reply.found else None

    async def list(self, thread_id: str) -> builtins.list[Checkpoint]:
        check_id(thread_id, "thread id")
        replies = await self._connection.stream(
            "List", gpb.GatewayThreadRequest(thread_id=thread_id)
        )
        return [decode_checkpoint(reply.document) for reply in replies]

    async def get_head(self, thread_id: str) -> str | None:
        check_id(thread_id, "thread id")
        reply = await self._connection.call(
            "GetHead", gpb.GatewayThreadRequest(thread_id=thread_id), repeatable=True
        )
        return reply.checkpoint_id if reply.HasField("checkpoint_id") else None

    async def append(
        self,
        checkpoint: Checkpoint,
        expected_head_id: str | None,
        writer: WriterLike,
        *,
        packed_blobs: Sequence[PackedBlob] = (),
    ) -> str:
        """``packed_blobs``: the pack index rows of the capture's packs, which
        the gateway matches against each pack's trailer (``gateway/packs.py``)."""
        check_checkpoint_ids(checkpoint, expected_head_id)
        check_checkpoint_body(checkpoint)
        request = gpb.GatewayAppendRequest(
            document=encode_checkpoint(checkpoint),
            expected_head_id=expected_head_id,
            writer=_writer(writer),
            packed_blobs=wire.rows_to_proto(packed_blobs) if packed_blobs else (),
        )
        try:
            reply = await self._connection.call("Append", request, repeatable=False)
        except SandboxCheckpointError as error:
            if not packed_blobs or "unpinned" not in error.details:
                raise
            # This gateway did not see our pack pins (another took them): it
            # refused before writing anything. Pin the packs through it, once more.
            groups = packed_blobs.groups if isinstance(packed_blobs, PackedRows) else packed_blobs
            packs = list(dict.fromkeys(group.pack for group in groups))
            if await self.pin_blobs(packs, writer):
                raise
            reply = await self._connection.call("Append", request, repeatable=False)
        return str(reply.checkpoint_id)

    async def delete_head(self, thread_id: str, checkpoint_id: str, writer: WriterLike) -> None:
        check_id(thread_id, "thread id")
        check_id(checkpoint_id, "checkpoint id")
        request = gpb.GatewayDeleteHeadRequest(
            thread_id=thread_id, checkpoint_id=checkpoint_id, writer=_writer(writer)
        )
        await self._connection.call("DeleteHead", request, repeatable=False)

    async def acquire_writer(self, thread_id: str, *, owner: str | None = None) -> WriterLease:
        check_id(thread_id, "thread id")
        lease_holder(owner)  # InvalidArgument for a bad owner, as the stores say
        request = gpb.GatewayAcquireWriterRequest(thread_id=thread_id, owner=owner)
        reply = await self._connection.call("AcquireWriter", request, repeatable=False)
        return WriterLease(
            thread_id=reply.writer.thread_id,
            owner_token=reply.writer.owner_token,
            fence=reply.writer.fence,
            expires_at=reply.expires_at,
            renew_after_ms=reply.renew_after_ms,
            renew=self._renew,
            release=self._release,
        )

    async def _renew(self, lease: WriterLease) -> int:
        reply = await self._connection.call("RenewWriter", _writer(lease), repeatable=True)
        return int(reply.expires_at)

    async def _release(self, lease: WriterLease) -> None:
        await self._connection.call("ReleaseWriter", _writer(lease), repeatable=True)

    async def list_blob_references(self) -> builtins.list[BlobReference]:
        replies = await self._connection.stream("ListBlobReferences", gpb.GatewayEmpty())
        return [
            BlobReference(ref.key, ref.references) for reply in replies for ref in reply.references
        ]

    async def delete_checkpoints(
        self, thread_id: str, keep: int, writer: WriterLike
    ) -> builtins.list[str]:
        check_id(thread_id, "thread id")
        check_keep(keep)
        request = gpb.GatewayDeleteCheckpointsRequest(
            thread_id=thread_id, keep=keep, writer=_writer(writer)
        )
        reply = await self._connection.call("DeleteCheckpoints", request, repeatable=False)
        return list(reply.checkpoint_ids)

    async def fork_from_checkpoint(
        self,
        source_thread_id: str,
        source_checkpoint_id: str,
        destination_thread_id: str,
        destination_checkpoint_id: str,
        created_at: int,
        writer: WriterLike,
    ) -> Checkpoint:
        check_fork_arguments(
            source_thread_id,
            source_checkpoint_id,
            destination_thread_id,
            destination_checkpoint_id,
            created_at,
        )
        request = gpb.GatewayForkRequest(
            source_thread_id=source_thread_id,
            source_checkpoint_id=source_checkpoint_id,
            destination_thread_id=destination_thread_id,
            destination_checkpoint_id=destination_checkpoint_id,
            created_at=created_at,
            writer=_writer(writer),
        )
        reply = await self._connection.call("ForkFromCheckpoint", request, repeatable=False)
        return decode_checkpoint(reply.document)

    async def list_threads(
        self, *, after: str | None = None, limit: int = DEFAULT_THREAD_PAGE
    ) -> builtins.list[ThreadSummary]:
        after, limit = check_thread_page(after, limit)
        request = gpb.GatewayListThreadsRequest(after=after, limit=limit)
        reply = await self._connection.call("ListThreads", request, repeatable=True)
        return [
            ThreadSummary(
                thread_id=t.thread_id,
                head_checkpoint_id=t.head_checkpoint_id
                if t.HasField("head_checkpoint_id")
                else None,
                checkpoint_count=t.checkpoint_count,
                newest_created_at=int(t.newest_created_at)
                if float(t.newest_created_at).is_integer()
                else t.newest_created_at,
            )
            for t in reply.threads
        ]

    async def spent_checkpoint_ids(self, checkpoint_ids: builtins.list[str]) -> builtins.list[str]:
        """The given ids that are spent (``store.base.SpentCheckpointIds``), asked
        of the gateway's store, so a request_id deleted by any path (the daemon,
        another sidecar, the Python API on the store) is refused here too."""
        wanted = [i for i in dict.fromkeys(checkpoint_ids) if isinstance(i, str)]
        if not wanted:
            return []
        request = gpb.GatewayCheckpointIds(checkpoint_ids=wanted)
        reply = await self._connection.call("SpentCheckpointIds", request, repeatable=True)
        return list(reply.checkpoint_ids)

    # ------------------------------------------------------------ BlobGuard

    async def pin_blobs(self, keys: builtins.list[str], writer: WriterLike) -> builtins.list[str]:
        message = _writer(writer)
        try:
            check_pin_keys(keys)
        except SandboxCheckpointError:
            # The stores check the writer first: ask with no keys, then refuse the keys.
            await self._connection.call(
                "PinBlobs", gpb.GatewayPinRequest(writer=message), repeatable=True
            )
            raise
        request = gpb.GatewayPinRequest(keys=list(keys), writer=message)
        reply = await self._connection.call("PinBlobs", request, repeatable=True)
        return list(reply.keys)

    async def condemn_blobs(self, keys: builtins.list[str], hold_ms: int) -> builtins.list[str]:
        hold = check_hold_ms(hold_ms)
        request = gpb.GatewayCondemnRequest(keys=condemnable_keys(keys), hold_ms=hold)
        reply = await self._connection.call("CondemnBlobs", request, repeatable=False)
        return list(reply.keys)

    async def release_condemned(self, keys: builtins.list[str]) -> None:
        request = gpb.GatewayKeys(keys=condemnable_keys(keys))
        await self._connection.call("ReleaseCondemned", request, repeatable=True)

    # ------------------------------------------------------------ BlobAudit

    @staticmethod
    def _counts(replies: builtins.list[Any]) -> builtins.list[BlobCount]:
        return [
            BlobCount(
                key=c.key,
                stored=c.stored,
                manifests=c.manifests,
                size=c.size if c.HasField("size") else None,
            )
            for reply in replies
            for c in reply.counts
        ]

    async def audit_blob_references(self, *, with_sizes: bool = False) -> builtins.list[BlobCount]:
        replies = await self._connection.stream(
            "AuditBlobReferences", gpb.GatewayAuditRequest(with_sizes=bool(with_sizes))
        )
        return self._counts(replies)

    async def repair_blob_references(self) -> builtins.list[BlobCount]:
        replies = await self._connection.stream(
            "RepairBlobReferences", gpb.GatewayEmpty(), repeatable=False
        )
        return self._counts(replies)

    async def mark_blobs_missing(self, keys: builtins.list[str]) -> None:
        request = gpb.GatewayKeys(keys=audit_keys(keys))
        await self._connection.call("MarkBlobsMissing", request, repeatable=True)

    async def clear_missing_blobs(self, keys: builtins.list[str]) -> None:
        wanted = audit_keys(keys)
        if wanted:
            await self._connection.call(
                "ClearMissingBlobs", gpb.GatewayKeys(keys=wanted), repeatable=True
            )

    async def list_missing_blobs(self) -> builtins.list[str]:
        reply = await self._connection.call("ListMissingBlobs", gpb.GatewayEmpty(), repeatable=True)
        return list(reply.keys)


class PackedRemoteCheckpointStore(RemoteCheckpointStore):
    """A remote store whose gateway keeps a pack index (``store.base.PackIndex``):
    a sidecar's small blobs travel and rest in packs. The gateway answers only
    for keys the token may read or pinned through it (others are left out, so a
    capture uploads them again)."""

    async def locate_blobs(self, keys: builtins.list[str]) -> dict[str, PackedBlob | None]:
        wanted = [key for key in dict.fromkeys(keys) if isinstance(key, str)]
        if not wanted:
            return {}
        reply = await self._connection.call(
            "LocateBlobs", gpb.GatewayKeys(keys=wanted), repeatable=True
        )
        return wire.located_from_proto(reply)

    async def locate_rows(self, digests: bytes) -> builtins.list[IndexRow]:
        return index_rows(await self.locate_blobs([file_key(d) for d in split_digests(digests)]))

    async def list_packed_blobs(
        self, *, after: str | None = None, limit: int = 1000
    ) -> builtins.list[PackedBlob]:
        request = gpb.GatewayListPackedRequest(after=after, limit=limit)
        reply = await self._connection.call("ListPackedBlobs", request, repeatable=True)
        rows = wire.located_from_proto(reply)
        return sorted((row for row in rows.values() if row is not None), key=lambda r: r.key)


def _blob_error(exc: Exception, key: str, url: str) -> Exception:
    """Bucket failures as the blob protocol says them (BlobStoreError naming the
    key); token and scope refusals stay what they are."""
    if isinstance(exc, SandboxCheckpointError) and exc.code == STORE_UNAVAILABLE:
        return BlobStoreError(f"blob '{key}' on {url} failed: {exc.message}")
    return exc


class RemoteBlobStore(BlobStore):
    """The bucket behind the gateways.

    Reads use presigned GET URLs the gateway signs (S3, GCS, Azure) so the bytes
    come straight from the bucket; a gateway whose bucket cannot sign says so
    once and the reads stream through it from then on (``presigned_reads=False``
    streams from the start). Uploads always stream through the gateway, which
    checks each blob's BLAKE3 digest against its key before storing it.
    """

    def __init__(self, connection: GatewayConnection, *, presigned_reads: bool = True) -> None:
        self._connection = connection
        self.url = connection.url
        self._presign = presigned_reads

    async def _signed(self, keys: Sequence[str]) -> builtins.list[str] | None:
        """Presigned URLs for ``keys`` (the gateway checked the token may read
        them), or None when reads must stream through the gateway."""
        if not self._presign:
            return None
        try:
            reply = await self._connection.call(
                "BlobSignGet", gpb.GatewayBlobSignRequest(keys=list(keys)), repeatable=True
            )
        except Exception as exc:  # noqa: BLE001
            raise _blob_error(exc, keys[0], self.url) from None
        if not reply.supported:
            self._presign = False
            return None
        return list(reply.urls)

    @staticmethod
    def _open_url(key: str, url: str) -> Any:
        try:
            return urllib.request.urlopen(url, timeout=PRESIGNED_TIMEOUT_S)  # noqa: S310 - the gateway's URL
        except urllib.error.HTTPError as error:
            if error.code == 404:
                raise BlobNotFoundError(key) from None
            raise BlobStoreError(
                f"get {key!r} from the bucket (presigned URL) failed: HTTP {error.code}"
            ) from None
        except OSError as error:
            raise BlobStoreError(
                f"get {key!r} from the bucket (presigned URL) failed: {error}"
            ) from None

    async def _fetch(self, key: str, url: str) -> bytes:
        def run() -> bytes:
            with self._open_url(key, url) as response:
                return bytes(response.read())

        return await asyncio.to_thread(run)

    async def put(
        self, key: str, data: bytes | AsyncIterable[bytes], *, if_absent: bool = True
    ) -> bool:
        chunk = wire.BLOB_CHUNK_BYTES
        try:
            if isinstance(data, (bytes, bytearray, memoryview)):
                body = bytes(data)

                def requests() -> Any:
                    return iter(
                        [
                            gpb.GatewayBlobChunk(
                                key=key,
                                if_absent=if_absent,
                                data=body[start : start + chunk],
                                last=start + chunk >= len(body),
                            )
                            for start in range(0, max(len(body), 1), chunk)
                        ]
                    )

                reply = await self._connection.call("BlobPut", requests, repeatable=True)
            else:

                async def stream() -> AsyncIterator[gpb.GatewayBlobChunk]:
                    yield gpb.GatewayBlobChunk(key=key, if_absent=if_absent)
                    async for part in data:
                        yield gpb.GatewayBlobChunk(key=key, data=bytes(part))
                    yield gpb.GatewayBlobChunk(key=key, last=True)

                reply = await self._connection.call("BlobPut", stream(), repeatable=False)
        except Exception as exc:  # noqa: BLE001 - re-raised as the protocol's error
            raise _blob_error(exc, key, self.url) from None
        return bool(reply.written)

    async def get(self, key: str) -> bytes:
        urls = await self._signed([key])
        if urls is not None:
            return await self._fetch(key, urls[0])
        return b"".join([chunk async for chunk in self.get_stream(key)])

    async def get_stream(self, key: str, chunk_size: int = 1 << 20) -> AsyncIterator[bytes]:
        urls = await self._signed([key])
        if urls is not None:
            response = await asyncio.to_thread(self._open_url, key, urls[0])
            try:
                while chunk := await asyncio.to_thread(response.read, chunk_size):
                    yield bytes(chunk)
            except OSError as error:
                raise BlobStoreError(f"get {key!r} from the bucket failed: {error}") from None
            finally:
                response.close()
            return
        request = gpb.GatewayBlobGetRequest(key=key, chunk_size=chunk_size)
        try:
            async for message in self._connection.stream_iter("BlobGet", request):
                yield message.data
        except BlobNotFoundError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise _blob_error(exc, key, self.url) from None

    async def head(self, key: str) -> BlobInfo | None:
        try:
            reply = await self._connection.call(
                "BlobHead", gpb.GatewayBlobKey(key=key), repeatable=True
            )
        except Exception as exc:  # noqa: BLE001
            raise _blob_error(exc, key, self.url) from None
        if not reply.found:
            return None
        return BlobInfo(reply.key, reply.size, reply.last_modified_ms)

    async def list(self, prefix: str) -> builtins.list[BlobInfo]:
        return [info async for page in self.list_pages(prefix) for info in page]

    async def list_pages(self, prefix: str) -> AsyncIterator[builtins.list[BlobInfo]]:
        request = gpb.GatewayBlobListRequest(prefix=prefix)
        try:
            async for message in self._connection.stream_iter("BlobList", request):
                yield [BlobInfo(b.key, b.size, b.last_modified_ms) for b in message.blobs]
        except Exception as exc:  # noqa: BLE001
            raise _blob_error(exc, prefix, self.url) from None

    async def delete(self, key: str) -> None:
        try:
            await self._connection.call("BlobDelete", gpb.GatewayBlobKey(key=key), repeatable=True)
        except Exception as exc:  # noqa: BLE001
            raise _blob_error(exc, key, self.url) from None

    async def put_many(self, items: Sequence[tuple[str, bytes]]) -> builtins.list[bool]:
        if not items:
            return []
        chunk = wire.BLOB_CHUNK_BYTES

        def requests() -> Any:
            for key, data in items:
                body = bytes(data)
                for start in range(0, max(len(body), 1), chunk):
                    yield gpb.GatewayBlobChunk(
                        key=key, data=body[start : start + chunk], last=start + chunk >= len(body)
                    )

        try:
            reply = await self._connection.call("BlobPutMany", requests, repeatable=True)
        except Exception as exc:  # noqa: BLE001
            raise _blob_error(exc, items[0][0], self.url) from None
        return list(reply.written)

    async def read_pack_frames(
        self, pack: str, start: int, end: int, rows: Sequence[PackedBlob], chunk_size: int = 1 << 20
    ) -> AsyncIterator[bytes]:
        """The bytes ``[start, end)`` of ``pack`` as a ranged read gives them,
        but holding only ``rows``' frames: the gateway sends exactly those
        (as stored), never a neighbour's, and the bytes between them are zeros
        here (``blobs/packs.py`` decodes only the frames). Raises
        BlobNotFoundError (``pack`` set) when the pack is gone or a row moved,
        BlobCorruptError for a frame that does not check, BlobStoreError."""
        [request] = wire.rows_to_proto([row for row in rows if row.pack == pack]) or [
            gpb.GatewayPackRows(pack=pack)
        ]
        position = start
        try:
            async for message in self._connection.stream_iter("ReadPackFrames", request):
                offset, data = message.offset, message.data
                if offset < position or offset + len(data) > end:
                    raise BlobStoreError(
                        f"the gateway sent bytes {offset}..{offset + len(data)} of {pack!r},"
                        f" not of {start}..{end} in order"
                    )
                while position < offset:
                    gap = min(offset - position, chunk_size)
                    yield bytes(gap)
                    position += gap
                yield data
                position += len(data)
        except BlobNotFoundError as error:
            error.pack = pack  # type: ignore[attr-defined]
            raise
        except SandboxCheckpointError as error:
            if error.code == INVALID_BLOB and "key" in error.details:
                raise BlobCorruptError(
                    str(error.details["key"]), str(error.details.get("pack", pack)), error.message
                ) from None
            raise _blob_error(error, pack, self.url) from None

    async def missing(self, keys: Sequence[str]) -> builtins.list[str]:
        if not keys:
            return []
        try:
            reply = await self._connection.call(
                "BlobMissing", gpb.GatewayKeys(keys=list(keys)), repeatable=True
            )
        except Exception as exc:  # noqa: BLE001
            raise _blob_error(exc, keys[0], self.url) from None
        return list(reply.keys)

    async def get_many(self, keys: Sequence[str]) -> builtins.list[bytes]:
        if not keys:
            return []
        urls = await self._signed(keys)
        if urls is not None:
            slots = asyncio.Semaphore(PRESIGNED_CONCURRENCY)

            async def one(key: str, url: str) -> bytes:
                async with slots:
                    return await self._fetch(key, url)

            return list(await asyncio.gather(*map(one, keys, urls)))
        parts: list[list[bytes]] = [[] for _ in keys]
        try:
            replies = await self._connection.stream("BlobGetMany", gpb.GatewayKeys(keys=list(keys)))
        except BlobNotFoundError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise _blob_error(exc, keys[0], self.url) from None
        for message in replies:
            parts[message.index].append(message.data)
        return [b"".join(chunks) for chunks in parts]


async def open_gateway_stores(config: Any) -> tuple[RemoteCheckpointStore, RemoteBlobStore]:
    """The sidecar's stores for ``serve --gateway`` (a ``ServeConfig``): one
    connection shared by both. Raises STORE_UNAVAILABLE when no gateway answers,
    UNAUTHENTICATED when the token is refused."""
    connection = connection_from_options(
        config.gateway,
        config.gateway_token_file,
        ca_file=config.gateway_ca,
        cert_file=config.gateway_cert,
        key_file=config.gateway_key,
        server_name=config.gateway_server_name,
    )
    try:
        store = await RemoteCheckpointStore.open(connection)
    except BaseException:
        await connection.aclose()
        raise
    return store, RemoteBlobStore(connection)


async def open_remote_store(url: str) -> RemoteCheckpointStore:
    """``open_store("checkpointd+gateway://h:p[,h2:p2]?token_file=/abs&ca_file=/abs")``."""
    query = parse_qs(urlsplit(url).query)

    def path(name: str) -> Path | None:
        values = query.get(name)
        return Path(values[-1]) if values else None

    token_file = path("token_file")
    if token_file is None:
        raise SandboxCheckpointInvalidArgumentError(
            f"a gateway store URL needs ?token_file=/path/to/token, got {url!r}"
        )
    connection = connection_from_options(url, token_file, ca_file=path("ca_file"))
    try:
        return await RemoteCheckpointStore.open(connection)
    except BaseException:
        await connection.aclose()
        raise
