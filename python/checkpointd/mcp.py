"""``checkpointd mcp``: the agent's own tools over the Model Context Protocol (stdio).

"Let the agent save and fork", as in TanStack AI's ``@tanstack/ai-sandbox`` API:
the orchestrator starts this server bound to one thread (``checkpointd mcp
--thread T``) and hands it to the agent as an MCP server. It talks to the
running daemon through the gRPC client (:class:`checkpointd.service.client.Client`),
so the agent never holds store or bucket credentials. Tools:

* ``save_checkpoint(label)`` — capture the workspace into a new named checkpoint
  of the bound thread; returns ``{checkpointId, label, threadId}``.
* ``list_checkpoints(limit?, cursor?)`` — the bound thread's checkpoints, newest
  first, a page of at most ``limit`` (default 20, at most 100), with the head
  and ``nextCursor`` (null on the last page).
* ``fork_checkpoint(checkpointId?)`` — copy the head (or the given checkpoint of the
  bound thread) into a new thread; returns the new thread's id. The source thread
  and its head are left alone.
* ``list_artifacts(checkpointId?)`` — the artifacts of a checkpoint (default: the
  head): ids, names, types, sizes; never their bytes.
* ``read_artifact(artifactId, checkpointId?)`` — one artifact's metadata.
* ``restore_checkpoint(checkpointId?)`` — rewind the workspace to a checkpoint of
  the bound thread (default: the head). It always saves the live tree to the
  thread's stash first (when it differs from what the thread holds) and always
  records: the head then describes the workspace (docs/restore-history.md).
* ``undo_restore()`` — undo the last rewind: restore the newest stash entry,
  saving what it overwrites (undo twice: redo), and record it as the head.

Each tool carries MCP annotations (``readOnlyHint``, ``destructiveHint``,
``idempotentHint``, ``openWorldHint``) and its input schema states the limits:
a label is 1 to 200 characters without C0/C1 control characters, line
separators or bidirectional formatting characters; ids at most MAX_ID_BYTES.

What the agent cannot do, by construction: delete, prune or sweep (no such tool,
and the client calls only Capture, Restore, Undo, ListCheckpoints, GetHead,
GetCheckpoint and Fork; every change a rewind makes can be undone), or read or
write another thread (every call names the bound thread; a
checkpoint id of another thread gets exactly the answer an unknown id gets, so
the tools do not tell whether it exists). Fork only ever creates a thread with a
fresh id, which the daemon refuses to do over a non-empty one.

Errors are tool results with ``isError`` set and a JSON text ``{"error": {"code",
"message", "metadata", "retryable"[, "retryAfterMs"]}}``: WRITER_CONFLICT (a save
raced another save or restore of the thread; ``retryAfterMs`` says when to call
again), MISSING_CHECKPOINT (no head yet, or no such checkpoint on the thread),
INVALID_TOOL_INPUT (bad arguments, the schema's or the daemon's), and otherwise
the daemon's code without its ``SANDBOX_SNAPSHOT_`` prefix (STALE_HEAD,
STORE_UNAVAILABLE, UNSUPPORTED_ENTRY, MISSING_ARTIFACT...). A message that is not
JSON-RPC (bad JSON, a string with a lone surrogate) gets a JSON-RPC error reply.

What a save captures (policy, sub-root, secrets to zero) is fixed by the
orchestrator on the command line (``--exclude``, ``--include``, ``--subdir``,
``--secret-env``, as for ``checkpointd capture``); the agent gives only a label.
A save uses a fresh request id per call (never retried by this server: the agent
decides); fork threads are named ``<thread>-fork-<12 hex>``. A rewind and an
undo use the same secrets (zeroed in what they stash, written back where the
restored files held them).
"""

from __future__ import annotations

import json
import re
import unicodedata
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Any, NoReturn

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import Field, ValidationError
from typing_extensions import TypedDict  # pydantic needs it on Python < 3.12

from .mcp_stdio import serve_checked_stdio
from .service.client import Client, RpcError
from .v1 import checkpointd_pb2 as pb
from .validation import MAX_ID_BYTES

