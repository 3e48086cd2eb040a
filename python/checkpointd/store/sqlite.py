"""SQLite checkpoint and instance stores (aiosqlite, WAL), the embedded default.

Layout (schema version 1, created on open, idempotent):

* ``checkpoints`` — one row per checkpoint: the columns that queries need (id,
  thread, parent, created_at) plus the whole checkpoint as ONE compact document,
  never a row per file. The document is the ``checkpointd.codec`` JSON,
  zlib-compressed: either whole (a *keyframe*) or as a *delta* against the parent
  (copy runs of the parent's entries and messages, plus the new ones), chosen and
  encoded by ``_documents`` exactly as the PostgreSQL store does. Ten
  consecutive 100k-entry checkpoints that share 99% of their entries take one
  ~5 MB keyframe and nine ~65 kB deltas instead of ten keyframes. A delta chain is
  at most ``MAX_DEPTH`` long; deleting a checkpoint first rewrites the checkpoints
  based on it as keyframes, so every base a delta names exists.
* ``heads``, ``writer_leases``, ``writer_fences`` (the per-thread fence counter,
  kept apart from the lease so it survives release).
* ``blob_references`` — one row per distinct key with its count. Keys are stored as
  33 bytes (kind + raw hash, see ``_options.key_to_bytes``), which sort like the
  UTF-8 text keys.
* ``blob_pins``, ``blob_condemned`` — the BlobGuard records of a safe sweep.
* ``instances`` — the instance store's records.

Concurrency: every check-then-write runs inside ``BEGIN IMMEDIATE`` … ``COMMIT``,
so the checks and the write see one state and other connections (in this process
or another) wait for the write lock. A store object owns one connection and an
``asyncio.Lock``: statements of two coroutines must not interleave inside one
transaction. ``busy_timeout`` makes SQLite wait for a lock held elsewhere; when it
still reports "database is locked" or "busy", the whole transaction is retried
with backoff until ``RETRY_DEADLINE_S``, after which the caller gets
SandboxCheckpointError with code ``SANDBOX_SNAPSHOT_STORE_UNAVAILABLE`` — a raw
``sqlite3.OperationalError`` never escapes.

Durability: WAL with ``synchronous=FULL`` (SQLite's default): a committed append
survives a power cut, which is what a checkpoint is for.
"""

from __future__ import annotations

import asyncio
import builtins
import gc
import os
import random
import sqlite3
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from types import TracebackType
from typing import Any, TypeVar

import aiosqlite

from ..errors import (
    STORE_UNAVAILABLE,
    SandboxCheckpointConflictError,
    SandboxCheckpointDuplicateIdError,
    SandboxCheckpointError,
    SandboxCheckpointInvalidArgumentError,
    SandboxCheckpointNotHeadError,
    SandboxCheckpointParentMismatchError,
)
from ..model import BlobReference, Checkpoint, WriterLease, WriterLike
from ..validation import check_checkpoint_body, check_checkpoint_ids, check_id
from . import _documents as documents
from ._options import (
    LeaseRecord,
    StoreOptions,
    audit_keys,
    blob_counts,
    check_fork_arguments,
    check_fork_source,
    check_hold_ms,
    check_instance_record,
    check_keep,
    check_pin_keys,
    check_thread_page,
    check_writer,
    condemnable_keys,
    destination_not_empty,
    key_from_bytes,
    key_to_bytes,
    lease_holder,
    lease_is_current,
    list_order,
    may_take_over,
    new_owner_token,
    plan_prune,
    read_clock,
    renew_lost,
    validate_store_options,
    writer_conflict,
    writer_fields,
)
from .base import (
    DEFAULT_LEASE_DURATION_MS,
    DEFAULT_RENEW_AFTER_MS,
    DEFAULT_THREAD_PAGE,
    BlobCount,
    Clock,
    InstanceRecord,
    ThreadSummary,
)

T = TypeVar("T")

SCHEMA_VERSION = 1
BUSY_TIMEOUT_MS = 5_000
# How long a transaction keeps retrying "database is locked" before giving up. Long
# enough for another process's largest append (a 100k-entry manifest commits in
# well under a second), short enough that a wedged peer becomes a clear error.
RETRY_DEADLINE_S = 60.0
# Documents of more entries than this are encoded/decoded in a worker thread.
OFFLOAD_ENTRIES = 2_000
# SQLite binds at most 32766 variables per statement; stay far below.
IN_BATCH = 500
# Contents of recently appended or read checkpoints kept per store object, so the
# next append of a thread makes its delta without reading its parent back. A
# 100k-entry content is ~30 MB of Python lists: keep few.
RECENT_CONTENTS = 2

