"""Markdown, JSON and (with matplotlib) PNG output of a benchmark run.

``peer/ours`` is always the other tool's median divided by ours for the same
operation on the same corpus in the same run: above 1 means checkpointd is faster.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .context import (
    CHANGED_1PCT,
    COLD,
    NO_CHANGE,
    OPERATIONS,
    RESTORE_EMPTY,
    RESTORE_OVER,
)
from .daemon import WARM_TOOL
from .ours import API_TOOL
from .timing import FLOOR, OURS, PEER, Measurement

# A write floor is also what a cold capture to a local blob dir is held to.
FLOORS_ALSO_UNDER = {RESTORE_EMPTY: (COLD,)}
FAMILIES = ("restic", "borg", "git", "tar", "floor")


@dataclass
class RunReport:
    size: str
    started_utc: str
    runs: int
    machine: dict[str, Any]
    native: dict[str, Any]
    versions: dict[str, str]
    corpora: dict[str, dict[str, Any]]  # name -> {"spec": ..., "stats": ...}
    measurements: list[Measurement]
    notes: list[str]

    def as_json(self) -> dict[str, Any]:
        return {
            "size": self.size,
            "started_utc": self.started_utc,
            "runs": self.runs,
            "machine": self.machine,
            "native": self.native,
            "versions": self.versions,
            "corpora": self.corpora,
            "notes": self.notes,
            "measurements": [m.as_json() for m in self.measurements],
            "ratios": ratios(self.measurements),
        }


def load_report(path: Path) -> RunReport:
    """A RunReport back from its JSON (to re-render the Markdown after a format change)."""
    data = json.loads(path.read_text())
    measurements = []
    for m in data["measurements"]:
        rss = [round(peak * 1024) for peak in [m["peak_rss_mib"]] * len(m["times_s"])]
        measurements.append(
            Measurement(
                m["corpus"], m["op"], m["tool"], m["kind"], m["command"],
                times=m["times_s"], max_rss_kib=rss, notes=m["notes"], error=m["error"],
            )
        )  # fmt: skip
    fields = ("size", "started_utc", "runs", "machine", "native", "versions", "corpora", "notes")
    return RunReport(**{k: data[k] for k in fields}, measurements=measurements)


def write_report(report: RunReport, out_dir: Path) -> list[Path]:
    """Write ``<size>.md`` and ``<size>.json`` (and ``<size>.png`` when matplotlib is
    installed) into ``out_dir``; returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    md, js = out_dir / f"{report.size}.md", out_dir / f"{report.size}.json"
    md.write_text(render_markdown(report))
    js.write_text(json.dumps(report.as_json(), indent=1, default=str) + "\n")
    written = [md, js]
    png = _plot(report, out_dir / f"{report.size}.png")
    if png:
        written.append(png)
    return written


def ours_for(measurements: Iterable[Measurement], corpus: str, op: str) -> Measurement | None:
    """Our measurement of ``op`` on ``corpus`` that ratios are taken against: the
    Python API's when it ran and succeeded, else the daemon's through a warm gRPC
    client, else through the CLI."""
    ours = [m for m in measurements if m.corpus == corpus and m.op == op and m.kind == OURS]
    ours = [m for m in ours if m.times and not m.error]
    preference = {API_TOOL: 0, WARM_TOOL: 1}
    return min(ours, key=lambda m: preference.get(m.tool, 2), default=None)


def _rows(measurements: list[Measurement], corpus: str, op: str) -> list[Measurement]:
    rows = [m for m in measurements if m.corpus == corpus and m.op == op]
    for floor_op, also in FLOORS_ALSO_UNDER.items():
        if op in also:
            rows += [m for m in measurements if m.corpus == corpus and m.op == floor_op and m.kind == FLOOR]  # fmt: skip
    order = {OURS: 0, PEER: 1, FLOOR: 2}
    return sorted(
        rows,
        key=lambda m: (order[m.kind], m.tool != API_TOOL, m.median if m.times else math.inf),
    )


def ratios(measurements: list[Measurement]) -> list[dict[str, Any]]:
    """Every peer/ours and floor/ours ratio of medians (and of minimums)."""
    out = []
    for corpus in dict.fromkeys(m.corpus for m in measurements):
        for op in OPERATIONS:
            ours = ours_for(measurements, corpus, op)
            if ours is None:
                continue
            for m in _rows(measurements, corpus, op):
                if m.kind == OURS or m.error or not m.times:
                    continue
                out.append({
                    "corpus": corpus, "op": op, "tool": m.tool, "kind": m.kind,
                    "ratio_median": round(m.median / ours.median, 3),
                    "ratio_min": round(m.minimum / ours.minimum, 3),
                })  # fmt: skip
    return out


def _family(m: Measurement) -> str:
    return "floor" if m.kind == FLOOR else m.tool.split()[0]


def _seconds(x: float) -> str:
    return f"{x:.3f}" if x < 100 else f"{x:.1f}"


