"""How the PostgreSQL store keeps a checkpoint's document: whole, or as a delta.

Consecutive checkpoints of a thread usually share almost every manifest entry and
the whole conversation but its last messages. Storing each one whole would cost
the full compressed manifest per checkpoint (≈ 470 kB for 10,000 entries), so a
checkpoint is stored as one of:

* a **keyframe**: the ``checkpointd.codec`` document and the manifest bytes;
* a **delta** against its parent: the document with ``conversation`` replaced by
  copy/insert operations on the parent's list (``[start, count]`` copies a run
  of the parent's items, ``{"add": [...]}`` inserts items), and the manifest as
  the native delta against the parent's manifest (``checkpointd._native``
  ``manifest_delta``: copy runs of the parent's rows and inserted rows, computed
  on the bytes, so no Python object per entry is made). A capture that changed
  nothing stores a delta of one copy run: its cost does not grow with the
  number of entries.

Stored bytes (``CKD4``): ``b"CKD4"``, the compressed document's length (4
bytes, little endian), the BLAKE3 (32 bytes) of every other byte of the row,
zlib of the document JSON (without ``files``), then zlib of the manifest
section: two streams, so a reader inflates the document alone and a keyframe's
manifest straight into one buffer of its size (written by ISA-L's deflate,
``ZLIB_LEVEL``; any zlib reads them). The checksum is checked whenever a row is
read (``materialize``, ~4 GB/s), before anything is inflated, so bit rot in the
store is found at once, even in a manifest section that is inflated later or
never: a row that fails it, or does not decode, raises
``SandboxCheckpointDamagedError`` (DATA_LOSS) naming the checkpoint, and so does
every delta stored against it. Rows written before checksums are still read:
``CKD3`` (the same without the checksum), zlib of ``b"CKD2"``, the JSON length,
the JSON and the section, and before that zlib of the whole JSON document, with
``files`` rows or row operations. Their zlib streams carry an Adler-32 each, so
damage there is found when the stream is inflated, and reported the same way.

The document JSON also carries the checkpoint's ``ManifestSummary`` under
``"manifest"`` (length in bytes, BLAKE3 fingerprint, totals), so every store
keeps it with the row (no column or migration of its own) and a reader names
a manifest without decompressing it: ``materialize`` reads a keyframe's header
and document only and gives a ``Manifest.stored`` whose bytes are inflated on
first use, and a delta's manifest is applied to its base's on first use too.
A no-change append compares fingerprints (``Manifest.same_bytes``), never
bytes. Rows written before summaries compute theirs from the bytes when asked
(once per loaded manifest).

Still one document (one row) per checkpoint, never a row per file. A delta is
used only while it is small (at most ``MAX_DELTA_RATIO`` of its items new) and the
chain of deltas down to a keyframe is short (``MAX_DEPTH``), which bounds the
cost of reading any checkpoint. Deleting a checkpoint rewrites the checkpoints
based on it as keyframes first (see ``PostgresCheckpointStore``), so every base a
delta names exists, in the same thread.

Everything here is pure: bytes and dicts in, bytes and dicts out.
"""

from __future__ import annotations

import functools
import json
import struct
import zlib
from collections import Counter
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any

import blake3
from isal import isal_zlib

from .. import _native

# The codec's own row encoders, so a stored document is exactly the codec's format.
from ..codec import checkpoint_fields, checkpoint_from_document
from ..errors import SandboxCheckpointDamagedError
from ..manifest import Manifest, ManifestSummary, manifest_of, split_digests
from ..model import Checkpoint

# Reading a checkpoint applies at most MAX_DEPTH deltas to a keyframe; each costs
# about a list copy, so 32 keeps a read within a few keyframe decodes.
MAX_DEPTH = 32
# A delta whose lists are more than this share new items is not worth its read
# cost: store a keyframe instead.
MAX_DELTA_RATIO = 0.5
# Level 1 of ISA-L's deflate (``isal_zlib``, levels 0-3), which writes the
# same zlib streams the stdlib reads: on a 100,000-entry manifest section (17
# MB) it takes 32 ms and 5.3 MB where zlib's level 1 takes 129 ms and 5.9 MB.
# That encoding runs beside a cold capture's index rows, on the append's
# critical path. Higher levels cost more for little: hashes are incompressible hex.
ZLIB_LEVEL = 1