_SCHEMA = [
    """CREATE TABLE IF NOT EXISTS checkpointd_meta (
        name TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID""",
    # created_at has no declared type (BLOB affinity) so ints and floats are kept
    # as given; SQLite orders them numerically. ids sort with BINARY collation,
    # i.e. by their UTF-8 bytes.
    #
    # serial is AUTOINCREMENT so it is never reused: (id, serial) names one row
    # even when a deleted id is appended again (the content cache relies on it).
    # base_id/depth: see ``_documents`` — NULL/0 for a keyframe, else the delta's
    # base (its parent, in the same thread) and the number of deltas to a keyframe.
    """CREATE TABLE IF NOT EXISTS checkpoints (
        serial INTEGER PRIMARY KEY AUTOINCREMENT,
        id TEXT NOT NULL UNIQUE,
        thread_id TEXT NOT NULL,
        parent_id TEXT,
        created_at NOT NULL,
        base_id TEXT,
        depth INTEGER NOT NULL,
        document BLOB NOT NULL)""",
    """CREATE INDEX IF NOT EXISTS checkpoints_by_thread
        ON checkpoints (thread_id, created_at, id)""",
    """CREATE INDEX IF NOT EXISTS checkpoints_by_base
        ON checkpoints (base_id) WHERE base_id IS NOT NULL""",
    """CREATE TABLE IF NOT EXISTS heads (
        thread_id TEXT PRIMARY KEY, head_id TEXT NOT NULL) WITHOUT ROWID""",
    # holder: ``_options.lease_holder`` of the acquiring owner (NULL: no owner).
    """CREATE TABLE IF NOT EXISTS writer_leases (
        thread_id TEXT PRIMARY KEY,
        owner_token TEXT NOT NULL,
        fence INTEGER NOT NULL,
        expires_at INTEGER NOT NULL,
        holder TEXT) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS writer_fences (
        thread_id TEXT PRIMARY KEY, fence INTEGER NOT NULL) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS blob_references (
        key BLOB PRIMARY KEY, refs INTEGER NOT NULL) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS blob_pins (
        key BLOB NOT NULL,
        thread_id TEXT NOT NULL,
        owner_token TEXT NOT NULL,
        fence INTEGER NOT NULL,
        PRIMARY KEY (key, thread_id, owner_token, fence)) WITHOUT ROWID""",
    """CREATE INDEX IF NOT EXISTS blob_pins_by_lease
        ON blob_pins (thread_id, owner_token, fence)""",
    """CREATE TABLE IF NOT EXISTS blob_condemned (
        key BLOB PRIMARY KEY, until INTEGER NOT NULL) WITHOUT ROWID""",
    # Keys ``checkpointd check`` found referenced but gone from the bucket.
    """CREATE TABLE IF NOT EXISTS blob_missing (
        key BLOB PRIMARY KEY, marked_at INTEGER NOT NULL) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS instances (
        key TEXT PRIMARY KEY,
        provider TEXT NOT NULL,
        provider_sandbox_id TEXT NOT NULL,
        thread_id TEXT NOT NULL,
        updated_at NOT NULL,
        latest_snapshot_id TEXT,
        latest_run_id TEXT) WITHOUT ROWID""",
]


_ADDED_COLUMNS = (("writer_leases", "holder", "TEXT"),)


def _is_busy(error: BaseException) -> bool:
    if not isinstance(error, sqlite3.OperationalError):
        return False
    text = str(error).lower()
    return "locked" in text or "busy" in text


def _sql_number(value: int | float) -> int | float:
    """SQLite integers are 64-bit; a larger int is kept (for ordering) as a float."""
    if isinstance(value, int) and not -(2**63) <= value < 2**63:
        return float(value)
    return value


def _unavailable(path: str, error: BaseException) -> SandboxCheckpointError:
    return SandboxCheckpointError(
        f"SQLite store {path} is unavailable: {error}",
        code=STORE_UNAVAILABLE,
        details={"store": f"sqlite://{path}"},
    )


Transaction = Callable[[aiosqlite.Connection], Awaitable[T]]


class SqliteDatabase:
    """One aiosqlite connection to one database file, with the transaction helpers
    both SQLite stores use. Open with ``await SqliteDatabase.open(path)``."""

    def __init__(self, path: str, connection: aiosqlite.Connection) -> None:
        self.path = path
        self._connection: aiosqlite.Connection | None = connection
        self._lock = asyncio.Lock()

    @classmethod
    async def open(cls, path: str) -> SqliteDatabase:
        """Open (create when missing) the file and its schema.

        Raises SandboxCheckpointInvalidArgumentError for a path that is not absolute
        or a file written by a newer schema, and SandboxCheckpointError
        (STORE_UNAVAILABLE) when the file cannot be opened.
        """
        if not isinstance(path, str | os.PathLike) or not os.path.isabs(os.fspath(path)):
            raise SandboxCheckpointInvalidArgumentError(
                f"the SQLite store needs an absolute file path, got {path!r}"
            )
        path = os.fspath(path)
        # A missing directory is reported before aiosqlite starts its thread.
        if not await asyncio.to_thread(os.path.isdir, os.path.dirname(path)):
            raise _unavailable(path, FileNotFoundError(f"no directory {os.path.dirname(path)}"))
        pending = aiosqlite.connect(path, isolation_level=None)
        try:
            connection = await pending
        except sqlite3.Error as error:
            # aiosqlite stops its worker thread after a failed connect and reports
            # that to this loop; wait for it so the report never hits a closed loop.
            thread = getattr(pending, "_thread", None)
            for _ in range(200):
                if thread is None or not thread.is_alive():
                    break
                await asyncio.sleep(0.005)
            raise _unavailable(path, error) from error
        database = cls(path, connection)
        try:
            await database._configure()
        except BaseException:
            await database.close()
            raise
        return database

    async def _configure(self) -> None:
        connection = self._require()
        await connection.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")

        async def set_wal() -> None:
            cursor = await connection.execute("PRAGMA journal_mode = WAL")
            row = await cursor.fetchone()
            if row is None or str(row[0]).lower() != "wal":
                raise SandboxCheckpointError(
                    f"SQLite store {self.path}: WAL journal mode is not available ({row})",
                    code=STORE_UNAVAILABLE,
                )

        await self._retrying(set_wal)
        await connection.execute("PRAGMA synchronous = FULL")

        async def create(conn: aiosqlite.Connection) -> None:
            for statement in _SCHEMA:
                await conn.execute(statement)
            # Columns added to version 1 after its release (nullable, so older
            # checkpointd keeps working on the same file).
            for table, column, declaration in _ADDED_COLUMNS:
                columns = await _fetchall(conn, f"PRAGMA table_info({table})")
                if column not in {row[1] for row in columns}:
                    await conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
            cursor = await conn.execute(
                "SELECT value FROM checkpointd_meta WHERE name = 'schema_version'"
            )
            row = await cursor.fetchone()
            if row is None:
                await conn.execute(
                    "INSERT INTO checkpointd_meta (name, value) VALUES ('schema_version', ?)",
                    (str(SCHEMA_VERSION),),
                )
            elif int(row[0]) > SCHEMA_VERSION:
                raise SandboxCheckpointInvalidArgumentError(
                    f"{self.path} has schema version {row[0]}, newer than this "
                    f"checkpointd's {SCHEMA_VERSION}; upgrade checkpointd"
                )

        await self.write(create)

    def _require(self) -> aiosqlite.Connection:
        if self._connection is None:
            raise SandboxCheckpointError(
                f"the SQLite store {self.path} is closed", code=STORE_UNAVAILABLE
            )
        return self._connection

    async def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            async with self._lock:
                try:
                    await connection.close()
                except sqlite3.Error:
                    pass

    @property
    def closed(self) -> bool:
        return self._connection is None

    async def _retrying(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """Run ``attempt`` again while SQLite says locked/busy, up to the deadline."""
        deadline = time.monotonic() + RETRY_DEADLINE_S
        delay = 0.005
        while True:
            try:
                return await attempt()
            except sqlite3.OperationalError as error:
                if not _is_busy(error):
                    raise _unavailable(self.path, error) from error
                if time.monotonic() >= deadline:
                    raise _unavailable(self.path, error) from error
            except sqlite3.Error as error:
                raise _unavailable(self.path, error) from error
            await asyncio.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 0.25)

    async def _rollback(self, connection: aiosqlite.Connection) -> None:
        if connection.in_transaction:
            try:
                await connection.execute("ROLLBACK")
            except sqlite3.Error:
                pass

    async def write(self, transaction: Transaction[T]) -> T:
        """Run ``transaction`` inside BEGIN IMMEDIATE … COMMIT (retried when busy).

        An exception from ``transaction`` rolls back and propagates, so a failed
        check changes nothing.
        """
        async with self._lock:
            connection = self._require()

            async def attempt() -> T:
                # A previous call cancelled mid-transaction may have left one open.
                await self._rollback(connection)
                await connection.execute("BEGIN IMMEDIATE")
                try:
                    result = await transaction(connection)
                    await connection.execute("COMMIT")
                except BaseException:
                    await self._rollback(connection)
                    raise
                return result

            return await self._retrying(attempt)

    async def read(self, transaction: Transaction[T]) -> T:
        """Run a read (one statement or a deferred transaction) under the lock."""
        async with self._lock:
            connection = self._require()

            async def attempt() -> T:
                await self._rollback(connection)
                return await transaction(connection)

            return await self._retrying(attempt)


