"""Large files are read once: the scan hands its open fd to the upload, which
streams it through the native verifying reader (docs/contract.md#capture, docs/design.md).

Every test here changes the workspace between the scan's read and the
upload's (through ``BeforeUpload``, a real store whose ``missing`` runs a hook
right before the upload), or bounds what the process may hold open."""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import blake3
import pytest

from checkpointd._capture_scan import HELD_FILES
from checkpointd.blobs import open_blobs
from checkpointd.capture import CaptureOptions, capture_checkpoint
from checkpointd.errors import FILE_CHANGED, SandboxSnapshotError
from checkpointd.model import FileEntry
from checkpointd.restore import RestoreOptions, restore_checkpoint
from checkpointd.store import open_store

from .conftest import snapshot_tree, write_tree
from .hooks import BeforeUpload

REPO = Path(__file__).resolve().parents[2]
BIG = (3 << 20) + 12_345  # several reader chunks, not a whole multiple


def _key(data: bytes) -> str:
    return "sandbox-files/blake3/" + blake3.blake3(data).hexdigest()


async def _assert_every_blob_is_its_key(blobs: Any) -> None:
    """Nothing torn: each stored file blob hashes to its own key."""
    for info in await blobs.list("sandbox-files/"):
        assert _key(await blobs.get(info.key)) == info.key, info.key


async def test_a_large_file_rewritten_after_the_scan_with_its_mtime_set_back_is_hashed_again(
    store: Any, blobs: Any, workspace: Path, tmp_path: Path, data_dir: Path
) -> None:
    # Same size, other bytes, the old mtime put back (``cp -p``, ``rsync -t``):
    # only the fd's ctime (and the bytes) tell. The upload must not store the
    # new bytes under the scanned key, nor a mix of both.
    old, new = os.urandom(BIG), os.urandom(BIG)
    write_tree(workspace, {"big.bin": old, "small.txt": b"small"})
    before = os.stat(workspace / "big.bin")
    rewrites: list[int] = []

    def rewrite(keys: list[str]) -> None:
        if _key(old) in keys and not rewrites:
            with open(workspace / "big.bin", "r+b") as handle:  # in place: same inode
                handle.write(new)
            os.utime(workspace / "big.bin", ns=(before.st_atime_ns, before.st_mtime_ns))
            rewrites.append(1)

    result = await capture_checkpoint(
        workspace, store, BeforeUpload(blobs, rewrite), "t", CaptureOptions(data_dir=data_dir)
    )
    assert rewrites
    entry = next(e for e in result.checkpoint.files if e.path == "big.bin")
    assert isinstance(entry, FileEntry)
    assert (entry.blob_key, entry.size) == (_key(new), BIG)
    assert await blobs.head(_key(old)) is None
    await _assert_every_blob_is_its_key(blobs)
    restored = tmp_path / "restored"
    await restore_checkpoint(restored, store, blobs, "t", RestoreOptions(data_dir=data_dir))
    assert (restored / "big.bin").read_bytes() == new


