"""Typed surface of the Rust extension ``checkpointd._native`` (see rust/src/py/).

The scanner walks a workspace in parallel with the GIL released, applies the
policy, classifies entries, zeroes secrets, hashes with BLAKE3 and consults a
persistent stat cache. Results cross into Python as compact bytes.
"""

import os
from collections.abc import Sequence

__version__: str
BUILD_PROFILE: str  # "release" or "debug" (benchmarks refuse debug builds)

class ScanCancelled(Exception):
    """Raised by ``scan`` when its ``CancelToken`` was cancelled."""

# One class per kind of failure (rust/src/py/errors.rs); each is an OSError with
# errno, strerror and filename, mapped once by checkpointd.errors.from_os_error.
class FileChangedError(OSError):
    """A file changed, vanished or changed kind while it was read."""

class RootInvalidError(NotADirectoryError):
    """The workspace root is missing, not a directory, or a symlink."""

class NameTooLongError(OSError):
    """A name or path is longer than the filesystem allows (ENAMETOOLONG)."""

class NoSpaceError(OSError):
    """The filesystem or quota is full (ENOSPC, EDQUOT)."""

class CrossDeviceError(OSError):
    """A rename or link across filesystems (EXDEV)."""

class PermissionDeniedError(OSError):
    """Permission denied or a read-only filesystem (EACCES, EPERM, EROFS)."""

def errno_error(errno: int) -> type[OSError]:
    """The class of the OSError this module raises for ``errno``: one of the
    classes above for the errnos they name (rust/src/error.rs ``errno_kind``,
    the one errno table), else ``OSError``."""

class CancelToken:
    def __init__(self) -> None: ...
    def cancel(self) -> None: ...
    @property
    def cancelled(self) -> bool: ...

class ScanResult:
    # The manifest in checkpointd.codec's compact encoding (a UTF-8 JSON array of
    # rows), sorted by the UTF-8 bytes of the path. Unsupported entries are NOT in it.
    # A file row where secrets were zeroed goes on with flat (offset, length,
    # secret index) triples; such files are never put in the stat cache.
    manifest: bytes
    # Every unsupported entry the policy did not exclude, sorted by path bytes:
    # (path, kind) with kind one of "symlink-escapes", "fifo", "socket",
    # "block-device", "char-device", "non-utf8-name", "unknown".
    # Non-UTF-8 paths are given with surrogateescape-decoded text. A symlink whose
    # target is not UTF-8 is "non-utf8-name" too (the manifest stores text), and a
    # non-UTF-8 directory is listed once, without its content.
    unsupported: list[tuple[str, str]]
    entries: int  # manifest entries (files + dirs + symlinks)
    files_hashed: int  # files read and hashed in this scan
    files_reused: int  # files whose hash came from the stat cache
    bytes_hashed: int  # bytes read for hashing
    files_with_secrets: int  # files whose rows carry secret positions
    # Wall milliseconds per phase, in order: setup, walk, sort, hash, encode, save_cache, digests.
    phases_ms: dict[str, float]
    # The manifest's distinct file digests, sorted, 32 bytes each.
    digests: bytes
    # How many references each digest has: a u32, little-endian, per digest.
    digest_counts: bytes
    # The manifest's fingerprint (BLAKE3 of its bytes), when the scan worked it
    # out (the previous manifest's when same_as_previous).
    fingerprint: bytes | None
    # The manifest is the one previous_length/previous_fingerprint name.
    same_as_previous: bool
    file_count: int  # file rows in the manifest
    file_bytes: int  # the sum of their sizes
    dirs_listed: int  # directories entered
    dirs_reused: int  # of which the stat cache gave the listing (not read again)
    # The previous manifest was kept on the stat cache's word (its manifest
    # witness), without encoding the rows to compare them.
    manifest_witnessed: bool
    # The policy's warnings, as PolicyMatcher.warnings.
    policy_warnings: list[tuple[str, str, str]]
    # "journal" when a journal ticket directed the scan, else "full"; why a scan
    # given a ticket scanned everything after all (None otherwise); entries
    # stat'ed plus directories listed.
    scan_mode: str
    fallback: str | None
    entries_examined: int
    # A journal scan's delta from ``parent`` (manifest_delta's encoding) and
    # the rows it inserts, when it wrote a new manifest; None otherwise.
    delta: tuple[bytes, int] | None

class ScanProgress:
    """Counts a running scan publishes; pass it as ``scan(progress=...)`` and
    read ``snapshot()`` from another thread while the scan runs."""

    def __init__(self) -> None: ...
    # (entries seen, files hashed, bytes hashed) so far: monotone, and equal
    # to the result's entries (plus unsupported ones), files_hashed and
    # bytes_hashed once the scan returns.
    def snapshot(self) -> tuple[int, int, int]: ...

