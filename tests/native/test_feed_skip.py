"""The feed's skip list: the parent's digests, searched where they lie."""

from __future__ import annotations

import threading
from pathlib import Path

import blake3
import pytest

from checkpointd import _native


def _fed(root: Path, skip: bytes) -> set[bytes]:
    """The digests a capture's scan of ``root`` feeds, given ``skip``."""
    feed = _native.BlobFeed(8 << 20, 1 << 20, skip, max_held_files=2)
    del skip  # the feed keeps the bytes it searches alive itself
    done: list[object] = []
    scan = threading.Thread(target=lambda: done.append(_native.scan(str(root), feed=feed)))
    scan.start()
    fed: set[bytes] = set()
    while (batch := feed.next_batch()) is not None:
        fed.update(digest for digest, _data in batch)
    scan.join(30)
    assert done, "the scan finished"
    return fed


def _tree(root: Path) -> dict[str, bytes]:
    files = {name: f"the file {name}\n".encode() * 3 for name in "abcde"}
    for name, data in files.items():
        (root / name).write_bytes(data)
    return {name: blake3.blake3(data).digest() for name, data in files.items()}


def test_digests_the_parent_holds_are_not_fed(tmp_path: Path) -> None:
    digests = _tree(tmp_path)
    parent = sorted([digests["a"], digests["c"]])
    assert _fed(tmp_path, b"".join(parent)) == {digests[n] for n in "bde"}
    assert _fed(tmp_path, b"") == set(digests.values())


def test_an_unsorted_skip_list_never_skips_what_it_lacks(tmp_path: Path) -> None:
    digests = _tree(tmp_path)
    listed = sorted([digests["a"], digests["b"], digests["c"]], reverse=True)
    fed = _fed(tmp_path, b"".join(listed))
    assert {digests["d"], digests["e"]} <= fed


def test_a_skip_list_of_partial_digests_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="32-byte digests"):
        _native.BlobFeed(8 << 20, 1 << 20, b"\0" * 33)
