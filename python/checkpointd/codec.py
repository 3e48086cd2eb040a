"""Compact documents for checkpoints: one JSON document per manifest, never a row per file.

A manifest is a JSON array of short arrays, in entry order:

    ["f", path, <64-hex of the blob>, size, mode, mtime_ns, chunks?, (offset, length, secret)*]
    ["d", path, mode]
    ["l", path, target]

A file row where capture zeroed secrets goes on with one flat ``offset, length,
secret`` triple per match (``secret``: the secret's index in the caller's list,
or its name); rows stay flat arrays. A large file stored as content-defined
chunks has their list as one string right after its mtime (see ``chunks``);
its hex is still the whole file's BLAKE3. The native scanner emits the same
encoding, so a capture's manifest crosses from Rust to Python as one ``bytes``
value. ``encode_checkpoint`` adds the other fields
and returns the document stores persist (optionally zlib-compressed by the store).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from .model import (
    ARTIFACT_KEY_PREFIX,
    FILE_KEY_PREFIX,
    Artifact,
    Checkpoint,
    DirEntry,
    Entry,
    FileEntry,
    Policy,
    SecretSpan,
    SymlinkEntry,
)

_PREFIX_LEN = len(FILE_KEY_PREFIX)


def _entry_row(entry: Entry) -> list[Any]:
    if isinstance(entry, FileEntry):
        row = [
            "f",
            entry.path,
            entry.blob_key[_PREFIX_LEN:],
            entry.size,
            entry.mode,
            entry.mtime_ns,
        ]
        if entry.chunks:
            row.append(entry.chunks)
        for span in entry.secrets:
            row += (span.offset, span.length, span.secret)
        return row
    if isinstance(entry, DirEntry):
        return ["d", entry.path, entry.mode]
    return ["l", entry.path, entry.target]


def encode_entries(entries: tuple[Entry, ...] | list[Entry]) -> bytes:
    """Encode validated entries (blob keys must have the file-key shape)."""
    rows = [_entry_row(entry) for entry in entries]
    return json.dumps(rows, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def entries_from_rows(rows: list[list[Any]]) -> tuple[Entry, ...]:
    out: list[Entry] = []
    append = out.append
    for row in rows:
        tag = row[0]
        if tag == "f":
            # A string after the mtime is the chunk list of a file stored as chunks.
            chunked = len(row) > 6 and isinstance(row[6], str)
            first = 7 if chunked else 6
            spans = (
                tuple(SecretSpan(row[i], row[i + 1], row[i + 2]) for i in range(first, len(row), 3))
                if len(row) > first
                else ()
            )
            append(
                FileEntry(
                    row[1],
                    FILE_KEY_PREFIX + row[2],
                    row[3],
                    row[4],
                    row[5],
                    spans,
                    row[6] if chunked else "",
                )
            )
        elif tag == "d":
            append(DirEntry(row[1], row[2]))
        elif tag == "l":
            append(SymlinkEntry(row[1], row[2]))
        else:
            raise ValueError(f"unknown manifest row tag {tag!r}")
    return tuple(out)


def decode_entries(data: bytes | str) -> tuple[Entry, ...]:
    return entries_from_rows(json.loads(data))


def _artifact_row(artifact: Artifact) -> list[Any]:
    return [
        artifact.artifact_id,
        artifact.name,
        artifact.mime_type,
        artifact.size,
        artifact.blob_key[len(ARTIFACT_KEY_PREFIX) :],
        artifact.created_at,
    ]


def _artifact_from_row(row: list[Any]) -> Artifact:
    return Artifact(
        artifact_id=row[0],
        name=row[1],
        mime_type=row[2],
        size=row[3],
        blob_key=ARTIFACT_KEY_PREFIX + row[4],
        created_at=row[5],
    )


def policy_document(policy: Policy | None) -> dict[str, Any] | None:
    """The recorded policy as JSON (None when the checkpoint records none)."""
    if policy is None:
        return None
    return {
        "exclude": list(policy.exclude),
        "include": list(policy.include),
        "default_excludes": policy.default_excludes,
    }


def policy_from_document(document: dict[str, Any] | None) -> Policy | None:
    if document is None:
        return None
    return Policy(
        exclude=tuple(document["exclude"]),
        include=tuple(document["include"]),
        default_excludes=bool(document["default_excludes"]),
    )


def checkpoint_fields(checkpoint: Checkpoint) -> dict[str, Any]:
    """The checkpoint as a JSON-ready dict without ``files`` (artifacts as rows):
    stores keep the manifest beside it as bytes."""
    texts = checkpoint.conversation_text
    fields: dict[str, Any] = {
        "id": checkpoint.id,
        "thread_id": checkpoint.thread_id,
        "parent_checkpoint_id": checkpoint.parent_checkpoint_id,
        "created_at": checkpoint.created_at,
        "reason": checkpoint.reason,
        "label": checkpoint.label,
        "source_run_id": checkpoint.source_run_id,
        # Messages sent as JSON text are kept as that text, byte for byte
        # ({"t": text} each, so conversation deltas still work per message).
        "conversation": list(checkpoint.conversation)
        if texts is None
        else [{"t": text} for text in texts],
        "artifacts": [_artifact_row(artifact) for artifact in checkpoint.artifacts],
        "policy": policy_document(checkpoint.policy),
        "workspace_subdir": checkpoint.workspace_subdir,
        "forked_from_thread_id": checkpoint.forked_from_thread_id,
        "forked_from_checkpoint_id": checkpoint.forked_from_checkpoint_id,
    }
    if texts is not None:
        fields["conversation_form"] = "text"
    if checkpoint.restored_from_checkpoint_id is not None:
        # Only when set: every other checkpoint's document stays as it was.
        fields["restored_from_checkpoint_id"] = checkpoint.restored_from_checkpoint_id
    return fields


def checkpoint_document(checkpoint: Checkpoint) -> dict[str, Any]:
    """The checkpoint as a JSON-ready dict (entries and artifacts as compact rows)."""
    document = checkpoint_fields(checkpoint)
    document["files"] = [_entry_row(entry) for entry in checkpoint.files]
    return document


def encode_checkpoint(checkpoint: Checkpoint) -> bytes:
    """The whole checkpoint as one compact UTF-8 JSON document."""
    document = checkpoint_document(checkpoint)
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def checkpoint_from_document(
    document: dict[str, Any], files: Sequence[Entry] | None = None
) -> Checkpoint:
    """A Checkpoint with new entry objects (or ``files`` when given, e.g. a
    ``Manifest``); the conversation values are the document's own (copy the
    document first if it is shared)."""
    stored = document["conversation"]
    texts: tuple[str, ...] | None = None
    if document.get("conversation_form") == "text":
        texts = tuple(item["t"] for item in stored)
        conversation = tuple(json.loads(text) for text in texts)
    else:
        conversation = tuple(stored)
    return Checkpoint(
        id=document["id"],
        thread_id=document["thread_id"],
        parent_checkpoint_id=document["parent_checkpoint_id"],
        created_at=document["created_at"],
        reason=document["reason"],
        label=document["label"],
        source_run_id=document["source_run_id"],
        files=entries_from_rows(document["files"]) if files is None else files,
        conversation=conversation,
        artifacts=tuple(_artifact_from_row(row) for row in document["artifacts"]),
        # Documents written before these fields existed record neither.
        policy=policy_from_document(document.get("policy")),
        workspace_subdir=document.get("workspace_subdir", ""),
        forked_from_thread_id=document.get("forked_from_thread_id"),
        forked_from_checkpoint_id=document.get("forked_from_checkpoint_id"),
        conversation_text=texts,
        restored_from_checkpoint_id=document.get("restored_from_checkpoint_id"),
    )


def decode_checkpoint(data: bytes | str) -> Checkpoint:
    """A fresh Checkpoint (new conversation objects each call, so callers can't mutate the store)."""
    return checkpoint_from_document(json.loads(data))
