"""The binding's larger calls read their keywords as Python functions do:
an unknown one is refused, a mistyped one named."""

from __future__ import annotations

from pathlib import Path

import pytest

from checkpointd import _native


def test_scan_refuses_an_unknown_keyword_and_names_a_mistyped_one(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'thread'"):
        _native.scan(str(tmp_path), thread=2)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="argument 'threads'"):
        _native.scan(str(tmp_path), threads="two")  # type: ignore[arg-type]
    assert _native.scan(str(tmp_path), threads=1, exclude=None).entries == 0


def test_a_restore_session_refuses_an_unknown_keyword(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="RestoreSession\\(\\) got an unexpected keyword argument"):
        _native.RestoreSession(str(tmp_path), b"[]", dry_run=True)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="argument 'subdir'"):
        _native.RestoreSession(str(tmp_path), b"[]", subdir=3)  # type: ignore[arg-type]


def test_a_journal_refuses_an_unknown_keyword(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="Journal\\(\\) got an unexpected keyword argument 'dir'"):
        _native.Journal(str(tmp_path), "off", dir=3)  # type: ignore[call-arg]
    _native.Journal(str(tmp_path), "off", dirs=3, exclude=["x"]).close()
