"""SQLite checkpoint and instance stores (aiosqlite, WAL), the embedded default.

The file, its schema and its transactions are ``_sqlite_db``'s; the SQL of
the writes is ``_sqlite_tx``'s and of the pack index ``_sqlite_packs``'s.
"""

from __future__ import annotations

import builtins
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiosqlite

from ..model import BlobReference, Checkpoint
from ..validation import check_id
from ._core import (
    RecentContents,
    Rows,
    SqlCheckpointStore,
    audited,
    checkpoints_of,
    damaged_of,
    repair_of,
)
from ._options import (
    StoreOptions,
    check_hold_ms,
    check_instance_record,
    check_thread_page,
    condemnable_keys,
    key_from_bytes,
    key_to_bytes,
    read_clock,
    validate_store_options,
)
from ._sqlite_db import (
    KEYS,
    PAGE_BYTES,
    SCHEMA_VERSION,
    SqliteDatabase,
    fetch_chains,
    fetch_in,
    fetchall,
    fetchone,
    key_params,
    sql_number,
)
from ._sqlite_packs import SqlitePacks
from ._sqlite_tx import SqliteTx
from .base import (
    DEFAULT_LEASE_DURATION_MS,
    DEFAULT_RENEW_AFTER_MS,
    DEFAULT_THREAD_PAGE,
    BlobCount,
    Clock,
    ClosingStore,
    DamagedCheckpoint,
    InstanceRecord,
    ThreadSummary,
)

# Contents of recently appended or read checkpoints kept per store object, so the
# next append of a thread makes its delta without reading its parent back, and a
# restore, its stash and an undo find the checkpoints they go between (a head,
# its target, the stash's head) without inflating them again. A 100k-entry
# manifest is ~17 MB; RECENT_CONTENTS_BUDGET bounds the bytes whatever the count.
RECENT_CONTENTS = 4
# An append that leaves a WAL of more than this copies it into the database right
# away (a passive checkpoint, which never waits for a reader; see
# ``_sqlite_db.WAL_KEPT_BYTES``).
WAL_CHECKPOINT_BYTES = 16 << 20


# Every key's count: its refs plus, per thread with an open run, the run's length
# beyond the one refs holds (see ``_core``).
_COUNTS = (
    "SELECT key, SUM(n) FROM ("
    " SELECT key, refs AS n FROM blob_references"
    " UNION ALL SELECT u.key, h.head_ordinal - u.open_since FROM blob_runs u"
    " JOIN heads h ON h.thread_id = u.thread_id"
    ") GROUP BY key"
)


T = TypeVar("T")


