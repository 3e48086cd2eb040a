"""``checkpointd mcp``: the agent's tools, run through the MCP client SDK over stdio
against a real daemon (the server is a ``python -m checkpointd mcp`` subprocess)."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from mcp import Client
from mcp.client.stdio import StdioServerParameters

from checkpointd import open_store

from .conftest import Daemon, clean_env

TOOLS = {"save_checkpoint", "list_checkpoints", "fork_checkpoint", "read_artifact"}


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


async def test_tools_are_the_four_and_save_takes_only_a_label(daemon: Daemon) -> None:
    async with agent(daemon, "t-mcp-tools") as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert set(tools) == TOOLS, "no delete, prune or sweep tool"
        schema = tools["save_checkpoint"].input_schema
        assert set(schema["properties"]) == {"label"} and schema["required"] == ["label"]
        assert "checkpointId" in tools["fork_checkpoint"].input_schema["properties"]
        assert not tools["fork_checkpoint"].input_schema.get("required")


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


async def test_errors_carry_the_seeds_codes(daemon: Daemon) -> None:
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
            await lease.release()
        finally:
            await store.aclose()
        assert (await call(client, "save_checkpoint", {"label": "after"}))["checkpointId"]
    async with daemon.client() as grpc_client:
        assert await grpc_client.get_head("t-mcp-other") == other.checkpoint.id


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