async def test_a_large_file_swapped_for_a_symlink_after_the_scan_reads_nothing_outside(
    store: Any, blobs: Any, workspace: Path, tmp_path: Path, data_dir: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    private = (b"TOP-SECRET outside the workspace " * 200_000)[:BIG]
    (outside / "private.bin").write_bytes(private)
    inside = os.urandom(BIG)
    write_tree(workspace, {"big.bin": inside})
    swapped: list[int] = []

    def swap(keys: list[str]) -> None:
        if _key(inside) in keys and not swapped:
            link = workspace / "link.tmp"
            link.symlink_to(outside / "private.bin")
            os.replace(link, workspace / "big.bin")  # atomically: never absent
            swapped.append(1)

    with pytest.raises(SandboxSnapshotError) as caught:
        await capture_checkpoint(
            workspace, store, BeforeUpload(blobs, swap), "t", CaptureOptions(data_dir=data_dir)
        )
    assert swapped
    # The fd the scan opened inside was unlinked (its ctime moved): the path
    # is hashed again beneath the root, where it is a symlink now.
    assert caught.value.code == FILE_CHANGED
    assert caught.value.details["path"] == "big.bin"
    assert await store.get_head("t") is None
    assert await blobs.head(_key(private)) is None
    for info in await blobs.list("sandbox-files/"):
        assert b"TOP-SECRET" not in await blobs.get(info.key)


async def test_a_large_file_replaced_by_a_regular_file_after_the_scan_records_the_new_one(
    memory_store: Any, blobs: Any, workspace: Path, data_dir: Path
) -> None:
    # A rename over the scanned file (an editor's save): the held fd is the old
    # inode, now unlinked; the path is hashed again and its new bytes stored.
    old, new = os.urandom(BIG), os.urandom(BIG + 1)
    write_tree(workspace, {"doc.bin": old})

    def save(keys: list[str]) -> None:
        if _key(old) in keys and (workspace / "doc.bin").stat().st_size == BIG:
            (workspace / "doc.bin.tmp").write_bytes(new)
            os.replace(workspace / "doc.bin.tmp", workspace / "doc.bin")

    result = await capture_checkpoint(
        workspace, memory_store, BeforeUpload(blobs, save), "t", CaptureOptions(data_dir=data_dir)
    )
    entry = next(e for e in result.checkpoint.files if e.path == "doc.bin")
    assert isinstance(entry, FileEntry)
    assert (entry.blob_key, entry.size) == (_key(new), BIG + 1)
    assert await blobs.head(_key(old)) is None
    await _assert_every_blob_is_its_key(blobs)


async def test_large_files_with_secrets_round_trip(
    store: Any, blobs: Any, workspace: Path, tmp_path: Path, data_dir: Path
) -> None:
    token, password = b"tok-3f9a7c1e55", b"hunter2-hunter2"
    rng = random.Random(7)
    files: dict[str, bytes | str] = {}
    for n in range(3):
        data = bytearray(rng.randbytes((2 << 20) + n * 999_999))
        # Across the readers' 1 MiB chunks, right after each other, at the end.
        data[(1 << 20) - 5 : (1 << 20) - 5 + len(token)] = token
        data[(1 << 20) + 9 : (1 << 20) + 9 + len(password)] = password
        data[-len(token) :] = token
        files[f"big/{n}.bin"] = bytes(data)
    write_tree(workspace, files)
    expected = snapshot_tree(workspace)
    secrets = {"TOKEN": token, "PASSWORD": password}
    result = await capture_checkpoint(
        workspace, store, blobs, "t", CaptureOptions(secrets=secrets, data_dir=data_dir)
    )
    assert result.stats.blobs_uploaded == 3
    for entry in result.checkpoint.files:
        if not isinstance(entry, FileEntry):
            continue
        stored = await blobs.get(entry.blob_key)
        assert token not in stored and password not in stored
        assert _key(stored) == entry.blob_key
        assert {span.secret for span in entry.secrets} == {"TOKEN", "PASSWORD"}
    restored = tmp_path / "restored"
    await restore_checkpoint(
        restored, store, blobs, "t", RestoreOptions(secrets=secrets, data_dir=data_dir)
    )
    assert snapshot_tree(restored) == expected


# The child process: a capture of many large files with few descriptors.
_LOW_FD_CAPTURE = textwrap.dedent(
    """
    import asyncio, os, resource, sys
    from checkpointd.blobs import open_blobs
    from checkpointd.capture import CaptureOptions, capture_checkpoint
    from checkpointd.store import open_store

    limit, workspace, store_url, blobs_url, data_dir = sys.argv[1:6]
    resource.setrlimit(resource.RLIMIT_NOFILE, (int(limit), resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    async def main():
        async with await open_store(store_url) as store:
            result = await capture_checkpoint(
                workspace, store, open_blobs(blobs_url), "t", CaptureOptions(data_dir=data_dir)
            )
            print(result.stats.blobs_uploaded, len(os.listdir("/proc/self/fd")))

    asyncio.run(main())
    """
)


@pytest.mark.timeout(300)
async def test_many_large_files_never_hold_more_descriptors_than_the_bound(tmp_path: Path) -> None:
    # Far more large files than descriptors: the scan hands over at most
    # HELD_FILES open files and waits until the upload closes some.
    limit, count = 96, 400
    assert HELD_FILES < limit // 3
    workspace = tmp_path / "ws"
    workspace.mkdir()
    rng = random.Random(3)
    for n in range(count):
        # Exactly 1 MiB: the smallest file the scan hands over as an open fd.
        (workspace / f"{n:04}.bin").write_bytes(rng.randbytes(1 << 20))
    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    blobs_url = f"file://{tmp_path / 'blobs'}"
    child = await asyncio.to_thread(
        subprocess.run,
        [
            sys.executable,
            "-c",
            _LOW_FD_CAPTURE,
            str(limit),
            str(workspace),
            store_url,
            blobs_url,
            str(tmp_path / "data"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    uploaded, _open_now = map(int, child.stdout.split())
    assert uploaded == count
    async with await open_store(store_url) as store:
        head = await store.get_head("t")
        assert head is not None
        checkpoint = await store.get(head)
        assert checkpoint is not None
        restored = tmp_path / "restored"
        await restore_checkpoint(
            restored, store, open_blobs(blobs_url), "t", RestoreOptions(data_dir=tmp_path / "data")
        )
    assert snapshot_tree(restored) == snapshot_tree(workspace)
