"""The PostgreSQL checkpoint store's ``_core.WriteTx``: the SQL of every write
(see ``_postgres_db`` for the tables and ``_core`` for the logic)."""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any, TypeVar

import asyncpg

from . import _documents as documents
from ._core import (
    AppendFacts,
    IdTaken,
    KeySet,
    Rows,
    RunChange,
    StoredRow,
    ThreadState,
    key_counts,
)
from ._options import (
    LeaseRecord,
    read_clock,
)
from ._packindex import (
    PackedRows,
    digest_of,
    pack_digest,
)
from ._postgres_db import (
    DB_NOW,
    PostgresClocked,
    fetch_chains,
    id_bytes,
    id_text,
    key_args,
    key_table,
    lease_of,
    numeric_created_at,
)
from .base import (
    PackedBlob,
)

T = TypeVar("T")


class PostgresTx:
    """``_core.WriteTx`` in one PostgreSQL transaction: ``lock_thread`` takes the
    thread's row lock (``FOR UPDATE``), everything after it runs under that lock."""

    def __init__(self, conn: asyncpg.Connection, store: PostgresClocked) -> None:
        self.conn = conn
        self._store = store

    async def lock_thread(self, thread_id: str) -> ThreadState:
        row = await self.conn.fetchrow(
            "SELECT head_id, head_ordinal, last_fence, lease_owner, lease_fence,"
            " lease_expires_at, lease_holder FROM checkpointd_threads"
            " WHERE thread_id = $1 FOR UPDATE",
            id_bytes(thread_id),
        )
        if row is None:
            return ThreadState(None, 0, None)
        return ThreadState(id_text(row["head_id"]), row["head_ordinal"], lease_of(row))

    async def now(self) -> int:
        return await self._store._now(self.conn)

    async def id_used(self, checkpoint_id: str) -> bool:
        used: bool = await self.conn.fetchval(
            "SELECT EXISTS (SELECT 1 FROM checkpointd_checkpoints WHERE id = $1)"
            " OR EXISTS (SELECT 1 FROM checkpointd_spent_checkpoints WHERE id = $1)",
            id_bytes(checkpoint_id),
        )
        return used

    async def row(self, checkpoint_id: str, *, lock: str = "") -> StoredRow | None:
        row = await self.conn.fetchrow(
            "SELECT thread_id, parent_id, depth, xmin::text::bigint AS xmin"
            f" FROM checkpointd_checkpoints WHERE id = $1 {lock}",
            id_bytes(checkpoint_id),
        )
        if row is None:
            return None
        return StoredRow(
            str(id_text(row["thread_id"])), id_text(row["parent_id"]), row["depth"], row["xmin"]
        )

    async def append_facts(self, checkpoint_id: str, head_id: str | None) -> AppendFacts:
        # One round trip, after the lock: the clock, whether the id is used, the head row.
        facts = await self.conn.fetchrow(
            "SELECT EXISTS (SELECT 1 FROM checkpointd_checkpoints WHERE id = $1)"
            " OR EXISTS (SELECT 1 FROM checkpointd_spent_checkpoints WHERE id = $1) AS used,"
            " p.thread_id, p.parent_id, p.depth, p.xmin::text::bigint AS xmin,"
            f" {DB_NOW} AS db_now"
            " FROM (SELECT 1) AS one LEFT JOIN checkpointd_checkpoints AS p ON p.id = $2",
            id_bytes(checkpoint_id),
            None if head_id is None else id_bytes(head_id),
        )
        assert facts is not None
        now = read_clock(self._store._options) if self._store._injected_clock else facts["db_now"]
        head_row = None
        if facts["thread_id"] is not None:
            head_row = StoredRow(
                str(id_text(facts["thread_id"])),
                id_text(facts["parent_id"]),
                facts["depth"],
                facts["xmin"],
            )
        return AppendFacts(now, facts["used"], head_row)

    async def fork_source(self, checkpoint_id: str) -> StoredRow | None:
        # FOR SHARE keeps the source from being deleted (and its keys forgotten)
        # until the fork's references are counted.
        return await self.row(checkpoint_id, lock="FOR SHARE")

    async def thread_has_checkpoints(self, thread_id: str) -> bool:
        found = await self.conn.fetchval(
            "SELECT 1 FROM checkpointd_checkpoints WHERE thread_id = $1 LIMIT 1",
            id_bytes(thread_id),
        )
        return found is not None

    async def fetch_chains(self, checkpoint_ids: Sequence[str], rows: Rows) -> None:
        await fetch_chains(self.conn, checkpoint_ids, rows)

    async def thread_checkpoints(
        self, thread_id: str
    ) -> builtins.list[tuple[str, str | None, Any]]:
        return [
            (str(id_text(r["id"])), id_text(r["parent_id"]), r["created_at"])
            for r in await self.conn.fetch(
                "SELECT id, parent_id, created_at FROM checkpointd_checkpoints"
                " WHERE thread_id = $1",
                id_bytes(thread_id),
            )
        ]

    async def publish(
        self, content: documents.Content, stored: documents.Stored, change: RunChange
    ) -> int:
        """Insert the row, apply the run change on the thread's own count rows and
        move the head, in one statement; returns the row's xmin."""
        document = content.document
        parent = document["parent_checkpoint_id"]
        try:
            xmin: int = await self.conn.fetchval(
                "WITH inserted AS ("
                " INSERT INTO checkpointd_checkpoints"
                " (id, thread_id, parent_id, created_at, base_id, depth, document)"
                " VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING xmin::text::bigint AS xmin),"
                " closed AS ("
                " UPDATE checkpointd_blob_counts AS c"
                " SET refs = c.refs + ($9 - c.open_since), open_since = NULL"
                f" FROM {key_table(10, 11)} AS k"
                " WHERE c.thread_id = $2 AND c.key = k.key AND c.open_since IS NOT NULL),"
                " opened AS ("
                " INSERT INTO checkpointd_blob_counts AS c (thread_id, key, refs, open_since)"
                f" SELECT $2, k.key, 1, $8 FROM {key_table(12, 13)} AS k"
                " ON CONFLICT (thread_id, key) DO UPDATE"
                " SET refs = c.refs + 1 + coalesce($9 - c.open_since, 0), open_since = $8),"
                " moved AS (UPDATE checkpointd_threads SET head_id = $1, head_ordinal = $8"
                " WHERE thread_id = $2)"
                " SELECT xmin FROM inserted",
                id_bytes(document["id"]),
                id_bytes(document["thread_id"]),
                None if parent is None else id_bytes(parent),
                numeric_created_at(document["created_at"]),
                None if stored.base_id is None else id_bytes(stored.base_id),
                stored.depth,
                stored.data,
                change.new_ordinal,
                change.old_ordinal,
                *key_args(change.close),
                *key_args(change.open),
            )
        except asyncpg.UniqueViolationError:
            # Another thread's append took the id after our check (no lock covers
            # ids of other threads); the primary key decides.
            raise IdTaken from None
        return xmin

    async def delete_rows(self, checkpoint_ids: Sequence[str]) -> Rows:
        return {
            str(id_text(r["id"])): (id_text(r["base_id"]), r["document"])
            for r in await self.conn.fetch(
                "DELETE FROM checkpointd_checkpoints WHERE id = ANY($1::bytea[])"
                " RETURNING id, base_id, document",
                [id_bytes(i) for i in checkpoint_ids],
            )
        }

    async def dependents(self, removed: Sequence[str]) -> Rows:
        return {
            str(id_text(r["id"])): (id_text(r["base_id"]), r["document"])
            for r in await self.conn.fetch(
                "SELECT id, base_id, document FROM checkpointd_checkpoints"
                " WHERE base_id = ANY($1::bytea[])",
                [id_bytes(i) for i in removed],
            )
        }

    async def rewrite_keyframe(self, checkpoint_id: str, data: bytes) -> None:
        await self.conn.execute(
            "UPDATE checkpointd_checkpoints SET document = $2, base_id = NULL, depth = 0"
            " WHERE id = $1",
            id_bytes(checkpoint_id),
            data,
        )

    async def set_head(self, thread_id: str, head_id: str | None, ordinal: int) -> None:
        await self.conn.execute(
            "UPDATE checkpointd_threads SET head_id = $2, head_ordinal = $3 WHERE thread_id = $1",
            id_bytes(thread_id),
            None if head_id is None else id_bytes(head_id),
            ordinal,
        )

    async def drop_runs(self, thread_id: str, keys: KeySet, ordinal: int) -> None:
        if keys:
            await self.conn.execute(
                "UPDATE checkpointd_blob_counts AS c"
                " SET refs = c.refs + coalesce($2 - c.open_since, 0) - 1, open_since = NULL"
                f" FROM {key_table(3, 4)} AS k WHERE c.thread_id = $1 AND c.key = k.key",
                id_bytes(thread_id),
                ordinal,
                *key_args(keys),
            )

    async def close_all_runs(self, thread_id: str, ordinal: int) -> None:
        await self.conn.execute(
            "UPDATE checkpointd_blob_counts SET refs = refs + ($2 - open_since),"
            " open_since = NULL WHERE thread_id = $1 AND open_since IS NOT NULL",
            id_bytes(thread_id),
            ordinal,
        )

    async def reopen_runs(self, thread_id: str, keys: KeySet, old: int, new: int) -> None:
        if keys:
            await self.conn.execute(
                "INSERT INTO checkpointd_blob_counts AS c (thread_id, key, refs, open_since)"
                f" SELECT $1, k.key, 0, $3 FROM {key_table(4, 5)} AS k"
                " ON CONFLICT (thread_id, key) DO UPDATE"
                " SET refs = c.refs + coalesce($2 - c.open_since, 0), open_since = $3",
                id_bytes(thread_id),
                old,
                new,
                *key_args(keys),
            )

    async def subtract_counts(self, thread_id: str, deleted: Sequence[KeySet], cutoff: int) -> None:
        counts = key_counts(deleted)
        if not counts:
            return
        keys = sorted(counts)
        await self.conn.execute(
            "UPDATE checkpointd_blob_counts AS c SET"
            " refs = c.refs - d.n + CASE WHEN c.open_since < $4 THEN $4 - c.open_since ELSE 0 END,"
            " open_since = CASE WHEN c.open_since < $4 THEN $4 ELSE c.open_since END"
            " FROM unnest($2::bytea[], $3::bigint[]) AS d(key, n)"
            " WHERE c.thread_id = $1 AND c.key = d.key",
            id_bytes(thread_id),
            keys,
            [counts[key] for key in keys],
            cutoff,
        )

    async def forget_zero_counts(self, thread_id: str, keys: KeySet) -> None:
        if keys:
            await self.conn.execute(
                "DELETE FROM checkpointd_blob_counts AS c"
                f" USING {key_table(2, 3)} AS k WHERE c.thread_id = $1 AND c.key = k.key"
                " AND c.open_since IS NULL AND c.refs <= 0",
                id_bytes(thread_id),
                *key_args(keys),
            )

    async def mark_spent(self, checkpoint_ids: Sequence[str]) -> None:
        if checkpoint_ids:
            await self.conn.execute(
                "INSERT INTO checkpointd_spent_checkpoints (id)"
                " SELECT unnest($1::bytea[]) ON CONFLICT DO NOTHING",
                [id_bytes(i) for i in checkpoint_ids],
            )

    async def index_packed_blobs(self, rows: Sequence[Any]) -> None:
        """Record where each (checked) row's blob is; the newest row of a key
        wins (a racing append's upsert waits for ours; see ``base.PackIndex``)."""
        if isinstance(rows, PackedRows):  # several packs: one key order for the locks
            rows = sorted(rows, key=lambda row: row.key)
        ids = await pack_ids(self.conn, rows)
        await self.conn.execute(
            "INSERT INTO checkpointd_packed_blobs"
            " (digest, pack, frame_offset, frame_length, raw_size, codec)"
            " SELECT * FROM unnest($1::bytea[], $2::bigint[], $3::integer[], $4::integer[],"
            " $5::integer[], $6::smallint[]) ON CONFLICT (digest) DO UPDATE SET"
            " pack = excluded.pack, frame_offset = excluded.frame_offset,"
            " frame_length = excluded.frame_length, raw_size = excluded.raw_size,"
            " codec = excluded.codec",
            *packed_columns(rows, ids),
        )

    async def lease_for_acquire(self, thread_id: str) -> tuple[LeaseRecord | None, int]:
        # Creates the thread's row or locks it, in one round trip.
        row = await self.conn.fetchrow(
            "INSERT INTO checkpointd_threads (thread_id) VALUES ($1)"
            " ON CONFLICT (thread_id) DO UPDATE SET thread_id = excluded.thread_id"
            " RETURNING last_fence, lease_owner, lease_fence, lease_expires_at, lease_holder",
            id_bytes(thread_id),
        )
        assert row is not None
        return lease_of(row), row["last_fence"]

    async def write_lease(self, thread_id: str, record: LeaseRecord) -> None:
        await self.conn.execute(
            "UPDATE checkpointd_threads SET last_fence = $2, lease_owner = $3,"
            " lease_fence = $2, lease_expires_at = $4, lease_holder = $5"
            " WHERE thread_id = $1",
            id_bytes(thread_id),
            record.fence,
            record.owner_token,
            record.expires_at,
            record.holder,
        )

    async def set_lease_expiry(self, thread_id: str, expires_at: int) -> None:
        await self.conn.execute(
            "UPDATE checkpointd_threads SET lease_expires_at = $2 WHERE thread_id = $1",
            id_bytes(thread_id),
            expires_at,
        )

    async def remove_lease(self, thread_id: str, token: str, fence: int) -> None:
        await self.conn.execute(
            "UPDATE checkpointd_threads SET lease_owner = NULL, lease_fence = NULL,"
            " lease_expires_at = NULL, lease_holder = NULL"
            " WHERE thread_id = $1 AND lease_owner = $2 AND lease_fence = $3",
            id_bytes(thread_id),
            token,
            fence,
        )

    async def drop_pins(self, thread_id: str, token: str, fence: int) -> None:
        await self.conn.execute(
            "WITH gone AS (DELETE FROM checkpointd_leases"
            " WHERE thread_id = $1 AND owner_token = $2 AND fence = $3 RETURNING id)"
            " DELETE FROM checkpointd_lease_pins WHERE lease_id IN (SELECT id FROM gone)",
            id_bytes(thread_id),
            token,
            fence,
        )

    async def pin(
        self, thread_id: str, token: str, fence: int, keys: Sequence[bytes]
    ) -> set[bytes]:
        # The lease's id, made by its first pin (under the thread's row lock:
        # no other pin of the thread runs meanwhile).
        lease = (id_bytes(thread_id), token, fence)
        lease_id = await self.conn.fetchval(
            "SELECT id FROM checkpointd_leases"
            " WHERE thread_id = $1 AND owner_token = $2 AND fence = $3",
            *lease,
        )
        if lease_id is None:
            lease_id = await self.conn.fetchval(
                "INSERT INTO checkpointd_leases (thread_id, owner_token, fence)"
                " VALUES ($1, $2, $3) RETURNING id",
                *lease,
            )
        await self.conn.execute(
            "INSERT INTO checkpointd_lease_pins (lease_id, key)"
            " SELECT $1, k FROM unnest($2::bytea[]) AS k ON CONFLICT DO NOTHING",
            lease_id,
            builtins.list(keys),
        )
        # Share locks: pins never wait for each other, only for a condemnation.
        marks = await lock_marks(self.conn, keys, "SHARE")
        now = await self.now()
        return {key for key, until in marks.items() if until is not None and now < until}

    async def release_condemned(self, keys: Sequence[bytes]) -> None:
        await self.conn.execute(
            "SELECT 1 FROM checkpointd_blob_marks WHERE key = ANY($1::bytea[])"
            " ORDER BY key FOR UPDATE",
            builtins.list(keys),
        )
        await self.conn.execute(
            "DELETE FROM checkpointd_blob_marks WHERE key = ANY($1::bytea[])", builtins.list(keys)
        )

    async def mark_missing(self, keys: Sequence[bytes], now: int) -> None:
        await self.conn.execute(
            "INSERT INTO checkpointd_blob_missing (key, marked_at)"
            " SELECT k, $2 FROM unnest($1::bytea[]) AS k ON CONFLICT DO NOTHING",
            builtins.list(keys),
            now,
        )

    async def clear_missing(self, keys: Sequence[bytes]) -> None:
        await self.conn.execute(
            "DELETE FROM checkpointd_blob_missing WHERE key = ANY($1::bytea[])",
            builtins.list(keys),
        )


