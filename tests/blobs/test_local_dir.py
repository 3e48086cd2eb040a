"""LocalBlobDir: the engines' plain-os path into a file:// store must agree with
obstore's LocalStore on every key, and a blob must only ever appear complete."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from checkpointd.blobs import (
    BlobNotFoundError,
    BlobStoreError,
    LocalBlobDir,
    ObjectBlobStore,
    local_dir_of,
    open_blobs,
)

KEY = "sandbox-files/blake3/" + "ab" * 32


def _local(blobs: ObjectBlobStore) -> LocalBlobDir:
    local = local_dir_of(blobs)
    assert local is not None
    return local


def _read(local: LocalBlobDir, key: str) -> bytes:
    fd = local.open_for_reading(key)
    try:
        return os.read(fd, 1 << 20)
    finally:
        os.close(fd)


def _write(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(data)


class Wrapper:
    """A store wrapped by a caller (as tests and services do)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_only_a_plain_local_directory_store_offers_it(tmp_path: Path) -> None:
    directory = open_blobs(f"file://{tmp_path}/")
    assert _local(directory).root == str(tmp_path)
    assert local_dir_of(open_blobs("memory://")) is None
    # A wrapper may watch or change calls: it keeps the per-blob async path.
    assert local_dir_of(Wrapper(directory)) is None  # type: ignore[arg-type]


@pytest.mark.parametrize("unnamed", [True, False], ids=["tmpfile", "named-staging"])
async def test_writes_are_what_obstore_reads_and_lists(tmp_path: Path, unnamed: bool) -> None:
    blobs = open_blobs(f"file://{tmp_path}")
    local = _local(blobs)
    # Where the filesystem lacks O_TMPFILE, the first put falls back by itself.
    local.use_tmpfile = unnamed
    assert not local.exists(KEY)
    assert local.put_if_absent(KEY, b"first bytes") is True
    assert local.exists(KEY)
    assert await blobs.get(KEY) == b"first bytes"
    info = await blobs.head(KEY)
    assert info is not None and info.size == len(b"first bytes")
    # An existing key is left as is, and the staging file is gone either way.
    assert local.put_if_absent(KEY, b"other bytes") is False
    assert await blobs.get(KEY) == b"first bytes"
    assert os.listdir(tmp_path / "sandbox-files" / "blake3") == ["ab" * 32]
    assert [found.key for found in await blobs.list("sandbox-files")] == [KEY]


async def test_reads_what_obstore_wrote(tmp_path: Path) -> None:
    blobs = open_blobs(f"file://{tmp_path}")
    await blobs.put(KEY, b"via obstore")
    local = _local(blobs)
    assert local.exists(KEY)
    assert _read(local, KEY) == b"via obstore"


async def test_a_staging_leftover_is_invisible(tmp_path: Path) -> None:
    # What a writer on the named-staging path killed before its link leaves behind.
    blobs = open_blobs(f"file://{tmp_path}")
    local = _local(blobs)
    local.use_tmpfile = False
    final = local.path(KEY)
    assert final is not None
    _write(f"{final}#1234567890123", b"trunc")
    assert not local.exists(KEY)
    assert await blobs.head(KEY) is None
    assert await blobs.list("sandbox-files") == []
    assert local.put_if_absent(KEY, b"complete") is True
    assert await blobs.get(KEY) == b"complete"


def test_missing_blobs_and_directories_are_not_found(tmp_path: Path) -> None:
    local = _local(open_blobs(f"file://{tmp_path}"))
    with pytest.raises(BlobNotFoundError):
        local.open_for_reading(KEY)
    (tmp_path / "sandbox-files").mkdir()
    assert not local.exists("sandbox-files")
    with pytest.raises(BlobNotFoundError):
        local.open_for_reading("sandbox-files")


@pytest.mark.parametrize("unnamed", [True, False], ids=["tmpfile", "named-staging"])
def test_a_refused_write_names_the_store_and_key(tmp_path: Path, unnamed: bool) -> None:
    local = _local(open_blobs(f"file://{tmp_path}"))
    local.use_tmpfile = unnamed
    assert local.put_if_absent("plain", b"a file") is True
    with pytest.raises(BlobStoreError) as caught:
        local.put_if_absent("plain/child", b"x")
    assert str(tmp_path) in str(caught.value)
    assert "plain/child" in str(caught.value)
    assert os.listdir(tmp_path) == ["plain"]


@pytest.mark.parametrize("key", ["a b", "a/../b", "./a", "a//b", "a/", "x#1", "é", "%41", ""])
def test_keys_obstore_would_encode_take_the_async_path(tmp_path: Path, key: str) -> None:
    local = _local(open_blobs(f"file://{tmp_path}"))
    assert local.path(key) is None


_PUT_SCRIPT = """
import asyncio, os, sys
from checkpointd.blobs import open_blobs

async def main():
    blobs = open_blobs("file://" + sys.argv[1])
    first = [("sandbox-packs/blake3/" + "%064x" % 1, b"a pack")]
    await blobs.put_many(first)  # creates the directories
    print("--- one", flush=True)
    await blobs.put_many([("sandbox-packs/blake3/" + "%064x" % 2, os.urandom(1 << 20))])
    print("--- many", flush=True)
    await blobs.put_many(
        [("sandbox-files/blake3/" + "%064x" % n, b"small %d" % n) for n in range(20)]
    )

asyncio.run(main())
"""


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace to watch the syscalls")
def test_a_small_batch_syncs_its_own_files_and_a_large_one_the_filesystem(
    tmp_path: Path,
) -> None:
    # A pack put alone must not wait for every dirty page of a shared disk
    # (syncfs): its bytes are fdatasynced before it is named, its directory
    # fsynced after. A batch of many small blobs, or one that made new
    # directories, still ends with one syncfs.
    trace = tmp_path / "trace.txt"
    done = subprocess.run(
        ["strace", "-f", "-qq", "--seccomp-bpf", "-e", "trace=syncfs,fdatasync,fsync,write"]
        + ["-o", str(trace), sys.executable, "-c", _PUT_SCRIPT, str(tmp_path / "blobs")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    calls = [line for line in trace.read_text().splitlines() if "resumed" not in line]
    one = next(i for i, line in enumerate(calls) if "--- one" in line)
    many = next(i for i, line in enumerate(calls) if "--- many" in line)

    def syncs(lines: list[str]) -> list[str]:
        return [
            name for line in lines for name in ("syncfs(", "fdatasync(", "fsync(") if name in line
        ]

    assert syncs(calls[:one]) == ["syncfs("]  # new directories: the filesystem
    assert syncs(calls[one:many]) == ["fdatasync(", "fsync("]
    assert syncs(calls[many:]) == ["syncfs("]
