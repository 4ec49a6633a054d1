"""From Prometheus series to per-Service before/after statistics and savings.

Every figure is defined in ``docs/report.md``; in short, for a window ``[s, e)`` of ``D``
seconds and a Service:

- ``bytes_per_second`` = ``increase(zonemeter_service_bytes_total[D])`` evaluated at ``e``,
  summed over the Service's series, divided by ``D`` (increase handles counter resets and,
  where the window edges fall between scrapes, extrapolates to them as ``rate()`` does);
- ``cross_zone_bytes_per_second``: the same over ``crossing="cross_zone"`` only, also split
  by ``direction``, ``client_zone`` and ``server_zone``;
- ``cross_zone_fraction`` = cross-zone / total (``None`` when the total is 0);
- ``hint_ignored_bytes_per_second``: as the total, over
  ``zonemeter_service_hint_ignored_bytes_total``;
- ``locality_in_effect_share``: the Service is *in effect* at instant ``t`` when
  ``min by (namespace, service) (zonemeter_service_locality_in_effect)`` at ``t`` is 1,
  i.e. at least one series exists and every client-zone series (of every agent) is 1. The
  share is the fraction of the instants ``s, s+step, ... < e`` with a known state at which
  it was in effect (``None`` when no instant had a state).

The change: ``saved = cross_before - cross_after``; ``normalized_saved = fraction_before *
total_after - cross_after`` (the cross-zone bytes the after-window traffic would have sent
at the before window's cross-zone fraction, minus what it sent); dollars a month are priced
from the normalised figure.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from agent.errors import InputError
from tools.report.pricing import Price
from tools.report.prom import PromClient, Sample, Series
from tools.report.timespec import Window, choose_step, format_time

BYTES = "zonemeter_service_bytes_total"
HINT_IGNORED = "zonemeter_service_hint_ignored_bytes_total"
IN_EFFECT = "zonemeter_service_locality_in_effect"
LAST_CHANGE = "zonemeter_service_locality_last_change_timestamp_seconds"
CROSS_ZONE = 'crossing="cross_zone"'
#: default window length (each side of a change time), seconds
DEFAULT_WINDOW_SECONDS = 86400.0
#: shortest usable window, seconds (increase() needs two scrapes inside it)
MIN_WINDOW_SECONDS = 60.0


@dataclass(frozen=True, slots=True, order=True)
class ServiceKey:
    """A Service: ``namespace/name``."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class PairRate:
    """Cross-zone bytes per second of one direction between two zones.

    Attributes:
        direction: ``request`` (client -> endpoint) or ``response``.
        client_zone: zone of the client.
        server_zone: zone of the endpoint.
        bytes_per_second: average over the window, bytes/s (L3 bytes).
    """

    direction: str
    client_zone: str
    server_zone: str
    bytes_per_second: float


@dataclass(frozen=True, slots=True)
class WindowStats:
    """One Service (or the cluster total) over one window.

    Attributes:
        window: the window.
        bytes_per_second: all Service bytes, bytes/s averaged over the window.
        cross_zone_bytes_per_second: bytes with ``crossing="cross_zone"``, bytes/s.
        hint_ignored_bytes_per_second: hint-ignored bytes, bytes/s.
        locality_in_effect_share: fraction of the window (0..1) with locality in effect, or
            ``None`` when the state is unknown throughout.
        cross_zone_pairs: cross-zone bytes/s by (direction, client_zone, server_zone),
            largest first.
        withdrawn_at: instants (Unix seconds) inside the window where the state went from in
            effect to not in effect.
    """

    window: Window
    bytes_per_second: float = 0.0
    cross_zone_bytes_per_second: float = 0.0
    hint_ignored_bytes_per_second: float = 0.0
    locality_in_effect_share: float | None = None
    cross_zone_pairs: tuple[PairRate, ...] = ()
    withdrawn_at: tuple[float, ...] = ()

    @property
    def cross_zone_fraction(self) -> float | None:
        """Cross-zone bytes / all bytes (0..1), ``None`` when there were no bytes."""
        if self.bytes_per_second <= 0:
            return None
        return self.cross_zone_bytes_per_second / self.bytes_per_second


