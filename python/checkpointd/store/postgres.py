"""PostgreSQL checkpoint and instance stores (docs/contract.md#checkpoint-store): many sidecars, one database.

Opened by ``open_store("postgresql://…")`` through ``open_postgres_store``. The
schema is created or migrated on open (``_postgres_db._migrate``: versioned,
idempotent, under an advisory lock so concurrent opens take turns), and a wrong
URL, password or database fails there, not at first use.

How each write stays atomic across processes and hosts: it is one transaction
that first locks the thread's row in ``checkpointd_threads`` (``SELECT … FOR
UPDATE``), reads the clock, then runs the docs/contract.md#checkpoint-store checks in their order and only
then writes. Everything that touches one thread therefore runs one at a time, and
a failed check rolls the transaction back, so nothing is half-written. A deadlock
or serialization failure the server reports is retried (the transaction was
rolled back whole).

One clock: lease expiry compares against ``now`` — the injected clock when the
store was opened with one, else the database server's clock, read inside the
transaction after the lock, so sidecars whose own clocks are skewed still agree.

Storage:

* a checkpoint is one row holding one zlib-compressed document, never a row per
  file; consecutive checkpoints are stored as deltas against their parent when
  that is small (``_documents``);
* ids are stored as their UTF-8 bytes (``bytea``), so ordering never depends on
  the database's collation and any well-formed id, NUL included, round-trips;
* blob reference counts are rows per (thread, key), the key in a compact 33-byte
  form (``_options.key_to_bytes``); a row counts ``refs`` plus, while the
  thread's head uses the key, ``head_ordinal - open_since`` (a run, see
  ``_core``), and the count of a key is the sum over threads. An append writes
  rows only for the keys in which it differs from its parent; a no-change
  capture updates the thread row alone. A thread's writes touch only its own
  count rows, under its own lock, so writers on different threads that share
  content never wait for each other.

Pin/condemn (``BlobGuard``): each key touched by a pin or a sweep has a row in
``checkpointd_blob_marks``. ``pin_blobs`` share-locks it and ``condemn_blobs``
locks it exclusively, so a pin and a condemnation of one key never interleave:
the later one sees the earlier one's committed result. ``condemn_blobs`` also
share-locks the thread row of every thread that pinned one of its keys, so an
append in flight on such a thread finishes before the sweep counts references,
and a later append checks its lease against a clock read after the sweep's — a
pin the sweep judged dead belongs to a lease no append can use any more.

Failures of the database (it went away, refused the connection, the password is
wrong) raise ``SandboxCheckpointError`` with code ``STORE_UNAVAILABLE`` and a
message naming the store as ``user@host:port/database`` (never the password).
"""

from __future__ import annotations

import asyncio
import builtins
import json
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import asyncpg

from ..model import BlobReference, Checkpoint
from ..validation import check_id, utf8_key
from . import _documents as documents
from ._core import (
    RecentContents,
    Rows,
    SqlCheckpointStore,
    audited,
    checkpoints_of,
    damaged_of,
    head_key_sets,
    paused,
)
from ._options import (
    StoreOptions,
    blob_counts,
    check_hold_ms,
    check_instance_record,
    check_thread_page,
    condemnable_keys,
    key_from_bytes,
    key_to_bytes,
    validate_store_options,
)
from ._postgres_db import (
    DEFAULT_POOL_MAX_SIZE,
    SCHEMA_VERSION,
    PostgresBase,
    describe_url,
    from_numeric,
    id_bytes,
    id_text,
    open_pool,
)
from ._postgres_packs import PostgresPacks
from ._postgres_tx import PostgresTx, forget_unmarked, lock_marks, referenced_keys
from .base import (
    DEFAULT_LEASE_DURATION_MS,
    DEFAULT_RENEW_AFTER_MS,
    DEFAULT_THREAD_PAGE,
    BlobCount,
    Clock,
    DamagedCheckpoint,
    InstanceRecord,
    ThreadSummary,
)

T = TypeVar("T")

# How many recently appended contents a store object keeps for the next delta.
_RECENT_CONTENTS = 8