# The path segments a policy leaves out by default: a name, or a prefix when
# it ends in "*" (rust/src/policy/mod.rs, docs/contract.md#capture).
DEFAULT_EXCLUDES: tuple[str, ...]
# Secrets shorter than this are refused: they would zero too much by accident.
MIN_SECRET_LEN: int
# Characters per row of ``decimal_rows``'s columns: four 10-digit integers and
# the codec's digit.
DECIMAL_ROW_CHARS: int

class PolicyMatcher:
    """The declarative policy of docs/contract.md#capture, compiled once (gitignore dialect)."""

    def __init__(
        self, exclude: Sequence[str], include: Sequence[str], default_excludes: bool
    ) -> None: ...
    # (list, pattern, reason) for each line git accepts but that never matches
    # ("/", "a//b", "[abc", ...) or holds a reversed range; list is "exclude" or
    # "include". Such lines match as in git (usually nothing) instead of raising.
    @property
    def warnings(self) -> list[tuple[str, str, str]]: ...
    # True when a path (workspace-relative, '/'-separated) is selected by the
    # policy: not excluded (by itself or any ancestor directory) and, for files,
    # included. ``is_dir`` selects the directory-only pattern rules.
    def selects(self, path: str, is_dir: bool) -> bool: ...
    # True when the path or one of its ancestors is excluded. Top-level names
    # starting with ".checkpointd" are always excluded (restore staging, cache clock).
    def excluded(self, path: str, is_dir: bool) -> bool: ...
    # True when the include list takes the path: the deepest of the path and its
    # ancestors that the list decides on is decided positively (so "src/" takes
    # everything under src). Always True for an empty include list. With a
    # non-empty list, a scan records a directory only when this is True for it
    # or it holds a recorded entry.
    def included(self, path: str, is_dir: bool) -> bool: ...

def release_freed_memory() -> None:
    """Return freed heap to the system when more than a few dozen MB are free."""

def scan(
    root: str,
    *,
    exclude: Sequence[str] = (),
    include: Sequence[str] = (),
    default_excludes: bool = True,
    secrets: Sequence[bytes] = (),
    cache_path: str | None = None,
    threads: int = 0,
    cancel: CancelToken | None = None,
    feed: BlobFeed | None = None,
    root_fd: int | None = None,
    progress: ScanProgress | None = None,
    previous_length: int | None = None,
    previous_fingerprint: bytes | None = None,
    chunk_threshold: int | None = None,
    chunk_average: int = 65536,
    journal: JournalTicket | None = None,
    parent: bytes | None = None,
    parent_totals: tuple[int, int, int] | None = None,
    parent_digests: tuple[bytes, bytes] | None = None,
) -> ScanResult:
    """Walk ``root`` (never following symlinks) and build its manifest.

    ``journal`` (with ``parent``, the manifest its changes are relative to,
    and that manifest's (entries, files, file bytes)): only what the ticket
    names is examined and every other row is the parent's (``scan_mode``
    "journal"); when its changes cannot be applied consistently the scan is a
    full one and ``fallback`` says why. ``parent_digests`` (the parent's
    ``digests`` and ``digest_counts``, when known) lets the new ones be worked
    out from the changes instead of read from the whole manifest.

    ``previous_length``/``previous_fingerprint`` (given together: the parent
    checkpoint's manifest length in bytes and its BLAKE3 hash): when the bytes
    of the scan's manifest have that length and hash, nothing is allocated,
    ``ScanResult.same_as_previous`` is True and ``manifest`` and ``digests``
    are empty (they are the previous manifest's). The manifest is hashed in
    small pieces as it is encoded, so the previous one is never needed.

    Top-level names starting with ``.checkpointd`` are never captured. With
    ``cache_path``, loads the stat cache from there (a missing or corrupt file is
    an empty cache) and saves the updated cache atomically (only when something
    changed). A cached hash is reused only when (dev, ino, size, mtime_ns,
    ctime_ns, mode) and the secret set are unchanged and the file's mtime is
    before the cache's reference time (git's racy-clean rule; the time is read
    from the cache directory's filesystem before the walk). A directory is not
    read again when its (dev, ino, mtime_ns, ctime_ns) match the listing the
    cache recorded and its mtime is before that reference time (git's untracked
    cache); its entries are still lstat'ed. ``threads=0`` means
    one per core. The GIL is released; a Python signal handler that raises
    (Ctrl-C) cancels the scan and its exception propagates.

    Raises RootInvalidError when the root is not a directory or is a symlink,
    FileChangedError when a file kept changing while it was hashed, another
    OSError (NoSpaceError, NameTooLongError, PermissionDeniedError... or a plain
    one) when the root or an entry cannot be read, ValueError for a pattern that
    cannot be one gitignore line (a line break or NUL inside) or a secret
    shorter than 4 bytes, ScanCancelled on cancel.
    """

