"""Daemon configuration: flags over ``CHECKPOINTD_*`` environment over a TOML file.

Every setting has one name used in all three places: the flag ``--data-dir``, the
variable ``CHECKPOINTD_DATA_DIR`` and the TOML key ``data_dir`` (top level, or in
a ``[serve]`` table). The TOML file is named by ``--config`` or
``CHECKPOINTD_CONFIG``.

Defaults (the embedded setup): data dir ``~/.local/state/checkpointd``, store
``sqlite://<data_dir>/checkpoints.db``, blobs ``file://<data_dir>/blobs``
(``<data_dir>`` is absolute, so three slashes),
listening on the Unix socket ``<data_dir>/checkpointd.sock``. TCP
(``tcp://127.0.0.1:50051``) needs a bearer token (``token`` or ``token_file``) or
mutual TLS (``tls_client_ca``); the daemon refuses to start without one. TLS
(``tls_cert`` + ``tls_key``) may be combined with the token.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..chunks import ChunkSettings
from ..errors import SandboxCheckpointInvalidArgumentError
from ..journal import WATCH_MODES
from ..model import DEFAULT_STASH_KEEP, Policy
from ..statcache_paths import DEFAULT_DATA_DIR

ENV_PREFIX = "CHECKPOINTD_"

# name → (type, default); None defaults are derived in ``resolve``.
SETTINGS: dict[str, tuple[str, Any]] = {
    "workspace": ("path", "/workspace"),
    "data_dir": ("path", DEFAULT_DATA_DIR),
    "store": ("str", None),
    "blobs": ("str", None),
    "listen": ("str", None),
    "token": ("str", None),
    "token_file": ("path", None),
    "grace_period": ("duration", 10.0),
    "thread": ("str", None),
    "restore_on_start": ("bool", False),
    "capture_every": ("duration", None),
    "log_level": ("str", "INFO"),
    # The loop's own captures (and --restore-on-start): the policy and the names
    # of environment variables holding secrets. Lists: repeat the flag, a TOML
    # array, or a comma-separated variable (CHECKPOINTD_EXCLUDE=build/,*.log).
    "exclude": ("list", None),
    "include": ("list", None),
    "default_excludes": ("bool", None),
    "secret_env": ("list", None),
    # TLS on TCP: server certificate chain and key (PEM); with tls_client_ca the
    # daemon asks every client for a certificate signed by that CA (mutual TLS).
    "tls_cert": ("path", None),
    "tls_key": ("path", None),
    "tls_client_ca": ("path", None),
    # Require the bearer token for health and reflection too (default: open).
    "auth_probes": ("bool", False),
    # Gateway mode (docs/gateway.md): the store and the bucket are reached
    # through `checkpointd gateway` at grpcs://host:port[,host:port…] with the
    # scoped token in gateway_token_file; no store URL, no bucket credentials.
    "gateway": ("str", None),
    "gateway_token_file": ("path", None),
    "gateway_ca": ("path", None),
    "gateway_cert": ("path", None),
    "gateway_key": ("path", None),
    "gateway_server_name": ("str", None),
    # Blobs smaller than this go into pack objects (blobs/packs.py): 1MiB, 256KiB, bytes.
    "pack_threshold": ("bytes", "1MiB"),
    # Files above this are stored as content-defined chunks (docs/chunks.md);
    # 0 stores every file whole. Chunks average chunk_average (a power of two).
    "chunk_threshold": ("bytes", "1MiB"),
    "chunk_average": ("bytes", "64KiB"),
    # The stash entries each thread keeps (docs/restore-history.md), at least 1.
    "stash_keep": ("int", DEFAULT_STASH_KEEP),
    # The change journal (docs/design.md, "The change journal"): how to watch
    # the workspace (auto, fanotify, inotify, off), how often a verifying scan
    # checks it (0: never), and capture-on-change's quiet period.
    "watch": ("str", "auto"),
    "watch_verify_every": ("duration", 600.0),
    "capture_on_change": ("duration", None),
}

_BYTES = re.compile(r"^\s*(\d+)\s*(B|KiB|MiB|GiB)?\s*$")
_UNIT_BYTES = {None: 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def parse_bytes(text: str | int) -> int:
    """Bytes from ``"1MiB"``, ``"256KiB"``, ``"4096"`` or an int.

    Raises SandboxCheckpointInvalidArgumentError for anything else.
    """
    if isinstance(text, int) and not isinstance(text, bool) and text >= 0:
        return text
    match = _BYTES.match(str(text))
    if not match:
        raise SandboxCheckpointInvalidArgumentError(
            f"not a size: {text!r} (bytes, or a number with KiB, MiB or GiB: 256KiB, 1MiB)",
            details={"value": str(text)},
        )
    return int(match.group(1)) * _UNIT_BYTES[match.group(2)]


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(text: str | float | int) -> float:
    """Seconds from ``"60s"``, ``"5m"``, ``"250ms"``, ``"1h"``, ``"7d"`` or a plain number.

    Raises SandboxCheckpointInvalidArgumentError for anything else.
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return float(text)
    match = _DURATION.match(str(text))
    if not match:
        raise SandboxCheckpointInvalidArgumentError(
            f"not a duration: {text!r} (a number with ms, s, m, h or d: 250ms, 60s, 5m, 1h, 7d)",
            details={"value": str(text)},
        )
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def _parse_bool(text: str | bool) -> bool:
    if isinstance(text, bool):
        return text
    lowered = str(text).strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise SandboxCheckpointInvalidArgumentError(f"not a boolean: {text!r}")