MAX_LABEL_CHARS = 200
DEFAULT_PAGE = 20
MAX_PAGE = 100
# A list_checkpoints cursor is the daemon's page token: an order key and an id.
MAX_CURSOR_CHARS = 1024
# A WRITER_CONFLICT without the daemon's retry_after_ms: call again after this.
DEFAULT_RETRY_MS = 1000
PREFIX = "SANDBOX_SNAPSHOT_"
# Daemon reasons that mean "the tool's input was bad".
_INPUT_REASONS = {
    PREFIX + "INVALID_ID",
    PREFIX + "INVALID_ARGUMENT",
    PREFIX + "INVALID_ENTRY",
    PREFIX + "INVALID_PATH",
}
# A checkpoint that is not (or not on) the bound thread.
_MISSING_REASONS = {
    PREFIX + "MISSING_CHECKPOINT",
    PREFIX + "FORK_SOURCE_NOT_FOUND",
    PREFIX + "FORK_SOURCE_THREAD_MISMATCH",
}
# Failures that calling again later may cure (the codes as the agent sees them).
_RETRYABLE = {"WRITER_CONFLICT", "WRITER_LOST", "STORE_UNAVAILABLE", "DRAINING", "UNAVAILABLE"}
_RETRYABLE |= {"DEADLINE_EXCEEDED"}

# Characters a label must not hold: C0 and C1 control characters and DEL, line and
# paragraph separators, and the bidirectional formatting characters (marks,
# embeddings, overrides, isolates), which make a label read differently from
# what it holds.
_REFUSED_RANGES = (
    (0x00, 0x1F),
    (0x7F, 0x9F),
    (0x061C, 0x061C),
    (0x200E, 0x200F),
    (0x2028, 0x202E),
    (0x2066, 0x2069),
)
_REFUSED_CLASS = "".join(f"\\u{low:04x}-\\u{high:04x}" for low, high in _REFUSED_RANGES)
# The same rule in the input schema (ECMAScript syntax, which Python's re shares here).
LABEL_PATTERN = f"^[^{_REFUSED_CLASS}]*$"
_REFUSED = re.compile(f"[{_REFUSED_CLASS}]")

Label = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_LABEL_CHARS,
        json_schema_extra={"pattern": LABEL_PATTERN},
        description="A name for the checkpoint: 1 to 200 characters, no control characters, "
        "line separators or bidirectional formatting characters.",
    ),
]
CheckpointRef = Annotated[
    str | None,
    Field(
        min_length=1,
        max_length=MAX_ID_BYTES,
        description="A checkpoint id of this thread (default: the head).",
    ),
]
ArtifactRef = Annotated[
    str,
    Field(min_length=1, max_length=MAX_ID_BYTES, description="An artifact id (list_artifacts)."),
]
PageLimit = Annotated[
    int, Field(ge=1, le=MAX_PAGE, description=f"At most this many (1 to {MAX_PAGE}).")
]
Cursor = Annotated[
    str | None,
    Field(
        min_length=1,
        max_length=MAX_CURSOR_CHARS,
        description="nextCursor of the previous page (default: the first page).",
    ),
]

_READ_ONLY = ToolAnnotations(read_only_hint=True, open_world_hint=False)
# Saves and forks add checkpoints and threads; they never change or delete one.
# A rewind and an undo change the workspace, but what they replace goes to the
# thread's stash first (undo_restore brings it back): nothing is lost.
_ADDITIVE = ToolAnnotations(
    read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False
)


def label_problem(label: str) -> str | None:
    """Why ``label`` is refused (naming the rule and the character), or None."""
    if not label.strip():
        return "label must not be blank"
    if len(label) > MAX_LABEL_CHARS:
        return f"label must be 1 to {MAX_LABEL_CHARS} characters, not {len(label)}"
    found = _REFUSED.search(label)
    if found is not None:
        char = found.group()
        name = unicodedata.name(char, "a control character")
        return (
            f"label must not hold control characters, line separators or bidirectional "
            f"formatting characters: U+{ord(char):04X} ({name}) at index {found.start()}"
        )
    return None


@dataclass(frozen=True)
class SaveSettings:
    """How the agent's saves capture, fixed by the orchestrator (``checkpointd mcp
    --exclude/--include/--subdir/--secret-env``): the agent gives only a label."""

    policy: pb.Policy | None = None
    secrets: Sequence[bytes] = ()
    workspace_subdir: str = ""


class SavedCheckpoint(TypedDict):
    checkpointId: str
    label: str
    threadId: str


class CheckpointInfo(TypedDict):
    checkpointId: str
    parentCheckpointId: str | None
    createdAt: int
    reason: str
    label: str | None
    fileCount: int
    totalBytes: int


class CheckpointPage(TypedDict):
    threadId: str
    headCheckpointId: str | None
    checkpoints: list[CheckpointInfo]
    nextCursor: str | None


class ForkedThread(TypedDict):
    threadId: str
    checkpointId: str
    sourceThreadId: str
    sourceCheckpointId: str


