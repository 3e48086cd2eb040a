"""Secrets round-trip through real daemons and the CLI: --secret-env on capture,
restore and diff; RestoreDone names the files left with zeros."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from .conftest import Daemon, DaemonFactory, clean_env

SECRET = "sk-live-0123456789abcdef"


def run(daemon: Daemon, *args: str, secret: bool = True) -> subprocess.CompletedProcess[str]:
    env = clean_env(CHECKPOINTD_ADDRESS=daemon.address)
    if secret:
        env["API_KEY"] = SECRET
    return subprocess.run(
        [sys.executable, "-m", "checkpointd", *args, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def ok(daemon: Daemon, *args: str, secret: bool = True) -> dict:
    result = run(daemon, *args, secret=secret)
    assert result.returncode == 0, result.stderr + result.stdout
    return json.loads(result.stdout)


def test_secrets_round_trip_through_the_cli(daemons: DaemonFactory) -> None:
    source = daemons.start()
    config = source.workspace / "settings.env.json"
    original = f'{{"api_key": "{SECRET}", "again": "{SECRET}"}}\n'.encode()
    config.write_bytes(original)
    (source.workspace / "readme.md").write_text("hello")
    captured = ok(source, "capture", "t-sec", "--secret-env", "API_KEY")
    checkpoint_id = captured["checkpoint"]["id"]

    # Diff with the secret: no false change; without it the live secret differs.
    assert ok(source, "diff", checkpoint_id, "--secret-env", "API_KEY")["changes"] == []
    plain = ok(source, "diff", checkpoint_id, secret=False)["changes"]
    assert [c["path"] for c in plain] == ["settings.env.json"]

    # Same workspace, still holding the secret, restored without it: untouched.
    inode = os.stat(config).st_ino
    done = ok(source, "restore", "t-sec", secret=False)
    assert config.read_bytes() == original and os.stat(config).st_ino == inode
    assert done["unfilled_secret_paths"] == []

    # A new sandbox without the secret: zeros, and the done event says where.
    bare = daemons.start()
    done = ok(bare, "restore", "t-sec", secret=False)
    assert done["unfilled_secret_paths"] == ["settings.env.json"]
    assert done["unfilled_secret_count"] == 1
    restored = (bare.workspace / "settings.env.json").read_bytes()
    assert SECRET.encode() not in restored and len(restored) == len(original)
    human = run(bare, "restore", "t-sec", secret=False)
    assert human.returncode == 0

    # Restored again with the secret: filled in, byte for byte.
    done = ok(bare, "restore", "t-sec", "--secret-env", "API_KEY")
    assert done["unfilled_secret_paths"] == []
    assert (bare.workspace / "settings.env.json").read_bytes() == original

    # A new sandbox with the secret from the start.
    fresh = daemons.start()
    ok(fresh, "restore", "t-sec", "--secret-env", "API_KEY")
    assert (fresh.workspace / "settings.env.json").read_bytes() == original
    assert (fresh.workspace / "readme.md").read_text() == "hello"
    for daemon in (source, bare, fresh):
        assert SECRET not in daemon.log_text()


async def test_restore_rpc_with_secret_names(daemons: DaemonFactory, short_tmp: Path) -> None:
    daemon = daemons.start()
    (daemon.workspace / "a.txt").write_bytes(b"A=" + b"alpha-secret" + b" B=" + b"beta-secret")
    async with daemon.client() as client:
        await client.capture(
            "t-names", secrets=[b"alpha-secret", b"beta-secret"], secret_names=["A", "B"]
        )
        target = daemons.start()
        async with target.client() as other:
            done = await other.restore(
                "t-names", secrets=[b"beta-secret", b"alpha-secret"], secret_names=["B", "A"]
            )
            assert list(done.unfilled_secret_paths) == []
            assert (target.workspace / "a.txt").read_bytes() == (b"A=alpha-secret B=beta-secret")
            done = await other.restore("t-names", secrets=[b"beta-secret"], secret_names=["B"])
            assert list(done.unfilled_secret_paths) == []  # left as it is: already whole


def test_unfilled_secret_paths_stay_bounded() -> None:
    """However many files hold zeros, RestoreDone lists a bounded prefix of them
    (its count says how many there are)."""
    from checkpointd.service.restore_rpcs import (
        MAX_UNFILLED_BYTES,
        MAX_UNFILLED_PATHS,
        bounded_paths,
    )

    many = [f"dir/file-{index:06d}.env" for index in range(MAX_UNFILLED_PATHS + 5)]
    assert bounded_paths(many) == many[:MAX_UNFILLED_PATHS]
    long = ["d/" + "x" * 4000 + f"{index}" for index in range(1000)]
    kept = bounded_paths(long)
    assert kept == long[: len(kept)] and sum(len(p) for p in kept) <= MAX_UNFILLED_BYTES
    assert 0 < len(kept) < len(long)
