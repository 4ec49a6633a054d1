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
