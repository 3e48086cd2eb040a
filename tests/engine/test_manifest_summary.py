"""Manifest summaries (1M-file RSS): every stored row carries its
manifest's length, BLAKE3 fingerprint and totals; a store hands a keyframe's
manifest out unloaded, and a no-change capture compares fingerprints and
appends its parent's manifest object again, so the parent's bytes are never
loaded. A change that keeps the manifest's length is still caught, and rows
written before summaries (the ``CKD2`` layout) are read and gain one with
the next append. Real SQLite files and a real PostgreSQL server."""

from __future__ import annotations

import json
import sqlite3
import struct
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import blake3
import pytest

from checkpointd.blobs import open_blobs
from checkpointd.capture import CaptureOptions, capture_checkpoint
from checkpointd.codec import encode_entries
from checkpointd.manifest import Manifest
from checkpointd.model import FileEntry
from checkpointd.store import open_store

from .conftest import write_tree

SQL_STORES = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=SQL_STORES)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    url: str = request.getfixturevalue("postgres_url")
    return url


def _tree() -> dict[str, bytes | str]:
    files: dict[str, bytes | str] = {f"src/m{n}.py": b"x = %d\n" % n for n in range(300)}
    files["docs/readme.md"] = b"hello\n"
    files["link"] = "docs/readme.md"
    return files


def _fingerprint(data: bytes) -> bytes:
    """BLAKE3 from the reference library (not our code)."""
    return blake3.blake3(data).digest()


async def _stored_rows(url: str) -> dict[str, bytes]:
    """id -> the stored document bytes, straight from the database."""
    if url.startswith("sqlite://"):
        with sqlite3.connect(url.removeprefix("sqlite://")) as conn:
            return dict(conn.execute("SELECT id, document FROM checkpoints").fetchall())
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch("SELECT id, document FROM checkpointd_checkpoints")
    finally:
        await conn.close()
    return {bytes(row["id"]).decode(): bytes(row["document"]) for row in rows}


async def _rewrite_rows(url: str, rewrite: Callable[[bytes], bytes]) -> None:
    """Replace every stored document by ``rewrite(document)``."""
    if url.startswith("sqlite://"):
        with sqlite3.connect(url.removeprefix("sqlite://")) as conn:
            rows = conn.execute("SELECT id, document FROM checkpoints").fetchall()
            for checkpoint_id, data in rows:
                conn.execute(
                    "UPDATE checkpoints SET document = ? WHERE id = ?",
                    (rewrite(data), checkpoint_id),
                )
        return
    conn = await asyncpg.connect(url)
    try:
        for row in await conn.fetch("SELECT id, document FROM checkpointd_checkpoints"):
            await conn.execute(
                "UPDATE checkpointd_checkpoints SET document = $1 WHERE id = $2",
                rewrite(bytes(row["document"])),
                row["id"],
            )
    finally:
        await conn.close()


def _as_ckd2(data: bytes) -> bytes:
    """A current row as the previous release wrote it: one zlib stream of
    ``CKD2``, the document's length, the document (no summary), the section."""
    assert data[:4] == b"CKD4"  # magic, document length, BLAKE3 checksum (32 bytes)
    (packed,) = struct.unpack_from("<I", data, 4)
    document = json.loads(zlib.decompress(data[40 : 40 + packed]))
    assert len(document.pop("manifest")) == 5  # the summary this release adds
    section = zlib.decompress(data[40 + packed :])
    raw = json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()
    return zlib.compress(struct.pack("<4sI", b"CKD2", len(raw)) + raw + section, 1)


def _summary_of(data: bytes) -> list[Any] | None:
    """The summary a stored row carries (None: none, or an older layout)."""
    if data[:4] != b"CKD4":
        return None
    (packed,) = struct.unpack_from("<I", data, 4)
    summary: list[Any] | None = json.loads(zlib.decompress(data[40 : 40 + packed])).get("manifest")
    return summary


