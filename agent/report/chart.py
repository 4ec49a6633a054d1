"""The picture: cross-zone bytes/s per Service over both windows, the change marked.

Rendered with matplotlib's Agg backend (no display needed). The HTML report is one
self-contained file: the PNG embedded as base64 and the summary table.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.dates as mdates  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from agent.errors import InputError  # noqa: E402
from agent.report.compute import CHART_PANELS, Change, Report  # noqa: E402
from agent.report.render import (  # noqa: E402
    TABLE_HEADER,
    WORKLOAD_HEADER,
    fmt_change,
    fmt_dollars,
    fmt_rate,
    shown,
    table_rows,
    to_table,
    workload_rows,
)
from agent.report.timespec import format_time  # noqa: E402

#: most Services drawn as their own line (the rest are summed as "other")
MAX_LINES = 8


def _dates(ts: list[float] | tuple[float, ...]) -> list[float]:
    """Unix seconds -> matplotlib date numbers (UTC)."""
    return [float(mdates.date2num(dt.datetime.fromtimestamp(t, tz=dt.UTC)))  # type: ignore[no-untyped-call]
            for t in ts]


def _rate_axis(ax: Axes) -> None:
    ax.xaxis_date(tz=dt.UTC)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt_rate(v)))
    ax.xaxis.set_major_formatter(
        mdates.ConciseDateFormatter(ax.xaxis.get_major_locator()))  # type: ignore[no-untyped-call]
    ax.grid(True, alpha=0.3)


def _shade(ax: Axes, c: Change, change_time: float | None, legend: bool,
           change_label: str | None = None) -> None:
    b, a = c.before.window, c.after.window
    ax.axvspan(*_dates([b.start, b.end]), color="tab:blue", alpha=0.07,
               label="before window" if legend else None)
    ax.axvspan(*_dates([a.start, a.end]), color="tab:green", alpha=0.07,
               label="after window" if legend else None)
    t = change_time if change_time is not None else (b.end + a.start) / 2
    ax.axvline(_dates([t])[0], color="black", linestyle="--", linewidth=1.2,
               label=(change_label or f"change {format_time(t)}") if legend else None)


def _withdrawals(ax: Axes, c: Change, color: str, legend: bool) -> bool:
    """Mark where locality was withdrawn inside the after window; True when any was."""
    for i, t in enumerate(c.after.withdrawn_at):
        ax.axvline(_dates([t])[0], color=color, linestyle=":", linewidth=1.5,
                   label=f"{c.key}: locality withdrawn" if legend and i == 0 else None)
    return bool(c.after.withdrawn_at)


def _plot_windows(ax: Axes, c: Change, color: str) -> None:
    """Draw each window's average as a flat segment (what the table reports)."""
    for w in (c.before, c.after):
        ax.plot(_dates([w.window.start, w.window.end]), [w.cross_zone_bytes_per_second] * 2,
                color=color, linewidth=3, alpha=0.45, solid_capstyle="butt")


def chart_title(report: Report) -> str:
    """Title of the one-panel chart: the total's observed and normalised change and what it
    is worth (``$57.85/month saved``, ``cost rose $0.44/month``, ``no significant change``),
    never a negative amount nor a change within the noise priced."""
    tot = report.total
    money = fmt_dollars(tot, "/month")
    if tot.verdict == "saved":
        money += " saved"
    return (f"Cross-zone bytes/s per Service: {money} at {report.price.name}\n"
            f"observed {fmt_change(tot.saved, tot.saved_stderr, tot.saved_significant)}, "
            "normalised for volume "
            f"{fmt_change(tot.normalized_saved, tot.normalized_stderr, tot.significant)}")


