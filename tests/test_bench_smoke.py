"""A tiny run of the benchmark harness, so ``make bench`` never rots.

Our own operations plus two cheap floors (find, cat) on a few dozen generated
files, one run each: needs neither restic nor borg, and finishes in seconds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.context import APPEND_1MIB, OPERATIONS, RESTORE_EMPTY, RESTORE_OVER
from benchmarks.harness import Config, run
from benchmarks.ours import API_TOOL

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