@dataclass(frozen=True, slots=True)
class Change:
    """Before/after of one Service (or the total).

    Attributes:
        key: the Service, ``None`` for the cluster total.
        before: statistics of the before window.
        after: statistics of the after window.
        saved: observed cross-zone bytes/s saved (before - after; negative = more).
        normalized_saved: cross-zone bytes/s saved at the after window's traffic volume,
            ``fraction_before * total_after - cross_after``; ``None`` when the before window
            had no traffic.
        usd_per_month_saved: ``normalized_saved`` priced over 30 days; ``None`` with it.
        warnings: one line each.
        change_time: the change instant (Unix seconds) when known.
        series: cross-zone bytes/s over both windows for the chart, ``[(t, v)]``.
    """

    key: ServiceKey | None
    before: WindowStats
    after: WindowStats
    saved: float
    normalized_saved: float | None
    usd_per_month_saved: float | None
    warnings: tuple[str, ...] = ()
    change_time: float | None = None
    series: tuple[tuple[float, float], ...] = ()


@dataclass(frozen=True, slots=True)
class Report:
    """The whole report.

    Attributes:
        price: the price used.
        before: the before window, ``None`` when each Service has its own (change-time mode
            without ``--change-time``).
        after: the after window, likewise.
        change_time: the global change instant when given or implied.
        services: per-Service changes, ordered by normalised saving (largest first).
        total: the cluster total (sum over ``services``).
        warnings: report-level warnings (partial data coverage, skipped Services).
        assumptions: lines stating how the numbers were computed.
    """

    price: Price
    before: Window | None
    after: Window | None
    change_time: float | None
    services: tuple[Change, ...]
    total: Change
    warnings: tuple[str, ...] = ()
    assumptions: tuple[str, ...] = field(default=())


def label_matchers(service: ServiceKey | None, extra: str = "") -> str:
    """PromQL matcher body for an optional Service plus ``extra`` matchers.

    Returns:
        e.g. ``{crossing="cross_zone",namespace="shop",service="cart"}`` or ``""``.
    """
    parts = [extra] if extra else []
    if service is not None:
        parts.append(f'namespace="{_escape(service.namespace)}"')
        parts.append(f'service="{_escape(service.name)}"')
    return "{" + ",".join(parts) + "}" if parts else ""


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _range(seconds: float) -> str:
    return f"{int(round(seconds * 1000))}ms"


def _key(labels: Mapping[str, str]) -> ServiceKey:
    return ServiceKey(labels.get("namespace", "unknown"), labels.get("service", "unknown"))


def in_effect_shares(series: Iterable[Series], window: Window, step: float
                     ) -> dict[ServiceKey, tuple[float | None, tuple[float, ...]]]:
    """Share of the window with locality in effect, and the withdrawal instants.

    Args:
        series: ``min by (namespace, service) (zonemeter_service_locality_in_effect)`` over
            the instants ``window.start + k*step < window.end``.
        window: the window.
        step: seconds between instants.

    Returns:
        ``{service: (share or None, (t_withdrawn, ...))}``; the share counts only instants
        with a value; a withdrawal is an instant with value < 1 right after one with 1.
    """
    out: dict[ServiceKey, tuple[float | None, tuple[float, ...]]] = {}
    for s in series:
        points = [(t, v) for t, v in s.points if window.start <= t < window.end]
        if not points:
            out[_key(s.labels)] = (None, ())
            continue
        on = sum(1 for _, v in points if v >= 1)
        withdrawn = tuple(t for (tp, vp), (t, v) in zip(points, points[1:])
                          if vp >= 1 and v < 1 and t - tp <= step * 1.5)
        out[_key(s.labels)] = (on / len(points), withdrawn)
    return out


