"""The restore engine (SPEC §5): bring a workspace back to a checkpoint, safely.

Read top to bottom, ``restore_checkpoint`` does:

1. take the thread's writer lease (fails fast with WRITER_CONFLICT) and resolve
   the checkpoint (None when the thread has none);
2. validate the manifest: every path as in SPEC §2, and no top-level
   ``.checkpointd*`` name (reserved for staging) → INVALID_PATH;
3. plan against the live workspace, scanned with the same policy and the stat
   cache: only files whose content differs are written, paths the policy selects
   that the checkpoint lacks are deleted, excluded paths stay;
4. fetch every needed blob into a staging directory at the top of the root (same
   filesystem, so the final renames are atomic), checking size and BLAKE3, before
   the first change to the workspace: MISSING_BLOB / INVALID_BLOB leave it as it
   was. From a local-directory bucket, blobs are copied in batches, each by one
   worker thread with plain os calls, instead of one async request per blob;
5. apply: deletions (deepest first), directories, files by atomic rename, symlinks
   (also renamed in from staging), then file modes and mtimes, then directory
   modes (deepest first, so a read-only directory is filled before it is locked).

Every path operation goes through ``safefs.SafeRoot``: descriptor-relative, never
following a symlink, so neither a hostile manifest nor a workspace whose
directories were swapped for symlinks can make restore touch anything outside the
root. The plan is computed from the live state, so re-running an interrupted
restore completes it. Afterwards the written files are recorded in the stat cache
so the next capture reuses their hashes.

Symlink targets are restored exactly as stored: creating a link never touches what
it names, and restore never follows one.
"""

from __future__ import annotations

import asyncio
import functools
import os
import stat
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import blake3

from . import _native
from ._engine import (
    LeaseKeeper,
    PhaseReporter,
    StopFlag,
    os_errors_mapped,
    run_bounded,
    run_in_thread,
)
from .blobs.base import BlobNotFoundError, BlobStore, BlobStoreError
from .blobs.local import LocalBlobDir
from .blobs.object_store import local_dir_of
from .codec import decode_entries
from .errors import (
    INVALID_BLOB,
    INVALID_PATH,
    MISSING_BLOB,
    MISSING_CHECKPOINT,
    NAME_TOO_LONG,
    SandboxCheckpointInvalidArgumentError,
    SandboxSnapshotError,
)
from .model import (
    FILE_KEY_PREFIX,
    Checkpoint,
    DirEntry,
    Entry,
    FileEntry,
    Policy,
    SymlinkEntry,
)
from .progress import ProgressCallback
from .safefs import SafeRoot, create_file
from .scanner import scan_workspace
from .statcache_paths import resolve_data_dir, stat_cache_path
from .store.base import CheckpointStore
from .validation import check_id, check_optional_id, entries_problem

# Blobs fetched at the same time (latency-bound for small files), of which at
# most LARGE_FETCH_CONCURRENCY stream large blobs; a small blob is gathered in
# memory, so the bound is FETCH_CONCURRENCY x SMALL_BLOB_BYTES plus chunks.
FETCH_CONCURRENCY = 32
LARGE_FETCH_CONCURRENCY = 4
SMALL_BLOB_BYTES = 1 << 20
# From a local-directory bucket: blobs per worker-thread trip (a batch ends at
# whichever limit comes first), and batches in flight.
LOCAL_BATCH_FILES = 256
LOCAL_BATCH_BYTES = 16 << 20
LOCAL_BATCH_CONCURRENCY = 2
_RESERVED_TOP_LEVEL = ".checkpointd"
_COPY_CHUNK = 1 << 20


@dataclass
class RestorePlan:
    """What restore changes, computed from the checkpoint and the live tree."""

    # (path, what stands there: "dir", "leaf" or "unsupported"), deepest first.
    deletions: list[tuple[str, str]] = field(default_factory=list)
    dirs_to_make: list[DirEntry] = field(default_factory=list)  # shallowest first
    writes: list[FileEntry] = field(default_factory=list)  # content differs or missing
    links: list[SymlinkEntry] = field(default_factory=list)
    file_metadata: list[FileEntry] = field(default_factory=list)  # same bytes, mode/mtime differ
    dir_modes: list[DirEntry] = field(default_factory=list)  # deepest first
    blob_sizes: dict[str, int] = field(default_factory=dict)  # key → size, for writes

    @property
    def operations(self) -> int:
        return (
            len(self.deletions)
            + len(self.dirs_to_make)
            + len(self.writes)
            + len(self.links)
            + len(self.file_metadata)
            + len(self.dir_modes)
        )


