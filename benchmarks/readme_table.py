"""The README's comparison table, rendered from one committed benchmark result.

    python -m benchmarks.readme_table            # print the table
    python -m benchmarks.readme_table --write    # replace it in README.md
    python -m benchmarks.readme_table --check    # exit 1 when README.md differs

The table sits in README.md between the two marker comments below; nothing else
in the README is touched. Its numbers come from ``benchmarks/results/full.json``
(or ``--result``): checkpointd's row is the Python API's, run as a fresh process
per operation like every peer, and each peer cell gives the peer's median and the
peer's median divided by ours (above 1: checkpointd is faster).
``tests/test_docs.py`` checks that the README holds what this renders.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .context import CHANGED_1PCT, COLD, NO_CHANGE, RESTORE_EMPTY
from .ours import API_TOOL, REPO_ROOT

START = "<!-- benchmark-table:start (python -m benchmarks.readme_table --write) -->"
END = "<!-- benchmark-table:end -->"
RESULT = REPO_ROOT / "benchmarks" / "results" / "full.json"
README = REPO_ROOT / "README.md"
CORPUS = "many-small"

# Rows: (label, operation in the result). Columns: (label, tool per operation).
ROWS: tuple[tuple[str, str], ...] = (
    ("cold capture", COLD),
    ("capture, nothing changed", NO_CHANGE),
    ("capture after 1% changed", CHANGED_1PCT),
    ("restore into an empty dir", RESTORE_EMPTY),
)
PEERS: tuple[tuple[str, Mapping[str, str]], ...] = (
    (
        "restic",
        {COLD: "restic", NO_CHANGE: "restic", CHANGED_1PCT: "restic", RESTORE_EMPTY: "restic"},
    ),
    (
        "git",
        {
            COLD: "git (add+commit)",
            NO_CHANGE: "git status",
            CHANGED_1PCT: "git (add+commit)",
            RESTORE_EMPTY: "git checkout",
        },
    ),
    ("tar \\| zstd -1", {COLD: "tar | zstd -1", RESTORE_EMPTY: "tar | zstd -1"}),
)


def _measurements(result: Mapping[str, Any]) -> dict[tuple[str, str], Mapping[str, Any]]:
    """The result's successful measurements of CORPUS by (operation, tool)."""
    return {
        (m["op"], m["tool"]): m
        for m in result["measurements"]
        if m["corpus"] == CORPUS and m.get("error") is None
    }


def _seconds(value: float) -> str:
    return f"{value:.2f} s"


def _stored(measurement: Mapping[str, Any] | None) -> str:
    stored = (measurement or {}).get("notes", {}).get("stored_bytes")
    return "—" if stored is None else f"{stored / 1e6:.1f} MB"


def render(result: Mapping[str, Any]) -> str:
    """The table (with its caption) for ``result``, a ``python -m benchmarks`` JSON.

    Raises KeyError when the result lacks checkpointd's row for an operation.
    """
    found = _measurements(result)
    header = ["", "checkpointd", *(label for label, _ in PEERS)]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    for label, op in ROWS:
        ours = found[(op, API_TOOL)]["median_s"]
        cells = [label, f"**{_seconds(ours)}**"]
        for _, tools in PEERS:
            peer = found.get((op, tools.get(op, "")))
            cells.append(
                "—"
                if peer is None
                else f"{_seconds(peer['median_s'])} ({peer['median_s'] / ours:.1f}×)"
            )
        lines.append("| " + " | ".join(cells) + " |")
    stored = [_stored(found.get((COLD, API_TOOL)))]
    stored += [_stored(found.get((COLD, tools[COLD]))) for _, tools in PEERS]
    lines.append("| stored after the cold capture | " + " | ".join(stored) + " |")
    return "\n".join([*lines, "", _caption(result)])


def _caption(result: Mapping[str, Any]) -> str:
    stats = result["corpora"][CORPUS]["stats"]
    machine = result["machine"]
    versions = result.get("versions", {})
    peers = ", ".join(
        f"{name} {_version_number(versions[name])}"
        for name in ("restic", "git", "tar", "zstd")
        if name in versions
    )
    return (
        f"{stats['files']:,} small files ({stats['bytes'] / 1e6:.1f} MB), median of "
        f"{result['runs']} runs each, {machine['nproc']} cores, {machine['scratch_filesystem']}, "
        f"run of {result['started_utc']} ({peers}). In brackets: the tool's time divided "
        "by checkpointd's; above 1, checkpointd is faster. Every tool runs as a fresh "
        f"process. Rendered from `benchmarks/results/{RESULT.name}` by "
        "`python -m benchmarks.readme_table`."
    )


def _version_number(text: str) -> str:
    """``1.5.4`` from ``Zstandard CLI (64-bit) v1.5.4, by Yann Collet``."""
    match = re.search(r"\d+(?:\.\d+)+", text)
    return match.group(0) if match else text


def render_file(path: Path = RESULT) -> str:
    return render(json.loads(path.read_text()))


def embedded(readme_text: str) -> str:
    """The text between the markers of ``readme_text``, without the blank lines
    around it. Raises ValueError when the markers are missing or out of order."""
    start, end = readme_text.find(START), readme_text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"README lacks the markers {START!r} ... {END!r}")
    return readme_text[start + len(START) : end].strip("\n")


def replaced(readme_text: str, table: str) -> str:
    """``readme_text`` with ``table`` between the markers."""
    embedded(readme_text)  # the markers are there
    head, rest = readme_text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{table}\n{END}{tail}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.readme_table", description=__doc__)
    parser.add_argument("--result", type=Path, default=RESULT, help="a python -m benchmarks JSON")
    parser.add_argument("--readme", type=Path, default=README)
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", action="store_true", help="replace the table in the README")
    action.add_argument("--check", action="store_true", help="exit 1 when the README differs")
    args = parser.parse_args(argv)
    table = render_file(args.result)
    if args.write:
        args.readme.write_text(replaced(args.readme.read_text(), table))
    elif args.check:
        if embedded(args.readme.read_text()) != table:
            print(
                f"{args.readme}: the table differs; run python -m benchmarks.readme_table --write"
            )
            return 1
    else:
        print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
