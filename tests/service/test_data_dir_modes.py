"""The data dir is private: files 0600, directories 0700, and a group- or
world-writable data dir is refused."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .conftest import DaemonFactory, make_tree, tree_state


def _modes(root: Path) -> dict[str, int]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            st = path.lstat()
            if stat.S_ISSOCK(st.st_mode):
                continue
            out[str(path.relative_to(root))] = stat.S_IMODE(st.st_mode)
    return out


async def test_everything_in_the_data_dir_is_private(daemons: DaemonFactory) -> None:
    base = daemons.base / "private"
    data = base / "data"
    daemon = daemons.start(
        data_dir=data, store=f"sqlite://{data / 'checkpoints.db'}", blobs=f"file://{data / 'blobs'}"
    )
    make_tree(daemon.workspace, files=10)
    expected = tree_state(daemon.workspace)
    async with daemon.client() as client:
        await client.capture("t-private")
        for child in daemon.workspace.iterdir():
            if child.is_dir() and not child.is_symlink():
                import shutil

                shutil.rmtree(child)
            else:
                child.unlink()
        await client.restore("t-private")
    # Restore still gives the workspace the manifest's modes, whatever the umask.
    assert tree_state(daemon.workspace) == expected
    modes = _modes(data)
    assert any(name.startswith("blobs/sandbox-packs/") for name in modes)  # small blobs
    assert "checkpoints.db" in modes
    loose = {name: oct(mode) for name, mode in modes.items() if mode & 0o077}
    assert loose == {}, loose
    assert stat.S_IMODE(data.stat().st_mode) == 0o700


def test_a_group_writable_data_dir_is_refused(daemons: DaemonFactory, short_tmp: Path) -> None:
    data = short_tmp / "shared-data"
    data.mkdir()
    data.chmod(0o770)
    daemon = daemons.start(data_dir=data, wait=False)
    assert daemon.proc.wait(60) == 2
    assert "group- or world-writable" in daemon.log_text()
    assert "chmod 700" in daemon.log_text()


def test_an_old_world_readable_store_is_tightened(daemons: DaemonFactory, short_tmp: Path) -> None:
    data = short_tmp / "old-data"
    data.mkdir(mode=0o755)
    data.chmod(0o755)
    old_db = data / "checkpoints.db"
    old_db.touch()
    old_db.chmod(0o644)
    daemons.start(data_dir=data, store=f"sqlite://{old_db}", blobs=f"file://{data / 'blobs'}")
    assert stat.S_IMODE(old_db.stat().st_mode) == 0o600
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
