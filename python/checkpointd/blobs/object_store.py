"""``ObjectBlobStore``: the BlobStore protocol over any obstore store.

One class serves memory, local directory, S3 (and S3-compatible services such as
R2 or SeaweedFS), GCS and Azure, because obstore gives them one API. What this
module adds on top of obstore:

* Errors: obstore's not-found (a builtin ``FileNotFoundError``) becomes
  ``BlobNotFoundError``; every other failure becomes ``BlobStoreError`` naming the
  store URL (never credentials) and the key.
* ``put(..., if_absent=True)``: a small blob (at most one multipart part) goes up
  with obstore's conditional create (``mode="create"``); "already exists" means
  the blob is there and is a success that returns False. A larger, streamed blob
  cannot use conditional create (obstore would buffer it whole in memory), so it
  is checked with ``head`` first and then streamed as a multipart upload. Keys are
  content addresses, so two writers racing on the same key write the same bytes
  and either result is correct. A backend without conditional create falls back
  to head-then-put for good.
* Durability: ``put`` returns only once the blob is durable, so an append
  that references it never outlives it. On S3, GCS and Azure a PUT (or a
  multipart upload's completion) that returned success is durable by the
  service's contract, and an object appears only complete (an aborted or
  interrupted multipart upload leaves no object, only parts the bucket's
  lifecycle rule should expire). The local directory (``file://``) writes
  through our own writer (``blobs/local.py``): complete or absent, synced
  before ``put`` returns; a stream that obstore's ``LocalStore`` writes (it
  never syncs) is synced afterwards. A ``VerifiedFile`` (a scanned file) is
  copied there natively.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import datetime as dt
import functools
import os
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import obstore
from obstore.exceptions import AlreadyExistsError, BaseError, NotSupportedError

from .._engine import REPORT_INTERVAL_S
from .base import (
    BlobInfo,
    BlobNotFoundError,
    BlobStore,
    BlobStoreError,
    VerifiedFile,
    default_get_many,
    default_missing,
    default_put_many,
)
from .local import LocalBlobDir

if TYPE_CHECKING:
    from obstore.store import ObjectStore

# obstore's multipart part size; a streamed blob no larger than this is buffered
# and sent as one conditional PUT, anything larger streams part by part.
MULTIPART_PART_SIZE = 5 * 1024 * 1024
# Parts in flight per upload: obstore's default (12) x 5 MiB is 60 MiB of buffers
# per blob, and each part costs about twice its size while it is sent; capture
# runs several uploads at once, so keep each one small (at 2, a 2 GiB capture
# into S3 peaks under 90 MiB in the daemon: benchmarks/results/bigfile.md).
MULTIPART_CONCURRENCY = 2
# Objects per listing page (S3 returns at most 1000).
LIST_PAGE_SIZE = 1000

# obstore raises its own classes, plus builtin FileNotFoundError for a missing
# object and plain OSError for some local-directory failures.
_BACKEND_ERRORS = (BaseError, OSError)

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)

T = TypeVar("T")


def _to_ms(moment: dt.datetime) -> int:
    """Milliseconds since the epoch, exactly (no float rounding)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return (moment - _EPOCH) // dt.timedelta(milliseconds=1)


def error_summary(error: BaseException) -> str:
    """The first line of an obstore error message."""
    # obstore messages carry a multi-line "Debug source" dump; the first line
    # already says what failed and where.
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _info(meta: Any) -> BlobInfo:
    return BlobInfo(
        key=meta["path"], size=int(meta["size"]), last_modified_ms=_to_ms(meta["last_modified"])
    )


