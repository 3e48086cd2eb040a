"""PostgreSQL checkpoint and instance stores (docs/contract.md#checkpoint-store): many sidecars, one database.

Opened by ``open_store("postgresql://…")`` through ``open_postgres_store``. The
schema is created or migrated on open (``_migrate``: versioned, idempotent, under
an advisory lock so concurrent opens take turns), and a wrong URL, password or
database fails there, not at first use.

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
from collections.abc import Awaitable, Callable, Mapping, Sequence
from decimal import Decimal
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

import asyncpg

from ..errors import (
    STORE_UNAVAILABLE,
    SandboxCheckpointError,
    SandboxCheckpointInvalidArgumentError,
)
from ..manifest import split_digests
from ..model import BlobReference, Checkpoint
from ..validation import check_id, utf8_key
from . import _documents as documents
from ._core import (
    AppendFacts,
    IdTaken,
    KeySet,
    RecentContents,
    Rows,
    RunChange,
    SqlCheckpointStore,
    StoredRow,
    ThreadState,
    audited,
    checkpoints_of,
    damaged_of,
    head_key_sets,
    paused,
)
from ._options import (
    LeaseRecord,
    StoreOptions,
    blob_counts,
    check_hold_ms,
    check_instance_record,
    check_thread_page,
    condemnable_keys,
    key_from_bytes,
    key_to_bytes,
    read_clock,
    validate_store_options,
)
from ._packindex import (
    PackedRows,
    artifact_twin,
    check_packed_blobs,
    digest_of,
    digests_of,
    located_rows,
    pack_digest,
    row_from_sql,
)
from .base import (
    DEFAULT_LEASE_DURATION_MS,
    DEFAULT_RENEW_AFTER_MS,
    DEFAULT_THREAD_PAGE,
    BlobCount,
    Clock,
    DamagedCheckpoint,
    IndexRow,
    InstanceRecord,
    PackedBlob,
    ThreadSummary,
)

T = TypeVar("T")

DEFAULT_POOL_MAX_SIZE = 5
CONNECT_TIMEOUT_S = 10.0
# A deadlock or serialization failure rolls the whole transaction back, so
# running it again is safe; a few attempts are plenty (they are rare by design).
_RETRY_ATTEMPTS = 4

# How many recently appended contents a store object keeps for the next delta.
_RECENT_CONTENTS = 8

# The pack rows of the digests $1 (those a pack holds).
_LOCATE = (
    "SELECT b.digest, p.digest AS pack, b.frame_offset, b.frame_length,"
    " b.raw_size, b.codec FROM checkpointd_packed_blobs b"
    " JOIN checkpointd_packs p ON p.id = b.pack WHERE b.digest = ANY($1::bytea[])"
)
_DB_NOW = "(extract(epoch from clock_timestamp()) * 1000)::bigint"

# ---------------------------------------------------------------------------- schema

# Each entry migrates the schema from version i to i + 1. Never edit a released
# entry: add a new one.
_MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE checkpointd_threads (
        thread_id        bytea PRIMARY KEY,
        head_id          bytea,
        last_fence       bigint NOT NULL DEFAULT 0,
        lease_owner      text,
        lease_fence      bigint,
        lease_expires_at bigint
    );
    CREATE TABLE checkpointd_checkpoints (
        id         bytea PRIMARY KEY,
        thread_id  bytea NOT NULL,
        parent_id  bytea,
        created_at numeric NOT NULL,
        -- A delta's base (its parent, same thread); NULL for a keyframe.
        base_id    bytea,
        depth      integer NOT NULL DEFAULT 0,
        document   bytea NOT NULL
    );
    -- The document is already zlib-compressed: do not let TOAST try again.
    ALTER TABLE checkpointd_checkpoints ALTER COLUMN document SET STORAGE EXTERNAL;
    CREATE INDEX checkpointd_checkpoints_thread ON checkpointd_checkpoints (thread_id);
    CREATE INDEX checkpointd_checkpoints_base ON checkpointd_checkpoints (base_id)
        WHERE base_id IS NOT NULL;
    -- Reference counts per (thread, key): a thread's writes only ever touch its
    -- own rows, under its own thread lock, so writers on different threads that
    -- share content never wait for each other. The count of a key is the sum.
    CREATE TABLE checkpointd_blob_counts (
        thread_id bytea NOT NULL,
        key       bytea NOT NULL,
        refs      bigint NOT NULL,
        PRIMARY KEY (thread_id, key)
    ) WITH (fillfactor = 80);
    CREATE INDEX checkpointd_blob_counts_key ON checkpointd_blob_counts (key);
    -- One row per key a pin or a sweep has touched: the row pin and condemn lock,
    -- and the key's condemnation.
    CREATE TABLE checkpointd_blob_marks (
        key             bytea PRIMARY KEY,
        condemned_until bigint
    );
    CREATE TABLE checkpointd_blob_pins (
        thread_id   bytea NOT NULL,
        owner_token text NOT NULL,
        fence       bigint NOT NULL,
        key         bytea NOT NULL,
        PRIMARY KEY (thread_id, owner_token, fence, key)
    );
    CREATE INDEX checkpointd_blob_pins_key ON checkpointd_blob_pins (key);
    CREATE TABLE checkpointd_instances (
        key      bytea PRIMARY KEY,
        document bytea NOT NULL
    );
    """,
    # 2: who acquired the lease (``_options.lease_holder`` of its owner; NULL when
    # acquired without one), so that owner may take it back after a restart.
    """
    ALTER TABLE checkpointd_threads ADD COLUMN lease_holder text;
    """,
    # 3: keys ``checkpointd check`` found referenced but gone from the bucket.
    """
    CREATE TABLE checkpointd_blob_missing (
        key       bytea PRIMARY KEY,
        marked_at bigint NOT NULL
    );
    """,
    # 4: counts as runs (``_core``): a row's count is refs + (head_ordinal -
    # open_since) while its thread's head uses the key; ids of deleted request_id
    # checkpoints. ``_PYTHON_STEPS[4]`` then opens the runs of every head.
    """
    ALTER TABLE checkpointd_threads ADD COLUMN head_ordinal bigint NOT NULL DEFAULT 0;
    ALTER TABLE checkpointd_blob_counts ADD COLUMN open_since bigint;
    CREATE TABLE checkpointd_spent_checkpoints (id bytea PRIMARY KEY);
    """,
    # 5: the pack index (``store._packindex``, blobs/packs.py): each pack's digest
    # once, and per packed blob its digest, pack, frame position, raw size, codec.
    """
    CREATE TABLE checkpointd_packs (
        id     bigserial PRIMARY KEY,
        digest bytea NOT NULL UNIQUE
    );
    CREATE TABLE checkpointd_packed_blobs (
        digest       bytea PRIMARY KEY,
        pack         bigint NOT NULL,
        frame_offset integer NOT NULL,
        frame_length integer NOT NULL,
        raw_size     integer NOT NULL,
        codec        smallint NOT NULL
    );
    """,
    # 6: packs a sweep retired before deleting them (PackMaintenance.retire_pack):
    # no row may point at one again.
    """
    CREATE TABLE checkpointd_retired_packs (digest bytea PRIMARY KEY, until bigint NOT NULL);
    """,
    # 7: pins by lease id, as in SQLite schema 4: each lease that pinned gets a
    # small integer id once, and a pin row is (lease id, key) instead of the
    # thread, the owner token text and the fence again in every row. Every pin
    # moves over (a dead lease's too: it stays as dead as it was).
    """
    CREATE TABLE checkpointd_leases (
        id          bigserial PRIMARY KEY,
        thread_id   bytea NOT NULL,
        owner_token text NOT NULL,
        fence       bigint NOT NULL,
        UNIQUE (thread_id, owner_token, fence)
    );
    CREATE TABLE checkpointd_lease_pins (
        lease_id bigint NOT NULL,
        key      bytea NOT NULL,
        PRIMARY KEY (lease_id, key)
    );
    CREATE INDEX checkpointd_lease_pins_key ON checkpointd_lease_pins (key);
    INSERT INTO checkpointd_leases (thread_id, owner_token, fence)
        SELECT DISTINCT thread_id, owner_token, fence FROM checkpointd_blob_pins;
    INSERT INTO checkpointd_lease_pins (lease_id, key)
        SELECT l.id, p.key FROM checkpointd_blob_pins p JOIN checkpointd_leases l
        USING (thread_id, owner_token, fence);
    DROP TABLE checkpointd_blob_pins;
    """,
    # 8: pack keys are pinned and condemned too (kind p), as in SQLite schema
    # 5: a capture pins per pack, which the sweep of an older checkpointd would
    # not see, so the version keeps it out. No table changes.
    """
    COMMENT ON TABLE checkpointd_lease_pins IS
        'pins by lease id; a key is f (file), a (artifact) or p (pack) + 32 digest bytes';
    """,
)
SCHEMA_VERSION = len(_MIGRATIONS)
# pg_advisory_xact_lock(classid, objid): 'cpkd' and 1 — serialises concurrent opens.
_MIGRATION_LOCK = (0x63706B64, 1)


