"""SQLite on real files: reopen, two store objects, two OS processes, locks, schema."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import checkpointd.store._sqlite_db as sqlite_db
import checkpointd.store.sqlite as sqlite_module
from checkpointd.errors import (
    STORE_UNAVAILABLE,
    SandboxCheckpointConflictError,
    SandboxCheckpointError,
    SandboxCheckpointInvalidArgumentError,
    SandboxCheckpointWriterConflictError,
)
from checkpointd.model import Checkpoint, DirEntry, FileEntry
from checkpointd.store import InstanceRecord, SqliteCheckpointStore, SqliteInstanceStore
from checkpointd.testkit import ManualClock
from checkpointd.testkit._support import artifact, checkpoint, fentry, file_key

REPO = Path(__file__).resolve().parents[2]


async def _open(path: Path, clock: ManualClock | None = None) -> SqliteCheckpointStore:
    """With a manual clock leases last 100 ms of it; on the wall clock, the defaults."""
    if clock is None:
        return await SqliteCheckpointStore.open(str(path))
    return await SqliteCheckpointStore.open(
        str(path), now=clock, lease_duration_ms=100, renew_after_ms=25
    )


async def test_reopen_sees_the_same_state(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    clock = ManualClock()
    store = await _open(path, clock)
    lease = await store.acquire_writer("t1")
    await store.append(
        checkpoint(
            "c1",
            "t1",
            files=[DirEntry("d"), fentry("d/a", 1)],
            artifacts=[artifact("art", 2)],
            conversation=[{"role": "user", "content": "héllo 😀"}],
            label="first",
            reason="named",
        ),
        None,
        lease,
    )
    await store.append(checkpoint("c2", "t1", "c1", 2, files=[fentry("b", 3)]), "c1", lease)
    fork_lease = await store.acquire_writer("t2")
    await store.fork_from_checkpoint("t1", "c1", "t2", "f1", 5, fork_lease)
    assert await store.pin_blobs([file_key(9)], lease) == []
    before = (
        await store.list("t1"),
        await store.list("t2"),
        await store.get_head("t1"),
        await store.get_head("t2"),
        await store.list_blob_references(),
    )
    await store.aclose()

    reopened = await _open(path, clock)
    try:
        after = (
            await reopened.list("t1"),
            await reopened.list("t2"),
            await reopened.get_head("t1"),
            await reopened.get_head("t2"),
            await reopened.list_blob_references(),
        )
        assert after == before
        # The live lease and its pin survive the reopen; the fence goes on.
        with pytest.raises(SandboxCheckpointWriterConflictError):
            await reopened.acquire_writer("t1")
        assert await reopened.condemn_blobs([file_key(9)], 10) == []
        await reopened.append(checkpoint("c3", "t1", "c2", 3), "c2", lease)
        await lease.release()  # the lease's callbacks target the closed store: no error
        clock.advance(100)
        assert (await reopened.acquire_writer("t1")).fence == 2
    finally:
        await reopened.aclose()


def _page_size(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute("PRAGMA page_size").fetchone()[0])


async def test_a_new_file_gets_large_pages_and_an_older_file_keeps_its_own(
    tmp_path: Path,
) -> None:
    new, old = tmp_path / "new.db", tmp_path / "old.db"
    store = await _open(new)
    await store.aclose()
    assert _page_size(new) == sqlite_module.PAGE_BYTES != 4096
    with sqlite3.connect(old) as conn:  # a store file written before PAGE_BYTES
        conn.execute("PRAGMA page_size = 4096")
        conn.execute("PRAGMA journal_mode = WAL")
    store = await _open(old)
    try:
        lease = await store.acquire_writer("t")
        await store.append(checkpoint("c1", "t", files=[fentry("a", 1)]), None, lease)
        assert await store.get_head("t") == "c1"
    finally:
        await store.aclose()
    assert _page_size(old) == 4096


async def test_instance_store_shares_the_file(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    checkpoints = await _open(path)
    instances = await SqliteInstanceStore.open(str(path))
    record = InstanceRecord("k", "docker", "sbx", "t1", 10, latest_snapshot_id="c1")
    await instances.upsert(record)
    await instances.aclose()
    again = await SqliteInstanceStore.open(str(path))
    assert await again.get("k") == record
    assert await checkpoints.list("t1") == []
    await again.aclose()
    await checkpoints.aclose()


async def test_two_store_objects_contend_for_one_lease(tmp_path: Path) -> None:
    path = tmp_path / "two.db"
    clock = ManualClock()
    a, b = await _open(path, clock), await _open(path, clock)
    try:
        results = await asyncio.gather(
            *(store.acquire_writer("t1") for store in (a, b) * 10), return_exceptions=True
        )
        leases = [r for r in results if not isinstance(r, BaseException)]
        errors = [r for r in results if isinstance(r, BaseException)]
        assert len(leases) == 1
        assert all(isinstance(e, SandboxCheckpointWriterConflictError) for e in errors), errors
        lease = leases[0]
        # The lease is the file's, not the object's: either store accepts it.
        await b.append(checkpoint("c1", "t1"), None, lease)
        await a.append(checkpoint("c2", "t1", "c1", 2), "c1", lease)
        # Both stores race one compare-and-swap: exactly one wins.
        outcome = await asyncio.gather(
            a.append(checkpoint("x", "t1", "c2", 3), "c2", lease),
            b.append(checkpoint("y", "t1", "c2", 3), "c2", lease),
            return_exceptions=True,
        )
        wins = [o for o in outcome if isinstance(o, str)]
        assert len(wins) == 1
        assert any(isinstance(o, SandboxCheckpointConflictError) for o in outcome)
        assert await a.get_head("t1") == wins[0]
        await lease.release()
        assert (await b.acquire_writer("t1")).fence == 2
    finally:
        await a.aclose()
        await b.aclose()


_WORKER = textwrap.dedent(
    """
    import asyncio, json, os, sys, time
    from checkpointd.errors import SandboxCheckpointWriterConflictError
    from checkpointd.model import Checkpoint, FileEntry
    from checkpointd.store import SqliteCheckpointStore

    path, name, rounds, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]

    async def main():
        store = await SqliteCheckpointStore.open(path)
        while not os.path.exists(go):
            time.sleep(0.005)
        won, conflicts = [], 0
        for n in range(rounds):
            try:
                lease = await store.acquire_writer("shared")
            except SandboxCheckpointWriterConflictError:
                conflicts += 1
                await asyncio.sleep(0.002)
                continue
            async with lease:
                head = await store.get_head("shared")
                files = tuple(
                    FileEntry(f"{name}/{n}/{i}", "sandbox-files/blake3/" + f"{i:064x}", 1)
                    for i in range(200)
                )
                cp = Checkpoint(
                    id=f"{name}-{n}", thread_id="shared", parent_checkpoint_id=head,
                    created_at=time.time_ns(), files=files,
                )
                await store.append(cp, head, lease)
                won.append([cp.id, lease.fence])
        await store.aclose()
        print(json.dumps({"won": won, "conflicts": conflicts}))

    asyncio.run(main())
    """
)


@pytest.mark.slow
def test_two_processes_contend_for_one_lease(tmp_path: Path) -> None:
    path = tmp_path / "procs.db"
    go = tmp_path / "go"
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    env = {**os.environ, "PYTHONPATH": str(REPO / "python")}
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(path), name, "60", str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for name in ("p1", "p2")
    ]
    time.sleep(1.0)  # both have opened the file (schema creation raced too)
    go.write_text("go")
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=100)
        assert proc.returncode == 0, err
        assert "locked" not in err.lower(), err
        outputs.append(json.loads(out))
    won = [tuple(w) for o in outputs for w in o["won"]]
    fences = [fence for _, fence in won]
    assert len(set(fences)) == len(fences), "two processes held one fence"
    assert sum(len(o["won"]) for o in outputs) + sum(o["conflicts"] for o in outputs) == 120

    async def check() -> None:
        store = await SqliteCheckpointStore.open(str(path))
        try:
            listed = await store.list("shared")
            assert sorted(c.id for c in listed) == sorted(i for i, _ in won)
            # One linear chain: every checkpoint's parent is the one before it.
            parents = [c.parent_checkpoint_id for c in listed]
            assert parents == [None, *[c.id for c in listed[:-1]]]
            assert await store.get_head("shared") == listed[-1].id
            refs = await store.list_blob_references()
            assert len(refs) == 200 and all(r.references == len(listed) for r in refs)
        finally:
            await store.aclose()

    asyncio.run(check())


async def test_a_held_write_lock_is_waited_for(tmp_path: Path) -> None:
    path = tmp_path / "held.db"
    store = await _open(path)
    lease = await store.acquire_writer("t1")
    other = sqlite3.connect(str(path), isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    loop = asyncio.get_running_loop()
    loop.call_later(0.5, other.execute, "COMMIT")
    started = time.monotonic()
    try:
        await store.append(checkpoint("c1", "t1"), None, lease)
        assert time.monotonic() - started >= 0.4
        assert await store.get_head("t1") == "c1"
    finally:
        other.close()
        await store.aclose()


async def test_a_lock_held_too_long_is_a_store_error_not_sqlite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_db, "BUSY_TIMEOUT_MS", 20)
    monkeypatch.setattr(sqlite_db, "RETRY_DEADLINE_S", 0.3)
    path = tmp_path / "wedged.db"
    store = await _open(path)
    lease = await store.acquire_writer("t1")
    other = sqlite3.connect(str(path), isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(SandboxCheckpointError) as info:
            await store.append(checkpoint("c1", "t1"), None, lease)
        assert info.value.code == STORE_UNAVAILABLE
        assert not isinstance(info.value, sqlite3.Error)
    finally:
        other.execute("ROLLBACK")
        other.close()
    # Nothing was written, and the store works again.
    assert await store.get_head("t1") is None
    await store.append(checkpoint("c1", "t1"), None, lease)
    await store.aclose()


async def test_cancelled_write_leaves_no_open_transaction(tmp_path: Path) -> None:
    path = tmp_path / "cancel.db"
    store = await _open(path)
    lease = await store.acquire_writer("t1")
    files = [fentry(f"f{i}", i) for i in range(1, 20_000)]
    task = asyncio.create_task(store.append(checkpoint("c1", "t1", files=files), None, lease))
    await asyncio.sleep(0.05)
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    # Either it committed before the cancel landed, or nothing of it is visible.
    head = await store.get_head("t1")
    refs = await store.list_blob_references()
    assert (head, len(refs)) in ((None, 0), ("c1", len(files)))
    # Another connection can write: no lock was left behind.
    other = await _open(path)
    await other.append(checkpoint("c9", "t1", head), head, lease)
    await other.aclose()
    await store.aclose()


async def test_schema_is_versioned_and_idempotent(tmp_path: Path) -> None:
    path = tmp_path / "schema.db"
    for _ in range(2):
        store = await _open(path)
        await store.aclose()
    raw = sqlite3.connect(str(path))
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert raw.execute(
        "SELECT value FROM checkpointd_meta WHERE name = 'schema_version'"
    ).fetchone() == (str(sqlite_module.SCHEMA_VERSION),)
    raw.execute(
        "UPDATE checkpointd_meta SET value = ? WHERE name = 'schema_version'",
        (str(sqlite_module.SCHEMA_VERSION + 1),),
    )
    raw.commit()
    raw.close()
    with pytest.raises(SandboxCheckpointInvalidArgumentError, match="newer"):
        await _open(path)


async def test_manifest_is_one_row_and_keys_are_counted_per_key(tmp_path: Path) -> None:
    path = tmp_path / "rows.db"
    store = await _open(path)
    lease = await store.acquire_writer("t1")
    files = [FileEntry(f"dir/{i:05}", file_key(i % 5_000 + 1), i) for i in range(10_000)]
    await store.append(checkpoint("big", "t1", files=files), None, lease)
    got = await store.get("big")
    assert got is not None and list(got.files) == files
    await store.aclose()
    raw = sqlite3.connect(str(path))
    assert raw.execute("SELECT COUNT(*) FROM checkpoints").fetchone() == (1,)
    assert raw.execute("SELECT COUNT(*), SUM(refs) FROM blob_references").fetchone() == (
        5_000,
        5_000,
    )
    raw.close()


async def test_closed_store_raises_a_store_error(tmp_path: Path) -> None:
    async with await _open(tmp_path / "closed.db") as store:
        lease = await store.acquire_writer("t1")
    with pytest.raises(SandboxCheckpointError) as info:
        await store.get_head("t1")
    assert info.value.code == STORE_UNAVAILABLE
    await lease.release()  # never raises
    await store.aclose()  # twice is fine


async def test_relative_path_is_rejected() -> None:
    with pytest.raises(SandboxCheckpointInvalidArgumentError):
        await SqliteCheckpointStore.open("relative.db")


async def test_unopenable_file_is_a_store_error(tmp_path: Path) -> None:
    (tmp_path / "a-directory").mkdir()
    for path in (tmp_path / "missing-dir" / "x.db", tmp_path / "a-directory"):
        with pytest.raises(SandboxCheckpointError) as info:
            await SqliteCheckpointStore.open(str(path))
        assert info.value.code == STORE_UNAVAILABLE


def _files(versions: dict[int, int], count: int = 20) -> list[FileEntry]:
    return [
        FileEntry(f"f{n:03d}", file_key(1_000 * versions.get(n, 0) + n + 1), n)
        for n in range(count)
    ]


async def test_delta_documents_read_back_everywhere(tmp_path: Path) -> None:
    """Consecutive checkpoints are stored as deltas; every read path (this object's
    cache, another object, a reopened file, after a prune that removes their
    bases) returns exactly what was appended."""
    path = tmp_path / "deltas.db"
    writer_store = await _open(path)
    lease = await writer_store.acquire_writer("t")
    appended: list[Checkpoint] = []
    versions: dict[int, int] = {}
    parent = None
    for step in range(45):  # more than one chain of deltas (MAX_DEPTH) long
        versions[step % 20] = versions.get(step % 20, 0) + 1
        cp = checkpoint(
            f"c{step:02d}",
            "t",
            parent,
            step,
            files=_files(versions),
            conversation=[{"step": n} for n in range(step + 1)],
        )
        await writer_store.append(cp, parent, lease)
        appended.append(cp)
        parent = cp.id
    raw = sqlite3.connect(str(path))
    kinds = raw.execute(
        "SELECT SUM(base_id IS NULL), SUM(base_id IS NOT NULL), MAX(depth) FROM checkpoints"
    ).fetchone()
    raw.close()
    assert kinds[0] >= 2 and kinds[1] >= 40, kinds  # mostly deltas, a few keyframes
    # A head read first is its chain of deltas applied at once; the rows
    # between it and its keyframe read back as well afterwards.
    head_first = await _open(path)
    for cp in (appended[-1], appended[-20], appended[-2]):
        assert await head_first.get(cp.id) == cp
    await head_first.aclose()
    reader = await _open(path)
    for store in (writer_store, reader):
        assert await store.list("t") == appended
        for cp in appended:
            assert await store.get(cp.id) == cp
    assert await reader.delete_checkpoints("t", 3, lease) == [c.id for c in appended[:-3]]
    await reader.aclose()
    reopened = await _open(path)
    assert await reopened.list("t") == appended[-3:]
    assert await writer_store.list("t") == appended[-3:]
    refs = {r.key: r.references for r in await reopened.list_blob_references()}
    expected: dict[str, int] = {}
    for cp in appended[-3:]:
        for key in {e.blob_key for e in cp.files if isinstance(e, FileEntry)}:
            expected[key] = expected.get(key, 0) + 1
    assert refs == expected
    # The thread goes on from there, from either object.
    nxt = checkpoint("c99", "t", appended[-1].id, 99, files=_files({0: 50}))
    await reopened.append(nxt, appended[-1].id, lease)
    assert await writer_store.get("c99") == nxt
    await reopened.aclose()
    await writer_store.aclose()


async def test_a_reused_id_is_not_mistaken_for_the_deleted_one(tmp_path: Path) -> None:
    path = tmp_path / "reuse.db"
    a, b = await _open(path), await _open(path)
    lease = await a.acquire_writer("t")
    await a.append(checkpoint("c1", "t", files=_files({})), None, lease)
    first = checkpoint("c2", "t", "c1", 2, files=_files({1: 1}))
    await a.append(first, "c1", lease)
    await b.delete_head("t", "c2", lease)
    second = checkpoint("c2", "t", "c1", 3, files=_files({2: 7, 3: 7}))
    await b.append(second, "c1", lease)  # same id, other content, other object
    third = checkpoint("c3", "t", "c2", 4, files=_files({2: 7, 3: 7, 4: 7}))
    await a.append(third, "c2", lease)  # a's cache holds the deleted c2
    for store in (a, b):
        assert await store.get("c2") == second
        assert await store.get("c3") == third
    await a.aclose()
    await b.aclose()


async def test_a_file_from_before_lease_owners_gains_the_column(tmp_path: Path) -> None:
    """A database made before leases recorded their owner is upgraded on open, and
    a lease left live in it (no owner) is no one's to take back."""
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TABLE writer_leases (thread_id TEXT PRIMARY KEY, owner_token TEXT NOT NULL,"
            " fence INTEGER NOT NULL, expires_at INTEGER NOT NULL) WITHOUT ROWID"
        )
        db.execute("INSERT INTO writer_leases VALUES ('t', 'old-token', 1, 9999999999999)")
    store = await _open(path)
    try:
        with pytest.raises(SandboxCheckpointWriterConflictError):
            await store.acquire_writer("t", owner="daemon")
        lease = await store.acquire_writer("u", owner="daemon")
        assert (await store.acquire_writer("u", owner="daemon")).fence == lease.fence + 1
    finally:
        await store.aclose()
    with sqlite3.connect(path) as db:
        columns = {row[1] for row in db.execute("PRAGMA table_info(writer_leases)")}
    assert "holder" in columns