def render_png(report: Report, path: str | Path, all_rows: bool = False) -> None:
    """Write the chart to ``path`` (PNG).

    With one pair of windows: one panel, a line per Service (largest before cross-zone
    rate first, at most :data:`MAX_LINES`), window averages as thick segments, the change
    as a dashed line. With per-Service windows: one small panel per Service, for the
    first :data:`~agent.report.compute.CHART_PANELS` (largest normalised saving first).
    Services with no bytes in either window are left out unless ``all_rows``.

    Raises:
        InputError: the file cannot be written.
    """
    # all-zero Services are left out as in the table (all of them drawn when all are zero)
    services = shown(report, all_rows)[0] or list(report.services)
    per_service = report.before is None
    if per_service:
        # the Services come ordered by normalised saving: draw the first panels only (a
        # panel per Service of a large cluster would exceed any image size)
        hidden = max(0, len(services) - CHART_PANELS)
        services = services[:CHART_PANELS]
        n = len(services)
        cols = 1 if n == 1 else 2
        rows = math.ceil(n / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 3.2 * rows), squeeze=False)
        for i, c in enumerate(services):
            ax = axes[i // cols][i % cols]
            if c.series:
                ax.plot(_dates([p[0] for p in c.series]), [p[1] for p in c.series], color="tab:red", linewidth=1.4)
            _plot_windows(ax, c, "tab:red")
            _shade(ax, c, c.change_time, legend=(i == 0), change_label="last locality change")
            _withdrawals(ax, c, "tab:red", legend=False)
            ax.set_ylim(bottom=0)
            ax.set_title(f"{c.key}, change {format_time(c.change_time or 0)}\n"
                         f"saved {fmt_change(c.saved, c.saved_stderr, c.saved_significant)}, "
                         f"normalised {fmt_change(c.normalized_saved, c.normalized_stderr, c.significant)}",
                         fontsize=9)
            _rate_axis(ax)
        for j in range(n, rows * cols):
            axes[j // cols][j % cols].axis("off")
        fig.legend(loc="lower center", ncol=3, fontsize=8)
        fig.suptitle("Cross-zone bytes/s around each Service's last locality change"
                     + (f" (the {n} largest normalised savings; {hidden} more Services in the "
                        "table)" if hidden else ""))
        fig.tight_layout(rect=(0, 0.05, 1, 0.97))
    else:
        fig, ax = plt.subplots(figsize=(11, 5.5))
        ranked = sorted(services, key=lambda c: -c.before.cross_zone_bytes_per_second)
        colors = [f"C{i}" for i in range(10)]
        for i, c in enumerate(ranked[:MAX_LINES]):
            color = colors[i % len(colors)]
            if c.series:
                ax.plot(_dates([p[0] for p in c.series]), [p[1] for p in c.series], color=color,
                        linewidth=1.4, label=str(c.key))
            _plot_windows(ax, c, color)
            _withdrawals(ax, c, color, legend=True)
        rest = ranked[MAX_LINES:]
        if rest:
            sums: dict[float, float] = {}
            for c in rest:
                for at, v in c.series:
                    sums[at] = sums.get(at, 0.0) + v
            instants = sorted(sums)
            ax.plot(_dates(instants), [sums[at] for at in instants], color="grey", linewidth=1.2,
                    label=f"{len(rest)} other Services")
        _shade(ax, report.total, report.change_time, legend=True)
        ax.set_ylabel("cross-zone bytes/s")
        ax.set_ylim(bottom=0)
        ax.set_title(chart_title(report), fontsize=10)
        _rate_axis(ax)
        ax.legend(loc="upper right", fontsize=8)
        fig.text(0.01, 0.01, "thick segments: window averages used by the report; thin lines: "
                 "rate() over the query step", fontsize=7, color="dimgrey")
        fig.tight_layout(rect=(0, 0.03, 1, 1))
    try:
        fig.savefig(path, format="png", dpi=110)
    except OSError as err:
        raise InputError(f"cannot write the chart: {err.strerror}", source="--plot",
                         obj=str(path)) from None
    finally:
        plt.close(fig)


def render_html(report: Report, path: str | Path, png_path: str | Path,
                all_rows: bool = False) -> None:
    """Write a self-contained HTML report: the PNG at ``png_path`` embedded as base64, the
    summary table, the non-Service table, zone pairs, warnings and assumptions.

    Raises:
        InputError: a file cannot be read or written.
    """
    try:
        png = base64.b64encode(Path(png_path).read_bytes()).decode("ascii")
    except OSError as err:
        raise InputError(f"cannot read the chart: {err.strerror}", source="--html",
                         obj=str(png_path)) from None
    head = "".join(f"<th>{html.escape(h)}</th>" for h in TABLE_HEADER)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>"
                   for r in table_rows(report, all_rows))
    wl = workload_rows(report, all_rows)
    workloads = ""
    if wl:
        w_head = "".join(f"<th>{html.escape(h)}</th>" for h in WORKLOAD_HEADER)
        w_body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>"
                         for r in wl)
        workloads = (f"<h2>Non-Service traffic</h2><table><tr>{w_head}</tr>{w_body}</table>")
    doc = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>zonemeter report</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}td:first-child{{text-align:left}}
tr:last-child{{font-weight:bold}}pre{{background:#f6f6f6;padding:1em}}</style></head>
<body><h1>zonemeter: cross-zone savings per Service</h1>
<img alt="cross-zone bytes per second per Service" src="data:image/png;base64,{png}">
<h2>Summary</h2><table><tr>{head}</tr>{body}</table>
{workloads}
<h2>Details</h2><pre>{html.escape(to_table(report, all_rows))}</pre>
</body></html>
"""
    try:
        Path(path).write_text(doc, encoding="utf-8")
    except OSError as err:
        raise InputError(f"cannot write the report: {err.strerror}", source="--html",
                         obj=str(path)) from None
