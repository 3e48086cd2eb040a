"""The TypeScript SDK (clients/typescript, npm package ``@checkpointd/client``).

``npm test`` there builds the package (ts-proto code generated from the proto by
buf, then tsc) and runs its ``node --test`` suites, which start their own real
daemons with this Python. The second test packs the tarball, installs it into an
empty project as a user would, and runs the README's crash-and-restore example
against a daemon started here. ``node_modules`` comes from ``npm ci`` (.ci/run),
so no network is needed.
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
TS_DIR = REPO / "clients" / "typescript"


@pytest.fixture(scope="session")
def npm() -> str:
    npm = shutil.which("npm")
    assert npm and shutil.which("node"), "node and npm are needed (see .ci/run)"
    if not (TS_DIR / "node_modules" / "ts-proto").is_dir():
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=TS_DIR, check=True, timeout=600)
    return npm


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHECKPOINTD_")}
    env["CHECKPOINTD_PYTHON"] = sys.executable
    return env


@pytest.mark.timeout(600)
def test_typescript_sdk_suite(npm: str) -> None:
    result = subprocess.run(
        [npm, "test"], cwd=TS_DIR, env=_env(), capture_output=True, text=True, timeout=540
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-20_000:]
    assert "# fail 0" in output and "# pass " in output, output[-5_000:]


@pytest.mark.timeout(600)
def test_packed_tarball_installs_and_runs_the_readme_example(
    npm: str, daemon: Daemon, tmp_path: Path
) -> None:
    subprocess.run(
        [npm, "pack", "--pack-destination", str(tmp_path)],
        cwd=TS_DIR,
        env=_env(),
        check=True,
        capture_output=True,
        timeout=300,
    )
    (tarball,) = tmp_path.glob("checkpointd-client-*.tgz")
    project = tmp_path / "user-project"
    project.mkdir()
    (project / "package.json").write_text('{"name": "user-project", "private": true}\n')
    subprocess.run(
        [npm, "install", "--prefer-offline", "--no-audit", "--no-fund", str(tarball)],
        cwd=project,
        check=True,
        capture_output=True,
        timeout=300,
    )
    # The published types, as a TypeScript user's project sees them.
    for name in ("use.ts", "tsconfig.json"):
        shutil.copy(TS_DIR / "test" / "consumer" / name, project / name)
    typecheck = subprocess.run(
        [str(TS_DIR / "node_modules" / ".bin" / "tsc"), "-p", "tsconfig.json"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert typecheck.returncode == 0, typecheck.stdout + typecheck.stderr
    example = project / "crash-and-restore.mjs"
    shutil.copy(TS_DIR / "examples" / "crash-and-restore.mjs", example)
    readme = (TS_DIR / "README.md").read_text()
    assert example.read_text().strip() in readme, "the README shows the example as it is"

    def run() -> str:
        result = subprocess.run(
            ["node", str(example), daemon.address, "t-ts-example"],
            cwd=project,
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
    _wipe(daemon.workspace)  # the crash: a new, empty sandbox
    second = run()
    assert second.startswith(f"Restored {saved_id}\n"), second
    assert tree_state(daemon.workspace) == expected
