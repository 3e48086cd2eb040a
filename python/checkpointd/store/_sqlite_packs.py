"""The SQLite checkpoint store's pack index and pack maintenance
(``base.PackIndex``, ``base.PackMaintenance``) over the tables of ``_sqlite_db``."""

from __future__ import annotations

import builtins
from typing import Any

import aiosqlite

from ._options import (
    check_hold_ms,
    key_to_bytes,
)
from ._packindex import (
    artifact_twin,
    check_packed_blobs,
    digest_of,
    digests_of,
    located_rows,
    pack_digest,
    row_from_sql,
)
from ._sqlite_db import SqliteDatabase, fetch_in, fetchall, pack_ids
from .base import (
    IndexRow,
    PackedBlob,
)

# File digests as a table ``ds (digest)``, from one parameter: the raw digests
# concatenated (:digests, 32 bytes each), like ``_sqlite_db.KEYS``.
_DIGESTS = (
    "WITH RECURSIVE fd (i) AS (SELECT 0 WHERE length(:digests) > 0"
    " UNION ALL SELECT i + 32 FROM fd WHERE i + 32 < length(:digests)),"
    " ds (digest) AS (SELECT substr(:digests, i + 1, 32) FROM fd) "
)

# The pack rows of ``_DIGESTS`` (those a pack holds).
_LOCATE = (
    _DIGESTS + "SELECT b.digest, p.digest, b.frame_offset, b.frame_length,"
    " b.raw_size, b.codec FROM ds JOIN packed_blobs b ON b.digest = ds.digest"
    " JOIN blob_packs p ON p.id = b.pack"
)

# Of ``_DIGESTS``, the file digests a checkpoint references, by their refs
# alone (an open run counts one there): a damaged count can only make a key
# look absent, and an absent key is packed again, never trusted.
_IS_REFERENCED = (
    "EXISTS (SELECT 1 FROM blob_references r"
    " WHERE r.key = CAST(X'66' || ds.digest AS BLOB) AND r.refs > 0)"
)
_REFERENCED_DIGESTS = _DIGESTS + "SELECT ds.digest FROM ds WHERE " + _IS_REFERENCED

# Of ``_DIGESTS``, those the store knows: packed, or referenced as above. One
# pass over the digests (a feed batch asks this of up to 4,096 at a time).
_KNOWN_DIGESTS = (
    _DIGESTS + "SELECT ds.digest FROM ds WHERE EXISTS"
    " (SELECT 1 FROM packed_blobs b WHERE b.digest = ds.digest) OR " + _IS_REFERENCED
)


