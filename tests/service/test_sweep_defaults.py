"""SweepBlobs with every field unset is a sweep at the server's default age (1 h):
an artifact uploaded seconds ago survives it and the next capture that uses it
succeeds; only an explicit 0 means any age. ``repack_below_percent`` (unset: 50)
chooses which sparse packs a sweep repacks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from checkpointd.service.client import RpcError
from checkpointd.v1 import checkpointd_pb2 as pb

from .conftest import Daemon, clean_env


async def test_all_default_sweep_keeps_a_blob_uploaded_seconds_ago(daemon: Daemon) -> None:
    (daemon.workspace / "a.txt").write_text("a")
    async with daemon.client() as client:
        artifact = await client.upload_artifact("report.txt", "text/plain", b"fresh report")
        blob = Path(daemon.blobs.removeprefix("file://")) / artifact.blob_key
        # Packed at once (a pack of its own and its row), no single object.
        assert not blob.exists()
        assert await client.read_artifact(artifact.blob_key) == b"fresh report"
        summaries = [
            event.summary
            async for event in client.stub.SweepBlobs(pb.SweepBlobsRequest())
            if event.HasField("summary")
        ]
        assert len(summaries) == 1
        summary = summaries[0]
        assert not summary.dry_run and summary.older_than_ms == 3_600_000
        # The artifact's row and its pack, both young.
        assert summary.deleted_count == 0 and summary.kept_by_reason["too-young"] == 2
        assert await client.read_artifact(artifact.blob_key) == b"fresh report"
        done = await client.capture("t-artifact", artifacts=[artifact])
        assert done.checkpoint.id
        # Explicit 0: any age; the artifact is referenced now, so it stays.
        explicit = await client.sweep(0)
        assert explicit.older_than_ms == 0 and explicit.deleted_count == 0
        # The artifact's row (named by its file form) and its pack, a.txt's
        # row and the capture's pack.
        assert explicit.kept_by_reason["referenced"] == 4
        assert await client.read_artifact(artifact.blob_key) == b"fresh report"
        orphan = await client.upload_artifact("orphan.txt", "text/plain", b"nobody uses me")
        gone = await client.sweep(0)
        assert gone.deleted_count == 2  # the orphan's row and its pack
        with pytest.raises(RpcError):
            await client.read_artifact(orphan.blob_key)
        assert await client.read_artifact(artifact.blob_key) == b"fresh report"


def _sparse_pack_tree(workspace: Path, generation: int, changed: int) -> None:
    """100 files; the first ``changed`` get new contents per generation."""
    for n in range(100):
        version = generation if n < changed else 0
        text = f"file {n} version {version}\n" + "".join(
            f"line {n}.{version}.{i} {(n * 7919 + i * 104729 + version) % 100003}\n"
            for i in range(60)
        )
        (workspace / f"f{n}.txt").write_text(text)


async def test_repack_below_percent_chooses_which_packs_are_repacked(daemon: Daemon) -> None:
    _sparse_pack_tree(daemon.workspace, 0, 0)
    async with daemon.client() as client:
        await client.capture("t-repack")
        _sparse_pack_tree(daemon.workspace, 1, 70)
        await client.capture("t-repack")
        await client.prune("t-repack", 1)
        # The first capture's pack is 30% live now.

        def repacked_packs(kept: list[tuple[str, str]]) -> set[str]:
            return {key for key, reason in kept if reason == "repacked"}

        async def dry(percent: int | None) -> tuple[pb.SweepBlobsSummary, set[str]]:
            kept: list[tuple[str, str]] = []
            summary = await client.sweep(
                0,
                dry_run=True,
                repack_below_percent=percent,
                on_batch=lambda batch: kept.extend((k.key, k.reason) for k in batch.kept),
            )
            return summary, repacked_packs(kept)

        default, by_default = await dry(None)
        assert default.repack_below_percent == 50 and len(by_default) == 1
        low, below_20 = await dry(20)
        assert low.repack_below_percent == 20 and below_20 == set()
        never, at_0 = await dry(0)
        assert never.repack_below_percent == 0 and at_0 == set()
        assert (await dry(100))[1] == by_default  # the second pack is 100% live

        for bad in (101, 1000):
            with pytest.raises(RpcError) as caught:
                await client.sweep(0, dry_run=True, repack_below_percent=bad)
            assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
            assert caught.value.reason == "SANDBOX_SNAPSHOT_INVALID_ARGUMENT"
            assert caught.value.metadata["field"] == "repack_below_percent"

        # A real sweep at 20% leaves the sparse pack; at 40% it is repacked.
        kept: list[tuple[str, str]] = []
        await client.sweep(
            0,
            repack_below_percent=20,
            on_batch=lambda b: kept.extend((k.key, k.reason) for k in b.kept),
        )
        assert repacked_packs(kept) == set()
        kept.clear()
        await client.sweep(
            0,
            repack_below_percent=40,
            on_batch=lambda b: kept.extend((k.key, k.reason) for k in b.kept),
        )
        assert repacked_packs(kept) == by_default
        report = await client.check(read_data=True)
        assert report.ok and report.missing == 0 and report.corrupt == 0

    # The command line: --repack-below PERCENT, its range checked before any call.
    ok = _cli(daemon, "sweep", "--older-than", "0", "--dry-run", "--repack-below", "30%", "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["summary"]["repack_below_percent"] == 30
    for bad in ("101", "-5", "half"):
        refused = _cli(daemon, "sweep", "--repack-below", bad)
        assert refused.returncode == 2 and "--repack-below" in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr


def _cli(daemon: Daemon, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "checkpointd", *args],
        env=clean_env(CHECKPOINTD_ADDRESS=daemon.address),
        capture_output=True,
        text=True,
        timeout=60,
    )
