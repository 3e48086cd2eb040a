"""Machinery shared by the capture and restore engines.

* ``LeaseKeeper`` renews a writer lease in the background while an engine works.
* ``run_in_thread`` runs blocking work off the event loop and, when the awaiting
  task is cancelled, tells the work to stop and waits for it: a cancelled capture
  must not release its lease while a thread still writes the stat cache or the
  workspace.
* ``run_bounded`` runs a coroutine per item (of an iterable, or of an async
  source read ahead) with bounded concurrency and stops the others at the
  first failure.
* ``PhaseReporter`` turns work into ``Progress`` reports (every phase change, at
  most ~10 per second within a phase) and measures each phase.
* ``os_errors_mapped`` makes an engine raise checkpointd errors, never a bare
  ``OSError`` with a class of its own (no space, name too long...).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import gc
import os
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable
from typing import Any, TypeVar

from . import _native
from .errors import SandboxCheckpointWriterLostError, from_os_error
from .model import WriterLease
from .progress import Progress, ProgressCallback

T = TypeVar("T")

# An operation on at least this many entries gives memory back when it ends
# (``reclaim_memory``); below it what it frees is small and the next one reuses it.
RECLAIM_AFTER_ENTRIES = 250_000


def reclaim_memory() -> None:
    """Collect reference cycles, then give freed heap back to the system.

    After a capture of a large workspace: its parent's row (~60 MB at a
    million entries) stayed reachable from a cycle until the collector ran,
    and glibc keeps freed heap mapped, so a daemon carried both into its next
    scan (its peak RSS rose by as much). A worker thread may run it."""
    gc.collect()
    _native.release_freed_memory()


def _report_interval_s() -> float:
    """How often running phases report (and the native scan is polled):
    ``CHECKPOINTD_PROGRESS_INTERVAL_MS`` (1..60000), else 100 ms. An orchestrator
    that draws its own bar may want it finer or coarser; a value that is not
    such an integer is ignored (the default stays), never fatal."""
    raw = os.environ.get("CHECKPOINTD_PROGRESS_INTERVAL_MS", "")
    if raw.isdigit() and 1 <= int(raw) <= 60_000:
        return int(raw) / 1000
    return 0.1


REPORT_INTERVAL_S = _report_interval_s()

E = TypeVar("E", bound=Callable[..., Coroutine[Any, Any, Any]])


def os_errors_mapped(engine: E) -> E:
    """Decorate an engine whose first argument is the workspace root: an OSError
    that escapes it and has a class of its own (``errors.from_os_error``: a file
    that kept changing, no space, a name too long, a cross-device rename,
    permission denied, an unusable root) is raised as that checkpointd error,
    naming the path (the workspace root when the OS gave none)."""

    @functools.wraps(engine)
    async def wrapper(workspace_root: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await engine(workspace_root, *args, **kwargs)
        except OSError as error:
            root = os.path.abspath(os.fspath(workspace_root))  # noqa: ASYNC240 - no I/O
            mapped = from_os_error(error, root=root)
            if mapped is None:
                raise
            raise mapped from error

    return wrapper  # type: ignore[return-value]


# After a transient failure to renew (database busy), try again sooner than usual.
_RENEW_RETRY_S = 0.5


class LeaseKeeper:
    """Renews ``lease`` every ``renew_after_ms`` until the block ends.

    A lease that is lost (expired or replaced) cannot come back: the keeper stops
    and ``check()`` raises SandboxCheckpointWriterLostError so the engine gives up
    early instead of finishing work it can no longer publish.
    """

    def __init__(self, lease: WriterLease) -> None:
        self._lease = lease
        self._task: asyncio.Task[None] | None = None
        self.lost: SandboxCheckpointWriterLostError | None = None

    async def _run(self) -> None:
        delay = max(self._lease.renew_after_ms, 1) / 1000
        while True:
            await asyncio.sleep(delay)
            try:
                await self._lease.renew()
            except SandboxCheckpointWriterLostError as error:
                self.lost = error
                return
            except Exception:  # noqa: BLE001 - a transient store failure; the lease may still be live
                delay = min(_RENEW_RETRY_S, max(self._lease.renew_after_ms, 1) / 1000)
                continue
            delay = max(self._lease.renew_after_ms, 1) / 1000

    def check(self) -> None:
        """Raise SandboxCheckpointWriterLostError if renewing found the lease lost."""
        if self.lost is not None:
            raise self.lost

    async def __aenter__(self) -> LeaseKeeper:
        self._task = asyncio.create_task(self._run(), name="checkpointd-lease-renewal")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


class StopFlag:
    """Set when the task awaiting threaded work is cancelled; the work polls it."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        self._event.set()

    def raise_if_set(self) -> None:
        if self._event.is_set():
            raise WorkCancelled("cancelled")