class PostgresCheckpointStore(PostgresPacks, SqlCheckpointStore):
    """The docs/contract.md#checkpoint-store checkpoint store on PostgreSQL (asyncpg), also a BlobGuard.

    Open it with ``await open_postgres_store(url, …)`` (or ``open_store``); options
    as docs/contract.md#checkpoint-store. ``now=None`` means the database server's clock. The writes of the contract
    docs/contract.md#checkpoint-store are ``_core.SqlCheckpointStore``'s, over ``PostgresTx``.
    """

    def __init__(
        self,
        pool: asyncpg.Pool,
        store_name: str,
        options: StoreOptions,
        *,
        injected_clock: bool,
    ) -> None:
        super().__init__(pool, store_name)
        self._options = options
        self._injected_clock = injected_clock
        # Contents of recently appended checkpoints by (id, row xmin): the next
        # append of the thread makes its delta against one of them without reading
        # it back. The xmin (the inserting transaction) tells a row from a later
        # one that reuses a deleted id, so a cached content is never the wrong one.
        self._recent = RecentContents(_RECENT_CONTENTS)

    async def _write(self, operation: str, body: Callable[[Any], Awaitable[T]]) -> T:
        self._check_open()

        async def run(conn: asyncpg.Connection) -> T:
            return await body(PostgresTx(conn, self))

        return await self._transaction(operation, run)

    def _is_closed(self) -> bool:
        return self._closed

    # ------------------------------------------------------------------ reads

    async def _row_version(self, checkpoint_id: str) -> int | None:
        check_id(checkpoint_id, "checkpoint id")

        async def body(conn: asyncpg.Connection) -> int | None:
            version: int | None = await conn.fetchval(
                "SELECT xmin::text::bigint FROM checkpointd_checkpoints WHERE id = $1",
                id_bytes(checkpoint_id),
            )
            return version

        return await self._transaction("get", body, read_only=True)

    async def _read_chain(self, checkpoint_id: str) -> tuple[int, Rows] | None:
        async def body(conn: asyncpg.Connection) -> tuple[int, Rows] | None:
            # One statement: the row's xmin comes with the chain it heads.
            found = await conn.fetch(
                "WITH RECURSIVE chain (id, base_id, document, version) AS ("
                " SELECT id, base_id, document, xmin::text::bigint"
                " FROM checkpointd_checkpoints WHERE id = $1"
                " UNION ALL"
                " SELECT c.id, c.base_id, c.document, c.xmin::text::bigint"
                " FROM checkpointd_checkpoints AS c JOIN chain ON c.id = chain.base_id"
                ") SELECT id, base_id, document, version FROM chain",
                id_bytes(checkpoint_id),
            )
            rows: Rows = {
                str(id_text(r["id"])): (id_text(r["base_id"]), r["document"]) for r in found
            }
            versions = {str(id_text(r["id"])): r["version"] for r in found}
            if checkpoint_id not in versions:
                return None
            return int(versions[checkpoint_id]), rows

        return await self._transaction("get", body, read_only=True)

    async def list(self, thread_id: str) -> builtins.list[Checkpoint]:
        """Every checkpoint of the thread by created_at, then UTF-8 bytes of the id."""
        check_id(thread_id, "thread id")

        async def body(conn: asyncpg.Connection) -> Rows:
            # A delta's base is always in the same thread: one query has them all.
            return {
                str(id_text(r["id"])): (id_text(r["base_id"]), r["document"])
                for r in await conn.fetch(
                    "SELECT id, base_id, document FROM checkpointd_checkpoints"
                    " WHERE thread_id = $1",
                    id_bytes(thread_id),
                )
            }

        rows = await self._transaction("list", body, read_only=True)

        return await checkpoints_of(rows)

    async def get_head(self, thread_id: str) -> str | None:
        check_id(thread_id, "thread id")

        async def body(conn: asyncpg.Connection) -> bytes | None:
            head: bytes | None = await conn.fetchval(
                "SELECT head_id FROM checkpointd_threads WHERE thread_id = $1", id_bytes(thread_id)
            )
            return head

        return id_text(await self._transaction("get_head", body, read_only=True))

    async def list_threads(
        self, *, after: str | None = None, limit: int = DEFAULT_THREAD_PAGE
    ) -> builtins.list[ThreadSummary]:
        """See ``base.ThreadListing``. Ids are bytea, so they compare by UTF-8 bytes."""
        after, limit = check_thread_page(after, limit)

        async def body(conn: asyncpg.Connection) -> builtins.list[Any]:
            rows: builtins.list[Any] = await conn.fetch(
                "SELECT c.thread_id, t.head_id, count(*) AS n, max(c.created_at) AS newest"
                " FROM checkpointd_checkpoints c"
                " LEFT JOIN checkpointd_threads t ON t.thread_id = c.thread_id"
                " WHERE c.thread_id > $1 GROUP BY c.thread_id, t.head_id"
                " ORDER BY c.thread_id LIMIT $2",
                b"" if after is None else id_bytes(after),
                limit,
            )
            return rows

        rows = await self._transaction("list_threads", body, read_only=True)
        return [
            ThreadSummary(
                str(id_text(r["thread_id"])),
                id_text(r["head_id"]),
                int(r["n"]),
                from_numeric(r["newest"]),
            )
            for r in rows
        ]

    async def spent_checkpoint_ids(self, checkpoint_ids: builtins.list[str]) -> builtins.list[str]:
        """Which of these ids belonged to deleted request_id checkpoints (``_core``)."""
        wanted = [i for i in dict.fromkeys(checkpoint_ids) if isinstance(i, str)]

        async def body(conn: asyncpg.Connection) -> set[str]:
            return {
                str(id_text(r["id"]))
                for r in await conn.fetch(
                    "SELECT id FROM checkpointd_spent_checkpoints WHERE id = ANY($1::bytea[])",
                    [id_bytes(i) for i in wanted],
                )
            }

        found = await self._transaction("spent_checkpoint_ids", body, read_only=True)
        return [i for i in wanted if i in found]

    async def list_blob_references(self) -> builtins.list[BlobReference]:
        """``(key, count)`` for every count > 0, sorted by the UTF-8 bytes of the key."""

        async def body(conn: asyncpg.Connection) -> builtins.list[asyncpg.Record]:
            # A row counts refs, plus its open run's length beyond one (``_core``).
            rows: builtins.list[asyncpg.Record] = await conn.fetch(
                "SELECT c.key,"
                " sum(c.refs + coalesce(t.head_ordinal - c.open_since, 0))::bigint AS refs"
                " FROM checkpointd_blob_counts AS c"
                " LEFT JOIN checkpointd_threads AS t ON t.thread_id = c.thread_id"
                " GROUP BY c.key"
                " HAVING sum(c.refs + coalesce(t.head_ordinal - c.open_since, 0)) > 0"
            )
            return rows

        rows = await self._transaction("list_blob_references", body, read_only=True)
        references = [BlobReference(key_from_bytes(row["key"]), row["refs"]) for row in rows]
        references.sort(key=lambda ref: utf8_key(ref.key))
        return references

    # ------------------------------------------------------------------ blob audit

    @staticmethod
    async def _audit_rows(
        conn: asyncpg.Connection,
    ) -> tuple[dict[bytes, Rows], dict[bytes, dict[bytes, int]]]:
        """Every stored document and every count row's count, both per thread."""
        rows: dict[bytes, Rows] = {}
        for r in await conn.fetch(
            "SELECT thread_id, id, base_id, document FROM checkpointd_checkpoints"
        ):
            rows.setdefault(bytes(r["thread_id"]), {})[str(id_text(r["id"]))] = (
                id_text(r["base_id"]),
                r["document"],
            )
        stored: dict[bytes, dict[bytes, int]] = {}
        for r in await conn.fetch(
            "SELECT c.thread_id, c.key,"
            " c.refs + coalesce(t.head_ordinal - c.open_since, 0) AS refs"
            " FROM checkpointd_blob_counts AS c"
            " LEFT JOIN checkpointd_threads AS t ON t.thread_id = c.thread_id"
        ):
            stored.setdefault(bytes(r["thread_id"]), {})[bytes(r["key"])] = r["refs"]
        return rows, stored

    async def audit_blob_references(self, *, with_sizes: bool = False) -> builtins.list[BlobCount]:
        """Stored counts beside the counts the manifests give (BlobAudit), read
        in one REPEATABLE READ snapshot; the manifests are decoded afterwards."""

        async def body(
            conn: asyncpg.Connection,
        ) -> tuple[dict[bytes, Rows], dict[bytes, dict[bytes, int]]]:
            await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            return await self._audit_rows(conn)

        rows, stored = await self._transaction("audit_blob_references", body)
        merged: Rows = {i: row for thread_rows in rows.values() for i, row in thread_rows.items()}
        totals: Counter[bytes] = Counter()
        for counts in stored.values():
            totals.update(counts)
        return await audited(merged, dict(totals), with_sizes=with_sizes)

    async def damaged_checkpoints(self) -> builtins.list[DamagedCheckpoint]:
        """See ``base.DocumentAudit``: every row read in one statement, checked
        afterwards."""

        async def body(conn: asyncpg.Connection) -> builtins.list[asyncpg.Record]:
            found: builtins.list[asyncpg.Record] = await conn.fetch(
                "SELECT thread_id, id, base_id, document FROM checkpointd_checkpoints"
            )
            return found

        records = await self._transaction("damaged_checkpoints", body, read_only=True)
        rows: Rows = {
            str(id_text(r["id"])): (id_text(r["base_id"]), r["document"]) for r in records
        }
        threads = {str(id_text(r["id"])): str(id_text(r["thread_id"])) for r in records}
        return await damaged_of(rows, threads)

    async def repair_blob_references(self) -> builtins.list[BlobCount]:
        """Set every thread's count rows to what its manifests say, in one
        transaction holding every thread row (writers wait); returns the keys
        whose total was wrong. Runs are rebuilt too (one per head key, at the
        thread's ordinal), so each row's ``refs`` is then its count."""

        async def body(conn: asyncpg.Connection) -> builtins.list[BlobCount]:
            # Lock order as everywhere: thread rows first (here all, in key order).
            threads = {
                bytes(r["thread_id"]): (id_text(r["head_id"]), r["head_ordinal"])
                for r in await conn.fetch(
                    "SELECT thread_id, head_id, head_ordinal FROM checkpointd_threads"
                    " ORDER BY thread_id FOR UPDATE"
                )
            }
            rows, stored = await self._audit_rows(conn)
            raw: dict[bytes, dict[bytes, tuple[int, int | None]]] = {}
            for r in await conn.fetch(
                "SELECT thread_id, key, refs, open_since FROM checkpointd_blob_counts"
            ):
                raw.setdefault(bytes(r["thread_id"]), {})[bytes(r["key"])] = (
                    r["refs"],
                    r["open_since"],
                )
            totals: Counter[bytes] = Counter()
            manifest_totals: Counter[bytes] = Counter()
            all_sizes: dict[bytes, int] = {}
            for thread in sorted(set(rows) | set(stored)):
                thread_rows = rows.get(thread, {})
                totals.update(stored.get(thread, {}))
                manifests, sizes = await asyncio.to_thread(
                    paused, documents.count_manifest_keys, thread_rows
                )
                manifest_totals.update(manifests)
                for key, size in sizes.items():
                    all_sizes.setdefault(key, size)
                head_id, ordinal = threads.get(thread, (None, 0))
                head_keys: set[bytes] = set()
                if head_id is not None and head_id in thread_rows:
                    key_sets = head_key_sets({"head": head_id}, thread_rows)
                    head_keys = set(key_sets["head"].keys())
                have = raw.get(thread, {})
                want = {key: (n, None) for key, n in manifests.items() if n > 0}
                want.update((key, (manifests.get(key, 0), ordinal)) for key in head_keys)
                fixes = [(key, row) for key, row in want.items() if have.get(key) != row]
                if fixes:
                    await conn.execute(
                        "INSERT INTO checkpointd_blob_counts AS c (thread_id, key, refs, open_since)"
                        " SELECT $1, k, n, o"
                        " FROM unnest($2::bytea[], $3::bigint[], $4::bigint[]) AS d(k, n, o)"
                        " ON CONFLICT (thread_id, key) DO UPDATE"
                        " SET refs = excluded.refs, open_since = excluded.open_since",
                        thread,
                        [key for key, _ in fixes],
                        [n for _, (n, _) in fixes],
                        [o for _, (_, o) in fixes],
                    )
                gone = [key for key in have if key not in want]
                if gone:
                    await conn.execute(
                        "DELETE FROM checkpointd_blob_counts WHERE thread_id = $1"
                        " AND key = ANY($2::bytea[])",
                        thread,
                        gone,
                    )
            audit = blob_counts(dict(totals), dict(manifest_totals), all_sizes)
            return [count for count in audit if not count.agrees]

        return await self._transaction("repair_blob_references", body)

    async def list_missing_blobs(self) -> builtins.list[str]:
        async def body(conn: asyncpg.Connection) -> builtins.list[asyncpg.Record]:
            found: builtins.list[asyncpg.Record] = await conn.fetch(
                "SELECT key FROM checkpointd_blob_missing"
            )
            return found

        keys = [
            key_from_bytes(bytes(r["key"]))
            for r in await self._transaction("list_missing_blobs", body, read_only=True)
        ]
        keys.sort(key=utf8_key)
        return keys

    # ------------------------------------------------------------------ blob guard

    async def _condemn(
        self, keys: builtins.list[str], hold_ms: int, *, referenced_too: bool
    ) -> builtins.list[str]:
        self._check_open()
        hold = check_hold_ms(hold_ms)
        candidates = condemnable_keys(keys)
        if not candidates:
            return []
        binary = sorted({key_to_bytes(key) for key in candidates})

        async def body(conn: asyncpg.Connection) -> builtins.list[str]:
            # 1. Share-lock the thread rows of every thread that pinned one of the
            #    keys, so an append of such a thread that is in flight finishes
            #    before we count (its count rows become visible), and one that
            #    comes later checks its lease against a clock read after ours: a
            #    pin we judge dead belongs to a lease no append can use any more.
            pin_threads = [
                bytes(r["thread_id"])
                for r in await conn.fetch(
                    "SELECT DISTINCT s.thread_id FROM checkpointd_lease_pins p"
                    " JOIN checkpointd_leases s ON s.id = p.lease_id"
                    " WHERE p.key = ANY($1::bytea[])",
                    binary,
                )
            ]
            locked_threads = {
                bytes(r["thread_id"])
                for r in await conn.fetch(
                    "SELECT thread_id FROM checkpointd_threads WHERE thread_id = ANY($1::bytea[])"
                    " ORDER BY thread_id FOR SHARE",
                    pin_threads,
                )
            }
            # 2. Lock the keys' mark rows: a pin in flight finishes first.
            marks = await lock_marks(conn, binary, "UPDATE")
            now = await self._now(conn)
            # 3. Judge. A pin of a thread we did not lock (it pinned after step 1)
            #    counts as live: skipping a key is always safe.
            blocked = {
                bytes(r["key"])
                for r in await conn.fetch(
                    "SELECT p.key FROM checkpointd_lease_pins AS p"
                    " JOIN checkpointd_leases AS s ON s.id = p.lease_id"
                    " LEFT JOIN checkpointd_threads AS t ON t.thread_id = s.thread_id"
                    " AND t.lease_owner = s.owner_token AND t.lease_fence = s.fence"
                    " WHERE p.key = ANY($1::bytea[])"
                    " AND (NOT (s.thread_id = ANY($3::bytea[])) OR $2 < t.lease_expires_at)",
                    binary,
                    now,
                    list(locked_threads),
                )
            }
            if not referenced_too:
                blocked.update(await referenced_keys(conn, binary))
            chosen = [
                key
                for key, until in marks.items()
                if key not in blocked and (until is None or now >= until)
            ]
            if chosen:
                await conn.execute(
                    "UPDATE checkpointd_blob_marks SET condemned_until = $2"
                    " WHERE key = ANY($1::bytea[])",
                    chosen,
                    now + hold,
                )
            await forget_unmarked(conn, binary)
            condemned = {key_from_bytes(key) for key in chosen}
            return [key for key in candidates if key in condemned]

        return await self._transaction("condemn_blobs", body)


