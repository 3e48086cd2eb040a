"""What ``checkpointd restore`` and ``checkpointd undo`` print: the restore, the
live changes it saved to the thread's stash first, the checkpoint it recorded,
and a dry run's plan (docs/restore-history.md)."""

from __future__ import annotations

from .cli_output import Output, human_duration, human_size, moved_text
from .v1 import checkpointd_pb2 as pb


def plan_text(
    done: pb.RestoreDone, written: list[str], deleted: list[str], stashed: list[str]
) -> str:
    """A dry run: the counts, then each path written, deleted and stashed."""
    plan = done.plan
    lines = [
        f"restoring {done.checkpoint.id} would write {plan.files_written} files, delete "
        f"{plan.paths_deleted} paths, keep {plan.files_kept} files, create "
        f"{plan.dirs_created} directories; fetch {plan.blobs_to_fetch} blobs "
        f"({human_size(plan.bytes_to_fetch)})"
    ]
    if plan.paths_stashed:
        lines.append(
            f"it would first save the live changes of {plan.paths_stashed} paths "
            f"({human_size(plan.bytes_stashed)}) to the thread's stash (undo brings them back)"
        )
    lines += [f"  write  {path}" for path in written]
    lines += [f"  delete {path}" for path in deleted]
    lines += [f"  stash  {path}" for path in stashed]
    return "\n".join(lines)


def restore_text(done: pb.RestoreDone, out: Output) -> str:
    """The restore's summary: the blobs it fetched and the files it wrote (each
    phase's own counts and rate), what it stashed and recorded, and where
    secrets were left as zeros."""
    text = (
        f"restored {done.checkpoint.id} ({done.checkpoint.file_count} files, "
        f"{human_size(done.checkpoint.total_bytes)}) in {human_duration(done.duration_ms)}"
    )
    moves = []
    for phase, verb, unit in (("fetch", "fetched", "blobs"), ("apply", "wrote", "files")):
        moved = out.moved(phase)
        if moved is not None:
            moves.append(moved_text(verb, moved[0], unit, moved[1], moved[2]))
    if moves:
        text += ": " + ", ".join(moves)
    text += "".join(f"\n{line}" for line in history_lines(done))
    if done.unfilled_secret_paths:
        text += "\nzeros where secrets were (restore with --secret-env to fill them):" + "".join(
            f"\n  {path}" for path in done.unfilled_secret_paths
        )
        more = done.unfilled_secret_count - len(done.unfilled_secret_paths)
        if more > 0:
            text += f"\n  … {more} more"
    return text


def history_lines(done: pb.RestoreDone) -> list[str]:
    """The stash entry the restore saved the live tree to, and the checkpoint
    it recorded, one line each (none when it did neither)."""
    lines = []
    if done.HasField("saved_before_restore"):
        saved = done.saved_before_restore
        entry = saved.checkpoint
        if saved.resumed:
            lines.append(f"the live changes were saved to the stash earlier, as {entry.id}")
        else:
            lines.append(
                f"saved the live changes first, as {entry.id} ({entry.file_count} files, "
                f"{saved.blobs_uploaded} new blobs, {human_size(saved.bytes_uploaded)}): "
                "checkpointd undo brings them back"
            )
    if done.HasField("recorded"):
        lines.append(f"recorded as {done.recorded.id}, the thread's new head")
    return lines


__all__ = ["history_lines", "plan_text", "restore_text"]
