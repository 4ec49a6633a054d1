"""From Prometheus series to per-Service before/after statistics and savings.

Every figure is defined in ``docs/report.md``; in short, for a window ``[s, e)`` of ``D``
seconds and a Service:

- ``bytes_per_second`` = ``increase(zonemeter_service_bytes_total[D])`` evaluated at ``e``,
  plus the same of ``zonemeter_service_entry_bytes_total`` (the first hop of the Service's
  node ports, a hop of its own: docs/attribution.md, "Two hops of NodePort and LoadBalancer
  traffic"), summed over the Service's series, divided by ``D`` (increase handles counter resets and,
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
from the same figure over the **billed** cross-zone bytes only: those of the client classes
the price's cloud bills (``client_kind``/``lb_type``, :meth:`agent.report.pricing.Price.rule`;
docs/report.md, "Prices by client class").
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from agent.errors import InputError
from agent.report.pricing import Price
from agent.report.prom import PromClient, Sample, Series, format_ms, prometheus_ms
from agent.report.timespec import NICE_STEPS_SECONDS, Window, choose_step, format_time

if TYPE_CHECKING:
    from agent.report.workloads import WorkloadChange

BYTES = "zonemeter_service_bytes_total"
ENTRY_BYTES = "zonemeter_service_entry_bytes_total"
#: the two hops of a Service's bytes, each family with the ``hop`` label value that keeps
#: their series apart until a query sums them (they carry the same labels)
HOP_FAMILIES = ((BYTES, "endpoint"), (ENTRY_BYTES, "entry"))
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
    """Cross-zone bytes per second of one direction between two zones, for one client class.

    Attributes:
        direction: ``request`` (client -> endpoint) or ``response``.
        client_zone: zone of the client.
        server_zone: zone of the endpoint.
        bytes_per_second: average over the window, bytes/s (L3 bytes).
        client_kind: the client's class (``client_kind`` of the series; a workload row's
            ``remote_kind``), ``""`` when the series has none (an agent before client classes).
        lb_type: the load balancer's type for ``load-balancer``, else ``""`` or ``none``.
    """

    direction: str
    client_zone: str
    server_zone: str
    bytes_per_second: float
    client_kind: str = ""
    lb_type: str = ""


def merged_pairs(pairs: Iterable[PairRate]) -> dict[tuple[str, str, str], float]:
    """Bytes/s by ``(direction, client_zone, server_zone)``, summed over client classes (in
    the order first seen)."""
    out: dict[tuple[str, str, str], float] = {}
    for p in pairs:
        k = (p.direction, p.client_zone, p.server_zone)
        out[k] = out.get(k, 0.0) + p.bytes_per_second
    return out


def class_rates(pairs: Iterable[PairRate]) -> dict[tuple[str, str], float]:
    """Cross-zone bytes/s by client class ``(client_kind, lb_type)`` (``lb_type`` ``""``
    unless ``client_kind`` is ``load-balancer``)."""
    out: dict[tuple[str, str], float] = {}
    for p in pairs:
        k = (p.client_kind, p.lb_type if p.client_kind == "load-balancer" else "")
        out[k] = out.get(k, 0.0) + p.bytes_per_second
    return out


def billed_cross_zone(w: WindowStats, price: Price) -> float:
    """The window's cross-zone bytes/s that ``price``'s cloud bills: all of them less the
    pairs of classes it does not bill (:meth:`Price.rule`)."""
    free = sum(v for (kind, lb), v in class_rates(w.cross_zone_pairs).items()
               if not price.billed(kind, lb))
    return max(0.0, w.cross_zone_bytes_per_second - free)


@dataclass(frozen=True, slots=True)
class Spread:
    """Variation of one Service's rates within one window, from its sub-windows.

    The window is cut into ``sub_windows`` consecutive sub-windows of ``seconds`` each; the
    rate of each is ``increase()`` over it / ``seconds`` (a sub-window without a sample
    counts as 0 bytes, as the window average counts it). The variances are those of the
    *mean* of the sub-window rates (sample variance / ``sub_windows``), the usual standard
    error of a mean, treating the sub-windows as independent draws (docs/report.md,
    "Noise").

    Attributes:
        sub_windows: number of sub-windows (at least 2).
        seconds: length of each, seconds.
        var_bytes: variance of the mean of all bytes/s, (bytes/s)^2.
        var_cross: variance of the mean of cross-zone bytes/s, (bytes/s)^2.
        cov: covariance of those two means, (bytes/s)^2.
    """

    sub_windows: int
    seconds: float
    var_bytes: float
    var_cross: float
    cov: float


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
        cross_zone_pairs: cross-zone bytes/s by (direction, client_zone, server_zone,
            client_kind, lb_type), largest first (:func:`merged_pairs` sums the classes).
        withdrawn_at: instants (Unix seconds) inside the window where the state went from in
            effect to not in effect.
        spread: variation of the rates within the window, ``None`` when not measured (the
            window holds fewer than two sub-windows).
    """

    window: Window
    bytes_per_second: float = 0.0
    cross_zone_bytes_per_second: float = 0.0
    hint_ignored_bytes_per_second: float = 0.0
    locality_in_effect_share: float | None = None
    cross_zone_pairs: tuple[PairRate, ...] = ()
    withdrawn_at: tuple[float, ...] = ()
    spread: Spread | None = None

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
            had no traffic. For the total: the sum over the Services whose normalised change
            is significant.
        usd_per_month_saved: ``billed_normalized_saved`` priced over a month of 30.44 days
            when the change is significant (negative: the cost rose), 0.0 when it is within
            the noise, ``None`` when ``normalized_saved`` is undefined or its noise unknown.
        warnings: one line each.
        change_time: the change instant (Unix seconds) when known.
        series: cross-zone bytes/s over both windows for the chart, ``[(t, v)]``.
        saved_stderr: standard error of ``saved``, bytes/s (:func:`change_errors`); ``None``
            when a window's spread is unknown.
        normalized_stderr: standard error of ``normalized_saved``, bytes/s, likewise.
        billed_normalized_saved: ``normalized_saved`` over the cross-zone bytes of the
            classes the price's cloud bills (:func:`billed_cross_zone`), bytes/s; equal to
            it when every class is billed; ``None`` when it is undefined. Significance is
            judged on ``normalized_saved`` (docs/report.md, "Prices by client class").
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
    saved_stderr: float | None = None
    normalized_stderr: float | None = None
    billed_normalized_saved: float | None = None

    @property
    def saved_significant(self) -> bool | None:
        """Whether the observed change exceeds the noise (:func:`significant`)."""
        return significant(self.saved, self.saved_stderr)

    @property
    def significant(self) -> bool | None:
        """Whether the normalised change (the one priced) exceeds the noise; ``None`` when
        it or its noise is undefined."""
        if self.normalized_saved is None:
            return None
        return significant(self.normalized_saved, self.normalized_stderr)

    @property
    def verdict(self) -> str:
        """``saved``, ``cost rose``, ``no significant change`` or ``undefined`` (no before
        traffic) or ``noise unknown`` (windows too short to measure it), for the normalised
        change."""
        if self.normalized_saved is None:
            return "undefined"
        sig = self.significant
        if sig is None:
            return "noise unknown"
        if not sig:
            return NO_SIGNIFICANT_CHANGE
        return "saved" if self.normalized_saved > 0 else "cost rose"


