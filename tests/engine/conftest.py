"""Fixtures of the engine tests: stores, blob stores, data dirs and tree snapshots."""

from __future__ import annotations

import os
import stat
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from checkpointd.blobs import open_blobs
from checkpointd.progress import Progress
from checkpointd.store import open_store

STORES = [pytest.param("memory", id="memory-store"), pytest.param("sqlite", id="sqlite-store")]
BLOBS = [pytest.param("memory", id="memory-blobs"), pytest.param("file", id="file-blobs")]
# An hour ago: files older than the stat cache's racy window, so a rescan trusts it.
PAST_NS = (int(time.time()) - 3600) * 1_000_000_000


# Every store we ship: for the tests of what each keeps (pack index, pins).
EVERY_STORE = [*STORES, pytest.param("postgres", id="postgres-store", marks=pytest.mark.postgres)]
# The pack-holding buckets: a local dir, and SeaweedFS S3.
BUCKETS = ["file", pytest.param("s3", marks=pytest.mark.s3)]


async def store_named_by_param(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[Any]:
    """The store ``request.param`` names, open for the test (the body of the
    ``store`` fixtures: a module picks its params, EVERY_STORE or STORES)."""
    if request.param == "memory":
        url = "memory://"
    elif request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'store.db'}"
    else:
        url = request.getfixturevalue("postgres_url")
    opened = await open_store(url)
    try:
        yield opened
    finally:
        await opened.aclose()


def bucket_named_by_param(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """The blob store ``request.param`` names (the body of the ``bucket``
    fixtures, over BUCKETS)."""
    if request.param == "file":
        return open_blobs(f"file://{tmp_path / 'blobs'}")
    return request.getfixturevalue("s3_blobs")


store = pytest.fixture(params=STORES, name="store")(store_named_by_param)


@pytest.fixture(params=BLOBS)
def blobs(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "memory":
        return open_blobs("memory://")
    return open_blobs(f"file://{tmp_path / 'blobs'}")


@pytest.fixture
async def memory_store() -> AsyncIterator[Any]:
    opened = await open_store("memory://")
    try:
        yield opened
    finally:
        await opened.aclose()


@pytest.fixture
def memory_blobs() -> Any:
    return open_blobs("memory://")


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "workspace"
    root.mkdir()
    return root


def snapshot_tree(root: Path, *, with_mtime: bool = True) -> dict[str, tuple[Any, ...]]:
    """Every entry beneath ``root`` (never following links): kind, mode, bytes or
    target, and for files the mtime; used to compare trees before and after."""
    tree: dict[str, tuple[Any, ...]] = {}
    for directory, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            full = Path(directory) / name
            rel = full.relative_to(root).as_posix()
            info = full.lstat()
            mode = stat.S_IMODE(info.st_mode)
            if stat.S_ISLNK(info.st_mode):
                tree[rel] = ("link", os.readlink(full))
            elif stat.S_ISDIR(info.st_mode):
                tree[rel] = ("dir", mode)
            elif stat.S_ISREG(info.st_mode):
                mtime = info.st_mtime_ns if with_mtime else None
                tree[rel] = ("file", mode, full.read_bytes(), mtime)
            else:
                tree[rel] = ("other", mode)
    return tree


def write_tree(root: Path, files: dict[str, bytes | str], *, mtime_ns: int = PAST_NS) -> None:
    """Files (parents made as needed) with mtimes in the past; a str value is a
    symlink target. Returns once their ctimes (now) are out of the stat cache's
    racy window (10 ms and a clock tick or two), so a capture right after trusts them."""
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            path.symlink_to(content)
        else:
            path.write_bytes(content)
            os.utime(path, ns=(mtime_ns, mtime_ns))
    wait_out_racy_window()


def settle_before_record(report: Progress) -> None:
    """A restore's progress hook: once its last file is in (the "record" phase,
    before the stat cache learns what was written), wait out the racy window,
    so the restore's reference time falls after every write's tick and the
    cache may trust what it wrote. A restore quicker than a timestamp tick
    rightly leaves its files racy (a capture hashes them again) otherwise."""
    if report.phase == "record":
        wait_out_racy_window()


def wait_out_racy_window() -> None:
    """Return once inodes changed until now have ctimes older than the stat
    cache's racy window (a fine filesystem's 10 ms and a clock tick or two):
    a capture right after trusts what its cache recorded, rather than hashing
    again files it cannot tell from a same-tick rewrite."""
    time.sleep(0.03)


def lexists(path: Path) -> bool:
    """True when anything (a dangling link too) stands at ``path``."""
    return os.path.lexists(path)
