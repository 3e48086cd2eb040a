"""Large files stored as content-defined chunks (see docs/chunks.md).

A file above the chunking threshold (1 MiB by default) is cut by FastCDC
where its (secret-zeroed) bytes say, into chunks of 64 KiB on average; each
chunk is a blob keyed by its BLAKE3 (``sandbox-files/blake3/<hex>``), packed
like any small blob. The file's manifest row keeps the whole file's BLAKE3 and
lists its chunks in one string: ``<64 hex digest><decimal length>`` items
joined by ``,`` (the native scanner writes it, ``rust/src/chunk.rs``).

The chunks of a file count as its blob keys wherever keys are counted
(``Manifest.digests``: reference counts, pins, sweep, check), and a restore
builds the file from them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from .errors import SandboxCheckpointInvalidArgumentError
from .model import FILE_KEY_PREFIX

# Files of more bytes than this are chunked (``serve --chunk-threshold``).
DEFAULT_THRESHOLD = 1 << 20
# Chunks average this many bytes (a quarter to four times as many each).
DEFAULT_AVERAGE = 64 << 10
# The smallest threshold accepted (smaller files are cheaper whole).
MIN_THRESHOLD = 64 << 10
MIN_AVERAGE = 1 << 10
MAX_AVERAGE = 4 << 20

_ITEM = re.compile(r"([0-9a-f]{64})([1-9][0-9]{0,9})")


@dataclass(frozen=True, slots=True)
class Chunk:
    """One chunk of a file: its blob key, where it starts and its length."""

    key: str
    offset: int
    length: int


@dataclass(frozen=True, slots=True)
class ChunkSettings:
    """Which files are chunked and how large their chunks are on average."""

    threshold: int = DEFAULT_THRESHOLD
    average: int = DEFAULT_AVERAGE

    def problem(self) -> str | None:
        """Why these settings cannot be used (naming the setting), or None."""
        if not isinstance(self.threshold, int) or self.threshold < MIN_THRESHOLD:
            return f"chunk_threshold must be an integer of at least {MIN_THRESHOLD} bytes"
        average = self.average
        if (
            not isinstance(average, int)
            or average & (average - 1)
            or not MIN_AVERAGE <= average <= MAX_AVERAGE
        ):
            return f"chunk_average must be a power of two from {MIN_AVERAGE} to {MAX_AVERAGE} bytes"
        return None


# The settings every capture and restore of this process uses (``configure``).
_current: ChunkSettings | None = ChunkSettings()


def configure(settings: ChunkSettings | None) -> None:
    """Chunk files by ``settings`` from now on in this process (None: store
    every file whole; existing chunked files still restore). A daemon calls
    this once with its settings. SandboxCheckpointInvalidArgumentError names
    a bad setting."""
    global _current
    problem = settings.problem() if settings is not None else None
    if problem is not None:
        raise SandboxCheckpointInvalidArgumentError(problem)
    _current = settings


def current() -> ChunkSettings | None:
    """The settings ``configure`` gave (the defaults until then)."""
    return _current


def native_args() -> tuple[int | None, int]:
    """The native scan's and restore session's ``chunk_threshold`` (None: no
    chunking) and ``chunk_average`` for the current settings."""
    settings = _current
    if settings is None:
        return None, DEFAULT_AVERAGE
    return settings.threshold, settings.average


def iter_chunks(text: str) -> Iterator[Chunk]:
    """The chunks a manifest row's chunk list names, in file order.
    ValueError when the text is not a chunk list."""
    offset = 0
    for item in text.split(","):
        found = _ITEM.fullmatch(item)
        if found is None:
            raise ValueError(f"malformed chunk list item {item[:80]!r}")
        length = int(found.group(2))
        yield Chunk(FILE_KEY_PREFIX + found.group(1), offset, length)
        offset += length


def chunk_count(text: str) -> int:
    """How many chunks a chunk list names (0 for a file stored whole)."""
    return text.count(",") + 1 if text else 0


def chunks_problem(text: object, size: int) -> str | None:
    """Why ``text`` is not the chunk list of a file of ``size`` bytes, or None."""
    if not isinstance(text, str):
        return "chunks must be a string"
    if not text:
        return None
    try:
        total = sum(chunk.length for chunk in iter_chunks(text))
    except ValueError as error:
        return str(error)
    if total != size:
        return f"chunk lengths add up to {total} bytes, not the file's {size}"
    return None


__all__ = [
    "DEFAULT_AVERAGE",
    "DEFAULT_THRESHOLD",
    "Chunk",
    "ChunkSettings",
    "chunk_count",
    "chunks_problem",
    "configure",
    "current",
    "iter_chunks",
    "native_args",
]
