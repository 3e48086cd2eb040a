"""A daemon whose SQLite store fills its filesystem (a real, tiny tmpfs):
the capture is RESOURCE_EXHAUSTED with reason NO_SPACE naming the store file,
as a full blob directory is, and the CLI exits 9; with room again the same
capture goes through."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import grpc
import pytest

from checkpointd.service.client import RpcError

from ..fixtures.tmpfs import small_tmpfs
from .conftest import DaemonFactory
from .test_cli import cli


async def test_a_full_store_filesystem_is_resource_exhausted(
    daemons: DaemonFactory, short_tmp: Path
) -> None:
    with small_tmpfs(short_tmp / "full", size="1m") as full:
        path = full / "checkpoints.db"
        daemon = daemons.start(store=f"sqlite://{path}")
        for n in range(6000):  # the append's rows (index, pins, counts) need ~1.5 MB
            target = daemon.workspace / f"d{n % 100}" / f"f{n}.txt"
            target.parent.mkdir(exist_ok=True)
            target.write_text(f"file {n}\n")
        async with daemon.client() as client:
            with pytest.raises(RpcError) as caught:
                await client.capture("t")
            error = caught.value
            assert error.code == grpc.StatusCode.RESOURCE_EXHAUSTED, error
            assert error.reason == "SANDBOX_SNAPSHOT_NO_SPACE"
            assert error.metadata["path"] == str(path)
            result = cli(daemon, "capture", "t")
            assert result.returncode == 9, result.stdout + result.stderr
            assert str(path) in result.stderr

            await asyncio.to_thread(
                subprocess.run, ["mount", "-o", "remount,size=64m", str(full)], check=True
            )
            done = await client.capture("t")
            assert done.checkpoint.entry_count > 6000
        daemon.stop()
