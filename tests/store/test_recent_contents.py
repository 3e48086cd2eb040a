"""How SQL stores hold parents' manifests: RecentContents keeps the newest
content always, more only within its byte budget, and materializing a chain
of no-change deltas shares one manifest (a million-entry manifest is ~170 MB:
it must not be held twice between captures, nor once per delta)."""

from __future__ import annotations

from pathlib import Path

import pytest

from checkpointd.manifest import Manifest
from checkpointd.model import Checkpoint, FileEntry
from checkpointd.store import _documents
from checkpointd.store._core import RecentContents
from checkpointd.store._documents import Content


def _content(manifest_bytes: int) -> Content:
    return Content({}, Manifest(b"[" + b" " * (manifest_bytes - 2) + b"]"))


def test_count_bound_and_order() -> None:
    recent = RecentContents(2, budget_bytes=1 << 20)
    for name in ("a", "b", "c"):
        recent.put(name, 1, _content(100))
    assert recent.get("a", 1) is None
    assert recent.get("b", 1) is not None and recent.get("c", 1) is not None
    assert recent.get("c", 2) is None  # another row version is another content


def test_over_budget_keeps_only_the_newest() -> None:
    recent = RecentContents(8, budget_bytes=1000)
    recent.put("small-1", 1, _content(300))
    recent.put("small-2", 1, _content(300))
    assert recent.get("small-1", 1) is not None
    recent.put("big", 1, _content(5000))  # alone over the budget: still kept
    assert recent.get("big", 1) is not None
    assert recent.get("small-1", 1) is None and recent.get("small-2", 1) is None
    recent.put("next", 1, _content(300))
    assert recent.get("big", 1) is None and recent.get("next", 1) is not None


def test_a_chain_of_no_change_deltas_shares_one_manifest() -> None:
    """Materializing a head after captures that changed nothing holds the
    keyframe's manifest once: each no-change delta reuses its base's."""
    files = tuple(FileEntry(f"f{n:03d}", f"sandbox-files/blake3/{n:064x}", n) for n in range(50))
    rows: dict[str, tuple[str | None, bytes]] = {}
    previous: Content | None = None
    previous_id: str | None = None
    for index in range(5):
        checkpoint = Checkpoint(
            id=f"c{index}",
            thread_id="t",
            parent_checkpoint_id=previous_id,
            created_at=index + 1,
            files=files,
            conversation=("hello", index),
        )
        content = Content.of(checkpoint)
        stored = _documents.encode(content, previous_id, previous, index - 1 if index else 0)
        assert (stored.base_id is None) == (index == 0)
        rows[checkpoint.id] = (stored.base_id, stored.data)
        previous, previous_id = content, checkpoint.id
    memo: dict[str, Content] = {}
    head = _documents.materialize("c4", rows, memo)
    assert head.manifest is memo["c0"].manifest
    assert head.checkpoint().files == files
    assert list(head.checkpoint().conversation) == ["hello", 4]
    # A delta that changes something is applied, not shared.
    changed = Content.of(
        Checkpoint(id="c5", thread_id="t", parent_checkpoint_id="c4", created_at=9, files=files[1:])
    )
    stored = _documents.encode(changed, "c4", head, 4)
    rows["c5"] = (stored.base_id, stored.data)
    again = _documents.materialize("c5", rows, memo)
    assert again.manifest is not head.manifest and again.checkpoint().files == files[1:]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    url: str = request.getfixturevalue("postgres_url")
    return url


def _checkpoint(checkpoint_id: str, parent: str | None, created_at: int, keys: range) -> Checkpoint:
    files = tuple(FileEntry(f"f{n}", f"sandbox-files/blake3/{n:064x}", n) for n in keys)
    return Checkpoint(
        id=checkpoint_id,
        thread_id="t",
        parent_checkpoint_id=parent,
        created_at=created_at,
        files=files,
    )