def _parse_count(name: str, value: Any) -> int:
    """A whole number of at least 1 (``stash_keep``), else InvalidArgument naming it."""
    text = str(value).strip()
    if isinstance(value, bool) or not text.isdigit() or int(text) < 1:
        raise SandboxCheckpointInvalidArgumentError(
            f"--{name.replace('_', '-')} must be a whole number of at least 1, got {value!r}",
            details={"field": name},
        )
    return int(text)


def _convert(name: str, value: Any) -> Any:
    kind = SETTINGS[name][0]
    if value is None:
        return None
    if kind == "duration":
        return parse_duration(value)
    if kind == "bytes":
        return parse_bytes(value)
    if kind == "bool":
        return _parse_bool(value)
    if kind == "int":
        return _parse_count(name, value)
    if kind == "path":
        return Path(os.path.expanduser(str(value)))
    if kind == "list":
        items = value.split(",") if isinstance(value, str) else list(value)
        return tuple(str(item).strip() for item in items if str(item).strip())
    return str(value)


@dataclass(frozen=True)
class ServeConfig:
    workspace: Path
    data_dir: Path
    store: str
    blobs: str
    listen: str
    token: str | None
    grace_period: float
    thread: str | None
    restore_on_start: bool
    capture_every: float | None
    log_level: str
    # None: no policy setting was given (the loop then uses the head's recorded one).
    policy: Policy | None = None
    secret_env: tuple[str, ...] = ()
    # The values of the secret_env variables, read once at start; never shown.
    secrets: tuple[bytes, ...] = field(default=(), repr=False)
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    auth_probes: bool = False
    gateway: str | None = None
    gateway_token_file: Path | None = None
    gateway_ca: Path | None = None
    gateway_cert: Path | None = None
    gateway_key: Path | None = None
    gateway_server_name: str | None = None
    pack_threshold: int = 1 << 20
    chunk_threshold: int = 1 << 20
    chunk_average: int = 64 << 10
    stash_keep: int = DEFAULT_STASH_KEEP
    watch: str = "auto"
    watch_verify_every: float = 600.0
    capture_on_change: float | None = None

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    @property
    def mutual_tls(self) -> bool:
        return self.tls_client_ca is not None

    @property
    def auth_mode(self) -> str:
        """How TCP callers are authenticated: "unix-socket" (file mode),
        "bearer-token", "mutual-tls" or "mutual-tls+bearer-token"."""
        if not self.is_tcp:
            return "unix-socket"
        modes = (["mutual-tls"] if self.mutual_tls else []) + (
            ["bearer-token"] if self.token else []
        )
        return "+".join(modes)

    @property
    def socket_path(self) -> Path | None:
        """The Unix socket path when listening on one."""
        return socket_path_of(self.listen)

    @property
    def is_tcp(self) -> bool:
        return self.socket_path is None


def socket_path_of(address: str) -> Path | None:
    """The path of a ``unix:`` address, None for a TCP address."""
    if address.startswith("unix://"):
        return Path(address[len("unix://") :])
    if address.startswith("unix:"):
        return Path(address[len("unix:") :])
    return None


def grpc_address(address: str) -> str:
    """The address in grpc's syntax: ``unix:/abs/path`` or ``host:port``."""
    path = socket_path_of(address)
    if path is not None:
        return f"unix:{path}"
    return address.removeprefix("tcp://")


def _absolute(path: Path | None) -> Path | None:
    return None if path is None else Path(os.path.abspath(path))


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            document = tomllib.load(handle)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SandboxCheckpointInvalidArgumentError(
            f"cannot read config file {path}: {exc}", details={"path": str(path)}
        ) from exc
    table = document.get("serve", document)
    unknown = sorted(set(table) - set(SETTINGS) - {"serve"})
    if unknown:
        raise SandboxCheckpointInvalidArgumentError(
            f"unknown keys in {path}: {', '.join(unknown)}", details={"path": str(path)}
        )
    return {key: value for key, value in table.items() if key in SETTINGS}


