"""The checkpointd.v1.Checkpointd service: each RPC turns into one engine or store call.

Errors: handlers raise; ``_unary`` / ``_streaming`` turn every exception into a
status through ``status.abort`` (the one error map). Cancellation: when the
client cancels or its deadline passes, grpc cancels the handler's task; the
engine task is cancelled too (and its native scan told to stop), and the
engines release their writer lease in ``finally`` — so a new capture of the
thread succeeds at once.

Capture ``request_id``: the checkpoint id is derived from the thread and the
request_id (``ids.derive_request_id``: a UUIDv8 bound to its thread). Before
capturing, the servicer looks that id up; when an earlier attempt already
committed it (the reply was lost), the retry returns it with
``done.replayed = true`` instead of making a second checkpoint. A retry that
races the first attempt still running gets WRITER_CONFLICT (ABORTED) and should
retry again; the id's uniqueness in the store makes a double append impossible.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

import grpc

from .. import __version__, diffing, validation
from ..blobs.base import BlobNotFoundError, BlobStore
from ..chunk_blobs import read_file_blobs
from ..errors import (
    INVALID_PATH,
    MISSING_CHECKPOINT,
    SandboxCheckpointError,
    SandboxCheckpointInvalidArgumentError,
    SandboxSnapshotError,
)
from ..history import (
    DEFAULT_STASH_KEEP,
    HistoryRestore,
    RestoreOutcome,
    list_user_threads,
    owner_of,
    preview_with_history,
    restore_with_history,
    undo_restore,
)
from ..ids import derive_request_id, is_request_derived, new_uuid7
from ..journal import WorkspaceJournal
from ..model import ARTIFACT_KEY_PREFIX, Checkpoint, Entry, FileEntry, stash_thread_id
from ..progress import Progress
from ..secrets import parse_secrets
from ..store.base import CheckpointStore, SpentCheckpointIds, ThreadListing
from ..v1 import checkpointd_pb2 as pb
from ..v1 import checkpointd_pb2_grpc as pb_grpc
from . import convert, live
from .guard import MAX_MESSAGE_BYTES
from .restore_history import history_note, set_history_fields
from .status import (
    DRAINING,
    FORBIDDEN,
    MESSAGE_TOO_LARGE,
    MISSING_ARTIFACT,
    MISSING_ENTRY,
    ServiceError,
    abort,
    classify,
)
from .watch import watch_capabilities

# 2: SweepBlobs became a server stream of batches and a summary.
PROTOCOL_VERSION = 2
MIN_CHUNK = 64 * 1024
MAX_CHUNK = 1024 * 1024
DEFAULT_CHUNK = 256 * 1024
# Chunks of manifest entries / diff changes: bounded by count and by an estimate
# of encoded size, so a message stays far below 4 MiB even with 4 KiB paths.
ENTRIES_PER_MESSAGE = 512
BYTES_PER_MESSAGE = 512 * 1024
DEFAULT_PAGE_SIZE = 100
# Ids a Prune reply lists (~40 bytes each: 400 KB), so it stays bounded however
# many checkpoints a thread had; deleted_count counts them all.
MAX_PRUNE_IDS = 10_000
# Paths a RestoreDone lists as holding zeros where secrets were: at most this
# many, and this many bytes of them; unfilled_secret_count counts them all.
MAX_UNFILLED_PATHS = 10_000
MAX_UNFILLED_BYTES = 1024 * 1024
# A ListCheckpoints page stops early past this many bytes of summaries.
PAGE_BYTES = 2 * 1024 * 1024
# SweepBlobs without older_than_ms: blobs younger than this are kept (an upload
# that a capture still in flight will reference is never that old).
DEFAULT_SWEEP_OLDER_THAN_MS = 3_600_000
MAX_PAGE_SIZE = 1000
# How long a new capture waits for a cancellation to be noticed, then to unwind.
SETTLE_NOTICE_S = 0.25
SETTLE_UNWIND_S = 30.0
# How often a retry polls for the first attempt's checkpoint on another daemon.
REPLAY_POLL_S = 0.1
# Metadata a client sends on a capture it retries (the attempt number, 2 and up;
# the TypeScript and Go SDKs do). Only a marked retry waits for another daemon's
# attempt to free the lease: a first attempt meeting a live lease is the reference API's
# fail-fast WRITER_CONFLICT, even with a request_id.
ATTEMPT_METADATA = "checkpointd-attempt"

if TYPE_CHECKING:
    from ..sweep import SweepBatch

_log = logging.getLogger(__name__)
Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"
T = TypeVar("T")


@dataclass
class ServiceState:
    """What the handlers share: the one workspace root and the open stores.

    ``store``/``blobs`` are None until the server opened them (calls before that,
    or while draining, get UNAVAILABLE).
    """

    workspace_root: Path
    data_dir: Path
    store: CheckpointStore | None = None
    blobs: BlobStore | None = None
    store_backend: str = ""
    blob_backend: str = ""
    # What GetServerInfo reports about the listener (set from the ServeConfig).
    auth_mode: str = "unix-socket"
    tls: bool = False
    mutual_tls: bool = False
    auth_probes: bool = False
    draining: bool = False
    # Capture/restore engine tasks in flight (cancelled and awaited on shutdown).
    running: set[asyncio.Task[Any]] = field(default_factory=set)
    # Every call's handler task (SIGTERM cancels those left after the grace period
    # and waits for them, so their ``finally`` blocks release leases).
    calls: set[asyncio.Task[Any]] = field(default_factory=set)
    # The newest capture/restore of each thread run here, with its call's context
    # (the serve loop skips a tick while its thread's entry is running).
    by_thread: dict[str, tuple[asyncio.Task[Any], Context]] = field(default_factory=dict)
    # Captures in flight by the checkpoint id they will append (a retry with the
    # same request_id joins the first attempt instead of conflicting with it).
    captures: dict[str, asyncio.Task[Any]] = field(default_factory=dict)
    # The stash entries each thread keeps (``serve --stash-keep``).
    stash_keep: int = DEFAULT_STASH_KEEP
    # The workspace's change journal (``serve --watch``; None: not started).
    journal: WorkspaceJournal | None = None

    async def join_capture(self, checkpoint_id: str) -> None:
        """Wait until this daemon's capture of ``checkpoint_id`` (if any) ends,
        however it ends; cancelling the waiter leaves the capture running."""
        task = self.captures.get(checkpoint_id)
        if task is not None and not task.done():
            await asyncio.wait({task})

    @contextlib.contextmanager
    def tracking(self) -> Iterator[None]:
        """Register the current handler task in ``calls`` while the block runs."""
        task = asyncio.current_task()
        if task is None:
            yield
            return
        self.calls.add(task)
        try:
            yield
        finally:
            self.calls.discard(task)

    async def settle(self, thread_id: str) -> None:
        """Wait for this daemon's own cancelled capture/restore of the thread to
        finish unwinding (and release its lease) before a new one starts.

        Without this a client that cancels and retries at once would race the
        cancelled task's ``finally`` and get WRITER_CONFLICT. A task whose call is
        not cancelled is left alone: then WRITER_CONFLICT is the right answer.
        The cancellation may still be on its way from grpc's core, so it is given
        a short moment to arrive.
        """
        entry = self.by_thread.get(thread_id)
        if entry is None or entry[0].done():
            return
        task, context = entry
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SETTLE_NOTICE_S
        while not (context.cancelled() or task.cancelling() or task.done()):
            if loop.time() >= deadline:
                return
            await asyncio.sleep(0.01)
        await asyncio.wait({task}, timeout=SETTLE_UNWIND_S)

    def stores(self) -> tuple[CheckpointStore, BlobStore]:
        if self.draining or self.store is None or self.blobs is None:
            raise ServiceError(DRAINING, "the daemon is not serving (starting or draining)")
        return self.store, self.blobs

    def resolve_root(self, subdir: str) -> Path:
        """The workspace root, or a relative sub-root that stays inside it.

        Raises ServiceError(INVALID_PATH) for an absolute path, ``..`` segments, or
        a path that leaves the root through a symlink.
        """
        subdir = normal_subdir(subdir)
        if not subdir:
            return self.workspace_root
        problem = validation.path_problem(subdir)
        if problem is not None:
            raise ServiceError(INVALID_PATH, f"bad workspace_subdir: {problem}", path=subdir)
        candidate = self.workspace_root / subdir
        try:
            resolved = Path(os.path.realpath(candidate))
        except OSError as error:
            # A component swapped between realpath's lstat and readlink (EINVAL):
            # the sandbox is racing us; the engines open the sub-root by fd anyway.
            raise ServiceError(
                INVALID_PATH,
                f"workspace_subdir cannot be resolved: {error.strerror or error}",
                path=subdir,
            ) from None
        root = Path(os.path.realpath(self.workspace_root))
        if resolved != root and root not in resolved.parents:
            raise ServiceError(
                INVALID_PATH, "workspace_subdir leaves the workspace root", path=subdir
            )
        return candidate


def normal_subdir(subdir: str) -> str:
    """A request's ``workspace_subdir`` as a checkpoint records it: "" for the
    whole workspace (also spelled "." or "./"), else without a trailing "/"."""
    return "" if subdir in ("", ".", "./") else subdir.rstrip("/")


def recorded_subdir(requested: str, checkpoint: Checkpoint | None) -> str:
    """The sub-root a Restore or Diff works on: the request's when it names one
    ("." is the whole workspace), else the one the checkpoint was captured from
    — so a plain Restore of a sub-root capture never empties the workspace."""
    if requested or checkpoint is None:
        return requested
    return checkpoint.workspace_subdir


def _check_replay(
    committed: Checkpoint,
    request_id: str,
    label: str | None,
    source_run_id: str | None,
    subdir: str,
    conversation: tuple[Any, ...],
    artifacts: tuple[Any, ...],
) -> None:
    """A retry must ask for what the first attempt did: a request_id sent again
    with other parameters is a client bug, not a retry (INVALID_ARGUMENT naming
    the field). Secrets and the policy are not compared: secrets are never
    stored, and the scan result is what the first attempt captured."""
    given = {
        "label": (label, committed.label),
        "source_run_id": (source_run_id, committed.source_run_id),
        "workspace_subdir": (subdir, committed.workspace_subdir),
        "conversation": (tuple(conversation), tuple(committed.conversation)),
        "artifacts": (tuple(artifacts), tuple(committed.artifacts)),
    }
    for name, (now, then) in given.items():
        if now != then:
            raise SandboxCheckpointInvalidArgumentError(
                f"request_id {request_id!r} was first sent with another {name}: a retry "
                "must repeat the request; use a new request_id for a new capture",
                details={"field": name, "request_id": request_id, "checkpoint_id": committed.id},
            )


# Markers of checkpoints made under a request_id and deleted since (DeleteHead,
# Prune): the id is spent, never reused for new content. Kept in the bucket, so
# every daemon sharing it knows; outside the swept prefixes, so sweep keeps them.
SPENT_REQUEST_PREFIX = "checkpointd-spent-request-ids/"


async def mark_spent(state: ServiceState, checkpoint_ids: Iterable[str]) -> None:
    """Record deleted checkpoints whose id came from a request_id."""
    _, blobs = state.stores()
    for checkpoint_id in checkpoint_ids:
        if not is_request_derived(checkpoint_id):
            continue
        await blobs.put(SPENT_REQUEST_PREFIX + checkpoint_id, b"deleted\n")


async def _refuse_spent_request_id(
    state: ServiceState, thread_id: str, request_id: str, checkpoint_id: str
) -> None:
    store, blobs = state.stores()
    # The store records the spent ids it deleted, by any path (store._core; the
    # gateway's remote store asks its store); the bucket markers cover stores
    # that cannot say (a user's own) and deletions from before stores kept them.
    spent = isinstance(store, SpentCheckpointIds) and bool(
        await store.spent_checkpoint_ids([checkpoint_id])
    )
    if spent or await blobs.head(SPENT_REQUEST_PREFIX + checkpoint_id) is not None:
        raise SandboxCheckpointInvalidArgumentError(
            f"request_id {request_id!r} of thread {thread_id!r} named checkpoint "
            f"{checkpoint_id}, which was deleted since; use a new request_id for a new capture",
            details={
                "field": "request_id",
                "request_id": request_id,
                "checkpoint_id": checkpoint_id,
            },
        )


def capture_attempt(context: Context) -> int:
    """The attempt number the client marked the call with (1 when unmarked)."""
    for key, value in context.invocation_metadata() or ():
        if key == ATTEMPT_METADATA and isinstance(value, str) and value.isdigit():
            return int(value)
    return 1


def derive_checkpoint_id(thread_id: str, request_id: str) -> str:
    """The checkpoint id a capture with ``request_id`` gets (same inputs, same id)."""
    return derive_request_id(thread_id, request_id)


def _unary(
    method: Callable[[Any, Any, Context], Awaitable[T]],
) -> Callable[[Any, Any, Context], Awaitable[T]]:
    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: Context) -> T:
        with self.state.tracking():
            try:
                return await method(self, request, context)
            except asyncio.CancelledError:
                _log_cancelled(method.__name__, context)
                raise
            except Exception as exc:  # noqa: BLE001 - every error becomes a status
                _log_failure(method.__name__, exc)
                await abort(context, exc)
                raise  # unreachable: abort raises

    return wrapper


def _streaming(
    method: Callable[[Any, Any, Context], AsyncIterator[T]],
) -> Callable[[Any, Any, Context], AsyncIterator[T]]:
    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: Context) -> AsyncIterator[T]:
        with self.state.tracking():
            answered = False  # the last message sent was the call's result
            try:
                async for item in method(self, request, context):
                    answered = _is_final(item)
                    yield item
            except (asyncio.CancelledError, GeneratorExit):
                # GeneratorExit: grpc closed the stream (the client went away)
                # while it waited for the next message. After the result (a
                # client that stops reading once it has it) the call succeeded.
                if answered:
                    _log.debug("%s: the client closed the stream after its result", method.__name__)
                else:
                    _log_cancelled(method.__name__, context)
                raise
            except Exception as exc:  # noqa: BLE001 - every error becomes a status
                _log_failure(method.__name__, exc)
                await abort(context, exc)

    return wrapper


def _log_failure(method: str, exc: BaseException) -> None:
    """One WARNING per failed call: the method, status, reason and message (the
    message names ids and paths, never secrets or request bodies)."""
    code, reason, message, metadata = classify(exc)
    where = " ".join(f"{k}={v}" for k, v in metadata.items() if k in _LOGGED_METADATA)
    _log.warning(
        "%s failed: %s %s: %s%s", method, code.name, reason, message, f" ({where})" if where else ""
    )


def _is_final(message: Any) -> bool:
    """True for the message that ends a long-work stream: a ``done`` event
    (Capture, Restore) or a ``summary`` (SweepBlobs, Check)."""
    fields = message.DESCRIPTOR.fields_by_name
    return any(name in fields and message.HasField(name) for name in ("done", "summary"))


def _log_cancelled(method: str, context: Context) -> None:
    """A call that ended because its client went away or its deadline passed
    (the work stopped and its lease was released) is a failure too."""
    remaining = context.time_remaining()
    why = "its deadline passed" if remaining is not None and remaining <= 0 else "cancelled"
    _log.warning("%s failed: CANCELLED: %s", method, why)


# ErrorInfo metadata worth a log line (short identifiers, no content).
_LOGGED_METADATA = ("thread_id", "checkpoint_id", "path", "key", "field", "deleted_count")


def _chunk_size(requested: int) -> int:
    return DEFAULT_CHUNK if requested == 0 else min(max(requested, MIN_CHUNK), MAX_CHUNK)


def _entry_weight(entry: Entry) -> int:
    return (
        64
        + len(entry.path)
        + len(getattr(entry, "target", ""))
        + len(getattr(entry, "blob_key", ""))
    )


async def _with_progress(
    state: ServiceState,
    thread_id: str,
    context: Context,
    work: Callable[[Callable[[Progress], None]], Coroutine[Any, Any, T]],
    checkpoint_id: str | None = None,
) -> AsyncIterator[Progress | tuple[str, T]]:
    """Run ``work(progress_callback)`` as a task; yield its Progress events, then
    ``("done", result)``. If the consumer stops (client cancel, deadline), the
    task is cancelled and awaited: the engine stops its threaded work and its
    ``finally`` releases the lease before the handler returns."""
    queue: asyncio.Queue[Progress | None] = asyncio.Queue()
    await state.settle(thread_id)
    task = asyncio.create_task(work(queue.put_nowait))
    state.running.add(task)
    task.add_done_callback(state.running.discard)
    state.by_thread[thread_id] = (task, context)
    if checkpoint_id is not None:
        state.captures[checkpoint_id] = task
        task.add_done_callback(lambda _: state.captures.pop(checkpoint_id, None))

    def forget(_: object) -> None:
        if state.by_thread.get(thread_id, (None,))[0] is task:
            del state.by_thread[thread_id]

    task.add_done_callback(forget)
    task.add_done_callback(lambda _: queue.put_nowait(None))
    try:
        while (item := await queue.get()) is not None:
            yield item
        yield ("done", task.result())
    finally:
        if not task.done():
            task.cancel()
            await asyncio.wait([task])


class CheckpointdServicer(pb_grpc.CheckpointdServicer):
    def __init__(self, state: ServiceState) -> None:
        self.state = state

    # ------------------------------------------------------------ capture/restore

    @_streaming
    async def Capture(
        self, request: pb.CaptureRequest, context: Context
    ) -> AsyncIterator[pb.CaptureEvent]:
        from ..capture import CaptureOptions, capture_checkpoint

        store, blobs = self.state.stores()
        thread_id = validation.check_id(request.thread_id, "thread_id")
        # Validated here for an early error; the engine opens it by fd.
        self.state.resolve_root(request.workspace_subdir)
        policy = convert.policy_from_proto(request.policy, request.HasField("policy"))
        conversation = convert.conversation_from_proto(request.conversation)
        artifacts = tuple(convert.artifact_from_proto(a) for a in request.artifacts)
        label = request.label if request.HasField("label") else None
        source_run_id = request.source_run_id if request.HasField("source_run_id") else None
        subdir = normal_subdir(request.workspace_subdir)
        secrets = convert.secrets_from_proto(request.secrets, request.secret_names)
        if request.HasField("request_id"):
            request_id = validation.check_id(request.request_id, "request_id")
            checkpoint_id = derive_checkpoint_id(thread_id, request_id)
            # A retry while the first attempt still runs here: wait for it (the
            # call's deadline bounds the wait) and answer with its result.
            await self.state.join_capture(checkpoint_id)
            committed = await store.get(checkpoint_id)
            if committed is None and capture_attempt(context) > 1:
                committed = await self._await_other_attempt(
                    store, thread_id, checkpoint_id, context
                )
            if committed is not None and committed.thread_id == thread_id:
                _check_replay(
                    committed, request_id, label, source_run_id, subdir, conversation, artifacts
                )
                _log.info(
                    "capture %s of thread %s: replayed (request_id %s), %d entries",
                    committed.id,
                    thread_id,
                    request_id,
                    len(committed.files),
                )
                yield pb.CaptureEvent(
                    started=pb.CaptureStarted(thread_id=thread_id, checkpoint_id=checkpoint_id)
                )
                yield pb.CaptureEvent(
                    done=pb.CaptureDone(
                        checkpoint=convert.summary_of(committed),
                        stats=pb.CaptureStats(),
                        replayed=True,
                    )
                )
                return
            await _refuse_spent_request_id(self.state, thread_id, request_id, checkpoint_id)
        else:
            checkpoint_id = new_uuid7()
        yield pb.CaptureEvent(
            started=pb.CaptureStarted(thread_id=thread_id, checkpoint_id=checkpoint_id)
        )

        async def work(progress: Callable[[Progress], None]) -> Any:
            # The engine opens the sub-root from the workspace fd, component by
            # component (``root`` above only validated it early).
            return await capture_checkpoint(
                self.state.workspace_root,
                store,
                blobs,
                thread_id,
                CaptureOptions(
                    label=label,
                    policy=policy,
                    secrets=secrets,
                    conversation=conversation,
                    artifacts=artifacts,
                    source_run_id=source_run_id,
                    data_dir=self.state.data_dir,
                    progress=progress,
                    checkpoint_id=checkpoint_id,
                    workspace_subdir=subdir,
                    skip_if_unchanged=request.skip_if_unchanged,
                    # Kept byte for byte as sent (the proto promises it verbatim).
                    conversation_text=tuple(request.conversation),
                    journal=self.state.journal,
                ),
            )

        async for item in _with_progress(self.state, thread_id, context, work, checkpoint_id):
            if isinstance(item, Progress):
                yield pb.CaptureEvent(progress=convert.progress_to_proto(item))
            else:
                result = item[1]
                stats = result.stats
                _log.info(
                    "capture %s of thread %s: %s%d entries, %d hashed, %d reused, %d blobs "
                    "uploaded (%d bytes) in %d ms",
                    result.checkpoint.id,
                    thread_id,
                    "unchanged, " if result.unchanged else "",
                    stats.entries,
                    stats.files_hashed,
                    stats.files_reused,
                    stats.blobs_uploaded,
                    stats.bytes_uploaded,
                    stats.duration_ms,
                )
                yield pb.CaptureEvent(
                    done=pb.CaptureDone(
                        checkpoint=convert.summary_of(result.checkpoint),
                        stats=convert.stats_to_proto(result.stats),
                        unchanged=result.unchanged,
                    )
                )

    @_streaming
    async def Restore(
        self, request: pb.RestoreRequest, context: Context
    ) -> AsyncIterator[pb.RestoreEvent]:
        store, _ = self.state.stores()
        thread_id = validation.check_id(request.thread_id, "thread_id")
        checkpoint_id = (
            validation.check_id(request.checkpoint_id, "checkpoint_id")
            if request.HasField("checkpoint_id")
            else None
        )
        subdir = request.workspace_subdir
        # Pin the head read here: the engine restores exactly that checkpoint
        # (whose sub-root we may use), and RestoreStarted names it.
        if checkpoint_id is None:
            checkpoint_id = await store.get_head(thread_id)
        if not subdir and checkpoint_id is not None:
            # Restore where the checkpoint was captured.
            subdir = recorded_subdir(subdir, await self._checkpoint(checkpoint_id))
        wanted = HistoryRestore(
            thread_id,
            checkpoint_id,
            convert.policy_from_proto(request.policy, request.HasField("policy")),
            subdir,
            convert.secrets_from_proto(request.secrets, request.secret_names),
            discard_live_changes=request.discard_live_changes,
            record=request.record,
            stash_keep=self.state.stash_keep,
        )
        async for event in self._restore_events(wanted, context, request.dry_run, undo=False):
            yield event

    @_streaming
    async def Undo(
        self, request: pb.UndoRequest, context: Context
    ) -> AsyncIterator[pb.RestoreEvent]:
        store, _ = self.state.stores()
        thread_id = validation.check_id(request.thread_id, "thread_id")
        newest = await store.get_head(stash_thread_id(owner_of(thread_id)))
        subdir = request.workspace_subdir
        if not subdir and newest is not None:
            subdir = recorded_subdir(subdir, await self._checkpoint(newest))
        wanted = HistoryRestore(
            thread_id,
            workspace_subdir=subdir,
            secrets=convert.secrets_from_proto(request.secrets, request.secret_names),
            record=request.record,
            stash_keep=self.state.stash_keep,
        )
        async for event in self._restore_events(wanted, context, request.dry_run, undo=True):
            yield event

    async def _restore_events(
        self, wanted: HistoryRestore, context: Context, dry_run: bool, *, undo: bool
    ) -> AsyncIterator[pb.RestoreEvent]:
        """A Restore's or an Undo's events: started, progress (or the plan's
        paths), done. The engine works under the owner thread's lease."""
        store, blobs = self.state.stores()
        # Validated here for an early error; the engine itself opens the sub-root
        # from the workspace fd, component by component (never by this path).
        self.state.resolve_root(wanted.workspace_subdir)
        started = pb.RestoreStarted(thread_id=wanted.thread_id)
        if wanted.checkpoint_id is not None:
            started.checkpoint_id = wanted.checkpoint_id
        yield pb.RestoreEvent(started=started)
        began = time.monotonic()
        if dry_run:
            async for event in self._restore_plan(wanted, undo):
                yield event
            return
        engine = undo_restore if undo else restore_with_history

        async def work(progress: Callable[[Progress], None]) -> RestoreOutcome:
            return await engine(
                self.state.workspace_root,
                store,
                blobs,
                wanted,
                data_dir=self.state.data_dir,
                progress=progress,
            )

        applied = Progress("apply")  # its last event: what the restore wrote
        owner = owner_of(wanted.thread_id)
        async for item in _with_progress(self.state, owner, context, work):
            if isinstance(item, Progress):
                if item.phase == "apply":
                    applied = item
                yield pb.RestoreEvent(progress=convert.progress_to_proto(item))
                continue
            outcome: RestoreOutcome = item[1]
            restored, unfilled = outcome.restored, outcome.unfilled_secrets
            done = pb.RestoreDone(
                restored=restored is not None,
                duration_ms=int((time.monotonic() - began) * 1000),
                unfilled_secret_paths=_bounded_paths(unfilled),
                unfilled_secret_count=len(unfilled),
            )
            _log.info(
                "%s %s of thread %s: %d entries, %d files written (%d bytes) in %d ms%s",
                "undo" if undo else "restore",
                restored.id if restored is not None else "(none: the thread has no checkpoint)",
                wanted.thread_id,
                len(restored.files) if restored is not None else 0,
                applied.files_done,
                applied.bytes_done,
                done.duration_ms,
                history_note(outcome),
            )
            if restored is not None:
                done.checkpoint.CopyFrom(convert.summary_of(restored))
            set_history_fields(done, outcome)
            yield pb.RestoreEvent(done=done)

    async def _await_other_attempt(
        self, store: CheckpointStore, thread_id: str, checkpoint_id: str, context: Context
    ) -> Checkpoint | None:
        """While another daemon (sharing the store) holds the thread's lease, a
        retry waits (until the lease frees, at most the call's deadline or one
        lease duration) for the first attempt's checkpoint to appear. Returns it,
        or None when the lease is free and nothing was committed."""
        from ..errors import SandboxCheckpointWriterConflictError

        loop = asyncio.get_running_loop()
        remaining = context.time_remaining()
        bound = float(getattr(store, "lease_duration_ms", 120_000)) / 1000
        deadline = loop.time() + (bound if remaining is None else min(bound, remaining))
        while True:
            try:
                lease = await store.acquire_writer(thread_id)
            except SandboxCheckpointWriterConflictError:
                committed = await store.get(checkpoint_id)
                if committed is not None or loop.time() >= deadline:
                    return committed
                await asyncio.sleep(REPLAY_POLL_S)
                continue
            await lease.release()
            return await store.get(checkpoint_id)

    async def _restore_plan(
        self, wanted: HistoryRestore, undo: bool
    ) -> AsyncIterator[pb.RestoreEvent]:
        """A dry run: the plan's paths in bounded chunks (with those whose live
        changes would be stashed), then done with the counts."""
        store, _ = self.state.stores()
        began = time.monotonic()
        preview = await preview_with_history(
            self.state.workspace_root, store, wanted, data_dir=self.state.data_dir, undo=undo
        )
        done = pb.RestoreDone(restored=False)
        if preview.checkpoint is not None:
            marked = (
                [(path, "written") for path in preview.written]
                + [(path, "deleted") for path in preview.deleted]
                + [(path, "stashed") for path in preview.stashed]
            )
            for chunk in _chunks(marked, lambda item: 16 + len(item[0])):
                yield pb.RestoreEvent(
                    plan_paths=pb.RestorePlanPaths(
                        written=[path for path, kind in chunk if kind == "written"],
                        deleted=[path for path, kind in chunk if kind == "deleted"],
                        stashed=[path for path, kind in chunk if kind == "stashed"],
                    )
                )
            done.checkpoint.CopyFrom(convert.summary_of(preview.checkpoint))
            done.plan.CopyFrom(
                pb.RestorePlan(
                    files_written=len(preview.written),
                    paths_deleted=len(preview.deleted),
                    files_kept=preview.kept,
                    dirs_created=preview.dirs_to_make,
                    bytes_to_fetch=preview.bytes_to_fetch,
                    blobs_to_fetch=preview.blobs_to_fetch,
                    paths_stashed=len(preview.stashed),
                    bytes_stashed=preview.bytes_stashed,
                )
            )
        else:
            done.plan.CopyFrom(pb.RestorePlan())
        done.duration_ms = int((time.monotonic() - began) * 1000)
        yield pb.RestoreEvent(done=done)

    # ------------------------------------------------------------ reading

    async def _checkpoint(self, checkpoint_id: str) -> Checkpoint:
        store, _ = self.state.stores()
        validation.check_id(checkpoint_id, "checkpoint_id")
        checkpoint = await store.get(checkpoint_id)
        if checkpoint is None:
            raise SandboxSnapshotError(
                MISSING_CHECKPOINT,
                f"no checkpoint {checkpoint_id!r}",
                details={"checkpoint_id": checkpoint_id},
            )
        return checkpoint

    @_unary
    async def GetCheckpoint(
        self, request: pb.GetCheckpointRequest, context: Context
    ) -> pb.GetCheckpointResponse:
        checkpoint = await self._checkpoint(request.checkpoint_id)
        response = pb.GetCheckpointResponse(
            checkpoint=convert.summary_of(checkpoint),
            artifacts=[convert.artifact_to_proto(a) for a in checkpoint.artifacts],
            conversation=_conversation_texts(checkpoint) if request.include_conversation else [],
        )
        # What a CaptureRequest carried fits in a reply; a checkpoint made through
        # the Python API may not: say so with the limit instead of failing in
        # the transport.
        if response.ByteSize() > MAX_MESSAGE_BYTES:
            raise ServiceError(
                MESSAGE_TOO_LARGE,
                f"checkpoint {checkpoint.id} with its conversation is {response.ByteSize()} "
                f"bytes, over the {MAX_MESSAGE_BYTES}-byte message limit; ask without "
                "include_conversation",
                checkpoint_id=checkpoint.id,
                limit_bytes=MAX_MESSAGE_BYTES,
                size_bytes=response.ByteSize(),
            )
        return response

    @_unary
    async def ListCheckpoints(
        self, request: pb.ListCheckpointsRequest, context: Context
    ) -> pb.ListCheckpointsResponse:
        store, _ = self.state.stores()
        thread_id = validation.check_id(request.thread_id, "thread_id")
        if request.stash:
            thread_id = stash_thread_id(owner_of(thread_id))
        page_size = _page_size(request.page_size)
        checkpoints = await store.list(thread_id)
        if request.HasField("before"):
            before = validation.check_id(request.before, "before")
            index = next((i for i, cp in enumerate(checkpoints) if cp.id == before), None)
            if index is None:
                raise SandboxSnapshotError(
                    MISSING_CHECKPOINT,
                    f"no checkpoint {before!r} in thread {thread_id!r}",
                    details={"thread_id": thread_id, "checkpoint_id": before},
                )
            checkpoints = checkpoints[:index]
        if request.newest_first:
            checkpoints.reverse()
        start = 0
        if request.page_token:
            cursor, newest_first = _decode_page_token(request.page_token)
            if newest_first != request.newest_first:
                raise SandboxCheckpointInvalidArgumentError(
                    "page_token belongs to a listing in the other order (newest_first)",
                    details={"newest_first": str(request.newest_first).lower()},
                )

            def past(cp: Checkpoint) -> bool:
                return _order_key(cp) < cursor if newest_first else _order_key(cp) > cursor

            start = next((i for i, cp in enumerate(checkpoints) if past(cp)), len(checkpoints))
        page = checkpoints[start : start + page_size]
        summaries: list[pb.CheckpointSummary] = []
        size = 0
        for checkpoint in page:
            summary = convert.summary_of(checkpoint)
            size += summary.ByteSize() + 8
            # Summaries carry the recorded policy: a page of huge ones is cut
            # short (the token continues after it), so the reply stays bounded.
            if summaries and size > PAGE_BYTES:
                break
            summaries.append(summary)
        page = page[: len(summaries)]
        more = start + len(page) < len(checkpoints)
        return pb.ListCheckpointsResponse(
            checkpoints=summaries,
            next_page_token=_encode_page_token(page[-1], request.newest_first)
            if more and page
            else "",
        )

    @_unary
    async def ListThreads(
        self, request: pb.ListThreadsRequest, context: Context
    ) -> pb.ListThreadsResponse:
        store, _ = self.state.stores()
        if not isinstance(store, ThreadListing):
            raise SandboxCheckpointInvalidArgumentError(
                f"the {self.state.store_backend} store cannot list threads"
            )
        page_size = _page_size(request.page_size)
        after = _decode_thread_token(request.page_token) if request.page_token else None
        # One more than asked: whether a next page exists, without a second query.
        threads = await list_user_threads(store, after=after, limit=page_size + 1)
        page = threads[:page_size]
        response = pb.ListThreadsResponse(
            next_page_token=_encode_thread_token(page[-1].thread_id)
            if len(threads) > page_size
            else ""
        )
        for thread in page:
            summary = response.threads.add(
                thread_id=thread.thread_id,
                checkpoint_count=thread.checkpoint_count,
                newest_created_at=int(thread.newest_created_at),
            )
            if thread.head_checkpoint_id is not None:
                summary.head_checkpoint_id = thread.head_checkpoint_id
        return response

    @_unary
    async def GetHead(self, request: pb.GetHeadRequest, context: Context) -> pb.GetHeadResponse:
        store, _ = self.state.stores()
        head = await store.get_head(validation.check_id(request.thread_id, "thread_id"))
        response = pb.GetHeadResponse()
        if head is not None:
            response.checkpoint_id = head
        return response

    @_streaming
    async def ListEntries(
        self, request: pb.ListEntriesRequest, context: Context
    ) -> AsyncIterator[pb.ListEntriesResponse]:
        checkpoint = await self._checkpoint(request.checkpoint_id)
        prefix = request.path_prefix.rstrip("/")
        entries = [
            e
            for e in checkpoint.files
            if not prefix or e.path == prefix or e.path.startswith(prefix + "/")
        ]
        for chunk in _chunks(entries, _entry_weight):
            yield pb.ListEntriesResponse(entries=[convert.entry_to_proto(e) for e in chunk])

    @_streaming
    async def Diff(
        self, request: pb.DiffRequest, context: Context
    ) -> AsyncIterator[pb.DiffResponse]:
        old = await self._checkpoint(request.from_checkpoint_id)
        if request.HasField("to_checkpoint_id"):
            new_entries = (await self._checkpoint(request.to_checkpoint_id)).files
        else:
            subdir = recorded_subdir(request.workspace_subdir, old)
            # Validated here for an early error; the scan itself opens the
            # sub-root from the workspace fd, component by component.
            self.state.resolve_root(subdir)
            policy = old.effective_policy(
                convert.policy_from_proto(request.policy, request.HasField("policy"))
            )
            secrets = convert.secrets_from_proto(request.secrets, request.secret_names)
            new_entries = await live.scan_live(
                self.state.workspace_root,
                normal_subdir(subdir),
                policy,
                tuple(parse_secrets(secrets).values),
                self.state.data_dir,
            )
        changes = list(diffing.diff_entries(old.files, new_entries))

        def weight(change: diffing.Change) -> int:
            return 2 * len(change.path) + 200

        for chunk in _chunks(changes, weight):
            yield pb.DiffResponse(changes=[_change_to_proto(c) for c in chunk])

    @_streaming
    async def ReadFile(
        self, request: pb.ReadFileRequest, context: Context
    ) -> AsyncIterator[pb.ReadFileResponse]:
        _, blobs = self.state.stores()
        checkpoint = await self._checkpoint(request.checkpoint_id)
        entry = next((e for e in checkpoint.files if e.path == request.path), None)
        if not isinstance(entry, FileEntry):
            raise ServiceError(
                MISSING_ENTRY,
                f"checkpoint {checkpoint.id!r} has no file {request.path!r}",
                checkpoint_id=checkpoint.id,
                path=request.path,
            )
        first = True
        try:
            async for data in read_file_blobs(blobs, entry, _chunk_size(request.chunk_size)):
                message = pb.ReadFileResponse(data=data)
                if first:
                    message.entry.CopyFrom(convert.entry_to_proto(entry))
                    first = False
                yield message
        except BlobNotFoundError as exc:
            raise SandboxSnapshotError(
                "SANDBOX_SNAPSHOT_MISSING_BLOB",
                f"blob {entry.blob_key} of {entry.path!r} is missing",
                details={"checkpoint_id": checkpoint.id, "path": entry.path, "key": exc.key},
            ) from exc
        if first:  # an empty file: still send the entry
            yield pb.ReadFileResponse(entry=convert.entry_to_proto(entry))

    @_streaming
    async def ReadArtifact(
        self, request: pb.ReadArtifactRequest, context: Context
    ) -> AsyncIterator[pb.ReadArtifactResponse]:
        _, blobs = self.state.stores()
        problem = validation.blob_key_problem(request.blob_key, ARTIFACT_KEY_PREFIX)
        if problem is not None:
            raise SandboxCheckpointInvalidArgumentError(
                f"bad artifact key: {problem}", details={"key": request.blob_key}
            )
        try:
            async for data in blobs.get_stream(request.blob_key, _chunk_size(request.chunk_size)):
                yield pb.ReadArtifactResponse(data=data)
        except BlobNotFoundError as exc:
            raise ServiceError(MISSING_ARTIFACT, f"no artifact {exc.key}", key=exc.key) from exc

    @_unary
    async def UploadArtifact(
        self, request_iterator: AsyncIterator[pb.UploadArtifactRequest], context: Context
    ) -> pb.UploadArtifactResponse:
        from ..artifacts import upload_artifact

        store, blobs = self.state.stores()
        first = await anext(aiter(request_iterator), None)
        if first is None or first.WhichOneof("part") != "metadata":
            raise SandboxCheckpointInvalidArgumentError(
                "the first UploadArtifact message must be metadata"
            )

        async def chunks() -> AsyncIterator[bytes]:
            async for message in request_iterator:
                if message.WhichOneof("part") != "chunk":
                    raise SandboxCheckpointInvalidArgumentError("metadata may only come first")
                yield message.chunk

        artifact = await upload_artifact(
            blobs, first.metadata.name, first.metadata.mime_type, chunks(), index=store
        )
        return pb.UploadArtifactResponse(artifact=convert.artifact_to_proto(artifact))

    # ------------------------------------------------------------ writing

    @_unary
    async def Fork(self, request: pb.ForkRequest, context: Context) -> pb.ForkResponse:
        store, _ = self.state.stores()
        source_thread = validation.check_id(request.source_thread_id, "source_thread_id")
        source_checkpoint = validation.check_id(
            request.source_checkpoint_id, "source_checkpoint_id"
        )
        destination = validation.check_id(request.destination_thread_id, "destination_thread_id")
        async with await store.acquire_writer(destination) as lease:
            checkpoint = await store.fork_from_checkpoint(
                source_thread,
                source_checkpoint,
                destination,
                new_uuid7(),
                int(time.time() * 1000),
                lease,
            )
        return pb.ForkResponse(checkpoint=convert.summary_of(checkpoint))

    @_unary
    async def DeleteHead(
        self, request: pb.DeleteHeadRequest, context: Context
    ) -> pb.DeleteHeadResponse:
        store, _ = self.state.stores()
        thread_id = validation.check_id(request.thread_id, "thread_id")
        checkpoint_id = validation.check_id(request.checkpoint_id, "checkpoint_id")
        # Marked before the delete: a marker whose checkpoint still exists is
        # harmless (a retry finds the checkpoint and replays it), a delete whose
        # marker failed to be written would free the request_id.
        await mark_spent(self.state, [checkpoint_id])
        async with await store.acquire_writer(thread_id) as lease:
            await store.delete_head(thread_id, checkpoint_id, lease)
        head = await store.get_head(thread_id)
        response = pb.DeleteHeadResponse()
        if head is not None:
            response.head_checkpoint_id = head
        return response

    @_unary
    async def Prune(self, request: pb.PruneRequest, context: Context) -> pb.PruneResponse:
        from ..sweep import prune

        store, _ = self.state.stores()
        thread_id = validation.check_id(request.thread_id, "thread_id")
        began = time.monotonic()
        if not request.dry_run:
            # As in DeleteHead: mark what will go before it goes (and whatever
            # else went, should the head have moved in between, after).
            planned = await prune(store, thread_id, request.keep, dry_run=True)
            await mark_spent(self.state, planned)
        deleted = await prune(store, thread_id, request.keep, dry_run=request.dry_run)
        ids = [d if isinstance(d, str) else d.id for d in deleted]
        if not request.dry_run:
            await mark_spent(self.state, sorted(set(ids) - set(planned)))
        _log.info(
            "prune%s of thread %s (keep %d): %d checkpoints in %d ms",
            " (dry run)" if request.dry_run else "",
            thread_id,
            request.keep,
            len(ids),
            int((time.monotonic() - began) * 1000),
        )
        return pb.PruneResponse(
            deleted_checkpoint_ids=ids[:MAX_PRUNE_IDS],
            dry_run=request.dry_run,
            deleted_count=len(ids),
            ids_truncated=len(ids) > MAX_PRUNE_IDS,
        )

    @_streaming
    async def SweepBlobs(
        self, request: pb.SweepBlobsRequest, context: Context
    ) -> AsyncIterator[pb.SweepBlobsEvent]:
        from ..sweep import iter_sweep_blobs, repack_below_percent

        store, blobs = self.state.stores()
        if self.state.store_backend == "gateway":
            # Gateway mode: the sidecar's token cannot see other threads' references,
            # so a sweep here would judge the bucket blind; the gateway's operator runs it.
            raise ServiceError(
                FORBIDDEN, "sweep runs on the gateway, not in a sidecar (docs/gateway.md)"
            )
        older_than_ms = (
            request.older_than_ms
            if request.HasField("older_than_ms")
            else DEFAULT_SWEEP_OLDER_THAN_MS
        )
        percent = request.repack_below_percent if request.HasField("repack_below_percent") else None
        repack_below = repack_below_percent(percent)
        began = time.monotonic()
        summary = pb.SweepBlobsSummary(
            dry_run=request.dry_run,
            older_than_ms=older_than_ms,
            repack_below_percent=round(repack_below * 100),
        )
        try:
            async for batch in iter_sweep_blobs(
                store, blobs, older_than_ms, dry_run=request.dry_run, repack_below=repack_below
            ):
                summary.listed_count += batch.listed
                summary.deleted_count += len(batch.deleted)
                summary.kept_count += len(batch.kept)
                summary.failed_count += len(batch.failures)
                for _, reason in batch.kept:
                    summary.kept_by_reason[reason] += 1
                for part in _sweep_messages(batch):
                    yield pb.SweepBlobsEvent(batch=part)
        except Exception as exc:
            # Every deleted key was already streamed; the status says how many,
            # so a client that only reads the error still learns it.
            _log.warning("sweep failed after deleting %d blobs: %s", summary.deleted_count, exc)
            _, reason, message, metadata = classify(exc)
            raise SandboxCheckpointError(
                f"sweep failed after deleting {summary.deleted_count} blobs: {message}",
                code=reason,
                details={**metadata, "deleted_count": summary.deleted_count},
            ) from exc
        summary.duration_ms = int((time.monotonic() - began) * 1000)
        _log.info(
            "sweep%s: listed %d, deleted %d, kept %d, failed %d in %d ms",
            " (dry run)" if request.dry_run else "",
            summary.listed_count,
            summary.deleted_count,
            summary.kept_count,
            summary.failed_count,
            summary.duration_ms,
        )
        yield pb.SweepBlobsEvent(summary=summary)

    @_streaming
    async def Check(
        self, request: pb.CheckRequest, context: Context
    ) -> AsyncIterator[pb.CheckEvent]:
        """``checkpointd check`` (check.py): findings streamed as they are found,
        so the reply stays bounded whatever the store holds; summary last."""
        from ..check import CheckFinding, CheckProgress, iter_check

        store, blobs = self.state.stores()
        async for event in iter_check(
            store, blobs, read_data=request.read_data, repair=request.repair
        ):
            if isinstance(event, CheckFinding):
                yield pb.CheckEvent(
                    finding=pb.CheckFinding(
                        kind=event.kind,
                        key=event.key,
                        stored=event.stored,
                        manifests=event.manifests,
                        message=event.message,
                    )
                )
            elif isinstance(event, CheckProgress):
                yield pb.CheckEvent(
                    progress=pb.CheckProgress(
                        blobs_checked=event.blobs_checked,
                        blobs_total=event.blobs_total,
                        bytes_read=event.bytes_read,
                    )
                )
            else:
                _log.info(
                    "check: %d keys, %d mismatched counts, %d missing, %d corrupt, "
                    "%d repaired in %d ms",
                    event.keys,
                    event.count_mismatches,
                    event.missing,
                    event.corrupt,
                    event.repaired,
                    event.duration_ms,
                )
                yield pb.CheckEvent(
                    summary=pb.CheckSummary(
                        keys=event.keys,
                        blobs_checked=event.blobs_checked,
                        bytes_read=event.bytes_read,
                        count_mismatches=event.count_mismatches,
                        missing=event.missing,
                        corrupt=event.corrupt,
                        found=event.found,
                        repaired=event.repaired,
                        read_data=event.read_data,
                        repair=event.repair,
                        duration_ms=event.duration_ms,
                        ok=event.ok,
                    )
                )

    # ------------------------------------------------------------ server

    @_unary
    async def GetServerInfo(
        self, request: pb.GetServerInfoRequest, context: Context
    ) -> pb.GetServerInfoResponse:
        return pb.GetServerInfoResponse(
            version=__version__,
            protocol_version=PROTOCOL_VERSION,
            capabilities=pb.Capabilities(
                store_backend=self.state.store_backend,
                blob_backend=self.state.blob_backend,
                fork=True,
                diff=True,
                safe_sweep=True,
                capture_request_id=True,
                max_chunk_bytes=MAX_CHUNK,
                max_message_bytes=MAX_MESSAGE_BYTES,
                lease_duration_ms=int(getattr(self.state.store, "lease_duration_ms", 0) or 0),
                max_page_size=MAX_PAGE_SIZE,
                auth_mode=self.state.auth_mode,
                tls=self.state.tls,
                mutual_tls=self.state.mutual_tls,
                auth_probes=self.state.auth_probes,
                restore_history=True,
                **watch_capabilities(self.state.journal),
            ),
        )


