"""Output of ``zonemeter report``: JSON (the contract of docs/report.md), CSV and a text table."""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from typing import Any

from agent.report.compute import (
    NO_SIGNIFICANT_CHANGE,
    SIGNIFICANCE_Z,
    Change,
    ClassCost,
    Report,
    WindowStats,
    class_rates,
    merged_pairs,
)
from agent.report.timespec import format_time
from agent.report.workloads import WorkloadChange

#: CSV columns, in order (``kind`` is ``service``, ``total``, ``workload`` or
#: ``workload_total``; a ``workload`` row's ``name`` is the workload, and only those rows
#: fill ``workload_kind`` and ``remote_kind``)
CSV_COLUMNS: tuple[str, ...] = (
    "kind", "namespace", "name",
    "before_start", "before_end", "after_start", "after_end",
    *(f"{w}_{f}" for w in ("before", "after") for f in (
        "bytes_per_second", "cross_zone_bytes_per_second", "cross_zone_fraction",
        "hint_ignored_bytes_per_second", "locality_in_effect_share")),
    "cross_zone_bytes_per_second_saved", "cross_zone_bytes_per_second_saved_stderr",
    "cross_zone_bytes_per_second_saved_significant",
    "normalized_cross_zone_bytes_per_second_saved",
    "normalized_cross_zone_bytes_per_second_saved_stderr", "significant", "change",
    "usd_per_month_saved", "warnings", "workload_kind", "remote_kind",
)


@dataclass(frozen=True, slots=True)
class Hidden:
    """All-zero rows left out of an output (no bytes in either window).

    Attributes:
        services: Services with 0 bytes/s in both windows.
        zone_pairs: zone pairs (of the Services shown) with 0 cross-zone bytes/s in both.
    """

    services: int = 0
    zone_pairs: int = 0

    def line(self) -> str:
        """One line saying what was hidden and how to see it, ``""`` when nothing was."""
        parts = []
        if self.services:
            parts.append(f"{self.services} Service{'s' if self.services != 1 else ''}")
        if self.zone_pairs:
            parts.append(f"{self.zone_pairs} zone pair{'s' if self.zone_pairs != 1 else ''}")
        if not parts:
            return ""
        return (f"hidden: {' and '.join(parts)} with no bytes in either window "
                "(--all-rows shows them)")


def _zero_service(c: Change) -> bool:
    return c.before.bytes_per_second == 0 and c.after.bytes_per_second == 0


def shown_workloads(report: Report, all_rows: bool = False) -> tuple[list[WorkloadChange], int]:
    """The non-Service rows an output lists and how many all-zero ones it hides."""
    if all_rows:
        return list(report.workloads), 0
    keep = [w for w in report.workloads if not _zero_service(w.change)]
    return keep, len(report.workloads) - len(keep)


def pair_rows(c: Change) -> list[tuple[tuple[str, str, str], float, float]]:
    """``[((direction, client_zone, server_zone), before, after)]`` of one change, bytes/s,
    in the before window's order then the after window's new pairs."""
    keys: dict[tuple[str, str, str], list[float]] = {
        k: [v, 0.0] for k, v in merged_pairs(c.before.cross_zone_pairs).items()}
    for k, v in merged_pairs(c.after.cross_zone_pairs).items():
        keys.setdefault(k, [0.0, 0.0])[1] = v
    return [(k, b, a) for k, (b, a) in keys.items()]


def shown(report: Report, all_rows: bool = False) -> tuple[list[Change], Hidden]:
    """The Services an output lists and what it hides.

    Args:
        report: the report.
        all_rows: keep all-zero rows.

    Returns:
        ``(services, hidden)``: without ``all_rows`` the Services with no bytes in either
        window are left out, and ``hidden`` counts them and the all-zero zone pairs of the
        Services kept.
    """
    if all_rows:
        return list(report.services), Hidden()
    keep = [c for c in report.services if not _zero_service(c)]
    pairs = sum(1 for c in keep for _, b, a in pair_rows(c) if b == 0 and a == 0)
    return keep, Hidden(len(report.services) - len(keep), pairs)