def _policy(values: Mapping[str, Any]) -> Policy | None:
    """The loop's policy from the exclude/include/default_excludes settings (None
    when none is set). Raises SandboxCheckpointInvalidArgumentError for a bad
    pattern, so a typo stops the daemon at start rather than every capture."""
    if (
        values["exclude"] is None
        and values["include"] is None
        and values["default_excludes"] is None
    ):
        return None
    policy = Policy(
        exclude=values["exclude"] or (),
        include=values["include"] or (),
        default_excludes=True if values["default_excludes"] is None else values["default_excludes"],
    )
    from ..scanner import policy_matcher

    policy_matcher(policy)
    return policy


def _secrets(names: tuple[str, ...], environ: Mapping[str, str]) -> tuple[bytes, ...]:
    """The secrets named by ``secret_env``; a variable that is unset or empty, or
    a value shorter than 4 bytes, is refused (naming the variable, never the value)."""
    from ..scanner import check_secrets

    values = []
    for name in names:
        value = environ.get(name)
        if not value:
            raise SandboxCheckpointInvalidArgumentError(
                f"--secret-env {name}: the variable is not set", details={"variable": name}
            )
        values.append(value.encode())
    try:
        return check_secrets(values)
    except SandboxCheckpointInvalidArgumentError as error:
        index = error.details.get("secret_index", 0)
        raise SandboxCheckpointInvalidArgumentError(
            f"--secret-env {names[index]}: {error.message}", details={"variable": names[index]}
        ) from None


def resolve(
    flags: Mapping[str, Any],
    environ: Mapping[str, str] | None = None,
    config_file: str | os.PathLike[str] | None = None,
) -> ServeConfig:
    """Merge flags (None = not given), environment and the TOML file; derive defaults.

    Raises SandboxCheckpointInvalidArgumentError for bad values and for TCP
    without a token.
    """
    environ = os.environ if environ is None else environ
    values = _merged(flags, environ, config_file)
    token = _token(values)
    _take_gateway(values)
    config = _serve_config(values, token, environ)
    _check(config)
    return config


def _merged(
    flags: Mapping[str, Any],
    environ: Mapping[str, str],
    config_file: str | os.PathLike[str] | None,
) -> dict[str, Any]:
    """Every setting, converted: the flag, else the environment, else the file,
    else the default."""
    config_path = config_file or environ.get(ENV_PREFIX + "CONFIG")
    from_file = _read_toml(Path(config_path)) if config_path else {}
    values: dict[str, Any] = {}
    for name, (_, default) in SETTINGS.items():
        raw = flags.get(name)
        if raw is None:
            raw = environ.get(ENV_PREFIX + name.upper())
        if raw is None:
            raw = from_file.get(name)
        values[name] = _convert(name, raw) if raw is not None else _convert(name, default)
    return values


def _token(values: Mapping[str, Any]) -> str | None:
    """The bearer token: given, else read from the token file."""
    token: str | None = values["token"]
    if token is None and values["token_file"] is not None:
        try:
            token = Path(values["token_file"]).read_text().strip()
        except OSError as exc:
            raise SandboxCheckpointInvalidArgumentError(f"cannot read token file: {exc}") from exc
    return token


def _take_gateway(values: dict[str, Any]) -> None:
    """With ``gateway``, the gateway is the store and the bucket."""
    gateway = values["gateway"]
    if gateway is None:
        return
    if values["store"] or values["blobs"]:
        raise SandboxCheckpointInvalidArgumentError(
            "--gateway replaces --store and --blobs: the gateway holds them"
        )
    if values["gateway_token_file"] is None:
        raise SandboxCheckpointInvalidArgumentError("--gateway needs --gateway-token-file")
    values["store"] = values["blobs"] = gateway