class SqlitePacks:
    """The pack index and pack maintenance of ``SqliteCheckpointStore``."""

    _db: SqliteDatabase

    def _now(self) -> int:
        raise NotImplementedError

    async def drop_packed_blobs(self, rows: builtins.list[PackedBlob]) -> builtins.list[str]:
        """See ``base.PackMaintenance``: one write transaction."""
        checked = check_packed_blobs(rows, None)

        async def run(conn: aiosqlite.Connection) -> builtins.list[str]:
            now = self._now()
            dropped: builtins.list[str] = []
            for row in checked:
                digest = digest_of(row.key)
                raw = key_to_bytes(row.key)
                current = await fetchall(
                    conn,
                    "SELECT p.digest, b.frame_offset FROM packed_blobs b"
                    " JOIN blob_packs p ON p.id = b.pack WHERE b.digest = ?",
                    (digest,),
                )
                if not current or (bytes(current[0][0]), current[0][1]) != (
                    pack_digest(row.pack),
                    row.offset,
                ):
                    continue
                # The row serves the digest's artifact key too (_packindex.row_key).
                twin = key_to_bytes(artifact_twin(row.key))
                blocked = await fetchall(
                    conn,
                    "SELECT 1 FROM blob_references WHERE key IN (?, ?) AND refs > 0"
                    " UNION ALL SELECT 1 FROM blob_runs WHERE key IN (?, ?)"
                    " UNION ALL SELECT 1 WHERE NOT EXISTS"
                    " (SELECT 1 FROM blob_condemned WHERE key = ? AND until > ?)",
                    (raw, twin, raw, twin, raw, now),
                )
                if blocked:
                    continue
                await conn.execute("DELETE FROM packed_blobs WHERE digest = ?", (digest,))
                dropped.append(row.key)
            return dropped

        return await self._db.write(run) if checked else []

    async def forget_lost_packed_blobs(self, rows: builtins.list[PackedBlob]) -> builtins.list[str]:
        """See ``base.PackMaintenance``: one write transaction."""
        checked = check_packed_blobs(rows, None)

        async def run(conn: aiosqlite.Connection) -> builtins.list[str]:
            now = self._now()
            gone: builtins.list[str] = []
            for row in checked:
                cursor = await conn.execute(
                    "DELETE FROM packed_blobs WHERE digest = ? AND frame_offset = ?"
                    " AND pack = (SELECT id FROM blob_packs WHERE digest = ?)",
                    (digest_of(row.key), row.offset, pack_digest(row.pack)),
                )
                if cursor.rowcount:
                    gone.append(row.key)
            await conn.executemany(
                "INSERT OR IGNORE INTO blob_missing (key, marked_at) VALUES (?, ?)",
                [(key_to_bytes(key), now) for key in gone],
            )
            return sorted(gone)

        return await self._db.write(run) if checked else []

    async def _retired(self, conn: aiosqlite.Connection, packs: builtins.list[bytes]) -> set[bytes]:
        """Those of ``packs`` retired right now."""
        sql = "SELECT digest FROM retired_packs WHERE until > ? AND digest IN ({in})"
        return {bytes(row[0]) for row in await fetch_in(conn, sql, packs, self._now())}

    async def switch_packed_blobs(
        self, old_pack: str, rows: builtins.list[PackedBlob]
    ) -> builtins.list[str]:
        """See ``base.PackMaintenance``: one write transaction."""
        checked = check_packed_blobs(rows, None)
        old = pack_digest(old_pack)

        async def run(conn: aiosqlite.Connection) -> builtins.list[str]:
            wanted = builtins.list(dict.fromkeys(pack_digest(row.pack) for row in checked))
            retired = await self._retired(conn, wanted)
            live = [row for row in checked if pack_digest(row.pack) not in retired]
            if not live:
                return []
            ids = await pack_ids(conn, [d for d in wanted if d not in retired])
            old_id = await fetchall(conn, "SELECT id FROM blob_packs WHERE digest = ?", (old,))
            if not old_id:
                return []
            switched: builtins.list[str] = []
            for row in live:
                cursor = await conn.execute(
                    "UPDATE packed_blobs SET pack = ?, frame_offset = ?, frame_length = ?,"
                    " raw_size = ?, codec = ? WHERE digest = ? AND pack = ?",
                    (
                        ids[pack_digest(row.pack)],
                        row.offset,
                        row.length,
                        row.raw_size,
                        row.codec,
                        digest_of(row.key),
                        old_id[0][0],
                    ),
                )
                if cursor.rowcount:
                    switched.append(row.key)
            return switched

        return await self._db.write(run) if checked else []

    async def add_packed_blobs(
        self, rows: builtins.list[PackedBlob], *, unreferenced: bool = False
    ) -> builtins.list[str]:
        """See ``base.PackMaintenance``: one write transaction."""
        checked = check_packed_blobs(rows, None)

        async def run(conn: aiosqlite.Connection) -> builtins.list[str]:
            # Not refused for a retired pack: migrate pins its keys (base.PackMaintenance).
            wanted = builtins.list(dict.fromkeys(pack_digest(row.pack) for row in checked))
            ids = await pack_ids(conn, wanted)
            added: builtins.list[str] = []
            for row in checked:
                # Referenced as a file or as an artifact (_packindex.row_key).
                raw, twin = key_to_bytes(row.key), key_to_bytes(artifact_twin(row.key))
                used = unreferenced or await fetchall(
                    conn,
                    "SELECT 1 FROM blob_references WHERE key IN (?, ?) AND refs > 0"
                    " UNION ALL SELECT 1 FROM blob_runs WHERE key IN (?, ?) LIMIT 1",
                    (raw, twin, raw, twin),
                )
                if not used:
                    continue
                cursor = await conn.execute(
                    "INSERT OR IGNORE INTO packed_blobs"
                    " (digest, pack, frame_offset, frame_length, raw_size, codec)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    (
                        digest_of(row.key),
                        ids[pack_digest(row.pack)],
                        row.offset,
                        row.length,
                        row.raw_size,
                        row.codec,
                    ),
                )
                if cursor.rowcount:
                    added.append(row.key)
            return added

        return await self._db.write(run) if checked else []

    async def retire_pack(self, pack: str, hold_ms: int) -> bool:
        """See ``base.PackMaintenance``: one write transaction."""
        digest = pack_digest(pack)
        hold = check_hold_ms(hold_ms)

        async def run(conn: aiosqlite.Connection) -> bool:
            pointed = await fetchall(
                conn,
                "SELECT 1 FROM packed_blobs b JOIN blob_packs p ON p.id = b.pack"
                " WHERE p.digest = ? LIMIT 1",
                (digest,),
            )
            if pointed:
                return False
            await conn.execute(
                "INSERT OR REPLACE INTO retired_packs (digest, until) VALUES (?, ?)",
                (digest, self._now() + hold),
            )
            return True

        return await self._db.write(run)

    async def locate_blobs(self, keys: builtins.list[str]) -> dict[str, PackedBlob | None]:
        """See ``base.PackIndex``: two statements for all of ``keys`` (their
        digests as one parameter, ``_DIGESTS``), answering only for the keys
        the store knows (``_REFERENCED_DIGESTS`` says when a key counts as
        referenced)."""
        wanted = digests_of(keys)
        if not wanted:
            return {}

        async def run(conn: aiosqlite.Connection) -> dict[str, PackedBlob | None]:
            found: dict[str, PackedBlob | None] = {}
            rows = await fetchall(conn, _LOCATE, {"digests": b"".join(wanted)})
            located_rows(wanted, rows, found)
            rest = b"".join(digest for digest, key in wanted.items() if key not in found)
            if rest:
                for (digest,) in await fetchall(conn, _REFERENCED_DIGESTS, {"digests": rest}):
                    found[wanted[bytes(digest)]] = None
            return found

        return await self._db.read(run)

    async def locate_rows(self, digests: bytes) -> builtins.list[IndexRow]:
        """See ``base.PackIndex``: one statement."""

        async def run(conn: aiosqlite.Connection) -> builtins.list[IndexRow]:
            return await fetchall(conn, _LOCATE, {"digests": digests})

        return await self._db.read(run) if digests else []

    async def known_digests(self, digests: bytes) -> bytes:
        """``locate_blobs`` for a pack session's feed (``blobs.packs.known_digests``):
        of ``digests`` (raw file digests, concatenated), those packed or
        referenced, concatenated; nothing bound or returned per unknown blob."""

        async def run(conn: aiosqlite.Connection) -> bytes:
            rows = await fetchall(conn, _KNOWN_DIGESTS, {"digests": digests})
            return b"".join(bytes(row[0]) for row in rows)

        return await self._db.read(run) if digests else b""

    async def list_packed_blobs(
        self, *, after: str | None = None, limit: int = 1000
    ) -> builtins.list[PackedBlob]:
        """See ``base.PackIndex``: in key order (the digests' byte order)."""
        start = b"" if after is None else (digest_of(after) or b"")

        async def run(conn: aiosqlite.Connection) -> builtins.list[Any]:
            return await fetchall(
                conn,
                "SELECT b.digest, p.digest, b.frame_offset, b.frame_length, b.raw_size, b.codec"
                " FROM packed_blobs b JOIN blob_packs p ON p.id = b.pack"
                " WHERE b.digest > ? ORDER BY b.digest LIMIT ?",
                (start, max(limit, 0)),
            )

        return [
            row_from_sql(bytes(row[0]), bytes(row[1]), *row[2:]) for row in await self._db.read(run)
        ]
