"""A real Prometheus (Debian's 2.42) serving a TSDB built from known OpenMetrics input.

The input (:func:`openmetrics_input`) is written so every figure the report prints can be
worked out by hand: counters grow by a constant number of bytes per 15 s scrape, one
constant before the change at ``CHANGE`` and another after it (one series resets, one
Service's locality is withdrawn half-way through the after window). The TSDB is built with
``promtool tsdb create-blocks-from openmetrics``; the data lie on a fixed day in the past
(2025-01-06) so the blocks are older than any head block and Prometheus loads them, and
the tests query absolute windows. Prometheus listens on loopback only.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tools.demo.prometheus import running_prometheus as _running_prometheus
from tools.demo.prometheus import scrape_config  # noqa: F401  (re-exported for the tests)

#: 2025-01-06T00:00:00Z: start of the data
T0 = 1736121600
#: the routing change: locality goes on for shop/cart and shop/pay
CHANGE = T0 + 3600
#: shop/pay's locality is withdrawn here
WITHDRAWN = T0 + 5400
#: cart's cross-zone request counter restarts from zero at this scrape
RESET = T0 + 5415
#: end of the data
END = T0 + 7200
SCRAPE = 15

Rate = Callable[[int], float]  # bytes/s of the scrape interval that ends at t


def _step(before: float, after: float, at: int = CHANGE) -> Rate:
    return lambda t: before if t <= at else after


def _pay_cross(t: int) -> float:
    if t <= CHANGE:
        return 1_000_000
    return 100_000 if t <= WITHDRAWN else 1_000_000


_B = 'namespace="shop",service="{svc}",port="8080",client_zone="{cz}",server_zone="{sz}",' \
     'crossing="{cr}",direction="{d}",instance="{inst}"'

#: (labels, rate, counter value at T0, reset instant or None)
BYTES_SERIES: list[tuple[str, Rate, int, int | None]] = [
    (_B.format(svc="cart", cz="a", sz="a", cr="same_zone", d="request", inst="node-a"),
     _step(1_000_000, 1_000_000), 7_000_000_000, None),
    (_B.format(svc="cart", cz="a", sz="b", cr="cross_zone", d="request", inst="node-b"),
     _step(2_000_000, 200_000), 9_000_000_000, RESET),
    (_B.format(svc="cart", cz="a", sz="b", cr="cross_zone", d="response", inst="node-b"),
     _step(1_000_000, 100_000), 3_000_000_000, None),
    (_B.format(svc="search", cz="b", sz="b", cr="same_zone", d="request", inst="node-b"),
     _step(500_000, 1_200_000), 1_000_000_000, None),
    (_B.format(svc="search", cz="b", sz="c", cr="cross_zone", d="request", inst="node-c"),
     _step(500_000, 800_000), 2_000_000_000, None),
    (_B.format(svc="pay", cz="a", sz="a", cr="same_zone", d="request", inst="node-a"),
     _step(1_000_000, 1_000_000), 4_000_000_000, None),
    (_B.format(svc="pay", cz="a", sz="c", cr="cross_zone", d="request", inst="node-c"),
     _pay_cross, 6_000_000_000, None),
]
HINT_SERIES: list[tuple[str, Rate, int, int | None]] = [
    ('namespace="shop",service="cart",client_zone="a",server_zone="b",instance="node-b"',
     _step(0, 100_000), 500_000_000, None),
]
GaugeFn = Callable[[int], float]
IN_EFFECT_SERIES: list[tuple[str, GaugeFn]] = [
    # cart: zone a hinted all along, zone b only from the change: in effect only after it
    ('namespace="shop",service="cart",client_zone="a",instance="node-b"', lambda t: 1),
    ('namespace="shop",service="cart",client_zone="b",instance="node-b"',
     lambda t: 1 if t >= CHANGE else 0),
    ('namespace="shop",service="search",client_zone="b",instance="node-c"', lambda t: 0),
    ('namespace="shop",service="pay",client_zone="a",instance="node-c"',
     lambda t: 1 if CHANGE <= t < WITHDRAWN else 0),
]
LAST_CHANGE_SERIES: list[tuple[str, GaugeFn]] = [
    ('namespace="shop",service="cart",instance="node-b"',
     lambda t: CHANGE if t >= CHANGE else T0 - 86400),
    ('namespace="shop",service="search",instance="node-c"', lambda t: T0 - 86400),
    ('namespace="shop",service="pay",instance="node-c"',
     lambda t: WITHDRAWN if t >= WITHDRAWN else CHANGE if t >= CHANGE else T0 - 86400),
]


def _times() -> range:
    return range(T0, END + 1, SCRAPE)


def _counter_lines(name: str, series: list[tuple[str, Rate, int, int | None]]) -> list[str]:
    lines = [f"# TYPE {name} counter"]
    for labels, rate, start, reset in series:
        value = start
        for t in _times():
            if t > T0:
                inc = int(rate(t) * SCRAPE)
                value = inc if t == reset else value + inc
            lines.append(f"{name}_total{{{labels}}} {value} {t}")
    return lines


def _gauge_lines(name: str, series: list[tuple[str, GaugeFn]]) -> list[str]:
    lines = [f"# TYPE {name} gauge"]
    for labels, fn in series:
        lines += [f"{name}{{{labels}}} {fn(t)} {t}" for t in _times()]
    return lines


def openmetrics_input() -> str:
    """The whole OpenMetrics text the TSDB is built from."""
    lines = (_counter_lines("zonemeter_service_bytes", BYTES_SERIES)
             + _counter_lines("zonemeter_service_hint_ignored_bytes", HINT_SERIES)
             + _gauge_lines("zonemeter_service_locality_in_effect", IN_EFFECT_SERIES)
             + _gauge_lines("zonemeter_service_locality_last_change_timestamp_seconds",
                            LAST_CHANGE_SERIES)
             + ["# EOF"])
    return "\n".join(lines) + "\n"


def _need(binary: str) -> str:
    path = shutil.which(binary) or (f"/usr/bin/{binary}" if os.path.exists(f"/usr/bin/{binary}")
                                    else None)
    if path is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"{binary} is not installed (tools/setup.sh installs it)")
        pytest.skip(f"{binary} is not installed (Debian package prometheus)")
    return path


@contextlib.contextmanager
def running_prometheus(root: Path, config_text: str = "global:\n  scrape_interval: 1h\n"
                       "scrape_configs: []\n", *, openmetrics: str | None = None
                       ) -> Iterator[str]:
    """:func:`tools.demo.prometheus.running_prometheus`, skipping (failing in CI) when
    prometheus or promtool is not installed."""
    prometheus = _need("prometheus")
    if openmetrics is not None:
        _need("promtool")
    with _running_prometheus(root, config_text, openmetrics=openmetrics,
                             binary=prometheus) as url:
        yield url


@pytest.fixture(scope="session")
def prometheus_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of a Prometheus on 127.0.0.1 serving :func:`openmetrics_input`."""
    with running_prometheus(tmp_path_factory.mktemp("prom"),
                            openmetrics=openmetrics_input()) as url:
        yield url


