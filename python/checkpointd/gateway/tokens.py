"""Scoped tokens: what one sandbox's sidecar may do through the gateway.

The orchestrator mints one token per sandbox (``checkpointd token mint``); the
gateway checks it on every call. A token is a JWT (PyJWT) signed with Ed25519
(``EdDSA``): the orchestrator holds the private key, the gateway needs only the
public key, so a leaked gateway config cannot mint tokens. Claims:

* ``aud`` — the gateway audience (default ``checkpointd-gateway``): a token
  minted for another service is refused;
* ``exp``, ``iat``, ``nbf`` — required; an expired token is refused (60 s leeway
  for clock skew between the orchestrator and the gateways);
* ``sub`` — who it is for (the sandbox), logged; ``jti`` — a random id;
* ``threads`` — exact thread ids; ``thread_prefixes`` — thread-id prefixes (a
  sandbox that forks makes new threads under its prefix). At least one of the two;
* ``ops`` — the operations granted (``OPS``): ``capture`` (append, leases, pins,
  blob uploads), ``restore`` and ``list`` (reads), ``fork``, ``prune``
  (delete_head / delete_checkpoints), ``admin`` (sweep and check: the reference
  list, condemn, audit, repair, blob listing and deletes). Sidecar tokens never
  get ``admin``: sweeping is the gateway operator's job.

Verification failures raise ``ServiceError(UNAUTHENTICATED)`` with ``why`` in
the details; a call outside the scope raises ``ServiceError(FORBIDDEN)``
(PERMISSION_DENIED) naming the thread or operation.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ..errors import SandboxCheckpointInvalidArgumentError
from ..model import stash_owner
from ..service.status import FORBIDDEN, UNAUTHENTICATED, ServiceError
from .scopes import DEFAULT_AUDIENCE as DEFAULT_AUDIENCE
from .scopes import DEFAULT_OPS as DEFAULT_OPS
from .scopes import OPS as OPS

ALGORITHM = "EdDSA"
ISSUER = "checkpointd"
LEEWAY_S = 60
# A token is a few hundred bytes; anything far larger is not one of ours.
MAX_TOKEN_BYTES = 16 * 1024


def generate_key(path: Path) -> Path:
    """Write a new Ed25519 private key (PKCS#8 PEM, mode 0600, never overwriting)
    to ``path`` and its public key to ``path.pub``; returns the public key's path."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    public_path = path.with_name(path.name + ".pub")
    for target, data, mode in ((path, private, 0o600), (public_path, public, 0o644)):
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        except FileExistsError:
            raise SandboxCheckpointInvalidArgumentError(
                f"{target} exists; keys are never overwritten (remove it first)",
                details={"path": str(target)},
            ) from None
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
    return public_path


def _read_key_file(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise SandboxCheckpointInvalidArgumentError(
            f"cannot read the token key {path}: {exc.strerror}", details={"path": str(path)}
        ) from exc


def load_signing_key(path: Path) -> Ed25519PrivateKey:
    """The Ed25519 private key in ``path`` (PEM). Raises InvalidArgument otherwise."""
    try:
        key = serialization.load_pem_private_key(_read_key_file(path), password=None)
    except (ValueError, TypeError) as exc:
        raise SandboxCheckpointInvalidArgumentError(
            f"{path} is not an unencrypted PEM private key: {exc}", details={"path": str(path)}
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SandboxCheckpointInvalidArgumentError(
            f"{path} holds a {type(key).__name__}; tokens are signed with Ed25519 "
            "(make one with `checkpointd token keygen`)",
            details={"path": str(path)},
        )
    return key


def load_verifying_key(path: Path) -> Ed25519PublicKey:
    """The Ed25519 public key in ``path`` (a public PEM, or the private PEM whose
    public half is taken). Raises InvalidArgument otherwise."""
    data = _read_key_file(path)
    if b"PRIVATE KEY" in data:
        return load_signing_key(path).public_key()
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        raise SandboxCheckpointInvalidArgumentError(
            f"{path} is not a PEM public key: {exc}", details={"path": str(path)}
        ) from None
    if not isinstance(key, Ed25519PublicKey):
        raise SandboxCheckpointInvalidArgumentError(
            f"{path} holds a {type(key).__name__}, not an Ed25519 public key",
            details={"path": str(path)},
        )
    return key


def _check_ops(ops: Iterable[str]) -> tuple[str, ...]:
    chosen = tuple(dict.fromkeys(op.strip() for op in ops if op.strip()))
    unknown = [op for op in chosen if op not in OPS]
    if unknown or not chosen:
        raise SandboxCheckpointInvalidArgumentError(
            f"unknown or no operations {unknown or list(chosen)!r}: choose from {', '.join(OPS)}"
        )
    return chosen


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenGrant:
    """What ``mint`` signs: ``ops`` on ``threads`` and on threads under
    ``thread_prefixes`` (every thread: ``all_threads``) for ``ttl_s`` seconds
    from ``now`` (seconds since the epoch; default the wall clock)."""

    ttl_s: float
    threads: Iterable[str] = ()
    thread_prefixes: Iterable[str] = ()
    ops: Iterable[str] = DEFAULT_OPS
    all_threads: bool = False
    audience: str = DEFAULT_AUDIENCE
    subject: str | None = None  # who it is for (default: the first thread)
    now: float | None = None


def mint(key: Ed25519PrivateKey, grant: TokenGrant) -> str:
    """A token signed with ``key`` granting what ``grant`` says. Raises
    InvalidArgument for an empty scope, an empty thread id or prefix (an empty
    prefix covers every tenant's threads: that is ``all_threads``, asked for by
    name), an unknown op or a non-positive ttl."""
    thread_list = list(dict.fromkeys(grant.threads))
    prefix_list = list(dict.fromkeys(grant.thread_prefixes))
    if any(not isinstance(t, str) or not t for t in thread_list):
        raise SandboxCheckpointInvalidArgumentError("thread ids must be non-empty strings")
    if any(not isinstance(p, str) or not p for p in prefix_list):
        raise SandboxCheckpointInvalidArgumentError(
            "an empty --thread-prefix would cover every tenant's threads: "
            "pass --all-threads if that is meant"
        )
    if grant.all_threads:
        prefix_list = [""]
    if not thread_list and not prefix_list:
        raise SandboxCheckpointInvalidArgumentError(
            "a token needs at least one --thread or --thread-prefix (or --all-threads)"
        )
    if not grant.ttl_s > 0:
        raise SandboxCheckpointInvalidArgumentError(f"--ttl must be positive, got {grant.ttl_s!r}")
    issued = int(time.time() if grant.now is None else grant.now)
    claims: dict[str, Any] = {
        "iss": ISSUER,
        "aud": grant.audience,
        "sub": grant.subject or (thread_list[0] if thread_list else prefix_list[0] + "*"),
        "iat": issued,
        "nbf": issued,
        "exp": issued + max(int(grant.ttl_s), 1),
        "jti": secrets.token_hex(12),
        "threads": thread_list,
        "thread_prefixes": prefix_list,
        "ops": list(_check_ops(grant.ops)),
    }
    return jwt.encode(claims, key, algorithm=ALGORITHM)


@dataclass(frozen=True, slots=True)
class TokenScope:
    """What a verified token grants."""

    subject: str
    token_id: str
    expires_at: int  # seconds since the epoch
    threads: frozenset[str]
    thread_prefixes: tuple[str, ...]
    ops: frozenset[str]

    def covers(self, thread_id: str) -> bool:
        """Whether the token grants ``thread_id``: one of its threads or under
        one of its prefixes. A thread's stash (``<thread>~stash``) comes with
        the thread: a prefix covers it already, an exact grant names only the
        thread (docs/restore-history.md)."""
        owner = stash_owner(thread_id)
        return (
            thread_id in self.threads
            or (owner is not None and owner in self.threads)
            or any(thread_id.startswith(prefix) for prefix in self.thread_prefixes)
        )

    def require(self, ops: Iterable[str], *thread_ids: str) -> None:
        """Raise FORBIDDEN unless the token grants one of ``ops`` and covers every
        thread in ``thread_ids``."""
        wanted = tuple(ops)
        if self.ops.isdisjoint(wanted):
            raise ServiceError(
                FORBIDDEN,
                f"the token ({self.subject}) does not grant {' or '.join(wanted)}",
                operation=",".join(wanted),
                subject=self.subject,
            )
        for thread_id in thread_ids:
            if not self.covers(thread_id):
                raise ServiceError(
                    FORBIDDEN,
                    f"the token ({self.subject}) does not cover thread {thread_id!r}",
                    thread_id=thread_id,
                    subject=self.subject,
                )

    def require_checkpoint(self, ops: Iterable[str], checkpoint_id: str, thread_id: str) -> None:
        """``require`` for a call that names a checkpoint, not its thread: the
        refusal names the checkpoint, never the thread (another tenant's)."""
        if not self.covers(thread_id):
            raise ServiceError(
                FORBIDDEN,
                f"the token ({self.subject}) does not cover checkpoint {checkpoint_id!r}",
                checkpoint_id=checkpoint_id,
                subject=self.subject,
            )
        self.require(ops)


def _unauthenticated(why: str) -> ServiceError:
    return ServiceError(UNAUTHENTICATED, f"gateway token refused: {why}", why=why)


def _strings(claims: dict[str, Any], name: str) -> list[str]:
    value = claims.get(name, [])
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise _unauthenticated(f"claim {name!r} must be a list of strings")
    return value


class TokenVerifier:
    """Checks tokens against one public key and audience (``verify``)."""

    def __init__(self, key: Ed25519PublicKey, *, audience: str = DEFAULT_AUDIENCE) -> None:
        self._key = key
        self._audience = audience

    def verify(self, token: str, *, now: float | None = None) -> TokenScope:
        """The token's scope. Raises ServiceError(UNAUTHENTICATED) when it is
        malformed, not signed by the key, expired, not yet valid, for another
        audience or missing a claim."""
        if len(token) > MAX_TOKEN_BYTES:
            raise _unauthenticated("token too large")
        try:
            claims = jwt.decode(
                token,
                self._key,
                algorithms=[ALGORITHM],
                audience=self._audience,
                issuer=ISSUER,
                leeway=LEEWAY_S,
                options={"require": ["exp", "iat", "nbf", "aud", "iss", "sub", "ops"]},
            )
        except jwt.ExpiredSignatureError:
            raise _unauthenticated("expired") from None
        except jwt.InvalidAudienceError:
            raise _unauthenticated("wrong audience") from None
        except jwt.InvalidSignatureError:
            raise _unauthenticated("bad signature") from None
        except jwt.ImmatureSignatureError:
            raise _unauthenticated("not yet valid") from None
        except jwt.MissingRequiredClaimError as exc:
            raise _unauthenticated(f"missing claim {exc.claim!r}") from None
        except jwt.PyJWTError as exc:
            raise _unauthenticated(f"malformed ({type(exc).__name__})") from None
        if now is not None and claims["exp"] + LEEWAY_S <= now:
            raise _unauthenticated("expired")
        ops = _strings(claims, "ops")
        unknown = [op for op in ops if op not in OPS]
        if unknown:
            raise _unauthenticated(f"unknown operations {unknown!r}")
        threads = _strings(claims, "threads")
        prefixes = _strings(claims, "thread_prefixes")
        if not threads and not prefixes:
            raise _unauthenticated("the token names no thread")
        return TokenScope(
            subject=str(claims["sub"]),
            token_id=str(claims.get("jti", "")),
            expires_at=int(claims["exp"]),
            threads=frozenset(threads),
            thread_prefixes=tuple(prefixes),
            ops=frozenset(ops),
        )
