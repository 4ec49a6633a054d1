"""Non-Service traffic in ``zonemeter report``: cross-zone bytes per workload, before/after.

Pod-to-pod traffic without a Service, pod-to-node traffic and traffic with peers outside
the cluster (a managed database in a zone) are billed like Service traffic but are not in
``zonemeter_service_bytes_total``; the agents export them as
``zonemeter_workload_bytes_total{namespace, workload, workload_kind, remote_kind, crossing,
direction, client_zone, remote_zone}`` (docs/metrics.md). Each byte is in exactly one
series: a pod remote's bytes are the sender's ``egress``, a non-pod remote's bytes are the
local pod's ``egress`` or ``ingress``.

The report groups them by ``(namespace, workload, workload_kind, remote_kind)`` and applies
the Services' arithmetic to each group (:func:`agent.report.compute.change_of`): the window
rates are ``increase()`` over the window / its seconds, the noise comes from sub-windows of
the same length as the Services', the normalised saving uses the group's own cross-zone
fraction, and only a significant change is priced, by the rule of the row's remote class
(docs/report.md, "Non-Service traffic" and "Prices by client class").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from agent.report.compute import (
    CROSS_ZONE,
    Change,
    PairRate,
    WindowStats,
    change_of,
    spread_of,
    sub_window_seconds,
    total_of,
)
from agent.report.pricing import Price
from agent.report.prom import PromClient, prometheus_ms
from agent.report.timespec import Window

WORKLOAD_BYTES = "zonemeter_workload_bytes_total"
#: the labels a row of the non-Service table is keyed by
GROUP = "namespace, workload, workload_kind, remote_kind"


@dataclass(frozen=True, slots=True, order=True)
class WorkloadKey:
    """One row of the non-Service table.

    Attributes:
        namespace, workload, kind: the local workload (``workload_kind`` ``Deployment``,
            ``StatefulSet``, ``Pod``, ...).
        remote_kind: the peer class, ``pod``, ``node``, ``load-balancer``, ``cidr``,
            ``external`` or ``unknown`` (the client classes' vocabulary).
    """

    namespace: str
    workload: str
    kind: str
    remote_kind: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.workload} ({self.kind}) -> {self.remote_kind}"


@dataclass(frozen=True, slots=True)
class WorkloadChange:
    """Before/after of one workload row: ``change`` carries every figure as for a Service
    (its ``key`` is ``None``; locality does not apply to non-Service bytes)."""

    key: WorkloadKey
    change: Change


def _wkey(labels: Mapping[str, str]) -> WorkloadKey:
    return WorkloadKey(labels.get("namespace", ""), labels.get("workload", ""),
                       labels.get("workload_kind", ""), labels.get("remote_kind", ""))


def _stats(client: PromClient, window: Window, scrape: float) -> dict[WorkloadKey, WindowStats]:
    """Rates, zone pairs and noise of every workload row over one window (3 requests)."""
    d = f"{int(round(window.seconds * 1000))}ms"
    at = f"@ {window.end:.3f}"
    totals: dict[WorkloadKey, list[float]] = {}
    for s in client.query(f"sum by ({GROUP}, crossing) "
                          f"(increase({WORKLOAD_BYTES}[{d}] {at}))", window.end):
        if not math.isfinite(s.value):
            continue
        acc = totals.setdefault(_wkey(s.labels), [0.0, 0.0])
        acc[0] += s.value
        if s.labels.get("crossing") == "cross_zone":
            acc[1] += s.value
    pairs: dict[WorkloadKey, list[PairRate]] = {}
    for s in client.query(f"sum by ({GROUP}, direction, client_zone, remote_zone) "
                          f"(increase({WORKLOAD_BYTES}{{{CROSS_ZONE}}}[{d}] {at}))", window.end):
        if math.isfinite(s.value) and s.value > 0:
            # the row's class is its remote's (a pod's hop to a load balancer, a managed
            # database...), priced by that class's rule (docs/report.md, Prices by client class)
            pairs.setdefault(_wkey(s.labels), []).append(PairRate(
                s.labels.get("direction", ""), s.labels.get("client_zone", ""),
                s.labels.get("remote_zone", ""), s.value / window.seconds,
                s.labels.get("remote_kind", "")))
    length = sub_window_seconds(window.seconds, scrape)
    n = int(math.floor(window.seconds / length + 1e-9))
    grid = [window.start + k * length for k in range(1, n + 1)]
    points: dict[WorkloadKey, dict[float, tuple[float, float]]] = {}
    if n >= 2:
        on_grid = {prometheus_ms(t): t for t in grid}
        expr = (f"sum by ({GROUP}, crossing) "
                f"(increase({WORKLOAD_BYTES}[{int(round(length * 1000))}ms]))")
        for series in client.query_range(expr, grid[0], grid[-1], length):
            cross = series.labels.get("crossing") == "cross_zone"
            sub = points.setdefault(_wkey(series.labels), {})
            for t, v in series.points:
                g = on_grid.get(prometheus_ms(t))
                if g is None or not math.isfinite(v):
                    continue
                tot, cz = sub.get(g, (0.0, 0.0))
                sub[g] = (tot + v, cz + (v if cross else 0.0))
    out = {}
    for key, (tot, cz) in totals.items():
        out[key] = WindowStats(
            window, tot / window.seconds, cz / window.seconds, 0.0, None,
            tuple(sorted(pairs.get(key, []), key=lambda p: (-p.bytes_per_second,
                                                            p.direction, p.client_zone,
                                                            p.server_zone))),
            spread=spread_of(points.get(key, {}), grid, length) if n >= 2 else None)
    return out


def workload_changes(client: PromClient, price: Price, before: Window, after: Window,
                     scrape: float) -> tuple[tuple[WorkloadChange, ...], Change]:
    """The non-Service table of a report with one before and one after window.

    Six requests whatever the number of workloads (per window: the increase by crossing, the
    cross-zone zone pairs, the sub-window increases).

    Args:
        client: the Prometheus API.
        price: the price (the same as the Services').
        before, after: the windows.
        scrape: the scrape interval, seconds (:func:`agent.report.compute.scrape_interval`).

    Returns:
        ``(rows, total)``: rows ordered by normalised saving (largest first), then name; the
        total sums the rows as :func:`agent.report.compute.total_of` sums Services.

    Raises:
        InputError: from the client (unreachable Prometheus, refused query).
    """
    b = _stats(client, before, scrape)
    a = _stats(client, after, scrape)
    rows = [WorkloadChange(k, change_of(None, b.get(k, WindowStats(before)),
                                        a.get(k, WindowStats(after)), price))
            for k in sorted(set(b) | set(a))]
    rows.sort(key=lambda r: (-(r.change.normalized_saved if r.change.normalized_saved is not None
                               else -math.inf), r.key))
    total = total_of([r.change for r in rows], price, before, after, names=[str(r.key) for r in rows])
    return tuple(rows), total
