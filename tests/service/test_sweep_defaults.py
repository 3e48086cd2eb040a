"""SweepBlobs with every field unset is a sweep at the server's default age (1 h):
an artifact uploaded seconds ago survives it and the next capture that uses it
succeeds; only an explicit 0 means any age."""

from __future__ import annotations

from pathlib import Path

from checkpointd.v1 import checkpointd_pb2 as pb

from .conftest import Daemon


async def test_all_default_sweep_keeps_a_blob_uploaded_seconds_ago(daemon: Daemon) -> None:
    (daemon.workspace / "a.txt").write_text("a")
    async with daemon.client() as client:
        artifact = await client.upload_artifact("report.txt", "text/plain", b"fresh report")
        blob = Path(daemon.blobs.removeprefix("file://")) / artifact.blob_key
        assert blob.exists()
        summaries = [
            event.summary
            async for event in client.stub.SweepBlobs(pb.SweepBlobsRequest())
            if event.HasField("summary")
        ]
        assert len(summaries) == 1
        summary = summaries[0]
        assert not summary.dry_run and summary.older_than_ms == 3_600_000
        assert summary.deleted_count == 0 and summary.kept_by_reason["too-young"] == 1
        assert blob.exists()
        done = await client.capture("t-artifact", artifacts=[artifact])
        assert done.checkpoint.id
        # Explicit 0: any age; the artifact is referenced now, so it stays.
        explicit = await client.sweep(0)
        assert explicit.older_than_ms == 0 and explicit.deleted_count == 0
        # The artifact, a.txt's blob (in a pack) and that pack.
        assert explicit.kept_by_reason["referenced"] == 3
        orphan = await client.upload_artifact("orphan.txt", "text/plain", b"nobody uses me")
        gone = await client.sweep(0)
        assert gone.deleted_count == 1
        assert not (blob.parent / orphan.blob_key.rsplit("/", 1)[1]).exists()
        assert blob.exists()
