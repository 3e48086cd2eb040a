"""Shared pytest configuration: service fixtures live in tests/fixtures/."""

import os
from collections.abc import Iterator

import pytest

from checkpointd import chunks

pytest_plugins = ["tests.fixtures.postgres", "tests.fixtures.s3"]

# Tests written before content-defined chunks assert whole-file blob layouts
# (blob counts, one object per large file, the large-file upload paths, which
# still serve files at or below the threshold and chunking turned off): they
# run with chunking off, in this process and in the daemons they start. Tests
# of chunked files ask for the `chunked` fixture (or pass the settings).
os.environ.setdefault("CHECKPOINTD_CHUNK_THRESHOLD", "0")


@pytest.fixture(autouse=True)
def _whole_files() -> Iterator[None]:
    saved = chunks.current()
    chunks.configure(None)
    yield
    chunks.configure(saved)


@pytest.fixture
def chunked(_whole_files: None) -> chunks.ChunkSettings:
    """Chunking on, with the default settings, for this test's captures and restores."""
    settings = chunks.ChunkSettings()
    chunks.configure(settings)
    return settings
