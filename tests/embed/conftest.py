"""Fixtures of the image tests: the artefacts `make wheel binary` built, and rootfs access.

The artefacts are not rebuilt here (`make test` builds them first); a missing or
stale one fails the test with the command that rebuilds it, never skips it.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
DIST = REPO / "dist"


def _load_rootfs_module() -> ModuleType:
    # packaging/ holds scripts, not a package (it would shadow PyPI's `packaging`).
    spec = importlib.util.spec_from_file_location(
        "checkpointd_rootfs", REPO / "packaging" / "rootfs.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


rootfs = _load_rootfs_module()


PACKAGE_SOURCES = [REPO / "python" / "checkpointd", REPO / "rust" / "src"]
WHEEL_SOURCES = [*PACKAGE_SOURCES, REPO / "packaging" / "build-wheels.sh"]
BINARY_SOURCES = [*WHEEL_SOURCES, REPO / "packaging"]


def _fresh(artefact: Path, sources: list[Path]) -> Path:
    """The artefact, or a test failure when it is missing or older than its sources."""
    if not artefact.is_file():
        pytest.fail(f"{artefact} is missing: run `make wheel binary`")
    newest = max(
        path.stat().st_mtime
        for source in sources
        for path in ([source] if source.is_file() else source.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".so"
    )
    if artefact.stat().st_mtime < newest:
        pytest.fail(f"{artefact} is older than its sources: run `make wheel binary`")
    return artefact


@pytest.fixture(scope="session")
def wheel() -> Path:
    """The manylinux2014 wheel `make wheel` built."""
    found = sorted(DIST.glob("checkpointd-*-manylinux2014_x86_64*.whl"))
    if len(found) != 1:
        pytest.fail(f"{DIST} holds {len(found)} manylinux2014 wheels: run `make wheel binary`")
    return _fresh(found[0], WHEEL_SOURCES)


@pytest.fixture(scope="session")
def musl_wheel() -> Path:
    found = sorted(DIST.glob("checkpointd-*-musllinux_1_2_x86_64.whl"))
    if len(found) != 1:
        pytest.fail(f"{DIST} holds {len(found)} musllinux_1_2 wheels: run `make wheel`")
    return _fresh(found[0], WHEEL_SOURCES)


@pytest.fixture(scope="session")
def binary() -> Path:
    """The single executable `make binary` built."""
    return _fresh(DIST / "checkpointd", BINARY_SOURCES)


@pytest.fixture(scope="session")
def rootfs_usable() -> None:
    reason = rootfs.can_use()
    if reason is not None:
        pytest.skip(f"no fresh rootfs here: {reason}")