def window_stats(client: PromClient, window: Window, service: ServiceKey | None
                 ) -> tuple[dict[ServiceKey, WindowStats], list[str]]:
    """Per-Service statistics of one window.

    Args:
        client: the Prometheus API.
        window: the window.
        service: only this Service, or all.

    Returns:
        ``({service: WindowStats}, warnings)``; Services with no ``zonemeter_service_bytes_total``
        increase in the window are absent.

    Raises:
        InputError: from the client (unreachable, refused).
    """
    d = window.seconds
    at = window.end
    totals = client.query(
        f"sum by (namespace, service) (increase({BYTES}{label_matchers(service)}[{_range(d)}]))",
        at)
    cross = client.query(
        "sum by (namespace, service, direction, client_zone, server_zone) "
        f"(increase({BYTES}{label_matchers(service, CROSS_ZONE)}[{_range(d)}]))",
        at)
    hints = client.query(
        f"sum by (namespace, service) (increase({HINT_IGNORED}{label_matchers(service)}"
        f"[{_range(d)}]))", at)
    step = choose_step(d)
    n = max(1, math.ceil(d / step))
    loc = client.query_range(
        f"min by (namespace, service) ({IN_EFFECT}{label_matchers(service)})",
        window.start, window.start + (n - 1) * step, step)
    shares = in_effect_shares(loc, window, step)

    pairs: dict[ServiceKey, list[PairRate]] = {}
    for smp in cross:
        pairs.setdefault(_key(smp.labels), []).append(PairRate(
            smp.labels.get("direction", "unknown"), smp.labels.get("client_zone", "unknown"),
            smp.labels.get("server_zone", "unknown"), smp.value / d))
    hint_by = {_key(s.labels): s.value / d for s in hints}
    stats: dict[ServiceKey, WindowStats] = {}
    for smp in totals:
        key = _key(smp.labels)
        prs = sorted(pairs.get(key, []), key=lambda p: (-p.bytes_per_second, p.direction,
                                                        p.client_zone, p.server_zone))
        share, withdrawn = shares.get(key, (None, ()))
        stats[key] = WindowStats(
            window=window,
            bytes_per_second=smp.value / d,
            cross_zone_bytes_per_second=sum(p.bytes_per_second for p in prs),
            hint_ignored_bytes_per_second=hint_by.get(key, 0.0),
            locality_in_effect_share=share,
            cross_zone_pairs=tuple(prs),
            withdrawn_at=withdrawn)
    return stats, _coverage_warnings(client, window, service)


def _coverage_warnings(client: PromClient, window: Window, service: ServiceKey | None
                       ) -> list[str]:
    warnings = []
    for edge, t in (("start", window.start), ("end", window.end)):
        if not client.query(f"count({BYTES}{label_matchers(service)})", t):
            warnings.append(
                f"no {BYTES} samples at the {edge} of the window {format_time(window.start)}.."
                f"{format_time(window.end)} (within Prometheus's lookback): the data covers only "
                "part of the window, and rates are averaged over the whole window")
    return warnings


def _no_data(which: str, window: Window, service: ServiceKey | None) -> InputError:
    what = f" for {service}" if service else ""
    return InputError(
        f"no {BYTES} data{what} in the {which} window {format_time(window.start)}.."
        f"{format_time(window.end)} (a window needs at least two scrapes)", source=f"--{which}")


def change_of(key: ServiceKey | None, before: WindowStats, after: WindowStats, price: Price,
              *, change_time: float | None = None,
              series: tuple[tuple[float, float], ...] = ()) -> Change:
    """Compute the change between two windows of one Service.

    Returns:
        A :class:`Change` with observed and normalised savings (bytes/s), USD a month, and
        warnings: no traffic in a window, locality withdrawn inside the after window, locality
        never in effect or unknown in the after window.
    """
    warnings: list[str] = []
    saved = before.cross_zone_bytes_per_second - after.cross_zone_bytes_per_second
    frac = before.cross_zone_fraction
    normalized: float | None
    if frac is None:
        normalized = None
        warnings.append("no traffic in the before window: the normalised saving is undefined")
    else:
        normalized = frac * after.bytes_per_second - after.cross_zone_bytes_per_second
    if after.bytes_per_second <= 0:
        warnings.append("no traffic in the after window")
    for t in after.withdrawn_at:
        warnings.append(f"locality withdrawn inside the after window at {format_time(t)}")
    if key is not None:
        if after.locality_in_effect_share is None:
            warnings.append(f"locality state unknown in the after window (no {IN_EFFECT} series)")
        elif after.locality_in_effect_share == 0:
            warnings.append("locality not in effect at any time in the after window")
    usd = None if normalized is None else price.usd_per_month(normalized)
    return Change(key, before, after, saved, normalized, usd, tuple(warnings), change_time, series)


def _sum_stats(window: Window, stats: list[WindowStats]) -> WindowStats:
    total = sum(s.bytes_per_second for s in stats)
    known = [s for s in stats if s.locality_in_effect_share is not None]
    weight = sum(s.bytes_per_second for s in known)
    share: float | None
    if not known:
        share = None
    elif weight > 0:
        share = sum(s.bytes_per_second * (s.locality_in_effect_share or 0.0) for s in known) / weight
    else:
        share = sum(s.locality_in_effect_share or 0.0 for s in known) / len(known)
    pairs: dict[tuple[str, str, str], float] = {}
    for s in stats:
        for p in s.cross_zone_pairs:
            k = (p.direction, p.client_zone, p.server_zone)
            pairs[k] = pairs.get(k, 0.0) + p.bytes_per_second
    return WindowStats(
        window=window,
        bytes_per_second=total,
        cross_zone_bytes_per_second=sum(s.cross_zone_bytes_per_second for s in stats),
        hint_ignored_bytes_per_second=sum(s.hint_ignored_bytes_per_second for s in stats),
        locality_in_effect_share=share,
        cross_zone_pairs=tuple(PairRate(*k, v) for k, v in
                               sorted(pairs.items(), key=lambda kv: (-kv[1], kv[0]))))


