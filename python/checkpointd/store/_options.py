"""Rules every checkpoint store shares: options, leases, writer checks, prune, fork.

The memory, SQLite and PostgreSQL stores keep their state differently but decide
the same way, so the decisions live here as plain functions over plain values:

* ``validate_store_options`` — the docs/contract.md#checkpoint-store options (``now``, ``lease_duration_ms``,
  ``renew_after_ms``), each store's constructor calls it first.
* ``LeaseRecord`` / ``lease_is_current`` / ``check_writer`` — a lease is current
  while ``now < expires_at`` and the record still carries the writer's
  ``owner_token`` and ``fence``; anything else is ``WRITER_LOST``.
* ``lease_holder`` / ``may_take_over`` / ``writer_conflict`` — who may acquire a
  thread whose lease is live: only the owner that holds it (a restarted daemon
  taking back its own lease, with a new fence); everyone else gets
  ``WRITER_CONFLICT`` saying when the lease expires.
* ``plan_prune`` — which checkpoints ``delete_checkpoints`` removes.
* ``check_fork_arguments`` / ``fork_checkpoint`` — the static fork checks and the
  new root it makes.
* ``key_to_bytes`` / ``key_from_bytes`` — the 33-byte form SQL stores keep blob keys
  in (a kind byte plus the raw 32-byte hash). It sorts like the UTF-8 bytes of the
  text key: ``a`` (artifacts) < ``f`` (files), and raw bytes sort like lowercase hex.
"""

from __future__ import annotations

import hashlib
import math
import re
import secrets
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import (
    FORK_DESTINATION_NOT_EMPTY,
    FORK_SOURCE_NOT_FOUND,
    FORK_SOURCE_THREAD_MISMATCH,
    SandboxCheckpointError,
    SandboxCheckpointInvalidArgumentError,
    SandboxCheckpointInvalidEntryError,
    SandboxCheckpointWriterConflictError,
    SandboxCheckpointWriterLostError,
)
from ..model import ARTIFACT_KEY_PREFIX, FILE_KEY_PREFIX, Checkpoint
from ..validation import check_id, is_finite_number, is_int, utf8_key
from ._packindex import PACK_KEY_PREFIX
from .base import (
    DEFAULT_LEASE_DURATION_MS,
    DEFAULT_RENEW_AFTER_MS,
    BlobCount,
    Clock,
    InstanceRecord,
)


def wall_clock_ms() -> int:
    """Milliseconds since the epoch from the system clock (the default ``now``)."""
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class StoreOptions:
    now: Clock
    lease_duration_ms: int
    renew_after_ms: int


def validate_store_options(
    now: Clock | None = None,
    lease_duration_ms: int = DEFAULT_LEASE_DURATION_MS,
    renew_after_ms: int = DEFAULT_RENEW_AFTER_MS,
) -> StoreOptions:
    """Check the docs/contract.md#checkpoint-store store options.

    Raises SandboxCheckpointInvalidArgumentError unless ``now`` is None or callable,
    both durations are integers, ``lease_duration_ms > 0`` and
    ``0 < renew_after_ms < lease_duration_ms``.
    """
    if now is not None and not callable(now):
        raise SandboxCheckpointInvalidArgumentError(
            f"now must be a callable returning milliseconds, got {now!r}"
        )
    if not is_int(lease_duration_ms) or lease_duration_ms <= 0:
        raise SandboxCheckpointInvalidArgumentError(
            f"lease_duration_ms must be an integer > 0, got {lease_duration_ms!r}"
        )
    if not is_int(renew_after_ms) or not 0 < renew_after_ms < lease_duration_ms:
        raise SandboxCheckpointInvalidArgumentError(
            "renew_after_ms must be an integer with 0 < renew_after_ms < "
            f"lease_duration_ms ({lease_duration_ms}), got {renew_after_ms!r}"
        )
    return StoreOptions(
        now=now if now is not None else wall_clock_ms,
        lease_duration_ms=lease_duration_ms,
        renew_after_ms=renew_after_ms,
    )


def read_clock(options: StoreOptions) -> int:
    """``now()`` as an int (a float clock is floored; a broken clock is an argument error)."""
    value = options.now()
    if is_int(value):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return math.floor(value)
    raise SandboxCheckpointInvalidArgumentError(f"now() must return milliseconds, got {value!r}")