def _path_key(path: str) -> bytes:
    return path.encode("utf-8", "surrogateescape")


def validate_manifest(checkpoint: Checkpoint) -> dict[str, Entry]:
    """The checkpoint's entries by path, or SandboxSnapshotError(INVALID_PATH).

    Applies SPEC §2's path rules (no '..', no absolute path, no entry beneath a
    file or symlink...) and refuses top-level ``.checkpointd*`` names, which
    restore reserves for its staging area.
    """
    problem = entries_problem(checkpoint.files)
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
    return {entry.path: entry for entry in checkpoint.files}


def plan_restore(
    targets: dict[str, Entry], live: Sequence[Entry], unsupported: Sequence[str]
) -> RestorePlan:
    """Compare the checkpoint's entries with the live (policy-selected) ones.

    Raises SandboxSnapshotError(INVALID_BLOB) when two entries give one blob
    different sizes.
    """
    plan = RestorePlan()
    live_by_path: dict[str, Entry] = {entry.path: entry for entry in live}
    doomed: list[tuple[str, str]] = [
        (entry.path, "dir" if isinstance(entry, DirEntry) else "leaf")
        for entry in live
        if entry.path not in targets
    ]
    doomed += [(path, "unsupported") for path in unsupported if path not in targets]
    # Reverse byte order puts every path after its descendants ("a/b" > "a").
    plan.deletions = sorted(doomed, key=lambda item: _path_key(item[0]), reverse=True)

    for path in sorted(targets, key=_path_key):
        target = targets[path]
        current = live_by_path.get(path)
        if isinstance(target, FileEntry):
            if (
                isinstance(current, FileEntry)
                and current.blob_key == target.blob_key
                and current.size == target.size
            ):
                if current.mode != target.mode or current.mtime_ns != target.mtime_ns:
                    plan.file_metadata.append(target)
            else:
                plan.writes.append(target)
                known = plan.blob_sizes.setdefault(target.blob_key, target.size)
                if known != target.size:
                    # One blob cannot have two sizes: the manifest is corrupt.
                    raise _invalid_blob(
                        target.blob_key, f"entries give it sizes {known} and {target.size}"
                    )
        elif isinstance(target, DirEntry):
            if not isinstance(current, DirEntry):
                plan.dirs_to_make.append(target)
                plan.dir_modes.append(target)
            elif current.mode != target.mode:
                plan.dir_modes.append(target)
        elif not (isinstance(current, SymlinkEntry) and current.target == target.target):
            plan.links.append(target)
    plan.dir_modes.reverse()
    return plan


@os_errors_mapped
async def restore_checkpoint(
    workspace_root: str | os.PathLike[str],
    store: CheckpointStore,
    blobs: BlobStore,
    thread_id: str,
    *,
    checkpoint_id: str | None = None,
    policy: Policy | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    progress: ProgressCallback | None = None,
) -> Checkpoint | None:
    """Restore the head (or ``checkpoint_id``) of ``thread_id`` into the workspace.

    ``policy`` None means the policy the checkpoint was captured with (the
    default one for a checkpoint that records none); an explicit one wins.

    Returns the restored checkpoint, or None when the thread has none (the root is
    still created). Raises SandboxCheckpointInvalidIdError for a bad id,
    SandboxCheckpointInvalidArgumentError for a data_dir inside the workspace or a
    root whose parent is missing, SandboxCheckpointWriterConflictError when the
    thread's lease is held, and SandboxSnapshotError with MISSING_CHECKPOINT (an
    unknown id or one of another thread), INVALID_PATH (hostile manifest),
    MISSING_BLOB or INVALID_BLOB (the workspace is then unchanged).
    """
    check_id(thread_id, "thread id")
    check_optional_id(checkpoint_id, "checkpoint id")
    root = _absolute(workspace_root)
    cache_path = stat_cache_path(resolve_data_dir(root, data_dir), root)
    reporter = PhaseReporter(progress)

    reporter.phase("lease")
    lease = await store.acquire_writer(thread_id)
    try:
        async with LeaseKeeper(lease) as keeper:
            reporter.phase("resolve")
            checkpoint = await _resolve(store, thread_id, checkpoint_id)
            targets = validate_manifest(checkpoint) if checkpoint is not None else {}
            _ensure_root(root)
            if checkpoint is None:
                return None
            _check_name_lengths(root, checkpoint)

            reporter.phase("plan")
            # No policy given: the one the checkpoint was captured with, so a
            # restore never deletes what that capture left out (SPEC §10).
            policy = checkpoint.effective_policy(policy)
            live, unsupported = await _scan_live(root, policy, cache_path)
            plan = plan_restore(targets, live, unsupported)
            keeper.check()
            await _fetch_and_apply(root, blobs, plan, reporter, keeper)

            written = [
                (entry.path, entry.blob_key[len(FILE_KEY_PREFIX) :])
                for entry in targets.values()
                if isinstance(entry, FileEntry)
            ]
            if written:
                await run_in_thread(lambda: _native.record_in_cache(root, cache_path, written, ()))
            reporter.finish()
            return checkpoint
    finally:
        await lease.release()


