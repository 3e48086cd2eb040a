"""The manifest stays bytes from the scan to the store.

A capture hands the store a trusted ``Manifest``; ``Checkpoint.files`` reads as
the same entries as before; a capture that changed nothing stores a delta with
no rows; names docs/contract.md#data-model forbids and mount points are refused by the scan itself,
before any blob is written.
"""

from __future__ import annotations

import os
import sqlite3
import struct
import subprocess
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from checkpointd import CaptureOptions, capture_checkpoint, open_blobs, open_store
from checkpointd.codec import decode_entries
from checkpointd.errors import UNSUPPORTED_ENTRY, SandboxSnapshotError
from checkpointd.manifest import Manifest
from checkpointd.model import Checkpoint, DirEntry, FileEntry, Policy

from .conftest import write_tree


async def test_files_is_a_lazy_sequence_equal_to_the_entries(
    store: Any, blobs: Any, workspace: Path, data_dir: Path
) -> None:
    write_tree(workspace, {"a.txt": b"a", "d/b.txt": b"bb"})
    result = await capture_checkpoint(
        workspace, store, blobs, "t", CaptureOptions(data_dir=data_dir)
    )
    files = result.checkpoint.files
    assert isinstance(files, Manifest) and files.trusted
    entries = decode_entries(files.data)
    assert files == entries and entries == tuple(files)
    assert hash(files) == hash(entries)
    assert len(files) == 3 and [e.path for e in files] == ["a.txt", "d", "d/b.txt"]
    assert isinstance(files[0], FileEntry) and isinstance(files[1], DirEntry)
    assert files.totals() == (3, 2, 3)
    stored = await store.get(result.checkpoint.id)
    assert stored == result.checkpoint
    assert stored.files == entries


async def test_a_checkpoint_built_by_a_caller_still_validates_and_round_trips(
    store: Any,
) -> None:
    lease = await store.acquire_writer("t")
    entries = (DirEntry("d"), FileEntry("d/x", "sandbox-files/blake3/" + "a" * 64, 1))
    checkpoint = Checkpoint(
        id="c1", thread_id="t", parent_checkpoint_id=None, created_at=1, files=entries
    )
    await store.append(checkpoint, None, lease)
    got = await store.get("c1")
    assert got.files == entries and tuple(got.files) == entries
    await lease.release()


async def test_no_change_capture_stores_a_delta_with_no_rows(
    tmp_path: Path, workspace: Path, data_dir: Path
) -> None:
    write_tree(workspace, {f"d{n % 10}/f{n}.txt": f"file {n}".encode() for n in range(2000)})
    db = tmp_path / "s.db"
    async with await open_store(f"sqlite:///{db}") as store:
        blobs = open_blobs(f"file://{tmp_path / 'blobs'}")
        first = await capture_checkpoint(
            workspace, store, blobs, "t", CaptureOptions(data_dir=data_dir)
        )
        second = await capture_checkpoint(
            workspace, store, blobs, "t", CaptureOptions(data_dir=data_dir)
        )
        assert second.stats.files_hashed == 0 and second.stats.blobs_uploaded == 0
        assert second.checkpoint.files == first.checkpoint.files
    with sqlite3.connect(db) as conn:
        rows = dict(conn.execute("SELECT id, length(document) FROM checkpoints").fetchall())
        (base_id,) = conn.execute(
            "SELECT base_id FROM checkpoints WHERE id = ?", (second.checkpoint.id,)
        ).fetchone()
        (document,) = conn.execute(
            "SELECT document FROM checkpoints WHERE id = ?", (second.checkpoint.id,)
        ).fetchone()
    assert base_id == first.checkpoint.id
    # Header + document + one copy run: a few hundred bytes whatever the
    # number of entries.
    assert document[:4] == b"CKD4"  # magic, document length, BLAKE3 checksum (32 bytes)
    (packed,) = struct.unpack_from("<I", document, 4)
    raw = zlib.decompress(document[40 : 40 + packed]) + zlib.decompress(document[40 + packed :])
    assert len(raw) < 700, len(raw)
    assert rows[second.checkpoint.id] < rows[first.checkpoint.id] / 20


async def test_a_backslash_name_is_unsupported_at_scan_time_with_no_blob_written(
    tmp_path: Path, workspace: Path, data_dir: Path
) -> None:
    write_tree(workspace, {"ok.txt": b"fine", "bad\\name.txt": b"never uploaded"})
    blob_dir = tmp_path / "blobs"
    async with await open_store("memory://") as store:
        blobs = open_blobs(f"file://{blob_dir}")
        with pytest.raises(SandboxSnapshotError) as raised:
            await capture_checkpoint(
                workspace, store, blobs, "t", CaptureOptions(data_dir=data_dir)
            )
        assert raised.value.code == UNSUPPORTED_ENTRY
        assert raised.value.details["paths"] == ["bad\\name.txt"]
        assert not blob_dir.exists() or not any(blob_dir.rglob("*"))
        # Excluded, it is fine.
        result = await capture_checkpoint(
            workspace,
            store,
            blobs,
            "t",
            CaptureOptions(data_dir=data_dir, policy=Policy(exclude=("bad*",))),
        )
        assert [e.path for e in result.checkpoint.files] == ["ok.txt"]


async def test_a_non_utf8_name_is_unsupported_with_no_blob_written(
    tmp_path: Path, workspace: Path, data_dir: Path
) -> None:
    write_tree(workspace, {"ok.txt": b"fine"})
    (workspace / os.fsdecode(b"bad\xff")).write_bytes(b"never uploaded")
    blob_dir = tmp_path / "blobs"
    async with await open_store("memory://") as store:
        blobs = open_blobs(f"file://{blob_dir}")
        with pytest.raises(SandboxSnapshotError) as raised:
            await capture_checkpoint(
                workspace, store, blobs, "t", CaptureOptions(data_dir=data_dir)
            )
        assert raised.value.code == UNSUPPORTED_ENTRY
        assert not blob_dir.exists() or not any(blob_dir.rglob("*"))


@pytest.fixture
def mounted_dir(workspace: Path) -> Iterator[Path]:
    """A tmpfs mounted inside the workspace (another filesystem)."""
    mount_point = workspace / "mnt"
    mount_point.mkdir(parents=True)
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
    try:
        (mount_point / "inside.txt").write_bytes(b"on another filesystem")
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


async def test_a_mount_point_is_unsupported_unless_excluded(
    mounted_dir: Path, workspace: Path, data_dir: Path
) -> None:
    write_tree(workspace, {"ok.txt": b"fine"})
    async with await open_store("memory://") as store:
        blobs = open_blobs("memory://")
        with pytest.raises(SandboxSnapshotError) as raised:
            await capture_checkpoint(
                workspace, store, blobs, "t", CaptureOptions(data_dir=data_dir)
            )
        assert raised.value.code == UNSUPPORTED_ENTRY
        assert raised.value.details["paths"] == ["mnt"]
        assert "mount-point" in str(raised.value)
        result = await capture_checkpoint(
            workspace,
            store,
            blobs,
            "t",
            CaptureOptions(data_dir=data_dir, policy=Policy(exclude=("/mnt",))),
        )
        assert [e.path for e in result.checkpoint.files] == ["ok.txt"]
