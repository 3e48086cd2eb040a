"""SQLite checkpoint and instance stores (aiosqlite, WAL), the embedded default.

Layout (schema version 2, created or migrated on open, idempotent):

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
* ``heads`` (with each thread's ``head_ordinal``), ``writer_leases``,
  ``writer_fences`` (the per-thread fence counter, kept apart from the lease so
  it survives release).
* ``blob_references`` — one row per distinct key with its ``refs``, and
  ``blob_runs`` — one row per (key, thread) whose head uses the key: the count of
  a key is its ``refs`` plus, per run, ``head_ordinal - open_since``. An append
  writes rows only for the keys its parent lacks or it drops (``_core``
  explains the runs), so a no-change capture writes one ``heads`` row. Keys are
  stored as 33 bytes (kind + raw hash, see ``_options.key_to_bytes``), which sort
  like the UTF-8 text keys. Version 1 files (plain counts) are migrated on open
  without changing any count.
* ``spent_checkpoints`` — ids of deleted request_id checkpoints (``_core``).
* ``leases`` (an integer id per lease that pinned), ``lease_pins`` (lease id,
  key), ``blob_condemned`` — the BlobGuard records of a safe sweep.
* ``instances`` — the instance store's records.

Concurrency: every check-then-write runs inside ``BEGIN IMMEDIATE`` … ``COMMIT``,
so the checks and the write see one state and other connections (in this process
or another) wait for the write lock. A store object owns one connection and an
``asyncio.Lock``: statements of two coroutines must not interleave inside one
transaction. ``busy_timeout`` makes SQLite wait for a lock held elsewhere; when it
still reports "database is locked" or "busy", the whole transaction is retried
with backoff until ``RETRY_DEADLINE_S``, after which the caller gets
SandboxCheckpointError with code ``SANDBOX_SNAPSHOT_STORE_UNAVAILABLE`` — a raw
``sqlite3.OperationalError`` never escapes. A write that finds the filesystem
full is ``SANDBOX_SNAPSHOT_NO_SPACE`` naming the file (RESOURCE_EXHAUSTED, as a
full blob directory is), rolled back like any failure: free space and retry.

Durability: WAL with ``synchronous=FULL`` (SQLite's default): a committed append
survives a power cut, which is what a checkpoint is for. The WAL is copied
back into the database every ``WAL_AUTOCHECKPOINT_BYTES`` (SQLite's default
is 1,000 pages): a cold capture of 100,000 small files writes ~100,000 pins
and index rows to B-tree pages that are rewritten batch after batch, and a
checkpoint every 4 MiB wrote the same pages again and again (pinning took
3.5 s, 1.7 s with this). Durability is the WAL's, not the checkpoint's.

Pages: a store file is created with ``PAGE_BYTES`` (16 KiB) pages, not
SQLite's 4 KiB. A cold capture's append writes ~300,000 rows of 32-byte keys
into three B-trees and every page twice (WAL, then the database): with 16 KiB
pages its inserts, commit and copy-back take ~385 ms instead of ~490 ms for
100,000 keys, while a 1% capture's 1,000 keys cost the same. A file created
with other pages keeps them (SQLite changes a WAL file's page size only by a
rebuild, which nothing here needs).
"""

from __future__ import annotations

import asyncio
import builtins
import errno
import os
import random
import sqlite3
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import aiosqlite

from ..errors import (
    STORE_UNAVAILABLE,
    SandboxCheckpointError,
    SandboxCheckpointInvalidArgumentError,
    from_os_error,
)
from ._core import (
    KeySet,
    Rows,
    head_key_sets,
    paused,
)

T = TypeVar("T")

