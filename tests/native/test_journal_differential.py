"""The change journal's differential test: after every random step, a scan the
journal directs equals a full scan of the same tree, byte for byte.

Each step is one of the operations an agent's tools (or a hostile sandbox) make:
create, write, append, truncate, a same-size rewrite set back to its old mtime,
renames of files and directories within the tree, into it from outside and out
of it, mkdir, rmdir and rm -r, chmod, utime to an older time, symlink create
and replace, a hard link and a write through it, delete and recreate under the
same name. The directed scan is given the parent manifest (the previous step's,
as the daemon gives a capture its head) and the journal's ticket; the reference
is a full scan without a stat cache.

Run on inotify (the machine's filesystem) and on fanotify (a tmpfs of its own,
where a filesystem mark sees only it; needs root), with the journal's default
bounds and with tiny ones (so directories are listed whole and the set
overflows to "scan everything"). ``CHECKPOINTD_JOURNAL_STEPS`` sets the number
of steps (default 150 per case in CI; thousands by hand).

A write through a shared ``mmap`` is no event; the daemon's verifying scan
catches it (tests/service/test_watch.py).
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import blake3
import pytest

from checkpointd import _native

from ..fixtures.tmpfs import small_tmpfs

STEPS = int(os.environ.get("CHECKPOINTD_JOURNAL_STEPS", "150"))
# Another seed each run by hand: CHECKPOINTD_JOURNAL_SEED=7.
SEED = int(os.environ.get("CHECKPOINTD_JOURNAL_SEED", "0"))
# A differential case's time budget (CI): it stops early past this.
BUDGET_S = float(os.environ.get("CHECKPOINTD_JOURNAL_BUDGET_S", "60"))

TINY = {"names_per_dir": 3, "dirs": 6, "bytes": 1 << 20, "linked_files": 64}


class Tree:
    """The workspace under test and a directory outside it for moves."""

    def __init__(self, root: Path, outside: Path, seed: int) -> None:
        self.root = root
        self.outside = outside
        self.rng = random.Random(seed)
        self.counter = 0

    def name(self, prefix: str) -> str:
        self.counter += 1
        # Names whose byte order differs from a tree walk's ("-", "." and "0"
        # around "/"), and one non-ASCII.
        return prefix + self.rng.choice(["", "-x", ".y", "0", "é"]) + str(self.counter)

    def all(self, kind: str) -> list[Path]:
        out: list[Path] = []
        for base, dirs, files in os.walk(self.root):
            here = Path(base)
            if kind == "dir":
                out.extend(here / d for d in dirs if not (here / d).is_symlink())
            else:
                out.extend(here / f for f in files + dirs if kind == "any" or (here / f).is_file())
                out.extend(here / d for d in dirs if kind == "link" and (here / d).is_symlink())
        if kind == "link":
            out = [p for p in out if p.is_symlink()]
        elif kind == "file":
            out = [p for p in out if p.is_file() and not p.is_symlink()]
        return out

    def some_dir(self) -> Path:
        return self.rng.choice([self.root, *self.all("dir")])

    def some_file(self) -> Path | None:
        files = self.all("file")
        return self.rng.choice(files) if files else None

    def data(self) -> bytes:
        return self.rng.randbytes(self.rng.choice([0, 1, 17, 300, 5000]))


def _create(t: Tree) -> None:
    (t.some_dir() / t.name("f")).write_bytes(t.data())


def _write(t: Tree) -> None:
    if (f := t.some_file()) is not None:
        f.write_bytes(t.data())


def _append(t: Tree) -> None:
    if (f := t.some_file()) is not None:
        with f.open("ab") as handle:
            handle.write(b"more")


def _truncate(t: Tree) -> None:
    if (f := t.some_file()) is not None:
        os.truncate(f, t.rng.randint(0, 3))


def _same_size_rewrite(t: Tree) -> None:
    """Other bytes of the same size, the mtime set back: only ctime tells."""
    if (f := t.some_file()) is not None:
        before = f.stat()
        f.write_bytes(bytes(b ^ 0xFF for b in f.read_bytes()))
        os.utime(f, ns=(before.st_atime_ns, before.st_mtime_ns))


def _rename_file(t: Tree) -> None:
    if (f := t.some_file()) is not None:
        f.rename(t.some_dir() / t.name("r"))


def _rename_dir(t: Tree) -> None:
    dirs = t.all("dir")
    if dirs:
        d = t.rng.choice(dirs)
        target = t.some_dir()
        if target != d and d not in target.parents:
            d.rename(target / t.name("m"))


def _move_in(t: Tree) -> None:
    """A file or a whole directory moved in from outside the workspace."""
    src = t.outside / t.name("in")
    if t.rng.random() < 0.5:
        src.write_bytes(t.data())
    else:
        (src / "sub").mkdir(parents=True)
        (src / "sub" / "deep").write_bytes(t.data())
        (src / "top").write_bytes(t.data())
    shutil.move(src, t.some_dir() / t.name("i"))  # (a copy across filesystems)


def _move_out(t: Tree) -> None:
    entries = t.all("any")
    if entries:
        victim = t.rng.choice(entries)
        shutil.move(victim, t.outside / t.name("out"))


def _mkdir(t: Tree) -> None:
    (t.some_dir() / t.name("d")).mkdir()


def _remove(t: Tree) -> None:
    dirs = t.all("dir")
    if dirs:
        d = t.rng.choice(dirs)
        shutil.rmtree(d) if t.rng.random() < 0.5 or any(d.iterdir()) else d.rmdir()


def _chmod(t: Tree) -> None:
    targets = t.all("file") + t.all("dir")
    if targets:
        target = t.rng.choice(targets)
        target.chmod(t.rng.choice([0o600, 0o644, 0o755, 0o700, 0o750]))


def _utime_back(t: Tree) -> None:
    targets = t.all("file") + t.all("dir")
    if targets:
        past = time.time() - t.rng.randint(1, 10**6)
        os.utime(t.rng.choice(targets), (past, past))


def _symlink(t: Tree) -> None:
    """Create a link, or replace one (renamed over it) with another target."""
    links = t.all("link")
    # (Targets that stay inside the workspace: an escaping one is refused,
    # see test_a_refused_entry_is_found_again_until_it_goes.)
    target = t.rng.choice(["a", "dir/f", "f0", "é/x"])
    if links and t.rng.random() < 0.5:
        old = t.rng.choice(links)
        tmp = old.parent / t.name("tmp")
        tmp.symlink_to(target)
        tmp.rename(old)
    else:
        (t.some_dir() / t.name("l")).symlink_to(target)


def _hard_link(t: Tree) -> None:
    """A second name for a file, then a write through one of the two."""
    if (f := t.some_file()) is not None:
        other = t.some_dir() / t.name("h")
        os.link(f, other)
        with t.rng.choice([f, other]).open("ab") as handle:
            handle.write(b"through a link")


def _write_linked(t: Tree) -> None:
    """A write through one name of a file that has several."""
    linked = [f for f in t.all("file") if f.stat().st_nlink > 1]
    if linked:
        with t.rng.choice(linked).open("r+b") as handle:
            handle.write(b"L")


def _recreate(t: Tree) -> None:
    if (f := t.some_file()) is not None:
        f.unlink()
        f.write_bytes(t.data())


OPERATIONS: list[Callable[[Tree], None]] = [
    _create,
    _create,
    _write,
    _append,
    _truncate,
    _same_size_rewrite,
    _rename_file,
    _rename_dir,
    _move_in,
    _move_out,
    _mkdir,
    _mkdir,
    _remove,
    _chmod,
    _utime_back,
    _symlink,
    _hard_link,
    _write_linked,
    _recreate,
]


def _wait_watching(journal: _native.Journal) -> None:
    """Until the journal's first walk of the tree is over."""
    deadline = time.monotonic() + 20
    while not journal.status()["ready"]:
        assert time.monotonic() < deadline, journal.status()
        time.sleep(0.01)


