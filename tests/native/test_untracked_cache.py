"""The stat cache's directory listings (git's untracked cache).

A rescan reuses a directory's recorded listing only when the directory's
fstat (dev, ino, mtime, ctime) is unchanged and its mtime is not racy; every
entry is still lstat'ed. These tests change trees the way a hostile sandbox
would (setting mtimes back, swapping directories for symlinks, moving
subtrees, creating and deleting within one timestamp tick, mounting over a
listed directory) and check that a cached rescan equals a fresh scan, on the
machine's filesystem and on one with 1-second timestamps.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import blake3
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checkpointd import _native
from checkpointd.codec import decode_entries
from checkpointd.model import FileEntry

from ..fixtures.loopfs import coarse_ext4
from ..fixtures.tmpfs import small_tmpfs
from .reference import age_tree


@pytest.fixture(params=["native-fs", "coarse-ext4"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    """A workspace on this machine's filesystem, or on a 1-second-timestamp ext4."""
    if request.param == "native-fs":
        workspace = tmp_path / "ws"
        workspace.mkdir()
        yield workspace
        return
    with coarse_ext4(tmp_path) as mount_point:
        workspace = mount_point / "ws"
        workspace.mkdir()
        yield workspace


def make_tree(root: Path) -> None:
    for directory in ("a", "a/x", "a/x/deep", "b", "c"):
        (root / directory).mkdir()
    for path in ("a/1.txt", "a/x/2.txt", "a/x/deep/3.txt", "b/4.txt", "top.txt"):
        (root / path).write_bytes(path.encode())
    os.symlink("a/1.txt", root / "link")


# The manifest each cache's last scan returned: every cached scan is given it
# as its previous manifest, as a capture gives the parent's, so each hostile
# change below is also a test that the cache's manifest witness (a no-change
# scan keeps the previous manifest without encoding one) never hides a change.
_last_manifest: dict[str, bytes] = {}


def previous_of(manifest: bytes | None) -> dict[str, Any]:
    """The scan's arguments naming ``manifest`` as its previous one, as a
    capture names its parent's: length and fingerprint (BLAKE3)."""
    if manifest is None:
        return {}
    return {
        "previous_length": len(manifest),
        "previous_fingerprint": blake3.blake3(manifest).digest(),
    }


class Kept:
    """A scan result that kept its previous manifest (``same_as_previous``):
    its manifest is those bytes, as the capture takes them."""

    def __init__(self, result: _native.ScanResult, manifest: bytes) -> None:
        self._result = result
        self.manifest = manifest

    def __getattr__(self, name: str) -> Any:
        return getattr(self._result, name)


def scan_given(root: Path, previous: bytes | None, **options: Any) -> Any:
    """``_native.scan`` given ``previous`` (by length and fingerprint)."""
    result = _native.scan(str(root), **options, **previous_of(previous))
    if result.same_as_previous:
        assert previous is not None and result.manifest == b""
        return Kept(result, previous)
    return result


def scan(root: Path, cache: str | None) -> Any:
    previous = _last_manifest.get(cache) if cache is not None else None
    result = scan_given(root, previous, cache_path=cache)
    if cache is not None:
        _last_manifest[cache] = result.manifest
    return result


def assert_same_as_fresh(root: Path, cached: _native.ScanResult) -> None:
    fresh = _native.scan(str(root))
    assert decode_entries(cached.manifest) == decode_entries(fresh.manifest)
    assert cached.manifest == fresh.manifest
    assert cached.unsupported == fresh.unsupported
    # What the scan says of its manifest (the capture hands these to Manifest
    # instead of parsing the bytes again) is what the bytes say; a scan that
    # kept its previous manifest leaves its digests to the caller.
    kept = cached.digests == b"" and cached.file_count > 0
    assert kept or cached.digests == _native.manifest_digests(cached.manifest)
    totals = (cached.entries, cached.file_count, cached.file_bytes)
    assert totals == _native.manifest_totals(cached.manifest)


def primed(root: Path, cache: str) -> _native.ScanResult:
    """Build, age and scan twice: the second scan reuses every listing."""
    make_tree(root)
    age_tree(str(root))
    scan(root, cache)
    again = scan(root, cache)
    assert again.dirs_reused == again.dirs_listed == 6  # root, a, a/x, a/x/deep, b, c
    # Nothing changed: the previous manifest is kept on the cache's word.
    assert again.manifest_witnessed and again.manifest is _last_manifest[cache]
    return again


def mtimes(root: Path) -> dict[str, int]:
    return {directory: os.stat(directory).st_mtime_ns for directory, _dirs, _files in os.walk(root)}


