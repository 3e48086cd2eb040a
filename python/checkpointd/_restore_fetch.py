"""The restore's fetch step (docs/contract.md#restore, step 4): every blob the
native plan needs, fetched and staged, verified (size and BLAKE3) before its
bytes are written, before the first change to the workspace.

Packed blobs are grouped by pack across the whole plan, nearby frames merged
into one ranged GET (about one per pack), at most FETCH_CONCURRENCY in flight,
each streamed into staging natively frame by frame (memory: a chunk per read,
not the pack); other blobs in batches (``get_many``), large ones streamed.
A blob that is gone raises MISSING_BLOB, one that is not what the checkpoint
records INVALID_BLOB: the workspace is then unchanged.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

from . import _native
from ._engine import PhaseReporter, run_bounded, run_in_thread
from .blobs.base import (
    BlobCorruptError,
    BlobNotFoundError,
    BlobStore,
    BlobStoreError,
    get_many,
)
from .blobs.packs import MAX_RANGE_BYTES, PACK_KEY_PREFIX, PackedBlobStore, PackRead
from .errors import INVALID_BLOB, MISSING_BLOB, SandboxSnapshotError
from .model import FILE_KEY_PREFIX
from .store._packindex import file_key
from .store.base import IndexRow, PackedBlob

# Blobs up to SMALL_BLOB_BYTES are fetched in batches (a batch ends at whichever
# limit comes first) and staged by one native call each; FETCH_CONCURRENCY
# batches or large streams are in flight, so memory stays bounded by about
# FETCH_CONCURRENCY x FETCH_BATCH_BYTES plus the stream chunks.
SMALL_BLOB_BYTES = 1 << 20
FETCH_BATCH_FILES = 512
FETCH_BATCH_BYTES = 16 << 20
FETCH_CONCURRENCY = 3
# The pack index is asked for the plan's small blobs in slices (the first
# LOCATE_FIRST, then 4x more each time, at most LOCATE_MOST): a slice's reads
# start while the next is looked up (about 1 s of lookup for 100,000 keys).
LOCATE_FIRST = 1024
LOCATE_MOST = 65536
# A pack read arrives in chunks of about this size (each staged natively as it comes).
FETCH_CHUNK_BYTES = 1 << 20


def invalid_blob(digest: str, reason: str) -> SandboxSnapshotError:
    key = FILE_KEY_PREFIX + digest
    return SandboxSnapshotError(
        INVALID_BLOB, f"blob {key} is invalid: {reason}", details={"key": key}
    )


def _missing_blob(blobs: BlobStore, key: str, pack: str | None = None) -> SandboxSnapshotError:
    if pack is not None:
        return SandboxSnapshotError(
            MISSING_BLOB,
            f"blob {key} is missing from {blobs.url}: its pack {pack} is gone",
            details={"key": key, "pack": pack},
        )
    return SandboxSnapshotError(
        MISSING_BLOB, f"blob {key} is missing from {blobs.url}", details={"key": key}
    )


def _corrupt_blob(error: BlobCorruptError) -> SandboxSnapshotError:
    return SandboxSnapshotError(
        INVALID_BLOB,
        f"blob {error.key} in pack {error.pack} is invalid: {error.reason}",
        details={"key": error.key, "pack": error.pack},
    )


async def fetch_blobs(
    blobs: BlobStore, session: _native.RestoreSession, reporter: PhaseReporter
) -> None:
    """Fetch and stage every blob the plan needs: MISSING_BLOB / INVALID_BLOB.

    Small blobs are looked up in the store's pack index a slice of the plan
    at a time (``_located_jobs``; one slice for a bucket), and each slice's
    reads start as soon as it is located, so the lookup of the next slice runs
    while this one's files are created. The index rows go to the native
    session as they come from the store, which groups them by pack and merges
    nearby frames into about one ranged GET per group (``pack::plan_reads``):
    no Python object per blob. A long read is streamed, each frame decoded,
    verified and staged natively once its bytes are in, so memory holds
    FETCH_CONCURRENCY chunks, not the packs; short reads of one pack (the few
    blobs a restore over a slightly changed tree needs) go in batches, one
    ``read_pack_ranges`` and one native call each. Blobs without an index row
    (single objects, or a store that keeps no index) are fetched in batches;
    large ones are streamed one by one."""
    small, large, total_bytes = session.needed(SMALL_BLOB_BYTES)
    reporter.phase("fetch", files_total=len(small) // 32 + len(large), bytes_total=total_bytes)
    large_jobs: list[Callable[[], Awaitable[None]]] = [
        functools.partial(_fetch_large, blobs, session, reporter, digest, size)
        for digest, size in large
    ]
    try:
        await run_bounded(
            _located_jobs(blobs, session, reporter, small, large_jobs),
            lambda job: job(),
            FETCH_CONCURRENCY,
        )
    except _native.InvalidBlob as error:
        raise invalid_blob(*error.args) from None


def _locate_slices(blobs: BlobStore, digests: bytes) -> list[bytes]:
    """The plan's small blobs (concatenated digests) in slices growing from
    LOCATE_FIRST by 4x up to LOCATE_MOST, so the first files are created after
    one short lookup; one slice for a store that reads each pack about once
    (a bucket's GETs: ``PackedBlobStore.locate_in_slices``)."""
    if not (isinstance(blobs, PackedBlobStore) and blobs.locate_in_slices):
        return [digests] if digests else []
    slices, start, size = [], 0, LOCATE_FIRST
    while start < len(digests):
        slices.append(digests[start : start + size * 32])
        start += size * 32
        size = min(size * 4, LOCATE_MOST)
    return slices


async def _located_jobs(
    blobs: BlobStore,
    session: _native.RestoreSession,
    reporter: PhaseReporter,
    small: bytes,
    large: list[Callable[[], Awaitable[None]]],
) -> AsyncIterator[Callable[[], Awaitable[None]]]:
    """The fetch jobs, a located slice at a time, then the large blobs."""
    for part in _locate_slices(blobs, small):
        if isinstance(blobs, PackedBlobStore):
            reads, unplaced = _plan_reads(blobs, session, part, await blobs.locate_rows(part))
            for job in _pack_jobs(blobs, session, reporter, reads):
                yield job
        else:
            _none, unplaced = session.plan_pack_reads(part, [], 0, 0)
        batch: list[tuple[str, int]] = []
        batch_bytes = 0
        for digest, size in unplaced:
            batch.append((digest, size))
            batch_bytes += size
            if len(batch) >= FETCH_BATCH_FILES or batch_bytes >= FETCH_BATCH_BYTES:
                yield functools.partial(_fetch_batch, blobs, session, reporter, batch)
                batch, batch_bytes = [], 0
        if batch:
            yield functools.partial(_fetch_batch, blobs, session, reporter, batch)
    for job in large:
        yield job


# A read the native session planned: its id (``begin_range`` and
# ``stage_ranges`` take it) and what to read.
_Planned = tuple[int, PackRead]


def _plan_reads(
    blobs: PackedBlobStore, session: _native.RestoreSession, digests: bytes, rows: list[IndexRow]
) -> tuple[list[_Planned], list[tuple[str, int]]]:
    """The pack reads that stage ``digests`` from their index ``rows``, and
    the blobs no row places, as (hex digest, size). A read holds its rows
    only for a store that serves packs frame by frame (the gateway's:
    ``PackedBlobStore.reads_by_frame``), which must name each frame."""
    planned, unplaced = session.plan_pack_reads(digests, rows, blobs.merge_gap, MAX_RANGE_BYTES)
    by_frame = blobs.reads_by_frame
    reads: list[_Planned] = []
    for read_id, pack_digest, start, end in planned:
        pack = PACK_KEY_PREFIX + pack_digest.hex()
        held = (
            [
                PackedBlob(file_key(digest), pack, offset, length, raw_size, codec)
                for digest, offset, length, raw_size, codec in session.read_frames(read_id)
            ]
            if by_frame
            else []
        )
        reads.append((read_id, PackRead(pack, start, end, held)))
    return reads, unplaced


def _pack_jobs(
    blobs: PackedBlobStore,
    session: _native.RestoreSession,
    reporter: PhaseReporter,
    reads: list[_Planned],
    *,
    again: bool = True,
) -> list[Callable[[], Awaitable[None]]]:
    """One job per streamed read, one per batch of short reads of a pack."""
    jobs: list[Callable[[], Awaitable[None]]] = []
    short: dict[str, list[_Planned]] = {}
    for planned in reads:
        read = planned[1]
        if read.end - read.start > FETCH_CHUNK_BYTES:
            jobs.append(
                functools.partial(_fetch_pack_read, blobs, session, reporter, planned, again=again)
            )
        else:
            short.setdefault(read.pack, []).append(planned)
    for pack_reads in short.values():
        batch: list[_Planned] = []
        batch_bytes = 0
        for planned in pack_reads:
            batch.append(planned)
            batch_bytes += planned[1].end - planned[1].start
            if len(batch) >= FETCH_BATCH_FILES or batch_bytes >= FETCH_BATCH_BYTES:
                jobs.append(
                    functools.partial(_fetch_pack_reads, blobs, session, reporter, batch, again)
                )
                batch, batch_bytes = [], 0
        if batch:
            jobs.append(
                functools.partial(_fetch_pack_reads, blobs, session, reporter, batch, again)
            )
    return jobs


async def _fetch_moved(
    blobs: PackedBlobStore,
    session: _native.RestoreSession,
    reporter: PhaseReporter,
    pack: str,
    read_ids: list[int],
) -> None:
    """A pack gone from the bucket: a sweep may have repacked its blobs in
    between, and the index then names their new place; read them from there
    once (blobs staged before are not staged twice), else MISSING_BLOB."""
    digests = [frame[0] for read_id in read_ids for frame in session.read_frames(read_id)]
    rows = await blobs.locate_rows(b"".join(digests))
    moved = {row[0]: row[1] for row in rows}
    for digest in digests:
        new_pack = moved.get(digest)
        if new_pack is None or PACK_KEY_PREFIX + new_pack.hex() == pack:
            raise _missing_blob(blobs, file_key(digest), pack) from None
    reads, _unplaced = _plan_reads(blobs, session, b"".join(digests), rows)
    for job in _pack_jobs(blobs, session, reporter, reads, again=False):
        await job()


async def _fetch_pack_reads(
    blobs: PackedBlobStore,
    session: _native.RestoreSession,
    reporter: PhaseReporter,
    reads: list[_Planned],
    again: bool,
) -> None:
    """Short reads of one pack: one ``read_pack_ranges``, then one native call that
    decodes, verifies and stages every frame."""
    pack = reads[0][1].pack
    try:
        with _as_invalid_blob(pack):
            wanted = [planned for planned in reads if planned[1].end > planned[1].start]
            datas = await blobs.read_pack_ranges(pack, [read for _id, read in wanted])
            found = {read_id: data for (read_id, _read), data in zip(wanted, datas, strict=True)}
            staged = [(read_id, found.get(read_id, b"")) for read_id, _read in reads]
            files, nbytes = await run_in_thread(functools.partial(session.stage_ranges, staged))
            reporter.advance(files=files, nbytes=nbytes)
    except BlobNotFoundError:
        read_ids = [read_id for read_id, _read in reads]
        if not again:
            raise _missing_blob(blobs, _first_key(session, read_ids[0]), pack) from None
        await _fetch_moved(blobs, session, reporter, pack, read_ids)


async def _fetch_pack_read(
    blobs: PackedBlobStore,
    session: _native.RestoreSession,
    reporter: PhaseReporter,
    planned: _Planned,
    *,
    again: bool = True,
) -> None:
    """Stage one long ranged read of a pack: from a local dir natively in one
    worker-thread trip (``_stage_local_read``), else streamed
    (``_stream_pack_read``). A pack gone from the bucket is looked up once
    more (``again``, ``_fetch_moved``)."""
    read_id, read = planned
    try:
        with _as_invalid_blob(read.pack):
            if not await _stage_local_read(blobs, session, reporter, planned):
                await _stream_pack_read(blobs, session, reporter, planned)
    except BlobNotFoundError:
        if not again:
            raise _missing_blob(blobs, _first_key(session, read_id), read.pack) from None
        await _fetch_moved(blobs, session, reporter, read.pack, [read_id])


@contextlib.contextmanager
def _as_invalid_blob(pack: str) -> Iterator[None]:
    """A frame of ``pack`` that staging refused (InvalidBlob) or the store
    found damaged (BlobCorruptError), raised as INVALID_BLOB naming both."""
    try:
        yield
    except _native.InvalidBlob as error:
        digest, reason = error.args
        raise _corrupt_blob(BlobCorruptError(FILE_KEY_PREFIX + digest, pack, reason)) from None
    except BlobCorruptError as error:
        raise _corrupt_blob(error) from None


async def _stream_pack_read(
    blobs: PackedBlobStore,
    session: _native.RestoreSession,
    reporter: PhaseReporter,
    planned: _Planned,
) -> None:
    """Stream ``planned`` into staging, each chunk staged as it arrives."""
    read_id, read = planned
    session.begin_range(read_id)
    finished = False
    try:
        chunks = blobs.stream_pack_read(read, FETCH_CHUNK_BYTES)
        if read.end <= read.start:  # empty blobs only: nothing to read
            chunks = _one_chunk(b"")
        async for chunk in chunks:
            files, nbytes = await run_in_thread(
                functools.partial(session.feed_range, read_id, chunk)
            )
            reporter.advance(files=files, nbytes=nbytes)
        finished = True
        session.end_range(read_id)
    finally:
        if not finished:
            session.end_range(read_id, discard=True)


async def _stage_local_read(
    blobs: PackedBlobStore,
    session: _native.RestoreSession,
    reporter: PhaseReporter,
    planned: _Planned,
) -> bool:
    """Stage ``planned`` from its pack file when the store is a local dir:
    the native session reads it a FETCH_CHUNK_BYTES piece at a time into one
    buffer (no ``bytes`` per piece, no trip through Python). False for any
    other store. Raises BlobNotFoundError, BlobStoreError, InvalidBlob."""
    read_id, read = planned
    fd = await run_in_thread(functools.partial(blobs.open_pack, read.pack))
    if fd is None:
        return False
    try:
        stage = functools.partial(
            session.stage_range_from, read_id, fd, (read.start, read.end), FETCH_CHUNK_BYTES
        )
        files, nbytes = await run_in_thread(stage)
    except OSError as error:
        raise BlobStoreError(f"cannot read pack {read.pack} from {blobs.url}: {error}") from error
    finally:
        os.close(fd)
    reporter.advance(files=files, nbytes=nbytes)
    return True


def _first_key(session: _native.RestoreSession, read_id: int) -> str:
    """The key of a planned read's first blob (an error names it)."""
    return file_key(session.read_frames(read_id)[0][0])


async def _one_chunk(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def _fetch_batch(
    blobs: BlobStore,
    session: _native.RestoreSession,
    reporter: PhaseReporter,
    items: list[tuple[str, int]],
) -> None:
    keys = [FILE_KEY_PREFIX + digest for digest, _size in items]
    try:
        datas = await get_many(blobs, keys)
    except BlobNotFoundError as error:
        raise _missing_blob(blobs, error.key, getattr(error, "pack", None)) from None
    except BlobCorruptError as error:
        raise _corrupt_blob(error) from None
    staged = [(digest, data) for (digest, _size), data in zip(items, datas, strict=True)]
    await run_in_thread(lambda: session.stage_many(staged))
    reporter.advance(files=len(items), nbytes=sum(len(data) for data in datas))


async def _fetch_large(
    blobs: BlobStore,
    session: _native.RestoreSession,
    reporter: PhaseReporter,
    digest: str,
    size: int,
) -> None:
    """Stream one large blob into staging, chunk by chunk (fixed memory).

    Each native call runs through ``run_in_thread``: when another fetch job
    fails and this one is cancelled, the call in flight finishes before the
    cancel goes on, so the session is never closed under it."""
    key = FILE_KEY_PREFIX + digest
    await run_in_thread(functools.partial(session.begin_blob, digest, size))
    try:
        async for chunk in blobs.get_stream(key):
            # Rust stops as soon as it is longer than recorded (INVALID_BLOB).
            await run_in_thread(functools.partial(session.write_blob, digest, chunk))
            reporter.advance(nbytes=len(chunk))
    except BlobNotFoundError as error:
        raise _missing_blob(blobs, key, getattr(error, "pack", None)) from None
    except BlobCorruptError as error:
        raise _corrupt_blob(error) from None
    await run_in_thread(functools.partial(session.end_blob, digest))
    reporter.advance(files=1)


__all__ = ["FETCH_CHUNK_BYTES", "LOCATE_FIRST", "fetch_blobs", "invalid_blob"]
