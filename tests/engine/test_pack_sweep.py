"""The pack-aware sweep, check against packs, and staging leftovers: real
captures into real packs (a local dir and SeaweedFS S3), real stores."""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import blake3
import pytest

from checkpointd.blobs import open_blobs
from checkpointd.blobs.packs import PACK_KEY_PREFIX
from checkpointd.blobs.staging import list_staging
from checkpointd.capture import CaptureOptions, capture_checkpoint
from checkpointd.check import CORRUPT, check_store
from checkpointd.manifest import split_digests
from checkpointd.migrate import migrate_to_packs
from checkpointd.restore import RestoreOptions, restore_checkpoint
from checkpointd.store._packindex import file_key, index_rows
from checkpointd.store.base import PackedBlob
from checkpointd.sweep import IN_USE, REFERENCED, REPACKED, TOO_YOUNG, prune, sweep_blobs
from tests.fixtures.bucket_counter import counted

from .conftest import (
    BUCKETS,
    EVERY_STORE,
    bucket_named_by_param,
    snapshot_tree,
    store_named_by_param,
    write_tree,
)

FILE_PREFIX = "sandbox-files/blake3/"
HOUR_MS = 3_600_000


def _key(data: bytes) -> str:
    return FILE_PREFIX + blake3.blake3(data).hexdigest()


def _text(seed: int, size: int = 3000) -> bytes:
    rng = random.Random(seed)
    words = [b"alpha", b"beta", b"gamma", b"delta", b"import", b"return", b"self"]
    out = bytearray(b"# file %d\n" % seed)
    while len(out) < size:
        out += rng.choice(words) + (b"\n" if rng.random() < 0.1 else b" ")
    return bytes(out)


def _each_key_once(report: Any) -> None:
    """SweepBatch's promise: a key appears in at most one place of a sweep."""
    keys = [*report.deleted, *(key for key, _ in report.kept), *(k for k, _ in report.failures)]
    assert len(keys) == len(set(keys)), [k for k in keys if keys.count(k) > 1][:5]


def _later() -> int:
    """A clock an hour ahead: everything in the bucket is old enough."""
    return time.time_ns() // 1_000_000 + HOUR_MS


bucket = pytest.fixture(params=BUCKETS, name="bucket")(bucket_named_by_param)


async def _packs(blobs: Any) -> dict[str, int]:
    return {info.key: info.size for info in await blobs.list(PACK_KEY_PREFIX)}


async def _drop_head(store: Any, thread: str) -> None:
    async with await store.acquire_writer(thread) as lease:
        head = await store.get_head(thread)
        await store.delete_head(thread, head, lease)


async def _restores(store: Any, blobs: Any, checkpoint_id: str, target: Path, tmp: Path) -> Any:
    checkpoint = await store.get(checkpoint_id)
    await restore_checkpoint(
        target,
        store,
        blobs,
        checkpoint.thread_id,
        RestoreOptions(checkpoint_id=checkpoint_id, data_dir=tmp / f"rd-{checkpoint_id}"),
    )
    return snapshot_tree(target, with_mtime=False)


async def test_a_pack_no_checkpoint_uses_is_deleted_with_its_rows(
    memory_store: Any, bucket: Any, workspace: Path, data_dir: Path
) -> None:
    files = {f"src/f{n}.py": _text(n) for n in range(60)}
    write_tree(workspace, files)
    await capture_checkpoint(
        workspace, memory_store, bucket, "t", CaptureOptions(data_dir=data_dir)
    )
    [pack] = await _packs(bucket)
    rows = await memory_store.list_packed_blobs(limit=1000)
    assert {row.key for row in rows} == {_key(data) for data in files.values()}

    # Used by a checkpoint: nothing goes.
    kept = await sweep_blobs(memory_store, bucket, 0, now=_later)
    assert kept.deleted == [] and kept.failures == []
    assert (pack, REFERENCED) in kept.kept
    assert (_key(files["src/f0.py"]), REFERENCED) in kept.kept

    await _drop_head(memory_store, "t")
    # Too young for older_than_ms: kept, keys and pack.
    young = await sweep_blobs(memory_store, bucket, HOUR_MS * 2, now=_later)
    assert young.deleted == [] and (pack, TOO_YOUNG) in young.kept
    dry = await sweep_blobs(memory_store, bucket, 0, now=_later, dry_run=True)
    assert set(dry.deleted) == {pack, *(_key(d) for d in files.values())}
    assert await _packs(bucket) == {pack: (await bucket.head(pack)).size}

    report = await sweep_blobs(memory_store, bucket, 0, now=_later)
    assert report.failures == []
    _each_key_once(report)
    assert set(report.deleted) == {pack, *(_key(d) for d in files.values())}
    assert await _packs(bucket) == {}
    assert await memory_store.list_packed_blobs(limit=1000) == []
    assert await memory_store.locate_blobs([_key(files["src/f1.py"])]) == {}


