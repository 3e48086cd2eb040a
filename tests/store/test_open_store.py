"""open_store / open_instance_store URLs and the store options every store validates."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from checkpointd.errors import SandboxCheckpointInvalidArgumentError
from checkpointd.store import (
    InMemoryCheckpointStore,
    InMemoryInstanceStore,
    InstanceRecord,
    SqliteCheckpointStore,
    SqliteInstanceStore,
    open_instance_store,
    open_store,
)
from checkpointd.testkit._support import checkpoint

REPO = Path(__file__).resolve().parents[2]


async def test_memory_opens_are_new_and_empty() -> None:
    first = await open_store("memory://")
    second = await open_store("memory://")
    assert isinstance(first, InMemoryCheckpointStore)
    assert first is not second
    lease = await first.acquire_writer("t1")
    await first.append(checkpoint("c1", "t1"), None, lease)
    assert await second.get_head("t1") is None
    assert await (await open_store("memory://")).list("t1") == []
    await first.aclose()
    await second.aclose()


async def test_sqlite_url(tmp_path: Path) -> None:
    path = tmp_path / "with space" / "db.sqlite"
    path.parent.mkdir()
    url = "sqlite://" + str(path).replace(" ", "%20")
    async with await open_store(url, lease_duration_ms=1_000, renew_after_ms=10) as store:
        assert isinstance(store, SqliteCheckpointStore)
        assert store.path == str(path)
        lease = await store.acquire_writer("t1")
        assert lease.renew_after_ms == 10
        await store.append(checkpoint("c1", "t1"), None, lease)
    assert path.exists()
    async with await open_store(url) as again:
        assert await again.get_head("t1") == "c1"
    instances = await open_instance_store(url)
    assert isinstance(instances, SqliteInstanceStore)
    await instances.upsert(InstanceRecord("k", "p", "s", "t1", 1))
    await instances.aclose()


async def test_injected_clock_reaches_the_store() -> None:
    store = await open_store(
        "memory://", now=lambda: 5_000, lease_duration_ms=300, renew_after_ms=1
    )
    lease = await store.acquire_writer("t1")
    assert lease.expires_at == 5_300


async def test_memory_instance_store() -> None:
    store = await open_instance_store("memory://")
    assert isinstance(store, InMemoryInstanceStore)
    assert await store.get("k") is None


@pytest.mark.parametrize(
    "url",
    [
        "",
        "nonsense",
        "ftp://host/x",
        "redis://localhost",
        "sqlite://relative.db",
        "sqlite:///",
        "sqlite:///dir/",
        "sqlite:relative.db",
        "sqlite:///abs.db?mode=ro",
        "memory://something",
        "file:///tmp/x",
    ],
)
async def test_bad_urls_name_the_url(url: str) -> None:
    for opener in (open_store, open_instance_store):
        with pytest.raises(SandboxCheckpointInvalidArgumentError) as info:
            await opener(url)
        assert repr(url) in str(info.value) or url in str(info.value)
        assert isinstance(info.value, ValueError)


async def test_non_string_url() -> None:
    with pytest.raises(SandboxCheckpointInvalidArgumentError):
        await open_store(None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "options",
    [
        {"renew_after_ms": 0},
        {"renew_after_ms": -5},
        {"renew_after_ms": 120_000},
        {"renew_after_ms": 200_000},
        {"lease_duration_ms": 0, "renew_after_ms": 1},
        {"lease_duration_ms": -1},
        {"lease_duration_ms": 1.5},
        {"renew_after_ms": 10.0},
        {"renew_after_ms": True},
        {"lease_duration_ms": "100"},
        {"now": 5},
    ],
)
async def test_bad_options(tmp_path: Path, options: dict) -> None:
    with pytest.raises(SandboxCheckpointInvalidArgumentError):
        InMemoryCheckpointStore(**options)
    with pytest.raises(SandboxCheckpointInvalidArgumentError):
        await SqliteCheckpointStore.open(str(tmp_path / "x.db"), **options)
    for url in ("memory://", f"sqlite://{tmp_path}/y.db"):
        with pytest.raises(SandboxCheckpointInvalidArgumentError):
            await open_store(url, **options)
    # Bad options are refused before the file is created.
    assert not (tmp_path / "x.db").exists()
    assert not (tmp_path / "y.db").exists()


async def test_default_clock_is_wall_clock_ms() -> None:
    import time

    store = InMemoryCheckpointStore()
    before = time.time_ns() // 1_000_000
    lease = await store.acquire_writer("t1")
    after = time.time_ns() // 1_000_000
    assert before + 120_000 <= lease.expires_at <= after + 120_000
    assert lease.renew_after_ms == 45_000


def test_importing_the_stores_does_not_import_asyncpg() -> None:
    code = "import sys, checkpointd.store, checkpointd.testkit; print('asyncpg' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(REPO / "python")},
    ).stdout.strip()
    assert out == "False"