def _bounded_paths(paths: list[str]) -> list[str]:
    """The first paths, within MAX_UNFILLED_PATHS and MAX_UNFILLED_BYTES."""
    kept, size = [], 0
    for path in paths[:MAX_UNFILLED_PATHS]:
        size += len(path.encode("utf-8", "surrogateescape")) + 8
        if size > MAX_UNFILLED_BYTES:
            break
        kept.append(path)
    return kept


def _chunks(items: list[T], weight: Callable[[T], int]) -> list[list[T]]:
    out: list[list[T]] = []
    current: list[T] = []
    size = 0
    for item in items:
        w = weight(item)
        if current and (len(current) >= ENTRIES_PER_MESSAGE or size + w > BYTES_PER_MESSAGE):
            out.append(current)
            current, size = [], 0
        current.append(item)
        size += w
    if current:
        out.append(current)
    return out


_CHANGE_KINDS = {
    "added": pb.CHANGE_KIND_ADDED,
    "deleted": pb.CHANGE_KIND_DELETED,
    "modified": pb.CHANGE_KIND_MODIFIED,
    "mode_changed": pb.CHANGE_KIND_MODE_CHANGED,
}


def _conversation_texts(checkpoint: Checkpoint) -> list[str]:
    """The messages as sent when the capture came over the wire, else re-encoded."""
    if checkpoint.conversation_text is not None:
        return list(checkpoint.conversation_text)
    return convert.conversation_to_proto(checkpoint.conversation)