def _check_name_lengths(root: str, checkpoint: Checkpoint) -> None:
    """NAME_TOO_LONG, before any change, for an entry with a name longer than the
    workspace's filesystem allows (a checkpoint taken on another filesystem, or
    a hand-made manifest): better refused whole than half restored."""
    try:
        limit = os.pathconf(root, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    for entry in checkpoint.files:
        if any(
            len(part.encode("utf-8", "surrogateescape")) > limit for part in entry.path.split("/")
        ):
            raise SandboxSnapshotError(
                NAME_TOO_LONG,
                f"{entry.path}: a name in it is longer than the {limit} bytes the filesystem "
                f"of {root} allows",
                details={"checkpoint_id": checkpoint.id, "path": entry.path},
            )


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


async def _scan_live(
    root: str, policy: Policy, cache_path: str
) -> tuple[tuple[Entry, ...], list[str]]:
    """The workspace as the policy sees it; secrets are not zeroed (none are known)."""
    token = _native.CancelToken()
    outcome = await run_in_thread(
        lambda: scan_workspace(root, policy, (), cache_path, cancel=token), token.cancel
    )
    return decode_entries(outcome.manifest), [path for path, _kind in outcome.unsupported]


async def _fetch_and_apply(
    root: str,
    blobs: BlobStore,
    plan: RestorePlan,
    reporter: PhaseReporter,
    keeper: LeaseKeeper,
) -> None:
    with SafeRoot(root) as safe:
        # Leftovers of a restore that was killed. A workspace has one restore at
        # a time (SPEC §5: nothing else writes to it meanwhile), so they are garbage.
        for name in safe.stale_staging_names():
            safe.remove_top_level(name)
        staging_name, staging_fd = safe.make_staging()
        try:
            reporter.phase(
                "fetch",
                files_total=len(plan.blob_sizes),
                bytes_total=sum(plan.blob_sizes.values()),
            )
            fetcher = _Fetcher(blobs, staging_fd, reporter, _single_use(plan))
            await run_bounded(fetcher.jobs(plan.blob_sizes), lambda job: job(), FETCH_CONCURRENCY)
            keeper.check()
            # Phase report before the first change: a caller's hook runs here.
            reporter.phase("apply", files_total=plan.operations)
            stop = StopFlag()
            await run_in_thread(lambda: _apply(safe, plan, staging_fd, reporter, stop), stop.set)
        finally:
            os.close(staging_fd)
            safe.remove_top_level(staging_name)


def _staged_name(key: str) -> str:
    return "b-" + key[len(FILE_KEY_PREFIX) :]


def _single_use(plan: RestorePlan) -> dict[str, FileEntry]:
    """The one entry each blob written to a single path is for: its staged file
    gets that entry's mode and mtime while still open, and is renamed as is."""
    uses = Counter(entry.blob_key for entry in plan.writes)
    return {entry.blob_key: entry for entry in plan.writes if uses[entry.blob_key] == 1}


class _StagedBlob:
    """Writes one blob into staging while hashing and counting it; ``finish``
    gives it the mode and mtime of ``entry`` (when it is the blob's only use)."""

    def __init__(self, staging_fd: int, key: str, entry: FileEntry | None = None) -> None:
        self.fd = create_file(staging_fd, _staged_name(key))
        self.entry = entry
        self.hasher = blake3.blake3()
        self.size = 0

    def finish(self) -> None:
        """Set the entry's mode and mtime, after the last write."""
        if self.entry is not None:
            os.fchmod(self.fd, stat.S_IMODE(self.entry.mode))
            os.utime(self.fd, ns=(self.entry.mtime_ns, self.entry.mtime_ns))

    def write(self, chunk: bytes) -> None:
        self.hasher.update(chunk)
        self.size += len(chunk)
        view = memoryview(chunk)
        while view:
            view = view[os.write(self.fd, view) :]

    def write_all(self, chunks: list[bytes]) -> None:
        """Write a small blob's chunks and close, in one trip to a worker thread."""
        try:
            for chunk in chunks:
                self.write(chunk)
            self.finish()
        finally:
            self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class _Fetcher:
    """Fetches blobs into staging, verifying each; MISSING_BLOB / INVALID_BLOB.

    Small blobs are gathered in memory (at most SMALL_BLOB_BYTES each) and
    written in one worker-thread trip, as most of a workspace is small files;
    large ones stream chunk by chunk, a few at a time to bound memory.
    """

    def __init__(
        self,
        blobs: BlobStore,
        staging_fd: int,
        reporter: PhaseReporter,
        single_use: dict[str, FileEntry],
    ) -> None:
        self.blobs = blobs
        self.single_use = single_use
        self.staging_fd = staging_fd
        self.reporter = reporter
        self.large_slots = asyncio.Semaphore(LARGE_FETCH_CONCURRENCY)
        self.batch_slots = asyncio.Semaphore(LOCAL_BATCH_CONCURRENCY)
        self.local = local_dir_of(blobs)

    def jobs(self, sizes: dict[str, int]) -> list[Callable[[], Awaitable[None]]]:
        """One job per blob, or per batch of blobs from a local-directory bucket."""
        jobs: list[Callable[[], Awaitable[None]]] = []
        local = self.local
        batch: list[tuple[str, int]] = []
        batch_bytes = 0
        for key, size in sizes.items():
            if local is None or local.path(key) is None:
                jobs.append(functools.partial(self.fetch, key, size))
                continue
            batch.append((key, size))
            batch_bytes += size
            if len(batch) >= LOCAL_BATCH_FILES or batch_bytes >= LOCAL_BATCH_BYTES:
                jobs.append(functools.partial(self.fetch_batch, local, batch))
                batch, batch_bytes = [], 0
        if local is not None and batch:
            jobs.append(functools.partial(self.fetch_batch, local, batch))
        return jobs

    async def fetch_batch(self, local: LocalBlobDir, batch: list[tuple[str, int]]) -> None:
        """Copy a batch of blobs from the local bucket in one worker-thread trip."""
        async with self.batch_slots:
            stop = StopFlag()
            await run_in_thread(lambda: self._copy_batch(local, batch, stop), stop.set)

    def _copy_batch(
        self, local: LocalBlobDir, batch: list[tuple[str, int]], stop: StopFlag
    ) -> None:
        for key, size in batch:
            stop.raise_if_set()
            self._copy_local(local, key, size)

    def _copy_local(self, local: LocalBlobDir, key: str, size: int) -> None:
        """Copy one blob into staging, checking it as ``fetch`` does (blocks)."""
        try:
            source = local.open_for_reading(key)
        except BlobNotFoundError:
            raise self._missing(key) from None
        try:
            sink = _StagedBlob(self.staging_fd, key, self.single_use.get(key))
            try:
                received = 0
                while True:
                    try:
                        chunk = os.read(source, min(_COPY_CHUNK, size + 1 - received))
                    except OSError as error:
                        raise BlobStoreError(
                            f"get {key!r} on {self.blobs.url} failed: {error}"
                        ) from error
                    if not chunk:
                        break
                    received += len(chunk)
                    if received > size:
                        raise _invalid_blob(
                            key, f"longer than the {size} bytes the checkpoint records"
                        )
                    sink.write(chunk)
                    self.reporter.advance(nbytes=len(chunk))
                sink.finish()
            finally:
                sink.close()
        finally:
            os.close(source)
        self._check(sink, key, size)

    def _missing(self, key: str) -> SandboxSnapshotError:
        return SandboxSnapshotError(
            MISSING_BLOB, f"blob {key} is missing from {self.blobs.url}", details={"key": key}
        )

    def _check(self, sink: _StagedBlob, key: str, size: int) -> None:
        """INVALID_BLOB unless the staged bytes have the recorded size and hash."""
        if sink.size != size:
            raise _invalid_blob(key, f"{sink.size} bytes where the checkpoint records {size}")
        if sink.hasher.hexdigest() != key[len(FILE_KEY_PREFIX) :]:
            raise _invalid_blob(key, "its BLAKE3 hash does not match its key")
        self.reporter.advance(files=1)

    async def fetch(self, key: str, size: int) -> None:
        sink = _StagedBlob(self.staging_fd, key, self.single_use.get(key))
        try:
            if size <= SMALL_BLOB_BYTES:
                chunks = [chunk async for chunk in self._chunks(key, size, sink)]
                await asyncio.to_thread(sink.write_all, chunks)
            else:
                async with self.large_slots:
                    async for chunk in self._chunks(key, size, sink):
                        await asyncio.to_thread(sink.write, chunk)
                    sink.finish()
        finally:
            sink.close()
        self._check(sink, key, size)

    async def _chunks(self, key: str, size: int, sink: _StagedBlob) -> AsyncIterator[bytes]:
        received = 0
        try:
            async for chunk in self.blobs.get_stream(key):
                received += len(chunk)
                if received > size:
                    # Stop early: a hostile or corrupt blob must not fill the disk.
                    raise _invalid_blob(key, f"longer than the {size} bytes the checkpoint records")
                self.reporter.advance(nbytes=len(chunk))
                yield chunk
        except BlobNotFoundError:
            raise self._missing(key) from None


def _invalid_blob(key: str, reason: str) -> SandboxSnapshotError:
    return SandboxSnapshotError(
        INVALID_BLOB, f"blob {key} is invalid: {reason}", details={"key": key}
    )


def _apply(
    safe: SafeRoot, plan: RestorePlan, staging_fd: int, reporter: PhaseReporter, stop: StopFlag
) -> None:
    """Change the workspace (runs in a worker thread; ``stop`` ends it early)."""
    for path, kind in plan.deletions:
        stop.raise_if_set()
        if kind == "dir":
            safe.remove_dir_if_empty(path)  # one holding excluded paths stays
        elif kind == "leaf":
            safe.remove_leaf(path)
        else:
            # A fifo, an escaping link, a non-UTF-8 name (perhaps a whole directory
            # the scan could not enter): the policy selects it, so it goes.
            safe.remove(path)
        reporter.advance(files=1)
    for directory in plan.dirs_to_make:
        stop.raise_if_set()
        safe.ensure_dir(directory.path)
        reporter.advance(files=1)

    remaining_uses = Counter(entry.blob_key for entry in plan.writes)
    single_use = _single_use(plan)
    for number, entry in enumerate(plan.writes):
        stop.raise_if_set()
        remaining_uses[entry.blob_key] -= 1
        staged = _staged_name(entry.blob_key)
        if remaining_uses[entry.blob_key] > 0:
            # Another path needs these bytes too: give this one a copy.
            name = f"c-{number}"
            _copy_file(staging_fd, staged, name)
            _set_file_metadata(staging_fd, name, entry)
        else:
            name = staged
            if entry.blob_key not in single_use:  # else the fetch already set them
                _set_file_metadata(staging_fd, name, entry)
        safe.rename_into(staging_fd, name, entry.path)
        reporter.advance(files=1, nbytes=entry.size)

    for number, link in enumerate(plan.links):
        stop.raise_if_set()
        name = f"l-{number}"
        os.symlink(link.target, name, dir_fd=staging_fd)
        safe.rename_into(staging_fd, name, link.path)
        reporter.advance(files=1)
    for entry in plan.file_metadata:
        stop.raise_if_set()
        safe.chmod(entry.path, entry.mode, is_dir=False)
        safe.set_mtime(entry.path, entry.mtime_ns)
        reporter.advance(files=1)
    for directory in plan.dir_modes:
        stop.raise_if_set()
        safe.chmod(directory.path, directory.mode, is_dir=True)
        reporter.advance(files=1)


def _copy_file(dir_fd: int, source: str, destination: str) -> None:
    src = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        dst = create_file(dir_fd, destination)
        try:
            while True:
                try:
                    copied = os.copy_file_range(src, dst, _COPY_CHUNK)
                except OSError:
                    copied = _copy_by_read(src, dst)
                if copied == 0:
                    break
        finally:
            os.close(dst)
    finally:
        os.close(src)


def _copy_by_read(src: int, dst: int) -> int:
    chunk = os.read(src, _COPY_CHUNK)
    view = memoryview(chunk)
    while view:
        view = view[os.write(dst, view) :]
    return len(chunk)


def _set_file_metadata(dir_fd: int, name: str, entry: FileEntry) -> None:
    """Mode and mtime on the staged file, before it is renamed into place."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        os.fchmod(fd, stat.S_IMODE(entry.mode))
        os.utime(fd, ns=(entry.mtime_ns, entry.mtime_ns))
    finally:
        os.close(fd)


__all__ = ["RestorePlan", "plan_restore", "restore_checkpoint", "validate_manifest"]
