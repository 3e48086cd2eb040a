"""Capture → restore round trips: the reference API's scenario and generated trees."""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from checkpointd.blobs import open_blobs
from checkpointd.capture import CaptureOptions, capture_checkpoint
from checkpointd.model import Policy
from checkpointd.restore import RestoreOptions, restore_checkpoint
from checkpointd.store import open_store

from .conftest import (
    PAST_NS,
    settle_before_record,
    snapshot_tree,
    wait_out_racy_window,
    write_tree,
)

SEED_FILES: dict[str, bytes | str] = {
    "README.md": b"# project\n",
    "src/main.py": b"print('hello')\n",
    "src/util/helpers.py": b"def helper():\n    return 42\n",
    "data/big.bin": random.Random(7).randbytes(3 << 20),
    "data/empty.txt": b"",
    "docs/link-to-readme": "../README.md",
}


async def test_seed_scenario_capture_throw_away_restore(
    store: Any, blobs: Any, tmp_path: Path, data_dir: Path
) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    write_tree(workspace, SEED_FILES)
    (workspace / "empty-dir").mkdir()
    os.chmod(workspace / "src/main.py", 0o755)
    before = snapshot_tree(workspace)

    first = await capture_checkpoint(
        workspace, store, blobs, "thread-1", CaptureOptions(data_dir=data_dir)
    )
    assert first.checkpoint.parent_checkpoint_id is None
    assert first.checkpoint.reason == "automatic"
    assert first.stats.entries == len(before)
    assert first.stats.blobs_uploaded == 5  # README, main, helpers, big, empty
    assert first.stats.bytes_uploaded == sum(
        len(v) for v in SEED_FILES.values() if isinstance(v, bytes)
    )

    # The sandbox is gone; a brand-new one restores into an empty directory.
    shutil.rmtree(workspace)
    fresh = tmp_path / "fresh-sandbox" / "workspace"
    fresh.parent.mkdir()
    restored = await restore_checkpoint(
        fresh,
        store,
        blobs,
        "thread-1",
        RestoreOptions(data_dir=data_dir, progress=settle_before_record),
    )
    assert restored is not None and restored.id == first.checkpoint.id
    assert snapshot_tree(fresh) == before

    # No change since the restore: nothing to hash (the restore filled the stat
    # cache) and nothing to upload.
    wait_out_racy_window()
    second = await capture_checkpoint(
        fresh, store, blobs, "thread-1", CaptureOptions(data_dir=data_dir)
    )
    assert second.stats.blobs_uploaded == 0
    assert second.stats.bytes_uploaded == 0
    assert second.stats.files_hashed == 0
    assert second.stats.files_reused == 5
    assert second.checkpoint.parent_checkpoint_id == first.checkpoint.id
    assert second.checkpoint.created_at > first.checkpoint.created_at

    # Work continues; restoring the older checkpoint brings the old content back.
    (fresh / "src/main.py").write_bytes(b"print('changed')\n")
    (fresh / "new.txt").write_bytes(b"new file\n")
    third = await capture_checkpoint(
        fresh, store, blobs, "thread-1", CaptureOptions(data_dir=data_dir, label="after change")
    )
    assert third.checkpoint.reason == "named"
    assert third.stats.blobs_uploaded == 2
    await restore_checkpoint(
        fresh,
        store,
        blobs,
        "thread-1",
        RestoreOptions(checkpoint_id=first.checkpoint.id, data_dir=data_dir),
    )
    assert snapshot_tree(fresh) == before
    # And forward again to the head.
    await restore_checkpoint(fresh, store, blobs, "thread-1", RestoreOptions(data_dir=data_dir))
    assert (fresh / "src/main.py").read_bytes() == b"print('changed')\n"
    assert (fresh / "new.txt").read_bytes() == b"new file\n"


async def test_second_capture_without_change_hashes_and_uploads_nothing(
    store: Any, blobs: Any, workspace: Path, data_dir: Path
) -> None:
    write_tree(workspace, SEED_FILES)
    await capture_checkpoint(workspace, store, blobs, "t", CaptureOptions(data_dir=data_dir))
    again = await capture_checkpoint(
        workspace, store, blobs, "t", CaptureOptions(data_dir=data_dir)
    )
    assert (again.stats.blobs_uploaded, again.stats.files_hashed) == (0, 0)
    assert again.stats.files_reused == 5
    assert set(again.stats.phases_ms) == {"lease", "scan", "pin", "upload", "append"}


