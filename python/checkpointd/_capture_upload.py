"""The capture's upload stage (steps 3 to 5 of ``capture_checkpoint``): pin
every key the checkpoint will reference, find the blobs the store lacks, and
upload them, taking what the scan feeds while it goes on; files that changed
under the capture are hashed again and their entries updated.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import stat
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal, TypeVar

import blake3

from . import _native
from ._capture_read import (
    FileChanged,
    Kept,
    NowLarge,
    Rehashed,
    open_verified,
    read_verified,
    rehash_each,
    rehash_in,
)
from ._engine import LeaseKeeper, PhaseReporter, StopFlag, run_bounded, run_in_thread
from .blobs import base as blob_batches
from .blobs.base import BlobNotFoundError, BlobStore, VerifiedFile
from .blobs.packs import PackedBlobStore, PackSession
from .check import missing_marks, without_marked
from .chunk_blobs import ChunkSource, upload_missing_chunks
from .codec import encode_entries
from .errors import ARTIFACT_NOT_UPLOADED, FILE_CHANGED, SandboxSnapshotError
from .manifest import Manifest, NewFiles, manifest_of, only_whole_files, split_digests
from .model import (
    ARTIFACT_KEY_PREFIX,
    FILE_KEY_PREFIX,
    Artifact,
    Checkpoint,
    Entry,
    FileEntry,
    SecretSpan,
    WriterLease,
)
from .store._packindex import file_key, row_key
from .store.base import BlobGuard, CheckpointStore

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
# Batches of the feed uploaded at once.
FEED_CONSUMERS = 2
# Small files per batch (one worker-thread trip to read them, one ``put_many``;
# a batch ends at whichever limit comes first), and batches in flight.
BATCH_FILES = 1024
BATCH_BYTES = 16 << 20
BATCH_CONCURRENCY = 2
# Rounds of "hash again and upload" for files that change under the capture.
CHANGED_FILE_ROUNDS = 3
# Zeroed bytes of changed small files held from the pass that hashed them again
# to their upload next round (past this, such a file is read again instead).
KEPT_BYTES = 64 << 20
# Offending paths named in an error message (all are in its details).
LISTED_IN_MESSAGE = 20
# Waiting for a sweep to release a condemned key: first and longest pause.
_PIN_RETRY_FIRST_S = 0.05
_PIN_RETRY_MAX_S = 1.0


@dataclass
class Uploads:
    blobs: int = 0
    bytes: int = 0


@dataclass
class _BatchOutcome:
    """What reading one batch of small files found (applied on the event loop)."""

    items: list[tuple[str, bytes]] = field(default_factory=list)  # (key, verified bytes)
    replaced: list[tuple[str, FileEntry | None]] = field(default_factory=list)
    kept: list[tuple[str, Kept]] = field(default_factory=list)  # path -> its new bytes
    grown: list[FileEntry] = field(default_factory=list)  # large now: not read


@dataclass(frozen=True)
class UploadScope:
    """What an upload works under: the directory scanned (held by fd by the
    capture), the thread's lease and its keeper, the secrets the scan zeroed,
    the phase reporter and the capture's cancel token."""

    root_fd: int
    lease: WriterLease
    keeper: LeaseKeeper
    secrets: tuple[bytes, ...]
    reporter: PhaseReporter
    token: _native.CancelToken


def _new_to(
    manifest: Manifest, parent: Manifest | None, rechecked: set[str], present: list[bytes]
) -> NewFiles:
    """What ``manifest`` adds to the digests of ``parent`` (less those marked
    for a recheck) and to the ``present`` (fed) ones. Read from the rows a
    scan directed by the change journal inserted, when it made its delta
    from this very parent; else from the digest lists when the scan gave
    them (nothing new: no row is read), else from every row."""
    known = without_marked(parent.digests(), rechecked) if parent is not None else b""
    fed = _native.sort_digests(b"".join(present)) if present else b""
    delta = manifest.delta_from(parent) if parent is not None and not rechecked else None
    found = _native.manifest_delta_new_files(delta[0], known, fed) if delta is not None else None
    if found is not None:
        return found
    digests = manifest.known_digests()
    if digests is not None:
        new = _native.digest_difference(digests, known)
        new = _native.digest_difference(new, fed) if new and fed else new
        if not new:
            return b"", []
        return new, _native.manifest_files_with_digests(manifest.data, new)
    return _native.manifest_new_files(manifest.data, known, fed)