class ObjectBlobStore(BlobStore):
    """A BlobStore backed by an obstore ``ObjectStore``.

    ``url`` names the store in errors and in GetServerInfo; pass it without
    credentials (``open_blobs`` does). ``local_dir`` is the directory behind a
    ``LocalStore`` (``open_blobs`` sets it for ``file://``): the engines then move
    small blobs in batches with plain os calls (see ``blobs/local.py``).
    """

    def __init__(
        self, store: ObjectStore, url: str, *, local_dir: LocalBlobDir | None = None
    ) -> None:
        self._store = store
        self.url = url
        self.local_dir = local_dir
        self._conditional_create = True  # cleared when the backend refuses it

    def __repr__(self) -> str:
        return f"ObjectBlobStore({self.url!r})"

    @property
    def object_store(self) -> ObjectStore:
        """The underlying obstore store (for callers that need obstore directly)."""
        return self._store

    def _translate(self, operation: str, key: str, error: BaseException) -> Exception:
        if isinstance(error, FileNotFoundError):
            return BlobNotFoundError(key)
        return BlobStoreError(f"{operation} {key!r} on {self.url} failed: {error_summary(error)}")

    @contextmanager
    def _errors(self, operation: str, key: str) -> Iterator[None]:
        try:
            yield
        except _BACKEND_ERRORS as error:
            raise self._translate(operation, key, error) from error

    async def put(
        self, key: str, data: bytes | AsyncIterable[bytes], *, if_absent: bool = True
    ) -> bool:
        """Store ``data`` (bytes or an async iterable of chunks) under ``key``.

        With ``if_absent`` an existing key is left untouched and False is
        returned; otherwise True after the bytes were written. Raises
        BlobStoreError when the backend fails (nothing is half-written: obstore
        puts are atomic).
        """
        local = self.local_dir
        if local is not None and local.path(key) is not None:
            # Our own writer: complete or absent, synced before we return.
            if isinstance(data, VerifiedFile):
                return await _copy_natively(functools.partial(local.put_verified, key, data), data)
            if if_absent and isinstance(data, bytes | bytearray | memoryview):
                return await asyncio.to_thread(local.put_durably, key, data)
        written = await self._put_obstore(key, data, if_absent)
        if written and local is not None and local.path(key) is not None:
            await asyncio.to_thread(local.sync, key)  # LocalStore does not sync
        return written

    async def _put_obstore(
        self, key: str, data: bytes | AsyncIterable[bytes], if_absent: bool
    ) -> bool:
        if isinstance(data, bytes | bytearray | memoryview):
            return await self._put_small(key, bytes(data), if_absent)
        stream = aiter(data)
        head = await _read_up_to(stream, MULTIPART_PART_SIZE + 1)
        if len(head) <= MULTIPART_PART_SIZE:
            return await self._put_small(key, head, if_absent)
        if if_absent and await self.head(key) is not None:
            await _close(stream)
            return False
        with self._errors("put", key):
            await obstore.put_async(
                self._store,
                key,
                _chain(head, stream),
                use_multipart=True,
                chunk_size=MULTIPART_PART_SIZE,
                max_concurrency=MULTIPART_CONCURRENCY,
            )
        return True

    async def _put_small(self, key: str, data: bytes, if_absent: bool) -> bool:
        if if_absent and self._conditional_create:
            try:
                await obstore.put_async(self._store, key, data, mode="create")
                return True
            except AlreadyExistsError:
                return False
            except (NotSupportedError, NotImplementedError):
                # e.g. S3 with conditional_put="disabled" for a backend that
                # ignores or rejects If-None-Match.
                self._conditional_create = False
            except _BACKEND_ERRORS as error:
                raise self._translate("put", key, error) from error
        if if_absent and await self.head(key) is not None:
            return False
        with self._errors("put", key):
            await obstore.put_async(self._store, key, data)
        return True

    async def get(self, key: str) -> bytes:
        """All bytes of the blob. Raises BlobNotFoundError or BlobStoreError."""
        with self._errors("get", key):
            result = await obstore.get_async(self._store, key)
            return bytes(await result.bytes_async())

    async def get_stream(self, key: str, chunk_size: int = 1 << 20) -> AsyncIterator[bytes]:
        """Chunks of the blob (each at least ``chunk_size`` bytes but the last).

        Raises BlobNotFoundError on the first iteration when the key is missing,
        BlobStoreError when the backend fails mid-stream.
        """
        with self._errors("get", key):
            result = await obstore.get_async(self._store, key)
            async for chunk in result.stream(min_chunk_size=chunk_size):
                yield chunk

    async def get_range_stream(
        self, key: str, start: int, end: int, chunk_size: int = 1 << 20
    ) -> AsyncIterator[bytes]:
        """The bytes ``[start, end)`` of the blob in chunks (at least
        ``chunk_size`` bytes but the last), with one ranged request; fewer when
        the object ends first. Raises BlobNotFoundError on the first iteration
        when the key is missing, BlobStoreError."""
        if end <= start:
            return
        local = self.local_dir
        if local is not None and local.path(key) is not None:
            # Read straight from the file, a chunk per worker-thread trip
            # (obstore's LocalStore hops to its own pool per small piece).
            fd = await asyncio.to_thread(local.open_for_reading, key)
            try:
                at = start
                while at < end:
                    chunk = await asyncio.to_thread(os.pread, fd, min(chunk_size, end - at), at)
                    if not chunk:
                        return
                    at += len(chunk)
                    yield chunk
            except OSError as error:
                raise self._translate("get", key, error) from error
            finally:
                os.close(fd)
            return
        with self._errors("get", key):
            try:
                result = await obstore.get_async(self._store, key, options={"range": (start, end)})
            except FileNotFoundError:
                raise
            except _BACKEND_ERRORS:
                # A range starting past the end (a truncated object) is refused.
                size = int((await obstore.head_async(self._store, key))["size"])
                if start >= min(end, size):
                    return
                result = await obstore.get_async(
                    self._store, key, options={"range": (start, min(end, size))}
                )
            async for chunk in result.stream(min_chunk_size=chunk_size):
                yield chunk

    async def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> builtins.list[bytes]:
        """The bytes ``[start, end)`` of each range, in one call (obstore fetches
        the ranges concurrently and merges close ones). A range past the end of
        the object comes back short. Raises BlobNotFoundError, BlobStoreError."""
        if not ranges:
            return []
        local = self.local_dir
        if local is not None and local.path(key) is not None:
            return await asyncio.to_thread(local.get_ranges, key, list(ranges))
        info = None
        with self._errors("get", key):
            try:
                found = await obstore.get_ranges_async(
                    self._store,
                    key,
                    starts=[start for start, _ in ranges],
                    ends=[end for _, end in ranges],
                )
                return [bytes(part) for part in found]
            except FileNotFoundError:
                raise
            except _BACKEND_ERRORS:
                # Backends refuse a range past the end (a truncated object)
                # instead of returning it short: read what is there.
                info = await obstore.head_async(self._store, key)
        size = int(info["size"])
        clipped = [(min(start, size), min(end, size)) for start, end in ranges]
        wanted = [i for i, (start, end) in enumerate(clipped) if end > start]
        out = [b""] * len(ranges)
        if wanted:
            with self._errors("get", key):
                found = await obstore.get_ranges_async(
                    self._store,
                    key,
                    starts=[clipped[i][0] for i in wanted],
                    ends=[clipped[i][1] for i in wanted],
                )
            for i, part in zip(wanted, found, strict=True):
                out[i] = bytes(part)
        return out

    async def put_learned(
        self, beside: str, source: VerifiedFile, *, unless_beside: bool = False
    ) -> tuple[str, bool] | None:
        """See ``base.put_learned``: natively into a local directory; None
        (not done, nothing read) for any other backend, whose objects are
        named before their first byte goes up."""
        local = self.local_dir
        if local is None or local.path(beside) is None:
            return None
        copy = functools.partial(local.put_learned, beside, source, unless_beside)
        return await _copy_natively(copy, source)

    async def head(self, key: str) -> BlobInfo | None:
        """Size and upload time of the blob, or None when it does not exist."""
        try:
            with self._errors("head", key):
                return _info(await obstore.head_async(self._store, key))
        except BlobNotFoundError:
            return None

    async def list(self, prefix: str) -> list[BlobInfo]:
        """Every object whose key starts with the path segments of ``prefix``.

        Prefixes match whole segments (``a/b`` lists ``a/b/c``, not ``a/bc``), as
        in obstore. ``last_modified_ms`` is the backend's last-modified time: the
        file's mtime for a directory (when its bytes were written), the put
        time in memory, whole seconds on S3. Raises BlobStoreError when listing
        fails.
        """
        found: list[BlobInfo] = []
        async for page in self.list_pages(prefix):
            found.extend(page)
        return found

    async def list_pages(self, prefix: str) -> AsyncIterator[builtins.list[BlobInfo]]:
        """``list`` one page (at most LIST_PAGE_SIZE objects) at a time, so a
        caller walking a bucket of millions holds one page, not all of it.
        Raises BlobStoreError when listing fails (also mid-way)."""
        with self._errors("list", prefix):
            async for page in obstore.list(self._store, prefix, chunk_size=LIST_PAGE_SIZE):
                yield [_info(meta) for meta in page]

    async def delete(self, key: str) -> None:
        """Remove the key; a missing key is not an error. Raises BlobStoreError."""
        try:
            with self._errors("delete", key):
                await obstore.delete_async(self._store, key)
        except BlobNotFoundError:
            pass  # the local-directory backend reports a missing file; S3 does not

    # ---------------------------------------------------------------- batches
    #
    # A local directory does a whole batch natively in one worker-thread trip;
    # every other backend (and a key obstore would percent-encode) takes the
    # protocol's default over the single-key requests.

    def _split(self, keys: Sequence[str]) -> tuple[builtins.list[int], builtins.list[int]]:
        """Positions of the keys the local directory takes natively, and the rest."""
        local = self.local_dir
        if local is None:
            return [], list(range(len(keys)))
        plain: builtins.list[int] = []
        other: builtins.list[int] = []
        for i, key in enumerate(keys):
            (plain if local.path(key) is not None else other).append(i)
        return plain, other

    async def put_many(self, items: Sequence[tuple[str, bytes]]) -> builtins.list[bool]:
        """See ``BlobStore.put_many``: durable on return."""
        plain, other = self._split([key for key, _ in items])
        written = [False] * len(items)
        if plain:
            local = self.local_dir
            assert local is not None
            batch = [(items[i][0], bytes(items[i][1])) for i in plain]
            for i, done in zip(plain, await asyncio.to_thread(local.put_many, batch), strict=True):
                written[i] = done
        if other:
            rest = await default_put_many(self, [items[i] for i in other])
            for i, done in zip(other, rest, strict=True):
                written[i] = done
        return written

    async def missing(self, keys: Sequence[str]) -> builtins.list[str]:
        """See ``BlobStore.missing``."""
        plain, other = self._split(keys)
        absent: set[str] = set()
        if plain:
            local = self.local_dir
            assert local is not None
            absent.update(await asyncio.to_thread(local.missing, [keys[i] for i in plain]))
        if other:
            absent.update(await default_missing(self, [keys[i] for i in other]))
        return [key for key in keys if key in absent]

    async def get_many(self, keys: Sequence[str]) -> builtins.list[bytes]:
        """See ``BlobStore.get_many``."""
        plain, other = self._split(keys)
        out: builtins.list[bytes] = [b""] * len(keys)
        if plain:
            local = self.local_dir
            assert local is not None
            found = await asyncio.to_thread(local.get_many, [keys[i] for i in plain])
            for i, data in zip(plain, found, strict=True):
                out[i] = data
        if other:
            for i, data in zip(
                other, await default_get_many(self, [keys[i] for i in other]), strict=True
            ):
                out[i] = data
        return out


