"""UploadArtifact puts a small artifact in a pack at once (no single object),
ReadArtifact reads it through the index, a capture names it; a large one stays
a single object. A real daemon over gRPC with a SQLite store and a local dir."""

from __future__ import annotations

import os
from pathlib import Path

from .conftest import Daemon


async def test_upload_artifact_packs_a_small_one(daemon: Daemon) -> None:
    bucket = Path(daemon.blobs.removeprefix("file://"))
    report = b"a report worth keeping\n" * 300
    screenshot = os.urandom((1 << 20) + 1)
    (daemon.workspace / "a.txt").write_bytes(b"a")
    async with daemon.client() as client:
        small = await client.upload_artifact("report.txt", "text/plain", report)
        large = await client.upload_artifact("shot.png", "image/png", screenshot)
        singles = sorted(p.name for p in (bucket / "sandbox-artifacts" / "blake3").iterdir())
        assert singles == [large.blob_key.rsplit("/", 1)[1]]
        assert len(list((bucket / "sandbox-packs" / "blake3").iterdir())) == 1
        assert await client.read_artifact(small.blob_key) == report
        assert await client.read_artifact(large.blob_key) == screenshot
        done = await client.capture("t", artifacts=[small, large])
        assert done.checkpoint.artifact_count == 2
        assert await client.read_artifact(small.blob_key) == report
