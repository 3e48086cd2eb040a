"""The checks an append makes and the ``WriteTx`` interface a dialect implements for
``SqlCheckpointStore`` (see ``_core`` for the rules)."""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .. import ids
from ..errors import (
    SandboxCheckpointConflictError,
    SandboxCheckpointDuplicateIdError,
    SandboxCheckpointNotHeadError,
    SandboxCheckpointParentMismatchError,
)
from ..model import Checkpoint, WriterLike
from . import _documents as documents
from ._keysets import KeySet, Rows, RunChange
from ._options import LeaseRecord, check_writer

# ------------------------------------------------------------------------ spent ids


def is_request_derived(checkpoint_id: str) -> bool:
    """True for the ids the daemon derives from a request_id (``ids.is_request_derived``)."""
    return ids.is_request_derived(checkpoint_id)


def spent_ids(deleted: Iterable[str]) -> builtins.list[str]:
    """The deleted ids that become spent (the contract: a request_id never names new content)."""
    return [checkpoint_id for checkpoint_id in deleted if is_request_derived(checkpoint_id)]


# ------------------------------------------------------------------------ checks


def duplicate_id(checkpoint_id: str) -> SandboxCheckpointDuplicateIdError:
    return SandboxCheckpointDuplicateIdError(
        f"checkpoint id {checkpoint_id!r} is already used (or was, by a deleted "
        "checkpoint made under a request_id)",
        details={"checkpoint_id": checkpoint_id},
    )


def check_append_state(
    checkpoint: Checkpoint,
    expected_head_id: str | None,
    writer: WriterLike,
    state: ThreadState,
    facts: AppendFacts,
) -> None:
    """docs/contract.md#checkpoint-store append checks 3–6 against the state read
    under the thread's lock (``state``) and the facts read after it (``facts``)."""
    thread_id = checkpoint.thread_id
    head_id = state.head_id
    check_writer(writer, thread_id, state.lease, facts.now)
    if facts.id_used:
        raise duplicate_id(checkpoint.id)
    if head_id != expected_head_id:
        raise SandboxCheckpointConflictError(
            f"the head of thread {thread_id!r} is {head_id!r}, not {expected_head_id!r}",
            details={"thread_id": thread_id, "checkpoint_id": checkpoint.id},
        )
    if checkpoint.parent_checkpoint_id != expected_head_id:
        raise SandboxCheckpointParentMismatchError(
            f"parent {checkpoint.parent_checkpoint_id!r} is not the expected head "
            f"{expected_head_id!r}",
            details={"thread_id": thread_id, "checkpoint_id": checkpoint.id},
        )


def not_head(thread_id: str, checkpoint_id: str) -> SandboxCheckpointNotHeadError:
    return SandboxCheckpointNotHeadError(
        f"{checkpoint_id!r} is not the head of thread {thread_id!r}",
        details={"thread_id": thread_id, "checkpoint_id": checkpoint_id},
    )


# ------------------------------------------------------------------------ the interface


@dataclass(frozen=True, slots=True)
class ThreadState:
    """A thread as its write transaction found it (after taking its lock)."""

    head_id: str | None
    ordinal: int  # the head ordinal of the count runs (0 for a thread without rows)
    lease: LeaseRecord | None


@dataclass(frozen=True, slots=True)
class StoredRow:
    """The columns of one checkpoint row the core needs. ``version`` tells a row
    from a later one that reuses its id (SQLite: serial; PostgreSQL: xmin)."""

    thread_id: str
    parent_id: str | None
    depth: int
    version: int


@dataclass(frozen=True, slots=True)
class AppendFacts:
    """What an append checks, read in one go after the thread's lock (PostgreSQL:
    one round trip): the clock, whether the id is used (or spent), and the row of
    the expected head."""

    now: int
    id_used: bool
    head_row: StoredRow | None


class IdTaken(Exception):
    """Raised by ``WriteTx.publish`` when the id was taken after the check (by a
    concurrent append in another thread; the database's unique key decided)."""


