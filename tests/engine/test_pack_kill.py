"""kill -9 during a pack upload and during a repack, with a real SQLite store
and a real local dir / SeaweedFS S3: no index row ever points at a missing
range, every checkpoint still restores, and a rerun completes."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from checkpointd.blobs import open_blobs
from checkpointd.capture import CaptureOptions, capture_checkpoint
from checkpointd.check import check_store
from checkpointd.restore import RestoreOptions, restore_checkpoint
from checkpointd.store import open_store
from checkpointd.sweep import prune, sweep_blobs
from tests.fixtures.bucket_counter import counted

from .conftest import snapshot_tree, write_tree
from .test_pack_sweep import _later, _packs

# ------------------------------------------------------------------ kill -9

CAPTURE_SCRIPT = """
import asyncio, sys
from checkpointd.blobs import open_blobs
from checkpointd.capture import CaptureOptions, capture_checkpoint
from checkpointd.store import open_store

workspace, store_url, blobs_url, data_dir = sys.argv[1:5]

async def main():
    async with await open_store(store_url) as store:
        await capture_checkpoint(workspace, store, open_blobs(blobs_url), "t", CaptureOptions(data_dir=data_dir))

asyncio.run(main())
"""

SWEEP_SCRIPT = """
import asyncio, sys, time
from checkpointd.blobs import open_blobs
from checkpointd.store import open_store
from checkpointd.sweep import sweep_blobs

store_url, blobs_url = sys.argv[1:3]

async def main():
    async with await open_store(store_url) as store:
        later = time.time_ns() // 1_000_000 + 3_600_000
        await sweep_blobs(store, open_blobs(blobs_url), 0, now=lambda: later)

