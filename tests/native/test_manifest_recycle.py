"""A directed scan writes its manifest (and its digests) into a buffer kept
from an earlier one that nobody holds any more: bytes Python still holds are
never rewritten, and a reused buffer has its new length, bytes and hash."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpointd import _native


class Directed:
    """Scans of ``root`` the journal directs, each relative to the last."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.journal = _native.Journal(str(root), "inotify")
        deadline = time.monotonic() + 20
        while not self.journal.status()["ready"]:
            assert time.monotonic() < deadline, self.journal.status()
            time.sleep(0.01)
        ticket = self.journal.take()
        self.parent: bytes = _native.scan(str(root)).manifest
        self.digests = b""
        self.journal.commit(ticket)

    def scan(self) -> bytes:
        self.journal.status()  # (reads the events so far)
        ticket = self.journal.take()
        assert ticket.full is None
        done = _native.scan(
            str(self.root),
            journal=ticket,
            parent=self.parent,
            parent_totals=_native.manifest_totals(self.parent),
        )
        assert done.scan_mode == "journal", done.fallback
        self.journal.commit(ticket)
        if not done.same_as_previous:
            self.parent, self.digests = done.manifest, done.digests
        return self.parent


@pytest.fixture
def directed(tmp_path: Path) -> Iterator[Directed]:
    root = tmp_path / "ws"
    for d in range(4):
        (root / f"d{d}").mkdir(parents=True)
        for f in range(50):
            (root / f"d{d}" / f"f{f}").write_bytes(b"x" * f)
    scans = Directed(root)
    try:
        yield scans
    finally:
        scans.journal.close()


def _edit(root: Path, step: int) -> None:
    """A change that makes the manifest longer on even steps, shorter on odd."""
    extra = root / "d0" / ("a-much-longer-name-" * 4)
    if step % 2 == 0:
        extra.write_bytes(b"y" * step)
    else:
        extra.unlink()
    (root / "d1" / "f1").write_bytes(b"z" * (step + 1))


def test_a_manifest_python_still_holds_is_never_rewritten(directed: Directed) -> None:
    held: list[tuple[bytes, bytes]] = []
    for step in range(12):
        _edit(directed.root, step)
        manifest = directed.scan()
        held.append((manifest, bytes(bytearray(manifest))))
        held.append((directed.digests, bytes(bytearray(directed.digests))))
    for kept, copy in held:
        assert kept == copy
    assert len({id(kept) for kept, _ in held}) == len(held)


def test_a_reused_manifest_has_its_new_length_bytes_and_hash(directed: Directed) -> None:
    let_go: set[int] = set()
    reused = 0
    for step in range(12):
        _edit(directed.root, step)
        before = (id(directed.parent), id(directed.digests))
        hash(directed.parent)  # (cached in the object: must not survive reuse)
        hash(directed.digests)
        manifest = directed.scan()
        digests = directed.digests
        reused += id(manifest) in let_go and id(digests) in let_go
        full = _native.scan(str(directed.root))
        for got, expected in ((manifest, full.manifest), (digests, full.digests)):
            copy = bytes(bytearray(got))
            assert len(got) == len(copy)
            assert hash(got) == hash(copy)
            assert got == copy == expected
        let_go.update(before)
        del manifest, digests, full
    # Each scan's bytes were let go of two scans later: most were reused.
    assert reused >= 8