def new_owner_token() -> str:
    """An unguessable token naming one acquisition of a lease."""
    return secrets.token_hex(16)


# --------------------------------------------------------------------------- leases


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """The stored lease of one thread (at most one per thread).

    ``holder`` is ``lease_holder(owner)`` of the owner that acquired it, or None
    when it was acquired without an owner (a random owner per call).
    """

    owner_token: str
    fence: int
    expires_at: int
    holder: str | None = None


def lease_holder(owner: object) -> str | None:
    """What a store records for ``acquire_writer(..., owner=owner)``: a digest, so
    the database never holds the identity itself (whoever learns an owner id
    could take over that owner's leases). None when ``owner`` is None.

    Raises SandboxCheckpointInvalidArgumentError unless ``owner`` is None or a
    non-empty string.
    """
    if owner is None:
        return None
    if not isinstance(owner, str) or not owner:
        raise SandboxCheckpointInvalidArgumentError(
            f"owner must be a non-empty string, got {owner!r}"
        )
    return hashlib.sha256(owner.encode("utf-8", "surrogatepass")).hexdigest()


def may_take_over(record: LeaseRecord | None, holder: str | None, now: int) -> bool:
    """True when an acquire by ``holder`` may replace ``record``: there is no live
    lease, or the live lease was acquired by the same owner (a restarted process
    taking back its own lease: the new fence makes the old writer WRITER_LOST)."""
    if record is None or now >= record.expires_at:
        return True
    return holder is not None and record.holder == holder


def writer_conflict(
    thread_id: str, record: LeaseRecord, now: int
) -> SandboxCheckpointWriterConflictError:
    """WRITER_CONFLICT for a live lease someone else holds; its details say when
    the lease expires (``expires_at_ms``) and how long to wait (``retry_after_ms``)."""
    retry_after_ms = max(record.expires_at - now, 0)
    return SandboxCheckpointWriterConflictError(
        f"thread {thread_id!r} has a live writer lease (fence {record.fence}) held by "
        f"another owner; it expires in {retry_after_ms} ms unless renewed",
        details={
            "thread_id": thread_id,
            "expires_at_ms": record.expires_at,
            "retry_after_ms": retry_after_ms,
        },
    )


def writer_fields(writer: object) -> tuple[str, str, int]:
    """``(thread_id, owner_token, fence)`` of a writer-like object.

    Anything without the three fields (or with fields of the wrong type) cannot be
    the current writer of any thread, so it is WRITER_LOST rather than a crash.
    """
    try:
        thread_id = writer.thread_id  # type: ignore[attr-defined]
        owner_token = writer.owner_token  # type: ignore[attr-defined]
        fence = writer.fence  # type: ignore[attr-defined]
    except AttributeError:
        raise SandboxCheckpointWriterLostError(
            f"not a writer: {type(writer).__name__} has no thread_id/owner_token/fence"
        ) from None
    if not isinstance(thread_id, str) or not isinstance(owner_token, str) or not is_int(fence):
        raise SandboxCheckpointWriterLostError(
            "not a writer: thread_id and owner_token must be str and fence an int"
        )
    return thread_id, owner_token, fence


def lease_is_current(record: LeaseRecord | None, owner_token: str, fence: int, now: int) -> bool:
    return (
        record is not None
        and record.owner_token == owner_token
        and record.fence == fence
        and now < record.expires_at
    )


def writer_thread_mismatch(writer: object, thread_id: str) -> tuple[str, str, int]:
    """The writer's fields; WRITER_LOST when it is a writer of another thread."""
    w_thread, token, fence = writer_fields(writer)
    if w_thread != thread_id:
        raise SandboxCheckpointWriterLostError(
            f"the writer is for thread {w_thread!r}, not {thread_id!r}",
            details={"thread_id": thread_id},
        )
    return w_thread, token, fence


def writer_lost_details(thread_id: str, record: LeaseRecord | None, now: int) -> dict[str, Any]:
    """WRITER_LOST's details: the thread, when to retry (``retry_after_ms``, 0
    when no lease holds the thread now) and, when another lease holds it, that
    lease's ``expires_at_ms`` (as WRITER_CONFLICT says it)."""
    if record is None or now >= record.expires_at:
        return {"thread_id": thread_id, "retry_after_ms": 0}
    return {
        "thread_id": thread_id,
        "expires_at_ms": record.expires_at,
        "retry_after_ms": max(record.expires_at - now, 0),
    }