asyncio.run(main())
"""


def _past_the_holds() -> int:
    """A store clock ten minutes ahead: a killed process's lease, pins and
    condemnations have expired by it."""
    return time.time_ns() // 1_000_000 + 600_000


def _run_and_kill(
    script: str, args: list[str], env: dict[str, str], ready: Any, delay_s: float = 0.0
) -> int | None:
    """Run ``script`` in a child and SIGKILL it once ``ready()`` is true (plus
    ``delay_s``); returns its exit code when it finished before that."""
    child = subprocess.Popen([sys.executable, "-c", script, *args], env=env)
    try:
        deadline = time.monotonic() + 120
        while not ready():
            if child.poll() is not None:
                return child.returncode
            assert time.monotonic() < deadline, "the child never got there"
            time.sleep(0.002)
        time.sleep(delay_s)
        if child.poll() is not None:
            return child.returncode
        child.kill()
        return None
    finally:
        child.kill()
        child.wait()


async def _index_is_whole(store: Any, blobs: Any) -> None:
    """No index row points at a missing pack or past the end of one, and every
    referenced blob reads back (check with read_data)."""
    packs = await _packs(blobs)
    for row in await store.list_packed_blobs(limit=100_000):
        assert row.pack in packs, row
        assert row.offset + row.length <= packs[row.pack], row
    report = await check_store(store, blobs, read_data=True)
    assert report.summary is not None and report.summary.ok, report.findings


async def _only_indexed_packs_left(store: Any, blobs: Any) -> None:
    indexed = {row.pack for row in await store.list_packed_blobs(limit=100_000)}
    assert set(await _packs(blobs)) == indexed


def _blob_env(kind: str, s3_server: Any | None) -> dict[str, str]:
    env = {**os.environ}
    if kind == "s3":
        env.update(s3_server.env())
    return env


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.s3)])
def kill_target(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """(blobs URL for children, blob store, a function that tells once a pack
    PUT has started, the child env, a context for the counting proxy)."""
    if request.param == "file":
        root = tmp_path / "blobs"
        url = f"file://{root}"

        def pack_started() -> bool:
            # Our writer stages under the final directory (an unnamed O_TMPFILE
            # is invisible; its fallback is a #-file): a pack dir means writing began.
            return (root / "sandbox-packs").exists()

        return "file", url, open_blobs(url), pack_started, None
    s3_server = request.getfixturevalue("s3_server")
    prefix = f"kill-{uuid.uuid4().hex}"
    return "s3", None, s3_server.open(prefix), None, (s3_server, prefix)


async def test_kill_9_during_a_pack_upload_leaves_no_row_pointing_at_a_missing_range(
    tmp_path: Path, workspace: Path, kill_target: Any
) -> None:
    kind, url, blobs, pack_started, s3 = kill_target
    # Incompressible files: two packs of ~16 MiB, each a long PUT.
    write_tree(workspace, {f"d{n % 7}/f{n}.bin": os.urandom(9000) for n in range(3600)})
    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    data_dir = tmp_path / "data"
    if s3 is None:
        code = await asyncio.to_thread(
            _run_and_kill,
            CAPTURE_SCRIPT,
            [str(workspace), store_url, url, str(data_dir)],
            dict(os.environ),
            pack_started,
        )
    else:
        s3_server, prefix = s3
        with counted(s3_server) as (via, proxy):
            code = await asyncio.to_thread(
                _run_and_kill,
                CAPTURE_SCRIPT,
                [str(workspace), store_url, via.url(prefix), str(data_dir)],
                {**os.environ, **via.env()},
                lambda: proxy.snapshot().get("PUT", 0) >= 1,
            )
    assert code is None, "the capture finished before it was killed"
    # The killed capture's lease (and the pins under it) would hold for two
    # minutes: the rerun's store clock runs ahead, past them.
    async with await open_store(store_url, now=_past_the_holds) as store:
        assert await store.get_head("t") is None
        await _index_is_whole(store, blobs)
        # A rerun completes, and a sweep removes what the killed one left.
        result = await capture_checkpoint(
            workspace, store, blobs, "t", CaptureOptions(data_dir=data_dir)
        )
        await _index_is_whole(store, blobs)
        report = await sweep_blobs(store, blobs, 0, now=_later)
        assert report.failures == []
        await _only_indexed_packs_left(store, blobs)
        target = tmp_path / "restored"
        await restore_checkpoint(
            target, store, blobs, "t", RestoreOptions(data_dir=tmp_path / "rd")
        )
        assert snapshot_tree(target, with_mtime=False) == snapshot_tree(workspace, with_mtime=False)
        assert result.checkpoint.id == await store.get_head("t")


@pytest.mark.parametrize("delay_s", [0.0, 0.05, 0.3])
async def test_kill_9_during_a_repack_keeps_every_checkpoint_and_a_rerun_completes(
    tmp_path: Path, workspace: Path, kill_target: Any, delay_s: float
) -> None:
    kind, url, blobs, _pack_started, s3 = kill_target
    files = {f"f{n}.bin": os.urandom(6000) for n in range(2000)}
    write_tree(workspace, files)
    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    data_dir = tmp_path / "data"
    async with await open_store(store_url) as store:
        await capture_checkpoint(workspace, store, blobs, "t", CaptureOptions(data_dir=data_dir))
        write_tree(workspace, {f"f{n}.bin": os.urandom(6000) for n in range(1500)})
        await capture_checkpoint(workspace, store, blobs, "t", CaptureOptions(data_dir=data_dir))
        assert len(await prune(store, "t", 1)) == 1
    expected = snapshot_tree(workspace, with_mtime=False)
    before = set(await _packs(blobs))
    if s3 is None:
        code = await asyncio.to_thread(
            _run_and_kill,
            SWEEP_SCRIPT,
            [store_url, url],
            dict(os.environ),
            lambda: True,
            0.4 + delay_s,
        )
    else:
        s3_server, prefix = s3
        with counted(s3_server) as (via, proxy):
            # Killed once the repack's reads began (ranged GETs of the old pack).
            code = await asyncio.to_thread(
                _run_and_kill,
                SWEEP_SCRIPT,
                [store_url, via.url(prefix)],
                {**os.environ, **via.env()},
                lambda: proxy.snapshot().get("GET", 0) >= 2,
                delay_s,
            )
    # Its condemnations would hold for two minutes: the rerun's clock is ahead.
    async with await open_store(store_url, now=_past_the_holds) as store:
        await _index_is_whole(store, blobs)
        target = tmp_path / "restored-after-kill"
        await restore_checkpoint(
            target, store, blobs, "t", RestoreOptions(data_dir=tmp_path / "rd1")
        )
        assert snapshot_tree(target, with_mtime=False) == expected
        # Reruns complete: the sparse pack is repacked, then deleted.
        for _ in range(2):
            report = await sweep_blobs(store, blobs, 0, now=_later)
            assert report.failures == []
        await _index_is_whole(store, blobs)
        await _only_indexed_packs_left(store, blobs)
        assert not before <= set(await _packs(blobs)), "nothing was repacked"
        target = tmp_path / "restored-after-rerun"
        await restore_checkpoint(
            target, store, blobs, "t", RestoreOptions(data_dir=tmp_path / "rd2")
        )
        assert snapshot_tree(target, with_mtime=False) == expected
    del code  # killed or finished: both must leave a whole index