async def test_a_sparse_pack_is_repacked_and_deleted_by_the_next_sweep(
    memory_store: Any, bucket: Any, workspace: Path, data_dir: Path, tmp_path: Path
) -> None:
    files = {f"f{n}.txt": _text(n) for n in range(100)}
    write_tree(workspace, files)
    first = await capture_checkpoint(
        workspace, memory_store, bucket, "t", CaptureOptions(data_dir=data_dir)
    )
    [old_pack] = await _packs(bucket)
    changed = {f"f{n}.txt": _text(1000 + n) for n in range(70)}
    write_tree(workspace, changed)
    second = await capture_checkpoint(
        workspace, memory_store, bucket, "t", CaptureOptions(data_dir=data_dir)
    )
    assert len(await _packs(bucket)) == 2
    assert await prune(memory_store, "t", 1) == [first.checkpoint.id]
    expected = snapshot_tree(workspace, with_mtime=False)

    dry = await sweep_blobs(memory_store, bucket, 0, now=_later, dry_run=True)
    assert (old_pack, REPACKED) in dry.kept
    assert len(await _packs(bucket)) == 2

    report = await sweep_blobs(memory_store, bucket, 0, now=_later)
    assert report.failures == []
    _each_key_once(report)
    dead = {_key(files[f"f{n}.txt"]) for n in range(70)}
    assert set(report.deleted) == dead
    assert (old_pack, REPACKED) in report.kept
    packs = await _packs(bucket)
    assert len(packs) == 3  # the old one stays until a later sweep
    live = {_key(files[f"f{n}.txt"]) for n in range(70, 100)}
    located = await memory_store.locate_blobs(sorted(live))
    assert {row.pack for row in located.values()}.isdisjoint({old_pack})
    new_pack = {row.pack for row in located.values()}.pop()
    assert packs[new_pack] < packs[old_pack] / 2
    restored = await _restores(
        memory_store, bucket, second.checkpoint.id, tmp_path / "r1", tmp_path
    )
    assert restored == expected

    again = await sweep_blobs(memory_store, bucket, 0, now=_later)
    assert again.failures == []
    assert again.deleted == [old_pack]
    assert old_pack not in await _packs(bucket)
    restored = await _restores(
        memory_store, bucket, second.checkpoint.id, tmp_path / "r2", tmp_path
    )
    assert restored == expected
    report = await check_store(memory_store, bucket, read_data=True)
    assert report.summary is not None and report.summary.ok, report.findings


