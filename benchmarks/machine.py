"""Machine facts for the report, and the refusal to benchmark a debug build.

A debug build of ``checkpointd._native`` hashes 20-50x slower than a release one,
which would make every ratio meaningless. The extension may say how it was built
(a ``BUILD_PROFILE`` attribute); when it does not, we time BLAKE3 over a 64 MiB
file: a release build does well over 500 MB/s on one core here, a debug one well
under 100 MB/s.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MIN_RELEASE_MB_PER_S = 250.0
PROFILE_ATTRIBUTES = ("BUILD_PROFILE", "build_profile", "__build_profile__")


class DebugBuildError(RuntimeError):
    """The native module looks like a debug build (``maturin develop`` without ``--release``)."""


def machine_facts(scratch: Path) -> dict[str, Any]:
    """nproc, memory, CPU model, kernel, filesystem of the scratch dir, Python."""
    facts: dict[str, Any] = {
        "nproc": os.cpu_count(),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
    }
    try:
        meminfo = Path("/proc/meminfo").read_text().splitlines()
        facts["memory_gib"] = round(int(meminfo[0].split()[1]) / (1 << 20), 1)
        cpu = [
            line for line in Path("/proc/cpuinfo").read_text().splitlines() if "model name" in line
        ]
        facts["cpu"] = cpu[0].split(":", 1)[1].strip() if cpu else platform.processor()
    except (OSError, IndexError, ValueError):
        pass
    fs = subprocess.run(["df", "-T", str(scratch)], capture_output=True, text=True, check=False)
    lines = fs.stdout.strip().splitlines()
    if len(lines) > 1:
        facts["scratch_filesystem"] = lines[-1].split()[1]
    facts["scratch"] = str(scratch)
    return facts


def check_native_build(scratch: Path, *, allow_debug: bool = False) -> dict[str, Any]:
    """How ``checkpointd._native`` was built, as far as we can tell.

    Raises DebugBuildError when it is (or hashes like) a debug build, unless
    ``allow_debug``; returns {"profile": ..., "how": ..., "blake3_mb_per_s": ...}.
    """
    try:
        import checkpointd
        import checkpointd._native as native
    except ImportError as exc:
        return {"profile": "unknown", "how": f"native module not importable: {exc}"}
    facts: dict[str, Any] = {
        "checkpointd": getattr(checkpointd, "__version__", "?"),
        "native_version": getattr(native, "__version__", "?"),
        "native_path": getattr(native, "__file__", "?"),
    }
    for attribute in PROFILE_ATTRIBUTES:
        if hasattr(native, attribute):
            facts.update(profile=str(getattr(native, attribute)), how=f"_native.{attribute}")
            break
    else:
        facts.update(_time_native_hash(native, scratch))
    if facts.get("profile") == "debug" and not allow_debug:
        raise DebugBuildError(
            f"checkpointd._native looks like a debug build ({facts.get('how')}); "
            "rebuild with `make build` (maturin develop --release) or pass --allow-debug"
        )
    return facts


def _time_native_hash(native: Any, scratch: Path) -> dict[str, Any]:
    hash_file = getattr(native, "hash_file", None)
    if hash_file is None:
        return {"profile": "unknown", "how": "no _native.hash_file to time yet"}
    sample = scratch / "native-hash-sample.bin"
    size = 64 << 20
    sample.write_bytes(os.urandom(size))
    try:
        hash_file(str(sample))  # first run pages the file in
        started = time.perf_counter()
        hash_file(str(sample))
        seconds = time.perf_counter() - started
    finally:
        sample.unlink()
    speed = size / 1e6 / seconds
    profile = "release" if speed >= MIN_RELEASE_MB_PER_S else "debug"
    return {"profile": profile, "how": "timed _native.hash_file", "blake3_mb_per_s": round(speed)}