def _sweep_messages(batch: SweepBatch) -> Iterator[pb.SweepBlobsBatch]:
    """One SweepBatch as SweepBlobsBatch messages of bounded size (a listing page
    of long foreign keys, or long failure messages, could pass the limit)."""
    message = pb.SweepBlobsBatch()
    size = 0
    items: list[tuple[str, str, str]] = [("deleted", key, "") for key in batch.deleted]
    items += [("kept", key, reason) for key, reason in batch.kept]
    items += [("failures", key, text) for key, text in batch.failures]
    for kind, key, text in items:
        weight = 16 + len(key) + len(text)
        if size and size + weight > BYTES_PER_MESSAGE:
            yield message
            message, size = pb.SweepBlobsBatch(), 0
        if kind == "deleted":
            message.deleted.append(key)
        elif kind == "kept":
            message.kept.add(key=key, reason=text)
        else:
            message.failures.add(key=key, message=text)
        size += weight
    if size:
        yield message


def _change_to_proto(change: diffing.Change) -> pb.Change:
    message = pb.Change(path=change.path, kind=_CHANGE_KINDS[change.kind])
    if change.old is not None:
        message.old.CopyFrom(convert.entry_to_proto(change.old))
    if change.new is not None:
        message.new.CopyFrom(convert.entry_to_proto(change.new))
    return message