def check_writer(writer: object, thread_id: str, record: LeaseRecord | None, now: int) -> None:
    """Raise SandboxCheckpointWriterLostError unless ``writer`` holds the current lease
    of ``thread_id`` (same owner_token and fence as the stored record, not expired)."""
    _, token, fence = writer_thread_mismatch(writer, thread_id)
    if not lease_is_current(record, token, fence, now):
        if record is None or record.owner_token != token or record.fence != fence:
            why = "was released or replaced by another writer"
        else:
            why = "expired"
        raise SandboxCheckpointWriterLostError(
            f"the writer lease of thread {thread_id!r} (fence {fence}) {why}",
            details=writer_lost_details(thread_id, record, now),
        )


def renew_lost(
    thread_id: str, fence: int, record: LeaseRecord | None, now: int
) -> SandboxCheckpointWriterLostError:
    """WRITER_LOST for a renew that found ``record`` (the thread's lease now) at ``now``."""
    return SandboxCheckpointWriterLostError(
        f"cannot renew: the writer lease of thread {thread_id!r} (fence {fence}) "
        "expired or was replaced",
        details=writer_lost_details(thread_id, record, now),
    )


# --------------------------------------------------------------------------- arguments


def check_keep(keep: object) -> int:
    if not is_int(keep) or keep < 1:  # type: ignore[operator]
        raise SandboxCheckpointInvalidArgumentError(f"keep must be an integer >= 1, got {keep!r}")
    assert isinstance(keep, int)
    return keep


def check_thread_page(after: object, limit: object) -> tuple[str | None, int]:
    """``list_threads`` arguments: ``after`` None or a valid id, ``limit`` >= 1."""
    if not is_int(limit) or limit < 1:  # type: ignore[operator]
        raise SandboxCheckpointInvalidArgumentError(f"limit must be an integer >= 1, got {limit!r}")
    if after is not None:
        check_id(after, "after")  # type: ignore[arg-type]
    assert isinstance(limit, int)
    return after, limit  # type: ignore[return-value]


def check_hold_ms(hold_ms: object) -> int:
    if not is_int(hold_ms) or hold_ms <= 0:  # type: ignore[operator]
        raise SandboxCheckpointInvalidArgumentError(
            f"hold_ms must be an integer > 0, got {hold_ms!r}"
        )
    assert isinstance(hold_ms, int)
    return hold_ms


def distinct(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(values))


# One compiled match per key: a capture pins every key it uploads (100,000 on a
# cold capture of many small files); a per-character check cost ~0.4 s there.
_BLOB_KEY = re.compile(
    f"(?:{re.escape(FILE_KEY_PREFIX)}|{re.escape(ARTIFACT_KEY_PREFIX)})[0-9a-f]{{64}}"
)


def valid_blob_key(key: object) -> bool:
    """True for a key of either docs/contract.md#data-model shape."""
    return isinstance(key, str) and _BLOB_KEY.fullmatch(key) is not None


# A pack object's key (``blobs/packs.py``) is guarded like a blob key: a
# capture pins the pack it is about to upload (one pin per pack, not one per
# blob in it) and a sweep condemns a pack before it deletes it.
_PACK_KEY = re.compile(f"{re.escape(PACK_KEY_PREFIX)}[0-9a-f]{{64}}")


def valid_guard_key(key: object) -> bool:
    """True for a key the blob guard pins and condemns: a blob key of either
    docs/contract.md#data-model shape, or a pack key (``sandbox-packs/blake3/<64 hex>``)."""
    return isinstance(key, str) and (
        _BLOB_KEY.fullmatch(key) is not None or _PACK_KEY.fullmatch(key) is not None
    )


def check_pin_keys(keys: object) -> list[str]:
    """Validated, de-duplicated keys for ``pin_blobs`` (InvalidEntry on a bad key)."""
    if isinstance(keys, str) or not isinstance(keys, Iterable):
        raise SandboxCheckpointInvalidEntryError("keys must be a list of blob keys")
    out = list(keys)
    for key in out:
        if not valid_guard_key(key):
            raise SandboxCheckpointInvalidEntryError(f"invalid blob key: {key!r}")
    return distinct(out)