def hash_file(path: str) -> tuple[str, int]:
    """(64-hex BLAKE3 of the file's bytes, size), streaming in fixed memory."""

class VerifyingReader:
    """A file's zeroed bytes streamed for an upload and checked on the way:
    pread from an fd the scan opened beneath the root (handed over by
    ``BlobFeed.next_file``) or that ``open`` opens beneath ``root_fd``.

    The last chunk comes out only once the bytes hashed equal ``digest_hex`` at
    exactly ``size`` bytes and the fd's fstat (dev, ino, mode, size, mtime,
    ctime) is the one the file was hashed under, before the first read and after
    the last; otherwise FileChangedError (and nothing more is read). Every
    method releases the GIL; ``close`` waits for a read in another thread.
    """

    path: str
    size: int
    digest_hex: str
    # Verified bytes handed out so far, a native copy in another thread
    # included (progress reports poll it while ``BlobDir.put_verified`` runs).
    bytes_verified: int
    @staticmethod
    def open(
        root_fd: int, path: str, digest_hex: str, size: int, secrets: Sequence[bytes] = ()
    ) -> VerifyingReader:
        """Raises FileChangedError (gone, a symlink in any component, not a
        regular file, not ``size`` bytes), OSError."""
    @staticmethod
    def open_unhashed(root_fd: int, path: str, secrets: Sequence[bytes] = ()) -> VerifyingReader:
        """A reader of the file as it is now (for one that changed after the
        scan): its bytes are zeroed and hashed on the way and the digest is
        learned (``learned``), not checked; the fstat taken now must hold from
        the first read to past the last, at exactly its size (else
        FileChangedError, never a last chunk). ``digest_hex`` is meaningless.
        Raises FileChangedError (gone, a symlink in any component, not a
        regular file), OSError."""
    def learned(self) -> tuple[str, list[tuple[int, int, int]], int, int] | None:
        """Once every byte came out and passed the checks at the end: (64-hex
        digest of the zeroed bytes, secret spans, st_mode, mtime_ns of the fstat
        they were read under); None before."""
    def read_chunk(self) -> bytes | None: ...
    def read_all(self, cancel: CancelToken | None = None) -> bytes: ...
    def stop(self) -> None:
        """Make a read or copy in progress in another thread stop at its next
        chunk (it raises ScanCancelled); later reads raise it too."""
    def close(self) -> None: ...

# (dev, ino, st_mode, size, mtime_ns, ctime_ns) of an fstat.
Stamp = tuple[int, int, int, int, int, int]

# What ``rehash_beneath`` says of a file: (64-hex digest, size, secret spans,
# st_mode, mtime_ns, kept).
Rehashed = tuple[str, int, list[tuple[int, int, int]], int, int, tuple[bytes, Stamp] | None]

def rehash_beneath(
    root_fd: int,
    paths: Sequence[str],
    secrets: Sequence[bytes] = (),
    cancel: CancelToken | None = None,
    keep_small: bool = False,
    unread_above: int | None = None,
) -> list[Rehashed | OSError | None]:
    """Hash each of ``paths`` again, opened beneath ``root_fd`` (no symlink in
    any component; fstat equal before and after the read), all without the
    GIL: per path (64-hex digest, size, secret spans, st_mode, mtime_ns,
    kept); the digest is "" when it is no longer a regular file, and for a
    regular file larger than ``unread_above`` (not read then); None when it is
    gone. ``kept`` is (the zeroed bytes hashed, the fstat they were read
    under) when ``keep_small`` and the file is under 1 MiB (read whole in that
    same pass), else None. A path that could not be read is the error it
    raised: FileChangedError when it kept changing, OSError (ELOOP: now a
    symlink). Raises ScanCancelled."""

def open_beneath(root_fd: int, subdir: str, create: bool = False) -> int:
    """A new fd of the directory ``subdir`` beneath ``root_fd``, opened one
    component at a time without following links (``create``: a missing last
    component is made). OSError (its filename ``subdir``): ELOOP or ENOTDIR
    for a symlink or a file on the way, EXDEV for a "." or ".." segment,
    ENOENT for a missing component."""