def _mode_of(files: Any, path: str) -> int:
    (entry,) = (e for e in files if e.path == path)
    assert isinstance(entry, FileEntry)
    return entry.mode


async def test_a_no_change_capture_never_loads_its_parents_manifest(
    tmp_path: Path, workspace: Path, data_dir: Path, store_url: str
) -> None:
    write_tree(workspace, _tree())
    blobs = open_blobs(f"file://{tmp_path / 'blobs'}")
    async with await open_store(store_url) as store:
        first = await capture_checkpoint(
            workspace, store, blobs, "t", CaptureOptions(data_dir=data_dir)
        )
    data = first.checkpoint.files.data
    rows = await _stored_rows(store_url)
    assert _summary_of(rows[first.checkpoint.id]) == [
        len(data),
        _fingerprint(data).hex(),
        len(first.checkpoint.files),
        301,
        sum(len(b"x = %d\n" % n) for n in range(300)) + len(b"hello\n"),
    ]

    # A fresh store object, as a restarted daemon has.
    async with await open_store(store_url) as store:
        head = await store.get(first.checkpoint.id)
        assert head is not None
        files = head.files
        assert isinstance(files, Manifest) and not files.loaded
        assert files.fingerprint() == _fingerprint(data) and files.byte_length() == len(data)
        assert len(files) == len(first.checkpoint.files) and not files.loaded

        again = await capture_checkpoint(
            workspace, store, blobs, "t", CaptureOptions(data_dir=data_dir)
        )
        assert again.stats.files_hashed == 0 and again.stats.entries == len(first.checkpoint.files)
        kept = again.checkpoint.files
        assert isinstance(kept, Manifest) and not kept.loaded  # the parent's, never loaded
        assert not files.loaded
        # Its row: a copy of the parent's rows and a summary, whatever the size.
        stored = (await _stored_rows(store_url))[again.checkpoint.id]
        assert len(stored) < 700, len(stored)
        assert _summary_of(stored) == _summary_of(rows[first.checkpoint.id])
        # Read back, it is the first capture's manifest byte for byte.
        assert kept.data == data and kept.loaded

        # A change that keeps the manifest's length (a mode: 420 -> 384).
        (workspace / "src" / "m7.py").chmod(0o600)
        changed = await capture_checkpoint(
            workspace, store, blobs, "t", CaptureOptions(data_dir=data_dir)
        )
    new_data = changed.checkpoint.files.data
    assert len(new_data) == len(data) and new_data != data
    assert _mode_of(changed.checkpoint.files, "src/m7.py") == 0o600
    async with await open_store(store_url) as store:
        read = await store.get(changed.checkpoint.id)
        assert read is not None and not read.files.loaded
        assert read.files.fingerprint() == _fingerprint(new_data)
        assert _mode_of(read.files, "src/m7.py") == 0o600
        assert read.files.data == new_data
        parent = await store.get(again.checkpoint.id)
        assert parent is not None and _mode_of(parent.files, "src/m7.py") == 0o644