_JSON = {"separators": (",", ":"), "ensure_ascii": False}


_MAGIC = b"CKD4"
_CKD3 = b"CKD3"  # the layout before checksums: read, never written
_CKD2 = b"CKD2"  # the layout before that: read, never written
_HEADER = struct.Struct("<4sI")  # CKD3: magic, compressed document length
# CKD4: magic, compressed document length, BLAKE3 of the magic, the length and
# everything after the checksum.
_SEALED_HEADER = struct.Struct("<4sI32s")
_SUM_AT = _HEADER.size
# What decoding a damaged row can raise (zlib.error, json's ValueError, a
# struct.error for a short header, a KeyError or TypeError for a document of
# the wrong shape).
_DECODE_ERRORS = (
    zlib.error,
    ValueError,
    struct.error,
    KeyError,
    TypeError,
    IndexError,
    AttributeError,
)


class Content:
    """One checkpoint as stored: the codec document without ``files`` (immutable
    by convention) and the manifest bytes, with the index a conversation delta
    against it needs, built on first use."""

    __slots__ = ("_conversation_index", "_digests", "document", "manifest")

    def __init__(self, document: dict[str, Any], manifest: Manifest) -> None:
        self.document = document
        self.manifest = manifest
        self._conversation_index: dict[Hashable, int] | None = None
        self._digests: bytes | None = None

    @classmethod
    def of(cls, checkpoint: Checkpoint) -> Content:
        """The content of a VALIDATED checkpoint (its manifest is trusted from
        here on), sharing nothing mutable with it: entries and artifacts are
        frozen, and the conversation (JSON values the caller may change later)
        is copied through JSON."""
        document = checkpoint_fields(checkpoint)
        document["conversation"] = json.loads(json.dumps(document["conversation"], **_JSON))  # type: ignore[arg-type]
        given = manifest_of(checkpoint.files)
        manifest = given if given.trusted else Manifest(given.data, length=len(given), trusted=True)
        return cls(document, manifest)

    def checkpoint(self) -> Checkpoint:
        """A fresh Checkpoint (new objects on every call, but for the immutable
        manifest): only the conversation, the one part holding mutable JSON
        values, is copied through JSON."""
        document = dict(self.document)
        document["conversation"] = json.loads(json.dumps(document["conversation"], **_JSON))  # type: ignore[arg-type]
        return checkpoint_from_document(document, files=self.manifest)

    def entry_count(self) -> int:
        return len(self.manifest)

    def digests(self) -> bytes:
        """The manifest's distinct file digests, sorted and concatenated (computed
        natively once per content: appends diff them against the parent's)."""
        if self._digests is None:
            self._digests = self.manifest.digests()
        return self._digests

    def blob_keys(self) -> set[bytes]:
        """Distinct blob keys in the store's 33-byte form (kind byte + raw hash)."""
        keys = {b"f" + digest for digest in split_digests(self.digests())}
        keys.update(self.artifact_keys())
        return keys

    def artifact_keys(self) -> set[bytes]:
        """Distinct artifact keys in the store's 33-byte form."""
        return {b"a" + bytes.fromhex(row[4]) for row in self.document["artifacts"]}

    def conversation_index(self) -> dict[Hashable, int]:
        if self._conversation_index is None:
            self._conversation_index = _index(self.document["conversation"], _value_key)
        return self._conversation_index


@dataclass(frozen=True, slots=True)
class Stored:
    """What goes in the row: the compressed document, its base (None for a
    keyframe) and its depth (0 for a keyframe)."""

    data: bytes
    base_id: str | None
    depth: int


