"""Restore and Undo: the calls that write a checkpoint back into the workspace,
streaming the engine's progress (or, for a dry run, the plan's paths)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable

from .. import validation
from ..history import (
    HistoryRestore,
    RestoreOutcome,
    owner_of,
    preview_with_history,
    restore_with_history,
    undo_restore,
)
from ..model import stash_thread_id
from ..progress import Progress
from ..v1 import checkpointd_pb2 as pb
from . import convert
from .calls import RpcGroup, chunks, log, streaming
from .restore_history import history_note, set_history_fields
from .state import Context, recorded_subdir, with_progress

# Paths a RestoreDone lists as holding zeros where secrets were: at most this
# many, and this many bytes of them; unfilled_secret_count counts them all.
MAX_UNFILLED_PATHS = 10_000
MAX_UNFILLED_BYTES = 1024 * 1024


def bounded_paths(paths: list[str]) -> list[str]:
    """The first paths, within MAX_UNFILLED_PATHS and MAX_UNFILLED_BYTES."""
    kept, size = [], 0
    for path in paths[:MAX_UNFILLED_PATHS]:
        size += len(path.encode("utf-8", "surrogateescape")) + 8
        if size > MAX_UNFILLED_BYTES:
            break
        kept.append(path)
    return kept


class RestoreRpcs(RpcGroup):
    @streaming
    async def Restore(
        self, request: pb.RestoreRequest, context: Context
    ) -> AsyncIterator[pb.RestoreEvent]:
        store, _ = self.state.stores()
        thread_id = validation.check_id(request.thread_id, "thread_id")
        checkpoint_id = (
            validation.check_id(request.checkpoint_id, "checkpoint_id")
            if request.HasField("checkpoint_id")
            else None
        )
        subdir = request.workspace_subdir
        # Pin the head read here: the engine restores exactly that checkpoint
        # (whose sub-root we may use), and RestoreStarted names it.
        if checkpoint_id is None:
            checkpoint_id = await store.get_head(thread_id)
        if not subdir and checkpoint_id is not None:
            # Restore where the checkpoint was captured.
            subdir = recorded_subdir(subdir, await self._checkpoint(checkpoint_id))
        wanted = HistoryRestore(
            thread_id,
            checkpoint_id,
            convert.policy_from_proto(request.policy, request.HasField("policy")),
            subdir,
            convert.secrets_from_proto(request.secrets, request.secret_names),
            discard_live_changes=request.discard_live_changes,
            record=request.record,
            stash_keep=self.state.stash_keep,
        )
        async for event in self._restore_events(wanted, context, request.dry_run, undo=False):
            yield event

    @streaming
    async def Undo(
        self, request: pb.UndoRequest, context: Context
    ) -> AsyncIterator[pb.RestoreEvent]:
        store, _ = self.state.stores()
        thread_id = validation.check_id(request.thread_id, "thread_id")
        newest = await store.get_head(stash_thread_id(owner_of(thread_id)))
        subdir = request.workspace_subdir
        if not subdir and newest is not None:
            subdir = recorded_subdir(subdir, await self._checkpoint(newest))
        wanted = HistoryRestore(
            thread_id,
            workspace_subdir=subdir,
            secrets=convert.secrets_from_proto(request.secrets, request.secret_names),
            record=request.record,
            stash_keep=self.state.stash_keep,
        )
        async for event in self._restore_events(wanted, context, request.dry_run, undo=True):
            yield event

    async def _restore_events(
        self, wanted: HistoryRestore, context: Context, dry_run: bool, *, undo: bool
    ) -> AsyncIterator[pb.RestoreEvent]:
        """A Restore's or an Undo's events: started, progress (or the plan's
        paths), done. The engine works under the owner thread's lease."""
        store, blobs = self.state.stores()
        # Validated here for an early error; the engine itself opens the sub-root
        # from the workspace fd, component by component (never by this path).
        self.state.check_subroot(wanted.workspace_subdir)
        started = pb.RestoreStarted(thread_id=wanted.thread_id)
        if wanted.checkpoint_id is not None:
            started.checkpoint_id = wanted.checkpoint_id
        yield pb.RestoreEvent(started=started)
        began = time.monotonic()
        if dry_run:
            async for event in self._restore_plan(wanted, undo):
                yield event
            return
        engine = undo_restore if undo else restore_with_history

        async def work(progress: Callable[[Progress], None]) -> RestoreOutcome:
            return await engine(
                self.state.workspace_root,
                store,
                blobs,
                wanted,
                data_dir=self.state.data_dir,
                progress=progress,
            )

        applied = Progress("apply")  # its last event: what the restore wrote
        owner = owner_of(wanted.thread_id)
        async for item in with_progress(self.state, owner, context, work):
            if isinstance(item, Progress):
                if item.phase == "apply":
                    applied = item
                yield pb.RestoreEvent(progress=convert.progress_to_proto(item))
                continue
            outcome: RestoreOutcome = item[1]
            restored, unfilled = outcome.restored, outcome.unfilled_secrets
            done = pb.RestoreDone(
                restored=restored is not None,
                duration_ms=int((time.monotonic() - began) * 1000),
                unfilled_secret_paths=bounded_paths(unfilled),
                unfilled_secret_count=len(unfilled),
            )
            log.info(
                "%s %s of thread %s: %d entries, %d files written (%d bytes) in %d ms%s",
                "undo" if undo else "restore",
                restored.id if restored is not None else "(none: the thread has no checkpoint)",
                wanted.thread_id,
                len(restored.files) if restored is not None else 0,
                applied.files_done,
                applied.bytes_done,
                done.duration_ms,
                history_note(outcome),
            )
            if restored is not None:
                done.checkpoint.CopyFrom(convert.summary_of(restored))
            set_history_fields(done, outcome)
            yield pb.RestoreEvent(done=done)

    async def _restore_plan(
        self, wanted: HistoryRestore, undo: bool
    ) -> AsyncIterator[pb.RestoreEvent]:
        """A dry run: the plan's paths in bounded chunks (with those whose live
        changes would be stashed), then done with the counts."""
        store, _ = self.state.stores()
        began = time.monotonic()
        preview = await preview_with_history(
            self.state.workspace_root, store, wanted, data_dir=self.state.data_dir, undo=undo
        )
        done = pb.RestoreDone(restored=False)
        if preview.checkpoint is not None:
            marked = (
                [(path, "written") for path in preview.written]
                + [(path, "deleted") for path in preview.deleted]
                + [(path, "stashed") for path in preview.stashed]
            )
            for chunk in chunks(marked, lambda item: 16 + len(item[0])):
                yield pb.RestoreEvent(
                    plan_paths=pb.RestorePlanPaths(
                        written=[path for path, kind in chunk if kind == "written"],
                        deleted=[path for path, kind in chunk if kind == "deleted"],
                        stashed=[path for path, kind in chunk if kind == "stashed"],
                    )
                )
            done.checkpoint.CopyFrom(convert.summary_of(preview.checkpoint))
            done.plan.CopyFrom(
                pb.RestorePlan(
                    files_written=len(preview.written),
                    paths_deleted=len(preview.deleted),
                    files_kept=preview.kept,
                    dirs_created=preview.dirs_to_make,
                    bytes_to_fetch=preview.bytes_to_fetch,
                    blobs_to_fetch=preview.blobs_to_fetch,
                    paths_stashed=len(preview.stashed),
                    bytes_stashed=preview.bytes_stashed,
                )
            )
        else:
            done.plan.CopyFrom(pb.RestorePlan())
        done.duration_ms = int((time.monotonic() - began) * 1000)
        yield pb.RestoreEvent(done=done)