def stat_beneath(root_fd: int, path: str) -> Stamp | None:
    """The fstat of ``path`` opened beneath ``root_fd`` (no symlink in any
    component), None when it is gone or no longer reachable that way."""

def remove_stale_staging(root: str | os.PathLike[str]) -> list[str]:
    """Remove the staging directories (``STAGING_PREFIX``) interrupted restores
    left at the top of ``root`` and nothing else: an entry named like one that
    is not a directory stays, never followed, and so does a running restore's
    (it holds its staging directory's ``flock``). Returns the names removed;
    raises OSError naming the path."""

def secrets_fingerprint(secrets: Sequence[bytes]) -> str:
    """A keyed hash of the secret set, stored in the stat cache (never the secrets)."""

class BlobDir:
    """The local blob directory of a ``file://`` store, batch by batch (fd-relative).

    Keys must be plain (letters, digits, ``._-`` segments). Every method releases
    the GIL and raises OSError (errno set, ``filename`` the blob's path).
    """

    def __init__(self, root: str) -> None: ...
    def missing(self, keys: Sequence[str]) -> list[int]:
        """Indexes into ``keys`` of the keys whose blob is not there."""
    def put_many(self, items: Sequence[tuple[str, bytes]]) -> list[bool]:
        """Write each blob unless its key exists (complete or not at all); per
        item whether it was written; one filesystem sync when any was."""
    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """Each key's bytes, None when it is missing."""
    def put_verified(
        self, key: str, reader: VerifyingReader, cancel: CancelToken | None = None
    ) -> bool:
        """Stream the reader's verified bytes into ``key`` unless it exists (an
        unnamed file, ``fdatasync``ed, then linked, then the directory synced:
        durable and complete when it returns True). Raises FileChangedError
        (the file is not what was scanned: nothing stored), ScanCancelled, OSError."""
    def put_learned(
        self,
        beside: str,
        reader: VerifyingReader,
        cancel: CancelToken | None = None,
        unless_beside: bool = False,
    ) -> tuple[str, bool]:
        """Stream an unhashed reader's bytes (``VerifyingReader.open_unhashed``)
        into the directory of the key ``beside``, named by the digest they had
        once all are written: (that key, whether written; False when it
        existed). With ``unless_beside``, when the blob ``beside`` exists
        nothing is read: ``(beside, False)``. Durable on return, as
        ``put_verified``; raises as it."""

# Packs (rust/src/pack.rs; the format is in blobs/packs.py): small blobs
# compressed one by one into one object. Digests are 64-hex strings.

PACK_FOOTER_LEN: int

class PackedBlobInvalid(ValueError):
    """A packed blob does not decode to its key; ``args`` = (64-hex digest, reason)."""

class PackInvalid(ValueError):
    """A pack's header, trailer or footer is damaged; ``args`` = (reason,)."""

class PackWriter:
    """A pack being built (thread-safe; every method releases the GIL)."""

    def __init__(self) -> None: ...
    def add_many(self, items: Sequence[tuple[str, bytes]]) -> list[tuple[int, int, int, int]]:
        """Compress (in parallel) and append ``(digest, raw bytes)`` items; per
        item ``(offset, stored_len, raw_len, codec)``."""
    @property
    def size(self) -> int:
        """Bytes of the pack if finished now."""
    @property
    def count(self) -> int: ...
    def extend_fed(
        self, batch: FedBatch, start: int, wanted: bytes, target: int, below: int
    ) -> tuple[int, int, int]:
        """Pack the blobs of ``batch`` (frames already made) from ``start`` on
        whose digest is in ``wanted`` (concatenated; each once) and whose raw
        size is below ``below``, until the pack reaches ``target`` bytes;
        ``(next, added, added_raw_bytes)``. GIL released."""
    def extend(self, items: Sequence[tuple[str, bytes]]) -> int:
        """``add_many`` without the per-item answer; the number of items added."""
    def finish(self) -> tuple[str, bytes]:
        """``(BLAKE3 hex of the pack, the pack object)``; the writer is spent."""
    def finish_with_rows(self) -> tuple[str, bytes, bytes, bytes, bytes, bytes, bytes]:
        """``finish`` and the pack's index rows as columns, one row per distinct
        digest in digest order: ``(hex, pack, digests, offsets, lengths,
        raw_sizes, codecs)``, the integer columns native-endian u32, the codecs
        one byte each."""

def decimal_rows(
    groups: Sequence[tuple[int, bytes, bytes, bytes, bytes, bytes]],
) -> tuple[bytes, bytes]:
    """Packs' index rows, each group ``(pack_id, digests, offsets, lengths,
    raw_sizes, codecs)``, merged into digest order (a digest's rows in group
    order): the digests concatenated, and per row the pack id, offset, length
    and raw size (native-endian u32s in) as 10 ASCII digits each, then the
    codec as one digit."""