def keyframe(content: Content) -> Stored:
    manifest = content.manifest
    packed = manifest.stored_source()
    if isinstance(packed, _PackedManifest):
        # A manifest read from a keyframe and never loaded (a no-change capture
        # past MAX_DEPTH): its compressed stream is taken as it is, so a
        # million-entry keyframe is neither inflated nor compressed again.
        return Stored(
            _compress(content.document, packed.section(), manifest.summary(), packed=True), None, 0
        )
    return Stored(_compress(content.document, manifest.data, manifest.summary()), None, 0)


@dataclass(frozen=True, slots=True)
class _PackedManifest:
    """A ``CKD4`` keyframe row (its checksum checked when it was read), the
    source of its unloaded manifest."""

    data: bytes

    def section(self) -> memoryview:
        """The manifest's zlib stream, as stored."""
        return memoryview(self.data)[_document_span(self.data)[1] :]


# Manifests up to this size stay loaded in a store's cache after an append (at
# 100k entries, ~17 MB: the next changed capture diffs against them without
# inflating them again); larger ones are kept as their compressed row.
KEEP_LOADED_BYTES = 32 << 20


class _SummaryOnly:
    """The source of a cached manifest that keeps its summary alone."""


_SUMMARY_ONLY = _SummaryOnly()


def _never_loaded() -> bytes:
    raise AssertionError("a store cache's summary-only manifest is never loaded")


def held_lightly(content: Content) -> Content:
    """``content`` as a store's cache keeps it: a large manifest its store has
    not loaded keeps only its summary there (not even the compressed row,
    ~60 MB at 1M entries), which is all a no-change append on top of it
    needs; anything else reads the row again (``is_summary_only``)."""
    manifest = content.manifest
    summary = manifest.known_summary()
    if manifest.loaded or summary is None or manifest.held_bytes() <= KEEP_LOADED_BYTES:
        return content
    light = Manifest.stored(_never_loaded, summary, 0, _SUMMARY_ONLY)
    keep_digests(manifest, light)
    return Content(content.document, light)


def keep_digests(manifest: Manifest, kept: Manifest) -> None:
    """``kept`` (``manifest``'s bytes, held another way or read again from
    the same row) knows its digests when ``manifest`` does: the next append
    counts keys against them, and working them out again would read and
    inflate the row (most of a second at a million entries)."""
    known = manifest.known_digests()
    if known is not None:
        kept.learn_digests(known)


def needs_parent_bytes(content: Content, parent: Content) -> bool:
    """Whether appending ``content`` on ``parent`` (a cache's summary-only
    form, ``is_summary_only``) needs the parent's bytes: not when a scan the
    change journal directed knows its delta from that very parent, the
    parent's digests are known, and no chunk list is patched."""
    known = content.manifest.delta_from(parent.manifest)
    return (
        known is None
        or parent.manifest.known_digests() is None
        or _native.manifest_delta_inserts_long_rows(known[0])
    )


def is_summary_only(content: Content) -> bool:
    """Whether ``content`` is a cache's light form (``held_lightly``): its
    manifest's bytes can only be had by reading its row again."""
    return content.manifest.stored_source() is _SUMMARY_ONLY


def unloaded(content: Content, stored: Stored) -> Content:
    """``content`` as a store keeps it once ``stored`` is its row: a large
    keyframe's manifest unloaded over the row (the compressed bytes, ~1/3 of
    the manifest's), so a daemon holds a million-entry head between captures
    that way however it was made (a cold capture's own manifest included)."""
    manifest = content.manifest
    if (
        stored.base_id is not None
        or stored.data[:4] != _MAGIC
        or not manifest.loaded
        or manifest.byte_length() <= KEEP_LOADED_BYTES
    ):
        return content
    summary = manifest.summary()
    lazy = Manifest.stored(
        functools.partial(_section, stored.data, summary.byte_length),
        summary,
        len(stored.data),
        _PackedManifest(stored.data),
    )
    keep_digests(manifest, lazy)
    return Content(content.document, lazy)


