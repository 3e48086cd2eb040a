"""The TypeScript SDK (clients/typescript, npm package ``@checkpointd/client``).

``npm test`` there builds the package (tsc, from the committed generated code)
and runs its ``node --test`` suites, which start their own real daemons with this
Python. The other tests pack the tarball as a user would, install it offline
into fresh CommonJS and ESM projects (from the npm cache that ``npm ci`` in
.ci/run fills), import it there, type-check a consumer, and run the README's
crash-and-restore example against a daemon started here.
"""

from __future__ import annotations

import base64
import hashlib
import json
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
# What `npm pack` reads: the sources and the committed generated code.
PACKED_SOURCES = ("package.json", "package-lock.json", "tsconfig.json", "tsconfig.cjs.json")
PACKED_DIRS = ("src", "scripts")


@pytest.fixture(scope="session")
def npm() -> str:
    npm = shutil.which("npm")
    assert npm and shutil.which("node"), "node and npm are needed (see .ci/run)"
    if not (TS_DIR / "node_modules" / "typescript").is_dir():
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=TS_DIR, check=True, timeout=600)
    return npm


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHECKPOINTD_")}
    env["CHECKPOINTD_PYTHON"] = sys.executable
    return env


def _without_buf(work: Path) -> Path:
    """A copy of the package whose node_modules lacks buf: packing must not need it."""
    package = work / "package"
    package.mkdir()
    for name in PACKED_SOURCES + ("README.md",):
        shutil.copy(TS_DIR / name, package / name)
    for name in PACKED_DIRS:
        shutil.copytree(TS_DIR / name, package / name)
    modules = package / "node_modules"
    (modules / ".bin").mkdir(parents=True)
    (modules / "@bufbuild").mkdir()
    for entry in (TS_DIR / "node_modules").iterdir():
        if entry.name not in (".bin", "@bufbuild"):
            (modules / entry.name).symlink_to(entry)
    (modules / "@bufbuild" / "protobuf").symlink_to(TS_DIR / "node_modules/@bufbuild/protobuf")
    (modules / ".bin" / "tsc").symlink_to(TS_DIR / "node_modules/typescript/bin/tsc")
    return package


@pytest.fixture(scope="module")
def tarball(npm: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("pack")
    package = _without_buf(work)
    result = subprocess.run(
        [npm, "pack", "--pack-destination", str(work)],
        cwd=package,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (packed,) = work.glob("checkpointd-client-*.tgz")
    return packed


def _install_offline(npm: str, tarball: Path, project: Path, module_type: str) -> None:
    """Installs the tarball into a fresh project with no network: a lockfile
    pins the SDK's runtime dependencies as its own lockfile does, so npm takes
    their tarballs from the cache `npm ci` filled (a bare `npm install --offline`
    would also need the registry's package lists, which `npm ci` never fetches)."""
    sdk_lock = json.loads((TS_DIR / "package-lock.json").read_text())["packages"]
    sdk = sdk_lock[""]
    spec = f"file:{tarball}"
    digest = base64.b64encode(hashlib.sha512(tarball.read_bytes()).digest()).decode()
    runtime = {
        path: entry
        for path, entry in sdk_lock.items()
        if path and not entry.get("dev") and not entry.get("devOptional")
    }
    manifest = {
        "name": "user-project",
        "private": True,
        "dependencies": {"@checkpointd/client": spec},
    }
    if module_type == "module":
        manifest["type"] = "module"
    lock = {
        "name": "user-project",
        "lockfileVersion": 3,
        "requires": True,
        "packages": {
            "": {"name": "user-project", "dependencies": {"@checkpointd/client": spec}},
            "node_modules/@checkpointd/client": {
                "version": sdk["version"],
                "resolved": spec,
                "integrity": f"sha512-{digest}",
                "dependencies": sdk["dependencies"],
            },
            **runtime,
        },
    }
    project.mkdir()
    (project / "package.json").write_text(json.dumps(manifest, indent=2))
    (project / "package-lock.json").write_text(json.dumps(lock, indent=2))
    result = subprocess.run(
        [npm, "ci", "--offline", "--no-audit", "--no-fund"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _typecheck(project: Path) -> None:
    """The published types, as a TypeScript user's project sees them."""
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


@pytest.mark.timeout(600)
def test_typescript_sdk_suite(npm: str) -> None:
    result = subprocess.run(
        [npm, "test"], cwd=TS_DIR, env=_env(), capture_output=True, text=True, timeout=540
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-20_000:]
    assert "# fail 0" in output and "# pass " in output, output[-5_000:]


IMPORTERS = {
    # A default npm project is CommonJS: require() must find the package.
    "commonjs": (
        "index.cjs",
        "const sdk = require('@checkpointd/client');\n"
        "const error = new sdk.SandboxCheckpointWriterConflictError('busy', "
        "{ code: 'SANDBOX_SNAPSHOT_WRITER_CONFLICT' });\n"
        "console.log(JSON.stringify({ connect: typeof sdk.connect, "
        "conflict: error instanceof sdk.CheckpointdConflictError, grpcCode: error.grpcCode }));\n",
    ),
    "module": (
        "index.mjs",
        "import { connect, CheckpointdConflictError, SandboxCheckpointWriterConflictError } "
        "from '@checkpointd/client';\n"
        "const error = new SandboxCheckpointWriterConflictError('busy', "
        "{ code: 'SANDBOX_SNAPSHOT_WRITER_CONFLICT' });\n"
        "console.log(JSON.stringify({ connect: typeof connect, "
        "conflict: error instanceof CheckpointdConflictError, grpcCode: error.grpcCode }));\n",
    ),
}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("module_type", sorted(IMPORTERS))
def test_commonjs_and_esm_projects_import_the_tarball(
    npm: str, tarball: Path, tmp_path: Path, module_type: str
) -> None:
    project = tmp_path / "user-project"
    _install_offline(npm, tarball, project, module_type)
    name, source = IMPORTERS[module_type]
    (project / name).write_text(source)
    result = subprocess.run(["node", name], cwd=project, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"connect": "function", "conflict": True, "grpcCode": 10}
    _typecheck(project)


@pytest.mark.timeout(600)
def test_packed_tarball_installs_and_runs_the_readme_example(
    npm: str, tarball: Path, daemon: Daemon, tmp_path: Path
) -> None:
    project = tmp_path / "user-project"
    _install_offline(npm, tarball, project, "commonjs")
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