class WorkCancelled(Exception):
    """Raised inside threaded work that noticed its StopFlag."""


async def run_in_thread(
    work: Callable[[], T],
    on_cancel: Callable[[], None] | None = None,
    executor: concurrent.futures.Executor | None = None,
) -> T:
    """Run ``work`` in a worker thread (of ``executor``, default the loop's); on
    cancellation call ``on_cancel`` (which should make the work stop soon), wait
    for the thread, then re-raise."""
    future: asyncio.Future[T]
    if executor is None:
        future = asyncio.ensure_future(asyncio.to_thread(work))
    else:
        future = asyncio.get_running_loop().run_in_executor(executor, work)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        if on_cancel is not None:
            on_cancel()
        with contextlib.suppress(BaseException):
            await future
        raise


async def run_bounded(
    items: Iterable[T] | AsyncIterator[T], worker: Callable[[T], Awaitable[None]], limit: int
) -> None:
    """Await ``worker(item)`` for every item, at most ``limit`` at a time.

    An async source is read by a task of its own, ahead of the workers, so
    what it awaits (a restore's next index lookup) overlaps their work. The
    first failure, of a worker or of the source, cancels the rest and is
    raised as is (no exception group), after they have stopped.
    """
    workers = max(limit, 1)
    if not isinstance(items, AsyncIterator):
        iterator = iter(items)

        async def drain() -> None:
            for item in iterator:  # the workers share one iterator
                await worker(item)

        await _gather_or_cancel([asyncio.create_task(drain()) for _ in range(workers)])
        return
    source = items
    queue: asyncio.Queue[tuple[T] | None] = asyncio.Queue()

    async def feed() -> None:
        try:
            async for item in source:
                queue.put_nowait((item,))
        finally:
            for _ in range(workers):
                queue.put_nowait(None)

    async def work() -> None:
        while (entry := await queue.get()) is not None:
            await worker(entry[0])

    await _gather_or_cancel(
        [asyncio.create_task(feed())] + [asyncio.create_task(work()) for _ in range(workers)]
    )


async def _gather_or_cancel(tasks: list[asyncio.Task[None]]) -> None:
    """Await ``tasks``; the first failure (or a cancel of the caller) cancels
    the others, waits until they have stopped, and is raised as is."""
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