async def test_sweeps_repacking_while_captures_run_keep_every_checkpoint_restorable(
    memory_store: Any, bucket: Any, workspace: Path, data_dir: Path, tmp_path: Path
) -> None:
    rng = random.Random(7)
    files = {f"d{n % 5}/f{n}.txt": _text(n, 1500) for n in range(120)}
    write_tree(workspace, files)
    expected: dict[str, Any] = {}
    done = asyncio.Event()
    sweeps: list[Any] = []

    async def sweeper() -> None:
        while not done.is_set():
            # repack_below 0.99: nearly every pack with a dead blob is repacked.
            sweeps.append(
                await sweep_blobs(
                    memory_store, bucket, 0, now=_later, repack_below=0.99, hold_ms=5000,
                    safety_margin_ms=1000,
                )
            )  # fmt: skip
            await asyncio.sleep(0)

    task = asyncio.ensure_future(sweeper())
    try:
        for round_ in range(8):
            for name in rng.sample(sorted(files), 30):
                files[name] = _text(rng.randrange(1 << 30), 1500)
            # Some content comes back: a capture reuses a blob a sweep may be dropping.
            files["d0/f0.txt"] = _text(round_ % 2, 1500)
            write_tree(workspace, files)
            result = await capture_checkpoint(
                workspace, memory_store, bucket, "t", CaptureOptions(data_dir=data_dir)
            )
            expected[result.checkpoint.id] = snapshot_tree(workspace, with_mtime=False)
            for gone in await prune(memory_store, "t", 3):
                expected.pop(gone)
            await asyncio.sleep(0)
    finally:
        done.set()
        await task
    assert sweeps and all(not s.failures for s in sweeps), [s.failures for s in sweeps]
    for one in sweeps:
        _each_key_once(one)
    assert any(reason == REPACKED for s in sweeps for _key_, reason in s.kept)
    # A final sweep with nothing running, then every checkpoint left restores.
    await sweep_blobs(memory_store, bucket, 0, now=_later, repack_below=0.99)
    assert len(expected) == 3
    for n, (checkpoint_id, tree) in enumerate(expected.items()):
        target = tmp_path / f"restore-{n}"
        assert await _restores(memory_store, bucket, checkpoint_id, target, tmp_path) == tree
    report = await check_store(memory_store, bucket, read_data=True)
    assert report.summary is not None and report.summary.ok, report.findings


async def test_a_pinned_key_keeps_its_row_and_its_pack(
    memory_store: Any, bucket: Any, workspace: Path, data_dir: Path
) -> None:
    files = {f"f{n}": _text(n) for n in range(10)}
    write_tree(workspace, files)
    await capture_checkpoint(
        workspace, memory_store, bucket, "a", CaptureOptions(data_dir=data_dir)
    )
    [pack] = await _packs(bucket)
    await _drop_head(memory_store, "a")
    pinned = _key(files["f3"])
    # A capture on another thread is about to reuse one blob of the pack.
    async with await memory_store.acquire_writer("b") as lease:
        assert await memory_store.pin_blobs([pinned], lease) == []
        report = await sweep_blobs(memory_store, bucket, 0, now=_later)
        assert (pinned, IN_USE) in report.kept
        assert pinned not in report.deleted and pack not in report.deleted
        assert (await memory_store.locate_blobs([pinned]))[pinned] is not None
        assert pack in await _packs(bucket)


every_store = pytest.fixture(params=EVERY_STORE, name="every_store")(store_named_by_param)


class _SweepAfterPackUpload:
    """The real bucket; right after each pack lands in it (the capture has not
    appended, so no row points at the pack yet) ``hook(pack)`` runs."""

    def __init__(self, inner: Any, hook: Any) -> None:
        self._inner = inner
        self._hook = hook
        self.url = inner.url

    async def put_many(self, items: Any) -> list[bool]:
        written: list[bool] = await self._inner.put_many(items)
        for key, _data in items:
            if key.startswith(PACK_KEY_PREFIX):
                await self._hook(key)
        return written

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


async def test_a_sweep_while_a_capture_uploads_keeps_the_pack_the_capture_pinned(
    every_store: Any, bucket: Any, workspace: Path, data_dir: Path, tmp_path: Path
) -> None:
    # A capture pins each pack it uploads (one pin), not every key in it: a
    # sweep that lists the pack before the append (no row points at it, and
    # everything is old enough) must find it in use and delete nothing of it.
    files = {f"src/f{n}.py": _text(n) for n in range(50)}
    write_tree(workspace, files)
    sweeps: list[Any] = []
    inside: list[str] = []

    async def sweep_now(pack: str) -> None:
        report = await sweep_blobs(every_store, bucket, 0, now=_later, hold_ms=5000,
                                   safety_margin_ms=1000)  # fmt: skip
        sweeps.append((pack, report))
        # The granularity: the pack's key is pinned, a key in it is not.
        assert await every_store.condemn_unpinned_blobs([pack], 5000) == []
        key = _key(files["src/f7.py"])
        inside.extend(await every_store.condemn_unpinned_blobs([key], 5000))
        await every_store.release_condemned(inside)

    result = await capture_checkpoint(
        workspace,
        every_store,
        _SweepAfterPackUpload(bucket, sweep_now),
        "t",
        CaptureOptions(data_dir=data_dir),
    )
    [pack] = await _packs(bucket)
    assert [p for p, _ in sweeps] == [pack]
    [(_, report)] = sweeps
    assert report.failures == [] and pack not in report.deleted
    assert (pack, IN_USE) in report.kept
    assert inside == [_key(files["src/f7.py"])]
    target = tmp_path / "restored"
    tree = await _restores(every_store, bucket, result.checkpoint.id, target, tmp_path)
    assert tree == snapshot_tree(workspace, with_mtime=False)
    # The lease is gone, so is the pin: the pack is now kept by its rows alone.
    after = await sweep_blobs(every_store, bucket, 0, now=_later)
    assert (pack, REFERENCED) in after.kept and after.deleted == []


