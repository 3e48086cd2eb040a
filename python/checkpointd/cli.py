"""The ``checkpointd`` command: ``serve`` runs the daemon; the other commands are its clients.

Kept light: the gRPC client and rich are imported when a command runs.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from . import _native
from .cli_output import (
    EXIT_BAD_INPUT,
    EXIT_ERROR,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    STATUS_EXIT_CODES,
    UsageError,
    exit_code_of,
    human_rate,
    human_size,
    progress_view,
)

EPILOG = """\
exit codes:
  0  success
  1  other error (INTERNAL, UNKNOWN...)
  2  bad input: a bad flag or argument, an ambiguous checkpoint reference,
     delete-thread without --yes, INVALID_ARGUMENT from the daemon, or a
     request over its message limit (MESSAGE_TOO_LARGE)
  3  not found: NOT_FOUND (no such checkpoint, file or artifact; no checkpoint
     a reference names), or a thread with no checkpoints (restore, list,
     diff --thread, prune, delete-thread)
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

where the client commands find the daemon: --address, else the socket in
--data-dir, else CHECKPOINTD_ADDRESS, else the socket in CHECKPOINTD_DATA_DIR,
else the socket in the default data dir, ~/.local/state/checkpointd (the data
dir `checkpointd serve` and `make run` use when given none).

checkpoint references (wherever a command takes a CHECKPOINT):
  ID            a full checkpoint id
  PART          a unique part of an id: its start, the start of its last
                group, or its end (at least 4 characters; ambiguous: exit 2,
                the candidates listed)
  THREAD:head   the thread's head; THREAD:head~N its N-th ancestor
  THREAD:LABEL  the thread's newest checkpoint with that label