class PhaseReporter:
    """Progress reports and per-phase timings for one engine run.

    ``phase()`` always reports (it is called on the event loop, so a callback can
    act before the phase starts); ``advance()`` reports at most every 100 ms and
    may be called from a worker thread: the report is then handed to the event
    loop, so callbacks always run on the loop's thread.

    Totals are reached: when a phase that counted anything ends (the next
    ``phase()`` or ``finish()``), one last report of it says done == total
    (a total of 0, unknown, becomes the count done). A report from a worker
    thread that arrives after its phase ended is dropped, so the last report of
    each phase is that closing one.
    """

    def __init__(self, callback: ProgressCallback | None) -> None:
        self._callback = callback
        self._loop = asyncio.get_running_loop()
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self._phase = ""
        self._phase_started = self._started
        self._last_report = 0.0
        self._files_done = self._files_total = self._bytes_done = self._bytes_total = 0
        self._files_hashed = 0
        self._generation = 0
        self.phases_ms: dict[str, int] = {}

    def _close_phase(self, now: float) -> None:
        if self._phase:
            elapsed = int((now - self._phase_started) * 1000)
            self.phases_ms[self._phase] = self.phases_ms.get(self._phase, 0) + elapsed

    def _closing(self) -> Progress | None:
        """The last report of the current phase (totals reached), if it counted."""
        if not self._phase or not (self._files_done or self._bytes_done or self._files_total):
            return None
        files = max(self._files_done, self._files_total)
        nbytes = max(self._bytes_done, self._bytes_total)
        return Progress(self._phase, files, files, nbytes, nbytes, self._files_hashed)

    def phase(
        self,
        name: str,
        *,
        files_total: int = 0,
        bytes_total: int = 0,
        files_done: int = 0,
        bytes_done: int = 0,
    ) -> None:
        """Start a phase; ``*_done`` is work of it already done (for example
        blobs a capture uploaded while it was still scanning)."""
        now = time.monotonic()
        with self._lock:
            closing = self._closing()
            self._generation += 1
            self._close_phase(now)
            self._phase, self._phase_started = name, now
            self._files_done, self._bytes_done = files_done, bytes_done
            self._files_total, self._bytes_total = files_total, bytes_total
            self._files_hashed = 0
            self._last_report = now
            report = self._snapshot()
        if self._callback is not None:
            if closing is not None:
                self._callback(closing)
            self._callback(report)

    def advance(self, files: int = 0, nbytes: int = 0) -> None:
        now = time.monotonic()
        with self._lock:
            self._files_done += files
            self._bytes_done += nbytes
            due = self._due_report(now)
        if due is not None:
            self._deliver(*due)

    def update(
        self, *, files_done: int, bytes_done: int, files_hashed: int = 0, final: bool = False
    ) -> None:
        """Set the current phase's counts to these values (a phase whose
        counts are polled, like the native scan's); reports at most every
        REPORT_INTERVAL_S, except ``final``, which fixes the phase's totals (its closing
        report then says exactly these counts)."""
        now = time.monotonic()
        with self._lock:
            self._files_done, self._bytes_done = files_done, bytes_done
            self._files_hashed = files_hashed
            if final:
                self._files_total, self._bytes_total = files_done, bytes_done
                return
            due = self._due_report(now)
        if due is not None:
            self._deliver(*due)

    def _due_report(self, now: float) -> tuple[Progress, int] | None:
        """Under the lock: the report to deliver now (and its phase's
        generation), or None within REPORT_INTERVAL_S of the last one."""
        if self._callback is None or now - self._last_report < REPORT_INTERVAL_S:
            return None
        self._last_report = now
        return self._snapshot(), self._generation

    def finish(self) -> int:
        """Close the current phase (its last report reaches the totals);
        returns the total duration in ms."""
        now = time.monotonic()
        with self._lock:
            closing = self._closing()
            self._generation += 1
            self._close_phase(now)
            self._phase = ""
        if closing is not None and self._callback is not None:
            self._callback(closing)
        return int((now - self._started) * 1000)

    def _snapshot(self) -> Progress:
        return Progress(
            self._phase,
            self._files_done,
            self._files_total,
            self._bytes_done,
            self._bytes_total,
            self._files_hashed,
        )

    def _deliver(self, report: Progress, generation: int) -> None:
        assert self._callback is not None
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            self._callback(report)
        else:
            self._loop.call_soon_threadsafe(self._deliver_current, report, generation)

    def _deliver_current(self, report: Progress, generation: int) -> None:
        # On the loop: a report of a phase that has ended since is stale.
        if generation == self._generation and self._callback is not None:
            self._callback(report)
