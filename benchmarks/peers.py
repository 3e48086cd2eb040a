"""The tools we are measured against, and the floors no tool can beat.

Peers do the same job on the same working copy with the same edits: restic
(backup with its parent snapshot, restore), borg (create with its files cache,
extract), git (add + commit, status with the untracked cache, checkout with
parallel workers) and ``tar | zstd`` (create, extract). Each is given checkpointd's
default excludes so all back up the same files. Floors: ``find -printf`` (stat),
``cat`` and ``b3sum`` (read + hash), ``cp -a`` and ``tar | tar`` (write).

Missing tools are installed from Debian when allowed; a tool that cannot be had is
skipped with a printed note.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Callable

from .context import (
    APPEND_1MIB,
    CHANGED_1PCT,
    COLD,
    NO_CHANGE,
    RESTORE_EMPTY,
    RESTORE_OVER,
    Command,
    CorpusRun,
)
from .corpus import disk_usage
from .timing import FLOOR, PEER

# binary -> Debian package
DEBIAN_PACKAGES = {
    "restic": "restic",
    "borg": "borgbackup",
    "git": "git",
    "zstd": "zstd",
    "b3sum": "b3sum",
    "tar": "tar",
    "time": "time",  # GNU time, for the peak RSS (see timing.py)
}
# suite name -> binaries it needs
NEEDS = {
    "restic": ("restic",),
    "borg": ("borg",),
    "git": ("git",),
    "tar-zstd": ("tar", "zstd"),
    "floors": ("find", "cat", "cp", "tar"),
    "b3sum": ("b3sum",),
}
THREADS = os.cpu_count() or 2


def ensure_tools(binaries: set[str], *, install: bool) -> dict[str, str]:
    """Install the Debian packages of missing ``binaries`` (one apt-get call) when
    ``install`` and we are root; returns {binary: why it is unavailable}."""
    missing = {b for b in binaries if shutil.which(b) is None}
    packages = sorted({DEBIAN_PACKAGES[b] for b in missing if b in DEBIAN_PACKAGES})
    if missing and packages and install and os.geteuid() == 0 and shutil.which("apt-get"):
        installable = [p for p in packages if _apt_has_candidate(p)]
        if installable:
            print(f"installing from Debian: {' '.join(installable)}", flush=True)
            env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
            subprocess.run(["apt-get", "install", "-y", "-qq", *installable], env=env, check=False)
    why = "not installed" if not install else "not installable here"
    return {b: why for b in binaries if shutil.which(b) is None}


def _apt_has_candidate(package: str) -> bool:
    policy = subprocess.run(["apt-cache", "policy", package], capture_output=True, text=True)
    if "Candidate:" not in policy.stdout or "Candidate: (none)" in policy.stdout:
        subprocess.run(["apt-get", "update", "-qq"], check=False)
        policy = subprocess.run(["apt-cache", "policy", package], capture_output=True, text=True)
    return "Candidate:" in policy.stdout and "Candidate: (none)" not in policy.stdout


def tool_versions() -> dict[str, str]:
    """First line of each peer's version output (for the report's machine facts)."""
    versions = {}
    for name, argv in {
        "restic": ["restic", "version"],
        "borg": ["borg", "--version"],
        "git": ["git", "--version"],
        "zstd": ["zstd", "--version"],
        "b3sum": ["b3sum", "--version"],
        "tar": ["tar", "--version"],
    }.items():
        if shutil.which(argv[0]):
            out = subprocess.run(argv, capture_output=True, text=True, check=False).stdout
            first = (out.strip().splitlines() or ["?"])[0].strip("* ")
            versions[name] = first.removeprefix(name).strip()
    return versions


# ------------------------------------------------------------------- helpers


def _capture_edits(ctx: CorpusRun, tool: str, command: Command, env: dict[str, str]) -> None:
    """The three incremental captures, for every peer that has them."""
    ctx.bench(NO_CHANGE, tool, PEER, command, warmup=True, env=env)
    ctx.bench(
        CHANGED_1PCT, tool, PEER, command,
        prepare=lambda run: ctx.mutate_work(CHANGED_1PCT, run), env=env,
    )  # fmt: skip
    if ctx.big_file:
        ctx.bench(
            APPEND_1MIB, tool, PEER, command,
            prepare=lambda run: ctx.append_work(APPEND_1MIB, run), env=env,
        )  # fmt: skip


def _restores(
    ctx: CorpusRun, tool: str, command: Command, env: dict[str, str] | None, *, over: bool = True
) -> None:
    """Restore into an empty dir, then (``over``) over a 1%-changed restored tree."""
    empty = ctx.bench(
        RESTORE_EMPTY, tool, PEER, command, prepare=lambda _run: ctx.fresh_target(), env=env
    )
    ctx.verify_restore(empty)
    if over and not empty.error:
        changed = ctx.bench(
            RESTORE_OVER, tool, PEER, command,
            prepare=lambda run: ctx.mutate_target(RESTORE_OVER, run), env=env,
        )  # fmt: skip
        ctx.verify_restore(changed)


# --------------------------------------------------------------------- peers


def restic_suite(ctx: CorpusRun) -> None:
    base = ctx.tool_dir("restic")
    repo, cache, password = base / "repo", base / "cache", base / "password"
    env = {
        **os.environ,
        "RESTIC_REPOSITORY": str(repo),
        "RESTIC_CACHE_DIR": str(cache),
        "RESTIC_PASSWORD_FILE": str(password),
    }
    excludes = ["--exclude", ".git", "--exclude", "node_modules", "--exclude", ".env*"]
    backup = [
        "restic",
        "backup",
        "-q",
        "--host",
        "bench",
        *(excludes if ctx.apply_excludes else []),
        str(ctx.work),
    ]

    def fresh_repo(_run: int) -> None:
        ctx.scratch.aside(repo, cache)
        base.mkdir(parents=True, exist_ok=True)
        password.write_text("benchmark-only password\n")
        subprocess.run(
            ["restic", "init", "-q", "--repository-version", "2"],
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
        )

    ctx.fresh_work()
    cold = ctx.bench(COLD, "restic", PEER, backup, prepare=fresh_repo, env=env)
    if cold.error:
        return
    cold.notes["stored_bytes"] = disk_usage(repo)
    _capture_edits(ctx, "restic", backup, env)
    restore = ["restic", "restore", "-q", "latest", "--target", str(ctx.target)]
    # A restic without `restore --overwrite` (before 0.17) cannot restore over
    # a tree holding the snapshot's symlinks: it fails on each existing one
    # ("There were 100 errors"), so that row is left out, said in the notes.
    overwrites = _restic_restore_overwrites()
    if overwrites:
        restore += ["--overwrite", "always"]
    else:
        ctx.problems.append(
            f"{ctx.name}: restic has no `restore --overwrite` (restic before 0.17 fails on "
            "every existing symlink), so it is not timed restoring over a changed tree"
        )
    _restores(ctx, "restic", restore, env, over=overwrites)


def _restic_restore_overwrites() -> bool:
    """Whether this restic's restore replaces what stands in the target (``--overwrite``)."""
    shown = subprocess.run(
        ["restic", "restore", "--help"], capture_output=True, text=True, check=False
    )
    return "--overwrite" in shown.stdout


