"""The README and docs/: links that resolve, words for users, a table that is
generated, and a walk-through that works.

* Every relative link of README.md and docs/*.md names a file of the repository,
  and every ``#anchor`` a heading of the page it points at (GitHub's slugs).
* No words that only make sense inside the team: "the seeds", "SPEC §", "issue N",
  commit hashes, paths outside the repository.
* README.md is at most 250 lines, its set-up block holds exactly the two commands
  ``make run`` and ``make test``, and each of its shell blocks says how it is checked
  (``<!-- checked-by: ... -->``) or why it is not run here (``<!-- not-run: ... -->``).
* The comparison table is what ``python -m benchmarks.readme_table`` renders from the
  committed result.
* The walk-through block runs, as written, against a real daemon started as
  ``make run`` starts it, in a fresh directory.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks import readme_table

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
PAGES = [README, *DOCS]
# The SDKs' own READMEs are to be held to the same words once their rewrite lands
# (they still say "the seeds"); until then the words test covers README.md and docs/.
CLIENT_READMES: list[Path] = []
MAX_README_LINES = 250

FORBIDDEN = {
    "team-only name of the reference documents": re.compile(r"\bthe seeds?\b", re.I),
    "a section of a document outside the repository": re.compile(r"SPEC §"),
    "an issue number": re.compile(r"\bissues? #?\d+|(?<![\w&])#\d+\b", re.I),
    "a commit hash": re.compile(r"\b[0-9a-f]{40}\b"),
    "a path outside the repository": re.compile(r"\.\./shared\b"),
}
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.M | re.S)
MARKER = re.compile(r"<!-- (checked-by|not-run): [^>]+ -->\n$")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    seen: dict[str, int] = {}
    anchors = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        slug = _slug(heading)
        count = seen.get(slug, 0)
        anchors.add(slug if count == 0 else f"{slug}-{count}")
        seen[slug] = count + 1
    return anchors


def _links(page: Path) -> Iterator[str]:
    yield from LINK.findall(FENCE.sub("", page.read_text()))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_links_resolve_within_the_repository(page: Path) -> None:
    broken = []
    for target in _links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.is_relative_to(REPO) or not resolved.exists():
            broken.append(f"{target}: no such file in the repository")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(f"{target}: {resolved.name} has no heading #{anchor}")
    assert not broken, "\n".join(broken)


def test_the_pages_link_to_each_other() -> None:
    """Every docs page is reachable from the README or from docs/README.md."""
    index = {
        (REPO / "docs" / t.partition("#")[0]).resolve() for t in _links(REPO / "docs" / "README.md")
    }
    index |= {(REPO / t.partition("#")[0]).resolve() for t in _links(README)}
    assert {page.resolve() for page in DOCS} - {(REPO / "docs" / "README.md").resolve()} <= index


@pytest.mark.parametrize("page", [*PAGES, *CLIENT_READMES], ids=lambda p: str(p.relative_to(REPO)))
def test_words_are_for_users_and_maintainers(page: Path) -> None:
    found = [
        f"{page.relative_to(REPO)}:{text[: m.start()].count(chr(10)) + 1}: {m.group(0)!r} ({why})"
        for text in [page.read_text()]
        for why, pattern in FORBIDDEN.items()
        for m in pattern.finditer(text)
    ]
    assert not found, "\n".join(found)


def test_the_forbidden_words_are_found() -> None:
    """The patterns above catch what they are for (and the test can fail)."""
    samples = [
        "in the seeds' words",
        "SPEC §4",
        "issue 12",
        "#15 asks",
        "../shared/SPEC.md",
        "a" * 40,
    ]
    assert all(any(p.search(s) for p in FORBIDDEN.values()) for s in samples)
    assert not any(p.search("C# 12, made from a seed") for p in FORBIDDEN.values())


def test_the_readme_is_a_front_page() -> None:
    assert len(README.read_text().splitlines()) <= MAX_README_LINES


def _shell_blocks(text: str) -> list[tuple[str, str]]:
    """(marker line or "", body) of every ```sh block."""
    blocks = []
    for match in FENCE.finditer(text):
        if match.group(1) in ("sh", "bash", "shell"):
            before = text[: match.start()]
            marker = MARKER.search(before)
            blocks.append((marker.group(0) if marker else "", match.group(2)))
    return blocks


def _commands(body: str) -> list[str]:
    return [
        line.split("#", 1)[0].strip() for line in body.splitlines() if line.split("#", 1)[0].strip()
    ]


def test_exactly_two_set_up_commands() -> None:
    text = README.read_text()
    install = text.split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
    blocks = _shell_blocks(install)
    assert [_commands(body) for _, body in blocks] == [["make run", "make test"]]


def test_every_shell_block_says_how_it_is_checked() -> None:
    blocks = _shell_blocks(README.read_text())
    assert blocks and all(marker for marker, _ in blocks), [b for m, b in blocks if not m]


def test_the_comparison_table_is_generated_from_the_committed_result() -> None:
    assert readme_table.embedded(README.read_text()) == readme_table.render_file(), (
        "run python -m benchmarks.readme_table --write"
    )


def _walkthrough() -> str:
    for marker, body in _shell_blocks(README.read_text()):
        if "tests/test_docs.py runs this block" in marker:
            return body
    raise AssertionError("README.md has no walk-through block marked for tests/test_docs.py")


def _environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("CHECKPOINTD_")}


def _wait_serving(daemon: subprocess.Popen[bytes], data_dir: Path, log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert daemon.poll() is None, log.read_text()
        health = subprocess.run(
            [sys.executable, "-m", "checkpointd", "health", "--data-dir", str(data_dir)],
            env=_environment(),
            capture_output=True,
            timeout=30,
        )
        if health.returncode == 0:
            return
        time.sleep(0.2)
    raise AssertionError(f"the daemon did not serve within 60 s:\n{log.read_text()}")


@pytest.fixture
def make_run_dir() -> Iterator[Path]:
    """A fresh directory laid out as `make run` leaves the repository: .venv,
    ./workspace, and the daemon serving it with its data in ./.checkpointd-data."""
    root = Path(tempfile.mkdtemp(prefix="cpd-readme-", dir="/tmp"))  # short socket path
    (root / ".venv").symlink_to(Path(sys.prefix))  # the venv the tests run in
    (root / "workspace").mkdir()
    log = root / "daemon.log"
    command = [sys.executable, "-m", "checkpointd", "serve"]
    command += [
        "--workspace",
        str(root / "workspace"),
        "--data-dir",
        str(root / ".checkpointd-data"),
    ]
    with log.open("wb") as out:
        daemon = subprocess.Popen(command, env=_environment(), stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_serving(daemon, root / ".checkpointd-data", log)
        yield root
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        shutil.rmtree(root, ignore_errors=True)


def test_the_walkthrough_runs_as_written(make_run_dir: Path) -> None:
    venv = make_run_dir / ".venv" / "bin"
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", _walkthrough()],
        cwd=make_run_dir,
        env={**_environment(), "PATH": f"{venv}{os.pathsep}{os.environ.get('PATH', '')}"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    captured = re.search(r"^captured (\S+) \(1 files", result.stdout, re.M)
    assert captured, result.stdout
    # diff --thread demo, before the restore: what the README's comment says.
    assert re.search(r"^A hello\.txt\nM main\.py$", result.stdout, re.M), result.stdout
    # restore: back to the checkpoint; list: the thread's one checkpoint.
    workspace = make_run_dir / "workspace"
    assert sorted(p.name for p in workspace.iterdir()) == ["main.py"]
    assert (workspace / "main.py").read_text() == "print('hi')\n"
    listed = [line for line in result.stdout.splitlines() if captured.group(1) in line]
    assert any("first" in line for line in listed[1:]), result.stdout
