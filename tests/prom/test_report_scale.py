"""``zonemeter report`` makes a fixed number of Prometheus requests whatever the number of
Services, and its batched queries give exactly the numbers of one query per Service.

A real Prometheus (Debian's 2.42) serves two data sets built by
:func:`tests.prom.promdata.scale_input`: 200 Services on one day, 1 Service a day later
(so each data set is alone at its own "now"). Every Service has its own change time on the
15 s scrape grid (Service i's after window is Service i + 40's before window, the rest are
distinct), and rates chosen so every figure is known by hand. HTTP requests are counted at
the ``requests.Session`` level.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from agent.report.compute import (
    BYTES,
    CHART_PANELS,
    CROSS_ZONE,
    HINT_IGNORED,
    IN_EFFECT,
    PairRate,
    Report,
    ServiceKey,
    Spread,
    WindowStats,
    in_effect_shares,
    label_matchers,
    report_for_windows,
    report_per_service,
    spread_of,
    sub_window_seconds,
)
from agent.report.pricing import parse_price
from agent.report.prom import PromClient
from agent.report.timespec import Window, choose_step
from tests.fixtures.promdata import (
    MANY_SPAN,
    MANY_T0,
    MANY_WINDOW,
    ONE_T0,
    many_change_time,
    running_prometheus,
    scale_input,
)

MANY = 200
AWS = parse_price("aws")
approx = lambda v: pytest.approx(v, rel=1e-12, abs=1e-9)  # noqa: E731


class CountingSession(requests.Session):
    """A ``requests.Session`` that counts the HTTP requests it sends."""

    def __init__(self) -> None:
        super().__init__()
        self.sent = 0
        self.methods: list[str] = []
        self.lock = threading.Lock()

    def request(self, method: str, url: str, *args: Any,  # type: ignore[override]
                **kwargs: Any) -> requests.Response:
        with self.lock:  # the report sends a few requests concurrently
            self.sent += 1
            self.methods.append(str(method))
        return super().request(method, url, *args, **kwargs)


@pytest.fixture(scope="module")
def scale_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_prometheus(tmp_path_factory.mktemp("prom-scale"),
                            openmetrics=scale_input(MANY)) as url:
        yield url


def client(url: str) -> tuple[PromClient, CountingSession]:
    session = CountingSession()
    return PromClient(url, session=session), session


def check_by_hand(report: Report, n: int, t0: int) -> None:
    """Every Service's figures, from the rates in :func:`many_services_input`."""
    assert len(report.services) == n
    for change in report.services:
        assert change.key is not None
        i = int(change.key.name.removeprefix("svc-"))
        same = 1000 * (i + 1)
        assert change.change_time in (None, many_change_time(t0, i))
        b, a = change.before, change.after
        assert b.bytes_per_second == approx(same + 2000)
        assert b.cross_zone_bytes_per_second == approx(2000)
        (pair,) = b.cross_zone_pairs
        assert (pair.direction, pair.client_zone, pair.server_zone) == ("request", "a", "b")
        assert pair.bytes_per_second == approx(2000)
        assert a.bytes_per_second == approx(same + 500)
        assert a.cross_zone_bytes_per_second == approx(500)
        assert change.saved == approx(1500)
        assert change.normalized_saved == approx(2000 / (same + 2000) * (same + 500) - 500)
        assert change.warnings == ()
        # steady rates on the 15 s scrape grid: 600 s windows in 10 sub-windows of 60 s,
        # every one at the window's rate, so no variation and the change is significant
        for w in (b, a):
            assert w.spread == Spread(10, 60.0, 0.0, 0.0, 0.0)
        assert change.significant is True and change.usd_per_month_saved is not None


def per_service_counts(url: str, with_series: bool) -> dict[int, int]:
    counts = {}
    for n, t0 in ((1, ONE_T0), (MANY, MANY_T0)):
        c, session = client(url)
        report = report_per_service(c, AWS, t0 + MANY_SPAN, window_seconds=MANY_WINDOW,
                                    with_series=with_series)
        check_by_hand(report, n, t0)
        for rank, change in enumerate(report.services):
            # windows of 600 s at 1 s steps: in effect exactly from the change on
            assert (change.before.locality_in_effect_share,
                    change.after.locality_in_effect_share) == (0, 1)
            if with_series and rank < CHART_PANELS:  # the chart's Services only
                assert change.series and change.series[-1][1] == approx(500)
            else:
                assert change.series == ()
        assert report.warnings == ()
        counts[n] = session.sent
        assert session.sent == c.requests_made
    return counts


def test_per_service_windows_make_the_same_few_requests_for_1_and_200_services(
        scale_url: str) -> None:
    counts = per_service_counts(scale_url, with_series=False)
    # change times + totals + cross-zone pairs + hint-ignored + window-edge coverage +
    # two locality range queries (every window is 600 s: one step; each Service's before
    # windows in one, its after windows in the other) + the scrape-interval probe + two
    # sub-window range queries for the noise (one sub-window length, two lanes likewise)
    assert counts == {1: 10, MANY: 10}


def test_per_service_windows_with_chart_make_the_same_few_requests(scale_url: str) -> None:
    counts = per_service_counts(scale_url, with_series=True)
    assert counts == {1: 11, MANY: 11}  # + one chart range query (the probe is shared)


