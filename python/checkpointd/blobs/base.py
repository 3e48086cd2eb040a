"""The blob-store protocol: content-addressed bytes in a bucket or a directory.

Implementations stream: ``put`` takes bytes or an async iterable of chunks (large
blobs go up as multipart), ``get_stream`` yields chunks. Keys are the docs/contract.md#data-model
shapes (``sandbox-files/blake3/<hex>``, ``sandbox-artifacts/blake3/<hex>``) but the
store itself does not care what a key looks like.

Batches: the engines move many small blobs at once through ``put_many``,
``missing`` and ``get_many``. The protocol gives each a default over the
single-key methods (a class that subclasses ``BlobStore`` inherits them; the
module functions of the same names serve a duck-typed store that lacks them), so
the engines have one upload path and one fetch path whatever the backend; a
backend that can do better overrides them (the local directory does the whole
batch natively, fd-relative, with one sync per batch). A batch is for small
blobs: callers bound its total size (large blobs go through ``put``/``get_stream``).
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

from .. import _native

T = TypeVar("T")
R = TypeVar("R")

# Single-key requests in flight in the default batch implementations.
BATCH_CONCURRENCY = 32


class BlobNotFoundError(KeyError):
    """The key does not exist in the blob store."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key

    def __str__(self) -> str:
        return f"blob not found: {self.key}"


class BlobStoreError(Exception):
    """The blob backend failed (unreachable, denied...); names the store and key."""


class BlobCorruptError(BlobStoreError):
    """A stored blob does not hold its key's bytes (a truncated or damaged pack):
    ``key`` the blob, ``pack`` the object holding it, ``reason`` what is wrong."""

    def __init__(self, key: str, pack: str, reason: str) -> None:
        super().__init__(f"blob {key} in pack {pack} is invalid: {reason}")
        self.key = key
        self.pack = pack
        self.reason = reason


@dataclass(frozen=True, slots=True)
class BlobInfo:
    key: str
    size: int
    last_modified_ms: int  # upload time, ms since epoch (the sweep's age)


class VerifiedFile:
    """A file's bytes for ``put``: an async iterable of chunks from a native
    ``VerifyingReader`` (zeroed, hashed and checked against the digest the
    manifest records; the last chunk comes only once the whole file matched).

    Any store can take it as the async iterable it is; a backend that can copy
    natively unwraps ``reader`` instead (the local directory streams it to disk
    in Rust, without a trip through Python per chunk). ``changed`` is set when
    the reader found the file no longer what was scanned (its
    ``FileChangedError`` may reach the caller wrapped by the store).
    ``on_bytes`` is told how many verified bytes went out.
    """

    def __init__(
        self,
        reader: _native.VerifyingReader,
        *,
        cancel: _native.CancelToken | None = None,
        on_bytes: Callable[[int], None] | None = None,
    ) -> None:
        self.reader = reader
        self.cancel = cancel
        self.on_bytes = on_bytes
        self.changed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            try:
                chunk = await asyncio.to_thread(self.reader.read_chunk)
            except _native.FileChangedError:
                self.changed = True
                raise
            if chunk is None:
                return
            if self.on_bytes is not None:
                self.on_bytes(len(chunk))
            yield chunk


@runtime_checkable
class BlobStore(Protocol):
    url: str  # where it lives, credentials removed (for errors and GetServerInfo)

    async def put(
        self, key: str, data: bytes | AsyncIterable[bytes], *, if_absent: bool = True
    ) -> bool:
        """Store the bytes under ``key``. With ``if_absent`` an existing key is
        left as is. Returns True when bytes were written."""
        ...

    async def get(self, key: str) -> bytes:
        """All bytes of a (small) blob. Raises BlobNotFoundError."""
        ...

    def get_stream(self, key: str, chunk_size: int = 1 << 20) -> AsyncIterator[bytes]:
        """Chunks of the blob; raises BlobNotFoundError on first iteration."""
        ...

    async def head(self, key: str) -> BlobInfo | None: ...

    async def list(self, prefix: str) -> list[BlobInfo]:
        """Every object under ``prefix`` (all pages)."""
        ...

    def list_pages(self, prefix: str) -> AsyncIterator[builtins.list[BlobInfo]]:
        """The objects under ``prefix``, one backend page at a time."""
        ...

    async def delete(self, key: str) -> None:
        """Remove the key; a missing key is not an error."""
        ...

    async def put_many(self, items: Sequence[tuple[str, bytes]]) -> builtins.list[bool]:
        """Store each ``(key, bytes)`` unless the key exists (``put`` with
        ``if_absent``); returns, per item, whether bytes were written. When it
        returns, every written blob is durable (an append may reference it).
        Raises BlobStoreError naming the key and the store; blobs written before
        the failure are complete, none is half-written."""
        return await default_put_many(self, items)

    async def missing(self, keys: Sequence[str]) -> builtins.list[str]:
        """The keys the store does not hold, in the order given."""
        return await default_missing(self, keys)

    async def get_many(self, keys: Sequence[str]) -> builtins.list[bytes]:
        """All bytes of each (small) blob, in the order given. Raises
        BlobNotFoundError for a missing key, BlobStoreError when the backend fails."""
        return await default_get_many(self, keys)


