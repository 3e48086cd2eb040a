"""The daemon's change journal: started with the server (``serve --watch``)
and checked by a background verifying scan (``serve --watch-verify-every``).

The verifying scan is a full scan of the workspace at low priority (one
thread, ``nice`` 19, its own stat cache: it never holds the captures'
secrets, so it must not replace their cache) when no capture holds the
journal. Every path whose row differs from the manifest the journal's
changes are relative to must be one the journal would have the next capture
examine; one that is not (a write through a shared ``mmap``, which no event
reports; a change the kernel did not tell) is logged as a warning, counted,
and makes the next capture a full scan that says why. A verification that a
capture overlapped proves nothing and is tried again at the next period.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from .. import _native
from .._engine import run_in_thread
from ..errors import SandboxCheckpointError
from ..journal import Baseline, WorkspaceJournal
from ..manifest import manifest_of
from ..scanner import scan_workspace
from ..statcache_paths import stat_cache_path
from ..store.base import CheckpointStore
from .config import ServeConfig

_log = logging.getLogger("checkpointd.watch")

# Paths named in a warning and in the reason the next capture gives.
_NAMED = 5
# Differences read from a verification, at most (enough to tell; bounded).
_DIFFERENCES = 1000


def start_journal(config: ServeConfig) -> WorkspaceJournal:
    """The workspace's journal in the mode ``--watch`` asks for (logged: the
    mode it got and why)."""
    journal = WorkspaceJournal(str(config.workspace), config.watch, config.policy)
    mode, detail = journal.describe()
    if mode == "off" and config.watch != "off":
        _log.warning("not watching the workspace (--watch %s): %s", config.watch, detail)
    else:
        _log.info("watching the workspace: %s (%s)", mode, detail)
    return journal


def watch_capabilities(journal: WorkspaceJournal | None) -> dict[str, str]:
    """GetServerInfo's watch fields: the journal's mode and why."""
    if journal is None:
        return {"watch_mode": "off", "watch_detail": "no change journal was started"}
    mode, detail = journal.describe()
    return {"watch_mode": mode, "watch_detail": detail}


@dataclass
class Verification:
    """What the verifying scans found so far."""

    runs: int = 0
    inconclusive: int = 0
    mismatches: int = 0
    last_missed: list[str] = field(default_factory=list)


class Verifier:
    """Every ``period`` seconds, a verifying scan (see the module docstring)."""

    def __init__(
        self,
        journal: WorkspaceJournal,
        store: CheckpointStore,
        config: ServeConfig,
        data_dir: Path,
        period: float,
    ) -> None:
        self.journal = journal
        self.store = store
        self.workspace = str(config.workspace)
        self.cache = stat_cache_path(data_dir, config.workspace, "") + ".verify"
        self.period = period
        self.found = Verification()
        self._task: asyncio.Task[None] | None = None
        # Its own thread: the scan runs at nice 19, which the thread keeps.
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="verify")

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="checkpointd-verify")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._thread.shutdown(wait=False, cancel_futures=True)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.period)
            try:
                await self.verify_once()
            except (SandboxCheckpointError, OSError, ValueError) as error:
                _log.warning("the verifying scan failed: %s", error)

    async def verify_once(self) -> bool | None:
        """One verification: True when the journal missed nothing, False when
        it did (the next capture then scans everything), None when it proves
        nothing (a capture overlapped it, or there is nothing to compare with)."""
        before = self.journal.quiescent()
        if before is None or self.journal.status().get("untrusted"):
            return None
        baseline = before[0]
        base = await self._baseline_bytes(baseline)
        if base is None:
            return None
        token = _native.CancelToken()
        policy = baseline.key.policy
        now = await run_in_thread(
            lambda: _low_priority_scan(self.workspace, policy, self.cache, token),
            token.cancel,
            self._thread,
        )
        paths = await run_in_thread(lambda: _native.journal_differences(base, now, _DIFFERENCES))
        missed = [path for path in paths if not self.journal.covers(path)]
        if self.journal.quiescent() != before:
            self.found.inconclusive += 1
            return None
        self.found.runs += 1
        if not missed:
            return True
        self.found.mismatches += 1
        self.found.last_missed = missed[:_NAMED]
        shown = ", ".join(missed[:_NAMED]) + (
            f" and {len(missed) - _NAMED} more" if len(missed) > _NAMED else ""
        )
        reason = (
            f"the verifying scan found {len(missed)} change(s) the journal missed ({shown}); "
            f"{self.found.mismatches} such scan(s) since the daemon started"
        )
        _log.warning("%s: the next capture scans everything", reason)
        self.journal.distrust(reason)
        return False

    async def _baseline_bytes(self, baseline: Baseline) -> bytes | None:
        checkpoint = await self.store.get(baseline.checkpoint_id)
        if checkpoint is None:
            return None
        files = manifest_of(checkpoint.files)
        if (files.byte_length(), files.fingerprint()) != (
            baseline.byte_length,
            baseline.fingerprint,
        ):
            return None  # a capture that found the head unchanged: mtimes differ
        return await run_in_thread(lambda: files.data)


def _low_priority_scan(root: str, policy: object, cache: str, token: _native.CancelToken) -> bytes:
    """A full scan's manifest, on one thread at the lowest CPU priority (the
    scan's thread inherits this thread's nice value)."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    outcome = scan_workspace(root, policy, (), cache, token, threads=1)  # type: ignore[arg-type]
    return outcome.manifest


__all__ = ["Verification", "Verifier", "start_journal", "watch_capabilities"]