A command that already names the thread (restore --checkpoint, fork, list
--before, diff --thread) takes the part after the colon alone: head~2, LABEL.
"""

REFERENCE_HELP = "an id, a part of one (4+ characters), THREAD:head~N or THREAD:LABEL"
CLIENT_EPILOG = EPILOG[EPILOG.index("where the client commands") :]

# Names other modules import from here.
__all__ = ["EPILOG", "build_parser", "exit_code_of", "human_rate", "human_size", "main"]
__all__ += ["progress_view"]

# ---------------------------------------------------------------- parser


# The default excludes as the help names them (".git, node_modules, .env*").
_DEFAULTS = ", ".join(_native.DEFAULT_EXCLUDES)
# What --exclude, --include and --no-default-excludes say for each command.
_POLICY_HELP = {
    "capture": (
        "gitignore pattern of paths to leave out (repeatable)",
        "capture only files matching (repeatable)",
        f"also capture {_DEFAULTS} (left out by default)",
    ),
    "restore": (
        "gitignore pattern of paths restore leaves alone, neither written nor deleted "
        "(repeatable; default: the policy the checkpoint was captured with)",
        "restore only files matching (repeatable)",
        f"also restore {_DEFAULTS}: write and delete there too (left alone by default)",
    ),
    "diff": (
        "gitignore pattern of paths to leave out of the comparison (repeatable; default: "
        "the policy the checkpoint was captured with)",
        "compare only files matching (repeatable)",
        f"also compare {_DEFAULTS} (left out by default)",
    ),
    "mcp": (
        "gitignore pattern of paths the agent's saves leave out (repeatable)",
        "the agent's saves capture only files matching (repeatable)",
        f"the agent's saves also capture {_DEFAULTS} (left out by default)",
    ),
}


def _add_policy_flags(parser: argparse.ArgumentParser, command: str) -> None:
    exclude, include, everything = _POLICY_HELP[command]
    parser.add_argument("--exclude", action="append", default=[], metavar="PATTERN", help=exclude)
    parser.add_argument("--include", action="append", default=[], metavar="PATTERN", help=include)
    parser.add_argument("--no-default-excludes", action="store_true", help=everything)
    parser.add_argument("--subdir", default="", help="a directory inside the daemon's workspace")


def _add_record_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--record",
        action="store_true",
        help="append the restored tree to the thread as its new head (default: the head "
        "stays; docs/restore-history.md)",
    )


def _add_secret_flag(parser: argparse.ArgumentParser, help_text: str) -> None:
    parser.add_argument("--secret-env", action="append", default=[], metavar="VAR", help=help_text)


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
    serve = _add_serve_command(commands)
    _add_serve_loop_flags(serve)
    _add_serve_network_flags(serve)
    from .gateway.cli import add_commands as add_gateway_commands

    add_gateway_commands(commands)
    _add_migrate_command(commands)
    _add_capture_and_restore(commands)
    _add_reading_commands(commands)
    _add_writing_commands(commands)
    _add_operator_commands(commands)
    return parser


def _add_serve_command(commands: Any) -> argparse.ArgumentParser:
    serve = commands.add_parser(
        "serve",
        help="run the daemon",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument("--config", help="TOML file (keys as the flags, with _)")
    serve.add_argument("--workspace", help="the one workspace root (default /workspace)")
    serve.add_argument(
        "--data-dir",
        help="stat cache, socket, embedded store (default ~/.local/state/checkpointd, where "
        "the client commands look too)",
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
    return serve


def _add_serve_loop_flags(serve: argparse.ArgumentParser) -> None:
    """The serve loop's own captures and restores (--thread, --capture-every...)."""
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
    serve.add_argument(
        "--capture-on-change",
        metavar="QUIET",
        help="capture the thread once the workspace changed and was quiet for QUIET (2s); "
        "--capture-every bounds the wait",
    )
    serve.add_argument(
        "--watch",
        metavar="MODE",
        help="how captures learn what changed: auto (default), fanotify, inotify or off",
    )
    serve.add_argument(
        "--watch-verify-every",
        metavar="PERIOD",
        help="a low-priority full scan checks the change journal every PERIOD "
        "(default 10m; 0 = never)",
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
        help=f"the loop also captures {_DEFAULTS}",
    )
    serve.add_argument(
        "--secret-env",
        action="append",
        default=None,
        metavar="VAR",
        help="zero the value of env VAR in the loop's captures (repeatable)",
    )


def _add_serve_network_flags(serve: argparse.ArgumentParser) -> None:
    """TLS, gateway mode, packs and the stash."""
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
    serve.add_argument(
        "--chunk-threshold",
        metavar="SIZE",
        help="files above SIZE are stored as content-defined chunks (default 1MiB; 0: whole)",
    )
    serve.add_argument(
        "--chunk-average",
        metavar="SIZE",
        help="the average chunk size, a power of two (default 64KiB)",
    )
    serve.add_argument(
        "--stash-keep",
        metavar="N",
        help="the newest N live trees restores replaced, kept per thread for undo (default 20)",
    )


