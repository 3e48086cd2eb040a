"""``checkpointd check`` and the Check RPC through a real daemon: a pack deleted
from the daemon's blob dir is reported blob by blob (exit 6), the next capture
uploads them again, restore works; a damaged count is reported (exit 1) and ``--repair``
fixes it; the reply is a stream of bounded messages."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from checkpointd.v1 import checkpointd_pb2 as pb

from .conftest import Daemon, make_tree, tree_state
from .test_cli import cli, ok_json


def _blob_dir(daemon: Daemon) -> Path:
    return Path(daemon.blobs.removeprefix("file://"))


def _db(daemon: Daemon) -> Path:
    return Path(daemon.store.removeprefix("sqlite://"))


async def test_check_finds_a_lost_blob_and_the_next_capture_brings_it_back(
    daemon: Daemon,
) -> None:
    make_tree(daemon.workspace, files=20)
    expected = tree_state(daemon.workspace)
    first = ok_json(daemon, "capture", "t-check")["checkpoint"]
    assert ok_json(daemon, "check")["summary"]["ok"] is True
    async with daemon.client() as client:
        entries = await client.list_entries(first["id"])
    keys = sorted({e.blob_key for e in entries if e.blob_key})
    # The small files' blobs rest in one pack: losing it loses every one of them.
    [pack] = [p for p in (_blob_dir(daemon) / "sandbox-packs").rglob("*") if p.is_file()]
    pack.unlink()

    found = cli(daemon, "check", "--json")
    assert found.returncode == 6, found.stderr
    report = json.loads(found.stdout)
    assert report["summary"]["missing"] == len(keys) and report["summary"]["ok"] is False
    assert sorted((f["kind"], f["key"]) for f in report["findings"]) == [
        ("missing", key) for key in keys
    ]
    human = cli(daemon, "check")
    assert human.returncode == 6 and keys[0] in human.stdout
    assert f"{len(keys)} missing" in human.stdout

    # The files are unchanged in the workspace: the capture uploads them again
    # (into a new pack; the index then names it).
    second = ok_json(daemon, "capture", "t-check")
    assert int(second["stats"]["blobs_uploaded"]) == len(keys)
    assert [p for p in (_blob_dir(daemon) / "sandbox-packs").rglob("*") if p.is_file()]
    assert ok_json(daemon, "check", "--read-data")["summary"]["ok"] is True
    ok_json(daemon, "restore", "t-check", "--checkpoint", first["id"])
    assert tree_state(daemon.workspace) == expected


async def test_check_reports_and_repairs_a_damaged_count(daemon: Daemon) -> None:
    (daemon.workspace / "a.txt").write_text("a")
    ok_json(daemon, "capture", "t-count")
    with sqlite3.connect(_db(daemon)) as db:
        (raw,) = db.execute("SELECT key FROM blob_references").fetchone()
        db.execute("UPDATE blob_references SET refs = 0 WHERE key = ?", (raw,))
    wrong = cli(daemon, "check", "--json")
    assert wrong.returncode == 1, wrong.stderr
    findings = json.loads(wrong.stdout)["findings"]
    assert [(f["kind"], f["stored"], f["manifests"]) for f in findings] == [
        ("count-mismatch", 0, 1)
    ]
    repaired = ok_json(daemon, "check", "--repair")
    assert repaired["summary"]["repaired"] == 1 and repaired["summary"]["ok"] is True
    with sqlite3.connect(_db(daemon)) as db:
        assert db.execute("SELECT refs FROM blob_references WHERE key = ?", (raw,)).fetchone() == (
            1,
        )
    assert ok_json(daemon, "check")["findings"] == []


async def test_check_rpc_streams_findings_and_a_summary(daemon: Daemon) -> None:
    for n in range(30):
        (daemon.workspace / f"f{n}.txt").write_text(f"file {n}")
    async with daemon.client() as client:
        await client.capture("t-stream")
        for path in _blob_dir(daemon).rglob("*"):
            if path.is_file():
                path.unlink()
        events = [e async for e in client.stub.Check(pb.CheckRequest(read_data=True))]
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds[-1] == "summary" and kinds.count("summary") == 1
    assert kinds.count("finding") == 30 and "progress" in kinds
    assert all(e.finding.kind == "missing" for e in events if e.HasField("finding"))
    summary = events[-1].summary
    assert (summary.missing, summary.blobs_checked, summary.ok) == (30, 30, False)
    assert max(e.ByteSize() for e in events) < 4096
