"""A pack ``checkpointd migrate`` uploaded but never recorded (killed between
the two) is deleted by the sweep once the run's pins are gone, and never while
they live: real SQLite and PostgreSQL stores (the memory store in-process), a
real local dir and SeaweedFS S3, a real kill -9."""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from checkpointd.blobs import open_blobs
from checkpointd.capture import CaptureOptions, capture_checkpoint
from checkpointd.check import check_store
from checkpointd.migrate import migrate_to_packs
from checkpointd.restore import RestoreOptions, restore_checkpoint
from checkpointd.store import open_store
from checkpointd.sweep import IN_USE, sweep_blobs

from .conftest import (
    BUCKETS,
    EVERY_STORE,
    bucket_named_by_param,
    snapshot_tree,
    store_named_by_param,
    write_tree,
)
from .test_pack_kill import _past_the_holds
from .test_pack_sweep import FILE_PREFIX, _later, _packs, _StoreBeforePacks, _text

# Stops right after the pack upload, before its rows are recorded: the marker
# names the pack, then the process waits to be killed.
MIGRATE_SCRIPT = """
import asyncio, pathlib, sys
from checkpointd.blobs import open_blobs
from checkpointd.migrate import migrate_to_packs
from checkpointd.store import open_store

store_url, blobs_url, marker = sys.argv[1:4]

async def main():
    async with await open_store(store_url) as store:
        async def uploaded_not_recorded(rows):
            pathlib.Path(marker).write_text(rows[0].pack)
            await asyncio.sleep(3600)
        store.add_packed_blobs = uploaded_not_recorded
        await migrate_to_packs(store, open_blobs(blobs_url))

asyncio.run(main())
"""


def _old_tree(workspace: Path) -> dict[str, bytes]:
    files = {f"src/f{n}.py": _text(n) for n in range(80)}
    write_tree(workspace, files)
    return files


async def _restores_each(store: Any, blobs: Any, ids: list[str], tmp: Path, expected: Any) -> None:
    for checkpoint_id in ids:
        target = tmp / f"restored-{uuid.uuid4().hex[:8]}"
        await restore_checkpoint(
            target,
            store,
            blobs,
            "t",
            RestoreOptions(checkpoint_id=checkpoint_id, data_dir=tmp / "rd"),
        )
        assert snapshot_tree(target, with_mtime=False) == expected[checkpoint_id]


@pytest.fixture(
    params=[
        pytest.param(("sqlite", "file"), id="sqlite-file"),
        pytest.param(
            ("postgres", "s3"), id="postgres-s3", marks=[pytest.mark.postgres, pytest.mark.s3]
        ),
        pytest.param(("sqlite", "s3"), id="sqlite-s3", marks=pytest.mark.s3),
    ]
)
def target(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str, Any, dict[str, str]]:
    """(store URL, blobs URL, blob store, the child's environment)."""
    store_kind, blob_kind = request.param
    store_url = (
        f"sqlite:///{tmp_path / 'store.db'}"
        if store_kind == "sqlite"
        else request.getfixturevalue("postgres_url")
    )
    if blob_kind == "file":
        url = f"file://{tmp_path / 'blobs'}"
        return store_url, url, open_blobs(url), dict(os.environ)
    s3_server = request.getfixturevalue("s3_server")
    prefix = f"migrate-kill-{uuid.uuid4().hex}"
    return (
        store_url,
        s3_server.url(prefix),
        s3_server.open(prefix),
        {**os.environ, **s3_server.env()},
    )


async def test_kill_9_after_a_migrate_pack_upload_the_sweep_deletes_the_leaked_pack(
    tmp_path: Path, workspace: Path, data_dir: Path, target: Any
) -> None:
    store_url, blobs_url, blobs, env = target
    expected: dict[str, Any] = {}
    ids: list[str] = []
    async with await open_store(store_url) as store:
        for round_ in range(2):
            _old_tree(workspace)
            write_tree(workspace, {"round.txt": f"round {round_}\n".encode()})
            old = await capture_checkpoint(
                workspace, _StoreBeforePacks(store), blobs, "t", CaptureOptions(data_dir=data_dir)
            )
            ids.append(old.checkpoint.id)
            expected[old.checkpoint.id] = snapshot_tree(workspace, with_mtime=False)
    singles = {info.key for info in await blobs.list(FILE_PREFIX)}
    assert await _packs(blobs) == {}

    marker = tmp_path / "uploaded"
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", MIGRATE_SCRIPT, store_url, blobs_url, str(marker), env=env
    )
    try:
        deadline = time.monotonic() + 120
        while not marker.exists() or not marker.read_text():
            assert child.returncode is None, "migrate ended before its upload"
            assert time.monotonic() < deadline, "migrate never uploaded a pack"
            await asyncio.sleep(0.01)
    finally:
        if child.returncode is None:
            child.kill()  # SIGKILL: nothing of the run gets to clean up
        await child.wait()
    leaked = marker.read_text()
    assert set(await _packs(blobs)) == {leaked}

    async with await open_store(store_url) as store:
        assert await store.list_packed_blobs() == []
        # The killed run's lease (and its pins) live on for now: to the sweep it
        # is a migrate about to record rows, and its pack stays.
        kept = await sweep_blobs(store, blobs, 0, now=_later)
        assert kept.failures == [] and (leaked, IN_USE) in kept.kept
        assert set(await _packs(blobs)) == {leaked}

    # Past the lease and the holds: two sweeps, then everything still reads.
    async with await open_store(store_url, now=_past_the_holds) as store:
        first = await sweep_blobs(store, blobs, 0, now=_later)
        assert first.failures == [] and leaked in first.deleted, first.kept
        second = await sweep_blobs(store, blobs, 0, now=_later)
        assert second.failures == [] and second.deleted == []
        assert await _packs(blobs) == {}
        assert {info.key for info in await blobs.list(FILE_PREFIX)} == singles
        await _restores_each(store, blobs, ids, tmp_path, expected)
        report = await check_store(store, blobs, read_data=True)
        assert report.summary is not None and report.summary.ok, report.findings

        # A rerun completes, and a sweep then frees the single objects.
        summary = await migrate_to_packs(store, blobs)
        assert summary.problems == 0 and summary.packed == len(singles)
        freed = await sweep_blobs(store, blobs, 0, now=_later)
        assert freed.failures == []
        assert await blobs.list(FILE_PREFIX) == []
        await _restores_each(store, blobs, ids, tmp_path, expected)
        report = await check_store(store, blobs, read_data=True)
        assert report.summary is not None and report.summary.ok, report.findings