async def lock_marks(
    conn: asyncpg.Connection, keys: Sequence[bytes], mode: str
) -> dict[bytes, int | None]:
    """Lock the mark row of every key (``SHARE`` or ``UPDATE``), creating
    missing rows; returns each key's ``condemned_until``.

    A row can vanish between our insert and our lock (a sweep forgets unused
    rows); we then make it again, because a pin that locked no row would not
    be seen by a condemnation running at the same time.
    """
    marks: dict[bytes, int | None] = {}
    missing = list(keys)
    while missing:
        await conn.execute(
            "INSERT INTO checkpointd_blob_marks (key)"
            " SELECT k FROM unnest($1::bytea[]) WITH ORDINALITY AS u(k, n) ORDER BY n"
            " ON CONFLICT DO NOTHING",
            missing,
        )
        for row in await conn.fetch(
            "SELECT key, condemned_until FROM checkpointd_blob_marks"
            f" WHERE key = ANY($1::bytea[]) ORDER BY key FOR {mode}",
            missing,
        ):
            marks[bytes(row["key"])] = row["condemned_until"]
        missing = [key for key in missing if key not in marks]
    return marks


async def referenced_keys(conn: asyncpg.Connection, keys: Sequence[bytes]) -> set[bytes]:
    """Those of ``keys`` a checkpoint uses (an open run means a head uses the
    key, whatever refs says)."""
    return {
        bytes(r["key"])
        for r in await conn.fetch(
            "SELECT DISTINCT key FROM checkpointd_blob_counts"
            " WHERE key = ANY($1::bytea[]) AND (refs > 0 OR open_since IS NOT NULL)",
            builtins.list(keys),
        )
    }


