"""The batch path for a file:// bucket: small files go up (and come back) many per
worker-thread trip, with the same rules as the per-blob path: files changed under
the capture are hashed again, a cancelled capture stops, nothing torn is stored."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import blake3
import pytest

from checkpointd import _native
from checkpointd._capture_upload import BATCH_FILES
from checkpointd.blobs import open_blobs
from checkpointd.blobs.packs import packed_blobs
from checkpointd.capture import FILE_CHANGED, CaptureOptions, capture_checkpoint
from checkpointd.errors import INVALID_BLOB, SandboxSnapshotError
from checkpointd.model import FileEntry
from checkpointd.progress import Progress
from checkpointd.restore import RestoreOptions, restore_checkpoint
from checkpointd.store import open_store

from .conftest import snapshot_tree, write_tree


def _key(data: bytes) -> str:
    return "sandbox-files/blake3/" + blake3.blake3(data).hexdigest()


def _stored_blobs(root: Path) -> dict[str, bytes]:
    """Every blob in the bucket directory: single objects and the blobs each
    pack lists (small blobs rest in packs). Every file must be a complete pack
    or blob named by its own hash (no staging leftovers)."""
    found: dict[str, bytes] = {}
    for name, data in _blob_files(root).items():
        if not name.startswith("sandbox-packs/"):
            assert name == _key(data)
            found[name] = data
            continue
        assert name == "sandbox-packs/blake3/" + blake3.blake3(data).hexdigest()
        for digest, offset, length, raw, codec, _kind in _native.read_pack_trailer(data, len(data)):
            [found["sandbox-files/blake3/" + digest]] = _native.unpack_many(
                data, 0, [(digest, offset, length, raw, codec)]
            )
    return found


def _blob_files(root: Path) -> dict[str, bytes]:
    """Every file under the bucket directory, staging leftovers included."""
    return {
        str(path.relative_to(root)): path.read_bytes() for path in root.rglob("*") if path.is_file()
    }


@pytest.fixture
def file_blobs(tmp_path: Path) -> Any:
    return open_blobs(f"file://{tmp_path / 'blobs'}")


async def _warm_stat_cache(workspace: Path, data_dir: Path) -> None:
    """Capture once elsewhere, so the next scan reuses every hash from the stat
    cache: it then reads no file, and the upload reads the small files itself
    (the batch path this module tests; a file the scan hashes is read once and
    its bytes handed straight to the upload)."""
    async with await open_store("memory://") as elsewhere:
        await capture_checkpoint(
            workspace, elsewhere, open_blobs("memory://"), "warm", CaptureOptions(data_dir=data_dir)
        )


async def test_many_small_files_in_several_batches_round_trip(
    memory_store: Any, file_blobs: Any, workspace: Path, tmp_path: Path, data_dir: Path
) -> None:
    count = BATCH_FILES * 2 + 7
    # Every third file repeats another's bytes: one blob, uploaded once.
    files = {f"d{n % 13}/f{n}.txt": f"content {n // 3 * 3}".encode() for n in range(count)}
    files["empty"] = b""
    write_tree(workspace, files)
    first = await capture_checkpoint(
        workspace, memory_store, file_blobs, "t", CaptureOptions(data_dir=data_dir)
    )
    distinct = set(files.values())
    assert first.stats.blobs_uploaded == len(distinct)
    assert first.stats.bytes_uploaded == sum(len(data) for data in distinct)
    # Only complete blobs, each under its own hash; no staging file left.
    assert _stored_blobs(tmp_path / "blobs") == {_key(data): data for data in distinct}

    # Another thread (no parent to trust) finds every blob already there.
    again = await capture_checkpoint(
        workspace, memory_store, file_blobs, "u", CaptureOptions(data_dir=data_dir)
    )
    assert again.stats.blobs_uploaded == 0

    restored = tmp_path / "restored"
    await restore_checkpoint(
        restored, memory_store, file_blobs, "t", RestoreOptions(data_dir=data_dir)
    )
    assert snapshot_tree(restored) == snapshot_tree(workspace)


async def test_file_changed_during_a_batch_is_hashed_again_never_stored_torn(
    memory_store: Any, file_blobs: Any, workspace: Path, tmp_path: Path, data_dir: Path
) -> None:
    old, new = b"small before", b"small after the scan"
    others = {f"other{n}.txt": f"other {n}".encode() for n in range(20)}
    write_tree(workspace, {"small.txt": old, "gone.txt": b"gone", **others})
    await _warm_stat_cache(workspace, data_dir)

    def change_files(report: Progress) -> None:
        if report.phase == "upload" and (workspace / "gone.txt").exists():
            (workspace / "small.txt").write_bytes(new)
            (workspace / "gone.txt").unlink()

    result = await capture_checkpoint(
        workspace,
        memory_store,
        file_blobs,
        "t",
        CaptureOptions(data_dir=data_dir, progress=change_files),
    )
    files = {e.path: e for e in result.checkpoint.files if isinstance(e, FileEntry)}
    assert set(files) == {"small.txt", *others}
    assert files["small.txt"].blob_key == _key(new)
    stored = packed_blobs(file_blobs, memory_store)  # what a restore can read
    assert await stored.head(_key(old)) is None
    assert await stored.head(_key(b"gone")) is None
    restored = tmp_path / "restored"
    await restore_checkpoint(
        restored, memory_store, file_blobs, "t", RestoreOptions(data_dir=data_dir)
    )
    assert snapshot_tree(restored, with_mtime=False) == snapshot_tree(workspace, with_mtime=False)


async def test_a_file_that_keeps_changing_is_reported(
    memory_store: Any, file_blobs: Any, workspace: Path, data_dir: Path
) -> None:
    write_tree(workspace, {"busy.log": b"line 0\n", "calm.txt": b"calm"})
    await _warm_stat_cache(workspace, data_dir)
    lines = [0]

    def keep_writing(report: Progress) -> None:
        if report.phase == "upload":
            lines[0] += 1
            with open(workspace / "busy.log", "ab") as handle:
                handle.write(f"line {lines[0]}\n".encode())

    with pytest.raises(SandboxSnapshotError) as caught:
        await capture_checkpoint(
            workspace,
            memory_store,
            file_blobs,
            "t",
            CaptureOptions(data_dir=data_dir, progress=keep_writing),
        )
    assert caught.value.code == FILE_CHANGED
    assert caught.value.details["paths"] == ["busy.log"]
    assert await memory_store.get_head("t") is None


async def test_a_token_cancelled_during_uploads_stops_the_batches(
    memory_store: Any, file_blobs: Any, workspace: Path, tmp_path: Path, data_dir: Path
) -> None:
    write_tree(workspace, {f"f{n}": f"bytes {n}".encode() for n in range(BATCH_FILES * 3)})
    await _warm_stat_cache(workspace, data_dir)
    token = _native.CancelToken()

    def cancel_at_upload(report: Progress) -> None:
        if report.phase == "upload":
            token.cancel()

    with pytest.raises(_native.ScanCancelled):
        await capture_checkpoint(
            workspace,
            memory_store,
            file_blobs,
            "t",
            CaptureOptions(data_dir=data_dir, progress=cancel_at_upload, cancel=token),
        )
    assert await memory_store.get_head("t") is None
    assert _blob_files(tmp_path / "blobs") == {}
    lease = await memory_store.acquire_writer("t")  # released
    await lease.release()


async def test_secrets_are_zeroed_in_batched_blobs(
    memory_store: Any, file_blobs: Any, workspace: Path, tmp_path: Path, data_dir: Path
) -> None:
    write_tree(workspace, {"env": b"TOKEN=hunter2-secret\n"})
    result = await capture_checkpoint(
        workspace,
        memory_store,
        file_blobs,
        "t",
        CaptureOptions(data_dir=data_dir, secrets=[b"hunter2-secret"]),
    )
    zeroed = b"TOKEN=" + bytes(len(b"hunter2-secret")) + b"\n"
    assert [e.blob_key for e in result.checkpoint.files] == [_key(zeroed)]
    assert _stored_blobs(tmp_path / "blobs") == {_key(zeroed): zeroed}


async def test_a_damaged_blob_in_a_batch_fails_restore_before_any_change(
    memory_store: Any, file_blobs: Any, workspace: Path, tmp_path: Path, data_dir: Path
) -> None:
    files = {f"f{n}.txt": f"bytes {n}".encode() for n in range(BATCH_FILES + 5)}
    write_tree(workspace, files)
    await capture_checkpoint(
        workspace, memory_store, file_blobs, "t", CaptureOptions(data_dir=data_dir)
    )
    damaged = _key(files["f200.txt"])
    # Its frame in the pack: same size, other bytes (stored raw: too short to compress).
    row = (await memory_store.locate_blobs([damaged]))[damaged]
    pack = await file_blobs.get(row.pack)
    assert pack[row.offset : row.offset + row.length] == b"bytes 200"
    await file_blobs.put(
        row.pack,
        pack[: row.offset] + b"bytes 2OO" + pack[row.offset + row.length :],
        if_absent=False,
    )
    target = tmp_path / "target"
    write_tree(target, {"keep.txt": b"untouched"})
    before = snapshot_tree(target)
    with pytest.raises(SandboxSnapshotError) as caught:
        await restore_checkpoint(
            target, memory_store, file_blobs, "t", RestoreOptions(data_dir=data_dir)
        )
    assert caught.value.code == INVALID_BLOB
    assert caught.value.details["key"] == damaged
    assert snapshot_tree(target) == before
    assert sorted(os.listdir(target)) == ["keep.txt"]