def _serve_config(
    values: Mapping[str, Any], token: str | None, environ: Mapping[str, str]
) -> ServeConfig:
    """The settings as a ServeConfig, with the defaults derived from the data dir."""
    workspace = Path(os.path.abspath(values["workspace"]))
    data_dir = Path(os.path.abspath(values["data_dir"]))
    return ServeConfig(
        workspace=workspace,
        data_dir=data_dir,
        # data_dir is absolute, so these read sqlite:///abs/path.db and file:///abs/dir.
        store=values["store"] or f"sqlite://{data_dir / 'checkpoints.db'}",
        blobs=values["blobs"] or f"file://{data_dir / 'blobs'}",
        listen=values["listen"] or f"unix://{data_dir / 'checkpointd.sock'}",
        token=token or None,
        grace_period=values["grace_period"],
        thread=values["thread"],
        restore_on_start=values["restore_on_start"],
        capture_every=values["capture_every"],
        log_level=str(values["log_level"]).upper(),
        policy=_policy(values),
        secret_env=values["secret_env"] or (),
        secrets=_secrets(values["secret_env"] or (), environ),
        tls_cert=_absolute(values["tls_cert"]),
        tls_key=_absolute(values["tls_key"]),
        tls_client_ca=_absolute(values["tls_client_ca"]),
        auth_probes=values["auth_probes"],
        gateway=values["gateway"],
        gateway_token_file=_absolute(values["gateway_token_file"]),
        gateway_ca=_absolute(values["gateway_ca"]),
        gateway_cert=_absolute(values["gateway_cert"]),
        gateway_key=_absolute(values["gateway_key"]),
        gateway_server_name=values["gateway_server_name"],
        pack_threshold=values["pack_threshold"],
        chunk_threshold=values["chunk_threshold"],
        chunk_average=values["chunk_average"],
        stash_keep=values["stash_keep"],
        watch=str(values["watch"]).strip().lower(),
        watch_verify_every=values["watch_verify_every"],
        capture_on_change=values["capture_on_change"],
    )


def _check(config: ServeConfig) -> None:
    """The rules between settings. Raises SandboxCheckpointInvalidArgumentError."""
    from ..blobs.packs import PACK_TARGET_BYTES

    if not 1 <= config.pack_threshold <= PACK_TARGET_BYTES:
        raise SandboxCheckpointInvalidArgumentError(
            f"--pack-threshold must be between 1 byte and the pack size "
            f"({PACK_TARGET_BYTES // (1 << 20)}MiB), got {config.pack_threshold}"
        )
    _check_transport(config)
    if (config.restore_on_start or config.capture_every) and not config.thread:
        raise SandboxCheckpointInvalidArgumentError(
            "--restore-on-start and --capture-every need --thread"
        )
    if config.capture_every is not None and config.capture_every <= 0:
        raise SandboxCheckpointInvalidArgumentError("--capture-every must be positive")
    _check_watch(config)
    problem = chunk_settings(config)
    if isinstance(problem, str):
        raise SandboxCheckpointInvalidArgumentError(f"--{problem.replace('_', '-')}")


def _check_transport(config: ServeConfig) -> None:
    """TLS and authentication. Raises SandboxCheckpointInvalidArgumentError."""
    if (config.tls_cert is None) != (config.tls_key is None):
        raise SandboxCheckpointInvalidArgumentError("--tls-cert and --tls-key go together")
    if config.tls_client_ca is not None and config.tls_cert is None:
        raise SandboxCheckpointInvalidArgumentError(
            "--tls-client-ca needs --tls-cert and --tls-key"
        )
    if config.tls and not config.is_tcp:
        raise SandboxCheckpointInvalidArgumentError(
            "TLS is for TCP; a Unix socket is protected by its file mode",
            details={"listen": config.listen},
        )
    # Mutual TLS authenticates each client by its certificate; plain TLS only
    # protects the wire, so it still needs the token.
    if config.is_tcp and not config.token and not config.mutual_tls:
        raise SandboxCheckpointInvalidArgumentError(
            "refusing to listen on TCP without a bearer token (set --token, --token-file "
            "or CHECKPOINTD_TOKEN) or mutual TLS (--tls-client-ca), or listen on a Unix socket",
            details={"listen": config.listen},
        )


def chunk_settings(config: ServeConfig) -> ChunkSettings | None | str:
    """The chunking the daemon's captures and restores use (None: every file
    whole), or why the settings cannot be used (naming the setting)."""
    if config.chunk_threshold == 0:
        return None
    settings = ChunkSettings(config.chunk_threshold, config.chunk_average)
    return settings.problem() or settings


def _check_watch(config: ServeConfig) -> None:
    """The change journal's settings. Raises SandboxCheckpointInvalidArgumentError."""
    if config.watch not in WATCH_MODES:
        raise SandboxCheckpointInvalidArgumentError(
            f"--watch must be one of {', '.join(WATCH_MODES)}, got {config.watch!r}",
            details={"field": "watch"},
        )
    if config.watch_verify_every < 0:
        raise SandboxCheckpointInvalidArgumentError(
            "--watch-verify-every must be 0 (never) or a positive duration",
            details={"field": "watch_verify_every"},
        )
    if config.capture_on_change is not None:
        if not config.thread:
            raise SandboxCheckpointInvalidArgumentError(
                "--capture-on-change needs --thread", details={"field": "capture_on_change"}
            )
        if config.capture_on_change <= 0:
            raise SandboxCheckpointInvalidArgumentError(
                "--capture-on-change must be a positive duration (2s, 500ms)",
                details={"field": "capture_on_change"},
            )