async def test_rows_written_before_summaries_are_read_and_the_next_append_has_one(
    tmp_path: Path, workspace: Path, data_dir: Path, store_url: str
) -> None:
    """A store written by the previous release (every row ``CKD2``, no summary):
    read as before, a no-change capture on it works (its parent's summary is
    computed from the bytes, which are then let go), appends a small row that
    carries the summary, and a same-length change is still caught."""
    write_tree(workspace, _tree())
    blobs = open_blobs(f"file://{tmp_path / 'blobs'}")
    async with await open_store(store_url) as store:
        first = await capture_checkpoint(
            workspace, store, blobs, "t", CaptureOptions(data_dir=data_dir)
        )
        second = await capture_checkpoint(
            workspace, store, blobs, "t", CaptureOptions(data_dir=data_dir)
        )
    data = first.checkpoint.files.data
    await _rewrite_rows(store_url, _as_ckd2)
    old = await _stored_rows(store_url)
    assert all(_summary_of(row) is None for row in old.values())

    async with await open_store(store_url) as store:
        for checkpoint_id in (first.checkpoint.id, second.checkpoint.id):
            read = await store.get(checkpoint_id)
            assert read is not None and read.files.data == data
    async with await open_store(store_url) as store:
        head = await store.get(second.checkpoint.id)
        assert head is not None and not head.files.loaded
        third = await capture_checkpoint(
            workspace, store, blobs, "t", CaptureOptions(data_dir=data_dir)
        )
        assert third.stats.files_hashed == 0
        assert not third.checkpoint.files.loaded  # summarized, not kept
        stored = (await _stored_rows(store_url))[third.checkpoint.id]
        assert len(stored) < 700 and _summary_of(stored) == [
            len(data),
            _fingerprint(data).hex(),
            len(first.checkpoint.files),
            301,
            first.checkpoint.files.totals()[2],
        ]
        (workspace / "src" / "m3.py").chmod(0o600)
        changed = await capture_checkpoint(
            workspace, store, blobs, "t", CaptureOptions(data_dir=data_dir)
        )
        assert _mode_of(changed.checkpoint.files, "src/m3.py") == 0o600
    async with await open_store(store_url) as store:
        read = await store.get(third.checkpoint.id)
        assert read is not None and read.files.data == data
        read = await store.get(changed.checkpoint.id)
        assert read is not None and _mode_of(read.files, "src/m3.py") == 0o600
        assert [c.id for c in await store.list("t")] == [
            first.checkpoint.id,
            second.checkpoint.id,
            third.checkpoint.id,
            changed.checkpoint.id,
        ]


def test_a_summary_that_does_not_match_the_bytes_is_refused_on_load() -> None:
    """A store's summary is checked when the bytes are loaded: a row whose
    manifest is not what its summary says is an error, never used."""
    good = Manifest(b'[["d","a",493]]', trusted=True)
    other = Manifest(b'[["d","b",493]]', trusted=True)
    stored = Manifest.stored(lambda: other.data, good.summary(), 0)
    assert stored.same_bytes(good) and not stored.loaded  # by its summary
    with pytest.raises(ValueError, match="summary"):
        _ = stored.data


def test_a_no_change_keyframe_past_max_depth_reuses_the_compressed_manifest() -> None:
    """A no-change checkpoint whose chain is MAX_DEPTH deep is stored whole:
    its manifest (its parent's, unloaded) goes in as the stream it was
    stored in, neither inflated nor compressed again, and reads back the same."""
    from checkpointd.store import _documents as documents

    from ..store.test_postgres_documents import make

    first = documents.Content.of(make("a", [("f", n, 0) for n in range(50)], []))
    row = documents.keyframe(first).data
    read = documents.materialize("a", {"a": (None, row)}, {})
    assert not read.manifest.loaded
    same = documents.Content({**read.document, "id": "b"}, read.manifest)
    stored = documents.encode(same, "a", read, documents.MAX_DEPTH)
    assert (stored.base_id, stored.depth) == (None, 0)
    assert not read.manifest.loaded  # never inflated
    (packed,) = struct.unpack_from("<I", row, 4)
    (packed_again,) = struct.unpack_from("<I", stored.data, 4)
    assert stored.data[40 + packed_again :] == row[40 + packed :]  # the very stream
    again = documents.materialize("b", {"b": (None, stored.data)}, {})
    assert again.manifest.data == first.manifest.data
    assert _summary_of(stored.data) == _summary_of(row)


