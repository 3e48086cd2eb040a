"""``check`` on real stores and buckets: a blob deleted from the bucket (a local
blob dir, SeaweedFS S3) is reported and marked; the next capture uploads it again
from the workspace; restore works. Damaged counts are reported and repaired;
``read_data`` finds a blob whose bytes changed."""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from checkpointd.blobs import open_blobs
from checkpointd.blobs.packs import packed_blobs
from checkpointd.capture import CaptureOptions, capture_checkpoint
from checkpointd.check import (
    CORRUPT,
    COUNT_MISMATCH,
    DAMAGED,
    FOUND,
    MISSING,
    REPAIRED,
    check_store,
)
from checkpointd.restore import RestoreOptions, restore_checkpoint
from checkpointd.store import open_store
from checkpointd.store._options import key_to_bytes

from ..fixtures.bitrot import flip_in_sqlite_file
from .conftest import snapshot_tree


def _kinds(report: Any) -> dict[str, set[str]]:
    kinds: dict[str, set[str]] = {}
    for finding in report.findings:
        kinds.setdefault(finding.kind, set()).add(finding.key)
    return kinds


def _key_of(checkpoint: Any, path: str) -> str:
    return next(e.blob_key for e in checkpoint.files if e.path == path)


async def _lose(store: Any, blobs: Any, key: str) -> set[str]:
    """Delete the object holding ``key`` (its pack when packed); the keys lost."""
    row = (await store.locate_blobs([key])).get(key)
    if row is None:
        await blobs.delete(key)
        return {key}
    await blobs.delete(row.pack)
    return {r.key for r in await store.list_packed_blobs() if r.pack == row.pack}


async def _lost_blob_round_trip(tmp_path: Path, store_url: str, blobs: Any) -> None:
    workspace = tmp_path / "ws"
    (workspace / "src").mkdir(parents=True)
    (workspace / "src" / "kept.py").write_text("print('kept')\n")
    (workspace / "src" / "lost.py").write_text("print('this blob will be lost')\n")
    data_dir = tmp_path / "data"
    store = await open_store(store_url)
    try:
        first = await capture_checkpoint(
            workspace, store, blobs, "t", CaptureOptions(data_dir=data_dir)
        )
        lost = _key_of(first.checkpoint, "src/lost.py")
        clean = await check_store(store, blobs)
        assert clean.summary is not None and clean.summary.ok and clean.findings == []
        assert clean.summary.blobs_checked == 2

        # Both small blobs rest in one pack: losing it loses both.
        gone = await _lose(store, blobs, lost)
        assert gone == {lost, _key_of(first.checkpoint, "src/kept.py")}
        stored = packed_blobs(blobs, store)
        assert await stored.missing([lost]) == [lost]
        report = await check_store(store, blobs)
        assert _kinds(report) == {MISSING: gone}
        assert report.summary is not None and not report.summary.ok
        assert await store.list_missing_blobs() == sorted(gone)

        # The parent uses the keys, but the capture does not trust them: uploaded again.
        second = await capture_checkpoint(
            workspace, store, blobs, "t", CaptureOptions(data_dir=data_dir)
        )
        assert second.stats.blobs_uploaded == 2
        assert await stored.missing([lost]) == []
        assert await store.list_missing_blobs() == []
        after = await check_store(store, blobs, read_data=True)
        assert after.summary is not None and after.summary.ok and after.findings == []

        # Both checkpoints restore (the first one uses the re-uploaded blob too).
        for done in (first, second):
            target = tmp_path / f"restored-{done.checkpoint.id}"
            await restore_checkpoint(
                target,
                store,
                blobs,
                "t",
                RestoreOptions(checkpoint_id=done.checkpoint.id, data_dir=data_dir),
            )
            assert snapshot_tree(target) == snapshot_tree(workspace)
    finally:
        await store.aclose()


async def test_a_lost_local_blob_is_reported_then_uploaded_again(tmp_path: Path) -> None:
    blobs = open_blobs(f"file://{tmp_path / 'blobs'}")
    await _lost_blob_round_trip(tmp_path, f"sqlite://{tmp_path / 'store.db'}", blobs)


