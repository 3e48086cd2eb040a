"""Counts kept as runs (``store._core``) stay the contract's counts through any mix of
appends, no-change appends, delete_head, prune and fork, on every store; a
no-change append writes no count row; a version-1 SQLite file (plain counts)
migrates on open without changing a count; a request_id checkpoint deleted
through the Python API is spent."""

from __future__ import annotations

import random
import sqlite3
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from checkpointd.errors import SandboxCheckpointDuplicateIdError
from checkpointd.model import Artifact, Checkpoint, FileEntry
from checkpointd.store import InMemoryCheckpointStore, SqliteCheckpointStore
from checkpointd.store.sqlite import SCHEMA_VERSION as SQLITE_SCHEMA_VERSION
from checkpointd.testkit._support import artifact_key, file_key


def _files(keys: set[int]) -> tuple[FileEntry, ...]:
    return tuple(FileEntry(f"f{n:04d}", file_key(n), n) for n in sorted(keys))


def _artifacts(keys: set[int]) -> tuple[Artifact, ...]:
    return tuple(
        Artifact(f"a{n}", "a.txt", "text/plain", 1, artifact_key(n), 1) for n in sorted(keys)
    )


async def _expected(store: Any, threads: list[str]) -> dict[str, int]:
    """the contract's counts, recomputed from every stored checkpoint."""
    counts: Counter[str] = Counter()
    for thread in threads:
        for stored in await store.list(thread):
            counts.update(set(stored.blob_keys()))
    return dict(counts)


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    if request.param == "memory":
        opened: Any = InMemoryCheckpointStore()
    elif request.param == "sqlite":
        opened = await SqliteCheckpointStore.open(str(tmp_path / "runs.db"))
    else:
        from checkpointd.store.postgres import open_postgres_store

        opened = await open_postgres_store(request.getfixturevalue("postgres_url"))
    yield opened
    await opened.aclose()


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_counts_follow_every_write(store: Any, seed: int) -> None:
    rng = random.Random(seed)
    threads = ["t1", "t2", "t3"]
    leases = {t: await store.acquire_writer(t) for t in threads}
    keys: dict[str, set[int]] = {t: set() for t in threads}
    serial = 0
    for _step in range(60):
        thread = rng.choice(threads)
        head = await store.get_head(thread)
        action = rng.random()
        lease = leases[thread]
        if action < 0.55 or head is None:
            if head is not None and rng.random() < 0.3:
                pass  # a no-change capture: the same keys again
            else:
                current = set(keys[thread]) if head is not None else set()
                current -= set(rng.sample(sorted(current), k=min(len(current), rng.randint(0, 3))))
                current |= {rng.randint(1, 40) for _ in range(rng.randint(0, 4))}
                keys[thread] = current
            serial += 1
            await store.append(
                Checkpoint(
                    id=f"c{serial}",
                    thread_id=thread,
                    parent_checkpoint_id=head,
                    created_at=serial,
                    files=_files(keys[thread]),
                    artifacts=_artifacts({n for n in keys[thread] if n % 7 == 0}),
                ),
                head,
                lease,
            )
        elif action < 0.7:
            await store.delete_head(thread, head, lease)
            parent = await store.get_head(thread)
            if parent is not None:
                got = await store.get(parent)
                keys[thread] = {int(e.blob_key[-64:], 16) for e in got.files}
            else:
                keys[thread] = set()
        elif action < 0.85:
            await store.delete_checkpoints(thread, rng.randint(1, 3), lease)
        else:
            target = f"fork{serial}"
            threads.append(target)
            leases[target] = await store.acquire_writer(target)
            serial += 1
            await store.fork_from_checkpoint(
                thread, head, target, f"c{serial}", serial, leases[target]
            )
            keys[target] = set(keys[thread])
        got = {r.key: r.references for r in await store.list_blob_references()}
        assert got == await _expected(store, threads), f"step {_step}"
    audit = await store.audit_blob_references()
    assert all(count.agrees for count in audit)


async def test_a_no_change_append_writes_no_count_row(tmp_path: Path) -> None:
    path = tmp_path / "nochange.db"
    store = await SqliteCheckpointStore.open(str(path))
    lease = await store.acquire_writer("t")
    files = _files(set(range(1, 2_001)))
    await store.append(Checkpoint("c0", "t", None, 1, files=files), None, lease)
    raw = sqlite3.connect(str(path))
    before = raw.execute("SELECT COUNT(*), SUM(refs) FROM blob_references").fetchone()
    raw.close()
    manifest = (await store.get("c0")).files  # type: ignore[union-attr]
    for n in range(1, 4):
        await store.append(
            Checkpoint(f"c{n}", "t", f"c{n - 1}", n + 1, files=manifest), f"c{n - 1}", lease
        )
    raw = sqlite3.connect(str(path))
    assert raw.execute("SELECT COUNT(*), SUM(refs) FROM blob_references").fetchone() == before
    assert raw.execute("SELECT COUNT(*) FROM blob_runs").fetchone() == (2_000,)
    raw.close()
    references = await store.list_blob_references()
    assert len(references) == 2_000 and {r.references for r in references} == {4}
    await store.aclose()


