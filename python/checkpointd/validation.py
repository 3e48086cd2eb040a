"""The rules of docs/contract.md#data-model, applied in one place by every store, capture and restore.

Each ``check_*`` raises the documented error class and names the offending value;
``path_problem`` returns a reason string instead, so restore can report
``SANDBOX_SNAPSHOT_INVALID_PATH`` with the same rules.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from typing import Any

from . import _native
from .chunks import chunks_problem
from .errors import (
    INVALID_PATH,
    SandboxCheckpointInvalidEntryError,
    SandboxCheckpointInvalidIdError,
    SandboxSnapshotError,
)
from .model import (
    ARTIFACT_KEY_PREFIX,
    FILE_KEY_PREFIX,
    REASONS,
    STASH_SUFFIX,
    Artifact,
    Checkpoint,
    DirEntry,
    FileEntry,
    Policy,
    SecretSpan,
    SymlinkEntry,
    stash_owner,
)

_HEX64 = re.compile(r"[0-9a-f]{64}")
MAX_MODE = 0o777

# Ids (threads, checkpoints, request ids, artifact ids) are at most this many
# UTF-8 bytes: an id is echoed in errors, logs and gRPC trailers, and a client
# library may refuse trailers beyond a few KiB (grpc-js stalls the connection).
MAX_ID_BYTES = 512
# How much of a refused value an error message shows.
_SHOWN_CHARS = 64


def shown(value: object) -> str:
    """``repr(value)``, cut to a length any error message can carry."""
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 1] + "…"


def is_well_formed_text(value: object) -> bool:
    """True for a ``str`` that encodes to UTF-8 (no lone surrogate)."""
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_id(value: object, what: str = "id") -> str:
    """Raise SandboxCheckpointInvalidIdError unless ``value`` is a valid id."""
    if not isinstance(value, str) or value == "" or not is_well_formed_text(value):
        raise SandboxCheckpointInvalidIdError(
            f"invalid {what}: {shown(value)} (ids are non-empty, well-formed Unicode strings)",
            details={"field": what},
        )
    size = len(value.encode("utf-8"))
    # A stash thread's id is its thread's id plus STASH_SUFFIX: over the limit
    # by that much at most, so a thread of the longest id has a stash too.
    limit = MAX_ID_BYTES + (len(STASH_SUFFIX) if stash_owner(value) is not None else 0)
    if size > limit:
        raise SandboxCheckpointInvalidIdError(
            f"invalid {what}: {shown(value)} is {size} bytes, over the {limit}-byte limit for ids",
            details={"field": what, "limit_bytes": limit, "size_bytes": size},
        )
    return value


def check_optional_id(value: object, what: str) -> str | None:
    if value is None:
        return None
    return check_id(value, what)


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_finite_number(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value)


def path_problem(path: object) -> str | None:
    """Why ``path`` is not a valid workspace-relative entry path, or None."""
    if not isinstance(path, str) or not is_well_formed_text(path):
        return "not a well-formed Unicode string"
    if path == "":
        return "empty path"
    if "\x00" in path:
        return "contains NUL"
    if "\\" in path:
        return "contains a backslash"
    if path.startswith("/"):
        return "absolute path"
    for segment in path.split("/"):
        if segment == "":
            return "empty segment"
        if segment in (".", ".."):
            return f"'{segment}' segment"
    return None


def checked_subdir(subdir: str) -> str:
    """A request's ``workspace_subdir`` as a checkpoint records it: "" for the
    whole workspace (also "." and either with trailing "/"), else without its
    trailing "/". SandboxSnapshotError(INVALID_PATH), naming the path as
    given, unless a workspace-relative path: the sub-root is opened beneath
    the root's fd later, one component at a time, never by this string."""
    cleaned = subdir.rstrip("/")
    if cleaned in ("", "."):
        return ""
    problem = path_problem(cleaned)
    if problem is not None:
        raise SandboxSnapshotError(
            INVALID_PATH, f"bad workspace_subdir {subdir!r}: {problem}", details={"path": subdir}
        )
    return cleaned


