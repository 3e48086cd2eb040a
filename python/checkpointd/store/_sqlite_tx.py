"""The SQLite checkpoint store's ``_core.WriteTx``: the SQL of every write
(see ``_sqlite_db`` for the tables and ``_core`` for the logic)."""

from __future__ import annotations

import builtins
import sqlite3
from collections.abc import Sequence
from typing import Any

import aiosqlite

from .. import _native
from . import _documents as documents
from ._core import (
    AppendFacts,
    IdTaken,
    KeySet,
    Rows,
    RunChange,
    StoredRow,
    ThreadState,
)
from ._options import (
    LeaseRecord,
    StoreOptions,
    read_clock,
)
from ._packindex import (
    PackColumns,
    PackedRows,
    checked_digest,
    pack_digest,
)
from ._sqlite_db import (
    KEYS,
    batches,
    fetch_chains,
    fetch_in,
    fetchall,
    fetchone,
    in_list,
    key_params,
    pack_ids,
    sql_number,
)

# A stored document larger than this is written through SQLite's incremental
# blob I/O (a zeroblob, then pieces of BLOB_PIECE_BYTES), never bound: SQLite
# copies a bound blob twice (SQLITE_TRANSIENT, then the record), which for a
# million-entry keyframe row (~60 MB) was +118 MiB of daemon RSS per append.
BLOB_IO_BYTES = 1 << 20
BLOB_PIECE_BYTES = 1 << 20

# Characters per row of ``SqliteTx._index_columns``'s integers: pack id,
# offset, length and raw size as 10 decimal digits each (< 2**32), then the
# codec's digit (``_native.decimal_rows``).
_ROW_CHARS = _native.DECIMAL_ROW_CHARS


