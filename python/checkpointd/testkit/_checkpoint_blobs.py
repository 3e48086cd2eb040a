"""The checkpoint-store suite's blob rules: one count per distinct key, the audit,
the missing marks and the blob guard (pins and condemnations)."""

from __future__ import annotations

import pytest

from ..errors import (
    SandboxCheckpointInvalidArgumentError,
    SandboxCheckpointInvalidEntryError,
    SandboxCheckpointWriterLostError,
)
from ..model import FILE_KEY_PREFIX, DirEntry, Writer
from ._checkpoint_world import SuiteBase, asyncio_test, utf8
from ._support import LEASE_DURATION_MS, artifact, artifact_key, checkpoint, fentry, file_key


class BlobRules(SuiteBase):
    """Blob counts, the audit, the missing marks and the blob guard."""

    # ================================================================ blob counts

    @asyncio_test
    async def test_one_count_per_distinct_key(self) -> None:
        async with self.world() as w:
            lease = await w.lease("t1")
            cp = checkpoint(
                "c1",
                "t1",
                files=[fentry("a", 1), fentry("b", 1), fentry("c", 2), DirEntry("d")],
                artifacts=[artifact("x", 1), artifact("y", 1)],
            )
            await w.add(cp, lease)
            refs = [(r.key, r.references) for r in await w.store.list_blob_references()]
            assert refs == [(artifact_key(1), 1), (file_key(1), 1), (file_key(2), 1)]

    @asyncio_test
    async def test_shared_keys_across_checkpoints_and_threads(self) -> None:
        async with self.world() as w:
            l1, l2 = await w.lease("t1"), await w.lease("t2")
            await w.add(checkpoint("c1", "t1", files=[fentry("a", 1), fentry("b", 2)]), l1)
            await w.add(checkpoint("c2", "t1", "c1", 2, files=[fentry("a", 1), fentry("c", 3)]), l1)
            await w.add(checkpoint("d1", "t2", files=[fentry("z", 1)]), l2)

            async def refs() -> dict[str, int]:
                return {r.key: r.references for r in await w.store.list_blob_references()}

            assert await refs() == {file_key(1): 3, file_key(2): 1, file_key(3): 1}
            await w.store.delete_head("t1", "c2", l1)
            assert await refs() == {file_key(1): 2, file_key(2): 1}
            await w.store.delete_head("t2", "d1", l2)
            assert await refs() == {file_key(1): 1, file_key(2): 1}
            await w.store.delete_head("t1", "c1", l1)
            assert await refs() == {}
            assert list(await w.store.list_blob_references()) == []

    # ================================================================ blob audit

    @asyncio_test
    async def test_audit_counts_keys_from_the_manifests(self) -> None:
        async with self.world() as w:
            self.need(w.store, "audit_blob_references", "repair_blob_references")
            assert list(await w.store.audit_blob_references()) == []
            lease = await w.lease("t1")
            await w.chain("t1", ["c1", "c2", "c3"], lease)
            other = await w.lease("t2")
            await w.add(
                checkpoint(
                    "d1",
                    "t2",
                    files=[fentry("x", 1000), fentry("y", 1000)],
                    artifacts=[artifact("art-1", 7)],
                ),
                other,
            )
            audit = {c.key: c for c in await w.store.audit_blob_references(with_sizes=True)}
            assert list(audit) == sorted(audit, key=utf8)
            assert (audit[file_key(1000)].stored, audit[file_key(1000)].manifests) == (4, 4)
            assert audit[file_key(1000)].size == 3
            for n in (1, 2, 3):
                assert (audit[file_key(n)].stored, audit[file_key(n)].manifests) == (1, 1)
            assert (audit[artifact_key(7)].manifests, audit[artifact_key(7)].size) == (1, 5)
            assert all(c.agrees for c in audit.values())
            references = {(r.key, r.references) for r in await w.store.list_blob_references()}
            assert references == {(c.key, c.stored) for c in audit.values()}
            await w.store.delete_head("t1", "c3", lease)
            after = {c.key: c for c in await w.store.audit_blob_references()}
            assert file_key(3) not in after
            assert after[file_key(1000)].manifests == 3
            # A store whose counts agree has nothing to repair.
            before = await w.snapshot()
            assert list(await w.store.repair_blob_references()) == []
            assert await w.snapshot() == before

    @asyncio_test
    async def test_missing_marks(self) -> None:
        async with self.world() as w:
            self.need(w.store, "mark_blobs_missing", "clear_missing_blobs", "list_missing_blobs")
            assert list(await w.store.list_missing_blobs()) == []
            keys = [file_key(2), artifact_key(1), file_key(1)]
            await w.store.mark_blobs_missing([*keys, "not-a-key", file_key(2)])
            assert list(await w.store.list_missing_blobs()) == sorted(keys, key=utf8)
            await w.store.mark_blobs_missing([file_key(1)])  # idempotent
            await w.store.clear_missing_blobs([file_key(1), file_key(99), "not-a-key"])
            assert list(await w.store.list_missing_blobs()) == [artifact_key(1), file_key(2)]
            await w.store.clear_missing_blobs([])
            await w.store.clear_missing_blobs(keys)
            assert list(await w.store.list_missing_blobs()) == []

    # ================================================================ blob guard

    @asyncio_test
    async def test_pin_and_condemn(self) -> None:
        async with self.world() as w:
            self.need(w.store, "pin_blobs", "condemn_blobs", "release_condemned")
            s = w.store
            l1, l2 = await w.lease("t1"), await w.lease("t2")
            k = {n: file_key(n) for n in range(1, 10)}
            await w.add(checkpoint("c1", "t1", files=[fentry("a", 1)]), l1)
            assert await s.pin_blobs([k[2]], l1) == []
            assert await s.pin_blobs([k[2], k[2]], l1) == []  # idempotent
            other = "other-prefix/" + "ab" * 32
            got = await s.condemn_blobs([k[4], k[1], k[2], k[3], k[3], other], 50)
            assert got == [k[4], k[3]], "referenced, pinned and odd keys are skipped"
            assert await s.condemn_blobs([k[3]], 50) == [], "already condemned"
            # A pin of a condemned key is recorded and reports it condemned.
            assert await s.pin_blobs([k[5], k[3]], l1) == [k[3]]
            assert await s.pin_blobs([k[3]], l1) == [k[3]]
            await s.release_condemned([k[3]])
            assert await s.pin_blobs([k[3]], l1) == []
            assert await s.condemn_blobs([k[3]], 50) == [], "now pinned"
            # Condemnations end at now + hold_ms.
            assert await s.condemn_blobs([k[6]], 10) == [k[6]]
            w.clock.advance(9)
            assert await s.condemn_blobs([k[6]], 10) == []
            w.clock.advance(1)
            assert await s.condemn_blobs([k[6]], 10) == [k[6]]
            # Releasing the lease drops its pins.
            await l1.release()
            assert await s.condemn_blobs([k[2], k[5], k[1]], 10) == [k[2], k[5]]
            # Pins of an expired lease are dead too.
            assert await s.pin_blobs([k[7]], l2) == []
            assert await s.condemn_blobs([k[7]], 10) == []
            w.clock.advance(LEASE_DURATION_MS)
            assert await s.condemn_blobs([k[7]], 10) == [k[7]]
            # A key becomes condemnable when its last reference goes.
            l1b = await w.lease("t1")
            await s.delete_head("t1", "c1", l1b)
            assert await s.condemn_blobs([k[1]], 10) == [k[1]]
            await s.release_condemned([k[1], k[8]])  # unknown keys are fine

    @asyncio_test
    async def test_pin_checks(self) -> None:
        async with self.world() as w:
            self.need(w.store, "pin_blobs", "condemn_blobs", "release_condemned")
            s = w.store
            lease = await w.lease("t1")
            stale = Writer("t1", "nope", 3)
            with pytest.raises(SandboxCheckpointWriterLostError):
                await s.pin_blobs([file_key(1)], stale)
            with pytest.raises(SandboxCheckpointWriterLostError):
                await s.pin_blobs(["not a key"], stale)  # the writer is checked first
            for bad in ("not a key", FILE_KEY_PREFIX + "\ud800" * 64, file_key(1).upper(), 5):
                with pytest.raises(SandboxCheckpointInvalidEntryError):
                    await s.pin_blobs([file_key(1), bad], lease)
            assert await s.pin_blobs([artifact_key(1), file_key(1)], lease) == []
            for hold in (0, -1, 1.5, None):
                with pytest.raises(SandboxCheckpointInvalidArgumentError):
                    await s.condemn_blobs([file_key(2)], hold)
            w.clock.advance(LEASE_DURATION_MS)
            with pytest.raises(SandboxCheckpointWriterLostError):
                await s.pin_blobs([file_key(1)], lease)
