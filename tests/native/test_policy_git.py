"""The policy's gitignore dialect against git itself.

Each case writes its lines to the `.gitignore` of a fresh `git init` repository
holding a small generated tree, and compares what git leaves visible with what
the scanner captures under an exclude policy of the same lines
(``default_excludes=False``):

- files and symlinks: ``git ls-files --others --exclude-standard`` (git lists
  no directory, and nothing under an excluded one) against the manifest's
  non-directory entries;
- every path, directories included: ``git check-ignore`` (which also reports a
  path under an excluded directory) against ``PolicyMatcher.excluded``, and the
  manifest's directories against the same answer.

The lines are the corner cases of the dialect plus seeded random combinations;
the trees hold names built to match (or nearly match) each line, multi-byte
names, dotfiles and nested directories.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from checkpointd import _native
from checkpointd.codec import decode_entries
from checkpointd.model import DirEntry

GIT = shutil.which("git")
pytestmark = pytest.mark.skipif(GIT is None, reason="git is not installed")

# Lines whose meaning the issue named or git's own tests probe. Each is a case
# of its own; the multi-line ones exercise negation and last-match-wins.
CORNERS: list[list[str]] = [
    [line]
    for line in [
        "[[:digit:]]*",
        "[[:alpha:]]",
        "[![:digit:]]*",
        "[[:space:]]x",
        "[[:punct:]]",
        "[[:upper:]]*",
        "[[:lower:]]b",
        "[[:xdigit:]]",
        "[[:alnum:]]*",
        "[[:blank:]]*",
        "[[:graph:]]",
        "[[:print:]]",
        "[[:cntrl:]]*",
        "[^a]*",
        "[!a]",
        "?",
        "??",
        "é?",
        "?é",
        "[é]",
        "[é][é]",
        "日*",
        "*本",
        "a?b",
        "*",
        "**",
        "build/",
        "build//",
        "x\\ ",
        "x ",
        "x\\  ",
        "x  \\ ",
        "\\ ",
        " x",
        "x\r",
        "a//b",
        "/",
        "!",
        "!/",
        "//",
        "//a",
        "/a",
        "a/",
        "a/b",
        "/a/b",
        "a/**",
        "**/a",
        "**/b/",
        "a/**/b",
        "**/a/**",
        "a**b",
        "ab**/c",
        "x/ab**/c",
        "**a",
        "a**",
        "***/b",
        "a/***/b",
        "a/**b",
        "a/**/",
        "**/",
        "/**",
        "*/",
        "*/*",
        "*/b",
        "a/*",
        "a/*/b",
        "a*/",
        "a[/]b",
        "[z-a]",
        "[z-ab]",
        "[abc",
        "[[:digit:]",
        "[[:nope:]]",
        "[[:]",
        "[]]",
        "[!]]",
        "[a-]",
        "[\\]]",
        "[a\\-c]",
        "\\[ab]",
        "a\\*",
        "a\\",
        "\\#x",
        "#x",
        "\\!x",
        ".*",
        ".env*",
        "*.log",
        "a/**/**/b",
        "**/**",
        "[a-c]?/",
        "\\a\\b",
    ]
] + [
    ["*", "!a"],
    ["*", "!*/"],
    ["a/", "!a/b"],
    ["*.log", "!keep.log"],
    ["!keep.log", "*.log"],
    ["**/b", "!**/a/b"],
    ["/*", "!/b"],
    ["a/*", "!a/keep"],
    ["*", "!x", "\\!x"],
    ["b", "!/b"],
]

LITERALS = ["a", "b", "ab", "foo", "x", "keep", "é", "日", ".", "-", " ", "#", "!", "1", "Z"]
WILDS = [
    "*",
    "*",
    "?",
    "**",
    "[ab]",
    "[!a]",
    "[^a]",
    "[a-c]",
    "[[:digit:]]",
    "[[:alpha:]]",
    "[[:space:]]",
    "[[:punct:]]",
    "[[:upper:]]",
    "[é]",
    "[]a]",
    "[a-]",
    "[\\]]",
    "\\*",
    "\\?",
    "\\ ",
    "\\[",
    "\\a",
]
# Lines with these can never match (or nearly so): a few, not most.
BROKEN = ["[z-a]", "[abc", "[[:nope:]]", "[z-ab]"]
PREFIXES = ["", "", "", "", "/", "/", "\\!", "\\#", "**/"]
SUFFIXES = ["", "", "", "", "", "/", "/", "//", " ", "  ", "\\ ", "\\", "/**", "/*"]

# Names every tree may hold, beside the ones built from the case's lines.
NAME_POOL = [
    "a",
    "b",
    "ab",
    "abc",
    "a.log",
    "keep.log",
    "build",
    "x",
    "x ",
    " x",
    "é",
    "éa",
    "aé",
    "ü",
    "日本",
    ".hidden",
    ".env",
    ".env.local",
    "1",
    "42",
    "9z",
    "A",
    "Z",
    "[ab]",
    "*",
    "?",
    "#x",
    "!x",
    "a-b",
    ":",
    "tab\tx",
    "]",
    "a b",
    "keep",
    "c",
]


def random_atom(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.04:
        return rng.choice(BROKEN)
    return rng.choice(LITERALS if roll < 0.5 else WILDS)


def random_line(rng: random.Random, negated: bool) -> str:
    segments = []
    for _ in range(rng.choice([1, 1, 2, 2, 3])):
        if rng.random() < 0.15:
            segments.append("**")
            continue
        atoms = [random_atom(rng) for _ in range(rng.randint(1, 3))]
        segments.append("".join(atoms))
    body = "/".join(segments)
    if rng.random() < 0.1:
        body = body.replace("/", "//", 1)
    return ("!" if negated else "") + rng.choice(PREFIXES) + body + rng.choice(SUFFIXES)


def random_cases(seed: int, count: int) -> list[list[str]]:
    """1 to 3 lines each; only a line after the first may be a `!` line (alone,
    one would have nothing to take back)."""
    rng = random.Random(seed)
    cases = []
    for _ in range(count):
        size = rng.choice([1, 1, 2, 3])
        cases.append([random_line(rng, negated=n > 0 and rng.random() < 0.4) for n in range(size)])
    return cases


CASES = CORNERS + random_cases(seed=20261201, count=200)
PATTERN_COUNT = sum(len(lines) for lines in CASES)


def _bad_name(name: str) -> bool:
    return (
        name in ("", ".", "..", ".git", ".gitignore")
        or "\\" in name
        or "/" in name
        or name.startswith(".checkpointd")
    )


POSIX_MEMBERS = {
    "digit": "07",
    "alpha": "qZ",
    "alnum": "k5",
    "space": " \t",
    "blank": " ",
    "punct": "%-",
    "upper": "QA",
    "lower": "qb",
    "xdigit": "fA",
    "graph": "~",
    "print": " ",
    "cntrl": "\x01",
}


def class_end(segment: str, start: int) -> int:
    """Index of the `]` closing the class opened at ``segment[start]``, or -1."""
    k = start + 1
    if segment[k : k + 1] in ("!", "^") and k < len(segment):
        k += 1
    if segment[k : k + 1] == "]":
        k += 1
    while k < len(segment):
        if segment.startswith("[:", k) and ":]" in segment[k + 2 :]:
            k = segment.index(":]", k + 2) + 2
        elif segment[k] == "\\":
            k += 2
        elif segment[k] == "]":
            return k
        else:
            k += 1
    return -1


def class_member(inside: str, rng: random.Random) -> str:
    """A byte that a class written as ``[inside]`` probably accepts."""
    for name, members in POSIX_MEMBERS.items():
        if f"[:{name}:]" in inside:
            return rng.choice(members)
    escaped = [inside[k + 1] for k in range(len(inside) - 1) if inside[k] == "\\"]
    plain = [c for c in inside if c not in "!^\\[]:-"] + escaped
    return rng.choice(plain) if plain else "b"


def witness_name(segment: str, rng: random.Random) -> str:
    """A name built from one segment of a line: wildcards filled in at random,
    so that it matches the segment often but not always."""
    out = []
    i = 0
    while i < len(segment):
        c = segment[i]
        if c == "\\" and i + 1 < len(segment):
            out.append(segment[i + 1])
            i += 2
            continue
        if c == "*":
            while i < len(segment) and segment[i] == "*":
                i += 1
            out.append(rng.choice(["", "a", "xé", "b.c", "日"]))
            continue
        if c == "?":
            out.append(rng.choice(["a", "a", "1", ".", "é"]))
        elif c == "[":
            close = class_end(segment, i)
            inside = segment[i + 1 : close] if close != -1 else ""
            near_miss = rng.choice(["a", "1", "é", "]"])
            out.append(class_member(inside, rng) if rng.random() < 0.75 else near_miss)
            i = close + 1 if close != -1 else len(segment)
            continue
        elif c not in " \r":
            out.append(c)
        elif rng.random() < 0.5:
            out.append(c)
        i += 1
    name = "".join(out)
    return "n" if _bad_name(name) else name


@dataclass
class Tree:
    files: set[str]
    dirs: set[str]
    links: set[str]

    def paths(self) -> list[tuple[str, bool]]:
        every = [(p, False) for p in self.files | self.links] + [(d, True) for d in self.dirs]
        return sorted(every)


def build_tree(lines: list[str], seed: int) -> Tree:
    rng = random.Random(seed)
    kinds: dict[str, str] = {}

    def add(parts: list[str], leaf: str) -> None:
        for depth in range(1, len(parts)):
            prefix = "/".join(parts[:depth])
            if kinds.setdefault(prefix, "d") != "d":
                return
        path = "/".join(parts)
        if path in kinds:
            return
        kinds[path] = leaf
        if leaf == "d":
            kinds.setdefault(path + "/f", "f")

    for line in lines:
        # Trailing spaces and `\r` stay: witness_name keeps or drops each one.
        body = line.removeprefix("!").strip("/")
        segments = [s for s in body.split("/") if s]
        for _ in range(4):
            parts: list[str] = []
            for segment in segments:
                if segment == "**":
                    parts.extend(rng.choice(NAME_POOL) for _ in range(rng.randint(0, 2)))
                else:
                    parts.append(witness_name(segment, rng))
            if rng.random() < 0.25:
                parts.insert(0, rng.choice(["a", "x", "é"]))
            if rng.random() < 0.3:
                parts.append(rng.choice(NAME_POOL))
            if parts:
                add(parts, rng.choice(["f", "f", "d", "l"]))
    for _ in range(12):
        parts = [rng.choice(NAME_POOL) for _ in range(rng.randint(1, 3))]
        add(parts, rng.choice(["f", "f", "d"]))
    return Tree(
        files={p for p, k in kinds.items() if k == "f"},
        dirs={p for p, k in kinds.items() if k == "d"},
        links={p for p, k in kinds.items() if k == "l"},
    )


def materialise(root: Path, tree: Tree, lines: list[str]) -> None:
    for d in sorted(tree.dirs):
        (root / d).mkdir(parents=True, exist_ok=True)
    for f in sorted(tree.files):
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        (root / f).write_bytes(b"x")
    for link in sorted(tree.links):
        (root / link).parent.mkdir(parents=True, exist_ok=True)
        # A link to its own directory: inside the workspace, never followed.
        os.symlink(".", root / link)
    (root / ".gitignore").write_bytes("".join(line + "\n" for line in lines).encode())
    tree.files.add(".gitignore")


def git(args: list[str], cwd: Path, env: dict[str, str], stdin: bytes = b"") -> list[str]:
    assert GIT is not None
    done = subprocess.run(
        [GIT, *args], cwd=cwd, env=env, input=stdin, capture_output=True, timeout=60, check=False
    )
    # check-ignore exits 1 when nothing is ignored.
    assert done.returncode in (0, 1), done.stderr.decode(errors="replace")
    return [p.decode() for p in done.stdout.split(b"\0") if p]


def case_id(index: int, lines: list[str]) -> str:
    shown = " | ".join(lines).encode("unicode_escape").decode("ascii")
    return f"{index:03d}:{shown[:60]}"


def test_the_differential_test_is_big_enough() -> None:
    assert len(CASES) >= 250
    assert PATTERN_COUNT >= 300


@pytest.mark.parametrize(
    "index", range(len(CASES)), ids=[case_id(i, lines) for i, lines in enumerate(CASES)]
)
def test_scan_agrees_with_git(tmp_path: Path, index: int) -> None:
    lines = CASES[index]
    root = tmp_path / "ws"
    root.mkdir()
    tree = build_tree(lines, seed=index)
    materialise(root, tree, lines)
    home = tmp_path / "home"
    home.mkdir()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        # The repository lives beside the tree, so neither side sees a `.git`.
        "GIT_DIR": str(tmp_path / "repo.git"),
        "GIT_WORK_TREE": str(root),
        "LC_ALL": "C",
    }
    git(["init", "-q"], tmp_path, env)

    visible_to_git = set(git(["ls-files", "-z", "--others", "--exclude-standard"], root, env))
    all_paths = tree.paths()
    # check-ignore reads pathspecs (`:x` would be magic); `./` keeps each a path.
    stdin = b"".join(b"./" + p.encode() + b"\0" for p, _ in all_paths)
    ignored_by_git = {p[2:] for p in git(["check-ignore", "-z", "--stdin"], root, env, stdin)}

    result = _native.scan(str(root), exclude=lines, default_excludes=False)
    entries = decode_entries(result.manifest)
    captured = {e.path for e in entries if not isinstance(e, DirEntry)}
    captured_dirs = {e.path for e in entries if isinstance(e, DirEntry)}
    assert result.unsupported == []

    matcher = _native.PolicyMatcher(lines, [], False)
    excluded = {p for p, is_dir in all_paths if matcher.excluded(p, is_dir)}

    assert captured == visible_to_git, f"lines={lines!r}"
    assert excluded == ignored_by_git, f"lines={lines!r}"
    assert captured_dirs == {d for d in tree.dirs if d not in excluded}, f"lines={lines!r}"
