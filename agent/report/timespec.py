"""Times, durations and windows for ``zonemeter report``.

Accepted time forms (all resolved to Unix seconds, UTC):

- RFC 3339: ``2025-01-06T10:00:00Z``, ``2025-01-06T10:00:00.5+02:00`` (an offset or ``Z`` is
  required; a bare date ``2025-01-06`` means midnight UTC);
- relative to now: ``-7d``, ``-2h30m``, ``+15m`` (units ``w d h m s``);
- ``now``;
- Unix seconds: ``1736121600`` or ``1736121600.5``.

A window is ``START..END`` with either side in any of the forms above.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from dataclasses import dataclass

from agent.errors import InputError

_UNIT_SECONDS = {"w": 604800, "d": 86400, "h": 3600, "m": 60, "s": 1}
_DURATION_RE = re.compile(r"^(?:(\d+(?:\.\d+)?)([wdhms]))+$")
_DURATION_PART_RE = re.compile(r"(\d+(?:\.\d+)?)([wdhms])")
_UNIX_RE = re.compile(r"^\d{9,11}(?:\.\d+)?$")
_DATE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_RFC3339_RE = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:[Zz]|[+-]\d{2}:\d{2})$")

#: longest duration accepted (100 years): longer ones are typos, and infinite ones broke
#: the PromQL range formatting
MAX_DURATION_SECONDS = 100 * 365 * 86400
#: latest time accepted, Unix seconds (9999-12-31T23:59:59Z, the last one RFC 3339 can write)
MAX_TIME_SECONDS = 253402300799.0

#: query steps the report picks from, in seconds
NICE_STEPS_SECONDS: tuple[int, ...] = (
    1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
#: most evaluation points per window (Prometheus refuses more than 11,000 per series)
MAX_POINTS_PER_WINDOW = 1000


@dataclass(frozen=True, slots=True)
class Window:
    """A half-open time window ``[start, end)`` in Unix seconds (UTC).

    Attributes:
        start: first instant, Unix seconds.
        end: end instant, Unix seconds; always greater than ``start``.
    """

    start: float
    end: float

    @property
    def seconds(self) -> float:
        """Length of the window in seconds."""
        return self.end - self.start

    def as_list(self) -> list[float]:
        """``[start, end]`` in Unix seconds, the JSON form."""
        return [self.start, self.end]


def parse_duration(text: str, *, flag: str = "--window") -> float:
    """Parse a duration such as ``90s``, ``15m``, ``2h30m``, ``7d``, ``1w`` into seconds.

    Args:
        text: the duration; a sequence of ``<number><unit>`` with units ``w d h m s``.
        flag: the flag name used in error messages.

    Returns:
        The duration in seconds (> 0).

    Raises:
        InputError: the text is empty, not a duration, a bare number without a unit, uses
            ``M`` (minutes or months?), is zero or longer than 100 years.
    """
    if "M" in text:
        raise InputError(f"{text!r} is ambiguous: use m for minutes (months are not accepted; "
                         "use e.g. 30d)", source=flag)
    s = text.strip().lower()
    if not s:
        raise InputError("empty duration (use e.g. 90s, 15m, 2h30m, 7d)", source=flag)
    if re.fullmatch(r"\d+(?:\.\d+)?", s):
        n = s if len(s) <= 12 else "N"
        raise InputError(f"{text!r} has no unit (use e.g. {n}s, {n}m, {n}h or {n}d)", source=flag)
    if not _DURATION_RE.match(s):
        raise InputError(f"{text!r} is not a duration (use e.g. 90s, 15m, 2h30m, 7d)", source=flag)
    seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in _DURATION_PART_RE.findall(s))
    if seconds <= 0:
        raise InputError(f"duration {text!r} must be longer than zero", source=flag)
    if not seconds <= MAX_DURATION_SECONDS:  # also catches inf from 400-digit numbers
        raise InputError(f"duration {text!r} is longer than 100 years", source=flag)
    return seconds


def parse_time(text: str, now: float, *, flag: str = "--before") -> float:
    """Parse one time into Unix seconds.

    Args:
        text: RFC 3339 time, bare date (midnight UTC), ``now``, ``-DURATION``/``+DURATION``
            relative to ``now``, or Unix seconds.
        now: the current time, Unix seconds (passed in so results are reproducible).
        flag: the flag name used in error messages.

    Returns:
        Unix seconds (float), within 1970-01-01 .. 9999-12-31 UTC.

    Raises:
        InputError: the text is none of the accepted forms, or lies outside that range.
    """
    t = _parse_time(text, now, flag)
    if not 0.0 <= t <= MAX_TIME_SECONDS:
        raise InputError(f"{text!r} lies outside 1970-01-01..9999-12-31 UTC", source=flag)
    return t


def _parse_time(text: str, now: float, flag: str) -> float:
    s = text.strip()
    if s.lower() == "now":
        return now
    if s[:1] in "+-" and len(s) > 1:
        delta = parse_duration(s[1:], flag=flag)
        return now - delta if s[0] == "-" else now + delta
    if _UNIX_RE.match(s):
        return float(s)
    if _DATE_RE.match(s):
        s = s + "T00:00:00Z"
    if _RFC3339_RE.match(s):
        iso = s.replace("z", "Z").replace("t", "T")
        iso = iso[:10] + "T" + iso[11:]
        iso = iso.replace("Z", "+00:00")
        try:
            return dt.datetime.fromisoformat(iso).timestamp()
        except ValueError as err:
            raise InputError(f"{text!r} is not a valid time ({err})", source=flag) from None
    raise InputError(
        f"{text!r} is not a time (use RFC 3339 like 2025-01-06T10:00:00Z, -7d, -2h30m, now, "
        "or Unix seconds)", source=flag)


def parse_window(text: str, now: float, *, flag: str) -> Window:
    """Parse ``START..END`` into a :class:`Window`.

    Raises:
        InputError: no ``..``, a bad time, or END not after START (reversed or empty window).
    """
    if text.count("..") != 1:
        raise InputError(f"{text!r} is not a window START..END (e.g. -14d..-7d)", source=flag)
    left, right = text.split("..")
    start = parse_time(left, now, flag=flag)
    end = parse_time(right, now, flag=flag)
    if end <= start:
        raise InputError(f"window {text!r} is reversed or empty: its end is not after its start",
                         source=flag)
    return Window(start, end)


def validate_windows(before: Window, after: Window, now: float) -> None:
    """Check that the before window ends no later than the after window starts.

    Windows may touch (``before.end == after.start``), as with ``--change-time``.

    Raises:
        InputError: the windows overlap, are in reverse order, or one ends in the future.
    """
    if after.end <= before.start:
        raise InputError("the after window ends before the before window starts "
                         "(reversed windows)", source="--after")
    if before.end > after.start:
        raise InputError(f"the windows overlap by {before.end - after.start:g} s: --before must "
                         "end no later than --after starts", source="--after")
    for flag, w in (("--before", before), ("--after", after)):
        if w.end > now + 60:
            raise InputError(f"window ends {w.end - now:.0f} s in the future", source=flag)


def choose_step(seconds: float) -> int:
    """Return the query step for a span of ``seconds``.

    The smallest of :data:`NICE_STEPS_SECONDS` that keeps the span at or under
    :data:`MAX_POINTS_PER_WINDOW` evaluation points (1 s up to ~16 min, 15 s up to ~4 h,
    60 s up to ~16 h, 300 s up to ~3.5 d, ...). Steps shorter than the scrape interval are
    harmless: an instant sees the latest scrape.
    """
    for step in NICE_STEPS_SECONDS:
        if seconds / step <= MAX_POINTS_PER_WINDOW:
            return step
    return int(math.ceil(seconds / MAX_POINTS_PER_WINDOW / 86400.0)) * 86400


def format_time(ts: float) -> str:
    """Unix seconds -> RFC 3339 in UTC (``2025-01-06T01:00:00Z``)."""
    d = dt.datetime.fromtimestamp(ts, tz=dt.UTC)
    text = d.isoformat(timespec="milliseconds" if ts % 1 else "seconds")
    return text.replace("+00:00", "Z")