def _downgrade_to_version_1(path: Path) -> None:
    """Make the file what schema version 1 wrote: plain counts, no runs."""
    raw = sqlite3.connect(str(path))
    with raw:
        runs = raw.execute(
            "SELECT u.key, h.head_ordinal - u.open_since FROM blob_runs u"
            " JOIN heads h ON h.thread_id = u.thread_id"
        ).fetchall()
        for key, extra in runs:
            raw.execute("UPDATE blob_references SET refs = refs + ? WHERE key = ?", (extra, key))
        raw.execute("DROP TABLE blob_runs")
        raw.execute("UPDATE heads SET head_ordinal = 0")
        raw.execute("UPDATE checkpointd_meta SET value = '1' WHERE name = 'schema_version'")
    raw.close()


async def test_a_version_1_file_migrates_without_changing_a_count(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    store = await SqliteCheckpointStore.open(str(path))
    lease = await store.acquire_writer("t")
    await store.append(Checkpoint("a", "t", None, 1, files=_files({1, 2, 3})), None, lease)
    await store.append(Checkpoint("b", "t", "a", 2, files=_files({2, 3, 4})), "a", lease)
    await store.append(Checkpoint("c", "t", "b", 3, files=_files({2, 3, 4})), "b", lease)
    await lease.release()
    await store.aclose()
    _downgrade_to_version_1(path)
    # A damaged count (as ``check`` would find it) survives the migration as it was.
    raw = sqlite3.connect(str(path))
    with raw:
        raw.execute(
            "UPDATE blob_references SET refs = 9 WHERE key = ?", (b"f" + (1).to_bytes(32, "big"),)
        )
    raw.close()

    store = await SqliteCheckpointStore.open(str(path))
    counts = {r.key: r.references for r in await store.list_blob_references()}
    assert counts == {file_key(1): 9, file_key(2): 3, file_key(3): 3, file_key(4): 2}
    assert [c.key for c in await store.repair_blob_references()] == [file_key(1)]
    lease = await store.acquire_writer("t")
    await store.append(Checkpoint("d", "t", "c", 4, files=_files({3, 4, 5})), "c", lease)
    await store.delete_head("t", "d", lease)
    await store.append(Checkpoint("e", "t", "c", 5, files=_files({2, 3, 4})), "c", lease)
    assert await store.delete_checkpoints("t", 2, lease) == ["a", "b"]
    counts = {r.key: r.references for r in await store.list_blob_references()}
    assert counts == {file_key(2): 2, file_key(3): 2, file_key(4): 2}
    assert all(c.agrees for c in await store.audit_blob_references())
    raw = sqlite3.connect(str(path))
    assert raw.execute(
        "SELECT value FROM checkpointd_meta WHERE name = 'schema_version'"
    ).fetchone() == (str(SQLITE_SCHEMA_VERSION),)
    raw.close()
    await store.aclose()


async def test_a_request_id_checkpoint_deleted_through_the_api_is_spent(store: Any) -> None:
    lease = await store.acquire_writer("t")
    derived = str(uuid.uuid5(uuid.NAMESPACE_URL, "t\x00r-1"))
    pruned = str(uuid.uuid5(uuid.NAMESPACE_URL, "t\x00r-2"))
    plain = str(uuid.uuid4())
    await store.append(Checkpoint(pruned, "t", None, 1), None, lease)
    await store.append(Checkpoint(plain, "t", pruned, 2), pruned, lease)
    await store.append(Checkpoint(derived, "t", plain, 3), plain, lease)
    await store.delete_head("t", derived, lease)
    assert await store.delete_checkpoints("t", 1, lease) == [pruned]
    assert await store.spent_checkpoint_ids([derived, pruned, plain, "x"]) == [derived, pruned]
    for spent in (derived, pruned):
        with pytest.raises(SandboxCheckpointDuplicateIdError):
            await store.append(Checkpoint(spent, "t", plain, 4), plain, lease)
    # Ids of another shape are not spent: deleted, they may come back.
    await store.delete_head("t", plain, lease)
    await store.append(Checkpoint(plain, "t", None, 5), None, lease)
    assert await store.get_head("t") == plain


@pytest.mark.postgres
async def test_a_version_3_postgres_database_migrates_without_changing_a_count(
    postgres_url: str,
) -> None:
    import asyncpg

    from checkpointd.store.postgres import SCHEMA_VERSION, open_postgres_store

    store = await open_postgres_store(postgres_url)
    for thread in ("t", "u"):
        lease = await store.acquire_writer(thread)
        await store.append(
            Checkpoint(f"{thread}a", thread, None, 1, files=_files({1, 2})), None, lease
        )
        await store.append(
            Checkpoint(f"{thread}b", thread, f"{thread}a", 2, files=_files({2, 3})),
            f"{thread}a",
            lease,
        )
        await store.append(
            Checkpoint(f"{thread}c", thread, f"{thread}b", 3, files=_files({2, 3})),
            f"{thread}b",
            lease,
        )
        await lease.release()
    await store.aclose()
    conn = await asyncpg.connect(postgres_url)
    try:  # what schema 3 wrote: plain per-(thread, key) counts; then one damaged
        await conn.execute(
            "UPDATE checkpointd_blob_counts AS c SET refs = c.refs + (t.head_ordinal - c.open_since)"
            " FROM checkpointd_threads AS t WHERE t.thread_id = c.thread_id"
            " AND c.open_since IS NOT NULL"
        )
        await conn.execute(
            "ALTER TABLE checkpointd_blob_counts DROP COLUMN open_since;"
            " ALTER TABLE checkpointd_threads DROP COLUMN head_ordinal;"
            " DROP TABLE checkpointd_spent_checkpoints;"
            " DROP TABLE checkpointd_packed_blobs; DROP TABLE checkpointd_packs;"
            " DROP TABLE checkpointd_retired_packs;"
            " DROP TABLE checkpointd_lease_pins; DROP TABLE checkpointd_leases;"
            " CREATE TABLE checkpointd_blob_pins (thread_id bytea NOT NULL,"
            " owner_token text NOT NULL, fence bigint NOT NULL, key bytea NOT NULL,"
            " PRIMARY KEY (thread_id, owner_token, fence, key));"
            " UPDATE checkpointd_schema SET version = 3"
        )
        await conn.execute(
            "UPDATE checkpointd_blob_counts SET refs = 5 WHERE thread_id = $1 AND key = $2",
            b"u",
            b"f" + (3).to_bytes(32, "big"),
        )
    finally:
        await conn.close()

    store = await open_postgres_store(postgres_url)
    try:
        counts = {r.key: r.references for r in await store.list_blob_references()}
        assert counts == {file_key(1): 2, file_key(2): 6, file_key(3): 2 + 5}
        assert [c.key for c in await store.repair_blob_references()] == [file_key(3)]
        lease = await store.acquire_writer("u")
        await store.append(Checkpoint("ud", "u", "uc", 4, files=_files({3})), "uc", lease)
        await store.delete_head("u", "ud", lease)
        assert await store.delete_checkpoints("u", 1, lease) == ["ua", "ub"]
        counts = {r.key: r.references for r in await store.list_blob_references()}
        assert counts == {file_key(1): 1, file_key(2): 4, file_key(3): 3}
        assert all(c.agrees for c in await store.audit_blob_references())
    finally:
        await store.aclose()
    conn = await asyncpg.connect(postgres_url)
    try:
        assert await conn.fetchval("SELECT version FROM checkpointd_schema") == SCHEMA_VERSION
    finally:
        await conn.close()


@pytest.mark.parametrize("size", [0, 1, 7, 3_000])
def test_a_no_change_delta_is_the_native_delta_without_indexing(size: int) -> None:
    """``_documents.encode`` answers an unchanged manifest with one copy run; it
    must be exactly what the native delta says, and apply back to the manifest."""
    from checkpointd import _native
    from checkpointd.store import _documents as documents

    content = documents.Content.of(Checkpoint("c", "t", None, 1, files=_files(set(range(size)))))
    again = documents.Content.of(Checkpoint("d", "t", "c", 2, files=_files(set(range(size)))))
    native_ops, native_added = _native.manifest_delta(content.manifest.data, again.manifest.data)
    stored = documents.encode(again, "c", content, 0)
    rows = {"c": (None, documents.keyframe(content).data), "d": ("c", stored.data)}
    assert (native_ops, native_added) == (documents._copy_all(size), 0)
    assert documents.materialize("d", rows, {}).manifest.data == again.manifest.data
