"""Content-addressed blob stores on obstore (SPEC §2, §8).

``open_blobs(url)`` gives an ``ObjectBlobStore`` for ``memory://``,
``file:///dir``, ``s3://bucket/prefix``, ``gs://…`` and ``az://…``; every store
implements the ``BlobStore`` protocol of ``checkpointd.blobs.base``.
"""

from __future__ import annotations

from .base import BlobInfo, BlobNotFoundError, BlobStore, BlobStoreError
from .object_store import ObjectBlobStore
from .urls import SUPPORTED_SCHEMES, open_blobs

__all__ = [
    "SUPPORTED_SCHEMES",
    "BlobInfo",
    "BlobNotFoundError",
    "BlobStore",
    "BlobStoreError",
    "ObjectBlobStore",
    "open_blobs",
]