class _SweepCondemnsFirst:
    """The real store; the first time a capture pins a pack, a sweep (as if
    deleting a pack of those very bytes) has just condemned it, and lets go
    after ``hold_s``."""

    def __init__(self, inner: Any, hold_s: float) -> None:
        self._inner = inner
        self._hold_s = hold_s
        self.released_at: float | None = None
        self._releasing: asyncio.Future[None] | None = None

    async def pin_blobs(self, keys: list[str], writer: Any) -> list[str]:
        packs = [key for key in keys if key.startswith(PACK_KEY_PREFIX)]
        if packs and self._releasing is None:
            assert await self._inner.condemn_unpinned_blobs(packs, 60_000) == packs

            async def release() -> None:
                await asyncio.sleep(self._hold_s)
                self.released_at = time.monotonic()
                await self._inner.release_condemned(packs)

            self._releasing = asyncio.ensure_future(release())
        condemned: list[str] = await self._inner.pin_blobs(keys, writer)
        return condemned

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


async def test_a_capture_waits_while_a_sweep_holds_its_pack_condemned(
    every_store: Any, bucket: Any, workspace: Path, data_dir: Path, tmp_path: Path
) -> None:
    # A sweep deleting a pack of these very bytes has condemned its key: the
    # capture's pin of it is refused until the sweep lets go, so its upload
    # cannot land before the sweep's delete.
    files = {f"src/f{n}.py": _text(n) for n in range(20)}
    write_tree(workspace, files)
    store = _SweepCondemnsFirst(every_store, 0.5)
    uploaded_at: list[float] = []

    async def note(_pack: str) -> None:
        uploaded_at.append(time.monotonic())

    result = await capture_checkpoint(
        workspace,
        store,
        _SweepAfterPackUpload(bucket, note),
        "t",
        CaptureOptions(data_dir=data_dir),
    )
    assert store.released_at is not None and len(uploaded_at) == 1
    assert uploaded_at[0] > store.released_at
    target = tmp_path / "restored"
    tree = await _restores(every_store, bucket, result.checkpoint.id, target, tmp_path)
    assert tree == snapshot_tree(workspace, with_mtime=False)