def condemnable_keys(keys: object) -> list[str]:
    """The keys ``condemn_blobs`` considers: well-shaped ones (blob or pack
    keys), de-duplicated.

    A key of another shape is never condemned, so a sweep can never delete it.
    """
    if isinstance(keys, str) or not isinstance(keys, Iterable):
        raise SandboxCheckpointInvalidArgumentError("keys must be a list of blob keys")
    return distinct(key for key in keys if valid_guard_key(key))


# --------------------------------------------------------------------------- keys as bytes

_KIND_FILE = b"f"
_KIND_ARTIFACT = b"a"
_KIND_PACK = b"p"  # pins and condemnations only: never counted or referenced
_PREFIX_OF_KIND = {
    _KIND_FILE: FILE_KEY_PREFIX,
    _KIND_ARTIFACT: ARTIFACT_KEY_PREFIX,
    _KIND_PACK: PACK_KEY_PREFIX,
}


def key_to_bytes(key: str) -> bytes:
    """33 bytes: kind (``a``/``f``, ``p`` for a pack) + raw hash. Only for validated keys."""
    if key.startswith(FILE_KEY_PREFIX):
        return _KIND_FILE + bytes.fromhex(key[len(FILE_KEY_PREFIX) :])
    if key.startswith(PACK_KEY_PREFIX):
        return _KIND_PACK + bytes.fromhex(key[len(PACK_KEY_PREFIX) :])
    return _KIND_ARTIFACT + bytes.fromhex(key[len(ARTIFACT_KEY_PREFIX) :])


def key_from_bytes(data: bytes) -> str:
    prefix = _PREFIX_OF_KIND.get(bytes(data[:1]), ARTIFACT_KEY_PREFIX)
    return prefix + bytes(data[1:]).hex()


# --------------------------------------------------------------------------- audit


def blob_counts(
    stored: dict[bytes, int], manifests: dict[bytes, int], sizes: dict[bytes, int]
) -> list[BlobCount]:
    """``BlobAudit.audit_blob_references`` from the stored counts and the manifest
    counts (keys in the 33-byte form, which sorts like the UTF-8 text keys)."""
    keys = sorted({key for key, n in stored.items() if n} | {k for k, n in manifests.items() if n})
    return [
        BlobCount(key_from_bytes(key), stored.get(key, 0), manifests.get(key, 0), sizes.get(key))
        for key in keys
    ]


def audit_keys(keys: object) -> list[str]:
    """Well-shaped, de-duplicated keys for the missing-blob marks (others ignored)."""
    return condemnable_keys(keys)


# --------------------------------------------------------------------------- ordering


def list_order(created_at: float | int, checkpoint_id: str) -> tuple[float | int, bytes]:
    """``list()`` order: created_at, then the UTF-8 bytes of the id."""
    return (created_at, utf8_key(checkpoint_id))


# --------------------------------------------------------------------------- prune


def plan_prune(
    checkpoints: Sequence[tuple[str, str | None]],
    head_id: str | None,
    keep: int,
) -> set[str]:
    """Ids to delete: all of the thread except the head and its ``keep - 1``
    nearest ancestors on the chain.

    ``checkpoints`` is ``(id, parent_id)`` of every checkpoint of the thread.
    """
    parents = dict(checkpoints)
    kept: set[str] = set()
    current = head_id
    while current is not None and current in parents and len(kept) < keep:
        if current in kept:  # a cycle cannot be made through append; stay safe
            break
        kept.add(current)
        current = parents[current]
    return {checkpoint_id for checkpoint_id in parents if checkpoint_id not in kept}


# --------------------------------------------------------------------------- fork


def fork_error(code: str, message: str, **details: Any) -> SandboxCheckpointError:
    return SandboxCheckpointError(message, code=code, details=details)