def total_of(changes: list[Change], price: Price, before: Window, after: Window) -> Change:
    """The cluster total: sums of rates; the normalised saving is the sum of the Services'
    normalised savings (Services without one are left out, with a warning); the locality
    share is the mean of the Services' shares weighted by their bytes/s in that window."""
    b = _sum_stats(before, [c.before for c in changes])
    a = _sum_stats(after, [c.after for c in changes])
    with_norm = [c for c in changes if c.normalized_saved is not None]
    normalized = sum(c.normalized_saved or 0.0 for c in with_norm)
    warnings = []
    if len(with_norm) < len(changes):
        left = ", ".join(str(c.key) for c in changes if c.normalized_saved is None)
        warnings.append(f"normalised total leaves out Services without a before figure: {left}")
    return Change(None, b, a, b.cross_zone_bytes_per_second - a.cross_zone_bytes_per_second,
                  normalized, price.usd_per_month(normalized), tuple(warnings))


#: scrape interval assumed when it cannot be measured, seconds
DEFAULT_SCRAPE_SECONDS = 60.0


def scrape_interval(client: PromClient, selector: str, at: float) -> float:
    """Median spacing (seconds) of the stored samples of ``selector`` in the 10 minutes
    before ``at``; :data:`DEFAULT_SCRAPE_SECONDS` when fewer than two samples are there."""
    gaps: list[float] = []
    for s in client.raw_samples(selector, 600, at)[:20]:
        gaps += [b[0] - a[0] for a, b in zip(s.points, s.points[1:])]
    if not gaps:
        return DEFAULT_SCRAPE_SECONDS
    gaps.sort()
    return gaps[len(gaps) // 2]


def cross_zone_series(client: PromClient, start: float, end: float,
                      service: ServiceKey | None) -> dict[ServiceKey, tuple[tuple[float, float], ...]]:
    """Cross-zone bytes/s per Service over ``[start, end]`` for the chart.

    Uses ``rate(...[max(4 x scrape, step + scrape)])`` (Grafana's ``$__rate_interval``) with
    the step from :func:`choose_step` of the span and the scrape interval measured by
    :func:`scrape_interval`.

    Returns:
        ``{service: ((t, bytes_per_second), ...)}``.
    """
    step = choose_step(end - start)
    sel = label_matchers(service, CROSS_ZONE)
    scrape = scrape_interval(client, BYTES + label_matchers(service), end)
    window = max(4 * scrape, step + scrape)
    result = client.query_range(
        f"sum by (namespace, service) (rate({BYTES}{sel}[{_range(window)}]))", start, end, step)
    return {_key(s.labels): tuple(s.points) for s in result}


def assumptions(price: Price) -> tuple[str, ...]:
    """The lines the report prints to state how it computed its numbers."""
    return (
        f"price: {price.describe()}; GB = 10^9 bytes; month = 30 days",
        "bytes are L3 (IP header included) as counted by zonemeter; cross-zone means "
        "crossing=\"cross_zone\" (cross_region and external bytes are priced differently and "
        "left out)",
        "rates = increase() over the window / window seconds (counter resets handled by "
        "Prometheus; edges between scrapes are extrapolated as rate() does)",
        "normalised saving = before cross-zone fraction x after bytes/s - after cross-zone "
        "bytes/s; $/month is priced from it; total = sum over Services",
        "locality in effect at an instant = every zonemeter_service_locality_in_effect series "
        "of the Service (all client zones, all agents) is 1; share = fraction of the window's "
        "query steps with that state",
    )


def report_for_windows(client: PromClient, price: Price, before: Window, after: Window, *,
                       service: ServiceKey | None = None, change_time: float | None = None,
                       with_series: bool = False) -> Report:
    """Report with one before and one after window for every Service.

    Raises:
        InputError: no data in a window, unreachable Prometheus.
    """
    b_stats, b_warn = window_stats(client, before, service)
    if not b_stats:
        raise _no_data("before", before, service)
    a_stats, a_warn = window_stats(client, after, service)
    if not a_stats:
        raise _no_data("after", after, service)
    series = cross_zone_series(client, before.start, after.end, service) if with_series else {}
    changes = [change_of(k, b_stats.get(k, WindowStats(before)), a_stats.get(k, WindowStats(after)),
                         price, change_time=change_time, series=series.get(k, ()))
               for k in sorted(set(b_stats) | set(a_stats))]
    changes.sort(key=_order)
    total = total_of(changes, price, before, after)
    warn = [f"before window: {w}" for w in b_warn] + [f"after window: {w}" for w in a_warn]
    return Report(price, before, after, change_time, tuple(changes), total, tuple(warn),
                  assumptions(price))


def _order(c: Change) -> tuple[float, str, str]:
    key = c.key or ServiceKey("", "")
    ns = c.normalized_saved if c.normalized_saved is not None else -math.inf
    return (-ns, key.namespace, key.name)


def change_times(client: PromClient, now: float, service: ServiceKey | None
                 ) -> dict[ServiceKey, float]:
    """Latest locality change per Service from ``zonemeter_service_locality_last_change_
    timestamp_seconds`` at ``now`` (max over agents), Unix seconds."""
    result = client.query(f"max by (namespace, service) ({LAST_CHANGE}{label_matchers(service)})",
                          now)
    return {_key(s.labels): s.value for s in result if math.isfinite(s.value) and s.value > 0}


def windows_around(change: float, now: float, window_seconds: float | None, *,
                   flag: str = "--change-time") -> tuple[Window, Window]:
    """Before ``[T-D, T)`` and after ``[T, T+D)`` around a change ``T``.

    ``D`` is ``window_seconds``, or by default 24 h shortened so the after window ends by
    ``now``.

    Raises:
        InputError: the after window would end in the future, or be shorter than 60 s.
    """
    if window_seconds is None:
        d = min(DEFAULT_WINDOW_SECONDS, now - change)
    else:
        d = window_seconds
        if change + d > now + 60:
            raise InputError(f"the after window {format_time(change)}..{format_time(change + d)} "
                             "ends in the future: use a shorter --window", source=flag)
    if d < MIN_WINDOW_SECONDS:
        raise InputError(f"the change at {format_time(change)} leaves a window of {d:.0f} s, "
                         f"under {MIN_WINDOW_SECONDS:.0f} s", source=flag)
    return Window(change - d, change), Window(change, change + d)


def report_per_service(client: PromClient, price: Price, now: float, *,
                       window_seconds: float | None = None, service: ServiceKey | None = None,
                       with_series: bool = False) -> Report:
    """Report where each Service's windows surround its own last locality change.

    Services whose change time leaves no usable window or no data are skipped with a
    report-level warning.

    Raises:
        InputError: no Service has a change time, or none has data in its windows.
    """
    times = change_times(client, now, service)
    if not times:
        what = f" for {service}" if service else ""
        raise InputError(f"no {LAST_CHANGE} series{what}: give --before/--after or --change-time",
                         source="--prometheus")
    changes: list[Change] = []
    warnings: list[str] = []
    spans: list[tuple[Window, Window]] = []
    for key in sorted(times):
        t = times[key]
        try:
            before, after = windows_around(t, now, window_seconds, flag="--window")
            b_stats, b_warn = window_stats(client, before, key)
            a_stats, a_warn = window_stats(client, after, key)
            if key not in b_stats:
                raise _no_data("before", before, key)
            if key not in a_stats:
                raise _no_data("after", after, key)
        except InputError as err:
            if err.source == "--prometheus":  # the API failed: not this Service's fault
                raise
            warnings.append(f"{key}: skipped: {err.problem}")
            continue
        warnings += [f"{key}: before window: {w}" for w in b_warn]
        warnings += [f"{key}: after window: {w}" for w in a_warn]
        series = (cross_zone_series(client, before.start, after.end, key).get(key, ())
                  if with_series else ())
        changes.append(change_of(key, b_stats[key], a_stats[key], price, change_time=t,
                                 series=series))
        spans.append((before, after))
    if not changes:
        raise InputError("no Service has data around its last locality change: "
                         + "; ".join(warnings), source="--prometheus")
    changes.sort(key=_order)
    env_before = Window(min(b.start for b, _ in spans), max(b.end for b, _ in spans))
    env_after = Window(min(a.start for _, a in spans), max(a.end for _, a in spans))
    total = total_of(changes, price, env_before, env_after)
    return Report(price, None, None, None, tuple(changes), total, tuple(warnings),
                  assumptions(price))
