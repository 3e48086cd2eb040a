"""``SqlCheckpointStore``: the docs/contract.md#checkpoint-store writes, leases, pins and missing
marks the SQL checkpoint stores share, over a dialect's ``WriteTx`` (see ``_core``)."""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..errors import NO_SPACE, SandboxCheckpointDamagedError, SandboxCheckpointError
from ..manifest import ManifestSummary
from ..model import Checkpoint, WriterLease, WriterLike
from ..validation import check_checkpoint_body, check_checkpoint_ids, check_id
from . import _documents as documents
from ._keysets import (
    OFFLOAD_ENTRIES,
    KeySet,
    RecentContents,
    Rows,
    content_size,
    count_change,
    offload,
    packed_rows,
    paused,
)
from ._options import (
    LeaseRecord,
    StoreOptions,
    audit_keys,
    check_fork_arguments,
    check_fork_source,
    check_keep,
    check_pin_keys,
    check_writer,
    condemnable_keys,
    destination_not_empty,
    key_to_bytes,
    lease_holder,
    lease_is_current,
    list_order,
    may_take_over,
    new_owner_token,
    plan_prune,
    renew_lost,
    writer_conflict,
    writer_fields,
)
from ._writetx import (
    IdTaken,
    WriteTx,
    check_append_state,
    duplicate_id,
    not_head,
    spent_ids,
)

T = TypeVar("T")


# ------------------------------------------------------------------------ the store


@dataclass
class _Loaded:
    """Contents materialized in one transaction (rows + memo for deltas)."""

    rows: Rows = field(default_factory=dict)
    memo: dict[str, documents.Content] = field(default_factory=dict)