class ArtifactInfo(TypedDict):
    artifactId: str
    name: str
    mimeType: str
    size: int
    blobKey: str
    createdAt: int
    checkpointId: str


class ArtifactList(TypedDict):
    checkpointId: str
    artifacts: list[ArtifactInfo]


class SavedBeforeRestore(TypedDict):
    checkpointId: str
    fileCount: int
    totalBytes: int


class Rewound(TypedDict):
    threadId: str
    restoredCheckpointId: str
    headCheckpointId: str | None
    savedBeforeRestore: SavedBeforeRestore | None


def _rewound(thread_id: str, done: pb.RestoreDone, head: str | None) -> Rewound:
    """A rewind's or an undo's result: what was restored, the head now, and
    the stash entry the live tree was saved to first (undo_restore restores it)."""
    saved: SavedBeforeRestore | None = None
    if done.HasField("saved_before_restore"):
        entry = done.saved_before_restore.checkpoint
        saved = {
            "checkpointId": entry.id,
            "fileCount": entry.file_count,
            "totalBytes": entry.total_bytes,
        }
    return {
        "threadId": thread_id,
        "restoredCheckpointId": done.checkpoint.id,
        "headCheckpointId": done.recorded.id if done.HasField("recorded") else head,
        "savedBeforeRestore": saved,
    }


class AgentToolError(ToolError):
    """A tool's failure; its text is JSON the agent (or a program) can read."""


def tool_error(
    code: str, message: str, retry_after_ms: int | None = None, /, **metadata: str
) -> AgentToolError:
    """The error a tool returns: its code, a message, the metadata naming what
    it is about, whether calling again later may succeed, and when."""
    body: dict[str, Any] = {
        "code": code,
        "message": message,
        "metadata": metadata,
        "retryable": code in _RETRYABLE,
    }
    if retry_after_ms is not None:
        body["retryAfterMs"] = retry_after_ms
    return AgentToolError(json.dumps({"error": body}, ensure_ascii=False))


def _raise_rpc(error: RpcError, tool: str = "save_checkpoint") -> NoReturn:
    if error.reason in _INPUT_REASONS:
        code = "INVALID_TOOL_INPUT"
    elif error.reason in _MISSING_REASONS:
        code = "MISSING_CHECKPOINT"
    elif error.reason:
        code = error.reason.removeprefix(PREFIX)
    else:
        code = error.code.name  # no ErrorInfo: the daemon is unreachable, a deadline...
    if code in ("WRITER_CONFLICT", "WRITER_LOST"):
        raw = error.metadata.get("retry_after_ms", "")
        wait_ms = int(raw) if raw.isdecimal() else DEFAULT_RETRY_MS
        message = (
            f"{error.message}; another save or restore of this thread was running: call "
            f"{tool} again in about {max(wait_ms, 1) / 1000:.1f} s"
        )
        raise tool_error(code, message, wait_ms, **error.metadata) from None
    raise tool_error(code, error.message, **error.metadata) from None


class AgentTools(MCPServer):
    """The MCP server: a tool's own error reaches the client as its JSON alone (the
    SDK would prefix it with "Error executing tool ..."), schema failures become
    INVALID_TOOL_INPUT like the rest, and stdio answers what the SDK would drop."""

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> Any:
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as error:
            if isinstance(error.__cause__, AgentToolError):
                raise error.__cause__ from None
            if isinstance(error.__cause__, ValidationError):
                problems = "; ".join(
                    f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}"
                    for e in error.__cause__.errors()
                )
                raise tool_error("INVALID_TOOL_INPUT", f"{name}: {problems}") from error
            raise

    async def run_stdio_async(self) -> None:
        """Serve on stdin/stdout; a message the SDK cannot parse is answered
        with a JSON-RPC error (``mcp_stdio``) instead of silence."""
        server = self._lowlevel_server
        await serve_checked_stdio(
            lambda read, write: server.run(read, write, server.create_initialization_options())
        )


def _info(s: pb.CheckpointSummary) -> CheckpointInfo:
    return {
        "checkpointId": s.id,
        "parentCheckpointId": s.parent_checkpoint_id
        if s.HasField("parent_checkpoint_id")
        else None,
        "createdAt": s.created_at,
        "reason": s.reason,
        "label": s.label if s.HasField("label") else None,
        "fileCount": s.file_count,
        "totalBytes": s.total_bytes,
    }


