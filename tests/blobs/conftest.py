"""The blob-store backends every blob test runs against: memory, a directory, S3."""

from __future__ import annotations

from pathlib import Path

import pytest

from checkpointd.blobs import ObjectBlobStore, open_blobs

BACKENDS = [
    pytest.param("memory", id="memory"),
    pytest.param("file", id="file"),
    pytest.param("s3", id="s3", marks=pytest.mark.s3),
]


@pytest.fixture(params=BACKENDS)
def blobs(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectBlobStore:
    if request.param == "memory":
        return open_blobs("memory://")
    if request.param == "file":
        return open_blobs(f"file://{tmp_path / 'blobs'}")
    return request.getfixturevalue("s3_blobs")
