"""``checkpointd mcp``: the agent's own tools over the Model Context Protocol (stdio).

The seeds' "Let the Agent Save and Fork": the orchestrator starts this server
bound to one thread (``checkpointd mcp --thread T``) and hands it to the agent as
an MCP server. It talks to the running daemon through the gRPC client
(:class:`checkpointd.service.client.Client`), so the agent never holds store or
bucket credentials. Tools:

* ``save_checkpoint(label)`` — capture the workspace into a new named checkpoint
  of the bound thread; returns ``{checkpointId, label, threadId}``.
* ``list_checkpoints()`` — the bound thread's checkpoints, oldest first, and its head.
* ``fork_checkpoint(checkpointId?)`` — copy the head (or the given checkpoint of the
  bound thread) into a new thread; returns the new thread's id. The source thread
  and its head are left alone.
* ``read_artifact(artifactId, checkpointId?)`` — an artifact's metadata (name,
  type, size, key), never its bytes.

What the agent cannot do, by construction: delete, prune or sweep (no such tool,
and the client calls only Capture, ListCheckpoints, GetHead, GetCheckpoint and
Fork), or read or write another thread (every call names the bound thread; a
checkpoint id of another thread is MISSING_CHECKPOINT). Fork only ever creates a
thread with a fresh id, which the daemon refuses to do over a non-empty one.

Errors are tool results with ``isError`` set and a JSON text
``{"error": {"code", "message", "metadata"}}``, with the seeds' codes:
WRITER_CONFLICT (a save raced another writer: try again later), MISSING_CHECKPOINT
(fork of a thread with no head, or a checkpoint not on the thread),
INVALID_TOOL_INPUT (bad arguments, the schema's or the daemon's), and otherwise
the daemon's code without its ``SANDBOX_SNAPSHOT_`` prefix (STALE_HEAD,
STORE_UNAVAILABLE, UNSUPPORTED_ENTRY, MISSING_ARTIFACT...).

What a save captures (policy, sub-root, secrets to zero) is fixed by the
orchestrator on the command line (``--exclude``, ``--include``, ``--subdir``,
``--secret-env``, as for ``checkpointd capture``); the agent gives only a label.

Decisions where the issue is silent: a label is 1 to 200 characters with no control
character; a save uses a fresh request id per call (a save is never retried by
this server: the agent decides); fork threads are named ``<thread>-fork-<12 hex>``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, NoReturn

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import ValidationError
from typing_extensions import TypedDict  # pydantic needs it on Python < 3.12

from .service.client import Client, RpcError
from .v1 import checkpointd_pb2 as pb

MAX_LABEL_CHARS = 200
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


class CheckpointList(TypedDict):
    threadId: str
    headCheckpointId: str | None
    checkpoints: list[CheckpointInfo]


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


class AgentToolError(ToolError):
    """A tool's failure; its text is JSON the agent (or a program) can read."""


def tool_error(code: str, message: str, **metadata: str) -> AgentToolError:
    body = {"error": {"code": code, "message": message, "metadata": metadata}}
    return AgentToolError(json.dumps(body, ensure_ascii=False))


def _raise_rpc(error: RpcError) -> NoReturn:
    if error.reason in _INPUT_REASONS:
        code = "INVALID_TOOL_INPUT"
    elif error.reason in _MISSING_REASONS:
        code = "MISSING_CHECKPOINT"
    elif error.reason:
        code = error.reason.removeprefix(PREFIX)
    else:
        code = error.code.name  # no ErrorInfo: the daemon is unreachable, a deadline...
    raise tool_error(code, error.message, **error.metadata) from None


class AgentTools(MCPServer):
    """The MCP server: a tool's own error reaches the client as its JSON alone (the
    SDK would prefix it with "Error executing tool ..."), and schema failures
    become INVALID_TOOL_INPUT like the rest."""

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


