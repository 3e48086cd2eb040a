"""Brand-new Debian root filesystems: where the binary is built and the artefacts tested.

Root only. A rootfs is made by ``debootstrap --variant=minbase`` from the Debian mirror
this machine's apt uses, plus packages installed by the rootfs's own apt, and kept as
a tarball in the cache (``/var/cache/checkpointd-test``, or ``$CHECKPOINTD_ROOTFS_CACHE``;
never in the repository), so the next run on the same machine only unpacks it.

Every command runs chrooted inside its own mount namespace (``unshare --mount``) with
``/proc``, a minimal ``/dev`` (null, zero, full, random, urandom, tty, shm) and nothing
else mounted: those mounts are the namespace's, gone when its last process exits, so
no failure leaves a mount behind on the host and deleting the rootfs never reaches
through one into the host's ``/dev``.

    python packaging/rootfs.py build-binary --wheel W --out DIR [--suite bullseye]

builds the single executable inside a rootfs of the oldest Debian the mirror serves
(bullseye: glibc 2.31) with a CPython 3.11 compiled there from Debian's own source
package, so the binary runs on that glibc and every newer one.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

CACHE = Path(os.environ.get("CHECKPOINTD_ROOTFS_CACHE", "/var/cache/checkpointd-test"))
# Bump when the way a cached tarball is made changes: old tarballs are then not reused.
RECIPE = "1"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# Oldest first. bullseye (glibc 2.31) is the floor the binary is built for; bookworm's
# python3 is the oldest Debian python3 that checkpointd (Python >= 3.11) installs on.
SUITES = ("bullseye", "bookworm", "trixie")
PATH_INSIDE = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The CA bundle pip uses here (PIP_CERT), copied in: a minbase rootfs has none.
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
CA_INSIDE = "/etc/checkpointd-host-ca.crt"

# The CPython the binary bundles, and what compiling it in the rootfs needs.
CPYTHON_SOURCE_PACKAGE = "python3.11"
CPYTHON_SOURCE_SUITE = "bookworm"
CPYTHON_PREFIX = "/opt/python3.11"
BUILD_PACKAGES = (
    "build-essential",
    "pkg-config",
    "libssl-dev",
    "libsqlite3-dev",
    "libffi-dev",
    "libexpat1-dev",
    "zlib1g-dev",
    "libbz2-dev",
    "liblzma-dev",
    "uuid-dev",
    "xz-utils",
)

# Runs as `sh -c SCRIPT chroot-run ROOT ARGV...` inside `unshare --mount`.
_MOUNT_AND_CHROOT = r"""
set -e
root=$1; shift
mount -t proc -o nosuid,nodev,noexec proc "$root/proc"
mount -t tmpfs -o mode=755,nosuid dev "$root/dev"
for node in null zero full random urandom tty; do
  touch "$root/dev/$node"
  mount --bind "/dev/$node" "$root/dev/$node"
done
mkdir "$root/dev/shm" "$root/dev/pts"
mount -t tmpfs -o mode=1777,nosuid,nodev shm "$root/dev/shm"
ln -s /proc/self/fd "$root/dev/fd"
ln -s /proc/self/fd/0 "$root/dev/stdin"
ln -s /proc/self/fd/1 "$root/dev/stdout"
ln -s /proc/self/fd/2 "$root/dev/stderr"
exec chroot "$root" "$@"
"""


class RootfsError(Exception):
    """A rootfs could not be made or used; the message says which step and why."""


def can_use() -> str | None:
    """None when rootfs work is possible here, else the reason it is not."""
    if os.geteuid() != 0:
        return "needs root (debootstrap, chroot and mount)"
    for tool in ("debootstrap", "unshare", "chroot", "mount"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (.ci/run installs debootstrap)"
    probe = subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "mount",
            "-t",
            "tmpfs",
            "probe",
            "/mnt",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        return f"cannot mount in a new mount namespace: {probe.stderr.strip()}"
    return None


def debian_mirror() -> str:
    """The Debian archive URL this machine's apt uses (not its security mirror)."""
    override = os.environ.get("CHECKPOINTD_DEBIAN_MIRROR")
    if override:
        return override.rstrip("/")
    files = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in files:
        try:
            text = path.read_text()
        except OSError:
            continue
        for match in re.finditer(r"(?m)^(?:URIs:|deb(?:\s+\[[^]]*\])?)\s+(\S+)", text):
            uri = match.group(1).rstrip("/")
            if uri.endswith("/debian"):
                return uri
    return DEFAULT_MIRROR


