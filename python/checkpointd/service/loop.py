"""The reference API's loop, built in: ``serve --thread T --restore-on-start --capture-every 60s``.

For platforms that want no orchestrator code. It never discards work:

* ``--restore-on-start`` (before the daemon serves, so nothing else writes yet)
  restores the thread's head only into an EMPTY workspace (nothing the policy
  selects). A workspace that holds something is left exactly as it is: when it
  differs from the head it is captured first, as a checkpoint labelled
  ``before-restore`` (so the work the last run did not capture is kept and
  becomes the head), and when it matches the head there is nothing to do.
* Every period a capture runs, except that a tick is skipped when a capture or
  restore of the thread requested over gRPC is running here (and when the store
  says another writer holds the thread: WRITER_CONFLICT), and when nothing
  changed: the live workspace (scanned with the stat cache, so unchanged files
  are not read) has the same manifest as the head.
* After ``FAILURES_BEFORE_NOT_SERVING`` failed captures in a row, health turns
  NOT_SERVING for the ``checkpointd.v1.Checkpointd`` service (the reason is
  logged on every failure), so an orchestrator watching health sees that work
  is no longer being saved; the next good capture turns it SERVING again.
* On SIGTERM, after the server drained, one final capture runs (again only when
  something changed); when it fails the daemon exits non-zero.

Policy and secrets: the ones ``serve`` was given (``--exclude``, ``--include``,
``--no-default-excludes``, ``--secret-env`` and their TOML keys); without a
policy setting, the one the head was captured with (the default policy for a
thread with no checkpoint).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from .. import _native
from .._engine import run_in_thread
from ..blobs.base import BlobStore
from ..capture import CaptureOptions, CaptureResult, capture_checkpoint
from ..diffing import diff_entries
from ..errors import SandboxCheckpointError, SandboxCheckpointWriterConflictError
from ..journal import WorkspaceJournal
from ..manifest import manifest_of
from ..model import Checkpoint, Entry, Policy
from ..scanner import ScanOutcome, scan_workspace
from ..statcache_paths import stat_cache_path
from ..store.base import CheckpointStore
from .config import ServeConfig
from .state import ServiceState

_log = logging.getLogger("checkpointd.loop")

# Failed captures in a row before health says NOT_SERVING: one failure may be a
# passing race (a file changing as it is read); three ticks is a pattern.
FAILURES_BEFORE_NOT_SERVING = 3
BEFORE_RESTORE_LABEL = "before-restore"

HealthCallback = Callable[[bool], Awaitable[None]]


class CaptureLoop:
    def __init__(
        self, config: ServeConfig, state: ServiceState, on_health: HealthCallback | None = None
    ) -> None:
        if config.thread is None:
            raise ValueError("the capture loop needs a thread")
        self._config = config
        self._state = state
        self._thread: str = config.thread
        self._on_health = on_health
        self._task: asyncio.Task[None] | None = None
        self.captures = 0
        self.skipped = 0
        self.failures_in_a_row = 0
        self.healthy = True

    # ---------------------------------------------------------------- start

    async def restore_on_start(self) -> None:
        """Restore the thread's head into an empty workspace; capture a non-empty
        one that differs from the head (label ``before-restore``) and leave it.

        Raises what ``restore_checkpoint`` raises (the daemon then does not start).
        A failed ``before-restore`` capture is logged and counted as a failed
        capture: the workspace is left alone either way.
        """
        from ..restore import RestoreOptions, restore_checkpoint

        store, blobs = self._stores()
        head = await self._head()
        if head is None:
            _log.info(
                "thread %s has no checkpoint; starting from the workspace as is", self._thread
            )
            return
        policy = head.effective_policy(self._config.policy)
        live = await self._scan(policy)
        if not live.entries and not live.unsupported:
            restored = await restore_checkpoint(
                self._config.workspace,
                store,
                blobs,
                self._thread,
                RestoreOptions(
                    checkpoint_id=head.id,
                    policy=self._config.policy,
                    data_dir=self._state.data_dir,
                    secrets=self._secrets(),
                ),
            )
            assert restored is not None
            _log.info("restored checkpoint %s of thread %s", restored.id, self._thread)
            return
        if not live.unsupported and _same(head, live.entries):
            _log.info(
                "the workspace already holds checkpoint %s of thread %s; nothing to restore",
                head.id,
                self._thread,
            )
            return
        _log.warning(
            "the workspace is not empty and differs from checkpoint %s of thread %s: "
            "capturing it as %r and leaving it as it is (no restore)",
            head.id,
            self._thread,
            BEFORE_RESTORE_LABEL,
        )
        try:
            await self._capture(head, label=BEFORE_RESTORE_LABEL)
        except Exception as error:  # noqa: BLE001 - the workspace is kept either way
            await self._failed(error)

    # ---------------------------------------------------------------- ticking

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
        quiet = self._config.capture_on_change
        if quiet is not None and self._watching() is not None:
            await self._run_on_change(quiet)
            return
        # Without a journal, capture-on-change looks every QUIET.
        period = self._config.capture_every or quiet or 60.0
        while True:
            await asyncio.sleep(period)
            if self._busy():
                continue
            await self.capture_if_changed()

    def _busy(self) -> bool:
        busy = self._state.by_thread.get(self._thread)
        if busy is not None and not busy[0].done():
            self.skipped += 1
            _log.info("skipping a tick: a capture or restore of %s is running", self._thread)
            return True
        return False

    def _watching(self) -> WorkspaceJournal | None:
        """The daemon's change journal, when it watches."""
        journal = self._state.journal
        return journal if journal is not None and journal.mode != "off" else None

    async def _run_on_change(self, quiet: float) -> None:
        """Capture once the workspace changed and has been quiet for ``quiet``
        seconds (or, with --capture-every, changed that long ago at most)."""
        bound = self._config.capture_every
        poll = min(max(quiet / 4, 0.05), 0.5)
        while True:
            await asyncio.sleep(poll)
            journal = self._watching()
            if journal is None:
                await asyncio.sleep(max(quiet, bound or 0.0) - poll)
                await self.capture_if_changed()
                continue
            status = journal.status()
            if not status["pending"]:
                continue
            idle, waiting = status["idle_ms"], status["pending_ms"]
            settled = idle is None or int(str(idle)) >= quiet * 1000
            overdue = (
                bound is not None and waiting is not None and int(str(waiting)) >= bound * 1000
            )
            if not (settled or overdue) or self._busy():
                continue
            if not await self.capture_if_changed() or journal.status()["pending"]:
                # Failed, or skipped (another writer): not again at once.
                await asyncio.sleep(min(quiet * 2 ** min(self.failures_in_a_row, 6), 60.0))

    async def final_capture(self) -> bool:
        """The capture on SIGTERM; False when it failed (the daemon then exits
        non-zero: work may not have been saved)."""
        return await self.capture_if_changed(final=True)

    async def capture_if_changed(self, *, final: bool = False) -> bool:
        """One tick; False only when the capture failed (a skipped tick is a
        success). Never raises (logs instead), except on cancellation."""
        try:
            head = await self._head()
            journal = self._watching()
            if head is not None and journal is not None:
                # The journal says whether anything changed; a capture it
                # directs finds out cheaply otherwise (unchanged: not stored).
                if not journal.status()["pending"] and journal.holds(manifest_of(head.files)):
                    self.skipped += 1
                    _log.debug("skipping a tick: the journal saw no change")
                    return True
                if (await self._capture(head, unchanged_from=head)).unchanged:
                    self.skipped += 1
                return True
            if head is not None and await self._unchanged(head):
                self.skipped += 1
                _log.debug("skipping a tick: nothing changed")
                return True
            await self._capture(head)
        except SandboxCheckpointWriterConflictError as error:
            if not final:
                self.skipped += 1
                _log.info("skipping a tick: another writer holds thread %s", self._thread)
                return True
            await self._failed(error)
            return False
        except Exception as error:  # noqa: BLE001 - the loop must outlive one failed tick
            await self._failed(error)
            return False
        return True

    # ---------------------------------------------------------------- parts

    def _stores(self) -> tuple[CheckpointStore, BlobStore]:
        store, blobs = self._state.store, self._state.blobs
        assert store is not None and blobs is not None
        return store, blobs

    async def _head(self) -> Checkpoint | None:
        store = self._state.store
        assert store is not None
        head_id = await store.get_head(self._thread)
        return await store.get(head_id) if head_id is not None else None

    def _secrets(self) -> dict[str, bytes]:
        """The --secret-env values by variable name (spans record the names)."""
        return dict(zip(self._config.secret_env, self._config.secrets, strict=True))

    def _policy(self, head: Checkpoint | None) -> Policy:
        if head is not None:
            return head.effective_policy(self._config.policy)
        return self._config.policy if self._config.policy is not None else Policy()

    async def _scan(self, policy: Policy) -> ScanOutcome:
        """The live workspace under ``policy``, with the loop's secrets (so zeroed
        bytes compare equal) and capture's stat cache."""
        cache = stat_cache_path(self._state.data_dir, self._config.workspace)
        token = _native.CancelToken()
        secrets = self._config.secrets
        return await run_in_thread(
            lambda: scan_workspace(self._config.workspace, policy, secrets, cache, token),
            token.cancel,
        )

    async def _unchanged(self, head: Checkpoint) -> bool:
        live = await self._scan(self._policy(head))
        return not live.unsupported and _same(head, live.entries)

    async def _capture(
        self,
        head: Checkpoint | None,
        *,
        label: str | None = None,
        unchanged_from: Checkpoint | None = None,
    ) -> CaptureResult:
        store, blobs = self._stores()
        result = await capture_checkpoint(
            self._config.workspace,
            store,
            blobs,
            self._thread,
            CaptureOptions(
                label=label,
                policy=self._policy(head),
                secrets=self._secrets(),
                data_dir=self._state.data_dir,
                unchanged_from=unchanged_from,
                journal=self._state.journal,
            ),
        )
        stats = result.stats
        if result.unchanged:
            _log.debug("the workspace still holds checkpoint %s", result.checkpoint.id)
        else:
            self.captures += 1
            _log.info(
                "captured checkpoint %s of thread %s (%s scan%s, %d entries examined)",
                result.checkpoint.id,
                self._thread,
                stats.scan_mode,
                f": {stats.full_scan_reason}" if stats.full_scan_reason else "",
                stats.entries_examined,
            )
        await self._succeeded()
        return result

    async def _succeeded(self) -> None:
        self.failures_in_a_row = 0
        if not self.healthy:
            self.healthy = True
            _log.warning("captures of thread %s work again: health SERVING", self._thread)
            if self._on_health is not None:
                await self._on_health(True)

    async def _failed(self, error: BaseException) -> None:
        self.failures_in_a_row += 1
        code = getattr(error, "code", type(error).__name__)
        reason = error.message if isinstance(error, SandboxCheckpointError) else str(error)
        _log.error(
            "capture of thread %s failed (%d in a row): %s: %s",
            self._thread,
            self.failures_in_a_row,
            code,
            reason,
            exc_info=not isinstance(error, SandboxCheckpointError),
        )
        if self.healthy and self.failures_in_a_row >= FAILURES_BEFORE_NOT_SERVING:
            self.healthy = False
            _log.error(
                "health NOT_SERVING: %d captures of thread %s failed in a row, the last "
                "with %s: %s",
                self.failures_in_a_row,
                self._thread,
                code,
                reason,
            )
            if self._on_health is not None:
                await self._on_health(False)


def _same(head: Checkpoint, live: tuple[Entry, ...]) -> bool:
    return next(iter(diff_entries(head.files, live)), None) is None