#: many-Services data set (:func:`many_services_input`): start of the data, 2025-01-08T00:00Z
MANY_T0 = T0 + 2 * 86400
#: ... its length, seconds, and the window each test uses around each change (``--window``)
MANY_SPAN = 4200
MANY_WINDOW = 600
#: the one-Service data set lies a day after the many-Services one (its series are stale then)
ONE_T0 = MANY_T0 + 86400


def many_change_time(t0: int, i: int) -> int:
    """Service ``i``'s locality change: on the scrape grid, 15 s apart, so Service ``i``'s
    after window is Service ``i + 40``'s before window (shared windows) and the rest differ."""
    return t0 + MANY_WINDOW + SCRAPE * i


def many_services_input(n: int, t0: int, namespace: str, span: int = MANY_SPAN
                        ) -> dict[str, list[str]]:
    """OpenMetrics sample lines for ``n`` Services ``svc-000...`` in ``namespace``, 15 s
    scrapes over ``[t0, t0 + span]``, by metric family (each series contiguous).

    Service ``i`` sends ``1000 * (i + 1)`` same-zone bytes/s throughout, and 2000 cross-zone
    request bytes/s (zone a -> b) until :func:`many_change_time`, 500 after it; its locality
    is in effect (1) from the change on, 0 before; its last-change gauge is the change time
    from then on (a day earlier before it).
    """
    out: dict[str, list[str]] = {"zonemeter_service_bytes": [],
                                 "zonemeter_service_locality_in_effect": [],
                                 "zonemeter_service_locality_last_change_timestamp_seconds": []}
    times = range(t0, t0 + span + 1, SCRAPE)
    for i in range(n):
        svc = f"svc-{i:03d}"
        c = many_change_time(t0, i)
        base = (f'namespace="{namespace}",service="{svc}",port="80",client_zone="a",'
                f'instance="node-a"')
        for zone, crossing, rate in (("a", "same_zone", lambda t: 1000 * (i + 1)),
                                     ("b", "cross_zone", lambda t: 2000 if t <= c else 500)):
            value = 0
            for t in times:
                value += rate(t) * SCRAPE if t > t0 else 0
                out["zonemeter_service_bytes"].append(
                    f'zonemeter_service_bytes_total{{{base},server_zone="{zone}",'
                    f'crossing="{crossing}",direction="request"}} {value} {t}')
        out["zonemeter_service_locality_in_effect"] += [
            f"zonemeter_service_locality_in_effect{{{base}}} {1 if t >= c else 0} {t}"
            for t in times]
        out["zonemeter_service_locality_last_change_timestamp_seconds"] += [
            f'zonemeter_service_locality_last_change_timestamp_seconds{{namespace="{namespace}",'
            f'service="{svc}",instance="node-a"}} {c if t >= c else c - 86400} {t}'
            for t in times]
    return out


def scale_input(many: int, span: int = MANY_SPAN) -> str:
    """OpenMetrics text of two data sets: ``many`` Services in namespace ``many`` from
    :data:`MANY_T0`, and one Service in namespace ``one`` from :data:`ONE_T0`, each
    ``span`` seconds long (every change must leave a full window after it:
    ``span >= 2 * MANY_WINDOW + 15 * (many - 1)``)."""
    a = many_services_input(many, MANY_T0, "many", span)
    b = many_services_input(1, ONE_T0, "one", span)
    lines = []
    for family, kind in (("zonemeter_service_bytes", "counter"),
                         ("zonemeter_service_locality_in_effect", "gauge"),
                         ("zonemeter_service_locality_last_change_timestamp_seconds", "gauge")):
        lines += [f"# TYPE {family} {kind}", *a[family], *b[family]]
    return "\n".join(lines + ["# EOF"]) + "\n"
