"""The change journal of a workspace, as the capture engine and the daemon use it.

The daemon keeps one :class:`WorkspaceJournal` per workspace (``serve --watch``):
the native journal (``_native.Journal``: fanotify or inotify, see
docs/design.md, "The change journal") records what changed since the last
capture, and a capture given the journal (``CaptureOptions(journal=...)``)
examines only that, taking every other row from its parent — when it may:

- the journal is trusted (it saw every change since a full scan; else its
  ticket says why not);
- the capture is of the whole workspace, under the policy the journal watches,
  with the secrets and chunking of the capture the journal last saw;
- its parent is that capture's manifest (same length and fingerprint): the
  changes are relative to it.

Otherwise the capture scans everything and says why (``CaptureStats``
``scan_mode`` and ``full_scan_reason``). Either way the capture hands its
ticket back: ``commit`` once stored (a full scan then makes the journal
trusted), ``abort`` when it failed (its changes go back into the journal).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from . import _native, chunks
from ._engine import run_in_thread
from .manifest import Manifest, ManifestSummary
from .model import Policy
from .scanner import JournalInput, ScanOutcome

WATCH_MODES = ("auto", "fanotify", "inotify", "off")


@dataclass(frozen=True)
class ScanKey:
    """What makes two captures' rows comparable: the sub-root, the policy, the
    secrets (values and names) and the chunking."""

    subdir: str
    policy: Policy
    secrets: str  # the secret set's fingerprint
    secret_names: tuple[str, ...] | None
    chunking: tuple[int | None, int]

    @classmethod
    def of(
        cls,
        subdir: str,
        policy: Policy,
        secrets: tuple[bytes, ...],
        secret_names: tuple[str, ...] | None,
    ) -> ScanKey:
        threshold, average = chunks.native_args()
        return cls(
            subdir,
            policy,
            _native.secrets_fingerprint(list(secrets)),
            secret_names,
            (threshold, average),
        )


@dataclass(frozen=True)
class Baseline:
    """The capture the journal's changes are relative to: its key, its
    manifest's length and fingerprint, and the checkpoint that holds it."""

    key: ScanKey
    byte_length: int
    fingerprint: bytes
    checkpoint_id: str
    # Its blob digests, when the capture knew them, and how many references
    # each has (``ScanOutcome.digest_counts``): a directed scan's next
    # digests are worked out from these and the changes.
    digests: bytes | None = dataclasses.field(default=None, repr=False)
    counts: bytes | None = dataclasses.field(default=None, repr=False)
    # Its bytes, when the capture held them: the next directed scan's parent
    # (a store keeps a large keyframe compressed, and inflating it again at a
    # million entries costs most of a second).
    data: bytes | None = dataclasses.field(default=None, repr=False, compare=False)


class JournalUse:
    """One capture's use of the journal: its ticket (None when another
    capture holds the journal), and why it scans everything (``reason``;
    None: the journal directs the scan)."""

    def __init__(
        self,
        journal: WorkspaceJournal,
        ticket: _native.JournalTicket | None,
        reason: str | None,
    ):
        self.journal = journal
        self.ticket = ticket
        self.reason = reason
        self.settled = False
        # The scan's digests and their counts (see ``scanned``).
        self.counted: tuple[bytes, bytes] | None = None

    @property
    def directed(self) -> bool:
        return self.reason is None

    @property
    def changes(self) -> int:
        """Names and directories the ticket holds (0: nothing changed)."""
        return self.ticket.changes if self.ticket is not None else 0

    def commit(self, stored: Manifest, key: ScanKey, checkpoint_id: str) -> None:
        """The capture is stored: ``stored`` is the manifest it scanned (held
        by ``checkpoint_id``), which the journal's changes are relative to
        from now on."""
        if not self.settled:
            self.settled = True
            digests = stored.known_digests()
            counted = self.counted
            baseline = Baseline(
                key,
                stored.byte_length(),
                stored.fingerprint(),
                checkpoint_id,
                digests,
                counted[1] if counted is not None and counted[0] == digests else None,
                stored.data if stored.loaded else None,
            )
            self.journal._settle(self.ticket, baseline)

    def abort(self) -> None:
        """The capture failed: its changes go back into the journal."""
        if not self.settled:
            self.settled = True
            self.journal._settle(self.ticket, None)


