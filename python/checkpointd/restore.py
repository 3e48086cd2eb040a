"""The restore engine (docs/contract.md#restore): bring a workspace back to a checkpoint, safely.

Read top to bottom, ``restore_checkpoint`` does:

1. take the thread's writer lease (fails fast with WRITER_CONFLICT) and resolve
   the checkpoint (None when the thread has none);
2. validate the manifest: every path as in docs/contract.md#data-model, and no top-level
   ``.checkpointd*`` name (reserved for staging) → INVALID_PATH;
3. plan natively (``_native.RestoreSession``): open the restore root (a
   ``workspace_subdir`` one component at a time from the workspace fd, never
   following a symlink), scan it live with the policy and the stat cache, diff
   the target manifest against it: only files whose content differs are
   written, paths the policy selects that the checkpoint lacks are deleted,
   excluded paths stay, a file whose inode has other names (a hard link) is
   replaced rather than changed in place, and a file that equals the
   checkpoint's but for the secrets capture zeroed in it is left alone;
4. fetch (``_restore_fetch``) every needed blob and stage it, verified (size and BLAKE3) before
   its bytes are written, in a private directory at the top of the root (same
   filesystem, so the final renames are atomic), before the first change to
   the workspace: MISSING_BLOB / INVALID_BLOB leave it as it was. Packed blobs
   are grouped by pack across the whole plan, nearby frames merged into one
   ranged GET (about one per pack), at most FETCH_CONCURRENCY in flight, each
   streamed into staging natively frame by frame (memory: a chunk per read,
   not the pack); other blobs in batches (``get_many``), large ones streamed;
5. apply natively in batches: deletions (deepest first), directories, files by
   atomic rename, symlinks, file modes and mtimes, directory modes (deepest
   first); every operation is fd-relative with ``O_NOFOLLOW`` beneath the root
   and never enters another filesystem (a mount point is left alone and
   logged);
6. sync the workspace's filesystem (restored data is durable before the
   restore reports success; a native thread has been starting the writeback
   every 300 ms since staging began, so this waits for the last bytes only),
   then record in the stat cache exactly the inodes
   the restore renamed in (their stat as the restore's own fds saw them), so
   the next capture reuses those hashes and re-hashes anything rewritten since;
   last, write the given secrets back where capture zeroed them
   (``RestoreSession.fill_secrets``, rust/src/spans.rs).

The plan is computed from the live state, so re-running an interrupted restore
completes it. Symlink targets are restored exactly as stored: creating a link
never touches what it names, and restore never follows one.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from . import _native, chunks
from ._engine import (
    LeaseKeeper,
    PhaseReporter,
    StopFlag,
    os_errors_mapped,
    run_in_thread,
)
from ._restore_fetch import fetch_blobs, invalid_blob
from .blobs.base import BlobStore
from .blobs.packs import packed_blobs
from .errors import (
    INVALID_PATH,
    MISSING_CHECKPOINT,
    NAME_TOO_LONG,
    SandboxCheckpointInvalidArgumentError,
    SandboxSnapshotError,
)
from .manifest import Known, Manifest, manifest_of
from .model import Checkpoint, Policy, WriterLease
from .progress import ProgressCallback
from .secrets import Secrets, SecretsArg, parse_secrets
from .statcache_paths import resolve_data_dir, stat_cache_path
from .store.base import CheckpointStore
from .validation import check_id, check_optional_id, checked_subdir, entries_problem
from .workspace_base import record_base

_log = logging.getLogger("checkpointd.restore")

# Operations per native apply call (between two progress reports and checks).
APPLY_BATCH = 4096
_RESERVED_TOP_LEVEL = ".checkpointd"


def validate_manifest(checkpoint: Checkpoint) -> None:
    """SandboxSnapshotError(INVALID_PATH) unless every path is valid.

    Applies docs/contract.md#data-model's path rules (no '..', no absolute path, no entry beneath a
    file or symlink...) and refuses top-level ``.checkpointd*`` names, which
    restore reserves for its staging area.
    """
    files = checkpoint.files
    if isinstance(files, Manifest) and files.trusted:
        # Validated by our scan or by the store on append; the reserved names
        # and the name lengths are checked natively while planning.
        return
    problem = entries_problem(files)
    if problem is None:
        for entry in checkpoint.files:
            if entry.path.split("/", 1)[0].startswith(_RESERVED_TOP_LEVEL):
                problem = (entry.path, "top-level .checkpointd* names are reserved")
                break
    if problem is not None:
        path, reason = problem
        raise SandboxSnapshotError(
            INVALID_PATH,
            f"checkpoint {checkpoint.id} has an invalid path {path}: {reason}",
            details={"checkpoint_id": checkpoint.id, "path": path},
        )


@dataclass(frozen=True)
class RestoreOptions:
    """How ``restore_checkpoint`` restores (every field optional).

    ``checkpoint_id``: the checkpoint to restore instead of the thread's head.

    ``policy`` None means the policy the checkpoint was captured with (the
    default one for a checkpoint that records none); an explicit one wins.

    ``data_dir``: where the stat cache lives (the default data dir when None).
    ``progress`` is called with the restore's phases and counts.

    ``workspace_subdir`` (relative, '/'-separated) restores into that directory
    beneath the workspace root instead, opened from the root's descriptor one
    component at a time without following symlinks (so code in the sandbox
    cannot redirect it); a missing last component is created.

    ``secrets`` (a sequence of byte strings or a mapping name → bytes, as given
    to capture) are written back where capture zeroed them. A live file whose
    bytes, with the recorded secret spans zeroed, equal the checkpoint's is left
    as it is (it still holds its secrets), except that a given secret is written
    where it holds zeros instead. Files left with zeros where a secret was (its
    secret not given) are logged and appended to ``unfilled_secrets`` when a
    list is given.

    ``lease``: a writer lease the caller holds (and releases) instead of this
    thread's own (restore history holds its thread's while it restores a
    stash entry). ``before_apply`` is awaited once every blob is staged and
    verified, before the first change (the stash is committed there);
    ``after_plan`` is called with the same plan before the fetch starts (work
    that may overlap the fetch starts there). Both see the live scan's tree.
    """

    checkpoint_id: str | None = None
    policy: Policy | None = None
    data_dir: str | os.PathLike[str] | None = None
    progress: ProgressCallback | None = None
    workspace_subdir: str = ""
    secrets: SecretsArg = ()
    unfilled_secrets: list[str] | None = None
    lease: WriterLease | None = None
    before_apply: Callable[[PlannedRestore], Awaitable[None]] | None = None
    after_plan: Callable[[PlannedRestore], None] | None = None


@os_errors_mapped
async def restore_checkpoint(
    workspace_root: str | os.PathLike[str],
    store: CheckpointStore,
    blobs: BlobStore,
    thread_id: str,
    options: RestoreOptions | None = None,
) -> Checkpoint | None:
    """Restore the head (or ``options.checkpoint_id``) of ``thread_id`` into
    the workspace, as ``options`` (``RestoreOptions``) say.

    Returns the restored checkpoint, or None when the thread has none (the root is
    still created). Raises SandboxCheckpointInvalidIdError for a bad id,
    SandboxCheckpointInvalidArgumentError for a data_dir inside the workspace or a
    root whose parent is missing, SandboxCheckpointWriterConflictError when the
    thread's lease is held, and SandboxSnapshotError with MISSING_CHECKPOINT (an
    unknown id or one of another thread), INVALID_PATH (hostile manifest, or a
    sub-root that is not a real directory beneath the root), MISSING_BLOB or
    INVALID_BLOB (the workspace is then unchanged); OSError (naming the path) when
    the workspace refuses a change, e.g. ENOSPC.
    """
    options = options or RestoreOptions()
    check_id(thread_id, "thread id")
    check_optional_id(options.checkpoint_id, "checkpoint id")
    given_secrets = parse_secrets(options.secrets)
    where = _restore_root(workspace_root, options)
    reporter = PhaseReporter(options.progress)

    reporter.phase("lease")
    lease = options.lease
    held = lease if lease is not None else await store.acquire_writer(thread_id)
    try:
        async with LeaseKeeper(held) as keeper:
            reporter.phase("resolve")
            checkpoint = await _resolve(store, thread_id, options.checkpoint_id)
            if checkpoint is not None:
                validate_manifest(checkpoint)
            _ensure_root(where.root)
            if checkpoint is None:
                return None

            reporter.phase("plan")
            # No policy given: the one the checkpoint was captured with, so a
            # restore never deletes what that capture left out (docs/design.md).
            policy = checkpoint.effective_policy(options.policy)
            session = await _open_session(
                where, checkpoint, policy, given_secrets, keep_live=options.before_apply is not None
            )
            try:
                keeper.check()
                planned = _planned(checkpoint, policy, where, session, reporter)
                # Small blobs are read out of their packs through the store's index.
                source = packed_blobs(blobs, store)
                await _fetch_and_apply(source, session, planned, options, reporter, keeper)
                unfilled = await run_in_thread(session.fill_secrets)
                prefix = f"{where.subdir}/" if where.subdir else ""
                unfilled = [prefix + path for path in unfilled]
                _report_unfilled(checkpoint, unfilled, options.unfilled_secrets)
                for path in session.skipped:
                    _log.warning(
                        "restore left %s alone: a mount point, or deeper than a checkpoint goes",
                        os.path.join(where.target_root, path),
                    )
            finally:
                await run_in_thread(session.close)
            reporter.finish()
            return checkpoint
    finally:
        if lease is None:
            await held.release()


async def _fetch_and_apply(
    blobs: BlobStore,
    session: _native.RestoreSession,
    planned: PlannedRestore,
    options: RestoreOptions,
    reporter: PhaseReporter,
    keeper: LeaseKeeper,
) -> None:
    """Steps 4 to 6 of a planned restore: fetch (``after_plan`` before it),
    ``before_apply``, apply, then sync and record (the session is open)."""
    if options.after_plan is not None:
        options.after_plan(planned)
    await fetch_blobs(blobs, session, reporter)
    keeper.check()
    if options.before_apply is not None:
        await options.before_apply(planned)
        keeper.check()
    # Phase report before the first change: a caller's hook runs here.
    reporter.phase(
        "apply",
        files_total=session.files_to_write,
        bytes_total=session.bytes_to_write,
    )
    await _apply(session, reporter, keeper)
    # After the last change, before the sync and the stat cache.
    reporter.phase("record", files_total=session.recorded)
    await run_in_thread(session.finish)
    checkpoint = planned.checkpoint
    record_base(planned.cache_path, planned.target_root, checkpoint.thread_id, checkpoint.id)


@dataclass(frozen=True)
class PlannedRestore:
    """What a restore is about to change, handed to ``before_apply``: the
    checkpoint and the policy it applies, the directory it restores into and
    its stat cache, how many files and symlinks it writes plus paths it
    deletes (0: the tree already equals the checkpoint), and ``phase``, which
    starts a progress phase of the restore (the hook's own work)."""

    checkpoint: Checkpoint
    policy: Policy
    target_root: str
    cache_path: str
    changes: int
    phase: Callable[[str], None]
    # The tree the restore's live scan saw (its secrets zeroed), and whether
    # any file of it had secrets zeroed: what the stash saves, unscanned.
    live: Manifest | None = None
    live_with_secrets: bool = False


def _planned(
    checkpoint: Checkpoint,
    policy: Policy,
    where: _RestoreRoot,
    session: _native.RestoreSession,
    reporter: PhaseReporter,
) -> PlannedRestore:
    changes = session.files_to_write + session.counts.get("deletions", 0)
    planned = PlannedRestore(
        checkpoint, policy, where.target_root, where.cache_path, changes, reporter.phase
    )
    live = session.take_live()
    if live is None:
        return planned
    rows, entries, files, nbytes, with_secrets = live
    # (A restore's live scan collects no digests: computed from the rows when asked.)
    manifest = Manifest(
        rows, length=entries, trusted=True, known=Known(totals=(entries, files, nbytes))
    )
    return dataclasses.replace(planned, live=manifest, live_with_secrets=with_secrets > 0)


@dataclass(frozen=True)
class RestorePreview:
    """What a restore of ``checkpoint`` would do to the workspace now (a dry run).

    ``written`` are the files and symlinks whose content would be (re)written,
    ``deleted`` the paths the policy manages that the checkpoint lacks (deepest
    first), ``kept`` the number of file entries already identical (at most their
    mode or mtime is set again), ``bytes_to_fetch`` / ``blobs_to_fetch`` what
    would be downloaded.
    """

    checkpoint: Checkpoint
    written: list[str]
    deleted: list[str]
    kept: int
    dirs_to_make: int
    bytes_to_fetch: int
    blobs_to_fetch: int


@os_errors_mapped
async def preview_restore(
    workspace_root: str | os.PathLike[str],
    store: CheckpointStore,
    thread_id: str,
    options: RestoreOptions | None = None,
) -> RestorePreview | None:
    """The plan ``restore_checkpoint`` with the same arguments would carry out,
    without fetching a blob or changing the workspace (None when the thread has
    no checkpoint). Raises as ``restore_checkpoint`` does before its first change.
    Of ``options`` it reads ``checkpoint_id``, ``policy``, ``data_dir`` and
    ``workspace_subdir``: secrets, the lease and the hooks change no plan.

    Takes no lease, so a preview never fails with WRITER_CONFLICT while a
    capture (the serve loop's, say) holds the thread. A lease would buy the plan
    no consistency: the checkpoint is immutable once resolved (the plan names
    it), capture only reads the workspace, and the agent changes the workspace
    without any lease, so every plan is of its moment and a real restore plans
    again from the live tree. What a lease-free preview must not do is touch
    the workspace a restore may be working in: it plans only (no staging
    directory made, no leftover of an interrupted restore removed)."""
    options = options or RestoreOptions()
    check_id(thread_id, "thread id")
    check_optional_id(options.checkpoint_id, "checkpoint id")
    where = _restore_root(workspace_root, options)
    checkpoint = await _resolve(store, thread_id, options.checkpoint_id)
    if checkpoint is None:
        return None
    validate_manifest(checkpoint)
    # Files that equal the checkpoint but for their secrets are kept, as a
    # restore would (the session finds them natively).
    policy = checkpoint.effective_policy(options.policy)
    session = await _open_session(where, checkpoint, policy, Secrets(), plan_only=True)
    try:
        written = session.written_paths
        counts = session.counts
        planned_blobs = session.blobs
        files = manifest_of(checkpoint.files).totals()[1]
        return RestorePreview(
            checkpoint=checkpoint,
            written=written,
            deleted=session.deleted_paths,
            kept=max(files - counts.get("writes", 0), 0),
            dirs_to_make=counts.get("dirs", 0),
            bytes_to_fetch=sum(size for _, size in planned_blobs),
            blobs_to_fetch=len(planned_blobs),
        )
    finally:
        await run_in_thread(session.close)


def _report_unfilled(checkpoint: Checkpoint, unfilled: list[str], out: list[str] | None) -> None:
    if not unfilled:
        return
    shown = ", ".join(unfilled[:20])
    if len(unfilled) > 20:
        shown += f" and {len(unfilled) - 20} more"
    _log.warning(
        "restored checkpoint %s with zeros where secrets were (give the secrets to fill them): %s",
        checkpoint.id,
        shown,
    )
    if out is not None:
        out.extend(unfilled)


@dataclass(frozen=True)
class _RestoreRoot:
    """Where a restore works: the workspace root (absolute), the sub-root it
    restores into ("" for the root itself) and that tree's stat cache."""

    root: str
    subdir: str
    cache_path: str

    @property
    def target_root(self) -> str:
        """The directory restored into."""
        return os.path.join(self.root, self.subdir) if self.subdir else self.root


def _restore_root(workspace_root: str | os.PathLike[str], options: RestoreOptions) -> _RestoreRoot:
    """Where a restore as ``options`` say works (INVALID_PATH for a bad
    ``workspace_subdir``, INVALID_ARGUMENT for a data dir in the workspace)."""
    subdir = checked_subdir(options.workspace_subdir)
    root = _absolute(workspace_root)
    cache_path = stat_cache_path(resolve_data_dir(root, options.data_dir), root, subdir)
    return _RestoreRoot(root, subdir, cache_path)


def _absolute(path: str | os.PathLike[str]) -> str:
    return os.path.abspath(os.fspath(path))


async def _resolve(
    store: CheckpointStore, thread_id: str, checkpoint_id: str | None
) -> Checkpoint | None:
    if checkpoint_id is None:
        head = await store.get_head(thread_id)
        if head is None:
            return None
        checkpoint_id = head
    checkpoint = await store.get(checkpoint_id)
    if checkpoint is None or checkpoint.thread_id != thread_id:
        raise SandboxSnapshotError(
            MISSING_CHECKPOINT,
            f"checkpoint {checkpoint_id!r} does not exist in thread {thread_id!r}",
            details={"thread_id": thread_id, "checkpoint_id": checkpoint_id},
        )
    return checkpoint


def _ensure_root(root: str) -> None:
    try:
        os.mkdir(root, 0o755)
    except FileExistsError:
        if not os.path.isdir(root):
            raise SandboxCheckpointInvalidArgumentError(
                f"workspace root {root!r} is not a directory", details={"path": root}
            ) from None
    except FileNotFoundError:
        raise SandboxCheckpointInvalidArgumentError(
            f"the parent of the workspace root {root!r} does not exist", details={"path": root}
        ) from None


async def _open_session(
    where: _RestoreRoot,
    checkpoint: Checkpoint,
    policy: Policy,
    secrets: Secrets,
    *,
    plan_only: bool = False,
    keep_live: bool = False,
) -> _native.RestoreSession:
    """Open the directory restored into, scan it live and plan, natively
    (GIL released).

    The live scan zeroes the given secrets (a file still holding them equals
    its blob); a file equal to the checkpoint but for its secret spans is left
    alone, and ``fill_secrets`` writes the given secrets back.
    ``plan_only``: a dry run's session, which makes no staging directory.
    ``keep_live``: the session keeps the live scan's manifest (``take_live``).
    """
    target = manifest_of(checkpoint.files).data
    token = _native.CancelToken()
    root, subdir = where.root, where.subdir

    def open_session() -> _native.RestoreSession:
        return _native.RestoreSession(
            root,
            target,
            subdir=subdir,
            exclude=policy.exclude,
            include=policy.include,
            default_excludes=policy.default_excludes,
            cache_path=where.cache_path,
            cancel=token,
            secrets=secrets.values,
            secret_names=secrets.names,
            plan_only=plan_only,
            keep_live=keep_live,
            chunk_threshold=chunks.native_args()[0],
            chunk_average=chunks.native_args()[1],
        )

    try:
        return await run_in_thread(open_session, token.cancel)
    except _native.TargetRefused as error:
        kind, path, message = error.args
        raise SandboxSnapshotError(
            NAME_TOO_LONG if kind == "name-too-long" else INVALID_PATH,
            f"checkpoint {checkpoint.id}: {message} (in {os.path.join(root, subdir)})",
            details={"checkpoint_id": checkpoint.id, "path": path},
        ) from None
    except _native.InvalidBlob as error:
        raise invalid_blob(*error.args) from None
    except ValueError as error:
        raise SandboxCheckpointInvalidArgumentError(str(error)) from error
    except OSError as error:
        if subdir and error.filename == subdir:
            raise SandboxSnapshotError(
                INVALID_PATH,
                f"workspace_subdir {subdir!r} cannot be restored into: {error.strerror or error}",
                details={"path": subdir},
            ) from error
        raise


async def _apply(
    session: _native.RestoreSession, reporter: PhaseReporter, keeper: LeaseKeeper
) -> None:
    """Change the workspace, a native batch at a time (a lost lease stops it
    between batches; re-running the restore completes the work). Progress
    counts the files (and symlinks) and bytes put in place."""
    stop = StopFlag()
    files_seen = bytes_seen = 0
    while not session.done:
        stop.raise_if_set()
        await run_in_thread(lambda: session.apply_some(APPLY_BATCH), stop.set)
        files, nbytes = session.written
        reporter.advance(files=files - files_seen, nbytes=nbytes - bytes_seen)
        files_seen, bytes_seen = files, nbytes
        keeper.check()


__all__ = [
    "PlannedRestore",
    "RestoreOptions",
    "RestorePreview",
    "preview_restore",
    "restore_checkpoint",
    "validate_manifest",
]