async def _gather_bounded(items: Sequence[T], work: Callable[[T], Awaitable[R]]) -> list[R]:
    """``work`` on every item, at most BATCH_CONCURRENCY at once, results in order;
    the first failure cancels the rest and is raised."""
    slots = asyncio.Semaphore(BATCH_CONCURRENCY)

    async def one(item: T) -> R:
        async with slots:
            return await work(item)

    tasks = [asyncio.ensure_future(one(item)) for item in items]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def get_ranges(blobs: BlobStore, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
    """The bytes ``[start, end)`` of ``key`` for each range (shorter when the
    object ends first): ``blobs.get_ranges`` where the store has it (one ranged
    request each), else the whole object read once and sliced. Raises
    BlobNotFoundError, BlobStoreError."""
    method = _batch_method(blobs, "get_ranges")
    if method is not None:
        result: list[bytes] = await method(key, ranges)
        return result
    data = await blobs.get(key)
    return [data[start:end] for start, end in ranges]


def get_range_stream(
    blobs: BlobStore, key: str, start: int, end: int, chunk_size: int = 1 << 20
) -> AsyncIterator[bytes]:
    """The bytes ``[start, end)`` of ``key`` as they arrive (one ranged request;
    fewer bytes when the object ends first): ``blobs.get_range_stream`` where the
    store has it, else ``get_ranges`` of that one range. Raises BlobNotFoundError
    (on the first iteration), BlobStoreError."""
    if getattr(type(blobs), "get_range_stream", None) is not None:
        stream: AsyncIterator[bytes] = blobs.get_range_stream(  # type: ignore[attr-defined]
            key, start, end, chunk_size
        )
        return stream
    return _one_range(blobs, key, start, end)


async def _one_range(blobs: BlobStore, key: str, start: int, end: int) -> AsyncIterator[bytes]:
    [data] = await get_ranges(blobs, key, [(start, end)])
    if data:
        yield data


async def default_put_many(blobs: BlobStore, items: Sequence[tuple[str, bytes]]) -> list[bool]:
    """``put_many`` over ``put(key, data, if_absent=True)``."""
    return await _gather_bounded(items, lambda item: blobs.put(item[0], item[1], if_absent=True))


async def default_missing(blobs: BlobStore, keys: Sequence[str]) -> list[str]:
    """``missing`` over ``head``."""
    infos = await _gather_bounded(keys, blobs.head)
    return [key for key, info in zip(keys, infos, strict=True) if info is None]


async def default_get_many(blobs: BlobStore, keys: Sequence[str]) -> list[bytes]:
    """``get_many`` over ``get``."""
    return await _gather_bounded(keys, blobs.get)


# The engines call these: the batch method of the store's class when it defines
# one (every subclass of BlobStore does), else the default over the store's
# single-key methods. Looked up on the class, not the instance: a wrapper that
# forwards unknown attributes to an inner store (and watches or changes ``put``)
# must not have its batches go straight to the inner store.


def _batch_method(blobs: object, name: str) -> Callable[..., Awaitable[Any]] | None:
    if getattr(type(blobs), name, None) is None:
        return None
    method: Callable[..., Awaitable[Any]] = getattr(blobs, name)
    return method


async def put_many(blobs: BlobStore, items: Sequence[tuple[str, bytes]]) -> list[bool]:
    """``blobs.put_many(items)``, or the default when ``blobs`` lacks it."""
    method = _batch_method(blobs, "put_many")
    if method is None:
        return await default_put_many(blobs, items)
    result: builtins.list[bool] = await method(items)
    return result


async def put_learned(
    blobs: BlobStore, beside: str, source: VerifiedFile, *, unless_beside: bool = False
) -> tuple[str, bool] | None:
    """Store the bytes of ``source``, a reader opened by
    ``VerifyingReader.open_unhashed`` (its digest learned from the bytes), as
    the blob of the same kind as the key ``beside`` named by that digest,
    reading the file once: (that key, whether written; False when it
    existed), durable on return; with ``unless_beside``, ``(beside, False)``
    and nothing read when the blob ``beside`` exists (the caller trusts that
    the file still holds its bytes, as a put of ``beside`` would). None, with
    nothing read, when the store cannot
    name a blob after its bytes are in (an optional method: the local
    directory can; the caller then hashes the file first and streams it
    after). Raises FileChangedError (the file changed while it was read:
    nothing stored), ScanCancelled, BlobStoreError."""
    method = _batch_method(blobs, "put_learned")
    if method is None:
        return None
    result: tuple[str, bool] | None = await method(beside, source, unless_beside=unless_beside)
    return result


async def missing(blobs: BlobStore, keys: Sequence[str]) -> list[str]:
    """``blobs.missing(keys)``, or the default when ``blobs`` lacks it."""
    method = _batch_method(blobs, "missing")
    if method is None:
        return await default_missing(blobs, keys)
    result: builtins.list[str] = await method(keys)
    return result


async def get_many(blobs: BlobStore, keys: Sequence[str]) -> list[bytes]:
    """``blobs.get_many(keys)``, or the default when ``blobs`` lacks it."""
    method = _batch_method(blobs, "get_many")
    if method is None:
        return await default_get_many(blobs, keys)
    result: builtins.list[bytes] = await method(keys)
    return result
