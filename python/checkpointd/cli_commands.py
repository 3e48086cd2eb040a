"""The client commands of ``checkpointd`` (everything but ``serve``, ``gateway``,
``token`` and ``migrate``): each is ``async (client, args, out) -> exit code``.

Imported when a client command runs, not when the parser is built.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import posixpath
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from .cli_history import plan_text, restore_text
from .cli_output import (
    EXIT_CONFLICT,
    EXIT_DATA_LOSS,
    EXIT_ERROR,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    Output,
    UsageError,
    exit_code_of,
    human_duration,
    human_rate,
    human_size,
    human_time,
    json_list_items,
    summary_line,
    summary_row,
    table,
    taken_lines,
    to_dict,
)
from .cli_refs import resolve
from .model import ARTIFACT_KEY_PREFIX, FILE_KEY_PREFIX, stash_thread_id
from .service.client import Client, RpcError
from .service.config import resolve as resolve_config
from .service.config import socket_path_of
from .statcache_paths import DEFAULT_DATA_DIR
from .v1 import checkpointd_pb2 as pb

# ---------------------------------------------------------------- arguments


def policy_of(args: argparse.Namespace) -> pb.Policy | None:
    if not (args.exclude or args.include or args.no_default_excludes):
        return None
    return pb.Policy(
        exclude=args.exclude, include=args.include, default_excludes=not args.no_default_excludes
    )


def secrets_of(args: argparse.Namespace) -> tuple[list[bytes], list[str]]:
    """The --secret-env values and their variable names (the names travel, so a
    restore finds each secret by name whatever the order)."""
    values = []
    for name in args.secret_env:
        value = os.environ.get(name)
        if not value:
            raise UsageError(f"--secret-env {name}: the variable is not set")
        values.append(value.encode())
    return values, list(args.secret_env)


@dataclass(frozen=True)
class Target:
    """The daemon a client command talks to, and why it looks there."""

    address: str
    because: str


def daemon_target(args: argparse.Namespace) -> Target:
    """--address, else --data-dir's socket, else CHECKPOINTD_ADDRESS, else
    CHECKPOINTD_DATA_DIR's socket, else the default data dir's (the one
    ``serve`` and ``make run`` use)."""
    if args.address:
        return Target(args.address, "--address")
    address = os.environ.get("CHECKPOINTD_ADDRESS")
    if address and args.data_dir is None:
        return Target(address, "CHECKPOINTD_ADDRESS")
    if args.data_dir is not None:
        data_dir, because = args.data_dir, f"--data-dir {args.data_dir}"
    elif os.environ.get("CHECKPOINTD_DATA_DIR"):
        data_dir = os.environ["CHECKPOINTD_DATA_DIR"]
        because = f"CHECKPOINTD_DATA_DIR={data_dir}"
    else:
        data_dir = DEFAULT_DATA_DIR
        because = f"the default data dir {DEFAULT_DATA_DIR} (the one serve and make run use)"
    listen = resolve_config({"data_dir": data_dir, "listen": None}, environ={}).listen
    return Target(listen, because)


def tls_files(args: argparse.Namespace) -> dict[str, bytes | None]:
    """The client's TLS material from flags or CHECKPOINTD_TLS_* (UsageError when unreadable)."""
    files: dict[str, bytes | None] = {}
    for name in ("tls_ca", "tls_cert", "tls_key"):
        path = getattr(args, name) or os.environ.get("CHECKPOINTD_" + name.upper())
        if not path:
            files[name] = None
            continue
        try:
            files[name] = Path(path).read_bytes()
        except OSError as error:
            flag = "--" + name.replace("_", "-")
            raise UsageError(f"{flag} {path}: {error.strerror}") from None
    if (files["tls_cert"] is None) != (files["tls_key"] is None):
        raise UsageError("--tls-cert and --tls-key go together")
    return files


def connect(args: argparse.Namespace) -> Client:
    """The daemon client the command line describes (address, token, TLS, deadline)."""
    tls = tls_files(args)
    return Client(
        daemon_target(args).address,
        token=args.token or os.environ.get("CHECKPOINTD_TOKEN"),
        timeout=args.timeout,
        tls_ca=tls["tls_ca"],
        tls_cert=tls["tls_cert"],
        tls_key=tls["tls_key"],
    )


