"""The stash a restore takes before its first change (docs/restore-history.md).

``StashBeforeApply`` gives ``restore_checkpoint`` its two hooks:

* ``after_plan``: the restore has scanned the live tree and planned; the hook
  decides whether the live tree must be saved (it differs from the
  workspace's base, or the caller always saves, as an undo does) and starts
  uploading the blobs of it the store lacks, beside the restore's own fetch;
* ``before_apply``: every blob the restore needs is staged and verified; the
  stash entry is appended now, and the base record names the restore under
  way. A restore that fails before this point appends nothing (blobs already
  uploaded are unreferenced: the next sweep deletes them).

The live tree is the restore's own scan (``PendingCheckpoint``: no second
walk), unless it holds a top-level ``.checkpointd*`` name (a leftover of an
interrupted restore, which no checkpoint may hold) or a changed file stored as
chunks (``PendingCheckpoint`` reads files whole): then it is captured afresh,
those names left out.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
from dataclasses import dataclass, replace
from typing import Literal

from . import _native
from ._engine import run_in_thread
from .blobs.base import BlobStore
from .capture import (
    CaptureOptions,
    CaptureResult,
    PendingCheckpoint,
    ScannedTree,
    capture_checkpoint,
)
from .manifest import Manifest, NewFiles, manifest_of, only_whole_files
from .model import DEFAULT_STASH_KEEP, Checkpoint, Policy, stash_thread_id
from .restore import PlannedRestore
from .secrets import SecretsArg
from .store.base import CheckpointStore
from .workspace_base import PendingRestore, WorkspaceBase, read_base, record_restoring

# The restore's staging directory lies at the top of the tree it restores
# into while the stash is taken: never part of a stash (restore reserves
# top-level ``.checkpointd*`` names).
STAGING_EXCLUDE = "/.checkpointd*"
# How a top-level ``.checkpointd*`` name shows in a manifest's rows (a symlink
# whose target starts so matches too: it only costs a scan).
_RESERVED_ROW = b'".checkpointd'


@dataclass(frozen=True)
class Stashed:
    """The stash entry a restore saved the live tree to. ``resumed``: an
    earlier, interrupted run of the same restore saved it."""

    checkpoint: Checkpoint
    blobs_uploaded: int = 0
    bytes_uploaded: int = 0
    resumed: bool = False


@dataclass(frozen=True)
class StashRequest:
    """Whose stash (``owner``'s), the sub-root and secrets the restore was
    given, and whether the live tree is saved whatever its base (``always``:
    an undo) or never (``discard``)."""

    owner: str
    workspace_subdir: str = ""
    secrets: SecretsArg = ()
    always: bool = False
    discard: bool = False
    keep: int = DEFAULT_STASH_KEEP


@dataclass
class _Step:
    """What ``after_plan`` prepared for ``before_apply``: nothing, an entry an
    earlier run made, a capture to take then, or an uploaded tree to append."""

    resumed: Checkpoint | None = None
    capture: bool = False
    compared: Checkpoint | None = None
    pending: PendingCheckpoint | None = None


def stash_policy(policy: Policy) -> Policy:
    """The policy a stash of a restore applying ``policy`` records."""
    return replace(policy, exclude=(*policy.exclude, STAGING_EXCLUDE))


def _compared_live(
    live: Manifest, compared: Checkpoint | None, target: Checkpoint
) -> tuple[Literal["same", "capture", "stash"], NewFiles | None]:
    """What the live tree a restore scanned asks of the stash: nothing
    ("same": it is the base ``compared``), a capture afresh ("capture": it
    holds a top-level ``.checkpointd*`` name, or a changed file stored as
    chunks, which adds chunk digests no file row has and PendingCheckpoint
    reads files whole), or the upload of the files it adds to the restore's
    ``target`` ("stash", with them)."""
    if _RESERVED_ROW in live.data:
        return "capture", None
    if compared is not None and manifest_of(compared.files).same_bytes(live):
        return "same", None
    new = _native.manifest_new_files(live.data, manifest_of(target.files).digests(), b"")
    if not only_whole_files(new):
        return "capture", None
    # Known now, beside the restore's fetch: the stash's append counts keys
    # against them (~40 ms at 100,000 entries, else on the event loop then).
    live.digests()
    return "stash", new


class StashBeforeApply:
    """The hooks of one restore (see the module); ``close`` in every case."""

    def __init__(
        self,
        root: str,
        store: CheckpointStore,
        blobs: BlobStore,
        request: StashRequest,
        data_dir: str | os.PathLike[str] | None,
    ) -> None:
        self.root, self.store, self.blobs, self.request = root, store, blobs, request
        self.data_dir = data_dir
        self.planned: PlannedRestore | None = None
        self.stashed: Stashed | None = None
        self._decided: asyncio.Future[bool] | None = None
        self._task: asyncio.Future[_Step] | None = None
        self._trimming: asyncio.Future[None] | None = None
        self._trim_due = False

    def after_plan(self, planned: PlannedRestore) -> None:
        self.planned = planned
        if self.request.discard:
            return
        self._decided = asyncio.get_running_loop().create_future()
        self._task = asyncio.ensure_future(self._prepare(planned, self._decided))

    async def before_apply(self, planned: PlannedRestore) -> None:
        if self._task is None or self._decided is None:
            return
        if await asyncio.shield(self._decided):
            planned.phase("stash")
        step = await asyncio.shield(self._task)
        if step.resumed is not None:
            self.stashed = Stashed(step.resumed, resumed=True)
            return
        result = await self._append(planned, step)
        if result is None:
            return
        saved = result.checkpoint
        self.stashed = Stashed(saved, result.stats.blobs_uploaded, result.stats.bytes_uploaded)
        self._trim_due = True
        if not self.request.always:
            # The oldest entries go while the restore applies (a prune of a
            # 100,000-entry entry is ~0.3 s of the store's work, beside the
            # renames); ``trimmed`` waits for it. (An undo restores a stash
            # entry: its trim waits for ``trimmed``.)
            trim = trim_stash(self.store, saved.thread_id, self.request.keep)
            self._trimming = asyncio.ensure_future(trim)
        record_restoring(
            planned.cache_path,
            planned.target_root,
            WorkspaceBase(saved.thread_id, saved.id),
            PendingRestore(planned.checkpoint.thread_id, planned.checkpoint.id, saved.id),
        )

    async def trimmed(self) -> None:
        """Trim the stash after a new entry (or wait for the trim that
        ``before_apply`` started); its error, if any, is the caller's."""
        trimming, self._trimming = self._trimming, None
        due, self._trim_due = self._trim_due, False
        if trimming is not None:
            await trimming
        elif due and self.stashed is not None:
            await trim_stash(self.store, self.stashed.checkpoint.thread_id, self.request.keep)

    async def close(self) -> None:
        """Stop what ``after_plan`` started and let go of its lease (a restore
        that failed before ``before_apply``: nothing is appended; one that
        failed after it: the trim still runs to its end, its error dropped for
        the restore's own)."""
        trimming, self._trimming = self._trimming, None
        if trimming is not None:
            with contextlib.suppress(BaseException):
                await trimming
        task, decided = self._task, self._decided
        if task is None or decided is None:
            return
        if not task.done():
            task.cancel()
        with contextlib.suppress(BaseException):
            step = await task
            if step.pending is not None:
                await step.pending.__aexit__(None, None, None)
        if decided.done() and not decided.cancelled():
            decided.exception()  # retrieved: the restore reported its own error

    async def _prepare(self, planned: PlannedRestore, decided: asyncio.Future[bool]) -> _Step:
        try:
            step = await self._decide(planned)
        except BaseException as error:
            decided.set_exception(error)
            raise
        stashing = step.capture or step.pending is not None
        decided.set_result(stashing)
        if step.pending is not None:
            await step.pending.__aenter__()
            try:
                await step.pending.upload()
            except BaseException:
                await step.pending.__aexit__(None, None, None)
                raise
        return step

    async def _decide(self, planned: PlannedRestore) -> _Step:
        base = read_base(planned.cache_path, planned.target_root)
        pending = base.restoring if base is not None else None
        if (
            pending is not None
            and (pending.thread_id, pending.checkpoint_id)
            == (planned.checkpoint.thread_id, planned.checkpoint.id)
            and (saved := await self.store.get(pending.stash_checkpoint_id)) is not None
        ):
            return _Step(resumed=saved)
        if planned.changes == 0:
            return _Step()  # nothing would be overwritten
        compared: Checkpoint | None = None
        if not self.request.always:
            if base is None or base.checkpoint_id is None:
                return _Step()  # a tree the thread never saw: nothing it could lose
            # A base gone from the store compares with nothing: stashed.
            checkpoint_id = base.checkpoint_id
            compared = await self.store.get(checkpoint_id)
        live = planned.live
        if live is None:
            return _Step(capture=True, compared=compared)
        # (Inflating, fingerprinting and diffing manifests: off the event loop,
        # which drives the restore's fetch meanwhile.)
        compared_live = functools.partial(_compared_live, live, compared, planned.checkpoint)
        verdict, new = await run_in_thread(compared_live)
        if verdict != "stash" or new is None:
            return _Step(capture=verdict == "capture", compared=compared)
        tree = ScannedTree(
            live,
            planned.live_with_secrets,
            stash_policy(planned.policy),
            self.request.workspace_subdir,
            self.request.secrets,
            "stash",
            known=planned.checkpoint,
            new_to_known=new,
        )
        pending_checkpoint = PendingCheckpoint(
            self.root, self.store, self.blobs, stash_thread_id(self.request.owner), tree
        )
        return _Step(pending=pending_checkpoint)

    async def _append(self, planned: PlannedRestore, step: _Step) -> CaptureResult | None:
        if step.pending is not None:
            try:
                return await step.pending.append()
            finally:
                await step.pending.__aexit__(None, None, None)
                step.pending = None
        if not step.capture:
            return None
        result = await capture_checkpoint(
            self.root,
            self.store,
            self.blobs,
            stash_thread_id(self.request.owner),
            CaptureOptions(
                policy=stash_policy(planned.policy),
                secrets=self.request.secrets,
                data_dir=self.data_dir,
                workspace_subdir=self.request.workspace_subdir,
                reason="stash",
                unchanged_from=step.compared,
            ),
        )
        return None if result.unchanged else result


async def trim_stash(store: CheckpointStore, stash_thread: str, keep: int) -> None:
    """Keep the newest ``keep`` stash entries (their blobs go at the next sweep)."""
    stash_lease = await store.acquire_writer(stash_thread)
    try:
        await store.delete_checkpoints(stash_thread, keep, stash_lease)
    finally:
        await stash_lease.release()


__all__ = [
    "STAGING_EXCLUDE",
    "StashBeforeApply",
    "StashRequest",
    "Stashed",
    "stash_policy",
    "trim_stash",
]
