"""The capture's scan stage (step 2 of ``capture_checkpoint``): the directory
scanned, held by fd; the native scan in a worker thread while the upload
takes what it feeds; the parent the scan compares with, read before and again
after it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
from dataclasses import dataclass
from typing import Any

from . import _native
from ._capture_upload import LISTED_IN_MESSAGE, SMALL_FILE_BYTES, Uploader
from ._engine import REPORT_INTERVAL_S, PhaseReporter, run_in_thread
from .errors import (
    INVALID_PATH,
    UNSUPPORTED_ENTRY,
    SandboxCheckpointConflictError,
    SandboxCheckpointDamagedError,
    SandboxCheckpointInvalidArgumentError,
    SandboxSnapshotError,
)
from .journal import JournalUse, scanned
from .manifest import Known, Manifest, ManifestSummary, manifest_of
from .model import Checkpoint, Policy
from .scanner import JournalInput, ScanOutcome, scan_workspace
from .store.base import CheckpointStore
from .validation import checked_subdir

# Zeroed bytes of small files waiting between the scan and the upload, as
# stored (compressed) in their frames; the scan waits when this is full:
# bounds a cold capture's memory.
FEED_BYTES = 64 << 20
# A parent manifest up to this size is loaded for its digests before a scan
# (new_feed); a larger one only when its store has it loaded already.
SMALL_PARENT_BYTES = 4 << 20
# Open files of large files the scan has handed to the upload and the upload
# has not closed yet (queued or streaming): a scan thread that would exceed it
# waits, so a workspace of thousands of large files stays far below any fd limit.
HELD_FILES = 16


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


def _beneath(fd: int, subdir: str, requested: str) -> int:
    """``subdir`` opened beneath ``fd`` (``_native.open_beneath``), or
    SandboxSnapshotError(INVALID_PATH) naming ``requested``."""
    try:
        return _native.open_beneath(fd, subdir)
    except OSError as error:
        raise SandboxSnapshotError(
            INVALID_PATH,
            f"workspace_subdir {requested!r} cannot be opened without following "
            f"links: {error.strerror or error}",
            details={"path": requested},
        ) from error


def check_subroot(workspace: str, requested: str) -> None:
    """A request's sub-root checked early, before any work: INVALID_PATH
    (naming ``requested``) for a path that is not workspace-relative, or
    that meets a symlink or a file on its way down. A missing component
    passes: a restore makes the sub-root, a capture fails opening it."""
    subdir = checked_subdir(requested)
    if not subdir:
        return
    fd = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.close(_beneath(fd, subdir, requested))
    except SandboxSnapshotError as error:
        if not isinstance(error.__cause__, FileNotFoundError):
            raise
    finally:
        os.close(fd)


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
            return cls(_beneath(fd, subdir, subdir))
        finally:
            os.close(fd)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


@dataclass(frozen=True)
class ScanRequest:
    """What one scan reads: the directory (its path, and the fd the capture
    holds), the policy, the secrets to zero, the stat cache's path, the cancel
    token, the parent's manifest summary (``previous``) and, when the change
    journal directs the scan, what it names (``journal``)."""

    root: str
    root_fd: int
    policy: Policy
    secrets: tuple[bytes, ...]
    cache_path: str
    token: _native.CancelToken
    previous: ManifestSummary | None
    journal: JournalInput | None


def new_feed(parent: Manifest | None) -> _native.BlobFeed:
    """The feed from the scan to the upload. It skips the parent's digests
    when they are at hand or cheap to have: a parent its store has loaded, or
    a small one (up to SMALL_PARENT_BYTES, such as a workspace of a few large
    files stored as chunks: a capture after an edit then neither uploads nor
    pins the thousands of chunks the parent holds). A large parent its store
    has not loaded is not loaded for them: a no-change capture never needs
    them, and a file the feed hands over anyway is found present (and pinned)
    by the upload's lookup."""
    parent_digests = (
        parent.digests_leaving_unloaded()
        if parent is not None and (parent.loaded or parent.byte_length() <= SMALL_PARENT_BYTES)
        else b""
    )
    return _native.BlobFeed(FEED_BYTES, SMALL_FILE_BYTES, parent_digests, max_held_files=HELD_FILES)