def served(suite: str, mirror: str | None = None) -> bool:
    """Whether the mirror serves the suite (its Release file answers)."""
    url = f"{mirror or debian_mirror()}/dists/{suite}/Release"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=30):
            return True
    except OSError:
        return False


def oldest_served(at_least: str = SUITES[0]) -> str:
    """The oldest suite of SUITES, from ``at_least`` on, that the mirror serves."""
    for suite in SUITES[SUITES.index(at_least) :]:
        if served(suite):
            return suite
    raise RootfsError(f"the mirror {debian_mirror()} serves none of {', '.join(SUITES)}")


def _run(argv: Sequence[str], what: str, **kwargs: object) -> None:
    done = subprocess.run(list(argv), capture_output=True, text=True, check=False, **kwargs)  # type: ignore[call-overload]
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip().splitlines()[-25:]
        raise RootfsError(f"{what} failed (exit {done.returncode}):\n" + "\n".join(tail))


@contextlib.contextmanager
def _cache_lock() -> Iterator[None]:
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


class Rootfs:
    """An unpacked root filesystem; commands run in it chrooted, in their own mounts."""

    def __init__(self, root: Path, suite: str) -> None:
        self.root = root
        self.suite = suite

    def argv(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> list[str]:
        """The host command line that runs ``argv`` inside, with a clean environment."""
        variables = {"PATH": PATH_INSIDE, "HOME": "/root", "LANG": "C.UTF-8", **(env or {})}
        return [
            "unshare", "--mount", "--propagation", "private", "--",
            "sh", "-c", _MOUNT_AND_CHROOT, "chroot-run", str(self.root),
            "/usr/bin/env", "-i", *(f"{k}={v}" for k, v in variables.items()), *argv,
        ]  # fmt: skip

    def run(
        self, argv: Sequence[str], env: Mapping[str, str] | None = None, timeout: float = 600
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(argv, env), capture_output=True, text=True, timeout=timeout, check=False
        )

    def check(
        self, argv: Sequence[str], env: Mapping[str, str] | None = None, timeout: float = 600
    ) -> str:
        """Runs ``argv`` inside; returns its stdout, raises RootfsError naming it on failure."""
        done = self.run(argv, env, timeout)
        if done.returncode != 0:
            tail = (done.stdout + done.stderr).strip().splitlines()[-30:]
            raise RootfsError(
                f"in {self.suite} rootfs: {' '.join(argv)} failed (exit {done.returncode}):\n"
                + "\n".join(tail)
            )
        return done.stdout

    def popen(self, argv: Sequence[str], env: Mapping[str, str] | None = None,
              **kwargs: object) -> subprocess.Popen[bytes]:  # fmt: skip
        return subprocess.Popen(self.argv(argv, env), **kwargs)  # type: ignore[call-overload]

    def host_path(self, inside: str) -> Path:
        return self.root / inside.lstrip("/")

    def use_host_dns(self) -> None:
        """Name resolution as on this machine (apt and pip inside reach the registries)."""
        resolv = self.host_path("/etc/resolv.conf")
        resolv.unlink(missing_ok=True)
        shutil.copyfile("/etc/resolv.conf", resolv)

    def add_host_ca(self) -> dict[str, str]:
        """Copies this machine's CA bundle in; returns the env that points pip at it."""
        if not HOST_CA_BUNDLE.is_file():
            return {}
        shutil.copyfile(HOST_CA_BUNDLE, self.host_path(CA_INSIDE))
        return {"PIP_CERT": CA_INSIDE, "SSL_CERT_FILE": CA_INSIDE}


def tarball(suite: str, packages: Sequence[str] = ()) -> Path:
    """The cached tarball of a minbase ``suite`` rootfs with ``packages``; made when missing."""
    key = hashlib.sha256(" ".join([RECIPE, suite, *sorted(packages)]).encode()).hexdigest()[:12]
    path = CACHE / f"debian-{suite}-{key}.tar"
    with _cache_lock():
        if path.is_file():
            return path
        with tempfile.TemporaryDirectory(dir=CACHE, prefix=f"make-{suite}-") as scratch:
            root = Path(scratch) / "root"
            # In its own mount namespace: the /proc and /sys debootstrap mounts go with it.
            _run(
                ["unshare", "--mount", "--propagation", "private", "--",
                 "debootstrap", "--variant=minbase", suite, str(root), debian_mirror()],
                f"debootstrap {suite}",
            )  # fmt: skip
            rootfs = Rootfs(root, suite)
            rootfs.use_host_dns()
            if packages:
                apt_env = {"DEBIAN_FRONTEND": "noninteractive"}
                rootfs.check(["apt-get", "update", "-qq"], apt_env)
                rootfs.check(
                    ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages],
                    apt_env,
                )
                rootfs.check(["apt-get", "clean"])
            partial = path.with_suffix(".partial")
            _run(["tar", "-C", str(root), "-cf", str(partial), "."], f"tar {suite} rootfs")
            partial.rename(path)
    return path


