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
   (``_Uploader._pack_fed``, blobs/packs.py "Safety");
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
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import functools
import os
import stat
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import blake3

from . import _native
from ._engine import (
    RECLAIM_AFTER_ENTRIES,
    REPORT_INTERVAL_S,
    LeaseKeeper,
    PhaseReporter,
    StopFlag,
    os_errors_mapped,
    reclaim_memory,
    run_bounded,
    run_in_thread,
)
from .blobs import base as blob_batches
from .blobs.base import BlobNotFoundError, BlobStore, VerifiedFile
from .blobs.packs import PackedBlobStore, PackSession, packed_blobs
from .check import forget_found_keys, missing_marks, without_marked
from .chunk_blobs import upload_missing_chunks
from .codec import encode_entries
from .diffing import diff_entries
from .errors import (
    ARTIFACT_NOT_UPLOADED,
    FILE_CHANGED,
    INVALID_PATH,
    UNSUPPORTED_ENTRY,
    SandboxCheckpointConflictError,
    SandboxCheckpointDamagedError,
    SandboxCheckpointDuplicateIdError,
    SandboxCheckpointInvalidArgumentError,
    SandboxCheckpointInvalidEntryError,
    SandboxSnapshotError,
)
from .ids import new_uuid7
from .journal import (
    JournalUse,
    ScanInput,
    ScanKey,
    WorkspaceJournal,
    scan_input,
    scan_report,
    scanned,
)
from .manifest import Manifest, ManifestSummary, manifest_of, split_digests
from .model import (
    ARTIFACT_KEY_PREFIX,
    FILE_KEY_PREFIX,
    Artifact,
    Checkpoint,
    Entry,
    FileEntry,
    Policy,
    Reason,
    SecretSpan,
    WriterLease,
)
from .progress import ProgressCallback
from .safefs import remove_stale_staging
from .scanner import ScanOutcome, scan_workspace
from .secrets import Secrets, SecretsArg, named_spans, parse_secrets
from .statcache_paths import PendingStatCache, resolve_data_dir, stat_cache_path
from .store._packindex import file_key, row_key
from .store.base import BlobGuard, CheckpointStore
from .validation import artifact_problem, check_id, check_optional_id, path_problem
from .workspace_base import record_base

T = TypeVar("T")

# Uploads in flight (latency-bound for small files), of which at most
# LARGE_UPLOAD_CONCURRENCY stream large files: memory stays below
# UPLOAD_CONCURRENCY x SMALL_FILE_BYTES + LARGE_UPLOAD_CONCURRENCY x (the blob
# store's multipart buffers + one chunk), whatever the file sizes.
UPLOAD_CONCURRENCY = 32
LARGE_UPLOAD_CONCURRENCY = 4
# `head` requests in flight while looking for missing blobs.
HEAD_CONCURRENCY = 32
# Files this small are read whole, checked, then sent as one conditional PUT.
SMALL_FILE_BYTES = 1 << 20
# Zeroed bytes of small files waiting between the scan and the upload, as
# stored (compressed) in their frames; the scan waits when this is full:
# bounds a cold capture's memory.
FEED_BYTES = 64 << 20
# Batches of the feed uploaded at once.
FEED_CONSUMERS = 2
# Small files per batch (one worker-thread trip to read them, one ``put_many``;
# a batch ends at whichever limit comes first), and batches in flight.
BATCH_FILES = 1024
BATCH_BYTES = 16 << 20
BATCH_CONCURRENCY = 2
# Open files of large files the scan has handed to the upload and the upload
# has not closed yet (queued or streaming): a scan thread that would exceed it
# waits, so a workspace of thousands of large files stays far below any fd limit.
HELD_FILES = 16
# Rounds of "hash again and upload" for files that change under the capture.
CHANGED_FILE_ROUNDS = 3
# Zeroed bytes of changed small files held from the pass that hashed them again
# to their upload next round (past this, such a file is read again instead).
KEPT_BYTES = 64 << 20
# Offending paths named in an error message (all are in its details).
_LISTED_IN_MESSAGE = 20
# Waiting for a sweep to release a condemned key: first and longest pause.
_PIN_RETRY_FIRST_S = 0.05
_PIN_RETRY_MAX_S = 1.0


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


class _FileChanged(Exception):
    """The file's bytes no longer match what the scan hashed."""


class _NowLarge(Exception):
    """A file the scan found small is large now (not read: it is streamed)."""


@dataclass
class _Uploads:
    blobs: int = 0
    bytes: int = 0


@dataclass
class _BatchOutcome:
    """What reading one batch of small files found (applied on the event loop)."""

    items: list[tuple[str, bytes]] = field(default_factory=list)  # (key, verified bytes)
    replaced: list[tuple[str, FileEntry | None]] = field(default_factory=list)
    kept: list[tuple[str, _Kept]] = field(default_factory=list)  # path -> its new bytes
    grown: list[FileEntry] = field(default_factory=list)  # large now: not read


@dataclass(frozen=True, slots=True)
class _Kept:
    """A changed small file's zeroed bytes, from the pass that hashed it again,
    and the fstat they were read under: next round they are uploaded as they
    are while the file's fstat is still ``stamp`` (a look, not a read)."""

    key: str
    data: bytes
    stamp: _native.Stamp


_FEED_WAITERS: concurrent.futures.ThreadPoolExecutor | None = None


def _feed_waiters() -> concurrent.futures.ThreadPoolExecutor:
    """The threads a capture's scan and the consumers of its feed block on.
    They wait on each other, so they never share the loop's small default
    executor, where enough concurrent captures would fill every thread with
    waiters whose producers never run (a deadlock): this pool is never full
    (a thread per blocked call, however many captures run), and it is one
    for the process, so a capture reuses idle threads instead of starting
    its own seven (their start-up competed with the scan's threads: ~0.5 ms
    each on two cores, for a no-change capture of ~90 ms)."""
    global _FEED_WAITERS
    if _FEED_WAITERS is None:
        _FEED_WAITERS = concurrent.futures.ThreadPoolExecutor(
            max_workers=1 << 16, thread_name_prefix="capture-feed"
        )
    return _FEED_WAITERS


def _forget_feed_waiters() -> None:
    global _FEED_WAITERS
    _FEED_WAITERS = None  # a forked child has none of its parent's threads


os.register_at_fork(after_in_child=_forget_feed_waiters)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _check_artifacts(artifacts: Iterable[Artifact]) -> tuple[Artifact, ...]:
    checked = tuple(artifacts)
    for artifact in checked:
        problem = artifact_problem(artifact)
        if problem:
            raise SandboxCheckpointInvalidEntryError(f"invalid artifact: {problem}")
    return checked