def window_json(w: WindowStats, drop_pairs: frozenset[tuple[str, str, str]] = frozenset()
                ) -> dict[str, Any]:
    """``W`` of the JSON contract, plus ``cross_zone_by_pair`` and the noise.

    Args:
        w: the window's statistics.
        drop_pairs: ``(direction, client_zone, server_zone)`` left out (all-zero rows).

    Returns:
        ``{"bytes_per_second": float, "cross_zone_bytes_per_second": float,
        "cross_zone_fraction": float | None, "hint_ignored_bytes_per_second": float,
        "locality_in_effect_share": float | None, "cross_zone_by_pair": [{"direction",
        "client_zone", "server_zone", "bytes_per_second"}] (summed over client classes),
        "cross_zone_by_class": [{"client_kind", "lb_type", "bytes_per_second"}],
        "bytes_per_second_stderr",
        "cross_zone_bytes_per_second_stderr": float | None, "sub_windows": int | None,
        "sub_window_seconds": float | None}``; rates and standard errors in bytes/s.
    """
    sp = w.spread
    return {
        "bytes_per_second": w.bytes_per_second,
        "cross_zone_bytes_per_second": w.cross_zone_bytes_per_second,
        "cross_zone_fraction": w.cross_zone_fraction,
        "hint_ignored_bytes_per_second": w.hint_ignored_bytes_per_second,
        "locality_in_effect_share": w.locality_in_effect_share,
        "cross_zone_by_pair": [
            {"direction": d, "client_zone": cz, "server_zone": sz, "bytes_per_second": v}
            for (d, cz, sz), v in merged_pairs(w.cross_zone_pairs).items()
            if (d, cz, sz) not in drop_pairs],
        "cross_zone_by_class": [
            {"client_kind": kind, "lb_type": lb, "bytes_per_second": v}
            for (kind, lb), v in class_rates(w.cross_zone_pairs).items()],
        "bytes_per_second_stderr": None if sp is None else math.sqrt(sp.var_bytes),
        "cross_zone_bytes_per_second_stderr": None if sp is None else math.sqrt(sp.var_cross),
        "sub_windows": None if sp is None else sp.sub_windows,
        "sub_window_seconds": None if sp is None else sp.seconds,
    }


def _change_json(c: Change, all_rows: bool = True) -> dict[str, Any]:
    drop = frozenset() if all_rows else frozenset(
        k for k, b, a in pair_rows(c) if b == 0 and a == 0)
    return {
        "before": window_json(c.before, drop),
        "after": window_json(c.after, drop),
        "cross_zone_bytes_per_second_saved": c.saved,
        "cross_zone_bytes_per_second_saved_stderr": c.saved_stderr,
        "cross_zone_bytes_per_second_saved_significant": c.saved_significant,
        "normalized_cross_zone_bytes_per_second_saved": c.normalized_saved,
        "normalized_cross_zone_bytes_per_second_saved_stderr": c.normalized_stderr,
        "billed_normalized_cross_zone_bytes_per_second_saved": c.billed_normalized_saved,
        "significant": c.significant,
        "change": c.verdict,
        "usd_per_month_saved": c.usd_per_month_saved,
    }


