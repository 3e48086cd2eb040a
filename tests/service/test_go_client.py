"""The Go SDK (clients/go/checkpointd): its ``go test`` suite, which starts its own
real daemons with this Python (the shared cases table and error vocabulary of
clients/shared, the timed connect failures, the ported reference examples, a
module that depends on this one), and the README's crash-and-restore example
built and run against a daemon started here. The module and build caches are
filled by .ci/run, so no network is needed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import Daemon, make_tree, tree_state
from .test_other_language_clients import _wipe

REPO = Path(__file__).resolve().parents[2]
GO_DIR = REPO / "clients" / "go"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHECKPOINTD_")}
    env["CHECKPOINTD_PYTHON"] = sys.executable
    return env


@pytest.fixture(scope="session")
def go() -> str:
    go = shutil.which("go")
    assert go, "go is needed (see .ci/run)"
    return go


@pytest.mark.timeout(900)
def test_go_sdk_suite(go: str) -> None:
    result = subprocess.run(
        [go, "test", "-count=1", "-v", "./checkpointd/"],
        cwd=GO_DIR,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=840,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-20_000:]
    # The suite ran these (a renamed or skipped test would not say PASS).
    for name in (
        "TestLostReplyIsRetriedWithTheSameRequestID",
        "TestSharedCases",
        "TestErrorCodesAreTheSharedVocabulary",
        "TestCategoriesFollowTheStatusAlone",
        "TestDialFailsAtOnceSayingWhy",
        "TestSuccessfulCallsLogNoFailure",
        "TestAnotherModuleDependsOnThisOne",
        "TestRestoreStashesLiveChangesAndUndoBringsThemBack",
        "Example_checkpointAtAnyTime",
    ):
        assert f"--- PASS: {name} " in output, (name, output[-5_000:])
    assert "--- SKIP" not in output, output[-5_000:]


@pytest.mark.timeout(900)
def test_go_readme_example_restores_after_a_crash(go: str, daemon: Daemon, tmp_path: Path) -> None:
    binary = tmp_path / "crash-and-restore"
    subprocess.run(
        [go, "build", "-o", str(binary), "./examples/crash-and-restore"],
        cwd=GO_DIR,
        check=True,
        timeout=840,
    )
    source = (GO_DIR / "examples" / "crash-and-restore" / "main.go").read_text()
    assert source.strip() in (GO_DIR / "README.md").read_text(), "the README shows the example"

    def run() -> str:
        result = subprocess.run(
            [str(binary), daemon.address, "t-go-example"],
            env=_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

    make_tree(daemon.workspace, files=15)
    expected = tree_state(daemon.workspace)
    first = run()
    assert first.startswith("New thread\nSaved "), first
    saved_id = first.split()[3]
    _wipe(daemon.workspace)
    assert run().startswith(f"Restored {saved_id}\n")
    assert tree_state(daemon.workspace) == expected