class SqliteCheckpointStore(SqlitePacks, SqlCheckpointStore, ClosingStore):
    """A checkpoint store in one SQLite file (docs/contract.md#checkpoint-store).

    Open with ``await SqliteCheckpointStore.open("/abs/path.db", now=…,
    lease_duration_ms=…, renew_after_ms=…)`` or ``open_store("sqlite:///abs/path.db")``.
    Several store objects and processes may share the file. The writes of docs/contract.md#checkpoint-store
    are ``_core.SqlCheckpointStore``'s, over ``SqliteTx``.
    """

    def __init__(self, database: SqliteDatabase, options: StoreOptions) -> None:
        self._db = database
        self._options = options
        self._recent = RecentContents(RECENT_CONTENTS)

    @classmethod
    async def open(
        cls,
        path: str,
        *,
        now: Clock | None = None,
        lease_duration_ms: int = DEFAULT_LEASE_DURATION_MS,
        renew_after_ms: int = DEFAULT_RENEW_AFTER_MS,
    ) -> SqliteCheckpointStore:
        """Open (create when missing) the store. Bad options raise
        SandboxCheckpointInvalidArgumentError before the file is touched."""
        options = validate_store_options(now, lease_duration_ms, renew_after_ms)
        return cls(await SqliteDatabase.open(path), options)

    @property
    def path(self) -> str:
        return self._db.path

    async def aclose(self) -> None:
        await self._db.close()

    def _now(self) -> int:
        return read_clock(self._options)

    async def _write(self, operation: str, body: Callable[[Any], Awaitable[T]]) -> T:
        async def run(conn: aiosqlite.Connection) -> T:
            return await body(SqliteTx(conn, self._options))

        result = await self._db.write(run)
        if operation == "append":
            await self._db.checkpoint_if_over(WAL_CHECKPOINT_BYTES)
        return result

    def _is_closed(self) -> bool:
        return self._db.closed

    # ------------------------------------------------------------------ reads

    async def _row_version(self, checkpoint_id: str) -> int | None:
        check_id(checkpoint_id, "checkpoint id")

        async def run(conn: aiosqlite.Connection) -> Any:
            return await fetchone(
                conn, "SELECT serial FROM checkpoints WHERE id = ?", (checkpoint_id,)
            )

        row = await self._db.read(run)
        return None if row is None else int(row[0])

    async def _read_chain(self, checkpoint_id: str) -> tuple[int, Rows] | None:
        async def run(conn: aiosqlite.Connection) -> tuple[int, Rows] | None:
            row = await fetchone(
                conn,
                "SELECT serial, base_id, document FROM checkpoints WHERE id = ?",
                (checkpoint_id,),
            )
            if row is None:
                return None
            serial, base_id, data = row
            rows: Rows = {checkpoint_id: (base_id, data)}
            if base_id is not None:
                await fetch_chains(conn, [checkpoint_id], rows)
            return int(serial), rows

        return await self._db.read(run)

    async def list(self, thread_id: str) -> builtins.list[Checkpoint]:
        """Every checkpoint of the thread by created_at, then UTF-8 bytes of the id."""
        check_id(thread_id, "thread id")

        async def run(conn: aiosqlite.Connection) -> Rows:
            # A delta's base is its parent, in the same thread: one query has them all.
            return {
                checkpoint_id: (base_id, data)
                for checkpoint_id, base_id, data in await fetchall(
                    conn,
                    "SELECT id, base_id, document FROM checkpoints WHERE thread_id = ?",
                    (thread_id,),
                )
            }

        rows = await self._db.read(run)

        return await checkpoints_of(rows)

    async def get_head(self, thread_id: str) -> str | None:
        check_id(thread_id, "thread id")

        async def run(conn: aiosqlite.Connection) -> Any:
            return await fetchone(
                conn, "SELECT head_id FROM heads WHERE thread_id = ?", (thread_id,)
            )

        row = await self._db.read(run)
        return None if row is None else row[0]

    async def list_threads(
        self, *, after: str | None = None, limit: int = DEFAULT_THREAD_PAGE
    ) -> builtins.list[ThreadSummary]:
        """See ``base.ThreadListing``. One indexed walk of checkpoints_by_thread
        (ids compare as BINARY, i.e. by UTF-8 bytes), stopped after ``limit``."""
        after, limit = check_thread_page(after, limit)

        async def run(conn: aiosqlite.Connection) -> builtins.list[Any]:
            return await fetchall(
                conn,
                "SELECT c.thread_id, h.head_id, COUNT(*), MAX(c.created_at)"
                " FROM checkpoints c LEFT JOIN heads h ON h.thread_id = c.thread_id"
                " WHERE c.thread_id > ? GROUP BY c.thread_id ORDER BY c.thread_id LIMIT ?",
                ("" if after is None else after, limit),
            )

        return [ThreadSummary(t, h, n, newest) for t, h, n, newest in await self._db.read(run)]

    async def list_blob_references(self) -> builtins.list[BlobReference]:
        async def run(conn: aiosqlite.Connection) -> builtins.list[Any]:
            # In key order along blob_references; each key's runs by their primary key.
            return await fetchall(
                conn,
                "SELECT r.key, r.refs + coalesce((SELECT SUM(h.head_ordinal - u.open_since)"
                " FROM blob_runs u JOIN heads h ON h.thread_id = u.thread_id"
                " WHERE u.key = r.key), 0) AS n FROM blob_references r"
                " WHERE n > 0 ORDER BY r.key",
            )

        rows = await self._db.read(run)
        return [BlobReference(key_from_bytes(key), refs) for key, refs in rows]

    async def spent_checkpoint_ids(self, checkpoint_ids: builtins.list[str]) -> builtins.list[str]:
        """Which of these ids belonged to deleted request_id checkpoints (``_core``)."""
        wanted = [i for i in dict.fromkeys(checkpoint_ids) if isinstance(i, str)]

        async def run(conn: aiosqlite.Connection) -> set[str]:
            sql = "SELECT id FROM spent_checkpoints WHERE id IN ({in})"
            return {row[0] for row in await fetch_in(conn, sql, wanted)}

        found = await self._db.read(run)
        return [i for i in wanted if i in found]

    # ------------------------------------------------------------------ blob guard

    async def _condemn(
        self, keys: builtins.list[str], hold_ms: int, *, referenced_too: bool
    ) -> builtins.list[str]:
        hold = check_hold_ms(hold_ms)
        candidates = condemnable_keys(keys)

        async def run(conn: aiosqlite.Connection) -> builtins.list[str]:
            now = self._now()
            blocked: set[bytes] = set()
            binary = [key_to_bytes(key) for key in candidates]
            referenced = (
                ("SELECT key FROM blob_references WHERE refs > 0 AND key IN ({in})", ()),
                # A key with an open run is in a head, whatever its refs say.
                ("SELECT DISTINCT key FROM blob_runs WHERE key IN ({in})", ()),
            )
            for sql, before in (
                *(() if referenced_too else referenced),
                ("SELECT key FROM blob_condemned WHERE until > ? AND key IN ({in})", (now,)),
                (
                    # From the few live leases to their pins of these keys
                    # (CROSS JOIN keeps that order: lease_pins is keyed by lease).
                    "SELECT p.key FROM writer_leases l CROSS JOIN leases s"
                    " CROSS JOIN lease_pins p WHERE l.expires_at > ?"
                    " AND s.thread_id = l.thread_id AND s.owner_token = l.owner_token"
                    " AND s.fence = l.fence AND p.lease_id = s.id AND p.key IN ({in})",
                    (now,),
                ),
            ):
                rows = await fetch_in(conn, sql, binary, *before)
                blocked.update(bytes(row[0]) for row in rows)
            chosen = [
                (key, raw)
                for key, raw in zip(candidates, binary, strict=True)
                if raw not in blocked
            ]
            await conn.executemany(
                "INSERT OR REPLACE INTO blob_condemned (key, until) VALUES (?, ?)",
                [(raw, now + hold) for _, raw in chosen],
            )
            return [key for key, _ in chosen]

        return await self._db.write(run)

    # ------------------------------------------------------------------ blob audit

    @staticmethod
    async def _audit_rows(conn: aiosqlite.Connection) -> tuple[Rows, dict[bytes, int]]:
        """Every stored document and every stored count (one snapshot when run
        inside a transaction)."""
        rows: Rows = {
            checkpoint_id: (base_id, data)
            for checkpoint_id, base_id, data in await fetchall(
                conn, "SELECT id, base_id, document FROM checkpoints"
            )
        }
        stored = {bytes(key): refs for key, refs in await fetchall(conn, _COUNTS)}
        return rows, stored

    async def audit_blob_references(self, *, with_sizes: bool = False) -> builtins.list[BlobCount]:
        """Stored counts beside the counts the manifests give (BlobAudit), from
        one read snapshot; the manifests are decoded after the lock is let go."""

        async def run(conn: aiosqlite.Connection) -> tuple[Rows, dict[bytes, int]]:
            await conn.execute("BEGIN")  # deferred: a WAL read snapshot, no lock
            try:
                return await self._audit_rows(conn)
            finally:
                await conn.execute("COMMIT")

        rows, stored = await self._db.read(run)
        return await audited(rows, stored, with_sizes=with_sizes)

    async def damaged_checkpoints(self) -> builtins.list[DamagedCheckpoint]:
        """See ``base.DocumentAudit``: every row read in one snapshot, checked
        after the lock is let go."""

        async def run(conn: aiosqlite.Connection) -> builtins.list[Any]:
            return await fetchall(conn, "SELECT id, thread_id, base_id, document FROM checkpoints")

        found = await self._db.read(run)
        rows: Rows = {checkpoint_id: (base_id, data) for checkpoint_id, _, base_id, data in found}
        return await damaged_of(
            rows, {checkpoint_id: thread for checkpoint_id, thread, _, _ in found}
        )

    async def repair_blob_references(self) -> builtins.list[BlobCount]:
        """Set every count to the manifests' in one write transaction (writers of
        every process wait for it); returns the keys that were wrong. The runs are
        rebuilt too: one per head key, at its thread's ordinal, so every row's
        ``refs`` is then the key's count."""

        async def run(conn: aiosqlite.Connection) -> builtins.list[BlobCount]:
            rows, stored = await self._audit_rows(conn)
            heads = {t: h for t, h in await fetchall(conn, "SELECT thread_id, head_id FROM heads")}
            repair = await repair_of(rows, stored, heads)
            await conn.execute("DELETE FROM blob_runs")
            for thread_id, keys in repair.head_keys.items():
                await conn.execute(
                    KEYS + "INSERT INTO blob_runs (key, thread_id, open_since)"
                    " SELECT key, :thread, (SELECT head_ordinal FROM heads"
                    " WHERE thread_id = :thread) FROM ks",
                    key_params(keys, thread=thread_id),
                )
            refs = {
                bytes(key): n
                for key, n in await fetchall(conn, "SELECT key, refs FROM blob_references")
            }
            await conn.executemany(
                "INSERT INTO blob_references (key, refs) VALUES (?, ?) "
                "ON CONFLICT (key) DO UPDATE SET refs = excluded.refs",
                sorted((k, n) for k, n in repair.refs.items() if refs.get(k) != n),
            )
            await conn.executemany(
                "DELETE FROM blob_references WHERE key = ?",
                [(key,) for key in sorted(refs) if key not in repair.refs],
            )
            return repair.wrong

        return await self._db.write(run)

    async def list_missing_blobs(self) -> builtins.list[str]:
        async def run(conn: aiosqlite.Connection) -> builtins.list[Any]:
            return await fetchall(conn, "SELECT key FROM blob_missing ORDER BY key")

        return [key_from_bytes(bytes(row[0])) for row in await self._db.read(run)]


