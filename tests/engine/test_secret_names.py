"""A secret in a file name, a directory name or a symlink's target is never
stored, listed, cached or shown: capture refuses such an entry as
UNSUPPORTED_ENTRY (``secret-in-name``, ``secret-in-target``) naming its path
with the secret masked (``***``), a directory listing that holds one (even of
an entry the policy excludes) never goes into the stat cache, and a restore
leaves an entry named by a secret alone."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest

from checkpointd.capture import CaptureOptions, capture_checkpoint
from checkpointd.errors import UNSUPPORTED_ENTRY, SandboxSnapshotError
from checkpointd.model import Policy
from checkpointd.restore import RestoreOptions, restore_checkpoint

from .conftest import write_tree

TOKEN = b"tok-8c2f61d0e4"
SECRETS = {"TOKEN": TOKEN}


def _stored_anywhere(root: Path) -> list[str]:
    """The files under ``root`` (a data dir) whose bytes hold the secret."""
    found = []
    for directory, _dirs, names in os.walk(root):
        for name in names:
            path = Path(directory) / name
            if TOKEN in path.read_bytes() or TOKEN.decode() in name:
                found.append(str(path))
    return found


@pytest.fixture
def secret_named(workspace: Path) -> Path:
    token = TOKEN.decode()
    write_tree(
        workspace,
        {
            "ok.txt": b"fine",
            f"config/{token}.json": b"{}",
            f"keys-{token}/a.txt": b"a",
            "link": f"x-{token}",
        },
    )
    return workspace


async def test_capture_refuses_secret_names_with_the_secret_masked(
    memory_store: Any,
    memory_blobs: Any,
    secret_named: Path,
    data_dir: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.DEBUG), pytest.raises(SandboxSnapshotError) as raised:
        await capture_checkpoint(
            secret_named,
            memory_store,
            memory_blobs,
            "t",
            CaptureOptions(secrets=SECRETS, data_dir=data_dir),
        )
    assert raised.value.code == UNSUPPORTED_ENTRY
    assert raised.value.details["paths"] == ["config/***.json", "keys-***", "link"]
    assert "secret-in-name" in str(raised.value) and "secret-in-target" in str(raised.value)
    for shown in (str(raised.value), repr(raised.value.details), caplog.text):
        assert TOKEN.decode() not in shown
    assert _stored_anywhere(data_dir) == []


async def test_excluded_secret_names_stay_out_of_the_stat_cache(
    memory_store: Any, memory_blobs: Any, secret_named: Path, data_dir: Path
) -> None:
    token = TOKEN.decode()
    policy = Policy(exclude=(f"/config/{token}.json", f"/keys-{token}", "/link"))
    result = await capture_checkpoint(
        secret_named,
        memory_store,
        memory_blobs,
        "t",
        CaptureOptions(secrets=SECRETS, data_dir=data_dir, policy=policy),
    )
    assert [e.path for e in result.checkpoint.files] == ["config", "ok.txt"]
    assert _stored_anywhere(data_dir) == []
    # The next capture still trusts the cache for what it holds.
    again = await capture_checkpoint(
        secret_named,
        memory_store,
        memory_blobs,
        "t",
        CaptureOptions(secrets=SECRETS, data_dir=data_dir, policy=policy),
    )
    assert again.stats.files_reused == 1
    assert _stored_anywhere(data_dir) == []


async def test_restore_neither_shows_nor_stores_a_secret_name(
    memory_store: Any,
    memory_blobs: Any,
    workspace: Path,
    data_dir: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    write_tree(workspace, {"ok.txt": b"fine"})
    await capture_checkpoint(
        workspace,
        memory_store,
        memory_blobs,
        "t",
        CaptureOptions(secrets=SECRETS, data_dir=data_dir),
    )
    (workspace / f"new-{TOKEN.decode()}.txt").write_bytes(b"made by the agent")
    (workspace / "ok.txt").write_bytes(b"changed")
    with caplog.at_level(logging.DEBUG):
        await restore_checkpoint(
            workspace,
            memory_store,
            memory_blobs,
            "t",
            RestoreOptions(secrets=SECRETS, data_dir=data_dir),
        )
    assert (workspace / "ok.txt").read_bytes() == b"fine"
    # Left alone: the scan reports it masked, not by a path to act on.
    assert (workspace / f"new-{TOKEN.decode()}.txt").exists()
    assert TOKEN.decode() not in caplog.text
    assert _stored_anywhere(data_dir) == []
