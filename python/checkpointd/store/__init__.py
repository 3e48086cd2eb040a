"""Checkpoint stores and instance stores (docs/contract.md#checkpoint-store), opened by URL.

``open_store(url)`` and ``open_instance_store(url)`` take ``memory://``,
``sqlite:///abs/path.db`` and ``postgresql://…`` (also ``postgres://``);
``open_store`` also takes ``checkpointd+gateway://host:port[,host:port…]?token_file=/abs/path``
(``&ca_file=…``, ``&tls=false`` on loopback): the store behind a
``checkpointd gateway`` (docs/gateway.md). The
PostgreSQL classes are imported on first use so that ``asyncpg`` is only loaded
when a PostgreSQL URL is opened.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from ..errors import SandboxCheckpointInvalidArgumentError
from ._options import validate_store_options
from .base import (
    DEFAULT_LEASE_DURATION_MS,
    DEFAULT_RENEW_AFTER_MS,
    BlobAudit,
    BlobCount,
    BlobGuard,
    CheckpointStore,
    Clock,
    InstanceRecord,
    InstanceStore,
    ThreadListing,
    ThreadSummary,
)
from .memory import InMemoryCheckpointStore, InMemoryInstanceStore
from .sqlite import SqliteCheckpointStore, SqliteInstanceStore

if TYPE_CHECKING:
    from .postgres import PostgresCheckpointStore, PostgresInstanceStore

_LAZY = {
    "PostgresCheckpointStore": "checkpointd.store.postgres",
    "PostgresInstanceStore": "checkpointd.store.postgres",
}

__all__ = [
    "BlobAudit",
    "BlobCount",
    "BlobGuard",
    "CheckpointStore",
    "InMemoryCheckpointStore",
    "InMemoryInstanceStore",
    "InstanceRecord",
    "InstanceStore",
    "PostgresCheckpointStore",
    "PostgresInstanceStore",
    "SqliteCheckpointStore",
    "SqliteInstanceStore",
    "ThreadListing",
    "ThreadSummary",
    "open_instance_store",
    "open_store",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'checkpointd.store' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def _scheme(url: object) -> str:
    if not isinstance(url, str) or "://" not in url:
        raise SandboxCheckpointInvalidArgumentError(
            f"not a store URL: {url!r} (use memory://, sqlite:///abs/path.db or postgresql://…)"
        )
    return url.split("://", 1)[0].lower()


def _sqlite_path(url: str) -> str:
    """The absolute file path of ``sqlite:///abs/path.db`` (percent-escapes decoded)."""
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise SandboxCheckpointInvalidArgumentError(
            f"sqlite URL must be sqlite:///absolute/path.db, got {url!r}"
        )
    path = unquote(parts.path)
    if not path.startswith("/") or path == "/" or path.endswith("/"):
        raise SandboxCheckpointInvalidArgumentError(
            f"sqlite URL must name an absolute file path (sqlite:///abs/path.db), got {url!r}"
        )
    if parts.query or parts.fragment:
        raise SandboxCheckpointInvalidArgumentError(
            f"sqlite URL takes no query or fragment, got {url!r}"
        )
    return path


def _check_memory(url: str) -> None:
    if url.lower() not in ("memory://", "memory:///"):
        raise SandboxCheckpointInvalidArgumentError(
            f"memory store URL takes nothing after memory://, got {url!r}"
        )


async def open_store(
    url: str,
    *,
    now: Clock | None = None,
    lease_duration_ms: int = DEFAULT_LEASE_DURATION_MS,
    renew_after_ms: int = DEFAULT_RENEW_AFTER_MS,
) -> Any:
    """Open a checkpoint store by URL (docs/contract.md#python-api).

    ``memory://`` gives a new empty store each call; ``sqlite:///abs/path.db``
    creates the file and its schema when missing; ``postgresql://…`` connects to a
    server. Raises SandboxCheckpointInvalidArgumentError for an unknown scheme, a
    malformed URL or bad options. The store is an async context manager; close it
    with ``aclose()``.
    """
    scheme = _scheme(url)
    validate_store_options(now, lease_duration_ms, renew_after_ms)
    options: dict[str, Any] = {
        "now": now,
        "lease_duration_ms": lease_duration_ms,
        "renew_after_ms": renew_after_ms,
    }
    if scheme == "memory":
        _check_memory(url)
        return InMemoryCheckpointStore(**options)
    if scheme == "sqlite":
        return await SqliteCheckpointStore.open(_sqlite_path(url), **options)
    if scheme in ("postgresql", "postgres"):
        postgres = importlib.import_module("checkpointd.store.postgres")
        return await postgres.open_postgres_store(url, **options)
    if scheme == "checkpointd+gateway":
        if now is not None:
            raise SandboxCheckpointInvalidArgumentError(
                "a gateway store keeps its own clock and lease settings (no now=)"
            )
        gateway = importlib.import_module("checkpointd.gateway.remote")
        return await gateway.open_remote_store(url)
    raise SandboxCheckpointInvalidArgumentError(
        f"unknown store URL scheme {scheme!r} in {url!r} "
        "(use memory://, sqlite:///abs/path.db or postgresql://…)"
    )


async def open_instance_store(url: str) -> Any:
    """Open an instance store by URL (same URLs as ``open_store``).

    Raises SandboxCheckpointInvalidArgumentError for an unknown scheme or a
    malformed URL.
    """
    scheme = _scheme(url)
    if scheme == "memory":
        _check_memory(url)
        return InMemoryInstanceStore()
    if scheme == "sqlite":
        return await SqliteInstanceStore.open(_sqlite_path(url))
    if scheme in ("postgresql", "postgres"):
        postgres = importlib.import_module("checkpointd.store.postgres")
        return await postgres.open_postgres_instance_store(url)
    raise SandboxCheckpointInvalidArgumentError(
        f"unknown store URL scheme {scheme!r} in {url!r} "
        "(use memory://, sqlite:///abs/path.db or postgresql://…)"
    )
