"""checkpointd.scanner: the one place native errors become checkpointd errors."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import blake3
import pytest

from checkpointd import _native
from checkpointd.errors import SandboxCheckpointInvalidArgumentError
from checkpointd.model import FileEntry, Policy, SecretSpan
from checkpointd.scanner import check_secrets, policy_matcher, scan_workspace

from .reference import age_tree


def test_scan_workspace_outcome(workspace: Path, cache_path: str) -> None:
    (workspace / "a.txt").write_bytes(b"token=SECRET1")
    (workspace / "b.log").write_bytes(b"log")
    age_tree(str(workspace))
    outcome = scan_workspace(workspace, Policy(exclude=("*.log",)), [b"SECRET1"], cache_path)
    assert outcome.entries_count == 1
    (entry,) = outcome.entries
    assert isinstance(entry, FileEntry)
    assert entry.blob_key.endswith(blake3.blake3(b"token=\0\0\0\0\0\0\0").hexdigest())
    assert (outcome.files_hashed, outcome.files_reused, outcome.bytes_hashed) == (1, 0, 13)
    assert outcome.unsupported == []
    again = scan_workspace(
        str(workspace),
        Policy(exclude=("*.log",)),
        (b"SECRET1",),
        cache_path,
        cancel=_native.CancelToken(),
    )
    # The file holds the secret: hashed again (the stat cache keeps no secret
    # positions), and its entry says where the secret was.
    assert (again.files_hashed, again.files_reused) == (1, 0)
    assert again.entries == outcome.entries and entry.secrets == (SecretSpan(6, 7, 0),)


@pytest.mark.parametrize("secrets", [[b"abc"], [b""], ["text"], b"bytes-itself"])
def test_bad_secrets(workspace: Path, secrets: object) -> None:
    with pytest.raises(SandboxCheckpointInvalidArgumentError) as caught:
        scan_workspace(workspace, None, secrets, None)  # type: ignore[arg-type]
    assert "abc" not in str(caught.value)
    with pytest.raises(SandboxCheckpointInvalidArgumentError):
        check_secrets(secrets)  # type: ignore[arg-type]


def test_check_secrets_copies_to_bytes() -> None:
    assert check_secrets([bytearray(b"abcd"), memoryview(b"efgh")]) == (b"abcd", b"efgh")


@pytest.mark.parametrize("make", ["missing", "file", "symlink"])
def test_bad_root_names_the_path(tmp_path: Path, make: str) -> None:
    root = tmp_path / "root"
    if make == "file":
        root.write_bytes(b"")
    elif make == "symlink":
        (tmp_path / "real").mkdir()
        os.symlink("real", root)
    with pytest.raises(SandboxCheckpointInvalidArgumentError) as caught:
        scan_workspace(root, None, (), None)
    assert str(root) in str(caught.value)
    assert caught.value.details["path"] == str(root)
    assert isinstance(caught.value.__cause__, OSError)


def test_bad_pattern(workspace: Path) -> None:
    with pytest.raises(SandboxCheckpointInvalidArgumentError, match="bad policy pattern"):
        scan_workspace(workspace, Policy(exclude=("a\nb",)), (), None)
    with pytest.raises(SandboxCheckpointInvalidArgumentError):
        policy_matcher(Policy(include=("a\0b",)))


def test_lines_git_ignores_are_logged_not_errors(
    workspace: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (workspace / "kept").write_bytes(b"x")
    with caplog.at_level(logging.WARNING, logger="checkpointd.policy"):
        outcome = scan_workspace(workspace, Policy(exclude=("[unclosed-scan",)), (), None)
        policy_matcher(Policy(include=("never//here",)))
    assert [entry.path for entry in outcome.entries] == ["kept"]
    messages = [record.getMessage() for record in caplog.records]
    assert any("exclude pattern '[unclosed-scan'" in m and "never matches" in m for m in messages)
    assert any("include pattern 'never//here'" in m for m in messages)


def test_policy_matcher_defaults() -> None:
    matcher = policy_matcher(None)
    assert not matcher.selects("node_modules/x", False)
    assert matcher.selects("src/x", False)
    assert policy_matcher(Policy(default_excludes=False)).selects("node_modules/x", False)


def test_cancel_passes_through(workspace: Path) -> None:
    token = _native.CancelToken()
    token.cancel()
    with pytest.raises(_native.ScanCancelled):
        scan_workspace(workspace, None, (), None, cancel=token)


@pytest.mark.parametrize("with_cache", [True, False], ids=["cached", "fresh"])
def test_previous_manifest_is_returned_when_nothing_changed(
    workspace: Path, cache_path: str, with_cache: bool
) -> None:
    """A scan given the parent's manifest returns that very object when its own
    bytes are the same (nothing is allocated for a copy), and its own bytes
    whenever one differs, even a change that keeps the length (a mode)."""
    cache = cache_path if with_cache else None
    (workspace / "src").mkdir()
    (workspace / "src" / "util.py").write_bytes(b"print(1)\n")
    (workspace / "src" / "other.py").write_bytes(b"x = 2\n")
    (workspace / "README").write_bytes(b"hello\n")
    age_tree(str(workspace))
    first = _native.scan(str(workspace), cache_path=cache).manifest
    again = _native.scan(str(workspace), cache_path=cache, previous_manifest=first)
    assert again.manifest is first
    assert again.digests == b""  # the caller has the previous manifest's
    assert _native.scan(str(workspace), previous_manifest=b"[]").manifest == first
    (workspace / "src" / "util.py").chmod(0o600)  # 420 -> 384: same length
    age_tree(str(workspace))
    changed = _native.scan(str(workspace), cache_path=cache, previous_manifest=first)
    assert changed.manifest is not first and len(changed.manifest) == len(first)
    assert changed.manifest == _native.scan(str(workspace)).manifest
    assert changed.manifest != first
    assert changed.digests == _native.manifest_digests(changed.manifest)
