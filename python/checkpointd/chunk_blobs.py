"""The blobs of files stored as chunks: reading a file back from its
chunks, and the chunks a capture must upload that the scan did not hand over.

The scan feeds the new chunks of each large file it reads. Chunks it did not
feed are those of files the stat cache vouched for (not read) and those its
chunk cache said an earlier capture stored; a capture whose parent does not
reference one of them asks the store, and reads the ones it lacks from their
files here: each read beneath the held root fd, zeroed as the scan zeroed it,
and checked against its digest before it is stored. A file that no longer
holds a chunk changed under the capture: FILE_CHANGED (capture again).
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import blake3

from . import _native
from .blobs import base as blob_batches
from .blobs.base import BlobCorruptError, BlobStore
from .chunks import iter_chunks
from .errors import FILE_CHANGED, SandboxSnapshotError
from .model import FILE_KEY_PREFIX, FileEntry

# Chunks read and put per batch (one worker-thread trip, one ``put_many``).
BATCH_CHUNKS = 256


@dataclass(frozen=True)
class ChunkSource:
    """Where a capture reads the chunks it must upload: the directory it
    scanned (held by fd), the secrets the scan zeroed, and ``run``, which runs
    a blocking read in a worker thread."""

    root_fd: int
    secrets: tuple[bytes, ...]
    run: Callable[[Callable[[], list[bytes]]], Awaitable[list[bytes]]]

    async def read(self, path: str, batch: list[tuple[int, int, bytes]]) -> list[bytes]:
        """The zeroed bytes of ``batch``'s chunks of ``path``, each checked
        against its digest; FILE_CHANGED when the file no longer holds one."""
        try:
            return await self.run(
                functools.partial(
                    _native.read_chunks_beneath, self.root_fd, path, batch, self.secrets
                )
            )
        except _native.FileChangedError:
            raise SandboxSnapshotError(
                FILE_CHANGED,
                f"{path} changed while it was captured; capture again",
                details={"path": path},
            ) from None


async def upload_missing_chunks(
    manifest: bytes,
    new_digests: bytes,
    source: ChunkSource,
    blobs: BlobStore,
    pin: Callable[[list[str]], Awaitable[None]],
) -> tuple[int, int]:
    """Upload the chunks among ``new_digests`` (the keys new to the parent and
    not fed) that chunked files of ``manifest`` use and ``blobs`` lacks, read
    from ``source``. ``pin`` pins keys before the store is asked. Returns the
    blobs and bytes written."""
    if not new_digests:
        return 0, 0
    reads = _native.manifest_chunk_reads(manifest, new_digests)
    if not reads:
        return 0, 0
    keys = sorted(
        {FILE_KEY_PREFIX + digest.hex() for _path, items in reads for *_, digest in items}
    )
    await pin(keys)
    missing = set(await blob_batches.missing(blobs, keys))
    written = nbytes = 0
    for path, items in reads:
        wanted = [item for item in items if FILE_KEY_PREFIX + item[2].hex() in missing]
        for start in range(0, len(wanted), BATCH_CHUNKS):
            batch = wanted[start : start + BATCH_CHUNKS]
            datas = await source.read(path, batch)
            items_out = [
                (FILE_KEY_PREFIX + digest.hex(), data)
                for (_o, _n, digest), data in zip(batch, datas, strict=True)
            ]
            done = await blob_batches.put_many(blobs, items_out)
            for (key, data), was_written in zip(items_out, done, strict=True):
                missing.discard(key)
                if was_written:
                    written += 1
                    nbytes += len(data)
    return written, nbytes


async def read_file_blobs(
    blobs: BlobStore, entry: FileEntry, chunk_size: int
) -> AsyncIterator[bytes]:
    """The bytes of ``entry`` as the checkpoint stores them (zeroed): its
    blob streamed, or for a file stored as chunks each chunk in order,
    checked against its digest. Raises BlobNotFoundError naming the missing
    key, BlobCorruptError for a chunk that is not its key's bytes."""
    if not entry.chunks:
        async for data in blobs.get_stream(entry.blob_key, chunk_size):
            yield data
        return
    for chunk in iter_chunks(entry.chunks):
        data = await blobs.get(chunk.key)
        if len(data) != chunk.length or blake3.blake3(data).hexdigest() != chunk.key[-64:]:
            raise BlobCorruptError(chunk.key, "", "its bytes are not its key's")
        for start in range(0, len(data), max(chunk_size, 1)):
            yield data[start : start + chunk_size]


__all__ = ["ChunkSource", "read_file_blobs", "upload_missing_chunks"]
