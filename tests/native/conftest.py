"""Fixtures for the native scanner tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root


@pytest.fixture
def cache_path(tmp_path: Path) -> str:
    return os.fspath(tmp_path / "data" / "statcache.bin")
