"""The PostgreSQL checkpoint store's pack index and pack maintenance
(``base.PackIndex``, ``base.PackMaintenance``) over the tables of ``_postgres_db``."""

from __future__ import annotations

import builtins
from collections.abc import Sequence

import asyncpg

from ..manifest import split_digests
from ._options import (
    check_hold_ms,
    key_from_bytes,
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
from ._postgres_db import PostgresClocked
from ._postgres_tx import forget_unmarked, lock_marks, pack_ids, packed_columns, referenced_keys
from .base import (
    IndexRow,
    PackedBlob,
)

# The pack rows of the digests $1 (those a pack holds).
_LOCATE = (
    "SELECT b.digest, p.digest AS pack, b.frame_offset, b.frame_length,"
    " b.raw_size, b.codec FROM checkpointd_packed_blobs b"
    " JOIN checkpointd_packs p ON p.id = b.pack WHERE b.digest = ANY($1::bytea[])"
)


# Class 'cpkp' of the transaction advisory locks on pack digests.
_PACK_LOCK_CLASS = 0x63706B70


async def _lock_packs(
    conn: asyncpg.Connection, packs: Sequence[bytes], *, exclusive: bool = False
) -> None:
    """Transaction locks on these packs' digests (sorted: no deadlock), the one
    point where retiring a pack (exclusive) and pointing rows at it (shared:
    appends, switches, adds) are ordered."""
    function = "pg_advisory_xact_lock" if exclusive else "pg_advisory_xact_lock_shared"
    for digest in sorted(set(packs)):
        await conn.execute(
            f"SELECT {function}($1, hashtext(encode($2::bytea, 'hex')))",
            _PACK_LOCK_CLASS,
            digest,
        )


async def _retired_packs(conn: asyncpg.Connection, packs: Sequence[bytes], now: int) -> set[bytes]:
    """Those of ``packs`` retired right now; locks them shared first, so a
    retire in flight has committed or waits for this transaction."""
    await _lock_packs(conn, packs)
    return {
        bytes(r["digest"])
        for r in await conn.fetch(
            "SELECT digest FROM checkpointd_retired_packs"
            " WHERE digest = ANY($1::bytea[]) AND until > $2",
            builtins.list(packs),
            now,
        )
    }


async def _delete_packed_rows(conn: asyncpg.Connection, rows: Sequence[PackedBlob]) -> set[bytes]:
    """Delete the index rows that still name exactly these frames (digest, pack
    and offset: a row a repack switched since is left alone); returns the
    digests whose row went."""
    return {
        bytes(r["digest"])
        for r in await conn.fetch(
            "DELETE FROM checkpointd_packed_blobs b USING checkpointd_packs p,"
            " unnest($1::bytea[], $2::bytea[], $3::integer[]) AS d(digest, pack, off)"
            " WHERE b.digest = d.digest AND p.id = b.pack AND p.digest = d.pack"
            " AND b.frame_offset = d.off RETURNING b.digest",
            [digest_of(row.key) for row in rows],
            [pack_digest(row.pack) for row in rows],
            [row.offset for row in rows],
        )
    }


async def _live_packs(
    conn: asyncpg.Connection, rows: builtins.list[PackedBlob], now: int
) -> builtins.list[PackedBlob]:
    """``rows`` less those naming a pack retired right now."""
    retired = await _retired_packs(
        conn, builtins.list(dict.fromkeys(pack_digest(row.pack) for row in rows)), now
    )
    return [row for row in rows if pack_digest(row.pack) not in retired]


class PostgresPacks(PostgresClocked):
    """The pack index and pack maintenance of ``PostgresCheckpointStore``."""

    async def locate_blobs(self, keys: builtins.list[str]) -> dict[str, PackedBlob | None]:
        """See ``base.PackIndex``: two indexed reads."""
        wanted = digests_of(keys)
        if not wanted:
            return {}

        async def body(conn: asyncpg.Connection) -> dict[str, PackedBlob | None]:
            found: dict[str, PackedBlob | None] = {}
            rows = await conn.fetch(_LOCATE, builtins.list(wanted))
            located_rows(wanted, rows, found)
            rest = [b"f" + digest for digest, key in wanted.items() if key not in found]
            for key in await referenced_keys(conn, rest) if rest else ():
                found[key_from_bytes(key)] = None
            return found

        return await self._transaction("locate_blobs", body, read_only=True)

    async def locate_rows(self, digests: bytes) -> builtins.list[IndexRow]:
        """See ``base.PackIndex``: one indexed read."""
        if not digests:
            return []

        async def body(conn: asyncpg.Connection) -> builtins.list[IndexRow]:
            rows = await conn.fetch(_LOCATE, split_digests(digests))
            return [tuple(row) for row in rows]  # type: ignore[misc]

        return await self._transaction("locate_rows", body, read_only=True)

    async def list_packed_blobs(
        self, *, after: str | None = None, limit: int = 1000
    ) -> builtins.list[PackedBlob]:
        """See ``base.PackIndex``: in key order (the digests' byte order)."""
        start = b"" if after is None else (digest_of(after) or b"")

        async def body(conn: asyncpg.Connection) -> builtins.list[asyncpg.Record]:
            found: builtins.list[asyncpg.Record] = await conn.fetch(
                "SELECT b.digest, p.digest AS pack, b.frame_offset, b.frame_length,"
                " b.raw_size, b.codec FROM checkpointd_packed_blobs b"
                " JOIN checkpointd_packs p ON p.id = b.pack WHERE b.digest > $1"
                " ORDER BY b.digest LIMIT $2",
                start,
                max(limit, 0),
            )
            return found

        return [
            row_from_sql(bytes(r["digest"]), bytes(r["pack"]), *builtins.list(r)[2:])
            for r in await self._transaction("list_packed_blobs", body, read_only=True)
        ]

    async def drop_packed_blobs(self, rows: builtins.list[PackedBlob]) -> builtins.list[str]:
        """See ``base.PackMaintenance``: one transaction; the keys' mark rows
        are locked first, so a pin in flight finishes before we judge."""
        self._check_open()
        checked = check_packed_blobs(rows, None)
        if not checked:
            return []

        async def body(conn: asyncpg.Connection) -> builtins.list[str]:
            binary = sorted({key_to_bytes(row.key) for row in checked})
            marks = await lock_marks(conn, binary, "UPDATE")
            now = await self._now(conn)
            # A row serves the digest's artifact key too (_packindex.row_key).
            twins = {key_to_bytes(row.key): key_to_bytes(artifact_twin(row.key)) for row in checked}
            used = await referenced_keys(conn, [*binary, *twins.values()])
            doomed = [
                row
                for row in checked
                if (raw := key_to_bytes(row.key)) not in used
                and twins[raw] not in used
                and (until := marks.get(raw)) is not None
                and now < until
            ]
            gone: set[bytes] = set()
            if doomed:
                gone = await _delete_packed_rows(conn, doomed)
            await forget_unmarked(conn, binary)
            return [row.key for row in checked if digest_of(row.key) in gone]

        return await self._transaction("drop_packed_blobs", body)

    async def switch_packed_blobs(
        self, old_pack: str, rows: builtins.list[PackedBlob]
    ) -> builtins.list[str]:
        """See ``base.PackMaintenance``: one transaction."""
        self._check_open()
        checked = check_packed_blobs(rows, None)
        if not checked:
            return []

        async def body(conn: asyncpg.Connection) -> builtins.list[str]:
            live = await _live_packs(conn, checked, await self._now(conn))
            if not live:
                return []
            ids = await pack_ids(conn, live)
            moved = {
                bytes(r["digest"])
                for r in await conn.fetch(
                    "UPDATE checkpointd_packed_blobs b SET pack = d.pack, frame_offset = d.off,"
                    " frame_length = d.len, raw_size = d.raw, codec = d.codec"
                    " FROM unnest($1::bytea[], $2::bigint[], $3::integer[], $4::integer[],"
                    " $5::integer[], $6::smallint[]) AS d(digest, pack, off, len, raw, codec)"
                    " WHERE b.digest = d.digest AND b.pack ="
                    " (SELECT id FROM checkpointd_packs WHERE digest = $7) RETURNING b.digest",
                    *packed_columns(live, ids),
                    pack_digest(old_pack),
                )
            }
            return [row.key for row in live if digest_of(row.key) in moved]

        return await self._transaction("switch_packed_blobs", body)

    async def forget_lost_packed_blobs(self, rows: builtins.list[PackedBlob]) -> builtins.list[str]:
        """See ``base.PackMaintenance``: one transaction (a row an append moved
        to another pack meanwhile no longer matches, and stays)."""
        self._check_open()
        checked = check_packed_blobs(rows, None)
        if not checked:
            return []

        async def body(conn: asyncpg.Connection) -> builtins.list[str]:
            gone = await _delete_packed_rows(conn, checked)
            keys = sorted({row.key for row in checked if digest_of(row.key) in gone})
            await conn.execute(
                "INSERT INTO checkpointd_blob_missing (key, marked_at)"
                " SELECT k, $2 FROM unnest($1::bytea[]) AS k ON CONFLICT DO NOTHING",
                [key_to_bytes(key) for key in keys],
                await self._now(conn),
            )
            return keys

        return await self._transaction("forget_lost_packed_blobs", body)

    async def add_packed_blobs(
        self, rows: builtins.list[PackedBlob], *, unreferenced: bool = False
    ) -> builtins.list[str]:
        """See ``base.PackMaintenance``: one transaction."""
        self._check_open()
        checked = check_packed_blobs(rows, None)
        if not checked:
            return []

        async def body(conn: asyncpg.Connection) -> builtins.list[str]:
            # Not refused for a retired pack: migrate pins its keys (base.PackMaintenance).
            # Referenced as a file or as an artifact (_packindex.row_key).
            forms = {
                row.key: (key_to_bytes(row.key), key_to_bytes(artifact_twin(row.key)))
                for row in checked
            }
            used = await referenced_keys(conn, [raw for pair in forms.values() for raw in pair])
            live = [row for row in checked if unreferenced or not used.isdisjoint(forms[row.key])]
            if not live:
                return []
            ids = await pack_ids(conn, live)
            added = {
                bytes(r["digest"])
                for r in await conn.fetch(
                    "INSERT INTO checkpointd_packed_blobs"
                    " (digest, pack, frame_offset, frame_length, raw_size, codec)"
                    " SELECT * FROM unnest($1::bytea[], $2::bigint[], $3::integer[],"
                    " $4::integer[], $5::integer[], $6::smallint[])"
                    " ON CONFLICT DO NOTHING RETURNING digest",
                    *packed_columns(live, ids),
                )
            }
            return [row.key for row in live if digest_of(row.key) in added]

        return await self._transaction("add_packed_blobs", body)

    async def retire_pack(self, pack: str, hold_ms: int) -> bool:
        """See ``base.PackMaintenance``: one transaction, under the pack's lock
        (a switch or add naming it waits, then sees it retired)."""
        self._check_open()
        digest = pack_digest(pack)
        hold = check_hold_ms(hold_ms)

        async def body(conn: asyncpg.Connection) -> bool:
            await _lock_packs(conn, [digest], exclusive=True)
            pointed = await conn.fetchval(
                "SELECT 1 FROM checkpointd_packed_blobs b JOIN checkpointd_packs p"
                " ON p.id = b.pack WHERE p.digest = $1 LIMIT 1",
                digest,
            )
            if pointed:
                return False
            await conn.execute(
                "INSERT INTO checkpointd_retired_packs (digest, until) VALUES ($1, $2)"
                " ON CONFLICT (digest) DO UPDATE SET until = EXCLUDED.until",
                digest,
                await self._now(conn) + hold,
            )
            return True

        return await self._transaction("retire_pack", body)
