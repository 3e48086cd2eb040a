"""One exception hierarchy for checkpointd, each class with a stable ``code``.

Class names follow the user's TypeScript API (``SandboxCheckpoint*Error``) so that
people who know it recognise them; codes are the strings the gRPC layer puts in
``google.rpc.ErrorInfo.reason`` (see ``service/status.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class SandboxCheckpointError(Exception):
    """Base of every checkpointd error.

    ``code`` is stable and machine-readable; ``details`` names the thread,
    checkpoint, path or key involved (it becomes ErrorInfo metadata on the wire).
    """

    code: str = "SANDBOX_SNAPSHOT_ERROR"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.details: dict[str, Any] = dict(details or {})

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class SandboxCheckpointConflictError(SandboxCheckpointError):
    """The thread's head is not the ``expected_head_id`` (someone else appended)."""

    code = "SANDBOX_SNAPSHOT_STALE_HEAD"


class SandboxCheckpointDuplicateIdError(SandboxCheckpointError):
    code = "SANDBOX_SNAPSHOT_DUPLICATE_ID"


class SandboxCheckpointInvalidIdError(SandboxCheckpointError):
    """An id is empty, not a ``str``, or not well-formed Unicode (lone surrogate)."""

    code = "SANDBOX_SNAPSHOT_INVALID_ID"


class SandboxCheckpointInvalidEntryError(SandboxCheckpointError):
    """A file entry, artifact, blob key or ``created_at`` breaks the data model."""

    code = "SANDBOX_SNAPSHOT_INVALID_ENTRY"


class SandboxCheckpointParentMismatchError(SandboxCheckpointError):
    code = "SANDBOX_SNAPSHOT_PARENT_MISMATCH"


class SandboxCheckpointNotHeadError(SandboxCheckpointError):
    code = "SANDBOX_SNAPSHOT_NOT_HEAD"


class SandboxCheckpointWriterConflictError(SandboxCheckpointError):
    """Another writer holds a live lease on the thread; acquiring does not wait."""

    code = "SANDBOX_SNAPSHOT_WRITER_CONFLICT"


class SandboxCheckpointWriterLostError(SandboxCheckpointError):
    """The writer is for another thread, expired, or was replaced by a newer lease."""

    code = "SANDBOX_SNAPSHOT_WRITER_LOST"


class SandboxCheckpointInvalidArgumentError(SandboxCheckpointError, ValueError):
    """A bad option or argument (``keep < 1``, short secret, bad store options...)."""

    code = "SANDBOX_SNAPSHOT_INVALID_ARGUMENT"


class SandboxSnapshotError(SandboxCheckpointError):
    """Capture/restore failures; ``code`` is one of the ``SANDBOX_SNAPSHOT_*`` below."""

    code = "SANDBOX_SNAPSHOT_ERROR"

    def __init__(
        self,
        code: str,
        message: str,
        *,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message, code=code, details=details)


# Codes used with SandboxSnapshotError / SandboxCheckpointError(code=...).
UNSUPPORTED_ENTRY = "SANDBOX_SNAPSHOT_UNSUPPORTED_ENTRY"
MISSING_CHECKPOINT = "SANDBOX_SNAPSHOT_MISSING_CHECKPOINT"
MISSING_BLOB = "SANDBOX_SNAPSHOT_MISSING_BLOB"
INVALID_BLOB = "SANDBOX_SNAPSHOT_INVALID_BLOB"
INVALID_PATH = "SANDBOX_SNAPSHOT_INVALID_PATH"
FORK_SOURCE_NOT_FOUND = "SANDBOX_SNAPSHOT_FORK_SOURCE_NOT_FOUND"
FORK_SOURCE_THREAD_MISMATCH = "SANDBOX_SNAPSHOT_FORK_SOURCE_THREAD_MISMATCH"
FORK_DESTINATION_NOT_EMPTY = "SANDBOX_SNAPSHOT_FORK_DESTINATION_NOT_EMPTY"
# A file kept changing while a capture read it (never stored torn).
FILE_CHANGED = "SANDBOX_SNAPSHOT_FILE_CHANGED"
# A store backend is unreachable or failed (database down, bucket unreachable).
STORE_UNAVAILABLE = "SANDBOX_SNAPSHOT_STORE_UNAVAILABLE"

__all__ = [
    "FILE_CHANGED",
    "FORK_DESTINATION_NOT_EMPTY",
    "FORK_SOURCE_NOT_FOUND",
    "FORK_SOURCE_THREAD_MISMATCH",
    "INVALID_BLOB",
    "INVALID_PATH",
    "MISSING_BLOB",
    "MISSING_CHECKPOINT",
    "STORE_UNAVAILABLE",
    "UNSUPPORTED_ENTRY",
    "SandboxCheckpointConflictError",
    "SandboxCheckpointDuplicateIdError",
    "SandboxCheckpointError",
    "SandboxCheckpointInvalidArgumentError",
    "SandboxCheckpointInvalidEntryError",
    "SandboxCheckpointInvalidIdError",
    "SandboxCheckpointNotHeadError",
    "SandboxCheckpointParentMismatchError",
    "SandboxCheckpointWriterConflictError",
    "SandboxCheckpointWriterLostError",
    "SandboxSnapshotError",
]