def _artifact(artifact: pb.Artifact, checkpoint_id: str) -> ArtifactInfo:
    return {
        "artifactId": artifact.artifact_id,
        "name": artifact.name,
        "mimeType": artifact.mime_type,
        "size": artifact.size,
        "blobKey": artifact.blob_key,
        "createdAt": artifact.created_at,
        "checkpointId": checkpoint_id,
    }


class _Thread:
    """The daemon as the bound thread's agent sees it: the lifespan context of
    every tool call (the thread, the daemon client, what saves capture)."""

    def __init__(self, thread_id: str, client: Client, save: SaveSettings) -> None:
        self.thread_id = thread_id
        self.client = client
        self.save = save

    def missing(self, checkpoint_id: str) -> AgentToolError:
        """The one answer for an id that is not a checkpoint of this thread,
        whether it is unknown or another thread's."""
        return tool_error(
            "MISSING_CHECKPOINT",
            f"thread {self.thread_id} has no checkpoint {checkpoint_id}",
            thread_id=self.thread_id,
            checkpoint_id=checkpoint_id,
        )

    async def checkpoint(self, checkpoint_id: str | None) -> pb.GetCheckpointResponse:
        """The given checkpoint if it is on the bound thread, else the head."""
        try:
            if checkpoint_id is None:
                head = await self.client.get_head(self.thread_id)
                if head is None:
                    raise tool_error(
                        "MISSING_CHECKPOINT",
                        f"thread {self.thread_id} has no checkpoint yet: save_checkpoint first",
                        thread_id=self.thread_id,
                    )
                checkpoint_id = head
            detail = await self.client.get_checkpoint(checkpoint_id)
        except RpcError as error:
            if error.reason == PREFIX + "MISSING_CHECKPOINT" and checkpoint_id is not None:
                raise self.missing(checkpoint_id) from None
            _raise_rpc(error)
        if detail.checkpoint.thread_id != self.thread_id:
            raise self.missing(checkpoint_id)
        return detail


def _bound(ctx: Context[Any, Any]) -> _Thread:
    thread: _Thread = ctx.request_context.lifespan_context
    return thread


# ---------------------------------------------------------------- the tools
# Their docstrings are what the agent reads about them.


async def save_checkpoint(label: Label, ctx: Context[Any, Any]) -> SavedCheckpoint:
    """Save the workspace as a named checkpoint of this thread.

    Returns its id. Fails with WRITER_CONFLICT while another save or restore of
    the thread runs: call again after the error's retryAfterMs.
    """
    problem = label_problem(label)
    if problem is not None:
        raise tool_error("INVALID_TOOL_INPUT", problem)
    thread = _bound(ctx)
    try:
        done = await thread.client.capture(
            thread.thread_id,
            label=label,
            policy=thread.save.policy,
            secrets=thread.save.secrets,
            workspace_subdir=thread.save.workspace_subdir,
            request_id=str(uuid.uuid4()),
        )
    except RpcError as error:
        _raise_rpc(error)
    return {"checkpointId": done.checkpoint.id, "label": label, "threadId": thread.thread_id}


async def list_checkpoints(
    ctx: Context[Any, Any], limit: PageLimit = DEFAULT_PAGE, cursor: Cursor = None
) -> CheckpointPage:
    """List this thread's checkpoints, newest first, a page at a time, and its
    head (the newest save). Pass nextCursor back as cursor for the next page."""
    thread = _bound(ctx)
    try:
        page = await thread.client.list_checkpoints_page(
            thread.thread_id, page_size=limit, page_token=cursor or "", newest_first=True
        )
        head = await thread.client.get_head(thread.thread_id)
    except RpcError as error:
        _raise_rpc(error)
    return {
        "threadId": thread.thread_id,
        "headCheckpointId": head,
        "checkpoints": [_info(s) for s in page.checkpoints],
        "nextCursor": page.next_page_token or None,
    }


async def fork_checkpoint(
    ctx: Context[Any, Any], checkpointId: CheckpointRef = None
) -> ForkedThread:
    """Copy a checkpoint of this thread (default: the head) into a new thread.

    Returns the new thread's id; this thread and its head are left as they are.
    """
    thread = _bound(ctx)
    source = (await thread.checkpoint(checkpointId)).checkpoint.id
    destination = f"{thread.thread_id}-fork-{uuid.uuid4().hex[:12]}"
    try:
        forked = await thread.client.fork(thread.thread_id, source, destination)
    except RpcError as error:
        _raise_rpc(error)
    return {
        "threadId": destination,
        "checkpointId": forked.id,
        "sourceThreadId": thread.thread_id,
        "sourceCheckpointId": source,
    }


