"""Progress reports from long work (capture, restore), for the gRPC stream and the CLI.

Engines call ``report(Progress(...))`` at phase changes and at most every ~100 ms
within a phase; the callback must be cheap and must not raise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# Capture phases: "lease", "scan", "pin", "upload", "append".
# Restore phases: "lease", "resolve", "plan", "fetch", "apply", "record".
# What each counts, and the rule that every counting phase ends with an event
# whose done == total: proto/checkpointd/v1/checkpointd.proto, enum ProgressPhase.


@dataclass(frozen=True, slots=True)
class Progress:
    phase: str
    files_done: int = 0
    files_total: int = 0
    bytes_done: int = 0
    bytes_total: int = 0
    files_hashed: int = 0  # scan only: files read and hashed (the rest: from the stat cache)


ProgressCallback = Callable[[Progress], None]