def to_json(report: Report, all_rows: bool = False) -> dict[str, Any]:
    """The report as the JSON object docs/report.md specifies (times in Unix seconds).

    Extra keys beyond the issue's schema: ``change_time``, ``assumptions``, ``warnings``,
    ``hidden_all_zero_rows`` (``{"services", "zone_pairs"}``) at the top; ``windows`` and
    ``change_time`` per Service (each Service has its own windows when they come from its
    last locality change, and the top-level windows are then ``null``); ``cross_zone_by_pair``
    and the noise in each window; the standard errors, ``significant`` and ``change`` per
    change; ``warnings`` in the total. Without ``all_rows`` all-zero Services and zone pairs
    are left out (and counted).
    """
    kept, hidden = shown(report, all_rows)
    services = []
    for c in kept:
        assert c.key is not None
        entry: dict[str, Any] = {"namespace": c.key.namespace, "name": c.key.name}
        entry.update(_change_json(c, all_rows))
        entry["warnings"] = list(c.warnings)
        entry["windows"] = {"before": c.before.window.as_list(), "after": c.after.window.as_list()}
        entry["change_time"] = c.change_time
        services.append(entry)
    total = _change_json(report.total, all_rows)
    total["warnings"] = list(report.total.warnings)
    workloads = []
    for w in shown_workloads(report, all_rows)[0]:
        row: dict[str, Any] = {"namespace": w.key.namespace, "workload": w.key.workload,
                               "workload_kind": w.key.kind, "remote_kind": w.key.remote_kind}
        row.update(_change_json(w.change, all_rows))
        for side in ("before", "after"):  # locality and hints do not apply to these bytes
            del row[side]["hint_ignored_bytes_per_second"], row[side]["locality_in_effect_share"]
        row["warnings"] = list(w.change.warnings)
        workloads.append(row)
    workload_total = None
    if report.workload_total is not None:
        workload_total = _change_json(report.workload_total, all_rows)
        for side in ("before", "after"):
            del (workload_total[side]["hint_ignored_bytes_per_second"],
                 workload_total[side]["locality_in_effect_share"])
        workload_total["warnings"] = list(report.workload_total.warnings)
    return {
        "price": {"name": report.price.name,
                  "usd_per_gb_crossing": report.price.usd_per_gb_crossing},
        "windows": {"before": report.before.as_list() if report.before else None,
                    "after": report.after.as_list() if report.after else None},
        "change_time": report.change_time,
        "services": services,
        "total": total,
        "workloads": workloads,
        "workloads_total": workload_total,
        "hidden_all_zero_rows": {"services": hidden.services, "zone_pairs": hidden.zone_pairs,
                                 "workloads": shown_workloads(report, all_rows)[1]},
        "classes": [class_json(k) for k in report.classes],
        "assumptions": list(report.assumptions),
        "warnings": list(report.warnings),
    }


def class_json(k: ClassCost) -> dict[str, Any]:
    """One ``classes`` entry: ``{"scope", "client_kind", "lb_type",
    "before_cross_zone_bytes_per_second", "after_cross_zone_bytes_per_second", "billed",
    "usd_per_month_before", "usd_per_month_after", "reason", "source", "sure"}``."""
    return {"scope": k.scope, "client_kind": k.client_kind, "lb_type": k.lb_type,
            "before_cross_zone_bytes_per_second": k.before,
            "after_cross_zone_bytes_per_second": k.after, "billed": k.billed,
            "usd_per_month_before": k.usd_per_month_before,
            "usd_per_month_after": k.usd_per_month_after,
            "reason": k.reason, "source": k.source, "sure": k.sure}


def class_label(kind: str, lb_type: str) -> str:
    """A class for people: ``pod``, ``load-balancer aws-alb``, ``(no class)`` for series of
    agents from before client classes."""
    if not kind:
        return "(no class)"
    return f"{kind} {lb_type}" if kind == "load-balancer" and lb_type else kind


CLASS_HEADER: tuple[str, ...] = ("CLIENT CLASS", "CROSS-ZONE/S before>after", "BILLED",
                                 "$/MONTH before>after", "WHY")


def class_rows(report: Report, scope: str) -> list[tuple[str, ...]]:
    """Rows of the by-class table of one scope (``services`` or ``workloads``)."""
    rows: list[tuple[str, ...]] = []
    for k in report.classes:
        if k.scope != scope:
            continue
        rows.append((
            class_label(k.client_kind, k.lb_type),
            f"{fmt_rate(k.before)} > {fmt_rate(k.after)}",
            "yes" if k.billed else "no",
            f"{fmt_usd(k.usd_per_month_before)} > {fmt_usd(k.usd_per_month_after)}",
            k.reason + ("" if k.sure else " (unsure: docs/report.md)")))
    return rows