async def test_restore_of_a_thread_without_checkpoints_returns_none(
    memory_store: Any, memory_blobs: Any, tmp_path: Path, data_dir: Path
) -> None:
    root = tmp_path / "new-root"
    assert (
        await restore_checkpoint(
            root, memory_store, memory_blobs, "t", RestoreOptions(data_dir=data_dir)
        )
        is None
    )
    assert root.is_dir()


async def test_restore_leaves_excluded_paths_and_reserved_names(
    memory_store: Any, memory_blobs: Any, workspace: Path, data_dir: Path
) -> None:
    write_tree(workspace, {"keep.txt": b"k", "build/out.o": b"o"})
    policy = Policy(exclude=("build/",))
    await capture_checkpoint(
        workspace, memory_store, memory_blobs, "t", CaptureOptions(policy=policy, data_dir=data_dir)
    )
    write_tree(
        workspace,
        {
            "stray.txt": b"s",
            "build/other.o": b"x",
            "node_modules/pkg/index.js": b"js",
            ".checkpointd-mine": b"reserved",
        },
    )
    await restore_checkpoint(
        workspace, memory_store, memory_blobs, "t", RestoreOptions(policy=policy, data_dir=data_dir)
    )
    tree = snapshot_tree(workspace)
    assert "stray.txt" not in tree  # selected by the policy, not in the checkpoint
    assert {
        "build/out.o",
        "build/other.o",
        "node_modules/pkg/index.js",
        ".checkpointd-mine",
    } <= set(tree)
    assert not [name for name in os.listdir(workspace) if name.startswith(".checkpointd-staging")]


# -- generated trees ------------------------------------------------------------

_NAME = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="/\\"),
    min_size=1,
    max_size=12,
).filter(
    lambda name: (
        name not in (".", "..")
        and not name.startswith((".checkpointd", ".env"))
        and name not in (".git", "node_modules")
        and len(name.encode()) < 200
    )
)
_FILE_MODES = st.sampled_from([0o644, 0o755, 0o600, 0o700, 0o444, 0o640])
_DIR_MODES = st.sampled_from([0o755, 0o700, 0o750, 0o711])
# Every feature at once, always tried first: an empty dir, 0-byte and multi-MiB
# files, unicode names, exec bits, links inside (also one level up, and dangling).
EVERY_FEATURE: dict[str, Any] = {
    "empty": ("dir", {}, 0o755),
    "zero": ("file", 0, 1, 0o644),
    "big.bin": ("file", (3 << 20) + 5, 2, 0o600),
    "run.sh": ("file", 40, 3, 0o755),
    "ünïcødé 名前 🎉": (
        "dir",
        {"ß.txt": ("file", 10, 4, 0o640), "up": ("link", 1, "zero"), "dangling": ("link", 0, "x")},
        0o750,
    ),
    "link": ("link", 0, "run.sh"),
}


@st.composite
def trees(draw: st.DrawFn, depth: int = 0) -> dict[str, Any]:
    """{name: ("file", size, seed, mode) | ("dir", children, mode) | ("link", ups, name)}"""
    # Common names too, so the tree restored over often has the same paths with
    # other kinds, contents and modes.
    name = st.one_of(st.sampled_from(["a", "b", "c"]), _NAME)
    names = draw(st.lists(name, max_size=4 if depth < 2 else 2, unique=True))
    node: dict[str, Any] = {}
    for name in names:
        kind = draw(
            st.sampled_from(["file", "file", "dir", "link"] if depth < 2 else ["file", "link"])
        )
        if kind == "file":
            # Mostly small files; now and then an empty or a multi-MiB one.
            size = (
                draw(st.integers(0, 300))
                if draw(st.integers(0, 9))
                else draw(st.sampled_from([0, (2 << 20) + 17]))
            )
            node[name] = ("file", size, draw(st.integers(0, 1 << 30)), draw(_FILE_MODES))
        elif kind == "dir":
            node[name] = ("dir", draw(trees(depth + 1)), draw(_DIR_MODES))
        else:
            # A relative link that stays inside: at most `depth` levels up.
            ups = draw(st.integers(0, depth))
            node[name] = ("link", ups, draw(_NAME))
    return node