class DigestSet:
    """32-byte digests kept natively."""

    def __init__(self) -> None: ...
    def take_new(self, digests: bytes) -> bytes:
        """Those of ``digests`` (concatenated) not in the set yet, each once,
        in order; they are in it from now on."""
    def without(self, digests: bytes) -> bytes:
        """Those of ``digests`` not in the set, each once, in order."""
    def __contains__(self, digest: bytes) -> bool: ...
    def __len__(self) -> int: ...

def digests_without(a: bytes, b: bytes) -> bytes:
    """The digests of ``a`` that ``b`` lacks (concatenated, unsorted), each once, in order."""

def sort_digests(digests: bytes) -> bytes:
    """The digests sorted, each once."""

def u32_bounds(column: bytes) -> tuple[int, int] | None:
    """(smallest, largest) of a column of native-endian u32s; None when empty."""

def digests_sorted_distinct(digests: bytes) -> bool:
    """Whether the concatenated 32-byte digests are in strictly rising order."""

def unpack_many(
    data: bytes, base: int, items: Sequence[tuple[str, int, int, int, int]]
) -> list[bytes]:
    """Raw bytes of each ``(digest, offset, stored_len, raw_len, codec)`` whose
    frame lies in ``data`` (the pack from offset ``base`` on), checked (size and
    BLAKE3); PackedBlobInvalid for the first that does not check."""

def plan_pack_reads(
    frames: Sequence[tuple[int, int, int]], merge_gap: int, max_range: int
) -> list[tuple[int, int, int, list[int]]]:
    """Frames ``(pack number, offset, stored_len)`` merged into ranged reads
    ``(pack number, start, end, indices of its frames)``: by pack (in the
    order of each pack's first frame), then offset; a frame joins the read
    before it when at most ``merge_gap`` bytes after it and the read stays
    within ``max_range`` bytes."""

def pack_trailer_len(footer: bytes) -> int:
    """The trailer length a pack's last PACK_FOOTER_LEN bytes announce; PackInvalid."""

def read_pack_trailer(tail: bytes, pack_len: int) -> list[tuple[str, int, int, int, int, int]]:
    """The blobs a pack lists, from its tail (trailer + footer at least):
    ``(digest, offset, stored_len, raw_len, codec, kind)``; PackInvalid."""

def verify_pack_file(
    fd: int, size: int, max_blob: int, max_total: int
) -> tuple[bytes, bytes, bytes, bytes, bytes]:
    """Check the whole pack in the ``size`` bytes of the file ``fd`` (read by
    offset, never whole): header, trailer, every entry's claimed size at most
    ``max_blob`` and their sum at most ``max_total`` before anything is
    decoded, every frame decoded streaming in a bounded window and its size and
    BLAKE3 compared (decoding stops past the entry's size). Returns
    ``(digests, offsets, lengths, raw_sizes, codecs)``: its index rows as
    ``PackWriter.finish_with_rows`` gives them. PackInvalid, PackedBlobInvalid."""

# The manifest as bytes (the codec's compact JSON rows). Digests are raw 32-byte
# BLAKE3 values, passed as one bytes object of concatenated, sorted, distinct
# digests. Each raises ValueError for bytes that are not the codec's encoding.

def manifest_totals(data: bytes) -> tuple[int, int, int]:
    """(entries, files, total file bytes)."""

def manifest_digests(data: bytes) -> bytes:
    """The distinct digests of the file rows, sorted and concatenated."""

def digest_difference(a: bytes, b: bytes) -> bytes:
    """The digests of ``a`` that are not in ``b`` (both sorted)."""

def manifest_files_with_digests(data: bytes, digests: bytes) -> list[tuple[str, bytes, int]]:
    """``(path, digest, size)`` of every file row whose digest is in ``digests``."""

def manifest_delta(base: bytes, new: bytes) -> tuple[bytes, int]:
    """The delta that builds ``new`` from ``base``, and how many rows it inserts."""

def manifest_new_files(
    data: bytes, known: bytes, fed: bytes
) -> tuple[bytes, list[tuple[str, bytes, int]]]:
    """What the manifest adds to ``known`` and ``fed`` (sorted flat digests),
    in one pass: its new digests (a file's, or a chunked file's chunks'),
    sorted and flat, and ``(path, digest, size)`` of each file stored whole
    whose digest is new."""