def _parse_ms(text: str) -> int:
    from .errors import SandboxCheckpointInvalidArgumentError
    from .service.config import parse_duration

    try:
        return int(parse_duration(text) * 1000)
    except SandboxCheckpointInvalidArgumentError as error:
        raise UsageError(str(error)) from None


def _parse_percent(text: str | None) -> int | None:
    """``--repack-below 30`` (or ``30%``); the range rule is the sweep's."""
    from .errors import SandboxCheckpointInvalidArgumentError
    from .sweep import repack_below_percent

    if text is None:
        return None
    digits = text.strip().removesuffix("%").strip()
    if not digits.isdecimal():
        raise UsageError(f"--repack-below: not a percentage: {text!r} (0-100, e.g. 30)")
    try:
        repack_below_percent(int(digits))
    except SandboxCheckpointInvalidArgumentError as error:
        raise UsageError(f"--repack-below: {error}") from None
    return int(digits)


# ---------------------------------------------------------------- running


def no_daemon(target: Target, error: RpcError) -> RpcError:
    """The error of a call that found no daemon: where the client looked, why
    there, and how to start one or point the client at one (the transport's
    own words kept as ``cause``)."""
    socket = socket_path_of(target.address)
    if socket is None:
        found = "nothing accepts connections there"
    elif not socket.exists():
        found = "the socket file does not exist"
    else:
        found = "the socket file exists but no daemon answers on it (a daemon that stopped?)"
    return RpcError(
        error.code,
        f"no daemon at {target.address}: {found}",
        error.reason,
        {
            "looked there because of": target.because,
            "start one": "checkpointd serve --workspace DIR [--data-dir DIR], or make run",
            "or point to one": "--data-dir DIR or CHECKPOINTD_DATA_DIR=DIR (the daemon's data "
            "dir), or --address unix:///PATH.sock or tcp://HOST:PORT or CHECKPOINTD_ADDRESS",
            "cause": error.message,
        },
    )


def _report(args: argparse.Namespace, error: RpcError) -> int:
    if error.code.name == "UNAVAILABLE" and not error.reason:
        # No ErrorInfo: the transport found no daemon (a daemon that is up
        # but whose store is down answers with a reason).
        error = no_daemon(daemon_target(args), error)
    if getattr(args, "json", False):
        document = {
            "code": error.code.name,
            "reason": error.reason,
            "message": error.message,
            "metadata": error.metadata,
        }
        print(json.dumps({"error": document}))
    else:
        print(f"checkpointd {args.command}: {error}", file=sys.stderr)
        for key, value in error.metadata.items():
            print(f"  {key}: {value}", file=sys.stderr)
    return exit_code_of(error.code.name, error.reason)


async def run_client(args: argparse.Namespace) -> int:
    """Run one client command; RpcErrors become messages and exit codes."""
    output = Output(getattr(args, "json", False))
    try:
        async with connect(args) as client:
            return int(await COMMANDS[args.command](client, args, output))
    except RpcError as error:
        output.close()
        return _report(args, error)
    finally:
        output.close()


# ---------------------------------------------------------------- capture, restore


async def _capture(client: Client, args: argparse.Namespace, out: Output) -> int:
    secrets, secret_names = secrets_of(args)
    conversation: list[str] = []
    if args.conversation:
        text = await asyncio.to_thread(Path(args.conversation).read_text, encoding="utf-8")
        conversation = json_list_items(text, f"--conversation {args.conversation}")
    artifacts = []
    for spec in args.artifact:
        path, _, mime = spec.partition(":")
        data = await asyncio.to_thread(Path(path).read_bytes)
        artifacts.append(
            await client.upload_artifact(
                os.path.basename(path), mime or "application/octet-stream", data
            )
        )
    done = await client.capture(
        args.thread,
        label=args.label,
        policy=policy_of(args),
        secrets=secrets,
        conversation=conversation,
        artifacts=artifacts,
        workspace_subdir=args.subdir,
        request_id=args.request_id,
        skip_if_unchanged=args.skip_if_unchanged,
        on_event=out.on_event,
        secret_names=secret_names,
    )
    out.emit(to_dict(done), capture_text(done))
    return EXIT_OK


