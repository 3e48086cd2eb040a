"""``Manifest``: a checkpoint's entries kept as the codec's compact bytes.

A capture's manifest is made by the native scan in the stored encoding
(``checkpointd.codec``: one JSON array of rows) and stays those bytes through the
engine and the stores: the delta against the parent, the blob keys and the
counts are computed natively on the bytes (``checkpointd._native.manifest_*``).
``Checkpoint.files`` holds a ``Manifest``, an immutable sequence of entries that
decodes into ``FileEntry``/``DirEntry``/``SymlinkEntry`` objects only when
someone reads them, so users of the Python API see the same entries as before
(equal to the tuple of those entries, same hash) while a capture with no change
never builds one Python object per file.

A manifest is *trusted* when its bytes come from our own scan (valid by
construction: the scan refuses every path docs/contract.md#data-model forbids) or from a store that
validated them on append; stores skip the per-entry validation for trusted
manifests. Entries given by a caller as a tuple are validated as before.

A store may hand out a manifest it has not loaded (``Manifest.stored``): its
``ManifestSummary`` (length in bytes, BLAKE3 fingerprint, entry and file
totals) is known, its bytes are decompressed on first use. A no-change capture
compares the scan's fingerprint with its parent's and appends the parent's
manifest object again, so at a million files neither the capture nor the
store ever holds the ~180 MB of a parent's manifest bytes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, overload

import blake3

from . import _native
from .codec import decode_entries, encode_entries

if TYPE_CHECKING:
    from .model import Entry

_DIGEST = 32
_decode_lock = threading.Lock()
# Re-entrant: loading a delta's manifest loads its base's first.
_load_lock = threading.RLock()


def fingerprint_of(data: bytes) -> bytes:
    """The fingerprint of manifest bytes: their BLAKE3 hash (32 bytes), on
    every core and without the GIL (the scan computes the same, natively)."""
    return blake3.blake3(data, max_threads=blake3.blake3.AUTO).digest()


@dataclass(frozen=True, slots=True)
class ManifestSummary:
    """What a store keeps beside a manifest so it can name it unloaded: its
    length in bytes, its fingerprint (BLAKE3 of the bytes) and its totals."""

    byte_length: int
    fingerprint: bytes
    entries: int
    files: int
    file_bytes: int

    def to_json(self) -> list[Any]:
        """``[byte_length, fingerprint hex, entries, files, file_bytes]`` (a list:
        it is stored in every row, keys would cost more than the values)."""
        return [self.byte_length, self.fingerprint.hex(), self.entries, self.files, self.file_bytes]

    @classmethod
    def from_json(cls, value: Any) -> ManifestSummary | None:
        """The summary a store wrote (None for anything else: the manifest's
        summary is then computed from its bytes when needed)."""
        try:
            byte_length, fingerprint, entries, files, file_bytes = value
            summary = cls(
                int(byte_length),
                bytes.fromhex(fingerprint),
                int(entries),
                int(files),
                int(file_bytes),
            )
        except (TypeError, ValueError):
            return None
        return summary if len(summary.fingerprint) == _DIGEST else None


@dataclass(frozen=True, slots=True)
class Known:
    """What the maker of a manifest's bytes already computed from them: what
    :meth:`Manifest.digests`, :meth:`Manifest.totals` and
    :meth:`Manifest.fingerprint` would otherwise compute again."""

    digests: bytes | None = None
    totals: tuple[int, int, int] | None = None
    fingerprint: bytes | None = None


_NOTHING_KNOWN = Known()


class Manifest(Sequence["Entry"]):
    """An immutable, lazily decoded sequence of entries over the codec's bytes
    (loaded on first use too when a store made it with :meth:`stored`)."""

    __slots__ = (
        "_byte_length",
        "_data",
        "_decoded",
        "_delta",
        "_digests",
        "_fingerprint",
        "_held",
        "_len",
        "_load",
        "_source",
        "_totals",
        "_trusted",
    )

    def __init__(
        self,
        data: bytes,
        *,
        length: int | None = None,
        trusted: bool = False,
        known: Known | None = None,
        delta: tuple[ManifestSummary, bytes, int] | None = None,
    ) -> None:
        """``known``: what the maker of ``data`` already computed from it (the
        scan does); only for bytes that same code made. ``delta``: the manifest
        ``data`` is made from (its summary), the native delta from it and the
        rows it inserts (a scan the change journal directed knows them: see
        :meth:`delta_from`)."""
        known = known or _NOTHING_KNOWN
        self._data: bytes | None = bytes(data)
        self._load: Callable[[], bytes] | None = None
        self._source: object = None
        self._held = 0
        self._byte_length = len(self._data)
        self._fingerprint: bytes | None = known.fingerprint
        self._len = length
        self._decoded: tuple[Entry, ...] | None = None
        self._trusted = trusted
        self._digests = known.digests
        self._totals = known.totals
        self._delta = delta

    @classmethod
    def stored(
        cls,
        load: Callable[[], bytes],
        summary: ManifestSummary | None,
        held_bytes: int,
        source: object = None,
    ) -> Manifest:
        """A trusted manifest a store has not loaded: ``load()`` returns its bytes
        on first use (once; they must match ``summary``, else ValueError), and
        ``held_bytes`` is what ``load`` keeps meanwhile (its compressed row).
        Without a summary (rows written before summaries) every property is
        computed from the loaded bytes. ``source``: what the store made it
        from, for that store's own use (:meth:`stored_source`)."""
        manifest = cls.__new__(cls)
        manifest._data = None
        manifest._load = load
        manifest._source = source
        manifest._held = held_bytes
        manifest._decoded = None
        manifest._trusted = True
        manifest._digests = None
        manifest._delta = None
        if summary is None:
            manifest._byte_length = -1
            manifest._fingerprint = None
            manifest._len = None
            manifest._totals = None
        else:
            manifest._byte_length = summary.byte_length
            manifest._fingerprint = summary.fingerprint
            manifest._len = summary.entries
            manifest._totals = (summary.entries, summary.files, summary.file_bytes)
        return manifest

    @classmethod
    def of(cls, entries: Iterable[Entry]) -> Manifest:
        """The manifest of caller-given entries (encoded in Python; not trusted)."""
        if isinstance(entries, Manifest):
            return entries
        decoded = tuple(entries)
        manifest = cls(encode_entries(decoded), length=len(decoded))
        manifest._decoded = decoded
        return manifest

    # ------------------------------------------------------------ bytes side

    @property
    def data(self) -> bytes:
        """The codec's JSON rows (loaded now when the store has not yet)."""
        data = self._data
        if data is None:
            with _load_lock:
                if self._data is None:
                    self._data = self._loaded()
                data = self._data
        return data

    def _loaded(self) -> bytes:
        assert self._load is not None
        data = self._load()
        if self._byte_length >= 0 and (
            len(data) != self._byte_length or fingerprint_of(data) != self._fingerprint
        ):
            raise ValueError("a stored manifest's bytes do not match its summary")
        self._byte_length = len(data)
        self._load = self._source = None  # (and whatever they held: the compressed row)
        self._held = 0
        return data

    def stored_source(self) -> object:
        """The ``source`` a store gave :meth:`stored`, while unloaded (else None)."""
        return self._source if self._data is None else None

    @property
    def loaded(self) -> bool:
        """Whether the bytes are in memory (False for a store's unloaded manifest)."""
        return self._data is not None

    def held_bytes(self) -> int:
        """Bytes this manifest keeps in memory: its own, or its store's row until loaded."""
        return len(self._data) if self._data is not None else self._held

    def byte_length(self) -> int:
        """``len(data)``, without loading when the store's summary says it."""
        if self._byte_length < 0:
            self._summarize()
        return self._byte_length

    def fingerprint(self) -> bytes:
        """BLAKE3 of the bytes (32 bytes; computed once, or the store's summary)."""
        fingerprint = self._fingerprint
        if fingerprint is None:
            if self._data is None:
                self._summarize()
            else:
                self._fingerprint = fingerprint_of(self._data)
            fingerprint = self._fingerprint
            assert fingerprint is not None
        return fingerprint

    def known_length(self) -> int | None:
        """``len(self)`` when known without loading (None: a store's manifest
        whose row has no summary, not loaded yet)."""
        if self._len is None and (self._totals is not None or self._data is not None):
            return len(self)
        return self._len

    def _summarize(self) -> None:
        """Length, fingerprint and totals of a store's unloaded manifest whose
        row has no summary (written before summaries): from its bytes, loaded
        for this and let go again, so a no-change capture on such a parent
        does not keep them either (its append stores the summary)."""
        with _load_lock:
            if self._data is not None or self._load is None:
                data = self.data
            else:
                data = self._load()  # kept unloaded: only the summary is kept
            if self._totals is None:
                self._totals = _native.manifest_totals(data)
            self._fingerprint = fingerprint_of(data)
            self._byte_length = len(data)
            del data

    def known_summary(self) -> ManifestSummary | None:
        """The summary when it is known without loading anything, else None."""
        if self._byte_length < 0 or self._fingerprint is None or self._totals is None:
            return None
        return self.summary()

    def summary(self) -> ManifestSummary:
        """What a store keeps beside the bytes (see ``ManifestSummary``)."""
        entries, files, file_bytes = self.totals()
        return ManifestSummary(self.byte_length(), self.fingerprint(), entries, files, file_bytes)

    def same_bytes(self, other: Manifest) -> bool:
        """Whether the two hold the same bytes: by identity, else by length and
        fingerprint (neither is loaded when their store's summaries say both)."""
        return self is other or (
            self.byte_length() == other.byte_length() and self.fingerprint() == other.fingerprint()
        )

    @property
    def trusted(self) -> bool:
        """True when the bytes need no per-entry validation (see the module docstring)."""
        return self._trusted

    def digests(self) -> bytes:
        """The distinct content digests of the file entries (sorted, 32 bytes each).

        Computed once per manifest (the engine and the store each ask; at 100k
        files one computation is ~40 ms)."""
        digests = self._digests
        if digests is None:
            digests = self._digests = _native.manifest_digests(self.data)
        return digests

    def digests_leaving_unloaded(self) -> bytes:
        """:meth:`digests`, read from a store's unloaded manifest without
        keeping its bytes (as :meth:`_summarize` does): a capture that wants
        its parent's digests before the scan does not hold the parent too."""
        if self._digests is None:
            with _load_lock:
                if self._data is not None or self._load is None:
                    data = self.data
                else:
                    data = self._load()  # kept unloaded: only the digests are kept
                self._digests = _native.manifest_digests(data)
                del data
        return self._digests

    def delta_from(self, base: Manifest) -> tuple[bytes, int] | None:
        """The native delta (``_native.manifest_delta``'s encoding) from
        ``base`` to this manifest and the rows it inserts, when this
        manifest's maker knew it for that very base (same length and
        fingerprint); None otherwise."""
        if self._delta is None:
            return None
        made_from, ops, added = self._delta
        if (base.byte_length(), base.fingerprint()) != (
            made_from.byte_length,
            made_from.fingerprint,
        ):
            return None
        return ops, added

    def learn_digests(self, digests: bytes) -> None:
        """Record :meth:`digests`, worked out by whoever made these very bytes
        (the caller has matched them by length and fingerprint)."""
        if self._digests is None:
            self._digests = digests

    def known_digests(self) -> bytes | None:
        """:meth:`digests` when known already (given, or computed once), else None."""
        return self._digests

    def totals(self) -> tuple[int, int, int]:
        """(entries, files, total file bytes), without decoding (computed once)."""
        totals = self._totals
        if totals is None:
            if self._data is None:
                self._summarize()
            else:
                self._totals = _native.manifest_totals(self._data)
            totals = self._totals
            assert totals is not None
        return totals

    # ------------------------------------------------------------ sequence side

    def entries(self) -> tuple[Entry, ...]:
        """The decoded entries (decoded once, then shared: they are frozen)."""
        decoded = self._decoded
        if decoded is None:
            with _decode_lock:
                if self._decoded is None:
                    self._decoded = decode_entries(self.data)
                decoded = self._decoded
        return decoded

    def __len__(self) -> int:
        if self._len is None:
            self._len = self.totals()[0]
        return self._len

    @overload
    def __getitem__(self, index: int) -> Entry: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[Entry, ...]: ...
    def __getitem__(self, index: int | slice) -> Entry | tuple[Entry, ...]:
        return self.entries()[index]

    def __iter__(self) -> Iterator[Entry]:
        return iter(self.entries())

    def __reversed__(self) -> Iterator[Entry]:
        return reversed(self.entries())

    def __contains__(self, value: object) -> bool:
        return value in self.entries()

    def __bool__(self) -> bool:
        return self.byte_length() > 2  # "[]" is the empty manifest

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Manifest):
            # The encoding is canonical: equal entries give equal bytes.
            return self.same_bytes(other)
        if isinstance(other, tuple):
            return self.entries() == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.entries())

    def __add__(self, other: Any) -> tuple[Entry, ...]:
        return self.entries() + tuple(other)

    def __radd__(self, other: Any) -> tuple[Entry, ...]:
        return tuple(other) + self.entries()

    def __repr__(self) -> str:
        return repr(self.entries())

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self.data, self._len, self._trusted))


def _rebuild(data: bytes, length: int | None, trusted: bool) -> Manifest:
    return Manifest(data, length=length, trusted=trusted)


def manifest_of(entries: Sequence[Entry]) -> Manifest:
    """``entries`` as a Manifest (itself when it already is one)."""
    return entries if isinstance(entries, Manifest) else Manifest.of(entries)


def split_digests(digests: bytes) -> list[bytes]:
    """Concatenated 32-byte digests as a list."""
    return [digests[i : i + _DIGEST] for i in range(0, len(digests), _DIGEST)]


# What a manifest adds to a set of known digests (``_native.manifest_new_files``):
# its new digests, sorted and flat, and the files stored whole among them as
# ``(path, digest, size)``.
NewFiles = tuple[bytes, list[tuple[str, bytes, int]]]


def only_whole_files(new: NewFiles) -> bool:
    """Whether every new digest is a file stored whole's (none is a chunk's)."""
    digests, files = new
    return len({digest for _path, digest, _size in files}) * _DIGEST == len(digests)


__all__ = [
    "Manifest",
    "ManifestSummary",
    "NewFiles",
    "fingerprint_of",
    "manifest_of",
    "only_whole_files",
    "split_digests",
]