def _full(root: Path, cache: str | None = None) -> _native.ScanResult:
    return _native.scan(str(root), cache_path=cache)


def run_differential(
    root: Path, outside: Path, mode: str, seed: int, **limits: int
) -> dict[str, int]:
    """The differential loop; returns counts of how each step's scan went."""
    tree = Tree(root, outside, seed)
    for _ in range(12):
        _create(tree)
        _mkdir(tree)
    journal = _native.Journal(
        str(root),
        mode,
        names_per_dir=limits.get("names_per_dir"),
        dirs=limits.get("dirs"),
        bytes=limits.get("bytes"),
        linked_files=limits.get("linked_files"),
    )
    assert journal.status()["mode"] == mode, journal.status()
    cache = str(outside.parent / f"cache-{mode}-{seed}.bin")
    counts = {"journal": 0, "full": 0, "same": 0, "fallback": 0}
    try:
        _wait_watching(journal)
        # The first capture is a full one (a fresh journal), then trusted.
        ticket = journal.take()
        assert ticket.full and "fresh daemon" in ticket.full
        first = _full(root, cache)
        parent, digests = first.manifest, (first.digests, first.digest_counts)
        journal.commit(ticket)
        started = time.monotonic()
        for step in range(STEPS):
            if time.monotonic() - started > BUDGET_S:
                break
            for _ in range(tree.rng.choice([1, 1, 2, 5])):
                tree.rng.choice(OPERATIONS)(tree)
                if mode == "inotify":
                    # A daemon's journal reads events as they come; the test
                    # gives it that moment, as the time between a tool's calls
                    # does. (Without it, a hard link made, written through and
                    # removed before the journal looked is the blind spot the
                    # verifying scan covers; fanotify names the file by inode.)
                    journal.status()
            ticket = journal.take()
            if ticket.full is not None:
                # Trust was lost (a bound passed, a hard link to a file whose
                # other names it did not know): a full scan, as a capture would.
                counts["full"] += 1
                full = _full(root, cache)
                parent, digests = full.manifest, (full.digests, full.digest_counts)
                journal.commit(ticket)
                continue
            totals = _native.manifest_totals(parent)
            directed = _native.scan(
                str(root),
                cache_path=cache,
                journal=ticket,
                parent=parent,
                parent_totals=totals,
                # (Every other step without them: the digests read whole.)
                parent_digests=digests if step % 2 else None,
            )
            reference = _full(root)
            got = parent if directed.same_as_previous else directed.manifest
            assert directed.scan_mode in ("journal", "full")
            assert directed.unsupported == reference.unsupported == []
            if got != reference.manifest and os.environ.get("JOURNAL_DEBUG"):
                import json

                a, b = json.loads(got or b"[]"), json.loads(reference.manifest)
                print("ONLY JOURNAL", [r for r in a if r not in b])
                print("ONLY FULL", [r for r in b if r not in a])
                print("TICKET", ticket.directories())
            assert got == reference.manifest, (
                f"step {step}: the directed scan differs from a full scan\n"
                f"fallback: {directed.fallback}\n"
                f"journal: {got[:3000]!r}\nfull:    {reference.manifest[:3000]!r}"
            )
            if directed.scan_mode == "journal":
                counts["journal"] += 1
                counts["same"] += directed.same_as_previous
                assert directed.entries == reference.entries
                assert directed.file_count == reference.file_count
                assert directed.file_bytes == reference.file_bytes
                if not directed.same_as_previous:
                    assert directed.digests == reference.digests
                    assert directed.digest_counts == reference.digest_counts
                    assert directed.fingerprint == blake3.blake3(got).digest()
            else:
                # As a capture does (checkpointd.journal.scanned): the tree
                # disagreed with the journal, which walks it again.
                counts["fallback"] += 1
                journal.commit(ticket)
                journal.distrust(str(directed.fallback), find_links=True)
                parent, digests = got, (reference.digests, reference.digest_counts)
                continue
            journal.commit(ticket)
            parent = got
            if not directed.same_as_previous:
                digests = (directed.digests, directed.digest_counts)
    finally:
        journal.close()
    return counts


