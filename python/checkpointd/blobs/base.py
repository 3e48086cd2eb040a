"""The blob-store protocol: content-addressed bytes in a bucket or a directory.

Implementations stream: ``put`` takes bytes or an async iterable of chunks (large
blobs go up as multipart), ``get_stream`` yields chunks. Keys are the SPEC §2
shapes (``sandbox-files/blake3/<hex>``, ``sandbox-artifacts/blake3/<hex>``) but the
store itself does not care what a key looks like.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


class BlobNotFoundError(KeyError):
    """The key does not exist in the blob store."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key

    def __str__(self) -> str:
        return f"blob not found: {self.key}"


class BlobStoreError(Exception):
    """The blob backend failed (unreachable, denied...); names the store and key."""


@dataclass(frozen=True, slots=True)
class BlobInfo:
    key: str
    size: int
    last_modified_ms: int  # upload time, ms since epoch (the sweep's age)


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

    async def delete(self, key: str) -> None:
        """Remove the key; a missing key is not an error."""
        ...
