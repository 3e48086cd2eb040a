"""Small artifacts rest in packs: the first capture that names one packs it with
its files (its row in the append), reads take the pack, the sweep frees the
single object and keeps the row while any checkpoint uses the artifact; large
artifacts stay single objects. Real stores (memory, SQLite, PostgreSQL), a
real local dir and SeaweedFS S3."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from checkpointd.artifacts import upload_artifact
from checkpointd.blobs.packs import PACK_KEY_PREFIX, PackedBlobStore
from checkpointd.capture import CaptureOptions, capture_checkpoint
from checkpointd.check import check_store
from checkpointd.store._packindex import row_key
from checkpointd.sweep import REFERENCED, iter_sweep_blobs, sweep_blobs

from .conftest import (
    BUCKETS,
    EVERY_STORE,
    bucket_named_by_param,
    store_named_by_param,
    write_tree,
)

HOUR_MS = 3_600_000


def _later() -> int:
    return time.time_ns() // 1_000_000 + HOUR_MS


# Every store we ship keeps the pack index.
store = pytest.fixture(params=EVERY_STORE, name="store")(store_named_by_param)


bucket = pytest.fixture(params=BUCKETS, name="bucket")(bucket_named_by_param)


async def _single_objects(bucket: Any) -> set[str]:
    return {info.key for info in await bucket.list("sandbox-artifacts/")}


async def _drop_head(store: Any, thread: str) -> None:
    async with await store.acquire_writer(thread) as lease:
        await store.delete_head(thread, await store.get_head(thread), lease)


async def test_small_artifacts_are_packed_large_ones_stay_single(
    store: Any, bucket: Any, workspace: Path, data_dir: Path
) -> None:
    report = b"a small report\n" * 200
    same_as_a_file = b"these bytes are also a file in the workspace\n" * 10
    screenshot = os.urandom((1 << 20) + 4096)  # above the pack threshold
    small = await upload_artifact(bucket, "report.txt", "text/plain", report)
    twin = await upload_artifact(bucket, "twin.txt", "text/plain", same_as_a_file)

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(screenshot), 300_000):
            yield screenshot[start : start + 300_000]

    large = await upload_artifact(bucket, "shot.png", "image/png", chunks())
    assert await _single_objects(bucket) == {small.blob_key, twin.blob_key, large.blob_key}

    write_tree(workspace, {"src/a.py": b"print('a')\n", "copy.txt": same_as_a_file})
    first = await capture_checkpoint(
        workspace,
        store,
        bucket,
        "t",
        CaptureOptions(data_dir=data_dir, artifacts=[small, twin, large]),
    )
    assert first.stats.blobs_uploaded >= 2
    packed = PackedBlobStore(bucket, store)
    rows = await packed.locate([small.blob_key, twin.blob_key, large.blob_key])
    assert set(rows) == {small.blob_key, twin.blob_key}  # the large one has no row
    [pack] = {row.pack for row in rows.values()}
    # One row serves the artifact and the file of the same bytes.
    assert rows[twin.blob_key].key == row_key(twin.blob_key)
    both = await packed.get_many([twin.blob_key, row_key(twin.blob_key), small.blob_key])
    assert both == [same_as_a_file, same_as_a_file, report]
    for artifact, data in ((small, report), (twin, same_as_a_file), (large, screenshot)):
        assert await packed.get(artifact.blob_key) == data
        streamed = b"".join([c async for c in packed.get_stream(artifact.blob_key, 64 << 10)])
        assert streamed == data
        assert (await packed.head(artifact.blob_key)).size == len(data)

    # A sweep frees the small ones' single objects (their rows stay: referenced).
    young = await sweep_blobs(store, bucket, 2 * HOUR_MS, now=_later)
    assert young.failures == [] and len(await _single_objects(bucket)) == 3
    swept = await sweep_blobs(store, bucket, 0, now=_later)
    assert swept.failures == [] and swept.deleted == []
    assert (small.blob_key, REFERENCED) in swept.kept
    # Its pack row is kept under the key the checkpoint names, not the file form.
    assert all(key != row_key(small.blob_key) for key, _ in swept.kept)
    assert await _single_objects(bucket) == {large.blob_key}
    for artifact, data in ((small, report), (twin, same_as_a_file), (large, screenshot)):
        assert await packed.get(artifact.blob_key) == data
    checked = await check_store(store, bucket, read_data=True)
    assert checked.summary is not None and checked.summary.ok, checked.findings

    # Another thread names the small artifact (already packed: nothing uploaded)
    # and holds the file; the first thread goes. The rows stay while used.
    write_tree(workspace, {"copy.txt": b"changed\n"})
    second = await capture_checkpoint(
        workspace, store, bucket, "u", CaptureOptions(data_dir=data_dir, artifacts=[small, twin])
    )
    assert second.stats.blobs_uploaded == 1  # the changed copy.txt only
    await _drop_head(store, "t")
    kept = await sweep_blobs(store, bucket, 0, now=_later)
    assert kept.failures == []
    assert large.blob_key in kept.deleted  # nothing names the screenshot now
    assert set(await packed.locate([small.blob_key, twin.blob_key])) == {
        small.blob_key,
        twin.blob_key,
    }
    assert await packed.get(twin.blob_key) == same_as_a_file
    assert pack in {info.key for info in await bucket.list(PACK_KEY_PREFIX)}

    # Nothing uses them: their rows go, then the packs no row points at.
    await _drop_head(store, "u")
    for _ in range(2):
        report_ = await sweep_blobs(store, bucket, 0, now=_later)
        assert report_.failures == []
    assert await packed.locate([small.blob_key, twin.blob_key]) == {}
    assert await bucket.list(PACK_KEY_PREFIX) == []
    assert await _single_objects(bucket) == set()


async def test_an_artifact_whose_bytes_are_not_its_key_is_not_packed(
    store: Any, bucket: Any, workspace: Path, data_dir: Path
) -> None:
    artifact = await upload_artifact(bucket, "note.txt", "text/plain", b"the real bytes")
    await bucket.delete(artifact.blob_key)
    await bucket.put(artifact.blob_key, b"other bytes", if_absent=False)
    write_tree(workspace, {"a.txt": b"a"})
    await capture_checkpoint(
        workspace, store, bucket, "t", CaptureOptions(data_dir=data_dir, artifacts=[artifact])
    )
    assert await PackedBlobStore(bucket, store).locate([artifact.blob_key]) == {}
    report = await check_store(store, bucket, read_data=True)
    assert {f.key for f in report.findings} == {artifact.blob_key}


async def test_migrate_packs_the_small_artifacts_of_an_old_store(
    store: Any, bucket: Any, workspace: Path, data_dir: Path
) -> None:
    from checkpointd.migrate import migrate_to_packs

    from .test_pack_sweep import _StoreBeforePacks

    note = await upload_artifact(bucket, "note.txt", "text/plain", b"an old note\n" * 30)
    shared = b"bytes both a file and an artifact\n" * 20
    twin = await upload_artifact(bucket, "twin.txt", "text/plain", shared)
    write_tree(workspace, {"a.txt": b"a" * 100, "twin.txt": shared})
    await capture_checkpoint(
        workspace,
        _StoreBeforePacks(store),
        bucket,
        "t",
        CaptureOptions(data_dir=data_dir, artifacts=[note, twin]),
    )
    packed = PackedBlobStore(bucket, store)
    assert await packed.locate([note.blob_key, twin.blob_key]) == {}
    summary = await migrate_to_packs(store, bucket)
    # a.txt, the note and one row for the twin's digest (file and artifact).
    assert (summary.candidates, summary.packed, summary.problems) == (3, 3, 0)
    assert set(await packed.locate([note.blob_key, twin.blob_key])) == {
        note.blob_key,
        twin.blob_key,
    }
    again = await migrate_to_packs(store, bucket)
    assert (again.candidates, again.packed) == (0, 0)
    swept = await sweep_blobs(store, bucket, 0, now=_later)
    assert swept.failures == [] and await _single_objects(bucket) == set()
    assert await packed.get(note.blob_key) == b"an old note\n" * 30
    assert await packed.get(twin.blob_key) == shared
    checked = await check_store(store, bucket, read_data=True)
    assert checked.summary is not None and checked.summary.ok, checked.findings


async def test_upload_artifact_given_the_store_packs_a_small_one_at_once(
    store: Any, bucket: Any, workspace: Path, data_dir: Path
) -> None:
    report = b"a report packed when it is uploaded\n" * 40
    packed = PackedBlobStore(bucket, store)
    artifact = await upload_artifact(bucket, "report.txt", "text/plain", report, index=store)

    async def chunks() -> AsyncIterator[bytes]:
        yield report[:100]
        yield report[100:]

    again = await upload_artifact(bucket, "again.txt", "text/plain", chunks(), index=store)
    assert again.blob_key == artifact.blob_key
    # No single object: one pack (the second upload found the row), read
    # through the index as ReadArtifact reads.
    assert await _single_objects(bucket) == set()
    [pack] = await bucket.list(PACK_KEY_PREFIX)
    assert (await packed.locate([artifact.blob_key]))[artifact.blob_key].pack == pack.key
    assert await packed.get(artifact.blob_key) == report
    # Large ones stay single objects.
    large = await upload_artifact(
        bucket, "shot.png", "image/png", os.urandom((1 << 20) + 1), index=store
    )
    assert await _single_objects(bucket) == {large.blob_key}

    # Unused, it is kept while its pack is young, as its single object would be.
    young = await sweep_blobs(store, bucket, 2 * HOUR_MS, now=_later)
    assert young.failures == [] and await packed.get(artifact.blob_key) == report
    # A capture that names it appends with it packed (nothing to read or pack).
    write_tree(workspace, {"a.txt": b"a"})
    done = await capture_checkpoint(
        workspace, store, bucket, "t", CaptureOptions(data_dir=data_dir, artifacts=[artifact])
    )
    assert done.checkpoint.artifacts == (artifact,)
    used = await sweep_blobs(store, bucket, 0, now=_later)
    # Kept under the key the checkpoint names, not the file form of its row.
    assert used.failures == [] and (artifact.blob_key, REFERENCED) in used.kept
    assert all(key != row_key(artifact.blob_key) for key, _ in used.kept)
    assert await packed.get(artifact.blob_key) == report
    # Once nothing names it and its pack is old, its row and pack go.
    await _drop_head(store, "t")
    for _ in range(2):  # rows first, then the pack no row points at
        swept = await sweep_blobs(store, bucket, 0, now=_later)
        assert swept.failures == []
    assert await packed.locate([artifact.blob_key]) == {}
    assert [info.key for info in await bucket.list(PACK_KEY_PREFIX)] == []


async def test_a_sweep_that_listed_the_packs_before_an_artifact_was_packed_keeps_its_row(
    store: Any, bucket: Any, workspace: Path, data_dir: Path
) -> None:
    # A capture of small files only: its pack is the one object in the bucket.
    write_tree(workspace, {"a.txt": b"a" * 100, "b.txt": b"b" * 200})
    await capture_checkpoint(workspace, store, bucket, "t", CaptureOptions(data_dir=data_dir))
    packed = PackedBlobStore(bucket, store)
    uploaded = None
    # (Anything unused for a minute goes: the new pack is younger than that.)
    async for batch in iter_sweep_blobs(store, bucket, 60_000):
        if uploaded is None and batch.listed and not batch.kept:
            # The packs are listed, the index not walked yet: the artifact's
            # pack is not in the listing, its row will be in the walk.
            uploaded = await upload_artifact(
                bucket, "late.txt", "text/plain", b"uploaded mid-sweep\n" * 9, index=store
            )
        assert not batch.failures, batch.failures
    assert uploaded is not None, "the pack listing came and went unseen"
    assert await packed.get(uploaded.blob_key) == b"uploaded mid-sweep\n" * 9
