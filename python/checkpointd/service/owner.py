"""The daemon's stable owner identity, so a restarted daemon takes back its own leases.

After ``kill -9`` a daemon's writer leases stay live in the store until they
expire (``lease_duration_ms``, 2 minutes by default): without an identity that
survives the restart, the new process would get WRITER_CONFLICT on its own
threads for that long. So the daemon keeps an owner id in its data directory
(``owner-id``, created once with mode 0600, read back on every start) and takes
every lease in that name: the store lets the owner of a live lease acquire it
again with a new fence, which fences off whatever the dead process left behind
(its renew, append and release get WRITER_LOST).

The store allows that to any caller with the same owner, so the daemon must not
take over a lease that one of its own running calls holds: ``OwnedStore`` keeps
the leases it handed out and not yet released, and refuses a second one on the
same thread with WRITER_CONFLICT, as docs/contract.md#capture asks of a second capture. Two
daemons must therefore never share a data directory (their socket is there too).
"""

from __future__ import annotations

import builtins
import errno
import os
import secrets
import time
from pathlib import Path
from typing import Any

from ..errors import SandboxCheckpointInvalidArgumentError, SandboxCheckpointWriterConflictError
from ..model import BlobReference, Checkpoint, WriterLease, WriterLike
from ..store.base import CheckpointStore

OWNER_FILE = "owner-id"
# A token_hex(16) is 32 characters; anything far larger is not a file we wrote.
_MAX_OWNER_BYTES = 256


def load_owner_id(data_dir: Path) -> str:
    """The daemon's owner id from ``data_dir/owner-id``, made on first use.

    The file is created with O_EXCL and mode 0600 (others must not read it: the
    id lets its holder take over this daemon's leases) and never rewritten.
    Raises SandboxCheckpointInvalidArgumentError when the file exists but is not
    a regular file holding an id (a symlink is refused, never followed).
    """
    path = data_dir / OWNER_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return _read_owner_id(path)
    try:
        os.write(fd, (secrets.token_hex(16) + "\n").encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    return _read_owner_id(path)


def _read_owner_id(path: Path) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as error:
        why = "it is a symlink" if error.errno == errno.ELOOP else str(error)
        raise SandboxCheckpointInvalidArgumentError(
            f"cannot read the daemon's owner id {path}: {why}", details={"path": str(path)}
        ) from None
    try:
        data = os.read(fd, _MAX_OWNER_BYTES + 1)
    finally:
        os.close(fd)
    text = data.decode("ascii", "replace").strip()
    if not text or len(data) > _MAX_OWNER_BYTES or not text.isprintable():
        raise SandboxCheckpointInvalidArgumentError(
            f"{path} does not hold an owner id; remove it and the daemon makes a new one "
            "(its leases then expire instead of being taken back)",
            details={"path": str(path)},
        )
    return text


# A call of this daemon holding a thread runs for seconds, not for the lease's
# two minutes: a second caller is told to come back after about as long as the
# holder has run so far, within these bounds (the lease's expiry is in the
# details too, for a holder that hangs).
_RETRY_MIN_MS = 100
_RETRY_MAX_MS = 5_000


class _Holding:
    """A thread this process is writing: when the call began, and its lease
    once the store handed it out."""

    __slots__ = ("started", "lease")

    def __init__(self, started: float) -> None:
        self.started = started
        self.lease: WriterLease | None = None


def _conflict(thread_id: str, holding: _Holding) -> SandboxCheckpointWriterConflictError:
    running_ms = int((time.monotonic() - holding.started) * 1000)
    details: dict[str, Any] = {
        "thread_id": thread_id,
        "retry_after_ms": min(max(running_ms, _RETRY_MIN_MS), _RETRY_MAX_MS),
    }
    fence = ""
    if holding.lease is not None:
        details["expires_at_ms"] = holding.lease.expires_at
        fence = f" (fence {holding.lease.fence})"
    return SandboxCheckpointWriterConflictError(
        f"thread {thread_id!r} is being written by another call of this daemon{fence}, "
        f"running for {running_ms} ms",
        details=details,
    )


class OwnedStore:
    """A checkpoint store whose writer leases are all taken in one owner's name,
    at most one at a time per thread within this process.

    Everything but ``acquire_writer`` goes straight to the wrapped store (also
    methods this class does not name, such as the BlobGuard ones).
    """

    def __init__(self, store: CheckpointStore, owner: str) -> None:
        self._store = store
        self._owner = owner
        self._held: dict[str, _Holding] = {}  # thread -> a call of this process writing it

    @property
    def inner(self) -> CheckpointStore:
        return self._store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def acquire_writer(self, thread_id: str, *, owner: str | None = None) -> WriterLease:
        """The thread's lease in this daemon's name (a lease the daemon's previous
        process left live is taken back). WRITER_CONFLICT while a call of this
        process holds it or is taking it, or another owner's lease is live.

        The thread is marked held before the store is asked: two calls that
        arrive together must not both pass the check across the ``await`` (the
        second would then fence the first, which fails with WRITER_LOST).
        """
        holding = self._held.get(thread_id)
        if holding is not None:
            raise _conflict(thread_id, holding)
        holding = _Holding(time.monotonic())
        self._held[thread_id] = holding
        try:
            inner = await self._store.acquire_writer(
                thread_id, owner=self._owner if owner is None else owner
            )
        except BaseException:
            del self._held[thread_id]
            raise

        async def renew(lease: WriterLease) -> int:
            return await inner.renew()

        async def release(lease: WriterLease) -> None:
            if self._held.get(thread_id) is holding:
                del self._held[thread_id]
            await inner.release()

        holding.lease = WriterLease(
            thread_id=inner.thread_id,
            owner_token=inner.owner_token,
            fence=inner.fence,
            expires_at=inner.expires_at,
            renew_after_ms=inner.renew_after_ms,
            renew=renew,
            release=release,
        )
        return holding.lease

    # The protocol's other methods, named so type checkers see a CheckpointStore.

    async def get(self, checkpoint_id: str) -> Checkpoint | None:
        return await self._store.get(checkpoint_id)

    async def list(self, thread_id: str) -> builtins.list[Checkpoint]:
        return await self._store.list(thread_id)

    async def get_head(self, thread_id: str) -> str | None:
        return await self._store.get_head(thread_id)

    async def append(
        self,
        checkpoint: Checkpoint,
        expected_head_id: str | None,
        writer: WriterLike,
        **index: Any,
    ) -> str:
        # ``index``: a PackIndex store's ``packed_blobs`` rows, passed on as given.
        return await self._store.append(checkpoint, expected_head_id, writer, **index)

    async def delete_head(self, thread_id: str, checkpoint_id: str, writer: WriterLike) -> None:
        await self._store.delete_head(thread_id, checkpoint_id, writer)

    async def list_blob_references(self) -> builtins.list[BlobReference]:
        return await self._store.list_blob_references()

    async def delete_checkpoints(
        self, thread_id: str, keep: int, writer: WriterLike
    ) -> builtins.list[str]:
        return await self._store.delete_checkpoints(thread_id, keep, writer)

    async def fork_from_checkpoint(
        self,
        source_thread_id: str,
        source_checkpoint_id: str,
        destination_thread_id: str,
        destination_checkpoint_id: str,
        created_at: int,
        writer: WriterLike,
    ) -> Checkpoint:
        return await self._store.fork_from_checkpoint(
            source_thread_id,
            source_checkpoint_id,
            destination_thread_id,
            destination_checkpoint_id,
            created_at,
            writer,
        )

    async def aclose(self) -> None:
        await self._store.aclose()
