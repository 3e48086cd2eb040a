"""The bucket behind the gateways, as a sidecar's BlobStore (``RemoteBlobStore``)."""

from __future__ import annotations

import asyncio
import builtins
import urllib.error
import urllib.request
from collections.abc import AsyncIterable, AsyncIterator, Sequence
from typing import Any

from ..blobs.base import BlobCorruptError, BlobInfo, BlobNotFoundError, BlobStore, BlobStoreError
from ..errors import INVALID_BLOB, STORE_UNAVAILABLE, SandboxCheckpointError
from ..store.base import PackedBlob
from ..v1 import gateway_pb2 as gpb
from . import wire
from .connection import GatewayConnection

# Presigned reads: how long one may take, how many run at once.
PRESIGNED_TIMEOUT_S = 300.0
PRESIGNED_CONCURRENCY = 16


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


__all__ = ["PRESIGNED_CONCURRENCY", "PRESIGNED_TIMEOUT_S", "RemoteBlobStore"]
