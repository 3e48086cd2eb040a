"""The ``checkpointd`` command: ``serve`` runs the daemon; the other commands are its clients.

Kept light: the gRPC client and rich are imported when a command runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_BAD_INPUT = 2
EXIT_NOT_FOUND = 3
EXIT_CONFLICT = 4
EXIT_PRECONDITION = 5
EXIT_DATA_LOSS = 6
EXIT_UNAVAILABLE = 7
EXIT_UNAUTHENTICATED = 8
EXIT_NO_SPACE = 9

EPILOG = """\
exit codes:
  0  success
  1  other error (INTERNAL, UNKNOWN...)
  2  bad input: a bad flag or argument, INVALID_ARGUMENT from the daemon, or a
     request over its message limit (MESSAGE_TOO_LARGE)
  3  not found: NOT_FOUND (no such checkpoint, file or artifact), or a thread
     with no checkpoints (restore, list, diff --thread, prune)
  4  conflict: ABORTED or ALREADY_EXISTS (another writer holds the thread, the
     head moved, the id exists) — retrying later may succeed
  5  failed precondition: FAILED_PRECONDITION (not the head, unsupported entry,
     fork destination not empty)
  6  data loss: DATA_LOSS (a blob is missing or corrupt)
  7  unavailable: the daemon cannot be reached, is not serving, or a store is down
  8  unauthenticated: missing or wrong bearer token
  9  no space: RESOURCE_EXHAUSTED (the filesystem holding the named path is full)

environment: CHECKPOINTD_ADDRESS, CHECKPOINTD_DATA_DIR, CHECKPOINTD_TOKEN and
CHECKPOINTD_TLS_CA / _CERT / _KEY for the client commands;
CHECKPOINTD_<SETTING> (e.g. CHECKPOINTD_DATA_DIR, CHECKPOINTD_STORE) and
CHECKPOINTD_CONFIG (a TOML file) for serve. Flags win over the environment, which
wins over the file.
"""

STATUS_EXIT_CODES = {
    "INVALID_ARGUMENT": EXIT_BAD_INPUT,
    "OUT_OF_RANGE": EXIT_BAD_INPUT,
    "NOT_FOUND": EXIT_NOT_FOUND,
    "ABORTED": EXIT_CONFLICT,
    "ALREADY_EXISTS": EXIT_CONFLICT,
    "FAILED_PRECONDITION": EXIT_PRECONDITION,
    "DATA_LOSS": EXIT_DATA_LOSS,
    "UNAVAILABLE": EXIT_UNAVAILABLE,
    "DEADLINE_EXCEEDED": EXIT_UNAVAILABLE,
    "UNAUTHENTICATED": EXIT_UNAUTHENTICATED,
    "PERMISSION_DENIED": EXIT_UNAUTHENTICATED,
    "RESOURCE_EXHAUSTED": EXIT_NO_SPACE,
}
# Reasons whose exit code is not their status code's: a request over the message
# limit is RESOURCE_EXHAUSTED like a full disk, but it is the caller's input.
REASON_EXIT_CODES = {"SANDBOX_SNAPSHOT_MESSAGE_TOO_LARGE": EXIT_BAD_INPUT}


def exit_code_of(code_name: str, reason: str) -> int:
    """The exit code for a failed call's status code name and ErrorInfo reason."""
    return REASON_EXIT_CODES.get(reason) or STATUS_EXIT_CODES.get(code_name, EXIT_ERROR)


class UsageError(Exception):
    """Bad command-line input found after argparse (exit code 2)."""


# ---------------------------------------------------------------- parser


def _add_policy_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="PATTERN",
        help="gitignore pattern to leave out (repeatable)",
    )
    parser.add_argument(
        "--include",
        action="append",
        default=[],
        metavar="PATTERN",
        help="only files matching (repeatable)",
    )
    parser.add_argument(
        "--no-default-excludes", action="store_true", help="also capture .git, node_modules, .env*"
    )
    parser.add_argument("--subdir", default="", help="a directory inside the daemon's workspace")


def _add_secret_flag(parser: argparse.ArgumentParser, help_text: str) -> None:
    parser.add_argument("--secret-env", action="append", default=[], metavar="VAR", help=help_text)


def _secrets(args: argparse.Namespace) -> tuple[list[bytes], list[str]]:
    """The --secret-env values and their variable names (the names travel, so a
    restore finds each secret by name whatever the order)."""
    values = []
    for name in args.secret_env:
        value = os.environ.get(name)
        if not value:
            raise UsageError(f"--secret-env {name}: the variable is not set")
        values.append(value.encode())
    return values, list(args.secret_env)


