"""Where the stat cache lives: a data directory outside the workspace (SPEC §4).

The stat cache lets a capture trust a file's previous hash without reading it.
If code in the sandbox could write it, that code could make a capture store a
stale hash for a changed file; so the data directory must not lie inside the
workspace, and ``resolve_data_dir`` refuses one that does.
"""

from __future__ import annotations

import os
from pathlib import Path

import blake3

from .errors import SandboxCheckpointInvalidArgumentError

DEFAULT_DATA_DIR = "~/.local/state/checkpointd"


def _is_within(path: str, ancestor: str) -> bool:
    return path == ancestor or path.startswith(ancestor.rstrip("/") + "/")


def resolve_data_dir(
    workspace_root: str | os.PathLike[str], data_dir: str | os.PathLike[str] | None
) -> Path:
    """The absolute data directory, created if missing (mode 0700).

    Raises SandboxCheckpointInvalidArgumentError when it is the workspace or lies
    inside it (symlinks resolved on both sides, so a link cannot sneak it in).
    """
    chosen = Path(
        os.path.expanduser(os.fspath(data_dir) if data_dir is not None else DEFAULT_DATA_DIR)
    )
    resolved_data = os.path.realpath(chosen)
    resolved_root = os.path.realpath(workspace_root)
    if _is_within(resolved_data, resolved_root):
        raise SandboxCheckpointInvalidArgumentError(
            f"data_dir {os.fspath(chosen)!r} lies inside the workspace {os.fspath(workspace_root)!r}; "
            "code in the sandbox could forge the stat cache",
            details={"data_dir": os.fspath(chosen)},
        )
    path = Path(resolved_data)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def stat_cache_path(
    data_dir: Path, workspace_root: str | os.PathLike[str], subdir: str = ""
) -> str:
    """The stat-cache file of one scanned tree: one per resolved workspace root and
    (checked, normalised) sub-root. Only the operator's root is resolved: a path
    through the sandbox (the sub-root) is never resolved, since the sandbox can
    swap it for a symlink between two system calls."""
    tree = os.path.realpath(workspace_root)
    if subdir:
        tree = os.path.join(tree, subdir)
    root_id = blake3.blake3(os.fsencode(tree)).hexdigest()[:32]
    directory = data_dir / "statcache"
    directory.mkdir(mode=0o700, exist_ok=True)
    return os.fspath(directory / f"{root_id}.cache")