def _checked_subdir(subdir: str) -> str:
    """``workspace_subdir`` normalised ("" for the whole workspace);
    SandboxSnapshotError(INVALID_PATH) unless a workspace-relative path."""
    normal = "" if subdir in ("", ".", "./") else subdir.rstrip("/")
    problem = path_problem(normal) if normal else None
    if problem is not None:
        raise SandboxSnapshotError(
            INVALID_PATH, f"bad workspace_subdir {subdir!r}: {problem}", details={"path": subdir}
        )
    return normal


class SubRoot:
    """The directory scanned (the workspace root, or the sub-root opened from it
    one component at a time with O_NOFOLLOW), held by fd for the whole capture:
    the scan walks from that fd and uploads open files beneath it. Sandbox code
    that swaps a component for a symlink (a RENAME_EXCHANGE loop) gets either
    the directory we opened or an error, never an outside directory read in the
    workspace's name."""

    def __init__(self, fd: int | None) -> None:
        self.fd = fd

    @classmethod
    def open(cls, workspace: str, subdir: str) -> SubRoot:
        """Raises SandboxCheckpointInvalidArgumentError when the workspace root
        is a symlink (as the scan of a root by path does), and
        SandboxSnapshotError(INVALID_PATH) when a sub-root component is missing,
        not a directory, or a symlink."""
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
        if not subdir:
            try:
                return cls(os.open(workspace, flags | os.O_NOFOLLOW))
            except OSError as error:
                raise SandboxCheckpointInvalidArgumentError(
                    f"workspace root {workspace!r} cannot be used: "
                    f"{error.strerror or error} (a symlink? pass the real directory)",
                    details={"path": workspace},
                ) from None
        fd = os.open(workspace, flags)  # the operator's path; it may be a symlink
        try:
            for part in subdir.split("/"):
                try:
                    child = os.open(part, flags | os.O_NOFOLLOW, dir_fd=fd)
                except OSError as error:
                    raise SandboxSnapshotError(
                        INVALID_PATH,
                        f"workspace_subdir {subdir!r} cannot be opened without following "
                        f"links: {error.strerror or error}",
                        details={"path": subdir},
                    ) from None
                os.close(fd)
                fd = child
        except BaseException:
            os.close(fd)
            raise
        return cls(fd)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


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
    options = options or CaptureOptions()
    label, conversation, conversation_text = (
        options.label,
        options.conversation,
        options.conversation_text,
    )
    checkpoint_id, journal, unchanged_from = (
        options.checkpoint_id,
        options.journal,
        options.unchanged_from,
    )
    check_id(thread_id, "thread id")
    check_optional_id(checkpoint_id, "checkpoint id")
    given_secrets = parse_secrets(options.secrets)
    checked_secrets = given_secrets.values
    checked_artifacts = _check_artifacts(options.artifacts)
    workspace = _workspace_path(workspace_root)
    subdir = _checked_subdir(options.workspace_subdir)
    # The directory scanned: the sub-root when one is given (named by its
    # lexical path, reached only through fds; see SubRoot).
    root = os.path.join(workspace, subdir) if subdir else workspace
    cache_path = stat_cache_path(resolve_data_dir(workspace, options.data_dir), workspace, subdir)
    policy = options.policy if options.policy is not None else Policy()
    clock = options.now if options.now is not None else _now_ms
    new_id = checkpoint_id if checkpoint_id is not None else new_uuid7()
    token = options.cancel if options.cancel is not None else _native.CancelToken()
    reporter = PhaseReporter(options.progress)

    reporter.phase("lease")
    lease = await store.acquire_writer(thread_id)
    subroot: SubRoot | None = None
    # The scan's stat cache, live once the checkpoint is (statcache_paths).
    scan_cache: PendingStatCache | None = None
    use: JournalUse | None = None  # the change journal's ticket, given back at the end
    reclaim = False  # a large scan: give memory back (see reclaim_memory)
    try:
        subroot = SubRoot.open(workspace, subdir)
        await _remove_stale_staging(workspace)
        async with LeaseKeeper(lease) as keeper:
            head_id = await store.get_head(thread_id)
            if checkpoint_id is not None:
                existing = await _existing(store, checkpoint_id, thread_id)
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
            parent = await _readable(store, head_id) if known is None else None

            reporter.phase("scan")
            assert subroot.fd is not None
            # Small blobs go into packs when the store keeps a pack index
            # (blobs/packs.py): the session's index rows go in with the append.
            engine = _Uploader(
                subroot.fd,
                store,
                packed_blobs(blobs, store),
                lease,
                keeper,
                checked_secrets,
                reporter,
                token,
            )
            session = engine.session
            try:
                await engine.distrust_marked()
                # Each new small file is read once: the scan hands the bytes it
                # zeroed and hashed to the upload through the feed, while it goes on.
                parent_manifest = manifest_of(parent.files) if parent is not None else None
                # What the scan compares with: the parent's summary alone. The
                # parent itself is let go for the scan and read again after it
                # (a store keeps a large one by its summary: at 1M files its
                # compressed row is ~60 MB, resident through the scan otherwise).
                previous = parent_manifest.summary() if parent_manifest is not None else known
                # With the daemon's change journal, only what changed is examined.
                scan_key = ScanKey.of(subdir, policy, checked_secrets, given_secrets.names)
                use = journal.begin(scan_key, previous) if journal is not None else None
                directed = await scan_input(
                    use, previous, parent_manifest, lambda: _parent_files(store, head_id)
                )
                # The feed skips the parent's digests when they are at hand (a
                # parent its store has not loaded is not loaded for them: a
                # no-change capture never needs them, and a file the feed
                # hands over anyway is found present by the upload's lookup).
                parent_digests = (
                    parent_manifest.digests()
                    if parent_manifest is not None and parent_manifest.loaded
                    else b""
                )
                feed = _native.BlobFeed(
                    FEED_BYTES, SMALL_FILE_BYTES, parent_digests, max_held_files=HELD_FILES
                )
                parent = parent_manifest = None
                feed_threads = _feed_waiters()
                counts = _native.ScanProgress()
                scan_cache = PendingStatCache(cache_path)
                scanning = asyncio.ensure_future(
                    _scan(
                        root,
                        policy,
                        checked_secrets,
                        scan_cache.path,
                        token,
                        feed,
                        subroot.fd,
                        executor=feed_threads,
                        progress=counts,
                        previous=previous,
                        journal=directed,
                    )
                )
                directed = None  # (the parent's bytes: held by the scan alone)
                polling = asyncio.ensure_future(_report_scan(counts, reporter, scanning))
                uploading = asyncio.ensure_future(engine.upload_feed(feed, feed_threads))
                scan_closed = False
                try:
                    await asyncio.wait({scanning, uploading}, return_when=asyncio.FIRST_COMPLETED)
                    if not uploading.done() and feed.held_files and _succeeded(scanning):
                        # Large files the scan handed over are still being
                        # copied: the scan phase ends now and their bytes are
                        # the upload phase's while they go up (not one report
                        # when the last copy ends).
                        _close_scan_phase(reporter, scanning.result())
                        scan_closed = True
                        engine.report_feed_uploads()
                    await uploading
                except BaseException:
                    feed.abandon()
                    token.cancel()
                    uploading.cancel()
                    await asyncio.gather(uploading, scanning, polling, return_exceptions=True)
                    raise
                await asyncio.gather(scanning, polling, return_exceptions=True)
                outcome = await scanning
                scanned(use, outcome)
                if not scan_closed:
                    _close_scan_phase(reporter, outcome)
                # (A capture the journal directed examined little: what it
                # freed is the size of what the next one allocates again.)
                reclaim = outcome.entries_examined >= RECLAIM_AFTER_ENTRIES
                # Bytes from here to the store: valid by construction (the scan
                # refuses every path docs/contract.md#data-model forbids), decoded only if someone reads it.
                parent = await _parent_again(store, head_id, previous)
                parent_manifest = manifest_of(parent.files) if parent is not None else None
                if use is not None and parent_manifest is not None:
                    use.journal.lend_digests(parent_manifest)
                # When nothing changed they are the parent's (same length and
                # fingerprint): the parent's manifest object is the new one, so
                # no second copy is made and an unloaded one stays unloaded.
                if parent_manifest is not None and outcome.same_as_previous:
                    manifest = (
                        parent_manifest
                        if parent_manifest.trusted
                        else Manifest(parent_manifest.data, trusted=True)
                    )
                else:
                    manifest = Manifest(
                        outcome.manifest,
                        length=outcome.entries_count,
                        trusted=True,
                        digests=outcome.digests,
                        totals=(outcome.entries_count, outcome.file_count, outcome.file_bytes),
                        delta=(previous, *outcome.delta)
                        if outcome.delta is not None and previous is not None
                        else None,
                    )
                keeper.check()
                same = (
                    unchanged_from
                    if unchanged_from is not None
                    and manifest_of(unchanged_from.files).same_bytes(manifest)
                    else None
                )
                if same is None and (
                    options.skip_if_unchanged
                    and parent is not None
                    and label is None
                    and _nothing_new(parent, manifest, conversation, checked_artifacts)
                ):
                    same = parent
                if same is not None:
                    scan_cache.commit()
                    record_base(cache_path, root, same.thread_id, same.id)
                    if use is not None:
                        use.commit(manifest, scan_key, same.id)
                    duration_ms = reporter.finish()
                    stats = CaptureStats(
                        entries=len(manifest),
                        files_hashed=outcome.files_hashed,
                        files_reused=outcome.files_reused,
                        bytes_hashed=outcome.bytes_hashed,
                        blobs_uploaded=0,
                        bytes_uploaded=0,
                        duration_ms=duration_ms,
                        phases_ms=dict(reporter.phases_ms),
                        **scan_report(use, outcome),  # type: ignore[arg-type]
                    )
                    return CaptureResult(same, stats, unchanged=True)
                manifest = await engine.store_blobs(manifest, checked_artifacts, parent)
                if session is not None:
                    await session.flush()  # the last pack, in the upload phase
            finally:
                engine.close()
                if session is not None:
                    await session.abandon()  # (after a flush: nothing left to stop)
            # (A file re-hashed during the upload keeps indexes: a mapping's
            # order resolves those too.)
            manifest = _name_secret_spans(manifest, given_secrets, outcome.files_with_secrets > 0)

            reporter.phase("append")
            parent_created = parent.created_at if parent is not None else None
            created_at = clock()
            if parent_created is not None:
                created_at = max(created_at, int(parent_created) + 1)
            checkpoint = Checkpoint(
                id=new_id,
                thread_id=thread_id,
                parent_checkpoint_id=head_id,
                created_at=created_at,
                reason=options.reason or ("named" if label is not None else "automatic"),
                files=manifest,
                conversation=tuple(conversation),
                conversation_text=None if conversation_text is None else tuple(conversation_text),
                artifacts=checked_artifacts,
                label=label,
                source_run_id=options.source_run_id,
                policy=policy,
                workspace_subdir=options.workspace_subdir,
            )
            keeper.check()
            await _append(store, checkpoint, head_id, lease, session)
            scan_cache.commit()
            record_base(cache_path, root, thread_id, checkpoint.id)
            if use is not None:
                use.commit(manifest_of(checkpoint.files), scan_key, checkpoint.id)
            await forget_found_keys(store, engine.rechecked, checkpoint)
            duration_ms = reporter.finish()
            stats = CaptureStats(
                entries=len(manifest),
                files_hashed=outcome.files_hashed,
                files_reused=outcome.files_reused,
                bytes_hashed=outcome.bytes_hashed,
                blobs_uploaded=engine.uploads.blobs,
                bytes_uploaded=engine.uploads.bytes,
                duration_ms=duration_ms,
                phases_ms=dict(reporter.phases_ms),
                **scan_report(use, outcome),  # type: ignore[arg-type]
            )
            return CaptureResult(checkpoint, stats)
    finally:
        if use is not None:
            use.abort()  # (a no-op once committed: a failed capture gives its changes back)
        if scan_cache is not None:
            scan_cache.discard()  # (a no-op once committed)
        if subroot is not None:
            subroot.close()
        await lease.release()
        if reclaim:
            await run_in_thread(reclaim_memory)


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
        self._subdir = _checked_subdir(tree.workspace_subdir)
        self._exit = contextlib.AsyncExitStack()
        self._manifest: Manifest | None = None
        self._engine: _Uploader | None = None
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
            engine = _Uploader(
                subroot.fd,
                self.store,
                packed_blobs(self.blobs, self.store),
                lease,
                keeper,
                self._secrets.values,
                reporter,
                _native.CancelToken(),
            )
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
        manifest = await engine.store_blobs(self.tree.manifest, (), self.tree.known)
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
            workspace_subdir=self.tree.workspace_subdir,
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


