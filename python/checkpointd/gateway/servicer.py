"""The Gateway service: a checkpoint store and a bucket behind scoped tokens.

Every call's bearer token is verified on its headers, before its request is
read (``auth.py``); each handler checks the token's scope before touching the
store:

| calls | ops (any of) | threads |
|---|---|---|
| Get, List, GetHead | any op | the checkpoint's / the thread |
| AcquireWriter, RenewWriter, ReleaseWriter | capture, restore, fork, prune | the lease's |
| Append, PinBlobs | capture | the checkpoint's / the writer's |
| DeleteHead, DeleteCheckpoints | prune (DeleteCheckpoints of a stash: capture too) | the thread |
| ForkFromCheckpoint | fork | source and destination |
| SpentCheckpointIds | capture, admin | — (a deleted id names no thread) |
| ClearMissingBlobs, ListMissingBlobs | capture, admin | only keys the token may read |
| BlobHead, BlobMissing, BlobPut* | capture, admin (head, missing: any op) | — |
| BlobGet* | any op | the key must be referenced by a checkpoint of a granted thread |
| LocateBlobs | any op | only keys the token may read or pinned through this gateway |
| ReadPackFrames | any op | every frame's key readable as for BlobGet, each the key's current row |
| ListPackedBlobs | admin | — |
| ListBlobReferences, Condemn/ReleaseCondemned, Audit/Repair, MarkBlobsMissing, BlobList, BlobDelete | admin | — |

Blob reads: a key a checkpoint of the token's threads references, as the
gateway learns it (``access.py``). Blob writes: hashed (BLAKE3) and stored only
under their own key, in bounded memory (``uploads.py``). Packs: checked whole
before they are stored, an Append's rows only entries of such a pack's trailer
(``packs.py`` has the rules and why, ``pack_calls.py`` the calls).

Leases are renewed and released by their fields (thread, owner token, fence)
through the store's lease callbacks, so any gateway can renew a lease another
gateway handed out: all state lives in the store. A lease's owner is namespaced
by the token's subject, so two tokens never take over each other's leases.
"""

from __future__ import annotations

import asyncio
import datetime
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import obstore
from obstore.store import AzureStore, GCSStore, S3Store

from ..blobs import base as blob_base
from ..blobs.base import BlobNotFoundError, BlobStore
from ..codec import encode_checkpoint
from ..errors import SandboxCheckpointInvalidArgumentError
from ..model import Checkpoint, WriterLease, stash_owner
from ..service import status
from ..service.request_ids import SPENT_REQUEST_PREFIX
from ..store.base import (
    BlobCount,
    CheckpointStore,
    PackIndex,
    SpentCheckpointIds,
    ThreadSummary,
)
from ..v1 import gateway_pb2 as gpb
from ..v1 import gateway_pb2_grpc as gpb_grpc
from . import packs as pack_rules
from . import uploads, wire
from .access import ReadAccess
from .auth import Authenticator
from .pack_calls import PackCalls, located
from .tokens import TokenScope, TokenVerifier

T = TypeVar("T")

ANY_OP = ("capture", "restore", "list", "fork", "prune", "admin")
LEASE_OPS = ("capture", "restore", "fork", "prune")
UPLOAD_OPS = ("capture", "admin")
ADMIN = ("admin",)
# Threads read per store page when ListThreads filters to a token's threads.
THREAD_SCAN_PAGE = 500
# The bytes of request_ids.mark_spent's markers (the daemon's, not content-addressed).
SPENT_MARKER_BYTES = b"deleted\n"
# Presigned GET URLs: default and longest lifetime.
DEFAULT_SIGNED_URL_S = 300
MAX_SIGNED_URL_S = 3600


def _lease_callbacks(
    store: CheckpointStore,
) -> tuple[Callable[[Any], Awaitable[int]], Callable[[Any], Awaitable[None]]]:
    """The store's renew and release by writer fields (``renew_writer`` and
    ``release_writer``, the callbacks its WriterLease objects carry)."""
    renew = getattr(store, "renew_writer", None)
    release = getattr(store, "release_writer", None)
    if renew is None or release is None:
        raise SandboxCheckpointInvalidArgumentError(
            f"{type(store).__name__} cannot renew a lease by its fields "
            "(needs renew_writer/release_writer): it cannot back a gateway"
        )
    return renew, release


