"""Unsupported entries are all listed (and kept out of the manifest) unless excluded."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from checkpointd import _native
from checkpointd.codec import decode_entries


@pytest.fixture
def odd_tree(workspace: Path) -> Path:
    (workspace / "ok.txt").write_bytes(b"ok")
    (workspace / "sub").mkdir()
    os.mkfifo(workspace / "sub" / "pipe")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(workspace / "sock"))
    sock.close()
    os.symlink("/etc/passwd", workspace / "abs-out")
    os.symlink("../../outside", workspace / "sub" / "rel-out")
    os.symlink("../ok.txt", workspace / "sub" / "rel-in")
    os.symlink(str(workspace / "ok.txt"), workspace / "abs-in")
    os.mkdir(os.path.join(bytes(workspace), b"dir-\xff"))
    open(os.path.join(bytes(workspace), b"dir-\xff", b"inner"), "wb").close()
    open(os.path.join(bytes(workspace), b"file-\xfe"), "wb").close()
    return workspace


def test_every_unsupported_entry_is_listed(odd_tree: Path) -> None:
    result = _native.scan(str(odd_tree))
    assert result.unsupported == [
        ("abs-out", "symlink-escapes"),
        ("dir-\udcff", "non-utf8-name"),
        ("file-\udcfe", "non-utf8-name"),
        ("sock", "socket"),
        ("sub/pipe", "fifo"),
        ("sub/rel-out", "symlink-escapes"),
    ]
    assert [(e.path, type(e).__name__) for e in decode_entries(result.manifest)] == [
        ("abs-in", "SymlinkEntry"),
        ("ok.txt", "FileEntry"),
        ("sub", "DirEntry"),
        ("sub/rel-in", "SymlinkEntry"),
    ]
    # The names come back as os.fsdecode gives them, so callers can find them.
    assert os.fsencode(result.unsupported[1][0]) == b"dir-\xff"


def test_excluded_unsupported_entries_are_not_listed(odd_tree: Path) -> None:
    result = _native.scan(str(odd_tree), exclude=["*-out", "sock", "pipe", "dir-*", "file-*"])
    assert result.unsupported == []


def test_include_list_also_hides_unsupported_files(odd_tree: Path) -> None:
    result = _native.scan(str(odd_tree), include=["*.txt"])
    # Only a non-UTF-8 directory stays listed: directories are never filtered by include.
    assert result.unsupported == [("dir-\udcff", "non-utf8-name")]


def test_root_must_be_a_real_directory(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    os.symlink("dir", tmp_path / "link")
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(NotADirectoryError, match="symlink"):
        _native.scan(str(tmp_path / "link"))
    with pytest.raises(NotADirectoryError):
        _native.scan(str(tmp_path / "file"))
    with pytest.raises(FileNotFoundError):
        _native.scan(str(tmp_path / "missing"))
