"""The capture engine (docs/contract.md#capture): save a workspace as a new checkpoint of a thread.

Read top to bottom, ``capture_checkpoint`` does:

1. validate the arguments, then take the thread's writer lease (a second capture
   of the thread fails fast with WRITER_CONFLICT) and read the head right after;
   a background task renews the lease while we work;
2. scan natively in a worker thread (walk, policy, classify, zero secrets, BLAKE3,
   stat cache); unsupported entries the policy does not exclude fail the capture,
   listing every path;
3. pin every blob key the checkpoint will reference in the store *before* asking
   the bucket about it, retrying keys that a concurrent sweep has condemned, so a
   sweep can never delete a blob this capture counts on (store/base.py BlobGuard).
   With packs the store is asked instead of the bucket, and only the keys it
   has are pinned (then asked again); the blobs this capture packs are kept
   safe by a pin of their pack's key, made before the pack is uploaded
   (``_capture_upload.Uploader._pack_fed``, blobs/packs.py "Safety");
4. find the missing blobs: keys the parent checkpoint references are present
   (the parent cannot lose them while we hold the lease); the rest are asked
   of the store in one ``missing`` batch. The manifest stays bytes throughout:
   the keys new to the parent come from a native set difference, so a capture
   that changed nothing makes no Python object per file;
5. upload each missing blob. Each new file is read once, by the scan: it
   hands the zeroed bytes of a small file, and the open file of a larger one,
   to the upload while it goes on (``_native.BlobFeed``, bounded in bytes and
   in open files). A large file streams from the scan's own fd through the
   native ``VerifyingReader`` (pread, zeroing, BLAKE3, GIL released), whose
   last chunk comes out only once the bytes equal the scanned digest and the
   fd's fstat (dev, ino, size, mtime, ctime) is the scan's, so a file that
   changed under the capture never completes an upload with torn bytes.
   Such a file is hashed again and its entry updated (a few rounds at most),
   or dropped when it vanished. Files the scan did not hand over (a hash the
   stat cache vouched for, a re-hashed file) are opened beneath the held root
   fd (no symlink in any component); nothing is re-opened by a path through
   the sandbox or ``/proc``. A large one goes through the same reader. A small
   one is hashed as it is now in one pass that keeps its zeroed bytes: sent when
   they have the manifest's hash, else kept for the next round under the new
   hash and sent then without another read while the file's fstat is still the
   one they were read under. So a changed small file is read once after the
   scan, not once to hash it again and once more to upload it. A large one is
   never held in memory: it streams as it is now through a reader that hashes
   on the way into a store that names the blob once its bytes are in (the
   local directory links its unnamed file under the digest), so it too is read
   once more; a store that names objects before their first byte (S3) gets it
   hashed, then streamed (twice more). Small files go in
   batches (``put_many``); every ``put`` is durable on return (see
   ``blobs/object_store.py``), and every upload has finished before step 6;
6. append with ``expected_head_id`` = the head read in step 1, then release the
   lease (in every case).

One module per stage, each importing only the ones below it: this one (the
options, step 1, the stages in order and step 6), ``_capture_scan`` (step 2:
the sub-root, the scan and its feed, the parent it compares with),
``_capture_upload`` (steps 3 to 5) and ``_capture_read`` (the upload's reads
beneath the root fd).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import _native
from ._capture_scan import (
    ScanRequest,
    SubRoot,
    check_subroot,
    finish_scan,
    new_feed,
    parent_again,
    parent_files,
    readable,
    scanned_manifest,
    start_scan,
)
from ._capture_upload import Uploader, Uploads, UploadScope
from ._engine import (
    RECLAIM_AFTER_ENTRIES,
    LeaseKeeper,
    PhaseReporter,
    os_errors_mapped,
    reclaim_memory,
    run_in_thread,
)
from .blobs.base import BlobStore
from .blobs.packs import PackSession, packed_blobs
from .check import forget_found_keys
from .codec import encode_entries
from .diffing import diff_entries
from .errors import (
    FILE_CHANGED,
    SandboxCheckpointDuplicateIdError,
    SandboxCheckpointInvalidArgumentError,
    SandboxCheckpointInvalidEntryError,
)
from .ids import new_uuid7
from .journal import JournalUse, ScanKey, WorkspaceJournal, scan_input, scan_report
from .manifest import Manifest, ManifestSummary, NewFiles, manifest_of
from .model import Artifact, Checkpoint, FileEntry, Policy, Reason, WriterLease
from .progress import ProgressCallback
from .scanner import ScanOutcome
from .secrets import Secrets, SecretsArg, named_spans, parse_secrets
from .statcache_paths import PendingStatCache, resolve_data_dir, stat_cache_path
from .store.base import CheckpointStore
from .validation import artifact_problem, check_id, check_optional_id, checked_subdir
from .workspace_base import record_base


@dataclass(frozen=True, slots=True)
class CaptureStats:
    """What a capture did (docs/contract.md#capture)."""

    entries: int  # manifest entries (files + dirs + symlinks)
    files_hashed: int  # files read and hashed by the scan
    files_reused: int  # files whose hash came from the stat cache
    bytes_hashed: int
    blobs_uploaded: int  # distinct keys put
    bytes_uploaded: int
    duration_ms: int  # total
    phases_ms: dict[str, int] = field(default_factory=dict)  # lease, scan, pin, upload, append
    # "journal" (only what the change journal named was examined) or "full",
    # why a full scan ran (empty without a journal), and entries stat'ed plus
    # directories listed.
    scan_mode: str = "full"
    full_scan_reason: str = ""
    entries_examined: int = 0


@dataclass(frozen=True, slots=True)
class CaptureResult:
    checkpoint: Checkpoint
    stats: CaptureStats
    # True when ``skip_if_unchanged`` found nothing new: ``checkpoint`` is the head.
    unchanged: bool = False


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _check_artifacts(artifacts: Iterable[Artifact]) -> tuple[Artifact, ...]:
    checked = tuple(artifacts)
    for artifact in checked:
        problem = artifact_problem(artifact)
        if problem:
            raise SandboxCheckpointInvalidEntryError(f"invalid artifact: {problem}")
    return checked


def _workspace_path(workspace_root: str | os.PathLike[str]) -> str:
    """The absolute root path; SandboxCheckpointInvalidArgumentError unless a directory."""
    root = os.path.abspath(os.fspath(workspace_root))
    if not os.path.isdir(root):
        raise SandboxCheckpointInvalidArgumentError(
            f"workspace root {root!r} is not a directory", details={"path": root}
        )
    return root


@dataclass(frozen=True)
class CaptureOptions:
    """How ``capture_checkpoint`` captures (every field optional).

    ``label`` names the checkpoint; ``policy`` selects what is captured (the
    default one when None) and is recorded with it; ``conversation``,
    ``conversation_text``, ``artifacts`` and ``source_run_id`` are recorded as
    given. ``data_dir``: where the stat cache lives (the default data dir when
    None). ``now`` is the clock (ms since the epoch) and ``progress`` is called
    with the capture's phases and counts.

    ``skip_if_unchanged``: when the scan finds the head's files (same paths,
    kinds, content, modes and link targets; mtimes alone do not count), the
    conversation and the artifacts equal the head's, and no ``label`` is given
    (a label always asks for a new, named checkpoint), nothing is uploaded or
    appended and the head is returned with ``unchanged=True``.

    ``unchanged_from``: when the scan finds exactly that checkpoint's manifest
    (the same bytes: mtimes count too, so no entry is decoded), nothing is
    uploaded or appended and it is returned with ``unchanged=True`` (the
    stash's test: the workspace still equals its base; a tree only touched
    since is saved once more, which costs an append and no upload).
    ``reason`` (default "named" with a label, else "automatic") is recorded.

    ``checkpoint_id`` (default: a new UUIDv7) makes retries idempotent: when a
    checkpoint with that id already exists in this thread it is returned with
    zeroed stats. ``cancel`` lets a caller stop the scan and the uploads.
    ``secrets`` is a sequence of byte strings or a mapping name → bytes; every
    occurrence is zeroed, and each file entry records where (``secrets``:
    offset, length, the name or index — never the value). The checkpoint
    records ``workspace_subdir``: the sub-root of the workspace root that is
    scanned, opened from the root one component at a time without following
    links and held by fd (INVALID_PATH when that fails). ``journal``: the
    daemon's change journal of the workspace, which then directs the scan
    (``checkpointd.journal``).
    """

    label: str | None = None
    policy: Policy | None = None
    secrets: SecretsArg = ()
    conversation: Sequence[Any] = ()
    artifacts: Sequence[Artifact] = ()
    source_run_id: str | None = None
    data_dir: str | os.PathLike[str] | None = None
    now: Callable[[], int] | None = None
    progress: ProgressCallback | None = None
    checkpoint_id: str | None = None
    cancel: _native.CancelToken | None = None
    workspace_subdir: str = ""
    skip_if_unchanged: bool = False
    conversation_text: Sequence[str] | None = None
    reason: Reason | None = None
    unchanged_from: Checkpoint | None = None
    journal: WorkspaceJournal | None = None


@dataclass
class _Capture:
    """One capture's state, shared by its stages (``_capture_held``,
    ``_scan_stage``, ``_unchanged``, ``_append_stage``); what the capture's
    last ``finally`` gives back is here too."""

    store: CheckpointStore
    blobs: BlobStore
    thread_id: str
    options: CaptureOptions
    secrets: Secrets
    artifacts: tuple[Artifact, ...]
    workspace: str
    subdir: str
    # The directory scanned: the sub-root when one is given (named by its
    # lexical path, reached only through fds; see SubRoot).
    root: str
    cache_path: str
    policy: Policy
    new_id: str
    token: _native.CancelToken
    reporter: PhaseReporter
    # The scan's stat cache, live once the checkpoint is (statcache_paths).
    scan_cache: PendingStatCache | None = None
    use: JournalUse | None = None  # the change journal's ticket, given back at the end
    scan_key: ScanKey | None = None
    reclaim: bool = False  # a large scan: give memory back (see reclaim_memory)

    @classmethod
    def of(
        cls,
        workspace_root: str | os.PathLike[str],
        store: CheckpointStore,
        blobs: BlobStore,
        thread_id: str,
        options: CaptureOptions,
    ) -> _Capture:
        """Step 1's checks of the arguments, in the order the errors are promised."""
        check_id(thread_id, "thread id")
        check_optional_id(options.checkpoint_id, "checkpoint id")
        given_secrets = parse_secrets(options.secrets)
        artifacts = _check_artifacts(options.artifacts)
        workspace = _workspace_path(workspace_root)
        subdir = checked_subdir(options.workspace_subdir)
        data_dir = resolve_data_dir(workspace, options.data_dir)
        return cls(
            store=store,
            blobs=blobs,
            thread_id=thread_id,
            options=options,
            secrets=given_secrets,
            artifacts=artifacts,
            workspace=workspace,
            subdir=subdir,
            root=os.path.join(workspace, subdir) if subdir else workspace,
            cache_path=stat_cache_path(data_dir, workspace, subdir),
            policy=options.policy if options.policy is not None else Policy(),
            new_id=options.checkpoint_id if options.checkpoint_id is not None else new_uuid7(),
            token=options.cancel if options.cancel is not None else _native.CancelToken(),
            reporter=PhaseReporter(options.progress),
        )


@dataclass
class _Head:
    """The thread's head before the scan: its id, its manifest's summary when
    the store's cache knows it, else the head itself (``parent``, handed over
    to the scan stage, which lets it go while it scans)."""

    id: str | None
    known: ManifestSummary | None
    parent: Checkpoint | None


@dataclass(frozen=True)
class _Scanned:
    """What the scan stage found: the scan's outcome, the new manifest and the
    parent read again after the scan (None without one)."""

    outcome: ScanOutcome
    manifest: Manifest
    parent: Checkpoint | None


@os_errors_mapped
async def capture_checkpoint(
    workspace_root: str | os.PathLike[str],
    store: CheckpointStore,
    blobs: BlobStore,
    thread_id: str,
    options: CaptureOptions | None = None,
) -> CaptureResult:
    """Capture the workspace into a new checkpoint at the head of ``thread_id``,
    as ``options`` (``CaptureOptions``) say.

    Raises SandboxCheckpointInvalidIdError (bad thread or checkpoint id),
    SandboxCheckpointInvalidArgumentError (a secret shorter than 4 bytes, a
    data_dir inside the workspace, a missing root), SandboxCheckpointInvalidEntryError
    (bad artifact, label or conversation), SandboxCheckpointWriterConflictError
    (the thread's lease is held), SandboxCheckpointWriterLostError (the lease was
    lost meanwhile), SandboxCheckpointConflictError (the head moved),
    SandboxCheckpointDuplicateIdError (the id is used by another thread),
    SandboxSnapshotError with UNSUPPORTED_ENTRY (every offending path listed),
    ARTIFACT_NOT_UPLOADED (an artifact record whose blob is not in the bucket) or FILE_CHANGED (a file kept
    changing while it was uploaded), BlobStoreError when the bucket fails, and
    ScanCancelled when ``cancel`` was cancelled.
    """
    run = _Capture.of(workspace_root, store, blobs, thread_id, options or CaptureOptions())
    run.reporter.phase("lease")
    lease = await store.acquire_writer(thread_id)
    subroot: SubRoot | None = None
    try:
        subroot = SubRoot.open(run.workspace, run.subdir)
        await _remove_stale_staging(run.workspace)
        async with LeaseKeeper(lease) as keeper:
            assert subroot.fd is not None
            scope = UploadScope(
                subroot.fd, lease, keeper, run.secrets.values, run.reporter, run.token
            )
            return await _capture_held(run, scope)
    finally:
        if run.use is not None:
            run.use.abort()  # (a no-op once committed: a failed capture gives its changes back)
        if run.scan_cache is not None:
            run.scan_cache.discard()  # (a no-op once committed)
        if subroot is not None:
            subroot.close()
        await lease.release()
        if run.reclaim:
            await run_in_thread(reclaim_memory)


async def _capture_held(run: _Capture, scope: UploadScope) -> CaptureResult:
    """Steps 2 to 6 under the thread's lease, the directory scanned held by fd."""
    store, reporter = run.store, run.reporter
    head_id = await store.get_head(run.thread_id)
    if run.options.checkpoint_id is not None:
        existing = await _existing(store, run.options.checkpoint_id, run.thread_id)
        if existing is not None:
            return CaptureResult(existing, _empty_stats(reporter))
    # Before the scan only the parent's manifest summary is needed: a
    # store whose cache knows it says so without reading the parent.
    cached_summary = getattr(store, "cached_manifest_summary", None)
    known = (
        await cached_summary(head_id)
        if head_id is not None and cached_summary is not None
        else None
    )
    head = _Head(head_id, known, await readable(store, head_id) if known is None else None)

    reporter.phase("scan")
    # Small blobs go into packs when the store keeps a pack index
    # (blobs/packs.py): the session's index rows go in with the append.
    engine = Uploader(store, packed_blobs(run.blobs, store), scope)
    session = engine.session
    try:
        await engine.distrust_marked()
        scanned = await _scan_stage(run, engine, head)
        scope.keeper.check()
        same = _unchanged(run, scanned)
        if same is not None:
            return same
        manifest = await engine.store_blobs(scanned.manifest, run.artifacts, scanned.parent)
        if session is not None:
            await session.flush()  # the last pack, in the upload phase
    finally:
        engine.close()
        if session is not None:
            await session.abandon()  # (after a flush: nothing left to stop)
    # (A file re-hashed during the upload keeps indexes: a mapping's
    # order resolves those too.)
    with_secrets = scanned.outcome.files_with_secrets > 0
    manifest = _name_secret_spans(manifest, run.secrets, with_secrets)
    return await _append_stage(run, engine, head.id, scanned, manifest)


async def _scan_stage(run: _Capture, engine: Uploader, head: _Head) -> _Scanned:
    """Step 2 (and step 5 for what the scan feeds): scan, compared with the
    parent, while the upload takes each new file the scan reads. The parent
    itself is let go for the scan and read again after it (a store keeps a
    large one by its summary: at 1M files its compressed row is ~60 MB,
    resident through the scan otherwise)."""
    parent, head.parent = head.parent, None
    parent_manifest = manifest_of(parent.files) if parent is not None else None
    # What the scan compares with: the parent's summary alone.
    previous = parent_manifest.summary() if parent_manifest is not None else head.known
    # With the daemon's change journal, only what changed is examined.
    journal = run.options.journal
    run.scan_key = ScanKey.of(run.subdir, run.policy, run.secrets.values, run.secrets.names)
    run.use = journal.begin(run.scan_key, previous) if journal is not None else None
    directed = await scan_input(
        run.use, previous, parent_manifest, lambda: parent_files(run.store, head.id)
    )
    # Each new small file is read once: the scan hands the bytes it
    # zeroed and hashed to the upload through the feed, while it goes on.
    feed = new_feed(parent_manifest)
    parent = parent_manifest = None
    counts = _native.ScanProgress()
    run.scan_cache = PendingStatCache(run.cache_path)
    scanning = start_scan(
        ScanRequest(
            run.root,
            engine.root_fd,
            run.policy,
            run.secrets.values,
            run.scan_cache.path,
            run.token,
            previous,
            directed,
        ),
        feed,
        counts,
    )
    directed = None  # (the parent's bytes: held by the scan alone)
    outcome = await finish_scan(scanning, feed, counts, engine, run.use)
    # (A capture the journal directed examined little: what it
    # freed is the size of what the next one allocates again.)
    run.reclaim = outcome.entries_examined >= RECLAIM_AFTER_ENTRIES
    parent = await parent_again(run.store, head.id, previous)
    parent_manifest = manifest_of(parent.files) if parent is not None else None
    if run.use is not None and parent_manifest is not None:
        run.use.journal.lend_digests(parent_manifest)
    return _Scanned(outcome, scanned_manifest(outcome, previous, parent_manifest), parent)


def _unchanged(run: _Capture, scanned: _Scanned) -> CaptureResult | None:
    """The result of a capture that records nothing (``unchanged_from`` or
    ``skip_if_unchanged`` found nothing new): its scan's stat cache is kept
    and nothing is uploaded or appended. None when it records something."""
    options, manifest, parent = run.options, scanned.manifest, scanned.parent
    unchanged_from = options.unchanged_from
    same = (
        unchanged_from
        if unchanged_from is not None and manifest_of(unchanged_from.files).same_bytes(manifest)
        else None
    )
    if same is None and (
        options.skip_if_unchanged
        and parent is not None
        and options.label is None
        and _nothing_new(parent, manifest, options.conversation, run.artifacts)
    ):
        same = parent
    if same is None:
        return None
    assert run.scan_cache is not None and run.scan_key is not None
    run.scan_cache.commit()
    record_base(run.cache_path, run.root, same.thread_id, same.id)
    if run.use is not None:
        run.use.commit(manifest, run.scan_key, same.id)
    return CaptureResult(same, _stats(run, scanned, len(manifest), Uploads()), unchanged=True)


async def _append_stage(
    run: _Capture,
    engine: Uploader,
    head_id: str | None,
    scanned: _Scanned,
    manifest: Manifest,
) -> CaptureResult:
    """Step 6: append on top of ``head_id`` (the head read under the lease)
    with the session's pack rows, then make the scan's stat cache live."""
    options, parent = run.options, scanned.parent
    run.reporter.phase("append")
    created_at = (options.now if options.now is not None else _now_ms)()
    if parent is not None:
        created_at = max(created_at, int(parent.created_at) + 1)
    conversation_text = options.conversation_text
    checkpoint = Checkpoint(
        id=run.new_id,
        thread_id=run.thread_id,
        parent_checkpoint_id=head_id,
        created_at=created_at,
        reason=options.reason or ("named" if options.label is not None else "automatic"),
        files=manifest,
        conversation=tuple(options.conversation),
        conversation_text=None if conversation_text is None else tuple(conversation_text),
        artifacts=run.artifacts,
        label=options.label,
        source_run_id=options.source_run_id,
        policy=run.policy,
        workspace_subdir=run.subdir,
    )
    engine.keeper.check()
    await _append(run.store, checkpoint, head_id, engine.lease, engine.session)
    assert run.scan_cache is not None and run.scan_key is not None
    run.scan_cache.commit()
    record_base(run.cache_path, run.root, run.thread_id, checkpoint.id)
    if run.use is not None:
        run.use.commit(manifest_of(checkpoint.files), run.scan_key, checkpoint.id)
    await forget_found_keys(run.store, engine.rechecked, checkpoint)
    return CaptureResult(checkpoint, _stats(run, scanned, len(manifest), engine.uploads))


def _stats(run: _Capture, scanned: _Scanned, entries: int, uploads: Uploads) -> CaptureStats:
    """The stats of a finished capture (the phases end here)."""
    outcome = scanned.outcome
    duration_ms = run.reporter.finish()
    return CaptureStats(
        entries=entries,
        files_hashed=outcome.files_hashed,
        files_reused=outcome.files_reused,
        bytes_hashed=outcome.bytes_hashed,
        blobs_uploaded=uploads.blobs,
        bytes_uploaded=uploads.bytes,
        duration_ms=duration_ms,
        phases_ms=dict(run.reporter.phases_ms),
        **scan_report(run.use, outcome),  # type: ignore[arg-type]
    )


@dataclass(frozen=True)
class ScannedTree:
    """A tree scanned elsewhere, to be stored as a checkpoint by
    ``store_scanned``: its manifest (a trusted one, as a scan makes it),
    whether any file in it had secrets zeroed, the policy and sub-root it was
    scanned with, the secrets given to that scan (names them in the spans),
    the reason to record, and ``known``: a checkpoint whose blobs are stored
    and which nothing can delete meanwhile (the caller holds its lease),
    whose keys are taken as present without asking the store."""

    manifest: Manifest
    with_secrets: bool
    policy: Policy
    workspace_subdir: str = ""
    secrets: SecretsArg = ()
    reason: Reason = "automatic"
    known: Checkpoint | None = None
    # What the manifest adds to ``known``, when the caller worked it out.
    new_to_known: NewFiles | None = None


class PendingCheckpoint:
    """A scanned tree on its way into a thread, in two steps under the thread's
    writer lease (taken on entering, released on leaving): ``upload`` puts
    the blobs the store lacks, ``append`` publishes the checkpoint. A caller
    may do other work between them (a restore fetches its own blobs while
    the stash's upload runs); leaving without ``append`` appends nothing.

    Raises as ``capture_checkpoint`` does after its scan (WRITER_CONFLICT on
    entering; WRITER_LOST, FILE_CHANGED, a bucket's BlobStoreError)."""

    def __init__(
        self,
        workspace_root: str | os.PathLike[str],
        store: CheckpointStore,
        blobs: BlobStore,
        thread_id: str,
        tree: ScannedTree,
    ) -> None:
        self.thread_id = check_id(thread_id, "thread id")
        self.store, self.blobs, self.tree = store, blobs, tree
        self._secrets = parse_secrets(tree.secrets)
        self._workspace = _workspace_path(workspace_root)
        self._subdir = checked_subdir(tree.workspace_subdir)
        self._exit = contextlib.AsyncExitStack()
        self._manifest: Manifest | None = None
        self._engine: Uploader | None = None
        self._reporter: PhaseReporter | None = None

    async def __aenter__(self) -> PendingCheckpoint:
        self._reporter = reporter = PhaseReporter(None)
        reporter.phase("lease")
        lease = await self.store.acquire_writer(self.thread_id)
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_callback(lease.release)
            subroot = SubRoot.open(self._workspace, self._subdir)
            stack.callback(subroot.close)
            keeper = await stack.enter_async_context(LeaseKeeper(lease))
            assert subroot.fd is not None
            scope = UploadScope(
                subroot.fd, lease, keeper, self._secrets.values, reporter, _native.CancelToken()
            )
            engine = Uploader(self.store, packed_blobs(self.blobs, self.store), scope)
            stack.callback(engine.close)
            if engine.session is not None:
                stack.push_async_callback(engine.session.abandon)
            self._engine = engine
            self._exit = stack.pop_all()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._exit.aclose()

    async def upload(self) -> None:
        """Put every blob of the tree the store lacks (a file changed since
        the scan is hashed again and its entry updated)."""
        engine = self._engine
        assert engine is not None, "enter the PendingCheckpoint first"
        await engine.distrust_marked()
        manifest = await engine.store_blobs(
            self.tree.manifest, (), self.tree.known, self.tree.new_to_known
        )
        if engine.session is not None:
            await engine.session.flush()
        self._manifest = _name_secret_spans(manifest, self._secrets, self.tree.with_secrets)

    async def append(self) -> CaptureResult:
        """Publish the checkpoint at the thread's head (after ``upload``)."""
        engine, reporter, manifest = self._engine, self._reporter, self._manifest
        assert engine is not None and reporter is not None and manifest is not None
        reporter.phase("append")
        head_id = await self.store.get_head(self.thread_id)
        head = await self.store.get(head_id) if head_id is not None else None
        created_at = _now_ms()
        if head is not None:
            created_at = max(created_at, int(head.created_at) + 1)
        checkpoint = Checkpoint(
            id=new_uuid7(),
            thread_id=self.thread_id,
            parent_checkpoint_id=head_id,
            created_at=created_at,
            reason=self.tree.reason,
            files=manifest,
            policy=self.tree.policy,
            workspace_subdir=self._subdir,
        )
        engine.keeper.check()
        await _append(self.store, checkpoint, head_id, engine.lease, engine.session)
        await forget_found_keys(self.store, engine.rechecked, checkpoint)
        duration_ms = reporter.finish()
        stats = CaptureStats(
            entries=len(manifest),
            files_hashed=0,
            files_reused=0,
            bytes_hashed=0,
            blobs_uploaded=engine.uploads.blobs,
            bytes_uploaded=engine.uploads.bytes,
            duration_ms=duration_ms,
            phases_ms=dict(reporter.phases_ms),
        )
        return CaptureResult(checkpoint, stats)


@os_errors_mapped
async def store_scanned(
    workspace_root: str | os.PathLike[str],
    store: CheckpointStore,
    blobs: BlobStore,
    thread_id: str,
    tree: ScannedTree,
) -> CaptureResult:
    """Append ``tree`` as a new checkpoint at the head of ``thread_id``, as
    ``capture_checkpoint`` would after its scan (``PendingCheckpoint``'s two
    steps at once). A restore saves the live tree to the stash with its own
    scan this way (docs/restore-history.md). Raises as ``PendingCheckpoint``."""
    async with PendingCheckpoint(workspace_root, store, blobs, thread_id, tree) as pending:
        await pending.upload()
        return await pending.append()


async def _remove_stale_staging(workspace: str) -> None:
    """What an interrupted restore left at the top of the workspace (never a
    running restore's): a failure to remove it is no reason to fail the capture."""
    try:
        await asyncio.to_thread(_native.remove_stale_staging, workspace)
    except OSError:
        pass


async def _append(
    store: CheckpointStore,
    checkpoint: Checkpoint,
    head_id: str | None,
    lease: WriterLease,
    session: PackSession | None,
) -> None:
    """Make the session's packs durable, then append with their index rows
    (one transaction: a row never exists before its pack, nor without the
    checkpoint that references its key)."""
    if session is None:
        await store.append(checkpoint, head_id, lease)
        return
    await session.flush()
    append: Any = store.append  # a PackIndex store's append takes the rows
    await append(checkpoint, head_id, lease, packed_blobs=session.rows)


def _nothing_new(
    head: Checkpoint,
    manifest: Manifest,
    conversation: Sequence[Any],
    artifacts: tuple[Artifact, ...],
) -> bool:
    """Whether a capture would record nothing the head does not hold already."""
    if tuple(conversation) != tuple(head.conversation) or artifacts != tuple(head.artifacts):
        return False
    if manifest_of(head.files).same_bytes(manifest):
        return True  # the same bytes: nothing to decode or compare entry by entry
    return next(iter(diff_entries(head.files, manifest)), None) is None


async def _existing(
    store: CheckpointStore, checkpoint_id: str, thread_id: str
) -> Checkpoint | None:
    """A checkpoint a previous attempt with this id already appended, if any."""
    existing = await store.get(checkpoint_id)
    if existing is None:
        return None
    if existing.thread_id != thread_id:
        raise SandboxCheckpointDuplicateIdError(
            f"checkpoint id {checkpoint_id!r} is used by another thread",
            details={"checkpoint_id": checkpoint_id},
        )
    return existing


def _empty_stats(reporter: PhaseReporter) -> CaptureStats:
    duration_ms = reporter.finish()
    return CaptureStats(0, 0, 0, 0, 0, 0, duration_ms, dict(reporter.phases_ms))


def _name_secret_spans(manifest: Manifest, secrets: Secrets, named: bool) -> Manifest:
    """Spans name their secret when the caller gave a mapping (the scan knows
    only indexes). Only when some file held a secret (``named``): decodes and
    re-encodes then, which is rare and small next to the hashing it follows."""
    if secrets.names is None or not named:
        return manifest
    out = [
        dataclasses.replace(entry, secrets=named_spans(entry.secrets, secrets))
        if isinstance(entry, FileEntry) and entry.secrets
        else entry
        for entry in manifest
    ]
    return Manifest(encode_entries(out), length=len(out), trusted=True)


__all__ = [
    "FILE_CHANGED",
    "CaptureOptions",
    "CaptureResult",
    "CaptureStats",
    "PendingCheckpoint",
    "ScannedTree",
    "capture_checkpoint",
    "check_subroot",
    "store_scanned",
]
