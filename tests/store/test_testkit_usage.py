"""The testkit as a user runs it: one call in their own test file, their own pytest
configuration (strict asyncio mode here), and a broken store is caught."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

_USER_TEST = textwrap.dedent(
    """
    from checkpointd.store import InMemoryCheckpointStore, InMemoryInstanceStore
    from checkpointd.testkit import checkpoint_store_conformance, instance_store_conformance

    {patch}

    async def make_store(*, now, lease_duration_ms, renew_after_ms):
        return InMemoryCheckpointStore(
            now=now, lease_duration_ms=lease_duration_ms, renew_after_ms=renew_after_ms
        )

    async def make_instances():
        return InMemoryInstanceStore()

    TestMyStore = checkpoint_store_conformance(make_store)
    TestMyInstances = instance_store_conformance(make_instances)
    """
)

# A store that forgets the fence counter on release (fences must survive release).
_BROKEN = textwrap.dedent(
    """
    _release = InMemoryCheckpointStore.release_writer

    async def _forgetful_release(self, lease):
        await _release(self, lease)
        self._tables.fences.pop(lease.thread_id, None)

    InMemoryCheckpointStore.release_writer = _forgetful_release
    """
)


def _run_user_suite(tmp_path: Path, patch: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_user_store.py").write_text(_USER_TEST.format(patch=patch))
    # The user's own config: strict mode, no config of ours.
    (tmp_path / "pytest.ini").write_text("[pytest]\nasyncio_mode = strict\n")
    env = {**os.environ, "PYTHONPATH": str(REPO / "python")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


@pytest.mark.slow
def test_a_user_runs_the_suites_in_one_call(tmp_path: Path) -> None:
    result = _run_user_suite(tmp_path, "")
    assert result.returncode == 0, result.stdout + result.stderr
    assert " passed" in result.stdout and "failed" not in result.stdout
    assert "skipped" not in result.stdout  # our memory store has every optional method


@pytest.mark.slow
def test_a_broken_store_fails_the_suite(tmp_path: Path) -> None:
    result = _run_user_suite(tmp_path, _BROKEN)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "test_fences_grow_and_survive_release" in result.stdout
