"""A full disk through a real daemon: RESOURCE_EXHAUSTED with reason NO_SPACE and
the path, never INTERNAL; the CLI exits 9."""

from __future__ import annotations

import os
from pathlib import Path

import grpc
import pytest

from checkpointd.service.client import RpcError

from ..fixtures.tmpfs import small_tmpfs
from .conftest import DaemonFactory
from .test_cli import cli


async def test_restore_into_a_full_workspace_is_resource_exhausted(
    daemons: DaemonFactory, short_tmp: Path
) -> None:
    source = daemons.start()
    (source.workspace / "big.bin").write_bytes(os.urandom(3 << 20))
    async with source.client() as client:
        await client.capture("t-full")
    with small_tmpfs(short_tmp / "full") as full:
        target = daemons.start(workspace=full)
        async with target.client() as client:
            with pytest.raises(RpcError) as caught:
                await client.restore("t-full")
        error = caught.value
        assert error.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert error.reason == "SANDBOX_SNAPSHOT_NO_SPACE"
        assert str(full) in error.metadata["path"]
        result = cli(target, "restore", "t-full")
        assert result.returncode == 9, result.stderr
        assert "SANDBOX_SNAPSHOT_NO_SPACE" in result.stderr or str(full) in result.stderr
        target.stop()
