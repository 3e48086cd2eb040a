"""Blob uploads from sidecars (BlobPut, BlobPutMany), in bounded memory.

Each blob of an upload stream is hashed (BLAKE3) as its chunks arrive and
stored only under its own key, so one sandbox cannot plant wrong bytes under
a key another sandbox's capture will trust as uploaded. What a stream holds:

* a blob up to ``SPOOL_BYTES`` in memory, a larger one in a temporary file;
* a pack always in a temporary file, checked from there frame by frame
  (``packs.verified_pack``), at most ``PACK_CHECK_BYTES`` of packs being
  checked at once across the gateway (``ByteBudget``);
* BlobPutMany stores its small blobs in groups of at most ``BATCH_BYTES`` as
  they arrive, and each spooled one on its own, never a whole batch at once.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import IO, Any

import blake3

from ..errors import INVALID_BLOB, SandboxCheckpointError, SandboxCheckpointInvalidArgumentError
from ..model import ARTIFACT_KEY_PREFIX, FILE_KEY_PREFIX
from ..store._packindex import PACK_KEY_PREFIX, PackColumns
from ..v1 import gateway_pb2 as gpb
from . import packs as pack_rules
from . import wire

# A blob above this is spooled to a temporary file while it is hashed.
SPOOL_BYTES = 8 << 20
# BlobPutMany stores the blobs it holds in memory once they reach this much.
BATCH_BYTES = 8 << 20
# Pack bytes checked at once across the gateway (a larger pack runs alone).
PACK_CHECK_BYTES = 256 << 20

MarkerCheck = Callable[[str, bytes], Awaitable[None]]


class ByteBudget:
    """At most ``limit`` bytes held at once; a request for more than the whole
    limit waits until nothing else is held."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._changed = asyncio.Condition()

    @asynccontextmanager
    async def hold(self, nbytes: int) -> AsyncIterator[None]:
        wanted = min(nbytes, self.limit)
        async with self._changed:
            await self._changed.wait_for(lambda: self.held + wanted <= self.limit)
            self.held += wanted
        try:
            yield
        finally:
            async with self._changed:
                self.held -= wanted
                self._changed.notify_all()


def check_blob_bytes(key: str, digest: str) -> None:
    """INVALID_BLOB unless ``digest`` (the bytes' BLAKE3) is ``key``'s;
    INVALID_ARGUMENT for a key that names no blob."""
    for prefix in (FILE_KEY_PREFIX, ARTIFACT_KEY_PREFIX, PACK_KEY_PREFIX):
        if key.startswith(prefix):
            if key[len(prefix) :] != digest:
                raise SandboxCheckpointError(
                    f"blob bytes do not hash to their key {key!r} (BLAKE3 {digest})",
                    code=INVALID_BLOB,
                    details={"key": key},
                )
            return
    raise SandboxCheckpointInvalidArgumentError(
        f"not a blob key: {key!r} (sandbox-files/blake3/<hex>, sandbox-artifacts/blake3/<hex>"
        " or sandbox-packs/blake3/<hex>)",
        details={"key": key},
    )


@dataclass
class Upload:
    """One blob of an upload stream, checked: its bytes in memory (``data``)
    or in a temporary file (``spool``), and a pack's index rows."""

    key: str
    if_absent: bool
    size: int = 0
    data: bytes | None = None
    spool: IO[bytes] | None = None
    columns: PackColumns | None = None
    _hasher: Any = field(default_factory=blake3.blake3, repr=False)
    _parts: list[bytes] = field(default_factory=list, repr=False)

    @property
    def is_pack(self) -> bool:
        return self.key.startswith(PACK_KEY_PREFIX)

    async def add(self, data: bytes) -> None:
        self._hasher.update(data)
        self.size += len(data)
        if self.is_pack and self.size > pack_rules.MAX_PACK_BYTES:
            raise pack_rules.refuse_pack(
                self.key, f"it is larger than a gateway takes ({pack_rules.MAX_PACK_BYTES})"
            )
        if self.spool is None and (self.is_pack or self.size > SPOOL_BYTES):
            self.spool = tempfile.TemporaryFile()
            parts, self._parts = self._parts, []
            await asyncio.to_thread(self.spool.writelines, parts)
        if self.spool is not None:
            await asyncio.to_thread(self.spool.write, data)
        else:
            self._parts.append(data)

    def complete(self) -> str:
        """The bytes' BLAKE3 (hex), once the last chunk is in."""
        if self.spool is None:
            self.data = b"".join(self._parts)
            self._parts = []
        else:
            self.spool.flush()
        return str(self._hasher.hexdigest())

    def body(self) -> bytes | AsyncIterator[bytes]:
        """The bytes to store: in memory, or streamed from the spool (closed
        once read)."""
        if self.data is not None:
            return self.data
        return self._spooled()

    async def _spooled(self) -> AsyncIterator[bytes]:
        spool = self.spool
        assert spool is not None
        try:
            await asyncio.to_thread(spool.seek, 0)
            while chunk := await asyncio.to_thread(spool.read, wire.BLOB_CHUNK_BYTES):
                yield chunk
        finally:
            self.close()

    def close(self) -> None:
        if self.spool is not None:
            self.spool.close()


class Receiver:
    """Turns upload streams into checked ``Upload``s (see the module docs)."""

    def __init__(
        self,
        limits: pack_rules.PackLimits,
        *,
        on_bytes: Callable[[int], None] = lambda n: None,
        budget: ByteBudget | None = None,
    ) -> None:
        self.limits = limits
        self._on_bytes = on_bytes
        self._budget = budget or ByteBudget(PACK_CHECK_BYTES)

    async def uploads(
        self,
        chunks: AsyncIterable[gpb.GatewayBlobChunk],
        special: Callable[[str], MarkerCheck | None],
    ) -> AsyncIterator[Upload]:
        """Each blob of the stream once its last chunk is in and it checks.
        ``special(key)`` gives the check of a key that is not content-addressed
        (it gets the bytes), or None."""
        upload: Upload | None = None
        try:
            async for chunk in chunks:
                if upload is None:
                    upload = Upload(chunk.key, chunk.if_absent)
                await upload.add(chunk.data)
                self._on_bytes(len(chunk.data))
                if chunk.last:
                    done, upload = upload, None
                    await self._check(done, special(done.key))
                    yield done
        except BaseException:
            if upload is not None:
                upload.close()
            raise
        if upload is not None:
            upload.close()
            raise SandboxCheckpointInvalidArgumentError(
                f"the upload of {upload.key!r} ended without its last chunk",
                details={"key": upload.key},
            )

    async def _check(self, upload: Upload, special: MarkerCheck | None) -> None:
        try:
            digest = upload.complete()
            if special is not None:
                await special(upload.key, upload.data if upload.data is not None else b"")
            elif upload.is_pack:
                check_blob_bytes(upload.key, digest)
                assert upload.spool is not None
                async with self._budget.hold(upload.size):
                    upload.columns = await asyncio.to_thread(
                        pack_rules.verified_pack,
                        upload.key,
                        upload.spool.fileno(),
                        upload.size,
                        self.limits,
                    )
            else:
                check_blob_bytes(upload.key, digest)
        except BaseException:
            upload.close()
            raise


__all__ = [
    "BATCH_BYTES",
    "ByteBudget",
    "PACK_CHECK_BYTES",
    "Receiver",
    "SPOOL_BYTES",
    "Upload",
    "check_blob_bytes",
]
