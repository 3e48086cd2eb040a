"""SweepBlobs over a bucket of 100,000+ blobs, through the daemon and the CLI.

The blobs are written straight into the daemon's local blob directory (the
sweep only lists, condemns and deletes: content does not matter), aged with
utime, so the store is built in seconds. A unary reply could not carry this
many keys under gRPC's 4 MiB limit; the stream must, batch by batch.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from checkpointd.v1 import checkpointd_pb2 as pb

from .conftest import Daemon, DaemonFactory
from .test_cli import cli

ORPHANS = 100_000
YOUNG = 25
TWO_HOURS_S = 2 * 3600


def _write_keys(blob_dir: Path, count: int, *, seed: str, age_s: float) -> list[str]:
    directory = blob_dir / "sandbox-files" / "blake3"
    directory.mkdir(parents=True, exist_ok=True)
    stamp = time.time() - age_s
    keys = []
    for index in range(count):
        hex_digest = f"{seed}{index:063x}"
        path = directory / hex_digest
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.close(fd)
        os.utime(path, (stamp, stamp))
        keys.append(f"sandbox-files/blake3/{hex_digest}")
    return keys


def _blob_dir(daemon: Daemon) -> Path:
    return Path(daemon.blobs.removeprefix("file://"))


@pytest.mark.timeout(600)
async def test_sweep_of_100k_blobs_streams_through_daemon_and_cli(
    daemons: DaemonFactory,
) -> None:
    daemon = daemons.start()
    # 1 MiB and more: a single object the sweep lists (a small one would rest
    # in a pack, which this sweep never lists).
    (daemon.workspace / "kept.txt").write_text("referenced by a checkpoint" * 50_000)
    async with daemon.client(timeout=300) as client:
        await client.capture("t-sweep")
    blob_dir = _blob_dir(daemon)
    orphans = _write_keys(blob_dir, ORPHANS, seed="a", age_s=TWO_HOURS_S)
    young = _write_keys(blob_dir, YOUNG, seed="b", age_s=0)

    # Dry run through the client: many bounded messages, nothing deleted.
    async with daemon.client(timeout=300) as client:
        batches: list[pb.SweepBlobsBatch] = []
        dry = await client.sweep(dry_run=True, on_batch=batches.append)
    assert dry.dry_run and dry.older_than_ms == 3_600_000  # unset → the 1 h default
    assert dry.deleted_count == ORPHANS
    assert sorted(k for b in batches for k in b.deleted) == sorted(orphans)
    assert dry.kept_by_reason["too-young"] == YOUNG
    assert dry.kept_by_reason["referenced"] == 1
    assert dry.listed_count == ORPHANS + YOUNG + 1
    assert len(batches) > 100
    assert max(b.ByteSize() for b in batches) < 1024 * 1024
    assert all((blob_dir / key).exists() for key in orphans[:: ORPHANS // 100])

    # The real sweep through the CLI, default age, key by key on stdout.
    result = cli(daemon, "sweep", "--json", "--keys", timeout=600)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    summary = lines[-1]["summary"]
    assert int(summary["deleted_count"]) == ORPHANS and int(summary["failed_count"]) == 0
    assert sorted(line["deleted"] for line in lines[:-1] if "deleted" in line) == sorted(orphans)
    assert not any((blob_dir / key).exists() for key in orphans)
    assert all((blob_dir / key).exists() for key in young)
    async with daemon.client() as client:
        restored = await client.restore("t-sweep")
    assert restored.restored
    assert "sweep: listed" in daemon.log_text()


@pytest.mark.timeout(600)
async def test_a_sweep_cut_short_has_reported_what_it_deleted(daemons: DaemonFactory) -> None:
    daemon = daemons.start()
    blob_dir = _blob_dir(daemon)
    orphans = _write_keys(blob_dir, ORPHANS, seed="c", age_s=TWO_HOURS_S)
    reported: list[str] = []
    # A deadline far shorter than the sweep: it fails part-way.
    async with daemon.client(timeout=4.0) as client:
        with pytest.raises(Exception) as failure:
            await client.sweep(0, on_batch=lambda b: reported.extend(b.deleted))
    assert "DEADLINE_EXCEEDED" in str(failure.value)
    assert reported, "the stream reports deletes as they happen"
    # Every key the stream called deleted is gone; the rest of the bucket is
    # either gone (batches in flight when the deadline hit) or still there for
    # the next sweep.
    assert not any((blob_dir / key).exists() for key in reported)
    remaining = {key for key in orphans if (blob_dir / key).exists()}
    in_flight = 16 * 256
    assert ORPHANS - len(reported) - in_flight <= len(remaining) <= ORPHANS - len(reported)
    async with daemon.client(timeout=300) as client:
        rest = await client.sweep(0)
    assert rest.deleted_count == len(remaining)
