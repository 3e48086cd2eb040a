"""``checkpointd mcp``: the agent's tools, run through the MCP client SDK over stdio
against a real daemon (the server is a ``python -m checkpointd mcp`` subprocess)."""

from __future__ import annotations

import json
import select
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

from mcp import Client
from mcp.client.stdio import StdioServerParameters

from checkpointd import open_store

from .conftest import Daemon, clean_env

TOOLS = {
    "save_checkpoint",
    "list_checkpoints",
    "fork_checkpoint",
    "list_artifacts",
    "read_artifact",
    "restore_checkpoint",
    "undo_restore",
}
READ_ONLY = {"list_checkpoints", "list_artifacts", "read_artifact"}


@asynccontextmanager
async def agent(
    daemon: Daemon, thread: str, *extra: str, env: dict[str, str] | None = None
) -> AsyncIterator[Client]:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "checkpointd", "mcp", "--thread", thread, "--address", daemon.address, *extra],
        env=clean_env(**(env or {})),
    )
    async with Client(params, read_timeout_seconds=60) as client:
        yield client


async def call(client: Client, tool: str, arguments: dict[str, Any] | None = None) -> Any:
    result = await client.call_tool(tool, arguments or {})
    assert not result.is_error, result.content
    return result.structured_content


async def fails(client: Client, tool: str, arguments: dict[str, Any], code: str) -> dict:
    result = await client.call_tool(tool, arguments)
    assert result.is_error, result
    error = json.loads(result.content[0].text)["error"]
    assert error["code"] == code, error
    return error


async def test_tools_are_these_and_save_takes_only_a_label(daemon: Daemon) -> None:
    async with agent(daemon, "t-mcp-tools") as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert set(tools) == TOOLS, "no delete, prune or sweep tool"
        schema = tools["save_checkpoint"].input_schema
        assert set(schema["properties"]) == {"label"} and schema["required"] == ["label"]
        assert "checkpointId" in tools["fork_checkpoint"].input_schema["properties"]
        assert not tools["fork_checkpoint"].input_schema.get("required")


async def test_tools_say_what_they_change_and_their_limits(daemon: Daemon) -> None:
    async with agent(daemon, "t-mcp-schema") as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    for name, tool in tools.items():
        hints = tool.annotations
        assert hints is not None, name
        assert hints.read_only_hint is (name in READ_ONLY), name
        assert hints.open_world_hint is False, name
        if name not in READ_ONLY:  # saves and forks add; a rewind stashes what it replaces
            assert hints.destructive_hint is False and hints.idempotent_hint is False, name
    label = tools["save_checkpoint"].input_schema["properties"]["label"]
    assert (label["minLength"], label["maxLength"]) == (1, 200)
    assert label["pattern"].startswith("^[^\\u0000-\\u001f\\u007f-\\u009f")
    paging = tools["list_checkpoints"].input_schema["properties"]
    assert (paging["limit"]["minimum"], paging["limit"]["maximum"]) == (1, 100)
    assert paging["limit"]["default"] == 20
    cursor = paging["cursor"]["anyOf"][0]
    assert cursor["maxLength"] == 1024
    for name in ("fork_checkpoint", "list_artifacts", "read_artifact"):
        checkpoint = tools[name].input_schema["properties"]["checkpointId"]["anyOf"][0]
        assert checkpoint["maxLength"] == 512, name
    assert tools["read_artifact"].input_schema["properties"]["artifactId"]["maxLength"] == 512


