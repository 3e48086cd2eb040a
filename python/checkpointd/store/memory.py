"""In-memory checkpoint and instance stores: the reference for every rule of SPEC §3.

State lives in dicts owned by one store object. The rules are the SQL stores'
(``_core``: ``check_append_state``, ``spent_ids``; ``_options``: leases, prune,
fork); the counts are plain per-key integers, since +1 on a dict costs nothing
like a database row does. Every method does its checks and
its writes without an ``await`` in between, so each call is atomic on the event
loop and a failed check changes nothing.

Immutability: checkpoints are frozen dataclasses whose entries and artifacts are
frozen too; the one mutable part, the conversation (JSON values), is kept as a
JSON string and decoded afresh for every read, so neither the caller's input nor a
returned value can reach the stored state.
"""

from __future__ import annotations

import builtins
import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType

from ..errors import STORE_UNAVAILABLE, SandboxCheckpointError
from ..manifest import Manifest, manifest_of
from ..model import BlobReference, Checkpoint, Entry, FileEntry, WriterLease, WriterLike
from ..validation import check_checkpoint_body, check_checkpoint_ids, check_id, utf8_key
from ._core import check_append_state, not_head, spent_ids
from ._options import (
    LeaseRecord,
    StoreOptions,
    audit_keys,
    blob_counts,
    check_fork_arguments,
    check_fork_source,
    check_hold_ms,
    check_instance_record,
    check_keep,
    check_pin_keys,
    check_thread_page,
    check_writer,
    checkpoint_blob_keys,
    condemnable_keys,
    destination_not_empty,
    fork_checkpoint,
    key_to_bytes,
    lease_holder,
    lease_is_current,
    list_order,
    may_take_over,
    new_owner_token,
    plan_prune,
    read_clock,
    renew_lost,
    validate_store_options,
    writer_conflict,
    writer_fields,
)
from ._packindex import artifact_twin, check_packed_blobs
from .base import (
    DEFAULT_LEASE_DURATION_MS,
    DEFAULT_RENEW_AFTER_MS,
    DEFAULT_THREAD_PAGE,
    BlobCount,
    Clock,
    InstanceRecord,
    PackedBlob,
    ThreadSummary,
)


@dataclass(frozen=True, slots=True)
class _Stored:
    checkpoint: Checkpoint  # conversation=() — the real one is in ``conversation_json``
    conversation_json: str
    keys: tuple[str, ...]


def _trusted_manifest(files: Sequence[Entry]) -> Manifest:
    """The validated entries as an immutable Manifest (bytes, decoded on demand)."""
    manifest = manifest_of(files)
    return (
        manifest
        if manifest.trusted
        else Manifest(manifest.data, length=len(manifest), trusted=True)
    )


def _freeze(checkpoint: Checkpoint) -> _Stored:
    conversation_json = json.dumps(
        list(checkpoint.conversation), ensure_ascii=False, allow_nan=False
    )
    frozen = dataclasses.replace(
        checkpoint,
        files=_trusted_manifest(checkpoint.files),
        artifacts=tuple(checkpoint.artifacts),
        conversation=(),
    )
    return _Stored(frozen, conversation_json, tuple(checkpoint_blob_keys(frozen)))


def _thaw(stored: _Stored) -> Checkpoint:
    return dataclasses.replace(
        stored.checkpoint, conversation=tuple(json.loads(stored.conversation_json))
    )


_LeaseId = tuple[str, str, int]  # (thread_id, owner_token, fence)


