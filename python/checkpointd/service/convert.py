"""Model ⇄ protobuf conversions for the checkpointd.v1 wire types."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from ..chunks import chunk_count
from ..errors import SandboxCheckpointInvalidArgumentError
from ..model import (
    Artifact,
    Checkpoint,
    DirEntry,
    Entry,
    FileEntry,
    Policy,
    stash_owner,
)
from ..progress import Progress
from ..v1 import checkpointd_pb2 as pb


def policy_from_proto(message: pb.Policy, present: bool = True) -> Policy | None:
    """The request's policy, or None (the engines' default) when it was not sent."""
    if not present:
        return None
    default_excludes = message.default_excludes if message.HasField("default_excludes") else True
    return Policy(
        exclude=tuple(message.exclude),
        include=tuple(message.include),
        default_excludes=default_excludes,
    )


def secrets_from_proto(
    secrets: Sequence[bytes], names: Sequence[str]
) -> tuple[bytes, ...] | dict[str, bytes]:
    """A request's secrets: a mapping name → bytes when ``secret_names`` came
    along (one per secret, distinct), else the plain list. Raises
    SandboxCheckpointInvalidArgumentError (never showing a value)."""
    if not names:
        return tuple(secrets)
    if len(names) != len(secrets) or len(set(names)) != len(names):
        raise SandboxCheckpointInvalidArgumentError(
            f"secret_names must name each of the {len(secrets)} secrets once "
            f"(got {len(names)} names)"
        )
    return dict(zip(names, secrets, strict=True))


def policy_to_proto(policy: Policy) -> pb.Policy:
    return pb.Policy(
        exclude=list(policy.exclude),
        include=list(policy.include),
        default_excludes=policy.default_excludes,
    )


def entry_to_proto(entry: Entry) -> pb.Entry:
    if isinstance(entry, FileEntry):
        return pb.Entry(
            path=entry.path,
            kind=pb.ENTRY_KIND_FILE,
            blob_key=entry.blob_key,
            size=entry.size,
            mtime_ns=entry.mtime_ns,
            mode=entry.mode,
            chunk_count=chunk_count(entry.chunks),
        )
    if isinstance(entry, DirEntry):
        return pb.Entry(path=entry.path, kind=pb.ENTRY_KIND_DIR, mode=entry.mode)
    return pb.Entry(path=entry.path, kind=pb.ENTRY_KIND_SYMLINK, target=entry.target)


def artifact_to_proto(artifact: Artifact) -> pb.Artifact:
    return pb.Artifact(
        artifact_id=artifact.artifact_id,
        name=artifact.name,
        mime_type=artifact.mime_type,
        size=artifact.size,
        blob_key=artifact.blob_key,
        created_at=artifact.created_at,
    )


def artifact_from_proto(message: pb.Artifact) -> Artifact:
    return Artifact(
        artifact_id=message.artifact_id,
        name=message.name,
        mime_type=message.mime_type,
        size=message.size,
        blob_key=message.blob_key,
        created_at=message.created_at,
    )


def _manifest_totals(checkpoint: Checkpoint) -> tuple[int, int, int]:
    """(entries, files, file bytes): counted on the bytes for a Manifest (a
    summary must not decode a million entries into Python objects)."""
    totals = getattr(checkpoint.files, "totals", None)
    if totals is not None:
        entries, file_count, total_bytes = totals()
        return entries, file_count, total_bytes
    files = [entry for entry in checkpoint.files if isinstance(entry, FileEntry)]
    return len(checkpoint.files), len(files), sum(entry.size for entry in files)


def summary_of(checkpoint: Checkpoint) -> pb.CheckpointSummary:
    entry_count, file_count, total_bytes = _manifest_totals(checkpoint)
    summary = pb.CheckpointSummary(
        id=checkpoint.id,
        thread_id=checkpoint.thread_id,
        created_at=checkpoint.created_at,
        reason=checkpoint.reason,
        entry_count=entry_count,
        file_count=file_count,
        total_bytes=total_bytes,
        artifact_count=len(checkpoint.artifacts),
        conversation_count=len(checkpoint.conversation),
    )
    if checkpoint.parent_checkpoint_id is not None:
        summary.parent_checkpoint_id = checkpoint.parent_checkpoint_id
    if checkpoint.label is not None:
        summary.label = checkpoint.label
    if checkpoint.source_run_id is not None:
        summary.source_run_id = checkpoint.source_run_id
    if checkpoint.policy is not None:
        summary.policy.CopyFrom(policy_to_proto(checkpoint.policy))
    summary.workspace_subdir = checkpoint.workspace_subdir
    if checkpoint.forked_from_thread_id is not None:
        summary.forked_from_thread_id = checkpoint.forked_from_thread_id
    if checkpoint.forked_from_checkpoint_id is not None:
        summary.forked_from_checkpoint_id = checkpoint.forked_from_checkpoint_id
    if checkpoint.restored_from_checkpoint_id is not None:
        summary.restored_from_checkpoint_id = checkpoint.restored_from_checkpoint_id
    owner = stash_owner(checkpoint.thread_id)
    if owner is not None:
        summary.stash_of_thread_id = owner
    return summary


def progress_to_proto(progress: Progress) -> pb.Progress:
    return pb.Progress(
        phase=progress.phase,
        phase_kind=pb.ProgressPhase.Value(  # type: ignore[arg-type]
            f"PROGRESS_PHASE_{progress.phase.upper()}"
        )
        if f"PROGRESS_PHASE_{progress.phase.upper()}" in pb.ProgressPhase.keys()
        else pb.PROGRESS_PHASE_UNSPECIFIED,
        files_done=max(progress.files_done, 0),
        files_total=max(progress.files_total, 0),
        bytes_done=max(progress.bytes_done, 0),
        bytes_total=max(progress.bytes_total, 0),
        files_hashed=max(progress.files_hashed, 0),
    )


def stats_to_proto(stats: Any) -> pb.CaptureStats:
    """CaptureStats (any object with the docs/contract.md#capture fields) as a message."""
    message = pb.CaptureStats()
    for name in (
        "entries",
        "files_hashed",
        "files_reused",
        "bytes_hashed",
        "blobs_uploaded",
        "bytes_uploaded",
        "duration_ms",
    ):
        setattr(message, name, max(int(getattr(stats, name, 0) or 0), 0))
    for phase, ms in (getattr(stats, "phases_ms", None) or {}).items():
        message.phases_ms[str(phase)] = max(int(ms), 0)
    message.scan_mode = str(getattr(stats, "scan_mode", "") or "")
    message.full_scan_reason = str(getattr(stats, "full_scan_reason", "") or "")
    message.entries_examined = max(int(getattr(stats, "entries_examined", 0) or 0), 0)
    return message


def conversation_from_proto(documents: Sequence[str]) -> tuple[Any, ...]:
    """Parse each JSON document. Raises SandboxCheckpointInvalidArgumentError."""
    parsed = []
    for index, document in enumerate(documents):
        try:
            parsed.append(json.loads(document))
        except ValueError as exc:
            raise SandboxCheckpointInvalidArgumentError(
                f"conversation message {index} is not JSON: {exc}",
                details={"conversation_index": index},
            ) from exc
    return tuple(parsed)


def conversation_to_proto(messages: Iterable[Any]) -> list[str]:
    return [json.dumps(message, ensure_ascii=False, separators=(",", ":")) for message in messages]