async def _copy_natively(copy: Callable[[], T], source: VerifiedFile) -> T:
    """``copy`` (a ``LocalBlobDir`` put of ``source``) in a worker thread. ``source.on_bytes`` hears of
    the verified bytes while the copy runs (the reader's ``bytes_verified``,
    polled every progress interval), not only at its end. A cancelled caller
    stops the copy at its next chunk and waits for it: no write to the blob
    directory, and no read of the workspace file, outlives the put (nor the
    capture)."""
    copying = asyncio.ensure_future(asyncio.to_thread(copy))
    reported = 0

    def report() -> None:
        nonlocal reported
        done = source.reader.bytes_verified
        if source.on_bytes is not None and done > reported:
            source.on_bytes(done - reported)
        reported = max(reported, done)

    try:
        # asyncio.wait never cancels what it waits for: the copy runs on.
        while not (await asyncio.wait({copying}, timeout=REPORT_INTERVAL_S))[0]:
            report()
        written = copying.result()
        # Done: the whole size (also when the key was there and nothing was read).
        if source.on_bytes is not None and source.reader.size > reported:
            source.on_bytes(source.reader.size - reported)
        return written
    except asyncio.CancelledError:
        source.reader.stop()
        with contextlib.suppress(BaseException):
            await copying
        raise


def local_dir_of(blobs: BlobStore) -> LocalBlobDir | None:
    """The local directory behind ``blobs``, if the engines may use it directly.

    Only an ``ObjectBlobStore`` itself qualifies: a wrapper around one may watch
    or change what its methods do, so it keeps the per-blob async path.
    """
    return blobs.local_dir if isinstance(blobs, ObjectBlobStore) else None


async def _read_up_to(stream: AsyncIterator[bytes], limit: int) -> bytes:
    """Read chunks until at least ``limit`` bytes or the end of the stream."""
    parts: list[bytes] = []
    total = 0
    while total < limit:
        try:
            chunk = await anext(stream)
        except StopAsyncIteration:
            break
        parts.append(bytes(chunk))
        total += len(chunk)
    return b"".join(parts)


async def _chain(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    yield first
    async for chunk in rest:
        yield chunk


async def _close(stream: AsyncIterator[bytes]) -> None:
    # An async generator left half-read would only be closed by the GC (with a
    # warning); close it now so files it holds open are released.
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        await aclose()


__all__ = ["MULTIPART_PART_SIZE", "ObjectBlobStore", "local_dir_of"]
