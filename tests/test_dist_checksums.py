"""`make dist`'s last step, packaging/checksums.sh: SHA256SUMS over the wheels, the
binary and the npm tarball, checkable with `sha256sum -c`; a missing artefact
fails the step, naming it and the target that builds it."""

from __future__ import annotations

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "packaging" / "checksums.sh"
ARTEFACTS = (
    "checkpointd-0.1.0-cp311-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
    "checkpointd-0.1.0-cp311-abi3-musllinux_1_2_x86_64.whl",
    "checkpointd",
    "checkpointd-client-0.1.0.tgz",
)


def _run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=60)


def test_sha256sums_cover_every_artefact_and_check(tmp_path: Path) -> None:
    for index, name in enumerate(ARTEFACTS):
        (tmp_path / name).write_bytes(bytes([index]) * (1000 + index))
    (tmp_path / "notes.txt").write_text("not an artefact")
    made = _run("bash", str(SCRIPT), str(tmp_path))
    assert made.returncode == 0, made.stderr
    listed = [line.split("  ", 1)[1] for line in (tmp_path / "SHA256SUMS").read_text().splitlines()]
    assert sorted(listed) == sorted(ARTEFACTS)
    assert _run("sha256sum", "-c", "SHA256SUMS", cwd=tmp_path).returncode == 0
    (tmp_path / "checkpointd").write_bytes(b"tampered")
    assert _run("sha256sum", "-c", "SHA256SUMS", cwd=tmp_path).returncode != 0


def test_a_missing_artefact_fails_naming_it(tmp_path: Path) -> None:
    for name in ARTEFACTS[:2]:
        (tmp_path / name).write_bytes(b"wheel")
    made = _run("bash", str(SCRIPT), str(tmp_path))
    assert made.returncode == 1
    assert "checkpointd (make binary)" in made.stderr and "make npm-pack" in made.stderr
    assert not (tmp_path / "SHA256SUMS").exists()