async def _migrate(conn: asyncpg.Connection, store_name: str) -> None:
    """Bring the schema to SCHEMA_VERSION; idempotent and safe for concurrent opens.

    Raises SandboxCheckpointError (STORE_UNAVAILABLE) when the database holds a
    newer schema than this code knows.
    """
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1, $2)", *_MIGRATION_LOCK)
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS checkpointd_schema ("
            " singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),"
            " version integer NOT NULL)"
        )
        version = await conn.fetchval("SELECT version FROM checkpointd_schema") or 0
        if version > SCHEMA_VERSION:
            raise SandboxCheckpointError(
                f"{store_name}: the database has checkpointd schema version {version}, "
                f"newer than this checkpointd supports ({SCHEMA_VERSION}); upgrade checkpointd",
                code=STORE_UNAVAILABLE,
                details={"store": store_name},
            )
        for number, migration in enumerate(_MIGRATIONS[version:], start=version + 1):
            await conn.execute(migration)
            step = _PYTHON_STEPS.get(number)
            if step is not None:
                await step(conn)
        await conn.execute(
            "INSERT INTO checkpointd_schema (version) VALUES ($1)"
            " ON CONFLICT (singleton) DO UPDATE SET version = excluded.version",
            SCHEMA_VERSION,
        )


# ---------------------------------------------------------------------------- helpers


