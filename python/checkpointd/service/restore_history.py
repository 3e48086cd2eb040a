"""What a Restore or an Undo reports of restore history (docs/restore-history.md):
the stash entry it saved first and the checkpoint it recorded, on the wire and
in the daemon's log line."""

from __future__ import annotations

from ..history import RestoreOutcome
from ..v1 import checkpointd_pb2 as pb
from . import convert


def set_history_fields(done: pb.RestoreDone, outcome: RestoreOutcome) -> None:
    """``saved_before_restore`` and ``recorded`` of a RestoreDone."""
    stashed = outcome.stashed
    if stashed is not None:
        done.saved_before_restore.CopyFrom(
            pb.SavedBeforeRestore(
                checkpoint=convert.summary_of(stashed.checkpoint),
                blobs_uploaded=stashed.blobs_uploaded,
                bytes_uploaded=stashed.bytes_uploaded,
                resumed=stashed.resumed,
            )
        )
    if outcome.recorded is not None:
        done.recorded.CopyFrom(convert.summary_of(outcome.recorded))


def history_note(outcome: RestoreOutcome) -> str:
    """The end of the log line: what was stashed and recorded (or nothing)."""
    note = ""
    stashed = outcome.stashed
    if stashed is not None:
        how = "found stashed by an earlier run" if stashed.resumed else "stashed"
        note += (
            f"; live changes {how} as {stashed.checkpoint.id} "
            f"({stashed.blobs_uploaded} blobs uploaded, {stashed.bytes_uploaded} bytes)"
        )
    if outcome.recorded is not None:
        note += f"; recorded as {outcome.recorded.id}"
    return note


__all__ = ["history_note", "set_history_fields"]
