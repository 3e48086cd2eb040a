"""The reading calls: a checkpoint, a thread's checkpoints, the threads, a
head, a checkpoint's entries, a diff, a file's bytes and an artifact's."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator

from .. import _native, diffing, validation
from .._engine import run_in_thread
from ..blobs.base import BlobNotFoundError
from ..chunk_blobs import read_file_blobs
from ..codec import decode_entries
from ..errors import (
    MISSING_CHECKPOINT,
    SandboxCheckpointInvalidArgumentError,
    SandboxSnapshotError,
)
from ..history import list_user_threads, owner_of
from ..manifest import manifest_of
from ..model import ARTIFACT_KEY_PREFIX, Checkpoint, Entry, FileEntry, stash_thread_id
from ..secrets import parse_secrets
from ..store.base import ThreadListing
from ..v1 import checkpointd_pb2 as pb
from . import convert, live
from .calls import RpcGroup, chunk_size, chunks, streaming, unary
from .guard import MAX_MESSAGE_BYTES
from .state import Context, recorded_subdir
from .status import MESSAGE_TOO_LARGE, MISSING_ARTIFACT, MISSING_ENTRY, ServiceError

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
# A ListCheckpoints page stops early past this many bytes of summaries.
PAGE_BYTES = 2 * 1024 * 1024


class ReadRpcs(RpcGroup):
    @unary
    async def GetCheckpoint(
        self, request: pb.GetCheckpointRequest, context: Context
    ) -> pb.GetCheckpointResponse:
        checkpoint = await self._checkpoint(request.checkpoint_id)
        response = pb.GetCheckpointResponse(
            checkpoint=convert.summary_of(checkpoint),
            artifacts=[convert.artifact_to_proto(a) for a in checkpoint.artifacts],
            conversation=_conversation_texts(checkpoint) if request.include_conversation else [],
        )
        # What a CaptureRequest carried fits in a reply; a checkpoint made through
        # the Python API may not: say so with the limit instead of failing in
        # the transport.
        if response.ByteSize() > MAX_MESSAGE_BYTES:
            raise ServiceError(
                MESSAGE_TOO_LARGE,
                f"checkpoint {checkpoint.id} with its conversation is {response.ByteSize()} "
                f"bytes, over the {MAX_MESSAGE_BYTES}-byte message limit; ask without "
                "include_conversation",
                checkpoint_id=checkpoint.id,
                limit_bytes=MAX_MESSAGE_BYTES,
                size_bytes=response.ByteSize(),
            )
        return response

    @unary
    async def ListCheckpoints(
        self, request: pb.ListCheckpointsRequest, context: Context
    ) -> pb.ListCheckpointsResponse:
        store, _ = self.state.stores()
        thread_id = validation.check_id(request.thread_id, "thread_id")
        if request.stash:
            thread_id = stash_thread_id(owner_of(thread_id))
        page_size = _page_size(request.page_size)
        checkpoints = await store.list(thread_id)
        if request.HasField("before"):
            before = validation.check_id(request.before, "before")
            index = next((i for i, cp in enumerate(checkpoints) if cp.id == before), None)
            if index is None:
                raise SandboxSnapshotError(
                    MISSING_CHECKPOINT,
                    f"no checkpoint {before!r} in thread {thread_id!r}",
                    details={"thread_id": thread_id, "checkpoint_id": before},
                )
            checkpoints = checkpoints[:index]
        if request.newest_first:
            checkpoints.reverse()
        start = 0
        if request.page_token:
            cursor, newest_first = _decode_page_token(request.page_token)
            if newest_first != request.newest_first:
                raise SandboxCheckpointInvalidArgumentError(
                    "page_token belongs to a listing in the other order (newest_first)",
                    details={"newest_first": str(request.newest_first).lower()},
                )

            def past(cp: Checkpoint) -> bool:
                return _order_key(cp) < cursor if newest_first else _order_key(cp) > cursor

            start = next((i for i, cp in enumerate(checkpoints) if past(cp)), len(checkpoints))
        page = checkpoints[start : start + page_size]
        summaries: list[pb.CheckpointSummary] = []
        size = 0
        for checkpoint in page:
            summary = convert.summary_of(checkpoint)
            size += summary.ByteSize() + 8
            # Summaries carry the recorded policy: a page of huge ones is cut
            # short (the token continues after it), so the reply stays bounded.
            if summaries and size > PAGE_BYTES:
                break
            summaries.append(summary)
        page = page[: len(summaries)]
        more = start + len(page) < len(checkpoints)
        return pb.ListCheckpointsResponse(
            checkpoints=summaries,
            next_page_token=_encode_page_token(page[-1], request.newest_first)
            if more and page
            else "",
        )

    @unary
    async def ListThreads(
        self, request: pb.ListThreadsRequest, context: Context
    ) -> pb.ListThreadsResponse:
        store, _ = self.state.stores()
        if not isinstance(store, ThreadListing):
            raise SandboxCheckpointInvalidArgumentError(
                f"the {self.state.store_backend} store cannot list threads"
            )
        page_size = _page_size(request.page_size)
        after = _decode_thread_token(request.page_token) if request.page_token else None
        # One more than asked: whether a next page exists, without a second query.
        threads = await list_user_threads(store, after=after, limit=page_size + 1)
        page = threads[:page_size]
        response = pb.ListThreadsResponse(
            next_page_token=_encode_thread_token(page[-1].thread_id)
            if len(threads) > page_size
            else ""
        )
        for thread in page:
            summary = response.threads.add(
                thread_id=thread.thread_id,
                checkpoint_count=thread.checkpoint_count,
                newest_created_at=int(thread.newest_created_at),
            )
            if thread.head_checkpoint_id is not None:
                summary.head_checkpoint_id = thread.head_checkpoint_id
        return response

    @unary
    async def GetHead(self, request: pb.GetHeadRequest, context: Context) -> pb.GetHeadResponse:
        store, _ = self.state.stores()
        head = await store.get_head(validation.check_id(request.thread_id, "thread_id"))
        response = pb.GetHeadResponse()
        if head is not None:
            response.checkpoint_id = head
        return response

    @streaming
    async def ListEntries(
        self, request: pb.ListEntriesRequest, context: Context
    ) -> AsyncIterator[pb.ListEntriesResponse]:
        checkpoint = await self._checkpoint(request.checkpoint_id)
        prefix = request.path_prefix.rstrip("/")
        entries = [
            e
            for e in checkpoint.files
            if not prefix or e.path == prefix or e.path.startswith(prefix + "/")
        ]
        for chunk in chunks(entries, _entry_weight):
            yield pb.ListEntriesResponse(entries=[convert.entry_to_proto(e) for e in chunk])

    @streaming
    async def Diff(
        self, request: pb.DiffRequest, context: Context
    ) -> AsyncIterator[pb.DiffResponse]:
        old = await self._checkpoint(request.from_checkpoint_id)
        if request.HasField("to_checkpoint_id"):
            new_entries = (await self._checkpoint(request.to_checkpoint_id)).files
        else:
            subdir = recorded_subdir(request.workspace_subdir, old)
            # Validated here for an early error; the scan itself opens the
            # sub-root from the workspace fd, component by component.
            self.state.check_subroot(subdir)
            policy = old.effective_policy(
                convert.policy_from_proto(request.policy, request.HasField("policy"))
            )
            secrets = convert.secrets_from_proto(request.secrets, request.secret_names)
            new_entries = await live.scan_live(
                self.state.workspace_root,
                validation.checked_subdir(subdir),
                policy,
                tuple(parse_secrets(secrets).values),
                self.state.data_dir,
            )
        changes = list(diffing.diff_entries(old.files, new_entries))

        def weight(change: diffing.Change) -> int:
            return 2 * len(change.path) + 200

        for chunk in chunks(changes, weight):
            yield pb.DiffResponse(changes=[_change_to_proto(c) for c in chunk])

    @streaming
    async def ReadFile(
        self, request: pb.ReadFileRequest, context: Context
    ) -> AsyncIterator[pb.ReadFileResponse]:
        _, blobs = self.state.stores()
        checkpoint = await self._checkpoint(request.checkpoint_id)
        entry = await run_in_thread(lambda: find_entry(checkpoint, request.path))
        if not isinstance(entry, FileEntry):
            raise ServiceError(
                MISSING_ENTRY,
                f"checkpoint {checkpoint.id!r} has no file {request.path!r}",
                checkpoint_id=checkpoint.id,
                path=request.path,
            )
        first = True
        try:
            async for data in read_file_blobs(blobs, entry, chunk_size(request.chunk_size)):
                message = pb.ReadFileResponse(data=data)
                if first:
                    message.entry.CopyFrom(convert.entry_to_proto(entry))
                    first = False
                yield message
        except BlobNotFoundError as exc:
            raise SandboxSnapshotError(
                "SANDBOX_SNAPSHOT_MISSING_BLOB",
                f"blob {entry.blob_key} of {entry.path!r} is missing",
                details={"checkpoint_id": checkpoint.id, "path": entry.path, "key": exc.key},
            ) from exc
        if first:  # an empty file: still send the entry
            yield pb.ReadFileResponse(entry=convert.entry_to_proto(entry))

    @streaming
    async def ReadArtifact(
        self, request: pb.ReadArtifactRequest, context: Context
    ) -> AsyncIterator[pb.ReadArtifactResponse]:
        _, blobs = self.state.stores()
        problem = validation.blob_key_problem(request.blob_key, ARTIFACT_KEY_PREFIX)
        if problem is not None:
            raise SandboxCheckpointInvalidArgumentError(
                f"bad artifact key: {problem}", details={"key": request.blob_key}
            )
        try:
            async for data in blobs.get_stream(request.blob_key, chunk_size(request.chunk_size)):
                yield pb.ReadArtifactResponse(data=data)
        except BlobNotFoundError as exc:
            raise ServiceError(MISSING_ARTIFACT, f"no artifact {exc.key}", key=exc.key) from exc


def _entry_weight(entry: Entry) -> int:
    return (
        64
        + len(entry.path)
        + len(getattr(entry, "target", ""))
        + len(getattr(entry, "blob_key", ""))
    )


_CHANGE_KINDS = {
    "added": pb.CHANGE_KIND_ADDED,
    "deleted": pb.CHANGE_KIND_DELETED,
    "modified": pb.CHANGE_KIND_MODIFIED,
    "mode_changed": pb.CHANGE_KIND_MODE_CHANGED,
}


def _conversation_texts(checkpoint: Checkpoint) -> list[str]:
    """The messages as sent when the capture came over the wire, else re-encoded."""
    if checkpoint.conversation_text is not None:
        return list(checkpoint.conversation_text)
    return convert.conversation_to_proto(checkpoint.conversation)


def _change_to_proto(change: diffing.Change) -> pb.Change:
    message = pb.Change(path=change.path, kind=_CHANGE_KINDS[change.kind])
    if change.old is not None:
        message.old.CopyFrom(convert.entry_to_proto(change.old))
    if change.new is not None:
        message.new.CopyFrom(convert.entry_to_proto(change.new))
    return message


def _order_key(checkpoint: Checkpoint) -> tuple[int, bytes]:
    return (checkpoint.created_at, checkpoint.id.encode("utf-8"))


def _page_size(requested: int) -> int:
    page_size = requested or DEFAULT_PAGE_SIZE
    if page_size > MAX_PAGE_SIZE:
        raise SandboxCheckpointInvalidArgumentError(
            f"page_size must be at most {MAX_PAGE_SIZE}", details={"page_size": page_size}
        )
    return page_size


def _encode_page_token(last: Checkpoint, newest_first: bool = False) -> str:
    raw = json.dumps([last.created_at, last.id, newest_first]).encode()
    return base64.urlsafe_b64encode(raw).decode()


def _decode_page_token(token: str) -> tuple[tuple[int, bytes], bool]:
    """(the last listed checkpoint's order key, newest_first) of a page token."""
    try:
        fields = json.loads(base64.urlsafe_b64decode(token.encode()))
        created_at, checkpoint_id = fields[0], fields[1]
        newest_first = bool(fields[2]) if len(fields) > 2 else False
        return (int(created_at), str(checkpoint_id).encode("utf-8")), newest_first
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        raise SandboxCheckpointInvalidArgumentError(
            "bad page_token", details={"page_token": token[:64]}
        ) from exc


def _encode_thread_token(last_thread_id: str) -> str:
    return base64.urlsafe_b64encode(json.dumps(["thread", last_thread_id]).encode()).decode()


def _decode_thread_token(token: str) -> str:
    try:
        kind, thread_id = json.loads(base64.urlsafe_b64decode(token.encode()))
        if kind != "thread" or not isinstance(thread_id, str):
            raise ValueError(token)
        return validation.check_id(thread_id, "page_token")
    except (ValueError, TypeError) as exc:
        raise SandboxCheckpointInvalidArgumentError(
            "bad page_token", details={"page_token": token[:64]}
        ) from exc


def find_entry(checkpoint: Checkpoint, path: str) -> Entry | None:
    """The entry at ``path``: its row found in the manifest's bytes and
    decoded alone (a scan writes rows in path order), else every entry looked
    at (a manifest some other writer put in another order)."""
    row = _native.manifest_row(manifest_of(checkpoint.files).data, path)
    if row is not None:
        return decode_entries(b"[" + row + b"]")[0]
    return next((e for e in checkpoint.files if e.path == path), None)