class WorkspaceJournal:
    """A workspace's change journal (see the module docstring).

    ``mode``: ``auto`` (fanotify on a workspace that is a filesystem of its own
    and a daemon allowed a filesystem mark, else inotify), ``fanotify``,
    ``inotify`` or ``off``. A mode that cannot be had is "off", and
    :attr:`status` says why. Raises SandboxCheckpointInvalidArgumentError for an
    unknown mode (ValueError from the native journal otherwise).
    """

    def __init__(self, root: str, mode: str = "auto", policy: Policy | None = None, **limits: int):
        if mode not in WATCH_MODES:
            from .errors import SandboxCheckpointInvalidArgumentError

            raise SandboxCheckpointInvalidArgumentError(
                f"--watch {mode!r}: expected one of {', '.join(WATCH_MODES)}",
                details={"field": "watch"},
            )
        self.policy = policy if policy is not None else Policy()
        self._native = _native.Journal(
            root,
            mode,
            exclude=self.policy.exclude,
            include=self.policy.include,
            default_excludes=self.policy.default_excludes,
            **limits,
        )
        self._lock = threading.Lock()
        self._baseline: Baseline | None = None
        # One capture at a time holds the changes: a second one taking them
        # too would find them gone and call its workspace unchanged.
        self._held = False
        self._begun = 0

    # ------------------------------------------------------------ state

    def status(self) -> dict[str, object]:
        """The native journal's status: mode, detail, untrusted (why the next
        capture scans everything), pending, idle_ms, pending_ms, counters."""
        return dict(self._native.status())

    @property
    def mode(self) -> str:
        return str(self.status()["mode"])

    def describe(self) -> tuple[str, str]:
        """(mode, why) for GetServerInfo: ``("inotify", "--watch inotify")``,
        ``("off", "watch limit 8192 < 31,000+ directories ...")``."""
        status = self.status()
        return str(status["mode"]), str(status["detail"])

    def distrust(self, reason: str, *, find_links: bool = False) -> None:
        """The next capture scans everything, for ``reason`` (``find_links``:
        after a walk of the tree finds every name of its hard-linked files)."""
        self._native.distrust(reason, find_links=find_links)

    def covers(self, path: str) -> bool:
        """Whether a change at ``path`` would be examined by the next capture."""
        return bool(self._native.covers(path))

    def holds(self, stored: Manifest | None, key: ScanKey | None = None) -> bool:
        """Whether ``stored`` (a head's files) is the manifest the journal last
        saw captured (under ``key``, when given)."""
        with self._lock:
            baseline = self._baseline
        if baseline is None or stored is None:
            return False
        if key is not None and key != baseline.key:
            return False
        return (stored.byte_length(), stored.fingerprint()) == (
            baseline.byte_length,
            baseline.fingerprint,
        )

    def parent_data(self, previous: ManifestSummary | None) -> bytes | None:
        """The bytes of ``previous`` when it is the manifest the journal last
        saw captured and that capture held them."""
        with self._lock:
            baseline = self._baseline
        if (
            baseline is None
            or baseline.data is None
            or previous is None
            or (previous.byte_length, previous.fingerprint)
            != (baseline.byte_length, baseline.fingerprint)
        ):
            return None
        return baseline.data

    def lend_digests(self, stored: Manifest) -> None:
        """Tell ``stored`` its blob digests when it is the manifest the journal
        last saw captured and their digests are known: a head read back from
        the store is not worked through again (~1 s at a million entries)."""
        with self._lock:
            baseline = self._baseline
        if baseline is not None and baseline.digests is not None and self.holds(stored):
            stored.learn_digests(baseline.digests)

    def close(self) -> None:
        self._native.close()

    # ------------------------------------------------------------ captures

    def begin(self, key: ScanKey, previous: ManifestSummary | None) -> JournalUse:
        """Take the changes for a capture under ``key`` whose parent is
        ``previous`` (None: no parent)."""
        elsewhere = self._elsewhere(key)
        if elsewhere is not None:
            # Not the captures the journal follows: its changes stay for them.
            return JournalUse(self, None, elsewhere)
        with self._lock:
            if self._held:
                return JournalUse(self, None, "another capture of the workspace holds the journal")
            self._held = True
            self._begun += 1
        try:
            ticket = self._native.take()
        except BaseException:
            with self._lock:
                self._held = False
            raise
        reason = ticket.full or self._why_not(key, previous)
        return JournalUse(self, ticket, reason)

    def _elsewhere(self, key: ScanKey) -> str | None:
        """Why a capture under ``key`` is not one the journal follows, if it is not."""
        if key.subdir:
            return "a capture of a sub-root (the journal directs whole-workspace captures)"
        if key.policy != self.policy:
            return "the capture's policy is not the one the journal watches (serve's policy)"
        return None

    def _why_not(self, key: ScanKey, previous: ManifestSummary | None) -> str | None:
        with self._lock:
            baseline = self._baseline
        if baseline is None:
            return "the journal has seen no capture of this workspace yet"
        if key != baseline.key:
            return "the secrets or the chunking differ from the last capture's"
        if previous is None or (previous.byte_length, previous.fingerprint) != (
            baseline.byte_length,
            baseline.fingerprint,
        ):
            return "the head is not the checkpoint the journal last saw captured"
        return None

    def _settle(self, ticket: _native.JournalTicket | None, baseline: Baseline | None) -> None:
        if ticket is None:
            return  # took nothing: changes nothing
        try:
            if baseline is None:
                self._native.abort(ticket)
                return
            with self._lock:
                before = self._baseline
                if (
                    (baseline.digests is None or baseline.counts is None)
                    and before is not None
                    and before.digests is not None
                    and before.fingerprint == baseline.fingerprint
                ):
                    # The same bytes (a capture that changed nothing): the same digests.
                    baseline = dataclasses.replace(
                        baseline, digests=before.digests, counts=before.counts
                    )
                if (
                    baseline.data is None
                    and before is not None
                    and before.fingerprint == baseline.fingerprint
                ):
                    baseline = dataclasses.replace(baseline, data=before.data)
                self._baseline = baseline
            self._native.commit(ticket)
        finally:
            with self._lock:
                self._held = False

    def baseline_counted(self) -> tuple[bytes, bytes] | None:
        """The blob digests of the manifest the changes are relative to and
        their counts, when both are known."""
        with self._lock:
            baseline = self._baseline
        if baseline is None or baseline.digests is None or baseline.counts is None:
            return None
        return baseline.digests, baseline.counts

    def quiescent(self) -> tuple[Baseline, int] | None:
        """The baseline and a count of the captures begun so far, when no
        capture holds the journal (None otherwise, or before any capture): a
        verifying scan compares the tree with that baseline, and its result
        stands only if the same pair is returned after it."""
        with self._lock:
            if self._held or self._baseline is None:
                return None
            return self._baseline, self._begun