class SqliteTx:
    """``_core.WriteTx`` on one connection inside ``BEGIN IMMEDIATE`` (which already
    holds the database's write lock, so ``lock_thread`` only reads)."""

    def __init__(self, conn: aiosqlite.Connection, options: StoreOptions) -> None:
        self.conn = conn
        self._options = options

    async def lock_thread(self, thread_id: str) -> ThreadState:
        head = await fetchone(
            self.conn, "SELECT head_id, head_ordinal FROM heads WHERE thread_id = ?", (thread_id,)
        )
        lease = await fetchone(
            self.conn,
            "SELECT owner_token, fence, expires_at, holder FROM writer_leases WHERE thread_id = ?",
            (thread_id,),
        )
        return ThreadState(
            None if head is None else head[0],
            0 if head is None else head[1],
            None if lease is None else LeaseRecord(*lease),
        )

    async def now(self) -> int:
        return read_clock(self._options)

    async def id_used(self, checkpoint_id: str) -> bool:
        row = await fetchone(
            self.conn,
            "SELECT 1 FROM checkpoints WHERE id = ?1"
            " UNION ALL SELECT 1 FROM spent_checkpoints WHERE id = ?1 LIMIT 1",
            (checkpoint_id,),
        )
        return row is not None

    async def row(self, checkpoint_id: str) -> StoredRow | None:
        row = await fetchone(
            self.conn,
            "SELECT thread_id, parent_id, depth, serial FROM checkpoints WHERE id = ?",
            (checkpoint_id,),
        )
        return None if row is None else StoredRow(*row)

    async def append_facts(self, checkpoint_id: str, head_id: str | None) -> AppendFacts:
        return AppendFacts(
            await self.now(),
            await self.id_used(checkpoint_id),
            None if head_id is None else await self.row(head_id),
        )

    async def fork_source(self, checkpoint_id: str) -> StoredRow | None:
        return await self.row(checkpoint_id)

    async def thread_has_checkpoints(self, thread_id: str) -> bool:
        row = await fetchone(
            self.conn, "SELECT 1 FROM checkpoints WHERE thread_id = ? LIMIT 1", (thread_id,)
        )
        return row is not None

    async def fetch_chains(self, checkpoint_ids: Sequence[str], rows: Rows) -> None:
        await fetch_chains(self.conn, checkpoint_ids, rows)

    async def thread_checkpoints(
        self, thread_id: str
    ) -> builtins.list[tuple[str, str | None, Any]]:
        return [
            (r[0], r[1], r[2])
            for r in await fetchall(
                self.conn,
                "SELECT id, parent_id, created_at FROM checkpoints WHERE thread_id = ?",
                (thread_id,),
            )
        ]

    async def publish(
        self, content: documents.Content, stored: documents.Stored, change: RunChange
    ) -> int:
        document = content.document
        thread_id = document["thread_id"]
        data = stored.data
        by_pieces = len(data) > BLOB_IO_BYTES
        try:
            cursor = await self.conn.execute(
                "INSERT INTO checkpoints "
                "(id, thread_id, parent_id, created_at, base_id, depth, document) "
                "VALUES (?, ?, ?, ?, ?, ?, " + ("zeroblob(?))" if by_pieces else "?)"),
                (
                    document["id"],
                    thread_id,
                    document["parent_checkpoint_id"],
                    sql_number(document["created_at"]),
                    stored.base_id,
                    stored.depth,
                    len(data) if by_pieces else data,
                ),
            )
        except sqlite3.IntegrityError:
            raise IdTaken from None
        serial = cursor.lastrowid
        await cursor.close()
        assert serial is not None
        if by_pieces:
            await _write_blob(self.conn, serial, data)
        await self.set_head(thread_id, document["id"], change.new_ordinal)
        if change.close:
            await self._close(thread_id, change.close, change.old_ordinal)
        if change.open:
            await self.conn.execute(
                KEYS + "INSERT INTO blob_references (key, refs) SELECT key, 1 FROM ks WHERE true"
                " ON CONFLICT (key) DO UPDATE SET refs = refs + 1",
                key_params(change.open),
            )
            await self.conn.execute(
                KEYS + "INSERT OR REPLACE INTO blob_runs (key, thread_id, open_since)"
                " SELECT key, :thread, :at FROM ks",
                key_params(change.open, thread=thread_id, at=change.new_ordinal),
            )
        return serial

    async def _close(self, thread_id: str, keys: KeySet, ordinal: int, extra: int = 0) -> None:
        """refs += ordinal - open_since + extra for each key's run, then drop the runs."""
        await self.conn.execute(
            KEYS + "INSERT INTO blob_references (key, refs)"
            " SELECT ks.key, coalesce(:at - u.open_since, 0) + :extra FROM ks"
            " LEFT JOIN blob_runs u ON u.key = ks.key AND u.thread_id = :thread WHERE true"
            " ON CONFLICT (key) DO UPDATE SET refs = refs + excluded.refs",
            key_params(keys, thread=thread_id, at=ordinal, extra=extra),
        )
        await self.conn.execute(
            KEYS + "DELETE FROM blob_runs WHERE thread_id = :thread"
            " AND key IN (SELECT key FROM ks)",
            key_params(keys, thread=thread_id),
        )

    async def delete_rows(self, checkpoint_ids: Sequence[str]) -> Rows:
        rows: Rows = {}
        for batch in batches(builtins.list(checkpoint_ids)):
            for checkpoint_id, base_id, data in await fetchall(
                self.conn,
                in_list("SELECT id, base_id, document FROM checkpoints WHERE id IN ({in})", batch),
                batch,
            ):
                rows[checkpoint_id] = (base_id, data)
            await self.conn.execute(
                in_list("DELETE FROM checkpoints WHERE id IN ({in})", batch), batch
            )
        return rows

    async def dependents(self, removed: Sequence[str]) -> Rows:
        return {
            checkpoint_id: (base_id, data)
            for checkpoint_id, base_id, data in await fetch_in(
                self.conn,
                "SELECT id, base_id, document FROM checkpoints WHERE base_id IN ({in})",
                builtins.list(removed),
            )
        }

    async def rewrite_keyframe(self, checkpoint_id: str, data: bytes) -> None:
        await self.conn.execute(
            "UPDATE checkpoints SET document = ?, base_id = NULL, depth = 0 WHERE id = ?",
            (data, checkpoint_id),
        )

    async def set_head(self, thread_id: str, head_id: str | None, ordinal: int) -> None:
        if head_id is None:
            await self.conn.execute("DELETE FROM heads WHERE thread_id = ?", (thread_id,))
            return
        await self.conn.execute(
            "INSERT INTO heads (thread_id, head_id, head_ordinal) VALUES (?, ?, ?) "
            "ON CONFLICT (thread_id) DO UPDATE SET head_id = excluded.head_id,"
            " head_ordinal = excluded.head_ordinal",
            (thread_id, head_id, ordinal),
        )

    async def drop_runs(self, thread_id: str, keys: KeySet, ordinal: int) -> None:
        if keys:
            await self._close(thread_id, keys, ordinal, -1)

    async def close_all_runs(self, thread_id: str, ordinal: int) -> None:
        await self.conn.execute(
            "INSERT INTO blob_references (key, refs)"
            " SELECT key, :at - open_since FROM blob_runs WHERE thread_id = :thread AND true"
            " ON CONFLICT (key) DO UPDATE SET refs = refs + excluded.refs",
            {"thread": thread_id, "at": ordinal},
        )
        await self.conn.execute("DELETE FROM blob_runs WHERE thread_id = ?", (thread_id,))

    async def reopen_runs(self, thread_id: str, keys: KeySet, old: int, new: int) -> None:
        if not keys:
            return
        await self._close(thread_id, keys, old)
        await self.conn.execute(
            KEYS + "INSERT INTO blob_runs (key, thread_id, open_since)"
            " SELECT key, :thread, :at FROM ks",
            key_params(keys, thread=thread_id, at=new),
        )

    async def subtract_counts(self, thread_id: str, deleted: Sequence[KeySet], cutoff: int) -> None:
        # One set-based statement per deleted checkpoint, its runs left where
        # they began (``refs + head_ordinal - open_since`` counts the same
        # with ``refs`` one lower). Moving them too cost a statement per key
        # and run: ~1.3 s to drop one 100,000-entry stash entry, now ~0.1 s.
        for keys in deleted:
            if keys:
                await self.conn.execute(
                    KEYS + "UPDATE blob_references SET refs = refs - 1"
                    " WHERE key IN (SELECT key FROM ks)",
                    key_params(keys),
                )

    async def forget_zero_counts(self, thread_id: str, keys: KeySet) -> None:
        if keys:
            await self.conn.execute(
                KEYS + "DELETE FROM blob_references WHERE key IN (SELECT key FROM ks)"
                " AND refs <= 0 AND NOT EXISTS"
                " (SELECT 1 FROM blob_runs u WHERE u.key = blob_references.key)",
                key_params(keys),
            )

    async def mark_spent(self, checkpoint_ids: Sequence[str]) -> None:
        await self.conn.executemany(
            "INSERT OR IGNORE INTO spent_checkpoints (id) VALUES (?)",
            [(checkpoint_id,) for checkpoint_id in checkpoint_ids],
        )

    async def index_packed_blobs(self, rows: Sequence[Any]) -> None:
        """Record where each (checked) row's blob is; the newest row of a key
        wins (see ``base.PackIndex``)."""
        if isinstance(rows, PackedRows):
            await self._index_columns(rows.groups)
            return
        # A cold capture appends ~100,000 rows in a handful of packs: each pack
        # name is decoded once.
        digest_by_pack = {pack: pack_digest(pack) for pack in dict.fromkeys(r.pack for r in rows)}
        ids = await pack_ids(self.conn, builtins.list(digest_by_pack.values()))
        id_by_pack = {pack: ids[digest] for pack, digest in digest_by_pack.items()}
        await self.conn.executemany(
            "INSERT OR REPLACE INTO packed_blobs"
            " (digest, pack, frame_offset, frame_length, raw_size, codec)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            [
                (
                    checked_digest(row.key),
                    id_by_pack[row.pack],
                    row.offset,
                    row.length,
                    row.raw_size,
                    row.codec,
                )
                for row in rows
            ],
        )

    async def _index_columns(self, groups: Sequence[PackColumns]) -> None:
        """Every pack's rows in one statement, in key order (so the B-tree fills
        from left to right, not once per pack): the digests as one parameter,
        the integers as one string of fixed-width decimals per row (SQLite
        cannot read integers out of a blob), no Python tuple per row."""
        ids: builtins.list[int] = []
        for group in groups:
            digest = pack_digest(group.pack)
            await self.conn.execute(
                "INSERT OR IGNORE INTO blob_packs (digest) VALUES (?)", (digest,)
            )
            (pack_id,) = await fetchone(
                self.conn, "SELECT id FROM blob_packs WHERE digest = ?", (digest,)
            )
            ids.append(pack_id)
        # ASCII bytes, not text: substr of a blob is found by offset, of text by
        # counting characters from the start (quadratic over 100,000 rows).
        digests, columns = _native.decimal_rows(
            [
                (
                    pack_id,
                    group.digests,
                    group.offsets.tobytes(),
                    group.lengths.tobytes(),
                    group.raw_sizes.tobytes(),
                    group.codecs,
                )
                for pack_id, group in zip(ids, groups, strict=True)
            ]
        )
        await self.conn.execute(
            "WITH RECURSIVE r (i) AS (SELECT 0 WHERE :n > 0"
            " UNION ALL SELECT i + 1 FROM r WHERE i + 1 < :n)"
            " INSERT OR REPLACE INTO packed_blobs"
            " (digest, pack, frame_offset, frame_length, raw_size, codec)"
            " SELECT substr(:digests, 32 * i + 1, 32),"
            f" CAST(substr(:columns, {_ROW_CHARS} * i + 1, 10) AS INTEGER),"
            f" CAST(substr(:columns, {_ROW_CHARS} * i + 11, 10) AS INTEGER),"
            f" CAST(substr(:columns, {_ROW_CHARS} * i + 21, 10) AS INTEGER),"
            f" CAST(substr(:columns, {_ROW_CHARS} * i + 31, 10) AS INTEGER),"
            f" CAST(substr(:columns, {_ROW_CHARS} * i + 41, 1) AS INTEGER) FROM r",
            {"n": len(digests) // 32, "digests": digests, "columns": columns},
        )

    async def lease_for_acquire(self, thread_id: str) -> tuple[LeaseRecord | None, int]:
        lease = (await self.lock_thread(thread_id)).lease
        row = await fetchone(
            self.conn, "SELECT fence FROM writer_fences WHERE thread_id = ?", (thread_id,)
        )
        return lease, 0 if row is None else row[0]

    async def write_lease(self, thread_id: str, record: LeaseRecord) -> None:
        await self.conn.execute(
            "INSERT INTO writer_fences (thread_id, fence) VALUES (?, ?) "
            "ON CONFLICT (thread_id) DO UPDATE SET fence = excluded.fence",
            (thread_id, record.fence),
        )
        await self.conn.execute(
            "INSERT OR REPLACE INTO writer_leases "
            "(thread_id, owner_token, fence, expires_at, holder) VALUES (?, ?, ?, ?, ?)",
            (thread_id, record.owner_token, record.fence, record.expires_at, record.holder),
        )

    async def set_lease_expiry(self, thread_id: str, expires_at: int) -> None:
        await self.conn.execute(
            "UPDATE writer_leases SET expires_at = ? WHERE thread_id = ?", (expires_at, thread_id)
        )

    async def remove_lease(self, thread_id: str, token: str, fence: int) -> None:
        await self.conn.execute(
            "DELETE FROM writer_leases WHERE thread_id = ? AND owner_token = ? AND fence = ?",
            (thread_id, token, fence),
        )

    async def _lease_id(self, thread_id: str, token: str, fence: int) -> int | None:
        row = await fetchone(
            self.conn,
            "SELECT id FROM leases WHERE thread_id = ? AND owner_token = ? AND fence = ?",
            (thread_id, token, fence),
        )
        return None if row is None else int(row[0])

    async def drop_pins(self, thread_id: str, token: str, fence: int) -> None:
        lease_id = await self._lease_id(thread_id, token, fence)
        if lease_id is not None:
            await self.conn.execute("DELETE FROM lease_pins WHERE lease_id = ?", (lease_id,))
            await self.conn.execute("DELETE FROM leases WHERE id = ?", (lease_id,))

    async def pin(
        self, thread_id: str, token: str, fence: int, keys: Sequence[bytes]
    ) -> set[bytes]:
        lease_id = await self._lease_id(thread_id, token, fence)
        if lease_id is None:
            cursor = await self.conn.execute(
                "INSERT INTO leases (thread_id, owner_token, fence) VALUES (?, ?, ?)",
                (thread_id, token, fence),
            )
            lease_id = cursor.lastrowid
            await cursor.close()
        keyset = KeySet.of(keys)
        await self.conn.execute(
            KEYS + "INSERT OR IGNORE INTO lease_pins (lease_id, key) SELECT :lease, key FROM ks",
            key_params(keyset, lease=lease_id),
        )
        return {
            bytes(row[0])
            for row in await fetchall(
                self.conn,
                KEYS + "SELECT c.key FROM ks JOIN blob_condemned c ON c.key = ks.key"
                " WHERE c.until > :now",
                key_params(keyset, now=read_clock(self._options)),
            )
        }

    async def release_condemned(self, keys: Sequence[bytes]) -> None:
        await self.conn.executemany(
            "DELETE FROM blob_condemned WHERE key = ?", [(key,) for key in keys]
        )

    async def mark_missing(self, keys: Sequence[bytes], now: int) -> None:
        await self.conn.executemany(
            "INSERT OR IGNORE INTO blob_missing (key, marked_at) VALUES (?, ?)",
            [(key, now) for key in keys],
        )

    async def clear_missing(self, keys: Sequence[bytes]) -> None:
        await self.conn.executemany(
            "DELETE FROM blob_missing WHERE key = ?", [(key,) for key in keys]
        )


async def _write_blob(conn: aiosqlite.Connection, serial: int, data: bytes) -> None:
    """Fill the zeroblob document of row ``serial`` with ``data`` a piece at a
    time, in the open transaction (on aiosqlite's thread: the sqlite3 blob
    handle belongs to its connection; aiosqlite has no blobopen of its own)."""

    def write(connection: sqlite3.Connection) -> None:
        view = memoryview(data)
        with connection.blobopen("checkpoints", "document", serial) as blob:
            for at in range(0, len(view), BLOB_PIECE_BYTES):
                blob.write(view[at : at + BLOB_PIECE_BYTES])

    await conn._execute(write, conn._conn)