@pytest.mark.postgres
@pytest.mark.s3
async def test_a_lost_s3_blob_is_reported_then_uploaded_again(
    tmp_path: Path, postgres_url: str, s3_server: Any
) -> None:
    blobs = s3_server.open(f"check-{uuid.uuid4().hex}")
    await _lost_blob_round_trip(tmp_path, postgres_url, blobs)


async def test_a_changed_file_is_not_uploaded_under_the_lost_key(tmp_path: Path) -> None:
    """When the workspace no longer holds the lost bytes, nothing can bring them
    back: the new checkpoint uses the new content and the mark stays."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "a.txt").write_text("old bytes")
    blobs = open_blobs(f"file://{tmp_path / 'blobs'}")
    store = await open_store(f"sqlite://{tmp_path / 'store.db'}")
    try:
        first = await capture_checkpoint(
            workspace, store, blobs, "t", CaptureOptions(data_dir=tmp_path / "d")
        )
        lost = _key_of(first.checkpoint, "a.txt")
        assert await _lose(store, blobs, lost) == {lost}
        await check_store(store, blobs)
        (workspace / "a.txt").write_text("new bytes")
        second = await capture_checkpoint(
            workspace, store, blobs, "t", CaptureOptions(data_dir=tmp_path / "d")
        )
        assert _key_of(second.checkpoint, "a.txt") != lost
        assert await packed_blobs(blobs, store).missing([lost]) == [lost]
        assert await store.list_missing_blobs() == [lost]
        # Once no checkpoint uses the key any more, check drops the mark.
        lease = await store.acquire_writer("t")
        await store.delete_checkpoints("t", 1, lease)
        await lease.release()
        report = await check_store(store, blobs)
        assert _kinds(report) == {FOUND: {lost}}
        assert await store.list_missing_blobs() == []
    finally:
        await store.aclose()


async def _damage_counts(url: str, a: str, b: str, bogus: str) -> None:
    """a: total 7 (was 2), b: no count at all (was 2), bogus: 2 (no manifest)."""
    if url.startswith("sqlite"):
        with sqlite3.connect(url.removeprefix("sqlite://")) as db:
            db.execute("UPDATE blob_references SET refs = 7 WHERE key = ?", (key_to_bytes(a),))
            db.execute("DELETE FROM blob_references WHERE key = ?", (key_to_bytes(b),))
            db.execute("INSERT INTO blob_references VALUES (?, 2)", (key_to_bytes(bogus),))
        return
    conn = await asyncpg.connect(url)
    try:  # counts are rows per (thread, key): thread t's row of a, 6 + u's 1
        await conn.execute(
            "UPDATE checkpointd_blob_counts SET refs = 6 WHERE key = $1 AND thread_id = $2",
            key_to_bytes(a),
            b"t",
        )
        await conn.execute("DELETE FROM checkpointd_blob_counts WHERE key = $1", key_to_bytes(b))
        await conn.execute(
            "INSERT INTO checkpointd_blob_counts (thread_id, key, refs) VALUES ($1, $2, 2)",
            b"t",
            key_to_bytes(bogus),
        )
    finally:
        await conn.close()


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
async def test_damaged_counts_are_reported_and_repaired(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "a.txt").write_text("a")
    (workspace / "b.txt").write_text("b")
    url = (
        f"sqlite://{tmp_path / 'store.db'}"
        if backend == "sqlite"
        else request.getfixturevalue("postgres_url")
    )
    blobs = open_blobs(f"file://{tmp_path / 'blobs'}")
    store = await open_store(url)
    try:
        done = await capture_checkpoint(
            workspace, store, blobs, "t", CaptureOptions(data_dir=tmp_path / "d")
        )
        await capture_checkpoint(
            workspace, store, blobs, "u", CaptureOptions(data_dir=tmp_path / "d")
        )
        a, b = _key_of(done.checkpoint, "a.txt"), _key_of(done.checkpoint, "b.txt")
        bogus = "sandbox-files/blake3/" + "ab" * 32
        await _damage_counts(url, a, b, bogus)
        report = await check_store(store, blobs)
        assert _kinds(report) == {COUNT_MISMATCH: {a, b, bogus}}
        by_key = {f.key: f for f in report.findings}
        assert (by_key[a].stored, by_key[a].manifests) == (7, 2)
        assert (by_key[b].stored, by_key[b].manifests) == (0, 2)
        assert (by_key[bogus].stored, by_key[bogus].manifests) == (2, 0)

        repaired = await check_store(store, blobs, repair=True)
        assert _kinds(repaired) == {COUNT_MISMATCH: {a, b, bogus}, REPAIRED: {a, b, bogus}}
        assert repaired.summary is not None and repaired.summary.ok
        references = {(r.key, r.references) for r in await store.list_blob_references()}
        assert references == {(a, 2), (b, 2)}
        again = await check_store(store, blobs)
        assert again.findings == [] and again.summary is not None and again.summary.ok
        # The repaired counts are the real ones: deleting a thread's checkpoint
        # takes them down to exactly what the other thread uses.
        lease = await store.acquire_writer("u")
        await store.delete_head("u", (await store.get_head("u")) or "", lease)
        await lease.release()
        references = {(r.key, r.references) for r in await store.list_blob_references()}
        assert references == {(a, 1), (b, 1)}
        assert (await check_store(store, blobs)).findings == []
    finally:
        await store.aclose()


async def test_read_data_finds_changed_bytes(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "same-size.txt").write_text("0123456789")
    (workspace / "shorter.txt").write_text("a longer text")
    blob_dir = tmp_path / "blobs"
    blobs = open_blobs(f"file://{blob_dir}")
    store = await open_store(f"sqlite://{tmp_path / 'store.db'}")
    try:
        done = await capture_checkpoint(
            workspace, store, blobs, "t", CaptureOptions(data_dir=tmp_path / "d")
        )
        same = _key_of(done.checkpoint, "same-size.txt")
        shorter = _key_of(done.checkpoint, "shorter.txt")
        # Both rest in one pack: the earlier frame gets other bytes of its size
        # (the pack itself stays whole).
        rows = await store.locate_blobs([same, shorter])
        first, last = sorted(rows.values(), key=lambda row: row.offset)  # type: ignore[union-attr]
        pack = await blobs.get(first.pack)
        other = bytes(b ^ 0x01 for b in pack[first.offset : first.offset + first.length])
        damaged = pack[: first.offset] + other + pack[first.offset + first.length :]
        (blob_dir / first.pack).write_bytes(damaged)
        assert (await check_store(store, blobs)).findings == []  # existence only
        report = await check_store(store, blobs, read_data=True)
        assert _kinds(report) == {CORRUPT: {first.key}}
        [finding] = report.findings
        assert first.pack in finding.message
        assert report.summary is not None and not report.summary.ok
        # A pack cut inside the later frame is found without reading the data:
        # its trailer is gone.
        (blob_dir / first.pack).write_bytes(pack[: last.offset + 5])
        cut = await check_store(store, blobs)
        assert _kinds(cut) == {CORRUPT: {same, shorter}}
        assert all(first.pack in f.message for f in cut.findings)
        assert not report.summary.ok
    finally:
        await store.aclose()


@pytest.fixture(
    params=[
        pytest.param(("memory", "file"), id="memory-file"),
        pytest.param(("sqlite", "file"), id="sqlite-file"),
        pytest.param(("sqlite", "s3"), id="sqlite-s3", marks=pytest.mark.s3),
        pytest.param(
            ("postgres", "s3"), id="postgres-s3", marks=[pytest.mark.postgres, pytest.mark.s3]
        ),
    ]
)
async def store_and_bucket(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    store_kind, blob_kind = request.param
    url = {
        "memory": lambda: "memory://",
        "sqlite": lambda: f"sqlite://{tmp_path / 'store.db'}",
        "postgres": lambda: request.getfixturevalue("postgres_url"),
    }[store_kind]()
    blobs = (
        open_blobs(f"file://{tmp_path / 'blobs'}")
        if blob_kind == "file"
        else request.getfixturevalue("s3_server").open(f"check-{uuid.uuid4().hex}")
    )
    store = await open_store(url)
    try:
        yield store, blobs
    finally:
        await store.aclose()


async def test_check_drops_the_rows_of_a_lost_pack_so_a_new_capture_uploads_again(
    tmp_path: Path, store_and_bucket: Any
) -> None:
    """A lost pack's rows must not keep claiming its blobs: a capture of the same
    tree, even on a new thread (no parent to distrust), uploads them again and
    its checkpoint restores."""
    store, blobs = store_and_bucket
    workspace = tmp_path / "ws"
    (workspace / "src").mkdir(parents=True)
    for n in range(20):
        (workspace / "src" / f"m{n}.py").write_text(f"def f{n}():\n    return {n}\n" * 20)
    data_dir = tmp_path / "data"
    first = await capture_checkpoint(
        workspace, store, blobs, "t", CaptureOptions(data_dir=data_dir)
    )
    keys = sorted({e.blob_key for e in first.checkpoint.files if getattr(e, "blob_key", None)})
    [pack] = {row.pack for row in (await store.locate_blobs(keys)).values() if row is not None}
    await blobs.delete(pack)

    report = await check_store(store, blobs)
    assert _kinds(report) == {MISSING: set(keys)}
    # The rows went with the marks: the keys are lost single objects now.
    assert await store.locate_blobs(keys) == dict.fromkeys(keys)
    assert await store.list_packed_blobs() == []
    assert await store.list_missing_blobs() == keys
    again = await check_store(store, blobs)  # the same findings, nothing else to drop
    assert _kinds(again) == {MISSING: set(keys)}

    second = await capture_checkpoint(
        workspace, store, blobs, "u", CaptureOptions(data_dir=data_dir)
    )
    assert second.stats.blobs_uploaded == len(keys)
    assert await store.list_missing_blobs() == []
    after = await check_store(store, blobs, read_data=True)
    assert after.summary is not None and after.summary.ok, after.findings
    for thread, done in (("u", second), ("t", first)):  # the old one reads the new pack
        target = tmp_path / f"restored-{thread}"
        await restore_checkpoint(
            target,
            store,
            blobs,
            thread,
            RestoreOptions(checkpoint_id=done.checkpoint.id, data_dir=data_dir),
        )
        assert snapshot_tree(target) == snapshot_tree(workspace)


async def test_a_row_moved_to_a_new_pack_is_not_forgotten(store_and_bucket: Any) -> None:
    """forget_lost_packed_blobs removes a row only while it still names the lost
    pack (a capture may have uploaded the blob again meanwhile)."""
    from checkpointd.store.base import PackedBlob

    store, _blobs = store_and_bucket
    key = "sandbox-files/blake3/" + "12" * 32
    lost_pack, new_pack = ("sandbox-packs/blake3/" + c * 64 for c in "ef")
    lease = await store.acquire_writer("t")
    from checkpointd.ids import new_uuid7
    from checkpointd.model import Checkpoint, FileEntry

    checkpoint = Checkpoint(
        id=new_uuid7(), thread_id="t", parent_checkpoint_id=None, created_at=1,
        files=(FileEntry("a", key, 10),),
    )  # fmt: skip
    await store.append(
        checkpoint, None, lease, packed_blobs=[PackedBlob(key, new_pack, 8, 5, 10, 1)]
    )
    await lease.release()
    stale = PackedBlob(key, lost_pack, 8, 5, 10, 1)
    assert await store.forget_lost_packed_blobs([stale]) == []
    assert (await store.locate_blobs([key]))[key].pack == new_pack
    assert await store.list_missing_blobs() == []
    current = PackedBlob(key, new_pack, 8, 5, 10, 1)
    assert await store.forget_lost_packed_blobs([current]) == [key]
    assert await store.locate_blobs([key]) == {key: None}
    assert await store.list_missing_blobs() == [key]


async def test_repair_keeps_the_healthy_blobs_of_a_pack_with_a_damaged_frame(
    tmp_path: Path, store_and_bucket: Any
) -> None:
    """One frame of a pack damaged in the bucket: check --read-data reports it;
    --repair copies the pack's other blobs to a new pack, drops the damaged
    key's row and marks it missing; the next capture of a workspace holding
    those bytes uploads them again, and the older checkpoint restores whole."""
    store, blobs = store_and_bucket
    workspace = tmp_path / "ws"
    (workspace / "src").mkdir(parents=True)
    for n in range(40):
        (workspace / "src" / f"m{n}.py").write_text(f"def f{n}():\n    return {n}\n" * 20)
    (workspace / "src" / "victim.py").write_text("the frame of these bytes will rot\n" * 30)
    data_dir = tmp_path / "data"
    first = await capture_checkpoint(
        workspace, store, blobs, "t", CaptureOptions(data_dir=data_dir)
    )
    keys = sorted({e.blob_key for e in first.checkpoint.files if getattr(e, "blob_key", None)})
    victim = _key_of(first.checkpoint, "src/victim.py")
    row = (await store.locate_blobs([victim]))[victim]
    assert row is not None
    pack = bytearray(await blobs.get(row.pack))
    pack[row.offset + row.length // 2] ^= 0x55
    await blobs.delete(row.pack)
    await blobs.put(row.pack, bytes(pack))

    found = await check_store(store, blobs, read_data=True)
    assert _kinds(found) == {CORRUPT: {victim}}
    assert await store.list_missing_blobs() == []  # reported, nothing changed

    repaired = await check_store(store, blobs, read_data=True, repair=True)
    assert _kinds(repaired) == {CORRUPT: {victim}, REPAIRED: {victim, row.pack}}
    messages = {f.key: f.message for f in repaired.findings if f.kind == REPAIRED}
    assert "marked missing" in messages[victim]
    assert f"{len(keys) - 1} healthy blobs copied to pack" in messages[row.pack]
    assert repaired.summary is not None
    assert (repaired.summary.packs_repaired, repaired.summary.repaired) == (2, 0)
    assert await store.list_missing_blobs() == [victim]
    healthy = [key for key in keys if key != victim]
    located = await store.locate_blobs(keys)
    assert located[victim] is None  # no row: a lost single object until uploaded again
    assert {located[key].pack for key in healthy} == {located[healthy[0]].pack} != {row.pack}
    stored = packed_blobs(blobs, store)
    assert len(await stored.get_many(healthy)) == len(healthy)  # each checked against its key

    second = await capture_checkpoint(
        workspace, store, blobs, "t", CaptureOptions(data_dir=data_dir)
    )
    assert second.stats.blobs_uploaded == 1
    assert await store.list_missing_blobs() == []
    after = await check_store(store, blobs, read_data=True)
    assert after.summary is not None and after.summary.ok, after.findings
    target = tmp_path / "restored"
    await restore_checkpoint(
        target,
        store,
        blobs,
        "t",
        RestoreOptions(checkpoint_id=first.checkpoint.id, data_dir=data_dir),
    )
    assert snapshot_tree(target) == snapshot_tree(workspace)


async def test_check_names_every_damaged_checkpoint_and_goes_on(tmp_path: Path) -> None:
    """Rows damaged in two threads of a SQLite file and a blob lost from the
    bucket: check reports each damaged checkpoint (and the one stored against
    it), still checks the blobs, and a repair leaves the counts alone."""
    path = tmp_path / "store.db"
    blobs = open_blobs(f"file://{tmp_path / 'blobs'}")
    workspace, data_dir = tmp_path / "ws", tmp_path / "data"
    workspace.mkdir()
    for n in range(30):
        (workspace / f"f{n}.txt").write_text(f"file {n}\n" * 40)
    store = await open_store(f"sqlite://{path}")
    made: dict[str, list[str]] = {}
    for thread in ("a", "b"):
        for n in range(2):
            (workspace / "changing.txt").write_text(f"{thread} {n}\n")
            done = await capture_checkpoint(
                workspace, store, blobs, thread, CaptureOptions(data_dir=data_dir)
            )
            made.setdefault(thread, []).append(done.checkpoint.id)
    lost = _key_of(done.checkpoint, "f0.txt")  # used by readable checkpoints too
    await store.aclose()
    flip_in_sqlite_file(path, made["a"][0], "document")
    flip_in_sqlite_file(path, made["b"][1], "manifest")
    store = await open_store(f"sqlite://{path}")
    try:
        await _lose(store, blobs, lost)
        report = await check_store(store, blobs, repair=True)
        kinds = _kinds(report)
        assert kinds[DAMAGED] == {*made["a"], made["b"][1]}
        assert lost in kinds[MISSING]
        assert REPAIRED not in kinds  # not while a damaged checkpoint is stored
        messages = {f.key: f.message for f in report.findings if f.kind == DAMAGED}
        assert f"stored against checkpoint {made['a'][0]!r}" in messages[made["a"][1]]
        assert "fails its BLAKE3 checksum" in messages[made["b"][1]]
        summary = report.summary
        assert summary is not None and not summary.ok
        assert summary.damaged_checkpoints == 3 and summary.corrupt == 3
    finally:
        await store.aclose()
