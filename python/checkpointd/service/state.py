"""What the checkpointd.v1 handlers share: the one workspace root, the open
stores, and the capture/restore tasks in flight, with the helper that runs one
such task while its call streams the task's progress."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias, TypeVar

import grpc

from ..blobs.base import BlobStore
from ..capture import check_subroot
from ..history import DEFAULT_STASH_KEEP
from ..journal import WorkspaceJournal
from ..model import Checkpoint
from ..progress import Progress
from ..store.base import CheckpointStore
from .status import DRAINING, ServiceError

# How long a new capture waits for a cancellation to be noticed, then to unwind.
SETTLE_NOTICE_S = 0.25
SETTLE_UNWIND_S = 30.0

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

    def check_subroot(self, subdir: str) -> None:
        """A request's ``workspace_subdir`` checked for an early error
        (INVALID_PATH): the engines open it themselves, from the workspace's
        fd, one component at a time."""
        check_subroot(str(self.workspace_root), subdir)


def recorded_subdir(requested: str, checkpoint: Checkpoint | None) -> str:
    """The sub-root a Restore or Diff works on: the request's when it names one
    ("." is the whole workspace), else the one the checkpoint was captured from
    — so a plain Restore of a sub-root capture never empties the workspace."""
    if requested or checkpoint is None:
        return requested
    return checkpoint.workspace_subdir


async def with_progress(
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
