"""A fresh journal's walk of the whole tree waits while a full scan taken
before it was over runs: that scan cannot make the journal trusted, and the
two would share the CPU."""

from __future__ import annotations

import time
from pathlib import Path

from checkpointd import _native


def _ready_within(journal: _native.Journal, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if journal.status()["ready"]:
            return True
        time.sleep(0.01)
    return False


def test_the_first_walk_waits_for_a_full_scan_taken_before_it_was_over(
    tmp_path: Path,
) -> None:
    root = tmp_path / "ws"
    for i in range(3000):
        (root / f"d{i // 100}" / f"e{i}").mkdir(parents=True)
    journal = _native.Journal(str(root), "inotify")
    try:
        ticket = journal.take()
        assert ticket.full is not None and "fresh daemon" in ticket.full
        assert not _ready_within(journal, 0.5)
        journal.abort(ticket)  # (the scan is over)
        assert _ready_within(journal, 20)
        # Once the walk is over, a full scan's ticket holds nothing back,
        # and a capture that began after it may make the journal trusted.
        ticket = journal.take()
        assert ticket.full is not None
        journal.commit(ticket)
        assert journal.take().full is None
    finally:
        journal.close()