def test_explicit_windows_make_the_same_few_requests_for_1_and_200_services(
        scale_url: str) -> None:
    counts = {}
    for n, t0 in ((1, ONE_T0), (MANY, MANY_T0)):
        # before every change (i <= 199: change <= t0 + 3585) and after every change
        before, after = Window(t0, t0 + 600), Window(t0 + 3600, t0 + 4200)
        c, session = client(scale_url)
        report = report_for_windows(c, AWS, before, after)
        assert len(report.services) == n
        for change in report.services:
            assert change.before.cross_zone_bytes_per_second == approx(2000)
            assert change.after.cross_zone_bytes_per_second == approx(500)
        counts[n] = session.sent
        by_key = {ch.key: ch for ch in report.services}
        for key in list(by_key)[:: max(1, n // 7)]:  # bit for bit, as one query per Service
            assert key is not None
            assert by_key[key].before == reference_window_stats(c, before, key)
            assert by_key[key].after == reference_window_stats(c, after, key)
    # 4 instant query kinds (both windows in each) + one locality range query per window +
    # the scrape-interval probe + one sub-window (noise) range query per window, then per
    # window the non-Service rows' increase, zone pairs and sub-windows (none in this data)
    assert counts == {1: 15, MANY: 15}


def reference_window_stats(c: PromClient, w: Window, key: ServiceKey) -> WindowStats | None:
    """One Service's window the way the report computed it before batching: its own
    instant queries at the window end and its own range query from the window start."""
    d, rng = w.seconds, f"{int(round(w.seconds * 1000))}ms"
    total = c.query(f"sum by (namespace, service) (increase({BYTES}{label_matchers(key)}[{rng}]))",
                    w.end)
    if not total:
        return None
    cross = c.query("sum by (namespace, service, direction, client_zone, server_zone) "
                    f"(increase({BYTES}{label_matchers(key, CROSS_ZONE)}[{rng}]))", w.end)
    hints = c.query(f"sum by (namespace, service) (increase({HINT_IGNORED}"
                    f"{label_matchers(key)}[{rng}]))", w.end)
    step = choose_step(d)
    n = max(1, math.ceil(d / step))
    loc = c.query_range(f"min by (namespace, service) ({IN_EFFECT}{label_matchers(key)})",
                        w.start, w.start + (n - 1) * step, step)
    share, withdrawn = in_effect_shares(loc, w, step).get(key, (None, ()))
    pairs = sorted((PairRate(s.labels["direction"], s.labels["client_zone"],
                             s.labels["server_zone"], s.value / d) for s in cross),
                   key=lambda p: (-p.bytes_per_second, p.direction, p.client_zone,
                                  p.server_zone))
    return WindowStats(w, total[0].value / d, sum(p.bytes_per_second for p in pairs),
                       hints[0].value / d if hints else 0.0, share, tuple(pairs), withdrawn,
                       reference_spread(c, w, key))


def reference_spread(c: PromClient, w: Window, key: ServiceKey, scrape: float = 15.0
                     ) -> Spread | None:
    """One Service's noise from its own range query of sub-window increases."""
    length = sub_window_seconds(w.seconds, scrape)
    n = int(math.floor(w.seconds / length + 1e-9))
    if n < 2:
        return None
    grid = [w.start + k * length for k in range(1, n + 1)]
    series = c.query_range(f"sum by (namespace, service, crossing) (increase({BYTES}"
                           f"{label_matchers(key)}[{int(round(length * 1000))}ms]))",
                           grid[0], grid[-1], length)
    points: dict[float, tuple[float, float]] = {}
    for s in series:
        for t, v in s.points:
            (at,) = [g for g in grid if round(g * 1000) == round(t * 1000)]
            tot, cz = points.get(at, (0.0, 0.0))
            points[at] = (tot + v, cz + (v if s.labels.get("crossing") == "cross_zone" else 0.0))
    return spread_of(points, grid, length) if series else None


@pytest.mark.parametrize("now_offset", [MANY_SPAN, MANY_SPAN - 0.123, MANY_SPAN - 7.5])
def test_default_windows_match_one_query_per_service_exactly(scale_url: str,
                                                             now_offset: float) -> None:
    """Without --window each Service's window is now - change (from 615 s to ~3600 s, so
    several steps, and starts off the scrape grid and off whole seconds): the batched
    figures equal, bit for bit, those of separate per-Service queries."""
    c, session = client(scale_url)
    now = MANY_T0 + now_offset
    report = report_per_service(c, AWS, now)
    assert len(report.services) == MANY
    # 400 distinct windows (no two Services share one): change times + 4 instant query kinds
    # in 2 requests each (256 windows per request) + range queries for 3 distinct steps
    # (1, 2 and 5 s) x 2 lanes (a Service's before and after windows) + the scrape-interval
    # probe + the noise's range queries (every window has 60 s sub-windows: 2 lanes): 18 at
    # most (one query per Service made 2,401)
    assert session.sent <= 1 + 4 * 2 + 3 * 2 + 1 + 2
    by_key = {ch.key: ch for ch in report.services}
    for i in (0, 1, 39, 40, 41, 99, 150, 198, 199):
        key = ServiceKey("many", f"svc-{i:03d}")
        change = by_key[key]
        assert change.change_time == many_change_time(MANY_T0, i)
        assert change.before == reference_window_stats(c, change.before.window, key)
        assert change.after == reference_window_stats(c, change.after.window, key)
        assert change.after.window.end == now


def test_service_filter_keeps_the_query_small(scale_url: str) -> None:
    c, session = client(scale_url)
    report = report_per_service(c, AWS, MANY_T0 + MANY_SPAN, window_seconds=MANY_WINDOW,
                                service=ServiceKey("many", "svc-007"))
    check_by_hand(report, 1, MANY_T0)
    assert session.sent == 10 and session.methods == ["GET"] * 10


def test_long_batched_queries_are_posted(scale_url: str) -> None:
    c, session = client(scale_url)
    report_per_service(c, AWS, MANY_T0 + MANY_SPAN, window_seconds=MANY_WINDOW)
    # 200 distinct windows make long queries: sent as POST forms, the short ones as GET
    assert "POST" in session.methods and session.methods[0] == "GET"