class SqlCheckpointStore:
    """The docs/contract.md#checkpoint-store writes of a SQL checkpoint store, its leases, pins and missing
    marks; a dialect subclasses it and provides ``_options``, ``_recent``,
    ``_write`` and ``_is_closed`` (and its own reads, ``_condemn`` and the
    audit, whose SQL is the whole of their logic)."""

    _options: StoreOptions
    _recent: RecentContents

    @property
    def lease_duration_ms(self) -> int:
        return self._options.lease_duration_ms

    @property
    def renew_after_ms(self) -> int:
        return self._options.renew_after_ms

    async def _write(self, operation: str, body: Callable[[WriteTx], Awaitable[T]]) -> T:
        raise NotImplementedError

    def _is_closed(self) -> bool:
        raise NotImplementedError

    async def _row_version(self, checkpoint_id: str) -> int | None:
        """The stored row's version (None: no such row)."""
        raise NotImplementedError

    async def _read_chain(self, checkpoint_id: str) -> tuple[int, Rows] | None:
        """The row's version and the rows of it and its bases down to a
        keyframe, read together (None: no such row)."""
        raise NotImplementedError

    async def get(self, checkpoint_id: str) -> Checkpoint | None:
        """The checkpoint or None (a missing id never raises; an invalid one is
        INVALID_ID). Its content comes from the store's cache when that holds
        its current row, and is kept there like an appended one: the head a
        capture reads is the parent its append diffs against next."""
        check_id(checkpoint_id, "checkpoint id")
        version = await self._row_version(checkpoint_id)
        if version is None:
            return None
        content = self._recent.get(checkpoint_id, version)
        if content is None:
            read = await self._read_chain(checkpoint_id)
            if read is None:  # deleted since the version was read
                return None
            version, rows = read
            content = await offload(
                sum(len(data) for _, data in rows.values()) // 16,
                documents.materialize,
                checkpoint_id,
                rows,
                {},
            )
            self._recent.put(checkpoint_id, version, content)
        return await offload(content_size(content), content.checkpoint)

    async def cached_manifest_summary(self, checkpoint_id: str) -> ManifestSummary | None:
        """The manifest summary of a stored checkpoint when this store's cache
        holds its current row's content (one small read of the row's version,
        no document read), else None: ask ``get``. A capture compares its scan
        with this before it needs the parent itself."""
        version = await self._row_version(checkpoint_id)
        if version is None:
            return None
        content = self._recent.get(checkpoint_id, version, summary_will_do=True)
        return None if content is None else content.manifest.known_summary()

    async def _content(
        self, tx: WriteTx, checkpoint_id: str, version: int, *, summary_will_do: bool = False
    ) -> documents.Content:
        """The content of a stored checkpoint (cached by its row version; see
        ``RecentContents.get`` for ``summary_will_do``)."""
        content = self._recent.get(checkpoint_id, version, summary_will_do=summary_will_do)
        if content is None:
            rows: Rows = {}
            await tx.fetch_chains([checkpoint_id], rows)
            content = await asyncio.to_thread(
                paused, documents.materialize, checkpoint_id, rows, {}
            )
            self._recent.put(checkpoint_id, version, content)
        return content

    async def _cached_keys(self, tx: WriteTx, checkpoint_id: str | None) -> KeySet | None:
        """A stored checkpoint's keys when this store's cache knows them
        without reading its document (the head an append just wrote), else None."""
        row = None if checkpoint_id is None else await tx.row(checkpoint_id)
        if checkpoint_id is None or row is None:
            return None
        content = self._recent.get(checkpoint_id, row.version, summary_will_do=True)
        digests = None if content is None else content.manifest.known_digests()
        if content is None or digests is None:
            return None
        return KeySet(digests, tuple(sorted(content.artifact_keys())))

    async def _content_or_none(
        self, tx: WriteTx, checkpoint_id: str, version: int
    ) -> documents.Content | None:
        """``_content`` with its keys at hand, or None when it is damaged."""
        try:
            content = await self._content(tx, checkpoint_id, version)
            await offload(content_size(content), content.digests)
        except SandboxCheckpointDamagedError:
            return None
        return content

    async def _readable_parent(
        self, tx: WriteTx, parent_id: str, version: int, content: documents.Content
    ) -> documents.Content | None:
        """The parent an append diffs against (its summary alone when that
        will do), or None when it is damaged: the thread goes on with a
        keyframe rather than a delta on a row nobody can read."""
        try:
            parent = await self._content(tx, parent_id, version, summary_will_do=True)
            if (
                documents.is_summary_only(parent)
                and not content.manifest.same_bytes(parent.manifest)
                and documents.needs_parent_bytes(content, parent)
            ):
                # Not the parent's files: the delta needs the parent's bytes.
                parent = await self._content(tx, parent_id, version)
            if not content.manifest.same_bytes(parent.manifest):
                # An older row's manifest inflates here (a newer one's checksum
                # was checked as it was read), not in the delta or the diff.
                await offload(content_size(parent), parent.digests)
        except SandboxCheckpointDamagedError:
            return None
        return parent

    async def _rewrite_dependents(
        self, tx: WriteTx, removed: Sequence[str], loaded: _Loaded
    ) -> None:
        """Store every remaining checkpoint whose base is in ``removed`` as a
        keyframe, so no delta names a lost base. ``loaded`` must still hold the
        removed checkpoints' rows."""
        for dependent_id, row in (await tx.dependents(removed)).items():
            loaded.rows[dependent_id] = row
            try:
                content = await asyncio.to_thread(
                    paused, documents.materialize, dependent_id, loaded.rows, loaded.memo
                )
            except SandboxCheckpointDamagedError:
                # Unreadable already (it or its base is damaged): it stays as
                # it is, and reads go on saying so. Nothing else can be saved.
                continue
            stored = await offload(content_size(content), documents.keyframe, content)
            await tx.rewrite_keyframe(dependent_id, stored.data)

    # ------------------------------------------------------------------ append

    async def append(
        self,
        checkpoint: Checkpoint,
        expected_head_id: str | None,
        writer: WriterLike,
        *,
        packed_blobs: Sequence[Any] = (),
    ) -> str:
        """Publish ``checkpoint`` as the new head (docs/contract.md#checkpoint-store check order 1–6), in one
        transaction with its counts (and ``packed_blobs``, the pack index rows of
        its keys). Raises InvalidId, InvalidEntry, WriterLost, DuplicateId,
        Conflict (STALE_HEAD), ParentMismatch in that order; nothing changes when
        it raises."""
        check_checkpoint_ids(checkpoint, expected_head_id)
        check_checkpoint_body(checkpoint)
        writer_fields(writer)
        thread_id = checkpoint.thread_id
        content = await offload(len(checkpoint.files), documents.Content.of, checkpoint)
        # Rows for keys this checkpoint references, checked (INVALID_ENTRY).
        packed = packed_rows(packed_blobs, content) if packed_blobs else []
        # A checkpoint with no parent is a keyframe whatever the transaction
        # finds, so a large one is encoded in a worker thread while the
        # transaction writes its index rows (a cold capture: ~0.15 s of zlib
        # beside ~0.2 s of SQL for 100,000 files, on two cores at once).
        early: asyncio.Future[documents.Stored] | None = None
        if expected_head_id is None and content_size(content) > OFFLOAD_ENTRIES:
            early = asyncio.ensure_future(
                offload(content_size(content), documents.keyframe, content)
            )

        async def body(tx: WriteTx) -> tuple[int, documents.Stored]:
            state = await tx.lock_thread(thread_id)
            facts = await tx.append_facts(checkpoint.id, expected_head_id)
            check_append_state(checkpoint, expected_head_id, writer, state, facts)
            parent: documents.Content | None = None
            depth = 0
            if expected_head_id is not None:
                row = facts.head_row
                assert row is not None, "a head always names a stored checkpoint"
                parent = await self._readable_parent(tx, expected_head_id, row.version, content)
                depth = row.depth
                if parent is None:
                    # A damaged head: its keys are unknown, so every run of the
                    # thread ends at the old ordinal (each count stays what it
                    # was) and this checkpoint, a keyframe, opens its own.
                    await tx.close_all_runs(thread_id, state.ordinal)
            if packed:
                # Before the document (the same transaction either way): the
                # early keyframe encodes meanwhile.
                await tx.index_packed_blobs(packed)
            stored = await _encoded(content, early, expected_head_id, parent, depth)
            change = await offload(
                content_size(content), count_change, parent, content, state.ordinal
            )
            try:
                version = await tx.publish(content, stored, change)
            except IdTaken:
                raise duplicate_id(checkpoint.id) from None
            return version, stored

        try:
            version, stored = await self._write("append", body)
        finally:
            if early is not None and not early.cancel() and not early.cancelled():
                # Done: a failed append leaves no unretrieved error behind.
                early.exception()
        # (A keyframe is kept over its row: the caller keeps the manifest it gave.)
        self._recent.put(checkpoint.id, version, documents.unloaded(content, stored))
        return checkpoint.id

    # ------------------------------------------------------------------ delete_head

    async def delete_head(self, thread_id: str, checkpoint_id: str, writer: WriterLike) -> None:
        """Remove the head; the head moves to its parent (None when the parent is
        gone). Raises InvalidId, WriterLost, NotHead (in that order)."""
        check_id(thread_id, "thread id")
        check_id(checkpoint_id, "checkpoint id")
        writer_fields(writer)

        async def body(tx: WriteTx) -> None:
            state = await tx.lock_thread(thread_id)
            check_writer(writer, thread_id, state.lease, await tx.now())
            if state.head_id != checkpoint_id:
                raise not_head(thread_id, checkpoint_id)
            row = await tx.row(checkpoint_id)
            assert row is not None, "a head always names a stored checkpoint"
            # Either may be damaged (None here): the head still goes, and the
            # thread's head moves to the parent while it is stored.
            head = await self._content_or_none(tx, checkpoint_id, row.version)
            parent_row = None if row.parent_id is None else await tx.row(row.parent_id)
            if parent_row is not None and parent_row.thread_id != thread_id:
                parent_row = None
            parent = (
                None
                if parent_row is None or row.parent_id is None
                else await self._content_or_none(tx, row.parent_id, parent_row.version)
            )
            new_head = None if parent_row is None else row.parent_id
            loaded = _Loaded()
            if head is not None:
                loaded.memo[checkpoint_id] = head  # what its dependents (if any) are based on
            await tx.delete_rows([checkpoint_id])
            await self._rewrite_dependents(tx, [checkpoint_id], loaded)
            if head is None:
                # Its keys are unknown: every run of the thread ends one
                # ordinal back (each key the head used is counted once less),
                # and a readable parent opens runs for its own keys.
                await tx.close_all_runs(thread_id, state.ordinal - 1)
                if parent is not None:
                    keys = KeySet.of_content(parent)
                    await tx.reopen_runs(thread_id, keys, state.ordinal - 1, state.ordinal - 1)
            elif parent is None:
                head_keys = KeySet.of_content(head)
                await tx.drop_runs(thread_id, head_keys, state.ordinal)
                await tx.close_all_runs(thread_id, state.ordinal)
                await tx.forget_zero_counts(thread_id, head_keys)
            else:
                head_keys, parent_keys = KeySet.of_content(head), KeySet.of_content(parent)
                dropped = head_keys.minus(parent_keys)
                await tx.drop_runs(thread_id, dropped, state.ordinal)
                await tx.reopen_runs(
                    thread_id, parent_keys.minus(head_keys), state.ordinal, state.ordinal - 1
                )
                await tx.forget_zero_counts(thread_id, dropped)
            await tx.set_head(thread_id, new_head, state.ordinal - 1)
            await tx.mark_spent(spent_ids([checkpoint_id]))

        await self._write("delete_head", body)

    # ------------------------------------------------------------------ prune

    async def delete_checkpoints(
        self, thread_id: str, keep: int, writer: WriterLike
    ) -> builtins.list[str]:
        """Keep the head and its ``keep - 1`` nearest ancestors; delete the rest of
        the thread in one transaction. Returns the deleted ids in list order.
        Raises InvalidId, InvalidArgument (keep), WriterLost (in that order)."""
        check_id(thread_id, "thread id")
        check_keep(keep)
        writer_fields(writer)

        async def body(tx: WriteTx) -> builtins.list[str]:
            state = await tx.lock_thread(thread_id)
            check_writer(writer, thread_id, state.lease, await tx.now())
            kept, ordered = await _prune_plan(tx, thread_id, state.head_id, keep)
            if not ordered:
                return []
            loaded = _Loaded()
            loaded.rows.update(await tx.delete_rows(ordered))
            kept_bases = {b for b, _ in loaded.rows.values() if b is not None} - set(loaded.rows)
            await tx.fetch_chains(sorted(kept_bases), loaded.rows)

            def deleted_keys() -> builtins.list[KeySet]:
                """Each deleted checkpoint's distinct keys (natively, from its
                manifest's digests: no Python object per key)."""
                deleted: builtins.list[KeySet] = []
                for checkpoint_id in ordered:
                    try:
                        content = documents.materialize(checkpoint_id, loaded.rows, loaded.memo)
                        deleted.append(KeySet.of_content(content))
                    except SandboxCheckpointDamagedError:
                        # Its keys are unknown: their counts stay one too high
                        # (a sweep keeps them; `check --repair` sets them).
                        continue
                return deleted

            deleted = await asyncio.to_thread(paused, deleted_keys)
            await self._rewrite_dependents(tx, ordered, loaded)
            # Every kept checkpoint is on the head chain: ordinals ordinal-kept+1..ordinal.
            cutoff = state.ordinal - kept + 1
            await tx.subtract_counts(thread_id, deleted, cutoff)
            forgettable = KeySet.union(deleted)
            # A key the head still uses has an open run: its count is not zero.
            head_keys = await self._cached_keys(tx, state.head_id)
            if head_keys is not None:
                forgettable = forgettable.minus(head_keys)
            await tx.forget_zero_counts(thread_id, forgettable)
            await tx.mark_spent(spent_ids(ordered))
            return ordered

        return await self._write("delete_checkpoints", body)

    async def planned_prune(self, thread_id: str, keep: int) -> builtins.list[str]:
        """What ``delete_checkpoints(thread_id, keep, …)`` would delete now, in
        list order, from the rows' ids alone (no document is read: a damaged
        one is pruned like any other). A dry run of prune; it changes nothing."""
        check_id(thread_id, "thread id")
        check_keep(keep)

        async def body(tx: WriteTx) -> builtins.list[str]:
            state = await tx.lock_thread(thread_id)
            return (await _prune_plan(tx, thread_id, state.head_id, keep))[1]

        return await self._write("planned_prune", body)

    # ------------------------------------------------------------------ fork

    async def fork_from_checkpoint(
        self,
        source_thread_id: str,
        source_checkpoint_id: str,
        destination_thread_id: str,
        destination_checkpoint_id: str,
        created_at: int,
        writer: WriterLike,
    ) -> Checkpoint:
        """Copy a checkpoint into a new root of an empty thread (docs/contract.md#checkpoint-store fork
        checks, in order: ids, created_at, threads differ, source exists, source
        thread, writer, destination empty and id unused)."""
        check_fork_arguments(
            source_thread_id,
            source_checkpoint_id,
            destination_thread_id,
            destination_checkpoint_id,
            created_at,
        )

        async def body(tx: WriteTx) -> tuple[int, documents.Content]:
            # Lock order as everywhere: the (destination) thread first, then rows.
            state = await tx.lock_thread(destination_thread_id)
            source_row = await tx.fork_source(source_checkpoint_id)
            check_fork_source(
                None if source_row is None else source_row.thread_id,
                source_thread_id,
                source_checkpoint_id,
            )
            assert source_row is not None
            check_writer(writer, destination_thread_id, state.lease, await tx.now())
            if state.head_id is not None or await tx.thread_has_checkpoints(destination_thread_id):
                raise destination_not_empty(
                    destination_thread_id, destination_checkpoint_id, "the thread has checkpoints"
                )
            id_used = destination_not_empty(
                destination_thread_id, destination_checkpoint_id, "the id is already used"
            )
            if await tx.id_used(destination_checkpoint_id):
                raise id_used
            source = await self._content(tx, source_checkpoint_id, source_row.version)
            # The new root: the source's files, conversation and artifacts, how it
            # was taken and where it came from (``_options.fork_checkpoint``'s fields).
            root = documents.Content(
                {
                    **source.document,
                    "id": destination_checkpoint_id,
                    "thread_id": destination_thread_id,
                    "parent_checkpoint_id": None,
                    "created_at": created_at,
                    "reason": "fork-root",
                    "label": None,
                    "source_run_id": None,
                    "forked_from_thread_id": source_thread_id,
                    "forked_from_checkpoint_id": source_checkpoint_id,
                },
                source.manifest,
            )
            stored = await offload(content_size(root), documents.keyframe, root)
            change = count_change(None, root, state.ordinal)
            try:
                return await tx.publish(root, stored, change), root
            except IdTaken:
                raise id_used from None

        version, root = await self._write("fork_from_checkpoint", body)
        self._recent.put(destination_checkpoint_id, version, root)
        return await offload(content_size(root), root.checkpoint)

    # ------------------------------------------------------------------ leases

    async def acquire_writer(self, thread_id: str, *, owner: str | None = None) -> WriterLease:
        """Take the thread's writer lease without waiting.

        A live lease raises WRITER_CONFLICT (with ``expires_at_ms`` and
        ``retry_after_ms`` in its details) unless ``owner`` acquired it: the same
        owner takes it back with a new fence, and the old writer is lost.
        """
        check_id(thread_id, "thread id")
        holder = lease_holder(owner)

        async def body(tx: WriteTx) -> LeaseRecord:
            current, last_fence = await tx.lease_for_acquire(thread_id)
            now = await tx.now()
            if not may_take_over(current, holder, now):
                assert current is not None
                raise writer_conflict(thread_id, current, now)
            if current is not None:
                await tx.drop_pins(thread_id, current.owner_token, current.fence)
            record = LeaseRecord(
                new_owner_token(), last_fence + 1, now + self._options.lease_duration_ms, holder
            )
            await tx.write_lease(thread_id, record)
            return record

        record = await self._write("acquire_writer", body)
        return WriterLease(
            thread_id=thread_id,
            owner_token=record.owner_token,
            fence=record.fence,
            expires_at=record.expires_at,
            renew_after_ms=self._options.renew_after_ms,
            renew=self.renew_writer,
            release=self.release_writer,
        )

    async def renew_writer(self, lease: WriterLease) -> int:
        """Extend the lease by its fields (a gateway renews for its clients);
        returns the new expiry, or raises WriterLost when it is not current."""
        thread_id, token, fence = writer_fields(lease)

        async def body(tx: WriteTx) -> int:
            state = await tx.lock_thread(thread_id)
            now = await tx.now()
            if not lease_is_current(state.lease, token, fence, now):
                raise renew_lost(thread_id, fence, state.lease, now)
            expires_at = now + self._options.lease_duration_ms
            await tx.set_lease_expiry(thread_id, expires_at)
            return expires_at

        return await self._write("renew", body)

    async def release_writer(self, lease: WriterLease) -> None:
        """Remove the lease's own record and its pins; never raises on a closed store."""
        if self._is_closed():
            return
        thread_id, token, fence = writer_fields(lease)

        async def body(tx: WriteTx) -> None:
            await tx.remove_lease(thread_id, token, fence)
            await tx.drop_pins(thread_id, token, fence)

        try:
            await self._write("release", body)
        except SandboxCheckpointError as error:
            if error.code != NO_SPACE:
                raise
            # A full disk has no room for the delete of a cold capture's pins
            # (~100,000 rows): the thread is given back all the same (one small
            # row), and its pins stay behind, dead with their lease (a sweep
            # honours only the pins of a live lease).
            await self._write("release", lambda tx: tx.remove_lease(thread_id, token, fence))

    # ------------------------------------------------------------------ blob guard

    async def pin_blobs(self, keys: builtins.list[str], writer: WriterLike) -> builtins.list[str]:
        """Pin ``keys`` for the writer's lease (WRITER_LOST first when not current;
        INVALID_ENTRY for a bad key). Returns the keys condemned right now."""
        thread_id, token, fence = writer_fields(writer)

        async def body(tx: WriteTx) -> builtins.list[str]:
            state = await tx.lock_thread(thread_id)
            check_writer(writer, thread_id, state.lease, await tx.now())
            wanted = check_pin_keys(keys)
            if not wanted:
                return []
            binary = {key: key_to_bytes(key) for key in wanted}
            condemned = await tx.pin(thread_id, token, fence, sorted(set(binary.values())))
            return [key for key in wanted if binary[key] in condemned]

        return await self._write("pin_blobs", body)

    async def condemn_blobs(self, keys: builtins.list[str], hold_ms: int) -> builtins.list[str]:
        """Condemn each key with no reference, no live pin and no live
        condemnation, until now + hold_ms; returns the condemned keys in the
        given order. Keys of another shape are never condemned.

        Raises InvalidArgument (hold_ms, keys not a list), STORE_UNAVAILABLE.
        """
        return await self._condemn(keys, hold_ms, referenced_too=False)

    async def condemn_unpinned_blobs(
        self, keys: builtins.list[str], hold_ms: int
    ) -> builtins.list[str]:
        """See ``base.PackMaintenance``: as condemn_blobs, references aside."""
        return await self._condemn(keys, hold_ms, referenced_too=True)

    async def _condemn(
        self, keys: builtins.list[str], hold_ms: int, *, referenced_too: bool
    ) -> builtins.list[str]:
        """The dialect's condemnation (its SQL is the whole of its logic)."""
        raise NotImplementedError

    async def release_condemned(self, keys: builtins.list[str]) -> None:
        """Drop condemnations (after the sweep deleted or gave up on the keys)."""
        binary = sorted({key_to_bytes(key) for key in condemnable_keys(keys)})
        if binary:
            await self._write("release_condemned", lambda tx: tx.release_condemned(binary))

    # ------------------------------------------------------------------ missing marks

    async def mark_blobs_missing(self, keys: builtins.list[str]) -> None:
        """Record that these keys' blobs are gone (keys of another shape: ignored)."""
        binary = sorted({key_to_bytes(key) for key in audit_keys(keys)})

        async def body(tx: WriteTx) -> None:
            if binary:
                await tx.mark_missing(binary, await tx.now())

        await self._write("mark_blobs_missing", body)

    async def clear_missing_blobs(self, keys: builtins.list[str]) -> None:
        """Forget the marks of these keys (their blobs are back)."""
        binary = sorted({key_to_bytes(key) for key in audit_keys(keys)})
        if binary:
            await self._write("clear_missing_blobs", lambda tx: tx.clear_missing(binary))