def manifest_delta_new_files(
    ops: bytes, known: bytes, fed: bytes
) -> tuple[bytes, list[tuple[str, bytes, int]]] | None:
    """``manifest_new_files`` of the manifest the delta ``ops`` makes from a
    base whose digests are all in ``known``: read from the rows the delta
    inserts alone (the rest are the base's). None when the delta patches
    rows (their bytes are not in it)."""

def manifest_delta_inserts_long_rows(ops: bytes) -> bool:
    """Whether the delta ``ops`` inserts a row long enough to store as a patch."""

def manifest_delta_compact(base: bytes, ops: bytes) -> tuple[bytes, int]:
    """The delta ``ops`` (against ``base``) with each long inserted row that
    replaces a base row of its path stored as a patch of that row, and how
    many rows it still inserts whole."""

def manifest_row(data: bytes, path: str) -> bytes | None:
    """The row of ``path`` in a manifest whose rows are in path order (as a
    scan writes them), found by bisecting the bytes; None when there is none
    where that order puts it."""

def manifest_apply(base: bytes, chain: list[bytes]) -> bytes:
    """The manifest a chain of deltas of ``manifest_delta`` builds on top of
    ``base``: each applied to what the one before built, the bytes copied once."""

# Top-level names reserved for a restore's staging (never captured, never deleted).
STAGING_PREFIX: str
# What the chunk cache's name adds to its stat cache's (the two go together).
CHUNK_CACHE_SUFFIX: str

class InvalidBlob(ValueError):
    """A blob is not what the checkpoint records; ``args`` = (64-hex digest, reason)."""

class TargetRefused(ValueError):
    """A target path refused before any change; ``args`` = (code, path, message),
    code "invalid-path" (a top-level ``.checkpointd*`` name) or "name-too-long"."""