def encode(content: Content, base_id: str | None, base: Content | None, base_depth: int) -> Stored:
    """A delta against ``base`` when that is small and the chain short, else a keyframe."""
    if base_id is None or base is None or base_depth + 1 > MAX_DEPTH:
        return keyframe(content)
    document = dict(content.document)
    if content.manifest.same_bytes(base.manifest):
        # A capture that changed nothing: the native delta would be one copy run
        # of every row. Say so from the row count instead of indexing every row
        # (by fingerprints: neither manifest needs to be in memory).
        files_ops, files_added = _copy_all(len(content.manifest)), 0
    else:
        # A scan the change journal directed knows its delta from the parent.
        known = content.manifest.delta_from(base.manifest)
        files_ops, files_added = (
            known
            if known is not None
            else _native.manifest_delta(base.manifest.data, content.manifest.data)
        )
        if _native.manifest_delta_inserts_long_rows(files_ops):
            # A changed file stored as chunks: its long row (the chunk list)
            # is stored as a patch of its old one, not whole again.
            files_ops, files_added = _native.manifest_delta_compact(base.manifest.data, files_ops)
    conversation = _operations(document["conversation"], base.conversation_index(), _value_key)
    new_items = files_added + _added(conversation)
    if new_items > MAX_DELTA_RATIO * (content.entry_count() + len(document["conversation"])):
        return keyframe(content)
    document["conversation"] = conversation
    return Stored(
        _compress(document, files_ops, content.manifest.summary()), base_id, base_depth + 1
    )


_COPY = struct.Struct("<cII")


def _copy_all(rows: int) -> bytes:
    """The native delta (``manifest.rs`` ``delta``) of a manifest against itself."""
    return _COPY.pack(b"C", 0, rows) if rows else b""


def _copies_all(files_section: bytes, base: Manifest) -> bool:
    """Whether the native delta ``files_section`` rebuilds ``base`` unchanged
    (what ``_copy_all`` writes; only then is the base's row count needed).
    False when that count is unknown without loading ``base`` (a row written
    before summaries): the delta is then applied when its bytes are needed."""
    rows = base.known_length()
    if rows is None:
        return False
    if not files_section:
        return rows == 0
    if len(files_section) != _COPY.size:
        return False
    tag, start, count = _COPY.unpack(files_section)
    return tag == b"C" and start == 0 and count == rows


def _compress(
    document: dict[str, Any],
    files_section: bytes | memoryview,
    summary: ManifestSummary,
    *,
    packed: bool = False,
) -> bytes:
    """The ``CKD4`` layout: the magic, the compressed document's length and the
    row's checksum (uncompressed), the document, the files section (each its
    own zlib stream), so a reader inflates the document alone and the section
    straight into one buffer of its known size."""
    raw = json.dumps({**document, _SUMMARY: summary.to_json()}, **_JSON).encode("utf-8")  # type: ignore[arg-type]
    packed_document = isal_zlib.compress(raw, ZLIB_LEVEL)
    if packed:  # ``files_section`` is a section's zlib stream already
        return _sealed([packed_document, files_section])
    compressor = isal_zlib.compressobj(ZLIB_LEVEL)
    return _sealed([packed_document, compressor.compress(files_section), compressor.flush()])


def _sealed(streams: list[bytes | memoryview]) -> bytes:
    """The row: header (magic, the first stream's length, the checksum), then
    the streams."""
    length = _HEADER.pack(_MAGIC, len(streams[0]))
    hasher = blake3.blake3(length)
    for stream in streams:
        hasher.update(stream)
    return b"".join([length, hasher.digest(), *streams])


def _document_span(data: bytes) -> tuple[int, int]:
    """Where the compressed document lies in a ``CKD4`` or ``CKD3`` row
    (struct.error when the row is too short for its header)."""
    if data[:4] == _MAGIC:
        _, length, _ = _SEALED_HEADER.unpack_from(data)
        return _SEALED_HEADER.size, _SEALED_HEADER.size + length
    _, length = _HEADER.unpack_from(data)
    return _HEADER.size, _HEADER.size + length