@contextlib.contextmanager
def fresh(suite: str, packages: Sequence[str] = (), parent: Path | None = None) -> Iterator[Rootfs]:
    """A brand-new rootfs unpacked from the cached tarball, deleted afterwards."""
    archive = tarball(suite, packages)
    with tempfile.TemporaryDirectory(dir=parent, prefix=f"rootfs-{suite}-") as scratch:
        root = Path(scratch) / "root"
        root.mkdir()
        _run(["tar", "-C", str(root), "-xf", str(archive)], f"unpack {archive}")
        rootfs = Rootfs(root, suite)
        rootfs.use_host_dns()
        yield rootfs


# ------------------------------------------------------------------- the binary


def _cpython_source(workdir: Path) -> Path:
    """Debian's python3.11 source package (with its patches), unpacked under workdir."""
    apt_dir = workdir / "apt"
    (apt_dir / "lists" / "partial").mkdir(parents=True)
    (apt_dir / "cache" / "archives" / "partial").mkdir(parents=True)
    (apt_dir / "sources.list").write_text(
        f"deb-src {debian_mirror()} {CPYTHON_SOURCE_SUITE} main\n"
    )
    options = [
        f"-oDir::Etc::SourceList={apt_dir / 'sources.list'}",
        "-oDir::Etc::SourceParts=/dev/null",
        f"-oDir::State::Lists={apt_dir / 'lists'}",
        f"-oDir::Cache={apt_dir / 'cache'}",
    ]
    download = workdir / "download"
    download.mkdir()
    _run(["apt-get", *options, "update", "-qq"], "apt-get update (deb-src)")
    _run(
        ["apt-get", *options, "source", "--download-only", "-qq",
         f"{CPYTHON_SOURCE_PACKAGE}/{CPYTHON_SOURCE_SUITE}"],
        f"apt-get source {CPYTHON_SOURCE_PACKAGE}",
        cwd=download,
    )  # fmt: skip
    (dsc,) = download.glob("*.dsc")
    tree = workdir / "cpython"
    _run(["dpkg-source", "--no-check", "-x", str(dsc), str(tree)], f"dpkg-source -x {dsc.name}")
    # Debian builds pyexpat into libpython; its CVE-2026-4224 patch includes an internal
    # header that a shared module may use only as Py_BUILD_CORE_MODULE, as upstream's
    # 3.11 branch declares it. Without this, pyexpat silently fails to build (no pip).
    pyexpat = tree / "Modules" / "pyexpat.c"
    text = pyexpat.read_text()
    if '#include "pycore_' in text and "Py_BUILD_CORE" not in text:
        pyexpat.write_text(
            "#ifndef Py_BUILD_CORE_BUILTIN\n#  define Py_BUILD_CORE_MODULE 1\n#endif\n" + text
        )
    return tree


