"""Secret zeroing in the scan capture uses: every (overlapping) occurrence,
across every read boundary, equal to a pure-Python reference; hashes equal the
`blake3` package's."""

from __future__ import annotations

import os
from pathlib import Path

import blake3
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from checkpointd import _native
from checkpointd.codec import decode_entries
from checkpointd.model import FileEntry

from .reference import zero_reference


def small_alphabet(letters: bytes, min_size: int, max_size: int) -> st.SearchStrategy[bytes]:
    """Bytes over a tiny alphabet, so secrets overlap and repeat often."""
    return st.lists(st.sampled_from(list(letters)), min_size=min_size, max_size=max_size).map(bytes)


SECRETS = st.lists(small_alphabet(b"ab\0", 4, 9), min_size=1, max_size=3)


def data_with(secrets: list[bytes]) -> st.SearchStrategy[bytes]:
    pieces = st.one_of(st.sampled_from(secrets), small_alphabet(b"abc\0", 0, 5))
    return st.lists(pieces, max_size=40).map(b"".join)


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_scan_zeroes_as_the_reference(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    secrets = data.draw(SECRETS)
    payload = data.draw(data_with(secrets))
    root = tmp_path_factory.mktemp("z")
    (root / "f").write_bytes(payload)
    (entry,) = decode_entries(_native.scan(str(root), secrets=secrets).manifest)
    assert isinstance(entry, FileEntry) and entry.size == len(payload)
    assert entry.blob_key.endswith(blake3.blake3(zero_reference(payload, secrets)).hexdigest())


def test_boundaries_of_large_files_in_scan(workspace: Path) -> None:
    # The scan reads whole files up to 1 MiB, then streams 1 MiB pieces: put a
    # secret across each of those boundaries.
    secret = b"TOPSECRET-TOKEN"
    size = 3 * (1 << 20) + 100
    data = bytearray(os.urandom(size))
    for boundary in (1 << 20, 2 << 20, 3 << 20):
        for shift in (1, 7, len(secret) - 1):
            start = boundary - shift
            data[start : start + len(secret)] = secret
    data[: len(secret)] = secret
    data[-len(secret) :] = secret
    payload = bytes(data)
    (workspace / "big.bin").write_bytes(payload)
    expected = zero_reference(payload, [secret])
    assert expected.count(secret) == 0
    want = blake3.blake3(expected).hexdigest()

    result = _native.scan(str(workspace), secrets=[secret])
    (entry,) = decode_entries(result.manifest)
    assert isinstance(entry, FileEntry) and entry.blob_key.endswith(want)
    assert result.bytes_hashed == size


@pytest.mark.parametrize("size", [0, 1, 1023, 1 << 20, (1 << 20) + 1, 5 * (1 << 20) + 3])
def test_hash_matches_blake3_package(workspace: Path, size: int) -> None:
    payload = os.urandom(size)
    (workspace / "f").write_bytes(payload)
    want = blake3.blake3(payload).hexdigest()
    assert _native.hash_file(str(workspace / "f")) == (want, size)
    (entry,) = decode_entries(_native.scan(str(workspace), threads=2).manifest)
    assert isinstance(entry, FileEntry)
    assert entry.blob_key.endswith(want) and entry.size == size


def test_short_secrets_are_refused(workspace: Path) -> None:
    (workspace / "f").write_bytes(b"abc")
    for secrets in ([b"abc"], [b"abcd", b"ab"], [b""]):
        with pytest.raises(ValueError, match="at least 4 bytes"):
            _native.scan(str(workspace), secrets=secrets)


def test_secrets_must_be_a_sequence_of_bytes(workspace: Path) -> None:
    with pytest.raises(TypeError):
        _native.scan(str(workspace), secrets=b"data")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        _native.scan(str(workspace), secrets=["text"])  # type: ignore[list-item]


def test_fingerprint_depends_on_the_set_only() -> None:
    a = _native.secrets_fingerprint([b"abcd", b"efgh"])
    assert a == _native.secrets_fingerprint([b"efgh", b"abcd", b"abcd"])
    assert a != _native.secrets_fingerprint([b"abcd"])
    assert len(a) == 64 and b"abcd".hex() not in a


def test_hash_file_refuses_symlinks_and_fifos(workspace: Path) -> None:
    (workspace / "f").write_bytes(b"x")
    os.symlink("f", workspace / "l")
    os.mkfifo(workspace / "p")
    with pytest.raises(OSError):
        _native.hash_file(str(workspace / "l"))
    with pytest.raises(OSError):
        _native.hash_file(str(workspace / "p"))