@pytest.mark.parametrize("damage", ["flip", "truncate"])
async def test_check_finds_a_damaged_pack_naming_blob_and_pack(
    memory_store: Any, tmp_path: Path, workspace: Path, data_dir: Path, damage: str
) -> None:
    blobs = open_blobs(f"file://{tmp_path / 'blobs'}")
    files = {f"f{n}": _text(n) for n in range(20)}
    write_tree(workspace, files)
    await capture_checkpoint(workspace, memory_store, blobs, "t", CaptureOptions(data_dir=data_dir))
    [pack] = await _packs(blobs)
    clean = await check_store(memory_store, blobs, read_data=True)
    assert clean.summary is not None and clean.summary.ok, clean.findings
    victim = _key(files["f7"])
    row = (await memory_store.locate_blobs([victim]))[victim]
    path = tmp_path / "blobs" / pack
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[row.offset + row.length // 2] ^= 0xFF
    else:
        data = data[: row.offset + row.length // 2]
    os.chmod(path, 0o644)
    path.write_bytes(bytes(data))

    report = await check_store(memory_store, blobs, read_data=damage == "flip")
    assert report.summary is not None and not report.summary.ok
    corrupt = [f for f in report.findings if f.kind == CORRUPT]
    assert victim in {f.key for f in corrupt}
    finding = next(f for f in corrupt if f.key == victim)
    assert pack in finding.message and victim in finding.message
    if damage == "flip":
        assert [f.key for f in corrupt] == [victim]  # the others decode
    else:
        assert "damaged" in finding.message
    # The sweep does not touch a damaged pack's rows either way.
    await _drop_head(memory_store, "t")
    swept = await sweep_blobs(memory_store, blobs, 0, now=_later)
    if damage == "truncate":
        assert pack in {key for key, _ in swept.failures}
        assert pack in await _packs(blobs)


async def test_staging_files_older_than_the_hold_are_swept(
    memory_store: Any, tmp_path: Path
) -> None:
    blobs = open_blobs(f"file://{tmp_path / 'blobs'}")
    key = _key(b"x")
    await blobs.put(key, b"x")
    folder = tmp_path / "blobs" / "sandbox-files" / "blake3"
    old = folder / f"{'a' * 64}#12345"
    young = folder / f"{'b' * 64}#77"
    other = folder / "c#notdigits"
    for path in (old, young, other):
        path.write_bytes(b"partial")
    hour_ago = time.time() - 3600
    os.utime(old, (hour_ago, hour_ago))
    now_ms = time.time_ns() // 1_000_000
    dry = await sweep_blobs(memory_store, blobs, 0, now=lambda: now_ms, dry_run=True)
    assert f"sandbox-files/blake3/{'a' * 64}#12345" in dry.deleted and old.exists()
    report = await sweep_blobs(memory_store, blobs, 0, now=lambda: now_ms)
    assert f"sandbox-files/blake3/{'a' * 64}#12345" in report.deleted
    assert not old.exists() and young.exists() and other.exists()
    assert key in report.deleted  # the unreferenced single blob, as always


class _StoreBeforePacks:
    """A store as it was before packs: everything but the pack index."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        if name in ("locate_blobs", "list_packed_blobs"):
            raise AttributeError(name)
        return getattr(self._inner, name)


async def test_migrate_packs_old_single_objects_once_and_a_sweep_frees_them(
    memory_store: Any, bucket: Any, workspace: Path, data_dir: Path, tmp_path: Path
) -> None:
    files = {f"f{n}.txt": _text(n) for n in range(40)}
    files["big.bin"] = os.urandom((1 << 20) + 1)  # above the threshold: stays single
    write_tree(workspace, files)
    old = await capture_checkpoint(
        workspace, _StoreBeforePacks(memory_store), bucket, "t", CaptureOptions(data_dir=data_dir)
    )
    expected = snapshot_tree(workspace, with_mtime=False)
    singles = {info.key for info in await bucket.list(FILE_PREFIX)}
    assert len(singles) == 41 and await _packs(bucket) == {}

    dry = await migrate_to_packs(memory_store, bucket, dry_run=True)
    assert (dry.candidates, dry.packed, dry.skipped_large, dry.packs_written) == (40, 40, 1, 0)
    assert await _packs(bucket) == {} and await memory_store.list_packed_blobs() == []

    summary = await migrate_to_packs(memory_store, bucket)
    assert (summary.candidates, summary.packed, summary.packs_written) == (40, 40, 1)
    assert summary.problems == 0 and summary.stored_bytes < summary.raw_bytes
    [pack] = await _packs(bucket)
    rows = await memory_store.list_packed_blobs()
    assert {row.key for row in rows} == {_key(files[f"f{n}.txt"]) for n in range(40)}
    assert {row.pack for row in rows} == {pack}
    # Nothing rewritten: the single objects are still there; reads take the pack.
    assert {info.key for info in await bucket.list(FILE_PREFIX)} == singles
    again = await migrate_to_packs(memory_store, bucket)  # idempotent
    assert (again.candidates, again.packed, again.already_packed) == (0, 0, 40)
    assert len(await _packs(bucket)) == 1

    # A sweep (old enough) frees the superseded single objects, not the big one.
    young = await sweep_blobs(memory_store, bucket, HOUR_MS * 2, now=_later)
    assert young.deleted == []
    report = await sweep_blobs(memory_store, bucket, 0, now=_later)
    assert report.failures == []
    # Storage, not keys: the keys stay (kept, referenced), their single objects go.
    assert report.deleted == []
    assert {key for key, _ in report.kept} >= {_key(files[f"f{n}.txt"]) for n in range(40)}
    _each_key_once(report)
    assert {info.key for info in await bucket.list(FILE_PREFIX)} == {_key(files["big.bin"])}
    assert (
        await _restores(memory_store, bucket, old.checkpoint.id, tmp_path / "r", tmp_path)
        == expected
    )
    checked = await check_store(memory_store, bucket, read_data=True)
    assert checked.summary is not None and checked.summary.ok, checked.findings


async def test_migrate_leaves_a_damaged_single_object_alone(
    memory_store: Any, tmp_path: Path, workspace: Path, data_dir: Path
) -> None:
    blobs = open_blobs(f"file://{tmp_path / 'blobs'}")
    write_tree(workspace, {"a": b"alpha" * 100, "b": b"beta" * 100})
    await capture_checkpoint(
        workspace, _StoreBeforePacks(memory_store), blobs, "t", CaptureOptions(data_dir=data_dir)
    )
    victim = tmp_path / "blobs" / _key(b"beta" * 100)
    os.chmod(victim, 0o644)
    victim.write_bytes(b"not beta")
    summary = await migrate_to_packs(memory_store, blobs)
    assert (summary.candidates, summary.packed, summary.problems) == (2, 1, 1)
    located = await memory_store.locate_blobs([_key(b"beta" * 100)])
    assert list(located.values()) == [None]


UPLOAD_SCRIPT = """
import asyncio, os, sys
from checkpointd.blobs import open_blobs

async def parts():
    while True:  # never ends: the test kills this process mid-upload
        yield os.urandom(5 << 20)
        await asyncio.sleep(0.05)

blobs = open_blobs(sys.argv[1])
asyncio.run(blobs.put(sys.argv[2], parts()))
"""


def _kill_mid_multipart(s3_server: Any, prefix: str, key: str) -> None:
    """Start a streamed upload in a child process and SIGKILL it once its first
    part went out (the counting proxy sees it), so no abort request follows."""
    with counted(s3_server) as (via, proxy):
        env = {**os.environ, **via.env()}
        writer = subprocess.Popen(
            [sys.executable, "-c", UPLOAD_SCRIPT, via.url(prefix), key], env=env
        )
        try:
            assert proxy.wait_for("MULTIPART_PART", 1, timeout=60)
        finally:
            writer.kill()
            writer.wait()


@pytest.mark.s3
async def test_a_killed_multipart_upload_is_aborted_by_the_sweep(
    memory_store: Any, s3_server: Any
) -> None:
    prefix = f"staging-{uuid.uuid4().hex}"
    key = _key(b"a large blob that never finished")
    await asyncio.to_thread(_kill_mid_multipart, s3_server, prefix, key)
    blobs = s3_server.open(prefix)
    [left] = await list_staging(blobs)
    assert left.key == f"{prefix}/{key}" and left.name.startswith(f"{key}?uploadId=")
    assert await blobs.head(key) is None  # never an object

    # Younger than the hold: kept.
    fresh = await sweep_blobs(memory_store, blobs, 0)
    assert left.name not in fresh.deleted
    report = await sweep_blobs(memory_store, blobs, 0, now=_later)
    assert report.failures == [] and left.name in report.deleted
    assert await list_staging(blobs) == []


async def test_a_retired_pack_gets_no_rows_while_retired(
    memory_store: Any, bucket: Any, workspace: Path, data_dir: Path
) -> None:
    """The race a concurrent repack could lose: it wrote a pack of the very
    bytes another sweep is deleting. Retiring refuses rows to that pack."""
    write_tree(workspace, {f"f{n}": _text(n) for n in range(5)})
    await capture_checkpoint(
        workspace, memory_store, bucket, "t", CaptureOptions(data_dir=data_dir)
    )
    [pack] = await _packs(bucket)
    rows = await memory_store.list_packed_blobs()
    other = PACK_KEY_PREFIX + "0" * 64
    assert not await memory_store.retire_pack(pack, 60_000)  # rows point at it
    assert await memory_store.retire_pack(other, 60_000)
    assert await memory_store.retire_pack(other, 60_000)  # again: a new hold
    moved = [PackedBlob(r.key, other, r.offset, r.length, r.raw_size, r.codec) for r in rows]
    assert await memory_store.switch_packed_blobs(pack, moved) == []
    assert {r.pack for r in await memory_store.list_packed_blobs()} == {pack}
    fresh = PACK_KEY_PREFIX + "1" * 64
    switched = [PackedBlob(r.key, fresh, r.offset, r.length, r.raw_size, r.codec) for r in rows]
    assert await memory_store.switch_packed_blobs(pack, switched) == [r.key for r in rows]


@pytest.mark.s3
async def test_bucket_requests_stay_a_handful_for_captures_restores_and_sweeps(
    memory_store: Any, s3_server: Any, workspace: Path, data_dir: Path, tmp_path: Path
) -> None:
    """Orders of magnitude (the benchmark counts exactly): 5,000 small files
    were ~10,000 requests to capture and 5,000 to restore before packs."""
    files = {f"d{n % 40}/f{n}.txt": _text(n, 400 + n % 300) for n in range(5000)}
    write_tree(workspace, files)
    with counted(s3_server) as (via, proxy):
        blobs = via.open(f"requests-{uuid.uuid4().hex}")
        await capture_checkpoint(
            workspace, memory_store, blobs, "t", CaptureOptions(data_dir=data_dir)
        )
        cold = proxy.reset()
        assert 0 < sum(cold.values()) <= 20, cold

        for n in range(0, 5000, 100):  # 1% of the files
            files[f"d{n % 40}/f{n}.txt"] += b"# changed\n"
        write_tree(workspace, files)
        await capture_checkpoint(
            workspace, memory_store, blobs, "t", CaptureOptions(data_dir=data_dir)
        )
        changed = proxy.reset()
        assert 0 < sum(changed.values()) <= 10, changed

        await restore_checkpoint(
            tmp_path / "r", memory_store, blobs, "t", RestoreOptions(data_dir=tmp_path / "rd")
        )
        restored = proxy.reset()
        assert 0 < sum(restored.values()) <= 50, restored
        assert snapshot_tree(tmp_path / "r", with_mtime=False) == snapshot_tree(
            workspace, with_mtime=False
        )

        # A sweep with nothing to do lists, and reads nothing.
        await sweep_blobs(memory_store, blobs, 0, now=_later)
        idle = proxy.reset()
        assert set(idle) <= {"LIST", "MULTIPART_LIST"} and sum(idle.values()) <= 10, idle

        # Dropping the first checkpoint leaves 50 dead blobs in the big pack: a
        # sweep drops their rows (no request), and repacks nothing (99% live).
        await prune(memory_store, "t", 1)
        report = await sweep_blobs(memory_store, blobs, 0, now=_later)
        assert len(report.deleted) == 50 and report.failures == []
        pruned = proxy.reset()
        assert sum(pruned.values()) <= 10, pruned
        # Forcing a repack of every pack: a few ranged GETs and one PUT per pack.
        report = await sweep_blobs(memory_store, blobs, 0, now=_later, repack_below=1.0)
        assert any(reason == REPACKED for _, reason in report.kept)
        repacked = proxy.reset()
        assert sum(repacked.values()) <= 30 and repacked.get("PUT", 0) <= 3, repacked


class _StaleOnce:
    """An index whose first answer is from before a sweep moved the blobs (a
    reader that looked up the rows just before a repack and its cleanup)."""

    def __init__(self, store: Any, stale: dict[str, Any]) -> None:
        self.store = store
        self.stale: dict[str, Any] | None = stale

    async def locate_blobs(self, keys: list[str]) -> dict[str, Any]:
        if self.stale is not None:
            stale, self.stale = self.stale, None
            return {key: stale[key] for key in keys if key in stale}
        result: dict[str, Any] = await self.store.locate_blobs(keys)
        return result

    async def locate_rows(self, digests: bytes) -> Any:
        return index_rows(await self.locate_blobs([file_key(d) for d in split_digests(digests)]))

    async def list_packed_blobs(self, *, after: str | None = None, limit: int = 1000) -> Any:
        return await self.store.list_packed_blobs(after=after, limit=limit)


async def test_a_reader_holding_rows_of_a_repacked_pack_reads_the_new_one(
    memory_store: Any, bucket: Any, workspace: Path, data_dir: Path
) -> None:
    from checkpointd.blobs.packs import PackedBlobStore

    files = {f"f{n}": _text(n) for n in range(20)}
    write_tree(workspace, files)
    await capture_checkpoint(
        workspace, memory_store, bucket, "t", CaptureOptions(data_dir=data_dir)
    )
    write_tree(workspace, {f"f{n}": _text(500 + n) for n in range(15)})
    await capture_checkpoint(
        workspace, memory_store, bucket, "t", CaptureOptions(data_dir=data_dir)
    )
    await prune(memory_store, "t", 1)
    live = [_key(files[f"f{n}"]) for n in range(15, 20)]
    before = await memory_store.locate_blobs(live)
    for _ in range(2):  # repack, then delete the old pack
        await sweep_blobs(memory_store, bucket, 0, now=_later)
    [old_pack] = {row.pack for row in before.values()}
    assert old_pack not in await _packs(bucket)
    reader = PackedBlobStore(bucket, _StaleOnce(memory_store, before))
    assert await reader.get_many(live) == [files[f"f{n}"] for n in range(15, 20)]


async def test_a_restore_planned_before_a_repack_reads_the_moved_blobs_from_the_new_pack(
    memory_store: Any, bucket: Any, workspace: Path, data_dir: Path, tmp_path: Path
) -> None:
    """Restore locates its whole plan once; a pack a sweep repacked and deleted
    after that lookup is looked up once more, and the blobs are read from
    their new pack (nothing is missing, nothing is staged twice)."""
    from checkpointd.blobs.packs import PackedBlobStore

    files = {f"f{n}": _text(n) for n in range(20)}
    write_tree(workspace, files)
    await capture_checkpoint(
        workspace, memory_store, bucket, "t", CaptureOptions(data_dir=data_dir)
    )
    write_tree(workspace, {f"f{n}": _text(500 + n) for n in range(15)})
    await capture_checkpoint(
        workspace, memory_store, bucket, "t", CaptureOptions(data_dir=data_dir)
    )
    await prune(memory_store, "t", 1)
    expected = snapshot_tree(workspace, with_mtime=False)
    keys = [
        _key(data)
        for data in [_text(500 + n) for n in range(15)] + [files[f"f{n}"] for n in range(15, 20)]
    ]
    before = await memory_store.locate_blobs(keys)
    for _ in range(2):  # repack, then delete the old pack
        await sweep_blobs(memory_store, bucket, 0, now=_later)
    old_pack = before[_key(files["f19"])].pack
    assert old_pack not in await _packs(bucket)
    reader = PackedBlobStore(bucket, _StaleOnce(memory_store, before))
    target = tmp_path / "restored"
    events: list[Any] = []
    await restore_checkpoint(
        target,
        memory_store,
        reader,
        "t",
        RestoreOptions(data_dir=tmp_path / "d2", progress=events.append),
    )
    assert snapshot_tree(target, with_mtime=False) == expected
    fetched = [event for event in events if event.phase == "fetch"]
    assert fetched[-1].files_done == fetched[-1].files_total == len(set(keys))


async def test_checkpointd_migrate_on_a_sqlite_store_packs_once(
    tmp_path: Path, workspace: Path, data_dir: Path
) -> None:
    import json

    from checkpointd.store import open_store

    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    blobs_url = f"file://{tmp_path / 'blobs'}"
    blobs = open_blobs(blobs_url)
    files = {f"f{n}.txt": _text(n) for n in range(30)}
    write_tree(workspace, files)
    async with await open_store(store_url) as store:
        await capture_checkpoint(
            workspace, _StoreBeforePacks(store), blobs, "t", CaptureOptions(data_dir=data_dir)
        )
    command = [sys.executable, "-m", "checkpointd", "migrate", "--store", store_url,
               "--blobs", blobs_url, "--json"]  # fmt: skip

    def run() -> dict[str, Any]:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])["MigrateSummary"]

    first = await asyncio.to_thread(run)
    assert (first["candidates"], first["packed"], first["packs_written"]) == (30, 30, 1)
    again = await asyncio.to_thread(run)
    assert (again["candidates"], again["packed"], again["already_packed"]) == (0, 0, 30)
    async with await open_store(store_url) as store:
        report = await check_store(store, blobs, read_data=True)
        assert report.summary is not None and report.summary.ok, report.findings
        target = tmp_path / "restored"
        await restore_checkpoint(
            target, store, blobs, "t", RestoreOptions(data_dir=tmp_path / "rd")
        )
        assert snapshot_tree(target, with_mtime=False) == snapshot_tree(workspace, with_mtime=False)