def _check_sum(checkpoint_id: str, data: bytes) -> None:
    """Raise SandboxCheckpointDamagedError when a ``CKD4`` row's bytes are not
    the ones its checksum was taken of (older rows carry none)."""
    if data[:4] != _MAGIC:
        return
    if len(data) < _SEALED_HEADER.size:
        raise SandboxCheckpointDamagedError(checkpoint_id, "its stored document is truncated")
    view = memoryview(data)
    hasher = blake3.blake3(view[:_SUM_AT])
    hasher.update(view[_SEALED_HEADER.size :])
    if hasher.digest() != view[_SUM_AT : _SEALED_HEADER.size]:
        raise SandboxCheckpointDamagedError(
            checkpoint_id, "its stored document fails its BLAKE3 checksum"
        )


# The stored document's key for the manifest's summary (never a codec field).
_SUMMARY = "manifest"


def _open(
    data: bytes,
) -> tuple[dict[str, Any], ManifestSummary | None, bytes | list[Any] | None]:
    """(document without files, its summary, the files section) of a stored
    row. In the ``CKD3`` and ``CKD2`` layouts only the document is inflated
    and the section is None (``_section`` inflates it); the oldest layout (one
    JSON document) is inflated whole and its ``files`` returned."""
    if data[:4] in (_MAGIC, _CKD3):
        start, end = _document_span(data)
        document = json.loads(zlib.decompress(memoryview(data)[start:end]))
        summary = ManifestSummary.from_json(document.pop(_SUMMARY, None))
        return document, summary, None
    head = _inflate_prefix(data, _HEADER.size)
    if head[:4] == _CKD2:
        _, length = _HEADER.unpack(head)
        document = json.loads(_inflate_prefix(data, _HEADER.size + length)[_HEADER.size :])
        return document, ManifestSummary.from_json(document.pop(_SUMMARY, None)), None
    document = json.loads(zlib.decompress(data))
    return document, None, document.pop("files")


# Compressed bytes fed at a time while only a row's start is inflated.
_PREFIX_SLICE = 64 << 10


def _inflate_prefix(data: bytes, size: int) -> bytes:
    """The first ``size`` bytes of the zlib stream ``data`` (fewer where it
    ends), feeding it a slice at a time: neither the rest of the stream nor
    a copy of it (``unconsumed_tail``) is ever inflated or made."""
    decompressor = zlib.decompressobj()
    view = memoryview(data)
    out: list[bytes] = []
    got = at = 0
    while got < size:
        if decompressor.unconsumed_tail:
            chunk: bytes | memoryview = decompressor.unconsumed_tail
        elif at < len(view) and not decompressor.eof:
            chunk = view[at : at + _PREFIX_SLICE]
            at += len(chunk)
        else:
            chunk = b""
        piece = decompressor.decompress(chunk, size - got)
        if not piece and not chunk:
            break
        out.append(piece)
        got += len(piece)
    return b"".join(out)


def _section(data: bytes, size: int = -1) -> bytes:
    """The files section of a stored row (``CKD4``, ``CKD3``: inflated into
    one buffer of ``size`` bytes when that is known, so a keyframe's manifest
    is never copied; ``CKD2``: the one stream inflated and sliced)."""
    if data[:4] in (_MAGIC, _CKD3):
        view = memoryview(data)[_document_span(data)[1] :]
        if size >= 0:
            return zlib.decompress(view, bufsize=max(size, 1))
        return zlib.decompress(view)
    raw = zlib.decompress(data)
    _, length = _HEADER.unpack_from(raw)
    return raw[_HEADER.size + length :]


def _added(operations: list[Any]) -> int:
    return sum(len(op["add"]) for op in operations if isinstance(op, dict))


