"""The secrets a caller hands to capture, restore and diff, and how a checkpoint
names them.

A caller gives secrets as a sequence of byte strings or as a mapping name →
bytes (docs/design.md). Capture zeroes every occurrence and records, per file, where
(``FileEntry.secrets``: offset, length, and the secret's name — or its index in
the list when no names were given). Restore given the secrets writes them back
there. A checkpoint never holds a secret's value nor a hash of it.

How a recorded span finds its secret again (``Secrets.lookup``): a name is looked
up among the names the caller gives now; an index is the position in the
caller's list (a mapping's insertion order counts as its list). A span whose
secret is not given, or is given with another length, stays zeros.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .errors import SandboxCheckpointInvalidArgumentError
from .model import SecretSpan

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

    def lookup(self, span: SecretSpan) -> bytes | None:
        """The secret a recorded span held, when the caller gave it (same length)."""
        value: bytes | None = None
        if isinstance(span.secret, str):
            if self.names is not None and span.secret in self.names:
                value = self.values[self.names.index(span.secret)]
        elif 0 <= span.secret < len(self.values):
            value = self.values[span.secret]
        return value if value is not None and len(value) == span.length else None


def parse_secrets(secrets: SecretsArg | Secrets) -> Secrets:
    """Secrets from a sequence of byte strings or a mapping name → bytes.

    Raises SandboxCheckpointInvalidArgumentError for a value that is not bytes or
    shorter than 4 bytes, or a name that is not a non-empty string (the message
    never shows a value).
    """
    from .scanner import check_secrets

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


# --------------------------------------------------------------------- restore

_READ_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class LiveSecrets:
    """A live file seen through a checkpoint entry's spans: the BLAKE3 hex of its
    bytes with those spans zeroed, and its bytes at each span."""

    zeroed_hex: str
    at_spans: tuple[bytes, ...]


def read_through_spans(fd: int, spans: tuple[SecretSpan, ...]) -> LiveSecrets:
    """Hash the open file ``fd`` with ``spans`` zeroed, in fixed memory, keeping
    the bytes each span covers (blocks: call it in a worker thread)."""
    import blake3

    hasher = blake3.blake3()
    pieces: list[list[bytes]] = [[] for _ in spans]
    position = 0
    while chunk := os.read(fd, _READ_CHUNK):
        end = position + len(chunk)
        buffer = bytearray(chunk)
        for index, span in enumerate(spans):
            start, stop = max(span.offset, position), min(span.offset + span.length, end)
            if start < stop:
                pieces[index].append(chunk[start - position : stop - position])
        for span in spans:
            start, stop = max(span.offset, position), min(span.offset + span.length, end)
            if start < stop:
                buffer[start - position : stop - position] = bytes(stop - start)
        hasher.update(buffer)
        position = end
    return LiveSecrets(hasher.hexdigest(), tuple(b"".join(parts) for parts in pieces))


def write_fills(fd: int, fills: list[tuple[int, bytes]], mtime_ns: int) -> None:
    """Write the secrets into the open file, put its mtime back, and make the
    bytes durable (restore reports success only after its data is synced)."""
    for offset, value in fills:
        view = memoryview(value)
        while view:
            view = view[os.pwrite(fd, view, offset + len(value) - len(view)) :]
    os.utime(fd, ns=(mtime_ns, mtime_ns))
    os.fsync(fd)


__all__ = [
    "LiveSecrets",
    "Secrets",
    "SecretsArg",
    "named_spans",
    "parse_secrets",
    "read_through_spans",
    "write_fills",
]