# ------------------------------------------------------------------ in-process, every store


# Every store we ship keeps the pack index.
store = pytest.fixture(params=EVERY_STORE, name="store")(store_named_by_param)


bucket = pytest.fixture(params=BUCKETS, name="bucket")(bucket_named_by_param)


async def test_a_migrate_between_upload_and_rows_keeps_its_pack_through_sweeps(
    store: Any, bucket: Any, workspace: Path, data_dir: Path, tmp_path: Path
) -> None:
    files = _old_tree(workspace)
    old = await capture_checkpoint(
        workspace, _StoreBeforePacks(store), bucket, "t", CaptureOptions(data_dir=data_dir)
    )
    expected = {old.checkpoint.id: snapshot_tree(workspace, with_mtime=False)}
    uploaded, resume = asyncio.Event(), asyncio.Event()
    record = store.add_packed_blobs

    async def paused(rows: list[Any]) -> list[str]:
        uploaded.set()
        await resume.wait()
        added: list[str] = await record(rows)
        return added

    store.add_packed_blobs = paused
    try:
        migrate = asyncio.create_task(migrate_to_packs(store, bucket))
        await asyncio.wait_for(uploaded.wait(), 60)
        [pack] = await _packs(bucket)
        for _ in range(2):
            report = await sweep_blobs(store, bucket, 0, now=_later)
            assert report.failures == [] and (pack, IN_USE) in report.kept
        assert set(await _packs(bucket)) == {pack}
        resume.set()
        summary = await asyncio.wait_for(migrate, 60)
    finally:
        store.add_packed_blobs = record
    assert summary.packed == len(files) and summary.problems == 0
    assert {row.pack for row in await store.list_packed_blobs(limit=1000)} == {pack}
    report = await sweep_blobs(store, bucket, 0, now=_later)
    assert report.failures == [] and set(await _packs(bucket)) == {pack}
    assert await bucket.list(FILE_PREFIX) == []  # superseded single objects go
    await _restores_each(store, bucket, [old.checkpoint.id], tmp_path, expected)


async def test_a_migrate_waits_for_keys_a_sweep_holds(
    store: Any, bucket: Any, workspace: Path, data_dir: Path
) -> None:
    files = _old_tree(workspace)
    await capture_checkpoint(
        workspace, _StoreBeforePacks(store), bucket, "t", CaptureOptions(data_dir=data_dir)
    )
    keys = sorted({info.key for info in await bucket.list(FILE_PREFIX)})
    # What a sweep deleting a pack of these keys holds (referenced keys too).
    assert await store.condemn_unpinned_blobs(keys, 60_000) == keys
    migrate = asyncio.create_task(migrate_to_packs(store, bucket))
    await asyncio.sleep(0.5)
    assert not migrate.done() and await _packs(bucket) == {}, "it read before the hold ended"
    await store.release_condemned(keys)
    summary = await asyncio.wait_for(migrate, 60)
    assert summary.packed == len(files) == len(keys)
    assert len(await _packs(bucket)) == 1


async def test_a_second_migrate_meanwhile_is_a_writer_conflict(
    store: Any, bucket: Any, workspace: Path, data_dir: Path
) -> None:
    from checkpointd.errors import SandboxCheckpointWriterConflictError
    from checkpointd.migrate import MIGRATE_THREAD

    _old_tree(workspace)
    await capture_checkpoint(
        workspace, _StoreBeforePacks(store), bucket, "t", CaptureOptions(data_dir=data_dir)
    )
    running = await store.acquire_writer(MIGRATE_THREAD)
    with pytest.raises(SandboxCheckpointWriterConflictError, match="another checkpointd migrate"):
        await migrate_to_packs(store, bucket)
    assert await _packs(bucket) == {}
    await running.release()
    assert (await migrate_to_packs(store, bucket)).packed == 80
    # The migrate thread never holds a checkpoint, and its lease went with the run.
    assert [t.thread_id for t in await store.list_threads()] == ["t"]
    again = await store.acquire_writer(MIGRATE_THREAD)  # free again
    await again.release()
