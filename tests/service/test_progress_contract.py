"""The progress contract (proto: enum ProgressPhase): phases as an enum, counts
in scan and apply, and every counting phase's last event reaches its totals."""

from __future__ import annotations

from checkpointd.v1 import checkpointd_pb2 as pb

from .conftest import Daemon


def _last_by_phase(events: list[pb.Progress]) -> dict[str, pb.Progress]:
    last: dict[str, pb.Progress] = {}
    for event in events:
        last[event.phase] = event
    return last


def _check(events: list[pb.Progress], phases: list[str]) -> dict[str, pb.Progress]:
    seen = list(dict.fromkeys(e.phase for e in events))
    assert seen == phases
    for event in events:
        assert event.phase_kind == pb.ProgressPhase.Value(f"PROGRESS_PHASE_{event.phase.upper()}")
        if event.files_total:
            assert event.files_done <= event.files_total
    last = _last_by_phase(events)
    for event in last.values():
        assert event.files_done == event.files_total, event
        assert event.bytes_done == event.bytes_total, event
    return last


async def test_capture_and_restore_progress_reach_their_totals(daemon: Daemon) -> None:
    sub = daemon.workspace / "proj"
    sub.mkdir()
    for index in range(1500):
        (sub / f"f{index:04d}.txt").write_bytes(f"{index}".encode() * (index % 50 + 1))
    async with daemon.client(timeout=120) as client:
        events: list[pb.Progress] = []
        done = await client.capture(
            "t-progress",
            workspace_subdir="proj",
            on_event=lambda e: events.append(e.progress) if e.HasField("progress") else None,
        )
        last = _check(events, ["lease", "scan", "pin", "upload", "append"])
        assert last["scan"].files_done == done.stats.entries == 1500
        assert last["scan"].bytes_done == done.stats.bytes_hashed > 0
        assert last["upload"].files_done == done.stats.blobs_uploaded > 0
        assert last["upload"].bytes_done == done.stats.bytes_uploaded

        for index in range(0, 1500, 3):
            (sub / f"f{index:04d}.txt").unlink()
        restore_events: list[pb.RestoreEvent] = []
        restored = await client.restore(
            "t-progress", workspace_subdir="proj", on_event=restore_events.append
        )
    assert restored.restored
    started = restore_events[0].started
    assert started.checkpoint_id == done.checkpoint.id  # the head, named
    progress = [e.progress for e in restore_events if e.HasField("progress")]
    # The deletions are live changes: saved to the thread's stash before the apply.
    last = _check(progress, ["lease", "resolve", "plan", "fetch", "stash", "apply", "record"])
    assert last["fetch"].files_done > 0 and last["fetch"].bytes_done > 0
    # Apply counts the files put in place and their bytes (not operations):
    # its totals are known from its first event and reached by its last.
    rewritten = range(0, 1500, 3)
    nbytes = sum(len(f"{index}") * (index % 50 + 1) for index in rewritten)
    apply = [e for e in progress if e.phase == "apply"]
    assert (apply[0].files_total, apply[0].bytes_total) == (len(rewritten), nbytes)
    assert (last["apply"].files_done, last["apply"].bytes_done) == (len(rewritten), nbytes)


def test_the_bar_shows_each_phase_in_its_own_unit() -> None:
    from checkpointd.cli_output import progress_view

    def text(phase: str, **counts: int) -> str:
        return progress_view(pb.Progress(phase=phase, **counts), 1000)[2]

    assert text("pin", files_done=3, files_total=9) == "3/9 keys, 3 keys/s"
    upload = text("upload", files_done=1, files_total=2, bytes_done=19, bytes_total=19)
    assert upload.startswith("1/2 blobs, 19 B/19 B")
    assert text("fetch", files_done=4, files_total=4).startswith("4/4 blobs")
    assert text("record", files_done=5, files_total=5).startswith("5/5 entries")
    for nothing in ("lease", "resolve", "plan", "append", "stash"):
        assert text(nothing) == "", "a phase that counts nothing shows no '0 files'"


async def test_summaries_quote_what_each_phase_moved(daemon: Daemon) -> None:
    from checkpointd.cli_commands import capture_text, restore_text
    from checkpointd.cli_output import Output, human_size

    (daemon.workspace / "tiny.txt").write_bytes(b"nineteen bytes long")
    for index in range(40):
        (daemon.workspace / f"f{index}.txt").write_text(f"file {index}\n" * (index + 1))
    async with daemon.client(timeout=120) as client:
        captured = Output(as_json=False)
        done = await client.capture("t-moved", on_event=captured.on_event)
        text = capture_text(done)
        st = done.stats
        assert f"uploaded {st.blobs_uploaded} blobs" in text and "/s" not in text, text
        assert f"recorded {st.entries} entries" in text
        append = captured.phases["append"].last
        assert captured.view(append)[2] == f"{done.stats.entries} entries"

        (daemon.workspace / "tiny.txt").write_bytes(b"changed")
        for index in range(0, 40, 2):
            (daemon.workspace / f"f{index}.txt").unlink()
        restored = Output(as_json=False)
        result = await client.restore("t-moved", on_event=restored.on_event)
    fetched = restored.phases["fetch"].last
    applied = restored.phases["apply"].last
    assert (applied.files_done, applied.bytes_done) == (
        21,
        19 + sum(len(f"file {i}\n") * (i + 1) for i in range(0, 40, 2)),
    )
    text = restore_text(result, restored)
    assert f"fetched {fetched.files_done} blobs" in text, text
    assert f"wrote {applied.files_done} files ({human_size(applied.bytes_done)}" in text, text
    assert "apply" in restored.phases and list(restored.phases)[-1] == "record"