class InMemoryCheckpointStore:
    """A checkpoint store in process memory (tests, the daemon's ``memory://``).

    Options as SPEC §3: ``now`` (callable returning ms), ``lease_duration_ms``,
    ``renew_after_ms``; bad options raise SandboxCheckpointInvalidArgumentError.
    """

    def __init__(
        self,
        *,
        now: Clock | None = None,
        lease_duration_ms: int = DEFAULT_LEASE_DURATION_MS,
        renew_after_ms: int = DEFAULT_RENEW_AFTER_MS,
    ) -> None:
        self._options: StoreOptions = validate_store_options(now, lease_duration_ms, renew_after_ms)
        self._checkpoints: dict[str, _Stored] = {}
        self._threads: dict[str, dict[str, None]] = {}  # thread -> its checkpoint ids
        self._heads: dict[str, str] = {}
        self._leases: dict[str, LeaseRecord] = {}
        self._fences: dict[str, int] = {}  # last fence handed out per thread
        self._references: dict[str, int] = {}
        self._pins: dict[str, set[_LeaseId]] = {}  # key -> leases pinning it
        self._pins_by_lease: dict[_LeaseId, set[str]] = {}
        self._condemned: dict[str, int] = {}  # key -> condemned until (ms)
        self._missing: set[str] = set()  # keys ``check`` found gone from the bucket
        self._spent: set[str] = set()  # deleted request_id checkpoints (``_core``)
        self._packed: dict[str, PackedBlob] = {}  # the pack index (store.base.PackIndex)
        self._retired_packs: dict[str, int] = {}  # pack -> retired until (ms)
        self._closed = False

    @property
    def lease_duration_ms(self) -> int:
        return self._options.lease_duration_ms

    @property
    def renew_after_ms(self) -> int:
        return self._options.renew_after_ms

    # ------------------------------------------------------------------ lifecycle

    async def aclose(self) -> None:
        self._closed = True

    async def __aenter__(self) -> InMemoryCheckpointStore:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxCheckpointError("the checkpoint store is closed", code=STORE_UNAVAILABLE)

    def _now(self) -> int:
        return read_clock(self._options)

    # ------------------------------------------------------------------ reads

    async def get(self, checkpoint_id: str) -> Checkpoint | None:
        """The checkpoint or None (a missing id never raises; an invalid one is INVALID_ID)."""
        self._check_open()
        check_id(checkpoint_id, "checkpoint id")
        stored = self._checkpoints.get(checkpoint_id)
        return None if stored is None else _thaw(stored)

    async def list(self, thread_id: str) -> builtins.list[Checkpoint]:
        """Every checkpoint of the thread by created_at, then UTF-8 bytes of the id."""
        self._check_open()
        check_id(thread_id, "thread id")
        stored = [self._checkpoints[i] for i in self._threads.get(thread_id, ())]
        stored.sort(key=lambda s: list_order(s.checkpoint.created_at, s.checkpoint.id))
        return [_thaw(s) for s in stored]

    async def get_head(self, thread_id: str) -> str | None:
        self._check_open()
        check_id(thread_id, "thread id")
        return self._heads.get(thread_id)

    async def list_threads(
        self, *, after: str | None = None, limit: int = DEFAULT_THREAD_PAGE
    ) -> builtins.list[ThreadSummary]:
        """See ``base.ThreadListing``."""
        self._check_open()
        after, limit = check_thread_page(after, limit)
        names = sorted(self._threads, key=utf8_key)
        if after is not None:
            names = [name for name in names if utf8_key(name) > utf8_key(after)]
        return [
            ThreadSummary(
                thread_id=name,
                head_checkpoint_id=self._heads.get(name),
                checkpoint_count=len(self._threads[name]),
                newest_created_at=max(
                    self._checkpoints[i].checkpoint.created_at for i in self._threads[name]
                ),
            )
            for name in names[:limit]
        ]

    async def spent_checkpoint_ids(self, checkpoint_ids: builtins.list[str]) -> builtins.list[str]:
        """Which of these ids belonged to deleted request_id checkpoints (``_core``)."""
        self._check_open()
        return [i for i in dict.fromkeys(checkpoint_ids) if i in self._spent]

    async def locate_blobs(self, keys: builtins.list[str]) -> dict[str, PackedBlob | None]:
        """See ``store.base.PackIndex``."""
        self._check_open()
        found: dict[str, PackedBlob | None] = {}
        for key in keys:
            row = self._packed.get(key)
            if row is not None:
                found[key] = row
            elif self._references.get(key, 0) > 0:
                found[key] = None
        return found

    async def list_packed_blobs(
        self, *, after: str | None = None, limit: int = 1000
    ) -> builtins.list[PackedBlob]:
        """See ``store.base.PackIndex``."""
        self._check_open()
        keys = sorted(key for key in self._packed if after is None or key > after)
        return [self._packed[key] for key in keys[: max(limit, 0)]]

    async def drop_packed_blobs(self, rows: builtins.list[PackedBlob]) -> builtins.list[str]:
        """See ``store.base.PackMaintenance``."""
        self._check_open()
        now = self._now()
        dropped: builtins.list[str] = []
        for row in check_packed_blobs(rows, None):
            if (
                self._packed.get(row.key) == row
                and self._live_condemned(row.key, now)
                and self._references.get(row.key, 0) <= 0
                and self._references.get(artifact_twin(row.key), 0) <= 0
            ):
                del self._packed[row.key]
                dropped.append(row.key)
        return dropped

    async def switch_packed_blobs(
        self, old_pack: str, rows: builtins.list[PackedBlob]
    ) -> builtins.list[str]:
        """See ``store.base.PackMaintenance``."""
        self._check_open()
        switched: builtins.list[str] = []
        for row in check_packed_blobs(rows, None):
            current = self._packed.get(row.key)
            if (
                current is not None
                and current.pack == old_pack
                and row.pack != old_pack
                and not self._pack_retired(row.pack)
            ):
                self._packed[row.key] = row
                switched.append(row.key)
        return switched

    def _pack_retired(self, pack: str) -> bool:
        return self._retired_packs.get(pack, 0) > self._now()

    async def retire_pack(self, pack: str, hold_ms: int) -> bool:
        """See ``store.base.PackMaintenance``."""
        self._check_open()
        hold = check_hold_ms(hold_ms)
        if any(row.pack == pack for row in self._packed.values()):
            return False
        self._retired_packs[pack] = self._now() + hold
        return True

    async def forget_lost_packed_blobs(self, rows: builtins.list[PackedBlob]) -> builtins.list[str]:
        """See ``store.base.PackMaintenance``."""
        self._check_open()
        gone: builtins.list[str] = []
        for row in check_packed_blobs(rows, None):
            current = self._packed.get(row.key)
            if current is not None and (current.pack, current.offset) == (row.pack, row.offset):
                del self._packed[row.key]
                gone.append(row.key)
        self._missing.update(gone)
        return sorted(gone)

    async def add_packed_blobs(self, rows: builtins.list[PackedBlob]) -> builtins.list[str]:
        """See ``store.base.PackMaintenance``."""
        self._check_open()
        added: builtins.list[str] = []
        for row in check_packed_blobs(rows, None):
            if row.key not in self._packed and self._references.get(row.key, 0) > 0:
                self._packed[row.key] = row
                added.append(row.key)
        return added

    async def list_blob_references(self) -> builtins.list[BlobReference]:
        self._check_open()
        return [
            BlobReference(key, count)
            for key, count in sorted(self._references.items(), key=lambda kv: utf8_key(kv[0]))
            if count > 0
        ]

    # ------------------------------------------------------------------ writes

    def _lease(self, thread_id: str) -> LeaseRecord | None:
        return self._leases.get(thread_id)

    async def append(
        self,
        checkpoint: Checkpoint,
        expected_head_id: str | None,
        writer: WriterLike,
        *,
        packed_blobs: Sequence[PackedBlob] = (),
    ) -> str:
        """Publish ``checkpoint`` as the new head (SPEC §3 check order 1–6);
        ``packed_blobs``: pack index rows for keys it references (PackIndex)."""
        self._check_open()
        check_checkpoint_ids(checkpoint, expected_head_id)
        check_checkpoint_body(checkpoint)
        thread_id = checkpoint.thread_id
        check_append_state(
            checkpoint,
            expected_head_id,
            writer,
            lease=self._lease(thread_id),
            now=self._now(),
            id_used=self._id_used(checkpoint.id),
            head_id=self._heads.get(thread_id),
        )
        stored = _freeze(checkpoint)
        used = set(stored.keys) if packed_blobs else set()
        # One row serves a digest's file and artifact keys (_packindex.row_key).
        rows = (
            check_packed_blobs(packed_blobs, lambda key: key in used or artifact_twin(key) in used)
            if packed_blobs
            else []
        )
        self._publish(stored)
        for row in rows:
            self._packed[row.key] = row  # the newest upload of the key wins
        return checkpoint.id

    def _id_used(self, checkpoint_id: str) -> bool:
        return checkpoint_id in self._checkpoints or checkpoint_id in self._spent

    def _publish(self, stored: _Stored) -> None:
        checkpoint = stored.checkpoint
        self._checkpoints[checkpoint.id] = stored
        self._threads.setdefault(checkpoint.thread_id, {})[checkpoint.id] = None
        self._heads[checkpoint.thread_id] = checkpoint.id
        for key in stored.keys:
            self._references[key] = self._references.get(key, 0) + 1

    def _forget(self, checkpoint_id: str) -> None:
        stored = self._checkpoints.pop(checkpoint_id)
        thread = self._threads[stored.checkpoint.thread_id]
        del thread[checkpoint_id]
        if not thread:
            del self._threads[stored.checkpoint.thread_id]
        for key in stored.keys:
            count = self._references.get(key, 0) - 1
            if count > 0:
                self._references[key] = count
            else:
                self._references.pop(key, None)

    async def delete_head(self, thread_id: str, checkpoint_id: str, writer: WriterLike) -> None:
        """Remove the head; the head moves to its parent (None when the parent is gone)."""
        self._check_open()
        check_id(thread_id, "thread id")
        check_id(checkpoint_id, "checkpoint id")
        check_writer(writer, thread_id, self._lease(thread_id), self._now())
        if self._heads.get(thread_id) != checkpoint_id:
            raise not_head(thread_id, checkpoint_id)
        parent = self._checkpoints[checkpoint_id].checkpoint.parent_checkpoint_id
        self._forget(checkpoint_id)
        self._spent.update(spent_ids([checkpoint_id]))
        if parent is not None and parent in self._threads.get(thread_id, {}):
            self._heads[thread_id] = parent
        else:
            del self._heads[thread_id]

    async def delete_checkpoints(
        self, thread_id: str, keep: int, writer: WriterLike
    ) -> builtins.list[str]:
        """Keep the head and its ``keep - 1`` nearest ancestors; delete the rest.

        Returns the deleted ids in list order.
        """
        self._check_open()
        check_id(thread_id, "thread id")
        check_keep(keep)
        check_writer(writer, thread_id, self._lease(thread_id), self._now())
        ids = self._threads.get(thread_id, {})
        pairs = [(i, self._checkpoints[i].checkpoint.parent_checkpoint_id) for i in ids]
        doomed = plan_prune(pairs, self._heads.get(thread_id), keep)
        ordered = sorted(
            (self._checkpoints[i].checkpoint for i in doomed),
            key=lambda c: list_order(c.created_at, c.id),
        )
        for checkpoint in ordered:
            self._forget(checkpoint.id)
        self._spent.update(spent_ids(c.id for c in ordered))
        return [c.id for c in ordered]

    async def fork_from_checkpoint(
        self,
        source_thread_id: str,
        source_checkpoint_id: str,
        destination_thread_id: str,
        destination_checkpoint_id: str,
        created_at: int,
        writer: WriterLike,
    ) -> Checkpoint:
        """Copy a checkpoint into a new root of an empty thread (SPEC §3 fork checks)."""
        self._check_open()
        check_fork_arguments(
            source_thread_id,
            source_checkpoint_id,
            destination_thread_id,
            destination_checkpoint_id,
            created_at,
        )
        stored = self._checkpoints.get(source_checkpoint_id)
        check_fork_source(
            None if stored is None else stored.checkpoint.thread_id,
            source_thread_id,
            source_checkpoint_id,
        )
        assert stored is not None
        check_writer(writer, destination_thread_id, self._lease(destination_thread_id), self._now())
        if self._threads.get(destination_thread_id) or destination_thread_id in self._heads:
            raise destination_not_empty(
                destination_thread_id, destination_checkpoint_id, "the thread has checkpoints"
            )
        if self._id_used(destination_checkpoint_id):
            raise destination_not_empty(
                destination_thread_id, destination_checkpoint_id, "the id is already used"
            )
        root = fork_checkpoint(
            _thaw(stored), destination_thread_id, destination_checkpoint_id, created_at
        )
        self._publish(_freeze(root))
        return _thaw(self._checkpoints[root.id])

    # ------------------------------------------------------------------ leases

    async def acquire_writer(self, thread_id: str, *, owner: str | None = None) -> WriterLease:
        """Take the thread's writer lease without waiting.

        A live lease raises WRITER_CONFLICT (with ``expires_at_ms`` and
        ``retry_after_ms`` in its details) unless ``owner`` acquired it: the same
        owner takes it back with a new fence, and the old writer is lost.
        """
        self._check_open()
        check_id(thread_id, "thread id")
        holder = lease_holder(owner)
        now = self._now()
        record = self._leases.get(thread_id)
        if not may_take_over(record, holder, now):
            assert record is not None
            raise writer_conflict(thread_id, record, now)
        if record is not None:
            self._drop_pins((thread_id, record.owner_token, record.fence))
        fence = self._fences.get(thread_id, 0) + 1
        self._fences[thread_id] = fence
        record = LeaseRecord(
            new_owner_token(), fence, now + self._options.lease_duration_ms, holder
        )
        self._leases[thread_id] = record
        return WriterLease(
            thread_id=thread_id,
            owner_token=record.owner_token,
            fence=fence,
            expires_at=record.expires_at,
            renew_after_ms=self._options.renew_after_ms,
            renew=self._renew,
            release=self._release,
        )

    async def _renew(self, lease: WriterLease) -> int:
        self._check_open()
        thread_id, token, fence = writer_fields(lease)
        now = self._now()
        record = self._leases.get(thread_id)
        if not lease_is_current(record, token, fence, now):
            raise renew_lost(thread_id, fence, record, now)
        assert record is not None
        expires_at = now + self._options.lease_duration_ms
        self._leases[thread_id] = dataclasses.replace(record, expires_at=expires_at)
        return expires_at

    async def _release(self, lease: WriterLease) -> None:
        if self._closed:
            return
        thread_id, token, fence = writer_fields(lease)
        record = self._leases.get(thread_id)
        if record is not None and record.owner_token == token and record.fence == fence:
            del self._leases[thread_id]
        self._drop_pins((thread_id, token, fence))

    # ------------------------------------------------------------------ blob guard

    def _drop_pins(self, lease_id: _LeaseId) -> None:
        for key in self._pins_by_lease.pop(lease_id, ()):
            holders = self._pins.get(key)
            if holders is not None:
                holders.discard(lease_id)
                if not holders:
                    del self._pins[key]

    def _live_pin(self, key: str, now: int) -> bool:
        for thread_id, token, fence in self._pins.get(key, ()):
            if lease_is_current(self._leases.get(thread_id), token, fence, now):
                return True
        return False

    def _live_condemned(self, key: str, now: int) -> bool:
        until = self._condemned.get(key)
        return until is not None and now < until

    async def pin_blobs(self, keys: builtins.list[str], writer: WriterLike) -> builtins.list[str]:
        """Pin ``keys`` for the writer's lease; returns those condemned right now."""
        self._check_open()
        thread_id, token, fence = writer_fields(writer)
        now = self._now()
        check_writer(writer, thread_id, self._lease(thread_id), now)
        wanted = check_pin_keys(keys)
        lease_id = (thread_id, token, fence)
        mine = self._pins_by_lease.setdefault(lease_id, set())
        for key in wanted:
            mine.add(key)
            self._pins.setdefault(key, set()).add(lease_id)
        return [key for key in wanted if self._live_condemned(key, now)]

    async def condemn_blobs(self, keys: builtins.list[str], hold_ms: int) -> builtins.list[str]:
        """Condemn unreferenced, unpinned, not-yet-condemned keys until now + hold_ms."""
        return self._condemn(keys, hold_ms, referenced_too=False)

    async def condemn_unpinned_blobs(
        self, keys: builtins.list[str], hold_ms: int
    ) -> builtins.list[str]:
        """See ``base.PackMaintenance``: as condemn_blobs, references aside."""
        return self._condemn(keys, hold_ms, referenced_too=True)

    def _condemn(
        self, keys: builtins.list[str], hold_ms: int, *, referenced_too: bool
    ) -> builtins.list[str]:
        self._check_open()
        hold = check_hold_ms(hold_ms)
        candidates = condemnable_keys(keys)
        now = self._now()
        condemned: builtins.list[str] = []
        for key in candidates:
            if not referenced_too and self._references.get(key, 0) > 0:
                continue
            if self._live_pin(key, now) or self._live_condemned(key, now):
                continue
            self._condemned[key] = now + hold
            condemned.append(key)
        return condemned

    async def release_condemned(self, keys: builtins.list[str]) -> None:
        self._check_open()
        for key in keys:
            self._condemned.pop(key, None)

    # ------------------------------------------------------------------ blob audit

    async def audit_blob_references(self, *, with_sizes: bool = False) -> builtins.list[BlobCount]:
        """Stored counts beside the counts the manifests give (BlobAudit)."""
        self._check_open()
        manifests: dict[bytes, int] = {}
        sizes: dict[bytes, int] = {}
        for stored in self._checkpoints.values():
            for key in stored.keys:
                raw = key_to_bytes(key)
                manifests[raw] = manifests.get(raw, 0) + 1
            if with_sizes:
                for key, size in _key_sizes(stored.checkpoint).items():
                    sizes.setdefault(key_to_bytes(key), size)
        counts = {key_to_bytes(key): n for key, n in self._references.items()}
        return blob_counts(counts, manifests, sizes)

    async def repair_blob_references(self) -> builtins.list[BlobCount]:
        """Set every count to the manifests' (atomic: no await in between)."""
        wrong = [count for count in await self.audit_blob_references() if not count.agrees]
        for count in wrong:
            if count.manifests:
                self._references[count.key] = count.manifests
            else:
                self._references.pop(count.key, None)
        return wrong

    async def mark_blobs_missing(self, keys: builtins.list[str]) -> None:
        self._check_open()
        self._missing.update(audit_keys(keys))

    async def clear_missing_blobs(self, keys: builtins.list[str]) -> None:
        self._check_open()
        self._missing.difference_update(audit_keys(keys))

    async def list_missing_blobs(self) -> builtins.list[str]:
        self._check_open()
        return sorted(self._missing, key=utf8_key)


def _key_sizes(checkpoint: Checkpoint) -> dict[str, int]:
    """The checkpoint's distinct blob keys with the size its entries give them."""
    sizes = {
        entry.blob_key: entry.size for entry in checkpoint.files if isinstance(entry, FileEntry)
    }
    sizes.update((artifact.blob_key, artifact.size) for artifact in checkpoint.artifacts)
    return sizes


class InMemoryInstanceStore:
    """Instance records in process memory (SPEC §3 instance store)."""

    def __init__(self) -> None:
        self._records: dict[str, InstanceRecord] = {}

    async def get(self, key: str) -> InstanceRecord | None:
        """The record or None; an invalid key is INVALID_ID."""
        check_id(key, "instance key")
        return self._records.get(key)

    async def upsert(self, record: InstanceRecord) -> None:
        """Replace the whole record (optional fields left out are cleared)."""
        # InstanceRecord is frozen; the validated copy keeps a subclass out.
        checked = check_instance_record(record)
        self._records[checked.key] = checked

    async def delete(self, key: str) -> None:
        """Forget the key; a missing key is not an error."""
        check_id(key, "instance key")
        self._records.pop(key, None)

    async def aclose(self) -> None:
        pass

    async def __aenter__(self) -> InMemoryInstanceStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
