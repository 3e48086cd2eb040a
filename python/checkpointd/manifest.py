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
construction: the scan refuses every path SPEC §2 forbids) or from a store that
validated them on append; stores skip the per-entry validation for trusted
manifests. Entries given by a caller as a tuple are validated as before.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, overload

from . import _native

if TYPE_CHECKING:
    from .model import Entry

_DIGEST = 32
_decode_lock = threading.Lock()


class Manifest(Sequence["Entry"]):
    """An immutable, lazily decoded sequence of entries over the codec's bytes."""

    __slots__ = ("_data", "_decoded", "_digests", "_len", "_totals", "_trusted")

    def __init__(
        self,
        data: bytes,
        *,
        length: int | None = None,
        trusted: bool = False,
        digests: bytes | None = None,
        totals: tuple[int, int, int] | None = None,
    ) -> None:
        """``digests`` and ``totals``: what :meth:`digests` and :meth:`totals`
        return, when the maker of ``data`` already knows them (the scan does);
        only for bytes that same code made."""
        self._data = bytes(data)
        self._len = length
        self._decoded: tuple[Entry, ...] | None = None
        self._trusted = trusted
        self._digests = digests
        self._totals = totals

    @classmethod
    def of(cls, entries: Iterable[Entry]) -> Manifest:
        """The manifest of caller-given entries (encoded in Python; not trusted)."""
        if isinstance(entries, Manifest):
            return entries
        from .codec import encode_entries

        decoded = tuple(entries)
        manifest = cls(encode_entries(decoded), length=len(decoded))
        manifest._decoded = decoded
        return manifest

    # ------------------------------------------------------------ bytes side

    @property
    def data(self) -> bytes:
        """The codec's JSON rows."""
        return self._data

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
            digests = self._digests = _native.manifest_digests(self._data)
        return digests

    def totals(self) -> tuple[int, int, int]:
        """(entries, files, total file bytes), without decoding (computed once)."""
        totals = self._totals
        if totals is None:
            totals = self._totals = _native.manifest_totals(self._data)
        return totals

    # ------------------------------------------------------------ sequence side

    def entries(self) -> tuple[Entry, ...]:
        """The decoded entries (decoded once, then shared: they are frozen)."""
        decoded = self._decoded
        if decoded is None:
            from .codec import decode_entries

            with _decode_lock:
                if self._decoded is None:
                    self._decoded = decode_entries(self._data)
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
        return len(self._data) > 2  # "[]" is the empty manifest

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Manifest):
            # The encoding is canonical: equal entries give equal bytes.
            return self._data == other._data
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
        return (_rebuild, (self._data, self._len, self._trusted))


def _rebuild(data: bytes, length: int | None, trusted: bool) -> Manifest:
    return Manifest(data, length=length, trusted=trusted)


def manifest_of(entries: Sequence[Entry]) -> Manifest:
    """``entries`` as a Manifest (itself when it already is one)."""
    return entries if isinstance(entries, Manifest) else Manifest.of(entries)


def split_digests(digests: bytes) -> list[bytes]:
    """Concatenated 32-byte digests as a list."""
    return [digests[i : i + _DIGEST] for i in range(0, len(digests), _DIGEST)]


__all__ = ["Manifest", "manifest_of", "split_digests"]