def _ratio(x: float) -> str:
    return f"{x:.2f}×" if x < 10 else f"{x:.1f}×"


def _mb(n: int | float) -> str:
    return f"{n / 1e6:,.1f} MB"


def _short_error(error: str | None) -> str:
    """``exit N: <the last line of its output>``, short enough for a table."""
    if not error:
        return "no timed run"
    code, _, lines = error.partition(": ")
    return f"{code}: {lines.split(' | ')[-1][:140]}"


def _cell(text: str) -> str:
    """Markdown table cell text: a pipe in a tool name must not split the cell."""
    return text.replace("|", "\\|")


def _notes(m: Measurement) -> str:
    parts = []
    if "stored_bytes" in m.notes:
        parts.append(f"stored {_mb(m.notes['stored_bytes'])}")
    if "verified" in m.notes:
        parts.append("restore verified" if m.notes["verified"] else "**restore MISMATCH**")
    if m.notes.get("engine_median_s") is not None:
        parts.append(f"engine {_seconds(m.notes['engine_median_s'])} s")
    if m.notes.get("daemon_peak_rss_mib") is not None:
        parts.append(f"daemon peak RSS {m.notes['daemon_peak_rss_mib']:.0f} MiB")
    stats = m.notes.get("stats") or {}
    if "files_hashed" in stats:
        parts.append(f"hashed {stats['files_hashed']:,}, reused {stats.get('files_reused', 0):,}")
    return "; ".join(parts)


def render_markdown(report: RunReport) -> str:
    lines = [f"# checkpointd benchmarks — size `{report.size}`", ""]
    m = report.machine
    versions = ", ".join(f"{k} {v}" for k, v in sorted(report.versions.items()))
    lines += [
        f"Run started {report.started_utc}; {report.runs} timed run(s) per operation, each in its own "
        "process, warm page cache. Seconds are the median (and minimum) wall time; `peer/ours` is "
        "the other tool's median ÷ ours (the Python API's, run as a fresh process like every "
        "peer) on the same files in the same run: **above 1 means checkpointd is faster**. "
        "Floors are the least work any tool must do (stat; read+hash; write). `engine` is "
        "the time inside capture/restore alone, without interpreter start-up or the CLI client.",
        "",
        f"Machine: {m.get('nproc')} cores ({m.get('cpu', '?')}), {m.get('memory_gib', '?')} GiB, "
        f"Linux {m.get('kernel')}, scratch on {m.get('scratch_filesystem', '?')}; "
        f"Python {m.get('python')}.",
        "",
        f"checkpointd {report.native.get('checkpointd', '?')}, native build: "
        f"{report.native.get('profile')} ({report.native.get('how')}"
        + (f", BLAKE3 {report.native['blake3_mb_per_s']} MB/s" if "blake3_mb_per_s" in report.native else "")
        + ").",
        "",
        f"Peers: {versions or 'none'}.",
        "",
    ]  # fmt: skip
    for note in report.notes:
        lines.append(f"- {note}")
    if report.notes:
        lines.append("")
    if not any(m.kind == OURS and m.times for m in report.measurements):
        lines += ["**checkpointd itself did not run** (see the notes above): no ratios.", ""]
    lines += _summary(report)
    for corpus, info in report.corpora.items():
        lines += _corpus_table(report, corpus, info)
    lines += _goals(report)
    return "\n".join(lines) + "\n"


def _summary(report: RunReport) -> list[str]:
    families = [f for f in FAMILIES if any(_family(m) == f for m in report.measurements if m.kind != OURS)]  # fmt: skip
    labels = {"tar": "tar \\| zstd", "floor": "best floor"}
    head = ["corpus", "operation", "ours s", "ours engine s",
            *[f"{labels.get(f, f)} /ours" for f in families]]  # fmt: skip
    lines = [
        "## Summary (peer/ours, medians; the best of each family)",
        "",
        "`ours s` is the wall time of a fresh process (interpreter start and imports "
        "included, as for every peer); `ours engine s` is the capture/restore call alone, "
        "what a long-running daemon pays. Ratios use the wall time.",
        "",
        "| " + " | ".join(head) + " |",
    ]
    lines.append("|---|---|" + "---:|" * (len(head) - 2))
    for corpus in report.corpora:
        for op in OPERATIONS:
            ours = ours_for(report.measurements, corpus, op)
            if ours is None:
                continue
            engine = ours.notes.get("engine_median_s")
            cells = [corpus, op, _seconds(ours.median), _seconds(engine) if engine else "—"]
            rows = [r for r in _rows(report.measurements, corpus, op) if r.kind != OURS and r.times]
            for family in families:
                best = [r.median for r in rows if _family(r) == family]
                cells.append(_ratio(min(best) / ours.median) if best else "—")
            lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]


