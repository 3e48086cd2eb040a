"""Scoped tokens: minted, verified, and refused when expired, tampered or misaddressed."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

import pytest

from checkpointd import cli
from checkpointd.errors import SandboxCheckpointInvalidArgumentError
from checkpointd.gateway import tokens
from checkpointd.service.status import FORBIDDEN, UNAUTHENTICATED, ServiceError

from .conftest import Keys


def _verifier(keys: Keys, audience: str = tokens.DEFAULT_AUDIENCE) -> tokens.TokenVerifier:
    return tokens.TokenVerifier(tokens.load_verifying_key(keys.public), audience=audience)


def _refused(verifier: tokens.TokenVerifier, token: str) -> str:
    with pytest.raises(ServiceError) as caught:
        verifier.verify(token)
    assert caught.value.code == UNAUTHENTICATED
    return str(caught.value.details["why"])


def test_a_minted_token_carries_its_scope(keys: Keys) -> None:
    token = keys.mint(threads=["t1"], prefixes=["sb-7/"], ops=["capture", "restore"], ttl_s=60)
    scope = _verifier(keys).verify(token)
    assert scope.threads == {"t1"} and scope.thread_prefixes == ("sb-7/",)
    assert scope.ops == {"capture", "restore"}
    assert scope.covers("t1") and scope.covers("sb-7/fork-1")
    assert not scope.covers("t2") and not scope.covers("sb-70")
    assert time.time() < scope.expires_at <= time.time() + 61
    scope.require(["capture"], "t1", "sb-7/x")
    with pytest.raises(ServiceError) as caught:
        scope.require(["capture"], "t2")
    assert caught.value.code == FORBIDDEN and caught.value.details["thread_id"] == "t2"
    with pytest.raises(ServiceError) as caught:
        scope.require(["admin"])
    assert caught.value.code == FORBIDDEN and caught.value.details["operation"] == "admin"


def test_expired_tampered_and_misaddressed_tokens_are_refused(keys: Keys, tmp_path: Path) -> None:
    verifier = _verifier(keys)
    expired = keys.mint(threads=["t1"], ttl_s=10, now=time.time() - 3600)
    assert _refused(verifier, expired) == "expired"

    good = keys.mint(threads=["t1"], ttl_s=3600)
    header, payload, signature = good.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims["threads"] = ["someone-elses-thread"]
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    assert _refused(verifier, f"{header}.{forged}.{signature}") == "bad signature"
    flipped = signature[:-2] + ("A" if signature[-2] != "A" else "B") + signature[-1]
    assert _refused(verifier, f"{header}.{payload}.{flipped}") == "bad signature"
    assert _refused(verifier, "not-a-token").startswith("malformed")

    assert _refused(_verifier(keys, audience="another-gateway"), good) == "wrong audience"

    other = Keys(tmp_path / "other.pem", tokens.generate_key(tmp_path / "other.pem"))
    assert _refused(verifier, other.mint(threads=["t1"])) == "bad signature"


def test_mint_refuses_an_empty_scope_or_unknown_ops(keys: Keys) -> None:
    with pytest.raises(SandboxCheckpointInvalidArgumentError, match="--thread"):
        keys.mint()
    with pytest.raises(SandboxCheckpointInvalidArgumentError, match="unknown"):
        keys.mint(threads=["t1"], ops=["capture", "sweep"])
    with pytest.raises(SandboxCheckpointInvalidArgumentError, match="ttl"):
        keys.mint(threads=["t1"], ttl_s=0)


def test_an_empty_prefix_is_every_tenant_and_must_be_asked_for_by_name(
    keys: Keys, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SandboxCheckpointInvalidArgumentError, match="--all-threads"):
        keys.mint(prefixes=[""])
    with pytest.raises(SandboxCheckpointInvalidArgumentError, match="--all-threads"):
        keys.mint(threads=["t1"], prefixes=["sb-1/", ""])
    argv = ["token", "mint", "--key-file", str(keys.private), "--ops", "admin"]
    assert cli.main([*argv, "--thread-prefix", ""]) == 2
    assert "--all-threads" in capsys.readouterr().err
    assert cli.main([*argv, "--all-threads"]) == 0
    scope = _verifier(keys).verify(capsys.readouterr().out.strip())
    assert scope.thread_prefixes == ("",) and scope.covers("any-tenant/any-thread")


def test_keygen_never_overwrites_a_key(keys: Keys) -> None:
    before = keys.private.read_bytes()
    with pytest.raises(SandboxCheckpointInvalidArgumentError, match="never overwritten"):
        tokens.generate_key(keys.private)
    assert keys.private.read_bytes() == before
    assert keys.private.stat().st_mode & 0o777 == 0o600


def test_the_cli_makes_keys_and_mints(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key = tmp_path / "k.pem"
    assert cli.main(["token", "keygen", "--key-file", str(key)]) == 0
    capsys.readouterr()
    argv = ["token", "mint", "--key-file", str(key), "--thread", "T", "--thread-prefix", "P/"]
    assert cli.main([*argv, "--ops", "capture,restore,list", "--ttl", "24h"]) == 0
    token = capsys.readouterr().out.strip()
    verifier = tokens.TokenVerifier(tokens.load_verifying_key(Path(f"{key}.pub")))
    scope = verifier.verify(token)
    assert scope.threads == {"T"} and scope.thread_prefixes == ("P/",)
    assert 24 * 3600 - 5 < scope.expires_at - time.time() <= 24 * 3600
    assert cli.main(["token", "mint", "--key-file", str(key), "--ops", "capture"]) == 2
