"""The data model of docs/contract.md#data-model and docs/contract.md#python-api: checkpoints, entries, artifacts, writers, policy.

Models are frozen dataclasses built by keyword. Validation lives in
``checkpointd.validation`` so that stores, capture and restore apply one set of rules.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeAlias, TypedDict, Unpack, runtime_checkable

from ._keywords import check_keywords

# "restore": appended by a restore asked to record (the head then describes the
# rewound workspace; ``restored_from_checkpoint_id`` names the target);
# "stash": the live state a restore or an undo replaced, kept in the thread's
# stash (docs/restore-history.md).
Reason: TypeAlias = Literal["automatic", "named", "fork-root", "restore", "stash"]
REASONS: tuple[str, ...] = ("automatic", "named", "fork-root", "restore", "stash")

FILE_KEY_PREFIX = "sandbox-files/blake3/"
ARTIFACT_KEY_PREFIX = "sandbox-artifacts/blake3/"


@dataclass(frozen=True, slots=True)
class SecretSpan:
    """Where capture zeroed a secret in a file: ``length`` bytes at ``offset``
    held the secret named ``secret`` (its name when the caller gave a mapping,
    else its index in the caller's list). Never the value nor a hash of it."""

    offset: int
    length: int
    secret: int | str


@dataclass(frozen=True, slots=True)
class FileEntry:
    """A regular file; its bytes (after secret zeroing) live at ``blob_key``;
    ``secrets`` says where secrets were zeroed (sorted by offset, usually empty)."""

    path: str
    blob_key: str
    size: int
    mode: int = 0o644
    mtime_ns: int = 0
    secrets: tuple[SecretSpan, ...] = ()
    # A large file stored as content-defined chunks: their list (see
    # checkpointd.chunks); "" for a file stored as one blob.
    chunks: str = ""
    kind: Literal["file"] = field(default="file", init=False, repr=False)


@dataclass(frozen=True, slots=True)
class DirEntry:
    """A directory; every captured directory is recorded so empty ones come back."""

    path: str
    mode: int = 0o755
    kind: Literal["dir"] = field(default="dir", init=False, repr=False)


@dataclass(frozen=True, slots=True)
class SymlinkEntry:
    """A symbolic link whose target stays inside the workspace; stored as read."""

    path: str
    target: str
    kind: Literal["symlink"] = field(default="symlink", init=False, repr=False)


Entry: TypeAlias = FileEntry | DirEntry | SymlinkEntry


@dataclass(frozen=True, slots=True)
class Artifact:
    """A named blob kept with a checkpoint (a report, a screenshot...)."""

    artifact_id: str
    name: str
    mime_type: str
    size: int
    blob_key: str
    created_at: int


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One immutable checkpoint of a thread (docs/contract.md#data-model)."""

    id: str
    thread_id: str
    parent_checkpoint_id: str | None
    created_at: int
    reason: Reason = "automatic"
    # A tuple of entries, or (from a capture or a store) a ``Manifest``: an
    # immutable, lazily decoded sequence equal to the tuple of its entries.
    files: Sequence[Entry] = ()
    conversation: tuple[Any, ...] = ()
    artifacts: tuple[Artifact, ...] = ()
    label: str | None = None
    source_run_id: str | None = None
    # How it was taken (docs/design.md): restore and diff use these when their caller
    # gives none. ``policy`` None = not recorded (a checkpoint made by hand or by
    # an older version): the default ``Policy()`` applies. ``workspace_subdir`` is
    # the daemon's sub-root ("" = the whole workspace).
    policy: Policy | None = None
    workspace_subdir: str = ""
    # Fork provenance, on a fork root only: the thread and checkpoint it was
    # forked from (None elsewhere, and on roots forked by an older version).
    forked_from_thread_id: str | None = None
    forked_from_checkpoint_id: str | None = None
    # The conversation exactly as it was sent, one JSON text per message, when it
    # came as text (the daemon's CaptureRequest); ``conversation`` holds the same
    # messages parsed. None: only the values are known (the Python API).
    conversation_text: tuple[str, ...] | None = None
    # On a checkpoint a recording restore appended (reason "restore"): the
    # checkpoint restored, whose manifest it repeats (None elsewhere).
    restored_from_checkpoint_id: str | None = None

    def effective_policy(self, explicit: Policy | None = None) -> Policy:
        """The policy a restore or diff of this checkpoint applies: the caller's
        when given, else the one it was captured with, else the default."""
        if explicit is not None:
            return explicit
        return self.policy if self.policy is not None else Policy()

    def blob_keys(self) -> list[str]:
        """The distinct blob keys this checkpoint uses, in first-seen order."""
        seen: dict[str, None] = {}
        digests = getattr(self.files, "digests", None)  # a Manifest: no decoding
        if digests is not None:
            data = digests()
            for i in range(0, len(data), 32):
                seen[FILE_KEY_PREFIX + data[i : i + 32].hex()] = None
        for entry in () if digests is not None else self.files:
            if isinstance(entry, FileEntry) and entry.chunks:
                # Stored as chunks (checkpointd.chunks): "<64 hex><length>" items.
                for item in entry.chunks.split(","):
                    seen.setdefault(FILE_KEY_PREFIX + item[:64], None)
            elif isinstance(entry, FileEntry):
                seen.setdefault(entry.blob_key, None)
        for artifact in self.artifacts:
            seen.setdefault(artifact.blob_key, None)
        return list(seen)


@runtime_checkable
class WriterLike(Protocol):
    """Anything with the three ``Writer`` fields is accepted as a writer."""

    @property
    def thread_id(self) -> str: ...

    @property
    def owner_token(self) -> str: ...

    @property
    def fence(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Writer:
    thread_id: str
    owner_token: str
    fence: int


class LeaseCallbacks(TypedDict):
    """The store's side of a ``WriterLease`` (keywords of its constructor):
    ``renew`` returns the new ``expires_at``; ``release`` removes the lease."""

    renew: Callable[[WriterLease], Awaitable[int]]
    release: Callable[[WriterLease], Awaitable[None]]


class WriterLease:
    """A thread's writer lease as handed out by ``acquire_writer``.

    Not frozen: ``renew()`` moves ``expires_at``. The store supplies the two
    callbacks (``renew=``, ``release=``: ``LeaseCallbacks``); ``release()``
    never raises, so it is safe in ``finally`` blocks.
    """

    def __init__(
        self,
        *,
        thread_id: str,
        owner_token: str,
        fence: int,
        expires_at: int,
        renew_after_ms: int,
        **callbacks: Unpack[LeaseCallbacks],
    ) -> None:
        check_keywords("WriterLease", callbacks, LeaseCallbacks)
        self.thread_id = thread_id
        self.owner_token = owner_token
        self.fence = fence
        self.expires_at = expires_at
        self.renew_after_ms = renew_after_ms
        self._renew = callbacks["renew"]
        self._release = callbacks["release"]

    async def renew(self) -> int:
        """Extend the lease to now + duration; returns the new ``expires_at``.

        Raises SandboxCheckpointWriterLostError when the lease expired or was
        replaced by another writer's.
        """
        expires_at = await self._renew(self)
        self.expires_at = expires_at
        return expires_at

    async def release(self) -> None:
        """Remove this lease's record (only its own); never raises, except that a
        cancelled caller's CancelledError is re-raised once the release is done.

        A caller cancelled while releasing (a daemon's drain cancels a call that
        is already unwinding) must still give the lease back, or the thread stays
        locked until the lease expires."""
        releasing = asyncio.ensure_future(self._release(self))
        try:
            await asyncio.shield(releasing)
        except asyncio.CancelledError:
            while not releasing.done():
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait({releasing})
            if not releasing.cancelled():
                releasing.exception()  # retrieved: a failed release is ignored
            raise
        except Exception:  # noqa: BLE001 - release must be safe in finally blocks
            pass

    async def __aenter__(self) -> WriterLease:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.release()

    def __repr__(self) -> str:
        return (
            f"WriterLease(thread_id={self.thread_id!r}, fence={self.fence}, "
            f"expires_at={self.expires_at})"
        )


@dataclass(frozen=True, slots=True)
class BlobReference:
    """A blob key and how many checkpoints use it (always > 0 when listed)."""

    key: str
    references: int

    # Allow ``key, count = ref`` as the contract writes the pairs as ``(key, count)``.
    def __iter__(self):  # type: ignore[no-untyped-def]
        yield self.key
        yield self.references


@dataclass(frozen=True, slots=True)
class Policy:
    """Which paths a capture keeps and a restore manages (docs/contract.md#capture).

    Patterns use git's gitignore dialect. Exclude wins over include; an empty
    ``include`` includes every file. ``default_excludes`` adds any ``.git``,
    ``node_modules`` or ``.env*`` path segment.
    """

    exclude: tuple[str, ...] = ()
    include: tuple[str, ...] = ()
    default_excludes: bool = True

    def __post_init__(self) -> None:
        # Accept lists from callers but keep the frozen value hashable.
        object.__setattr__(self, "exclude", tuple(self.exclude))
        object.__setattr__(self, "include", tuple(self.include))


# A thread's stash (docs/restore-history.md) is a thread of its own whose id is
# the thread's id and this suffix: it stays under any thread-id prefix a gateway
# token grants, and it is never listed among the threads. It may exceed the id
# limit by the suffix's length, so every thread id has one.
STASH_SUFFIX = "~stash"
# The stash entries a thread keeps unless the daemon is told otherwise
# (``serve --stash-keep``); older ones are deleted as a prune deletes.
DEFAULT_STASH_KEEP = 20


def stash_thread_id(thread_id: str) -> str:
    """The id of the thread whose checkpoints are ``thread_id``'s stash (the
    stash of a stash thread is itself)."""
    return thread_id if thread_id.endswith(STASH_SUFFIX) else thread_id + STASH_SUFFIX


def stash_owner(thread_id: str) -> str | None:
    """The thread whose stash ``thread_id`` is, or None for any other thread."""
    if thread_id.endswith(STASH_SUFFIX) and len(thread_id) > len(STASH_SUFFIX):
        return thread_id[: -len(STASH_SUFFIX)]
    return None


__all__ = [
    "ARTIFACT_KEY_PREFIX",
    "DEFAULT_STASH_KEEP",
    "FILE_KEY_PREFIX",
    "REASONS",
    "STASH_SUFFIX",
    "Artifact",
    "BlobReference",
    "Checkpoint",
    "DirEntry",
    "Entry",
    "FileEntry",
    "LeaseCallbacks",
    "Policy",
    "Reason",
    "SecretSpan",
    "SymlinkEntry",
    "Writer",
    "WriterLease",
    "WriterLike",
    "stash_owner",
    "stash_thread_id",
]
