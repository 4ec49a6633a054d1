"""Output of ``zonemeter report``: JSON (the contract of docs/report.md), CSV and a text table."""

from __future__ import annotations

import csv
import io
from typing import Any

from agent.report.compute import Change, Report, WindowStats
from agent.report.timespec import format_time

#: CSV columns, in order (``kind`` is ``service`` or ``total``)
CSV_COLUMNS: tuple[str, ...] = (
    "kind", "namespace", "name",
    "before_start", "before_end", "after_start", "after_end",
    *(f"{w}_{f}" for w in ("before", "after") for f in (
        "bytes_per_second", "cross_zone_bytes_per_second", "cross_zone_fraction",
        "hint_ignored_bytes_per_second", "locality_in_effect_share")),
    "cross_zone_bytes_per_second_saved", "normalized_cross_zone_bytes_per_second_saved",
    "usd_per_month_saved", "warnings",
)


def window_json(w: WindowStats) -> dict[str, Any]:
    """``W`` of the JSON contract, plus ``cross_zone_by_pair``.

    Returns:
        ``{"bytes_per_second": float, "cross_zone_bytes_per_second": float,
        "cross_zone_fraction": float | None, "hint_ignored_bytes_per_second": float,
        "locality_in_effect_share": float | None, "cross_zone_by_pair": [{"direction",
        "client_zone", "server_zone", "bytes_per_second"}]}``; rates in bytes/s.
    """
    return {
        "bytes_per_second": w.bytes_per_second,
        "cross_zone_bytes_per_second": w.cross_zone_bytes_per_second,
        "cross_zone_fraction": w.cross_zone_fraction,
        "hint_ignored_bytes_per_second": w.hint_ignored_bytes_per_second,
        "locality_in_effect_share": w.locality_in_effect_share,
        "cross_zone_by_pair": [
            {"direction": p.direction, "client_zone": p.client_zone,
             "server_zone": p.server_zone, "bytes_per_second": p.bytes_per_second}
            for p in w.cross_zone_pairs],
    }


def _change_json(c: Change) -> dict[str, Any]:
    return {
        "before": window_json(c.before),
        "after": window_json(c.after),
        "cross_zone_bytes_per_second_saved": c.saved,
        "normalized_cross_zone_bytes_per_second_saved": c.normalized_saved,
        "usd_per_month_saved": c.usd_per_month_saved,
    }


def to_json(report: Report) -> dict[str, Any]:
    """The report as the JSON object docs/report.md specifies (times in Unix seconds).

    Extra keys beyond the issue's schema: ``change_time``, ``assumptions``, ``warnings`` at
    the top; ``windows`` and ``change_time`` per Service (each Service has its own windows
    when they come from its last locality change, and the top-level windows are then
    ``null``); ``cross_zone_by_pair`` in each window; ``warnings`` in the total.
    """
    services = []
    for c in report.services:
        assert c.key is not None
        entry: dict[str, Any] = {"namespace": c.key.namespace, "name": c.key.name}
        entry.update(_change_json(c))
        entry["warnings"] = list(c.warnings)
        entry["windows"] = {"before": c.before.window.as_list(), "after": c.after.window.as_list()}
        entry["change_time"] = c.change_time
        services.append(entry)
    total = _change_json(report.total)
    total["warnings"] = list(report.total.warnings)
    return {
        "price": {"name": report.price.name,
                  "usd_per_gb_crossing": report.price.usd_per_gb_crossing},
        "windows": {"before": report.before.as_list() if report.before else None,
                    "after": report.after.as_list() if report.after else None},
        "change_time": report.change_time,
        "services": services,
        "total": total,
        "assumptions": list(report.assumptions),
        "warnings": list(report.warnings),
    }


def _num(v: float | None) -> str:
    return "" if v is None else repr(float(v))


def to_csv(report: Report) -> str:
    """One row per Service and a ``total`` row; columns :data:`CSV_COLUMNS`; rates in
    bytes/s, fractions 0..1, times in Unix seconds, empty cell for an undefined value."""
    buf = io.StringIO()
    out = csv.writer(buf, lineterminator="\n")
    out.writerow(CSV_COLUMNS)
    for c in (*report.services, report.total):
        row: list[str] = ["service" if c.key else "total",
                          c.key.namespace if c.key else "", c.key.name if c.key else ""]
        if c.key is None and report.before is None:
            row += ["", "", "", ""]  # per-Service windows: the total has none of its own
        else:
            row += [_num(c.before.window.start), _num(c.before.window.end),
                    _num(c.after.window.start), _num(c.after.window.end)]
        for w in (c.before, c.after):
            row += [_num(w.bytes_per_second), _num(w.cross_zone_bytes_per_second),
                    _num(w.cross_zone_fraction), _num(w.hint_ignored_bytes_per_second),
                    _num(w.locality_in_effect_share)]
        row += [_num(c.saved), _num(c.normalized_saved), _num(c.usd_per_month_saved),
                "; ".join(c.warnings)]
        out.writerow(row)
    return buf.getvalue()


