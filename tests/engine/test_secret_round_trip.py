"""Secrets round-trip (docs/design.md): capture records where it zeroed which secret;
restore given the secrets writes them back, leaves a live file that still holds
them alone, and without them writes zeros and says which files."""

from __future__ import annotations

import logging
import os
import random
from pathlib import Path
from typing import Any

import pytest

from checkpointd.capture import CaptureOptions, capture_checkpoint
from checkpointd.errors import SandboxCheckpointInvalidArgumentError
from checkpointd.model import FileEntry, SecretSpan
from checkpointd.restore import RestoreOptions, restore_checkpoint

from .conftest import settle_before_record, snapshot_tree, wait_out_racy_window, write_tree

TOKEN = b"tok-3f9a7c1e55"
PASSWORD = b"hunter2-hunter2"


def _files() -> dict[str, bytes | str]:
    big = bytearray(random.Random(5).randbytes(3 << 20))
    # Across the scan's 1 MiB stream pieces and at the very end.
    big[(1 << 20) - 5 : (1 << 20) - 5 + len(TOKEN)] = TOKEN
    big[-len(PASSWORD) :] = PASSWORD
    return {
        "config/app.ini": b"token=" + TOKEN + b"\npassword=" + PASSWORD + b"\ntoken2=" + TOKEN,
        "data/big.bin": bytes(big),
        "plain.txt": b"nothing secret here",
        "copy/app.ini": b"token=" + TOKEN + b"\npassword=" + PASSWORD + b"\ntoken2=" + TOKEN,
    }


def _spans(checkpoint: Any) -> dict[str, tuple[SecretSpan, ...]]:
    return {e.path: e.secrets for e in checkpoint.files if isinstance(e, FileEntry) and e.secrets}


@pytest.fixture
async def captured(store: Any, blobs: Any, tmp_path: Path, data_dir: Path) -> Any:
    workspace = tmp_path / "ws"
    write_tree(workspace, _files())
    result = await capture_checkpoint(
        workspace,
        store,
        blobs,
        "t",
        CaptureOptions(secrets={"TOKEN": TOKEN, "PASSWORD": PASSWORD}, data_dir=data_dir),
    )
    return workspace, result.checkpoint


async def test_capture_records_where_it_zeroed_which_secret(captured: Any, store: Any) -> None:
    _, checkpoint = captured
    spans = _spans(await store.get(checkpoint.id))
    assert spans["config/app.ini"] == (
        SecretSpan(6, len(TOKEN), "TOKEN"),
        SecretSpan(30, len(PASSWORD), "PASSWORD"),
        SecretSpan(53, len(TOKEN), "TOKEN"),
    )
    assert spans["data/big.bin"] == (
        SecretSpan((1 << 20) - 5, len(TOKEN), "TOKEN"),
        SecretSpan((3 << 20) - len(PASSWORD), len(PASSWORD), "PASSWORD"),
    )
    assert "plain.txt" not in spans


async def test_restore_with_secrets_into_a_new_workspace_is_the_original(
    captured: Any, store: Any, blobs: Any, tmp_path: Path, data_dir: Path
) -> None:
    workspace, _ = captured
    fresh = tmp_path / "fresh"
    unfilled: list[str] = []
    await restore_checkpoint(
        fresh,
        store,
        blobs,
        "t",
        RestoreOptions(
            secrets={"PASSWORD": PASSWORD, "TOKEN": TOKEN},
            data_dir=tmp_path / "fresh-data",
            unfilled_secrets=unfilled,
        ),
    )
    assert snapshot_tree(fresh) == snapshot_tree(workspace)
    assert unfilled == []


