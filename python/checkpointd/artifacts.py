"""``upload_artifact``: store a named blob for a checkpoint (docs/contract.md#data-model, docs/contract.md#capture).

The key is the BLAKE3 of the bytes (``sandbox-artifacts/blake3/<hex>``), so it is
known only after the last byte. A streamed artifact is therefore hashed while it
is spooled (in memory up to ``SPOOL_MEMORY_BYTES``, then in a temporary file),
and uploaded from the spool under its key; equal artifacts are stored once.

Given the checkpoint store (``index``) and a store that keeps a pack index, an
artifact below the pack threshold goes into a pack of its own, as a capture's
small blobs do: the pack is uploaded (durable) and then its row recorded
(``PackMaintenance.add_packed_blobs(unreferenced=True)``: no checkpoint names
the artifact yet). ReadArtifact and the capture that names it find it through
the index; until then a sweep treats the row as it would the single object
(kept while its pack is young, dropped once it is old and still unused). One
already packed is not uploaded again.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable
from typing import IO, TypedDict, Unpack

import blake3

from . import _native
from ._keywords import check_keywords
from .blobs.base import BlobStore, put_many
from .blobs.packs import PackedBlobStore, pack_key, packed_blobs
from .errors import SandboxCheckpointInvalidArgumentError
from .ids import new_uuid7
from .model import ARTIFACT_KEY_PREFIX, Artifact
from .store._packindex import row_key
from .store.base import PackedBlob, PackMaintenance
from .validation import check_id, is_well_formed_text

# Artifacts are usually small (reports, screenshots); above this the spool moves
# to a temporary file so a large one never sits whole in memory.
SPOOL_MEMORY_BYTES = 8 * 1024 * 1024
READ_CHUNK_BYTES = 1024 * 1024


class UploadOptions(TypedDict, total=False):
    """The keywords of ``upload_artifact`` (its docstring)."""

    artifact_id: str | None
    now: Callable[[], int] | None
    index: object | None


async def upload_artifact(
    blobs: BlobStore,
    name: str,
    mime_type: str,
    data: bytes | AsyncIterable[bytes],
    **options: Unpack[UploadOptions],
) -> Artifact:
    """Upload ``data`` (bytes or an async iterable of bytes) as an artifact.

    Returns the ``Artifact`` record to pass to ``capture_checkpoint``: its
    ``artifact_id`` (a new UUIDv7 unless given), ``size``, ``blob_key`` and
    ``created_at`` (``now()`` in ms, default the wall clock). An artifact whose
    bytes are already stored is not uploaded again. Raises
    SandboxCheckpointInvalidArgumentError for an empty ``name`` or ``mime_type``
    or ``data`` of another type, SandboxCheckpointInvalidIdError for a bad
    ``artifact_id``, BlobStoreError when the upload fails, and TypeError for an
    unknown keyword. ``index``: the checkpoint store; a small artifact is
    packed when it keeps a pack index (module docstring).
    """
    check_keywords("upload_artifact", options, UploadOptions)
    artifact_id, now, index = options.get("artifact_id"), options.get("now"), options.get("index")
    _check_text(name, "name")
    _check_text(mime_type, "mime_type")
    artifact_id = new_uuid7() if artifact_id is None else check_id(artifact_id, "artifact id")
    if isinstance(data, bytes | bytearray | memoryview):
        content = bytes(data)
        key = ARTIFACT_KEY_PREFIX + blake3.blake3(content).hexdigest()
        size = len(content)
        if not await _packed(blobs, index, key, content):
            await blobs.put(key, content, if_absent=True)
    elif isinstance(data, AsyncIterable):
        with tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY_BYTES) as spool:
            digest, size = await _spool(data, spool)
            key = ARTIFACT_KEY_PREFIX + digest
            spool.seek(0)
            if _packing(blobs, index, size) is None or not await _packed(
                blobs, index, key, await asyncio.to_thread(spool.read)
            ):
                spool.seek(0)
                await blobs.put(key, _read_back(spool), if_absent=True)
    else:
        raise SandboxCheckpointInvalidArgumentError(
            f"artifact data must be bytes or an async iterable of bytes, got {type(data).__name__}"
        )
    created_at = now() if now is not None else time.time_ns() // 1_000_000
    return Artifact(
        artifact_id=artifact_id,
        name=name,
        mime_type=mime_type,
        size=size,
        blob_key=key,
        created_at=created_at,
    )


def _packing(blobs: BlobStore, index: object | None, size: int) -> PackedBlobStore | None:
    """The packed view to put an artifact of ``size`` bytes in, if it is to be
    packed: small, and a store that keeps and can be given a pack index."""
    packed = packed_blobs(blobs, index) if index is not None else blobs
    if not isinstance(packed, PackedBlobStore) or not isinstance(index, PackMaintenance):
        return None
    return packed if size < packed.threshold else None


async def _packed(blobs: BlobStore, index: object | None, key: str, content: bytes) -> bool:
    """Put a small artifact in a pack of its own and record its row (unless it
    is packed already); False when it is not to be packed (``_packing``)."""
    packed = _packing(blobs, index, len(content))
    if packed is None:
        return False
    assert isinstance(index, PackMaintenance)
    if await packed.locate([key]):
        return True  # its digest's row (a file's or an artifact's) holds these bytes
    writer = _native.PackWriter()
    hex_digest = key[len(ARTIFACT_KEY_PREFIX) :]
    [(offset, length, raw_size, codec)] = await asyncio.to_thread(
        writer.add_many, [(hex_digest, content)]
    )
    pack_digest, body = await asyncio.to_thread(writer.finish)
    name = pack_key(pack_digest)
    await put_many(packed.inner, [(name, body)])  # durable before its row names it
    row = PackedBlob(row_key(key), name, offset, length, raw_size, codec)
    await index.add_packed_blobs([row], unreferenced=True)
    return True


def _check_text(value: object, what: str) -> None:
    if not isinstance(value, str) or value == "" or not is_well_formed_text(value):
        raise SandboxCheckpointInvalidArgumentError(
            f"artifact {what} must be a non-empty string, got {value!r}", details={"field": what}
        )


async def _spool(data: AsyncIterable[bytes], spool: IO[bytes]) -> tuple[str, int]:
    hasher = blake3.blake3()
    size = 0
    async for chunk in data:
        if not isinstance(chunk, bytes | bytearray | memoryview):
            raise SandboxCheckpointInvalidArgumentError(
                f"artifact data chunks must be bytes, got {type(chunk).__name__}"
            )
        hasher.update(chunk)
        size += len(chunk)
        # Spilling to disk may block; keep the event loop free.
        await asyncio.to_thread(spool.write, chunk)
    return hasher.hexdigest(), size


async def _read_back(spool: IO[bytes]) -> AsyncIterator[bytes]:
    while chunk := await asyncio.to_thread(spool.read, READ_CHUNK_BYTES):
        yield chunk


__all__ = ["UploadOptions", "upload_artifact"]
