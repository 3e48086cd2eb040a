#!/usr/bin/env bash
# Writes DIST_DIR/SHA256SUMS over the artefacts `make dist` leaves there: the wheels,
# the single binary and the npm tarball (names relative to DIST_DIR, so
# `cd DIST_DIR && sha256sum -c SHA256SUMS` checks them). Fails naming what is missing.
#
#   packaging/checksums.sh DIST_DIR
set -euo pipefail

dist=${1:?usage: checksums.sh DIST_DIR}
cd "$dist"
shopt -s nullglob
wheels=(checkpointd-*.whl)
tarballs=(checkpointd-client-*.tgz)
missing=()
[ ${#wheels[@]} -gt 0 ] || missing+=("the wheels (make wheel)")
[ -f checkpointd ] || missing+=("the binary checkpointd (make binary)")
[ ${#tarballs[@]} -gt 0 ] || missing+=("the npm tarball checkpointd-client-*.tgz (make npm-pack)")
if [ ${#missing[@]} -gt 0 ]; then
  printf 'checksums: %s holds no %s\n' "$dist" "${missing[@]}" >&2
  exit 1
fi
sha256sum "${wheels[@]}" checkpointd "${tarballs[@]}" > SHA256SUMS.tmp
mv SHA256SUMS.tmp SHA256SUMS
cat SHA256SUMS