async def forget_unmarked(conn: asyncpg.Connection, keys: Sequence[bytes]) -> None:
    """Drop mark rows that hold no condemnation (the caller has them locked)."""
    await conn.execute(
        "DELETE FROM checkpointd_blob_marks"
        " WHERE key = ANY($1::bytea[]) AND condemned_until IS NULL",
        list(keys),
    )


async def pack_ids(conn: asyncpg.Connection, rows: Sequence[PackedBlob]) -> dict[bytes, int]:
    """The id of each pack the rows name (created when new)."""
    packs = builtins.list(dict.fromkeys(pack_digest(row.pack) for row in rows))
    await conn.execute(
        "INSERT INTO checkpointd_packs (digest) SELECT unnest($1::bytea[]) ON CONFLICT DO NOTHING",
        packs,
    )
    return {
        bytes(r["digest"]): r["id"]
        for r in await conn.fetch(
            "SELECT id, digest FROM checkpointd_packs WHERE digest = ANY($1::bytea[])", packs
        )
    }


def packed_columns(
    rows: Sequence[PackedBlob], ids: dict[bytes, int]
) -> tuple[builtins.list[Any], ...]:
    """The rows as the six arrays of ``unnest($1::bytea[], $2::bigint[],
    $3::integer[], $4::integer[], $5::integer[], $6::smallint[])``: digest,
    pack id, frame offset, frame length, raw size, codec."""
    return (
        [digest_of(row.key) for row in rows],
        [ids[pack_digest(row.pack)] for row in rows],
        [row.offset for row in rows],
        [row.length for row in rows],
        [row.raw_size for row in rows],
        [row.codec for row in rows],
    )
