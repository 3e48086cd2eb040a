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
    # The manifest's fingerprint, as the scan hashed the bytes it wrote.
    assert outcome.fingerprint == blake3.blake3(outcome.manifest).digest()
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


def fingerprint_of(manifest: bytes) -> bytes:
    """BLAKE3 of the bytes, from the reference library (not our code)."""
    return blake3.blake3(manifest).digest()


@pytest.mark.parametrize("with_cache", [True, False], ids=["cached", "fresh"])
def test_previous_manifest_is_named_by_length_and_fingerprint(
    workspace: Path, cache_path: str, with_cache: bool
) -> None:
    """A scan told the parent's manifest length and fingerprint allocates
    nothing when its own bytes have both (``same_as_previous``), and returns
    its own bytes whenever one differs, even a change that keeps the length
    (a mode) or a fingerprint that is not the bytes'."""
    cache = cache_path if with_cache else None
    (workspace / "src").mkdir()
    (workspace / "src" / "util.py").write_bytes(b"print(1)\n")
    (workspace / "src" / "other.py").write_bytes(b"x = 2\n")
    (workspace / "README").write_bytes(b"hello\n")
    age_tree(str(workspace))
    first = _native.scan(str(workspace), cache_path=cache)
    assert not first.same_as_previous
    previous = {
        "previous_length": len(first.manifest),
        "previous_fingerprint": fingerprint_of(first.manifest),
    }
    again = _native.scan(str(workspace), cache_path=cache, **previous)
    assert again.same_as_previous
    assert again.manifest == b"" and again.digests == b""  # the caller has the previous ones
    assert (again.entries, again.file_count, again.file_bytes) == (
        first.entries,
        first.file_count,
        first.file_bytes,
    )
    # The same length under another fingerprint: the scan's own bytes.
    other = _native.scan(
        str(workspace), previous_length=len(first.manifest), previous_fingerprint=bytes(32)
    )
    assert not other.same_as_previous and other.manifest == first.manifest
    (workspace / "src" / "util.py").chmod(0o600)  # 420 -> 384: same length
    age_tree(str(workspace))
    changed = _native.scan(str(workspace), cache_path=cache, **previous)
    assert not changed.same_as_previous
    assert len(changed.manifest) == len(first.manifest)
    assert changed.manifest == _native.scan(str(workspace)).manifest
    assert changed.manifest != first.manifest
    assert changed.digests == _native.manifest_digests(changed.manifest)
    with pytest.raises(ValueError, match="together"):
        _native.scan(str(workspace), previous_length=len(first.manifest))
    with pytest.raises(ValueError, match="32 bytes"):
        _native.scan(str(workspace), previous_length=2, previous_fingerprint=b"short")


def test_a_fingerprint_spans_many_hashed_pieces(workspace: Path) -> None:
    """More rows than one hashed piece (4,096) and empty directories between
    files: the fingerprint the scan compares is BLAKE3 of exactly its bytes."""
    for d in range(3):
        sub = workspace / f"d{d}"
        sub.mkdir()
        (sub / "empty").mkdir()
        for n in range(2_000):
            (sub / f"f{n}").write_bytes(b"%d" % (n % 7))
    age_tree(str(workspace))
    first = _native.scan(str(workspace))
    assert first.entries > 4_096
    again = _native.scan(
        str(workspace),
        previous_length=len(first.manifest),
        previous_fingerprint=fingerprint_of(first.manifest),
    )
    assert again.same_as_previous


def test_wide_and_deep_trees_are_walked_whole(workspace: Path, cache_path: str) -> None:
    """A directory is listed from the fd its parent opened for it, or by its
    path when the walk holds its limit of such fds (256; a directory of 600
    subdirectories may reach it). Every directory and file is found either
    way, with the bytes it holds, 40 levels down too, and a second scan (the
    stat cache's listings) finds the same."""
    wide = workspace / "wide"
    for n in range(600):
        (wide / f"d{n:03}").mkdir(parents=True)
        (wide / f"d{n:03}" / "f").write_bytes(b"%d" % n)
    deep = workspace.joinpath(*(f"level{n}" for n in range(40)))
    deep.mkdir(parents=True)
    (deep / "bottom").write_bytes(b"bottom")
    age_tree(str(workspace))
    outcome = scan_workspace(workspace, Policy(), (), cache_path)
    files = {e.path: e for e in outcome.entries if isinstance(e, FileEntry)}
    assert len(files) == 601
    assert files["wide/d599/f"].blob_key.endswith(blake3.blake3(b"599").hexdigest())
    bottom = "/".join(f"level{n}" for n in range(40)) + "/bottom"
    assert files[bottom].blob_key.endswith(blake3.blake3(b"bottom").hexdigest())
    assert outcome.entries_count == 601 + 600 + 1 + 40
    again = scan_workspace(workspace, Policy(), (), cache_path)
    assert again.entries == outcome.entries
    assert (again.files_hashed, again.files_reused) == (0, 601)
