"""The PostgreSQL stores' database: the schema and its migrations, the pool and
the transaction runner that maps database failures (see ``postgres``)."""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Awaitable, Callable, Sequence
from decimal import Decimal
from typing import TypeVar
from urllib.parse import unquote, urlsplit

import asyncpg

from ..errors import (
    STORE_UNAVAILABLE,
    SandboxCheckpointError,
    SandboxCheckpointInvalidArgumentError,
)
from ._core import (
    KeySet,
    Rows,
    head_key_sets,
    paused,
)
from ._options import (
    LeaseRecord,
    StoreOptions,
    read_clock,
)
from .base import ClosingStore

T = TypeVar("T")

DEFAULT_POOL_MAX_SIZE = 5
CONNECT_TIMEOUT_S = 10.0
# A deadlock or serialization failure rolls the whole transaction back, so
# running it again is safe; a few attempts are plenty (they are rare by design).
_RETRY_ATTEMPTS = 4

DB_NOW = "(extract(epoch from clock_timestamp()) * 1000)::bigint"

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


CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.InternalClientError,
)
_RETRYABLE = (asyncpg.exceptions.DeadlockDetectedError, asyncpg.SerializationError)


def unavailable(store_name: str, operation: str, error: BaseException) -> SandboxCheckpointError:
    if isinstance(error, CONNECTION_ERRORS):
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
    except (asyncpg.PostgresError, *CONNECTION_ERRORS) as error:
        raise SandboxCheckpointError(
            f"{store_name}: cannot connect: {type(error).__name__}: {error}",
            code=STORE_UNAVAILABLE,
            details={"store": store_name},
        ) from error


def id_bytes(text: str) -> bytes:
    return text.encode("utf-8")


def id_text(data: bytes | None) -> str | None:
    return None if data is None else bytes(data).decode("utf-8")


def numeric_created_at(value: int | float) -> Decimal:
    # numeric keeps ints of any size and floats exactly, so the column orders like
    # the Python values it came from.
    return Decimal(value)


def from_numeric(value: Decimal) -> int | float:
    """A numeric created_at back as the int (or float) it was stored from."""
    return int(value) if value == value.to_integral_value() else float(value)


def lease_of(row: asyncpg.Record | None) -> LeaseRecord | None:
    if row is None or row["lease_owner"] is None:
        return None
    return LeaseRecord(
        row["lease_owner"], row["lease_fence"], row["lease_expires_at"], row["lease_holder"]
    )


# ---------------------------------------------------------------------------- base


class PostgresBase(ClosingStore):
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
                    raise unavailable(self.store_name, operation, error) from error
                await asyncio.sleep(0.005 * attempt)
            except (asyncpg.PostgresError, *CONNECTION_ERRORS) as error:
                safe = read_only or not began
                if connection_retries > 0 and safe and isinstance(error, CONNECTION_ERRORS):
                    connection_retries -= 1
                    continue
                raise unavailable(self.store_name, operation, error) from error

    async def aclose(self) -> None:
        """Close the pool (waits briefly for operations in flight); never raises."""
        if self._closed:
            return
        self._closed = True
        try:
            await asyncio.wait_for(self._pool.close(), timeout=10)
        except Exception:  # noqa: BLE001 - closing must not fail; drop the sockets instead
            self._pool.terminate()


class PostgresClocked(PostgresBase):
    """A checkpoint store's pool with its options and its one clock."""

    _options: StoreOptions
    _injected_clock: bool

    async def _now(self, conn: asyncpg.Connection) -> int:
        """The one clock of this store (call it after taking the row lock)."""
        if self._injected_clock:
            return read_clock(self._options)
        value: int = await conn.fetchval(f"SELECT {DB_NOW}")
        return value


# ---------------------------------------------------------------------------- checkpoints


# A ``_core.KeySet`` as a table ``(key)`` from two parameters: the file digests
# concatenated (32 bytes each; the kind byte ``f`` is added here) and the artifact
# keys (bytea[]). One statement per key set, whatever its size.
def key_table(digests: int, artifacts: int) -> str:
    return (
        f"(SELECT decode('66', 'hex') || substring(${digests}::bytea from g * 32 + 1 for 32)"
        f" AS key FROM generate_series(0, length(${digests}::bytea) / 32 - 1) AS g"
        f" UNION ALL SELECT unnest(${artifacts}::bytea[]))"
    )


def key_args(keys: KeySet) -> tuple[bytes, builtins.list[bytes]]:
    return keys.digests, builtins.list(keys.artifacts)


async def fetch_chains(conn: asyncpg.Connection, checkpoint_ids: Sequence[str], rows: Rows) -> None:
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
        [id_bytes(i) for i in checkpoint_ids],
    ):
        rows[str(id_text(r["id"]))] = (id_text(r["base_id"]), r["document"])


async def _open_head_runs(conn: asyncpg.Connection) -> None:
    """Schema 3 -> 4: open a run at each head's ordinal (0) for each of its keys;
    ``refs`` stays, so every stored count reads as before (see ``_core``)."""
    heads = {
        str(id_text(r["thread_id"])): str(id_text(r["head_id"]))
        for r in await conn.fetch(
            "SELECT thread_id, head_id FROM checkpointd_threads WHERE head_id IS NOT NULL"
        )
    }
    rows: Rows = {}
    await fetch_chains(conn, builtins.list(heads.values()), rows)
    key_sets = await asyncio.to_thread(paused, head_key_sets, heads, rows)
    for thread_id, keys in key_sets.items():
        await conn.execute(
            "INSERT INTO checkpointd_blob_counts AS c (thread_id, key, refs, open_since)"
            f" SELECT $1, k.key, 0, 0 FROM {key_table(2, 3)} AS k"
            " ON CONFLICT (thread_id, key) DO UPDATE SET open_since = 0",
            id_bytes(thread_id),
            *key_args(keys),
        )


# Schema steps that need Python after their SQL (keyed by the version they make).
_PYTHON_STEPS: dict[int, Callable[[asyncpg.Connection], Awaitable[None]]] = {4: _open_head_runs}


async def open_pool(url: str, pool_max_size: int) -> tuple[asyncpg.Pool, str]:
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
    except (asyncpg.PostgresError, *CONNECTION_ERRORS) as error:
        pool.terminate()
        raise unavailable(store_name, "schema migration", error) from error
    return pool, store_name