def capture_text(done: pb.CaptureDone) -> str:
    """The capture's summary: what it found, read, reused and uploaded (the
    bytes it moved, never the checkpoint's size as a rate)."""
    s, st = done.checkpoint, done.stats
    if done.unchanged:
        return f"unchanged: the head {s.id} already holds this ({s.file_count} files)"
    return (
        f"captured {s.id} ({s.file_count} files, {human_size(s.total_bytes)}) in "
        f"{human_duration(st.duration_ms)}: hashed {st.files_hashed} files "
        f"({human_size(st.bytes_hashed)}), reused {st.files_reused}, uploaded "
        f"{st.blobs_uploaded} blobs ({human_size(st.bytes_uploaded)}), recorded "
        f"{st.entries} entries" + scan_text(st) + (" [replayed]" if done.replayed else "")
    )


def scan_text(stats: pb.CaptureStats) -> str:
    """How the capture examined the workspace: `; journal scan, 12 examined`
    or `; full scan (a fresh daemon), 1,204 examined` (nothing from a daemon
    that does not say)."""
    if not stats.scan_mode:
        return ""
    why = f" ({stats.full_scan_reason})" if stats.full_scan_reason else ""
    return f"; {stats.scan_mode} scan{why}, {stats.entries_examined:,} examined"


async def _restore(client: Client, args: argparse.Namespace, out: Output) -> int:
    """``restore`` and ``undo`` (``args.command``): the same events and output."""
    paths: dict[str, list[str]] = {"written": [], "deleted": [], "stashed": []}

    def on_event(event: pb.RestoreEvent) -> None:
        if event.HasField("plan_paths"):
            for kind, found in paths.items():
                found.extend(getattr(event.plan_paths, kind))
        else:
            out.on_event(event)

    secrets, secret_names = secrets_of(args)
    common: dict[str, Any] = dict(dry_run=args.dry_run, on_event=on_event, record=args.record)
    common.update(workspace_subdir=args.subdir, secrets=secrets, secret_names=secret_names)
    if args.command == "undo":
        done = await client.undo(args.thread, **common)
    else:
        checkpoint = args.checkpoint
        if checkpoint is not None:
            checkpoint = await resolve(client, checkpoint, thread=args.thread)
        done = await client.restore(
            args.thread,
            checkpoint_id=checkpoint,
            policy=policy_of(args),
            discard_live_changes=args.discard,
            **common,
        )
    if not done.HasField("checkpoint"):
        return no_such_thread(out, args.thread, to_dict(done))
    data = to_dict(done)
    if args.dry_run:
        data.update(paths)
        out.emit(data, plan_text(done, paths["written"], paths["deleted"], paths["stashed"]))
        return EXIT_OK
    out.emit(data, restore_text(done, out))
    return EXIT_OK


def no_such_thread(out: Output, thread: str, data: dict[str, Any] | None = None) -> int:
    """An unknown thread (no checkpoint) exits 3 in every command: with --json
    the command's usual document plus an ``error`` shaped like a daemon's
    (code, reason, message, metadata); else one line on stderr, as any error."""
    message = f"thread {thread} has no checkpoints"
    error = {
        "code": "NOT_FOUND",
        "reason": "SANDBOX_SNAPSHOT_MISSING_CHECKPOINT",
        "message": message,
        "metadata": {"thread_id": thread},
        "thread_id": thread,
    }
    out.close()
    if out.as_json:
        print(json.dumps({**(data or {}), "error": error}, indent=2, sort_keys=True))
    else:
        print(f"checkpointd: NOT_FOUND: {message}", file=sys.stderr)
    return EXIT_NOT_FOUND


# ---------------------------------------------------------------- reading


async def _list(client: Client, args: argparse.Namespace, out: Output) -> int:
    before = args.before
    if before is not None:
        before = await resolve(client, before, thread=args.thread)
    summaries = await client.list_checkpoints(
        args.thread,
        newest_first=args.newest_first,
        before=before,
        limit=args.limit,
        stash=args.stash,
    )
    head = await client.get_head(args.thread)
    if not summaries and head is None and before is None:
        return no_such_thread(out, args.thread, {"head": None, "checkpoints": []})
    rows = [summary_row(s, head) for s in summaries]
    out.emit(
        {"head": head, "checkpoints": [to_dict(s) for s in summaries]},
        table(rows, right=(3, 4)) if rows else f"no checkpoints of thread {args.thread} match",
    )
    return EXIT_OK