def materialize(
    checkpoint_id: str,
    rows: Mapping[str, tuple[str | None, bytes]],
    memo: dict[str, Content],
) -> Content:
    """The content of ``checkpoint_id`` from stored rows ``id → (base_id, data)``.

    ``rows`` must hold the checkpoint and every base down to a keyframe or to an
    id already in ``memo``; results are added to ``memo``. Raises
    SandboxCheckpointDamagedError (naming ``checkpoint_id`` and the damaged
    row) when a row of the chain fails its checksum or does not decode, or a
    base it names is not in ``rows`` (lost: the store never deletes a base
    first).
    """
    chain: list[tuple[str, str | None, bytes]] = []
    current: str | None = checkpoint_id
    while current is not None and current not in memo:
        row = rows.get(current)
        if row is None:
            if not chain:
                raise KeyError(current)  # the caller's rows: never a stored row's fault
            raise SandboxCheckpointDamagedError(
                checkpoint_id,
                f"the checkpoint it is stored against, {current!r}, is not in the store",
                damaged_checkpoint_id=chain[-1][0],
            )
        base_id, data = row
        chain.append((current, base_id, data))
        current = base_id
    for current_id, base_id, data in reversed(chain):
        try:
            memo[current_id] = _decoded(current_id, base_id, data, memo)
        except SandboxCheckpointDamagedError as error:
            raise _for(checkpoint_id, error) from None
    return memo[checkpoint_id]


def _for(checkpoint_id: str, error: SandboxCheckpointDamagedError) -> SandboxCheckpointDamagedError:
    """``error`` as the failure to read ``checkpoint_id`` (itself, or one it is
    stored against)."""
    if error.checkpoint_id == checkpoint_id:
        return error
    return SandboxCheckpointDamagedError(
        checkpoint_id, error.reason, damaged_checkpoint_id=error.damaged_checkpoint_id
    )


def _undecodable(checkpoint_id: str, error: BaseException) -> SandboxCheckpointDamagedError:
    return SandboxCheckpointDamagedError(
        checkpoint_id, f"its stored document does not decode ({type(error).__name__}: {error})"
    )


def _decoded(
    checkpoint_id: str, base_id: str | None, data: bytes, memo: Mapping[str, Content]
) -> Content:
    """One row of a chain (its base, if any, in ``memo``), checked: its checksum,
    then its decoding; a manifest left to inflate later says which row it is."""
    _check_sum(checkpoint_id, data)
    try:
        document, summary, files = _open(data)
        if document["id"] != checkpoint_id:
            raise ValueError(f"it holds checkpoint {document['id']!r}")
        manifest: Manifest
        if base_id is None:
            if files is None:
                # Left compressed until someone reads it (a no-change capture
                # on top of it never does): the row is what stays in memory.
                size = -1 if summary is None else summary.byte_length
                manifest = Manifest.stored(
                    functools.partial(_lazily, checkpoint_id, _section, data, size),
                    summary,
                    len(data),
                    _PackedManifest(data) if data[:4] == _MAGIC else None,
                )
            else:  # an older layout
                manifest = Manifest(_manifest_bytes(files), trusted=True)
        else:
            base = memo[base_id]
            if files is None:
                files = _section(data)  # a delta's section: small
            if isinstance(files, bytes) and _copies_all(files, base.manifest):
                # A capture that changed nothing: the base's (immutable) manifest
                # itself, not a copy, so a head after N such captures is one
                # manifest in memory, not N + 1 (~180 MB each at a million entries).
                manifest = base.manifest
            elif isinstance(files, bytes):
                manifest = Manifest.stored(
                    functools.partial(_lazily, checkpoint_id, _applied, base.manifest, files),
                    summary,
                    len(files) + base.manifest.held_bytes(),
                    _Delta(base.manifest, files),
                )
            else:  # the old layout: row operations on the base's rows
                manifest = Manifest(
                    _rows_bytes(_apply(files, json.loads(base.manifest.data))), trusted=True
                )
            document["conversation"] = _apply(
                document["conversation"], base.document["conversation"]
            )
    except _DECODE_ERRORS as error:
        raise _undecodable(checkpoint_id, error) from None
    return Content(document, manifest)