def _add_migrate_command(commands: Any) -> None:
    """``checkpointd migrate`` (``migrate.run``; it opens the store and the
    bucket itself, like ``serve``: an operator's job, safe while daemons run).
    Defined here, not in ``migrate``, so that building the parser for any
    command does not import the store and the pack writer."""
    migrate = commands.add_parser(
        "migrate",
        help="pack the small single-object blobs written before packs (optional, idempotent)",
    )
    migrate.add_argument(
        "--data-dir",
        default=None,
        help="the daemon's data dir: its embedded store and blobs (CHECKPOINTD_DATA_DIR)",
    )
    migrate.add_argument("--store", default=None, help="store URL (default: the data dir's)")
    migrate.add_argument("--blobs", default=None, help="blob store URL (default: the data dir's)")
    migrate.add_argument("--dry-run", action="store_true", help="report, write nothing")
    migrate.add_argument("--json", action="store_true", help="one JSON object a line")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="checkpointd",
        description="Checkpoint an AI agent sandbox's workspace and restore it anywhere.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from . import __version__

    parser.add_argument("--version", action="version", version=f"checkpointd {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser(
        "serve",
        help="run the daemon",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument("--config", help="TOML file (keys as the flags, with _)")
    serve.add_argument("--workspace", help="the one workspace root (default /workspace)")
    serve.add_argument(
        "--data-dir", help="stat cache, socket, embedded store (default ~/.local/state/checkpointd)"
    )
    serve.add_argument("--store", help="sqlite:///abs/path.db, postgresql://…, memory://")
    serve.add_argument(
        "--blobs", help="file:///abs/dir, s3://bucket/prefix, gs://…, az://…, memory://"
    )
    serve.add_argument(
        "--listen",
        help="unix:///path.sock (default <data-dir>/checkpointd.sock) or tcp://host:port",
    )
    serve.add_argument(
        "--token", help="bearer token every TCP call must carry (prefer CHECKPOINTD_TOKEN)"
    )
    serve.add_argument("--token-file", help="file holding the bearer token")
    serve.add_argument("--grace-period", help="drain time on SIGTERM (default 10s)")
    serve.add_argument("--thread", help="thread for --restore-on-start / --capture-every")
    serve.add_argument(
        "--restore-on-start",
        action="store_const",
        const=True,
        default=None,
        help="restore the thread's newest checkpoint before serving",
    )
    serve.add_argument(
        "--capture-every",
        metavar="PERIOD",
        help="capture the thread every PERIOD (60s, 5m); final capture on SIGTERM",
    )
    serve.add_argument("--log-level", help="DEBUG, INFO, WARNING (default INFO)")
    # The loop's own captures; None = not given, so the environment and TOML apply.
    serve.add_argument(
        "--exclude",
        action="append",
        default=None,
        metavar="PATTERN",
        help="gitignore pattern the loop's captures leave out (repeatable)",
    )
    serve.add_argument(
        "--include",
        action="append",
        default=None,
        metavar="PATTERN",
        help="the loop captures only files matching (repeatable)",
    )
    serve.add_argument(
        "--no-default-excludes",
        dest="default_excludes",
        action="store_const",
        const=False,
        default=None,
        help="the loop also captures .git, node_modules, .env*",
    )
    serve.add_argument(
        "--secret-env",
        action="append",
        default=None,
        metavar="VAR",
        help="zero the value of env VAR in the loop's captures (repeatable)",
    )
    serve.add_argument("--tls-cert", help="TCP over TLS: the server certificate chain (PEM)")
    serve.add_argument("--tls-key", help="TCP over TLS: the server private key (PEM)")
    serve.add_argument(
        "--tls-client-ca",
        help="mutual TLS: clients must present a certificate signed by this CA (PEM)",
    )
    serve.add_argument(
        "--auth-probes",
        action="store_const",
        const=True,
        default=None,
        help="require the bearer token for health and reflection too (default: open)",
    )

    serve.add_argument(
        "--gateway", help="gateway mode: grpcs://host:port[,host:port…] instead of --store/--blobs"
    )
    serve.add_argument("--gateway-token-file", help="gateway mode: the scoped token's file")
    serve.add_argument("--gateway-ca", help="gateway mode: CA of the gateway's certificate (PEM)")
    serve.add_argument("--gateway-cert", help="gateway mode, mutual TLS: client certificate")
    serve.add_argument("--gateway-key", help="gateway mode, mutual TLS: client key")
    serve.add_argument(
        "--gateway-server-name", help="gateway mode: the name the gateway's certificate holds"
    )
    serve.add_argument(
        "--pack-threshold",
        metavar="SIZE",
        help="blobs smaller than SIZE travel and rest in compressed pack objects (default 1MiB)",
    )
    from .gateway.cli import add_commands as add_gateway_commands

    add_gateway_commands(commands)
    _add_migrate_command(commands)

    def client(name: str, help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text)
        sub.add_argument(
            "--address",
            default=None,
            help="daemon address (CHECKPOINTD_ADDRESS; default unix://<data-dir>/checkpointd.sock)",
        )
        sub.add_argument(
            "--data-dir",
            default=None,
            help="the daemon's data dir, to find its socket (CHECKPOINTD_DATA_DIR)",
        )
        sub.add_argument("--token", default=None, help="bearer token for TCP (CHECKPOINTD_TOKEN)")
        sub.add_argument(
            "--tls-ca",
            default=None,
            help="TLS: verify the daemon with this CA (PEM; CHECKPOINTD_TLS_CA)",
        )
        sub.add_argument(
            "--tls-cert",
            default=None,
            help="mutual TLS: client certificate (PEM; CHECKPOINTD_TLS_CERT)",
        )
        sub.add_argument(
            "--tls-key", default=None, help="mutual TLS: client key (PEM; CHECKPOINTD_TLS_KEY)"
        )
        sub.add_argument("--timeout", type=float, default=None, help="deadline per call, seconds")
        sub.add_argument("--json", action="store_true", help="machine-readable output on stdout")
        return sub

    capture = client("capture", "capture the workspace into a new checkpoint")
    capture.add_argument("thread")
    capture.add_argument("--label")
    capture.add_argument(
        "--request-id", help="idempotency key: a retry returns the committed checkpoint"
    )
    _add_secret_flag(capture, "zero the value of env VAR in captured files (repeatable)")
    capture.add_argument(
        "--conversation", metavar="FILE", help="JSON file holding a list of messages"
    )
    capture.add_argument(
        "--artifact",
        action="append",
        default=[],
        metavar="FILE[:MIME]",
        help="upload a file as an artifact (repeatable)",
    )
    capture.add_argument(
        "--skip-if-unchanged",
        action="store_true",
        help="make no checkpoint when nothing changed since the head (prints the head)",
    )
    _add_policy_flags(capture)

    restore = client("restore", "restore a checkpoint into the workspace")
    restore.add_argument("thread")
    restore.add_argument("--checkpoint", help="checkpoint id (default: the head)")
    restore.add_argument(
        "--dry-run",
        action="store_true",
        help="print the plan (files written, deleted, kept; bytes to fetch); change nothing",
    )
    _add_secret_flag(restore, "write the value of env VAR back where capture zeroed it")
    _add_policy_flags(restore)

    listing = client("list", "list a thread's checkpoints")
    listing.add_argument("thread")
    listing.add_argument("--newest-first", action="store_true", help="newest checkpoint first")
    listing.add_argument("--limit", type=int, default=None, help="at most this many")
    listing.add_argument("--before", metavar="CHECKPOINT", help="only those before this one")

    client("threads", "list the threads that hold checkpoints, with head and count")

    show = client("show", "show a checkpoint")
    show.add_argument("checkpoint")
    show.add_argument("--entries", action="store_true", help="list the manifest")
    show.add_argument("--conversation", action="store_true", help="include the conversation")

    diff = client("diff", "changes between two checkpoints, or a checkpoint and the live workspace")
    diff.add_argument("from_checkpoint", nargs="?", help="default: the head of --thread")
    diff.add_argument("to_checkpoint", nargs="?", help="default: the live workspace")
    diff.add_argument("--thread", help="start from this thread's head")
    _add_secret_flag(diff, "zero the value of env VAR in live files, as capture did")
    _add_policy_flags(diff)

    fork = client("fork", "start a new thread from a checkpoint")
    fork.add_argument("source_thread")
    fork.add_argument("checkpoint")
    fork.add_argument("destination_thread")

    prune = client("prune", "delete a thread's old checkpoints")
    prune.add_argument("thread")
    prune.add_argument(
        "--keep", type=int, required=True, help="keep the head and its KEEP-1 nearest ancestors"
    )
    prune.add_argument("--dry-run", action="store_true")

    sweep = client("sweep", "delete blobs no checkpoint uses")
    sweep.add_argument(
        "--older-than",
        default=None,
        help="only blobs uploaded at least this long ago: 30m, 12h, 7d, 0 (default: the "
        "daemon's, 1h)",
    )
    sweep.add_argument("--dry-run", action="store_true")
    sweep.add_argument(
        "--repack-below",
        default=None,
        metavar="PERCENT",
        help="repack a pack whose live blobs fill less than PERCENT of it: 0-100, 0 never "
        "(default: 50)",
    )
    sweep.add_argument(
        "--keys",
        action="store_true",
        help="print every key as it is deleted or kept (with --json: one JSON object a line)",
    )

    check = client(
        "check",
        "recompute blob counts from every manifest and confirm every used blob exists "
        "(exit 6 when blobs are missing or corrupt, 1 when counts are wrong)",
    )
    check.add_argument(
        "--read-data", action="store_true", help="also read every blob: size and BLAKE3"
    )
    check.add_argument("--repair", action="store_true", help="set the counts the manifests give")

    health = client("health", "check that the daemon is SERVING")
    health.add_argument(
        "--wait", type=float, default=0.0, metavar="SECONDS", help="poll until SERVING"
    )

    client("info", "server version and capabilities")

    mcp = client("mcp", "the agent's own tools (save, list, fork, read artifact) over MCP on stdio")
    mcp.add_argument("--thread", required=True, help="the one thread the agent may use")
    # What the agent's saves capture is the orchestrator's choice, not the agent's.
    _add_policy_flags(mcp)
    mcp.add_argument(
        "--secret-env",
        action="append",
        default=[],
        metavar="VAR",
        help="zero the value of env VAR in the agent's saves (repeatable)",
    )
    return parser


# ---------------------------------------------------------------- output


class Output:
    """Human text (with a progress bar on a terminal) or one JSON document."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self._progress: Any = None
        self._task: Any = None

    def progress_callback(self) -> Callable[[Any], None] | None:
        if self.as_json or not sys.stderr.isatty():
            return None
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        # On stderr, so stdout stays clean for the result (and for pipes).
        self._progress = Progress(
            TextColumn("{task.description:<8}"),
            BarColumn(),
            TextColumn("{task.fields[counts]}"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        self._progress.start()
        self._task = self._progress.add_task("start", total=None, counts="")
        phase_started: dict[str, float] = {}

        def on_event(event: Any) -> None:
            if not event.HasField("progress"):
                return
            p = event.progress
            started = phase_started.setdefault(p.phase, time.monotonic())
            elapsed_ms = int((time.monotonic() - started) * 1000)
            done, total, counts = progress_view(p, elapsed_ms)
            self._progress.update(
                self._task,
                description=p.phase,
                completed=done,
                total=total or None,
                counts=counts,
            )

        return on_event

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def emit(self, data: Any, text: str) -> None:
        self.close()
        print(json.dumps(data, indent=2, sort_keys=True) if self.as_json else text)


# Phases whose bar moves with bytes (their work is bytes moved); the others
# (scan, pin, apply, record) count files.
_BYTE_PHASES = ("upload", "fetch")


def progress_view(p: Any, elapsed_ms: int) -> tuple[int, int, str]:
    """(done, total, text) of a progress bar for one Progress event: a file
    count in scan and apply (bytes in upload and fetch), the counts in words
    with human sizes, and the phase's rate so far."""
    by_bytes = p.phase in _BYTE_PHASES and p.bytes_total > 0
    done, total = (p.bytes_done, p.bytes_total) if by_bytes else (p.files_done, p.files_total)
    counts = f"{p.files_done}" + (f"/{p.files_total}" if p.files_total else "") + " files"
    if p.files_hashed:
        counts += f" ({p.files_hashed} hashed)"
    if p.bytes_done or p.bytes_total:
        counts += f", {human_size(p.bytes_done)}"
        if p.bytes_total:
            counts += f"/{human_size(p.bytes_total)}"
    if elapsed_ms > 0 and (p.bytes_done or p.files_done):
        counts += ", " + (
            human_rate(p.bytes_done, elapsed_ms)
            if p.bytes_done
            else human_rate(p.files_done, elapsed_ms, "files")
        )
    return done, total, counts


def _to_dict(message: Any) -> dict[str, Any]:
    """A message as JSON-ready data for ``--json``: field names as in the proto,
    numbers as JSON numbers (protobuf's JSON mapping would quote every 64-bit
    int), enums by their short lower-case name (``file``, ``mode_changed``),
    bytes as base64; unset optional fields are left out, other fields always
    printed."""
    from google.protobuf.descriptor import FieldDescriptor

    def enum_name(field: Any, number: int) -> str:
        value = field.enum_type.values_by_number.get(number)
        if value is None:
            return str(number)
        prefix = "".join(
            f"_{c}" if c.isupper() and i else c for i, c in enumerate(field.enum_type.name)
        ).upper()
        return value.name.removeprefix(prefix + "_").lower()

    def scalar(field: Any, value: Any) -> Any:
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            return _to_dict(value)
        if field.type == FieldDescriptor.TYPE_ENUM:
            return enum_name(field, value)
        if field.type == FieldDescriptor.TYPE_BYTES:
            import base64

            return base64.b64encode(value).decode()
        return value

    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            out[field.name] = {str(k): scalar(value_field, v) for k, v in value.items()}
        elif field.is_repeated:
            out[field.name] = [scalar(field, item) for item in value]
        elif field.has_presence and not message.HasField(field.name):
            continue
        else:
            out[field.name] = scalar(field, value)
    return out


_JSON_SPACE = " \t\n\r"


def json_list_items(text: str, source: str) -> list[str]:
    """The text of each element of the JSON list ``text``, exactly as written
    (the daemon stores each message byte for byte: ``1e3`` stays ``1e3``).
    UsageError naming ``source`` unless ``text`` is one JSON list."""
    try:
        value = json.loads(text)
    except ValueError as error:
        raise UsageError(f"{source}: not JSON: {error}") from None
    if not isinstance(value, list):
        raise UsageError(f"{source} must hold a JSON list of messages")
    decoder = json.JSONDecoder()

    def skip_space(at: int) -> int:
        while at < len(text) and text[at] in _JSON_SPACE:
            at += 1
        return at

    at = skip_space(0) + 1  # past "["
    items: list[str] = []
    while len(items) < len(value):
        start = skip_space(at)
        _, end = decoder.raw_decode(text, start)
        items.append(text[start:end])
        at = skip_space(end) + 1  # past "," (or the closing "]")
    return items


def human_size(count: int) -> str:
    """Bytes for people: 0 B, 512 B, 1.5 KiB, 12.0 MiB, 3.2 GiB."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def human_rate(amount: int, ms: int, unit: str = "B") -> str:
    """A rate for people: 12.0 MiB/s for bytes (unit "B"), 1,234 files/s else."""
    per_second = amount * 1000 / max(ms, 1)
    if unit == "B":
        return f"{human_size(int(per_second))}/s"
    return f"{per_second:,.0f} {unit}/s"


def human_duration(ms: int) -> str:
    """250 ms, 1.5 s, 2m05s."""
    if ms < 1000:
        return f"{ms} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    minutes, seconds = divmod(ms // 1000, 60)
    return f"{minutes}m{seconds:02d}s"


def human_time(ms: int) -> str:
    """A created_at (ms since the epoch) as local ISO time to the second."""
    import datetime as dt

    return dt.datetime.fromtimestamp(ms / 1000).isoformat(timespec="seconds")


def _summary_line(s: Any) -> str:
    label = f"  {s.label}" if s.HasField("label") else ""
    forked = (
        f"  (forked from {s.forked_from_thread_id}/{s.forked_from_checkpoint_id})"
        if s.HasField("forked_from_checkpoint_id")
        else ""
    )
    return (
        f"{s.id}  {s.reason:<9}  {s.file_count:>6} files  {human_size(s.total_bytes):>10}  "
        f"{human_time(s.created_at)}{label}{forked}"
    )


def _taken_lines(s: Any) -> list[str]:
    """How a checkpoint was taken: its recorded policy and sub-root."""
    if s.HasField("policy"):
        p = s.policy
        policy = (
            f"exclude={list(p.exclude)} include={list(p.include)} "
            f"default_excludes={'true' if p.default_excludes else 'false'}"
        )
    else:
        policy = "not recorded (the default policy applies)"
    return [
        f"  policy: {policy}",
        f"  workspace_subdir: {s.workspace_subdir or '(whole workspace)'}",
    ]


# ---------------------------------------------------------------- commands


def _policy(args: argparse.Namespace) -> Any:
    from .v1 import checkpointd_pb2 as pb

    if not (args.exclude or args.include or args.no_default_excludes):
        return None
    return pb.Policy(
        exclude=args.exclude, include=args.include, default_excludes=not args.no_default_excludes
    )


def _default_address(data_dir: str | None) -> str:
    """--data-dir's socket, else CHECKPOINTD_ADDRESS, else the default data dir's."""
    from .service.config import resolve
    from .statcache_paths import DEFAULT_DATA_DIR

    address = os.environ.get("CHECKPOINTD_ADDRESS")
    if address and data_dir is None:
        return address
    data_dir = data_dir or os.environ.get("CHECKPOINTD_DATA_DIR", DEFAULT_DATA_DIR)
    return resolve({"data_dir": data_dir, "listen": None}, environ={}).listen


def _tls_files(args: argparse.Namespace) -> dict[str, bytes | None]:
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


async def _run_client(args: argparse.Namespace) -> int:
    from .service.client import Client, RpcError

    output = Output(args.json)
    token = args.token or os.environ.get("CHECKPOINTD_TOKEN")
    address = args.address or _default_address(args.data_dir)
    tls = _tls_files(args)
    try:
        async with Client(
            address,
            token=token,
            timeout=args.timeout,
            tls_ca=tls["tls_ca"],
            tls_cert=tls["tls_cert"],
            tls_key=tls["tls_key"],
        ) as client:
            return await COMMANDS[args.command](client, args, output)
    except RpcError as error:
        output.close()
        if args.json:
            print(
                json.dumps(
                    {
                        "error": {
                            "code": error.code.name,
                            "reason": error.reason,
                            "message": error.message,
                            "metadata": error.metadata,
                        }
                    }
                )
            )
        else:
            print(f"checkpointd {args.command}: {error}", file=sys.stderr)
            for key, value in error.metadata.items():
                print(f"  {key}: {value}", file=sys.stderr)
        return exit_code_of(error.code.name, error.reason)
    finally:
        output.close()


async def _capture(client: Any, args: argparse.Namespace, out: Output) -> int:
    secrets, secret_names = _secrets(args)
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
        policy=_policy(args),
        secrets=secrets,
        conversation=conversation,
        artifacts=artifacts,
        workspace_subdir=args.subdir,
        request_id=args.request_id,
        skip_if_unchanged=args.skip_if_unchanged,
        on_event=out.progress_callback(),
        secret_names=secret_names,
    )
    s, st = done.checkpoint, done.stats
    if done.unchanged:
        text = f"unchanged: the head {s.id} already holds this ({s.file_count} files)"
    else:
        text = (
            f"captured {s.id} ({s.file_count} files, {human_size(s.total_bytes)}; hashed "
            f"{st.files_hashed} ({human_size(st.bytes_hashed)}), reused {st.files_reused}, "
            f"uploaded {st.blobs_uploaded} blobs ({human_size(st.bytes_uploaded)}) in "
            f"{human_duration(st.duration_ms)}, {human_rate(s.total_bytes, st.duration_ms)})"
            + (" [replayed]" if done.replayed else "")
        )
    out.emit(_to_dict(done), text)
    return EXIT_OK


async def _restore(client: Any, args: argparse.Namespace, out: Output) -> int:
    written: list[str] = []
    deleted: list[str] = []
    progress = out.progress_callback()

    def on_event(event: Any) -> None:
        if event.HasField("plan_paths"):
            written.extend(event.plan_paths.written)
            deleted.extend(event.plan_paths.deleted)
        elif progress is not None:
            progress(event)

    secrets, secret_names = _secrets(args)
    done = await client.restore(
        args.thread,
        checkpoint_id=args.checkpoint,
        policy=_policy(args),
        workspace_subdir=args.subdir,
        dry_run=args.dry_run,
        on_event=on_event,
        secrets=secrets,
        secret_names=secret_names,
    )
    if not done.HasField("checkpoint"):
        return _no_such_thread(out, args.thread, _to_dict(done))
    data = _to_dict(done)
    if args.dry_run:
        plan = done.plan
        data["written"], data["deleted"] = written, deleted
        lines = [
            f"restoring {done.checkpoint.id} would write {plan.files_written} files, delete "
            f"{plan.paths_deleted} paths, keep {plan.files_kept} files, create "
            f"{plan.dirs_created} directories; fetch {plan.blobs_to_fetch} blobs "
            f"({human_size(plan.bytes_to_fetch)})"
        ]
        lines += [f"  write  {path}" for path in written]
        lines += [f"  delete {path}" for path in deleted]
        out.emit(data, "\n".join(lines))
        return EXIT_OK
    text = (
        f"restored {done.checkpoint.id} ({done.checkpoint.file_count} files, "
        f"{human_size(done.checkpoint.total_bytes)}) in {human_duration(done.duration_ms)}, "
        f"{human_rate(done.checkpoint.total_bytes, done.duration_ms)}"
    )
    if done.unfilled_secret_paths:
        text += "\nzeros where secrets were (restore with --secret-env to fill them):" + "".join(
            f"\n  {path}" for path in done.unfilled_secret_paths
        )
        more = done.unfilled_secret_count - len(done.unfilled_secret_paths)
        if more > 0:
            text += f"\n  … {more} more"
    out.emit(data, text)
    return EXIT_OK


def _no_such_thread(out: Output, thread: str, data: dict[str, Any] | None = None) -> int:
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


async def _list(client: Any, args: argparse.Namespace, out: Output) -> int:
    summaries = await client.list_checkpoints(
        args.thread, newest_first=args.newest_first, before=args.before, limit=args.limit
    )
    head = await client.get_head(args.thread)
    if not summaries and head is None and args.before is None:
        return _no_such_thread(out, args.thread, {"head": None, "checkpoints": []})
    lines = [("* " if s.id == head else "  ") + _summary_line(s) for s in summaries]
    out.emit(
        {"head": head, "checkpoints": [_to_dict(s) for s in summaries]},
        "\n".join(lines) if lines else f"no checkpoints of thread {args.thread} match",
    )
    return EXIT_OK


async def _threads(client: Any, args: argparse.Namespace, out: Output) -> int:
    threads = [thread async for thread in client.list_threads()]
    lines = [
        f"{t.thread_id}  {t.checkpoint_count:>6} checkpoints  head "
        f"{t.head_checkpoint_id if t.HasField('head_checkpoint_id') else '(none)'}  newest "
        f"{human_time(t.newest_created_at)}"
        for t in threads
    ]
    out.emit(
        {"threads": [_to_dict(t) for t in threads]},
        "\n".join(lines) if lines else "no threads",
    )
    return EXIT_OK


async def _show(client: Any, args: argparse.Namespace, out: Output) -> int:
    response = await client.get_checkpoint(args.checkpoint, include_conversation=args.conversation)
    data = _to_dict(response)
    lines = [_summary_line(response.checkpoint), *_taken_lines(response.checkpoint)]
    if args.entries:
        entries = await client.list_entries(args.checkpoint)
        data["entries"] = [_to_dict(e) for e in entries]
        from .v1 import checkpointd_pb2 as pb

        for e in entries:
            kind = pb.EntryKind.Name(e.kind).removeprefix("ENTRY_KIND_").lower()
            extra = f" -> {e.target}" if e.target else f" {e.size}"
            lines.append(f"  {kind:<7} {e.mode:04o} {e.path}{extra}")
    for artifact in response.artifacts:
        lines.append(
            f"  artifact {artifact.name} ({artifact.mime_type}, {human_size(artifact.size)}) "
            f"{artifact.blob_key}"
        )
    for message in response.conversation:
        lines.append(f"  message {message}")
    out.emit(data, "\n".join(lines))
    return EXIT_OK


async def _diff(client: Any, args: argparse.Namespace, out: Output) -> int:
    from .v1 import checkpointd_pb2 as pb

    start = args.from_checkpoint
    if start is None:
        if not args.thread:
            raise UsageError("give a checkpoint id or --thread")
        start = await client.get_head(args.thread)
        if start is None:
            return _no_such_thread(out, args.thread, {"changes": []})
    secrets, secret_names = _secrets(args)
    changes = await client.diff(
        start,
        args.to_checkpoint,
        policy=_policy(args),
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
        {"changes": [_to_dict(c) for c in changes]}, "\n".join(lines) if lines else "no changes"
    )
    return EXIT_OK


async def _fork(client: Any, args: argparse.Namespace, out: Output) -> int:
    summary = await client.fork(args.source_thread, args.checkpoint, args.destination_thread)
    out.emit(
        _to_dict(summary),
        f"forked {args.checkpoint} into thread {args.destination_thread} as {summary.id}",
    )
    return EXIT_OK


async def _prune(client: Any, args: argparse.Namespace, out: Output) -> int:
    response = await client.prune_response(args.thread, args.keep, dry_run=args.dry_run)
    deleted = list(response.deleted_checkpoint_ids)
    if not deleted and await client.get_head(args.thread) is None:
        if not await client.list_checkpoints(args.thread, limit=1):
            return _no_such_thread(out, args.thread, {"deleted": [], "dry_run": args.dry_run})
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


# Failures printed (human) or put in the JSON document; the summary counts all.
MAX_REPORTED_FAILURES = 100


async def _sweep(client: Any, args: argparse.Namespace, out: Output) -> int:
    older_than_ms = None if args.older_than is None else _parse_ms(args.older_than)
    from .service.client import RpcError

    failures: list[tuple[str, str]] = []
    deleted = 0

    def on_batch(batch: Any) -> None:
        nonlocal deleted
        deleted += len(batch.deleted)
        # Keys stream through: a sweep of millions never gathers them here.
        for failure in batch.failures:
            if len(failures) < MAX_REPORTED_FAILURES:
                failures.append((failure.key, failure.message))
        if not args.keys:
            return
        rows = [("deleted", key, "") for key in batch.deleted]
        rows += [("kept", k.key, k.reason) for k in batch.kept]
        rows += [("failed", f.key, f.message) for f in batch.failures]
        for kind, key, why in rows:
            if args.json:
                print(json.dumps({kind: key, **({"why": why} if why else {})}))
            else:
                print(f"{kind:<7} {key}" + (f"  ({why})" if why else ""))

    try:
        summary = await client.sweep(
            older_than_ms,
            dry_run=args.dry_run,
            repack_below_percent=_parse_percent(args.repack_below),
            on_batch=on_batch,
        )
    except RpcError as error:
        # What the stream already reported as deleted is gone: say so with the error.
        error.metadata["deleted_before_failure"] = str(deleted)
        raise
    verb = "would delete" if args.dry_run else "deleted"
    reasons = ", ".join(f"{r}: {n}" for r, n in sorted(summary.kept_by_reason.items()))
    text = (
        f"{verb} {summary.deleted_count} blobs, kept {summary.kept_count}"
        + (f" ({reasons})" if reasons else "")
        + f", {summary.failed_count} failures; listed {summary.listed_count} in "
        f"{human_duration(summary.duration_ms)} "
        f"({human_rate(summary.listed_count, summary.duration_ms, 'keys')})"
    )
    text += "".join(f"\n  failed {key}: {message}" for key, message in failures)
    if summary.failed_count > len(failures):
        text += f"\n  … {summary.failed_count - len(failures)} more failures"
    data = {
        "summary": _to_dict(summary),
        "failures": [{"key": key, "message": message} for key, message in failures],
    }
    if args.keys and args.json:
        print(json.dumps(data))  # the last of the JSON lines
    else:
        out.emit(data, text)
    return EXIT_OK if not summary.failed_count else EXIT_ERROR


async def _check(client: Any, args: argparse.Namespace, out: Output) -> int:
    findings: list[dict[str, Any]] = []
    more = 0

    def on_event(event: Any) -> None:
        nonlocal more
        if not event.HasField("finding"):
            return
        if len(findings) < MAX_REPORTED_FAILURES:
            findings.append(_to_dict(event.finding))
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
    out.emit({"summary": _to_dict(summary), "findings": findings}, text)
    if summary.missing or summary.corrupt:
        return EXIT_DATA_LOSS
    return EXIT_OK if summary.ok else EXIT_ERROR


async def _health(client: Any, args: argparse.Namespace, out: Output) -> int:
    if args.wait > 0:
        try:
            await client.wait_serving(within=args.wait)
        except TimeoutError as error:
            out.emit({"status": "NOT_SERVING"}, str(error))
            return EXIT_UNAVAILABLE
    from .v1 import checkpointd_pb2 as pb

    # The checkpointd service's status: NOT_SERVING also when the serve loop's
    # captures keep failing (the server as a whole still answers).
    status = await client.health(pb.DESCRIPTOR.services_by_name["Checkpointd"].full_name)
    out.emit({"status": status}, status)
    return EXIT_OK if status == "SERVING" else EXIT_UNAVAILABLE


async def _info(client: Any, args: argparse.Namespace, out: Output) -> int:
    info = await client.server_info()
    caps = info.capabilities
    out.emit(
        _to_dict(info),
        f"checkpointd {info.version} (protocol {info.protocol_version}); store {caps.store_backend}, "
        f"blobs {caps.blob_backend}; fork={caps.fork} diff={caps.diff} safe_sweep={caps.safe_sweep}"
        f"\n  auth {caps.auth_mode}{' (probes too)' if caps.auth_probes else ''}, "
        f"tls={caps.tls} mutual_tls={caps.mutual_tls}; messages up to "
        f"{human_size(caps.max_message_bytes)}, pages up to {caps.max_page_size}, leases "
        f"{human_duration(caps.lease_duration_ms)}",
    )
    return EXIT_OK


COMMANDS: dict[str, Callable[[Any, argparse.Namespace, Output], Any]] = {
    "capture": _capture,
    "restore": _restore,
    "list": _list,
    "threads": _threads,
    "show": _show,
    "diff": _diff,
    "fork": _fork,
    "prune": _prune,
    "sweep": _sweep,
    "check": _check,
    "health": _health,
    "info": _info,
}


# glibc's mallopt parameter, and the size from which allocations get their own
# mapping (glibc's initial default, which it otherwise raises as it goes).
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_BYTES = 256 << 10


def _return_large_buffers_to_the_os() -> None:
    """Pin glibc's mmap threshold: streaming a large file moves MiB-sized
    buffers through several threads (our reader, the bucket client), and glibc
    would raise the threshold to their size and keep the freed buffers in its
    heaps, so a long-lived daemon's RSS would carry them. Fixed, each such
    buffer is its own mapping, unmapped when freed. No-op without glibc."""
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES)
    except (OSError, AttributeError):
        pass


def _serve(args: argparse.Namespace) -> int:
    from .errors import SandboxCheckpointError
    from .service import config as service_config
    from .service.server import run

    flags = {name: getattr(args, name, None) for name in service_config.SETTINGS}
    try:
        config = service_config.resolve(flags, config_file=args.config)
    except SandboxCheckpointError as error:
        print(f"checkpointd serve: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    logging.basicConfig(
        level=getattr(logging, config.log_level, logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    _return_large_buffers_to_the_os()
    try:
        return asyncio.run(run(config))
    except SandboxCheckpointError as error:
        print(f"checkpointd serve: {error}", file=sys.stderr)
        from .service.status import classify

        code = classify(error)[0]
        return STATUS_EXIT_CODES.get(code.name, EXIT_ERROR)
    except (OSError, RuntimeError) as error:
        # Cannot bind, cannot reach the database or bucket...: one line, not a traceback.
        logging.getLogger("checkpointd.server").error("cannot serve: %s", error)
        return EXIT_UNAVAILABLE


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``checkpointd`` script; returns the exit code."""
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    if args.command in ("gateway", "token"):
        from .gateway import cli as gateway_cli

        return (
            gateway_cli.run_gateway(args)
            if args.command == "gateway"
            else gateway_cli.run_token(args)
        )
    if args.command == "migrate":
        from .migrate import run as run_migrate

        return run_migrate(args)
    if args.command == "mcp":
        try:
            from .mcp import SaveSettings, serve_stdio
        except ModuleNotFoundError as error:
            if error.name is None or not error.name.startswith("mcp"):
                raise
            print(
                "checkpointd mcp needs the MCP SDK: pip install 'checkpointd[mcp]'", file=sys.stderr
            )
            return EXIT_BAD_INPUT

        from .service.client import Client

        address = args.address or _default_address(args.data_dir)
        token = args.token or os.environ.get("CHECKPOINTD_TOKEN")
        try:
            tls = _tls_files(args)
            save = SaveSettings(
                policy=_policy(args),
                secrets=_secrets(args)[0],
                workspace_subdir=args.subdir,
            )
        except UsageError as error:
            print(f"checkpointd mcp: {error}", file=sys.stderr)
            return EXIT_BAD_INPUT
        return serve_stdio(
            args.thread,
            save,
            lambda: Client(
                address,
                token=token,
                timeout=args.timeout,
                tls_ca=tls["tls_ca"],
                tls_cert=tls["tls_cert"],
                tls_key=tls["tls_key"],
            ),
        )
    try:
        return asyncio.run(_run_client(args))
    except UsageError as error:
        print(f"checkpointd {args.command}: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as error:
        print(f"checkpointd {args.command}: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
