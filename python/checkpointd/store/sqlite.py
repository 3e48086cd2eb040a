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
from types import TracebackType
from typing import Any, TypeVar

import aiosqlite

from .. import _native
from ..errors import (
    STORE_UNAVAILABLE,
    SandboxCheckpointError,
    SandboxCheckpointInvalidArgumentError,
    from_os_error,
)
from ..model import BlobReference, Checkpoint
from ..validation import check_id
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
    repair_of,
)
from ._options import (
    LeaseRecord,
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
from ._packindex import (
    PackColumns,
    PackedRows,
    artifact_twin,
    check_packed_blobs,
    checked_digest,
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
# append that leaves a WAL of more than WAL_CHECKPOINT_BYTES copies it into the
# database right away (a passive checkpoint, which never waits for a reader): a
# cold capture's append writes ~25 MB of pages, and without these the WAL kept
# them a second time on disk, for good (the store's bytes 1.4x restic's, not 1.05x).
WAL_KEPT_BYTES = 4 << 20
WAL_CHECKPOINT_BYTES = 16 << 20
# How long a transaction keeps retrying "database is locked" before giving up. Long
# enough for another process's largest append (a 100k-entry manifest commits in
# well under a second), short enough that a wedged peer becomes a clear error.
RETRY_DEADLINE_S = 60.0
# SQLite binds at most 32766 variables per statement; stay far below.
IN_BATCH = 500
# Contents of recently appended or read checkpoints kept per store object, so the
# next append of a thread makes its delta without reading its parent back. A
# 100k-entry content is ~30 MB of Python lists: keep few.
RECENT_CONTENTS = 2
# A stored document larger than this is written through SQLite's incremental
# blob I/O (a zeroblob, then pieces of BLOB_PIECE_BYTES), never bound: SQLite
# copies a bound blob twice (SQLITE_TRANSIENT, then the record), which for a
# million-entry keyframe row (~60 MB) was +118 MiB of daemon RSS per append.
BLOB_IO_BYTES = 1 << 20
BLOB_PIECE_BYTES = 1 << 20

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


def _sql_number(value: int | float) -> int | float:
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
        (page_bytes,) = await _fetchone(connection, "PRAGMA page_size")
        pages = max(WAL_AUTOCHECKPOINT_BYTES // page_bytes, 1)
        await connection.execute(f"PRAGMA wal_autocheckpoint = {pages}")
        await connection.execute(f"PRAGMA journal_size_limit = {WAL_KEPT_BYTES}")

        async def create(conn: aiosqlite.Connection) -> None:
            for statement in _SCHEMA:
                await conn.execute(statement)
            # Columns added after a version's release (with defaults, so the
            # file's own version still decides who may open it).
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


async def _fetchone(
    connection: aiosqlite.Connection, sql: str, parameters: Sequence[Any] = ()
) -> Any:
    cursor = await connection.execute(sql, parameters)
    try:
        return await cursor.fetchone()
    finally:
        await cursor.close()


async def _fetchall(
    connection: aiosqlite.Connection,
    sql: str,
    parameters: Sequence[Any] | Mapping[str, Any] = (),
) -> builtins.list[Any]:
    return list(await connection.execute_fetchall(sql, parameters))


def _batches(values: Sequence[T], size: int = IN_BATCH) -> Iterable[Sequence[T]]:
    for start in range(0, len(values), size):
        yield values[start : start + size]


# ------------------------------------------------------------------------ documents

_Rows = Rows


# The keys of a KeySet as a table ``ks (key)``, from two parameters: the file
# digests concatenated (:digests, 32 bytes each; the kind byte is added here) and
# the artifact keys concatenated (:artifacts, 33 bytes each). One statement per
# key set, whatever its size, and no Python object per key. (``||`` yields text:
# the CAST keeps the key a BLOB, the type every other statement binds.)
_KEYS = (
    "WITH RECURSIVE fd (i) AS (SELECT 0 WHERE length(:digests) > 0"
    " UNION ALL SELECT i + 32 FROM fd WHERE i + 32 < length(:digests)),"
    " ad (i) AS (SELECT 0 WHERE length(:artifacts) > 0"
    " UNION ALL SELECT i + 33 FROM ad WHERE i + 33 < length(:artifacts)),"
    " ks (key) AS (SELECT CAST(X'66' || substr(:digests, i + 1, 32) AS BLOB) FROM fd"
    " UNION ALL SELECT substr(:artifacts, i + 1, 33) FROM ad) "
)

# File digests as a table ``ds (digest)``, from one parameter: the raw digests
# concatenated (:digests, 32 bytes each), like ``_KEYS``.
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

# Every key's count: its refs plus, per thread with an open run, the run's length
# beyond the one refs holds (see ``_core``).
_COUNTS = (
    "SELECT key, SUM(n) FROM ("
    " SELECT key, refs AS n FROM blob_references"
    " UNION ALL SELECT u.key, h.head_ordinal - u.open_since FROM blob_runs u"
    " JOIN heads h ON h.thread_id = u.thread_id"
    ") GROUP BY key"
)


# Characters per row of ``_SqliteTx._index_columns``'s integers: pack id,
# offset, length and raw size as 10 decimal digits each (< 2**32), then the
# codec's digit (``_native.decimal_rows``).
_ROW_CHARS = 41


def _keys(keys: KeySet, **extra: Any) -> dict[str, Any]:
    return {"digests": keys.digests, "artifacts": keys.artifact_blob(), **extra}


class _SqliteTx:
    """``_core.WriteTx`` on one connection inside ``BEGIN IMMEDIATE`` (which already
    holds the database's write lock, so ``lock_thread`` only reads)."""

    def __init__(self, conn: aiosqlite.Connection, options: StoreOptions) -> None:
        self.conn = conn
        self._options = options

    async def lock_thread(self, thread_id: str) -> ThreadState:
        head = await _fetchone(
            self.conn, "SELECT head_id, head_ordinal FROM heads WHERE thread_id = ?", (thread_id,)
        )
        lease = await _fetchone(
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
        row = await _fetchone(
            self.conn,
            "SELECT 1 FROM checkpoints WHERE id = ?1"
            " UNION ALL SELECT 1 FROM spent_checkpoints WHERE id = ?1 LIMIT 1",
            (checkpoint_id,),
        )
        return row is not None

    async def row(self, checkpoint_id: str) -> StoredRow | None:
        row = await _fetchone(
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
        row = await _fetchone(
            self.conn, "SELECT 1 FROM checkpoints WHERE thread_id = ? LIMIT 1", (thread_id,)
        )
        return row is not None

    async def fetch_chains(self, checkpoint_ids: Sequence[str], rows: Rows) -> None:
        await _fetch_chains(self.conn, checkpoint_ids, rows)

    async def thread_checkpoints(
        self, thread_id: str
    ) -> builtins.list[tuple[str, str | None, Any]]:
        return [
            (r[0], r[1], r[2])
            for r in await _fetchall(
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
                    _sql_number(document["created_at"]),
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
                _KEYS + "INSERT INTO blob_references (key, refs) SELECT key, 1 FROM ks WHERE true"
                " ON CONFLICT (key) DO UPDATE SET refs = refs + 1",
                _keys(change.open),
            )
            await self.conn.execute(
                _KEYS + "INSERT OR REPLACE INTO blob_runs (key, thread_id, open_since)"
                " SELECT key, :thread, :at FROM ks",
                _keys(change.open, thread=thread_id, at=change.new_ordinal),
            )
        return serial

    async def _close(self, thread_id: str, keys: KeySet, ordinal: int, extra: int = 0) -> None:
        """refs += ordinal - open_since + extra for each key's run, then drop the runs."""
        await self.conn.execute(
            _KEYS + "INSERT INTO blob_references (key, refs)"
            " SELECT ks.key, coalesce(:at - u.open_since, 0) + :extra FROM ks"
            " LEFT JOIN blob_runs u ON u.key = ks.key AND u.thread_id = :thread WHERE true"
            " ON CONFLICT (key) DO UPDATE SET refs = refs + excluded.refs",
            _keys(keys, thread=thread_id, at=ordinal, extra=extra),
        )
        await self.conn.execute(
            _KEYS + "DELETE FROM blob_runs WHERE thread_id = :thread"
            " AND key IN (SELECT key FROM ks)",
            _keys(keys, thread=thread_id),
        )

    async def delete_rows(self, checkpoint_ids: Sequence[str]) -> Rows:
        rows: Rows = {}
        for batch in _batches(builtins.list(checkpoint_ids)):
            marks = ",".join("?" * len(batch))
            for checkpoint_id, base_id, data in await _fetchall(
                self.conn,
                f"SELECT id, base_id, document FROM checkpoints WHERE id IN ({marks})",
                batch,
            ):
                rows[checkpoint_id] = (base_id, data)
            await self.conn.execute(f"DELETE FROM checkpoints WHERE id IN ({marks})", batch)
        return rows

    async def dependents(self, removed: Sequence[str]) -> Rows:
        rows: Rows = {}
        for batch in _batches(builtins.list(removed)):
            marks = ",".join("?" * len(batch))
            for checkpoint_id, base_id, data in await _fetchall(
                self.conn,
                f"SELECT id, base_id, document FROM checkpoints WHERE base_id IN ({marks})",
                batch,
            ):
                rows[checkpoint_id] = (base_id, data)
        return rows

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
            _KEYS + "INSERT INTO blob_runs (key, thread_id, open_since)"
            " SELECT key, :thread, :at FROM ks",
            _keys(keys, thread=thread_id, at=new),
        )

    async def subtract_counts(
        self, thread_id: str, counts: Mapping[bytes, int], cutoff: int
    ) -> None:
        ordered = sorted(counts)  # key order: the updates walk the B-tree left to right
        parameters = [
            {"key": key, "n": counts[key], "cutoff": cutoff, "thread": thread_id} for key in ordered
        ]
        await self.conn.executemany(
            "UPDATE blob_references SET refs = refs - :n + coalesce((SELECT"
            " max(:cutoff - open_since, 0) FROM blob_runs"
            " WHERE key = :key AND thread_id = :thread), 0) WHERE key = :key",
            parameters,
        )
        await self.conn.executemany(
            "UPDATE blob_runs SET open_since = :cutoff"
            " WHERE key = :key AND thread_id = :thread AND open_since < :cutoff",
            parameters,
        )

    async def forget_zero_counts(self, thread_id: str, keys: KeySet) -> None:
        if keys:
            await self.conn.execute(
                _KEYS + "DELETE FROM blob_references WHERE key IN (SELECT key FROM ks)"
                " AND refs <= 0 AND NOT EXISTS"
                " (SELECT 1 FROM blob_runs u WHERE u.key = blob_references.key)",
                _keys(keys),
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
        packs = builtins.list(digest_by_pack.values())
        await self.conn.executemany(
            "INSERT OR IGNORE INTO blob_packs (digest) VALUES (?)", [(d,) for d in packs]
        )
        ids: dict[bytes, int] = {}
        for batch in _batches(packs):
            marks = ",".join("?" * len(batch))
            for pack_id, digest in await _fetchall(
                self.conn, f"SELECT id, digest FROM blob_packs WHERE digest IN ({marks})", batch
            ):
                ids[bytes(digest)] = pack_id
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
            (pack_id,) = await _fetchone(
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
        row = await _fetchone(
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
        row = await _fetchone(
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
            _KEYS + "INSERT OR IGNORE INTO lease_pins (lease_id, key) SELECT :lease, key FROM ks",
            _keys(keyset, lease=lease_id),
        )
        return {
            bytes(row[0])
            for row in await _fetchall(
                self.conn,
                _KEYS + "SELECT c.key FROM ks JOIN blob_condemned c ON c.key = ks.key"
                " WHERE c.until > :now",
                _keys(keyset, now=read_clock(self._options)),
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


async def _fetch_chains(
    conn: aiosqlite.Connection, checkpoint_ids: Sequence[str], rows: Rows
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


async def _pins_by_lease_id(conn: aiosqlite.Connection) -> None:
    """Schema 3 -> 4: each (thread, owner token, fence) that pinned gets a lease
    id and its pins move to ``lease_pins``, every one of them (a dead lease's
    pins too: they stay as dead as they were)."""
    if not await _fetchall(
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
    heads = {t: h for t, h in await _fetchall(conn, "SELECT thread_id, head_id FROM heads")}
    rows: Rows = {}
    await _fetch_chains(conn, builtins.list(heads.values()), rows)
    key_sets = await asyncio.to_thread(paused, head_key_sets, heads, rows)
    for thread_id, keys in key_sets.items():
        await conn.execute(
            _KEYS + "INSERT OR IGNORE INTO blob_runs (key, thread_id, open_since)"
            " SELECT key, :thread, 0 FROM ks",
            _keys(keys, thread=thread_id),
        )


# ------------------------------------------------------------------------ the store


class SqliteCheckpointStore(SqlCheckpointStore):
    """A checkpoint store in one SQLite file (docs/contract.md#checkpoint-store).

    Open with ``await SqliteCheckpointStore.open("/abs/path.db", now=…,
    lease_duration_ms=…, renew_after_ms=…)`` or ``open_store("sqlite:///abs/path.db")``.
    Several store objects and processes may share the file. The writes of docs/contract.md#checkpoint-store
    are ``_core.SqlCheckpointStore``'s, over ``_SqliteTx``.
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

    async def _write(self, operation: str, body: Callable[[Any], Awaitable[T]]) -> T:
        async def run(conn: aiosqlite.Connection) -> T:
            return await body(_SqliteTx(conn, self._options))

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
            return await _fetchone(
                conn, "SELECT serial FROM checkpoints WHERE id = ?", (checkpoint_id,)
            )

        row = await self._db.read(run)
        return None if row is None else int(row[0])

    async def _read_chain(self, checkpoint_id: str) -> tuple[int, _Rows] | None:
        async def run(conn: aiosqlite.Connection) -> tuple[int, _Rows] | None:
            row = await _fetchone(
                conn,
                "SELECT serial, base_id, document FROM checkpoints WHERE id = ?",
                (checkpoint_id,),
            )
            if row is None:
                return None
            serial, base_id, data = row
            rows: _Rows = {checkpoint_id: (base_id, data)}
            if base_id is not None:
                await _fetch_chains(conn, [checkpoint_id], rows)
            return int(serial), rows

        return await self._db.read(run)

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

        return await checkpoints_of(rows)

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
            # In key order along blob_references; each key's runs by their primary key.
            return await _fetchall(
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
            found: set[str] = set()
            for batch in _batches(wanted):
                marks = ",".join("?" * len(batch))
                found.update(
                    row[0]
                    for row in await _fetchall(
                        conn, f"SELECT id FROM spent_checkpoints WHERE id IN ({marks})", batch
                    )
                )
            return found

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
            for batch in _batches(binary):
                marks = ",".join("?" * len(batch))
                referenced = (
                    (f"SELECT key FROM blob_references WHERE refs > 0 AND key IN ({marks})", ()),
                    # A key with an open run is in a head, whatever its refs say.
                    (f"SELECT DISTINCT key FROM blob_runs WHERE key IN ({marks})", ()),
                )
                for sql, extra in (
                    *(() if referenced_too else referenced),
                    (
                        f"SELECT key FROM blob_condemned WHERE until > ? AND key IN ({marks})",
                        (now,),
                    ),
                    (
                        # From the few live leases to their pins of these keys
                        # (CROSS JOIN keeps that order: lease_pins is keyed by lease).
                        "SELECT p.key FROM writer_leases l CROSS JOIN leases s"
                        " CROSS JOIN lease_pins p WHERE l.expires_at > ?"
                        " AND s.thread_id = l.thread_id AND s.owner_token = l.owner_token"
                        f" AND s.fence = l.fence AND p.lease_id = s.id AND p.key IN ({marks})",
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

    # ------------------------------------------------------------ pack maintenance

    async def drop_packed_blobs(self, rows: builtins.list[PackedBlob]) -> builtins.list[str]:
        """See ``base.PackMaintenance``: one write transaction."""
        checked = check_packed_blobs(rows, None)

        async def run(conn: aiosqlite.Connection) -> builtins.list[str]:
            now = self._now()
            dropped: builtins.list[str] = []
            for row in checked:
                digest = digest_of(row.key)
                raw = key_to_bytes(row.key)
                current = await _fetchall(
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
                blocked = await _fetchall(
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

    async def _pack_ids(
        self, conn: aiosqlite.Connection, packs: builtins.list[bytes]
    ) -> dict[bytes, int]:
        await conn.executemany(
            "INSERT OR IGNORE INTO blob_packs (digest) VALUES (?)", [(d,) for d in packs]
        )
        ids: dict[bytes, int] = {}
        for batch in _batches(packs):
            marks = ",".join("?" * len(batch))
            for pack_id, digest in await _fetchall(
                conn, f"SELECT id, digest FROM blob_packs WHERE digest IN ({marks})", batch
            ):
                ids[bytes(digest)] = pack_id
        return ids

    async def _retired(self, conn: aiosqlite.Connection, packs: builtins.list[bytes]) -> set[bytes]:
        """Those of ``packs`` retired right now."""
        now = self._now()
        found: set[bytes] = set()
        for batch in _batches(packs):
            marks = ",".join("?" * len(batch))
            found.update(
                bytes(row[0])
                for row in await _fetchall(
                    conn,
                    f"SELECT digest FROM retired_packs WHERE until > ? AND digest IN ({marks})",
                    (now, *batch),
                )
            )
        return found

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
            ids = await self._pack_ids(conn, [d for d in wanted if d not in retired])
            old_id = await _fetchall(conn, "SELECT id FROM blob_packs WHERE digest = ?", (old,))
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
            ids = await self._pack_ids(conn, wanted)
            added: builtins.list[str] = []
            for row in checked:
                # Referenced as a file or as an artifact (_packindex.row_key).
                raw, twin = key_to_bytes(row.key), key_to_bytes(artifact_twin(row.key))
                used = unreferenced or await _fetchall(
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
            pointed = await _fetchall(
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

    # ------------------------------------------------------------------ blob audit

    @staticmethod
    async def _audit_rows(conn: aiosqlite.Connection) -> tuple[_Rows, dict[bytes, int]]:
        """Every stored document and every stored count (one snapshot when run
        inside a transaction)."""
        rows: _Rows = {
            checkpoint_id: (base_id, data)
            for checkpoint_id, base_id, data in await _fetchall(
                conn, "SELECT id, base_id, document FROM checkpoints"
            )
        }
        stored = {bytes(key): refs for key, refs in await _fetchall(conn, _COUNTS)}
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
        return await audited(rows, stored, with_sizes=with_sizes)

    async def damaged_checkpoints(self) -> builtins.list[DamagedCheckpoint]:
        """See ``base.DocumentAudit``: every row read in one snapshot, checked
        after the lock is let go."""

        async def run(conn: aiosqlite.Connection) -> builtins.list[Any]:
            return await _fetchall(conn, "SELECT id, thread_id, base_id, document FROM checkpoints")

        found = await self._db.read(run)
        rows: _Rows = {checkpoint_id: (base_id, data) for checkpoint_id, _, base_id, data in found}
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
            heads = {t: h for t, h in await _fetchall(conn, "SELECT thread_id, head_id FROM heads")}
            repair = await repair_of(rows, stored, heads)
            await conn.execute("DELETE FROM blob_runs")
            for thread_id, keys in repair.head_keys.items():
                await conn.execute(
                    _KEYS + "INSERT INTO blob_runs (key, thread_id, open_since)"
                    " SELECT key, :thread, (SELECT head_ordinal FROM heads"
                    " WHERE thread_id = :thread) FROM ks",
                    _keys(keys, thread=thread_id),
                )
            refs = {
                bytes(key): n
                for key, n in await _fetchall(conn, "SELECT key, refs FROM blob_references")
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
            return await _fetchall(conn, "SELECT key FROM blob_missing ORDER BY key")

        return [key_from_bytes(bytes(row[0])) for row in await self._db.read(run)]

    # ------------------------------------------------------------------ pack index

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
            rows = await _fetchall(conn, _LOCATE, {"digests": b"".join(wanted)})
            located_rows(wanted, rows, found)
            rest = b"".join(digest for digest, key in wanted.items() if key not in found)
            if rest:
                for (digest,) in await _fetchall(conn, _REFERENCED_DIGESTS, {"digests": rest}):
                    found[wanted[bytes(digest)]] = None
            return found

        return await self._db.read(run)

    async def locate_rows(self, digests: bytes) -> builtins.list[IndexRow]:
        """See ``base.PackIndex``: one statement."""

        async def run(conn: aiosqlite.Connection) -> builtins.list[IndexRow]:
            return await _fetchall(conn, _LOCATE, {"digests": digests})

        return await self._db.read(run) if digests else []

    async def known_digests(self, digests: bytes) -> bytes:
        """``locate_blobs`` for a pack session's feed (``blobs.packs.known_digests``):
        of ``digests`` (raw file digests, concatenated), those packed or
        referenced, concatenated; nothing bound or returned per unknown blob."""

        async def run(conn: aiosqlite.Connection) -> bytes:
            rows = await _fetchall(conn, _KNOWN_DIGESTS, {"digests": digests})
            return b"".join(bytes(row[0]) for row in rows)

        return await self._db.read(run) if digests else b""

    async def list_packed_blobs(
        self, *, after: str | None = None, limit: int = 1000
    ) -> builtins.list[PackedBlob]:
        """See ``base.PackIndex``: in key order (the digests' byte order)."""
        start = b"" if after is None else (digest_of(after) or b"")

        async def run(conn: aiosqlite.Connection) -> builtins.list[Any]:
            return await _fetchall(
                conn,
                "SELECT b.digest, p.digest, b.frame_offset, b.frame_length, b.raw_size, b.codec"
                " FROM packed_blobs b JOIN blob_packs p ON p.id = b.pack"
                " WHERE b.digest > ? ORDER BY b.digest LIMIT ?",
                (start, max(limit, 0)),
            )

        return [
            row_from_sql(bytes(row[0]), bytes(row[1]), *row[2:]) for row in await self._db.read(run)
        ]


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
