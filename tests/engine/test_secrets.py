"""Secrets are zeroed before hashing and storing, and never reach any store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from checkpointd import _native
from checkpointd.artifacts import upload_artifact
from checkpointd.capture import CaptureOptions, capture_checkpoint
from checkpointd.codec import encode_checkpoint
from checkpointd.errors import SandboxCheckpointInvalidArgumentError
from checkpointd.restore import RestoreOptions, restore_checkpoint

from .conftest import write_tree


def _every_file(directory: Path, pattern: str = "**/*") -> list[bytes]:
    """Bytes of the stat cache files or the SQLite database (and its WAL)."""
    return [path.read_bytes() for path in directory.glob(pattern) if path.is_file()]


SECRET_A = b"sk-live-0123456789abcdef"
SECRET_B = b"hunter2!"


async def test_secrets_never_appear_in_any_stored_object(
    store: Any, blobs: Any, workspace: Path, tmp_path: Path, data_dir: Path
) -> None:
    big = (b"x" * ((1 << 20) - 5)) + SECRET_A + (b"y" * (3 << 20)) + SECRET_B
    write_tree(
        workspace,
        {
            "config.json": b'{"token": "' + SECRET_A + b'"}',
            "twice.txt": SECRET_B + SECRET_B + b"-" + SECRET_A[:10],
            "big.bin": big,  # a secret spans the first 1 MiB read boundary
            "clean.txt": b"nothing to hide",
        },
    )
    artifact = await upload_artifact(blobs, "report.txt", "text/plain", b"report body")
    result = await capture_checkpoint(
        workspace,
        store,
        blobs,
        "t",
        CaptureOptions(
            secrets=[SECRET_A, SECRET_B],
            conversation=[{"role": "user", "content": "hi"}],
            artifacts=[artifact],
            data_dir=data_dir,
        ),
    )

    stored = []
    for prefix in ("sandbox-files/", "sandbox-artifacts/"):
        for info in await blobs.list(prefix):
            stored.append(await blobs.get(info.key))
    # Small blobs rest in packs, compressed: check each pack's bytes and every
    # blob it holds, decoded (compression must not hide a secret from this test).
    for info in await blobs.list("sandbox-packs/"):
        pack = await blobs.get(info.key)
        stored.append(pack)
        listed = _native.read_pack_trailer(pack, len(pack))
        stored.extend(_native.unpack_many(pack, 0, [row[:5] for row in listed]))
    # 4 file blobs, the artifact's single object and its packed copy (the
    # capture packs a small artifact; a sweep frees the single object later).
    assert len(stored) - len(await blobs.list("sandbox-packs/")) == 6
    for checkpoint in await store.list("t"):
        stored.append(encode_checkpoint(checkpoint))
    stored += _every_file(data_dir) + _every_file(tmp_path, "store.db*")
    for data in stored:
        for secret in (SECRET_A, SECRET_B, SECRET_A[4:], SECRET_B[:6]):
            assert secret not in data
    assert result.stats.blobs_uploaded == 4

    # Restored files hold zeros where the secrets were, same length.
    restored = tmp_path / "restored"
    await restore_checkpoint(restored, store, blobs, "t", RestoreOptions(data_dir=data_dir))
    assert (restored / "config.json").read_bytes() == b'{"token": "' + b"\0" * len(SECRET_A) + b'"}'
    assert (restored / "big.bin").read_bytes() == big.replace(
        SECRET_A, b"\0" * len(SECRET_A)
    ).replace(SECRET_B, b"\0" * len(SECRET_B))


@pytest.mark.parametrize("secret", [b"", b"abc"])
async def test_short_secret_is_an_invalid_argument_and_not_echoed(
    memory_store: Any, memory_blobs: Any, workspace: Path, data_dir: Path, secret: bytes
) -> None:
    with pytest.raises(SandboxCheckpointInvalidArgumentError) as caught:
        await capture_checkpoint(
            workspace,
            memory_store,
            memory_blobs,
            "t",
            CaptureOptions(secrets=[b"long-enough", secret], data_dir=data_dir),
        )
    assert caught.value.code == "SANDBOX_SNAPSHOT_INVALID_ARGUMENT"
    if secret:
        assert secret.decode() not in str(caught.value)
    assert await memory_store.get_head("t") is None