#: what a change within the noise reads, in every output
NO_SIGNIFICANT_CHANGE = "no significant change"
#: a change is significant when its magnitude exceeds this many standard errors (about a
#: 95 % two-sided level for a normally distributed estimate)
SIGNIFICANCE_Z = 2.0
#: each sub-window of the noise estimate holds at least this many scrape intervals (as
#: Grafana's $__rate_interval, so increase() always sees two samples in it)
SCRAPES_PER_SUB_WINDOW = 4


def significant(change: float, stderr: float | None) -> bool | None:
    """``|change| > SIGNIFICANCE_Z x stderr`` (strict: a zero change is never significant);
    ``None`` when ``stderr`` is unknown."""
    if stderr is None:
        return None
    return abs(change) > SIGNIFICANCE_Z * stderr


def change_errors(before: WindowStats, after: WindowStats) -> tuple[float | None, float | None]:
    """Standard errors of the observed and the normalised change, bytes/s.

    With ``C``/``T`` the cross-zone/all bytes/s means and ``V``, ``Cov`` from each window's
    :class:`Spread` (the windows independent of each other):

    - observed ``C_b - C_a``: ``sqrt(V(C_b) + V(C_a))``;
    - normalised ``N = C_b / T_b x T_a - C_a`` (first-order error propagation):
      ``V(N) = g_Cb^2 V(C_b) + g_Tb^2 V(T_b) + 2 g_Cb g_Tb Cov_b
      + g_Ta^2 V(T_a) + V(C_a) - 2 g_Ta Cov_a`` with ``g_Cb = T_a / T_b``,
      ``g_Tb = -C_b T_a / T_b^2``, ``g_Ta = C_b / T_b``.

    Returns:
        ``(observed, normalised)``; each ``None`` when a spread is unknown, the normalised
        one also when the before window had no traffic.
    """
    b, a = before.spread, after.spread
    if b is None or a is None:
        return None, None
    observed = math.sqrt(max(0.0, b.var_cross + a.var_cross))
    if before.bytes_per_second <= 0:
        return observed, None
    tb, cb, ta = before.bytes_per_second, before.cross_zone_bytes_per_second, after.bytes_per_second
    g_cb, g_tb, g_ta = ta / tb, -cb * ta / tb ** 2, cb / tb
    var = (g_cb ** 2 * b.var_cross + g_tb ** 2 * b.var_bytes + 2 * g_cb * g_tb * b.cov
           + g_ta ** 2 * a.var_bytes + a.var_cross - 2 * g_ta * a.cov)
    return observed, math.sqrt(max(0.0, var))


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
        workloads: the non-Service rows (:class:`agent.report.workloads.WorkloadChange`),
            with one before and one after window only (empty otherwise, or with a Service
            selected).
        workload_total: their total, ``None`` when there are none.
        classes: cross-zone bytes and their cost by client class (:class:`ClassCost`), the
            Services' then the non-Service rows'.
    """

    price: Price
    before: Window | None
    after: Window | None
    change_time: float | None
    services: tuple[Change, ...]
    total: Change
    warnings: tuple[str, ...] = ()
    assumptions: tuple[str, ...] = field(default=())
    workloads: tuple[WorkloadChange, ...] = ()
    workload_total: Change | None = None
    classes: tuple[ClassCost, ...] = ()


@dataclass(frozen=True, slots=True)
class ClassCost:
    """Cross-zone bytes of one client class over both windows, and what they cost.

    Attributes:
        scope: ``services`` (``zonemeter_service_bytes_total``, by the client's class) or
            ``workloads`` (``zonemeter_workload_bytes_total``, by the remote's class).
        client_kind, lb_type: the class (:class:`PairRate`).
        before, after: cross-zone bytes/s in each window (summed over Services or rows).
        billed: whether the price's cloud bills them (:meth:`Price.rule`).
        usd_per_month_before, usd_per_month_after: each window's rate held for a month at
            the price, $0 when not billed.
        reason, source, sure: the rule's (:class:`agent.report.pricing.ClassRule`).
    """

    scope: str
    client_kind: str
    lb_type: str
    before: float
    after: float
    billed: bool
    usd_per_month_before: float
    usd_per_month_after: float
    reason: str
    source: str
    sure: bool


def class_costs(scope: str, before: WindowStats, after: WindowStats, price: Price
                ) -> tuple[ClassCost, ...]:
    """One :class:`ClassCost` per client class with cross-zone bytes in either window
    (totals' windows: every Service's, or every non-Service row's), largest after first."""
    b, a = class_rates(before.cross_zone_pairs), class_rates(after.cross_zone_pairs)
    out = []
    for kind, lb in sorted(set(b) | set(a), key=lambda k: (-a.get(k, 0.0), -b.get(k, 0.0), k)):
        rule = price.rule(kind, lb)
        vb, va = b.get((kind, lb), 0.0), a.get((kind, lb), 0.0)
        out.append(ClassCost(scope, kind, lb, vb, va, rule.billed,
                             price.usd_per_month(vb) if rule.billed else 0.0,
                             price.usd_per_month(va) if rule.billed else 0.0,
                             rule.reason, rule.source, rule.sure))
    return tuple(out)


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


def _hops(fn: str, matchers: str, rng: str, clause: str = "") -> str:
    """``fn(family{matchers}[rng]clause)`` over both hop families (:data:`HOP_FAMILIES`),
    joined with ``or``, each tagged with a ``hop`` label first: an endpoint series and an
    entry series of one agent can have the very same labels, which one selector of both
    names (``__name__=~``) refuses once ``fn`` drops the name ("vector cannot contain
    metrics with the same labelset"). The caller sums over ``hop``."""
    return " or ".join(f'label_replace({fn}({name}{matchers}[{rng}]{clause}), "hop", "{hop}", "", "")'
                       for name, hop in HOP_FAMILIES)


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
        withdrawn = tuple(t for (tp, vp), (t, v) in zip(points, points[1:], strict=False)
                          if vp >= 1 and v < 1 and t - tp <= step * 1.5)
        out[_key(s.labels)] = (on / len(points), withdrawn)
    return out


#: label the batched queries add to tell their parts apart (never a zonemeter label)
PART_LABEL = "zonemeter_report_part"


@dataclass(frozen=True, slots=True)
class Scope:
    """The Services one part of a batched query selects.

    Attributes:
        service: the user's ``--service`` filter, or ``None``.
        keys: exactly these Services (the rest of the result is dropped), or ``None`` for
            every Service the filter admits.
    """

    service: ServiceKey | None = None
    keys: frozenset[ServiceKey] | None = None

    def matchers(self, extra: str = "") -> str:
        """PromQL matchers selecting the scope (a superset when ``keys`` spans several
        namespaces and names; :meth:`admits` drops the rest).

        Returns:
            e.g. ``{crossing="cross_zone",namespace="shop",service="cart"}``; the size
            grows with ``keys`` only.
        """
        if self.keys is None:
            return label_matchers(self.service, extra)
        if len(self.keys) == 1:
            return label_matchers(next(iter(self.keys)), extra)
        parts = [extra] if extra else []
        for label, values in (("namespace", {k.namespace for k in self.keys}),
                              ("service", {k.name for k in self.keys})):
            if len(values) == 1:
                parts.append(f'{label}="{_escape(next(iter(values)))}"')
            else:
                alternatives = "|".join(re.escape(v) for v in sorted(values))
                parts.append(f'{label}=~"{_escape(alternatives)}"')
        return "{" + ",".join(parts) + "}"

    def admits(self, key: ServiceKey) -> bool:
        """Whether ``key`` belongs to the scope."""
        return self.keys is None or key in self.keys


def _or_all(parts: list[str]) -> str:
    """``a or b or ...`` as a balanced tree, so Prometheus's ``or`` (which indexes its left
    side) costs O(n log n) rather than O(n^2) over n parts."""
    if len(parts) == 1:
        return parts[0]
    mid = len(parts) // 2
    return f"({_or_all(parts[:mid])}) or ({_or_all(parts[mid:])})"


def _tagged(expr: str, tag: str) -> str:
    return f'label_replace({expr}, "{PART_LABEL}", "{tag}", "", "")'


def _by_tag(samples: Iterable[Sample]) -> dict[str, list[Sample]]:
    out: dict[str, list[Sample]] = {}
    for smp in samples:
        tag = smp.labels.get(PART_LABEL)
        if tag is not None:
            out.setdefault(tag, []).append(smp)
    return out


#: most parts (one window of one scope each) in one HTTP request. Prometheus's cost for a
#: query grows faster than its number of selectors (2.42, 600-step range query over raw
#: selectors: 500 parts in one query 11.5 s, in 8 queries of 64 2.3 s), and one huge query
#: would also hit its 2 min query timeout; 256 keeps up to 128 Services with distinct windows
#: in one request per query kind
MAX_PARTS_PER_QUERY = 256
#: most parts in one range query (each is evaluated at every step, so a range query costs
#: Prometheus far more per part than an instant query)
MAX_RANGE_PARTS_PER_QUERY = 256
#: requests in flight at once (Prometheus runs up to 20 queries concurrently by default)
MAX_CONCURRENT_QUERIES = 4

_T = TypeVar("_T")


def _chunks(items: list[_T], size: int = MAX_PARTS_PER_QUERY) -> list[list[_T]]:
    """``items`` in consecutive pieces of at most ``size``."""
    return [items[i:i + size] for i in range(0, len(items), size)]


def _run_all(calls: list[Callable[[], _T]]) -> list[_T]:
    """Run the request thunks, up to :data:`MAX_CONCURRENT_QUERIES` at a time.

    Returns:
        Their results, in order.

    Raises:
        InputError: the first failed call's error (in call order).
    """
    if len(calls) <= 1:
        return [call() for call in calls]
    with ThreadPoolExecutor(min(MAX_CONCURRENT_QUERIES, len(calls))) as pool:
        futures = [pool.submit(call) for call in calls]
        return [f.result() for f in futures]


def _instant_calls(client: PromClient, exprs: dict[str, str], at: float, *, per_job: int = 1
                   ) -> list[Callable[[], dict[str, list[Sample]]]]:
    """Instant queries evaluating every ``{tag: expr}`` (each pinned with ``@``), the parts
    of at most :data:`MAX_PARTS_PER_QUERY` jobs (``per_job`` consecutive parts each) per
    request; each call returns ``{tag: [Sample, ...]}`` (tags without a result are absent)."""
    def call(chunk: list[str]) -> dict[str, list[Sample]]:
        return _by_tag(client.query(_or_all([_tagged(exprs[t], t) for t in chunk]), at))

    return [functools.partial(call, chunk)
            for chunk in _chunks(list(exprs), MAX_PARTS_PER_QUERY * per_job)]


@dataclass(frozen=True, slots=True)
class _RangePart:
    """One grid of a batched range query: ``expr(offset)`` evaluated at the instants
    ``start, start + step, ...`` up to ``end`` (Unix seconds, as a separate
    ``query_range(expr, start, end, step)`` would)."""

    tag: str
    expr: Callable[[str], str]  # the offset clause ("" or " offset -Xms") -> the expression
    start: float
    end: float
    step: float
    #: evaluate in a request of its own: a part over every Service is cheapest aggregated
    #: on its own (its series outnumber all the small parts together)
    alone: bool = False
    #: the one Service the part selects (exact matchers): such parts are batched without a
    #: tag label, each Service at most once per request
    key: ServiceKey | None = None


def _range_calls(client: PromClient, parts: list[_RangePart], aggregate: str | None = None
                 ) -> list[Callable[[], dict[str, list[Series]]]]:
    """Range queries evaluating every part on its own grid, in few requests.

    Each part's grid is shifted onto a common one with ``offset``: the request runs from the
    earliest part's start, and a part starting ``X`` ms later reads its data ``offset -Xms``,
    so it is evaluated at exactly its own instants (Prometheus's millisecond rounding of each
    start and end is reproduced by :func:`prometheus_ms`). Returned timestamps are mapped back.
    Requests: one per ``alone`` part (exactly the query of that window alone); the others
    grouped by step and at most :data:`MAX_RANGE_PARTS_PER_QUERY` per request, parts with a
    ``key`` additionally in lanes so no Service appears twice in a request: those need no
    tag label, which Prometheus would otherwise add to every raw series at every step.

    Args:
        client: the Prometheus API.
        parts: the grids.
        aggregate: ``"min"`` etc.: the parts are raw selectors and the request aggregates
            ``by (namespace, service)`` (and the tag) once outside the ``or`` of the parts
            (cheaper than one aggregation per part; exact for ``min``/``max``, whose result
            does not depend on the order of the series); ``None``: the parts are complete
            expressions.

    Returns:
        Calls returning ``{tag: [Series, ...]}`` with the part's own instants.
    """
    chunks = [[p] for p in parts if p.alone]
    lanes: dict[tuple[float, int, bool], list[_RangePart]] = {}
    seen: dict[tuple[float, ServiceKey], int] = {}
    for part in sorted((p for p in parts if not p.alone), key=lambda p: p.start):
        lane = 0
        if part.key is not None:
            lane = seen.get((part.step, part.key), 0)
            seen[(part.step, part.key)] = lane + 1
        lanes.setdefault((part.step, lane, part.key is not None), []).append(part)
    chunks += [chunk for _, group in sorted(lanes.items(), key=lambda kv: kv[0])
               for chunk in _chunks(group, MAX_RANGE_PARTS_PER_QUERY)]
    return [functools.partial(_range_chunk, client, chunk[0].step, chunk, aggregate)
            for chunk in chunks]


def _range_chunk(client: PromClient, step: float, group: list[_RangePart],
                 aggregate: str | None) -> dict[str, list[Series]]:
    step_ms = int(step * 1000)
    first = min(group, key=lambda p: prometheus_ms(p.start))
    base = prometheus_ms(first.start)
    shift = [prometheus_ms(p.start) - base for p in group]
    last = [prometheus_ms(p.end) for p in group]
    keyed = all(p.key is not None for p in group)
    exprs = []
    for p, x in zip(group, shift, strict=False):
        clause = f" offset -{x}ms" if x else ""
        exprs.append(p.expr(clause) if keyed or len(group) == 1 else _tagged(p.expr(clause),
                                                                             str(id(p))))
    by = "namespace, service" if keyed or len(group) == 1 else f"namespace, service, {PART_LABEL}"
    query = _or_all(exprs)  # one part: exactly the query of that window alone
    if aggregate is not None:
        query = f"{aggregate} by ({by}) ({query})"
    end_ms = max(e - x for e, x in zip(last, shift, strict=False))
    end = first.start if end_ms <= base else (end_ms + step_ms / 2) / 1000
    index = {str(id(p)): i for i, p in enumerate(group)}
    by_key = {p.key: i for i, p in enumerate(group)}
    out: dict[str, list[Series]] = {}
    for series in client.query_range(query, first.start, end, step):
        if len(group) == 1:
            i: int | None = 0
        elif keyed:
            i = by_key.get(_key(series.labels))
        else:
            i = index.get(series.labels.get(PART_LABEL, ""))
        if i is None:
            continue
        points = series.points
        if shift[i] or (points and round(points[-1][0] * 1000) > last[i]):
            points = []
            for t, v in series.points:
                ms = round(t * 1000) + shift[i]
                if ms <= last[i]:
                    points.append((ms / 1000, v))
        labels = {k: v for k, v in series.labels.items() if k != PART_LABEL}
        out.setdefault(group[i].tag, []).append(Series(labels, points))
    return out


def _offset_selector(selector: str, clause: str) -> str:
    return selector + clause


def _offset_rate(matchers: str, rng: str, clause: str) -> str:
    return f"sum by (namespace, service) ({_hops('rate', matchers, rng, clause)})"


def _merged(results: Iterable[dict[str, list[_T]]]) -> dict[str, list[_T]]:
    out: dict[str, list[_T]] = {}
    for result in results:
        for tag, items in result.items():
            out.setdefault(tag, []).extend(items)
    return out


def batch_window_stats(client: PromClient, jobs: list[tuple[Window, Scope]], *,
                       coverage_by_service: bool = False, separate_ranges: bool = False
                       ) -> list[tuple[dict[ServiceKey, WindowStats], list[str],
                                       dict[ServiceKey, list[str]]]]:
    """Per-Service statistics of many (window, scope) jobs in a fixed number of queries.

    Four instant queries (totals, cross-zone pairs, hint-ignored bytes, coverage at the
    window edges), each an ``or`` of one ``@``-pinned part per job, plus one range query
    per distinct step for the locality share (:func:`_range_calls`); each of them is split
    into requests of at most :data:`MAX_PARTS_PER_QUERY` jobs, sent
    :data:`MAX_CONCURRENT_QUERIES` at a time. Every figure is the one :func:`window_stats`
    would compute for each job alone.

    Args:
        client: the Prometheus API.
        jobs: ``[(window, scope), ...]``.
        coverage_by_service: check the window edges per Service (``count by (namespace,
            service)``) rather than for the scope as a whole (``count``).
        separate_ranges: one locality range query per job, exactly as for one window
            (cheapest when each job selects every Service); else they are batched.

    Returns:
        Per job, in order: ``({service: WindowStats}, scope warnings, {service: warnings})``;
        Services with no ``zonemeter_service_bytes_total`` increase in the window are
        absent; the scope warnings are filled without ``coverage_by_service``, the
        per-Service ones with it.

    Raises:
        InputError: from the client (unreachable, refused).
    """
    if not jobs:
        return []
    totals_q, cross_q, hints_q, cover_q = {}, {}, {}, {}
    ranges: list[_RangePart] = []
    at = max(w.end for w, _ in jobs)
    for i, (w, scope) in enumerate(jobs):
        rng = _range(w.seconds)
        end = format_ms(prometheus_ms(w.end))
        totals_q[f"{i}"] = (f"sum by (namespace, service) "
                            f"({_hops('increase', scope.matchers(), rng, f' @ {end}')})")
        cross_q[f"{i}"] = ("sum by (namespace, service, direction, client_zone, server_zone, "
                           "client_kind, lb_type) "
                           f"({_hops('increase', scope.matchers(CROSS_ZONE), rng, f' @ {end}')})")
        hints_q[f"{i}"] = (f"sum by (namespace, service) "
                           f"(increase({HINT_IGNORED}{scope.matchers()}[{rng}] @ {end}))")
        count = "count by (namespace, service)" if coverage_by_service else "count"
        for edge, t in (("start", w.start), ("end", w.end)):
            cover_q[f"{i}{edge}"] = (f"{count} ({BYTES}{scope.matchers()} "
                                     f"@ {format_ms(prometheus_ms(t))})")
        step = choose_step(w.seconds)
        n = max(1, math.ceil(w.seconds / step))
        last = w.start + (n - 1) * step
        if scope.keys is None or separate_ranges:
            sel = scope.matchers()
            ranges.append(_RangePart(f"{i}", functools.partial(_offset_selector, IN_EFFECT + sel),
                                     w.start, last, step, alone=separate_ranges))
        else:  # one part per Service: batched without tags
            for key in sorted(scope.keys):
                sel = label_matchers(key)
                ranges.append(_RangePart(
                    f"{i}", functools.partial(_offset_selector, IN_EFFECT + sel),
                    w.start, last, step, key=key))
    kinds = [_instant_calls(client, q, at) for q in (totals_q, cross_q, hints_q)]
    kinds.append(_instant_calls(client, cover_q, at, per_job=2))  # start and end
    kinds.append(_range_calls(client, ranges, "min"))  # type: ignore[arg-type]  # Series lists
    flat: list[Callable[[], dict[str, list[Any]]]] = [c for calls in kinds for c in calls]
    done = iter(_run_all(flat))
    totals, cross, hints, cover, loc = (_merged(next(done) for _ in calls) for calls in kinds)

    out = []
    for i, (w, scope) in enumerate(jobs):
        d = w.seconds
        shares = in_effect_shares(loc.get(f"{i}", []), w, choose_step(d))
        pairs: dict[ServiceKey, list[PairRate]] = {}
        for smp in cross.get(f"{i}", []):
            pairs.setdefault(_key(smp.labels), []).append(PairRate(
                smp.labels.get("direction", "unknown"), smp.labels.get("client_zone", "unknown"),
                smp.labels.get("server_zone", "unknown"), smp.value / d,
                smp.labels.get("client_kind", ""), smp.labels.get("lb_type", "")))
        hint_by = {_key(s.labels): s.value / d for s in hints.get(f"{i}", [])}
        stats: dict[ServiceKey, WindowStats] = {}
        for smp in totals.get(f"{i}", []):
            key = _key(smp.labels)
            if not scope.admits(key):
                continue
            prs = sorted(pairs.get(key, []), key=lambda p: (-p.bytes_per_second, p.direction,
                                                            p.client_zone, p.server_zone,
                                                            p.client_kind, p.lb_type))
            share, withdrawn = shares.get(key, (None, ()))
            stats[key] = WindowStats(
                window=w,
                bytes_per_second=smp.value / d,
                cross_zone_bytes_per_second=sum(p.bytes_per_second for p in prs),
                hint_ignored_bytes_per_second=hint_by.get(key, 0.0),
                locality_in_effect_share=share,
                cross_zone_pairs=tuple(prs),
                withdrawn_at=withdrawn)
        scope_warn: list[str] = []
        per_key: dict[ServiceKey, list[str]] = {}
        for edge in ("start", "end"):
            seen = cover.get(f"{i}{edge}", [])
            if not coverage_by_service:
                if not seen:
                    scope_warn.append(_coverage_warning(edge, w))
                continue
            present = {_key(s.labels) for s in seen}
            for key in stats:
                if key not in present:
                    per_key.setdefault(key, []).append(_coverage_warning(edge, w))
        out.append((stats, scope_warn, per_key))
    return out


def sub_window_seconds(window_seconds: float, scrape: float) -> float:
    """Length of the noise estimate's sub-windows: the smallest of the query steps
    (:data:`~agent.report.timespec.NICE_STEPS_SECONDS`) that is at least the window's query
    step and :data:`SCRAPES_PER_SUB_WINDOW` scrape intervals (the largest step when none is)."""
    floor = max(choose_step(window_seconds), SCRAPES_PER_SUB_WINDOW * scrape)
    return float(next((s for s in NICE_STEPS_SECONDS if s >= floor), NICE_STEPS_SECONDS[-1]))


def _offset_increase(matchers: str, rng: str, clause: str) -> str:
    return f"sum by (namespace, service, crossing) ({_hops('increase', matchers, rng, clause)})"


def spread_of(points: Mapping[float, tuple[float, float]], grid: list[float], seconds: float
              ) -> Spread | None:
    """:class:`Spread` of one Service from its sub-window increases.

    Args:
        points: ``{t: (all bytes, cross-zone bytes)}`` increases of the sub-window ending at
            ``t``; a grid instant absent here counts as 0 bytes.
        grid: the sub-window ends.
        seconds: sub-window length.

    Returns:
        The spread (sample variances and covariance, ``n - 1`` in the denominator, divided
        by ``n``), or ``None`` for fewer than 2 sub-windows.
    """
    n = len(grid)
    if n < 2:
        return None
    tot = [points.get(t, (0.0, 0.0))[0] / seconds for t in grid]
    cross = [points.get(t, (0.0, 0.0))[1] / seconds for t in grid]
    mt, mc = sum(tot) / n, sum(cross) / n
    var_t = sum((v - mt) ** 2 for v in tot) / (n - 1)
    var_c = sum((v - mc) ** 2 for v in cross) / (n - 1)
    cov = sum((x - mt) * (y - mc) for x, y in zip(tot, cross, strict=True)) / (n - 1)
    return Spread(n, seconds, var_t / n, var_c / n, cov / n)


def batch_spreads(client: PromClient, jobs: list[tuple[Window, Scope]], scrape: float, *,
                  separate_ranges: bool = False) -> list[dict[ServiceKey, Spread]]:
    """The noise of every (window, scope) job: per-sub-window increases, one range query per
    distinct sub-window length (batched as :func:`_range_calls` does).

    Each window ``[s, e)`` is cut into ``n = floor((e - s) / L)`` sub-windows of
    ``L = sub_window_seconds(e - s, scrape)``; the rate of sub-window ``k`` is
    ``sum by (namespace, service, crossing) (increase(zonemeter_service_bytes_total[L]))``
    at ``s + k L`` (k = 1..n), / ``L``.

    Args:
        client: the Prometheus API.
        jobs: ``[(window, scope), ...]``.
        scrape: scrape interval, seconds (:func:`scrape_interval`).
        separate_ranges: one request per job (each job selects every Service).

    Returns:
        Per job: ``{service: Spread}`` for the Services with at least one sub-window of data
        when the window holds at least 2 sub-windows, else ``{}``.

    Raises:
        InputError: from the client.
    """
    parts: list[_RangePart] = []
    grids: list[list[float]] = []
    for i, (w, scope) in enumerate(jobs):
        length = sub_window_seconds(w.seconds, scrape)
        n = int(math.floor(w.seconds / length + 1e-9))
        grid = [w.start + k * length for k in range(1, n + 1)]
        grids.append(grid)
        if n < 2:
            continue
        rng = _range(length)
        if scope.keys is None or separate_ranges:
            parts.append(_RangePart(
                f"{i}", functools.partial(_offset_increase, scope.matchers(), rng),
                grid[0], grid[-1], length, alone=separate_ranges))
        else:
            for key in sorted(scope.keys):
                parts.append(_RangePart(
                    f"{i}", functools.partial(_offset_increase, label_matchers(key), rng),
                    grid[0], grid[-1], length, key=key))
    result = _merged(_run_all(_range_calls(client, parts))) if parts else {}
    out: list[dict[ServiceKey, Spread]] = []
    for i, (w, scope) in enumerate(jobs):
        grid = grids[i]
        length = sub_window_seconds(w.seconds, scrape)
        on_grid = {prometheus_ms(t): t for t in grid}
        per_key: dict[ServiceKey, dict[float, tuple[float, float]]] = {}
        for series in result.get(f"{i}", []):
            key = _key(series.labels)
            if not scope.admits(key):
                continue
            cross = series.labels.get("crossing") == "cross_zone"
            acc = per_key.setdefault(key, {})
            for t, v in series.points:
                at = on_grid.get(prometheus_ms(t))
                if at is None or not math.isfinite(v):
                    continue
                tot, cz = acc.get(at, (0.0, 0.0))
                acc[at] = (tot + v, cz + (v if cross else 0.0))
        spreads = {k: spread_of(pts, grid, length) for k, pts in per_key.items()}
        out.append({k: sp for k, sp in spreads.items() if sp is not None})
    return out


def _with_spreads(stats: dict[ServiceKey, WindowStats], spreads: Mapping[ServiceKey, Spread]
                  ) -> dict[ServiceKey, WindowStats]:
    """``stats`` with each Service's spread (``None`` for a Service without one)."""
    return {key: dataclasses.replace(st, spread=spreads.get(key)) for key, st in stats.items()}


def window_stats(client: PromClient, window: Window, service: ServiceKey | None
                 ) -> tuple[dict[ServiceKey, WindowStats], list[str]]:
    """Per-Service statistics of one window (:func:`batch_window_stats` with one job).

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
    ((stats, warnings, _),) = batch_window_stats(client, [(window, Scope(service))])
    return stats, warnings


def _coverage_warning(edge: str, window: Window) -> str:
    return (f"no {BYTES} samples at the {edge} of the window {format_time(window.start)}.."
            f"{format_time(window.end)} (within Prometheus's lookback): the data covers only "
            "part of the window, and rates are averaged over the whole window")


def _no_data(which: str, window: Window, service: ServiceKey | None) -> InputError:
    what = f" for {service}" if service else ""
    return InputError(
        f"no {BYTES} data{what} in the {which} window {format_time(window.start)}.."
        f"{format_time(window.end)} (a window needs at least two scrapes: check that this "
        "Prometheus scrapes the zonemeter agents and still keeps data that old)",
        source=f"--{which}")


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
    billed: float | None = None
    if frac is not None:  # the same arithmetic over the billed classes' bytes
        billed = (billed_cross_zone(before, price) / before.bytes_per_second * after.bytes_per_second
                  - billed_cross_zone(after, price))
    saved_se, normalized_se = change_errors(before, after)
    sig = None if normalized is None else significant(normalized, normalized_se)
    usd = None if sig is None or billed is None else (
        price.usd_per_month(billed) if sig else 0.0)
    if normalized is not None and sig is None:
        warnings.append("too few sub-windows to measure the noise: the change is not priced")
    return Change(key, before, after, saved, normalized, usd, tuple(warnings), change_time, series,
                  saved_se, normalized_se, billed)


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
    pairs: dict[tuple[str, str, str, str, str], float] = {}
    for s in stats:
        for p in s.cross_zone_pairs:
            k = (p.direction, p.client_zone, p.server_zone, p.client_kind, p.lb_type)
            pairs[k] = pairs.get(k, 0.0) + p.bytes_per_second
    spreads = [s.spread for s in stats]
    spread = None
    if spreads and all(sp is not None for sp in spreads):
        known_spreads = [sp for sp in spreads if sp is not None]
        spread = Spread(min(sp.sub_windows for sp in known_spreads),
                        max(sp.seconds for sp in known_spreads),
                        sum(sp.var_bytes for sp in known_spreads),
                        sum(sp.var_cross for sp in known_spreads),
                        sum(sp.cov for sp in known_spreads))
    return WindowStats(
        window=window,
        bytes_per_second=total,
        cross_zone_bytes_per_second=sum(s.cross_zone_bytes_per_second for s in stats),
        hint_ignored_bytes_per_second=sum(s.hint_ignored_bytes_per_second for s in stats),
        locality_in_effect_share=share,
        cross_zone_pairs=tuple(PairRate(*k[:3], v, *k[3:]) for k, v in
                               sorted(pairs.items(), key=lambda kv: (-kv[1], kv[0]))),
        spread=spread)


def total_of(changes: list[Change], price: Price, before: Window, after: Window, *,
             names: list[str] | None = None) -> Change:
    """The cluster total (of Services, or of the non-Service rows when ``names`` names them).

    Rates are sums over ``changes``; the normalised saving (and its dollars) is the sum of
    the normalised savings of the Services whose normalised change is significant (the rest
    count 0, with a warning naming those without a before figure or with unknown noise);
    standard errors add in quadrature over the Services summed (Services taken as
    independent); the locality share is the mean of the Services' shares weighted by their
    bytes/s in that window.
    """
    b = _sum_stats(before, [c.before for c in changes])
    a = _sum_stats(after, [c.after for c in changes])
    counted = [c for c in changes if c.significant]
    normalized = sum(c.normalized_saved or 0.0 for c in counted)
    billed = sum(c.billed_normalized_saved or 0.0 for c in counted)
    normalized_se = math.sqrt(sum((c.normalized_stderr or 0.0) ** 2 for c in counted))
    saved_ses = [c.saved_stderr for c in changes]
    saved_se = (None if any(v is None for v in saved_ses)
                else math.sqrt(sum((v or 0.0) ** 2 for v in saved_ses)))
    warnings = []
    label = names if names is not None else [str(c.key) for c in changes]
    noun = "rows" if names is not None else "Services"
    # a Service without bytes in either window has nothing to leave out
    undefined = [n for n, c in zip(label, changes, strict=True) if c.normalized_saved is None
                 and (c.before.bytes_per_second > 0 or c.after.bytes_per_second > 0)]
    if undefined:
        warnings.append(f"normalised total leaves out {noun} without a before figure: "
                        + ", ".join(undefined))
    unknown = [n for n, c in zip(label, changes, strict=True)
               if c.normalized_saved is not None and c.significant is None]
    if unknown:
        warnings.append(f"normalised total leaves out {noun} whose noise is unknown: "
                        + ", ".join(unknown))
    usd = price.usd_per_month(billed) if significant(normalized, normalized_se) else 0.0
    return Change(None, b, a, b.cross_zone_bytes_per_second - a.cross_zone_bytes_per_second,
                  normalized, usd, tuple(warnings), saved_stderr=saved_se,
                  normalized_stderr=normalized_se, billed_normalized_saved=billed)


#: scrape interval assumed when it cannot be measured, seconds
DEFAULT_SCRAPE_SECONDS = 60.0


def scrape_interval(client: PromClient, selector: str, at: float) -> float:
    """Median spacing (seconds) of the stored samples of ``selector`` in the 10 minutes
    before ``at``; :data:`DEFAULT_SCRAPE_SECONDS` when fewer than two samples are there."""
    gaps: list[float] = []
    for s in client.raw_samples(selector, 600, at)[:20]:
        gaps += [b[0] - a[0] for a, b in zip(s.points, s.points[1:], strict=False)]
    if not gaps:
        return DEFAULT_SCRAPE_SECONDS
    gaps.sort()
    return gaps[len(gaps) // 2]


def cross_zone_series(client: PromClient, spans: list[tuple[float, float, Scope]],
                      probe: ServiceKey | None, *, scrape: float | None = None
                      ) -> list[dict[ServiceKey, tuple[tuple[float, float], ...]]]:
    """Cross-zone bytes/s per Service over each ``[start, end]`` span, for the chart.

    Uses ``rate(...[max(4 x scrape, step + scrape)])`` (Grafana's ``$__rate_interval``) with
    the step from :func:`choose_step` of the span and the scrape interval measured once by
    :func:`scrape_interval` on the series of ``probe`` (one Service, so the measurement reads
    a bounded number of samples) at the latest span end. All spans are evaluated with one
    request per distinct step and :data:`MAX_PARTS_PER_QUERY` spans (:func:`_range_calls`).

    Args:
        client: the Prometheus API.
        spans: ``[(start, end, scope), ...]`` in Unix seconds.
        probe: the Service whose samples give the scrape interval; ``None``: the first
            scope's whole selector.
        scrape: the scrape interval when already measured (then ``probe`` is not read).

    Returns:
        Per span, in order: ``{service: ((t, bytes_per_second), ...)}``.
    """
    if not spans:
        return []
    if scrape is None:
        probe_sel = BYTES + (label_matchers(probe) if probe is not None
                             else spans[0][2].matchers())
        scrape = scrape_interval(client, probe_sel, max(end for _, end, _ in spans))
    parts = []
    for i, (start, end, scope) in enumerate(spans):
        step = choose_step(end - start)
        rng = _range(max(4 * scrape, step + scrape))
        sel = scope.matchers(CROSS_ZONE)
        parts.append(_RangePart(
            f"{i}", functools.partial(_offset_rate, sel, rng),
            start, end, step, alone=scope.keys is None,
            key=next(iter(scope.keys)) if scope.keys is not None and len(scope.keys) == 1
            else None))
    result = _merged(_run_all(_range_calls(client, parts)))
    return [{_key(s.labels): tuple(s.points) for s in result.get(f"{i}", [])
             if scope.admits(_key(s.labels))}
            for i, (_, _, scope) in enumerate(spans)]


def class_summary(price: Price) -> str:
    """One phrase naming the Service client classes the price bills and those it does not."""
    from agent.report.pricing import CLASS_RULES
    if price.name not in CLASS_RULES:
        return "every class billed"
    rules = CLASS_RULES[price.name].values()

    def name(kind: str, lb: str) -> str:
        return f"{kind}/{lb}" if lb else (kind or "no class")

    free = [name(r.client_kind, r.lb_type) for r in rules if not r.billed
            and r.client_kind not in ("external", "") and not (r.client_kind == "load-balancer"
                                                                and not r.lb_type)]
    paid = [name(r.client_kind, r.lb_type) for r in rules if r.billed
            and r.client_kind not in ("", "unknown") and r.lb_type != "other"
            and not (r.client_kind == "load-balancer" and not r.lb_type) and r.sure]
    if not any(r.billed for r in rules):
        return "no class billed"
    return f"billed {', '.join(paid) or 'none'}; not billed {', '.join(free) or 'none'}"


def assumptions(price: Price) -> tuple[str, ...]:
    """The lines the report prints to state how it computed its numbers."""
    return (
        f"price: {price.describe()}; GB = 10^9 bytes; month = 30.44 days",
        "bytes are L3 (IP header included) as counted by zonemeter; cross-zone means "
        "crossing=\"cross_zone\" (cross_region and external bytes are priced differently and "
        "left out)",
        "rates = increase() over the window / window seconds (counter resets handled by "
        "Prometheus; edges between scrapes are extrapolated as rate() does)",
        "normalised saving = before cross-zone fraction x after bytes/s - after cross-zone "
        "bytes/s; total = sum over Services",
        "$/month = the normalised saving over the cross-zone bytes of the client classes the "
        f"price bills ({price.name}: {class_summary(price)}; by class below, with each rule's "
        "reason and source; docs/report.md, Prices by client class)",
        "locality in effect at an instant = every zonemeter_service_locality_in_effect series "
        "of the Service (all client zones, all agents) is 1; share = fraction of the window's "
        "query steps with that state",
        "noise: each window is cut into sub-windows of at least 4 scrape intervals; standard "
        "error = sample standard deviation of the sub-window rates / sqrt(count), the two "
        "windows' errors combined in quadrature (normalised: first-order error propagation); "
        f"a change within {SIGNIFICANCE_Z:g} standard errors (the ± shown) reads \"no "
        "significant change\" and is neither priced nor counted in the total",
    )


def report_for_windows(client: PromClient, price: Price, before: Window, after: Window, *,
                       service: ServiceKey | None = None, change_time: float | None = None,
                       with_series: bool = False) -> Report:
    """Report with one before and one after window for every Service.

    Makes a fixed number of HTTP requests whatever the number of Services: 4 instant
    queries (each window an ``@``-pinned part), 2 range queries (the locality state over
    each window), and 2 more with ``with_series``; without ``service``, 6 more for the
    non-Service rows (:func:`agent.report.workloads.workload_changes`).

    Raises:
        InputError: no data in a window, unreachable Prometheus.
    """
    scope = Scope(service)
    (b_stats, b_warn, _), (a_stats, a_warn, _) = batch_window_stats(
        client, [(before, scope), (after, scope)], separate_ranges=True)
    if not b_stats:
        raise _no_data("before", before, service)
    if not a_stats:
        raise _no_data("after", after, service)
    keys = sorted(set(b_stats) | set(a_stats))
    probe = service or keys[0]
    scrape = scrape_interval(client, BYTES + label_matchers(probe), after.end)
    b_spread, a_spread = batch_spreads(client, [(before, scope), (after, scope)], scrape,
                                       separate_ranges=True)
    b_stats, a_stats = _with_spreads(b_stats, b_spread), _with_spreads(a_stats, a_spread)
    series: dict[ServiceKey, tuple[tuple[float, float], ...]] = {}
    if with_series:
        (series,) = cross_zone_series(client, [(before.start, after.end, scope)], probe,
                                      scrape=scrape)
    changes = [change_of(k, b_stats.get(k, WindowStats(before)), a_stats.get(k, WindowStats(after)),
                         price, change_time=change_time, series=series.get(k, ()))
               for k in keys]
    changes.sort(key=_order)
    total = total_of(changes, price, before, after)
    warn = [f"before window: {w}" for w in b_warn] + [f"after window: {w}" for w in a_warn]
    workloads: tuple[WorkloadChange, ...] = ()
    workload_total = None
    if service is None:  # non-Service bytes belong to no Service: only in the whole report
        from agent.report.workloads import workload_changes  # imports this module

        workloads, workload_total = workload_changes(client, price, before, after, scrape)
        if not workloads:
            workload_total = None
    classes = class_costs("services", total.before, total.after, price)
    if workload_total is not None:
        classes += class_costs("workloads", workload_total.before, workload_total.after, price)
    return Report(price, before, after, change_time, tuple(changes), total, tuple(warn),
                  assumptions(price), workloads, workload_total, classes)


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
                             f"ends in the future: use a --window of at most "
                             f"{max(now - change, 0.0):.0f} s, or none (24 h shortened to end "
                             "by now)", source=flag)
    if d < MIN_WINDOW_SECONDS:
        raise InputError(f"the change at {format_time(change)} leaves a window of {d:.0f} s, "
                         f"under {MIN_WINDOW_SECONDS:.0f} s", source=flag)
    return Window(change - d, change), Window(change, change + d)


#: Services drawn (one panel each) in the chart of per-Service windows, largest normalised
#: saving first; the chart's series are fetched for these only
CHART_PANELS = 12
#: skipped Services named in the error when none has data (the rest are counted)
MAX_NAMED_SKIPS = 5


def _named(keys: list[ServiceKey]) -> str:
    """``a/b, c/d and 3 more``: the first :data:`MAX_NAMED_SKIPS` Services, the rest counted."""
    named = ", ".join(str(k) for k in keys[:MAX_NAMED_SKIPS])
    more = len(keys) - MAX_NAMED_SKIPS
    return named + (f" and {more} more" if more > 0 else "")


def _skip_reason(err: InputError) -> str:
    """The short, Service-independent reason a change time leaves no usable window."""
    if "in the future" in err.problem:
        return "--window after the change ends in the future"
    return f"changed under {MIN_WINDOW_SECONDS:.0f} s ago"


#: the assumption line of a report with per-Service windows
PER_SERVICE_WORKLOADS = ("non-Service traffic (zonemeter_workload_bytes_total) has no locality "
                         "change of its own: it is reported with --before/--after or "
                         "--change-time only")


def report_per_service(client: PromClient, price: Price, now: float, *,
                       window_seconds: float | None = None, service: ServiceKey | None = None,
                       with_series: bool = False) -> Report:
    """Report where each Service's windows surround its own last locality change.

    Services whose change time leaves no usable window or no data are skipped with a
    report-level warning, one line per reason naming the Services (the first
    :data:`MAX_NAMED_SKIPS`, the rest counted). The HTTP requests are bounded whatever the number of Services:
    1 for the change times, 4 instant queries, one range query per distinct step of the
    windows (at most 8 without ``window_seconds``, 1 with it), and with ``with_series`` 1
    more plus one per distinct chart step. Services sharing a window share one part of
    each query; otherwise each Service is one ``@``/``offset``-pinned part, so the query
    text (sent as a POST form when long) grows with the number of distinct windows.

    Raises:
        InputError: no Service has a change time, or none has data in its windows.
    """
    times = change_times(client, now, service)
    if not times:
        what = f" for {service}" if service else ""
        raise InputError(f"no {LAST_CHANGE} series{what}: give --before/--after or --change-time",
                         source="--prometheus")
    windows: dict[ServiceKey, tuple[Window, Window]] = {}
    skipped: dict[ServiceKey, str] = {}
    for key in sorted(times):
        try:
            windows[key] = windows_around(times[key], now, window_seconds, flag="--window")
        except InputError as err:
            skipped[key] = _skip_reason(err)
    # one job per distinct window; a Service's before and after windows are two jobs
    members: dict[Window, set[ServiceKey]] = {}
    for key, (before, after) in windows.items():
        members.setdefault(before, set()).add(key)
        members.setdefault(after, set()).add(key)
    jobs = [(w, Scope(service, frozenset(keys)))
            for w, keys in sorted(members.items(), key=lambda kv: (kv[0].start, kv[0].end))]
    results = dict(zip((w for w, _ in jobs), batch_window_stats(client, jobs,
                                                                coverage_by_service=True), strict=False))

    changes: list[Change] = []
    # Services skipped or warned about, by reason: one line per reason, each Service once
    skips: dict[str, list[ServiceKey]] = {}
    partial: dict[str, list[ServiceKey]] = {}
    kept: list[ServiceKey] = []
    for key in sorted(times):
        if key in skipped:
            skips.setdefault(skipped[key], []).append(key)
            continue
        before, after = windows[key]
        b_stats, _, b_warn = results[before]
        a_stats, _, a_warn = results[after]
        if key not in b_stats:
            skips.setdefault(f"no {BYTES} data in the before window", []).append(key)
            continue
        if key not in a_stats:
            skips.setdefault(f"no {BYTES} data in the after window", []).append(key)
            continue
        for which, warn in (("before", b_warn), ("after", a_warn)):
            for edge in sorted({w.split(" of the window")[0] for w in warn.get(key, [])}):
                partial.setdefault(f"{edge} of the {which} window", []).append(key)
        kept.append(key)
    warnings = [f"skipped, {reason}: {_named(keys)}" for reason, keys in skips.items()]
    warnings += [f"{reason} (the data cover only part of it; rates are averaged over the "
                 f"whole window): {_named(keys)}" for reason, keys in partial.items()]
    if not kept:
        reasons = "; ".join(f"{reason}: {_named(keys)}" for reason, keys in skips.items())
        raise InputError(f"no Service has data around its last locality change ({reasons}); "
                         "check that Prometheus scrapes the agents and keeps data that old, or "
                         "give --before/--after", source="--prometheus")
    scrape = scrape_interval(client, BYTES + label_matchers(kept[0]),
                             max(windows[k][1].end for k in kept))
    used = sorted({w for k in kept for w in windows[k]}, key=lambda w: (w.start, w.end))
    spread_jobs = [(w, Scope(service, frozenset(k for k in kept if w in windows[k])))
                   for w in used]
    spreads = dict(zip(used, batch_spreads(client, spread_jobs, scrape), strict=True))
    for key in kept:
        before, after = windows[key]
        b = dataclasses.replace(results[before][0][key], spread=spreads[before].get(key))
        a = dataclasses.replace(results[after][0][key], spread=spreads[after].get(key))
        changes.append(change_of(key, b, a, price, change_time=times[key]))
    changes.sort(key=_order)
    if with_series:  # only for the Services the chart draws
        drawn = [c.key for c in changes[:CHART_PANELS] if c.key is not None]
        curves = cross_zone_series(
            client, [(windows[k][0].start, windows[k][1].end, Scope(service, frozenset({k})))
                     for k in drawn], drawn[0], scrape=scrape)
        series = {k: c.get(k, ()) for k, c in zip(drawn, curves, strict=False)}
        changes = [dataclasses.replace(c, series=series[c.key]) if c.key in series else c
                   for c in changes]
    spans = [windows[k] for k in kept]
    env_before = Window(min(b.start for b, _ in spans), max(b.end for b, _ in spans))
    env_after = Window(min(a.start for _, a in spans), max(a.end for _, a in spans))
    total = total_of(changes, price, env_before, env_after)
    return Report(price, None, None, None, tuple(changes), total, tuple(warnings),
                  (*assumptions(price), PER_SERVICE_WORKLOADS),
                  classes=class_costs("services", total.before, total.after, price))