def _num(v: float | None) -> str:
    return "" if v is None else repr(float(v))


def _bool(v: bool | None) -> str:
    return "" if v is None else ("true" if v else "false")


def to_csv(report: Report, all_rows: bool = False) -> str:
    """One row per Service and a ``total`` row, then one per non-Service row (``workload``,
    hint and locality cells empty) and their ``workload_total``; columns
    :data:`CSV_COLUMNS`; rates and
    standard errors in bytes/s, fractions 0..1, times in Unix seconds, booleans
    ``true``/``false``, empty cell for an undefined value; ``change`` is the verdict text
    (``saved``, ``cost rose``, ``no significant change``, ...). Without ``all_rows`` the
    Services with no bytes in either window are left out (:func:`shown` counts them)."""
    buf = io.StringIO()
    out = csv.writer(buf, lineterminator="\n")
    out.writerow(CSV_COLUMNS)
    rows: list[tuple[str, str, str, Change, tuple[str, str]]] = [
        ("service" if c.key else "total", c.key.namespace if c.key else "",
         c.key.name if c.key else "", c, ("", ""))
        for c in (*shown(report, all_rows)[0], report.total)]
    rows += [("workload", w.key.namespace, w.key.workload, w.change,
              (w.key.kind, w.key.remote_kind)) for w in shown_workloads(report, all_rows)[0]]
    if report.workload_total is not None:
        rows.append(("workload_total", "", "", report.workload_total, ("", "")))
    for kind, namespace, name, c, extra in rows:
        row: list[str] = [kind, namespace, name]
        if kind == "total" and report.before is None:
            row += ["", "", "", ""]  # per-Service windows: the total has none of its own
        else:
            row += [_num(c.before.window.start), _num(c.before.window.end),
                    _num(c.after.window.start), _num(c.after.window.end)]
        service_row = kind in ("service", "total")  # hints and locality: Services only
        for w in (c.before, c.after):
            row += [_num(w.bytes_per_second), _num(w.cross_zone_bytes_per_second),
                    _num(w.cross_zone_fraction),
                    _num(w.hint_ignored_bytes_per_second) if service_row else "",
                    _num(w.locality_in_effect_share) if service_row else ""]
        row += [_num(c.saved), _num(c.saved_stderr), _bool(c.saved_significant),
                _num(c.normalized_saved), _num(c.normalized_stderr), _bool(c.significant),
                c.verdict, _num(c.usd_per_month_saved), "; ".join(c.warnings), *extra]
        out.writerow(row)
    return buf.getvalue()