def check_fork_arguments(
    source_thread_id: object,
    source_checkpoint_id: object,
    destination_thread_id: object,
    destination_checkpoint_id: object,
    created_at: object,
) -> None:
    """Fork checks that need no state: ids, finite created_at, distinct threads."""
    check_id(source_thread_id, "source thread id")
    check_id(source_checkpoint_id, "source checkpoint id")
    check_id(destination_thread_id, "destination thread id")
    check_id(destination_checkpoint_id, "destination checkpoint id")
    if not is_finite_number(created_at):
        raise SandboxCheckpointInvalidEntryError(
            f"created_at must be a finite number, got {created_at!r}"
        )
    if source_thread_id == destination_thread_id:
        raise fork_error(
            FORK_SOURCE_THREAD_MISMATCH,
            f"cannot fork thread {source_thread_id!r} into itself",
            thread_id=source_thread_id,
        )


def check_fork_source(
    found: Checkpoint | str | None, source_thread_id: str, source_checkpoint_id: str
) -> Checkpoint | None:
    """Fork checks 4 and 5: the source exists and belongs to ``source_thread_id``.

    ``found`` is the source checkpoint, or just its thread id (a SQL store need not
    decode the document before the checks pass), or None when it is missing.
    Returns ``found`` when it is a Checkpoint.
    """
    found_thread_id = found.thread_id if isinstance(found, Checkpoint) else found
    if found_thread_id is None:
        raise fork_error(
            FORK_SOURCE_NOT_FOUND,
            f"fork source checkpoint {source_checkpoint_id!r} does not exist",
            checkpoint_id=source_checkpoint_id,
        )
    if found_thread_id != source_thread_id:
        raise fork_error(
            FORK_SOURCE_THREAD_MISMATCH,
            f"checkpoint {source_checkpoint_id!r} belongs to thread {found_thread_id!r}, "
            f"not {source_thread_id!r}",
            checkpoint_id=source_checkpoint_id,
            thread_id=source_thread_id,
        )
    return found if isinstance(found, Checkpoint) else None


def destination_not_empty(thread_id: str, checkpoint_id: str, why: str) -> SandboxCheckpointError:
    return fork_error(
        FORK_DESTINATION_NOT_EMPTY,
        f"cannot fork into thread {thread_id!r} as {checkpoint_id!r}: {why}",
        thread_id=thread_id,
        checkpoint_id=checkpoint_id,
    )


def fork_checkpoint(
    source: Checkpoint, destination_thread_id: str, destination_checkpoint_id: str, created_at: int
) -> Checkpoint:
    """The new root: the source's files, conversation and artifacts, how it
    was taken (policy, sub-root: a restore of the fork must manage the same
    paths) and where it came from (forked_from_*); nothing else."""
    return Checkpoint(
        id=destination_checkpoint_id,
        thread_id=destination_thread_id,
        parent_checkpoint_id=None,
        created_at=created_at,
        reason="fork-root",
        files=source.files,
        conversation=source.conversation,
        artifacts=source.artifacts,
        label=None,
        source_run_id=None,
        policy=source.policy,
        workspace_subdir=source.workspace_subdir,
        forked_from_thread_id=source.thread_id,
        forked_from_checkpoint_id=source.id,
        conversation_text=source.conversation_text,
    )


# --------------------------------------------------------------------------- instances


def check_instance_record(record: object) -> InstanceRecord:
    """Validate an InstanceRecord: text fields are ids (INVALID_ID), ``updated_at``
    is finite (INVALID_ENTRY). Returns a plain InstanceRecord copy."""
    if not isinstance(record, InstanceRecord):
        raise SandboxCheckpointInvalidEntryError(f"not an InstanceRecord: {type(record).__name__}")
    check_id(record.key, "instance key")
    check_id(record.provider, "provider")
    check_id(record.provider_sandbox_id, "provider sandbox id")
    check_id(record.thread_id, "thread id")
    if record.latest_snapshot_id is not None:
        check_id(record.latest_snapshot_id, "latest snapshot id")
    if record.latest_run_id is not None:
        check_id(record.latest_run_id, "latest run id")
    if not is_finite_number(record.updated_at):
        raise SandboxCheckpointInvalidEntryError(
            f"updated_at must be a finite number, got {record.updated_at!r}"
        )
    return InstanceRecord(
        key=record.key,
        provider=record.provider,
        provider_sandbox_id=record.provider_sandbox_id,
        thread_id=record.thread_id,
        updated_at=record.updated_at,
        latest_snapshot_id=record.latest_snapshot_id,
        latest_run_id=record.latest_run_id,
    )