def blob_key_problem(key: object, prefix: str) -> str | None:
    if not isinstance(key, str):
        return "blob key is not a string"
    if not key.startswith(prefix) or not _HEX64.fullmatch(key[len(prefix) :]):
        return f"blob key must be {prefix}<64 lowercase hex>"
    return None


def _entry_problem(entry: object) -> str | None:
    if isinstance(entry, FileEntry):
        problem = blob_key_problem(entry.blob_key, FILE_KEY_PREFIX)
        if problem:
            return problem
        if not is_int(entry.size) or entry.size < 0:
            return "size must be an integer >= 0"
        if not is_int(entry.mode) or not 0 <= entry.mode <= MAX_MODE:
            return "mode must be an integer in 0..0o777"
        if not is_int(entry.mtime_ns):
            return "mtime_ns must be an integer"
        return chunks_problem(entry.chunks, entry.size) or _spans_problem(entry)
    if isinstance(entry, DirEntry):
        if not is_int(entry.mode) or not 0 <= entry.mode <= MAX_MODE:
            return "mode must be an integer in 0..0o777"
        return None
    if isinstance(entry, SymlinkEntry):
        target = entry.target
        if not isinstance(target, str) or target == "" or "\x00" in target:
            return "symlink target must be a non-empty string without NUL"
        if not is_well_formed_text(target):
            return "symlink target is not well-formed Unicode"
        return None
    return f"not a file, dir or symlink entry: {type(entry).__name__}"


def _spans_problem(entry: FileEntry) -> str | None:
    if not isinstance(entry.secrets, tuple):
        return "secrets must be a tuple of SecretSpan"
    for span in entry.secrets:
        if not isinstance(span, SecretSpan):
            return "secrets must be SecretSpan records"
        if not is_int(span.offset) or not is_int(span.length) or span.offset < 0:
            return "a secret span needs an integer offset >= 0 and length"
        if span.length < _native.MIN_SECRET_LEN or span.offset + span.length > entry.size:
            return (
                f"a secret span must be at least {_native.MIN_SECRET_LEN} bytes and lie within "
                "the file"
            )
        ref = span.secret
        if not (is_int(ref) and ref >= 0) and not (  # type: ignore[operator]
            isinstance(ref, str) and ref and is_well_formed_text(ref)
        ):
            return "a secret span names its secret by index (int >= 0) or name"
    return None


def entries_problem(entries: Iterable[object]) -> tuple[str, str] | None:
    """(path, reason) for the first invalid entry, or None when all are valid.

    Checks each entry's fields and path, uniqueness, and that no entry lies
    beneath a file or a symlink.
    """
    leaves: set[str] = set()  # paths of files and symlinks
    seen: set[str] = set()
    paths: list[str] = []
    for entry in entries:
        path = getattr(entry, "path", None)
        problem = path_problem(path)
        if problem:
            return (repr(path), problem)
        assert isinstance(path, str)
        problem = _entry_problem(entry)
        if problem:
            return (path, problem)
        if path in seen:
            return (path, "duplicate path")
        seen.add(path)
        paths.append(path)
        if not isinstance(entry, DirEntry):
            leaves.add(path)
    for path in paths:
        parent = path
        while "/" in parent:
            parent = parent.rsplit("/", 1)[0]
            if parent in leaves:
                return (path, f"lies beneath the file or symlink {parent!r}")
    return None


def artifact_problem(artifact: object) -> str | None:
    if not isinstance(artifact, Artifact):
        return f"not an Artifact: {type(artifact).__name__}"
    if not isinstance(artifact.artifact_id, str) or not artifact.artifact_id:
        return "artifact_id must be a valid id"
    if not is_well_formed_text(artifact.artifact_id):
        return "artifact_id must be a valid id"
    for name in ("name", "mime_type"):
        value = getattr(artifact, name)
        if not isinstance(value, str) or value == "" or not is_well_formed_text(value):
            return f"{name} must be a non-empty string"
    if not is_int(artifact.size) or artifact.size < 0:
        return "size must be an integer >= 0"
    problem = blob_key_problem(artifact.blob_key, ARTIFACT_KEY_PREFIX)
    if problem:
        return problem
    if not is_finite_number(artifact.created_at):
        return "created_at must be finite"
    return None