def start_scan(
    request: ScanRequest, feed: _native.BlobFeed, counts: _native.ScanProgress
) -> asyncio.Task[ScanOutcome]:
    """Start the scan on the feed's threads; it hands what it reads to ``feed``
    and its counts to ``counts``. The request (and the journal's bytes in it)
    is held by the scan alone once the caller lets go of it."""
    return asyncio.ensure_future(_scan(request, feed, counts))


async def finish_scan(
    scanning: asyncio.Task[ScanOutcome],
    feed: _native.BlobFeed,
    counts: _native.ScanProgress,
    uploader: Uploader,
    use: JournalUse | None,
) -> ScanOutcome:
    """Report the scan's counts and upload what it feeds until both end, then
    close the scan phase. On any failure the feed is abandoned and the scan
    and the upload are stopped and waited for before the error goes on."""
    reporter, token = uploader.reporter, uploader.token
    polling = asyncio.ensure_future(_report_scan(counts, reporter, scanning))
    uploading = asyncio.ensure_future(uploader.upload_feed(feed, _feed_waiters()))
    scan_closed = False
    try:
        await asyncio.wait({scanning, uploading}, return_when=asyncio.FIRST_COMPLETED)
        if not uploading.done() and feed.held_files and _succeeded(scanning):
            # Large files the scan handed over are still being copied: the
            # scan phase ends now and their bytes are the upload phase's while
            # they go up (not one report when the last copy ends).
            _close_scan_phase(reporter, scanning.result())
            scan_closed = True
            uploader.report_feed_uploads()
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
    return outcome


def scanned_manifest(
    outcome: ScanOutcome, previous: ManifestSummary | None, parent: Manifest | None
) -> Manifest:
    """The scan's manifest: bytes from here to the store, valid by
    construction (the scan refuses every path docs/contract.md#data-model
    forbids), decoded only if someone reads it. When nothing changed they are
    the parent's (same length and fingerprint): the parent's manifest object
    is the new one, so no second copy is made and an unloaded one stays
    unloaded."""
    if parent is not None and outcome.same_as_previous:
        return parent if parent.trusted else Manifest(parent.data, trusted=True)
    return Manifest(
        outcome.manifest,
        length=outcome.entries_count,
        trusted=True,
        known=Known(
            digests=outcome.digests,
            totals=(outcome.entries_count, outcome.file_count, outcome.file_bytes),
            fingerprint=outcome.fingerprint,
        ),
        delta=(previous, *outcome.delta)
        if outcome.delta is not None and previous is not None
        else None,
    )


async def parent_again(
    store: CheckpointStore, head_id: str | None, previous: ManifestSummary | None
) -> Checkpoint | None:
    """The parent, read again after the scan: the head cannot have moved (we
    hold the lease), and its manifest must still be the one the scan was
    compared with."""
    if head_id is None:
        return None
    parent = await readable(store, head_id)
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


async def parent_files(store: CheckpointStore, head_id: str | None) -> Manifest | None:
    """The head's manifest, read again (for a scan the change journal directs)."""
    parent = await readable(store, head_id)
    return manifest_of(parent.files) if parent is not None else None


async def readable(store: CheckpointStore, head_id: str | None) -> Checkpoint | None:
    """The head, or None when there is none or it is damaged in the store
    (DATA_LOSS for a read of it): the capture goes on without a parent's help,
    and the store appends a keyframe on top of the damaged head."""
    if head_id is None:
        return None
    try:
        return await store.get(head_id)
    except SandboxCheckpointDamagedError:
        return None


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
    request: ScanRequest, feed: _native.BlobFeed, progress: _native.ScanProgress
) -> ScanOutcome:
    token = request.token
    outcome = await run_in_thread(
        lambda: scan_workspace(
            request.root,
            request.policy,
            request.secrets,
            request.cache_path,
            cancel=token,
            feed=feed,
            root_fd=request.root_fd,
            progress=progress,
            previous=request.previous,
            journal=request.journal,
        ),
        token.cancel,
        _feed_waiters(),
    )
    if outcome.unsupported:
        # details["paths"] lists every one; the message stays short enough for a
        # gRPC status (whose text travels in an 8 KiB header budget).
        shown = outcome.unsupported[:LISTED_IN_MESSAGE]
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
