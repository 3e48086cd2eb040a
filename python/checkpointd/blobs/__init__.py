"""Content-addressed blob stores on obstore (docs/contract.md#data-model, docs/contract.md#python-api).

``open_blobs(url)`` gives an ``ObjectBlobStore`` for ``memory://``,
``file:///dir``, ``s3://bucket/prefix``, ``gs://…`` and ``az://…``; every store
implements the ``BlobStore`` protocol of ``checkpointd.blobs.base``. For a
``file://`` store, ``local_dir_of(store)`` gives a ``LocalBlobDir``: blocking,
plain-os access to the same directory that the engines use to move many small
blobs per worker-thread trip.
"""

from __future__ import annotations

from .base import BlobInfo, BlobNotFoundError, BlobStore, BlobStoreError
from .local import LocalBlobDir
from .object_store import ObjectBlobStore, local_dir_of
from .urls import SUPPORTED_SCHEMES, open_blobs

__all__ = [
    "SUPPORTED_SCHEMES",
    "BlobInfo",
    "BlobNotFoundError",
    "BlobStore",
    "BlobStoreError",
    "LocalBlobDir",
    "ObjectBlobStore",
    "local_dir_of",
    "open_blobs",
]
