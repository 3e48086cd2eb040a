"""A restore killed with its daemon (SIGKILL) leaves its staging directory
(``.checkpointd-staging-*``) in the workspace. The daemon removes such
leftovers when it starts and before each capture, and nothing else: other
``.checkpointd*`` names and the workspace's files stay, and a staging directory
a running restore holds (its ``flock``) is left alone."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from checkpointd._native import STAGING_PREFIX
from checkpointd.service.client import RpcError

from .conftest import DaemonFactory, make_tree, tree_state

LEFTOVER = STAGING_PREFIX + "0123456789abcdef"


def _staging(root: Path) -> list[str]:
    return sorted(name for name in os.listdir(root) if name.startswith(STAGING_PREFIX))


def _leftover(root: Path, name: str = LEFTOVER) -> Path:
    """A staging directory as a killed restore leaves it: files in its tree."""
    tree = root / name / "t" / "deep"
    tree.mkdir(parents=True)
    (tree / "half-written.bin").write_bytes(os.urandom(1 << 16))
    return root / name


async def test_a_restore_killed_with_its_daemon_leaves_nothing_after_a_restart(
    daemons: DaemonFactory,
) -> None:
    source = daemons.start()
    make_tree(source.workspace, files=400, max_size=60_000)
    async with source.client() as client:
        await client.capture("t")
    target = daemons.start()
    (target.workspace / "kept.txt").write_text("the workspace's own file\n")
    (target.workspace / ".checkpointd-notes").write_text("not staging\n")
    killed = False

    def kill_in_fetch(event: object) -> None:
        nonlocal killed
        if getattr(event, "progress", None) is not None and event.progress.phase in (  # type: ignore[attr-defined]
            "fetch",
            "apply",
        ):
            if not killed:
                killed = True
                target.kill()

    async with target.client() as client:
        with pytest.raises(RpcError):
            await client.restore("t", on_event=kill_in_fetch)
    assert killed
    assert len(_staging(target.workspace)) == 1  # what the issue saw

    restarted = daemons.start(workspace=target.workspace, data_dir=target.data_dir)
    assert _staging(restarted.workspace) == []
    assert (restarted.workspace / "kept.txt").read_text() == "the workspace's own file\n"
    assert (restarted.workspace / ".checkpointd-notes").read_text() == "not staging\n"
    async with restarted.client() as client:
        await client.restore("t")
    assert tree_state(restarted.workspace) == tree_state(source.workspace)


async def test_a_capture_removes_leftover_staging_but_not_a_running_restores(
    daemons: DaemonFactory,
) -> None:
    daemon = daemons.start()
    make_tree(daemon.workspace, files=20)
    expected = tree_state(daemon.workspace)
    _leftover(daemon.workspace)
    held = _leftover(daemon.workspace, STAGING_PREFIX + "fedcba9876543210")
    (daemon.workspace / (STAGING_PREFIX + "file")).write_text("a file, not a staging directory\n")
    fd = os.open(held, os.O_RDONLY | os.O_DIRECTORY)  # a restore at work in it
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        async with daemon.client() as client:
            done = await client.capture("t")
            assert done.checkpoint.entry_count > 0
        assert _staging(daemon.workspace) == [held.name, STAGING_PREFIX + "file"]
    finally:
        os.close(fd)
    assert tree_state(daemon.workspace) == expected  # (.checkpointd* names are never listed)