def fmt_rate(v: float | None) -> str:
    """Bytes/s for people: ``1.23 MB/s`` (decimal units), ``-`` when undefined."""
    if v is None:
        return "-"
    sign = "-" if v < 0 else ""
    a = abs(v)
    for unit, div in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if a >= div:
            return f"{sign}{a / div:.3g} {unit}"
    return f"{sign}{a:.3g} B/s"


def fmt_share(v: float | None) -> str:
    """A 0..1 share as a percentage, ``-`` when undefined."""
    return "-" if v is None else f"{v * 100:.0f}%"


def fmt_usd(v: float | None) -> str:
    """USD with cents, ``-`` when undefined."""
    if v is None:
        return "-"
    return f"-${-v:,.2f}" if v < 0 else f"${v:,.2f}"


TABLE_HEADER: tuple[str, ...] = (
    "SERVICE", "BYTES/S before>after", "CROSS-ZONE/S before>after", "XZ% before>after",
    "HINT-IGNORED/S after", "LOCALITY before>after", "SAVED/S", "NORM SAVED/S", "$/MONTH")


def table_rows(report: Report) -> list[tuple[str, ...]]:
    """Rows of the summary table (Services then ``TOTAL``), as strings."""
    rows: list[tuple[str, ...]] = []
    for c in (*report.services, report.total):
        rows.append((
            str(c.key) if c.key else "TOTAL",
            f"{fmt_rate(c.before.bytes_per_second)} > {fmt_rate(c.after.bytes_per_second)}",
            f"{fmt_rate(c.before.cross_zone_bytes_per_second)} > "
            f"{fmt_rate(c.after.cross_zone_bytes_per_second)}",
            f"{fmt_share(c.before.cross_zone_fraction)} > {fmt_share(c.after.cross_zone_fraction)}",
            fmt_rate(c.after.hint_ignored_bytes_per_second),
            f"{fmt_share(c.before.locality_in_effect_share)} > "
            f"{fmt_share(c.after.locality_in_effect_share)}",
            fmt_rate(c.saved), fmt_rate(c.normalized_saved), fmt_usd(c.usd_per_month_saved)))
    return rows


def _grid(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=False)).rstrip()]
    for r in rows:
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths, strict=False))).rstrip())
    return lines


def to_table(report: Report) -> str:
    """The report for a terminal: windows, summary table, cross-zone pairs, warnings,
    assumptions."""
    lines = []
    if report.before and report.after:
        lines.append(f"before: {format_time(report.before.start)} .. {format_time(report.before.end)}"
                     f"   after: {format_time(report.after.start)} .. {format_time(report.after.end)}")
    else:
        lines.append("windows: per Service, around its last locality change (see below)")
    lines.append("")
    lines += _grid(TABLE_HEADER, table_rows(report))
    lines.append("")
    lines.append("cross-zone bytes/s by direction and zone pair (before > after):")
    for c in report.services:
        assert c.key is not None
        head = f"  {c.key}"
        if report.before is None:
            head += (f"  (change {format_time(c.change_time or 0)}; before "
                     f"{format_time(c.before.window.start)}..{format_time(c.before.window.end)}, "
                     f"after {format_time(c.after.window.start)}..{format_time(c.after.window.end)})")
        lines.append(head)
        keys = {(p.direction, p.client_zone, p.server_zone): [p.bytes_per_second, 0.0]
                for p in c.before.cross_zone_pairs}
        for p in c.after.cross_zone_pairs:
            keys.setdefault((p.direction, p.client_zone, p.server_zone), [0.0, 0.0])[1] = \
                p.bytes_per_second
        if not keys:
            lines.append("    (none)")
        for (direction, cz, sz), (b, a) in keys.items():
            lines.append(f"    {direction:<8} {cz} -> {sz}: {fmt_rate(b)} > {fmt_rate(a)}")
    warn = [f"{c.key}: {w}" for c in report.services for w in c.warnings]
    warn += [f"total: {w}" for w in report.total.warnings] + list(report.warnings)
    if warn:
        lines.append("")
        lines.append("warnings:")
        lines += [f"  ! {w}" for w in warn]
    lines.append("")
    lines.append("assumptions:")
    lines += [f"  - {a}" for a in report.assumptions]
    return "\n".join(lines) + "\n"
