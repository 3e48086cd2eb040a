"""What the ``checkpointd`` client commands print: exit codes, the progress bar,
JSON documents, aligned tables and sizes, times and rates for people.

Kept light like ``cli``: rich and the protobuf runtime are imported when used.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
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


# ---------------------------------------------------------------- progress


@dataclass
class PhaseTally:
    """What one phase of a capture or restore reported: its last event and
    when its first and last events arrived (client-side clock)."""

    last: Any
    started: float
    ended: float

    @property
    def elapsed_ms(self) -> int:
        return int((self.ended - self.started) * 1000)


class Output:
    """Human text (with a progress bar on a terminal) or one JSON document.

    Every progress event of a capture or restore goes through ``on_event``,
    bar or not: the summary line quotes each phase's own counts."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.phases: dict[str, PhaseTally] = {}
        self._bar: Any = None
        self._task: Any = None

    def _start_bar(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        # On stderr, so stdout stays clean for the result (and for pipes).
        self._bar = Progress(
            TextColumn("{task.description:<8}"),
            BarColumn(),
            TextColumn("{task.fields[counts]}"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        self._bar.start()
        self._task = self._bar.add_task("start", total=None, counts="")

    def on_event(self, event: Any) -> None:
        """A CaptureEvent or RestoreEvent: its progress is tallied and shown."""
        if not event.HasField("progress"):
            return
        p = event.progress
        now = time.monotonic()
        tally = self.phases.get(p.phase)
        if tally is None:
            tally = self.phases[p.phase] = PhaseTally(p, now, now)
        tally.last, tally.ended = p, now
        if self._bar is None:
            if self.as_json or not sys.stderr.isatty():
                return
            self._start_bar()
        done, total, counts = self.view(p)
        self._bar.update(
            self._task, description=p.phase, completed=done, total=total or None, counts=counts
        )

    def view(self, p: Any) -> tuple[int, int, str]:
        """The bar for one event (``progress_view``); append, which counts
        nothing itself, shows the entries the scan found, which it records."""
        tally = self.phases.get(p.phase)
        done, total, counts = progress_view(p, tally.elapsed_ms if tally else 0)
        if p.phase == "append" and "scan" in self.phases:
            counts = f"{self.phases['scan'].last.files_done} entries"
        return done, total, counts

    def moved(self, phase: str) -> tuple[int, int, int] | None:
        """(files, bytes, ms) the phase's last event reported, None when it did not run."""
        tally = self.phases.get(phase)
        if tally is None:
            return None
        return tally.last.files_done, tally.last.bytes_done, tally.elapsed_ms

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def emit(self, data: Any, text: str) -> None:
        self.close()
        print(json.dumps(data, indent=2, sort_keys=True) if self.as_json else text)


# What each phase counts in its files fields (proto: enum ProgressPhase); the
# phases not named here (lease, resolve, plan, append) count nothing.
_UNITS = {
    "scan": "files",
    "pin": "keys",
    "upload": "blobs",
    "fetch": "blobs",
    "apply": "files",
    "record": "entries",
}
# Phases whose bar moves with bytes (their work is bytes moved); the others count items.
_BYTE_PHASES = ("upload", "fetch")


def progress_view(p: Any, elapsed_ms: int) -> tuple[int, int, str]:
    """(done, total, text) of a progress bar for one Progress event: an item
    count in scan, pin, apply and record (bytes in upload and fetch), the counts
    in the phase's own unit with human sizes, and the phase's rate so far; a
    phase that counts nothing shows no counts."""
    unit = _UNITS.get(p.phase)
    if unit is None:
        return 0, 0, ""
    by_bytes = p.phase in _BYTE_PHASES and p.bytes_total > 0
    done, total = (p.bytes_done, p.bytes_total) if by_bytes else (p.files_done, p.files_total)
    counts = f"{p.files_done}" + (f"/{p.files_total}" if p.files_total else "") + f" {unit}"
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
            else human_rate(p.files_done, elapsed_ms, unit)
        )
    return done, total, counts


# ---------------------------------------------------------------- documents


def to_dict(message: Any) -> dict[str, Any]:
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
            return to_dict(value)
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


# ---------------------------------------------------------------- text


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


def moved_text(what: str, count: int, unit: str, nbytes: int, ms: int) -> str:
    """``uploaded 3 blobs (19 B, 1.2 MiB/s)``: what a phase moved, at the rate
    of those bytes over that phase's time (no rate when nothing moved)."""
    text = f"{what} {count} {unit} ({human_size(nbytes)}"
    if nbytes and ms > 0:
        text += f", {human_rate(nbytes, ms)}"
    return text + ")"


def table(rows: Sequence[Sequence[str]], *, right: Sequence[int] = ()) -> str:
    """Rows as aligned columns two spaces apart (columns in ``right`` aligned
    right, the others left); trailing spaces trimmed."""
    if not rows:
        return ""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [
            cell.rjust(width) if i in right else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def summary_row(s: Any, head: str | None = None) -> list[str]:
    """One checkpoint summary as table cells: (head mark,) id, reason, files,
    size, created, label and fork provenance."""
    label = s.label if s.HasField("label") else ""
    if s.HasField("forked_from_checkpoint_id"):
        label += f"{'  ' if label else ''}(forked from {s.forked_from_thread_id}/"
        label += f"{s.forked_from_checkpoint_id})"
    cells = [
        s.id,
        s.reason,
        f"{s.file_count} files",
        human_size(s.total_bytes),
        human_time(s.created_at),
        label,
    ]
    return cells if head is None else ["*" if s.id == head else "", *cells]


def summary_line(s: Any) -> str:
    return table([summary_row(s)], right=(2, 3))


def taken_lines(s: Any) -> list[str]:
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
