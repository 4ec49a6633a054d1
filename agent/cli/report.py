"""``zonemeter report``: before/after cross-zone bytes and dollars per Service, from Prometheus.

Reads the agents' series from a Prometheus HTTP API (never the agents directly) and
prints, per Service, the traffic of a before and an after window, the cross-zone bytes/s
saved (observed and normalised for traffic volume) and the dollars a month that is worth.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agent.errors import InputError
from agent.report.compute import (
    MIN_WINDOW_SECONDS,
    Report,
    ServiceKey,
    report_for_windows,
    report_per_service,
    windows_around,
)
from agent.report.pricing import parse_price
from agent.report.prom import PromClient
from agent.report.render import Hidden, shown, to_csv, to_json, to_table
from agent.report.timespec import format_time, parse_duration, parse_time, parse_window, validate_windows

EXAMPLES = """\
examples:
  zonemeter report --prometheus http://prometheus:9090 --before -14d..-7d --after -7d..now
  zonemeter report --prometheus http://prometheus:9090 --change-time 2025-01-06T10:00:00Z \\
      --window 2d --service shop/cart --price gcp -o json
  zonemeter report --prometheus http://prometheus:9090 --window 1d --plot saved.png \\
      --html saved.html          # windows around each Service's last locality change

times: RFC 3339 (2025-01-06T10:00:00Z), relative (-7d, -2h30m), now, or Unix seconds.
exit codes: 0 success, 1 runtime failure, 2 bad input (bad flag, unreachable Prometheus,
no data in a window, overlapping or reversed windows, unknown price).
"""

_SERVICE_RE = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?)/([a-z0-9]([-a-z0-9]*[a-z0-9])?)$")


def register(subparsers: Any) -> None:
    """Add the ``report`` verb to the top-level subparsers."""
    p = subparsers.add_parser(
        "report", help="before/after cross-zone bytes and $ per Service, from Prometheus",
        description=(__doc__ or "").replace("``", ""), epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prometheus", required=True, metavar="URL",
                   help="Prometheus HTTP API base URL, e.g. http://prometheus:9090")
    p.add_argument("--before", metavar="T1..T2", help="the before window")
    p.add_argument("--after", metavar="T3..T4", help="the after window")
    p.add_argument("--change-time", metavar="T",
                   help="the change instant; windows are [T-D, T) and [T, T+D)")
    p.add_argument("--window", metavar="D",
                   help="window length D around a change (default 24h, shortened so the "
                   "after window ends by now; a D you give must fit: no after window may end "
                   "in the future)")
    p.add_argument("--service", metavar="NS/NAME", help="only this Service")
    p.add_argument("--price", default="aws", metavar="aws|gcp|azure|USD_PER_GB",
                   help="price per GB crossing zones (default aws: $0.01 each side)")
    p.add_argument("-o", "--output", choices=("table", "json", "csv"), default="table")
    p.add_argument("--plot", metavar="FILE.png", help="write the chart as PNG")
    p.add_argument("--html", metavar="FILE.html", help="write an HTML report with the chart")
    p.add_argument("--all-rows", action="store_true",
                   help="also list Services and zone pairs with no bytes in either window "
                   "(hidden by default, and counted)")
    p.add_argument("--now", metavar="T", help=argparse.SUPPRESS)  # reproducible tests
    # Relative times start with "-" ("--before -14d..-7d"); let argparse take any "-<digit>..."
    # as a value rather than an unknown option (the verb has no option named like a number).
    p._negative_number_matcher = re.compile(r"^-\d")
    p.set_defaults(func=run)


def parse_service(text: str | None) -> ServiceKey | None:
    """``NS/NAME`` -> :class:`ServiceKey` (``None`` passes through).

    Raises:
        InputError: not two DNS-1123 labels separated by ``/``.
    """
    if text is None:
        return None
    if not _SERVICE_RE.match(text):
        raise InputError(f"{text!r} is not NAMESPACE/NAME", source="--service")
    ns, name = text.split("/")
    return ServiceKey(ns, name)


def build(args: argparse.Namespace) -> Report:
    """Validate the flags and build the report (no output).

    Raises:
        InputError: any bad flag, unreachable Prometheus, no data.
    """
    now = time.time() if args.now is None else parse_time(args.now, time.time(), flag="--now")
    price = parse_price(args.price)
    service = parse_service(args.service)
    window = parse_duration(args.window) if args.window is not None else None
    if (args.before is None) != (args.after is None):
        raise InputError("give both --before and --after, or neither",
                         source="--after" if args.after is None else "--before")
    if args.before is not None and args.change_time is not None:
        raise InputError("give either --before/--after or --change-time, not both",
                         source="--change-time")
    if args.before is not None and window is not None:
        raise InputError("--window applies to --change-time or per-Service change times, "
                         "not to --before/--after", source="--window")
    if window is not None and window < MIN_WINDOW_SECONDS:
        raise InputError(f"{args.window!r} is {window:g} s; each window must be at least "
                         f"{MIN_WINDOW_SECONDS:.0f} s (e.g. 15m, 1d)", source="--window")
    change = None
    if args.change_time is not None:
        change = parse_time(args.change_time, now, flag="--change-time")
        if change > now:
            raise InputError(f"{args.change_time!r} ({format_time(change)}) is in the future",
                             source="--change-time")
        if window is not None and change + window > now + 60:
            raise InputError(f"{args.window!r} after --change-time {format_time(change)} ends "
                             f"{change + window - now:.0f} s in the future: use a --window of at "
                             f"most {max(0.0, now - change):.0f} s", source="--window")
    client = PromClient(args.prometheus)
    with_series = bool(args.plot or args.html)
    if args.before is not None:
        before = parse_window(args.before, now, flag="--before")
        after = parse_window(args.after, now, flag="--after")
        validate_windows(before, after, now)
        return report_for_windows(client, price, before, after, service=service,
                                  with_series=with_series)
    if change is not None:
        t = change
        before, after = windows_around(t, now, window)
        return report_for_windows(client, price, before, after, service=service, change_time=t,
                                  with_series=with_series)
    return report_per_service(client, price, now, window_seconds=window, service=service,
                              with_series=with_series)


def draw(report: Report, png: str | None, page: str | None, all_rows: bool = False) -> None:
    """Write the PNG chart and/or the HTML report (which embeds the chart).

    Raises:
        InputError: a file cannot be written.
    """
    from agent.report import chart  # matplotlib is imported only when drawing

    if png:
        chart.render_png(report, png, all_rows)
    if page:
        if png:
            chart.render_html(report, page, png, all_rows)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                tmp_png = Path(tmp) / "chart.png"
                chart.render_png(report, tmp_png, all_rows)
                chart.render_html(report, page, tmp_png, all_rows)


def run(args: argparse.Namespace) -> int:
    """Run ``zonemeter report``; returns the exit code."""
    for flag, path, suffix in (("--plot", args.plot, ".png"), ("--html", args.html, ".html")):
        if path and not path.lower().endswith(suffix):
            raise InputError(f"{path!r} must end in {suffix}", source=flag)
        if path and not Path(path).resolve().parent.is_dir():
            raise InputError(f"directory of {path!r} does not exist", source=flag)
    report = build(args)
    if args.plot or args.html:
        draw(report, args.plot, args.html, args.all_rows)
    if args.output == "json":
        json.dump(to_json(report, args.all_rows), sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif args.output == "csv":
        sys.stdout.write(to_csv(report, args.all_rows))
        # a CSV has no place for a note: say on stderr what the rows leave out
        note = shown(report, args.all_rows)[1]
        if note.services:
            sys.stderr.write(f"zonemeter: {Hidden(services=note.services).line()}\n")
    else:
        sys.stdout.write(to_table(report, args.all_rows))
    return 0