@contextlib.contextmanager
def _places(tmp_path: Path, mode: str) -> Iterator[tuple[Path, Path]]:
    outside = tmp_path / "outside"
    outside.mkdir()
    if mode == "fanotify":
        # A filesystem of its own, so the mark sees the workspace only; moves
        # in and out of it are then copies (another filesystem), as from a
        # mounted volume.
        with small_tmpfs(tmp_path / "ws", size="64m") as root:
            yield root, outside
    else:
        root = tmp_path / "ws"
        root.mkdir()
        yield root, outside


@pytest.mark.parametrize("mode", ["inotify", "fanotify"])
@pytest.mark.parametrize("bounds", ["default", "tiny"])
def test_a_directed_scan_equals_a_full_scan_after_every_step(
    tmp_path: Path, mode: str, bounds: str
) -> None:
    limits = TINY if bounds == "tiny" else {}
    with _places(tmp_path, mode) as (root, outside):
        seed = (
            SEED * 100
            + {"inotify": 1, "fanotify": 2}[mode] * 10
            + {"default": 1, "tiny": 2}[bounds]
        )
        counts = run_differential(root, outside, mode, seed, **limits)
    # The journal directed most captures (some fall back, some overflow).
    assert counts["journal"] >= 5, counts
    if bounds == "tiny":
        assert counts["full"] >= 1, f"the tiny bounds never overflowed: {counts}"


def test_a_refused_entry_is_found_again_until_it_goes(tmp_path: Path) -> None:
    """A fifo or an escaping link made after the last capture is refused by
    the directed scan as by a full one; the capture fails and gives the
    journal its changes back, so the next one looks again."""
    root = tmp_path / "ws"
    (root / "d").mkdir(parents=True)
    (root / "d" / "f").write_text("x")
    journal = _native.Journal(str(root), "inotify")
    try:
        _wait_watching(journal)
        ticket = journal.take()
        parent = _full(root).manifest
        journal.commit(ticket)
        os.mkfifo(root / "d" / "pipe")
        (root / "out").symlink_to("../../etc")
        for _ in range(2):  # a failed capture gives the changes back
            ticket = journal.take()
            directed = _native.scan(
                str(root),
                journal=ticket,
                parent=parent,
                parent_totals=_native.manifest_totals(parent),
            )
            assert directed.scan_mode == "journal"
            assert directed.unsupported == _full(root).unsupported
            assert directed.unsupported == [("d/pipe", "fifo"), ("out", "symlink-escapes")]
            journal.abort(ticket)
        (root / "d" / "pipe").unlink()
        (root / "out").unlink()
        ticket = journal.take()
        directed = _native.scan(
            str(root), journal=ticket, parent=parent, parent_totals=_native.manifest_totals(parent)
        )
        assert directed.unsupported == []
        assert (parent if directed.same_as_previous else directed.manifest) == _full(root).manifest
    finally:
        journal.close()
