"""``zonemeter top``: a live terminal view of one running agent.

Reads the agent's ``/flows`` JSON (agent/exporter/collector.py ``Exporter.flows``) every
``--interval`` seconds and redraws, like ``top``: per-Service bytes/s by crossing
(from the difference of two reads of cumulative counters), locality state, and the
heaviest client -> server pod pairs of the agent's last interval. On a terminal: plain
ANSI clear and redraw, no curses; into a pipe or file: plain snapshots, one after the other,
separated by a blank line (no escape codes).

Examples::

    zonemeter top                                   # http://127.0.0.1:11808
    zonemeter top --url http://127.0.0.1:19900 --interval 2
    zonemeter top -o json                           # one snapshot, then exit
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import select
import shutil
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import IO, Any, TextIO

from agent.errors import InputError, RuntimeFailure

DEFAULT_URL = "http://127.0.0.1:11808"
CROSSING_COLUMNS = ("cross_zone", "cross_region", "same_zone", "same_node", "external", "unknown")
CLEAR = "\x1b[H\x1b[2J"
#: largest ``--interval`` (one day): ``time.sleep`` refuses far larger values
MAX_INTERVAL = 86400.0

_EPILOG = """\
examples:
  zonemeter top
  zonemeter top --url http://127.0.0.1:19900 --interval 2
  zonemeter top -o json            # one /flows snapshot as JSON
  zonemeter top --once             # one table (rates need two reads: shows totals)
