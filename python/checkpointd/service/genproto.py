"""Regenerate the Python gRPC code from ``proto/``: ``python -m checkpointd.service.genproto``.

Layout (why there is no import fixing): the wire contract lives at
``proto/checkpointd/v1/checkpointd.proto`` and is compiled with ``-I proto``, so its
import path is ``checkpointd/v1/checkpointd.proto``. Output goes to ``python/``, so
the modules land in ``python/checkpointd/v1/`` — the Python package
``checkpointd.v1`` matches the proto package ``checkpointd.v1`` and protoc's
``from checkpointd.v1 import checkpointd_pb2`` is correct as generated. The
generated package is excluded from ruff and mypy in pyproject.toml; the ``.pyi``
stubs give mypy the message types.

``--out DIR`` writes somewhere else (the test that checks the committed code is
current regenerates into a temporary directory and compares).

``--go`` also regenerates the Go client's stubs in ``clients/go/checkpointdv1/``
with ``protoc-gen-go`` and ``protoc-gen-go-grpc`` built from the versions pinned
as tool dependencies in ``clients/go/go.mod`` (needs ``go``). The proto's
``go_package`` names the package; ``module=`` strips the module path so the files
land in the module's directory.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from importlib import resources
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
PROTO_ROOT = REPO_ROOT / "proto"
PYTHON_ROOT = REPO_ROOT / "python"
GENERATED_PACKAGE = ("checkpointd", "v1")
PROTO_FILES = ("checkpointd/v1/checkpointd.proto", "checkpointd/v1/gateway.proto")


def generate(out_root: Path, proto_root: Path = PROTO_ROOT) -> list[Path]:
    """Run protoc (from grpcio-tools) into ``out_root``; returns the files written.

    Raises RuntimeError when protoc fails.
    """
    from grpc_tools import protoc  # imported here: only needed to regenerate

    well_known = str(resources.files("grpc_tools") / "_proto")
    package_dir = out_root.joinpath(*GENERATED_PACKAGE)
    package_dir.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{proto_root}",
        f"-I{well_known}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *PROTO_FILES,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")
    init = package_dir / "__init__.py"
    init.write_text(
        '"""Generated gRPC code for checkpointd.v1 (see checkpointd.service.genproto)."""\n'
    )
    return sorted(p for p in package_dir.iterdir() if p.is_file())


GO_MODULE = "checkpointd.dev/clients/go"
GO_ROOT = REPO_ROOT / "clients" / "go"
# The plugins are tool dependencies of clients/go (go.mod's ``tool`` block), so
# their versions are pinned there and ``go build`` needs no network once
# ``go mod download`` ran.
GO_PLUGINS = {
    "protoc-gen-go": "google.golang.org/protobuf/cmd/protoc-gen-go",
    "protoc-gen-go-grpc": "google.golang.org/grpc/cmd/protoc-gen-go-grpc",
}


def build_go_plugins(bin_dir: Path) -> dict[str, Path]:
    """Build the two protoc plugins into ``bin_dir``. Raises CalledProcessError."""
    built = {}
    for name, package in GO_PLUGINS.items():
        target = bin_dir / name
        subprocess.run(["go", "build", "-o", str(target), package], cwd=GO_ROOT, check=True)
        built[name] = target
    return built


def generate_go(
    out_root: Path = GO_ROOT, proto_root: Path = PROTO_ROOT, bin_dir: Path | None = None
) -> list[Path]:
    """Run protoc with the Go plugins into ``out_root`` (``checkpointdv1/``).

    Raises RuntimeError when protoc fails, CalledProcessError when a plugin does
    not build.
    """
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as scratch:
        plugins = build_go_plugins(bin_dir or Path(scratch))
        args = [
            "grpc_tools.protoc",
            f"-I{proto_root}",
            f"--plugin=protoc-gen-go={plugins['protoc-gen-go']}",
            f"--plugin=protoc-gen-go-grpc={plugins['protoc-gen-go-grpc']}",
            f"--go_out={out_root}",
            f"--go_opt=module={GO_MODULE}",
            f"--go-grpc_out={out_root}",
            f"--go-grpc_opt=module={GO_MODULE}",
            *PROTO_FILES,
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed: {' '.join(args)}")
    return sorted((out_root / "checkpointdv1").glob("*.go"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=PYTHON_ROOT, help="output root")
    parser.add_argument("--go", action="store_true", help="also regenerate the Go client's stubs")
    args = parser.parse_args(argv)
    written = generate(args.out)
    if args.go:
        written += generate_go()
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