#: decimal rate units, largest first
_RATE_UNITS: tuple[tuple[str, float], ...] = (
    ("PB/s", 1e15), ("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3))


def _digits(x: float) -> str:
    """A non-negative number with at most 3 significant digits (2 decimals below 1), in
    positional notation, trailing zeros dropped."""
    text = f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def fmt_rate(v: float | None) -> str:
    """Bytes/s for people: ``1.23 MB/s`` (decimal units B/s .. PB/s, 3 significant digits,
    never scientific notation; ``<0.01 B/s`` for a non-zero magnitude below that), ``-``
    when undefined."""
    if v is None or not math.isfinite(v):
        return "-"
    if v == 0:
        return "0 B/s"
    sign = "-" if v < 0 else ""
    a = float(f"{abs(v):.3g}")  # round first, so 999.7 B/s becomes 1 kB/s
    for unit, div in _RATE_UNITS:
        if a >= div:
            return f"{sign}{_digits(a / div)} {unit}"
    if a < 0.005:
        return "<0.01 B/s"  # either sign: a rounding residue, not a rate
    return f"{sign}{_digits(a)} B/s"


def fmt_share(v: float | None) -> str:
    """A 0..1 share as a percentage, ``-`` when undefined."""
    return "-" if v is None else f"{v * 100:.0f}%"


def fmt_usd(v: float | None) -> str:
    """USD with cents, ``-`` when undefined."""
    if v is None:
        return "-"
    return f"-${-v:,.2f}" if v < 0 else f"${v:,.2f}"


def fmt_change(v: float | None, stderr: float | None, sig: bool | None) -> str:
    """A cross-zone bytes/s change for the table: ``2.7 MB/s ±24 kB/s`` (a saving),
    ``rose 300 kB/s ±24 kB/s`` (more cross-zone bytes), ``no significant change (±24 kB/s)``;
    the ``±`` is the noise threshold, :data:`~agent.report.compute.SIGNIFICANCE_Z` standard
    errors; ``(noise unknown)`` without one; ``-`` when undefined."""
    if v is None:
        return "-"
    if stderr is None or sig is None:
        return (f"rose {fmt_rate(-v)}" if v < 0 else fmt_rate(v)) + " (noise unknown)"
    noise = f"±{fmt_rate(SIGNIFICANCE_Z * stderr)}"
    if not sig:
        return f"{NO_SIGNIFICANT_CHANGE} ({noise})"
    return f"rose {fmt_rate(-v)} {noise}" if v < 0 else f"{fmt_rate(v)} {noise}"


def fmt_dollars(c: Change, per: str = "") -> str:
    """What a change is worth: ``$35.50`` saved, ``cost rose $4.10``, ``no significant
    change``, ``noise unknown`` or ``-`` (undefined); ``per`` (e.g. ``/month``) follows the
    amount. Never a negative amount."""
    verdict = c.verdict
    usd = c.usd_per_month_saved
    if verdict == "saved" and usd is not None:
        return f"{fmt_usd(usd)}{per}"
    if verdict == "cost rose" and usd is not None:
        return f"cost rose {fmt_usd(-usd)}{per}"
    return "-" if verdict == "undefined" else verdict


TABLE_HEADER: tuple[str, ...] = (
    "SERVICE", "BYTES/S before>after", "CROSS-ZONE/S before>after", "XZ% before>after",
    "HINT-IGNORED/S after", "LOCALITY before>after", "SAVED/S", "NORM SAVED/S", "$/MONTH SAVED")


def table_rows(report: Report, all_rows: bool = False) -> list[tuple[str, ...]]:
    """Rows of the summary table (Services then ``TOTAL``), as strings; all-zero Services
    left out unless ``all_rows``."""
    rows: list[tuple[str, ...]] = []
    for c in (*shown(report, all_rows)[0], report.total):
        rows.append((
            str(c.key) if c.key else "TOTAL",
            f"{fmt_rate(c.before.bytes_per_second)} > {fmt_rate(c.after.bytes_per_second)}",
            f"{fmt_rate(c.before.cross_zone_bytes_per_second)} > "
            f"{fmt_rate(c.after.cross_zone_bytes_per_second)}",
            f"{fmt_share(c.before.cross_zone_fraction)} > {fmt_share(c.after.cross_zone_fraction)}",
            fmt_rate(c.after.hint_ignored_bytes_per_second),
            f"{fmt_share(c.before.locality_in_effect_share)} > "
            f"{fmt_share(c.after.locality_in_effect_share)}",
            fmt_change(c.saved, c.saved_stderr, c.saved_significant),
            fmt_change(c.normalized_saved, c.normalized_stderr, c.significant),
            fmt_dollars(c)))
    return rows


WORKLOAD_HEADER: tuple[str, ...] = (
    "WORKLOAD", "REMOTE", "BYTES/S before>after", "CROSS-ZONE/S before>after",
    "XZ% before>after", "SAVED/S", "NORM SAVED/S", "$/MONTH SAVED")


def workload_rows(report: Report, all_rows: bool = False) -> list[tuple[str, ...]]:
    """Rows of the non-Service table (workloads then ``TOTAL``), as strings; all-zero rows
    left out unless ``all_rows``; empty when the report has no non-Service rows."""
    if report.workload_total is None:
        return []
    rows: list[tuple[str, ...]] = []
    entries = [(f"{w.key.namespace}/{w.key.workload} ({w.key.kind})", w.key.remote_kind, w.change)
               for w in shown_workloads(report, all_rows)[0]]
    for name, remote, c in (*entries, ("TOTAL", "", report.workload_total)):
        rows.append((
            name, remote,
            f"{fmt_rate(c.before.bytes_per_second)} > {fmt_rate(c.after.bytes_per_second)}",
            f"{fmt_rate(c.before.cross_zone_bytes_per_second)} > "
            f"{fmt_rate(c.after.cross_zone_bytes_per_second)}",
            f"{fmt_share(c.before.cross_zone_fraction)} > {fmt_share(c.after.cross_zone_fraction)}",
            fmt_change(c.saved, c.saved_stderr, c.saved_significant),
            fmt_change(c.normalized_saved, c.normalized_stderr, c.significant),
            fmt_dollars(c)))
    return rows


def _grid(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=False)).rstrip()]
    for r in rows:
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths, strict=False))).rstrip())
    return lines


