"""A file that changes between the scan and its upload is read once more, not
twice (once to hash it again, once more to upload): the pass that hashes a
small file again hands its zeroed bytes to the upload. Counted with the kernel's
own tally of bytes this process read (``rchar`` in /proc/self/io, every thread),
around a real capture to a real bucket directory."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import blake3
import pytest

from checkpointd import open_blobs, open_store
from checkpointd.blobs.packs import packed_blobs
from checkpointd.capture import CaptureOptions, capture_checkpoint
from checkpointd.errors import FILE_CHANGED, SandboxSnapshotError
from checkpointd.model import FileEntry
from checkpointd.progress import Progress
from checkpointd.restore import RestoreOptions, restore_checkpoint

from .conftest import snapshot_tree, write_tree

SIZE = 900 << 10  # small (read whole), and large next to everything else read


def _key(data: bytes) -> str:
    return "sandbox-files/blake3/" + blake3.blake3(data).hexdigest()


def _bytes_read() -> int:
    with open("/proc/self/io", encoding="ascii") as handle:
        fields = dict(line.split(": ") for line in handle.read().splitlines())
    return int(fields["rchar"])


async def _warm_stat_cache(workspace: Path, data_dir: Path, secrets: Any = ()) -> None:
    """The next scan (with the same ``secrets``: they are part of the cache's
    fingerprint) then trusts every hash and reads no file: the upload reads
    the files the bucket lacks itself, and meets the change."""
    async with await open_store("memory://") as elsewhere:
        await capture_checkpoint(
            workspace,
            elsewhere,
            open_blobs("memory://"),
            "warm",
            CaptureOptions(data_dir=data_dir, secrets=secrets),
        )


@pytest.mark.parametrize(
    "new_size", [SIZE, 600 << 10, 3 << 20], ids=["same-size", "smaller", "now-large"]
)
async def test_a_file_changed_before_its_upload_is_read_once_more(
    memory_store: Any, workspace: Path, tmp_path: Path, data_dir: Path, new_size: int
) -> None:
    blobs = open_blobs(f"file://{tmp_path / 'blobs'}")
    old, new = os.urandom(SIZE), os.urandom(new_size)
    write_tree(workspace, {"big-ish.bin": old, "calm.txt": b"calm"})
    await _warm_stat_cache(workspace, data_dir)

    changed: list[bool] = []

    def change(report: Progress) -> None:
        if report.phase == "upload" and not changed:
            (workspace / "big-ish.bin").write_bytes(new)
            changed.append(True)

    before = _bytes_read()
    result = await capture_checkpoint(
        workspace, memory_store, blobs, "t", CaptureOptions(data_dir=data_dir, progress=change)
    )
    read = _bytes_read() - before
    assert changed
    files = {e.path: e for e in result.checkpoint.files if isinstance(e, FileEntry)}
    assert files["big-ish.bin"].blob_key == _key(new)
    assert await packed_blobs(blobs, memory_store).head(_key(old)) is None
    if new_size < 1 << 20:
        # Read once: the pass that hashed the new bytes uploaded them
        # (before: once to hash, once more to upload).
        assert new_size <= read < 1.5 * new_size, read
    else:
        # Large now: streamed as it is, hashed on the way, into a blob the
        # directory names by that hash once it is in: read once too.
        assert new_size <= read < 1.5 * new_size, read
    restored = tmp_path / "restored"
    await restore_checkpoint(restored, memory_store, blobs, "t", RestoreOptions(data_dir=data_dir))
    assert snapshot_tree(restored, with_mtime=False) == snapshot_tree(workspace, with_mtime=False)


LARGE = 6 << 20  # streamed (never read whole)


def _settle() -> None:
    """Past the racy-clean window (the workspace's timestamp tick, 10 ms here)
    of the files just written: the warm-up's stat cache then vouches for them,
    so the capture's scan neither reads nor hands them over."""
    time.sleep(0.05)


@pytest.mark.parametrize(
    "new_size", [LARGE, 10 << 20, 700 << 10], ids=["same-size", "larger", "now-small"]
)
async def test_a_large_file_changed_before_its_upload_is_read_once_more(
    memory_store: Any, workspace: Path, tmp_path: Path, data_dir: Path, new_size: int
) -> None:
    # The stat cache vouches for the old hash, so the upload meets the change;
    # the new bytes hold a secret, whose span the new entry records.
    blobs = open_blobs(f"file://{tmp_path / 'blobs'}")
    secret = b"hunter2-secret"
    old = os.urandom(LARGE)
    new = bytearray(os.urandom(new_size))
    new[new_size // 2 : new_size // 2 + len(secret)] = secret
    write_tree(workspace, {"big.bin": old, "calm.txt": b"calm"})
    _settle()
    await _warm_stat_cache(workspace, data_dir, [secret])

    changed: list[bool] = []

    def change(report: Progress) -> None:
        if report.phase == "upload" and not changed:
            (workspace / "big.bin").write_bytes(new)
            changed.append(True)

    before = _bytes_read()
    result = await capture_checkpoint(
        workspace,
        memory_store,
        blobs,
        "t",
        CaptureOptions(data_dir=data_dir, progress=change, secrets=[secret]),
    )
    read = _bytes_read() - before
    assert changed
    zeroed = bytes(new).replace(secret, bytes(len(secret)))
    entry = {e.path: e for e in result.checkpoint.files if isinstance(e, FileEntry)}["big.bin"]
    assert (entry.blob_key, entry.size) == (_key(zeroed), new_size)
    assert [(span.offset, span.length) for span in entry.secrets] == [(new_size // 2, len(secret))]
    # Once: streamed as it is now, hashed on the way (before: hashed again,
    # then streamed; a small one's hash pass keeps its bytes).
    assert new_size <= read < new_size + (1 << 20), read
    stored = packed_blobs(blobs, memory_store)
    assert await stored.head(_key(old)) is None
    assert await stored.get(entry.blob_key) == zeroed
    restored = tmp_path / "restored"
    await restore_checkpoint(restored, memory_store, blobs, "t", RestoreOptions(data_dir=data_dir))
    assert (restored / "big.bin").read_bytes() == zeroed


async def test_a_large_file_that_keeps_changing_is_reported_and_no_torn_blob_stays(
    memory_store: Any, workspace: Path, tmp_path: Path, data_dir: Path
) -> None:
    blobs = open_blobs(f"file://{tmp_path / 'blobs'}")
    write_tree(workspace, {"busy.bin": os.urandom(4 * LARGE), "calm.txt": b"calm"})
    _settle()
    await _warm_stat_cache(workspace, data_dir)
    stop = threading.Event()

    def keep_writing() -> None:
        # Appends: every read that one lands in sees the size move (a rewrite
        # in place within one timestamp tick would look unchanged).
        with open(workspace / "busy.bin", "ab") as handle:
            while not stop.is_set():
                handle.write(b"more")
                handle.flush()
                time.sleep(0.0002)

    writer = threading.Thread(target=keep_writing)

    def start_writing(report: Progress) -> None:
        if report.phase == "upload" and not writer.is_alive() and not stop.is_set():
            writer.start()

    try:
        with pytest.raises(SandboxSnapshotError) as caught:
            await capture_checkpoint(
                workspace,
                memory_store,
                blobs,
                "t",
                CaptureOptions(data_dir=data_dir, progress=start_writing),
            )
    finally:
        stop.set()
        if writer.is_alive():
            writer.join()
    assert caught.value.code == FILE_CHANGED
    assert caught.value.details["paths"] == ["busy.bin"]
    assert await memory_store.get_head("t") is None
    # Every blob in the directory holds its name's bytes: no torn one.
    for path in (tmp_path / "blobs" / "sandbox-files" / "blake3").iterdir():
        assert blake3.blake3(path.read_bytes()).hexdigest() == path.name


async def test_a_store_that_names_objects_first_gets_a_changed_large_file_hashed_then_streamed(
    memory_store: Any, workspace: Path, tmp_path: Path, data_dir: Path
) -> None:
    # memory:// (as S3) has no put_learned: the old two reads, same result.
    blobs = open_blobs("memory://")
    old, new = os.urandom(LARGE), os.urandom(LARGE)
    write_tree(workspace, {"big.bin": old})
    _settle()
    await _warm_stat_cache(workspace, data_dir)

    def change(report: Progress) -> None:
        if report.phase == "upload" and (workspace / "big.bin").read_bytes() == old:
            (workspace / "big.bin").write_bytes(new)

    result = await capture_checkpoint(
        workspace, memory_store, blobs, "t", CaptureOptions(data_dir=data_dir, progress=change)
    )
    entry = next(e for e in result.checkpoint.files if isinstance(e, FileEntry))
    assert entry.blob_key == _key(new)
    assert await blobs.get(entry.blob_key) == new
