"""The checkpoint-store and instance-store protocols of SPEC §3.

Every store we ship (memory, SQLite, PostgreSQL) implements these and passes the
suites in ``checkpointd.testkit``; users' own stores can too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ..model import BlobReference, Checkpoint, WriterLease, WriterLike

Clock = Callable[[], int]
"""Returns the current time in milliseconds since the epoch."""

DEFAULT_LEASE_DURATION_MS = 120_000
DEFAULT_RENEW_AFTER_MS = 45_000


@runtime_checkable
class CheckpointStore(Protocol):
    async def get(self, checkpoint_id: str) -> Checkpoint | None: ...

    async def list(self, thread_id: str) -> list[Checkpoint]: ...

    async def get_head(self, thread_id: str) -> str | None: ...

    async def append(
        self, checkpoint: Checkpoint, expected_head_id: str | None, writer: WriterLike
    ) -> str: ...

    async def delete_head(self, thread_id: str, checkpoint_id: str, writer: WriterLike) -> None: ...

    async def acquire_writer(self, thread_id: str) -> WriterLease: ...

    async def list_blob_references(self) -> list[BlobReference]: ...

    async def delete_checkpoints(
        self, thread_id: str, keep: int, writer: WriterLike
    ) -> list[str]: ...

    async def fork_from_checkpoint(
        self,
        source_thread_id: str,
        source_checkpoint_id: str,
        destination_thread_id: str,
        destination_checkpoint_id: str,
        created_at: int,
        writer: WriterLike,
    ) -> Checkpoint: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True, slots=True)
class InstanceRecord:
    """Which provider sandbox serves a key (SPEC §3, instance store)."""

    key: str
    provider: str
    provider_sandbox_id: str
    thread_id: str
    updated_at: int
    latest_snapshot_id: str | None = None
    latest_run_id: str | None = None


@runtime_checkable
class InstanceStore(Protocol):
    async def get(self, key: str) -> InstanceRecord | None: ...

    async def upsert(self, record: InstanceRecord) -> None: ...

    async def delete(self, key: str) -> None: ...

    async def aclose(self) -> None: ...
