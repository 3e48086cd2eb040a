"""The Python face of the native scanner, for the capture and restore engines.

``scan_workspace`` runs :func:`checkpointd._native.scan` (GIL released, parallel)
and is the ONE place where native errors become checkpointd errors:

- a secret shorter than 4 bytes, or a policy entry that cannot be one gitignore
  line (a line break or NUL inside) →
  :class:`~checkpointd.errors.SandboxCheckpointInvalidArgumentError`;
- an ``OSError`` with a class of its own (the root missing, not a directory, a
  symlink or unreadable; a file that kept changing; no space; a name too long;
  a cross-device link; permission denied) → its checkpointd error through
  :func:`checkpointd.errors.from_os_error`, naming the path
  (``details["path"]``), chained to the ``OSError``;
- a pattern line git accepts but that never matches (``/``, ``a//b``, ``[abc``)
  is no error: it matches as in git and is logged once per process as a warning
  on the ``checkpointd.policy`` logger, naming the pattern and the rule;
- cancellation → :class:`checkpointd._native.ScanCancelled`, unchanged (the
  engines catch it to stop cleanly);
- any other ``OSError`` (a genuine I/O fault) propagates unchanged.

The manifest stays compact bytes (``ScanOutcome.manifest``); entries are decoded
only when asked for, through :mod:`checkpointd.codec`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TypedDict, Unpack

from . import _native, chunks
from ._keywords import check_keywords
from .codec import decode_entries
from .errors import SandboxCheckpointInvalidArgumentError, from_os_error
from .manifest import ManifestSummary
from .model import Entry, Policy

_policy_log = logging.getLogger("checkpointd.policy")
# Warnings already logged: a daemon capturing every minute says it once. Bounded,
# since policies arrive over the wire.
_logged_policy_warnings: set[tuple[str, str, str]] = set()
_MAX_LOGGED_POLICY_WARNINGS = 1024


@dataclass(frozen=True)
class ScanOutcome:
    """What one scan found.

    ``manifest`` is the codec's compact JSON (sorted by path bytes);
    ``unsupported`` lists every ``(path, kind)`` the policy did not exclude.
    """

    manifest: bytes
    unsupported: list[tuple[str, str]]
    entries_count: int
    files_hashed: int
    files_reused: int
    bytes_hashed: int
    files_with_secrets: int = 0  # files whose entries say where secrets were zeroed
    digests: bytes | None = None  # distinct file digests, sorted (b"" when same_as_previous)
    digest_counts: bytes | None = None  # references per digest (u32 little-endian each)
    fingerprint: bytes | None = None  # BLAKE3 of ``manifest``, when the scan worked it out
    file_count: int = 0  # file rows in the manifest
    file_bytes: int = 0  # the sum of their sizes
    dirs_listed: int = 0  # directories entered
    dirs_reused: int = 0  # of which the stat cache gave the listing (not re-read)
    # The manifest is ``previous`` (``manifest`` is then b""): see scan_workspace.
    same_as_previous: bool = False
    # "journal" (directed by a change journal's ticket) or "full"; why a scan
    # given a ticket scanned everything after all; entries stat'ed plus
    # directories listed.
    scan_mode: str = "full"
    fallback: str | None = None
    entries_examined: int = 0
    # A journal scan's delta from its parent (the store's encoding) and the
    # rows it inserts.
    delta: tuple[bytes, int] | None = None

    # Decoded lazily: a million-entry manifest is only turned into objects on demand.
    @cached_property
    def entries(self) -> tuple[Entry, ...]:
        """The manifest decoded into model entries (computed once)."""
        return decode_entries(self.manifest)


def check_secrets(secrets: Iterable[bytes | bytearray | memoryview]) -> tuple[bytes, ...]:
    """The secrets as a tuple of bytes.

    Raises SandboxCheckpointInvalidArgumentError when one is not bytes-like or is
    shorter than 4 bytes (the message never shows the secret).
    """
    if isinstance(secrets, (bytes, bytearray, memoryview, str)):
        raise SandboxCheckpointInvalidArgumentError(
            "secrets must be a sequence of byte strings, not a single value"
        )
    checked: list[bytes] = []
    for index, secret in enumerate(secrets):
        if not isinstance(secret, (bytes, bytearray, memoryview)):
            raise SandboxCheckpointInvalidArgumentError(
                f"secret #{index} is a {type(secret).__name__}, not bytes"
            )
        value = bytes(secret)
        if len(value) < _native.MIN_SECRET_LEN:
            raise SandboxCheckpointInvalidArgumentError(
                f"secret #{index} is {len(value)} bytes; secrets must be at least "
                f"{_native.MIN_SECRET_LEN} bytes",
                details={"secret_index": index},
            )
        checked.append(value)
    return tuple(checked)


def policy_matcher(policy: Policy | None) -> _native.PolicyMatcher:
    """The policy compiled natively (a default ``Policy()`` when None).

    Raises SandboxCheckpointInvalidArgumentError for a bad pattern.
    """
    policy = policy if policy is not None else Policy()
    try:
        matcher = _native.PolicyMatcher(policy.exclude, policy.include, policy.default_excludes)
    except ValueError as error:
        raise SandboxCheckpointInvalidArgumentError(str(error)) from error
    _log_policy_warnings(matcher.warnings)
    return matcher


def _log_policy_warnings(warnings: Iterable[tuple[str, str, str]]) -> None:
    """Log each ``(list, pattern, reason)`` the native matcher reported, once."""
    for warning in warnings:
        if warning in _logged_policy_warnings:
            continue
        if len(_logged_policy_warnings) >= _MAX_LOGGED_POLICY_WARNINGS:
            _logged_policy_warnings.clear()
        _logged_policy_warnings.add(warning)
        list_name, pattern, reason = warning
        _policy_log.warning(
            "policy %s pattern %r: %s (git reads the line the same way)",
            list_name,
            pattern,
            reason,
        )


# What a scan the change journal directs takes: the journal's ticket, the
# parent's manifest bytes, its totals (entries, files, file bytes) and, when
# known, its digests with their counts.
JournalInput = tuple[_native.JournalTicket, bytes, tuple[int, int, int], tuple[bytes, bytes] | None]


class ScanOptions(TypedDict, total=False):
    """The keywords of ``scan_workspace`` (its docstring)."""

    threads: int  # worker threads (0: one per core)
    feed: _native.BlobFeed | None
    root_fd: int | None
    progress: _native.ScanProgress | None
    previous: ManifestSummary | None
    journal: JournalInput | None


def scan_workspace(
    root: str | os.PathLike[str],
    policy: Policy | None,
    secrets: Sequence[bytes],
    cache_path: str | os.PathLike[str] | None,
    cancel: _native.CancelToken | None = None,
    **options: Unpack[ScanOptions],
) -> ScanOutcome:
    """Scan ``root`` under ``policy``, zeroing ``secrets``, with the stat cache
    at ``cache_path`` (None: no cache).

    ``progress`` receives the counts while the scan runs (poll its
    ``snapshot()`` from another thread). ``previous``: the parent's manifest
    summary; when the scan's manifest is byte for byte that one (same length
    and fingerprint), ``ScanOutcome.same_as_previous`` is True and no second
    copy is made (the parent's manifest itself is never needed).
    ``journal``: a change journal's ticket, the parent's manifest bytes, its
    totals and (when known) its digests with their counts: only what the
    ticket names is examined (see ``checkpointd.journal``).

    Raises SandboxCheckpointInvalidArgumentError (bad secret, bad pattern, bad
    root), ScanCancelled, or OSError for an unreadable entry; TypeError for an
    unknown keyword.
    """
    check_keywords("scan_workspace", options, ScanOptions)
    policy = policy if policy is not None else Policy()
    checked = check_secrets(secrets)
    root_text = os.fspath(root)
    previous = options.get("previous")
    journal = options.get("journal")
    try:
        result = _native.scan(
            root_text,
            exclude=policy.exclude,
            include=policy.include,
            default_excludes=policy.default_excludes,
            secrets=checked,
            cache_path=os.fspath(cache_path) if cache_path is not None else None,
            threads=options.get("threads", 0),
            cancel=cancel,
            feed=options.get("feed"),
            root_fd=options.get("root_fd"),
            progress=options.get("progress"),
            previous_length=None if previous is None else previous.byte_length,
            previous_fingerprint=None if previous is None else previous.fingerprint,
            journal=None if journal is None else journal[0],
            parent=None if journal is None else journal[1],
            parent_totals=None if journal is None else journal[2],
            parent_digests=None if journal is None else journal[3],
            chunk_threshold=chunks.native_args()[0],
            chunk_average=chunks.native_args()[1],
        )
    except _native.ScanCancelled:
        raise
    except ValueError as error:
        raise SandboxCheckpointInvalidArgumentError(str(error)) from error
    except OSError as error:
        mapped = from_os_error(error, root=root_text)
        if mapped is not None:
            raise mapped from error
        raise
    _log_policy_warnings(result.policy_warnings)
    return _outcome(result)


def _outcome(result: _native.ScanResult) -> ScanOutcome:
    return ScanOutcome(
        manifest=result.manifest,
        unsupported=list(result.unsupported),
        entries_count=result.entries,
        files_hashed=result.files_hashed,
        files_reused=result.files_reused,
        bytes_hashed=result.bytes_hashed,
        files_with_secrets=result.files_with_secrets,
        digests=result.digests,
        digest_counts=result.digest_counts,
        fingerprint=result.fingerprint,
        file_count=result.file_count,
        file_bytes=result.file_bytes,
        dirs_listed=result.dirs_listed,
        dirs_reused=result.dirs_reused,
        same_as_previous=result.same_as_previous,
        scan_mode=result.scan_mode,
        fallback=result.fallback,
        entries_examined=result.entries_examined,
        delta=result.delta,
    )


__all__ = [
    "JournalInput",
    "ScanOptions",
    "ScanOutcome",
    "check_secrets",
    "policy_matcher",
    "scan_workspace",
]