async def scan_input(
    use: JournalUse | None,
    previous: ManifestSummary | None,
    parent: Manifest | None,
    load_parent: Callable[[], Awaitable[Manifest | None]],
) -> JournalInput | None:
    """What the scan needs when the journal directs it (None: it scans
    everything): the parent's bytes, loaded now when the capture has not
    (none are needed when nothing changed: its summary says the totals)."""
    if use is None or not use.directed or use.ticket is None:
        return None
    if use.changes == 0 and previous is not None:
        totals = (previous.entries, previous.files, previous.file_bytes)
        return (use.ticket, b"[]", totals, None)
    data = use.journal.parent_data(previous)
    if data is not None and previous is not None:
        totals = (previous.entries, previous.files, previous.file_bytes)
        return (use.ticket, data, totals, use.journal.baseline_counted())
    manifest = parent if parent is not None else await load_parent()
    if manifest is None:
        use.reason = "the parent checkpoint cannot be read"
        return None
    data = await run_in_thread(lambda: manifest.data)
    return (use.ticket, data, manifest.totals(), use.journal.baseline_counted())


def scanned(use: JournalUse | None, outcome: ScanOutcome) -> None:
    """Tell ``use`` its scan's digests and their counts. A scan the journal
    was to direct found the tree inconsistent with the journal (it scanned
    everything instead, ``outcome.fallback`` says why): the journal is not
    trusted until it has walked the tree again."""
    if use is None:
        return
    if outcome.digests and outcome.digest_counts:
        use.counted = (outcome.digests, outcome.digest_counts)
    if use.directed and outcome.fallback is not None:
        use.journal.distrust(outcome.fallback, find_links=True)


def scan_report(use: JournalUse | None, outcome: ScanOutcome) -> dict[str, object]:
    """``CaptureStats``' scan fields: how the capture examined the workspace."""
    if outcome.scan_mode == "journal":
        return {
            "scan_mode": "journal",
            "full_scan_reason": "",
            "entries_examined": outcome.entries_examined,
        }
    reason = outcome.fallback or (use.reason if use is not None else None) or ""
    return {
        "scan_mode": "full",
        "full_scan_reason": reason,
        "entries_examined": outcome.entries_examined,
    }


__all__ = [
    "WATCH_MODES",
    "Baseline",
    "JournalUse",
    "ScanKey",
    "WorkspaceJournal",
    "scan_input",
    "scan_report",
    "scanned",
]
