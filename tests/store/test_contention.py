"""Many OS processes, each with its own store object, on one database.

8 processes run for a bounded time. Each round a process takes the writer lease of
one of 4 threads (or finds it taken), then appends a checkpoint with random shared
and unique blob keys, deletes the head, prunes, or — in the processes opened with
a short lease — lets its lease expire on purpose and tries to write with it. They
report what they did; the test then checks the stored state against the reports:
every head chain intact, no id twice, every stale write refused, and the stored
blob counts equal to the counts recomputed from the surviving checkpoints.

Run on PostgreSQL (one database) and on SQLite (processes on one file).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import multiprocessing
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from checkpointd.errors import (
    SandboxCheckpointError,
    SandboxCheckpointWriterConflictError,
    SandboxCheckpointWriterLostError,
)
from checkpointd.model import Artifact, Checkpoint, DirEntry, FileEntry
from checkpointd.store import open_store

PROCESSES = 8
THREADS = [f"thread-{n}" for n in range(4)]
RUN_SECONDS = 3.0
SHORT_LEASE_MS = 300
SHORT_LEASE_PROCESSES = {0, 1, 2}  # these open their store with SHORT_LEASE_MS
SHARED_KEYS = [
    f"sandbox-files/blake3/{hashlib.sha256(b'shared%d' % n).hexdigest()}" for n in range(24)
]


def unique_key(checkpoint_id: str, n: int, prefix: str = "sandbox-files/blake3/") -> str:
    return prefix + hashlib.sha256(f"{checkpoint_id}/{n}".encode()).hexdigest()


def make_checkpoint(
    rng: random.Random, checkpoint_id: str, thread: str, head: str | None
) -> Checkpoint:
    keys = rng.sample(SHARED_KEYS, rng.randint(0, 8))
    keys += [unique_key(checkpoint_id, n) for n in range(rng.randint(1, 3))]
    files = [FileEntry(f"dir/f{n}", key, n) for n, key in enumerate(keys)]
    if rng.random() < 0.3:  # a key used twice in one checkpoint counts once
        files.append(FileEntry("copy", keys[0], 0))
    artifacts = ()
    if rng.random() < 0.3:
        key = unique_key(checkpoint_id, 99, "sandbox-artifacts/blake3/")
        artifacts = (Artifact("art", "a.txt", "text/plain", 1, key, 1),)
    return Checkpoint(
        id=checkpoint_id,
        thread_id=thread,
        parent_checkpoint_id=head,
        created_at=time.time_ns() // 1_000_000,
        files=(DirEntry("dir"), *files),
        artifacts=artifacts,
    )


# ---------------------------------------------------------------------------- workers


async def _work(url: str, index: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    short = index in SHORT_LEASE_PROCESSES
    options = {"lease_duration_ms": SHORT_LEASE_MS, "renew_after_ms": 100} if short else {}
    report: dict[str, Any] = {
        "appended": [],
        "deleted": [],
        "stale_refused": 0,
        "stale_accepted": [],
        "conflicts": 0,
        "lost": 0,
        "errors": [],
    }
    store = await open_store(url, **options)
    serial = 0
    deadline = time.monotonic() + RUN_SECONDS
    try:
        while time.monotonic() < deadline:
            thread = rng.choice(THREADS)
            try:
                lease = await store.acquire_writer(thread)
            except SandboxCheckpointWriterConflictError:
                report["conflicts"] += 1
                await asyncio.sleep(rng.uniform(0, 0.02))
                continue
            # A short-lease process goes stale on purpose on its first round, then
            # now and then, so every run exercises the refusal.
            stale_round = short and (serial == 0 or rng.random() < 0.2)
            serial += 1
            checkpoint_id = f"p{index}-{serial}"
            try:
                if stale_round:
                    await _write_with_stale_lease(store, lease, rng, checkpoint_id, report)
                else:
                    await _one_write(store, lease, rng, checkpoint_id, report)
            except SandboxCheckpointWriterLostError:
                # A short lease can run out mid-round on a busy machine: refused, fine.
                report["lost"] += 1
            except SandboxCheckpointError as error:
                report["errors"].append(f"{type(error).__name__}: {error}")
            finally:
                await lease.release()
    finally:
        await store.aclose()
    return report


async def _one_write(
    store: Any, lease: Any, rng: random.Random, checkpoint_id: str, report: dict[str, Any]
) -> None:
    thread = lease.thread_id
    action = rng.random()
    head = await store.get_head(thread)
    if action < 0.7 or head is None:
        checkpoint = make_checkpoint(rng, checkpoint_id, thread, head)
        await store.pin_blobs(checkpoint.blob_keys(), lease)
        await store.append(checkpoint, head, lease)
        report["appended"].append(checkpoint_id)
    elif action < 0.85:
        await store.delete_head(thread, head, lease)
        report["deleted"].append(head)
    else:
        report["deleted"] += await store.delete_checkpoints(thread, rng.randint(1, 3), lease)


async def _write_with_stale_lease(
    store: Any, lease: Any, rng: random.Random, checkpoint_id: str, report: dict[str, Any]
) -> None:
    await asyncio.sleep((SHORT_LEASE_MS + 150) / 1000)
    thread = lease.thread_id
    head = await store.get_head(thread)
    attempts = [
        lambda: store.append(make_checkpoint(rng, checkpoint_id, thread, head), head, lease),
        lambda: store.delete_checkpoints(thread, 1, lease),
    ]
    if head is not None:
        attempts.append(lambda: store.delete_head(thread, head, lease))
    for attempt in attempts:
        try:
            result = await attempt()
        except SandboxCheckpointWriterLostError:
            report["stale_refused"] += 1
        else:
            report["stale_accepted"].append(repr(result))


def run_worker(url: str, index: int, seed: int, out_path: str) -> None:
    """Process entry point: do the work, write the report as JSON."""
    try:
        report = asyncio.run(_work(url, index, seed))
    except BaseException as error:  # report everything, the parent asserts
        report = {"fatal": f"{type(error).__name__}: {error}"}
    Path(out_path).write_text(json.dumps(report))


# ---------------------------------------------------------------------------- the test


@pytest.fixture(params=[pytest.param("postgres", marks=pytest.mark.postgres), "sqlite"])
def shared_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        return str(request.getfixturevalue("postgres_url"))
    return f"sqlite://{tmp_path / 'shared.db'}"


@pytest.mark.timeout(90)
async def test_processes_contending_for_threads_keep_every_promise(
    shared_store_url: str, tmp_path: Path
) -> None:
    # Create the schema once up front so the workers' opens race on data, not DDL.
    await (await open_store(shared_store_url)).aclose()
    context = multiprocessing.get_context("spawn")
    outputs = [tmp_path / f"worker-{i}.json" for i in range(PROCESSES)]
    workers = [
        context.Process(target=run_worker, args=(shared_store_url, i, 1000 + i, str(outputs[i])))
        for i in range(PROCESSES)
    ]
    for worker in workers:
        worker.start()
    try:
        for worker in workers:
            await asyncio.to_thread(worker.join, 60)
    finally:
        for worker in workers:
            if worker.is_alive():
                worker.kill()
    assert [w.exitcode for w in workers] == [0] * PROCESSES

    reports = [json.loads(path.read_text()) for path in outputs]
    for report in reports:
        assert "fatal" not in report, report
        assert report["errors"] == [], report["errors"]
        assert report["stale_accepted"] == [], "a write with an expired lease was accepted"
    appended = [i for r in reports for i in r["appended"]]
    deleted = [i for r in reports for i in r["deleted"]]
    assert len(appended) == len(set(appended))
    assert len(deleted) == len(set(deleted)), "a checkpoint was deleted twice"
    assert sum(r["stale_refused"] for r in reports) >= len(SHORT_LEASE_PROCESSES)
    summary = {
        name: sum(r[name] if isinstance(r[name], int) else len(r[name]) for r in reports)
        for name in ("appended", "deleted", "stale_refused", "conflicts", "lost")
    }
    print(f"contention on {shared_store_url.split(':', 1)[0]}: {summary}")  # shown with -s
    assert len(appended) >= 10, f"the run made too little progress to prove anything: {summary}"

    async with await open_store(shared_store_url) as store:
        surviving: dict[str, Checkpoint] = {}
        for thread in THREADS:
            listed = await store.list(thread)
            for checkpoint in listed:
                assert checkpoint.id not in surviving, f"id {checkpoint.id} listed twice"
                assert checkpoint.thread_id == thread
                surviving[checkpoint.id] = checkpoint
            _assert_chain_intact(thread, await store.get_head(thread), listed, set(deleted))
        assert set(surviving) == set(appended) - set(deleted)

        expected = Counter(key for c in surviving.values() for key in set(c.blob_keys()))
        stored = {ref.key: ref.references for ref in await store.list_blob_references()}
        assert stored == dict(expected)


def _assert_chain_intact(
    thread: str, head: str | None, listed: list[Checkpoint], deleted: set[str]
) -> None:
    """Head → parent → … only through stored checkpoints of the thread, ending at a
    root or at a parent that a reported delete removed."""
    by_id = {c.id: c for c in listed}
    if head is None:
        return
    assert head in by_id, f"{thread}: head {head} is not stored"
    seen: set[str] = set()
    current: str | None = head
    while current is not None and current in by_id:
        assert current not in seen, f"{thread}: cycle at {current}"
        seen.add(current)
        current = by_id[current].parent_checkpoint_id
    assert current is None or current in deleted, (
        f"{thread}: chain from {head} reaches {current}, neither stored nor deleted"
    )
