#!/usr/bin/env bash
# Builds OUT_DIR/checkpointd, one executable holding the daemon, the CLI, the Python
# interpreter and every dependency (PyInstaller --onefile; it downloads nothing).
#
#   packaging/build-binary.sh OUT_DIR      (after packaging/build-wheels.sh OUT_DIR)
#
# It bundles the manylinux2014 wheel (not the editable build in .venv) and the
# manylinux wheels of the dependencies, installed in a venv of their own, so no
# module is newer than what the wheels promise; the interpreter, libpython and the
# C libraries of the standard library (libssl, libsqlite3...) come from the machine
# that builds it, so the binary needs a glibc at least as new as theirs: the check
# at the end prints that floor.
set -euo pipefail
cd "$(dirname "$0")/.."

out=${1:?usage: build-binary.sh OUT_DIR}
python=${PYTHON:-python3}
venv=build/binary-venv
wheel=$(ls "$out"/checkpointd-*-manylinux2014_x86_64*.whl)

[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check --only-binary=:all: \
  "pyinstaller>=6.10,<7" "pyelftools>=0.31" "$wheel"
# The same version number on every build: replace the package, keep its dependencies.
"$venv/bin/pip" install -q --disable-pip-version-check --force-reinstall --no-deps "$wheel"

"$venv/bin/pyinstaller" --noconfirm --clean --log-level WARN \
  --distpath "$out" --workpath build/pyinstaller packaging/checkpointd.spec
"$venv/bin/python" packaging/check_artefacts.py binary "$out/checkpointd"