# ---------------------------------------------------------------------------- instances


def _encode_instance(record: InstanceRecord) -> bytes:
    return json.dumps(
        [
            record.provider,
            record.provider_sandbox_id,
            record.thread_id,
            record.updated_at,
            record.latest_snapshot_id,
            record.latest_run_id,
        ],
        allow_nan=False,
    ).encode("utf-8")


def _decode_instance(key: str, document: bytes) -> InstanceRecord:
    provider, sandbox_id, thread_id, updated_at, snapshot_id, run_id = json.loads(document)
    return InstanceRecord(
        key=key,
        provider=provider,
        provider_sandbox_id=sandbox_id,
        thread_id=thread_id,
        updated_at=updated_at,
        latest_snapshot_id=snapshot_id,
        latest_run_id=run_id,
    )


class PostgresInstanceStore(PostgresBase):
    """The docs/contract.md#checkpoint-store instance store on PostgreSQL; open with ``open_postgres_instance_store``."""

    async def get(self, key: str) -> InstanceRecord | None:
        """The record or None; an invalid key is INVALID_ID; STORE_UNAVAILABLE on failure."""
        check_id(key, "instance key")

        async def body(conn: asyncpg.Connection) -> bytes | None:
            document: bytes | None = await conn.fetchval(
                "SELECT document FROM checkpointd_instances WHERE key = $1", id_bytes(key)
            )
            return document

        document = await self._transaction("get", body, read_only=True)
        return None if document is None else _decode_instance(key, document)

    async def upsert(self, record: InstanceRecord) -> None:
        """Replace the whole record (optional fields left out are cleared).

        Raises InvalidId / InvalidEntry for a bad record, STORE_UNAVAILABLE.
        """
        checked = check_instance_record(record)
        document = _encode_instance(checked)

        async def body(conn: asyncpg.Connection) -> None:
            await conn.execute(
                "INSERT INTO checkpointd_instances (key, document) VALUES ($1, $2)"
                " ON CONFLICT (key) DO UPDATE SET document = excluded.document",
                id_bytes(checked.key),
                document,
            )

        await self._transaction("upsert", body)

    async def delete(self, key: str) -> None:
        """Forget the key; a missing key is not an error."""
        check_id(key, "instance key")

        async def body(conn: asyncpg.Connection) -> None:
            await conn.execute("DELETE FROM checkpointd_instances WHERE key = $1", id_bytes(key))

        await self._transaction("delete", body)