class RestoreSession:
    """One restore, planned and applied natively (see ``rust/src/restore/``).

    The constructor opens ``root`` (the operator's path) and ``subdir`` beneath it
    one component at a time with O_NOFOLLOW (a missing last one is created), scans
    it live with the policy and the stat cache (GIL released), plans against
    ``target`` (a manifest in ``checkpointd.codec``'s encoding) and makes a private
    staging directory at the top of the restore root (first removing what an
    interrupted restore left). Nothing else changes until ``apply_some``. Always
    call ``close`` (it removes the staging directory). With ``plan_only`` (a dry
    run, which holds no lease) it only plans: no staging directory, no leftover
    removed, nothing in the workspace touched; only the plan's properties work.

    Raises OSError (naming the path; for the sub-root, ``filename`` is ``subdir``),
    ValueError (bad pattern or manifest), TargetRefused, InvalidBlob (one blob
    given two sizes), ScanCancelled.
    """

    def __init__(
        self,
        root: str,
        target: bytes,
        *,
        subdir: str = "",
        exclude: Sequence[str] = (),
        include: Sequence[str] = (),
        default_excludes: bool = True,
        cache_path: str | None = None,
        cancel: CancelToken | None = None,
        secrets: Sequence[bytes] = (),
        secret_names: Sequence[str] | None = None,
        plan_only: bool = False,
        chunk_threshold: int | None = None,
        chunk_average: int = 65536,
        keep_live: bool = False,
    ) -> None: ...
    # ``secrets`` are zeroed in the live scan (a file still holding them equals
    # its zeroed blob), and ``fill_secrets`` writes them back (``secret_names``:
    # their names, when the caller gave a mapping). A file equal to the
    # checkpoint but for its secret spans is never rewritten; ``keep_live``
    # keeps the live scan's tree for ``take_live``.
    def take_live(self) -> tuple[bytes, int, int, int, int] | None:
        """The live tree the scan saw (``keep_live``), once: its manifest rows,
        entries, files, file bytes and files with secrets zeroed. None after
        that, or without ``keep_live``."""
    # The distinct blobs to fetch: (64-hex digest, size), in first-use order.
    @property
    def blobs(self) -> list[tuple[str, int]]: ...
    @property
    def operations(self) -> int: ...
    # Files and symlinks apply writes, and the bytes of those files (its totals).
    @property
    def files_to_write(self) -> int: ...
    @property
    def bytes_to_write(self) -> int: ...
    # (files and symlinks, bytes) apply has written so far.
    @property
    def written(self) -> tuple[int, int]: ...
    # Planned changes per kind: deletions, dirs, writes, links, file_metadata, dir_modes.
    @property
    def counts(self) -> dict[str, int]: ...
    # Files and symlinks the restore writes, in path order.
    @property
    def written_paths(self) -> list[str]: ...
    # Paths the restore deletes, deepest first (non-UTF-8 names lossily decoded).
    @property
    def deleted_paths(self) -> list[str]: ...
    def stage_many(self, items: Sequence[tuple[str, bytes]]) -> None:
        """Verify (size, BLAKE3) then stage each (digest, bytes); InvalidBlob."""
    def needed(self, max_size: int) -> tuple[bytes, list[tuple[str, int]], int]:
        """The blobs to fetch: the digests of those of at most ``max_size``
        bytes concatenated (first-use order), the larger ones as (hex digest,
        size), and the bytes of all of them."""
    def plan_pack_reads(
        self,
        wanted: bytes,
        rows: Sequence[tuple[bytes, bytes, int, int, int, int]],
        merge_gap: int,
        max_range: int,
    ) -> tuple[list[tuple[int, bytes, int, int]], list[tuple[str, int]]]:
        """The pack reads that stage ``wanted`` (concatenated digests) from
        their index rows ``(digest, pack digest, offset, stored_len, raw_len,
        codec)``: ``(read id, pack digest, start, end)`` each (frames at most
        ``merge_gap`` apart merged, at most ``max_range`` bytes a read), and
        the wanted blobs no row places, as (hex digest, size)."""
    def read_frames(self, read: int) -> list[tuple[bytes, int, int, int, int]]:
        """A planned read's frames, ``(digest, offset, stored_len, raw_len,
        codec)`` by offset."""
    def stage_ranges(self, reads: Sequence[tuple[int, bytes]]) -> tuple[int, int]:
        """Stage whole planned reads of one pack: each (read id, the bytes from
        the read's start on); (blobs, bytes) staged. Raises InvalidBlob (a
        frame that does not decode to its key, or is not held whole: a
        truncated pack)."""
    def begin_range(self, read: int) -> None:
        """Start staging a planned read as its bytes arrive."""
    def feed_range(self, handle: int, chunk: bytes) -> tuple[int, int]:
        """The read's next bytes: frames completed by them are decoded, verified
        and staged; (blobs, bytes) staged. Raises InvalidBlob."""
    def stage_range_from(
        self, handle: int, fd: int, span: tuple[int, int], piece: int
    ) -> tuple[int, int]:
        """A whole planned read from ``fd`` (a pack file), ``span`` (start,
        end) read ``piece`` bytes at a time and staged natively; (blobs, bytes)
        staged. Raises OSError, InvalidBlob."""
    def end_range(self, handle: int, discard: bool = False) -> None:
        """The read ended: InvalidBlob for a frame it did not hold whole."""
    def begin_blob(self, digest: str, size: int) -> None:
        """Start streaming a large blob into staging."""
    def write_blob(self, digest: str, chunk: bytes) -> None:
        """Append a chunk (InvalidBlob once longer than recorded)."""
    def end_blob(self, digest: str) -> None:
        """Check the streamed blob's size and hash (InvalidBlob)."""
    def apply_some(self, budget: int) -> int:
        """Apply up to ``budget`` operations of the current step; returns how many
        (files moved in with a new directory count too)."""
    # True once apply has nothing left to do.
    @property
    def done(self) -> bool: ...
    def finish(self) -> None:
        """syncfs of the workspace's filesystem, then record in the stat cache the
        stat of each inode the restore renamed in."""
    def fill_secrets(self) -> list[str]:
        """After ``finish``: write each given secret where capture zeroed it and
        its restored file holds something else (zeros), its mtime put back and
        synced; only into a regular, single-link file of the recorded size on
        the restore root's mount, opened beneath it without following a
        symlink. Returns the paths (relative to the restore root, sorted) left
        with zeros where a secret was."""
    # Paths left alone because they lie on another filesystem (mount points).
    @property
    def skipped(self) -> list[str]: ...
    # Written files the stat cache learns at ``finish``.
    @property
    def recorded(self) -> int: ...
    def close(self) -> None: ...

class FedBatch:
    """One feed batch, kept native: per small file its digest and its zeroed
    bytes in their pack frame (compressed by the scan thread that read them);
    ``items`` decodes them back to ``(digest, zeroed bytes)``."""

    @property
    def digests(self) -> bytes:
        """The digests concatenated (32 bytes each), in the batch's order."""
    def __len__(self) -> int: ...
    def items(self) -> list[tuple[bytes, bytes]]: ...

