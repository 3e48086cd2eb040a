"""The sidecar's side of gateway mode: a CheckpointStore and a BlobStore over gRPC.

``GatewayConnection`` (``connection.py``: several gateways, failover, the token
file) holds one channel per gateway address; ``RemoteCheckpointStore`` and
``RemoteBlobStore`` (``remote_blobs.py``) turn each protocol method into one
Gateway call. They check their arguments with the stores' own validators
first (so a bad id or writer fails the same way, and in the same order, as on a
local store, and never reaches the wire), and rebuild the store's exception
from the status the gateway returns (``wire.error_from_rpc``).

Packs: against a gateway whose store keeps a pack index (``GetStoreInfo.packs``)
``RemoteCheckpointStore.open`` gives a ``PackedRemoteCheckpointStore``, so the
engines pack small blobs as with a local store (``blobs/packs.py``): packs are
uploaded like blobs (the gateway checks each whole), the append carries the
rows, ``locate_blobs`` is ``LocateBlobs`` and ``RemoteBlobStore.read_pack_frames``
the ranged read, frame by frame (``gateway/packs.py`` has the gateway's rules).
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from ..codec import decode_checkpoint, encode_checkpoint
from ..errors import (
    SandboxCheckpointError,
    SandboxCheckpointInvalidArgumentError,
)
from ..manifest import split_digests
from ..model import BlobReference, Checkpoint, WriterLease, WriterLike
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
from ..validation import check_checkpoint_body, check_checkpoint_ids, check_id
from . import wire
from .connection import GatewayConnection, TokenFile, connection_from_options, parse_gateway_url
from .remote_blobs import RemoteBlobStore


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

    # ------------------------------------------------------------ docs/contract.md#checkpoint-store

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
            renew=self.renew_writer,
            release=self.release_writer,
        )

    async def renew_writer(self, lease: WriterLease) -> int:
        reply = await self._connection.call("RenewWriter", _writer(lease), repeatable=True)
        return int(reply.expires_at)

    async def release_writer(self, lease: WriterLease) -> None:
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


__all__ = [
    "GatewayConnection",
    "PackedRemoteCheckpointStore",
    "RemoteBlobStore",
    "RemoteCheckpointStore",
    "TokenFile",
    "connection_from_options",
    "open_gateway_stores",
    "open_remote_store",
    "parse_gateway_url",
]