# 2: count runs (``blob_runs``, ``heads.head_ordinal``) and spent request ids.
# 3: the pack index (``blob_packs``, ``packed_blobs``; blobs/packs.py).
# 4: pins by lease id (``leases``, ``lease_pins``; ``blob_pins`` migrated, dropped).
# 5: pack keys are pinned and condemned too (kind ``p`` in ``lease_pins`` and
#    ``blob_condemned``): a capture pins per pack, not per key (blobs/packs.py,
#    "Safety"), which the sweep of a checkpointd before 5 would not see (it
#    could delete a pack a capture is about to point rows at), so such a
#    checkpointd must not open the file. No table changes.
SCHEMA_VERSION = 5
BUSY_TIMEOUT_MS = 5_000
# WAL bytes before SQLite copies them into the database, and the page size of a
# new store file (see the module docstring).
WAL_AUTOCHECKPOINT_BYTES = 32 << 20
PAGE_BYTES = 16 << 10
# A WAL file larger than this is cut back to it when SQLite starts it over, and an
# append that leaves a WAL of more than ``sqlite.WAL_CHECKPOINT_BYTES`` copies it into the
# database right away (a passive checkpoint, which never waits for a reader): a
# cold capture's append writes ~25 MB of pages, and without these the WAL kept
# them a second time on disk, for good (the store's bytes 1.4x restic's, not 1.05x).
WAL_KEPT_BYTES = 4 << 20
# How long a transaction keeps retrying "database is locked" before giving up. Long
# enough for another process's largest append (a 100k-entry manifest commits in
# well under a second), short enough that a wedged peer becomes a clear error.
RETRY_DEADLINE_S = 60.0
# SQLite binds at most 32766 variables per statement; stay far below.
IN_BATCH = 500

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
    # head_ordinal: the count runs' clock of the thread (see ``_core``).
    """CREATE TABLE IF NOT EXISTS heads (
        thread_id TEXT PRIMARY KEY, head_id TEXT NOT NULL,
        head_ordinal INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID""",
    # holder: ``_options.lease_holder`` of the acquiring owner (NULL: no owner).
    """CREATE TABLE IF NOT EXISTS writer_leases (
        thread_id TEXT PRIMARY KEY,
        owner_token TEXT NOT NULL,
        fence INTEGER NOT NULL,
        expires_at INTEGER NOT NULL,
        holder TEXT) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS writer_fences (
        thread_id TEXT PRIMARY KEY, fence INTEGER NOT NULL) WITHOUT ROWID""",
    # refs: the checkpoints using the key, an open run counted once (``_core``).
    """CREATE TABLE IF NOT EXISTS blob_references (
        key BLOB PRIMARY KEY, refs INTEGER NOT NULL) WITHOUT ROWID""",
    # One row per (key, thread) whose head uses the key: the run began at the
    # thread's head ordinal ``open_since``.
    """CREATE TABLE IF NOT EXISTS blob_runs (
        key BLOB NOT NULL,
        thread_id TEXT NOT NULL,
        open_since INTEGER NOT NULL,
        PRIMARY KEY (key, thread_id)) WITHOUT ROWID""",
    # No index by thread: it would double the runs' bytes for the rare writes
    # that touch a whole thread (its head gone, repair), which scan instead.
    """DROP INDEX IF EXISTS blob_runs_by_thread""",
    # Ids of deleted request_id checkpoints: never used again (``_core``).
    """CREATE TABLE IF NOT EXISTS spent_checkpoints (id TEXT PRIMARY KEY) WITHOUT ROWID""",
    # Each lease that pinned keys, once, under a small integer id (never reused),
    # and its pins keyed by (lease id, key): a pin row is the key and one
    # integer, so a cold capture's 100,000 pins stay small and are dropped
    # with one range delete. (Schema 3's ``blob_pins`` repeated the thread and
    # the owner token as text in every row and in a second index.)
    """CREATE TABLE IF NOT EXISTS leases (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        thread_id TEXT NOT NULL,
        owner_token TEXT NOT NULL,
        fence INTEGER NOT NULL,
        UNIQUE (thread_id, owner_token, fence))""",
    """CREATE TABLE IF NOT EXISTS lease_pins (
        lease_id INTEGER NOT NULL,
        key BLOB NOT NULL,
        PRIMARY KEY (lease_id, key)) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS blob_condemned (
        key BLOB PRIMARY KEY, until INTEGER NOT NULL) WITHOUT ROWID""",
    # Keys ``checkpointd check`` found referenced but gone from the bucket.
    """CREATE TABLE IF NOT EXISTS blob_missing (
        key BLOB PRIMARY KEY, marked_at INTEGER NOT NULL) WITHOUT ROWID""",
    # The pack index (``store._packindex``): each pack's digest once, and per
    # packed blob its digest, pack, frame position, raw size and codec.
    """CREATE TABLE IF NOT EXISTS blob_packs (
        id INTEGER PRIMARY KEY, digest BLOB NOT NULL UNIQUE)""",
    """CREATE TABLE IF NOT EXISTS packed_blobs (
        digest BLOB PRIMARY KEY,
        pack INTEGER NOT NULL,
        frame_offset INTEGER NOT NULL,
        frame_length INTEGER NOT NULL,
        raw_size INTEGER NOT NULL,
        codec INTEGER NOT NULL) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS instances (
        key TEXT PRIMARY KEY,
        provider TEXT NOT NULL,
        provider_sandbox_id TEXT NOT NULL,
        thread_id TEXT NOT NULL,
        updated_at NOT NULL,
        latest_snapshot_id TEXT,
        latest_run_id TEXT) WITHOUT ROWID""",
    # Packs a sweep retired before deleting them (``PackMaintenance.retire_pack``):
    # no row may point at one again.
    """CREATE TABLE IF NOT EXISTS retired_packs (
        digest BLOB PRIMARY KEY, until INTEGER NOT NULL) WITHOUT ROWID""",
]