class WriteTx(Protocol):
    """One open write transaction of a dialect. Every method runs SQL in it."""

    async def lock_thread(self, thread_id: str) -> ThreadState:
        """Take the thread's write lock (SQLite holds the database's already) and
        read its head, ordinal and lease."""
        ...

    async def now(self) -> int:
        """The store's clock (call after ``lock_thread``)."""
        ...

    async def id_used(self, checkpoint_id: str) -> bool:
        """A stored checkpoint has the id, or a deleted one whose id is spent."""
        ...

    async def row(self, checkpoint_id: str) -> StoredRow | None: ...

    async def append_facts(self, checkpoint_id: str, head_id: str | None) -> AppendFacts:
        """``now()``, ``id_used(checkpoint_id)`` and ``row(head_id)`` together."""
        ...

    async def fork_source(self, checkpoint_id: str) -> StoredRow | None:
        """The row, protected from deletion until commit (PostgreSQL: FOR SHARE)."""
        ...

    async def thread_has_checkpoints(self, thread_id: str) -> bool: ...

    async def fetch_chains(self, checkpoint_ids: Sequence[str], rows: Rows) -> None:
        """Add to ``rows`` each checkpoint and its bases down to a keyframe."""
        ...

    async def thread_checkpoints(
        self, thread_id: str
    ) -> builtins.list[tuple[str, str | None, Any]]:
        """``(id, parent_id, created_at)`` of every checkpoint of the thread."""
        ...

    async def publish(
        self, content: documents.Content, stored: documents.Stored, change: RunChange
    ) -> int:
        """Insert the row, make it the head at ``change.new_ordinal``, apply the
        run change; returns the row's version. Raises IdTaken."""
        ...

    async def delete_rows(self, checkpoint_ids: Sequence[str]) -> Rows:
        """Delete the rows; returns what they held."""
        ...

    async def dependents(self, removed: Sequence[str]) -> Rows:
        """The rows whose delta base is one of ``removed``."""
        ...

    async def rewrite_keyframe(self, checkpoint_id: str, data: bytes) -> None: ...

    async def set_head(self, thread_id: str, head_id: str | None, ordinal: int) -> None: ...

    async def drop_runs(self, thread_id: str, keys: KeySet, ordinal: int) -> None:
        """The head at ``ordinal`` goes and its parent lacks ``keys``: each is
        counted once less and its run ends (``refs += ordinal - open_since - 1``)."""
        ...

    async def close_all_runs(self, thread_id: str, ordinal: int) -> None:
        """End every run of the thread at ``ordinal`` (``refs += ordinal - open_since``)."""
        ...

    async def reopen_runs(self, thread_id: str, keys: KeySet, old: int, new: int) -> None:
        """The parent at ``new`` becomes the head and uses ``keys``, which the old
        head lacked: open their runs at ``new``, counts unchanged."""
        ...

    async def subtract_counts(self, thread_id: str, deleted: Sequence[KeySet], cutoff: int) -> None:
        """Prune: each key counted once less per deleted checkpoint that used
        it (``deleted``: their distinct keys); ``cutoff`` is the oldest kept
        ordinal, which a run that began before it may be moved up to (a
        store may leave the run where it began and lower ``refs`` instead:
        ``refs + ordinal - open_since`` counts the same)."""
        ...

    async def forget_zero_counts(self, thread_id: str, keys: KeySet) -> None:
        """Drop count rows of these keys that count nothing (no run, refs <= 0)."""
        ...

    async def mark_spent(self, checkpoint_ids: Sequence[str]) -> None: ...

    async def index_packed_blobs(self, rows: Sequence[Any]) -> None:
        """The pack index rows of an append (see the module docstring)."""
        ...

    # leases and the blob guard

    async def lease_for_acquire(self, thread_id: str) -> tuple[LeaseRecord | None, int]:
        """Lock (creating when missing) the thread's lease state: its lease and
        the last fence handed out."""
        ...

    async def write_lease(self, thread_id: str, record: LeaseRecord) -> None:
        """Store ``record`` as the thread's lease and its fence as the last one."""
        ...

    async def set_lease_expiry(self, thread_id: str, expires_at: int) -> None: ...

    async def remove_lease(self, thread_id: str, token: str, fence: int) -> None:
        """Remove the lease only when it is still this one."""
        ...

    async def drop_pins(self, thread_id: str, token: str, fence: int) -> None: ...

    async def pin(
        self, thread_id: str, token: str, fence: int, keys: Sequence[bytes]
    ) -> set[bytes]:
        """Record the pins; return those of ``keys`` condemned right now (PostgreSQL
        share-locks their mark rows first, so a condemnation in flight finishes)."""
        ...

    async def release_condemned(self, keys: Sequence[bytes]) -> None: ...

    async def mark_missing(self, keys: Sequence[bytes], now: int) -> None: ...

    async def clear_missing(self, keys: Sequence[bytes]) -> None: ...
