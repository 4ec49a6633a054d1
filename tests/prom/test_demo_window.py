"""The demo's aligned Prometheus check (:func:`tools.demo.prometheus.service_increase_aligned`)
against a real Prometheus serving a TSDB built from known samples.

The demo settles every agent's export, then takes the window's start ``S`` and starts the
traffic. Two shapes seen under load are built here: a target whose first scrape after
``S`` already carries traffic bytes (its agent exported before Prometheus came round), and
a target whose first scrape after ``S`` failed (``up`` 0, no sample of its metrics). The
aligned sum must equal the bytes sent after ``S`` exactly in both.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.promdata import running_prometheus
from tools.demo import prometheus as prom

#: 2025-01-20T00:00:00Z plus 100 s: the window's start (a day no other data set uses)
S = 1737331200 + 100
STEP = 0.5
#: (instance, Service, counter value before the traffic, bytes per scrape after it,
#:  offsets from S of failed scrapes)
TARGETS = [("127.0.0.1:9101", "checkout", 1_000, 500, ()),
           ("127.0.0.1:9102", "ledger", 2_000, 300, (0.2,))]
TRAFFIC = (0.1, 4.0)  # offsets from S: the traffic's first and last byte
END = S + 8


def _openmetrics() -> str:
    up = ["# TYPE up gauge"]
    counter = ["# TYPE zonemeter_service_bytes counter"]
    for inst, svc, before, per, failed in TARGETS:
        labels = (f'namespace="shop",service="{svc}",crossing="cross_zone",'
                  f'instance="{inst}",job="zonemeter"')
        value = before
        k = 0
        while (off := -10 + 0.2 + k * STEP) <= END - S:
            k += 1
            if TRAFFIC[0] < off <= TRAFFIC[1] + STEP:
                value += per
            t = f"{S + off:.3f}"
            ok = not any(abs(off - f) < 1e-9 for f in failed)
            up.append(f'up{{instance="{inst}",job="zonemeter"}} {int(ok)} {t}')
            if ok:
                counter.append(f"zonemeter_service_bytes_total{{{labels}}} {value} {t}")
    return "\n".join(up + counter + ["# EOF"]) + "\n"


def _truth() -> dict[str, float]:
    out = {}
    for _inst, svc, _before, per, _failed in TARGETS:
        n = sum(1 for k in range(200) if TRAFFIC[0] < -10 + 0.2 + k * STEP <= TRAFFIC[1] + STEP)
        out[f"shop/{svc}"] = float(per * n)
    return out


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> object:
    with running_prometheus(Path(tmp_path_factory.mktemp("promwin")),
                            openmetrics=_openmetrics()) as u:
        yield u


def test_aligned_sum_counts_bytes_exported_before_the_first_scrape_and_past_a_failed_one(
        url: str) -> None:
    got, promql, start = prom.service_increase_aligned(
        url, "zonemeter_service_bytes_total", 'crossing="cross_zone"',
        [t[0] for t in TARGETS], S, END)
    assert got == _truth(), promql
    # each range starts on the target's last successful scrape at or before S
    assert start == pytest.approx(S - 0.3)


def test_a_target_without_a_successful_scrape_before_the_window_is_an_error(url: str) -> None:
    with pytest.raises(prom.RuntimeFailure, match="127.0.0.1:9101"):
        prom.service_increase_aligned(url, "zonemeter_service_bytes_total", "",
                                      ["127.0.0.1:9101"], S, END, lookback=0.1)