async def test_list_checkpoints_pages_newest_first(daemon: Daemon) -> None:
    (daemon.workspace / "a.txt").write_text("a")
    async with agent(daemon, "t-mcp-pages") as client:
        saved = [
            (await call(client, "save_checkpoint", {"label": f"save {index}"}))["checkpointId"]
            for index in range(5)
        ]
        seen: list[str] = []
        cursor = None
        pages = 0
        while True:
            arguments: dict[str, Any] = {"limit": 2} | ({"cursor": cursor} if cursor else {})
            page = await call(client, "list_checkpoints", arguments)
            assert len(page["checkpoints"]) <= 2 and page["headCheckpointId"] == saved[-1]
            seen += [c["checkpointId"] for c in page["checkpoints"]]
            pages += 1
            cursor = page["nextCursor"]
            if cursor is None:
                break
        assert seen == saved[::-1] and pages == 3
        whole = await call(client, "list_checkpoints")
        assert [c["checkpointId"] for c in whole["checkpoints"]] == saved[::-1]
        for bad in ({"limit": 0}, {"limit": 101}, {"cursor": "x" * 1025}, {"cursor": "!!"}):
            await fails(client, "list_checkpoints", bad, "INVALID_TOOL_INPUT")


async def test_save_list_and_fork(daemon: Daemon) -> None:
    (daemon.workspace / "notes.md").write_text("plan A\n")
    async with agent(daemon, "t-mcp") as client:
        saved = await call(client, "save_checkpoint", {"label": "before refactor"})
        assert saved["label"] == "before refactor" and saved["threadId"] == "t-mcp"
        listed = await call(client, "list_checkpoints")
        assert listed["headCheckpointId"] == saved["checkpointId"]
        assert [c["checkpointId"] for c in listed["checkpoints"]] == [saved["checkpointId"]]
        assert listed["checkpoints"][0]["reason"] == "named"
        assert listed["checkpoints"][0]["fileCount"] == 1

        forked = await call(client, "fork_checkpoint")
        assert forked["sourceCheckpointId"] == saved["checkpointId"]
        assert forked["threadId"] != "t-mcp"
        second = await call(client, "fork_checkpoint", {"checkpointId": saved["checkpointId"]})
        assert second["threadId"] not in {forked["threadId"], "t-mcp"}
    async with daemon.client() as grpc_client:
        assert await grpc_client.get_head("t-mcp") == saved["checkpointId"], "source head stays"
        assert await grpc_client.get_head(forked["threadId"]) == forked["checkpointId"]
        root = await grpc_client.get_checkpoint(forked["checkpointId"])
        assert root.checkpoint.reason == "fork-root" and root.checkpoint.file_count == 1


async def test_errors_carry_the_reference_codes(daemon: Daemon) -> None:
    (daemon.workspace / "a.txt").write_text("a")
    async with agent(daemon, "t-mcp-empty") as client:
        await fails(client, "fork_checkpoint", {}, "MISSING_CHECKPOINT")
        for bad in ({"label": ""}, {"label": "   "}, {}, {"label": 7}, {"label": "x" * 201}):
            await fails(client, "save_checkpoint", bad, "INVALID_TOOL_INPUT")
        await fails(client, "save_checkpoint", {"label": "a\nb"}, "INVALID_TOOL_INPUT")

    async with daemon.client() as grpc_client:
        other = await grpc_client.capture("t-mcp-other", label="someone else's")
    async with agent(daemon, "t-mcp-bound") as client:
        # A checkpoint of another thread is not there for this agent.
        await fails(
            client, "fork_checkpoint", {"checkpointId": other.checkpoint.id}, "MISSING_CHECKPOINT"
        )
        await fails(
            client,
            "read_artifact",
            {"artifactId": "x", "checkpointId": other.checkpoint.id},
            "MISSING_CHECKPOINT",
        )
        await fails(client, "fork_checkpoint", {"checkpointId": "nope"}, "MISSING_CHECKPOINT")

        store = await open_store(daemon.store)
        try:
            lease = await store.acquire_writer("t-mcp-bound")
            error = await fails(client, "save_checkpoint", {"label": "racing"}, "WRITER_CONFLICT")
            assert error["metadata"]["thread_id"] == "t-mcp-bound"
            # What to do about it: call again, and when.
            assert error["retryable"] is True and error["retryAfterMs"] > 0
            assert "call save_checkpoint again in about" in error["message"]
            await lease.release()
        finally:
            await store.aclose()
        assert (await call(client, "save_checkpoint", {"label": "after"}))["checkpointId"]
    async with daemon.client() as grpc_client:
        assert await grpc_client.get_head("t-mcp-other") == other.checkpoint.id