async def _threads(client: Client, args: argparse.Namespace, out: Output) -> int:
    threads = [thread async for thread in client.list_threads()]
    rows = [["THREAD", "CHECKPOINTS", "HEAD", "NEWEST"]] + [
        [
            t.thread_id,
            str(t.checkpoint_count),
            t.head_checkpoint_id if t.HasField("head_checkpoint_id") else "(none)",
            human_time(t.newest_created_at),
        ]
        for t in threads
    ]
    out.emit(
        {"threads": [to_dict(t) for t in threads]},
        table(rows, right=(1,)) if threads else "no threads",
    )
    return EXIT_OK


def entry_row(entry: pb.Entry) -> list[str]:
    """One manifest entry as ``ls -l`` cells: mode, size, mtime, path (-> target)."""
    kind = {
        pb.ENTRY_KIND_DIR: stat.S_IFDIR,
        pb.ENTRY_KIND_SYMLINK: stat.S_IFLNK,
    }.get(entry.kind, stat.S_IFREG)
    mode = 0o777 if kind == stat.S_IFLNK else entry.mode
    size = human_size(entry.size) if kind == stat.S_IFREG else "-"
    mtime = human_time(entry.mtime_ns // 1_000_000) if entry.mtime_ns else "-"
    path = entry.path + (f" -> {entry.target}" if entry.target else "")
    return [stat.filemode(kind | mode), size, mtime, path]


async def _show(client: Client, args: argparse.Namespace, out: Output) -> int:
    checkpoint_id = await resolve(client, args.checkpoint)
    response = await client.get_checkpoint(checkpoint_id, include_conversation=args.conversation)
    data = to_dict(response)
    lines = [summary_line(response.checkpoint), *taken_lines(response.checkpoint)]
    if args.entries:
        entries = await client.list_entries(checkpoint_id)
        data["entries"] = [to_dict(e) for e in entries]
        lines += ["  " + line for line in table([entry_row(e) for e in entries]).splitlines()]
    for artifact in response.artifacts:
        lines.append(
            f"  artifact {artifact.name} ({artifact.mime_type}, {human_size(artifact.size)}) "
            f"{artifact.blob_key}"
        )
    for message in response.conversation:
        lines.append(f"  message {message}")
    out.emit(data, "\n".join(lines))
    return EXIT_OK


def checkpoint_path(path: str) -> str:
    """A path inside a checkpoint as its manifest spells it: relative and
    normalised ("" for the root). UsageError for a path that leaves the root."""
    normal = posixpath.normpath(path.strip().strip("/") or ".")
    if normal == ".." or normal.startswith("../"):
        raise UsageError(f"{path!r} leaves the checkpoint's root")
    return "" if normal == "." else normal


async def _ls(client: Client, args: argparse.Namespace, out: Output) -> int:
    checkpoint_id = await resolve(client, args.checkpoint)
    path = checkpoint_path(args.path or "")
    entries = await client.list_entries(checkpoint_id, path_prefix=path)
    if path and not entries:
        raise RpcError(
            grpc.StatusCode.NOT_FOUND,
            f"checkpoint {checkpoint_id} has no path {path!r}",
            "SANDBOX_SNAPSHOT_MISSING_ENTRY",
            {"checkpoint_id": checkpoint_id, "path": path},
        )
    if not args.recursive:
        # Like ls: the file itself, or the directory's children (not the whole tree).
        itself = [e for e in entries if e.path == path and e.kind != pb.ENTRY_KIND_DIR]
        depth = path.count("/") + 1 if path else 0
        entries = itself or [e for e in entries if e.path != path and e.path.count("/") == depth]
    out.emit(
        {"checkpoint_id": checkpoint_id, "entries": [to_dict(e) for e in entries]},
        table([entry_row(e) for e in entries], right=(1,)),
    )
    return EXIT_OK


async def _cat(client: Client, args: argparse.Namespace, out: Output) -> int:
    checkpoint_id = await resolve(client, args.checkpoint)
    path = checkpoint_path(args.path)
    sink = sys.stdout.buffer
    async for chunk in client.iter_file(checkpoint_id, path):
        sink.write(chunk)
    sink.flush()
    return EXIT_OK


async def _diff(client: Client, args: argparse.Namespace, out: Output) -> int:
    start = args.from_checkpoint
    if start is None:
        if not args.thread:
            raise UsageError("give a checkpoint or --thread")
        start = await client.get_head(args.thread)
        if start is None:
            return no_such_thread(out, args.thread, {"changes": []})
    else:
        start = await resolve(client, start, thread=args.thread)
    end = args.to_checkpoint
    if end is not None:
        end = await resolve(client, end, thread=args.thread)
    secrets, secret_names = secrets_of(args)
    changes = await client.diff(
        start,
        end,
        policy=policy_of(args),
        workspace_subdir=args.subdir,
        secrets=secrets,
        secret_names=secret_names,
    )
    marks = {
        pb.CHANGE_KIND_ADDED: "A",
        pb.CHANGE_KIND_DELETED: "D",
        pb.CHANGE_KIND_MODIFIED: "M",
        pb.CHANGE_KIND_MODE_CHANGED: "m",
    }
    lines = [f"{marks.get(c.kind, '?')} {c.path}" for c in changes]
    out.emit(
        {"changes": [to_dict(c) for c in changes]}, "\n".join(lines) if lines else "no changes"
    )
    return EXIT_OK


# ---------------------------------------------------------------- writing


async def _fork(client: Client, args: argparse.Namespace, out: Output) -> int:
    source = await resolve(client, args.checkpoint, thread=args.source_thread)
    summary = await client.fork(args.source_thread, source, args.destination_thread)
    out.emit(
        to_dict(summary),
        f"forked {source} into thread {args.destination_thread} as {summary.id}",
    )
    return EXIT_OK


async def _prune(client: Client, args: argparse.Namespace, out: Output) -> int:
    response = await client.prune_response(args.thread, args.keep, dry_run=args.dry_run)
    deleted = list(response.deleted_checkpoint_ids)
    if not deleted and await client.get_head(args.thread) is None:
        if not await client.list_checkpoints(args.thread, limit=1):
            return no_such_thread(out, args.thread, {"deleted": [], "dry_run": args.dry_run})
    verb = "would delete" if args.dry_run else "deleted"
    more = response.deleted_count - len(deleted)
    out.emit(
        {
            "deleted": deleted,
            "deleted_count": response.deleted_count,
            "ids_truncated": response.ids_truncated,
            "dry_run": args.dry_run,
        },
        f"{verb} {response.deleted_count} checkpoints"
        + "".join(f"\n  {d}" for d in deleted)
        + (f"\n  … {more} more" if more > 0 else ""),
    )
    return EXIT_OK


# A checkpoint captured while delete-thread runs makes it go round again, this often.
DELETE_THREAD_ROUNDS = 5


async def _delete_thread(client: Client, args: argparse.Namespace, out: Output) -> int:
    thread = args.thread
    head = await client.get_head(thread)
    if head is None and not await client.list_checkpoints(thread, limit=1):
        return no_such_thread(out, thread, {"deleted_count": 0})
    if not args.yes:
        planned = await client.prune_response(thread, 1, dry_run=True)
        count = planned.deleted_count + (head is not None)
        raise UsageError(
            f"would delete all {count} checkpoints of thread {thread} (head {head}); the "
            "blobs stay until a sweep deletes those no checkpoint uses. Run again with --yes"
        )
    deleted, done = await _delete_checkpoints_of(client, thread)
    if done:
        # Its stash (the live states restores saved) goes with it.
        stashed, _ = await _delete_checkpoints_of(client, stash_thread_id(thread))
        out.emit(
            {"thread_id": thread, "deleted_count": deleted, "stash_deleted_count": stashed},
            f"deleted thread {thread}: {deleted} checkpoints"
            + (f" and {stashed} stashed" if stashed else "")
            + " (a sweep deletes the blobs no checkpoint uses any more)",
        )
        return EXIT_OK
    print(
        f"checkpointd delete-thread: thread {thread} kept getting new checkpoints (a capture "
        f"running?); deleted {deleted} so far, try again",
        file=sys.stderr,
    )
    return EXIT_CONFLICT


async def _delete_checkpoints_of(client: Client, thread: str) -> tuple[int, bool]:
    """Delete every checkpoint of ``thread``: (how many, whether none is left)."""
    deleted = 0
    for _ in range(DELETE_THREAD_ROUNDS):
        # Everything but the head, then the head (whose parent is gone by then).
        deleted += (await client.prune_response(thread, 1)).deleted_count
        head = await client.get_head(thread)
        if head is not None:
            try:
                await client.delete_head(thread, head)
            except RpcError as error:
                if error.reason != "SANDBOX_SNAPSHOT_NOT_HEAD":
                    raise
                continue  # a capture moved the head: go round again
            deleted += 1
        if not await client.list_checkpoints(thread, limit=1):
            return deleted, True
    return deleted, False


# Failures printed (human) or put in the JSON document; the summary counts all.
MAX_REPORTED_FAILURES = 100


@dataclass
class KeyCounts:
    """Keys of a sweep by kind: blob keys (files, artifacts), pack objects, other."""

    blobs: int = 0
    packs: int = 0
    other: int = 0

    def add(self, key: str, pack_prefix: str) -> None:
        if key.startswith(pack_prefix):
            self.packs += 1
        elif key.startswith((FILE_KEY_PREFIX, ARTIFACT_KEY_PREFIX)):
            self.blobs += 1
        else:
            self.other += 1

    def text(self) -> str:
        words = [f"{self.blobs} blob keys", f"{self.packs} packs"]
        return ", ".join(words + ([f"{self.other} other keys"] if self.other else []))


async def _sweep(client: Client, args: argparse.Namespace, out: Output) -> int:
    from .blobs.packs import PACK_KEY_PREFIX

    older_than_ms = None if args.older_than is None else _parse_ms(args.older_than)
    failures: list[tuple[str, str]] = []
    deleted, kept = KeyCounts(), KeyCounts()

    def on_batch(batch: pb.SweepBlobsBatch) -> None:
        # Keys stream through: a sweep of millions never gathers them here.
        for key in batch.deleted:
            deleted.add(key, PACK_KEY_PREFIX)
        for k in batch.kept:
            kept.add(k.key, PACK_KEY_PREFIX)
        for failure in batch.failures:
            if len(failures) < MAX_REPORTED_FAILURES:
                failures.append((failure.key, failure.message))
        if args.keys:
            _print_keys(batch, args.json)

    try:
        summary = await client.sweep(
            older_than_ms,
            dry_run=args.dry_run,
            repack_below_percent=_parse_percent(args.repack_below),
            on_batch=on_batch,
        )
    except RpcError as error:
        # What the stream already reported as deleted is gone: say so with the error.
        error.metadata["deleted_before_failure"] = str(deleted.blobs + deleted.packs)
        raise
    data = {
        "summary": to_dict(summary),
        "deleted": {"blob_keys": deleted.blobs, "packs": deleted.packs, "other": deleted.other},
        "kept": {"blob_keys": kept.blobs, "packs": kept.packs, "other": kept.other},
        "failures": [{"key": key, "message": message} for key, message in failures],
    }
    if args.keys and args.json:
        print(json.dumps(data))  # the last of the JSON lines
    else:
        out.emit(data, _sweep_text(summary, deleted, kept, failures, args.dry_run))
    return EXIT_OK if not summary.failed_count else EXIT_ERROR


def _print_keys(batch: pb.SweepBlobsBatch, as_json: bool) -> None:
    rows = [("deleted", key, "") for key in batch.deleted]
    rows += [("kept", k.key, k.reason) for k in batch.kept]
    rows += [("failed", f.key, f.message) for f in batch.failures]
    for kind, key, why in rows:
        if as_json:
            print(json.dumps({kind: key, **({"why": why} if why else {})}))
        else:
            print(f"{kind:<7} {key}" + (f"  ({why})" if why else ""))


def _sweep_text(
    summary: pb.SweepBlobsSummary,
    deleted: KeyCounts,
    kept: KeyCounts,
    failures: list[tuple[str, str]],
    dry_run: bool,
) -> str:
    verb = "would delete" if dry_run else "deleted"
    reasons = ", ".join(f"{r}: {n}" for r, n in sorted(summary.kept_by_reason.items()))
    text = (
        f"{verb} {deleted.text()}; kept {kept.text()}"
        + (f" ({reasons})" if reasons else "")
        + f"; {summary.failed_count} failures; listed {summary.listed_count} bucket objects "
        f"in {human_duration(summary.duration_ms)} "
        f"({human_rate(summary.listed_count, summary.duration_ms, 'objects')})"
    )
    text += "".join(f"\n  failed {key}: {message}" for key, message in failures)
    if summary.failed_count > len(failures):
        text += f"\n  … {summary.failed_count - len(failures)} more failures"
    return text


async def _check(client: Client, args: argparse.Namespace, out: Output) -> int:
    findings: list[dict[str, Any]] = []
    more = 0

    def on_event(event: pb.CheckEvent) -> None:
        nonlocal more
        if not event.HasField("finding"):
            return
        if len(findings) < MAX_REPORTED_FAILURES:
            findings.append(to_dict(event.finding))
        else:
            more += 1

    summary = await client.check(read_data=args.read_data, repair=args.repair, on_event=on_event)
    text = (
        f"checked {summary.blobs_checked} blobs of {summary.keys} keys"
        + (f", read {human_size(summary.bytes_read)}" if summary.read_data else "")
        + f": {summary.count_mismatches} wrong counts"
        + (f" ({summary.repaired} repaired)" if summary.repair else "")
        + f", {summary.missing} missing, {summary.corrupt} corrupt blobs"
        + ("; all good" if summary.ok else "")
    )
    text += "".join(f"\n  {f['kind']:<14} {f['key']}  {f.get('message', '')}" for f in findings)
    if more:
        text += f"\n  … {more} more findings"
    out.emit({"summary": to_dict(summary), "findings": findings}, text)
    if summary.missing or summary.corrupt:
        return EXIT_DATA_LOSS
    return EXIT_OK if summary.ok else EXIT_ERROR


async def _health(client: Client, args: argparse.Namespace, out: Output) -> int:
    if args.wait > 0:
        try:
            await client.wait_serving(within=args.wait)
        except TimeoutError as error:
            out.emit({"status": "NOT_SERVING"}, str(error))
            return EXIT_UNAVAILABLE
    # The checkpointd service's status: NOT_SERVING also when the serve loop's
    # captures keep failing (the server as a whole still answers).
    status = await client.health(pb.DESCRIPTOR.services_by_name["Checkpointd"].full_name)
    out.emit({"status": status}, status)
    return EXIT_OK if status == "SERVING" else EXIT_UNAVAILABLE


async def _info(client: Client, args: argparse.Namespace, out: Output) -> int:
    info = await client.server_info()
    caps = info.capabilities
    out.emit(
        to_dict(info),
        f"checkpointd {info.version} (protocol {info.protocol_version}); store {caps.store_backend}, "
        f"blobs {caps.blob_backend}; fork={caps.fork} diff={caps.diff} safe_sweep={caps.safe_sweep}"
        f"\n  auth {caps.auth_mode}{' (probes too)' if caps.auth_probes else ''}, "
        f"tls={caps.tls} mutual_tls={caps.mutual_tls}; messages up to "
        f"{human_size(caps.max_message_bytes)}, pages up to {caps.max_page_size}, leases "
        f"{human_duration(caps.lease_duration_ms)}"
        + (f"\n  watching {caps.watch_mode} ({caps.watch_detail})" if caps.watch_mode else ""),
    )
    return EXIT_OK


COMMANDS: dict[str, Callable[[Client, argparse.Namespace, Output], Any]] = {
    "capture": _capture,
    "restore": _restore,
    "undo": _restore,
    "list": _list,
    "threads": _threads,
    "show": _show,
    "ls": _ls,
    "cat": _cat,
    "diff": _diff,
    "fork": _fork,
    "prune": _prune,
    "delete-thread": _delete_thread,
    "sweep": _sweep,
    "check": _check,
    "health": _health,
    "info": _info,
}

__all__ = [
    "COMMANDS",
    "Target",
    "connect",
    "daemon_target",
    "no_daemon",
    "policy_of",
    "run_client",
    "secrets_of",
    "tls_files",
]
