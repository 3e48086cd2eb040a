"""How the PostgreSQL store keeps a checkpoint's document: whole, or as a delta.

Consecutive checkpoints of a thread usually share almost every manifest entry and
the whole conversation but its last messages. Storing each one whole would cost
the full compressed manifest per checkpoint (≈ 470 kB for 10,000 entries), so a
checkpoint is stored as one of:

* a **keyframe**: the ``checkpointd.codec`` JSON document, zlib-compressed;
* a **delta** against its parent: the same document where ``files`` and
  ``conversation`` are replaced by copy/insert operations on the parent's lists
  (``[start, count]`` copies a run of the parent's items, ``{"add": [...]}``
  inserts items), zlib-compressed.

Still one document (one row) per checkpoint, never a row per file. A delta is
used only while it is small (at most ``MAX_DELTA_RATIO`` of its items new) and the
chain of deltas down to a keyframe is short (``MAX_DEPTH``), which bounds the
cost of reading any checkpoint. Deleting a checkpoint rewrites the checkpoints
based on it as keyframes first (see ``PostgresCheckpointStore``), so every base a
delta names exists, in the same thread.

Everything here is pure: bytes and dicts in, bytes and dicts out.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any

# The codec's own row encoders, so a stored document is exactly the codec's format.
from ..codec import checkpoint_document, checkpoint_from_document
from ..model import Checkpoint

# Reading a checkpoint applies at most MAX_DEPTH deltas to a keyframe; each costs
# about a list copy, so 32 keeps a read within a few keyframe decodes.
MAX_DEPTH = 32
# A delta whose lists are more than this share new items is not worth its read
# cost: store a keyframe instead.
MAX_DELTA_RATIO = 0.5
# zlib level 1: hashes are incompressible hex, so higher levels cost three times
# the CPU for about 3% less (measured on a 10,000-entry manifest).
ZLIB_LEVEL = 1

_JSON = {"separators": (",", ":"), "ensure_ascii": False}


class Content:
    """The whole codec document of one checkpoint (immutable by convention), with
    the indexes a delta against it needs, built on first use."""

    __slots__ = ("_conversation_index", "_files_index", "document")

    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document
        self._files_index: dict[Hashable, int] | None = None
        self._conversation_index: dict[Hashable, int] | None = None

    @classmethod
    def of(cls, checkpoint: Checkpoint) -> Content:
        """The content of a (validated) checkpoint, sharing nothing mutable with it:
        entries and artifacts are frozen, and the conversation (JSON values the
        caller may change later) is copied through JSON."""
        conversation = json.loads(json.dumps(list(checkpoint.conversation), **_JSON))  # type: ignore[arg-type]
        document = checkpoint_document(checkpoint)
        document["conversation"] = conversation
        return cls(document)

    def checkpoint(self) -> Checkpoint:
        """A fresh Checkpoint (new objects on every call): entries and artifacts are
        rebuilt from the rows, and only the conversation, the one part holding
        mutable JSON values, is copied through JSON."""
        document = dict(self.document)
        document["conversation"] = json.loads(json.dumps(document["conversation"], **_JSON))  # type: ignore[arg-type]
        return checkpoint_from_document(document)

    def blob_keys(self) -> set[bytes]:
        """Distinct blob keys in the store's 33-byte form (kind byte + raw hash)."""
        keys = {b"f" + bytes.fromhex(row[2]) for row in self.document["files"] if row[0] == "f"}
        keys.update(b"a" + bytes.fromhex(row[4]) for row in self.document["artifacts"])
        return keys

    def files_index(self) -> dict[Hashable, int]:
        if self._files_index is None:
            self._files_index = _index(self.document["files"], _row_key)
        return self._files_index

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
    return Stored(_compress(content.document), None, 0)


def encode(content: Content, base_id: str | None, base: Content | None, base_depth: int) -> Stored:
    """A delta against ``base`` when that is small and the chain short, else a keyframe."""
    if base_id is None or base is None or base_depth + 1 > MAX_DEPTH:
        return keyframe(content)
    document = dict(content.document)
    files = _operations(document["files"], base.files_index(), _row_key)
    conversation = _operations(document["conversation"], base.conversation_index(), _value_key)
    new_items = _added(files) + _added(conversation)
    if new_items > MAX_DELTA_RATIO * (len(document["files"]) + len(document["conversation"])):
        return keyframe(content)
    document["files"] = files
    document["conversation"] = conversation
    return Stored(_compress(document), base_id, base_depth + 1)


def _compress(document: dict[str, Any]) -> bytes:
    raw = json.dumps(document, **_JSON).encode("utf-8")  # type: ignore[arg-type]
    return zlib.compress(raw, ZLIB_LEVEL)


def _added(operations: list[Any]) -> int:
    return sum(len(op["add"]) for op in operations if isinstance(op, dict))


def materialize(
    checkpoint_id: str,
    rows: Mapping[str, tuple[str | None, bytes]],
    memo: dict[str, Content],
) -> Content:
    """The content of ``checkpoint_id`` from stored rows ``id → (base_id, data)``.

    ``rows`` must hold the checkpoint and every base down to a keyframe or to an
    id already in ``memo``; results are added to ``memo``. Raises KeyError when a
    base is missing (the store never lets that happen).
    """
    chain: list[tuple[str, str | None, dict[str, Any]]] = []
    current: str | None = checkpoint_id
    while current is not None and current not in memo:
        base_id, data = rows[current]
        chain.append((current, base_id, json.loads(zlib.decompress(data))))
        current = base_id
    for current_id, base_id, document in reversed(chain):
        if base_id is None:
            memo[current_id] = Content(document)
        else:
            base = memo[base_id].document
            document["files"] = _apply(document["files"], base["files"])
            document["conversation"] = _apply(document["conversation"], base["conversation"])
            memo[current_id] = Content(document)
    return memo[checkpoint_id]


# ---------------------------------------------------------------------------- operations


def _row_key(row: list[Any]) -> Hashable:
    return tuple(row)


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