class SqliteInstanceStore(ClosingStore):
    """Instance records in a SQLite file (may be the checkpoint store's file)."""

    def __init__(self, database: SqliteDatabase) -> None:
        self._db = database

    @classmethod
    async def open(cls, path: str) -> SqliteInstanceStore:
        return cls(await SqliteDatabase.open(path))

    async def aclose(self) -> None:
        await self._db.close()

    async def get(self, key: str) -> InstanceRecord | None:
        """The record or None; an invalid key is INVALID_ID."""
        check_id(key, "instance key")

        async def run(conn: aiosqlite.Connection) -> Any:
            return await fetchone(
                conn,
                "SELECT key, provider, provider_sandbox_id, thread_id, updated_at, "
                "latest_snapshot_id, latest_run_id FROM instances WHERE key = ?",
                (key,),
            )

        row = await self._db.read(run)
        return None if row is None else InstanceRecord(*row)

    async def upsert(self, record: InstanceRecord) -> None:
        """Replace the whole record (optional fields left out are cleared)."""
        checked = check_instance_record(record)

        async def run(conn: aiosqlite.Connection) -> None:
            await conn.execute(
                "INSERT OR REPLACE INTO instances (key, provider, provider_sandbox_id, "
                "thread_id, updated_at, latest_snapshot_id, latest_run_id) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    checked.key,
                    checked.provider,
                    checked.provider_sandbox_id,
                    checked.thread_id,
                    sql_number(checked.updated_at),
                    checked.latest_snapshot_id,
                    checked.latest_run_id,
                ),
            )

        await self._db.write(run)

    async def delete(self, key: str) -> None:
        """Forget the key; a missing key is not an error."""
        check_id(key, "instance key")

        async def run(conn: aiosqlite.Connection) -> None:
            await conn.execute("DELETE FROM instances WHERE key = ?", (key,))

        await self._db.write(run)


__all__ = [
    "PAGE_BYTES",
    "SCHEMA_VERSION",
    "SqliteCheckpointStore",
    "SqliteDatabase",
    "SqliteInstanceStore",
]