async def _parent_again(
    store: CheckpointStore, head_id: str | None, previous: ManifestSummary | None
) -> Checkpoint | None:
    """The parent, read again after the scan: the head cannot have moved (we
    hold the lease), and its manifest must still be the one the scan was
    compared with."""
    if head_id is None:
        return None
    parent = await _readable(store, head_id)
    if parent is None and previous is None:
        return None  # a damaged head, before the scan as now: the store writes a keyframe
    summary = manifest_of(parent.files).summary() if parent is not None else None
    if (
        summary is None
        or previous is None
        or (summary.byte_length, summary.fingerprint)
        != (
            previous.byte_length,
            previous.fingerprint,
        )
    ):
        raise SandboxCheckpointConflictError(
            f"the head {head_id!r} changed while the workspace was scanned",
            details={"checkpoint_id": head_id},
        )
    return parent


async def _remove_stale_staging(workspace: str) -> None:
    """What an interrupted restore left at the top of the workspace (never a
    running restore's): a failure to remove it is no reason to fail the capture."""
    try:
        await asyncio.to_thread(remove_stale_staging, workspace)
    except OSError:
        pass


async def _parent_files(store: CheckpointStore, head_id: str | None) -> Manifest | None:
    """The head's manifest, read again (for a scan the change journal directs)."""
    parent = await _readable(store, head_id)
    return manifest_of(parent.files) if parent is not None else None


