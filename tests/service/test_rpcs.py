"""Every RPC of checkpointd.v1 against a real daemon on a Unix socket (happy paths)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from checkpointd.v1 import checkpointd_pb2 as pb

from .conftest import Daemon, make_tree, tree_state

MiB = 1024 * 1024


def _wipe(root: Path) -> None:
    for child in root.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


async def test_capture_streams_started_progress_done(daemon: Daemon) -> None:
    make_tree(daemon.workspace)
    events: list[pb.CaptureEvent] = []
    async with daemon.client() as client:
        artifact = await client.upload_artifact("report.txt", "text/plain", b"all good\n" * 1000)
        done = await client.capture(
            "thread-a",
            label="first",
            conversation=[json.dumps({"role": "user", "content": "hi"})],
            artifacts=[artifact],
            source_run_id="run-1",
            on_event=events.append,
        )
        kinds = [event.WhichOneof("event") for event in events]
        assert kinds[0] == "started" and kinds[-1] == "done"
        assert set(kinds[1:-1]) == {"progress"}
        phases = [event.progress.phase for event in events[1:-1]]
        assert "scan" in phases and "append" in phases
        assert events[0].started.checkpoint_id == done.checkpoint.id
        summary = done.checkpoint
        assert summary.thread_id == "thread-a"
        assert summary.reason == "named" and summary.label == "first"
        assert summary.source_run_id == "run-1"
        assert not summary.HasField("parent_checkpoint_id")
        state = tree_state(daemon.workspace)
        assert summary.entry_count == len(state)
        assert summary.file_count == sum(1 for kind, _, _ in state.values() if kind == "file")
        assert summary.artifact_count == 1 and summary.conversation_count == 1
        assert done.stats.entries == len(state)
        assert done.stats.files_hashed == summary.file_count
        assert done.stats.duration_ms >= 0 and "scan" in done.stats.phases_ms

        got = await client.get_checkpoint(summary.id, include_conversation=True)
        assert got.checkpoint == summary
        assert [json.loads(m) for m in got.conversation] == [{"role": "user", "content": "hi"}]
        assert got.artifacts[0] == artifact
        assert await client.read_artifact(artifact.blob_key) == b"all good\n" * 1000
        without = await client.get_checkpoint(summary.id)
        assert list(without.conversation) == []

        # A second capture of an unchanged tree reuses every hash and uploads nothing.
        again = await client.capture("thread-a")
        assert again.checkpoint.parent_checkpoint_id == summary.id
        assert again.stats.files_reused == summary.file_count
        assert again.stats.blobs_uploaded == 0
        assert again.checkpoint.reason == "automatic"


async def test_list_head_entries_and_paging(daemon: Daemon) -> None:
    make_tree(daemon.workspace, files=10)
    async with daemon.client() as client:
        ids = []
        for index in range(5):
            (daemon.workspace / "counter").write_text(str(index))
            ids.append((await client.capture("t-list")).checkpoint.id)
        assert await client.get_head("t-list") == ids[-1]
        assert await client.get_head("unknown-thread") is None
        assert [s.id for s in await client.list_checkpoints("t-list", page_size=2)] == ids
        first = await client.stub.ListCheckpoints(
            pb.ListCheckpointsRequest(thread_id="t-list", page_size=2)
        )
        assert [s.id for s in first.checkpoints] == ids[:2] and first.next_page_token
        assert await client.list_checkpoints("unknown-thread") == []

        entries = await client.list_entries(ids[-1])
        state = tree_state(daemon.workspace)
        assert [e.path for e in entries] == sorted(state, key=lambda p: p.encode())
        for entry in entries:
            kind, mode, _ = state[entry.path]
            assert pb.EntryKind.Name(entry.kind) == f"ENTRY_KIND_{kind.upper()}"
            if kind != "symlink":
                assert entry.mode == mode
        link = next(e for e in entries if e.path == "link")
        assert link.target == "dir0"
        below = await client.list_entries(ids[-1], path_prefix="dir0")
        assert below and all(e.path == "dir0" or e.path.startswith("dir0/") for e in below)


async def test_list_entries_streams_large_manifests_in_chunks(daemon: Daemon) -> None:
    for index in range(1500):
        (daemon.workspace / f"f{index:05d}-{'x' * 100}").write_text(str(index))
    async with daemon.client() as client:
        checkpoint = (await client.capture("t-big")).checkpoint
        messages = [
            m
            async for m in client.stub.ListEntries(
                pb.ListEntriesRequest(checkpoint_id=checkpoint.id)
            )
        ]
        assert len(messages) >= 3
        assert all(m.ByteSize() < 1 * MiB for m in messages)
        assert sum(len(m.entries) for m in messages) == 1500


async def test_diff_between_checkpoints_and_against_the_live_workspace(daemon: Daemon) -> None:
    ws = daemon.workspace
    (ws / "keep.txt").write_text("same")
    (ws / "edit.txt").write_text("before")
    (ws / "gone.txt").write_text("bye")
    (ws / "mode.sh").write_text("#!/bin/sh\n")
    (ws / "mode.sh").chmod(0o644)
    async with daemon.client() as client:
        first = (await client.capture("t-diff")).checkpoint.id
        assert await client.diff(first) == []
        (ws / "edit.txt").write_text("after!")
        (ws / "gone.txt").unlink()
        (ws / "new.txt").write_text("hello")
        (ws / "mode.sh").chmod(0o755)
        expected = {
            "edit.txt": pb.CHANGE_KIND_MODIFIED,
            "gone.txt": pb.CHANGE_KIND_DELETED,
            "new.txt": pb.CHANGE_KIND_ADDED,
            "mode.sh": pb.CHANGE_KIND_MODE_CHANGED,
        }
        live = await client.diff(first)
        assert {c.path: c.kind for c in live} == expected
        assert [c.path for c in live] == sorted(expected)
        by_path = {c.path: c for c in live}
        assert not by_path["new.txt"].HasField("old") and by_path["new.txt"].new.size == 5
        assert not by_path["gone.txt"].HasField("new")
        assert by_path["mode.sh"].old.mode == 0o644 and by_path["mode.sh"].new.mode == 0o755
        second = (await client.capture("t-diff")).checkpoint.id
        assert {c.path: c.kind for c in await client.diff(first, second)} == expected
        assert await client.diff(second) == []


async def test_read_file_streams_in_bounded_chunks(daemon: Daemon) -> None:
    data = os.urandom(3 * MiB + 123)
    (daemon.workspace / "big.bin").write_bytes(data)
    (daemon.workspace / "empty.txt").write_bytes(b"")
    async with daemon.client() as client:
        checkpoint = (await client.capture("t-read")).checkpoint.id
        assert await client.read_file(checkpoint, "big.bin") == data
        for requested, expected in ((0, 256 * 1024), (1, 64 * 1024), (8 * MiB, MiB)):
            request = pb.ReadFileRequest(
                checkpoint_id=checkpoint, path="big.bin", chunk_size=requested
            )
            messages = [m async for m in client.stub.ReadFile(request)]
            assert max(len(m.data) for m in messages) == expected
            assert messages[0].entry.path == "big.bin" and messages[0].entry.size == len(data)
            assert b"".join(m.data for m in messages) == data
        assert await client.read_file(checkpoint, "empty.txt") == b""


async def test_restore_brings_the_tree_back(daemon: Daemon) -> None:
    make_tree(daemon.workspace)
    async with daemon.client() as client:
        first = (await client.capture("t-restore")).checkpoint
        original = tree_state(daemon.workspace)
        (daemon.workspace / "later.txt").write_text("later")
        await client.capture("t-restore")
        _wipe(daemon.workspace)
        events: list[pb.RestoreEvent] = []
        done = await client.restore("t-restore", checkpoint_id=first.id, on_event=events.append)
        assert done.restored and done.checkpoint.id == first.id
        assert events[0].WhichOneof("event") == "started"
        assert any(e.WhichOneof("event") == "progress" for e in events)
        assert tree_state(daemon.workspace) == original
        head = await client.restore("t-restore")
        assert "later.txt" in tree_state(daemon.workspace)
        assert head.checkpoint.id == await client.get_head("t-restore")
        nothing = await client.restore("t-never-captured")
        assert not nothing.restored and not nothing.HasField("checkpoint")


async def test_workspace_subdir(daemon: Daemon) -> None:
    (daemon.workspace / "a" / "b").mkdir(parents=True)
    (daemon.workspace / "a" / "b" / "x.txt").write_text("x")
    (daemon.workspace / "outside.txt").write_text("o")
    async with daemon.client() as client:
        done = await client.capture("t-sub", workspace_subdir="a")
        entries = await client.list_entries(done.checkpoint.id)
        assert [e.path for e in entries] == ["b", "b/x.txt"]
        (daemon.workspace / "restored").mkdir()
        await client.restore("t-sub", workspace_subdir="restored")
        assert (daemon.workspace / "restored" / "b" / "x.txt").read_text() == "x"


async def test_fork_delete_head_prune_and_sweep(daemon: Daemon) -> None:
    async with daemon.client() as client:
        ids = []
        for index in range(4):
            # 1 MiB and more: single objects (this version's sweep never deletes
            # a blob resting in a pack; the pack-aware sweep comes with repacking).
            (daemon.workspace / f"f{index}.txt").write_text(f"content {index}" * (1 << 17))
            ids.append((await client.capture("t-main")).checkpoint.id)
        fork = await client.fork("t-main", ids[1], "t-fork")
        assert fork.reason == "fork-root" and fork.thread_id == "t-fork"
        assert not fork.HasField("parent_checkpoint_id")
        assert await client.get_head("t-fork") == fork.id
        assert [e.path for e in await client.list_entries(fork.id)] == ["f0.txt", "f1.txt"]

        assert await client.delete_head("t-main", ids[3]) == ids[2]
        assert await client.delete_head("t-fork", fork.id) is None

        would = await client.prune("t-main", 1, dry_run=True)
        assert would == ids[:2]
        assert [s.id for s in await client.list_checkpoints("t-main")] == ids[:3]
        assert await client.prune("t-main", 1) == ids[:2]
        assert [s.id for s in await client.list_checkpoints("t-main")] == [ids[2]]

        # f3.txt's blob is referenced by no checkpoint any more.
        dry_batches: list[pb.SweepBlobsBatch] = []
        dry = await client.sweep(0, dry_run=True, on_batch=dry_batches.append)
        dry_deleted = [key for batch in dry_batches for key in batch.deleted]
        assert dry.dry_run and dry.deleted_count == len(dry_deleted) == 1
        batches: list[pb.SweepBlobsBatch] = []
        report = await client.sweep(0, on_batch=batches.append)
        assert [key for batch in batches for key in batch.deleted] == dry_deleted
        assert report.deleted_count == 1 and report.failed_count == 0
        assert report.kept_by_reason["referenced"] == report.kept_count > 0
        assert report.listed_count == report.kept_count + 1
        assert any(k.reason == "referenced" for batch in batches for k in batch.kept)
        assert (await client.sweep(0)).deleted_count == 0


async def test_capture_request_id_replays_a_committed_capture(daemon: Daemon) -> None:
    (daemon.workspace / "a.txt").write_text("a")
    async with daemon.client() as client:
        first = await client.capture("t-idem", request_id="req-1")
        (daemon.workspace / "a.txt").write_text("changed")
        retry = await client.capture("t-idem", request_id="req-1")
        assert retry.replayed and not first.replayed
        assert retry.checkpoint.id == first.checkpoint.id
        assert len(await client.list_checkpoints("t-idem")) == 1
        other = await client.capture("t-idem", request_id="req-2")
        assert other.checkpoint.id != first.checkpoint.id


async def test_upload_and_read_artifact_in_chunks(daemon: Daemon) -> None:
    data = os.urandom(2 * MiB + 5)

    async def chunks():
        for start in range(0, len(data), 300_000):
            yield data[start : start + 300_000]

    async with daemon.client() as client:
        artifact = await client.upload_artifact("blob.bin", "application/octet-stream", chunks())
        assert artifact.size == len(data) and artifact.blob_key.startswith(
            "sandbox-artifacts/blake3/"
        )
        assert await client.read_artifact(artifact.blob_key) == data
        messages = [
            m
            async for m in client.stub.ReadArtifact(
                pb.ReadArtifactRequest(blob_key=artifact.blob_key)
            )
        ]
        assert len(messages) > 1


async def test_server_info_health_and_reflection(daemon: Daemon) -> None:
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    async with daemon.client() as client:
        info = await client.server_info()
        assert info.protocol_version == 2 and info.version
        caps = info.capabilities
        assert (caps.store_backend, caps.blob_backend) == ("sqlite", "file")
        assert caps.fork and caps.diff and caps.safe_sweep and caps.capture_request_id
        assert await client.health() == "SERVING"
        assert await client.health("checkpointd.v1.Checkpointd") == "SERVING"

        stub = reflection_pb2_grpc.ServerReflectionStub(client._channel)

        async def requests():
            yield reflection_pb2.ServerReflectionRequest(list_services="")

        services = set()
        async for reply in stub.ServerReflectionInfo(requests()):
            services = {s.name for s in reply.list_services_response.service}
        assert {"checkpointd.v1.Checkpointd", "grpc.health.v1.Health"} <= services


def test_sigterm_drains_and_exits_cleanly(daemon: Daemon) -> None:
    assert daemon.stop() == 0
    assert "draining" in daemon.log_text() and "stopped" in daemon.log_text()