def borg_suite(ctx: CorpusRun) -> None:
    base = ctx.tool_dir("borg")
    repo = base / "repo"
    env = {
        **os.environ,
        "BORG_REPO": str(repo),
        "BORG_BASE_DIR": str(base / "home"),
        "BORG_UNKNOWN_UNENCRYPTED_REPO_ACCESS_IS_OK": "yes",
        "BORG_RELOCATED_REPO_ACCESS_IS_OK": "yes",
    }
    excludes = [
        "--exclude",
        "sh:**/.git",
        "--exclude",
        "sh:**/node_modules",
        "--exclude",
        "sh:**/.env*",
    ]
    create = [
        "borg",
        "create",
        *(excludes if ctx.apply_excludes else []),
        "::{now:%Y-%m-%dT%H:%M:%S.%f}",
        str(ctx.work),
    ]

    def fresh_repo(_run: int) -> None:
        ctx.scratch.aside(base)
        base.mkdir(parents=True)
        subprocess.run(["borg", "init", "-e", "none"], env=env, check=True)

    ctx.fresh_work()
    cold = ctx.bench(COLD, "borg", PEER, create, prepare=fresh_repo, env=env)
    if cold.error:
        return
    cold.notes["stored_bytes"] = disk_usage(repo)
    _capture_edits(ctx, "borg", create, env)
    last = subprocess.run(
        ["borg", "list", "--last", "1", "--short"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    # borg extracts into the current directory.
    extract = f"cd {shlex.quote(str(ctx.target))} && borg extract ::{shlex.quote(last)}"
    _restores(ctx, "borg", extract, env)


def git_suite(ctx: CorpusRun) -> None:
    base = ctx.tool_dir("git")
    git_dir, index = base / "git-dir", base / "checkout.index"
    env = {
        **os.environ,
        "GIT_DIR": str(git_dir),
        "GIT_WORK_TREE": str(ctx.work),
        "GIT_AUTHOR_NAME": "bench",
        "GIT_AUTHOR_EMAIL": "bench@example.invalid",
        "GIT_COMMITTER_NAME": "bench",
        "GIT_COMMITTER_EMAIL": "bench@example.invalid",
        "GIT_CONFIG_NOSYSTEM": "1",
    }
    env.pop("GIT_INDEX_FILE", None)

    def fresh_repo(_run: int) -> None:
        ctx.scratch.aside(git_dir)
        base.mkdir(parents=True, exist_ok=True)
        git = ["git", "-c", "init.defaultBranch=main"]
        subprocess.run([*git, "init", "-q"], env=env, check=True)
        # gc.auto=0: else committing thousands of loose objects forks a repack mid-run.
        for key, value in (("gc.auto", "0"), ("core.untrackedCache", "true")):
            subprocess.run(["git", "config", key, value], env=env, check=True)
        if ctx.apply_excludes:  # git already never descends into .git
            (git_dir / "info").mkdir(exist_ok=True)
            (git_dir / "info" / "exclude").write_text("node_modules/\n.env*\n")

    # The workspace's own .gitignore hides its build outputs from git, but checkpointd
    # captures them: force-add everything except the default excludes instead.
    add = "git add -A"
    if ctx.apply_excludes:
        add += " -f -- . ':(exclude,glob)**/node_modules/**' ':(exclude,glob)**/.env*'"
    commit = f"{add} && git commit -q --no-verify -m snapshot"
    ctx.fresh_work()
    cold = ctx.bench(COLD, "git (add+commit)", PEER, commit, prepare=fresh_repo, env=env)
    if cold.error:
        return
    cold.notes["stored_bytes"] = disk_usage(git_dir)
    ctx.bench(NO_CHANGE, "git status", PEER, ["git", "status", "--porcelain"], warmup=True, env=env)
    ctx.bench(
        CHANGED_1PCT, "git (add+commit)", PEER, commit,
        prepare=lambda run: ctx.mutate_work(CHANGED_1PCT, run), env=env,
    )  # fmt: skip
    if ctx.big_file:
        ctx.bench(
            APPEND_1MIB, "git (add+commit)", PEER, commit,
            prepare=lambda run: ctx.append_work(APPEND_1MIB, run), env=env,
        )  # fmt: skip
    checkout_env = {**env, "GIT_WORK_TREE": str(ctx.target), "GIT_INDEX_FILE": str(index)}
    checkout = [
        "git",
        "-c",
        f"checkout.workers={THREADS}",
        "-c",
        "checkout.thresholdForParallelism=1",
        "checkout",
        "-f",
        "HEAD",
        "--",
        ".",
    ]

    def empty_target(_run: int) -> None:
        ctx.fresh_target()
        ctx.scratch.aside(index)

    empty = ctx.bench(
        RESTORE_EMPTY, "git checkout", PEER, checkout, prepare=empty_target, env=checkout_env
    )
    ctx.verify_restore(empty)
    if not empty.error:
        # With the index of the last checkout, git rewrites only the stat-dirty files.
        over = ctx.bench(
            RESTORE_OVER, "git checkout", PEER, checkout,
            prepare=lambda run: ctx.mutate_target(RESTORE_OVER, run), env=checkout_env,
        )  # fmt: skip
        ctx.verify_restore(over)


def tar_zstd_suite(ctx: CorpusRun) -> None:
    archive = ctx.tool_dir("tar-zstd") / "corpus.tar.zst"
    excludes = (
        "--exclude=.git --exclude=node_modules --exclude='.env*' " if ctx.apply_excludes else ""
    )
    parent, name = shlex.quote(str(ctx.work.parent)), shlex.quote(ctx.work.name)
    create = f"tar -C {parent} {excludes}-cf - {name} | zstd -1 -T{THREADS} -q > {shlex.quote(str(archive))}"

    def fresh_archive(_run: int) -> None:
        ctx.scratch.aside(archive)
        archive.parent.mkdir(parents=True, exist_ok=True)

    ctx.fresh_work()
    cold = ctx.bench(COLD, "tar | zstd -1", PEER, create, prepare=fresh_archive)
    if cold.error:
        return
    cold.notes["stored_bytes"] = disk_usage(archive)
    extract = (
        f"zstd -dc -q {shlex.quote(str(archive))} | tar -xf - -C {shlex.quote(str(ctx.target))}"
    )
    _restores(ctx, "tar | zstd -1", extract, None, over=False)


# -------------------------------------------------------------------- floors


def floor_suite(ctx: CorpusRun, *, floors: tuple[str, ...]) -> None:
    """The floors named in ``floors`` ("find", "cat", "b3sum", "cp -a", "tar|tar")."""
    ctx.fresh_work()
    work = shlex.quote(str(ctx.work))
    prune = (
        "\\( -name .git -o -name node_modules -o -name '.env*' \\) -prune -o "
        if ctx.apply_excludes
        else ""
    )
    files = f"find {work} {prune}-type f -print0"
    if "find" in floors:
        ctx.bench(
            NO_CHANGE,
            "floor: find -printf",
            FLOOR,
            f"find {work} {prune}-printf '%s %T@\\n' >/dev/null",
            warmup=True,
        )
    if "cat" in floors:
        ctx.bench(COLD, "floor: cat", FLOOR, f"{files} | xargs -0 -r cat >/dev/null", warmup=True)
    if "b3sum" in floors and shutil.which("b3sum"):
        ctx.bench(
            COLD,
            f"floor: b3sum -t{THREADS}",
            FLOOR,
            f"{files} | xargs -0 -r b3sum --num-threads {THREADS} >/dev/null",
            warmup=True,
        )
    target = shlex.quote(str(ctx.target))
    if "cp -a" in floors and not ctx.apply_excludes:  # cp cannot leave the excluded dirs out
        m = ctx.bench(
            RESTORE_EMPTY,
            "floor: cp -a",
            FLOOR,
            f"cp -a {work} {target}",
            prepare=lambda _r: ctx.fresh_target(create=False),
        )
        ctx.verify_restore(m)
    if "tar|tar" in floors:
        excludes = (
            "--exclude=.git --exclude=node_modules --exclude='.env*' " if ctx.apply_excludes else ""
        )
        parent, name = shlex.quote(str(ctx.work.parent)), shlex.quote(ctx.work.name)
        m = ctx.bench(
            RESTORE_EMPTY,
            "floor: tar | tar",
            FLOOR,
            f"tar -C {parent} {excludes}-cf - {name} | tar -xf - -C {target}",
            prepare=lambda _r: ctx.fresh_target(),
        )
        ctx.verify_restore(m)


def suite_for(name: str) -> Callable[[CorpusRun], None]:
    return {
        "restic": restic_suite,
        "borg": borg_suite,
        "git": git_suite,
        "tar-zstd": tar_zstd_suite,
    }[name]