_ADDED_COLUMNS = (
    ("writer_leases", "holder", "TEXT"),
    ("heads", "head_ordinal", "INTEGER NOT NULL DEFAULT 0"),
)


def _is_busy(error: BaseException) -> bool:
    if not isinstance(error, sqlite3.OperationalError):
        return False
    text = str(error).lower()
    return "locked" in text or "busy" in text


def sql_number(value: int | float) -> int | float:
    """SQLite integers are 64-bit; a larger int is kept (for ordering) as a float."""
    if isinstance(value, int) and not -(2**63) <= value < 2**63:
        return float(value)
    return value


def _failure(path: str, error: BaseException) -> SandboxCheckpointError:
    """What a SQLite failure is to the caller: NO_SPACE when the filesystem
    holding the file is full (``_is_full``), else STORE_UNAVAILABLE."""
    if _is_full(path, error):
        full = from_os_error(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path))
        assert full is not None
        full.details["store"] = f"sqlite://{path}"
        return full
    return SandboxCheckpointError(
        f"SQLite store {path} is unavailable: {error}",
        code=STORE_UNAVAILABLE,
        details={"store": f"sqlite://{path}"},
    )


# Free bytes below which an I/O error of the store file is taken for a full
# filesystem: SQLite writes whole pages (16 KiB) and grows its WAL and -shm
# files in pieces of that order.
FULL_BELOW_BYTES = 1 << 20