async def test_restore_without_secrets_writes_zeros_and_says_where(
    captured: Any,
    store: Any,
    blobs: Any,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fresh = tmp_path / "fresh"
    unfilled: list[str] = []
    with caplog.at_level(logging.WARNING, logger="checkpointd.restore"):
        await restore_checkpoint(
            fresh,
            store,
            blobs,
            "t",
            RestoreOptions(data_dir=tmp_path / "d2", unfilled_secrets=unfilled),
        )
    assert unfilled == ["config/app.ini", "copy/app.ini", "data/big.bin"]
    assert "config/app.ini" in caplog.text
    assert TOKEN.decode() not in caplog.text
    ini = (fresh / "config/app.ini").read_bytes()
    assert ini == b"token=" + bytes(len(TOKEN)) + b"\npassword=" + bytes(len(PASSWORD)) + (
        b"\ntoken2=" + bytes(len(TOKEN))
    )

    # Given the secrets later, the same restore fills the zeros in.
    unfilled.clear()
    await restore_checkpoint(
        fresh,
        store,
        blobs,
        "t",
        RestoreOptions(
            secrets={"TOKEN": TOKEN, "PASSWORD": PASSWORD},
            data_dir=tmp_path / "d2",
            unfilled_secrets=unfilled,
        ),
    )
    assert unfilled == []
    assert (fresh / "config/app.ini").read_bytes() == _files()["config/app.ini"]
    assert (fresh / "data/big.bin").read_bytes() == _files()["data/big.bin"]


@pytest.mark.parametrize("with_secrets", [True, False], ids=["with-secrets", "without-secrets"])
async def test_restore_into_the_same_workspace_keeps_the_live_secrets(
    captured: Any, store: Any, blobs: Any, data_dir: Path, with_secrets: bool
) -> None:
    workspace, _ = captured
    (workspace / "plain.txt").write_bytes(b"edited")  # something to restore
    before = {
        path: (os.stat(workspace / path).st_ino, (workspace / path).read_bytes())
        for path in ("config/app.ini", "data/big.bin")
    }
    unfilled: list[str] = []
    await restore_checkpoint(
        workspace,
        store,
        blobs,
        "t",
        RestoreOptions(
            secrets={"TOKEN": TOKEN, "PASSWORD": PASSWORD} if with_secrets else (),
            data_dir=data_dir,
            unfilled_secrets=unfilled,
        ),
    )
    assert (workspace / "plain.txt").read_bytes() == b"nothing secret here"
    for path, (inode, data) in before.items():
        # Left untouched: same inode, the real secret still in it.
        assert os.stat(workspace / path).st_ino == inode, path
        assert (workspace / path).read_bytes() == data
    assert unfilled == []


async def test_secrets_as_a_list_are_recorded_by_index(
    store: Any, blobs: Any, tmp_path: Path, data_dir: Path
) -> None:
    workspace = tmp_path / "ws"
    write_tree(workspace, {"a.txt": b"x" + PASSWORD + b"y" + TOKEN})
    result = await capture_checkpoint(
        workspace, store, blobs, "t", CaptureOptions(secrets=[TOKEN, PASSWORD], data_dir=data_dir)
    )
    assert _spans(result.checkpoint)["a.txt"] == (
        SecretSpan(1, len(PASSWORD), 1),
        SecretSpan(2 + len(PASSWORD), len(TOKEN), 0),
    )
    fresh = tmp_path / "fresh"
    unfilled: list[str] = []
    # Only the first secret given: the other stays zeros, and is reported.
    await restore_checkpoint(
        fresh,
        store,
        blobs,
        "t",
        RestoreOptions(secrets=[TOKEN], data_dir=data_dir, unfilled_secrets=unfilled),
    )
    assert (fresh / "a.txt").read_bytes() == b"x" + bytes(len(PASSWORD)) + b"y" + TOKEN
    assert unfilled == ["a.txt"]


async def test_a_second_capture_keeps_the_spans(
    captured: Any, store: Any, blobs: Any, data_dir: Path
) -> None:
    workspace, first = captured
    again = await capture_checkpoint(
        workspace,
        store,
        blobs,
        "t",
        CaptureOptions(secrets={"TOKEN": TOKEN, "PASSWORD": PASSWORD}, data_dir=data_dir),
    )
    assert _spans(again.checkpoint) == _spans(first)
    # Files holding secrets are hashed again (the stat cache keeps no spans);
    # the others are reused.
    assert again.stats.files_hashed == 3 and again.stats.files_reused == 1


async def test_bad_secret_arguments(store: Any, blobs: Any, tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    with pytest.raises(SandboxCheckpointInvalidArgumentError, match="'SHORT'"):
        await capture_checkpoint(
            workspace, store, blobs, "t", CaptureOptions(secrets={"SHORT": b"abc"})
        )
    with pytest.raises(SandboxCheckpointInvalidArgumentError):
        await restore_checkpoint(workspace, store, blobs, "t", RestoreOptions(secrets={"": TOKEN}))


async def test_filled_files_are_not_taken_from_the_stat_cache(
    captured: Any, store: Any, blobs: Any, tmp_path: Path
) -> None:
    """A restore fills secrets in after it wrote the zeroed blob: the stat cache
    must not vouch for the zeroed hash (a capture without the secrets would
    then record bytes the file does not hold)."""
    import blake3

    fresh, data = tmp_path / "fresh", tmp_path / "fresh-data"
    secrets = {"TOKEN": TOKEN, "PASSWORD": PASSWORD}
    await restore_checkpoint(
        fresh,
        store,
        blobs,
        "t",
        RestoreOptions(secrets=secrets, data_dir=data, progress=settle_before_record),
    )
    wait_out_racy_window()  # else plain.txt, restored just now, is racy and hashed again
    again = await capture_checkpoint(fresh, store, blobs, "t", CaptureOptions(data_dir=data))
    files = {e.path: e for e in again.checkpoint.files if isinstance(e, FileEntry)}
    ini = (fresh / "config/app.ini").read_bytes()
    assert TOKEN in ini
    assert files["config/app.ini"].blob_key.endswith(blake3.blake3(ini).hexdigest())
    assert again.stats.files_reused == 1  # plain.txt only
