"""Property tests over generated trees: the native scan equals a Python model,
serial equals parallel, and a rescan with no change hashes nothing."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checkpointd import _native
from checkpointd.codec import decode_entries, encode_entries

from .reference import age_tree, encode_rows, reference_scan

# Names that exercise JSON escaping and UTF-8 ordering (control characters,
# quotes, backslashes, multi-byte characters, astral code points).
NAMES = st.sampled_from(
    [
        "a",
        "b",
        "Z",
        "é",
        "日本",
        "x y",
        'q"t',
        "back\\slash",
        "n\nl",
        "t\tab",
        "c\x01",
        "😀",
        "-",
        "_",
    ]
)

# A symlink target chosen relative to the link: some stay inside, some escape.
LINK_TARGETS = st.sampled_from(
    ["a", "../a", "./b/../a", "..", "../../../etc", "/etc/passwd", "ROOT/a", "ROOT/../x"]
)


def file_spec() -> st.SearchStrategy[tuple[str, Any]]:
    return st.tuples(st.just("file"), st.tuples(st.binary(max_size=64), st.booleans()))


def link_spec() -> st.SearchStrategy[tuple[str, Any]]:
    return st.tuples(st.just("link"), LINK_TARGETS)


TREES = st.recursive(
    st.dictionaries(NAMES, st.one_of(file_spec(), link_spec()), max_size=4),
    lambda children: st.dictionaries(
        NAMES,
        st.one_of(file_spec(), link_spec(), st.tuples(st.just("dir"), children)),
        max_size=4,
    ),
    max_leaves=14,
)


def build(root: Path, tree: dict[str, tuple[str, Any]], depth: int = 0) -> None:
    for name, (kind, value) in tree.items():
        path = root / name
        if kind == "file":
            data, executable = value
            path.write_bytes(data)
            path.chmod(0o755 if executable else 0o640)
        elif kind == "link":
            os.symlink(value.replace("ROOT", str(root.parents[depth - 1] if depth else root)), path)
        else:
            path.mkdir()
            build(path, value, depth + 1)
            if depth == 1:
                path.chmod(0o750)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(tree=TREES)
def test_scan_matches_model_serial_equals_parallel_and_rescan_is_free(tree: dict[str, Any]) -> None:
    base = Path(tempfile.mkdtemp(prefix="ckpd-prop-"))
    try:
        root = base / "ws"
        root.mkdir()
        build(root, tree)
        age_tree(str(root))
        cache = str(base / "cache.bin")

        serial = _native.scan(str(root), threads=1, cache_path=cache)
        parallel = _native.scan(str(root), threads=4)
        assert serial.manifest == parallel.manifest
        assert serial.unsupported == parallel.unsupported

        rows, unsupported = reference_scan(str(root))
        assert serial.manifest == encode_rows(rows)
        assert serial.unsupported == unsupported
        assert serial.entries == len(rows)
        # The manifest round-trips through the codec byte for byte.
        assert encode_entries(decode_entries(serial.manifest)) == serial.manifest

        again = _native.scan(str(root), threads=4, cache_path=cache)
        assert again.manifest == serial.manifest
        assert again.files_hashed == 0
        assert again.bytes_hashed == 0
        assert again.files_reused == sum(1 for row in rows if row[0] == "f")
    finally:
        shutil.rmtree(base)


PATTERNS = st.sampled_from(
    ["a", "b/", "/a", "*.x", "Z*", "a/**", "**/b", "!a", "!b/", "é", "[ab]", "?", "a/*", "b/**/a"]
)


def walk_paths(root: Path) -> dict[str, str]:
    """Every path under ``root`` → "d", "f" or "l" (nothing followed)."""
    out: dict[str, str] = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            full = Path(directory) / name
            rel = full.relative_to(root).as_posix()
            out[rel] = "l" if full.is_symlink() else "d" if full.is_dir() else "f"
    return out


@settings(max_examples=60, deadline=None)
@given(
    tree=TREES,
    exclude=st.lists(PATTERNS, max_size=3),
    include=st.lists(PATTERNS, max_size=2),
)
def test_scan_keeps_exactly_what_the_matcher_selects(
    tree: dict[str, Any], exclude: list[str], include: list[str]
) -> None:
    base = Path(tempfile.mkdtemp(prefix="ckpd-policy-"))
    try:
        root = base / "ws"
        root.mkdir()
        build(root, tree)
        matcher = _native.PolicyMatcher(exclude, include, True)
        serial = _native.scan(str(root), exclude=exclude, include=include, threads=1)
        parallel = _native.scan(str(root), exclude=exclude, include=include, threads=4)
        assert serial.manifest == parallel.manifest
        assert serial.unsupported == parallel.unsupported

        kept = {entry.path for entry in decode_entries(serial.manifest)}
        unsupported = {path for path, _kind in serial.unsupported}

        def listed(path: str) -> bool:
            # An unsupported directory (a name with a backslash) is reported
            # and not entered: it stands for everything beneath it.
            parts = path.split("/") if path else []
            return any("/".join(parts[: i + 1]) in unsupported for i in range(len(parts)))

        for path, kind in walk_paths(root).items():
            if listed(path.rpartition("/")[0]):
                continue  # beneath an unsupported directory: never judged
            if kind == "d":
                if matcher.excluded(path, True):
                    assert path not in kept
                elif not include:
                    assert path in kept or listed(path)
                continue
            selected = matcher.selects(path, False)
            assert (path in kept or listed(path)) is selected, (path, exclude, include)
        # Every kept entry's parent directory is kept too (restore can rebuild the tree).
        for path in kept:
            parent = path.rpartition("/")[0]
            assert parent == "" or parent in kept, (path, exclude, include)
        # With an include list, every recorded directory is included or holds a kept entry.
        if include:
            for path in kept:
                if (root / path).is_dir() and not (root / path).is_symlink():
                    holds = any(other.startswith(path + "/") for other in kept)
                    assert holds or matcher.included(path, True), (path, include)
    finally:
        shutil.rmtree(base)