def _is_full(path: str, error: BaseException) -> bool:
    """SQLite says SQLITE_FULL when a write of the file, its WAL or its journal
    hits ENOSPC (or a quota); a few paths (growing the -shm file) say only
    SQLITE_IOERR, which counts as full when the filesystem has next to no
    room left."""
    code = getattr(error, "sqlite_errorcode", None)
    if not isinstance(code, int):
        return False
    if code & 0xFF == sqlite3.SQLITE_FULL:
        return True
    if code & 0xFF != sqlite3.SQLITE_IOERR:
        return False
    try:
        room = os.statvfs(os.path.dirname(path))
    except OSError:
        return False
    return room.f_bavail * room.f_frsize < FULL_BELOW_BYTES


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
            raise _failure(path, FileNotFoundError(f"no directory {os.path.dirname(path)}"))
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
            raise _failure(path, error) from error
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
        # Only a file with no pages yet takes it: before WAL mode writes the header.
        await connection.execute(f"PRAGMA page_size = {PAGE_BYTES}")

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
        (page_bytes,) = await fetchone(connection, "PRAGMA page_size")
        pages = max(WAL_AUTOCHECKPOINT_BYTES // page_bytes, 1)
        await connection.execute(f"PRAGMA wal_autocheckpoint = {pages}")
        await connection.execute(f"PRAGMA journal_size_limit = {WAL_KEPT_BYTES}")

        async def create(conn: aiosqlite.Connection) -> None:
            for statement in _SCHEMA:
                await conn.execute(statement)
            # Columns added after a version's release (with defaults, so the
            # file's own version still decides who may open it).
            for table, column, declaration in _ADDED_COLUMNS:
                columns = await fetchall(conn, f"PRAGMA table_info({table})")
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
            elif int(row[0]) < SCHEMA_VERSION:
                if int(row[0]) < 2:
                    # 1 -> 2: the counts become runs, each stored count unchanged.
                    await _open_head_runs(conn)
                # 2 -> 3: the pack index tables (created above, empty: blobs
                # written before packs stay single objects).
                # 3 -> 4: every pin moves to its lease's id.
                await _pins_by_lease_id(conn)
                # 4 -> 5: nothing to move (the version keeps older sweeps out).
                await conn.execute(
                    "UPDATE checkpointd_meta SET value = ? WHERE name = 'schema_version'",
                    (str(SCHEMA_VERSION),),
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
                    raise _failure(self.path, error) from error
                if time.monotonic() >= deadline:
                    raise _failure(self.path, error) from error
            except sqlite3.Error as error:
                raise _failure(self.path, error) from error
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

    async def checkpoint_if_over(self, limit: int) -> None:
        """Copy the WAL into the database when its file is over ``limit`` bytes
        (passive: pages a reader still needs stay; best effort, never raises)."""
        try:
            if os.stat(self.path + "-wal").st_size <= limit:
                return
        except OSError:
            return
        async with self._lock:
            connection = self._connection
            if connection is None:
                return
            try:
                await connection.execute("PRAGMA wal_checkpoint(PASSIVE)")
            except sqlite3.Error:
                pass

    async def read(self, transaction: Transaction[T]) -> T:
        """Run a read (one statement or a deferred transaction) under the lock."""
        async with self._lock:
            connection = self._require()

            async def attempt() -> T:
                await self._rollback(connection)
                return await transaction(connection)

            return await self._retrying(attempt)


async def fetchone(
    connection: aiosqlite.Connection, sql: str, parameters: Sequence[Any] = ()
) -> Any:
    """The first row of a query of at most one row (by key), or None: one
    trip to the connection's thread, not three (execute, fetch, close)."""
    rows = await connection.execute_fetchall(sql, parameters)
    return next(iter(rows), None)


async def fetchall(
    connection: aiosqlite.Connection,
    sql: str,
    parameters: Sequence[Any] | Mapping[str, Any] = (),
) -> builtins.list[Any]:
    return list(await connection.execute_fetchall(sql, parameters))


def batches(values: Sequence[T], size: int = IN_BATCH) -> Iterable[Sequence[T]]:
    for start in range(0, len(values), size):
        yield values[start : start + size]


def in_list(sql: str, batch: Sequence[Any]) -> str:
    """``sql`` with its ``{in}`` the placeholders of ``batch`` (``?,?,…``)."""
    return sql.replace("{in}", ",".join("?" * len(batch)))


async def fetch_in(
    connection: aiosqlite.Connection, sql: str, values: Sequence[Any], *before: Any
) -> builtins.list[Any]:
    """The rows of ``sql`` for every batch of ``values`` (``in_list``), each
    bound after the ``before`` parameters."""
    rows: builtins.list[Any] = []
    for batch in batches(values):
        rows += await fetchall(connection, in_list(sql, batch), (*before, *batch))
    return rows


async def pack_ids(connection: aiosqlite.Connection, packs: Sequence[bytes]) -> dict[bytes, int]:
    """The id of each of these pack digests (created when new)."""
    await connection.executemany(
        "INSERT OR IGNORE INTO blob_packs (digest) VALUES (?)", [(d,) for d in packs]
    )
    return {
        bytes(digest): pack_id
        for pack_id, digest in await fetch_in(
            connection, "SELECT id, digest FROM blob_packs WHERE digest IN ({in})", packs
        )
    }


# The keys of a KeySet as a table ``ks (key)``, from two parameters: the file
# digests concatenated (:digests, 32 bytes each; the kind byte is added here) and
# the artifact keys concatenated (:artifacts, 33 bytes each). One statement per
# key set, whatever its size, and no Python object per key. (``||`` yields text:
# the CAST keeps the key a BLOB, the type every other statement binds.)
KEYS = (
    "WITH RECURSIVE fd (i) AS (SELECT 0 WHERE length(:digests) > 0"
    " UNION ALL SELECT i + 32 FROM fd WHERE i + 32 < length(:digests)),"
    " ad (i) AS (SELECT 0 WHERE length(:artifacts) > 0"
    " UNION ALL SELECT i + 33 FROM ad WHERE i + 33 < length(:artifacts)),"
    " ks (key) AS (SELECT CAST(X'66' || substr(:digests, i + 1, 32) AS BLOB) FROM fd"
    " UNION ALL SELECT substr(:artifacts, i + 1, 33) FROM ad) "
)


def key_params(keys: KeySet, **extra: Any) -> dict[str, Any]:
    return {"digests": keys.digests, "artifacts": keys.artifact_blob(), **extra}


async def fetch_chains(
    conn: aiosqlite.Connection, checkpoint_ids: Sequence[str], rows: Rows
) -> None:
    """Add to ``rows`` each checkpoint and its bases down to a keyframe."""
    for checkpoint_id, base_id, data in await fetch_in(
        conn,
        # Walk the small (id, base_id) pairs (UNION drops shared bases),
        # then read each document once.
        "WITH RECURSIVE chain (id, base_id) AS ("
        " SELECT id, base_id FROM checkpoints WHERE id IN ({in})"
        " UNION"
        " SELECT c.id, c.base_id FROM checkpoints AS c"
        " JOIN chain ON c.id = chain.base_id"
        ") SELECT k.id, k.base_id, k.document FROM chain"
        " JOIN checkpoints AS k ON k.id = chain.id",
        builtins.list(checkpoint_ids),
    ):
        rows[checkpoint_id] = (base_id, data)


async def _pins_by_lease_id(conn: aiosqlite.Connection) -> None:
    """Schema 3 -> 4: each (thread, owner token, fence) that pinned gets a lease
    id and its pins move to ``lease_pins``, every one of them (a dead lease's
    pins too: they stay as dead as they were)."""
    if not await fetchall(
        conn, "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'blob_pins'"
    ):
        return
    await conn.execute(
        "INSERT OR IGNORE INTO leases (thread_id, owner_token, fence)"
        " SELECT DISTINCT thread_id, owner_token, fence FROM blob_pins"
    )
    await conn.execute(
        "INSERT OR IGNORE INTO lease_pins (lease_id, key)"
        " SELECT l.id, p.key FROM blob_pins p JOIN leases l ON l.thread_id = p.thread_id"
        " AND l.owner_token = p.owner_token AND l.fence = p.fence"
    )
    await conn.execute("DROP TABLE blob_pins")


async def _open_head_runs(conn: aiosqlite.Connection) -> None:
    """Schema 1 -> 2: open a run at each head's ordinal for each of its keys (the
    counts stay as they were; see ``_core``)."""
    heads = {t: h for t, h in await fetchall(conn, "SELECT thread_id, head_id FROM heads")}
    rows: Rows = {}
    await fetch_chains(conn, builtins.list(heads.values()), rows)
    key_sets = await asyncio.to_thread(paused, head_key_sets, heads, rows)
    for thread_id, keys in key_sets.items():
        await conn.execute(
            KEYS + "INSERT OR IGNORE INTO blob_runs (key, thread_id, open_since)"
            " SELECT key, :thread, 0 FROM ks",
            key_params(keys, thread=thread_id),
        )