async def restore_checkpoint(ctx: Context[Any, Any], checkpointId: CheckpointRef = None) -> Rewound:
    """Rewind the workspace to a checkpoint of this thread (default: the head).

    Your uncommitted changes are saved to the thread's stash first, and the
    restored checkpoint becomes the head: undo_restore brings the changes back.
    """
    thread = _bound(ctx)
    target = (await thread.checkpoint(checkpointId)).checkpoint.id
    try:
        done = await thread.client.restore(
            thread.thread_id, checkpoint_id=target, record=True, secrets=thread.save.secrets
        )
        head = await thread.client.get_head(thread.thread_id)
    except RpcError as error:
        _raise_rpc(error, "restore_checkpoint")
    return _rewound(thread.thread_id, done, head)


async def undo_restore(ctx: Context[Any, Any]) -> Rewound:
    """Undo the last restore_checkpoint (or undo_restore): bring back the
    workspace it replaced, saving the current one first (undo twice: redo).

    Fails with MISSING_CHECKPOINT when nothing was replaced yet.
    """
    thread = _bound(ctx)
    try:
        done = await thread.client.undo(thread.thread_id, record=True, secrets=thread.save.secrets)
        head = await thread.client.get_head(thread.thread_id)
    except RpcError as error:
        _raise_rpc(error, "undo_restore")
    return _rewound(thread.thread_id, done, head)


async def list_artifacts(
    ctx: Context[Any, Any], checkpointId: CheckpointRef = None
) -> ArtifactList:
    """List the artifacts of a checkpoint of this thread (default: the head):
    ids, names, types and sizes. Never their bytes."""
    detail = await _bound(ctx).checkpoint(checkpointId)
    source = detail.checkpoint.id
    return {"checkpointId": source, "artifacts": [_artifact(a, source) for a in detail.artifacts]}


async def read_artifact(
    artifactId: ArtifactRef, ctx: Context[Any, Any], checkpointId: CheckpointRef = None
) -> ArtifactInfo:
    """Describe an artifact of a checkpoint of this thread (default: the head):
    name, type, size and key. Never its bytes."""
    detail = await _bound(ctx).checkpoint(checkpointId)
    source = detail.checkpoint.id
    for artifact in detail.artifacts:
        if artifact.artifact_id == artifactId:
            return _artifact(artifact, source)
    raise tool_error(
        "MISSING_ARTIFACT",
        f"checkpoint {source} has no artifact {artifactId}",
        checkpoint_id=source,
        artifact_id=artifactId,
    )


# Each tool and what it may change (saves, forks, rewinds and undos add; see _ADDITIVE).
TOOLS: tuple[tuple[Callable[..., Any], ToolAnnotations], ...] = (
    (save_checkpoint, _ADDITIVE),
    (list_checkpoints, _READ_ONLY),
    (fork_checkpoint, _ADDITIVE),
    (restore_checkpoint, _ADDITIVE),
    (undo_restore, _ADDITIVE),
    (list_artifacts, _READ_ONLY),
    (read_artifact, _READ_ONLY),
)


def build_server(
    thread_id: str, connect: Callable[[], Client], save: SaveSettings | None = None
) -> AgentTools:
    """The server for one thread; ``connect`` makes the daemon client (opened once)."""
    settings = save or SaveSettings()

    @asynccontextmanager
    async def lifespan(_: MCPServer[Any]) -> AsyncIterator[_Thread]:
        async with connect() as client:
            yield _Thread(thread_id, client, settings)

    server = AgentTools(
        "checkpointd",
        instructions=(
            f"Checkpoints of your workspace (thread {thread_id}). save_checkpoint before a "
            "risky step; fork_checkpoint to try an alternative in a new thread; "
            "restore_checkpoint to rewind (undo_restore takes the rewind back)."
        ),
        lifespan=lifespan,
    )
    for tool, hints in TOOLS:
        server.add_tool(tool, annotations=hints)
    return server


def serve_stdio(thread_id: str, save: SaveSettings, connect: Callable[[], Client]) -> int:
    """Run the server on stdin/stdout until the client closes it; ``connect`` makes
    the daemon client (address, token and TLS from the command line)."""
    if not thread_id:
        raise ValueError("--thread must not be empty")
    build_server(thread_id, connect, save).run("stdio")
    return 0


__all__ = [
    "LABEL_PATTERN",
    "AgentToolError",
    "AgentTools",
    "SaveSettings",
    "build_server",
    "label_problem",
    "serve_stdio",
    "tool_error",
]