async def test_labels_refuse_controls_separators_and_bidi_formatting(daemon: Daemon) -> None:
    (daemon.workspace / "a.txt").write_text("a")
    refused = ["a\x85b", "a\x9bb", "a\x7fb", "ok\u202egnp.exe", "x\u2066y\u2069", "a\u2028b"]
    refused += ["\u200fmark", "\u061c", "tab\there"]
    async with agent(daemon, "t-mcp-labels") as client:
        for label in refused:
            error = await fails(client, "save_checkpoint", {"label": label}, "INVALID_TOOL_INPUT")
            assert "U+" in error["message"], (label, error)
        # Letters of any script, emoji sequences (with their joiners) are fine.
        for label in ("плaн Б", "計画", "\U0001f469\u200d\U0001f4bb refactor", "café"):
            assert (await call(client, "save_checkpoint", {"label": label}))["label"] == label
    async with daemon.client() as grpc_client:
        assert len(await grpc_client.list_checkpoints("t-mcp-labels")) == 4, "refused: not saved"


async def test_another_threads_checkpoint_answers_like_an_unknown_id(daemon: Daemon) -> None:
    (daemon.workspace / "a.txt").write_text("a")
    async with daemon.client() as grpc_client:
        artifact = await grpc_client.upload_artifact("notes.txt", "text/plain", b"notes")
        other = (await grpc_client.capture("t-mcp-tenant", artifacts=[artifact])).checkpoint.id
    unknown = str(uuid.UUID(int=uuid.UUID(other).int ^ 0xFFFF))  # same shape, no checkpoint
    async with agent(daemon, "t-mcp-oracle") as client:
        await call(client, "save_checkpoint", {"label": "mine"})
        calls = [
            ("fork_checkpoint", {}),
            ("list_artifacts", {}),
            ("read_artifact", {"artifactId": artifact.artifact_id}),
        ]
        for tool, arguments in calls:
            answers = []
            for checkpoint_id in (other, unknown):
                result = await client.call_tool(tool, arguments | {"checkpointId": checkpoint_id})
                assert result.is_error, (tool, result)
                answers.append(result.content[0].text.replace(checkpoint_id, "<id>"))
            assert answers[0] == answers[1], (tool, answers)
            assert json.loads(answers[0])["error"]["code"] == "MISSING_CHECKPOINT"


@contextmanager
def raw_stdio(
    daemon: Daemon, thread: str, python: str = sys.executable, **env: str
) -> Iterator[Any]:
    """The server as a bare subprocess (run by ``python``, with ``env`` added):
    send(text) writes a line, reply() reads one."""
    proc = subprocess.Popen(
        [python, "-m", "checkpointd", "mcp", "--thread", thread],
        env=clean_env(CHECKPOINTD_ADDRESS=daemon.address, **env),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdin is not None and proc.stdout is not None
    stdin, stdout = proc.stdin, proc.stdout

    class Session:
        def send(self, line: str) -> None:
            stdin.write(line.encode() + b"\n")
            stdin.flush()

        def reply(self, within: float = 30) -> dict[str, Any]:
            deadline = time.monotonic() + within
            while not select.select([stdout], [], [], 0.1)[0]:
                assert time.monotonic() < deadline, "no reply"
            line = stdout.readline()
            assert line, "the server closed stdout"
            return dict(json.loads(line))

    try:
        session = Session()
        session.send(
            json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": 0,
                    "method": "initialize",
                    "params": {
                        "protocolVersion": "2025-06-18",
                        "capabilities": {},
                        "clientInfo": {"name": "raw", "version": "1"},
                    },
                }
            )
        )
        assert "result" in session.reply()
        session.send('{"jsonrpc": "2.0", "method": "notifications/initialized"}')
        yield session
    finally:
        stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def test_a_message_the_sdk_cannot_parse_gets_a_json_rpc_error(daemon: Daemon) -> None:
    call_with = (
        '{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": '
        '"save_checkpoint", "arguments": {"label": "a\\ud800b"}}}'
    )
    with raw_stdio(daemon, "t-mcp-raw") as session:
        session.send(call_with)
        reply = session.reply()
        assert reply["id"] == 7 and reply["error"]["code"] == -32600, reply
        assert "lone surrogate" in reply["error"]["message"]
        session.send('{"jsonrpc": "2.0", "id": "s\\udc00", "method": "tools/list"}')
        assert session.reply()["id"] is None, "an id that is not text is not echoed"
        session.send("{not json")
        parse = session.reply()
        assert (parse["id"], parse["error"]["code"]) == (None, -32700)
        # A notification that does not parse gets no reply; the session goes on.
        session.send('{"jsonrpc": "2.0", "method": "notifications/x", "params": "\\ud800"}')
        session.send('{"jsonrpc": "2.0", "id": 8, "method": "tools/list"}')
        listed = session.reply()
        assert listed["id"] == 8 and len(listed["result"]["tools"]) == len(TOOLS)
    async with daemon.client() as grpc_client:
        assert await grpc_client.get_head("t-mcp-raw") is None, "nothing was saved"