def _lazily(checkpoint_id: str, load: Callable[..., bytes], *args: Any) -> bytes:
    """A manifest's bytes, inflated (or applied to its base's) when first
    used: a failure then names the checkpoint, as a read of its row would."""
    try:
        return load(*args)
    except SandboxCheckpointDamagedError as error:  # its base's bytes
        raise _for(checkpoint_id, error) from None
    except _DECODE_ERRORS as error:
        raise _undecodable(checkpoint_id, error) from None


def verify_rows(
    rows: Mapping[str, tuple[str | None, bytes]],
) -> dict[str, SandboxCheckpointDamagedError]:
    """Every checkpoint in ``rows`` that cannot be read, by id: rows that fail
    their checksum (older layouts: that do not decode, documents and
    manifests inflated), and rows stored against one of those or against a
    base ``rows`` lacks. ``rows`` should hold every base of each delta in it."""
    damaged: dict[str, SandboxCheckpointDamagedError] = {}
    for checkpoint_id, (_, data) in rows.items():
        try:
            _check_sum(checkpoint_id, data)
            if data[:4] != _MAGIC:  # no checksum: inflate what the row holds
                document, _summary, files = _open(data)
                if document["id"] != checkpoint_id:
                    raise ValueError(f"it holds checkpoint {document['id']!r}")
                if files is None:
                    _section(data)
        except SandboxCheckpointDamagedError as error:
            damaged[checkpoint_id] = error
        except _DECODE_ERRORS as error:
            damaged[checkpoint_id] = _undecodable(checkpoint_id, error)
    for checkpoint_id in rows:
        chain: list[str] = []
        current: str | None = checkpoint_id
        cause: SandboxCheckpointDamagedError | None = None
        while current is not None:
            if current in damaged:
                cause = damaged[current]
                break
            row = rows.get(current)
            if row is None:
                cause = SandboxCheckpointDamagedError(
                    chain[-1],
                    f"the checkpoint it is stored against, {current!r}, is not in the store",
                )
                break
            chain.append(current)
            current = row[0]
        if cause is not None:
            for below in chain:  # each delta above the damaged row
                damaged[below] = _for(below, cause)
    return damaged


@dataclass(frozen=True)
class _Delta:
    """What an unloaded delta's manifest is made of: its base's manifest and
    its files section (``Manifest.stored_source``)."""

    base: Manifest
    files_section: bytes


def _applied(base: Manifest, files_section: bytes) -> bytes:
    """A delta's manifest: its native delta applied to the base's bytes (the
    base's very bytes object when the delta copies it whole: a chain of old
    no-change deltas loads as one manifest, not one per delta).

    A base that is itself an unloaded delta is not loaded: the chain down to
    the first loaded manifest (or keyframe) is applied in one native call,
    which copies the bytes once (a head 31 deltas above its keyframe was 31
    copies and 31 fingerprint checks of a manifest, ~10 s at a million entries)."""
    chain = [files_section]
    while isinstance(source := base.stored_source(), _Delta):
        chain.append(source.files_section)
        base = source.base
    data = base.data
    if len(chain) == 1 and _copies_all(files_section, base):
        return data
    return _native.manifest_apply(data, chain[::-1])


def _rows_bytes(rows: list[Any]) -> bytes:
    """Rows as the codec encodes them."""
    return json.dumps(rows, **_JSON).encode("utf-8")  # type: ignore[arg-type]


def _manifest_bytes(files: bytes | list[Any]) -> bytes:
    return files if isinstance(files, bytes) else _rows_bytes(files)


# ---------------------------------------------------------------------------- operations


def _value_key(value: Any) -> Hashable:
    # Order-sensitive on purpose: a copied message must come back byte for byte.
    return json.dumps(value, **_JSON)  # type: ignore[arg-type]


def _index(items: list[Any], key: Callable[[Any], Hashable]) -> dict[Hashable, int]:
    index: dict[Hashable, int] = {}
    for position, item in enumerate(items):
        index.setdefault(key(item), position)
    return index


