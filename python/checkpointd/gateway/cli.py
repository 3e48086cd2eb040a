"""``checkpointd gateway`` and ``checkpointd token keygen|mint`` (parsers and runs)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path
from typing import Any

from ..errors import SandboxCheckpointError

EXIT_OK = 0
EXIT_BAD_INPUT = 2
EXIT_UNAVAILABLE = 3


def add_commands(commands: Any) -> None:
    """Add ``gateway`` and ``token`` to the CLI's subcommands."""
    _add_gateway(commands)
    _add_token(commands)


def _add_gateway(commands: Any) -> None:
    from .scopes import DEFAULT_AUDIENCE

    gateway = commands.add_parser(
        "gateway",
        help="serve the store and the bucket to sidecars holding scoped tokens",
        description="The only process that holds the store URL and the bucket credentials "
        "(docs/gateway.md). Sidecars run `checkpointd serve --gateway grpcs://host:port "
        "--gateway-token-file F`.",
    )
    gateway.add_argument(
        "--listen", required=True, help="host:port (or tcp://host:port) to listen on"
    )
    gateway.add_argument("--store", required=True, help="postgresql://… (or sqlite:///abs.db)")
    gateway.add_argument("--blobs", required=True, help="s3://bucket/prefix, file:///dir, …")
    gateway.add_argument(
        "--token-key-file",
        "--key-file",
        dest="token_key_file",
        required=True,
        help="the Ed25519 public key tokens are checked with (PEM; `checkpointd token keygen`)",
    )
    gateway.add_argument("--audience", default=DEFAULT_AUDIENCE, help="the tokens' aud claim")
    gateway.add_argument("--tls-cert", help="the server certificate chain (PEM)")
    gateway.add_argument("--tls-key", help="the server private key (PEM)")
    gateway.add_argument("--tls-client-ca", help="mutual TLS: sidecars' certificates' CA (PEM)")
    gateway.add_argument(
        "--insecure-plaintext",
        action="store_true",
        help="no TLS beyond loopback too (tokens would cross the network in clear)",
    )
    gateway.add_argument("--grace-period", default="10s", help="drain time on SIGTERM")
    gateway.add_argument(
        "--pool-max-size", type=int, default=None, help="PostgreSQL connections (default 5)"
    )
    gateway.add_argument(
        "--metrics-listen", help="host:port for Prometheus metrics (keep it local: 127.0.0.1:…)"
    )
    gateway.add_argument(
        "--sweep-every", help="run the blob sweep every PERIOD (6h); sidecars never sweep"
    )
    gateway.add_argument(
        "--sweep-older-than", default="24h", help="the sweep keeps blobs younger than this"
    )
    gateway.add_argument(
        "--sweep-repack-below",
        type=int,
        default=50,
        metavar="PERCENT",
        help="the sweep repacks packs whose live blobs fill less than PERCENT (0-100, 0 never)",
    )
    gateway.add_argument(
        "--max-packed-blob",
        default="16MiB",
        help="refuse an uploaded pack claiming a blob larger than this, decoded (16MiB: "
        "the largest pack threshold a sidecar may use)",
    )
    gateway.add_argument(
        "--max-pack-decoded",
        default="1GiB",
        help="refuse an uploaded pack whose blobs claim more than this in all, decoded",
    )
    gateway.add_argument("--log-level", default="INFO")


def _add_token(commands: Any) -> None:
    from .scopes import DEFAULT_AUDIENCE, DEFAULT_OPS, OPS

    token = commands.add_parser("token", help="make signing keys and mint scoped gateway tokens")
    actions = token.add_subparsers(dest="token_command", required=True, metavar="ACTION")
    keygen = actions.add_parser("keygen", help="write a new Ed25519 key pair (K and K.pub)")
    keygen.add_argument("--key-file", required=True, help="the private key file to create")
    mint = actions.add_parser("mint", help="print a token for one sandbox")
    mint.add_argument("--key-file", required=True, help="the Ed25519 private key (PEM)")
    mint.add_argument(
        "--thread", action="append", default=[], help="a thread the token covers (repeatable)"
    )
    mint.add_argument(
        "--thread-prefix",
        action="append",
        default=[],
        help="threads whose id starts with this (repeatable)",
    )
    mint.add_argument(
        "--all-threads",
        action="store_true",
        help="every thread of every tenant (an operator's token; never a sandbox's)",
    )
    mint.add_argument(
        "--ops",
        default=",".join(DEFAULT_OPS),
        help=f"comma-separated operations of {', '.join(OPS)} (default {','.join(DEFAULT_OPS)})",
    )
    mint.add_argument("--ttl", default="24h", help="lifetime (90s, 30m, 24h, 7d)")
    mint.add_argument("--audience", default=DEFAULT_AUDIENCE)
    mint.add_argument("--subject", help="who it is for (default: the first thread)")


def _fail(command: str, error: BaseException) -> int:
    print(f"checkpointd {command}: {error}", file=sys.stderr)
    return EXIT_BAD_INPUT


def run_token(args: argparse.Namespace) -> int:
    from ..service.config import parse_duration
    from . import tokens

    try:
        if args.token_command == "keygen":
            public = tokens.generate_key(Path(args.key_file))
            print(f"wrote {args.key_file} (private: orchestrator only) and {public} (gateways)")
            return EXIT_OK
        key = tokens.load_signing_key(Path(args.key_file))
        print(
            tokens.mint(
                key,
                tokens.TokenGrant(
                    threads=args.thread,
                    thread_prefixes=args.thread_prefix,
                    ops=args.ops.split(","),
                    ttl_s=parse_duration(args.ttl),
                    audience=args.audience,
                    subject=args.subject,
                    all_threads=args.all_threads,
                ),
            )
        )
        return EXIT_OK
    except SandboxCheckpointError as error:
        return _fail("token", error)


def run_gateway(args: argparse.Namespace) -> int:
    from ..malloc import return_large_buffers_to_the_os
    from ..service.config import parse_bytes, parse_duration
    from .server import GatewayConfig, run

    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )

    return_large_buffers_to_the_os()  # uploads stream MiB-sized chunks through threads

    def path(value: str | None) -> Path | None:
        return Path(value).absolute() if value else None

    try:
        config = GatewayConfig(
            listen=args.listen,
            store=args.store,
            blobs=args.blobs,
            token_key=Path(args.token_key_file).absolute(),
            audience=args.audience,
            tls_cert=path(args.tls_cert),
            tls_key=path(args.tls_key),
            tls_client_ca=path(args.tls_client_ca),
            insecure_plaintext=args.insecure_plaintext,
            grace_period=parse_duration(args.grace_period),
            pool_max_size=args.pool_max_size,
            metrics_listen=args.metrics_listen,
            sweep_every=parse_duration(args.sweep_every) if args.sweep_every else None,
            sweep_older_than=parse_duration(args.sweep_older_than),
            sweep_repack_below=args.sweep_repack_below,
            max_packed_blob=parse_bytes(args.max_packed_blob),
            max_pack_decoded=parse_bytes(args.max_pack_decoded),
        )
        config.check()
        return asyncio.run(run(config))
    except SandboxCheckpointError as error:
        print(f"checkpointd gateway: {error}", file=sys.stderr)
        from ..service.status import classify

        return EXIT_UNAVAILABLE if classify(error)[0].name == "UNAVAILABLE" else EXIT_BAD_INPUT
    except (OSError, RuntimeError) as error:
        logging.getLogger("checkpointd.gateway").error("cannot serve: %s", error)
        return EXIT_UNAVAILABLE