def set_back(saved: dict[str, int]) -> None:
    """`touch -d`: every directory that still exists gets its old mtime back
    (its ctime moves to now: that cannot be set back)."""
    for directory, mtime in saved.items():
        if os.path.isdir(directory) and not os.path.islink(directory):
            os.utime(directory, ns=(mtime, mtime), follow_symlinks=False)


def test_unchanged_tree_reuses_every_listing(root: Path, tmp_path: Path) -> None:
    cache = str(tmp_path / "cache.bin")
    again = primed(root, cache)
    assert again.files_hashed == 0
    stamp = os.stat(cache).st_mtime_ns
    third = scan(root, cache)
    assert third.dirs_reused == third.dirs_listed and third.manifest_witnessed
    assert os.stat(cache).st_mtime_ns == stamp  # nothing changed: not rewritten


def test_touch_d_after_a_new_file_is_seen_through_ctime(root: Path, tmp_path: Path) -> None:
    cache = str(tmp_path / "cache.bin")
    primed(root, cache)
    old = os.stat(root / "b").st_mtime_ns
    (root / "b" / "new.txt").write_bytes(b"new")
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(old // 1_000_000_000))
    subprocess.run(["touch", "-d", stamp, str(root / "b")], check=True)
    if os.stat(root / "b").st_mtime_ns != old:
        # touch -d takes whole seconds: put back the exact nanoseconds too.
        os.utime(root / "b", ns=(old, old))
    assert os.stat(root / "b").st_mtime_ns == old
    cached = scan(root, cache)
    assert "b/new.txt" in {entry.path for entry in decode_entries(cached.manifest)}
    assert_same_as_fresh(root, cached)


def test_directory_swapped_for_a_symlink_with_mtimes_set_back(root: Path, tmp_path: Path) -> None:
    cache = str(tmp_path / "cache.bin")
    primed(root, cache)
    saved = mtimes(root)
    shutil.rmtree(root / "a" / "x")
    os.symlink("../b", root / "a" / "x")
    set_back(saved)
    cached = scan(root, cache)
    paths = {entry.path: entry for entry in decode_entries(cached.manifest)}
    assert not any(path.startswith("a/x/") for path in paths)
    assert type(paths["a/x"]).__name__ == "SymlinkEntry"
    assert_same_as_fresh(root, cached)


def test_subtree_moved_and_exchanged_with_mtimes_set_back(root: Path, tmp_path: Path) -> None:
    cache = str(tmp_path / "cache.bin")
    primed(root, cache)
    saved = mtimes(root)
    os.rename(root / "a" / "x", root / "c" / "x")  # a subtree moves
    os.rename(root / "b", root / "a" / "x")  # another directory takes its name
    set_back(saved)
    cached = scan(root, cache)
    paths = {entry.path for entry in decode_entries(cached.manifest)}
    assert {"c/x/deep/3.txt", "a/x/4.txt"} <= paths
    assert "a/x/deep" not in paths
    assert_same_as_fresh(root, cached)


def _start_of_a_second() -> None:
    time.sleep(1 - time.time() % 1 + 0.02)


def test_created_and_deleted_in_the_tick_of_the_scan(root: Path, tmp_path: Path) -> None:
    """On a 1-second filesystem the directory's stat does not change when a
    name comes and another goes in the second of the scan: only the racy
    rule makes the next scan read it again."""
    cache = str(tmp_path / "cache.bin")
    primed(root, cache)
    for _attempt in range(5):
        _start_of_a_second()
        second = int(time.time())
        (root / "c" / "gone.txt").write_bytes(b"soon deleted")
        first = scan(root, cache)
        (root / "c" / "gone.txt").unlink()
        (root / "c" / "born.txt").write_bytes(b"created after the scan")
        if int(time.time()) != second:
            continue  # too slow for one second: try again
        cached = scan(root, cache)
        before = {entry.path for entry in decode_entries(first.manifest)}
        after = {entry.path for entry in decode_entries(cached.manifest)}
        assert "c/gone.txt" in before and "c/born.txt" not in before
        assert "c/born.txt" in after and "c/gone.txt" not in after
        assert_same_as_fresh(root, cached)
        (root / "c" / "born.txt").unlink()
        return
    pytest.fail("could not change the tree within the scan's second in 5 tries")


def test_same_tick_edit_hidden_by_touch_d_is_hashed_again(root: Path, tmp_path: Path) -> None:
    """git's hole: an edit in the second of the scan, its mtime then set back
    with `touch -d`, leaves size, mtime AND ctime as recorded (the ctime only
    has whole seconds). The racy rule on ctime makes the next scan hash it."""
    cache = str(tmp_path / "cache.bin")
    primed(root, cache)
    target = root / "b" / "4.txt"
    old = os.stat(target).st_mtime_ns
    for _attempt in range(5):
        _start_of_a_second()
        second = int(time.time())
        target.write_bytes(b"v1 4")  # same size as "b/4.txt" bytes
        os.utime(target, ns=(old, old))
        first = scan(root, cache)
        target.write_bytes(b"v2 4")
        os.utime(target, ns=(old, old))
        if int(time.time()) != second:
            continue
        cached = scan(root, cache)
        by_path = {entry.path: entry for entry in decode_entries(cached.manifest)}
        before = {entry.path: entry for entry in decode_entries(first.manifest)}
        now, then = by_path["b/4.txt"], before["b/4.txt"]
        assert isinstance(now, FileEntry) and isinstance(then, FileEntry)
        assert now.blob_key != then.blob_key
        assert_same_as_fresh(root, cached)
        return
    pytest.fail("could not edit within the scan's second in 5 tries")


def test_mount_over_a_listed_directory_is_still_a_mount_point(tmp_path: Path) -> None:
    """Mounting does not touch the parent's stat, so its listing is reused;
    the lstat of each entry still sees the other device."""
    root = tmp_path / "ws"
    root.mkdir()
    cache = str(tmp_path / "cache.bin")
    primed(root, cache)
    with small_tmpfs(root / "c") as mounted:
        (mounted / "outside.txt").write_bytes(b"another filesystem")
        cached = scan(root, cache)
        assert cached.dirs_reused >= 1  # the root's listing came from the cache
        assert ("c", "mount-point") in cached.unsupported
        paths = {entry.path for entry in decode_entries(cached.manifest)}
        assert "c" not in paths and "c/outside.txt" not in paths
        assert_same_as_fresh(root, cached)


def test_witness_vouches_only_for_the_manifest_it_recorded(root: Path, tmp_path: Path) -> None:
    """The cache's witness is the digest of the manifest its scan made: a
    previous manifest that is another one (an older head, a capture that
    failed after its scan) is compared byte for byte and replaced."""
    cache = str(tmp_path / "cache.bin")
    first = primed(root, cache).manifest
    for other in (b"[]", first.replace(b'"top.txt"', b'"top.txu"')):
        got = scan_given(root, other, cache_path=cache)
        assert not got.manifest_witnessed and not got.same_as_previous
        assert got.manifest == first
    # The witness still holds for the manifest it recorded.
    kept = scan_given(root, first, cache_path=cache)
    assert kept.manifest_witnessed and kept.same_as_previous and kept.manifest is first


def test_file_holding_a_secret_is_never_witnessed(root: Path, tmp_path: Path) -> None:
    """A file holding a secret is not cached (it is hashed every time), so no
    scan of a tree holding one keeps the previous manifest on the cache's
    word: a same-size rewrite with the mtime set back is captured."""
    cache = str(tmp_path / "cache.bin")
    make_tree(root)
    secret = b"hunter2-secret"
    (root / "b" / "env").write_bytes(b"KEY=" + secret + b"\n")
    age_tree(str(root))

    def scan_secret(previous: bytes | None) -> Any:
        return scan_given(root, previous, cache_path=cache, secrets=[secret])

    first = scan_secret(None).manifest
    again = scan_secret(first)
    assert again.files_hashed == 1 and again.same_as_previous and again.manifest is first
    assert not again.manifest_witnessed  # compared byte for byte instead
    stat = os.stat(root / "b" / "env")
    (root / "b" / "env").write_bytes(b"K=" + secret + b"XY\n")  # same size, secret moved
    os.utime(root / "b" / "env", ns=(stat.st_atime_ns, stat.st_mtime_ns))
    changed = scan_secret(first)
    assert not changed.manifest_witnessed and changed.manifest != first
    assert changed.manifest == _native.scan(str(root), secrets=[secret]).manifest


def test_policy_change_is_not_witnessed(root: Path, tmp_path: Path) -> None:
    """The witness is recorded under the policy it was made with: a scan
    under another policy, given the last manifest, encodes its own rows; once
    it has recorded its own witness, the next one under it is kept."""
    cache = str(tmp_path / "cache.bin")
    full = primed(root, cache).manifest

    def narrowed(previous: bytes) -> Any:
        return scan_given(root, previous, cache_path=cache, exclude=["b/"])

    first = narrowed(full)
    assert not first.manifest_witnessed and first.manifest != full
    assert first.manifest == _native.scan(str(root), exclude=["b/"]).manifest
    again = narrowed(first.manifest)
    assert again.manifest_witnessed and again.manifest is first.manifest
    widened = scan_given(root, first.manifest, cache_path=cache)
    assert not widened.manifest_witnessed and widened.manifest == full


def test_policy_change_uses_the_raw_listing(root: Path, tmp_path: Path) -> None:
    """Listings are kept before the policy: a name the last scan excluded is
    found again from the reused listing of its directory. (Directories the
    last scan did not enter are not in its cache: they are read.)"""
    cache = str(tmp_path / "cache.bin")
    primed(root, cache)
    narrowed = _native.scan(str(root), cache_path=cache, exclude=["top.txt", "x/"])
    paths = {entry.path for entry in decode_entries(narrowed.manifest)}
    assert "top.txt" not in paths and "a/x" not in paths
    assert narrowed.dirs_reused == narrowed.dirs_listed == 4  # root, a, b, c
    widened = scan(root, cache)
    assert (widened.dirs_listed, widened.dirs_reused) == (6, 4)  # a/x, a/x/deep read
    assert {"top.txt", "a/x/deep/3.txt"} <= {e.path for e in decode_entries(widened.manifest)}
    assert_same_as_fresh(root, widened)


# The file ends with the directory section, a 136-byte trailer and a 32-byte
# checksum of both; the file entries come first, one block per directory.
_TRAILER = 136 + 32


def _flip_in_directories(data: bytearray) -> None:
    data[-_TRAILER - 40] ^= 0xFF  # the last directory's record


def _flip_in_witness(data: bytearray) -> None:
    data[-_TRAILER + 80] ^= 0xFF  # the trailer's manifest witness


def _flip_in_entries(data: bytearray) -> None:
    data[8 + 3] ^= 0xFF  # the first block's first name, right after the magic


def _old_version(data: bytearray) -> None:
    data[:8] = b"CKPDSTC4"


def _truncated(data: bytearray) -> None:
    del data[-1]


@pytest.mark.parametrize(
    ("damage", "whole"),
    [
        pytest.param(_flip_in_directories, True, id="directories-corrupt"),
        pytest.param(_flip_in_witness, True, id="witness-corrupt"),
        pytest.param(_flip_in_entries, False, id="entries-corrupt"),
        pytest.param(_old_version, True, id="old-version"),
        pytest.param(_truncated, True, id="truncated"),
    ],
)
def test_corrupt_or_old_cache_is_an_empty_one(
    root: Path, tmp_path: Path, damage: Callable[[bytearray], None], whole: bool
) -> None:
    """A damaged or old cache is never trusted where it is damaged. The
    directories and the trailer are checked as a whole: damage there (or an
    old version, or a cut) leaves no listing and no hash reused. Each
    directory's block of file entries is checked on its own before any of its
    entries is used: a damaged block costs its directory's files a re-hash,
    and nothing else. The next scan writes a sound cache again."""
    cache = tmp_path / "cache.bin"
    primed(root, str(cache))
    data = bytearray(cache.read_bytes())
    damage(data)
    cache.write_bytes(bytes(data))
    again = scan(root, str(cache))
    assert again.files_hashed > 0
    if whole:
        assert again.files_reused == 0 and again.dirs_reused == 0
    else:
        assert again.files_reused > 0 and again.dirs_reused == again.dirs_listed
    assert_same_as_fresh(root, again)
    healed = scan(root, str(cache))
    assert healed.files_hashed == 0 and healed.dirs_reused == healed.dirs_listed


# ----------------------------------------------------------- random mutations

NAMES = ["a", "b", "c", "x", "é", "n o"]
MUTATIONS = st.lists(
    st.tuples(
        st.sampled_from(["file", "rm", "mkdir", "rmtree", "move", "symlink", "rewrite"]),
        st.integers(0, 1000),
        st.integers(0, 1000),
        st.sampled_from(NAMES),
    ),
    min_size=1,
    max_size=6,
)


def _dirs(root: Path) -> list[Path]:
    return sorted(Path(d) for d, _dirs, _files in os.walk(root))


def _entries(root: Path) -> list[Path]:
    out: list[Path] = []
    for directory, dirs, files in os.walk(root):
        out += [Path(directory) / name for name in dirs + files]
    return sorted(out)


def mutate(root: Path, op: str, i: int, j: int, name: str) -> None:
    dirs, entries = _dirs(root), _entries(root)
    where = dirs[i % len(dirs)]
    target = where / name
    if op == "file" and not os.path.lexists(target):
        target.write_bytes(b"made %d" % j)
    elif op == "mkdir" and not os.path.lexists(target):
        target.mkdir()
    elif op == "rm" and entries:
        victim = entries[i % len(entries)]
        if victim.is_symlink() or not victim.is_dir():
            victim.unlink()
    elif op == "rmtree" and len(dirs) > 1:
        shutil.rmtree(dirs[1 + i % (len(dirs) - 1)])
    elif op == "move" and entries:
        moved = entries[i % len(entries)]
        destination = dirs[j % len(dirs)] / name
        if not os.path.lexists(destination) and not destination.is_relative_to(moved):
            os.rename(moved, destination)
    elif op == "symlink" and not os.path.lexists(target):
        os.symlink(name, target)
    elif op == "rewrite" and entries:
        victim = entries[j % len(entries)]
        if victim.is_file() and not victim.is_symlink():
            victim.write_bytes(b"rewritten %d" % i)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(mutations=MUTATIONS, set_mtimes_back=st.booleans())
def test_cached_rescan_equals_fresh_scan_after_random_mutations(
    mutations: list[tuple[str, int, int, str]], set_mtimes_back: bool
) -> None:
    base = Path(tempfile.mkdtemp(prefix="ckpd-utc-"))
    try:
        root = base / "ws"
        root.mkdir()
        cache = str(base / "cache.bin")
        make_tree(root)
        age_tree(str(root))
        scan(root, cache)
        saved = mtimes(root)
        for mutation in mutations:
            mutate(root, *mutation)
        if set_mtimes_back:
            set_back(saved)  # the sandbox hides its changes from mtime checks
        cached = scan(root, cache)
        assert_same_as_fresh(root, cached)
        # And the cache it saved serves the next scan just as well.
        assert_same_as_fresh(root, scan(root, cache))
    finally:
        shutil.rmtree(base)


def test_cache_holds_only_what_the_last_scan_saw(tmp_path: Path) -> None:
    """Bounded: deleted directories and files leave the cache with the scan
    that no longer finds them (nothing accumulates across scans)."""
    root = tmp_path / "ws"
    root.mkdir()
    for d in range(50):
        (root / f"dir{d:02}").mkdir()
        for f in range(5):
            (root / f"dir{d:02}" / f"file{f}.txt").write_bytes(b"x")
    age_tree(str(root))
    cache = tmp_path / "cache.bin"
    scan(root, str(cache))
    full = cache.stat().st_size
    for d in range(25):
        shutil.rmtree(root / f"dir{d:02}")
    scan(root, str(cache))
    assert cache.stat().st_size < full * 0.6


def test_file_swapped_for_a_symlink_while_no_change_scans_run(tmp_path: Path) -> None:
    """A file swapped for a symlink (and back) by a sandbox loop while
    cached no-change scans run: every scan, told of the last manifest, is the
    tree as it was (the file), as it was mid-swap (the link, or nothing
    there), or refuses with FileChangedError; never a mix, never the previous
    manifest kept on the cache's word while the link is there. Once the loop
    stops, a scan is a fresh scan's."""
    root = tmp_path / "ws"
    root.mkdir()
    for d in range(10):
        (root / f"d{d}").mkdir()
        for f in range(20):
            (root / f"d{d}" / f"f{f}.txt").write_bytes(b"file %d %d\n" % (d, f))
    age_tree(str(root))
    cache = str(tmp_path / "cache.bin")
    scan(root, cache)
    assert scan(root, cache).manifest_witnessed
    swapped = root / "d3" / "f7.txt"
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink("f0.txt", outside / "link")
    states = {_native.scan(str(root)).manifest}
    os.rename(swapped, outside / "file")
    states.add(_native.scan(str(root)).manifest)
    os.rename(outside / "link", swapped)
    states.add(_native.scan(str(root)).manifest)
    os.rename(swapped, outside / "link")
    os.rename(outside / "file", swapped)
    assert len(states) == 3  # file, nothing, link

    stop = threading.Event()

    def swap_loop() -> None:
        while not stop.is_set():
            os.rename(swapped, outside / "file")
            os.rename(outside / "link", swapped)
            os.rename(swapped, outside / "link")
            os.rename(outside / "file", swapped)

    swapper = threading.Thread(target=swap_loop)
    swapper.start()
    seen = 0
    try:
        for _ in range(40):
            try:
                result = scan(root, cache)
            except _native.FileChangedError:
                continue
            assert result.manifest in states
            seen += 1
    finally:
        stop.set()
        swapper.join()
    assert seen > 0
    time.sleep(0.02)  # past the racy tick of the last rename
    assert_same_as_fresh(root, scan(root, cache))
    assert_same_as_fresh(root, scan(root, cache))