def _order_key(checkpoint: Checkpoint) -> tuple[int, bytes]:
    return (checkpoint.created_at, checkpoint.id.encode("utf-8"))


def _page_size(requested: int) -> int:
    page_size = requested or DEFAULT_PAGE_SIZE
    if page_size > MAX_PAGE_SIZE:
        raise SandboxCheckpointInvalidArgumentError(
            f"page_size must be at most {MAX_PAGE_SIZE}", details={"page_size": page_size}
        )
    return page_size


def _encode_page_token(last: Checkpoint, newest_first: bool = False) -> str:
    raw = json.dumps([last.created_at, last.id, newest_first]).encode()
    return base64.urlsafe_b64encode(raw).decode()


def _decode_page_token(token: str) -> tuple[tuple[int, bytes], bool]:
    """(the last listed checkpoint's order key, newest_first) of a page token."""
    try:
        fields = json.loads(base64.urlsafe_b64decode(token.encode()))
        created_at, checkpoint_id = fields[0], fields[1]
        newest_first = bool(fields[2]) if len(fields) > 2 else False
        return (int(created_at), str(checkpoint_id).encode("utf-8")), newest_first
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        raise SandboxCheckpointInvalidArgumentError(
            "bad page_token", details={"page_token": token[:64]}
        ) from exc


def _encode_thread_token(last_thread_id: str) -> str:
    return base64.urlsafe_b64encode(json.dumps(["thread", last_thread_id]).encode()).decode()


def _decode_thread_token(token: str) -> str:
    try:
        kind, thread_id = json.loads(base64.urlsafe_b64decode(token.encode()))
        if kind != "thread" or not isinstance(thread_id, str):
            raise ValueError(token)
        return validation.check_id(thread_id, "page_token")
    except (ValueError, TypeError) as exc:
        raise SandboxCheckpointInvalidArgumentError(
            "bad page_token", details={"page_token": token[:64]}
        ) from exc
