"""Restore history: a restore never loses work (docs/restore-history.md).

``restore_with_history`` is ``restore_checkpoint`` with three additions, all
under the thread's writer lease:

1. **Stash before overwrite.** Once every blob the restore needs is staged and
   verified, and before its first change, a restore that would change the
   tree captures the live state into the thread's stash (``<thread>~stash``,
   ``model.stash_thread_id``) when it differs from the workspace's base
   (``workspace_base``): the checkpoint the tree was last captured to or
   restored from. A tree with no base (a new sandbox) has nothing the thread
   could lose: nothing is stashed. ``discard_live_changes`` skips the stash.
   The stash keeps the newest ``stash_keep`` entries.
2. **Undo** (``undo_restore``) restores the newest stash entry, stashing
   whatever it overwrites (base or not), so an undo of an undo is a redo.
3. **Record.** ``record`` appends to the thread, when the restored checkpoint
   is not its head, a checkpoint with that manifest (reason "restore",
   ``restored_from_checkpoint_id``; every blob is already stored), so the head
   describes the workspace. Off by default: TanStack AI's ``@tanstack/ai-sandbox``
   restore never moves the head.

A restore that fails before its first change (a missing or corrupt blob)
stashes nothing. One killed after the stash and before its last change left
the stash committed and the base record naming the restore; run again, it
does not stash its own half-applied tree, and an interrupted undo resumes.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from .blobs.base import BlobStore
from .errors import MISSING_CHECKPOINT, SandboxCheckpointInvalidArgumentError, SandboxSnapshotError
from .ids import new_uuid7
from .model import (
    DEFAULT_STASH_KEEP,
    Checkpoint,
    Policy,
    WriterLease,
    stash_owner,
    stash_thread_id,
)
from .progress import ProgressCallback
from .restore import PlannedRestore, RestoreOptions, preview_restore, restore_checkpoint
from .secrets import SecretsArg
from .stash import StashBeforeApply, Stashed, StashRequest
from .statcache_paths import resolve_data_dir, stat_cache_path
from .store.base import CheckpointStore, ThreadListing, ThreadSummary
from .validation import checked_subdir
from .workspace_base import read_base, record_base


@dataclass(frozen=True)
class HistoryRestore:
    """One restore through history: ``thread_id`` and ``checkpoint_id`` (None:
    the head; ignored by undo), ``policy`` and ``workspace_subdir`` as
    ``restore_checkpoint`` takes them, ``secrets`` (zeroed in the stash,
    written back into the restored files), and what history adds."""

    thread_id: str
    checkpoint_id: str | None = None
    policy: Policy | None = None
    workspace_subdir: str = ""
    secrets: SecretsArg = ()
    discard_live_changes: bool = False
    record: bool = False
    stash_keep: int = DEFAULT_STASH_KEEP


@dataclass
class RestoreOutcome:
    """What a restore through history did: the checkpoint restored (None: the
    thread has none), the stash entry it saved first, the checkpoint it
    appended (``record``), and the files left with zeros where secrets were."""

    restored: Checkpoint | None = None
    stashed: Stashed | None = None
    recorded: Checkpoint | None = None
    unfilled_secrets: list[str] = field(default_factory=list)
    planned: PlannedRestore | None = None


@dataclass(frozen=True)
class HistoryPreview:
    """A dry run: the restore's plan, and the live changes (differences from
    the workspace's base) it would overwrite or delete, saved to the stash
    first (empty: nothing would be stashed), with the bytes of those files."""

    written: list[str]
    deleted: list[str]
    stashed: list[str]
    bytes_stashed: int
    checkpoint: Checkpoint | None = None
    kept: int = 0
    dirs_to_make: int = 0
    bytes_to_fetch: int = 0
    blobs_to_fetch: int = 0


def owner_of(thread_id: str) -> str:
    """The thread whose lease and stash a restore of ``thread_id`` uses (a
    restore of a stash entry is the owner thread's)."""
    return stash_owner(thread_id) or thread_id


def _absolute(path: str | os.PathLike[str]) -> str:
    return os.path.abspath(os.fspath(path))


def _tree(root: str, data_dir: str | os.PathLike[str] | None, subdir: str) -> tuple[str, str]:
    """(the directory a restore of ``subdir`` works in, its stat cache)."""
    subdir = checked_subdir(subdir)
    cache = stat_cache_path(resolve_data_dir(root, data_dir), root, subdir)
    return (os.path.join(root, subdir) if subdir else root), cache


async def _existing(store: CheckpointStore, checkpoint_id: str | None) -> Checkpoint | None:
    return await store.get(checkpoint_id) if checkpoint_id is not None else None


async def restore_with_history(
    workspace_root: str | os.PathLike[str],
    store: CheckpointStore,
    blobs: BlobStore,
    request: HistoryRestore,
    *,
    data_dir: str | os.PathLike[str] | None = None,
    progress: ProgressCallback | None = None,
) -> RestoreOutcome:
    """Restore ``request.checkpoint_id`` (None: the head) of ``request.thread_id``,
    stashing the live changes it would overwrite first, and appending a
    ``restore`` checkpoint when ``request.record`` asks (see the module).

    Raises as ``restore_checkpoint`` does (WRITER_CONFLICT while the thread, or
    for a stash thread its owner, is held), and as ``capture_checkpoint`` does
    for the stash; ``stash_keep`` below 1 is INVALID_ARGUMENT."""
    given = RestoreOptions(data_dir=data_dir, progress=progress)
    return await _restore(workspace_root, store, blobs, request, given, undo=False)


async def undo_restore(
    workspace_root: str | os.PathLike[str],
    store: CheckpointStore,
    blobs: BlobStore,
    request: HistoryRestore,
    *,
    data_dir: str | os.PathLike[str] | None = None,
    progress: ProgressCallback | None = None,
) -> RestoreOutcome:
    """Restore the newest entry of ``request.thread_id``'s stash, stashing
    whatever it overwrites (an undo of an undo is a redo). ``record`` makes
    the thread's head follow. Raises SandboxSnapshotError(MISSING_CHECKPOINT)
    when the stash is empty, else as ``restore_with_history``."""
    given = RestoreOptions(data_dir=data_dir, progress=progress)
    return await _restore(workspace_root, store, blobs, request, given, undo=True)


async def _restore(
    workspace_root: str | os.PathLike[str],
    store: CheckpointStore,
    blobs: BlobStore,
    request: HistoryRestore,
    given: RestoreOptions,
    *,
    undo: bool,
) -> RestoreOutcome:
    """A restore (``undo``: of the newest stash entry) through history;
    ``given`` holds the caller's ``data_dir`` and ``progress``, the rest of the
    restore's options come from ``request``."""
    if request.stash_keep < 1:
        raise SandboxCheckpointInvalidArgumentError(
            f"stash_keep must be at least 1, got {request.stash_keep}",
            details={"field": "stash_keep"},
        )
    root = _absolute(workspace_root)
    data_dir = given.data_dir
    owner = owner_of(request.thread_id)
    lease = await store.acquire_writer(owner)
    try:
        target_thread, target_id = request.thread_id, request.checkpoint_id
        if undo:
            target_thread, undone, subdir = await _undo_target(
                store, owner, root, request, data_dir
            )
            target_id = undone
            request = replace(request, workspace_subdir=subdir)
        hook = StashBeforeApply(
            root,
            store,
            blobs,
            StashRequest(
                owner,
                checked_subdir(request.workspace_subdir),
                request.secrets,
                always=undo,
                discard=request.discard_live_changes,
                keep=request.stash_keep,
            ),
            data_dir,
        )
        outcome = RestoreOutcome()
        try:
            outcome.restored = await restore_checkpoint(
                root,
                store,
                blobs,
                target_thread,
                replace(
                    given,
                    checkpoint_id=target_id,
                    policy=request.policy,
                    workspace_subdir=request.workspace_subdir,
                    secrets=request.secrets,
                    unfilled_secrets=outcome.unfilled_secrets,
                    lease=lease,
                    before_apply=hook.before_apply,
                    after_plan=hook.after_plan,
                ),
            )
            outcome.stashed, outcome.planned = hook.stashed, hook.planned
            if request.record and outcome.restored is not None:
                await _record_restored(store, lease, owner, outcome)
            # (An undo's trim starts only now: it may delete the entry just
            # restored, which the record above still names.)
            await hook.trimmed()
        finally:
            await hook.close()
        return outcome
    finally:
        await lease.release()


async def _undo_target(
    store: CheckpointStore,
    owner: str,
    root: str,
    request: HistoryRestore,
    data_dir: str | os.PathLike[str] | None,
) -> tuple[str, str, str]:
    """(thread, checkpoint, sub-root) an undo restores: the newest stash entry,
    or the entry an interrupted undo was restoring (it stashed the tree it
    overwrote, which is now the newest entry)."""
    stash_thread = stash_thread_id(owner)
    newest_id = await store.get_head(stash_thread)
    newest = await _existing(store, newest_id)
    if newest is None:
        raise SandboxSnapshotError(
            MISSING_CHECKPOINT,
            f"nothing to undo: thread {owner!r} has no stash entry",
            details={"thread_id": owner},
        )
    subdir = request.workspace_subdir or newest.workspace_subdir
    target_root, cache = _tree(root, data_dir, subdir)
    base = read_base(cache, target_root)
    pending = base.restoring if base is not None else None
    if (
        pending is not None
        and pending.thread_id == stash_thread
        and pending.stash_checkpoint_id == newest.id
        and await _existing(store, pending.checkpoint_id) is not None
    ):
        return stash_thread, pending.checkpoint_id, subdir
    return stash_thread, newest.id, subdir


async def _record_restored(
    store: CheckpointStore, lease: WriterLease, owner: str, outcome: RestoreOutcome
) -> None:
    """``record``: the head follows the workspace (see ``_record``), and the
    workspace's base is that new head."""
    assert outcome.restored is not None
    outcome.recorded = await _record(store, lease, owner, outcome.restored)
    if outcome.recorded is not None and outcome.planned is not None:
        planned = outcome.planned
        record_base(planned.cache_path, planned.target_root, owner, outcome.recorded.id)


async def _record(
    store: CheckpointStore, lease: WriterLease, owner: str, restored: Checkpoint
) -> Checkpoint | None:
    """Append to ``owner`` a checkpoint with ``restored``'s manifest, unless it
    is the head already. Its blobs are stored (``restored`` references them,
    and nothing deletes it while the lease is held): nothing is uploaded."""
    head_id = await store.get_head(owner)
    if head_id == restored.id:
        return None
    head = await _existing(store, head_id)
    created_at = int(time.time() * 1000)
    if head is not None:
        created_at = max(created_at, int(head.created_at) + 1)
    checkpoint = Checkpoint(
        id=new_uuid7(),
        thread_id=owner,
        parent_checkpoint_id=head_id,
        created_at=created_at,
        reason="restore",
        files=restored.files,
        conversation=restored.conversation,
        conversation_text=restored.conversation_text,
        artifacts=restored.artifacts,
        policy=restored.policy,
        workspace_subdir=restored.workspace_subdir,
        restored_from_checkpoint_id=restored.id,
    )
    await store.append(checkpoint, head_id, lease)
    return checkpoint


async def preview_with_history(
    workspace_root: str | os.PathLike[str],
    store: CheckpointStore,
    request: HistoryRestore,
    *,
    data_dir: str | os.PathLike[str] | None = None,
    undo: bool = False,
) -> HistoryPreview:
    """What ``restore_with_history`` (``undo``: ``undo_restore``) would do now,
    changing nothing and taking no lease: the plan, and the paths whose live
    changes it would stash first. Raises as ``preview_restore`` does (and
    MISSING_CHECKPOINT for an undo with an empty stash)."""
    root = _absolute(workspace_root)
    owner = owner_of(request.thread_id)
    thread, checkpoint_id = request.thread_id, request.checkpoint_id
    if undo:
        thread, checkpoint_id, subdir = await _undo_target(store, owner, root, request, data_dir)
        request = replace(request, workspace_subdir=subdir)
    preview = await preview_restore(
        root,
        store,
        thread,
        RestoreOptions(
            checkpoint_id=checkpoint_id,
            policy=request.policy,
            data_dir=data_dir,
            workspace_subdir=request.workspace_subdir,
        ),
    )
    if preview is None:
        return HistoryPreview([], [], [], 0)
    touched = sorted({*preview.written, *preview.deleted})
    stashed: list[str] = []
    if touched and not request.discard_live_changes:
        # An undo stashes whatever it overwrites; a restore, the live changes.
        differing = (
            None
            if undo
            else await _differing_from_base(root, store, request, preview.checkpoint, data_dir)
        )
        stashed = touched if differing is None else [p for p in touched if p in differing]
    target_root, _cache = _tree(root, data_dir, request.workspace_subdir)
    return HistoryPreview(
        written=preview.written,
        deleted=preview.deleted,
        stashed=stashed,
        bytes_stashed=_live_bytes(target_root, stashed),
        checkpoint=preview.checkpoint,
        kept=preview.kept,
        dirs_to_make=preview.dirs_to_make,
        bytes_to_fetch=preview.bytes_to_fetch,
        blobs_to_fetch=preview.blobs_to_fetch,
    )


async def _differing_from_base(
    root: str,
    store: CheckpointStore,
    request: HistoryRestore,
    target: Checkpoint,
    data_dir: str | os.PathLike[str] | None,
) -> set[str] | None:
    """The paths where the live tree differs from its base (those a restore of
    the base would write or delete); None: every path counts (the base is gone
    from the store); empty without a base, or when an interrupted run of this
    restore stashed the tree already."""
    target_root, cache = _tree(root, data_dir, request.workspace_subdir)
    base = read_base(cache, target_root)
    if base is None or base.checkpoint_id is None:
        return set()
    pending = base.restoring
    if pending is not None and (pending.thread_id, pending.checkpoint_id) == (
        target.thread_id,
        target.id,
    ):
        return set()
    compared = await _existing(store, base.checkpoint_id)
    if compared is None:
        return None
    changed = await preview_restore(
        root,
        store,
        compared.thread_id,
        RestoreOptions(
            checkpoint_id=compared.id,
            policy=target.effective_policy(request.policy),
            data_dir=data_dir,
            workspace_subdir=request.workspace_subdir,
        ),
    )
    return set() if changed is None else {*changed.written, *changed.deleted}


def _live_bytes(target_root: str, paths: Sequence[str]) -> int:
    """The bytes of the regular files among ``paths`` as they are now."""
    total = 0
    for path in paths:
        try:
            info = os.lstat(os.path.join(target_root, path))
        except OSError:
            continue
        if stat.S_ISREG(info.st_mode):
            total += info.st_size
    return total


async def list_user_threads(
    store: ThreadListing, *, after: str | None, limit: int
) -> list[ThreadSummary]:
    """At most ``limit`` threads after ``after`` as ``list_threads`` gives
    them, stash threads left out (they are listed with their thread's
    checkpoints, ``ListCheckpoints`` ``stash``)."""
    found: list[ThreadSummary] = []
    cursor = after
    while len(found) < limit:
        page = await store.list_threads(after=cursor, limit=limit)
        found.extend(thread for thread in page if stash_owner(thread.thread_id) is None)
        if len(page) < limit:
            break
        cursor = page[-1].thread_id
    return found[:limit]


__all__ = [
    "DEFAULT_STASH_KEEP",
    "HistoryPreview",
    "HistoryRestore",
    "RestoreOutcome",
    "Stashed",
    "list_user_threads",
    "owner_of",
    "preview_with_history",
    "restore_with_history",
    "undo_restore",
]
