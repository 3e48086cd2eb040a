#!/usr/bin/env bash
# Builds OUT_DIR/checkpointd, one executable holding the daemon, the CLI, the Python
# interpreter and every dependency (PyInstaller --onefile; it downloads nothing).
#
#   packaging/build-binary.sh OUT_DIR      (after packaging/build-wheels.sh OUT_DIR)
#
# It bundles the manylinux2014 wheel (not the editable build in .venv) and the
# manylinux wheels of its dependencies. PyInstaller also bundles the interpreter,
# libpython and the C libraries of the standard library (libssl, libsqlite3...) of
# the machine that builds it, so the binary needs a glibc at least as new as that
# machine's. Hence BINARY_BUILD:
#   rootfs  build inside a fresh bullseye rootfs (glibc 2.31) with a CPython compiled
#           there (packaging/rootfs.py; root, debootstrap; cached after the first run)
#   host    build on this machine (its glibc is the floor)
#   auto    (default) rootfs where this machine allows it, else host
# The check at the end prints the floor the binary has.
set -euo pipefail
cd "$(dirname "$0")/.."

out=${1:?usage: build-binary.sh OUT_DIR}
python=${PYTHON:-python3}
venv=build/binary-venv
wheel=$(ls "$out"/checkpointd-*-manylinux2014_x86_64*.whl)
pip=("$venv/bin/pip" install -q --disable-pip-version-check --only-binary=:all:)

[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"${pip[@]}" "pyinstaller>=6.10,<7" "pyelftools>=0.31"

mode=${BINARY_BUILD:-auto}
if [ "$mode" = auto ]; then
  if reason=$("$venv/bin/python" packaging/rootfs.py can-use); then
    mode=rootfs
  else
    echo "build-binary: building on this machine, not in an old rootfs: $reason" >&2
    mode=host
  fi
fi
case $mode in
  rootfs)
    "$venv/bin/python" packaging/rootfs.py build-binary --wheel "$wheel" --out "$out"
    ;;
  host)
    "${pip[@]}" "$wheel"
    # The same version number on every build: replace the package, keep its dependencies.
    "${pip[@]}" --force-reinstall --no-deps "$wheel"
    "$venv/bin/pyinstaller" --noconfirm --clean --log-level WARN \
      --distpath "$out" --workpath build/pyinstaller packaging/checkpointd.spec
    ;;
  *)
    echo "build-binary: BINARY_BUILD is $mode; use rootfs, host or auto" >&2
    exit 2
    ;;
esac
"$venv/bin/python" packaging/check_artefacts.py binary "$out/checkpointd"