async def open_postgres_store(
    url: str,
    *,
    now: Clock | None = None,
    lease_duration_ms: int = DEFAULT_LEASE_DURATION_MS,
    renew_after_ms: int = DEFAULT_RENEW_AFTER_MS,
    pool_max_size: int = DEFAULT_POOL_MAX_SIZE,
) -> PostgresCheckpointStore:
    """Connect, create or migrate the schema, and return the checkpoint store.

    ``now=None`` uses the database server's clock for leases. Raises
    SandboxCheckpointInvalidArgumentError for bad options or a malformed URL, and
    SandboxCheckpointError (STORE_UNAVAILABLE) when the server cannot be reached or
    refuses the credentials or database.
    """
    options = validate_store_options(now, lease_duration_ms, renew_after_ms)
    pool, store_name = await open_pool(url, pool_max_size)
    return PostgresCheckpointStore(pool, store_name, options, injected_clock=now is not None)


async def open_postgres_instance_store(
    url: str, *, pool_max_size: int = DEFAULT_POOL_MAX_SIZE
) -> PostgresInstanceStore:
    """Connect, create or migrate the schema, and return the instance store.

    Raises as ``open_postgres_store``.
    """
    pool, store_name = await open_pool(url, pool_max_size)
    return PostgresInstanceStore(pool, store_name)


__all__ = [
    "SCHEMA_VERSION",
    "PostgresCheckpointStore",
    "PostgresInstanceStore",
    "describe_url",
    "open_postgres_instance_store",
    "open_postgres_store",
]
