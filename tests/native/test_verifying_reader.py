"""The native verifying reader, ``rehash_beneath`` and the feed's bound on open
files: the pieces a large file's single read goes through."""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import blake3
import pytest

from checkpointd import _native

CHUNK = 1 << 20
SECRET = b"s3cr3t-value"


@pytest.fixture
def root(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    place = tmp_path / "root"
    place.mkdir()
    fd = os.open(place, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield place, fd
    finally:
        os.close(fd)


def _zeroed(data: bytes) -> bytes:
    return data.replace(SECRET, b"\0" * len(SECRET))


def _open(
    fd: int, rel: str, data: bytes, secrets: tuple[bytes, ...] = ()
) -> _native.VerifyingReader:
    expected = _zeroed(data) if secrets else data
    return _native.VerifyingReader.open(
        fd, rel, blake3.blake3(expected).hexdigest(), len(data), secrets
    )


def test_reads_the_zeroed_bytes_and_holds_the_last_chunk_until_verified(
    root: tuple[Path, int],
) -> None:
    place, fd = root
    data = bytearray(os.urandom(3 * CHUNK + 99))
    data[CHUNK - 4 : CHUNK - 4 + len(SECRET)] = SECRET  # across a chunk boundary
    (place / "f.bin").write_bytes(bytes(data))
    reader = _open(fd, "f.bin", bytes(data), (SECRET,))
    chunks = []
    while (chunk := reader.read_chunk()) is not None:
        chunks.append(chunk)
    assert b"".join(chunks) == _zeroed(bytes(data))
    assert (reader.path, reader.size) == ("f.bin", len(data))
    reader.close()

    # The same file with the wrong digest: every chunk but the last comes out.
    wrong = _native.VerifyingReader.open(fd, "f.bin", "0" * 64, len(data), (SECRET,))
    handed = 0
    with pytest.raises(_native.FileChangedError):
        while wrong.read_chunk() is not None:
            handed += 1
    assert handed == len(chunks) - 1
    wrong.close()


def test_a_rewrite_between_open_and_read_is_a_change(root: tuple[Path, int]) -> None:
    place, fd = root
    data = os.urandom(2 * CHUNK)
    (place / "f.bin").write_bytes(data)
    reader = _open(fd, "f.bin", data)
    before = os.stat(place / "f.bin")
    with open(place / "f.bin", "r+b") as handle:
        handle.write(os.urandom(len(data)))  # same size, same inode
    os.utime(place / "f.bin", ns=(before.st_atime_ns, before.st_mtime_ns))
    with pytest.raises(_native.FileChangedError):
        reader.read_chunk()
    assert reader.read_chunk() is None  # spent
    reader.close()
    with pytest.raises(ValueError, match="closed"):
        reader.read_chunk()


def test_open_refuses_symlinks_in_any_component_and_other_sizes(
    root: tuple[Path, int], tmp_path: Path
) -> None:
    place, fd = root
    outside = tmp_path / "outside"
    outside.mkdir()
    data = b"outside bytes " * 100_000
    (outside / "f.bin").write_bytes(data)
    (place / "dir").symlink_to(outside)
    (place / "link.bin").symlink_to(outside / "f.bin")
    (place / "real.bin").write_bytes(data)
    for rel in ("dir/f.bin", "link.bin", "missing.bin"):
        with pytest.raises(_native.FileChangedError):
            _open(fd, rel, data)
    with pytest.raises(_native.FileChangedError):
        _native.VerifyingReader.open(fd, "real.bin", "0" * 64, len(data) + 1)


def test_read_all_and_stop(root: tuple[Path, int]) -> None:
    place, fd = root
    data = os.urandom(2 * CHUNK + 5)
    (place / "f.bin").write_bytes(data)
    assert _open(fd, "f.bin", data).read_all() == data
    stopped = _open(fd, "f.bin", data)
    stopped.stop()
    with pytest.raises(_native.ScanCancelled):
        stopped.read_chunk()


def _rehash(fd: int, path: str, *args: object, **kwargs: object) -> object:
    (found,) = _native.rehash_beneath(fd, [path], *args, **kwargs)  # type: ignore[arg-type]
    return found


def test_rehash_beneath(root: tuple[Path, int], tmp_path: Path) -> None:
    place, fd = root
    data = b"a" * 100 + SECRET + b"b" * 100
    (place / "f.bin").write_bytes(data)
    found = _rehash(fd, "f.bin", (SECRET,))
    assert isinstance(found, tuple)
    hex_digest, size, spans, mode, mtime_ns, kept = found
    assert hex_digest == blake3.blake3(_zeroed(data)).hexdigest()
    assert (size, spans) == (len(data), [(100, len(SECRET), 0)])
    assert stat.S_ISREG(mode) and mtime_ns == os.stat(place / "f.bin").st_mtime_ns
    assert kept is None  # only asked for with keep_small
    # keep_small: the zeroed bytes that very pass hashed, with the fstat they
    # were read under (what stat_beneath says while the file is unchanged).
    found = _rehash(fd, "f.bin", (SECRET,), keep_small=True)
    assert isinstance(found, tuple)
    kept = found[-1]
    assert kept is not None
    zeroed, stamp = kept
    assert zeroed == _zeroed(data) and stamp == _native.stat_beneath(fd, "f.bin")
    assert stamp[3] == len(data) and stamp[4] == mtime_ns
    (place / "f.bin").write_bytes(data + b"more")
    assert _native.stat_beneath(fd, "f.bin") != stamp
    assert _native.stat_beneath(fd, "gone.bin") is None
    big = os.urandom(CHUNK + 1)  # not read whole: hashed, never kept
    (place / "big.bin").write_bytes(big)
    found = _rehash(fd, "big.bin", keep_small=True)
    assert isinstance(found, tuple) and found[-1] is None
    assert _rehash(fd, "gone.bin") is None
    (place / "link").symlink_to(place / "f.bin")
    os.mkfifo(place / "fifo")
    # Many paths in one call: each one's answer, a failure among them.
    link, fifo, gone, again = _native.rehash_beneath(fd, ["link", "fifo", "gone.bin", "f.bin"])
    assert isinstance(link, OSError)
    assert isinstance(fifo, tuple) and fifo[0] == "" and stat.S_ISFIFO(fifo[3])
    assert gone is None
    assert isinstance(again, tuple) and again[1] == len(data) + 4
    stopped = _native.CancelToken()
    stopped.cancel()
    with pytest.raises(_native.ScanCancelled):
        _native.rehash_beneath(fd, ["f.bin"], (), stopped)


def test_one_call_keeps_each_small_file_exactly(root: tuple[Path, int]) -> None:
    """One call reads every path through one buffer: a short file after a
    long one keeps its own bytes, never the tail of the one before."""
    place, fd = root
    sizes = [CHUNK - 1, 10, 0, 5000, CHUNK - 1, 3]
    files = {f"{n}.bin": os.urandom(size) + SECRET for n, size in enumerate(sizes)}
    files["last.bin"] = b"x" * 200
    for name, data in files.items():
        (place / name).write_bytes(data)
    found = _native.rehash_beneath(fd, list(files), (SECRET,), keep_small=True)
    for (name, data), one in zip(files.items(), found, strict=True):
        assert isinstance(one, tuple), name
        hex_digest, size, _spans, _mode, _mtime_ns, kept = one
        zeroed = _zeroed(data)
        assert (hex_digest, size) == (blake3.blake3(zeroed).hexdigest(), len(data)), name
        if len(data) < CHUNK:
            assert kept is not None and kept[0] == zeroed, name
        else:
            assert kept is None, name


def test_the_feed_never_holds_more_open_files_than_its_bound(tmp_path: Path) -> None:
    files = {f"{n}.bin": os.urandom(CHUNK + n) for n in range(12)}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    feed = _native.BlobFeed(8 << 20, CHUNK, b"", max_held_files=3)
    result: list[object] = []
    scan = threading.Thread(
        target=lambda: result.append(_native.scan(str(tmp_path), threads=2, feed=feed))
    )
    scan.start()
    most, seen = 0, {}
    while (reader := feed.next_file()) is not None:
        most = max(most, feed.held_files)
        seen[reader.path] = reader.read_all()
        time.sleep(0.05)  # a slow upload: the scan gets ahead until the bound stops it
        reader.close()
    scan.join(30)
    assert result, "the scan finished"
    assert 1 <= most <= 3
    assert seen == files
    assert feed.held_files == 0
