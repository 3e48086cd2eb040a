"""Listening: a 0600 Unix socket by default; TCP only with a bearer token on every call."""

from __future__ import annotations

import asyncio
import stat
import subprocess
import sys

import grpc
import pytest

from checkpointd.service import status
from checkpointd.service.client import RpcError

from .conftest import DaemonFactory, clean_env, free_port


def test_unix_socket_is_private(daemons: DaemonFactory) -> None:
    daemon = daemons.start()
    socket_path = daemon.data_dir / "checkpointd.sock"
    mode = socket_path.stat().st_mode
    assert stat.S_ISSOCK(mode)
    assert stat.S_IMODE(mode) == 0o600
    assert daemon.stop() == 0
    assert not socket_path.exists(), "the socket file is removed on shutdown"


async def test_tcp_without_token_is_unauthenticated(daemons: DaemonFactory) -> None:
    daemon = daemons.start(tcp=True, token="s3cret-token")
    for token in ("", "wrong-token"):
        async with daemon.client(token=token or None) as client:
            if not token:
                client._metadata = ()  # no authorization header at all
            with pytest.raises(RpcError) as caught:
                await client.get_head("t")
            assert caught.value.code == grpc.StatusCode.UNAUTHENTICATED
            assert caught.value.reason == status.UNAUTHENTICATED
            # Health answers probes that cannot send a token (auth.py).
            assert await client.health() == "SERVING"
    async with daemon.client() as client:
        assert await client.health() == "SERVING"
        assert await client.get_head("t") is None
        info = await client.server_info()
        assert info.protocol_version == 2


def test_tcp_without_token_refuses_to_start(short_tmp) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "checkpointd",
            "serve",
            "--workspace",
            str(short_tmp / "ws"),
            "--data-dir",
            str(short_tmp / "data"),
            "--listen",
            f"tcp://127.0.0.1:{free_port()}",
        ],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "refusing to listen on TCP without a bearer token" in result.stderr


def test_a_second_daemon_cannot_steal_a_live_socket(daemons: DaemonFactory) -> None:
    first = daemons.start()
    second = daemons.start(data_dir=first.data_dir, wait=False)
    assert second.proc.wait(60) == 7
    assert "another process is serving" in second.log_text()
    assert first.health() == "SERVING"


def test_a_stale_socket_from_a_killed_daemon_is_replaced(daemons: DaemonFactory) -> None:
    first = daemons.start()
    first.kill()
    assert (first.data_dir / "checkpointd.sock").exists()
    second = daemons.start(data_dir=first.data_dir)
    assert second.health() == "SERVING"


def test_cli_over_tcp_needs_the_token(daemons: DaemonFactory) -> None:
    daemon = daemons.start(tcp=True, token="cli-token")
    command = [sys.executable, "-m", "checkpointd", "info", "--address", daemon.address]
    denied = subprocess.run(command, env=clean_env(), capture_output=True, text=True, timeout=60)
    assert denied.returncode == 8, denied.stderr
    assert "SANDBOX_SNAPSHOT_UNAUTHENTICATED" in denied.stderr
    allowed = subprocess.run(
        command,
        env=clean_env(CHECKPOINTD_TOKEN="cli-token"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert allowed.returncode == 0 and "checkpointd" in allowed.stdout


def _peak_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status_file:
        for line in status_file:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM")


def _reset_peak_rss(pid: int) -> None:
    with open(f"/proc/{pid}/clear_refs", "w") as clear:
        clear.write("5")  # reset VmHWM to the current RSS


async def test_a_tokenless_request_is_refused_unread(daemons: DaemonFactory) -> None:
    """The token is checked on the headers: a refused call's body is never
    buffered, so many large tokenless requests leave the daemon's memory flat."""
    daemon = daemons.start(tcp=True, token="s3cret-token")
    target = daemon.address.replace("tcp://", "")
    body = b"\x0a" + b"\xff\xff\xbf\x07" + b"x" * (15 << 20)  # thread_id of 15 MiB
    pid = daemon.proc.pid
    async with grpc.aio.insecure_channel(
        target, options=[("grpc.max_send_message_length", 64 << 20)]
    ) as channel:
        get_head = channel.unary_unary("/checkpointd.v1.Checkpointd/GetHead")
        await asyncio.sleep(0.5)
        _reset_peak_rss(pid)
        idle = _peak_rss_kib(pid)
        calls = [get_head(body, timeout=30) for _ in range(12)]
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
        for outcome in outcomes:
            assert isinstance(outcome, grpc.aio.AioRpcError), outcome
            assert outcome.code() == grpc.StatusCode.UNAUTHENTICATED
        grown_mib = (_peak_rss_kib(pid) - idle) / 1024
    # 12 requests of 15 MiB: buffered, they would take ~180 MiB.
    assert grown_mib < 60, f"the daemon grew {grown_mib:.0f} MiB for refused requests"