def materialise(root: Path, tree: dict[str, Any]) -> None:
    for name, node in tree.items():
        path = root / name
        if node[0] == "file":
            _, size, seed, mode = node
            path.write_bytes(random.Random(seed).randbytes(size))
            os.chmod(path, mode)
            os.utime(path, ns=(PAST_NS, PAST_NS + seed))
        elif node[0] == "dir":
            _, children, mode = node
            path.mkdir()
            materialise(path, children)
            os.chmod(path, mode)
        else:
            _, ups, target = node
            path.symlink_to("../" * ups + target)


async def _round_trip(source: dict[str, Any], other: dict[str, Any], base: Path) -> None:
    workspace, target, data_dir = base / "ws", base / "target", base / "data"
    workspace.mkdir()
    target.mkdir()
    materialise(workspace, source)
    materialise(target, other)
    policy = Policy(default_excludes=False)
    async with await open_store("memory://") as store:
        blobs = open_blobs("memory://")
        await capture_checkpoint(
            workspace, store, blobs, "t", CaptureOptions(policy=policy, data_dir=data_dir)
        )
        # Into an empty directory, and over a different tree.
        fresh = base / "fresh"
        await restore_checkpoint(
            fresh, store, blobs, "t", RestoreOptions(policy=policy, data_dir=data_dir)
        )
        await restore_checkpoint(
            target, store, blobs, "t", RestoreOptions(policy=policy, data_dir=data_dir)
        )
    expected = snapshot_tree(workspace)
    assert snapshot_tree(fresh) == expected
    assert snapshot_tree(target) == expected


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(source=trees(), other=trees())
@example(source=EVERY_FEATURE, other={})
@example(source={}, other=EVERY_FEATURE)
@example(source=EVERY_FEATURE, other={"big.bin": ("dir", {"x": ("file", 1, 1, 0o644)}, 0o755)})
def test_generated_trees_round_trip(source: dict[str, Any], other: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        asyncio.run(_round_trip(source, other, Path(scratch)))


def _make_non_utf8_dir(workspace: Path) -> None:
    raw = os.fsencode(workspace) + b"/bad-\xff-name"
    os.mkdir(raw)
    with open(raw + b"/inner", "wb") as handle:
        handle.write(b"x")


async def test_restore_removes_unsupported_entries_the_checkpoint_lacks(
    memory_store: Any, memory_blobs: Any, workspace: Path, tmp_path: Path, data_dir: Path
) -> None:
    write_tree(workspace, {"keep.txt": b"k"})
    await capture_checkpoint(
        workspace, memory_store, memory_blobs, "t", CaptureOptions(data_dir=data_dir)
    )
    outside = tmp_path / "outside-target"
    outside.write_bytes(b"must survive")
    os.mkfifo(workspace / "pipe")
    (workspace / "escaping").symlink_to(outside)
    _make_non_utf8_dir(workspace)
    await restore_checkpoint(
        workspace, memory_store, memory_blobs, "t", RestoreOptions(data_dir=data_dir)
    )
    assert sorted(os.listdir(workspace)) == ["keep.txt"]
    assert outside.read_bytes() == b"must survive"


def _identity(path: Path) -> tuple[int, int]:
    info = path.lstat()
    return info.st_ino, info.st_ctime_ns


async def test_identical_files_are_not_rewritten(
    memory_store: Any, memory_blobs: Any, workspace: Path, data_dir: Path
) -> None:
    write_tree(workspace, {f"same/{n}.txt": f"unchanged {n}".encode() for n in range(20)})
    write_tree(workspace, {"changed.txt": b"before"})
    await capture_checkpoint(
        workspace, memory_store, memory_blobs, "t", CaptureOptions(data_dir=data_dir)
    )
    untouched = {n: _identity(workspace / f"same/{n}.txt") for n in range(20)}
    (workspace / "changed.txt").write_bytes(b"after!")
    changed_identity = _identity(workspace / "changed.txt")
    await restore_checkpoint(
        workspace, memory_store, memory_blobs, "t", RestoreOptions(data_dir=data_dir)
    )
    assert {n: _identity(workspace / f"same/{n}.txt") for n in range(20)} == untouched
    assert _identity(workspace / "changed.txt") != changed_identity
    assert (workspace / "changed.txt").read_bytes() == b"before"