async def _fetchone(
    connection: aiosqlite.Connection, sql: str, parameters: Sequence[Any] = ()
) -> Any:
    cursor = await connection.execute(sql, parameters)
    try:
        return await cursor.fetchone()
    finally:
        await cursor.close()


async def _fetchall(
    connection: aiosqlite.Connection, sql: str, parameters: Sequence[Any] = ()
) -> builtins.list[Any]:
    return list(await connection.execute_fetchall(sql, parameters))


def _batches(values: Sequence[T], size: int = IN_BATCH) -> Iterable[Sequence[T]]:
    for start in range(0, len(values), size):
        yield values[start : start + size]


# ------------------------------------------------------------------------ documents

_Rows = dict[str, tuple[str | None, bytes]]  # id -> (base_id, stored document)


def _keyframe_checkpoint(checkpoint_id: str, data: bytes) -> Checkpoint:
    return documents.materialize(checkpoint_id, {checkpoint_id: (None, data)}, {}).checkpoint()


class _GcPause:
    """Pauses the cyclic garbage collector while manifests are built.

    Decoding a 100k-entry manifest allocates about a million lists, tuples and
    entry objects; the collector would rescan the growing heap again and again
    (measured: ``list`` of ten such checkpoints 5.0 s with it, 1.9 s without).
    None of these objects form cycles, so reference counting frees them all the
    same. Re-entrant across threads: the collector comes back (if it was on)
    when the last pause ends.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0
        self._reenable = False

    def __enter__(self) -> None:
        with self._lock:
            if self._depth == 0:
                self._reenable = gc.isenabled()
                gc.disable()
            self._depth += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth == 0 and self._reenable:
                gc.enable()


_GC_PAUSE = _GcPause()


def _paused(function: Callable[..., T], *args: Any) -> T:
    with _GC_PAUSE:
        return function(*args)


async def _offload(size: int, function: Callable[..., T], *args: Any) -> T:
    """Run CPU-heavy document work in a worker thread (collector paused) when it is
    large, so the event loop keeps serving other calls (gRPC health, progress)."""
    if size > OFFLOAD_ENTRIES:
        return await asyncio.to_thread(_paused, function, *args)
    return function(*args)


def _size(content: documents.Content) -> int:
    return content.entry_count()


# ------------------------------------------------------------------------ the store


class SqliteCheckpointStore:
    """A checkpoint store in one SQLite file (SPEC §3).

    Open with ``await SqliteCheckpointStore.open("/abs/path.db", now=…,
    lease_duration_ms=…, renew_after_ms=…)`` or ``open_store("sqlite:///abs/path.db")``.
    Several store objects and processes may share the file.
    """

    def __init__(self, database: SqliteDatabase, options: StoreOptions) -> None:
        self._db = database
        self._options = options
        # Contents by (id, serial) of checkpoints this object appended or read.
        self._recent: OrderedDict[tuple[str, int], documents.Content] = OrderedDict()

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

    @property
    def lease_duration_ms(self) -> int:
        return self._options.lease_duration_ms

    @property
    def renew_after_ms(self) -> int:
        return self._options.renew_after_ms

    async def aclose(self) -> None:
        await self._db.close()

    async def __aenter__(self) -> SqliteCheckpointStore:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def _now(self) -> int:
        return read_clock(self._options)

    # ------------------------------------------------------------------ documents

    def _remember(self, row: tuple[str, int], content: documents.Content) -> None:
        self._recent[row] = content
        self._recent.move_to_end(row)
        while len(self._recent) > RECENT_CONTENTS:
            self._recent.popitem(last=False)

    @staticmethod
    async def _fetch_chains(
        conn: aiosqlite.Connection, checkpoint_ids: Sequence[str], rows: _Rows
    ) -> None:
        """Add to ``rows`` each checkpoint and its bases down to a keyframe."""
        for batch in _batches(builtins.list(checkpoint_ids)):
            marks = ",".join("?" * len(batch))
            for checkpoint_id, base_id, data in await _fetchall(
                conn,
                # Walk the small (id, base_id) pairs (UNION drops shared bases),
                # then read each document once.
                "WITH RECURSIVE chain (id, base_id) AS ("
                f" SELECT id, base_id FROM checkpoints WHERE id IN ({marks})"
                " UNION"
                " SELECT c.id, c.base_id FROM checkpoints AS c"
                " JOIN chain ON c.id = chain.base_id"
                ") SELECT k.id, k.base_id, k.document FROM chain"
                " JOIN checkpoints AS k ON k.id = chain.id",
                batch,
            ):
                rows[checkpoint_id] = (base_id, data)

    async def _content(
        self, conn: aiosqlite.Connection, checkpoint_id: str
    ) -> tuple[int, int, documents.Content] | None:
        """``(serial, depth, content)`` of one stored checkpoint, or None."""
        row = await _fetchone(
            conn, "SELECT serial, depth FROM checkpoints WHERE id = ?", (checkpoint_id,)
        )
        if row is None:
            return None
        serial, depth = row
        content = self._recent.get((checkpoint_id, serial))
        if content is None:
            rows: _Rows = {}
            await self._fetch_chains(conn, [checkpoint_id], rows)
            content = await asyncio.to_thread(
                _paused, documents.materialize, checkpoint_id, rows, {}
            )
            self._remember((checkpoint_id, serial), content)
        return serial, depth, content

    @staticmethod
    async def _rewrite_dependents(
        conn: aiosqlite.Connection,
        removed: set[str],
        rows: _Rows,
        memo: dict[str, documents.Content],
    ) -> None:
        """Store every remaining checkpoint whose base is in ``removed`` as a
        keyframe, so no delta names a lost base. ``rows``/``memo`` must still
        hold the removed checkpoints."""
        for batch in _batches(builtins.list(removed)):
            marks = ",".join("?" * len(batch))
            dependents = await _fetchall(
                conn,
                f"SELECT id, base_id, document FROM checkpoints WHERE base_id IN ({marks})",
                batch,
            )
            for dependent_id, base_id, data in dependents:
                rows[dependent_id] = (base_id, data)
                content = await asyncio.to_thread(
                    _paused, documents.materialize, dependent_id, rows, memo
                )
                stored = await _offload(_size(content), documents.keyframe, content)
                await conn.execute(
                    "UPDATE checkpoints SET document = ?, base_id = NULL, depth = 0 WHERE id = ?",
                    (stored.data, dependent_id),
                )

    # ------------------------------------------------------------------ reads

    async def get(self, checkpoint_id: str) -> Checkpoint | None:
        """The checkpoint or None (a missing id never raises; an invalid one is INVALID_ID)."""
        check_id(checkpoint_id, "checkpoint id")

        async def run(
            conn: aiosqlite.Connection,
        ) -> tuple[Any, documents.Content | None, _Rows]:
            row = await _fetchone(
                conn,
                "SELECT serial, base_id, document FROM checkpoints WHERE id = ?",
                (checkpoint_id,),
            )
            rows: _Rows = {}
            cached = None if row is None else self._recent.get((checkpoint_id, row[0]))
            if row is not None and cached is None and row[1] is not None:
                await self._fetch_chains(conn, [checkpoint_id], rows)
            return row, cached, rows

        row, cached, rows = await self._db.read(run)
        if row is None:
            return None
        if cached is not None:
            return await _offload(_size(cached), cached.checkpoint)
        _, base_id, data = row
        if base_id is None:
            # A keyframe decodes straight from the codec document.
            return await _offload(len(data) // 16, _keyframe_checkpoint, checkpoint_id, data)
        content = await asyncio.to_thread(_paused, documents.materialize, checkpoint_id, rows, {})
        return await _offload(_size(content), content.checkpoint)

    async def list(self, thread_id: str) -> builtins.list[Checkpoint]:
        """Every checkpoint of the thread by created_at, then UTF-8 bytes of the id."""
        check_id(thread_id, "thread id")

        async def run(conn: aiosqlite.Connection) -> _Rows:
            # A delta's base is its parent, in the same thread: one query has them all.
            return {
                checkpoint_id: (base_id, data)
                for checkpoint_id, base_id, data in await _fetchall(
                    conn,
                    "SELECT id, base_id, document FROM checkpoints WHERE thread_id = ?",
                    (thread_id,),
                )
            }

        rows = await self._db.read(run)

        def build() -> builtins.list[Checkpoint]:
            memo: dict[str, documents.Content] = {}
            return [documents.materialize(i, rows, memo).checkpoint() for i in rows]

        checkpoints = await _offload(sum(len(data) for _, data in rows.values()) // 16, build)
        checkpoints.sort(key=lambda c: list_order(c.created_at, c.id))
        return checkpoints

    async def get_head(self, thread_id: str) -> str | None:
        check_id(thread_id, "thread id")

        async def run(conn: aiosqlite.Connection) -> Any:
            return await _fetchone(
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
            return await _fetchall(
                conn,
                "SELECT c.thread_id, h.head_id, COUNT(*), MAX(c.created_at)"
                " FROM checkpoints c LEFT JOIN heads h ON h.thread_id = c.thread_id"
                " WHERE c.thread_id > ? GROUP BY c.thread_id ORDER BY c.thread_id LIMIT ?",
                ("" if after is None else after, limit),
            )

        return [ThreadSummary(t, h, n, newest) for t, h, n, newest in await self._db.read(run)]

    async def list_blob_references(self) -> builtins.list[BlobReference]:
        async def run(conn: aiosqlite.Connection) -> builtins.list[Any]:
            return await _fetchall(
                conn, "SELECT key, refs FROM blob_references WHERE refs > 0 ORDER BY key"
            )

        rows = await self._db.read(run)
        return [BlobReference(key_from_bytes(key), refs) for key, refs in rows]

    # ------------------------------------------------------------------ helpers

    @staticmethod
    async def _lease(conn: aiosqlite.Connection, thread_id: str) -> LeaseRecord | None:
        row = await _fetchone(
            conn,
            "SELECT owner_token, fence, expires_at, holder FROM writer_leases WHERE thread_id = ?",
            (thread_id,),
        )
        return None if row is None else LeaseRecord(row[0], row[1], row[2], row[3])

    async def _check_writer(
        self, conn: aiosqlite.Connection, writer: WriterLike, thread_id: str
    ) -> int:
        """WRITER_LOST unless ``writer`` holds the current lease; returns now."""
        now = self._now()
        check_writer(writer, thread_id, await self._lease(conn, thread_id), now)
        return now

    @staticmethod
    async def _head(conn: aiosqlite.Connection, thread_id: str) -> str | None:
        row = await _fetchone(conn, "SELECT head_id FROM heads WHERE thread_id = ?", (thread_id,))
        return None if row is None else row[0]

    @staticmethod
    async def _id_used(conn: aiosqlite.Connection, checkpoint_id: str) -> bool:
        row = await _fetchone(conn, "SELECT 1 FROM checkpoints WHERE id = ?", (checkpoint_id,))
        return row is not None

    @staticmethod
    async def _add_content_references(
        conn: aiosqlite.Connection, content: documents.Content
    ) -> None:
        """+1 for each distinct key of ``content``. The file keys go to SQLite as
        ONE value (the manifest's sorted digests, concatenated) that a recursive
        query splits: no Python object per key, and the upserts walk the B-tree
        in key order. (``||`` yields text: the CAST keeps the key a BLOB, the
        type every other statement binds.)"""
        digests = content.manifest.digests()
        if digests:
            await conn.execute(
                "WITH RECURSIVE at (i) AS (SELECT 0 UNION ALL SELECT i + 32 FROM at"
                " WHERE i + 32 < length(?1))"
                " INSERT INTO blob_references (key, refs)"
                " SELECT CAST(X'66' || substr(?1, i + 1, 32) AS BLOB), 1 FROM at WHERE true"
                " ON CONFLICT (key) DO UPDATE SET refs = refs + 1",
                (digests,),
            )
        await SqliteCheckpointStore._add_references(conn, content.artifact_keys())

    @staticmethod
    async def _add_references(conn: aiosqlite.Connection, keys: Iterable[bytes]) -> None:
        # In key order: the upserts then walk the B-tree left to right, ~3x faster
        # than random order for 100k keys that are mostly already counted.
        await conn.executemany(
            "INSERT INTO blob_references (key, refs) VALUES (?, 1) "
            "ON CONFLICT (key) DO UPDATE SET refs = refs + 1",
            [(key,) for key in sorted(keys)],
        )

    @staticmethod
    async def _subtract_references(conn: aiosqlite.Connection, counts: Counter[bytes]) -> None:
        """Subtract per key and forget keys that reach 0."""
        ordered = sorted(counts)  # key order, as in _add_references
        await conn.executemany(
            "UPDATE blob_references SET refs = refs - ? WHERE key = ?",
            [(counts[key], key) for key in ordered],
        )
        await conn.executemany(
            "DELETE FROM blob_references WHERE key = ? AND refs <= 0",
            [(key,) for key in ordered],
        )

    @staticmethod
    async def _publish(
        conn: aiosqlite.Connection, content: documents.Content, stored: documents.Stored
    ) -> int:
        """Insert the row, make it the head, count its keys; returns its serial."""
        document = content.document
        cursor = await conn.execute(
            "INSERT INTO checkpoints "
            "(id, thread_id, parent_id, created_at, base_id, depth, document) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                document["id"],
                document["thread_id"],
                document["parent_checkpoint_id"],
                _sql_number(document["created_at"]),
                stored.base_id,
                stored.depth,
                stored.data,
            ),
        )
        serial = cursor.lastrowid
        await cursor.close()
        await conn.execute(
            "INSERT INTO heads (thread_id, head_id) VALUES (?, ?) "
            "ON CONFLICT (thread_id) DO UPDATE SET head_id = excluded.head_id",
            (document["thread_id"], document["id"]),
        )
        await SqliteCheckpointStore._add_content_references(conn, content)
        assert serial is not None
        return serial

    # ------------------------------------------------------------------ writes

    async def append(
        self, checkpoint: Checkpoint, expected_head_id: str | None, writer: WriterLike
    ) -> str:
        """Publish ``checkpoint`` as the new head (SPEC §3 check order 1–6), in one
        transaction with the blob counts."""
        check_checkpoint_ids(checkpoint, expected_head_id)
        check_checkpoint_body(checkpoint)
        thread_id = checkpoint.thread_id
        content = await _offload(len(checkpoint.files), documents.Content.of, checkpoint)

        async def run(conn: aiosqlite.Connection) -> int:
            await self._check_writer(conn, writer, thread_id)
            if await self._id_used(conn, checkpoint.id):
                raise SandboxCheckpointDuplicateIdError(
                    f"checkpoint id {checkpoint.id!r} is already used",
                    details={"checkpoint_id": checkpoint.id},
                )
            head = await self._head(conn, thread_id)
            if head != expected_head_id:
                raise SandboxCheckpointConflictError(
                    f"the head of thread {thread_id!r} is {head!r}, not {expected_head_id!r}",
                    details={"thread_id": thread_id, "checkpoint_id": checkpoint.id},
                )
            if checkpoint.parent_checkpoint_id != expected_head_id:
                raise SandboxCheckpointParentMismatchError(
                    f"parent {checkpoint.parent_checkpoint_id!r} is not the expected head "
                    f"{expected_head_id!r}",
                    details={"thread_id": thread_id, "checkpoint_id": checkpoint.id},
                )
            # Stored as a delta against the parent when that is small.
            base = None
            if expected_head_id is not None:
                base = await self._content(conn, expected_head_id)
            if base is None:
                stored = await _offload(_size(content), documents.keyframe, content)
            else:
                _, depth, base_content = base
                stored = await _offload(
                    _size(content), documents.encode, content, expected_head_id, base_content, depth
                )
            return await self._publish(conn, content, stored)

        serial = await self._db.write(run)
        self._remember((checkpoint.id, serial), content)
        return checkpoint.id

    async def delete_head(self, thread_id: str, checkpoint_id: str, writer: WriterLike) -> None:
        """Remove the head; the head moves to its parent (None when the parent is gone)."""
        check_id(thread_id, "thread id")
        check_id(checkpoint_id, "checkpoint id")

        async def run(conn: aiosqlite.Connection) -> None:
            await self._check_writer(conn, writer, thread_id)
            if await self._head(conn, thread_id) != checkpoint_id:
                raise SandboxCheckpointNotHeadError(
                    f"{checkpoint_id!r} is not the head of thread {thread_id!r}",
                    details={"thread_id": thread_id, "checkpoint_id": checkpoint_id},
                )
            rows: _Rows = {}
            await self._fetch_chains(conn, [checkpoint_id], rows)
            memo: dict[str, documents.Content] = {}
            parent = await _fetchone(
                conn, "SELECT parent_id FROM checkpoints WHERE id = ?", (checkpoint_id,)
            )
            parent_id = None if parent is None else parent[0]
            keys: set[bytes] = set()
            if checkpoint_id in rows:
                content = await asyncio.to_thread(
                    _paused, documents.materialize, checkpoint_id, rows, memo
                )
                keys = content.blob_keys()
            await conn.execute("DELETE FROM checkpoints WHERE id = ?", (checkpoint_id,))
            await self._rewrite_dependents(conn, {checkpoint_id}, rows, memo)
            await self._subtract_references(conn, Counter(keys))
            parent_row = None
            if parent_id is not None:
                parent_row = await _fetchone(
                    conn,
                    "SELECT 1 FROM checkpoints WHERE id = ? AND thread_id = ?",
                    (parent_id, thread_id),
                )
            if parent_row is not None:
                await conn.execute(
                    "UPDATE heads SET head_id = ? WHERE thread_id = ?", (parent_id, thread_id)
                )
            else:
                await conn.execute("DELETE FROM heads WHERE thread_id = ?", (thread_id,))

        await self._db.write(run)

    async def delete_checkpoints(
        self, thread_id: str, keep: int, writer: WriterLike
    ) -> builtins.list[str]:
        """Keep the head and its ``keep - 1`` nearest ancestors; delete the rest of the
        thread in one transaction. Returns the deleted ids in list order."""
        check_id(thread_id, "thread id")
        check_keep(keep)

        async def run(conn: aiosqlite.Connection) -> builtins.list[str]:
            await self._check_writer(conn, writer, thread_id)
            listed = await _fetchall(
                conn,
                "SELECT id, parent_id, created_at, base_id, document FROM checkpoints "
                "WHERE thread_id = ?",
                (thread_id,),
            )
            head = await self._head(conn, thread_id)
            doomed = plan_prune([(r[0], r[1]) for r in listed], head, keep)
            if not doomed:
                return []
            ordered = sorted(
                ((r[2], r[0]) for r in listed if r[0] in doomed),
                key=lambda pair: list_order(pair[0], pair[1]),
            )
            rows: _Rows = {r[0]: (r[3], r[4]) for r in listed}
            memo: dict[str, documents.Content] = {}

            def count_keys() -> Counter[bytes]:
                counts: Counter[bytes] = Counter()
                for _, checkpoint_id in ordered:
                    counts.update(documents.materialize(checkpoint_id, rows, memo).blob_keys())
                return counts

            counts = await asyncio.to_thread(_paused, count_keys)
            await conn.executemany(
                "DELETE FROM checkpoints WHERE id = ?", [(i,) for _, i in ordered]
            )
            await self._rewrite_dependents(conn, doomed, rows, memo)
            await self._subtract_references(conn, counts)
            return [checkpoint_id for _, checkpoint_id in ordered]

        return await self._db.write(run)

    async def fork_from_checkpoint(
        self,
        source_thread_id: str,
        source_checkpoint_id: str,
        destination_thread_id: str,
        destination_checkpoint_id: str,
        created_at: int,
        writer: WriterLike,
    ) -> Checkpoint:
        """Copy a checkpoint into a new root of an empty thread (SPEC §3 fork checks)."""
        check_fork_arguments(
            source_thread_id,
            source_checkpoint_id,
            destination_thread_id,
            destination_checkpoint_id,
            created_at,
        )

        async def run(conn: aiosqlite.Connection) -> tuple[int, documents.Content]:
            row = await _fetchone(
                conn, "SELECT thread_id FROM checkpoints WHERE id = ?", (source_checkpoint_id,)
            )
            check_fork_source(
                None if row is None else row[0], source_thread_id, source_checkpoint_id
            )
            await self._check_writer(conn, writer, destination_thread_id)
            busy = await _fetchone(
                conn,
                "SELECT 1 FROM checkpoints WHERE thread_id = ? "
                "UNION ALL SELECT 1 FROM heads WHERE thread_id = ? LIMIT 1",
                (destination_thread_id, destination_thread_id),
            )
            if busy is not None:
                raise destination_not_empty(
                    destination_thread_id, destination_checkpoint_id, "the thread has checkpoints"
                )
            if await self._id_used(conn, destination_checkpoint_id):
                raise destination_not_empty(
                    destination_thread_id, destination_checkpoint_id, "the id is already used"
                )
            source = await self._content(conn, source_checkpoint_id)
            assert source is not None
            # The new root: the source's files, conversation and artifacts only
            # (the same fields as ``_options.fork_checkpoint``), always a keyframe.
            root = documents.Content(
                {
                    **source[2].document,
                    "id": destination_checkpoint_id,
                    "thread_id": destination_thread_id,
                    "parent_checkpoint_id": None,
                    "created_at": created_at,
                    "reason": "fork-root",
                    "label": None,
                    "source_run_id": None,
                    "forked_from_thread_id": source_thread_id,
                    "forked_from_checkpoint_id": source_checkpoint_id,
                },
                source[2].manifest,
            )
            stored = await _offload(_size(root), documents.keyframe, root)
            return await self._publish(conn, root, stored), root

        serial, root = await self._db.write(run)
        self._remember((destination_checkpoint_id, serial), root)
        return await _offload(_size(root), root.checkpoint)

    # ------------------------------------------------------------------ leases

    async def acquire_writer(self, thread_id: str, *, owner: str | None = None) -> WriterLease:
        """Take the thread's writer lease without waiting.

        A live lease raises WRITER_CONFLICT (with ``expires_at_ms`` and
        ``retry_after_ms`` in its details) unless ``owner`` acquired it: the same
        owner takes it back with a new fence, and the old writer is lost.
        """
        check_id(thread_id, "thread id")
        holder = lease_holder(owner)
        duration = self._options.lease_duration_ms

        async def run(conn: aiosqlite.Connection) -> LeaseRecord:
            now = self._now()
            record = await self._lease(conn, thread_id)
            if not may_take_over(record, holder, now):
                assert record is not None
                raise writer_conflict(thread_id, record, now)
            if record is not None:
                await self._drop_pins(conn, thread_id, record.owner_token, record.fence)
            row = await _fetchone(
                conn, "SELECT fence FROM writer_fences WHERE thread_id = ?", (thread_id,)
            )
            fence = (0 if row is None else row[0]) + 1
            await conn.execute(
                "INSERT INTO writer_fences (thread_id, fence) VALUES (?, ?) "
                "ON CONFLICT (thread_id) DO UPDATE SET fence = excluded.fence",
                (thread_id, fence),
            )
            new = LeaseRecord(new_owner_token(), fence, now + duration, holder)
            await conn.execute(
                "INSERT OR REPLACE INTO writer_leases "
                "(thread_id, owner_token, fence, expires_at, holder) VALUES (?, ?, ?, ?, ?)",
                (thread_id, new.owner_token, new.fence, new.expires_at, new.holder),
            )
            return new

        record = await self._db.write(run)
        return WriterLease(
            thread_id=thread_id,
            owner_token=record.owner_token,
            fence=record.fence,
            expires_at=record.expires_at,
            renew_after_ms=self._options.renew_after_ms,
            renew=self._renew,
            release=self._release,
        )

    async def _renew(self, lease: WriterLease) -> int:
        thread_id, token, fence = writer_fields(lease)

        async def run(conn: aiosqlite.Connection) -> int:
            now = self._now()
            record = await self._lease(conn, thread_id)
            if not lease_is_current(record, token, fence, now):
                raise renew_lost(thread_id, fence, record, now)
            expires_at = now + self._options.lease_duration_ms
            await conn.execute(
                "UPDATE writer_leases SET expires_at = ? WHERE thread_id = ?",
                (expires_at, thread_id),
            )
            return expires_at

        return await self._db.write(run)

    async def _release(self, lease: WriterLease) -> None:
        if self._db.closed:
            return
        thread_id, token, fence = writer_fields(lease)

        async def run(conn: aiosqlite.Connection) -> None:
            await conn.execute(
                "DELETE FROM writer_leases WHERE thread_id = ? AND owner_token = ? AND fence = ?",
                (thread_id, token, fence),
            )
            await self._drop_pins(conn, thread_id, token, fence)

        await self._db.write(run)

    # ------------------------------------------------------------------ blob guard

    @staticmethod
    async def _drop_pins(
        conn: aiosqlite.Connection, thread_id: str, token: str, fence: int
    ) -> None:
        await conn.execute(
            "DELETE FROM blob_pins WHERE thread_id = ? AND owner_token = ? AND fence = ?",
            (thread_id, token, fence),
        )

    async def pin_blobs(self, keys: builtins.list[str], writer: WriterLike) -> builtins.list[str]:
        """Pin ``keys`` for the writer's lease (WRITER_LOST first when not current;
        INVALID_ENTRY for a bad key). Returns the keys condemned right now."""
        thread_id, token, fence = writer_fields(writer)

        async def run(conn: aiosqlite.Connection) -> builtins.list[str]:
            now = await self._check_writer(conn, writer, thread_id)
            wanted = check_pin_keys(keys)
            binary = [key_to_bytes(key) for key in wanted]
            await conn.executemany(
                "INSERT OR IGNORE INTO blob_pins (key, thread_id, owner_token, fence) "
                "VALUES (?, ?, ?, ?)",
                [(key, thread_id, token, fence) for key in sorted(binary)],
            )
            condemned = {
                bytes(row[0])
                for row in await _fetchall(
                    conn, "SELECT key FROM blob_condemned WHERE until > ?", (now,)
                )
            }
            return [key for key, raw in zip(wanted, binary, strict=True) if raw in condemned]

        return await self._db.write(run)

    async def condemn_blobs(self, keys: builtins.list[str], hold_ms: int) -> builtins.list[str]:
        """Condemn unreferenced, unpinned, not-yet-condemned keys until now + hold_ms;
        returns them in the given order. Keys of another shape are never condemned."""
        hold = check_hold_ms(hold_ms)
        candidates = condemnable_keys(keys)

        async def run(conn: aiosqlite.Connection) -> builtins.list[str]:
            now = self._now()
            blocked: set[bytes] = set()
            binary = [key_to_bytes(key) for key in candidates]
            for batch in _batches(binary):
                marks = ",".join("?" * len(batch))
                for sql, extra in (
                    (f"SELECT key FROM blob_references WHERE refs > 0 AND key IN ({marks})", ()),
                    (
                        f"SELECT key FROM blob_condemned WHERE until > ? AND key IN ({marks})",
                        (now,),
                    ),
                    (
                        "SELECT p.key FROM blob_pins p JOIN writer_leases l "
                        "ON l.thread_id = p.thread_id AND l.owner_token = p.owner_token "
                        "AND l.fence = p.fence "
                        f"WHERE l.expires_at > ? AND p.key IN ({marks})",
                        (now,),
                    ),
                ):
                    rows = await _fetchall(conn, sql, (*extra, *batch))
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

    async def release_condemned(self, keys: builtins.list[str]) -> None:
        """Drop condemnations (after the sweep deleted or gave up on the keys)."""
        wanted = condemnable_keys(keys)

        async def run(conn: aiosqlite.Connection) -> None:
            await conn.executemany(
                "DELETE FROM blob_condemned WHERE key = ?",
                [(key_to_bytes(key),) for key in wanted],
            )

        await self._db.write(run)

    # ------------------------------------------------------------------ blob audit

    @staticmethod
    async def _audit_rows(
        conn: aiosqlite.Connection,
    ) -> tuple[_Rows, dict[bytes, int]]:
        """Every stored document and every stored count (one snapshot when run
        inside a transaction)."""
        rows: _Rows = {
            checkpoint_id: (base_id, data)
            for checkpoint_id, base_id, data in await _fetchall(
                conn, "SELECT id, base_id, document FROM checkpoints"
            )
        }
        stored = {
            bytes(key): refs
            for key, refs in await _fetchall(conn, "SELECT key, refs FROM blob_references")
        }
        return rows, stored

    async def audit_blob_references(self, *, with_sizes: bool = False) -> builtins.list[BlobCount]:
        """Stored counts beside the counts the manifests give (BlobAudit), from
        one read snapshot; the manifests are decoded after the lock is let go."""

        async def run(conn: aiosqlite.Connection) -> tuple[_Rows, dict[bytes, int]]:
            await conn.execute("BEGIN")  # deferred: a WAL read snapshot, no lock
            try:
                return await self._audit_rows(conn)
            finally:
                await conn.execute("COMMIT")

        rows, stored = await self._db.read(run)
        manifests, sizes = await asyncio.to_thread(
            _paused, lambda: documents.count_manifest_keys(rows, with_sizes=with_sizes)
        )
        return blob_counts(stored, manifests, sizes)

    async def repair_blob_references(self) -> builtins.list[BlobCount]:
        """Set every count to the manifests' in one write transaction (writers of
        every process wait for it); returns the keys that were wrong."""

        async def run(conn: aiosqlite.Connection) -> builtins.list[BlobCount]:
            rows, stored = await self._audit_rows(conn)
            manifests, sizes = await asyncio.to_thread(_paused, documents.count_manifest_keys, rows)
            wrong = [c for c in blob_counts(stored, manifests, sizes) if not c.agrees]
            raw = [(key_to_bytes(c.key), c.manifests) for c in wrong]
            await conn.executemany(
                "INSERT INTO blob_references (key, refs) VALUES (?, ?) "
                "ON CONFLICT (key) DO UPDATE SET refs = excluded.refs",
                [(key, n) for key, n in raw if n > 0],
            )
            await conn.executemany(
                "DELETE FROM blob_references WHERE key = ?", [(key,) for key, n in raw if n <= 0]
            )
            # A row the audit did not list (a count <= 0) is no count at all.
            await conn.execute("DELETE FROM blob_references WHERE refs <= 0")
            return wrong

        return await self._db.write(run)

    async def mark_blobs_missing(self, keys: builtins.list[str]) -> None:
        wanted = audit_keys(keys)

        async def run(conn: aiosqlite.Connection) -> None:
            now = self._now()
            await conn.executemany(
                "INSERT OR IGNORE INTO blob_missing (key, marked_at) VALUES (?, ?)",
                [(key_to_bytes(key), now) for key in wanted],
            )

        await self._db.write(run)

    async def clear_missing_blobs(self, keys: builtins.list[str]) -> None:
        wanted = audit_keys(keys)
        if not wanted:
            return

        async def run(conn: aiosqlite.Connection) -> None:
            await conn.executemany(
                "DELETE FROM blob_missing WHERE key = ?", [(key_to_bytes(key),) for key in wanted]
            )

        await self._db.write(run)

    async def list_missing_blobs(self) -> builtins.list[str]:
        async def run(conn: aiosqlite.Connection) -> builtins.list[Any]:
            return await _fetchall(conn, "SELECT key FROM blob_missing ORDER BY key")

        return [key_from_bytes(bytes(row[0])) for row in await self._db.read(run)]


class SqliteInstanceStore:
    """Instance records in a SQLite file (may be the checkpoint store's file)."""

    def __init__(self, database: SqliteDatabase) -> None:
        self._db = database

    @classmethod
    async def open(cls, path: str) -> SqliteInstanceStore:
        return cls(await SqliteDatabase.open(path))

    async def aclose(self) -> None:
        await self._db.close()

    async def __aenter__(self) -> SqliteInstanceStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def get(self, key: str) -> InstanceRecord | None:
        """The record or None; an invalid key is INVALID_ID."""
        check_id(key, "instance key")

        async def run(conn: aiosqlite.Connection) -> Any:
            return await _fetchone(
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
                    _sql_number(checked.updated_at),
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
