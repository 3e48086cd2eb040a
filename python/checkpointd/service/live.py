"""The live side of the Diff RPC: a manifest of the workspace as it is now."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from .. import _native
from .._capture_scan import SubRoot
from .._engine import run_in_thread
from ..model import Entry, Policy
from ..scanner import scan_workspace
from ..statcache_paths import stat_cache_path


async def scan_live(
    workspace_root: Path,
    subdir: str,
    policy: Policy | None,
    secrets: Sequence[bytes],
    data_dir: Path,
) -> tuple[Entry, ...]:
    """The live manifest of ``subdir`` ("" for the whole workspace), scanned
    natively off the event loop.

    The sub-root is held by fd exactly as capture holds it (``_capture_scan.SubRoot``:
    opened from the workspace root one component at a time with O_NOFOLLOW), so
    sandbox code that swaps a component for a symlink gets INVALID_PATH or the
    directory we opened, never an outside directory diffed in the workspace's
    name. Shares capture's stat cache (so unchanged files are not read again).
    Entries capture would refuse (fifos, escaping links...) are left out.
    Cancelling the caller stops the scan. Raises what ``scanner.scan_workspace``
    raises (SandboxCheckpointInvalidArgumentError for a bad secret, pattern or
    root) and SandboxSnapshotError(INVALID_PATH) for a sub-root that is not a
    real directory beneath the root.
    """
    workspace = os.path.abspath(workspace_root)  # noqa: ASYNC240 - no I/O
    root = os.path.join(workspace, subdir) if subdir else workspace
    cache = stat_cache_path(data_dir, workspace, subdir)
    token = _native.CancelToken()

    def scan() -> tuple[Entry, ...]:
        subroot = SubRoot.open(workspace, subdir)
        try:
            return scan_workspace(root, policy, secrets, cache, token, root_fd=subroot.fd).entries
        finally:
            subroot.close()

    return await run_in_thread(scan, token.cancel)