class Uploader:
    """Steps 3-5: pin, find missing, upload; owns the upload counters."""

    def __init__(self, store: CheckpointStore, blobs: BlobStore, scope: UploadScope) -> None:
        self.root_fd = scope.root_fd  # the directory scanned, held by the capture
        self.store = store
        # With a pack index, small blobs go into this capture's packs, each
        # pack pinned before its upload (blobs/packs.py, "Safety").
        self.session = (
            blobs.capture_session(pin=self._pin) if isinstance(blobs, PackedBlobStore) else None
        )
        self.blobs: BlobStore = self.session if self.session is not None else blobs
        self.lease = scope.lease
        self.keeper = scope.keeper
        self.secrets = scope.secrets
        self.reporter = scope.reporter
        self.token = scope.token
        self.uploads = Uploads()
        # Digests the feed saw pinned and present (or put): no second look
        # needed. Raw digests concatenated, a batch per item, so the upload
        # phase leaves them out natively (a cold capture feeds every file: no
        # Python object per file there).
        self.present: list[bytes] = []
        self.fed = Uploads()  # blobs the feed put (or found put by a racing capture)
        # Bytes of handed-over files copied so far whose copy has not ended, and
        # whether those copies report in the upload phase (report_feed_uploads).
        self.fed_copying = 0
        self.feed_reports = False
        # Paths whose handed-over file was no longer what the scan hashed: the
        # upload hashes them again instead of reading them to find that out.
        self.fed_changed: set[str] = set()
        self.rechecked: set[str] = set()  # keys check marked missing (distrust_marked)
        # Changed small files' bytes for the next round's upload (``Kept``).
        self.kept: dict[str, Kept] = {}
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
            except FileChanged:
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
        """``put`` the reader's verified bytes; FileChanged when the file is
        not what was scanned any more (nothing was stored under ``key``)."""
        source = VerifiedFile(reader, cancel=self.token, on_bytes=on_bytes)
        try:
            return await self.blobs.put(key, source, if_absent=True)
        except _native.FileChangedError:
            raise FileChanged(reader.path) from None
        except Exception:
            # The store may wrap what our stream raised; the source knows.
            if source.changed:
                raise FileChanged(reader.path) from None
            raise

    async def store_blobs(
        self,
        manifest: Manifest,
        artifacts: tuple[Artifact, ...],
        parent: Checkpoint | None,
        new_to_parent: NewFiles | None = None,
    ) -> Manifest:
        """Make sure every blob the manifest and artifacts use is in the bucket;
        returns the manifest, updated for files that changed under the capture.
        ``new_to_parent``: what the manifest adds to the parent, when the
        caller worked it out (``_native.manifest_new_files`` against the
        parent's digests, nothing fed).

        Works on the manifest's bytes: only files whose content the parent does
        not reference become Python objects (none when nothing changed)."""
        pending = await self._new_files(manifest, parent, new_to_parent)
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
        paths = ", ".join(entry.path for entry in pending[:LISTED_IN_MESSAGE])
        if len(pending) > LISTED_IN_MESSAGE:
            paths += f" and {len(pending) - LISTED_IN_MESSAGE} more"
        raise SandboxSnapshotError(
            FILE_CHANGED,
            f"files kept changing while they were captured: {paths}; capture again when "
            "nothing writes to them",
            details={"paths": [entry.path for entry in pending]},
        )

    async def _new_files(
        self, manifest: Manifest, parent: Checkpoint | None, new_to_parent: NewFiles | None
    ) -> list[FileEntry]:
        """The manifest's files whose content neither the parent references
        nor the feed put, after the chunks of large files among them are
        uploaded (those the scan did not feed)."""
        parent_manifest = manifest_of(parent.files) if parent is not None else None
        if new_to_parent is not None and not self.rechecked and not self.present:
            new_digests, files = new_to_parent
        elif (
            parent_manifest is not None
            and not self.rechecked
            and parent_manifest.same_bytes(manifest)
        ):
            # The parent's files: every key is present (see store_blobs), and neither
            # manifest is loaded to find that out.
            new_digests, files = b"", []
        else:
            rechecked, present = self.rechecked, self.present
            new_digests, files = await self._in_thread(
                lambda _stop: _new_to(manifest, parent_manifest, rechecked, present)
            )
        pending = [
            FileEntry(path, FILE_KEY_PREFIX + digest.hex(), size) for path, digest, size in files
        ]
        # Chunks of large files the scan did not feed (checkpointd.chunk_blobs):
        # only when some new digest is no whole file's.
        chunk_blobs, chunk_bytes = (
            (0, 0)
            if only_whole_files((new_digests, files))
            else await upload_missing_chunks(
                manifest.data,
                new_digests,
                ChunkSource(
                    self.root_fd, self.secrets, lambda read: self._in_thread(lambda _stop: read())
                ),
                self.blobs,
                self._pin,
            )
        )
        self.uploads.blobs += chunk_blobs
        self.uploads.bytes += chunk_bytes
        return pending

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

    def _keep(self, path: str, kept: Kept) -> None:
        if self.kept_bytes + len(kept.data) <= KEPT_BYTES:
            self.kept[path] = kept
            self.kept_bytes += len(kept.data)

    def _unkeep(self, path: str) -> Kept:
        kept = self.kept.pop(path)
        self.kept_bytes -= len(kept.data)
        return kept

    def _read_batch_now(
        self, stop: StopFlag, groups: list[list[FileEntry]], kept: dict[str, Kept]
    ) -> _BatchOutcome:
        """The batch's reads, in a worker thread: per group, the bytes of the
        first file that still holds them. Each file is read once: hashed as it
        is now with its zeroed bytes kept, which are sent when they still have
        the manifest's hash, else kept for the next round under the new hash
        (and sent then without a read while the file's fstat is unchanged)."""
        outcome = _BatchOutcome()
        # The first file of each group is read by one native call for all.
        firsts = [group[0] for group in groups if group[0].path not in kept]
        read = dict(
            zip((entry.path for entry in firsts), self._rehash_small_now(firsts), strict=True)
        )
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
                    found = read.pop(entry.path, None) or self._rehash_small_now([entry])[0]
                    if isinstance(found, NowLarge):
                        outcome.grown.append(entry)  # streamed as it is, in one read
                        continue
                    if isinstance(found, Exception):
                        raise found
                    fresh, now = found
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
                        else read_verified(self.root_fd, entry, self.secrets, self.token)
                    )
                outcome.items.append((entry.blob_key, data))
                self.reporter.advance(files=1, nbytes=len(data))
                break
        return outcome

    def _rehash_small_now(
        self, entries: list[FileEntry]
    ) -> list[Rehashed | SandboxSnapshotError | NowLarge]:
        """``rehash_each`` of small files, their bytes kept (blocks)."""
        return rehash_each(
            self.root_fd,
            entries,
            self.secrets,
            self.token,
            keep_small=True,
            unread_above=SMALL_FILE_BYTES,
        )

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
                    raise FileChanged(entry.path)
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
            except FileChanged:
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

    async def _rehash(self, entry: FileEntry) -> tuple[FileEntry | None, Kept | None]:
        """``rehash_in`` (bytes kept when small) in a worker thread."""
        return await self._in_thread(
            lambda _stop: rehash_in(self.root_fd, entry, self.secrets, self.token, keep_small=True)
        )

    async def _upload(self, entry: FileEntry) -> bool:
        if entry.size <= SMALL_FILE_BYTES:
            data = await self._in_thread(
                lambda _stop: read_verified(self.root_fd, entry, self.secrets, self.token)
            )
            self.reporter.advance(nbytes=len(data))
            return await self.blobs.put(entry.blob_key, data, if_absent=True)
        async with self.large_slots:
            reader = await self._in_thread(
                lambda _stop: open_verified(self.root_fd, entry, self.secrets)
            )
            try:
                return await self._put_verified(
                    entry.blob_key, reader, lambda n: self.reporter.advance(nbytes=n)
                )
            finally:
                await asyncio.to_thread(reader.close)


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
