"""The README and docs/: links that resolve, words for users, a table that is
generated, and a walk-through that works.

* Every relative link of README.md and docs/*.md names a file of the repository,
  and every ``#anchor`` a heading of the page it points at (GitHub's slugs).
* No words that only make sense inside the team: "the seeds", "SPEC §", "issue N",
  commit hashes, paths outside the repository; the SDKs' READMEs too.
* README.md is at most 250 lines, its set-up block holds exactly the two commands
  ``make run`` and ``make test``, and each of its shell blocks says how it is checked
  (``<!-- checked-by: ... -->``) or why it is not run here (``<!-- not-run: ... -->``).
* The comparison table is what ``python -m benchmarks.readme_table`` renders from the
  committed result.
* The walk-through block runs, as written, against a real daemon started as
  ``make run`` starts it (its data in the default data directory of a fresh
  ``$HOME``), in a fresh directory.
"""

from __future__ import annotations

import os
import re
import shlex
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
CLIENT_READMES = sorted((REPO / "clients").glob("*/README.md"))
MAX_README_LINES = 250

FORBIDDEN = {
    "team-only name of the reference documents": re.compile(r"\bthe seeds?\b", re.I),
    "a section of a document outside the repository": re.compile(r"SPEC §"),
    "an issue number": re.compile(r"\bissues? #?\d+|(?<![\w&])#\d+\b", re.I),
    "a commit hash": re.compile(r"\b[0-9a-f]{40}\b"),
}
# A relative path to a `shared` directory: outside the repository when it climbs
# above the root (the team's documents), inside when it does not (clients/shared).
SHARED_PATH = re.compile(r"(?<![\w./])((?:\.\./)+)shared\b")
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


def _team_words(page: Path, text: str) -> list[str]:
    """Each forbidden word of ``text``, read as the page at ``page`` holds it."""
    found = [
        f"{text[: m.start()].count(chr(10)) + 1}: {m.group(0)!r} ({why})"
        for why, pattern in FORBIDDEN.items()
        for m in pattern.finditer(text)
    ]
    for m in SHARED_PATH.finditer(text):
        if not (page.parent / m.group(1)).resolve().is_relative_to(REPO):
            line = text[: m.start()].count(chr(10)) + 1
            found.append(f"{line}: {m.group(0)!r} (a path outside the repository)")
    return found


@pytest.mark.parametrize("page", [*PAGES, *CLIENT_READMES], ids=lambda p: str(p.relative_to(REPO)))
def test_words_are_for_users_and_maintainers(page: Path) -> None:
    found = _team_words(page, page.read_text())
    assert not found, "\n".join(f"{page.relative_to(REPO)}:{f}" for f in found)


def test_the_forbidden_words_are_found() -> None:
    """The patterns above catch what they are for (and the test can fail)."""
    samples = ["in the seeds' words", "SPEC §4", "issue 12", "#15 asks", "a" * 40]
    assert all(_team_words(README, s) for s in samples)
    assert not _team_words(README, "C# 12, made from a seed")
    # ../shared climbs out of the repository from its root, not from clients/typescript.
    assert _team_words(README, "see ../shared/SPEC.md")
    assert _team_words(REPO / "docs" / "x.md", "[spec](../../shared/SPEC.md)")
    assert not _team_words(REPO / "clients" / "typescript" / "README.md", "../shared/errors.json")


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


def _wait_serving(daemon: subprocess.Popen[bytes], env: dict[str, str], log: Path) -> None:
    """Wait until ``checkpointd health``, given no flag, finds the daemon SERVING."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert daemon.poll() is None, log.read_text()
        health = subprocess.run(
            [sys.executable, "-m", "checkpointd", "health"],
            env=env,
            capture_output=True,
            timeout=30,
        )
        if health.returncode == 0:
            return
        time.sleep(0.2)
    raise AssertionError(f"the daemon did not serve within 60 s:\n{log.read_text()}")


def _make_run_serve(env: dict[str, str], workspace: Path) -> list[str]:
    """The daemon command `make run` ends with, read from its dry run."""
    dry = subprocess.run(
        ["make", "--dry-run", "--silent", "run", f"WORKSPACE={workspace}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    serve = [line for line in dry.stdout.splitlines() if " serve " in line]
    assert len(serve) == 1, dry.stdout
    return shlex.split(serve[0])


@pytest.fixture
def make_run_dir() -> Iterator[tuple[Path, dict[str, str]]]:
    """A fresh directory laid out as `make run` leaves the repository (.venv,
    ./workspace), a fresh $HOME, and the daemon `make run` starts serving it
    with its data in that $HOME's default data dir. Yields the directory and
    the environment a second terminal would have."""
    root = Path(tempfile.mkdtemp(prefix="cpd-readme-", dir="/tmp"))  # short socket path
    (root / ".venv").symlink_to(Path(sys.prefix))  # the venv the tests run in
    (root / "workspace").mkdir()
    (root / "home").mkdir()
    venv = root / ".venv" / "bin"
    env = {
        **_environment(),
        "HOME": str(root / "home"),
        "PATH": f"{venv}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    command = _make_run_serve(env, root / "workspace")
    data_dir = Path(command[command.index("--data-dir") + 1])
    assert data_dir == root / "home" / ".local" / "state" / "checkpointd", command
    data_dir.mkdir(parents=True)  # as make run does
    log = root / "daemon.log"
    with log.open("wb") as out:
        daemon = subprocess.Popen(command, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_serving(daemon, env, log)
        yield root, env
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        shutil.rmtree(root, ignore_errors=True)


def test_the_walkthrough_runs_as_written(make_run_dir: tuple[Path, dict[str, str]]) -> None:
    root, env = make_run_dir
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", _walkthrough()],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    captured = re.search(r"^captured (\S+) \(1 files", out, re.M)
    assert captured, out
    # diff --thread demo, before the restore: what the README's comment says.
    assert re.search(r"^A hello\.txt\nM main\.py$", out, re.M), out
    # restore: back to the checkpoint, the edits saved to the stash first.
    assert re.search(rf"^restored {captured.group(1)} ", out, re.M), out
    assert "saved the live changes first" in out, out
    # cat: the checkpoint's file, by its label.
    assert re.search(r"^print\('hi'\)$", out, re.M), out
    # list: the thread's one checkpoint, labelled.
    listed = [line for line in out.splitlines() if captured.group(1) in line]
    assert any("first" in line for line in listed[1:]), out
    # undo: the edits the restore replaced are back.
    workspace = root / "workspace"
    assert sorted(p.name for p in workspace.iterdir()) == ["hello.txt", "main.py"]
    assert (workspace / "main.py").read_text() == "print('bye')\n"
    assert (workspace / "hello.txt").read_text() == "hello\n"