class BlobFeed:
    """Zeroed bytes of the small files a scan hashes, for the upload (read once).

    Pass it to ``scan(feed=...)``; consume with ``next_batch`` from another
    thread while the scan runs. Files larger than ``max_file_bytes``, digests in
    ``skip`` (sorted, distinct 32-byte digests laid end to end, such as
    ``Manifest.digests()``: searched in place, never copied) and digests
    already fed are not fed. At most ``capacity_bytes`` (stored, i.e. compressed, bytes) wait in
    the queue: the scan waits beyond.

    A file too large to copy (at least 1 MiB) is handed over as the open file
    the scan hashed (``next_file``); at most ``max_held_files`` such files are
    queued or not yet closed by the consumer at once: the scan waits beyond.
    """

    held_files: int  # files handed over and not closed yet
    def __init__(
        self,
        capacity_bytes: int,
        max_file_bytes: int,
        skip: bytes | None = None,
        max_held_files: int = 16,
    ) -> None: ...
    def next_fed(self) -> FedBatch | None:
        """``next_batch`` kept native (blocks, GIL released)."""
    def next_batch(self) -> list[tuple[bytes, bytes]] | None:
        """The next ``(digest, bytes)`` batch, blocking (GIL released); None at the end."""
    def next_file(self) -> VerifyingReader | None:
        """The next file handed over, blocking (GIL released); None at the end.
        Close it when done: that gives its place back to the scan."""
    def abandon(self) -> None:
        """Stop consuming: queued bytes are freed, the scan never waits again."""

class JournalTicket:
    """What a capture took from a ``Journal``: give it back once, with
    ``Journal.commit`` (stored) or ``Journal.abort`` (failed)."""

    # Why the capture must scan everything (None: the journal may direct it).
    full: str | None
    generation: int  # events recorded when it was taken
    changes: int  # names and directories it holds (0: nothing changed)
    def directories(
        self,
    ) -> list[tuple[str, list[bytes] | None, list[bytes], bool]]:
        """What it holds: (directory, names or None when listed whole, names
        walked whole, every subdirectory walked whole), in path order."""

class Journal:
    """The change journal of a workspace (docs/design.md, "The change journal").

    ``mode``: "auto", "fanotify", "inotify" or "off"; a mode that cannot be had
    is "off" and ``status()["detail"]`` says why. The policy's excluded
    directories are not watched. The limits bound its memory (names per
    directory, directories, bytes of names, hard-linked files). Owns a thread;
    a forked child cannot use it (RuntimeError). Raises ValueError for a bad
    mode or pattern, OSError when the root cannot be opened.
    """

    def __init__(
        self,
        root: str,
        mode: str = "auto",
        *,
        exclude: Sequence[str] = (),
        include: Sequence[str] = (),
        default_excludes: bool = True,
        names_per_dir: int | None = None,
        dirs: int | None = None,
        bytes: int | None = None,
        linked_files: int | None = None,
    ) -> None: ...
    def take(self) -> JournalTicket:
        """What changed since the last take (the kernel's queue drained first)."""
    def commit(self, ticket: JournalTicket) -> None:
        """The capture that took ``ticket`` is stored (a full scan taken while the
        journal watched everything, with no trust lost since, makes it trusted)."""
    def abort(self, ticket: JournalTicket) -> None:
        """The capture that took ``ticket`` failed: its changes are given back."""
    def distrust(self, reason: str, *, find_links: bool = False) -> None:
        """The next capture scans everything, for ``reason``; ``find_links``: a
        file with other names the journal does not know was found (it walks the
        tree for them before it is trusted again)."""
    def covers(self, path: str) -> bool:
        """Whether a change at ``path`` would be examined by the next capture."""
    def status(self) -> dict[str, object]:
        """mode, detail, untrusted (why the next capture scans everything, or
        None), generation, pending, idle_ms, pending_ms, events, overflows,
        watches, linked_files, ready (the whole tree is watched)."""
    def close(self) -> None:
        """Stop watching (idempotent)."""

def journal_differences(base: bytes, now: bytes, limit: int) -> list[str]:
    """The paths whose rows differ between two manifests (a file row that
    recorded secrets compared on size, mode and mtime), at most ``limit``.
    Raises ValueError for a malformed manifest."""

def manifest_chunk_reads(
    data: bytes, wanted: bytes
) -> list[tuple[str, list[tuple[int, int, bytes]]]]:
    """Per file stored as chunks in the manifest ``data`` that uses some of the
    ``wanted`` digests (concatenated, 32 bytes each): its path and those
    chunks as (offset, length, digest), in file order. ValueError for bytes
    that are not a manifest."""

def read_chunks_beneath(
    root_fd: int,
    path: str,
    reads: Sequence[tuple[int, int, bytes]],
    secrets: Sequence[bytes] | None = None,
) -> list[bytes]:
    """The zeroed bytes of each (offset, length, digest) chunk of the file at
    ``path`` beneath ``root_fd`` (no symlink followed), each checked against
    its digest. FileChangedError when the file is gone or no longer holds one."""
