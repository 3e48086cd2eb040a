"""The secrets a caller hands to capture, restore and diff, and how a checkpoint
names them.

A caller gives secrets as a sequence of byte strings or as a mapping name →
bytes (docs/design.md). Capture zeroes every occurrence and records, per file, where
(``FileEntry.secrets``: offset, length, and the secret's name — or its index in
the list when no names were given). Restore given the secrets writes them back
there. A checkpoint never holds a secret's value nor a hash of it.

How a recorded span finds its secret again at restore is native
(``rust/src/spans.rs``): a name is looked up among the names the caller gives
now; an index is the position in the caller's list (a mapping's insertion order
counts as its list). A span whose secret is not given, or is given with another
length, stays zeros.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .errors import SandboxCheckpointInvalidArgumentError
from .model import SecretSpan
from .scanner import check_secrets

SecretsArg = Iterable[bytes | bytearray | memoryview] | Mapping[str, bytes | bytearray | memoryview]


@dataclass(frozen=True, slots=True)
class Secrets:
    """Validated secrets: their values, and their names when a mapping was given."""

    values: tuple[bytes, ...] = ()
    names: tuple[str, ...] | None = None

    def __repr__(self) -> str:  # never the values
        shown = list(self.names) if self.names is not None else len(self.values)
        return f"Secrets({shown})"

    def ref(self, index: int) -> int | str:
        """What a span records for the secret at ``index``: its name, else the index."""
        return self.names[index] if self.names is not None else index


def parse_secrets(secrets: SecretsArg | Secrets) -> Secrets:
    """Secrets from a sequence of byte strings or a mapping name → bytes.

    Raises SandboxCheckpointInvalidArgumentError for a value that is not bytes or
    shorter than 4 bytes, or a name that is not a non-empty string (the message
    never shows a value).
    """
    if isinstance(secrets, Secrets):
        return secrets
    if isinstance(secrets, Mapping):
        names = tuple(secrets)
        for name in names:
            if not isinstance(name, str) or not name:
                raise SandboxCheckpointInvalidArgumentError(
                    f"secret names must be non-empty strings, got {name!r}"
                )
        values: list[bytes] = []
        for name, value in secrets.items():
            try:
                values.extend(check_secrets([value]))
            except SandboxCheckpointInvalidArgumentError as error:
                reason = error.message.replace("secret #0", f"secret {name!r}")
                raise SandboxCheckpointInvalidArgumentError(
                    reason, details={"secret_name": name}
                ) from None
        return Secrets(tuple(values), names)
    return Secrets(check_secrets(secrets), None)


def named_spans(spans: tuple[SecretSpan, ...], secrets: Secrets) -> tuple[SecretSpan, ...]:
    """The scanner's spans (which carry indexes) with the caller's names."""
    if secrets.names is None:
        return spans
    return tuple(
        SecretSpan(span.offset, span.length, secrets.ref(span.secret))
        if isinstance(span.secret, int)
        else span
        for span in spans
    )


__all__ = [
    "Secrets",
    "SecretsArg",
    "named_spans",
    "parse_secrets",
]
