"""The seed's loop, built in: ``serve --thread T --restore-on-start --capture-every 60s``.

For platforms that want no orchestrator code. Before the daemon serves, the
thread's newest checkpoint is restored (nothing else can write yet). Then every
period a capture runs, except that a tick is skipped

* when a capture or restore of the thread requested over gRPC is running here
  (and when the store says another writer holds the thread: WRITER_CONFLICT),
  and
* when nothing changed: the live workspace (scanned with the stat cache, so
  unchanged files are not read) has the same manifest as the head.

On SIGTERM, after the server drained, one final capture runs (again only when
something changed). The loop uses the default policy and no secrets.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from ..errors import SandboxCheckpointWriterConflictError
from .config import ServeConfig
from .diffing import diff_entries, scan_live
from .servicer import ServiceState

_log = logging.getLogger("checkpointd.loop")


class CaptureLoop:
    def __init__(self, config: ServeConfig, state: ServiceState) -> None:
        if config.thread is None:
            raise ValueError("the capture loop needs a thread")
        self._config = config
        self._state = state
        self._thread: str = config.thread
        self._task: asyncio.Task[None] | None = None
        self.captures = 0
        self.skipped = 0

    async def restore_on_start(self) -> None:
        """Restore the thread's newest checkpoint, if it has one. Raises what
        ``restore_checkpoint`` raises (the daemon then does not start)."""
        from ..restore import restore_checkpoint

        assert self._state.store is not None and self._state.blobs is not None
        restored = await restore_checkpoint(
            self._config.workspace,
            self._state.store,
            self._state.blobs,
            self._thread,
            data_dir=self._state.data_dir,
        )
        if restored is None:
            _log.info(
                "thread %s has no checkpoint; starting from the workspace as is", self._thread
            )
        else:
            _log.info("restored checkpoint %s of thread %s", restored.id, self._thread)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="checkpointd-capture-loop")

    async def stop(self) -> None:
        """Stop ticking; a capture of the loop that is running is cancelled (its
        lease released); the final capture follows the drain."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        period = self._config.capture_every or 60.0
        while True:
            await asyncio.sleep(period)
            busy = self._state.by_thread.get(self._thread)
            if busy is not None and not busy[0].done():
                self.skipped += 1
                _log.info("skipping a tick: a capture or restore of %s is running", self._thread)
                continue
            await self.capture_if_changed()

    async def final_capture(self) -> None:
        await self.capture_if_changed()

    async def _unchanged(self) -> bool:
        store = self._state.store
        assert store is not None
        head = await store.get_head(self._thread)
        if head is None:
            return False
        checkpoint = await store.get(head)
        if checkpoint is None:
            return False
        live = await scan_live(self._config.workspace, None, (), self._state.data_dir)
        return next(iter(diff_entries(checkpoint.files, live)), None) is None

    async def capture_if_changed(self) -> bool:
        """One tick; True when a checkpoint was made. Never raises (logs instead),
        except on cancellation."""
        from ..capture import capture_checkpoint

        store, blobs = self._state.store, self._state.blobs
        assert store is not None and blobs is not None
        try:
            if await self._unchanged():
                self.skipped += 1
                _log.debug("skipping a tick: nothing changed")
                return False
            result = await capture_checkpoint(
                self._config.workspace, store, blobs, self._thread, data_dir=self._state.data_dir
            )
        except SandboxCheckpointWriterConflictError:
            self.skipped += 1
            _log.info("skipping a tick: another writer holds thread %s", self._thread)
            return False
        except Exception:  # noqa: BLE001 - the loop must outlive one failed tick
            _log.exception("capture of thread %s failed", self._thread)
            return False
        self.captures += 1
        _log.info("captured checkpoint %s of thread %s", result.checkpoint.id, self._thread)
        return True
