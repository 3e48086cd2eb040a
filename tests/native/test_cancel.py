"""A CancelToken stops a scan promptly, in the walk and inside a large file."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from checkpointd import _native


def test_cancelled_token_stops_the_walk(workspace: Path) -> None:
    # The walk checks the token per entry: a cancelled one stops at the first.
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


class Interrupted(Exception):
    pass


def test_a_signal_handler_error_stops_the_scan(workspace: Path) -> None:
    # Ctrl-C works the same way: the scan runs with the GIL released while the
    # calling thread keeps checking Python's signal handlers; an exception from
    # one cancels the scan and propagates.
    with open(workspace / "huge.bin", "wb") as handle:
        handle.truncate(16 << 30)

    def on_signal(signum: int, frame: object) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGUSR1, on_signal)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGUSR1))
    timer.start()
    started = time.monotonic()
    try:
        with pytest.raises(Interrupted):
            _native.scan(str(workspace), threads=2)
    finally:
        timer.cancel()
        signal.signal(signal.SIGUSR1, previous)
    assert time.monotonic() - started < 2.0