def _signing_store(blobs: BlobStore) -> Any:
    """The obstore store that can sign URLs behind ``blobs`` (S3, GCS, Azure), or None."""
    store = getattr(blobs, "object_store", None)
    return store if isinstance(store, (S3Store, GCSStore, AzureStore)) else None


@dataclass(frozen=True, slots=True)
class BackendNames:
    """What GetInfo says the gateway's store and bucket are ("postgresql", "s3"...)."""

    store: str = ""
    blobs: str = ""


class GatewayServicer(gpb_grpc.GatewayServicer):
    def __init__(
        self,
        store: CheckpointStore,
        blobs: BlobStore,
        verifier: TokenVerifier,
        *,
        backend_names: BackendNames = BackendNames(),
        observe: Callable[[str, grpc.StatusCode, float], None] | None = None,
        pack_limits: pack_rules.PackLimits | None = None,
    ) -> None:
        self.store = store
        self.blobs = blobs
        self.verifier = verifier
        self.store_backend = backend_names.store
        self.blob_backend = backend_names.blobs
        self._renew, self._release = _lease_callbacks(store)
        self.authenticator = Authenticator(verifier)
        self._pins = pack_rules.Pins()  # keys pinned through this gateway
        self._access = ReadAccess(store, self._pins)
        self._pack_calls = PackCalls(store, blobs, self._access, on_bytes_out=self._count_out)
        self.observe = observe
        self.draining = False
        # Blob bytes that crossed the gateway (streamed), for the metrics.
        self.bytes_in = 0
        self.bytes_out = 0
        self._receiver = uploads.Receiver(
            pack_limits or pack_rules.PackLimits(), on_bytes=self._count_in
        )

    def _count_in(self, nbytes: int) -> None:
        self.bytes_in += nbytes

    def _count_out(self, nbytes: int) -> None:
        self.bytes_out += nbytes

    # ------------------------------------------------------------ plumbing

    def _scope(self, context: grpc.aio.ServicerContext[Any, Any]) -> TokenScope:
        # Verified before the request was read (``auth.GatewayAuthInterceptor``):
        # the scope is in the authenticator's cache.
        return self.authenticator.scope(context.invocation_metadata())

    async def _unary(
        self,
        method: str,
        context: grpc.aio.ServicerContext[Any, Any],
        work: Callable[[TokenScope], Awaitable[T]],
    ) -> T:
        started = time.perf_counter()
        code = grpc.StatusCode.OK
        try:
            if self.draining:
                raise status.ServiceError(status.DRAINING, "the gateway is shutting down")
            return await work(self._scope(context))
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED
            raise
        except Exception as exc:  # noqa: BLE001 - every error leaves as a status
            # (classify logs an unexpected one with its traceback)
            code, message, trailers = wire.error_trailers(exc)
            await context.abort(code, message, trailing_metadata=trailers)
            raise  # unreachable: abort raises
        finally:
            if self.observe is not None:
                self.observe(method, code, time.perf_counter() - started)

    async def _stream(
        self,
        method: str,
        context: grpc.aio.ServicerContext[Any, Any],
        work: Callable[[TokenScope], AsyncIterator[T]],
    ) -> AsyncIterator[T]:
        started = time.perf_counter()
        code = grpc.StatusCode.OK
        try:
            if self.draining:
                raise status.ServiceError(status.DRAINING, "the gateway is shutting down")
            async for item in work(self._scope(context)):
                yield item
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED
            raise
        except Exception as exc:  # noqa: BLE001 - every error leaves as a status
            code, message, trailers = wire.error_trailers(exc)
            await context.abort(code, message, trailing_metadata=trailers)
        finally:
            if self.observe is not None:
                self.observe(method, code, time.perf_counter() - started)

    def _document(self, checkpoint: Checkpoint) -> gpb.GatewayCheckpoint:
        self._access.remember(checkpoint)
        return gpb.GatewayCheckpoint(found=True, document=encode_checkpoint(checkpoint))

    # ------------------------------------------------------------ store

    async def GetStoreInfo(self, request: Any, context: Any) -> gpb.GatewayStoreInfo:
        async def work(scope: TokenScope) -> gpb.GatewayStoreInfo:
            return gpb.GatewayStoreInfo(
                lease_duration_ms=int(getattr(self.store, "lease_duration_ms", 0) or 0),
                renew_after_ms=int(getattr(self.store, "renew_after_ms", 0) or 0),
                store_backend=self.store_backend,
                blob_backend=self.blob_backend,
                packs=isinstance(self.store, PackIndex),
            )

        return await self._unary("GetStoreInfo", context, work)

    async def Get(self, request: gpb.GatewayGetRequest, context: Any) -> gpb.GatewayCheckpoint:
        async def work(scope: TokenScope) -> gpb.GatewayCheckpoint:
            scope.require(ANY_OP)
            checkpoint = await self.store.get(request.checkpoint_id)
            if checkpoint is None:
                return gpb.GatewayCheckpoint(found=False)
            scope.require_checkpoint(ANY_OP, checkpoint.id, checkpoint.thread_id)
            return self._document(checkpoint)

        return await self._unary("Get", context, work)

    async def List(self, request: gpb.GatewayThreadRequest, context: Any) -> AsyncIterator[Any]:
        async def work(scope: TokenScope) -> AsyncIterator[gpb.GatewayCheckpoint]:
            scope.require(ANY_OP, request.thread_id)
            for checkpoint in await self.store.list(request.thread_id):
                yield self._document(checkpoint)

        async for message in self._stream("List", context, work):
            yield message

    async def GetHead(self, request: gpb.GatewayThreadRequest, context: Any) -> gpb.GatewayHead:
        async def work(scope: TokenScope) -> gpb.GatewayHead:
            scope.require(ANY_OP, request.thread_id)
            return gpb.GatewayHead(checkpoint_id=await self.store.get_head(request.thread_id))

        return await self._unary("GetHead", context, work)

    async def Append(
        self, request: gpb.GatewayAppendRequest, context: Any
    ) -> gpb.GatewayAppendResponse:
        async def work(scope: TokenScope) -> gpb.GatewayAppendResponse:
            checkpoint = wire.decoded_checkpoint(request.document)
            scope.require(("capture",), checkpoint.thread_id)
            wire.refuse_foreign_id(checkpoint.id, checkpoint.thread_id)
            expected = request.expected_head_id if request.HasField("expected_head_id") else None
            writer = wire.writer_from_proto(request.writer)
            if request.packed_blobs:
                scope.require(("capture",), writer.thread_id)
                rows = await self._pack_calls.trusted_rows(request.packed_blobs, writer)
                append: Any = self.store.append  # a PackIndex store's append takes the rows
                checkpoint_id = await append(checkpoint, expected, writer, packed_blobs=rows)
            else:
                checkpoint_id = await self.store.append(checkpoint, expected, writer)
            self._access.remember(checkpoint)
            return gpb.GatewayAppendResponse(checkpoint_id=checkpoint_id)

        return await self._unary("Append", context, work)

    async def DeleteHead(
        self, request: gpb.GatewayDeleteHeadRequest, context: Any
    ) -> gpb.GatewayEmpty:
        async def work(scope: TokenScope) -> gpb.GatewayEmpty:
            scope.require(("prune",), request.thread_id)
            await self.store.delete_head(
                request.thread_id, request.checkpoint_id, wire.writer_from_proto(request.writer)
            )
            return gpb.GatewayEmpty()

        return await self._unary("DeleteHead", context, work)

    async def AcquireWriter(
        self, request: gpb.GatewayAcquireWriterRequest, context: Any
    ) -> gpb.GatewayLease:
        async def work(scope: TokenScope) -> gpb.GatewayLease:
            scope.require(LEASE_OPS, request.thread_id)
            owner = None
            if request.HasField("owner"):
                # Namespaced: another token's sidecar cannot take this lease over.
                owner = f"{scope.subject}\x00{request.owner}" if request.owner else ""
            lease = await self.store.acquire_writer(request.thread_id, owner=owner)
            return gpb.GatewayLease(
                writer=gpb.GatewayWriter(
                    thread_id=lease.thread_id, owner_token=lease.owner_token, fence=lease.fence
                ),
                expires_at=lease.expires_at,
                renew_after_ms=lease.renew_after_ms,
            )

        return await self._unary("AcquireWriter", context, work)

    def _lease(self, message: gpb.GatewayWriter) -> WriterLease:
        return WriterLease(
            thread_id=message.thread_id,
            owner_token=message.owner_token,
            fence=message.fence,
            expires_at=0,
            renew_after_ms=0,
            renew=self._renew,
            release=self._release,
        )

    async def RenewWriter(
        self, request: gpb.GatewayWriter, context: Any
    ) -> gpb.GatewayRenewResponse:
        async def work(scope: TokenScope) -> gpb.GatewayRenewResponse:
            scope.require(LEASE_OPS, request.thread_id)
            return gpb.GatewayRenewResponse(expires_at=await self._renew(self._lease(request)))

        return await self._unary("RenewWriter", context, work)

    async def ReleaseWriter(self, request: gpb.GatewayWriter, context: Any) -> gpb.GatewayEmpty:
        async def work(scope: TokenScope) -> gpb.GatewayEmpty:
            scope.require(LEASE_OPS, request.thread_id)
            await self._release(self._lease(request))
            return gpb.GatewayEmpty()

        return await self._unary("ReleaseWriter", context, work)

    async def DeleteCheckpoints(
        self, request: gpb.GatewayDeleteCheckpointsRequest, context: Any
    ) -> gpb.GatewayCheckpointIds:
        async def work(scope: TokenScope) -> gpb.GatewayCheckpointIds:
            # A restore that stashes keeps its stash to its newest entries:
            # part of that capture (docs/restore-history.md).
            stash = stash_owner(request.thread_id) is not None
            scope.require(("prune", "capture") if stash else ("prune",), request.thread_id)
            deleted = await self.store.delete_checkpoints(
                request.thread_id, request.keep, wire.writer_from_proto(request.writer)
            )
            return gpb.GatewayCheckpointIds(checkpoint_ids=deleted)

        return await self._unary("DeleteCheckpoints", context, work)

    async def ForkFromCheckpoint(
        self, request: gpb.GatewayForkRequest, context: Any
    ) -> gpb.GatewayCheckpoint:
        async def work(scope: TokenScope) -> gpb.GatewayCheckpoint:
            scope.require(("fork",), request.source_thread_id, request.destination_thread_id)
            wire.refuse_foreign_id(request.destination_checkpoint_id, request.destination_thread_id)
            checkpoint = await self.store.fork_from_checkpoint(
                request.source_thread_id,
                request.source_checkpoint_id,
                request.destination_thread_id,
                request.destination_checkpoint_id,
                request.created_at,
                wire.writer_from_proto(request.writer),
            )
            return self._document(checkpoint)

        return await self._unary("ForkFromCheckpoint", context, work)

    async def _covered_threads(
        self, scope: TokenScope, after: str | None, limit: int
    ) -> list[ThreadSummary]:
        """The store's thread pages filtered to the token's threads: walks the
        store's pages from ``after`` until ``limit`` covered threads are found or
        the walk is past every thread and prefix the token names."""
        if "admin" in scope.ops or "" in scope.thread_prefixes:
            return await self.store.list_threads(after=after, limit=limit)  # type: ignore[attr-defined]
        ends = [t.encode() for t in scope.threads] + [p.encode() for p in scope.thread_prefixes]
        found: list[ThreadSummary] = []
        cursor = after
        page_size = max(limit, THREAD_SCAN_PAGE)
        while len(found) < limit:
            page = await self.store.list_threads(after=cursor, limit=page_size)  # type: ignore[attr-defined]
            found += [t for t in page if scope.covers(t.thread_id)][: limit - len(found)]
            if len(page) < page_size:
                break
            cursor = page[-1].thread_id
            raw = cursor.encode()
            if all(raw > end and not raw.startswith(end) for end in ends):
                break
        return found

    async def ListThreads(
        self, request: gpb.GatewayListThreadsRequest, context: Any
    ) -> gpb.GatewayThreads:
        async def work(scope: TokenScope) -> gpb.GatewayThreads:
            scope.require(ANY_OP)
            after = request.after if request.HasField("after") else None
            threads = await self._covered_threads(scope, after, request.limit)
            return gpb.GatewayThreads(
                threads=[
                    gpb.GatewayThreadSummary(
                        thread_id=t.thread_id,
                        head_checkpoint_id=t.head_checkpoint_id,
                        checkpoint_count=t.checkpoint_count,
                        newest_created_at=t.newest_created_at,
                    )
                    for t in threads
                ]
            )

        return await self._unary("ListThreads", context, work)

    async def SpentCheckpointIds(
        self, request: gpb.GatewayCheckpointIds, context: Any
    ) -> gpb.GatewayCheckpointIds:
        async def work(scope: TokenScope) -> gpb.GatewayCheckpointIds:
            # A spent id is a deleted UUIDv5 of (thread, request_id): asking
            # reveals no more than a blob head does, so any capturing token may.
            scope.require(UPLOAD_OPS)
            ids = list(request.checkpoint_ids)
            spent = (
                await self.store.spent_checkpoint_ids(ids)
                if isinstance(self.store, SpentCheckpointIds)
                else []  # a store that cannot say: the daemon's bucket markers remain
            )
            return gpb.GatewayCheckpointIds(checkpoint_ids=spent)

        return await self._unary("SpentCheckpointIds", context, work)

    # ------------------------------------------------------------ guard and audit

    async def PinBlobs(self, request: gpb.GatewayPinRequest, context: Any) -> gpb.GatewayKeys:
        async def work(scope: TokenScope) -> gpb.GatewayKeys:
            scope.require(("capture",), request.writer.thread_id)
            keys = list(request.keys)
            writer = wire.writer_from_proto(request.writer)
            condemned = await self.store.pin_blobs(keys, writer)  # type: ignore[attr-defined]
            refused = set(condemned)
            self._pins.remember(
                (k for k in keys if k not in refused),
                (writer.thread_id, writer.owner_token, writer.fence),
            )
            return gpb.GatewayKeys(keys=condemned)

        return await self._unary("PinBlobs", context, work)

    async def CondemnBlobs(
        self, request: gpb.GatewayCondemnRequest, context: Any
    ) -> gpb.GatewayKeys:
        async def work(scope: TokenScope) -> gpb.GatewayKeys:
            scope.require(ADMIN)
            keys = await self.store.condemn_blobs(list(request.keys), request.hold_ms)  # type: ignore[attr-defined]
            return gpb.GatewayKeys(keys=keys)

        return await self._unary("CondemnBlobs", context, work)

    async def ReleaseCondemned(self, request: gpb.GatewayKeys, context: Any) -> gpb.GatewayEmpty:
        async def work(scope: TokenScope) -> gpb.GatewayEmpty:
            scope.require(ADMIN)
            await self.store.release_condemned(list(request.keys))  # type: ignore[attr-defined]
            return gpb.GatewayEmpty()

        return await self._unary("ReleaseCondemned", context, work)

    async def ListBlobReferences(self, request: Any, context: Any) -> AsyncIterator[Any]:
        async def work(scope: TokenScope) -> AsyncIterator[gpb.GatewayBlobReferences]:
            scope.require(ADMIN)
            references = await self.store.list_blob_references()
            for start in range(0, len(references), 10_000):
                yield gpb.GatewayBlobReferences(
                    references=[
                        gpb.GatewayBlobReference(key=r.key, references=r.references)
                        for r in references[start : start + 10_000]
                    ]
                )

        async for message in self._stream("ListBlobReferences", context, work):
            yield message

    @staticmethod
    def _counts(counts: list[BlobCount]) -> Iterable[gpb.GatewayBlobCounts]:
        for start in range(0, len(counts), 10_000):
            yield gpb.GatewayBlobCounts(
                counts=[
                    gpb.GatewayBlobCount(
                        key=c.key, stored=c.stored, manifests=c.manifests, size=c.size
                    )
                    for c in counts[start : start + 10_000]
                ]
            )

    async def AuditBlobReferences(
        self, request: gpb.GatewayAuditRequest, context: Any
    ) -> AsyncIterator[Any]:
        async def work(scope: TokenScope) -> AsyncIterator[gpb.GatewayBlobCounts]:
            scope.require(ADMIN)
            counts = await self.store.audit_blob_references(with_sizes=request.with_sizes)  # type: ignore[attr-defined]
            for message in self._counts(counts):
                yield message

        async for message in self._stream("AuditBlobReferences", context, work):
            yield message

    async def RepairBlobReferences(self, request: Any, context: Any) -> AsyncIterator[Any]:
        async def work(scope: TokenScope) -> AsyncIterator[gpb.GatewayBlobCounts]:
            scope.require(ADMIN)
            counts = await self.store.repair_blob_references()  # type: ignore[attr-defined]
            for message in self._counts(counts):
                yield message

        async for message in self._stream("RepairBlobReferences", context, work):
            yield message

    async def MarkBlobsMissing(self, request: gpb.GatewayKeys, context: Any) -> gpb.GatewayEmpty:
        async def work(scope: TokenScope) -> gpb.GatewayEmpty:
            scope.require(ADMIN)
            await self.store.mark_blobs_missing(list(request.keys))  # type: ignore[attr-defined]
            return gpb.GatewayEmpty()

        return await self._unary("MarkBlobsMissing", context, work)

    async def ClearMissingBlobs(self, request: gpb.GatewayKeys, context: Any) -> gpb.GatewayEmpty:
        async def work(scope: TokenScope) -> gpb.GatewayEmpty:
            scope.require(UPLOAD_OPS)
            # Marks of keys only other tenants use are theirs to clear (by check).
            keys = [k for k in request.keys if self._access.readable_now(scope, k)]
            await self.store.clear_missing_blobs(keys)  # type: ignore[attr-defined]
            return gpb.GatewayEmpty()

        return await self._unary("ClearMissingBlobs", context, work)

    async def ListMissingBlobs(self, request: Any, context: Any) -> gpb.GatewayKeys:
        async def work(scope: TokenScope) -> gpb.GatewayKeys:
            scope.require(UPLOAD_OPS)
            marked = await self.store.list_missing_blobs()  # type: ignore[attr-defined]
            # A capture asks after reading its parent, whose keys are remembered.
            return gpb.GatewayKeys(keys=[k for k in marked if self._access.readable_now(scope, k)])

        return await self._unary("ListMissingBlobs", context, work)

    # ------------------------------------------------------------ blobs

    async def BlobHead(self, request: gpb.GatewayBlobKey, context: Any) -> gpb.GatewayBlobInfo:
        async def work(scope: TokenScope) -> gpb.GatewayBlobInfo:
            scope.require(ANY_OP)
            info = await self.blobs.head(request.key)
            if info is None:
                return gpb.GatewayBlobInfo(found=False, key=request.key)
            return gpb.GatewayBlobInfo(
                found=True, key=info.key, size=info.size, last_modified_ms=info.last_modified_ms
            )

        return await self._unary("BlobHead", context, work)

    async def BlobMissing(self, request: gpb.GatewayKeys, context: Any) -> gpb.GatewayKeys:
        async def work(scope: TokenScope) -> gpb.GatewayKeys:
            scope.require(ANY_OP)
            return gpb.GatewayKeys(keys=await blob_base.missing(self.blobs, list(request.keys)))

        return await self._unary("BlobMissing", context, work)

    async def BlobGet(self, request: gpb.GatewayBlobGetRequest, context: Any) -> AsyncIterator[Any]:
        async def work(scope: TokenScope) -> AsyncIterator[gpb.GatewayBlobChunk]:
            scope.require(ANY_OP)
            await self._access.may_read(scope, request.key)
            chunk_size = min(request.chunk_size or wire.BLOB_CHUNK_BYTES, 4 << 20)
            async for chunk in self.blobs.get_stream(request.key, chunk_size):
                self.bytes_out += len(chunk)
                yield gpb.GatewayBlobChunk(data=chunk)

        async for message in self._stream("BlobGet", context, work):
            yield message

    async def BlobGetMany(self, request: gpb.GatewayKeys, context: Any) -> AsyncIterator[Any]:
        async def work(scope: TokenScope) -> AsyncIterator[gpb.GatewayBlobChunk]:
            scope.require(ANY_OP)
            keys = list(request.keys)
            for key in dict.fromkeys(keys):
                await self._access.may_read(scope, key)
            datas = await blob_base.get_many(self.blobs, keys)
            self.bytes_out += sum(len(data) for data in datas)
            for index, data in enumerate(datas):
                for start in range(0, max(len(data), 1), wire.BLOB_CHUNK_BYTES):
                    end = start + wire.BLOB_CHUNK_BYTES
                    yield gpb.GatewayBlobChunk(
                        index=index, data=data[start:end], last=end >= len(data)
                    )

        async for message in self._stream("BlobGetMany", context, work):
            yield message

    async def _check_spent_marker(self, scope: TokenScope, key: str, data: Any) -> None:
        """The one object a sidecar stores that is not content-addressed: the
        daemon's marker of a request_id checkpoint it deletes (service.request_ids.mark_spent).
        Only with its fixed bytes, and only for a checkpoint of a thread the
        token may prune (the daemon marks before it deletes) or one the store
        already records as spent (deleted: the marker says nothing new). Never
        for an id no checkpoint has had: that would spend the id another
        tenant's request_id will name."""
        checkpoint_id = key[len(SPENT_REQUEST_PREFIX) :]
        if data != SPENT_MARKER_BYTES or not wire.is_uuid(checkpoint_id):
            raise SandboxCheckpointInvalidArgumentError(
                f"not a spent-request marker: {key!r}", details={"key": key}
            )
        checkpoint = await self.store.get(checkpoint_id)
        if checkpoint is not None:
            scope.require_checkpoint(("prune",), checkpoint_id, checkpoint.thread_id)
            return
        if isinstance(self.store, SpentCheckpointIds) and await self.store.spent_checkpoint_ids(
            [checkpoint_id]
        ):
            return
        raise status.ServiceError(
            status.FORBIDDEN,
            f"no checkpoint {checkpoint_id!r} was made or deleted: it cannot be marked spent",
            checkpoint_id=checkpoint_id,
            subject=scope.subject,
        )

    def _special_upload(self, scope: TokenScope) -> Callable[[str], uploads.MarkerCheck | None]:
        """The check of an uploaded key that is not content-addressed: the
        daemon's spent-request markers (``_check_spent_marker``)."""

        def special(key: str) -> uploads.MarkerCheck | None:
            if not key.startswith(SPENT_REQUEST_PREFIX):
                return None

            async def check(key: str, data: bytes) -> None:
                await self._check_spent_marker(scope, key, data)

            return check

        return special

    async def BlobPut(self, request_iterator: Any, context: Any) -> gpb.GatewayBlobPutResponse:
        async def work(scope: TokenScope) -> gpb.GatewayBlobPutResponse:
            scope.require(UPLOAD_OPS)
            written = False
            special = self._special_upload(scope)
            async for upload in self._receiver.uploads(request_iterator, special):
                try:
                    # A pack is never overwritten: the bytes under its key are its key's.
                    written = await self.blobs.put(
                        upload.key,
                        upload.body(),
                        if_absent=upload.if_absent or upload.columns is not None,
                    )
                finally:
                    upload.close()
                if upload.columns is not None:
                    self._pack_calls.packs.remember(
                        upload.columns
                    )  # durable now (stored, or there already)
            return gpb.GatewayBlobPutResponse(written=written)

        return await self._unary("BlobPut", context, work)

    async def BlobPutMany(
        self, request_iterator: Any, context: Any
    ) -> gpb.GatewayBlobPutManyResponse:
        async def work(scope: TokenScope) -> gpb.GatewayBlobPutManyResponse:
            scope.require(UPLOAD_OPS)
            written: list[bool] = []
            held: list[tuple[str, bytes]] = []  # in memory, stored at BATCH_BYTES
            held_bytes = 0

            async def store_held() -> None:
                nonlocal held_bytes
                if held:
                    written.extend(await blob_base.put_many(self.blobs, held))
                    held.clear()
                    held_bytes = 0

            special = self._special_upload(scope)
            async for upload in self._receiver.uploads(request_iterator, special):
                if upload.data is None:  # spooled (large, or a pack): on its own
                    await store_held()
                    try:
                        written.append(await self.blobs.put(upload.key, upload.body()))
                    finally:
                        upload.close()
                else:
                    held.append((upload.key, upload.data))
                    held_bytes += upload.size
                if upload.columns is not None:
                    self._pack_calls.packs.remember(
                        upload.columns
                    )  # durable now (stored, or there)
                if held_bytes >= uploads.BATCH_BYTES:
                    await store_held()
            await store_held()
            return gpb.GatewayBlobPutManyResponse(written=written)

        return await self._unary("BlobPutMany", context, work)

    async def BlobList(
        self, request: gpb.GatewayBlobListRequest, context: Any
    ) -> AsyncIterator[Any]:
        async def work(scope: TokenScope) -> AsyncIterator[gpb.GatewayBlobInfos]:
            scope.require(ADMIN)
            async for page in self.blobs.list_pages(request.prefix):
                yield gpb.GatewayBlobInfos(
                    blobs=[
                        gpb.GatewayBlobInfo(
                            found=True, key=i.key, size=i.size, last_modified_ms=i.last_modified_ms
                        )
                        for i in page
                    ]
                )

        async for message in self._stream("BlobList", context, work):
            yield message

    async def BlobSignGet(
        self, request: gpb.GatewayBlobSignRequest, context: Any
    ) -> gpb.GatewayBlobUrls:
        async def work(scope: TokenScope) -> gpb.GatewayBlobUrls:
            scope.require(ANY_OP)
            signer = _signing_store(self.blobs)
            if signer is None:
                return gpb.GatewayBlobUrls(supported=False)
            keys = list(request.keys)
            for key in dict.fromkeys(keys):
                await self._access.may_read(scope, key)
            # Never past the token: a URL must not outlive the token that asked.
            left = scope.expires_at - int(time.time())
            seconds = max(
                1, min(request.expires_in_s or DEFAULT_SIGNED_URL_S, MAX_SIGNED_URL_S, left)
            )
            urls = await obstore.sign_async(
                signer, "GET", keys, datetime.timedelta(seconds=seconds)
            )
            return gpb.GatewayBlobUrls(supported=True, urls=list(urls))

        return await self._unary("BlobSignGet", context, work)

    # ------------------------------------------------------------ packs

    async def LocateBlobs(self, request: gpb.GatewayKeys, context: Any) -> gpb.GatewayLocated:
        async def work(scope: TokenScope) -> gpb.GatewayLocated:
            scope.require(ANY_OP)
            return await self._pack_calls.locate(scope, request.keys)

        return await self._unary("LocateBlobs", context, work)

    async def ListPackedBlobs(
        self, request: gpb.GatewayListPackedRequest, context: Any
    ) -> gpb.GatewayLocated:
        async def work(scope: TokenScope) -> gpb.GatewayLocated:
            scope.require(ADMIN)
            if not isinstance(self.store, PackIndex):
                return gpb.GatewayLocated()
            after = request.after if request.HasField("after") else None
            rows = await self.store.list_packed_blobs(after=after, limit=request.limit or 1000)
            return located({row.key: row for row in rows})

        return await self._unary("ListPackedBlobs", context, work)

    async def ReadPackFrames(
        self, request: gpb.GatewayPackRows, context: Any
    ) -> AsyncIterator[Any]:
        async def work(scope: TokenScope) -> AsyncIterator[gpb.GatewayPackFrame]:
            scope.require(ANY_OP)
            async for frame in self._pack_calls.read_frames(scope, request):
                yield frame

        async for message in self._stream("ReadPackFrames", context, work):
            yield message

    async def BlobDelete(self, request: gpb.GatewayBlobKey, context: Any) -> gpb.GatewayEmpty:
        async def work(scope: TokenScope) -> gpb.GatewayEmpty:
            scope.require(ADMIN)
            await self.blobs.delete(request.key)
            return gpb.GatewayEmpty()

        return await self._unary("BlobDelete", context, work)


__all__ = ["BackendNames", "BlobNotFoundError", "GatewayServicer"]
