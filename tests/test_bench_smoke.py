"""A tiny run of the benchmark harness, so ``make bench`` never rots.

Our own operations plus two cheap floors (find, cat) on a few dozen generated
files, one run each: needs neither restic nor borg, and finishes in seconds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.context import APPEND_1MIB, OPERATIONS, RESTORE_EMPTY, RESTORE_OVER
from benchmarks.corpus import SIZES, ensure_corpus, largest_file, mutate, walk_regular_files
from benchmarks.harness import Config, run
from benchmarks.ours import API_TOOL
from benchmarks.scratch import Scratch

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bench")
    config = Config(
        size="tiny",
        tools=("ours", "floors"),
        floors=("find", "cat"),
        out_dir=root / "results",
        scratch=root / "scratch",
        install=False,
        use_shared_corpus_script=False,  # our own generators, whatever is beside the repo
        pause_s=0,
        delete_in_background=False,
    )
    written = run(config)
    return {path.suffix: path for path in written}


def test_writes_markdown_and_json(tiny_run: dict[str, Path]) -> None:
    assert tiny_run[".md"].name == "tiny.md"
    assert json.loads(tiny_run[".json"].read_text())["size"] == "tiny"


def test_every_operation_of_ours_has_a_positive_time(tiny_run: dict[str, Path]) -> None:
    report = json.loads(tiny_run[".json"].read_text())
    assert set(report["corpora"]) == {"many-small", "agent"}
    ours = [m for m in report["measurements"] if m["tool"] == API_TOOL]
    assert all(m["error"] is None for m in ours), [m["error"] for m in ours if m["error"]]
    for corpus in report["corpora"]:
        ran = {m["op"]: m for m in ours if m["corpus"] == corpus}
        # Only the agent workspace holds a file big enough for the 1 MiB append.
        expected = set(OPERATIONS) - ({APPEND_1MIB} if corpus == "many-small" else set())
        assert set(ran) == expected
        for measurement in ran.values():
            assert measurement["runs"] == 1
            assert measurement["median_s"] > 0
            assert measurement["peak_rss_mib"] > 0
        for op in (RESTORE_EMPTY, RESTORE_OVER):
            assert ran[op]["notes"]["verified"] is True


def test_floors_and_ratios_are_reported(tiny_run: dict[str, Path]) -> None:
    report = json.loads(tiny_run[".json"].read_text())
    floors = {(m["corpus"], m["tool"]) for m in report["measurements"] if m["kind"] == "floor"}
    assert floors == {
        (corpus, tool)
        for corpus in ("many-small", "agent")
        for tool in ("floor: find -printf", "floor: cat")
    }
    assert report["ratios"] and all(r["ratio_median"] > 0 for r in report["ratios"])
    markdown = tiny_run[".md"].read_text()
    for op in OPERATIONS:
        assert f"| {op} | **{API_TOOL}** |" in markdown


@pytest.mark.timeout(300)
def test_the_daemon_suite_times_every_operation_through_a_warm_client(tmp_path: Path) -> None:
    from benchmarks.daemon import WARM_TOOL

    config = Config(
        size="tiny",
        tools=("daemon",),
        floors=(),
        corpora=("many-small",),
        out_dir=tmp_path / "results",
        scratch=tmp_path / "scratch",
        install=False,
        use_shared_corpus_script=False,
        pause_s=0,
        delete_in_background=False,
    )
    report = json.loads(next(p for p in run(config) if p.suffix == ".json").read_text())
    warm = {m["op"]: m for m in report["measurements"] if m["tool"] == WARM_TOOL}
    # A cold capture and a restore into an empty dir too, each to a fresh daemon.
    assert set(warm) == set(OPERATIONS) - {APPEND_1MIB}
    for measurement in warm.values():
        assert measurement["error"] is None, measurement["error"]
        assert measurement["median_s"] > 0
    for op in (RESTORE_EMPTY, RESTORE_OVER):
        assert warm[op]["notes"]["verified"] is True


def test_trash_shrinks_by_deleting_trees_of_few_big_files_first(tmp_path: Path) -> None:
    scratch = Scratch(tmp_path / "scratch", trash_max_bytes=3000, pause_s=0)
    big = scratch.path("big")
    big.mkdir()
    (big / "one.bin").write_bytes(b"x" * 4000)
    small = scratch.path("small")
    small.mkdir()
    for i in range(20):
        (small / f"f{i}").write_bytes(b"y" * 50)
    scratch.aside(big, small)
    assert not big.exists() and not small.exists()  # renamed, not deleted

    scratch.flush()

    left = [p.name for p in scratch.trash.iterdir()]
    assert len(left) == 1 and left[0].endswith("-small")
    scratch.close(background=False)
    assert not scratch.trash.exists()
    assert not list(scratch.root.glob("deleting-*"))


def test_a_new_scratch_finishes_what_any_earlier_run_left_deleting(tmp_path: Path) -> None:
    """Another benchmark's background delete (a sibling root under the same
    scratch dir) is finished before this one times anything; nothing else goes."""
    base = tmp_path / "scratch"
    leftover = base / "restore-run" / "deleting-1"
    (leftover / "tree").mkdir(parents=True)
    (leftover / "tree" / "f").write_bytes(b"z")
    kept = base / "restore-run" / "work"
    kept.mkdir()

    scratch = Scratch(base / "bucket-requests", pause_s=0)

    assert not leftover.exists()
    assert kept.is_dir() and scratch.trash.is_dir()


def _contents(root: Path) -> list[tuple[str, bytes]]:
    return [
        (rel, (root / rel).read_bytes()) for rel, _ in walk_regular_files(root, apply_excludes=True)
    ]


def test_corpora_and_edits_are_deterministic_from_the_seed(tmp_path: Path) -> None:
    for spec in SIZES["tiny"]:
        first = ensure_corpus(spec, tmp_path / "a" / spec.name, use_shared=False)
        second = ensure_corpus(spec, tmp_path / "b" / spec.name, use_shared=False)
        assert _contents(first) == _contents(second)
        assert mutate(first, seed=7) == mutate(second, seed=7)
        assert _contents(first) == _contents(second)
    agent = tmp_path / "a" / "agent"
    assert (agent / ".git" / "HEAD").is_file() and (agent / "node_modules").is_dir()
    assert largest_file(agent) == "build/app.bin"


def test_the_large_file_benchmark_measures_peak_rss(tmp_path: Path) -> None:
    from benchmarks import bigfile_bench

    code = bigfile_bench.main(
        ["--gib", "0.01", "--tools", "engine,daemon", "--scratch", str(tmp_path / "scratch"),
         "--out", str(tmp_path / "results")]
    )  # fmt: skip
    assert code == 0
    rows = json.loads((tmp_path / "results" / "bigfile.json").read_text())
    assert {(r["case"], r["tool"]) for r in rows} == {
        (case, tool)
        for case in ("plain", "secrets")
        for tool in ("checkpointd (engine)", "checkpointd (daemon)")
    }
    assert all(r["peak_rss_mib"] > 0 and r["seconds"] > 0 for r in rows)
