"""sweep_blobs and prune (docs/contract.md#prune-and-sweep) on a real memory store and real blob backends."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import blake3
import pytest

from checkpointd.blobs import ObjectBlobStore, open_blobs
from checkpointd.errors import (
    SandboxCheckpointConflictError,
    SandboxCheckpointInvalidArgumentError,
    SandboxCheckpointInvalidIdError,
    SandboxCheckpointWriterConflictError,
)
from checkpointd.ids import new_uuid7
from checkpointd.model import Artifact, Checkpoint, FileEntry
from checkpointd.store import open_store
from checkpointd.sweep import (
    HOLD_EXPIRING,
    IN_USE,
    NOT_A_BLOB_KEY,
    REFERENCED,
    TOO_YOUNG,
    SweepReport,
    _delete_before,
    prune,
    sweep_blobs,
)


def file_key(data: bytes) -> str:
    return "sandbox-files/blake3/" + blake3.blake3(data).hexdigest()


def artifact_key(data: bytes) -> str:
    return "sandbox-artifacts/blake3/" + blake3.blake3(data).hexdigest()


async def put(blobs: ObjectBlobStore, key: str, data: bytes = b"x") -> int:
    """Upload and return the upload time the backend reports."""
    await blobs.put(key, data, if_absent=False)
    info = await blobs.head(key)
    assert info is not None
    return info.last_modified_ms


async def append(
    store: Any,
    thread_id: str,
    file_keys: list[str],
    artifact_keys: tuple[str, ...] = (),
) -> Checkpoint:
    async with await store.acquire_writer(thread_id) as lease:
        head = await store.get_head(thread_id)
        parent = await store.get(head) if head else None
        checkpoint = Checkpoint(
            id=new_uuid7(),
            thread_id=thread_id,
            parent_checkpoint_id=head,
            created_at=(parent.created_at + 1) if parent else 1_000,
            files=tuple(
                FileEntry(path=f"f{index}", blob_key=key, size=1)
                for index, key in enumerate(file_keys)
            ),
            artifacts=tuple(
                Artifact(
                    artifact_id=new_uuid7(),
                    name=f"a{index}",
                    mime_type="text/plain",
                    size=1,
                    blob_key=key,
                    created_at=1_000,
                )
                for index, key in enumerate(artifact_keys)
            ),
        )
        await store.append(checkpoint, head, lease)
    return checkpoint


def kept_reasons(report: SweepReport) -> dict[str, str]:
    return dict(report.kept)


STORES = ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


async def open_test_store(kind: str, request: pytest.FixtureRequest) -> Any:
    if kind == "memory":
        return await open_store("memory://")
    if kind == "sqlite":
        tmp_path = request.getfixturevalue("tmp_path")
        return await open_store(f"sqlite://{tmp_path / 'checkpoints.db'}")
    return await open_store(request.getfixturevalue("postgres_url"))


@pytest.fixture(params=STORES)
async def store(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    """Every checkpoint store we ship: the sweep relies on its BlobGuard."""
    opened = await open_test_store(request.param, request)
    try:
        yield opened
    finally:
        await opened.aclose()


@pytest.fixture(params=["memory", pytest.param("s3", marks=pytest.mark.s3)])
def blobs(request: pytest.FixtureRequest) -> ObjectBlobStore:
    if request.param == "memory":
        return open_blobs("memory://")
    return request.getfixturevalue("s3_blobs")


# --------------------------------------------------------------------------- sweep


async def test_sweep_deletes_only_unreferenced_old_blobs(
    store: Any, blobs: ObjectBlobStore
) -> None:
    used, used_artifact, old = file_key(b"used"), artifact_key(b"art"), file_key(b"old")
    old_artifact = artifact_key(b"old art")
    odd_shapes = [
        "sandbox-files/blake3/" + "A" * 64,  # uppercase hex
        "sandbox-files/blake3/abc",  # short
        "sandbox-files/notes/readme.txt",
        "sandbox-artifacts/blake3/" + "0" * 64 + "/extra",
    ]
    outside = "elsewhere/" + "0" * 64
    await append(store, "thread-a", [used], (used_artifact,))
    times = [await put(blobs, key) for key in [used, used_artifact, old, old_artifact, outside]]
    times += [await put(blobs, key) for key in odd_shapes]
    newest = max(times)

    report = await sweep_blobs(store, blobs, 60_000, now=lambda: newest + 60_000)

    assert sorted(report.deleted) == sorted([old, old_artifact])
    assert report.failures == []
    assert kept_reasons(report) == {
        used: REFERENCED,
        used_artifact: REFERENCED,
        **{key: NOT_A_BLOB_KEY for key in odd_shapes},
    }
    assert await blobs.head(old) is None and await blobs.head(old_artifact) is None
    for key in [used, used_artifact, outside, *odd_shapes]:
        assert await blobs.head(key) is not None, key
    # Condemnations were released: a capture could pin the deleted keys now.
    async with await store.acquire_writer("thread-b") as lease:
        assert await store.pin_blobs([old, old_artifact], lease) == []


async def test_age_boundary(store: Any, blobs: ObjectBlobStore) -> None:
    key = file_key(b"boundary")
    uploaded = await put(blobs, key)
    younger = await sweep_blobs(store, blobs, 5_000, now=lambda: uploaded + 4_999)
    assert younger.deleted == [] and kept_reasons(younger) == {key: TOO_YOUNG}
    # now - uploaded >= older_than_ms: exactly old enough is deleted.
    exact = await sweep_blobs(store, blobs, 5_000, now=lambda: uploaded + 5_000)
    assert exact.deleted == [key]
    assert await blobs.head(key) is None


async def test_young_and_old_in_one_sweep(store: Any) -> None:
    blobs = open_blobs("memory://")
    old, young = file_key(b"old"), file_key(b"young")
    old_time = await put(blobs, old)
    await asyncio.sleep(0.02)
    young_time = await put(blobs, young)
    assert young_time > old_time
    report = await sweep_blobs(store, blobs, 1_000, now=lambda: old_time + 1_000)
    assert report.deleted == [old]
    assert kept_reasons(report) == {young: TOO_YOUNG}


async def test_dry_run_deletes_and_condemns_nothing(store: Any, blobs: ObjectBlobStore) -> None:
    used, unused = file_key(b"used"), file_key(b"unused")
    await append(store, "t", [used])
    newest = max([await put(blobs, used), await put(blobs, unused)])
    report = await sweep_blobs(store, blobs, 0, now=lambda: newest, dry_run=True)
    assert report.dry_run is True
    assert report.deleted == [unused]
    assert kept_reasons(report) == {used: REFERENCED}
    assert await blobs.head(unused) is not None
    async with await store.acquire_writer("t2") as lease:
        assert await store.pin_blobs([unused], lease) == []  # not condemned
    real = await sweep_blobs(store, blobs, 0, now=lambda: newest)
    assert real.dry_run is False and real.deleted == [unused]


async def test_listing_failure_deletes_nothing(store: Any, tmp_path: Path) -> None:
    blobs = open_blobs(f"file://{tmp_path}")
    doomed = file_key(b"would be deleted")
    uploaded = await put(blobs, doomed)
    # A real listing failure of the local backend: a symlink loop under one of
    # the swept prefixes (the walk follows links and refuses loops).
    (tmp_path / "sandbox-artifacts").mkdir()
    os.symlink("..", tmp_path / "sandbox-artifacts" / "loop")

    report = await sweep_blobs(store, blobs, 0, now=lambda: uploaded + 1)

    assert report.deleted == []
    assert [prefix for prefix, _ in report.failures] == ["sandbox-artifacts/"]
    assert "loop" in report.failures[0][1]
    assert await blobs.head(doomed) is not None


@pytest.mark.s3
async def test_listing_failure_on_s3_is_reported(store, s3_server) -> None:
    blobs = open_blobs(
        s3_server.url("sweep-denied"),
        endpoint=s3_server.endpoint,
        region=s3_server.region,
        access_key_id=s3_server.access_key_id,
        secret_access_key="not-the-secret",
    )
    report = await sweep_blobs(store, blobs, 0)
    assert report.deleted == [] and report.kept == []
    assert [prefix for prefix, _ in report.failures] == ["sandbox-files/", "sandbox-artifacts/"]
    assert all("s3://" in message for _, message in report.failures)
    assert all("not-the-secret" not in message for _, message in report.failures)


async def test_pinned_keys_are_not_condemned(store: Any, blobs: ObjectBlobStore) -> None:
    pinned, loose = file_key(b"pinned"), file_key(b"loose")
    newest = max([await put(blobs, pinned), await put(blobs, loose)])
    lease = await store.acquire_writer("capturing")
    assert await store.pin_blobs([pinned], lease) == []

    report = await sweep_blobs(store, blobs, 0, now=lambda: newest)
    assert report.deleted == [loose]
    assert kept_reasons(report) == {pinned: IN_USE}
    assert await blobs.head(pinned) is not None

    # Releasing the lease drops its pins: the next sweep may delete the key.
    await lease.release()
    report = await sweep_blobs(store, blobs, 0, now=lambda: newest)
    assert report.deleted == [pinned]


async def test_condemned_keys_are_reported_by_pin_blobs(store: Any, blobs: ObjectBlobStore) -> None:
    key = file_key(b"contested")
    uploaded = await put(blobs, key)
    # Another sweep holds the key condemned: pins see it, this sweep skips it.
    assert await store.condemn_blobs([key], 60_000) == [key]
    async with await store.acquire_writer("capturing") as lease:
        assert await store.pin_blobs([key], lease) == [key]
    report = await sweep_blobs(store, blobs, 0, now=lambda: uploaded)
    assert report.deleted == [] and kept_reasons(report) == {key: IN_USE}
    assert await blobs.head(key) is not None
    await store.release_condemned([key])
    async with await store.acquire_writer("capturing") as lease:
        assert await store.pin_blobs([key], lease) == []


async def test_deletes_stop_when_the_hold_is_about_to_expire() -> None:
    blobs = open_blobs("memory://")
    keys = [file_key(bytes([index])) for index in range(5)]
    for key in keys:
        await put(blobs, key)
    outcomes = await _delete_before(blobs, keys, deadline=time.monotonic() - 0.001)
    assert outcomes == [HOLD_EXPIRING] * 5
    for key in keys:
        assert await blobs.head(key) is not None
    outcomes = await _delete_before(blobs, keys, deadline=time.monotonic() + 60)
    assert outcomes == [None] * 5
    assert await blobs.list("sandbox-files/") == []


async def test_a_delete_still_running_when_the_hold_ends_is_cancelled() -> None:
    # A real unresponsive S3 endpoint on loopback: it accepts connections and
    # never answers, so the delete hangs until the sweep gives up on it.
    connections: list[asyncio.StreamWriter] = []

    async def swallow(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        blobs = open_blobs(
            "s3://bucket/prefix",
            endpoint=f"http://127.0.0.1:{port}",
            access_key_id="k",
            secret_access_key="s",
            region="us-east-1",
        )
        started = time.monotonic()
        outcomes = await _delete_before(
            blobs, [file_key(b"k")], deadline=started + 30, hard_deadline=started + 0.5
        )
        elapsed = time.monotonic() - started
        assert len(outcomes) == 1 and outcomes[0] is not None
        assert "hold" in outcomes[0]
        assert 0.4 < elapsed < 5
    finally:
        for writer in connections:
            writer.close()
        server.close()
        await server.wait_closed()


async def test_small_batches(store: Any) -> None:
    blobs = open_blobs("memory://")
    keys = [file_key(str(index).encode()) for index in range(23)]
    newest = max([await put(blobs, key) for key in keys])
    await append(store, "t", keys[:3])
    report = await sweep_blobs(store, blobs, 0, now=lambda: newest, batch_size=4)
    assert sorted(report.deleted) == sorted(keys[3:])
    assert kept_reasons(report) == {key: REFERENCED for key in keys[:3]}


@pytest.mark.parametrize(
    "arguments",
    [
        {"older_than_ms": -1},
        {"older_than_ms": 1.5},
        {"older_than_ms": 0, "hold_ms": 0},
        {"older_than_ms": 0, "hold_ms": 1_000, "safety_margin_ms": 1_000},
        {"older_than_ms": 0, "batch_size": 0},
    ],
)
async def test_bad_arguments(store: Any, arguments: dict) -> None:
    with pytest.raises(SandboxCheckpointInvalidArgumentError):
        await sweep_blobs(store, open_blobs("memory://"), **arguments)


@pytest.mark.timeout(60)
async def test_sweeps_under_fire_never_delete_a_referenced_blob(store: Any) -> None:
    """Captures (pin, check the bucket, upload, append) and prunes of several
    threads race sweeps with older_than_ms=0; every checkpoint keeps its blobs."""
    blobs = open_blobs("memory://")
    pool = [f"content {index}".encode() for index in range(12)]
    stop = asyncio.Event()
    rng = random.Random(5)
    appended: list[Checkpoint] = []
    sweeps: list[SweepReport] = []

    async def capture(thread_id: str) -> None:
        contents = rng.sample(pool, 4)
        keys = [file_key(data) for data in contents]
        async with await store.acquire_writer(thread_id) as lease:
            for _ in range(100_000):
                if not await store.pin_blobs(keys, lease):
                    break
                await asyncio.sleep(0)  # a sweep holds some condemned: wait for it
            else:
                raise AssertionError("keys stayed condemned")
            for key, data in zip(keys, contents, strict=True):
                if await blobs.head(key) is None:
                    await blobs.put(key, data)
                await asyncio.sleep(0)  # let sweeps interleave with the capture
            head = await store.get_head(thread_id)
            parent = await store.get(head) if head else None
            checkpoint = Checkpoint(
                id=new_uuid7(),
                thread_id=thread_id,
                parent_checkpoint_id=head,
                created_at=(parent.created_at + 1) if parent else 1,
                files=tuple(
                    FileEntry(path=f"f{index}", blob_key=key, size=len(data))
                    for index, (key, data) in enumerate(zip(keys, contents, strict=True))
                ),
            )
            await store.append(checkpoint, head, lease)
            appended.append(checkpoint)
            if rng.random() < 0.5:
                await store.delete_checkpoints(thread_id, 1, lease)

    async def capture_loop(thread_id: str) -> None:
        while not stop.is_set():
            try:
                await capture(thread_id)
            except (SandboxCheckpointWriterConflictError, SandboxCheckpointConflictError):
                pass
            await asyncio.sleep(0)

    async def sweep_loop() -> None:
        while not stop.is_set():
            sweeps.append(await sweep_blobs(store, blobs, 0))
            if sweeps[-1].deleted:
                swept.set()
            await asyncio.sleep(0)

    swept = asyncio.Event()
    tasks = [asyncio.create_task(capture_loop(f"thread-{n}")) for n in range(3)]
    tasks += [asyncio.create_task(sweep_loop()) for _ in range(2)]
    # At least a second of interleaving, and on until a sweep has deleted
    # something (a loaded 2-core runner can take longer to get there).
    await asyncio.sleep(1.0)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(swept.wait(), 20.0)
    stop.set()
    await asyncio.gather(*tasks)

    assert sum(len(report.deleted) for report in sweeps) > 0  # the sweeps did work
    assert all(report.failures == [] for report in sweeps)
    for thread in ("thread-0", "thread-1", "thread-2"):
        for checkpoint in await store.list(thread):
            for entry in checkpoint.files:
                assert isinstance(entry, FileEntry)
                assert await blobs.head(entry.blob_key) is not None, (checkpoint.id, entry)
    assert len(appended) > 10


# --------------------------------------------------------------------------- prune


async def chain(store: Any, thread_id: str, length: int) -> list[str]:
    return [(await append(store, thread_id, [])).id for _ in range(length)]


async def test_prune_keeps_head_and_nearest_ancestors(store: Any) -> None:
    ids = await chain(store, "t", 5)
    await chain(store, "other", 2)
    assert await prune(store, "t", 2, dry_run=True) == ids[:3]
    assert [c.id for c in await store.list("t")] == ids  # the dry run changed nothing
    assert await prune(store, "t", 2) == ids[:3]
    assert [c.id for c in await store.list("t")] == ids[3:]
    assert await store.get_head("t") == ids[-1]
    assert len(await store.list("other")) == 2
    assert await prune(store, "t", 2) == []
    # The lease was released each time.
    await (await store.acquire_writer("t")).release()


async def test_prune_dry_run_matches_the_real_prune_on_branches(
    store: Any,
) -> None:
    ids = await chain(store, "t", 3)
    # Roll the head back and grow a branch: ids[2] is now off the head chain.
    async with await store.acquire_writer("t") as lease:
        await store.delete_head("t", ids[2], lease)
    branch = await chain(store, "t", 2)
    planned = await prune(store, "t", 2, dry_run=True)
    assert planned == await prune(store, "t", 2)
    assert [c.id for c in await store.list("t")] == branch


async def test_prune_of_an_unknown_thread(store: Any) -> None:
    assert await prune(store, "nobody", 1) == []
    assert await prune(store, "nobody", 1, dry_run=True) == []


async def test_prune_errors(store: Any) -> None:
    await chain(store, "t", 2)
    with pytest.raises(SandboxCheckpointInvalidArgumentError):
        await prune(store, "t", 0)
    with pytest.raises(SandboxCheckpointInvalidArgumentError):
        await prune(store, "t", 0, dry_run=True)
    with pytest.raises(SandboxCheckpointInvalidIdError):
        await prune(store, "", 1)
    lease = await store.acquire_writer("t")
    with pytest.raises(SandboxCheckpointWriterConflictError):
        await prune(store, "t", 1)
    with pytest.raises(SandboxCheckpointWriterConflictError):
        await prune(store, "t", 1, dry_run=True)
    await lease.release()
    assert len(await prune(store, "t", 1)) == 1