async def _readable(store: CheckpointStore, head_id: str | None) -> Checkpoint | None:
    """The head, or None when there is none or it is damaged in the store
    (DATA_LOSS for a read of it): the capture goes on without a parent's help,
    and the store appends a keyframe on top of the damaged head."""
    if head_id is None:
        return None
    try:
        return await store.get(head_id)
    except SandboxCheckpointDamagedError:
        return None


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


def _succeeded(task: asyncio.Future[Any]) -> bool:
    return task.done() and not task.cancelled() and task.exception() is None


def _close_scan_phase(reporter: PhaseReporter, outcome: ScanOutcome) -> None:
    """The scan phase's totals: what the scan found and hashed in the end."""
    reporter.update(
        files_done=outcome.entries_count,
        bytes_done=outcome.bytes_hashed,
        files_hashed=outcome.files_hashed,
        final=True,
    )


async def _report_scan(
    counts: _native.ScanProgress, reporter: PhaseReporter, scanning: asyncio.Future[Any]
) -> None:
    """While the native scan runs (GIL released), report its counters every
    REPORT_INTERVAL_S: entries found, files and bytes hashed so far."""
    while not scanning.done():
        await asyncio.wait({scanning}, timeout=REPORT_INTERVAL_S)
        if scanning.done():
            return  # the caller reports the final counts
        entries, hashed, nbytes = counts.snapshot()
        reporter.update(files_done=entries, bytes_done=nbytes, files_hashed=hashed)


async def _scan(
    root: str,
    policy: Policy,
    secrets: tuple[bytes, ...],
    cache_path: str,
    token: _native.CancelToken,
    feed: _native.BlobFeed | None = None,
    root_fd: int | None = None,
    executor: concurrent.futures.Executor | None = None,
    progress: _native.ScanProgress | None = None,
    previous: ManifestSummary | None = None,
    journal: ScanInput | None = None,
) -> ScanOutcome:
    outcome = await run_in_thread(
        lambda: scan_workspace(
            root,
            policy,
            secrets,
            cache_path,
            cancel=token,
            feed=feed,
            root_fd=root_fd,
            progress=progress,
            previous=previous,
            journal=journal,
        ),
        token.cancel,
        executor,
    )
    if outcome.unsupported:
        # details["paths"] lists every one; the message stays short enough for a
        # gRPC status (whose text travels in an 8 KiB header budget).
        shown = outcome.unsupported[:_LISTED_IN_MESSAGE]
        # A path-too-long entry's path alone is over 4 KiB: each is cut.
        listing = ", ".join(f"{_cut(path)} ({kind})" for path, kind in shown)
        if len(outcome.unsupported) > len(shown):
            listing += f" and {len(outcome.unsupported) - len(shown)} more"
        raise SandboxSnapshotError(
            UNSUPPORTED_ENTRY,
            f"the workspace has entries a checkpoint cannot hold: {listing}; "
            "exclude them with the policy",
            details={"paths": [path for path, _kind in outcome.unsupported]},
        )
    return outcome


def _cut(path: str, limit: int = 160) -> str:
    """``path`` as an error message shows it: its last ``limit`` characters."""
    return path if len(path) <= limit else "…" + path[-(limit - 1) :]


