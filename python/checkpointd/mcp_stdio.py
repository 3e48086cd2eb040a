"""The MCP server's stdio transport: the SDK's, with every message answered.

The MCP SDK reads one JSON-RPC message a line and drops a line it cannot parse
without a reply, so a client that sent it waits forever. A lone surrogate
(``"\\ud800"``) is such a line: valid JSON syntax, but not Unicode text, which
the SDK's parser refuses. Here each line is checked first; one that would be
dropped is answered with a JSON-RPC error (PARSE_ERROR for bad JSON,
INVALID_REQUEST with the request's id otherwise) and not passed on. Responses
and notifications get no reply, as JSON-RPC says.

The wire is a private duplicate of stdout; while serving, file descriptor 1
points at stderr and 0 at /dev/null, so stray output never corrupts the wire.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, BinaryIO, cast

import anyio
import anyio.to_thread
import mcp.types as types
from mcp.server.stdio import stdio_server

# The longest request id an error reply echoes (a longer one is answered with id null).
_MAX_ECHOED_ID_CHARS = 512


class Wire:
    """The client's end: whole lines, written one at a time (the SDK's writer
    and the error replies share it)."""

    def __init__(self, sink: BinaryIO) -> None:
        self._sink = sink
        self._lock = anyio.Lock()

    def _write(self, data: bytes) -> None:
        self._sink.write(data)
        self._sink.flush()

    async def write(self, text: str) -> None:
        async with self._lock:
            await anyio.to_thread.run_sync(self._write, text.encode("utf-8"))

    async def flush(self) -> None:
        """Every write is flushed already."""


def _usable_id(value: Any) -> int | str | None:
    """The request's id to echo in an error, None when it has no usable one."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        return None
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return None
        if len(value) > _MAX_ECHOED_ID_CHARS:
            return None
    return value


def _holds_lone_surrogate(value: Any) -> bool:
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def rejection(line: str, problem: Exception) -> str | None:
    """The JSON-RPC error line answering ``line``, which the SDK cannot parse
    (``problem`` says why), or None when no reply is due (a blank line, a
    response or a notification)."""
    if not line.strip():
        return None
    try:
        message = json.loads(line)
    except ValueError as error:
        return _error_line(None, types.PARSE_ERROR, f"Parse error: {error}")
    if not isinstance(message, dict):
        return _error_line(None, types.INVALID_REQUEST, "Invalid Request: not a JSON object")
    if "id" not in message or "method" not in message:
        return None  # a notification or a response: JSON-RPC answers neither
    request_id = _usable_id(message["id"])
    if _holds_lone_surrogate(message):
        text = (
            "Invalid Request: a string holds a lone surrogate (a \\ud800-\\udfff escape "
            "without its pair), which is not Unicode text"
        )
    else:
        text = f"Invalid Request: {str(problem).splitlines()[0]}"
    return _error_line(request_id, types.INVALID_REQUEST, text)


def _error_line(request_id: int | str | None, code: int, message: str) -> str:
    reply = {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}
    return json.dumps(reply, ensure_ascii=True) + "\n"


async def checked_lines(lines: AsyncIterator[str], wire: Wire) -> AsyncIterator[str]:
    """The lines the SDK can parse; the others are answered on ``wire``."""
    async for line in lines:
        try:
            types.jsonrpc_message_adapter.validate_json(line, by_name=False)
        except Exception as problem:  # noqa: BLE001 - the SDK would drop the line on any
            reply = rejection(line, problem)
            if reply is not None:
                await wire.write(reply)
            continue
        yield line


async def serve_checked_stdio(run: Callable[[Any, Any], Awaitable[None]]) -> None:
    """Run ``run(read_stream, write_stream)`` (the low-level server) on this
    process's stdin and stdout through the checks above."""
    wire_fd, input_fd = os.dup(1), os.dup(0)
    saved_out, saved_in = os.dup(1), os.dup(0)
    os.dup2(2, 1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    try:
        with (
            os.fdopen(wire_fd, "wb") as sink,
            open(input_fd, encoding="utf-8", errors="replace") as source,  # noqa: ASYNC230
        ):
            wire = Wire(sink)
            lines = checked_lines(cast(AsyncIterator[str], anyio.wrap_file(source)), wire)
            async with stdio_server(stdin=cast(Any, lines), stdout=cast(Any, wire)) as streams:
                await run(*streams)
    finally:
        os.dup2(saved_out, 1)
        os.dup2(saved_in, 0)
        os.close(saved_out)
        os.close(saved_in)