def build_server(
    thread_id: str, connect: Callable[[], Client], save: SaveSettings | None = None
) -> AgentTools:
    """The server for one thread; ``connect`` makes the daemon client (opened once)."""
    save = save or SaveSettings()

    @asynccontextmanager
    async def lifespan(_: MCPServer[Any]) -> AsyncIterator[Client]:
        async with connect() as client:
            yield client

    server = AgentTools(
        "checkpointd",
        instructions=(
            f"Checkpoints of your workspace (thread {thread_id}). save_checkpoint before a "
            "risky step; fork_checkpoint to try an alternative in a new thread."
        ),
        lifespan=lifespan,
    )

    def daemon(ctx: Context[Any, Any]) -> Client:
        client: Client = ctx.request_context.lifespan_context
        return client

    @server.tool()
    async def save_checkpoint(label: str, ctx: Context[Any, Any]) -> SavedCheckpoint:
        """Save the workspace as a named checkpoint of this thread.

        Returns its id. Fails with WRITER_CONFLICT while another save or restore of
        the thread runs (try again later).
        """
        if not label.strip() or len(label) > MAX_LABEL_CHARS:
            raise tool_error(
                "INVALID_TOOL_INPUT", f"label must be 1 to {MAX_LABEL_CHARS} characters"
            )
        if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in label):
            raise tool_error("INVALID_TOOL_INPUT", "label must not hold control characters")
        try:
            done = await daemon(ctx).capture(
                thread_id,
                label=label,
                policy=save.policy,
                secrets=save.secrets,
                workspace_subdir=save.workspace_subdir,
                request_id=str(uuid.uuid4()),
            )
        except RpcError as error:
            _raise_rpc(error)
        return {"checkpointId": done.checkpoint.id, "label": label, "threadId": thread_id}

    @server.tool()
    async def list_checkpoints(ctx: Context[Any, Any]) -> CheckpointList:
        """List this thread's checkpoints, oldest first, and its head (the newest save)."""
        client = daemon(ctx)
        try:
            summaries = await client.list_checkpoints(thread_id)
            head = await client.get_head(thread_id)
        except RpcError as error:
            _raise_rpc(error)
        return {
            "threadId": thread_id,
            "headCheckpointId": head,
            "checkpoints": [
                {
                    "checkpointId": s.id,
                    "parentCheckpointId": (
                        s.parent_checkpoint_id if s.HasField("parent_checkpoint_id") else None
                    ),
                    "createdAt": s.created_at,
                    "reason": s.reason,
                    "label": s.label if s.HasField("label") else None,
                    "fileCount": s.file_count,
                    "totalBytes": s.total_bytes,
                }
                for s in summaries
            ],
        }

    async def own_checkpoint(client: Client, checkpoint_id: str | None) -> str:
        """The given checkpoint id if it is on the bound thread, else the head."""
        try:
            if checkpoint_id is None:
                head = await client.get_head(thread_id)
                if head is None:
                    raise tool_error(
                        "MISSING_CHECKPOINT",
                        f"thread {thread_id} has no checkpoint yet: save_checkpoint first",
                        thread_id=thread_id,
                    )
                return head
            detail = await client.get_checkpoint(checkpoint_id)
        except RpcError as error:
            _raise_rpc(error)
        if detail.checkpoint.thread_id != thread_id:
            raise tool_error(
                "MISSING_CHECKPOINT",
                f"checkpoint {checkpoint_id} is not on thread {thread_id}",
                thread_id=thread_id,
                checkpoint_id=checkpoint_id,
            )
        return checkpoint_id

    @server.tool()
    async def fork_checkpoint(
        ctx: Context[Any, Any], checkpointId: str | None = None
    ) -> ForkedThread:
        """Copy a checkpoint of this thread (default: the head) into a new thread.

        Returns the new thread's id; this thread and its head are left as they are.
        """
        client = daemon(ctx)
        source = await own_checkpoint(client, checkpointId)
        destination = f"{thread_id}-fork-{uuid.uuid4().hex[:12]}"
        try:
            forked = await client.fork(thread_id, source, destination)
        except RpcError as error:
            _raise_rpc(error)
        return {
            "threadId": destination,
            "checkpointId": forked.id,
            "sourceThreadId": thread_id,
            "sourceCheckpointId": source,
        }

    @server.tool()
    async def read_artifact(
        artifactId: str, ctx: Context[Any, Any], checkpointId: str | None = None
    ) -> ArtifactInfo:
        """Describe an artifact of a checkpoint of this thread (default: the head):
        name, type, size and key. Never its bytes."""
        client = daemon(ctx)
        source = await own_checkpoint(client, checkpointId)
        try:
            detail = await client.get_checkpoint(source)
        except RpcError as error:
            _raise_rpc(error)
        for artifact in detail.artifacts:
            if artifact.artifact_id == artifactId:
                return {
                    "artifactId": artifact.artifact_id,
                    "name": artifact.name,
                    "mimeType": artifact.mime_type,
                    "size": artifact.size,
                    "blobKey": artifact.blob_key,
                    "createdAt": artifact.created_at,
                    "checkpointId": source,
                }
        raise tool_error(
            "MISSING_ARTIFACT",
            f"checkpoint {source} has no artifact {artifactId}",
            checkpoint_id=source,
            artifact_id=artifactId,
        )

    return server


def serve_stdio(thread_id: str, save: SaveSettings, connect: Callable[[], Client]) -> int:
    """Run the server on stdin/stdout until the client closes it; ``connect`` makes
    the daemon client (address, token and TLS from the command line)."""
    if not thread_id:
        raise ValueError("--thread must not be empty")
    build_server(thread_id, connect, save).run("stdio")
    return 0


__all__ = [
    "AgentToolError",
    "AgentTools",
    "SaveSettings",
    "build_server",
    "serve_stdio",
    "tool_error",
]