class _Uploader:
    """Steps 3-5: pin, find missing, upload; owns the upload counters."""

    def __init__(
        self,
        root_fd: int,
        store: CheckpointStore,
        blobs: BlobStore,
        lease: WriterLease,
        keeper: LeaseKeeper,
        secrets: tuple[bytes, ...],
        reporter: PhaseReporter,
        token: _native.CancelToken,
    ) -> None:
        self.root_fd = root_fd  # the directory scanned, held by the capture
        self.store = store
        # With a pack index, small blobs go into this capture's packs, each
        # pack pinned before its upload (blobs/packs.py, "Safety").
        self.session = (
            blobs.capture_session(pin=self._pin) if isinstance(blobs, PackedBlobStore) else None
        )
        self.blobs: BlobStore = self.session if self.session is not None else blobs
        self.lease = lease
        self.keeper = keeper
        self.secrets = secrets
        self.reporter = reporter
        self.token = token
        self.uploads = _Uploads()
        # Digests the feed saw pinned and present (or put): no second look
        # needed. Raw digests concatenated, a batch per item, so the upload
        # phase leaves them out natively (a cold capture feeds every file: no
        # Python object per file there).
        self.present: list[bytes] = []
        self.fed = _Uploads()  # blobs the feed put (or found put by a racing capture)
        # Bytes of handed-over files copied so far whose copy has not ended, and
        # whether those copies report in the upload phase (report_feed_uploads).
        self.fed_copying = 0
        self.feed_reports = False
        # Paths whose handed-over file was no longer what the scan hashed: the
        # upload hashes them again instead of reading them to find that out.
        self.fed_changed: set[str] = set()
        self.rechecked: set[str] = set()  # keys check marked missing (distrust_marked)
        # Changed small files' bytes for the next round's upload (``_Kept``).
        self.kept: dict[str, _Kept] = {}
        self.kept_bytes = 0
        self.large_slots = asyncio.Semaphore(LARGE_UPLOAD_CONCURRENCY)
        self.batch_slots = asyncio.Semaphore(BATCH_CONCURRENCY)

    def close(self) -> None:
        """Nothing of its own to free: the capture holds the root fd."""

    async def distrust_marked(self) -> None:
        """Keys `checkpointd check` found gone from the bucket are not trusted:
        neither from the parent (store_blobs looks them up like new ones) nor
        from their counts (the feed asks the bucket). Before the feed starts."""
        self.rechecked = await missing_marks(self.store)
        if isinstance(self.blobs, PackSession):
            self.blobs.distrust(self.rechecked)

    async def _in_thread(self, work: Callable[[StopFlag], T]) -> T:
        """Run ``work`` in a worker thread; a cancellation stops it and waits
        for it (no read of the root fd outlives the capture)."""
        stop = StopFlag()
        return await run_in_thread(lambda: work(stop), stop.set)

    def _check_running(self) -> None:
        self.keeper.check()
        if self.token.cancelled:
            raise _native.ScanCancelled("capture cancelled")

    async def upload_feed(
        self, feed: _native.BlobFeed, waiters: concurrent.futures.Executor
    ) -> None:
        """Upload what the scan feeds until the scan ends: small files batch by
        batch (pin the batch's keys, ask the store which are missing, put
        those), large files one open file at a time (LARGE_UPLOAD_CONCURRENCY
        at once; closing each gives its place back to the scan). The waits for
        the next batch or file run on ``waiters`` (threads reserved for this feed)."""
        loop = asyncio.get_running_loop()

        async def consume_files() -> None:
            while (reader := await loop.run_in_executor(waiters, feed.next_file)) is not None:
                try:
                    await self._upload_fed_file(reader)
                finally:
                    await asyncio.to_thread(reader.close)

        async def consume() -> None:
            while (batch := await loop.run_in_executor(waiters, feed.next_fed)) is not None:
                self._check_running()
                if self.session is not None:
                    await self._pack_fed(batch, self.session)
                else:
                    await self._put_fed(batch.items())
                # Counted in the upload phase's progress: left out natively.
                self.present.append(batch.digests)

        consumers = [consume] * FEED_CONSUMERS + [consume_files] * LARGE_UPLOAD_CONCURRENCY
        await run_bounded(consumers, lambda work: work(), len(consumers))

    def report_feed_uploads(self) -> None:
        """The scan is over but files it handed over are still going up: start
        the upload phase (after an empty pin phase: the phases keep their
        order) with what the feed did so far; the copies report their bytes
        as they go, each file when it is done."""
        self.reporter.phase("pin")
        self.reporter.phase(
            "upload", files_done=self.fed.blobs, bytes_done=self.fed.bytes + self.fed_copying
        )
        self.feed_reports = True

    async def _upload_fed_file(self, reader: _native.VerifyingReader) -> None:
        """Upload one file the scan handed over, unless the store holds it."""
        self._check_running()
        key = FILE_KEY_PREFIX + reader.digest_hex
        await self._pin([key])
        if await blob_batches.missing(self.blobs, [key]):
            copied = 0

            def on_bytes(count: int) -> None:
                nonlocal copied
                copied += count
                self.fed_copying += count
                if self.feed_reports:
                    self.reporter.advance(nbytes=count)

            try:
                written = await self._put_verified(key, reader, on_bytes)
            except _FileChanged:
                # Hashed again by the upload phase (it is not in `present`).
                self.fed_changed.add(reader.path)
                return
            finally:
                self.fed_copying -= copied
            if written:
                self.uploads.blobs += 1
                self.uploads.bytes += reader.size
            self.fed.blobs += 1
            self.fed.bytes += reader.size
            if self.feed_reports:
                self.reporter.advance(files=1, nbytes=max(0, reader.size - copied))
        self.present.append(bytes.fromhex(reader.digest_hex))

    async def _put_verified(
        self,
        key: str,
        reader: _native.VerifyingReader,
        on_bytes: Callable[[int], None] | None = None,
    ) -> bool:
        """``put`` the reader's verified bytes; _FileChanged when the file is
        not what was scanned any more (nothing was stored under ``key``)."""
        source = VerifiedFile(reader, cancel=self.token, on_bytes=on_bytes)
        try:
            return await self.blobs.put(key, source, if_absent=True)
        except _native.FileChangedError:
            raise _FileChanged(reader.path) from None
        except Exception:
            # The store may wrap what our stream raised; the source knows.
            if source.changed:
                raise _FileChanged(reader.path) from None
            raise

    async def store_blobs(
        self, manifest: Manifest, artifacts: tuple[Artifact, ...], parent: Checkpoint | None
    ) -> Manifest:
        """Make sure every blob the manifest and artifacts use is in the bucket;
        returns the manifest, updated for files that changed under the capture.

        Works on the manifest's bytes: only files whose content the parent does
        not reference become Python objects (none when nothing changed)."""
        parent_manifest = manifest_of(parent.files) if parent is not None else None
        if (
            parent_manifest is not None
            and not self.rechecked
            and parent_manifest.same_bytes(manifest)
        ):
            # The parent's files: every key is present (see below), and neither
            # manifest is loaded to find that out.
            new_digests = b""
        else:
            parent_digests = parent_manifest.digests() if parent_manifest is not None else b""
            parent_digests = without_marked(parent_digests, self.rechecked)
            new_digests = _native.digest_difference(manifest.digests(), parent_digests)
        if self.present and new_digests:
            fed = _native.sort_digests(b"".join(self.present))
            new_digests = _native.digest_difference(new_digests, fed)
        pending = (
            [
                FileEntry(path, FILE_KEY_PREFIX + digest.hex(), size)
                for path, digest, size in _native.manifest_files_with_digests(
                    manifest.data, new_digests
                )
            ]
            if new_digests
            else []
        )
        # Chunks of large files the scan did not feed (checkpointd.chunk_blobs);
        # with no new key the manifest is not even loaded (it may be the parent's).
        chunk_blobs, chunk_bytes = (
            await upload_missing_chunks(
                manifest.data,
                new_digests,
                self.root_fd,
                self.secrets,
                self.blobs,
                self._pin,
                lambda read: self._in_thread(lambda _stop: read()),
            )
            if new_digests
            else (0, 0)
        )
        self.uploads.blobs += chunk_blobs
        self.uploads.bytes += chunk_bytes
        artifact_keys = list(dict.fromkeys(artifact.blob_key for artifact in artifacts))
        replaced: dict[str, FileEntry | None] = {}  # path → new entry, None = vanished
        first_round = True
        for _round in range(CHANGED_FILE_ROUNDS + 1):
            # Keys the parent references need no pin and are present: only a
            # holder of this thread's lease (us) can delete the parent, so their
            # counts stay > 0 and no sweep can condemn them until our append lands.
            # Every pending key is new to the parent (rehashed ones may not be,
            # and are then simply checked again).
            keys = list(dict.fromkeys(entry.blob_key for entry in pending))
            self.reporter.phase("pin", files_total=len(keys))
            # An artifact's packed copy is the row of its digest's file form
            # (store._packindex.row_key): pinned too, so no sweep drops it.
            artifact_pins = [*artifact_keys, *map(row_key, artifact_keys)]
            await self._pin(keys + (artifact_pins if first_round else []))
            if first_round:
                await self._require_artifacts(artifact_keys)
                first_round = False
            missing = set(await blob_batches.missing(self.blobs, keys)) if keys else set()
            by_key: dict[str, list[FileEntry]] = {}
            for entry in pending:
                if entry.blob_key in missing:
                    by_key.setdefault(entry.blob_key, []).append(entry)
            self.reporter.phase(
                "upload",
                files_total=self.fed.blobs + len(by_key),
                bytes_total=self.fed.bytes + sum(group[0].size for group in by_key.values()),
                files_done=self.fed.blobs,
                bytes_done=self.fed.bytes,
            )
            changed: list[FileEntry] = []
            jobs = self._upload_jobs(list(by_key.values()), changed, replaced)
            await run_bounded(jobs, lambda job: job(), UPLOAD_CONCURRENCY)
            if not changed:
                return _apply_replacements(manifest, replaced)
            pending = changed
        paths = ", ".join(entry.path for entry in pending[:_LISTED_IN_MESSAGE])
        if len(pending) > _LISTED_IN_MESSAGE:
            paths += f" and {len(pending) - _LISTED_IN_MESSAGE} more"
        raise SandboxSnapshotError(
            FILE_CHANGED,
            f"files kept changing while they were captured: {paths}; capture again when "
            "nothing writes to them",
            details={"paths": [entry.path for entry in pending]},
        )

    async def _pack_fed(self, batch: _native.FedBatch, session: PackSession) -> None:
        """One batch of the feed into this capture's packs, kept native: the
        store is asked which digests it lacks (no bucket request), only the
        keys it has are pinned and then asked about again (a sweep may have
        dropped a row between the two; it drops only condemned keys, and the
        pin waits out a condemnation), and the rest are packed straight from
        the batch. Their pack's key is pinned before its upload (PackSession),
        so a cold capture pins a handful of packs, not every key, and makes
        no Python object per file."""
        digests = batch.digests
        absent = await session.missing_digests(digests)
        present = _native.digests_without(digests, absent)
        if present:
            await self._pin([file_key(digest) for digest in split_digests(present)])
            absent += await session.missing_digests(present)
        blobs, nbytes = await session.put_fed(batch, absent)
        self.uploads.blobs += blobs
        self.uploads.bytes += nbytes
        self.fed.blobs += blobs
        self.fed.bytes += nbytes

    async def _put_fed(self, batch: list[tuple[bytes, bytes]]) -> None:
        """One batch of the feed as single objects: every key pinned before
        the bucket is asked about it, as the blob guard says."""
        items = [(FILE_KEY_PREFIX + digest.hex(), data) for digest, data in batch]
        keys = [key for key, _ in items]
        await self._pin(keys)
        absent = set(await blob_batches.missing(self.blobs, keys))
        todo = [(key, data) for key, data in items if key in absent]
        written = await blob_batches.put_many(self.blobs, todo) if todo else []
        for (_key, data), was_written in zip(todo, written, strict=True):
            if was_written:
                self.uploads.blobs += 1
                self.uploads.bytes += len(data)
        self.fed.blobs += len(todo)
        self.fed.bytes += sum(len(data) for _, data in todo)

    async def _pin(self, keys: list[str]) -> None:
        if not keys or not isinstance(self.store, BlobGuard):
            return
        condemned = await self.store.pin_blobs(keys, self.lease)
        delay = _PIN_RETRY_FIRST_S
        while condemned:
            # A sweep may be deleting these right now: wait until it lets go,
            # then our pin holds and the bucket can be trusted for them.
            self._check_running()
            await asyncio.sleep(delay)
            delay = min(delay * 2, _PIN_RETRY_MAX_S)
            condemned = await self.store.pin_blobs(condemned, self.lease)

    async def _require_artifacts(self, keys: list[str]) -> None:
        """Every artifact must be in the bucket (pinned first). With packs, a
        small one still a single object (UploadArtifact's) is read, checked
        against its key and packed with this capture's files: its row goes in
        with the append, and a later sweep deletes the single object."""
        session = self.blobs if isinstance(self.blobs, PackSession) else None
        packed = await session.packed.locate(keys) if session is not None else {}

        def absent(key: str) -> SandboxSnapshotError:
            return SandboxSnapshotError(
                ARTIFACT_NOT_UPLOADED,
                f"artifact blob {key} is not in {self.blobs.url}: upload the artifact "
                "(UploadArtifact) before the capture that names it",
                details={"key": key},
            )

        async def check(key: str) -> None:
            if session is None or key in packed:
                if await self.blobs.head(key) is None:
                    raise absent(key)
                return
            info = await session.packed.inner.head(key)
            if info is None:
                raise absent(key)
            if info.size >= session.packed.threshold:
                return
            try:
                data = await session.packed.inner.get(key)
            except BlobNotFoundError:
                raise absent(key) from None
            if blake3.blake3(data).hexdigest() == key[len(ARTIFACT_KEY_PREFIX) :]:
                await session.put_many([(row_key(key), data)])
            # (Bytes that are not the key's stay a single object for check to report.)

        await run_bounded(keys, check, HEAD_CONCURRENCY)

    def _upload_jobs(
        self,
        groups: list[list[FileEntry]],
        changed: list[FileEntry],
        replaced: dict[str, FileEntry | None],
    ) -> list[Callable[[], Awaitable[None]]]:
        """One job per large file, one per batch of small files (``put_many``:
        the store does the whole batch at once, durable on return)."""
        jobs: list[Callable[[], Awaitable[None]]] = []
        batch: list[list[FileEntry]] = []
        batch_bytes = 0
        for group in groups:
            if group[0].size > SMALL_FILE_BYTES:
                jobs.append(functools.partial(self._upload_one_of, group, changed, replaced))
                continue
            batch.append(group)
            batch_bytes += group[0].size
            if len(batch) >= BATCH_FILES or batch_bytes >= BATCH_BYTES:
                jobs.append(functools.partial(self._upload_batch, batch, changed, replaced))
                batch, batch_bytes = [], 0
        if batch:
            jobs.append(functools.partial(self._upload_batch, batch, changed, replaced))
        return jobs

    async def _upload_batch(
        self,
        groups: list[list[FileEntry]],
        changed: list[FileEntry],
        replaced: dict[str, FileEntry | None],
    ) -> None:
        """Read a batch of small files in one worker-thread trip, then put them
        with one ``put_many``."""
        kept = {
            entry.path: self._unkeep(entry.path)
            for group in groups
            for entry in group
            if entry.path in self.kept
        }
        async with self.batch_slots:
            outcome = await self._in_thread(lambda stop: self._read_batch_now(stop, groups, kept))
            written = await blob_batches.put_many(self.blobs, outcome.items)
        for (_key, data), was_written in zip(outcome.items, written, strict=True):
            if was_written:
                self.uploads.blobs += 1
                self.uploads.bytes += len(data)
        for path, fresh in outcome.replaced:
            replaced[path] = fresh
            if fresh is not None:
                changed.append(fresh)
        for path, bytes_now in outcome.kept:
            self._keep(path, bytes_now)
        for entry in outcome.grown:
            # (Large now, and the group's key is a small file's: never "same".)
            await self._after_change(entry, changed, replaced)

    def _keep(self, path: str, kept: _Kept) -> None:
        if self.kept_bytes + len(kept.data) <= KEPT_BYTES:
            self.kept[path] = kept
            self.kept_bytes += len(kept.data)

    def _unkeep(self, path: str) -> _Kept:
        kept = self.kept.pop(path)
        self.kept_bytes -= len(kept.data)
        return kept

    def _read_batch_now(
        self, stop: StopFlag, groups: list[list[FileEntry]], kept: dict[str, _Kept]
    ) -> _BatchOutcome:
        """The batch's reads, in a worker thread: per group, the bytes of the
        first file that still holds them. Each file is read once: hashed as it
        is now with its zeroed bytes kept, which are sent when they still have
        the manifest's hash, else kept for the next round under the new hash
        (and sent then without a read while the file's fstat is unchanged)."""
        outcome = _BatchOutcome()
        for group in groups:
            for entry in group:
                stop.raise_if_set()
                self._check_running()
                held = kept.get(entry.path)
                if (
                    held is not None
                    and held.key == entry.blob_key
                    and _native.stat_beneath(self.root_fd, entry.path) == held.stamp
                ):
                    data = held.data
                else:
                    try:
                        fresh, now = _rehash_in(
                            self.root_fd,
                            entry,
                            self.secrets,
                            self.token,
                            keep_small=True,
                            unread_above=SMALL_FILE_BYTES,
                        )
                    except _NowLarge:
                        outcome.grown.append(entry)  # streamed as it is, in one read
                        continue
                    if fresh is None or fresh.blob_key != entry.blob_key:
                        outcome.replaced.append((entry.path, fresh))
                        if now is not None:
                            outcome.kept.append((entry.path, now))
                        continue
                    # The manifest's bytes (read whole when under 1 MiB; a file
                    # of exactly 1 MiB is not kept by the hash pass: read again).
                    data = (
                        now.data
                        if now is not None
                        else _read_verified(self.root_fd, entry, self.secrets, self.token)
                    )
                outcome.items.append((entry.blob_key, data))
                self.reporter.advance(files=1, nbytes=len(data))
                break
        return outcome

    async def _upload_one_of(
        self,
        group: list[FileEntry],
        changed: list[FileEntry],
        replaced: dict[str, FileEntry | None],
    ) -> None:
        """Upload the group's blob from the first of its files that still holds
        those bytes; the others that changed get new entries (uploaded with
        them, where the store names a blob after its bytes, else next round)."""
        for entry in group:
            self._check_running()
            try:
                if entry.path in self.fed_changed:
                    # The scan's own fd already showed it changed.
                    self.fed_changed.discard(entry.path)
                    raise _FileChanged(entry.path)
                if entry.size > SMALL_FILE_BYTES:
                    # Read once, whatever it holds now (not verified first).
                    found = await self._upload_as_it_is(entry, changed, replaced, first=True)
                    if found == "unable":
                        written = await self._upload(entry)
                    elif found == "same":
                        self.reporter.advance(files=1)
                        return
                    else:
                        continue
                else:
                    written = await self._upload(entry)
            except _FileChanged:
                if await self._after_change(entry, changed, replaced) == "same":
                    self.reporter.advance(files=1)
                    return
                continue
            if written:
                self.uploads.blobs += 1
                self.uploads.bytes += entry.size
            self.reporter.advance(files=1)
            return
        # Every file with these bytes changed: nothing references the key any more.

    async def _after_change(
        self,
        entry: FileEntry,
        changed: list[FileEntry],
        replaced: dict[str, FileEntry | None],
    ) -> Literal["same", "other"]:
        """A file no longer what the scan saw, read once more: a large one is
        uploaded as it is now (``_upload_as_it_is``; "same" when it holds the
        manifest's bytes after all) where the store allows; otherwise it is
        hashed again, and next round a small file's kept bytes go up as they
        are, a large one streams through a new verifying reader (a large file
        is never held in memory)."""
        found = await self._upload_as_it_is(entry, changed, replaced)
        if found != "unable":
            return found
        fresh, now = await self._rehash(entry)
        replaced[entry.path] = fresh
        if fresh is not None:
            changed.append(fresh)
        if now is not None:
            self._keep(entry.path, now)
        return "other"

    async def _upload_as_it_is(
        self,
        entry: FileEntry,
        changed: list[FileEntry],
        replaced: dict[str, FileEntry | None],
        *,
        first: bool = False,
    ) -> Literal["same", "other", "unable"]:
        """Upload a large file as it is now, in the one read that hashes it
        (``blob_batches.put_learned``: the store names the blob once its bytes
        are in): "same" when it holds the entry's bytes (uploaded, or there);
        "other" when it holds other bytes, uploaded under their key with the new
        entry in ``replaced``, or when it changed during the read (the entry
        is back in ``changed`` for the next round; FILE_CHANGED after the
        last). "unable", with nothing read, when the store cannot name a blob
        after its bytes or the file is gone, not a regular file or small now
        (the caller verifies or hashes it instead). ``first``: not known to have
        changed, so when the entry's blob is there already, nothing is read
        ("same"), as a put of that key would."""
        async with self.large_slots:
            try:
                reader = await self._in_thread(
                    lambda _stop: _native.VerifyingReader.open_unhashed(
                        self.root_fd, entry.path, self.secrets
                    )
                )
            except _native.FileChangedError:
                return "unable"
            try:
                if reader.size <= SMALL_FILE_BYTES:
                    return "unable"  # one read whose bytes are kept (_rehash)
                try:
                    put = await blob_batches.put_learned(
                        self.blobs,
                        entry.blob_key,
                        VerifiedFile(
                            reader,
                            cancel=self.token,
                            on_bytes=lambda n: self.reporter.advance(nbytes=n),
                        ),
                        unless_beside=first,
                    )
                except _native.FileChangedError:
                    changed.append(entry)  # changing while read: another round
                    return "other"
                learned = reader.learned() if put is not None else None
            finally:
                await asyncio.to_thread(reader.close)
        if put is None:
            return "unable"
        key, written = put
        if learned is None:  # ``first``, and the blob is there: nothing read
            return "same"
        _hex, spans, mode, mtime_ns = learned
        fresh = FileEntry(
            entry.path,
            key,
            reader.size,
            stat.S_IMODE(mode) & 0o777,
            mtime_ns,
            tuple(SecretSpan(*span) for span in spans),
        )
        # Named after the put: pinned now (the entry's own key is pinned
        # already), and present once the pin holds; a sweep that condemned
        # the key before may have deleted the blob: uploaded again next round.
        if key != entry.blob_key:
            replaced[entry.path] = fresh
            await self._pin([key])
        if await self.blobs.head(key) is None:
            changed.append(fresh if key != entry.blob_key else entry)
            return "other"
        if written:
            self.uploads.blobs += 1
            self.uploads.bytes += fresh.size
        return "same" if key == entry.blob_key else "other"

    async def _rehash(self, entry: FileEntry) -> tuple[FileEntry | None, _Kept | None]:
        """``_rehash_in`` (bytes kept when small) in a worker thread."""
        return await self._in_thread(
            lambda _stop: _rehash_in(self.root_fd, entry, self.secrets, self.token, keep_small=True)
        )

    async def _upload(self, entry: FileEntry) -> bool:
        if entry.size <= SMALL_FILE_BYTES:
            data = await self._in_thread(
                lambda _stop: _read_verified(self.root_fd, entry, self.secrets, self.token)
            )
            self.reporter.advance(nbytes=len(data))
            return await self.blobs.put(entry.blob_key, data, if_absent=True)
        async with self.large_slots:
            reader = await self._in_thread(
                lambda _stop: _open_verified(self.root_fd, entry, self.secrets)
            )
            try:
                return await self._put_verified(
                    entry.blob_key, reader, lambda n: self.reporter.advance(nbytes=n)
                )
            finally:
                await asyncio.to_thread(reader.close)