"""


def fetch(url: str, top: int = 20, timeout: float = 5.0) -> dict[str, Any]:
    """Return the agent's ``/flows?top=N`` document.

    Raises:
        InputError: ``url`` is not a URL urllib can request.
        RuntimeFailure: unreachable agent, HTTP error, not an HTTP server, or a body that
            is not the document (the message names the first field that is off).
    """
    full = url.rstrip("/") + f"/flows?top={top}"
    try:
        with urllib.request.urlopen(full, timeout=timeout) as resp:
            body = resp.read()
    except urllib.error.HTTPError as err:
        # the agent says why in the body (a 403 names --flows-allow-remote): pass it on
        try:
            said = " ".join(err.read(300).decode("utf-8", "replace").split())
        except OSError:
            said = ""
        raise RuntimeFailure(f"{full}: HTTP {err.code}" + (f": {said}" if said else "")
                             ) from None
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise RuntimeFailure(f"{full}: cannot reach the agent: {reason} (is an agent "
                             "listening there? give its address with --url; "
                             "'zonemeter demo --keep' prints one per lab node)") from None
    except http.client.InvalidURL as err:
        raise InputError(f"not a valid URL: {err}", source="--url") from None
    except http.client.HTTPException as err:  # something that is not an HTTP server
        raise RuntimeFailure(f"{full}: not an HTTP answer: {type(err).__name__}: {err}") from None
    except ValueError as err:  # urllib's own URL checks ("Invalid IPv6 URL")
        raise InputError(f"not a valid URL: {err}", source="--url") from None
    try:
        doc = json.loads(body.decode())
    except (ValueError, RecursionError) as err:
        raise RuntimeFailure(f"{full}: not JSON: {' '.join(str(err).split())[:200]}") from None
    problem = flows_problem(doc)
    if problem is not None:
        raise RuntimeFailure(f"{full}: not a zonemeter /flows document: {problem}")
    out: dict[str, Any] = doc
    return out


def _num(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _counts(value: Any) -> bool:
    """``{str: finite number}``."""
    return isinstance(value, dict) and all(isinstance(k, str) and _num(v) for k, v in value.items())


def flows_problem(doc: Any) -> str | None:
    """Check a ``/flows`` document against what :meth:`agent.exporter.Exporter.flows`
    writes and what :func:`render` reads.

    Returns:
        the first field that is missing or of the wrong type (``services[2].by_crossing``),
        or None when the document is usable.
    """
    if not isinstance(doc, dict):
        return "not an object"
    for key in ("generated_at", "interval_seconds"):
        if key in doc and not _num(doc[key]):
            return key
    services = doc.get("services")
    if not isinstance(services, list):
        return "services"
    for i, s in enumerate(services):
        where = f"services[{i}]"
        if not isinstance(s, dict):
            return where
        for key in ("namespace", "service"):
            if not isinstance(s.get(key), str):
                return f"{where}.{key}"
        for key in ("mode", "reason"):
            if key in s and not isinstance(s[key], str):
                return f"{where}.{key}"
        if not _counts(s.get("by_crossing", {})):
            return f"{where}.by_crossing"
        zones = s.get("locality_in_effect")
        if zones is not None and not (isinstance(zones, dict)
                                      and all(isinstance(z, str) for z in zones)):
            return f"{where}.locality_in_effect"
    pairs = doc.get("pairs", [])
    if not isinstance(pairs, list):
        return "pairs"
    for i, p in enumerate(pairs):
        where = f"pairs[{i}]"
        if not isinstance(p, dict):
            return where
        for key in ("client", "server", "client_zone", "server_zone", "crossing"):
            if not isinstance(p.get(key), str):
                return f"{where}.{key}"
        for key in ("namespace", "service", "client_kind", "lb_type"):
            if key in p and not isinstance(p[key], str):
                return f"{where}.{key}"
        if p.get("service") and "namespace" not in p:
            return f"{where}.namespace"
        if not _num(p.get("bytes")):
            return f"{where}.bytes"
    span = doc.get("pairs_interval")
    if span is not None and not (isinstance(span, list) and len(span) == 2
                                 and all(_num(x) for x in span)):
        return "pairs_interval"
    if "unattributed_bytes" in doc and not (doc["unattributed_bytes"] is None
                                            or _counts(doc["unattributed_bytes"])):
        return "unattributed_bytes"
    me = doc.get("self")
    if me is not None:
        if not isinstance(me, dict):
            return "self"
        for key in ("flow_table_entries", "flow_table_capacity", "attached_interfaces",
                    "collector_duration_seconds"):
            if key in me and not _num(me[key]):
                return f"self.{key}"
        synced = me.get("metadata_synced")
        if synced is not None and not (isinstance(synced, dict)
                                       and all(isinstance(k, str) for k in synced)):
            return "self.metadata_synced"
    return None


def rates(prev: Mapping[str, Any] | None, cur: Mapping[str, Any]) -> dict[tuple[str, str], dict[str, float]]:
    """Per-Service bytes/s by crossing between two ``/flows`` documents.

    Args:
        prev: the earlier document, or None (then rates are not known: empty result).
        cur: the later one.

    Returns:
        ``{(namespace, service): {crossing: bytes per second}}``; an agent restart
        (a counter going down) counts from zero, as Prometheus' ``rate`` does.
    """
    if prev is None:
        return {}
    dt = float(cur.get("generated_at", 0)) - float(prev.get("generated_at", 0))
    if dt <= 0:
        return {}
    before = {(s["namespace"], s["service"]): s.get("by_crossing", {}) for s in prev["services"]}
    out: dict[tuple[str, str], dict[str, float]] = {}
    for s in cur["services"]:
        key = (s["namespace"], s["service"])
        old = before.get(key, {})
        row = {}
        for crossing, value in s.get("by_crossing", {}).items():
            diff = value - old.get(crossing, 0)
            row[crossing] = (diff if diff >= 0 else value) / dt
        out[key] = row
    return out


def _human(n: float, unit: str = "B") -> str:
    for prefix in ("", "Ki", "Mi", "Gi", "Ti"):
        if abs(n) < 1024 or prefix == "Ti":
            return f"{n:.0f}{prefix}{unit}" if prefix == "" else f"{n:.1f}{prefix}{unit}"
        n /= 1024
    return f"{n:.1f}{unit}"  # pragma: no cover


def _locality(s: Mapping[str, Any]) -> str:
    zones = s.get("locality_in_effect") or {}
    if not zones:
        return f"{s.get('mode', 'unknown')}: {s.get('reason', 'unknown')}"
    on = sorted(z for z, v in zones.items() if v)
    state = "on" if len(on) == len(zones) else "off" if not on else "on in " + ",".join(on)
    reason = s.get("reason", "unknown")
    return f"{s.get('mode', 'unknown')} {state}" + ("" if reason == "none" else f" ({reason})")


#: crossing columns shown at every width; the others only when some Service has bytes there
#: or the terminal fits the full table
ALWAYS_SHOWN = ("cross_zone", "same_zone", "same_node")
#: width of the full table (every column at its natural width)
FULL_WIDTH = 136


def pair_class(p: Mapping[str, Any], short: bool = False) -> str:
    """The CLASS cell of a pair row: its client's class (docs/attribution.md, *Client
    classes*), a load balancer as ``lb:<lb_type>`` (``short``: without the cloud's prefix or
    ``-lb`` suffix, ``lb:nlb``, ``lb:gcp``); ``?`` for an agent that does not say."""
    kind = p.get("client_kind")
    if not kind:
        return "?"
    if kind != "load-balancer":
        return str(kind)
    lb = str(p.get("lb_type") or "unknown")
    if short:
        lb = lb.removeprefix("aws-").removesuffix("-lb")
    return f"lb:{lb}"


def _fit(text: str, width: int) -> str:
    """``text`` cut to ``width`` columns, a cut marked with a trailing ``~``."""
    return text if len(text) <= width else text[:max(0, width - 1)] + "~"


def render(cur: Mapping[str, Any], prev: Mapping[str, Any] | None, url: str, pairs: int = 10,
           width: int = 80, keys: bool = False) -> str:
    """Return the text screen for one refresh (no ANSI codes), every line at most ``width``
    columns (at least 60 are used).

    With ``prev`` the Service columns are bytes/s; without it they are cumulative bytes.
    Pair rows are the bytes of the agent's last interval, shown as bytes/s over it. Below
    :data:`FULL_WIDTH` columns the crossing columns without bytes (other than
    :data:`ALWAYS_SHOWN`) are left out, names are cut (marked ``~``) and the locality text
    wraps inside its column. ``keys``: say that
    ``q`` quits (the terminal is read for keys).
    """
    width = max(60, width)
    r = rates(prev, cur)
    per_s = prev is not None
    unit = "B/s" if per_s else "B"
    lines = [f"zonemeter top - {url} - agent interval {cur.get('interval_seconds', 0):g}s - "
             f"{'rates' if per_s else 'totals since start'}" + (" - q quits" if keys else ""), ""]
    rows = []
    for s in cur["services"]:
        key = (s["namespace"], s["service"])
        rows.append((f"{key[0]}/{key[1]}", r.get(key, {}) if per_s else s.get("by_crossing", {}), s))
    full = width >= FULL_WIDTH
    cols = [c for c in CROSSING_COLUMNS
            if full or c in ALWAYS_SHOWN or any(vals.get(c, 0) for _, vals, _ in rows)]
    cell = 12
    cells_w = cell * len(cols)
    name_w = min(32, max(12, width - cells_w - 2 - 24))
    loc_w = max(8, width - name_w - cells_w - 2)
    lines.append(f"{'SERVICE':<{name_w}}" + "".join(f"{c.upper():>{cell}}" for c in cols) + "  LOCALITY")
    for name, vals, s in rows:
        cells = "".join(f"{_human(vals.get(c, 0), unit):>{cell}}" for c in cols)
        # the locality text wraps inside its column rather than being cut: its reason matters
        loc = textwrap.wrap(_locality(s), loc_w, break_on_hyphens=False) or [""]
        lines.append(f"{_fit(name, name_w - 1):<{name_w}}{cells}  {loc[0]}")
        lines.extend(" " * (name_w + cells_w + 2) + more for more in loc[1:])
    if not cur["services"]:
        lines.append("(no Services)")
    lines.append("")
    span = cur.get("pairs_interval")
    dur = (span[1] - span[0]) if span and span[1] > span[0] else 0.0
    cross_w, zones_w, val_w, class_w = (13, 22, 10, 12) if full else (11, 14, 9, 9)
    rest = width - cross_w - zones_w - val_w - class_w
    client_w = server_w = min(29, max(10, rest * 2 // 5))
    svc_w = min(25, max(8, rest - client_w - server_w))
    lines.append(f"{'CLIENT':<{client_w}}{'CLASS':<{class_w}}{'SERVER':<{server_w}}{'SERVICE':<{svc_w}}"
                 f"{'CROSSING':<{cross_w}}{'ZONES':<{zones_w}}{'B/s' if dur else 'BYTES':>{val_w}}")
    for p in cur.get("pairs", [])[:pairs]:
        svc = f"{p['namespace']}/{p['service']}" if p.get("service") else "-"
        zones = f"{p['client_zone']}>{p['server_zone']}"
        val = p["bytes"] / dur if dur else p["bytes"]
        cls = pair_class(p, short=not full)
        lines.append(f"{_fit(p['client'], client_w - 1):<{client_w}}{_fit(cls, class_w - 1):<{class_w}}"
                     f"{_fit(p['server'], server_w - 1):<{server_w}}"
                     f"{_fit(svc, svc_w - 1):<{svc_w}}{_fit(p['crossing'], cross_w - 1):<{cross_w}}"
                     f"{_fit(zones, zones_w - 1):<{zones_w}}{_human(val, ''):>{val_w}}")
    if not cur.get("pairs"):
        lines.append("(no traffic in the last interval)")
    other = {f"unattributed:{k}": v for k, v in (cur.get("unattributed_bytes") or {}).items()}
    me = cur.get("self") or {}
    lines.append("")
    lines.append(f"flow table {me.get('flow_table_entries', 0)}/{me.get('flow_table_capacity', 0)}, "
                 f"{me.get('attached_interfaces', 0)} interfaces, last interval "
                 f"{me.get('collector_duration_seconds', 0):.3f}s")
    lines.append("metadata synced: "
                 + (",".join(k for k, v in (me.get("metadata_synced") or {}).items() if v) or "none")
                 + ("" if not other else "; " + ", ".join(f"{k}={_human(v)}" for k, v in other.items())))
    return "\n".join(_fit(line, width).rstrip() for line in lines).rstrip("\n") + "\n"


def register(subparsers: Any) -> None:
    """Add the ``top`` verb."""
    p = subparsers.add_parser(
        "top", help="live per-Service and per-pod-pair view of a running agent",
        description="Live view of one zonemeter agent: per-Service bytes/s by crossing, "
        "locality state, top client->server pod pairs (reads the agent's /flows).",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default=DEFAULT_URL, help="agent base URL (default %(default)s)")
    p.add_argument("--interval", type=float, default=2.0, metavar="S",
                   help="refresh period, seconds (default %(default)g)")
    p.add_argument("--pairs", type=int, default=10, metavar="N", help="pair rows shown (default 10)")
    p.add_argument("-o", "--output", choices=("table", "json"), default="table",
                   help="json: print one /flows snapshot and exit")
    p.add_argument("--once", action="store_true", help="print one table and exit")
    p.set_defaults(func=run)


class _Keys:
    """Single keys from a terminal (cbreak mode while open, restored on close).

    :meth:`wait` sleeps up to ``timeout`` seconds and returns True as soon as ``q`` is pressed.
    """

    def __init__(self, stream: IO[Any]) -> None:
        import termios
        import tty

        self._fd = stream.fileno()
        self._saved = termios.tcgetattr(self._fd)
        tty.setcbreak(self._fd, termios.TCSANOW)  # keep keys pressed while starting
        self._eof = False

    def wait(self, timeout: float, sleep: Callable[[float], None]) -> bool:
        deadline = time.monotonic() + timeout
        while not self._eof:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            ready, _, _ = select.select([self._fd], [], [], left)
            if ready:
                data = os.read(self._fd, 64)
                if not data:
                    self._eof = True  # a closed terminal: no more keys, plain sleeps
                elif b"q" in data or b"Q" in data:
                    return True
        sleep(max(0.0, deadline - time.monotonic()))
        return False

    def close(self) -> None:
        import termios

        termios.tcsetattr(self._fd, termios.TCSADRAIN, self._saved)


def _keys_of(stream: IO[Any] | None) -> _Keys | None:
    if stream is None or not _isatty(stream):
        return None
    try:
        return _Keys(stream)
    except (OSError, ValueError):  # not a real terminal after all (termios refuses)
        return None


def run(args: argparse.Namespace, out: TextIO | None = None,
        sleep: Callable[[float], None] = time.sleep, max_frames: int | None = None,
        keys: IO[Any] | None = None, width: int | None = None) -> int:
    """Run ``zonemeter top``; returns 0 (ends on ``q`` or Ctrl-C with 0 too).

    Redraws the screen (ANSI clear) only when ``out`` is a terminal (``isatty()``);
    otherwise each refresh is a plain snapshot after a blank line, so
    ``zonemeter top | tail`` gets no escape codes. When ``keys`` (default: stdin) is a
    terminal, ``q`` quits. Lines fit ``width`` columns (default: the terminal's, else
    ``$COLUMNS``, else 80).

    Raises:
        InputError: bad ``--interval``/``--pairs``/``--url`` (exit 2).
        RuntimeFailure: the agent is unreachable (exit 1, one line).
    """
    out = out or sys.stdout
    if not 0 < args.interval <= MAX_INTERVAL:  # NaN fails too
        raise InputError(f"must be > 0 and at most {MAX_INTERVAL:g} seconds, got {args.interval:g}",
                         source="--interval")
    if args.pairs < 0:
        raise InputError("must be >= 0", source="--pairs")
    if not args.url.startswith(("http://", "https://")):
        raise InputError(f"expected http://HOST:PORT, got {args.url!r}", source="--url")
    top = max(args.pairs, 1)
    if args.output == "json":
        json.dump(fetch(args.url, top), out, indent=2, sort_keys=True)
        out.write("\n")
        return 0
    prev: dict[str, Any] | None = None
    frames = 0
    redraw = _isatty(out)
    cols = width or shutil.get_terminal_size((80, 24)).columns
    reader = None if args.once else _keys_of(sys.stdin if keys is None else keys)
    try:
        while True:
            cur = fetch(args.url, top)
            screen = render(cur, prev, args.url, args.pairs, width=cols, keys=reader is not None)
            if not screen.endswith("\n"):
                screen += "\n"
            if args.once:
                out.write(screen)
            elif redraw:
                out.write(CLEAR + screen)
            else:
                out.write(("\n" if frames else "") + screen)
            out.flush()
            frames += 1
            if args.once or (max_frames is not None and frames >= max_frames):
                return 0
            prev = cur
            if reader is None:
                sleep(args.interval)
            elif reader.wait(args.interval, sleep):
                return 0
    except KeyboardInterrupt:
        return 0
    finally:
        if reader is not None:
            reader.close()


def _isatty(out: IO[Any]) -> bool:
    try:
        return bool(out.isatty())
    except (AttributeError, ValueError):
        return False
