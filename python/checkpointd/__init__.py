"""checkpointd: checkpoint an AI agent sandbox's workspace and restore it anywhere.

Public names (docs/contract.md#python-api). Submodules are imported on first use so that
``import checkpointd`` stays cheap for the CLI client.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "capture_checkpoint": "checkpointd.capture",
    "CaptureOptions": "checkpointd.capture",
    "CaptureResult": "checkpointd.capture",
    "CaptureStats": "checkpointd.capture",
    "restore_checkpoint": "checkpointd.restore",
    "RestoreOptions": "checkpointd.restore",
    "sweep_blobs": "checkpointd.sweep",
    "prune": "checkpointd.sweep",
    "SweepReport": "checkpointd.sweep",
    "upload_artifact": "checkpointd.artifacts",
    "open_store": "checkpointd.store",
    "open_instance_store": "checkpointd.store",
    "open_blobs": "checkpointd.blobs",
}

__all__ = [
    "CaptureOptions",
    "CaptureResult",
    "CaptureStats",
    "RestoreOptions",
    "SweepReport",
    "__version__",
    "capture_checkpoint",
    "open_blobs",
    "open_instance_store",
    "open_store",
    "prune",
    "restore_checkpoint",
    "sweep_blobs",
    "upload_artifact",
]

if TYPE_CHECKING:
    from .artifacts import upload_artifact
    from .blobs import open_blobs
    from .capture import CaptureOptions, CaptureResult, CaptureStats, capture_checkpoint
    from .restore import RestoreOptions, restore_checkpoint
    from .store import open_instance_store, open_store
    from .sweep import SweepReport, prune, sweep_blobs


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'checkpointd' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