def describe_url(url: str) -> str:
    """``PostgreSQL store user@host:port/database`` — the URL without its password."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or "localhost"
        port = parts.port or 5432
    except ValueError:
        return "PostgreSQL store (malformed URL)"
    database = unquote(parts.path.lstrip("/")) or (parts.username or "")
    user = f"{unquote(parts.username)}@" if parts.username else ""
    return f"PostgreSQL store {user}{host}:{port}/{database}"


_CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.InternalClientError,
)
_RETRYABLE = (asyncpg.exceptions.DeadlockDetectedError, asyncpg.SerializationError)


def _unavailable(store_name: str, operation: str, error: BaseException) -> SandboxCheckpointError:
    if isinstance(error, _CONNECTION_ERRORS):
        why = "the database is unreachable or went away"
    else:
        why = "the database failed"
    return SandboxCheckpointError(
        f"{store_name}: {operation} failed, {why}: {type(error).__name__}: {error}",
        code=STORE_UNAVAILABLE,
        details={"store": store_name, "operation": operation},
    )


async def _keep_session(conn: asyncpg.Connection) -> None:
    """The pool's reset on release: nothing to reset.

    asyncpg's default runs ``RESET ALL; UNLISTEN *; …`` after every operation, one
    more round trip each time. This store never changes session state (no SET,
    LISTEN, cursors or session advisory locks; its one advisory lock is
    transaction-scoped), and asyncpg still rolls back a transaction left open.
    """


async def _create_pool(url: str, store_name: str, max_size: int) -> asyncpg.Pool:
    """A connected pool; every connection problem becomes STORE_UNAVAILABLE here."""
    try:
        return await asyncpg.create_pool(
            dsn=url,
            min_size=1,
            max_size=max_size,
            timeout=CONNECT_TIMEOUT_S,
            reset=_keep_session,
        )
    except (ValueError, asyncpg.exceptions.ClientConfigurationError) as error:
        raise SandboxCheckpointInvalidArgumentError(
            f"{store_name}: malformed PostgreSQL URL: {error}"
        ) from None
    except (asyncpg.PostgresError, *_CONNECTION_ERRORS) as error:
        raise SandboxCheckpointError(
            f"{store_name}: cannot connect: {type(error).__name__}: {error}",
            code=STORE_UNAVAILABLE,
            details={"store": store_name},
        ) from error


def _b(text: str) -> bytes:
    return text.encode("utf-8")


def _s(data: bytes | None) -> str | None:
    return None if data is None else bytes(data).decode("utf-8")


def _created_at(value: int | float) -> Decimal:
    # numeric keeps ints of any size and floats exactly, so the column orders like
    # the Python values it came from.
    return Decimal(value)


def _number(value: Decimal) -> int | float:
    """A numeric created_at back as the int (or float) it was stored from."""
    return int(value) if value == value.to_integral_value() else float(value)


def _lease(row: asyncpg.Record | None) -> LeaseRecord | None:
    if row is None or row["lease_owner"] is None:
        return None
    return LeaseRecord(
        row["lease_owner"], row["lease_fence"], row["lease_expires_at"], row["lease_holder"]
    )


# ---------------------------------------------------------------------------- base


class _PostgresBase:
    """A pool plus the transaction runner that maps database failures."""

    def __init__(self, pool: asyncpg.Pool, store_name: str) -> None:
        self._pool = pool
        self.store_name = store_name
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxCheckpointError(
                f"{self.store_name} is closed",
                code=STORE_UNAVAILABLE,
                details={"store": self.store_name},
            )

    async def _transaction(
        self,
        operation: str,
        body: Callable[[asyncpg.Connection], Awaitable[T]],
        *,
        read_only: bool = False,
    ) -> T:
        """Run ``body`` in one transaction (a ``read_only`` body, one statement,
        runs without BEGIN/COMMIT), retrying deadlocks.

        Raises what ``body`` raises (SandboxCheckpointError subclasses, after the
        rollback), or SandboxCheckpointError(STORE_UNAVAILABLE) for a database
        failure. A dropped connection is retried once when nothing can have been
        written: the failure came before the transaction began (the pool handed
        out a connection that died with a server restart), or the body only reads.
        A write that was under way is never retried: it may have committed just
        before the connection went.
        """
        self._check_open()
        connection_retries = 1
        attempt = 0
        while True:
            attempt += 1
            began = False
            try:
                if read_only:
                    # A read is one statement: atomic without BEGIN/COMMIT trips.
                    async with self._pool.acquire() as conn:
                        return await body(conn)
                async with self._pool.acquire() as conn, conn.transaction():
                    began = True
                    return await body(conn)
            except SandboxCheckpointError:
                raise
            except _RETRYABLE as error:
                if attempt >= _RETRY_ATTEMPTS:
                    raise _unavailable(self.store_name, operation, error) from error
                await asyncio.sleep(0.005 * attempt)
            except (asyncpg.PostgresError, *_CONNECTION_ERRORS) as error:
                safe = read_only or not began
                if connection_retries > 0 and safe and isinstance(error, _CONNECTION_ERRORS):
                    connection_retries -= 1
                    continue
                raise _unavailable(self.store_name, operation, error) from error

    async def aclose(self) -> None:
        """Close the pool (waits briefly for operations in flight); never raises."""
        if self._closed:
            return
        self._closed = True
        try:
            await asyncio.wait_for(self._pool.close(), timeout=10)
        except Exception:  # noqa: BLE001 - closing must not fail; drop the sockets instead
            self._pool.terminate()

    async def __aenter__(self) -> Any:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


# ---------------------------------------------------------------------------- checkpoints


# A ``_core.KeySet`` as a table ``(key)`` from two parameters: the file digests
# concatenated (32 bytes each; the kind byte ``f`` is added here) and the artifact
# keys (bytea[]). One statement per key set, whatever its size.
def _key_table(digests: int, artifacts: int) -> str:
    return (
        f"(SELECT decode('66', 'hex') || substring(${digests}::bytea from g * 32 + 1 for 32)"
        f" AS key FROM generate_series(0, length(${digests}::bytea) / 32 - 1) AS g"
        f" UNION ALL SELECT unnest(${artifacts}::bytea[]))"
    )


def _key_args(keys: KeySet) -> tuple[bytes, builtins.list[bytes]]:
    return keys.digests, builtins.list(keys.artifacts)


class _PostgresTx:
    """``_core.WriteTx`` in one PostgreSQL transaction: ``lock_thread`` takes the
    thread's row lock (``FOR UPDATE``), everything after it runs under that lock."""

    def __init__(self, conn: asyncpg.Connection, store: PostgresCheckpointStore) -> None:
        self.conn = conn
        self._store = store

    async def lock_thread(self, thread_id: str) -> ThreadState:
        row = await self.conn.fetchrow(
            "SELECT head_id, head_ordinal, last_fence, lease_owner, lease_fence,"
            " lease_expires_at, lease_holder FROM checkpointd_threads"
            " WHERE thread_id = $1 FOR UPDATE",
            _b(thread_id),
        )
        if row is None:
            return ThreadState(None, 0, None)
        return ThreadState(_s(row["head_id"]), row["head_ordinal"], _lease(row))

    async def now(self) -> int:
        return await self._store._now(self.conn)

    async def id_used(self, checkpoint_id: str) -> bool:
        used: bool = await self.conn.fetchval(
            "SELECT EXISTS (SELECT 1 FROM checkpointd_checkpoints WHERE id = $1)"
            " OR EXISTS (SELECT 1 FROM checkpointd_spent_checkpoints WHERE id = $1)",
            _b(checkpoint_id),
        )
        return used

    async def row(self, checkpoint_id: str, *, lock: str = "") -> StoredRow | None:
        row = await self.conn.fetchrow(
            "SELECT thread_id, parent_id, depth, xmin::text::bigint AS xmin"
            f" FROM checkpointd_checkpoints WHERE id = $1 {lock}",
            _b(checkpoint_id),
        )
        if row is None:
            return None
        return StoredRow(str(_s(row["thread_id"])), _s(row["parent_id"]), row["depth"], row["xmin"])

    async def append_facts(self, checkpoint_id: str, head_id: str | None) -> AppendFacts:
        # One round trip, after the lock: the clock, whether the id is used, the head row.
        facts = await self.conn.fetchrow(
            "SELECT EXISTS (SELECT 1 FROM checkpointd_checkpoints WHERE id = $1)"
            " OR EXISTS (SELECT 1 FROM checkpointd_spent_checkpoints WHERE id = $1) AS used,"
            " p.thread_id, p.parent_id, p.depth, p.xmin::text::bigint AS xmin,"
            f" {_DB_NOW} AS db_now"
            " FROM (SELECT 1) AS one LEFT JOIN checkpointd_checkpoints AS p ON p.id = $2",
            _b(checkpoint_id),
            None if head_id is None else _b(head_id),
        )
        assert facts is not None
        now = read_clock(self._store._options) if self._store._injected_clock else facts["db_now"]
        head_row = None
        if facts["thread_id"] is not None:
            head_row = StoredRow(
                str(_s(facts["thread_id"])), _s(facts["parent_id"]), facts["depth"], facts["xmin"]
            )
        return AppendFacts(now, facts["used"], head_row)

    async def fork_source(self, checkpoint_id: str) -> StoredRow | None:
        # FOR SHARE keeps the source from being deleted (and its keys forgotten)
        # until the fork's references are counted.
        return await self.row(checkpoint_id, lock="FOR SHARE")

    async def thread_has_checkpoints(self, thread_id: str) -> bool:
        found = await self.conn.fetchval(
            "SELECT 1 FROM checkpointd_checkpoints WHERE thread_id = $1 LIMIT 1", _b(thread_id)
        )
        return found is not None

    async def fetch_chains(self, checkpoint_ids: Sequence[str], rows: Rows) -> None:
        await _fetch_chains(self.conn, checkpoint_ids, rows)

    async def thread_checkpoints(
        self, thread_id: str
    ) -> builtins.list[tuple[str, str | None, Any]]:
        return [
            (str(_s(r["id"])), _s(r["parent_id"]), r["created_at"])
            for r in await self.conn.fetch(
                "SELECT id, parent_id, created_at FROM checkpointd_checkpoints"
                " WHERE thread_id = $1",
                _b(thread_id),
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
                f" FROM {_key_table(10, 11)} AS k"
                " WHERE c.thread_id = $2 AND c.key = k.key AND c.open_since IS NOT NULL),"
                " opened AS ("
                " INSERT INTO checkpointd_blob_counts AS c (thread_id, key, refs, open_since)"
                f" SELECT $2, k.key, 1, $8 FROM {_key_table(12, 13)} AS k"
                " ON CONFLICT (thread_id, key) DO UPDATE"
                " SET refs = c.refs + 1 + coalesce($9 - c.open_since, 0), open_since = $8),"
                " moved AS (UPDATE checkpointd_threads SET head_id = $1, head_ordinal = $8"
                " WHERE thread_id = $2)"
                " SELECT xmin FROM inserted",
                _b(document["id"]),
                _b(document["thread_id"]),
                None if parent is None else _b(parent),
                _created_at(document["created_at"]),
                None if stored.base_id is None else _b(stored.base_id),
                stored.depth,
                stored.data,
                change.new_ordinal,
                change.old_ordinal,
                *_key_args(change.close),
                *_key_args(change.open),
            )
        except asyncpg.UniqueViolationError:
            # Another thread's append took the id after our check (no lock covers
            # ids of other threads); the primary key decides.
            raise IdTaken from None
        return xmin

    async def delete_rows(self, checkpoint_ids: Sequence[str]) -> Rows:
        return {
            str(_s(r["id"])): (_s(r["base_id"]), r["document"])
            for r in await self.conn.fetch(
                "DELETE FROM checkpointd_checkpoints WHERE id = ANY($1::bytea[])"
                " RETURNING id, base_id, document",
                [_b(i) for i in checkpoint_ids],
            )
        }

    async def dependents(self, removed: Sequence[str]) -> Rows:
        return {
            str(_s(r["id"])): (_s(r["base_id"]), r["document"])
            for r in await self.conn.fetch(
                "SELECT id, base_id, document FROM checkpointd_checkpoints"
                " WHERE base_id = ANY($1::bytea[])",
                [_b(i) for i in removed],
            )
        }

    async def rewrite_keyframe(self, checkpoint_id: str, data: bytes) -> None:
        await self.conn.execute(
            "UPDATE checkpointd_checkpoints SET document = $2, base_id = NULL, depth = 0"
            " WHERE id = $1",
            _b(checkpoint_id),
            data,
        )

    async def set_head(self, thread_id: str, head_id: str | None, ordinal: int) -> None:
        await self.conn.execute(
            "UPDATE checkpointd_threads SET head_id = $2, head_ordinal = $3 WHERE thread_id = $1",
            _b(thread_id),
            None if head_id is None else _b(head_id),
            ordinal,
        )

    async def drop_runs(self, thread_id: str, keys: KeySet, ordinal: int) -> None:
        if keys:
            await self.conn.execute(
                "UPDATE checkpointd_blob_counts AS c"
                " SET refs = c.refs + coalesce($2 - c.open_since, 0) - 1, open_since = NULL"
                f" FROM {_key_table(3, 4)} AS k WHERE c.thread_id = $1 AND c.key = k.key",
                _b(thread_id),
                ordinal,
                *_key_args(keys),
            )

    async def close_all_runs(self, thread_id: str, ordinal: int) -> None:
        await self.conn.execute(
            "UPDATE checkpointd_blob_counts SET refs = refs + ($2 - open_since),"
            " open_since = NULL WHERE thread_id = $1 AND open_since IS NOT NULL",
            _b(thread_id),
            ordinal,
        )

    async def reopen_runs(self, thread_id: str, keys: KeySet, old: int, new: int) -> None:
        if keys:
            await self.conn.execute(
                "INSERT INTO checkpointd_blob_counts AS c (thread_id, key, refs, open_since)"
                f" SELECT $1, k.key, 0, $3 FROM {_key_table(4, 5)} AS k"
                " ON CONFLICT (thread_id, key) DO UPDATE"
                " SET refs = c.refs + coalesce($2 - c.open_since, 0), open_since = $3",
                _b(thread_id),
                old,
                new,
                *_key_args(keys),
            )

    async def subtract_counts(
        self, thread_id: str, counts: Mapping[bytes, int], cutoff: int
    ) -> None:
        if not counts:
            return
        keys = sorted(counts)
        await self.conn.execute(
            "UPDATE checkpointd_blob_counts AS c SET"
            " refs = c.refs - d.n + CASE WHEN c.open_since < $4 THEN $4 - c.open_since ELSE 0 END,"
            " open_since = CASE WHEN c.open_since < $4 THEN $4 ELSE c.open_since END"
            " FROM unnest($2::bytea[], $3::bigint[]) AS d(key, n)"
            " WHERE c.thread_id = $1 AND c.key = d.key",
            _b(thread_id),
            keys,
            [counts[key] for key in keys],
            cutoff,
        )

    async def forget_zero_counts(self, thread_id: str, keys: KeySet) -> None:
        if keys:
            await self.conn.execute(
                "DELETE FROM checkpointd_blob_counts AS c"
                f" USING {_key_table(2, 3)} AS k WHERE c.thread_id = $1 AND c.key = k.key"
                " AND c.open_since IS NULL AND c.refs <= 0",
                _b(thread_id),
                *_key_args(keys),
            )

    async def mark_spent(self, checkpoint_ids: Sequence[str]) -> None:
        if checkpoint_ids:
            await self.conn.execute(
                "INSERT INTO checkpointd_spent_checkpoints (id)"
                " SELECT unnest($1::bytea[]) ON CONFLICT DO NOTHING",
                [_b(i) for i in checkpoint_ids],
            )

    async def index_packed_blobs(self, rows: Sequence[Any]) -> None:
        """Record where each (checked) row's blob is; the newest row of a key
        wins (a racing append's upsert waits for ours; see ``base.PackIndex``)."""
        if isinstance(rows, PackedRows):  # several packs: one key order for the locks
            rows = sorted(rows, key=lambda row: row.key)
        ids = await _pack_ids(self.conn, rows)
        await self.conn.execute(
            "INSERT INTO checkpointd_packed_blobs"
            " (digest, pack, frame_offset, frame_length, raw_size, codec)"
            " SELECT * FROM unnest($1::bytea[], $2::bigint[], $3::integer[], $4::integer[],"
            " $5::integer[], $6::smallint[]) ON CONFLICT (digest) DO UPDATE SET"
            " pack = excluded.pack, frame_offset = excluded.frame_offset,"
            " frame_length = excluded.frame_length, raw_size = excluded.raw_size,"
            " codec = excluded.codec",
            *_packed_columns(rows, ids),
        )

    async def lease_for_acquire(self, thread_id: str) -> tuple[LeaseRecord | None, int]:
        # Creates the thread's row or locks it, in one round trip.
        row = await self.conn.fetchrow(
            "INSERT INTO checkpointd_threads (thread_id) VALUES ($1)"
            " ON CONFLICT (thread_id) DO UPDATE SET thread_id = excluded.thread_id"
            " RETURNING last_fence, lease_owner, lease_fence, lease_expires_at, lease_holder",
            _b(thread_id),
        )
        assert row is not None
        return _lease(row), row["last_fence"]

    async def write_lease(self, thread_id: str, record: LeaseRecord) -> None:
        await self.conn.execute(
            "UPDATE checkpointd_threads SET last_fence = $2, lease_owner = $3,"
            " lease_fence = $2, lease_expires_at = $4, lease_holder = $5"
            " WHERE thread_id = $1",
            _b(thread_id),
            record.fence,
            record.owner_token,
            record.expires_at,
            record.holder,
        )

    async def set_lease_expiry(self, thread_id: str, expires_at: int) -> None:
        await self.conn.execute(
            "UPDATE checkpointd_threads SET lease_expires_at = $2 WHERE thread_id = $1",
            _b(thread_id),
            expires_at,
        )

    async def remove_lease(self, thread_id: str, token: str, fence: int) -> None:
        await self.conn.execute(
            "UPDATE checkpointd_threads SET lease_owner = NULL, lease_fence = NULL,"
            " lease_expires_at = NULL, lease_holder = NULL"
            " WHERE thread_id = $1 AND lease_owner = $2 AND lease_fence = $3",
            _b(thread_id),
            token,
            fence,
        )

    async def drop_pins(self, thread_id: str, token: str, fence: int) -> None:
        await self.conn.execute(
            "WITH gone AS (DELETE FROM checkpointd_leases"
            " WHERE thread_id = $1 AND owner_token = $2 AND fence = $3 RETURNING id)"
            " DELETE FROM checkpointd_lease_pins WHERE lease_id IN (SELECT id FROM gone)",
            _b(thread_id),
            token,
            fence,
        )

    async def pin(
        self, thread_id: str, token: str, fence: int, keys: Sequence[bytes]
    ) -> set[bytes]:
        # The lease's id, made by its first pin (under the thread's row lock:
        # no other pin of the thread runs meanwhile).
        lease = (_b(thread_id), token, fence)
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
        marks = await _lock_marks(self.conn, keys, "SHARE")
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


async def _fetch_chains(
    conn: asyncpg.Connection, checkpoint_ids: Sequence[str], rows: Rows
) -> None:
    """Add to ``rows`` each checkpoint and its bases down to a keyframe."""
    if not checkpoint_ids:
        return
    for r in await conn.fetch(
        "WITH RECURSIVE chain (id, base_id, document) AS ("
        " SELECT id, base_id, document FROM checkpointd_checkpoints"
        " WHERE id = ANY($1::bytea[])"
        " UNION ALL"
        " SELECT c.id, c.base_id, c.document FROM checkpointd_checkpoints AS c"
        " JOIN chain ON c.id = chain.base_id"
        ") SELECT id, base_id, document FROM chain",
        [_b(i) for i in checkpoint_ids],
    ):
        rows[str(_s(r["id"]))] = (_s(r["base_id"]), r["document"])


async def _open_head_runs(conn: asyncpg.Connection) -> None:
    """Schema 3 -> 4: open a run at each head's ordinal (0) for each of its keys;
    ``refs`` stays, so every stored count reads as before (see ``_core``)."""
    heads = {
        str(_s(r["thread_id"])): str(_s(r["head_id"]))
        for r in await conn.fetch(
            "SELECT thread_id, head_id FROM checkpointd_threads WHERE head_id IS NOT NULL"
        )
    }
    rows: Rows = {}
    await _fetch_chains(conn, builtins.list(heads.values()), rows)
    key_sets = await asyncio.to_thread(paused, head_key_sets, heads, rows)
    for thread_id, keys in key_sets.items():
        await conn.execute(
            "INSERT INTO checkpointd_blob_counts AS c (thread_id, key, refs, open_since)"
            f" SELECT $1, k.key, 0, 0 FROM {_key_table(2, 3)} AS k"
            " ON CONFLICT (thread_id, key) DO UPDATE SET open_since = 0",
            _b(thread_id),
            *_key_args(keys),
        )


async def _lock_marks(
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


# Schema steps that need Python after their SQL (keyed by the version they make).
_PYTHON_STEPS: dict[int, Callable[[asyncpg.Connection], Awaitable[None]]] = {4: _open_head_runs}


class PostgresCheckpointStore(_PostgresBase, SqlCheckpointStore):
    """The docs/contract.md#checkpoint-store checkpoint store on PostgreSQL (asyncpg), also a BlobGuard.

    Open it with ``await open_postgres_store(url, …)`` (or ``open_store``); options
    as docs/contract.md#checkpoint-store. ``now=None`` means the database server's clock. The writes of the contract
    docs/contract.md#checkpoint-store are ``_core.SqlCheckpointStore``'s, over ``_PostgresTx``.
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

    async def _now(self, conn: asyncpg.Connection) -> int:
        """The one clock of this store (call it after taking the row lock)."""
        if self._injected_clock:
            return read_clock(self._options)
        value: int = await conn.fetchval(f"SELECT {_DB_NOW}")
        return value

    async def _write(self, operation: str, body: Callable[[Any], Awaitable[T]]) -> T:
        self._check_open()

        async def run(conn: asyncpg.Connection) -> T:
            return await body(_PostgresTx(conn, self))

        return await self._transaction(operation, run)

    def _is_closed(self) -> bool:
        return self._closed

    # ------------------------------------------------------------------ reads

    async def _row_version(self, checkpoint_id: str) -> int | None:
        check_id(checkpoint_id, "checkpoint id")

        async def body(conn: asyncpg.Connection) -> int | None:
            version: int | None = await conn.fetchval(
                "SELECT xmin::text::bigint FROM checkpointd_checkpoints WHERE id = $1",
                _b(checkpoint_id),
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
                _b(checkpoint_id),
            )
            rows: Rows = {str(_s(r["id"])): (_s(r["base_id"]), r["document"]) for r in found}
            versions = {str(_s(r["id"])): r["version"] for r in found}
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
                str(_s(r["id"])): (_s(r["base_id"]), r["document"])
                for r in await conn.fetch(
                    "SELECT id, base_id, document FROM checkpointd_checkpoints"
                    " WHERE thread_id = $1",
                    _b(thread_id),
                )
            }

        rows = await self._transaction("list", body, read_only=True)

        return await checkpoints_of(rows)

    async def get_head(self, thread_id: str) -> str | None:
        check_id(thread_id, "thread id")

        async def body(conn: asyncpg.Connection) -> bytes | None:
            head: bytes | None = await conn.fetchval(
                "SELECT head_id FROM checkpointd_threads WHERE thread_id = $1", _b(thread_id)
            )
            return head

        return _s(await self._transaction("get_head", body, read_only=True))

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
                b"" if after is None else _b(after),
                limit,
            )
            return rows

        rows = await self._transaction("list_threads", body, read_only=True)
        return [
            ThreadSummary(
                str(_s(r["thread_id"])),
                _s(r["head_id"]),
                int(r["n"]),
                _number(r["newest"]),
            )
            for r in rows
        ]

    async def spent_checkpoint_ids(self, checkpoint_ids: builtins.list[str]) -> builtins.list[str]:
        """Which of these ids belonged to deleted request_id checkpoints (``_core``)."""
        wanted = [i for i in dict.fromkeys(checkpoint_ids) if isinstance(i, str)]

        async def body(conn: asyncpg.Connection) -> set[str]:
            return {
                str(_s(r["id"]))
                for r in await conn.fetch(
                    "SELECT id FROM checkpointd_spent_checkpoints WHERE id = ANY($1::bytea[])",
                    [_b(i) for i in wanted],
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
            rows.setdefault(bytes(r["thread_id"]), {})[str(_s(r["id"]))] = (
                _s(r["base_id"]),
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
        rows: Rows = {str(_s(r["id"])): (_s(r["base_id"]), r["document"]) for r in records}
        threads = {str(_s(r["id"])): str(_s(r["thread_id"])) for r in records}
        return await damaged_of(rows, threads)

    async def repair_blob_references(self) -> builtins.list[BlobCount]:
        """Set every thread's count rows to what its manifests say, in one
        transaction holding every thread row (writers wait); returns the keys
        whose total was wrong. Runs are rebuilt too (one per head key, at the
        thread's ordinal), so each row's ``refs`` is then its count."""

        async def body(conn: asyncpg.Connection) -> builtins.list[BlobCount]:
            # Lock order as everywhere: thread rows first (here all, in key order).
            threads = {
                bytes(r["thread_id"]): (_s(r["head_id"]), r["head_ordinal"])
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

    # ------------------------------------------------------------------ pack index

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
            if rest:
                for r in await conn.fetch(
                    "SELECT DISTINCT key FROM checkpointd_blob_counts WHERE key = ANY($1::bytea[])"
                    " AND (refs > 0 OR open_since IS NOT NULL)",
                    rest,
                ):
                    found[key_from_bytes(bytes(r["key"]))] = None
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
            marks = await _lock_marks(conn, binary, "UPDATE")
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
                blocked.update(
                    bytes(r["key"])
                    for r in await conn.fetch(
                        # An open run means a head uses the key, whatever refs says.
                        "SELECT DISTINCT key FROM checkpointd_blob_counts"
                        " WHERE key = ANY($1::bytea[]) AND (refs > 0 OR open_since IS NOT NULL)",
                        binary,
                    )
                )
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
            await self._forget_unmarked(conn, binary)
            condemned = {key_from_bytes(key) for key in chosen}
            return [key for key in candidates if key in condemned]

        return await self._transaction("condemn_blobs", body)

    @staticmethod
    async def _forget_unmarked(conn: asyncpg.Connection, keys: Sequence[bytes]) -> None:
        """Drop mark rows that hold no condemnation (the caller has them locked)."""
        await conn.execute(
            "DELETE FROM checkpointd_blob_marks"
            " WHERE key = ANY($1::bytea[]) AND condemned_until IS NULL",
            list(keys),
        )

    # ------------------------------------------------------------ pack maintenance

    async def drop_packed_blobs(self, rows: builtins.list[PackedBlob]) -> builtins.list[str]:
        """See ``base.PackMaintenance``: one transaction; the keys' mark rows
        are locked first, so a pin in flight finishes before we judge."""
        self._check_open()
        checked = check_packed_blobs(rows, None)
        if not checked:
            return []

        async def body(conn: asyncpg.Connection) -> builtins.list[str]:
            binary = sorted({key_to_bytes(row.key) for row in checked})
            marks = await _lock_marks(conn, binary, "UPDATE")
            now = await self._now(conn)
            # A row serves the digest's artifact key too (_packindex.row_key).
            twins = {key_to_bytes(row.key): key_to_bytes(artifact_twin(row.key)) for row in checked}
            used = {
                bytes(r["key"])
                for r in await conn.fetch(
                    "SELECT DISTINCT key FROM checkpointd_blob_counts"
                    " WHERE key = ANY($1::bytea[]) AND (refs > 0 OR open_since IS NOT NULL)",
                    [*binary, *twins.values()],
                )
            }
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
            await self._forget_unmarked(conn, binary)
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
            ids = await _pack_ids(conn, live)
            moved = {
                bytes(r["digest"])
                for r in await conn.fetch(
                    "UPDATE checkpointd_packed_blobs b SET pack = d.pack, frame_offset = d.off,"
                    " frame_length = d.len, raw_size = d.raw, codec = d.codec"
                    " FROM unnest($1::bytea[], $2::bigint[], $3::integer[], $4::integer[],"
                    " $5::integer[], $6::smallint[]) AS d(digest, pack, off, len, raw, codec)"
                    " WHERE b.digest = d.digest AND b.pack ="
                    " (SELECT id FROM checkpointd_packs WHERE digest = $7) RETURNING b.digest",
                    *_packed_columns(live, ids),
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
            used = {
                bytes(r["key"])
                for r in await conn.fetch(
                    "SELECT DISTINCT key FROM checkpointd_blob_counts"
                    " WHERE key = ANY($1::bytea[]) AND (refs > 0 OR open_since IS NOT NULL)",
                    [raw for pair in forms.values() for raw in pair],
                )
            }
            live = [row for row in checked if unreferenced or not used.isdisjoint(forms[row.key])]
            if not live:
                return []
            ids = await _pack_ids(conn, live)
            added = {
                bytes(r["digest"])
                for r in await conn.fetch(
                    "INSERT INTO checkpointd_packed_blobs"
                    " (digest, pack, frame_offset, frame_length, raw_size, codec)"
                    " SELECT * FROM unnest($1::bytea[], $2::bigint[], $3::integer[],"
                    " $4::integer[], $5::integer[], $6::smallint[])"
                    " ON CONFLICT DO NOTHING RETURNING digest",
                    *_packed_columns(live, ids),
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


# ------------------------------------------------------------------ pack maintenance
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


async def _pack_ids(conn: asyncpg.Connection, rows: Sequence[PackedBlob]) -> dict[bytes, int]:
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


def _packed_columns(
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


async def _live_packs(
    conn: asyncpg.Connection, rows: builtins.list[PackedBlob], now: int
) -> builtins.list[PackedBlob]:
    """``rows`` less those naming a pack retired right now."""
    retired = await _retired_packs(
        conn, builtins.list(dict.fromkeys(pack_digest(row.pack) for row in rows)), now
    )
    return [row for row in rows if pack_digest(row.pack) not in retired]


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


class PostgresInstanceStore(_PostgresBase):
    """The docs/contract.md#checkpoint-store instance store on PostgreSQL; open with ``open_postgres_instance_store``."""

    async def get(self, key: str) -> InstanceRecord | None:
        """The record or None; an invalid key is INVALID_ID; STORE_UNAVAILABLE on failure."""
        check_id(key, "instance key")

        async def body(conn: asyncpg.Connection) -> bytes | None:
            document: bytes | None = await conn.fetchval(
                "SELECT document FROM checkpointd_instances WHERE key = $1", _b(key)
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
                _b(checked.key),
                document,
            )

        await self._transaction("upsert", body)

    async def delete(self, key: str) -> None:
        """Forget the key; a missing key is not an error."""
        check_id(key, "instance key")

        async def body(conn: asyncpg.Connection) -> None:
            await conn.execute("DELETE FROM checkpointd_instances WHERE key = $1", _b(key))

        await self._transaction("delete", body)


# ---------------------------------------------------------------------------- opening


async def _open_pool(url: str, pool_max_size: int) -> tuple[asyncpg.Pool, str]:
    store_name = describe_url(url)
    if not isinstance(pool_max_size, int) or pool_max_size < 1:
        raise SandboxCheckpointInvalidArgumentError(
            f"pool_max_size must be an integer >= 1, got {pool_max_size!r}"
        )
    pool = await _create_pool(url, store_name, pool_max_size)
    try:
        async with pool.acquire() as conn:
            await _migrate(conn, store_name)
    except SandboxCheckpointError:
        pool.terminate()
        raise
    except (asyncpg.PostgresError, *_CONNECTION_ERRORS) as error:
        pool.terminate()
        raise _unavailable(store_name, "schema migration", error) from error
    return pool, store_name


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
    pool, store_name = await _open_pool(url, pool_max_size)
    return PostgresCheckpointStore(pool, store_name, options, injected_clock=now is not None)


async def open_postgres_instance_store(
    url: str, *, pool_max_size: int = DEFAULT_POOL_MAX_SIZE
) -> PostgresInstanceStore:
    """Connect, create or migrate the schema, and return the instance store.

    Raises as ``open_postgres_store``.
    """
    pool, store_name = await _open_pool(url, pool_max_size)
    return PostgresInstanceStore(pool, store_name)


__all__ = [
    "SCHEMA_VERSION",
    "PostgresCheckpointStore",
    "PostgresInstanceStore",
    "describe_url",
    "open_postgres_instance_store",
    "open_postgres_store",
]
