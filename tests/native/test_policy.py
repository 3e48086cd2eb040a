"""Every policy rule of docs/contract.md#capture, in one table, through PolicyMatcher and through scan."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from checkpointd import _native
from checkpointd.codec import decode_entries

# (rule, exclude, include, default_excludes, path, is_dir, selected)
CASES = [
    ("no policy keeps files", [], [], True, "a/b.txt", False, True),
    ("default: .git dir", [], [], True, ".git", True, False),
    ("default: .git at any depth", [], [], True, "x/.git/config", False, False),
    ("default: node_modules", [], [], True, "web/node_modules/m/i.js", False, False),
    ("default: .env", [], [], True, ".env", False, False),
    ("default: .env* segment", [], [], True, "app/.env.local/x", False, False),
    ("default excludes can be turned off", [], [], False, "app/.env.local", False, True),
    ("reserved top-level .checkpointd*", [], [], False, ".checkpointd-staging/x", False, False),
    ("reserved only at the top", [], [], False, "a/.checkpointd-x", False, True),
    ("basename pattern at any depth", ["*.log"], [], True, "a/b/c.log", False, False),
    ("! re-includes in the same list", ["*.log", "!keep.log"], [], True, "a/keep.log", False, True),
    ("last match wins", ["!keep.log", "*.log"], [], True, "keep.log", False, False),
    ("leading / anchors", ["/top.txt"], [], True, "top.txt", False, False),
    ("anchored does not match deeper", ["/top.txt"], [], True, "sub/top.txt", False, True),
    ("middle / anchors", ["a/b"], [], True, "x/a/b", False, True),
    ("trailing / matches dirs", ["build/"], [], True, "build", True, False),
    ("excluded dir excludes its content", ["build/"], [], True, "build/out.o", False, False),
    ("trailing / skips files", ["build/"], [], True, "build", False, True),
    (
        "no re-include under an excluded dir",
        ["build/", "!build/keep"],
        [],
        True,
        "build/keep",
        False,
        False,
    ),
    ("** spans zero dirs", ["a/**/z"], [], True, "a/z", False, False),
    ("** spans many dirs", ["a/**/z"], [], True, "a/b/c/z", False, False),
    ("leading **/", ["**/gen"], [], True, "p/q/gen", True, False),
    ("a/** is not a itself", ["a/**"], [], True, "a", True, True),
    ("a/** is what is inside", ["a/**"], [], True, "a/q/r", False, False),
    ("* does not cross /", ["a/*.c"], [], True, "a/b/x.c", False, True),
    ("character class", ["[ab]?.txt"], [], True, "bz.txt", False, False),
    ("POSIX class", ["[[:digit:]]*"], [], True, "7up", False, False),
    ("? is one byte, as in git", ["?"], [], True, "é", False, True),
    ("?? covers a two-byte character", ["??"], [], True, "é", False, False),
    ("escaped trailing space is kept", ["x\\ "], [], True, "x ", False, False),
    ("unescaped trailing space is dropped", ["x "], [], True, "x", False, False),
    ("build// never matches, as in git", ["build//"], [], True, "build", True, True),
    ("include filters files", [], ["*.py"], True, "src/m.txt", False, False),
    ("include keeps matching files", [], ["*.py"], True, "src/m.py", False, True),
    ("include never filters dirs", [], ["*.py"], True, "src", True, True),
    ("include dir/ takes its content", [], ["src/"], True, "src/deep/m.txt", False, True),
    (
        "include ! takes content back",
        [],
        ["src/", "!src/gen/"],
        True,
        "src/gen/m.txt",
        False,
        False,
    ),
    ("exclude wins over include", ["*.py"], ["*.py"], True, "m.py", False, False),
]


@pytest.mark.parametrize(
    ("rule", "exclude", "include", "defaults", "path", "is_dir", "selected"),
    CASES,
    ids=[c[0] for c in CASES],
)
def test_policy_matcher(
    rule: str,
    exclude: list[str],
    include: list[str],
    defaults: bool,
    path: str,
    is_dir: bool,
    selected: bool,
) -> None:
    matcher = _native.PolicyMatcher(exclude, include, defaults)
    assert matcher.selects(path, is_dir) is selected, rule


@pytest.mark.parametrize(
    ("rule", "exclude", "include", "defaults", "path", "is_dir", "selected"),
    CASES,
    ids=[c[0] for c in CASES],
)
def test_scan_applies_the_same_rules(
    workspace: Path,
    rule: str,
    exclude: list[str],
    include: list[str],
    defaults: bool,
    path: str,
    is_dir: bool,
    selected: bool,
) -> None:
    target = workspace / path
    target.parent.mkdir(parents=True, exist_ok=True)
    if is_dir:
        target.mkdir()
        # A file inside, so that an include list does not drop the dir as empty.
        (target / "inside.py").write_bytes(b"")
    else:
        target.write_bytes(b"x")
    manifest = _native.scan(
        str(workspace), exclude=exclude, include=include, default_excludes=defaults
    ).manifest
    paths = {entry.path for entry in decode_entries(manifest)}
    if is_dir and include and selected:
        # With an include list a directory is recorded only if it holds something included.
        selected = _native.PolicyMatcher(exclude, include, defaults).selects(
            path + "/inside.py", False
        )
    assert (path in paths) is selected, rule


def test_excluded_is_true_for_ancestors() -> None:
    matcher = _native.PolicyMatcher(["build/"], [], True)
    assert matcher.excluded("build/a/b", False)
    assert not matcher.excluded("src/a", False)
    assert _native.PolicyMatcher([], ["*.py"], True).excluded("a.txt", False) is False


def test_include_records_only_dirs_that_hold_included_entries(workspace: Path) -> None:
    for rel in ["src/pkg/m.py", "src/pkg/data.txt", "docs/guide.md", "tests/unit/t.py"]:
        (workspace / rel).parent.mkdir(parents=True, exist_ok=True)
        (workspace / rel).write_bytes(b"x")
    (workspace / "assets").mkdir()
    (workspace / "empty.py").mkdir()  # a dir matching the include pattern itself
    manifest = _native.scan(str(workspace), include=["*.py"]).manifest
    paths = [entry.path for entry in decode_entries(manifest)]
    assert paths == [
        "empty.py",
        "src",
        "src/pkg",
        "src/pkg/m.py",
        "tests",
        "tests/unit",
        "tests/unit/t.py",
    ]


def test_excluded_dirs_are_not_entered(workspace: Path) -> None:
    locked = workspace / "locked"
    locked.mkdir()
    (locked / "secret").write_bytes(b"x")
    os.mkfifo(locked / "pipe")
    # Not even listed: an unsupported entry inside is not reported either.
    result = _native.scan(str(workspace), exclude=["/locked/"])
    assert result.unsupported == []
    assert decode_entries(result.manifest) == ()


# Lines git accepts without a word but that can never match: kept (matching
# nothing, as in git) and reported, instead of failing the capture.
DEAD_LINES = ["[abc", "/", "!", "a\\", "a//b", "build//", "//x", "[[:nope:]]x", "[[:digit:]"]


@pytest.mark.parametrize("line", DEAD_LINES)
def test_lines_git_never_matches_are_warnings(workspace: Path, line: str) -> None:
    matcher = _native.PolicyMatcher([line], [], False)
    assert [(w[0], w[1]) for w in matcher.warnings] == [("exclude", line)]
    assert matcher.warnings[0][2].startswith("it never matches")
    for name in ["abc", "a", "b", "x", "build", "a\\", "[abc", "1x"]:
        assert matcher.selects(name, False)
        assert matcher.selects(name, True)
    (workspace / "build").mkdir()
    (workspace / "build" / "x").write_bytes(b"")
    (workspace / "a").write_bytes(b"")
    result = _native.scan(str(workspace), exclude=[line], default_excludes=False)
    assert [w[1] for w in result.policy_warnings] == [line]
    assert {e.path for e in decode_entries(result.manifest)} == {"a", "build", "build/x"}


def test_a_reversed_range_is_a_warning_but_matches_as_git() -> None:
    # git reads `[z-a]` as the byte `z` plus an empty range.
    matcher = _native.PolicyMatcher([], ["[z-a]"], False)
    assert [w[:2] for w in matcher.warnings] == [("include", "[z-a]")]
    assert "reversed" in matcher.warnings[0][2]
    assert matcher.included("z", False)
    assert not matcher.included("m", False)


@pytest.mark.parametrize("bad", ["a\nb", "x\0"])
def test_entries_that_cannot_be_one_line_are_value_errors(workspace: Path, bad: str) -> None:
    with pytest.raises(ValueError, match="bad policy pattern"):
        _native.PolicyMatcher([bad], [], True)
    with pytest.raises(ValueError, match="bad policy pattern"):
        _native.scan(str(workspace), include=[bad])


def test_deep_chain_finishes(workspace: Path) -> None:
    """git's backtracking needs about d**3 steps here; the matcher must not stall
    (the chain stays within the walk's depth limit, 256)."""
    chain = workspace
    for _ in range(250):
        chain = chain / "a"
        chain.mkdir()
    (chain / "b").write_bytes(b"")
    result = _native.scan(str(workspace), exclude=["**/a*/**/a*/**/b"], default_excludes=False)
    paths = [e.path for e in decode_entries(result.manifest)]
    assert len(paths) == 250
    assert not paths[-1].endswith("/b")


def test_a_single_string_is_not_a_pattern_list(workspace: Path) -> None:
    with pytest.raises(TypeError):
        _native.scan(str(workspace), exclude="*.log")
