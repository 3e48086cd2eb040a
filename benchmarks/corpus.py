"""Benchmark corpora, made deterministically from a seed, and the edits timed on them.

Four shapes (BENCHMARKS.md): a source tree (a copy of this Python's stdlib), many
small files, a few large incompressible files, and an agent-like workspace (a git
repo with ``.git``, ``node_modules``, build outputs and a ``.env``). The first three
come from ``../shared/bench/make_corpus.py`` when that checkout is beside the repo,
so our corpora match the published anchors; without it the generators here make the
same shapes. Corpora are cached under the scratch dir and re-made only when their
spec changes.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import stat
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .machine import DebugBuildError, check_native_build

FIXED_MTIME = 1_704_067_200  # 2024-01-01T00:00:00Z, as make_corpus.py uses
MIB = 1 << 20
# checkpointd's default excludes (docs/contract.md#capture); every peer is given the same ones so
# all tools back up the same files.
DEFAULT_EXCLUDES = (".git", "node_modules", ".env*")
SHARED_MAKE_CORPUS = Path(__file__).resolve().parent.parent.parent / "shared/bench/make_corpus.py"


@dataclass(frozen=True)
class CorpusSpec:
    """One corpus: ``kind`` picks the generator, ``params`` its sizes."""

    name: str
    kind: str  # src-tree | many-small | large-files | agent
    params: dict[str, int] = field(default_factory=dict)
    seed: int = 1

    @property
    def has_excluded_paths(self) -> bool:
        """True when the default excludes remove something (peers get them too)."""
        return self.kind == "agent"


SIZES: dict[str, list[CorpusSpec]] = {
    # The smoke test's size: seconds in total.
    "tiny": [
        CorpusSpec("many-small", "many-small", {"files": 40}),
        CorpusSpec("agent", "agent", {"src": 20, "modules": 24, "build": 6, "big_mib": 2}),
    ],
    # A few minutes on a 2-core machine.
    "quick": [
        CorpusSpec("many-small", "many-small", {"files": 5000}),
        CorpusSpec("large-files", "large-files", {"files": 4, "total_mib": 64}),
        CorpusSpec("agent", "agent", {"src": 1500, "modules": 3000, "build": 150, "big_mib": 32}),
    ],
    # BENCHMARKS.md's sizes: under an hour.
    "full": [
        CorpusSpec("src-tree", "src-tree"),
        CorpusSpec("many-small", "many-small", {"files": 100_000}),
        CorpusSpec("large-files", "large-files", {"files": 20, "total_mib": 2048}),
        CorpusSpec(
            "agent", "agent", {"src": 12_000, "modules": 40_000, "build": 1500, "big_mib": 256}
        ),
    ],
    # Issue 11's scale goals: 1,000,000 small files (~2 GB, generated on demand
    # into the scratch dir, never committed; making it takes a while): no-change
    # capture under 2 s, daemon peak RSS under 300 MB, store bytes per no-change
    # checkpoint under 10 KB.
    "million": [
        CorpusSpec("many-small", "many-small", {"files": 1_000_000}),
    ],
}


# --------------------------------------------------------------------- making


def ensure_corpus(spec: CorpusSpec, dest: Path, *, use_shared: bool = True) -> Path:
    """Make ``spec`` at ``dest`` unless a copy made from the same spec is there.

    Raises subprocess.CalledProcessError when make_corpus.py or git fails.
    """
    stamp = dest.parent / f"{dest.name}.spec.json"
    wanted = json.dumps(asdict(spec), sort_keys=True)
    if dest.is_dir() and stamp.is_file() and stamp.read_text() == wanted:
        return dest
    if dest.exists():
        # Not timed, but keep the habit: never unlink a big tree right before a
        # benchmark creates files (see BENCHMARKS.md); a sibling name is enough.
        dest.rename(dest.with_name(f"{dest.name}.old.{os.getpid()}.{random.getrandbits(32):x}"))
    dest.parent.mkdir(parents=True, exist_ok=True)
    if use_shared and SHARED_MAKE_CORPUS.is_file() and spec.kind != "agent":
        _make_with_shared_script(spec, dest)
    else:
        _GENERATORS[spec.kind](spec, dest)
    stamp.write_text(wanted)
    return dest


def _make_with_shared_script(spec: CorpusSpec, dest: Path) -> None:
    args = [sys.executable, str(SHARED_MAKE_CORPUS), spec.kind, str(dest)]
    p = spec.params
    if spec.kind == "many-small":
        args += ["--files", str(p["files"]), "--seed", str(spec.seed)]
    elif spec.kind == "large-files":
        args += ["--files", str(p["files"]), "--total", f"{p['total_mib']}MiB"]
        args += ["--seed", str(spec.seed)]
    elif "max_files" in p:
        args += ["--max-files", str(p["max_files"])]
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)


class _TextSource:
    """Zipf-weighted pseudo source code, like make_corpus.py's (compresses ~3x)."""

    def __init__(self, rng: random.Random) -> None:
        letters = "abcdefghijklmnopqrstuvwxyz_"
        words = ["".join(rng.choices(letters, k=rng.randint(2, 10))) for _ in range(3000)]
        words += ["(", ")", "=", ":", ",", ".", "    ", "\n", "\n", "def", "return", "if"]
        weights = [1.0 / (i + 1) ** 0.9 for i in range(len(words))]
        rng.shuffle(weights)
        self.words, self.weights, self.rng = words, weights, rng

    def text(self, size: int, header: str = "") -> bytes:
        if size <= len(header):
            return header[:size].encode()
        tokens = self.rng.choices(self.words, weights=self.weights, k=size // 4 + 8)
        return (header + " ".join(tokens))[:size].encode()


def _write(path: Path, data: bytes, mtime: int, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if mode != 0o644:
        path.chmod(mode)
    os.utime(path, (mtime, mtime))


def _random_dirs(rng: random.Random, count: int, prefix: str = "d") -> list[str]:
    """A random recursive tree: each new dir hangs under a random earlier one."""
    dirs = [""]
    for i in range(max(0, count - 1)):
        dirs.append(os.path.join(dirs[rng.randrange(len(dirs))], f"{prefix}{i:05d}"))
    return dirs


def _make_many_small(spec: CorpusSpec, dest: Path) -> None:
    rng = random.Random(spec.seed)
    source = _TextSource(rng)
    files = spec.params["files"]
    dirs = _random_dirs(rng, max(1, files // 20))
    exts = [".py", ".js", ".c", ".h", ".txt", ".md", ".json", ".rs", ".go", ".sh"]
    made = []
    dest.mkdir(parents=True)
    for i in range(files):
        rel = os.path.join(dirs[rng.randrange(len(dirs))], f"f{i:06d}{rng.choice(exts)}")
        mode = 0o755 if rng.random() < 0.05 else 0o644
        _write(
            dest / rel, source.text(rng.randint(0, 4096), f"# file {i}\n"), FIXED_MTIME + i, mode
        )
        made.append(rel)
    for j in range(files // 1000):
        target = dest / made[rng.randrange(len(made))]
        link_dir = dest / dirs[rng.randrange(len(dirs))]
        link_dir.mkdir(parents=True, exist_ok=True)
        (link_dir / f"link{j:04d}").symlink_to(os.path.relpath(target, link_dir))


def _make_large_files(spec: CorpusSpec, dest: Path) -> None:
    rng = random.Random(spec.seed)
    total = spec.params["total_mib"] * MIB
    count = spec.params["files"]
    weights = [rng.lognormvariate(0, 0.8) for _ in range(count)]
    sizes = [int(total * w / sum(weights)) for w in weights]
    sizes[-1] += total - sum(sizes)
    dest.mkdir(parents=True)
    for i, size in enumerate(sizes):
        path = dest / f"blob{i:03d}.bin"
        with path.open("wb") as f:
            for offset in range(0, size, 16 * MIB):
                f.write(rng.randbytes(min(16 * MIB, size - offset)))
        os.utime(path, (FIXED_MTIME + i, FIXED_MTIME + i))


def _make_src_tree(spec: CorpusSpec, dest: Path) -> None:
    source = Path(sysconfig.get_paths()["stdlib"])
    limit = spec.params.get("max_files", 0)
    copied = 0

    def ignore(directory: str, names: list[str]) -> set[str]:
        nonlocal copied
        skipped = {n for n in names if n == "__pycache__" or n.endswith((".pyc", ".pyo"))}
        for name in sorted(set(names) - skipped):
            full = os.path.join(directory, name)
            if os.path.isfile(full) and not os.path.islink(full):
                if limit and copied >= limit:
                    skipped.add(name)
                else:
                    copied += 1
        return skipped

    shutil.copytree(source, dest, symlinks=True, ignore=ignore)


def _make_agent(spec: CorpusSpec, dest: Path) -> None:
    """A workspace an agent leaves behind: a git repo with sources, its ``.git``,
    an installed ``node_modules`` (symlinks in ``.bin``), build outputs with one
    big incompressible binary, and a ``.env`` holding a fake secret."""
    p = spec.params
    rng = random.Random(spec.seed)
    source = _TextSource(rng)
    dest.mkdir(parents=True)
    tick = iter(range(FIXED_MTIME, FIXED_MTIME + 10_000_000))
    src_dirs = _random_dirs(rng, max(1, p["src"] // 15), "pkg")
    exts = [".ts", ".tsx", ".py", ".json", ".md", ".css"]
    for i in range(p["src"]):
        rel = Path("src", src_dirs[rng.randrange(len(src_dirs))], f"m{i:05d}{rng.choice(exts)}")
        _write(dest / rel, source.text(rng.randint(200, 12_000), f"// {i}\n"), next(tick))
    _write(dest / "README.md", source.text(3000, "# agent workspace\n"), next(tick))
    _write(dest / ".gitignore", b"node_modules/\nbuild/\n.env\n", next(tick))
    _write(dest / "package.json", b'{"name": "agent-app", "version": "1.0.0"}\n', next(tick))
    _write(dest / ".env", b"OPENAI_API_KEY=sk-fake-0123456789abcdef\n", next(tick))
    modules = dest / "node_modules"
    per_package = 12
    for k in range(max(1, p["modules"] // per_package)):
        name = f"@scope{k % 7}/pkg{k:05d}" if k % 5 == 0 else f"pkg{k:05d}"
        package = modules / name
        _write(package / "package.json", f'{{"name": "{name}"}}\n'.encode(), next(tick))
        _write(package / "bin/cli.js", source.text(400, "#!/usr/bin/env node\n"), next(tick), 0o755)
        for j in range(per_package - 2):
            where = f"lib/sub{j % 3}/f{j}.js" if j % 2 else f"lib/f{j}.js"
            _write(package / where, source.text(rng.randint(100, 6000)), next(tick))
        if k % 4 == 0:
            link = modules / ".bin" / f"cli{k:05d}"
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(f"../{name}/bin/cli.js")
    build = dest / "build"
    for i in range(p["build"]):
        if i % 3:
            _write(
                build / f"obj/unit{i:04d}.o", rng.randbytes(rng.randint(4096, 65536)), next(tick)
            )
        else:
            _write(
                build / f"dist/chunk{i:04d}.js",
                source.text(rng.randint(20_000, 200_000)),
                next(tick),
            )
    with (build / "app.bin").open("wb") as f:
        for _ in range(p["big_mib"]):
            f.write(rng.randbytes(MIB))
    _git_init_and_commit(dest)


def _git_init_and_commit(dest: Path) -> None:
    stamp = f"{FIXED_MTIME} +0000"
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "agent",
        "GIT_AUTHOR_EMAIL": "agent@example.invalid",
        "GIT_COMMITTER_NAME": "agent",
        "GIT_COMMITTER_EMAIL": "agent@example.invalid",
        "GIT_AUTHOR_DATE": stamp,
        "GIT_COMMITTER_DATE": stamp,
    }
    for env_var in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        env.pop(env_var, None)
    for args in (["-c", "init.defaultBranch=main", "init", "-q"], ["add", "-A"],
                 ["commit", "-q", "-m", "initial import"]):  # fmt: skip
        subprocess.run(["git", *args], cwd=dest, env=env, check=True, stdout=subprocess.DEVNULL)


_GENERATORS = {
    "many-small": _make_many_small,
    "large-files": _make_large_files,
    "src-tree": _make_src_tree,
    "agent": _make_agent,
}


# ----------------------------------------------------------------- inspecting


def _excluded(name: str) -> bool:
    return name in (".git", "node_modules") or name.startswith(".env")


def walk_regular_files(root: Path, *, apply_excludes: bool) -> Iterator[tuple[str, int]]:
    """(relative path, size) of every regular file, sorted, never following links;
    with ``apply_excludes`` the default-excluded segments are skipped."""
    stack = [""]
    found: list[tuple[str, int]] = []
    while stack:
        rel_dir = stack.pop()
        with os.scandir(root / rel_dir) as it:
            for entry in it:
                if apply_excludes and _excluded(entry.name):
                    continue
                rel = os.path.join(rel_dir, entry.name)
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    stack.append(rel)
                elif stat.S_ISREG(st.st_mode):
                    found.append((rel, st.st_size))
    yield from sorted(found)


def tree_stats(root: Path, *, apply_excludes: bool = False) -> dict[str, int]:
    """Counts of regular files and their bytes (what a correct restore must match)."""
    files = total = 0
    for _, size in walk_regular_files(root, apply_excludes=apply_excludes):
        files += 1
        total += size
    return {"files": files, "bytes": total}


def disk_usage(path: Path) -> int:
    """Apparent bytes of every regular file under ``path`` (``du -sb``-like)."""
    if path.is_file():
        return path.stat().st_size
    if not path.exists():
        return 0
    return sum(size for _, size in walk_regular_files(path, apply_excludes=False))


def largest_file(root: Path, *, min_size: int = MIB) -> str | None:
    """Relative path of the biggest captured file of at least ``min_size`` bytes."""
    best = max(walk_regular_files(root, apply_excludes=True), key=lambda f: f[1], default=None)
    return best[0] if best and best[1] >= min_size else None


# -------------------------------------------------------------------- editing


def mutate(root: Path, *, fraction: float = 0.01, seed: int = 1) -> dict[str, int]:
    """Change ``fraction`` of the captured regular files, chosen by ``seed``: files
    under 1 MiB get a line appended, larger ones 64 KiB overwritten in place (the
    rule of make_corpus.py's ``mutate``; excluded paths are left alone so every
    tool sees the same number of changed files)."""
    rng = random.Random(seed)
    files = list(walk_regular_files(root, apply_excludes=True))
    chosen = rng.sample(files, min(len(files), max(1, round(len(files) * fraction))))
    written = 0
    for rel, size in chosen:
        path = root / rel
        if size < MIB:
            line = f"# mutated seed={seed} {rng.getrandbits(64):016x}\n".encode()
            with path.open("ab") as f:
                f.write(line)
            written += len(line)
        else:
            with path.open("r+b") as f:
                f.seek(rng.randrange(0, size - (64 << 10)))
                f.write(rng.randbytes(64 << 10))
            written += 64 << 10
    return {"files": len(chosen), "of": len(files), "bytes": written}


def append_mib(path: Path, *, seed: int) -> None:
    """Append 1 MiB of incompressible bytes (a growing log or build artifact)."""
    with path.open("ab") as f:
        f.write(random.Random(seed).randbytes(MIB))


def release_many_small(scratch: Path, files: int) -> Path | None:
    """The many-small corpus of ``files`` files under ``scratch`` (made once), on
    a release build of the native module; None, saying why on stderr, on a
    debug build (its timings would mean nothing)."""
    try:
        build = check_native_build(scratch)
    except DebugBuildError as exc:
        print(f"refusing to benchmark: {exc}", file=sys.stderr)
        return None
    print(f"native build: {build.get('profile')} ({build.get('how')})")
    return ensure_corpus(
        CorpusSpec("many-small", "many-small", {"files": files}),
        scratch / "corpora" / f"many-small-{files}",
    )