def test_mcp_help_works_and_names_the_tools() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "checkpointd", "mcp", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "--thread" in result.stdout and "artifacts" in result.stdout


async def test_list_artifacts_and_read_artifact_give_metadata_only(daemon: Daemon) -> None:
    async with daemon.client() as grpc_client:
        first = await grpc_client.upload_artifact("a.log", "text/plain", b"first")
        second = await grpc_client.upload_artifact("b.json", "application/json", b"{}")
        captured = await grpc_client.capture("t-mcp-arts", artifacts=[first, second])
    async with agent(daemon, "t-mcp-arts") as client:
        listed = await call(client, "list_artifacts")
        assert listed["checkpointId"] == captured.checkpoint.id
        assert [(a["artifactId"], a["name"], a["size"]) for a in listed["artifacts"]] == [
            (first.artifact_id, "a.log", 5),
            (second.artifact_id, "b.json", 2),
        ]
        again = await call(client, "list_artifacts", {"checkpointId": captured.checkpoint.id})
        assert again == listed


async def test_read_artifact_gives_metadata_only(daemon: Daemon) -> None:
    async with daemon.client() as grpc_client:
        artifact = await grpc_client.upload_artifact("report.txt", "text/plain", b"secret-ish")
        captured = await grpc_client.capture("t-mcp-art", artifacts=[artifact])
    async with agent(daemon, "t-mcp-art") as client:
        info = await call(client, "read_artifact", {"artifactId": artifact.artifact_id})
        assert info == {
            "artifactId": artifact.artifact_id,
            "name": "report.txt",
            "mimeType": "text/plain",
            "size": 10,
            "blobKey": artifact.blob_key,
            "createdAt": artifact.created_at,
            "checkpointId": captured.checkpoint.id,
        }
        result = await client.call_tool("read_artifact", {"artifactId": artifact.artifact_id})
        assert "secret-ish" not in str(result), "never the bytes"
        await fails(client, "read_artifact", {"artifactId": "missing"}, "MISSING_ARTIFACT")


async def test_saves_use_the_orchestrators_policy_and_secrets(daemon: Daemon) -> None:
    root = daemon.workspace / "agent"
    root.mkdir()
    (root / "main.py").write_text("TOKEN = 'hunter2-secret'\n")
    (root / "debug.log").write_text("noise\n")
    flags = ("--subdir", "agent", "--exclude", "*.log", "--secret-env", "AGENT_SECRET")
    async with agent(daemon, "t-mcp-policy", *flags, env={"AGENT_SECRET": "hunter2-secret"}) as c:
        saved = await call(c, "save_checkpoint", {"label": "with policy"})
    async with daemon.client() as grpc_client:
        entries = await grpc_client.list_entries(saved["checkpointId"])
        assert [e.path for e in entries] == ["main.py"], "the excluded log is not saved"
        stored = await grpc_client.read_file(saved["checkpointId"], "main.py")
    assert b"hunter2" not in stored and stored == b"TOKEN = '" + b"\0" * 14 + b"'\n"