def _client_command(
    commands: Any, name: str, help_text: str, *, as_json: bool = True
) -> argparse.ArgumentParser:
    """A client command with the flags every client command takes (where the
    daemon is, token, TLS, deadline, --json)."""
    sub = commands.add_parser(
        name,
        help=help_text,
        description=help_text[0].upper() + help_text[1:] + ".",
        epilog=CLIENT_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub.add_argument(
        "--address",
        default=None,
        help="daemon address: unix:///path.sock or tcp://host:port (CHECKPOINTD_ADDRESS; "
        "default: the socket in the data dir)",
    )
    sub.add_argument(
        "--data-dir",
        default=None,
        help="the daemon's data dir, to find its socket (CHECKPOINTD_DATA_DIR; default "
        "~/.local/state/checkpointd, the one serve and make run use)",
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
    if as_json:
        sub.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    return sub


def _add_capture_and_restore(commands: Any) -> None:
    capture = _client_command(commands, "capture", "capture the workspace into a new checkpoint")
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
    _add_policy_flags(capture, "capture")

    restore = _client_command(commands, "restore", "restore a checkpoint into the workspace")
    restore.add_argument("thread")
    restore.add_argument(
        "--checkpoint",
        metavar="CHECKPOINT",
        help="the checkpoint: an id, a part of one, head~N or a label (default: the head)",
    )
    restore.add_argument(
        "--dry-run",
        action="store_true",
        help="print the plan (files written, deleted, kept, live changes stashed; bytes to "
        "fetch); change nothing",
    )
    restore.add_argument(
        "--discard",
        action="store_true",
        help="lose the live changes instead of saving them to the thread's stash first",
    )
    _add_record_flag(restore)
    _add_secret_flag(restore, "write the value of env VAR back where capture zeroed it")
    _add_policy_flags(restore, "restore")

    undo = _client_command(
        commands, "undo", "undo the last restore: bring back the live tree it replaced"
    )
    undo.add_argument("thread")
    undo.add_argument("--dry-run", action="store_true", help="print the plan; change nothing")
    _add_record_flag(undo)
    _add_secret_flag(undo, "write the value of env VAR back where capture zeroed it")
    undo.add_argument("--subdir", default="", help="default: where the stash entry was taken")


def _add_reading_commands(commands: Any) -> None:
    listing = _client_command(commands, "list", "list a thread's checkpoints")
    listing.add_argument("thread")
    listing.add_argument("--newest-first", action="store_true", help="newest checkpoint first")
    listing.add_argument(
        "--stash", action="store_true", help="the thread's stash: the live trees restores replaced"
    )
    listing.add_argument("--limit", type=int, default=None, help="at most this many")
    listing.add_argument(
        "--before",
        metavar="CHECKPOINT",
        help="only those before this one (an id, a part of one, head~N or a label)",
    )

    _client_command(
        commands, "threads", "list the threads that hold checkpoints, with head and count"
    )

    show = _client_command(commands, "show", "show a checkpoint")
    show.add_argument("checkpoint", metavar="CHECKPOINT", help=REFERENCE_HELP)
    show.add_argument("--entries", action="store_true", help="list the manifest")
    show.add_argument("--conversation", action="store_true", help="include the conversation")

    ls = _client_command(commands, "ls", "list the files and directories of a checkpoint")
    ls.add_argument("checkpoint", metavar="CHECKPOINT", help=REFERENCE_HELP)
    ls.add_argument("path", nargs="?", default="", help="a directory or file in it (default: /)")
    ls.add_argument("-R", "--recursive", action="store_true", help="everything below PATH")

    cat = _client_command(commands, "cat", "write a file of a checkpoint to stdout", as_json=False)
    cat.add_argument("checkpoint", metavar="CHECKPOINT", help=REFERENCE_HELP)
    cat.add_argument("path", help="the file's path in the checkpoint")

    diff = _client_command(
        commands, "diff", "changes between two checkpoints, or a checkpoint and the live workspace"
    )
    diff.add_argument(
        "from_checkpoint", nargs="?", metavar="FROM", help="a checkpoint (default: --thread's head)"
    )
    diff.add_argument(
        "to_checkpoint", nargs="?", metavar="TO", help="a checkpoint (default: the live workspace)"
    )
    diff.add_argument(
        "--thread", help="start from this thread's head; FROM and TO may be head~N or labels of it"
    )
    _add_secret_flag(diff, "zero the value of env VAR in live files, as capture did")
    _add_policy_flags(diff, "diff")


def _add_writing_commands(commands: Any) -> None:
    fork = _client_command(commands, "fork", "start a new thread from a checkpoint")
    fork.add_argument("source_thread")
    fork.add_argument(
        "checkpoint",
        metavar="CHECKPOINT",
        help="a checkpoint of SOURCE_THREAD: an id, a part of one, head, head~N or a label",
    )
    fork.add_argument("destination_thread")

    prune = _client_command(commands, "prune", "delete a thread's old checkpoints")
    prune.add_argument("thread")
    prune.add_argument(
        "--keep", type=int, required=True, help="keep the head and its KEEP-1 nearest ancestors"
    )
    prune.add_argument("--dry-run", action="store_true")

    delete_thread = _client_command(
        commands,
        "delete-thread",
        "delete every checkpoint of a thread (blobs stay until a sweep deletes the unused ones)",
    )
    delete_thread.add_argument("thread")
    delete_thread.add_argument(
        "--yes", action="store_true", help="really delete (without it: say what would go, exit 2)"
    )

    sweep = _client_command(commands, "sweep", "delete blobs no checkpoint uses")
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


def _add_operator_commands(commands: Any) -> None:
    check = _client_command(
        commands,
        "check",
        "recompute blob counts from every manifest and confirm every used blob exists "
        "(exit 6 when blobs are missing or corrupt, 1 when counts are wrong)",
    )
    check.add_argument(
        "--read-data", action="store_true", help="also read every blob: size and BLAKE3"
    )
    check.add_argument("--repair", action="store_true", help="set the counts the manifests give")

    health = _client_command(commands, "health", "check that the daemon is SERVING")
    health.add_argument(
        "--wait", type=float, default=0.0, metavar="SECONDS", help="poll until SERVING"
    )

    _client_command(commands, "info", "server version and capabilities")

    mcp = _client_command(
        commands,
        "mcp",
        "the agent's own tools (save, list, fork, rewind, undo, artifacts) over MCP on stdio",
        as_json=False,
    )
    mcp.add_argument("--thread", required=True, help="the one thread the agent may use")
    # What the agent's saves capture is the orchestrator's choice, not the agent's.
    _add_policy_flags(mcp, "mcp")
    mcp.add_argument(
        "--secret-env",
        action="append",
        default=[],
        metavar="VAR",
        help="zero the value of env VAR in the agent's saves (repeatable)",
    )


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
    from .gateway.remote import open_gateway_stores
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
        return asyncio.run(run(config, open_remote=open_gateway_stores))
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
        return _mcp(args)
    try:
        from .cli_commands import run_client

        code = asyncio.run(run_client(args))
        sys.stdout.flush()  # inside the try: a closed pipe is found here too
        return code
    except BrokenPipeError:
        return _closed_pipe()
    except UsageError as error:
        print(f"checkpointd {args.command}: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as error:
        print(f"checkpointd {args.command}: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130


def _closed_pipe() -> int:
    """The reader of stdout went away (``checkpointd list t | head``): that is
    the reader's choice, not an error. Later writes (and the flush at exit)
    go to /dev/null, so nothing more is said."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_OK


def _mcp(args: argparse.Namespace) -> int:
    """``checkpointd mcp``: the agent's tools on stdio, talking to the daemon."""
    try:
        from .mcp import SaveSettings, serve_stdio
    except ModuleNotFoundError as error:
        if error.name is None or not error.name.startswith("mcp"):
            raise
        from importlib.metadata import requires

        wanted = next((r for r in requires("checkpointd") or [] if r.startswith("mcp")), "mcp")
        print(
            f"checkpointd mcp needs the MCP SDK, a dependency of checkpointd missing from this "
            f"environment: {sys.executable} -m pip install '{wanted}'",
            file=sys.stderr,
        )
        return EXIT_ERROR
    from .cli_commands import connect, policy_of, secrets_of, tls_files

    try:
        tls_files(args)  # unreadable TLS files are bad input now, not at the first tool call
        save = SaveSettings(
            policy=policy_of(args), secrets=secrets_of(args)[0], workspace_subdir=args.subdir
        )
    except UsageError as error:
        print(f"checkpointd mcp: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return serve_stdio(args.thread, save, lambda: connect(args))


if __name__ == "__main__":
    sys.exit(main())
