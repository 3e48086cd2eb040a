"""A slow, obviously-correct Python model of the native scanner, for comparison.

It knows only what the tests need: default excludes, the reserved top-level
``.checkpointd*`` names, classification, symlink containment and hashing with
secret zeroing.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Sequence

import blake3

DEFAULT_EXCLUDED = (".git", "node_modules")


def zero_reference(data: bytes, secrets: Sequence[bytes]) -> bytes:
    """Every occurrence (overlapping too) of every secret, found on the original bytes."""
    out = bytearray(data)
    for secret in secrets:
        start = data.find(secret)
        while start != -1:
            out[start : start + len(secret)] = bytes(len(secret))
            start = data.find(secret, start + 1)
    return bytes(out)


def _stays_inside(link_rel: str, target: str, root: str) -> bool:
    if target.startswith("/"):
        parts: list[str] = []
        for part in target.split("/"):
            if part in ("", "."):
                continue
            if part == "..":
                if not parts:
                    return False
                parts.pop()
            else:
                parts.append(part)
        root_parts = [p for p in root.split("/") if p]
        return parts[: len(root_parts)] == root_parts
    parts = link_rel.split("/")[:-1]
    for part in target.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                return False
            parts.pop()
        else:
            parts.append(part)
    return True


def reference_scan(
    root: str, secrets: Sequence[bytes] = ()
) -> tuple[list[list[object]], list[tuple[str, str]]]:
    """(manifest rows, unsupported) as the native scanner should produce them."""
    rows: list[list[object]] = []
    unsupported: list[tuple[str, str]] = []
    root = os.path.abspath(root)

    def visit(rel: str) -> None:
        directory = os.path.join(root, rel) if rel else root
        for name in os.listdir(directory):
            path = f"{rel}/{name}" if rel else name
            if name in DEFAULT_EXCLUDED or name.startswith(".env"):
                continue
            if not rel and name.startswith(".checkpointd"):
                continue
            full = os.path.join(directory, name)
            st = os.lstat(full)
            try:
                path.encode("utf-8")
            except UnicodeEncodeError:
                unsupported.append((path, "non-utf8-name"))
                continue
            if "\\" in name:
                unsupported.append((path, "backslash-name"))
                continue
            if stat.S_ISDIR(st.st_mode):
                rows.append(["d", path, st.st_mode & 0o777])
                visit(path)
            elif stat.S_ISREG(st.st_mode):
                with open(full, "rb") as handle:
                    data = zero_reference(handle.read(), secrets)
                digest = blake3.blake3(data).hexdigest()
                rows.append(["f", path, digest, len(data), st.st_mode & 0o777, st.st_mtime_ns])
            elif stat.S_ISLNK(st.st_mode):
                target = os.readlink(full)
                if _stays_inside(path, target, root):
                    rows.append(["l", path, target])
                else:
                    unsupported.append((path, "symlink-escapes"))
            elif stat.S_ISFIFO(st.st_mode):
                unsupported.append((path, "fifo"))
            elif stat.S_ISSOCK(st.st_mode):
                unsupported.append((path, "socket"))
            else:
                unsupported.append((path, "unknown"))

    visit("")
    rows.sort(key=lambda row: str(row[1]).encode("utf-8", "surrogateescape"))
    unsupported.sort(key=lambda item: item[0].encode("utf-8", "surrogateescape"))
    return rows, unsupported


def encode_rows(rows: list[list[object]]) -> bytes:
    """Rows exactly as checkpointd.codec writes them."""
    return json.dumps(rows, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def age_tree(root: str, seconds: int = 3600) -> None:
    """Move every mtime (and so the racy window) well into the past, the
    root's too (the stat cache keeps directory listings under the same rule)."""
    past = os.stat(root).st_mtime_ns - seconds * 1_000_000_000
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            full = os.path.join(directory, name)
            if not os.path.islink(full):
                os.utime(full, ns=(past, past), follow_symlinks=False)
    os.utime(root, ns=(past, past))
    settle(root)


def settle(root: str) -> None:
    """Wait until the ctimes just set are out of the racy window: the stat
    cache trusts nothing whose mtime or ctime is within one timestamp tick of
    the scan's clock (10 ms, or 1 s on a filesystem with whole-second times),
    read as the scan reads it: the mtime of a new file on the same filesystem."""
    newest = os.stat(root).st_ctime_ns  # age_tree's last change
    probe = os.path.join(os.path.dirname(os.path.abspath(root)), ".settle-probe")
    while True:
        with open(probe, "wb"):
            pass
        now = os.stat(probe).st_mtime_ns
        os.unlink(probe)
        tick = 1_000_000_000 if now % 1_000_000_000 == 0 else 10_000_000
        if now - tick > newest:
            return
        time.sleep(0.005 if tick < 1_000_000_000 else 0.1)