async def test_a_large_appended_keyframe_is_cached_unloaded(
    tmp_path: Path, workspace: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Above KEEP_LOADED_BYTES a store's cache keeps a manifest by its summary
    alone (a cold capture's 180 MB manifest at 1M files, or its 60 MB row, is
    not held between captures); the next no-change capture uses it unloaded,
    and a changed one reads the parent's row again for its delta."""
    from checkpointd.store import _documents as documents

    monkeypatch.setattr(documents, "KEEP_LOADED_BYTES", 0)
    write_tree(workspace, _tree())
    blobs = open_blobs(f"file://{tmp_path / 'blobs'}")
    async with await open_store(f"sqlite:///{tmp_path / 'store.db'}") as store:
        first = await capture_checkpoint(
            workspace, store, blobs, "t", CaptureOptions(data_dir=data_dir)
        )
        assert first.checkpoint.files.loaded  # the caller's own
        head = await store.get(first.checkpoint.id)
        assert head is not None and not head.files.loaded
        again = await capture_checkpoint(
            workspace, store, blobs, "t", CaptureOptions(data_dir=data_dir)
        )
        assert again.stats.files_hashed == 0 and not again.checkpoint.files.loaded
        # The cache keeps these by their summaries alone (not even the rows).
        held = list(store._recent._items.values())
        assert held and all(documents.is_summary_only(content) for content in held)
        # What a capture asks before its scan: the cache's summary, no row read.
        summary = await store.cached_manifest_summary(again.checkpoint.id)
        assert summary == first.checkpoint.files.summary()
        assert await store.cached_manifest_summary("missing") is None
        assert again.checkpoint.files.data == first.checkpoint.files.data
        # A change: the append reads its parent's row again for the delta.
        (workspace / "src" / "m9.py").chmod(0o600)
        changed = await capture_checkpoint(
            workspace, store, blobs, "t", CaptureOptions(data_dir=data_dir)
        )
        assert _mode_of(changed.checkpoint.files, "src/m9.py") == 0o600
    async with await open_store(f"sqlite:///{tmp_path / 'store.db'}") as store:
        # A fresh store's cache knows nothing: the capture reads the parent.
        assert await store.cached_manifest_summary(changed.checkpoint.id) is None
        read = await store.get(changed.checkpoint.id)
        assert read is not None and read.files.data == changed.checkpoint.files.data
        read = await store.get(again.checkpoint.id)
        assert read is not None and read.files.data == first.checkpoint.files.data


async def test_a_cached_keyframe_keeps_its_digests_known(
    tmp_path: Path, workspace: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large keyframe cached unloaded (by its summary alone) keeps its
    digests known, and so does its row read again: the next append counts
    keys against them without inflating the row."""
    from checkpointd.store import _documents as documents

    monkeypatch.setattr(documents, "KEEP_LOADED_BYTES", 0)
    write_tree(workspace, _tree())
    blobs = open_blobs(f"file://{tmp_path / 'blobs'}")
    async with await open_store(f"sqlite:///{tmp_path / 'store.db'}") as store:
        first = await capture_checkpoint(
            workspace, store, blobs, "t", CaptureOptions(data_dir=data_dir)
        )
        digests = first.checkpoint.files.digests()
        (held,) = store._recent._items.values()
        assert documents.is_summary_only(held)
        assert held.manifest.known_digests() == digests
        read = await store.get(first.checkpoint.id)  # the row read again
        assert read is not None and not read.files.loaded
        (held,) = store._recent._items.values()
        assert held.manifest.known_digests() == digests
        assert not read.files.loaded


def test_an_append_with_a_known_delta_needs_no_parent_bytes() -> None:
    from checkpointd import _native
    from checkpointd.store import _documents as documents

    def content(entries: list[FileEntry], **manifest: Any) -> documents.Content:
        data = encode_entries(entries)
        return documents.Content({"id": "x"}, Manifest(data, trusted=True, **manifest))

    key = "sandbox-files/blake3/"
    old = [FileEntry(f"f{n}", key + "0" * 64, 1) for n in range(5)]
    new = [*old[:4], FileEntry("f4", key + "1" * 64, 2)]
    parent = content(old)
    ops, added = _native.manifest_delta(parent.manifest.data, encode_entries(new))
    delta = (parent.manifest.summary(), ops, added)
    assert documents.needs_parent_bytes(content(new), parent)  # no delta known
    assert documents.needs_parent_bytes(content(new, delta=delta), parent)  # nor digests
    parent.manifest.digests()
    assert not documents.needs_parent_bytes(content(new, delta=delta), parent)
