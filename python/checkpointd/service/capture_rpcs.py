"""Capture and UploadArtifact: the calls that make what a checkpoint holds.

Capture ``request_id``: the checkpoint id is derived from the thread and the
request_id (``ids.derive_request_id``: a UUIDv8 bound to its thread). Before
capturing, the servicer looks that id up; when an earlier attempt already
committed it (the reply was lost), the retry returns it with
``done.replayed = true`` instead of making a second checkpoint. A retry that
races the first attempt still running gets WRITER_CONFLICT (ABORTED) and should
retry again; the id's uniqueness in the store makes a double append impossible.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from .. import validation
from ..capture import CaptureOptions, capture_checkpoint
from ..errors import SandboxCheckpointInvalidArgumentError, SandboxCheckpointWriterConflictError
from ..ids import new_uuid7
from ..model import Artifact, Checkpoint
from ..progress import Progress
from ..store.base import CheckpointStore
from ..v1 import checkpointd_pb2 as pb
from . import convert
from .calls import RpcGroup, log, streaming, unary
from .request_ids import derive_checkpoint_id, refuse_spent_request_id
from .state import Context, with_progress

# How often a retry polls for the first attempt's checkpoint on another daemon.
REPLAY_POLL_S = 0.1
# Metadata a client sends on a capture it retries (the attempt number, 2 and up;
# the TypeScript and Go SDKs do). Only a marked retry waits for another daemon's
# attempt to free the lease: a first attempt meeting a live lease is the reference API's
# fail-fast WRITER_CONFLICT, even with a request_id.
ATTEMPT_METADATA = "checkpointd-attempt"


@dataclass(frozen=True)
class _Asked:
    """What a CaptureRequest asks to record beside the files: a retry with the
    same request_id must ask for the same."""

    label: str | None
    source_run_id: str | None
    workspace_subdir: str
    conversation: tuple[Any, ...]
    artifacts: tuple[Artifact, ...]


def _check_replay(committed: Checkpoint, request_id: str, asked: _Asked) -> None:
    """A retry must ask for what the first attempt did: a request_id sent again
    with other parameters is a client bug, not a retry (INVALID_ARGUMENT naming
    the field). Secrets and the policy are not compared: secrets are never
    stored, and the scan result is what the first attempt captured."""
    given = {
        "label": (asked.label, committed.label),
        "source_run_id": (asked.source_run_id, committed.source_run_id),
        "workspace_subdir": (asked.workspace_subdir, committed.workspace_subdir),
        "conversation": (asked.conversation, tuple(committed.conversation)),
        "artifacts": (asked.artifacts, tuple(committed.artifacts)),
    }
    for name, (now, then) in given.items():
        if now != then:
            raise SandboxCheckpointInvalidArgumentError(
                f"request_id {request_id!r} was first sent with another {name}: a retry "
                "must repeat the request; use a new request_id for a new capture",
                details={"field": name, "request_id": request_id, "checkpoint_id": committed.id},
            )


def capture_attempt(context: Context) -> int:
    """The attempt number the client marked the call with (1 when unmarked)."""
    for key, value in context.invocation_metadata() or ():
        if key == ATTEMPT_METADATA and isinstance(value, str) and value.isdigit():
            return int(value)
    return 1


def _replayed(thread_id: str, request_id: str, committed: Checkpoint) -> list[pb.CaptureEvent]:
    """The events answering a retry whose first attempt committed ``committed``."""
    log.info(
        "capture %s of thread %s: replayed (request_id %s), %d entries",
        committed.id,
        thread_id,
        request_id,
        len(committed.files),
    )
    return [
        pb.CaptureEvent(started=pb.CaptureStarted(thread_id=thread_id, checkpoint_id=committed.id)),
        pb.CaptureEvent(
            done=pb.CaptureDone(
                checkpoint=convert.summary_of(committed),
                stats=pb.CaptureStats(),
                replayed=True,
            )
        ),
    ]


def _capture_done(thread_id: str, result: Any) -> pb.CaptureEvent:
    """The ``done`` event of a capture the engine finished (logged)."""
    stats = result.stats
    log.info(
        "capture %s of thread %s: %s%d entries, %d hashed, %d reused, %d blobs "
        "uploaded (%d bytes) in %d ms",
        result.checkpoint.id,
        thread_id,
        "unchanged, " if result.unchanged else "",
        stats.entries,
        stats.files_hashed,
        stats.files_reused,
        stats.blobs_uploaded,
        stats.bytes_uploaded,
        stats.duration_ms,
    )
    return pb.CaptureEvent(
        done=pb.CaptureDone(
            checkpoint=convert.summary_of(result.checkpoint),
            stats=convert.stats_to_proto(result.stats),
            unchanged=result.unchanged,
        )
    )


class CaptureRpcs(RpcGroup):
    @streaming
    async def Capture(
        self, request: pb.CaptureRequest, context: Context
    ) -> AsyncIterator[pb.CaptureEvent]:
        store, blobs = self.state.stores()
        thread_id = validation.check_id(request.thread_id, "thread_id")
        # Validated here for an early error; the engine opens it by fd.
        self.state.check_subroot(request.workspace_subdir)
        policy = convert.policy_from_proto(request.policy, request.HasField("policy"))
        asked = _Asked(
            label=request.label if request.HasField("label") else None,
            source_run_id=request.source_run_id if request.HasField("source_run_id") else None,
            workspace_subdir=validation.checked_subdir(request.workspace_subdir),
            conversation=tuple(convert.conversation_from_proto(request.conversation)),
            artifacts=tuple(convert.artifact_from_proto(a) for a in request.artifacts),
        )
        secrets = convert.secrets_from_proto(request.secrets, request.secret_names)
        if request.HasField("request_id"):
            request_id = validation.check_id(request.request_id, "request_id")
            checkpoint_id = derive_checkpoint_id(thread_id, request_id)
            committed = await self._committed_attempt(store, thread_id, checkpoint_id, context)
            if committed is not None:
                _check_replay(committed, request_id, asked)
                for event in _replayed(thread_id, request_id, committed):
                    yield event
                return
            await refuse_spent_request_id(self.state, thread_id, request_id, checkpoint_id)
        else:
            checkpoint_id = new_uuid7()
        yield pb.CaptureEvent(
            started=pb.CaptureStarted(thread_id=thread_id, checkpoint_id=checkpoint_id)
        )

        async def work(progress: Callable[[Progress], None]) -> Any:
            # The engine opens the sub-root from the workspace fd, component by
            # component (``check_subroot`` above only checked it early).
            return await capture_checkpoint(
                self.state.workspace_root,
                store,
                blobs,
                thread_id,
                CaptureOptions(
                    label=asked.label,
                    policy=policy,
                    secrets=secrets,
                    conversation=asked.conversation,
                    artifacts=asked.artifacts,
                    source_run_id=asked.source_run_id,
                    data_dir=self.state.data_dir,
                    progress=progress,
                    checkpoint_id=checkpoint_id,
                    workspace_subdir=asked.workspace_subdir,
                    skip_if_unchanged=request.skip_if_unchanged,
                    # Kept byte for byte as sent (the proto promises it verbatim).
                    conversation_text=tuple(request.conversation),
                    journal=self.state.journal,
                ),
            )

        async for item in with_progress(self.state, thread_id, context, work, checkpoint_id):
            if isinstance(item, Progress):
                yield pb.CaptureEvent(progress=convert.progress_to_proto(item))
            else:
                yield _capture_done(thread_id, item[1])

    async def _committed_attempt(
        self, store: CheckpointStore, thread_id: str, checkpoint_id: str, context: Context
    ) -> Checkpoint | None:
        """The thread's checkpoint an earlier attempt with this request_id
        committed, or None (then this call captures)."""
        # A retry while the first attempt still runs here: wait for it (the
        # call's deadline bounds the wait) and answer with its result.
        await self.state.join_capture(checkpoint_id)
        committed = await store.get(checkpoint_id)
        if committed is None and capture_attempt(context) > 1:
            committed = await self._await_other_attempt(store, thread_id, checkpoint_id, context)
        if committed is not None and committed.thread_id == thread_id:
            return committed
        return None

    async def _await_other_attempt(
        self, store: CheckpointStore, thread_id: str, checkpoint_id: str, context: Context
    ) -> Checkpoint | None:
        """While another daemon (sharing the store) holds the thread's lease, a
        retry waits (until the lease frees, at most the call's deadline or one
        lease duration) for the first attempt's checkpoint to appear. Returns it,
        or None when the lease is free and nothing was committed."""

        loop = asyncio.get_running_loop()
        remaining = context.time_remaining()
        bound = float(getattr(store, "lease_duration_ms", 120_000)) / 1000
        deadline = loop.time() + (bound if remaining is None else min(bound, remaining))
        while True:
            try:
                lease = await store.acquire_writer(thread_id)
            except SandboxCheckpointWriterConflictError:
                committed = await store.get(checkpoint_id)
                if committed is not None or loop.time() >= deadline:
                    return committed
                await asyncio.sleep(REPLAY_POLL_S)
                continue
            await lease.release()
            return await store.get(checkpoint_id)

    @unary
    async def UploadArtifact(
        self, request_iterator: AsyncIterator[pb.UploadArtifactRequest], context: Context
    ) -> pb.UploadArtifactResponse:
        from ..artifacts import upload_artifact

        store, blobs = self.state.stores()
        first = await anext(aiter(request_iterator), None)
        if first is None or first.WhichOneof("part") != "metadata":
            raise SandboxCheckpointInvalidArgumentError(
                "the first UploadArtifact message must be metadata"
            )

        async def chunks() -> AsyncIterator[bytes]:
            async for message in request_iterator:
                if message.WhichOneof("part") != "chunk":
                    raise SandboxCheckpointInvalidArgumentError("metadata may only come first")
                yield message.chunk

        artifact = await upload_artifact(
            blobs, first.metadata.name, first.metadata.mime_type, chunks(), index=store
        )
        return pb.UploadArtifactResponse(artifact=convert.artifact_to_proto(artifact))
