"""``upload_artifact``: store a named blob for a checkpoint (SPEC §2, §4).

The key is the BLAKE3 of the bytes (``sandbox-artifacts/blake3/<hex>``), so it is
known only after the last byte. A streamed artifact is therefore hashed while it
is spooled (in memory up to ``SPOOL_MEMORY_BYTES``, then in a temporary file),
and uploaded from the spool under its key; equal artifacts are stored once.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable
from typing import IO

import blake3

from .blobs.base import BlobStore
from .errors import SandboxCheckpointInvalidArgumentError
from .ids import new_uuid7
from .model import ARTIFACT_KEY_PREFIX, Artifact
from .validation import check_id, is_well_formed_text

# Artifacts are usually small (reports, screenshots); above this the spool moves
# to a temporary file so a large one never sits whole in memory.
SPOOL_MEMORY_BYTES = 8 * 1024 * 1024
READ_CHUNK_BYTES = 1024 * 1024


async def upload_artifact(
    blobs: BlobStore,
    name: str,
    mime_type: str,
    data: bytes | AsyncIterable[bytes],
    *,
    artifact_id: str | None = None,
    now: Callable[[], int] | None = None,
) -> Artifact:
    """Upload ``data`` (bytes or an async iterable of bytes) as an artifact.

    Returns the ``Artifact`` record to pass to ``capture_checkpoint``: its
    ``artifact_id`` (a new UUIDv7 unless given), ``size``, ``blob_key`` and
    ``created_at`` (``now()`` in ms, default the wall clock). An artifact whose
    bytes are already stored is not uploaded again. Raises
    SandboxCheckpointInvalidArgumentError for an empty ``name`` or ``mime_type``
    or ``data`` of another type, SandboxCheckpointInvalidIdError for a bad
    ``artifact_id``, and BlobStoreError when the upload fails.
    """
    _check_text(name, "name")
    _check_text(mime_type, "mime_type")
    artifact_id = new_uuid7() if artifact_id is None else check_id(artifact_id, "artifact id")
    if isinstance(data, bytes | bytearray | memoryview):
        content = bytes(data)
        key = ARTIFACT_KEY_PREFIX + blake3.blake3(content).hexdigest()
        size = len(content)
        await blobs.put(key, content, if_absent=True)
    elif isinstance(data, AsyncIterable):
        with tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY_BYTES) as spool:
            digest, size = await _spool(data, spool)
            key = ARTIFACT_KEY_PREFIX + digest
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


__all__ = ["upload_artifact"]