def _open_verified(
    root_fd: int, entry: FileEntry, secrets: tuple[bytes, ...]
) -> _native.VerifyingReader:
    """The native verifying reader on the entry's file, opened beneath the
    held root fd without following a symlink in any component: code in the
    sandbox that swaps a directory for a link to /etc must not get /etc's files
    read (and uploaded) in the workspace's name. Raises _FileChanged when the
    file or a parent is gone or no longer what the scan saw."""
    try:
        return _native.VerifyingReader.open(
            root_fd, entry.path, entry.blob_key[len(FILE_KEY_PREFIX) :], entry.size, secrets
        )
    except _native.FileChangedError:
        raise _FileChanged(entry.path) from None


def _read_verified(
    root_fd: int, entry: FileEntry, secrets: tuple[bytes, ...], token: _native.CancelToken
) -> bytes:
    """All of a small file's verified bytes (blocks: call it in a worker
    thread). Raises _FileChanged."""
    reader = _open_verified(root_fd, entry, secrets)
    try:
        return reader.read_all(token)
    except _native.FileChangedError:
        raise _FileChanged(entry.path) from None
    finally:
        reader.close()


def _rehash_in(
    root_fd: int,
    entry: FileEntry,
    secrets: tuple[bytes, ...],
    token: _native.CancelToken,
    *,
    keep_small: bool = False,
    unread_above: int | None = None,
) -> tuple[FileEntry | None, _Kept | None]:
    """The file's entry as it is now (None when it is gone) and, with
    ``keep_small``, the zeroed bytes that pass hashed when the file is under
    1 MiB (else None), so a changed small file is read once more in all (blocks:
    call it in a worker thread). Opened beneath the held root fd like every upload
    read. Raises SandboxSnapshotError(FILE_CHANGED) when the file can no longer
    be read (a symlink now, unreadable, changing on every read) or stopped being
    a regular file. With ``unread_above``, a file larger than that is not read:
    _NowLarge."""
    try:
        found = _native.rehash_beneath(
            root_fd, entry.path, secrets, token, keep_small, unread_above
        )
    except _native.ScanCancelled:
        raise
    except OSError as error:
        raise SandboxSnapshotError(
            FILE_CHANGED,
            f"{entry.path} changed while it was captured and can no longer be read: {error}",
            details={"path": entry.path},
        ) from None
    if found is None:
        return None, None
    hex_hash, size, spans, mode, mtime_ns, kept = found
    if not hex_hash and stat.S_ISREG(mode):
        raise _NowLarge(entry.path)
    if not stat.S_ISREG(mode):
        raise SandboxSnapshotError(
            FILE_CHANGED,
            f"{entry.path} stopped being a regular file while it was captured",
            details={"path": entry.path},
        )
    fresh = FileEntry(
        entry.path,
        FILE_KEY_PREFIX + hex_hash,
        size,
        stat.S_IMODE(mode) & 0o777,
        mtime_ns,
        tuple(SecretSpan(*span) for span in spans),
    )
    return fresh, None if kept is None else _Kept(fresh.blob_key, *kept)


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


def _apply_replacements(manifest: Manifest, replaced: dict[str, FileEntry | None]) -> Manifest:
    """The manifest with files that changed under the capture updated (or
    dropped when they vanished). Rare: decodes and re-encodes; the new entries
    come from our own fstat, so the result is still trusted."""
    if not replaced:
        return manifest
    out: list[Entry] = []
    for entry in manifest:
        if entry.path in replaced:
            fresh = replaced[entry.path]
            if fresh is not None:
                out.append(fresh)
        else:
            out.append(entry)
    return Manifest(encode_entries(out), length=len(out), trusted=True)


__all__ = [
    "FILE_CHANGED",
    "CaptureOptions",
    "CaptureResult",
    "CaptureStats",
    "PendingCheckpoint",
    "ScannedTree",
    "capture_checkpoint",
    "store_scanned",
]
