"""One exception hierarchy for checkpointd, each class with a stable ``code``.

Class names follow the user's TypeScript API (``SandboxCheckpoint*Error``) so that
people who know it recognise them; codes are the strings the gRPC layer puts in
``google.rpc.ErrorInfo.reason`` (see ``service/status.py``).
"""

from __future__ import annotations

import errno
import os
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
# The filesystem (or quota) holding the named path is full (ENOSPC, EDQUOT).
NO_SPACE = "SANDBOX_SNAPSHOT_NO_SPACE"
# A name or path is longer than the filesystem allows (ENAMETOOLONG).
NAME_TOO_LONG = "SANDBOX_SNAPSHOT_NAME_TOO_LONG"
# A rename or link would cross filesystems (EXDEV), e.g. a mount inside the workspace.
CROSS_DEVICE = "SANDBOX_SNAPSHOT_CROSS_DEVICE"
# Permission denied, or a read-only filesystem (EACCES, EPERM, EROFS).
PERMISSION_DENIED = "SANDBOX_SNAPSHOT_PERMISSION_DENIED"
# A capture names an artifact record whose blob was never uploaded (or was
# swept): the caller's mistake, not lost data; upload it again.
ARTIFACT_NOT_UPLOADED = "SANDBOX_SNAPSHOT_ARTIFACT_NOT_UPLOADED"


class SandboxCheckpointDamagedError(SandboxSnapshotError):
    """A stored checkpoint cannot be read: its document fails its checksum or
    does not decode (bit rot in the store), or it is stored as a delta against
    one that cannot be read. DATA_LOSS (reason ``INVALID_BLOB``: a stored
    object whose bytes are not what was written); ``details`` name the
    checkpoint asked for (``checkpoint_id``) and the damaged one
    (``damaged_checkpoint_id``, the same when it is itself damaged)."""

    def __init__(
        self, checkpoint_id: str, reason: str, *, damaged_checkpoint_id: str | None = None
    ) -> None:
        damaged = checkpoint_id if damaged_checkpoint_id is None else damaged_checkpoint_id
        if damaged == checkpoint_id:
            what = f"checkpoint {checkpoint_id!r} is damaged in the store: {reason}"
        else:
            what = (
                f"checkpoint {checkpoint_id!r} cannot be read: it is stored against "
                f"checkpoint {damaged!r}, which is damaged in the store: {reason}"
            )
        super().__init__(
            INVALID_BLOB,
            what + "; prune or delete-head removes it, and the thread's next capture is stored "
            "whole",
            details={"checkpoint_id": checkpoint_id, "damaged_checkpoint_id": damaged},
        )
        self.checkpoint_id = checkpoint_id
        self.damaged_checkpoint_id = damaged
        self.reason = reason


# Errors about the workspace root itself, as opposed to an entry inside it.
_ROOT_ERRNOS = frozenset({errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EACCES, errno.EPERM})
_REMEDIES: dict[str, str] = {
    NO_SPACE: "free space on that filesystem and try again",
    NAME_TOO_LONG: "shorten the name or path",
    CROSS_DEVICE: "keep the workspace on one filesystem (or exclude the mount)",
    PERMISSION_DENIED: "fix the permissions or exclude the path",
    FILE_CHANGED: "capture again when nothing writes to it",
}


def from_os_error(error: OSError, *, root: str | None = None) -> SandboxCheckpointError | None:
    """The checkpointd error for an OS-level failure, or None when it has no
    class of its own (then it is a genuine I/O fault).

    This is the one map from OSError to checkpointd codes: the native scanner's
    classes (``checkpointd._native.FileChangedError``, ``RootInvalidError``,
    ``NoSpaceError``...) first, then the errno of any other OSError. The path
    goes in ``details["path"]``: the error's filename, else ``root`` (the
    workspace root the operation worked in), so the message always names one.
    A missing or unusable workspace root (``root`` itself) is the caller's bad
    input: SandboxCheckpointInvalidArgumentError.
    """
    from . import _native  # the extension is loaded by every engine already

    path = error.filename if isinstance(error.filename, str) else None
    where = path if path is not None else root
    reason = error.strerror or str(error)
    code: str | None
    if isinstance(error, _native.FileChangedError):
        code = FILE_CHANGED
    elif isinstance(error, _native.RootInvalidError) or (
        root is not None
        and path is not None
        and error.errno in _ROOT_ERRNOS
        and _same_path(path, root)
    ):
        return SandboxCheckpointInvalidArgumentError(
            f"workspace root {where!r} cannot be used: {reason}", details={"path": where}
        )
    else:
        codes: dict[type[OSError], str] = {
            _native.NoSpaceError: NO_SPACE,
            _native.NameTooLongError: NAME_TOO_LONG,
            _native.CrossDeviceError: CROSS_DEVICE,
            _native.PermissionDeniedError: PERMISSION_DENIED,
        }
        code = next((c for cls, c in codes.items() if isinstance(error, cls)), None)
        if code is None and error.errno is not None:
            # An OSError raised by Python code gets the code of the class the
            # native module raises for its errno: one errno table
            # (rust/src/error.rs ``errno_kind``).
            code = codes.get(_native.errno_error(error.errno))
    if code is None:
        return None
    remedy = _REMEDIES.get(code)
    message = f"{where}: {reason}" if where is not None else reason
    return SandboxSnapshotError(
        code,
        message + (f"; {remedy}" if remedy else ""),
        details={"path": where} if where is not None else None,
    )


def _same_path(a: str, b: str) -> bool:
    return os.path.abspath(a) == os.path.abspath(b)


__all__ = [
    "ARTIFACT_NOT_UPLOADED",
    "CROSS_DEVICE",
    "FILE_CHANGED",
    "FORK_DESTINATION_NOT_EMPTY",
    "FORK_SOURCE_NOT_FOUND",
    "FORK_SOURCE_THREAD_MISMATCH",
    "INVALID_BLOB",
    "INVALID_PATH",
    "MISSING_BLOB",
    "MISSING_CHECKPOINT",
    "NAME_TOO_LONG",
    "NO_SPACE",
    "PERMISSION_DENIED",
    "STORE_UNAVAILABLE",
    "UNSUPPORTED_ENTRY",
    "SandboxCheckpointConflictError",
    "SandboxCheckpointDamagedError",
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
    "from_os_error",
]