def cpython_tarball(suite: str) -> Path:
    """The cached tarball of CPYTHON_PREFIX, compiled in a ``suite`` rootfs."""
    key = hashlib.sha256(" ".join([RECIPE, suite, *BUILD_PACKAGES]).encode()).hexdigest()[:12]
    path = CACHE / f"cpython-3.11-{suite}-{key}.tar"
    with _cache_lock():
        if path.is_file():
            return path
    with fresh(suite, BUILD_PACKAGES, parent=CACHE) as rootfs:
        source = _cpython_source(rootfs.root.parent)
        shutil.move(source, rootfs.host_path("/src/cpython"))
        # Shared libpython (PyInstaller bundles it), found through its rpath. Debian's
        # patches refuse ensurepip for a whole installation; venvs still get pip from
        # the wheels bundled in the source.
        rootfs.check(
            ["sh", "-c",
             f"cd /src/cpython && ./configure -q --prefix={CPYTHON_PREFIX} --enable-shared "
             f"--with-system-expat --with-ensurepip=no LDFLAGS=-Wl,-rpath,{CPYTHON_PREFIX}/lib "
             f"&& make -s -j{os.cpu_count() or 2} && make -s install"
             " > /src/build.log 2>&1 || { tail -60 /src/build.log; exit 1; }"],
            timeout=3600,
        )  # fmt: skip
        rootfs.check(
            [
                f"{CPYTHON_PREFIX}/bin/python3.11",
                "-c",
                "import ssl, sqlite3, ctypes, lzma, bz2, zlib, uuid, pyexpat, _decimal, _hashlib",
            ]
        )
        with _cache_lock():
            partial = path.with_suffix(".partial")
            _run(
                ["tar", "-C", str(rootfs.root), "-cf", str(partial), CPYTHON_PREFIX.lstrip("/")],
                "tar cpython",
            )
            partial.rename(path)
    return path


def build_binary(wheel: Path, out: Path, suite: str) -> Path:
    """Builds ``out/checkpointd`` with PyInstaller inside a fresh ``suite`` rootfs."""
    python = cpython_tarball(suite)
    packaging = Path(__file__).resolve().parent
    with fresh(suite, BUILD_PACKAGES) as rootfs:
        _run(["tar", "-C", str(rootfs.root), "-xf", str(python)], "unpack cpython")
        build = rootfs.host_path("/build")
        shutil.copytree(packaging, build / "packaging")
        shutil.copyfile(wheel, build / wheel.name)
        env = rootfs.add_host_ca()
        rootfs.check([f"{CPYTHON_PREFIX}/bin/python3.11", "-m", "venv", "/build/venv"])
        rootfs.check(
            ["/build/venv/bin/pip", "install", "-q", "--disable-pip-version-check",
             "--only-binary=:all:", "pyinstaller>=6.10,<7", "pyelftools>=0.31",
             f"/build/{wheel.name}"],
            env,
        )  # fmt: skip
        rootfs.check(
            ["/build/venv/bin/pyinstaller", "--noconfirm", "--clean", "--log-level", "WARN",
             "--distpath", "/build/dist", "--workpath", "/build/work",
             "/build/packaging/checkpointd.spec"],
            env,
            timeout=1800,
        )  # fmt: skip
        out.mkdir(parents=True, exist_ok=True)
        target = out / "checkpointd"
        shutil.copy2(rootfs.host_path("/build/dist/checkpointd"), target)
    return target


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="rootfs.py", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build-binary", help="build the binary in an old rootfs")
    build.add_argument("--wheel", type=Path, required=True)
    build.add_argument("--out", type=Path, required=True)
    build.add_argument("--suite", help="default: the oldest one the mirror serves")
    commands.add_parser("can-use", help="exit 0 when rootfs work is possible here")
    args = parser.parse_args(argv)
    if args.command == "can-use":
        reason = can_use()
        if reason:
            print(reason)
        return 0 if reason is None else 1
    try:
        suite = args.suite or oldest_served()
        if suite != SUITES[0]:
            print(f"rootfs: {SUITES[0]} is not served by {debian_mirror()}; building on {suite}")
        target = build_binary(args.wheel.resolve(), args.out.resolve(), suite)
    except RootfsError as error:
        print(f"rootfs: {error}", file=sys.stderr)
        return 1
    print(f"rootfs: built {target} in a {suite} rootfs")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