def policy_problem(policy: object) -> str | None:
    """Why a recorded policy is malformed (None when it is None or well-formed)."""
    if policy is None:
        return None
    if not isinstance(policy, Policy):
        return f"not a Policy: {type(policy).__name__}"
    for name in ("exclude", "include"):
        for pattern in getattr(policy, name):
            if not isinstance(pattern, str) or not is_well_formed_text(pattern):
                return f"{name} patterns must be well-formed strings"
    if not isinstance(policy.default_excludes, bool):
        return "default_excludes must be a bool"
    return None


def _json_problem(conversation: Any) -> str | None:
    try:
        json.dumps(list(conversation), allow_nan=False, ensure_ascii=False).encode("utf-8")
    except (TypeError, ValueError, UnicodeEncodeError) as error:
        return f"conversation is not JSON: {error}"
    return None


def check_checkpoint_ids(checkpoint: Checkpoint, expected_head_id: object = None) -> None:
    """Step 1 of append: every id of the checkpoint (and the expected head)."""
    check_id(checkpoint.id, "checkpoint id")
    check_id(checkpoint.thread_id, "thread id")
    check_optional_id(checkpoint.parent_checkpoint_id, "parent checkpoint id")
    check_optional_id(expected_head_id, "expected head id")


def check_checkpoint_body(checkpoint: Checkpoint) -> None:
    """Step 2 of append: entries, artifacts, finite created_at, reason, JSON."""

    def fail(message: str, **details: Any) -> SandboxCheckpointInvalidEntryError:
        return SandboxCheckpointInvalidEntryError(
            message, details={"checkpoint_id": checkpoint.id, **details}
        )

    if not is_finite_number(checkpoint.created_at):
        raise fail(f"created_at must be a finite number, got {checkpoint.created_at!r}")
    if checkpoint.reason not in REASONS:
        raise fail(f"reason must be one of {REASONS}, got {checkpoint.reason!r}")
    for name in (
        "label",
        "source_run_id",
        "forked_from_thread_id",
        "forked_from_checkpoint_id",
        "restored_from_checkpoint_id",
    ):
        value = getattr(checkpoint, name)
        if value is not None and not is_well_formed_text(value):
            raise fail(f"{name} must be a well-formed string or None")
    problem_text = policy_problem(checkpoint.policy)
    if problem_text:
        raise fail(f"invalid recorded policy: {problem_text}")
    subdir = checkpoint.workspace_subdir
    if not isinstance(subdir, str) or (subdir != "" and path_problem(subdir) is not None):
        raise fail(f"workspace_subdir must be '' or a workspace-relative path, got {subdir!r}")
    # A trusted Manifest (made by our scan, or read back from a store that
    # checked it) is valid by construction: no per-entry pass.
    trusted = getattr(checkpoint.files, "trusted", False) is True
    problem = None if trusted else entries_problem(checkpoint.files)
    if problem:
        path, reason = problem
        raise fail(f"invalid entry {path}: {reason}", path=path)
    for artifact in checkpoint.artifacts:
        reason_text = artifact_problem(artifact)
        if reason_text:
            raise fail(f"invalid artifact: {reason_text}")
    texts = checkpoint.conversation_text
    if texts is not None and (
        not isinstance(texts, tuple)
        or len(texts) != len(checkpoint.conversation)
        or not all(isinstance(text, str) and is_well_formed_text(text) for text in texts)
    ):
        raise fail("conversation_text must be None or one well-formed str per message")
    problem_text = _json_problem(checkpoint.conversation)
    if problem_text:
        raise fail(problem_text)


def utf8_key(value: str) -> bytes:
    """Sort key: the UTF-8 bytes (Python's str order differs for astral chars)."""
    return value.encode("utf-8")