async def test_a_fresh_store_reads_the_head_once(store_url: str) -> None:
    """A fresh daemon's capture reads its head (``get``), reads it again after
    its scan, and then appends on it: SQLite and PostgreSQL alike serve the
    second read and the append from what the first read left in the store's
    cache (PostgreSQL's ``get`` read the chain every time), and a row that
    another store object replaced under the same id is read anew."""
    from checkpointd.store import open_store

    async with await open_store(store_url) as store:
        async with await store.acquire_writer("t") as lease:
            await store.append(_checkpoint("c1", None, 1, range(3)), None, lease)
    async with await open_store(store_url) as store, await open_store(store_url) as other:
        assert await store.cached_manifest_summary("c1") is None  # nothing read yet
        head = await store.get("c1")
        assert head is not None and head.files == _checkpoint("c1", None, 1, range(3)).files
        (held,) = store._recent._items.values()
        again = await store.get("c1")
        assert again is not None and again.files is head.files  # the cached content
        assert await store.cached_manifest_summary("c1") == head.files.summary()
        async with await store.acquire_writer("t") as lease:
            await store.append(_checkpoint("c2", "c1", 2, range(3)), "c1", lease)
        assert held in store._recent._items.values()  # the parent was not read again
        assert (await store.get("c2")).files == head.files  # type: ignore[union-attr]
        # Another store object replaces c2 (same id, new row): never the cached one.
        async with await other.acquire_writer("t") as lease:
            await other.delete_head("t", "c2", lease)
            await other.append(_checkpoint("c2", "c1", 3, range(1, 4)), "c1", lease)
        assert await store.cached_manifest_summary("c2") is None
        replaced = await store.get("c2")
        assert (
            replaced is not None and replaced.files == _checkpoint("c2", "c1", 3, range(1, 4)).files
        )
        assert await store.get("missing") is None


async def test_a_large_sqlite_row_is_written_in_pieces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A document above BLOB_IO_BYTES goes in through blob I/O (zeroblob, then
    pieces, in the append's transaction): it reads back byte for byte, a
    duplicate id still fails with nothing written, and a small one is bound."""
    import sqlite3

    from checkpointd.errors import SandboxCheckpointDuplicateIdError
    from checkpointd.store import SqliteCheckpointStore
    from checkpointd.store import _sqlite_tx as sqlite

    monkeypatch.setattr(sqlite, "BLOB_IO_BYTES", 1000)
    monkeypatch.setattr(sqlite, "BLOB_PIECE_BYTES", 7)
    written: list[int] = []
    write_blob = sqlite._write_blob

    async def counted(conn: object, serial: int, data: bytes) -> None:
        written.append(len(data))
        await write_blob(conn, serial, data)  # type: ignore[arg-type]

    monkeypatch.setattr(sqlite, "_write_blob", counted)
    path = tmp_path / "store.db"
    big = _checkpoint("c1", None, 1, range(200))
    async with await SqliteCheckpointStore.open(str(path)) as store:
        async with await store.acquire_writer("t") as lease:
            await store.append(big, None, lease)
            await store.append(_checkpoint("c2", "c1", 2, range(200)), "c1", lease)
            with pytest.raises(SandboxCheckpointDuplicateIdError):
                await store.append(_checkpoint("c1", "c2", 3, range(5)), "c2", lease)
    with sqlite3.connect(path) as conn:
        sizes = dict(conn.execute("SELECT id, length(document) FROM checkpoints").fetchall())
    assert sizes["c1"] > 1000 > sizes["c2"] and set(sizes) == {"c1", "c2"}
    assert written == [sizes["c1"]]  # c1 in pieces; c2 bound; the duplicate never written
    async with await SqliteCheckpointStore.open(str(path)) as store:
        read = await store.get("c1")
        assert read is not None and read.files == big.files
        assert (await store.get("c2")).files == big.files  # type: ignore[union-attr]
