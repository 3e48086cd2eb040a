"""A CancelToken stops a scan promptly, in the walk and inside a large file."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from checkpointd import _native


def test_cancelled_token_stops_before_work(workspace: Path) -> None:
    (workspace / "f").write_bytes(b"x")
    token = _native.CancelToken()
    assert not token.cancelled
    token.cancel()
    assert token.cancelled
    with pytest.raises(_native.ScanCancelled):
        _native.scan(str(workspace), cancel=token)


def test_cancel_during_a_huge_file_is_prompt(workspace: Path) -> None:
    # A sparse 16 GiB file: reading it costs no disk, hashing it takes seconds.
    with open(workspace / "huge.bin", "wb") as handle:
        handle.truncate(16 << 30)
    token = _native.CancelToken()
    timer = threading.Timer(0.3, token.cancel)
    timer.start()
    started = time.monotonic()
    try:
        with pytest.raises(_native.ScanCancelled):
            _native.scan(str(workspace), cancel=token, threads=2)
    finally:
        timer.cancel()
    assert time.monotonic() - started < 2.0


def test_cancel_during_the_walk_is_prompt(workspace: Path) -> None:
    for i in range(60):
        sub = workspace / f"d{i}"
        sub.mkdir()
        for j in range(40):
            (sub / f"f{j}").write_bytes(b"")
    token = _native.CancelToken()
    token.cancel()
    started = time.monotonic()
    with pytest.raises(_native.ScanCancelled):
        _native.scan(str(workspace), cancel=token, threads=1)
    assert time.monotonic() - started < 1.0