def _operations(
    items: list[Any], base_index: dict[Hashable, int], key: Callable[[Any], Hashable]
) -> list[Any]:
    """Copy runs of the base (``[start, count]``) and inserted items (``{"add": [...]}``)."""
    operations: list[Any] = []
    added: list[Any] = []
    start = count = 0
    for item in items:
        position = base_index.get(key(item))
        if position is None:
            if count:
                operations.append([start, count])
                count = 0
            added.append(item)
            continue
        if count and position == start + count:
            count += 1
            continue
        if added:
            operations.append({"add": added})
            added = []
        if count:
            operations.append([start, count])
        start, count = position, 1
    if added:
        operations.append({"add": added})
    if count:
        operations.append([start, count])
    return operations


def _apply(operations: list[Any], base: list[Any]) -> list[Any]:
    items: list[Any] = []
    for operation in operations:
        if isinstance(operation, dict):
            items.extend(operation["add"])
        else:
            start, count = operation
            items.extend(base[start : start + count])
    return items


def count_manifest_keys(
    rows: Mapping[str, tuple[str | None, bytes]],
    *,
    with_sizes: bool = False,
    damaged: dict[str, SandboxCheckpointDamagedError] | None = None,
) -> tuple[dict[bytes, int], dict[bytes, int]]:
    """For every blob key (33-byte form) the stored checkpoints in ``rows`` use:
    how many of them use it, and (``with_sizes``) the size their entries give it.

    ``rows`` (``id → (base_id, data)``) must hold every base it names. Each
    checkpoint is materialized once, bases before the deltas on them, and a
    content is dropped as soon as no delta still to come needs it, so a chain of
    any length costs about two decoded manifests of memory. Keys come from the
    manifest's digests (native, no object per entry); sizes need the entries.

    A checkpoint that cannot be read raises SandboxCheckpointDamagedError, or
    with ``damaged`` is recorded there by id and left out of the counts (an
    audit goes on; a repair must not count without it).
    """
    waiting: dict[str, int] = {}  # id -> its dependents not yet counted
    for base_id, _ in rows.values():
        if base_id is not None:
            waiting[base_id] = waiting.get(base_id, 0) + 1
    # Raw file digests are counted apart (Counter.update runs in C; the kind byte
    # is added once per key at the end, not once per key per checkpoint).
    file_counts: Counter[bytes] = Counter()
    counts: dict[bytes, int] = {}
    sizes: dict[bytes, int] = {}
    memo: dict[str, Content] = {}
    done: set[str] = set()

    def count(checkpoint_id: str) -> None:
        content = materialize(checkpoint_id, rows, memo)
        digests = content.manifest.digests()  # distinct, sorted
        data = content.manifest.data if with_sizes else b""
        file_counts.update(split_digests(digests))
        for key in {b"a" + bytes.fromhex(row[4]) for row in content.document["artifacts"]}:
            counts[key] = counts.get(key, 0) + 1
        if with_sizes:
            for _path, digest, size in _native.manifest_files_with_digests(data, digests):
                sizes.setdefault(b"f" + digest, size)
            for row in content.document["artifacts"]:
                sizes.setdefault(b"a" + bytes.fromhex(row[4]), row[3])

    def settle(checkpoint_id: str) -> None:
        done.add(checkpoint_id)
        if not waiting.get(checkpoint_id):
            memo.pop(checkpoint_id, None)
        base_id = rows[checkpoint_id][0]
        if base_id is not None and base_id in waiting:
            waiting[base_id] -= 1
            if not waiting[base_id] and base_id in done:
                memo.pop(base_id, None)

    for checkpoint_id in rows:
        chain: list[str] = []
        current: str | None = checkpoint_id
        while current is not None and current not in done and current in rows:
            chain.append(current)
            current = rows[current][0]
        for pending in reversed(chain):  # bases first
            try:
                count(pending)
            except SandboxCheckpointDamagedError as error:
                if damaged is None:
                    raise
                damaged[pending] = error
            settle(pending)
    counts.update((b"f" + digest, n) for digest, n in file_counts.items())
    return counts, sizes