async def _encoded(
    content: documents.Content,
    early: asyncio.Future[documents.Stored] | None,
    expected_head_id: str | None,
    parent: documents.Content | None,
    depth: int,
) -> documents.Stored:
    """The document an append stores: its early keyframe, a keyframe (no
    readable parent) or a delta on ``parent``."""
    if early is not None:
        return await asyncio.shield(early)  # a retried body awaits it again
    if parent is None:
        return await offload(content_size(content), documents.keyframe, content)
    return await offload(
        content_size(content), documents.encode, content, expected_head_id, parent, depth
    )


async def _prune_plan(
    tx: WriteTx, thread_id: str, head_id: str | None, keep: int
) -> tuple[int, builtins.list[str]]:
    """(how many checkpoints of the thread stay, the ids prune deletes in list
    order): the head and its ``keep - 1`` nearest ancestors stay."""
    listed = await tx.thread_checkpoints(thread_id)
    doomed = plan_prune([(i, p) for i, p, _ in listed], head_id, keep)
    ordered = [
        checkpoint_id
        for _, checkpoint_id in sorted(
            ((created_at, i) for i, _, created_at in listed if i in doomed),
            key=lambda pair: list_order(pair[0], pair[1]),
        )
    ]
    return len(listed) - len(doomed), ordered