def _corpus_table(report: RunReport, corpus: str, info: dict[str, Any]) -> list[str]:
    stats, captured = info.get("stats", {}), info.get("captured", {})
    title = f"## {corpus} — {stats.get('files', 0):,} files, {_mb(stats.get('bytes', 0))}"
    if captured and captured != stats:
        title += (
            f" ({captured['files']:,} files, {_mb(captured['bytes'])} after the default excludes)"
        )
    lines = [
        title,
        "",
        "| operation | tool | median s | min s | peer/ours | peak RSS MiB | notes |",
    ]
    lines.append("|---|---|---:|---:|---:|---:|---|")
    for op in OPERATIONS:
        ours = ours_for(report.measurements, corpus, op)
        for m in _rows(report.measurements, corpus, op):
            tool = f"**{m.tool}**" if m.kind == OURS else _cell(m.tool)
            if m.error or not m.times:
                lines.append(f"| {op} | {tool} | failed | | | | {_cell(_short_error(m.error))} |")
                continue
            ratio = "—" if m.kind == OURS or ours is None else _ratio(m.median / ours.median)
            lines.append(
                f"| {op} | {tool} | {_seconds(m.median)} | {_seconds(m.minimum)} | {ratio} "
                f"| {m.peak_rss_mib:,.0f} | {_notes(m)} |"
            )
    return [*lines, ""]


def _best(report: RunReport, corpus: str, op: str, *, family: str) -> Measurement | None:
    rows = [m for m in _rows(report.measurements, corpus, op) if m.times and _family(m) == family]
    return min(rows, key=lambda m: m.median, default=None)


def _goals(report: RunReport) -> list[str]:
    """BENCHMARKS.md's goals, checked on this run's medians."""
    goals: list[tuple[str, str, str, str, float]] = [
        # (label, our op, reference op, reference family, bound on ours/reference)
        ("no-change capture ≤ 1.0× git status", NO_CHANGE, NO_CHANGE, "git", 1.0),
        ("1% change ≤ 1.0× git add+commit", CHANGED_1PCT, CHANGED_1PCT, "git", 1.0),
        ("cold capture ≤ 1.5× write floor", COLD, RESTORE_EMPTY, "floor", 1.5),
        ("cold capture ≥ 3× faster than restic", COLD, COLD, "restic", 1 / 3),
        ("restore into empty dir ≤ 1.2× write floor", RESTORE_EMPTY, RESTORE_EMPTY, "floor", 1.2),
        ("restore into empty dir ≥ 4× faster than restic", RESTORE_EMPTY, RESTORE_EMPTY, "restic", 1 / 4),
        ("restore over 1% change ≤ 2× no-change capture", RESTORE_OVER, NO_CHANGE, OURS, 2.0),
    ]  # fmt: skip
    lines = ["## Goals (BENCHMARKS.md), ours ÷ reference", "", "| goal | corpus | ours/ref | met |"]
    lines.append("|---|---|---:|:---:|")
    for corpus in report.corpora:
        for label, op, ref_op, family, bound in goals:
            ours = ours_for(report.measurements, corpus, op)
            if ours is None:
                continue
            if family == OURS:
                ref = ours_for(report.measurements, corpus, ref_op)
            else:
                ref = _best(report, corpus, ref_op, family=family)
            if ref is None or not ref.times:
                continue
            value = ours.median / ref.median
            met = "yes" if value <= bound else "no"
            which = f" ({_cell(ref.tool)})" if family == "floor" else ""
            lines.append(f"| {label}{which} | {corpus} | {value:.2f} | {met} |")
        cold = ours_for(report.measurements, corpus, COLD)
        if cold and corpus.startswith("large"):
            met = "yes" if cold.peak_rss_mib < 100 else "no"
            lines.append(f"| peak RSS capturing large files < 100 MB | {corpus} | {cold.peak_rss_mib:.0f} MiB | {met} |")  # fmt: skip
    return [*lines, ""]


def _plot(report: RunReport, path: Path) -> Path | None:
    """A bar chart of peer/ours per operation (log scale), one panel per corpus."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    data = ratios(report.measurements)
    corpora = [c for c in report.corpora if any(r["corpus"] == c for r in data)]
    if not corpora:
        return None
    fig, axes = plt.subplots(len(corpora), 1, figsize=(11, 3.2 * len(corpora)), squeeze=False)
    for ax, corpus in zip(axes[:, 0], corpora, strict=True):
        rows = [r for r in data if r["corpus"] == corpus]
        labels = [f"{r['op']}\n{r['tool']}" for r in rows]
        values = [r["ratio_median"] for r in rows]
        ax.bar(range(len(rows)), values, color=["tab:green" if v >= 1 else "tab:red" for v in values])  # fmt: skip
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_yscale("log")
        ax.set_xticks(range(len(rows)), labels, rotation=90, fontsize=6)
        ax.set_title(f"{corpus}: peer/ours (above 1: checkpointd faster)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":  # python -m benchmarks.report results/quick.json
    import sys

    for argument in sys.argv[1:]:
        source = Path(argument)
        for written in write_report(load_report(source), source.parent):
            print(f"wrote {written}")