def to_table(report: Report, all_rows: bool = False) -> str:
    """The report for a terminal: windows, summary table, cross-zone pairs, what was hidden,
    warnings, assumptions. Without ``all_rows`` all-zero Services and zone pairs are left
    out and counted."""
    kept, hidden = shown(report, all_rows)
    lines = []
    if report.before and report.after:
        lines.append(f"before: {format_time(report.before.start)} .. {format_time(report.before.end)}"
                     f"   after: {format_time(report.after.start)} .. {format_time(report.after.end)}")
    else:
        lines.append("windows: per Service, around its last locality change (see below)")
    lines.append("")
    lines += _grid(TABLE_HEADER, table_rows(report, all_rows))
    lines.append("")
    lines.append("cross-zone bytes/s by direction and zone pair (before > after):")
    for c in kept:
        assert c.key is not None
        head = f"  {c.key}"
        if report.before is None:
            head += (f"  (change {format_time(c.change_time or 0)}; before "
                     f"{format_time(c.before.window.start)}..{format_time(c.before.window.end)}, "
                     f"after {format_time(c.after.window.start)}..{format_time(c.after.window.end)})")
        lines.append(head)
        pairs = [(k, b, a) for k, b, a in pair_rows(c) if all_rows or b != 0 or a != 0]
        if not pairs:
            lines.append("    (none)")
        for (direction, cz, sz), b, a in pairs:
            lines.append(f"    {direction:<8} {cz} -> {sz}: {fmt_rate(b)} > {fmt_rate(a)}")
    for scope, what in (("services", "Service bytes by the client's class"),
                        ("workloads", "non-Service bytes by the remote's class")):
        rows = class_rows(report, scope)
        if rows:
            lines.append("")
            lines.append(f"cross-zone {what} and their cost at the price ({report.price.name}):")
            lines += ["  " + ln for ln in _grid(CLASS_HEADER, rows)]
    wl, wl_hidden = shown_workloads(report, all_rows)
    if report.workload_total is not None:
        lines.append("")
        lines.append("non-Service traffic (zonemeter_workload_bytes_total: pod to pod without a "
                     "Service, pod to node, pod to outside peers), by workload and remote kind:")
        lines += _grid(WORKLOAD_HEADER, workload_rows(report, all_rows))
        if wl_hidden:
            lines.append(f"hidden: {wl_hidden} non-Service row{'s' if wl_hidden != 1 else ''} "
                         "with no bytes in either window (--all-rows shows them)")
    if hidden.line():
        lines.append("")
        lines.append(hidden.line())
    warn = [f"{c.key}: {w}" for c in kept for w in c.warnings]
    warn += [f"total: {w}" for w in report.total.warnings] + list(report.warnings)
    warn += [f"{w.key}: {m}" for w in wl for m in w.change.warnings]
    if report.workload_total is not None:
        warn += [f"non-Service total: {m}" for m in report.workload_total.warnings]
    if warn:
        lines.append("")
        lines.append("warnings:")
        lines += [f"  ! {w}" for w in warn]
    lines.append("")
    lines.append("assumptions:")
    lines += [f"  - {a}" for a in report.assumptions]
    return "\n".join(lines) + "\n"
