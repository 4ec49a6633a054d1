"""``zonemeter report`` live (docs/report.md): Prometheus scrapes the lab's real agents through a change of
``trafficDistribution``, and ``zonemeter report`` proves the saving against the lab's own
counters.

A three-zone lab (one node per zone, a ``web`` client and an ``api`` endpoint on each node),
``app/api`` without locality at first. Three real agents (``--interval 0.5``, snapshot
reload), Debian's Prometheus scraping them every 0.5 s on loopback; every span below is
sized in those intervals (the bounds hold at any interval the machine keeps up with).
Steady traffic (every client calls ``app/api`` at a fixed rate, one TCP connection per
request) runs throughout:

    lead | before window [a, b] | gap | flip at T | gap | after window [c, d] | tail

The flip is :meth:`DemoCluster.set_locality` (``trafficDistribution: PreferSameZone``):
proxies narrow to the own-zone endpoint at ``T - SETTLE``, the snapshot is replaced at ``T``,
agents reload it within a poll. The lab's ground truth (nftables in each server pod) is read at
``a, b, c, d`` and the report is run on exactly those windows.

Tolerances and why:

* **before/after rates vs ground truth, 8 %**: an agent's counter moves once per export
  (0.5 s), so the bytes between a target's first and last sample in a window cover the sampled
  span +/- one export interval; ``increase()`` scales that to the window, so the rate is off by
  at most ``interval / (window - 2 scrapes)`` = 0.5/9 = 5.6 % at 10 s windows; the rest is the
  random DNAT choice in the edge seconds (binomial, ~1 % at this rate). In practice exports
  and scrapes both keep a fixed phase, so the spans match and runs agree within ~0.5 %.
  Prometheus must have scraped every agent before the before window opens: a first sample
  more than 1.1 intervals after a window's start is extrapolated by half an interval only
  (``extrapolatedRate``), which read 3-4 % low before the wait was added.
* **after-window cross-zone = 0 exactly**: the gaps (``GAP`` = 3 s on each side of ``T``)
  are wider than narrowing-to-``T`` (1.5 s) + one export + one scrape (0.5 s each), so every cross-zone byte
  is exported and scraped before ``c``; the counters are flat in ``[c, d]`` and ``increase``
  of a flat counter is 0 (no extrapolation of 0).
* **locality share: before 0, after 1 exactly**: no series says "in effect" before the flip;
  after it every agent reloads within 0.25 s + one export, scraped within 0.5 s, all before ``c``.
* **last change within [T, T + 3 intervals]** (1.5 s): the agent stamps the export in which it
  saw the new snapshot: poll 0.25 s plus up to one interval.
* **significant**: the report cuts each 10 s window into 2 s sub-windows (4 scrapes each), 5 of
  them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.cli import main
from tests.fixtures.lab_hints import lab_hints
from tools.demo import prometheus as prom
from tools.demo.agents import AgentFleet
from tools.demo.cluster import DemoCluster, ServiceTruth
from tools.demo.topology import THREE_ZONE_API_TOPOLOGY, parse_demo

pytestmark = pytest.mark.e2e

SERVICE = "app/api"
INTERVAL = 0.5     # agents' export interval and Prometheus's scrape interval (s)
LEAD = 2.0         # traffic before the before window: every series exists at its start
WINDOW = 10.0
GAP = 3.0          # between a window edge and the flip instant T
SETTLE = 1.5       # set_locality: narrowing -> snapshot -> final programming
TAIL = 2.0         # traffic after the after window
RATE_TOLERANCE = 0.08
AWS_USD_PER_GB = 0.02
MONTH_SECONDS = 2_629_746  # 30.44 days, as the recording rules


@pytest.fixture()
def lab(tmp_path: Path) -> Iterator[DemoCluster]:
    cluster = DemoCluster(parse_demo(THREE_ZONE_API_TOPOLOGY), tmp_path, hints=lab_hints("oracle"),
                          state_dir=tmp_path / "state",
                          server_max_seconds=600)
    cluster.up()
    try:
        yield cluster
    finally:
        cluster.down()


def _sleep_until(t: float) -> None:
    time.sleep(max(0.0, t - time.time()))


def _edge(cluster: DemoCluster) -> tuple[float, ServiceTruth]:
    """Ground truth of app/api now; the instant is the middle of the nft reads."""
    t0 = time.time()
    truth = cluster.truth()[SERVICE]
    return (t0 + time.time()) / 2, truth


def _wait_for_scrapes(url: str, targets: list[str], timeout: float = 30.0) -> None:
    """Wait until Prometheus stored two scrapes of every target (its first scrape comes
    up to ~5 s after start: discovery updates are batched), so the windows are covered from
    their first second and ``increase()`` extrapolates no more than the edge gaps."""
    deadline = time.monotonic() + timeout
    while True:
        now = time.time()
        if all(len(prom.scrape_times(url, t, now - 10, now)) >= 2 for t in targets):
            return
        assert time.monotonic() < deadline, "Prometheus did not scrape the agents"
        time.sleep(0.3)


def _wait_for_scrape_after(url: str, targets: list[str], t: float, timeout: float = 10.0) -> None:
    """Wait until Prometheus stored a scrape of every target at or after ``t``, so the
    samples at or before ``t`` that ``increase()`` over a window ending at ``t`` reads are
    all in (a scrape is stored once it completes)."""
    deadline = time.monotonic() + timeout
    while True:
        now = time.time()
        if all(prom.scrape_times(url, target, t, now) for target in targets):
            return
        assert time.monotonic() < deadline, f"Prometheus stored no scrape after {t:.3f}"
        time.sleep(0.2)


def _gt(first: ServiceTruth, last: ServiceTruth) -> tuple[int, int]:
    """(all bytes, cross-zone bytes) the lab counted between two readings."""
    return (sum(last.bytes.values()) - sum(first.bytes.values()),
            last.cross_zone_bytes - first.cross_zone_bytes)


def test_report_through_a_live_flip(lab: DemoCluster, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert lab.models[SERVICE].mode == "none"
    fleet = AgentFleet(lab.lab, lab.snapshot_path, tmp_path / "logs", INTERVAL)
    fleet.start()
    (tmp_path / "prom").mkdir()
    try:
        with prom.running_prometheus(tmp_path / "prom",
                                     prom.scrape_config(fleet.targets(), INTERVAL)) as url:
            _wait_for_scrapes(url, fleet.targets())
            total = LEAD + 2 * WINDOW + 2 * GAP + TAIL
            handles = lab.start_traffic(total)
            try:
                time.sleep(LEAD)
                a, ga = _edge(lab)
                _sleep_until(a + WINDOW)
                b, gb = _edge(lab)
                _sleep_until(b + GAP - SETTLE)
                change = lab.set_locality(SERVICE, traffic_distribution="PreferSameZone",
                                          settle_seconds=SETTLE)
                assert change.changed_at is not None and change.narrowed_at is not None
                flip = change.changed_at
                _sleep_until(flip + GAP)
                c, gc = _edge(lab)
                _sleep_until(c + WINDOW)
                d, gd = _edge(lab)
                results = [h.wait() for h in handles]
            finally:
                for h in handles:
                    h.stop()
            _wait_for_scrape_after(url, fleet.targets(), d)
            code = main(["report", "--prometheus", url, "-o", "json",
                         "--before", f"{a:.3f}..{b:.3f}", "--after", f"{c:.3f}..{d:.3f}"])
            out, err = capsys.readouterr()
            last_change = [prom.query(url, 'max(zonemeter_service_locality_last_change_'
                                           'timestamp_seconds{namespace="app",service="api"})',
                                      at=t) for t in (b, d)]
            in_effect = prom.locality(url, d)
    finally:
        codes = fleet.stop()

    # the lab: every request answered; the flip cut cross-zone traffic to nothing
    assert sum(r.ok for r in results) > 0 and sum(r.failed for r in results) == 0, \
        [r.errors for r in results if r.failed]
    gt_before, gt_cross_before = _gt(ga, gb)
    gt_after, gt_cross_after = _gt(gc, gd)
    assert 0.5 < gt_cross_before / gt_before < 0.8  # 2 of 3 endpoints in another zone
    assert gt_cross_after == 0 and gt_after > 0.8 * gt_before * (d - c) / (b - a)
    assert change.narrowed_at + SETTLE <= flip < c - GAP + 0.1 and b < change.narrowed_at

    assert code == 0, err
    doc = json.loads(out)
    (svc,) = doc["services"]
    assert (svc["namespace"], svc["name"]) == ("app", "api")
    assert doc["windows"] == {"before": [pytest.approx(a, abs=1e-3), pytest.approx(b, abs=1e-3)],
                              "after": [pytest.approx(c, abs=1e-3), pytest.approx(d, abs=1e-3)]}
    before, after = svc["before"], svc["after"]
    db, da = b - a, d - c
    print(f"lab before {gt_before / db:.0f} B/s ({gt_cross_before / db:.0f} cross), "
          f"after {gt_after / da:.0f} B/s; report before {before['bytes_per_second']:.0f} "
          f"({before['cross_zone_bytes_per_second']:.0f} cross), after "
          f"{after['bytes_per_second']:.0f}; T={flip:.3f} last change "
          f"{[float(r[0]['value'][1]) for r in last_change]}")
    assert before["cross_zone_bytes_per_second"] == pytest.approx(gt_cross_before / db,
                                                                 rel=RATE_TOLERANCE)
    assert before["bytes_per_second"] == pytest.approx(gt_before / db, rel=RATE_TOLERANCE)
    assert after["bytes_per_second"] == pytest.approx(gt_after / da, rel=RATE_TOLERANCE)
    assert after["cross_zone_bytes_per_second"] == 0
    assert after["cross_zone_fraction"] == 0
    # no data plane ever sent outside what the agents' model selected
    assert before["hint_ignored_bytes_per_second"] == 0
    assert after["hint_ignored_bytes_per_second"] == 0
    assert before["locality_in_effect_share"] == 0
    assert after["locality_in_effect_share"] == 1
    # the change, from the report's own figures
    assert svc["cross_zone_bytes_per_second_saved"] == pytest.approx(
        before["cross_zone_bytes_per_second"] - after["cross_zone_bytes_per_second"], rel=1e-9)
    normalized = before["cross_zone_fraction"] * after["bytes_per_second"]
    assert svc["normalized_cross_zone_bytes_per_second_saved"] == pytest.approx(normalized,
                                                                                rel=1e-9)
    # a real flip is far outside the noise of 10 s windows (5 sub-windows of 2 s each), so
    # it is priced
    assert svc["significant"] is True and svc["change"] == "saved"
    assert svc["normalized_cross_zone_bytes_per_second_saved_stderr"] < normalized / 2
    assert svc["usd_per_month_saved"] == pytest.approx(
        normalized * MONTH_SECONDS / 1e9 * AWS_USD_PER_GB, rel=1e-9)
    # ... and against the lab: what the after traffic would have crossed at the old fraction
    assert svc["normalized_cross_zone_bytes_per_second_saved"] == pytest.approx(
        gt_cross_before / gt_before * gt_after / da, rel=2 * RATE_TOLERANCE)
    assert doc["total"]["cross_zone_bytes_per_second_saved"] == pytest.approx(
        svc["cross_zone_bytes_per_second_saved"], rel=1e-9)
    assert not svc["warnings"], svc["warnings"]

    # the agents stamped the change when they read the new snapshot
    before_flip, after_flip = (float(r[0]["value"][1]) for r in last_change)
    assert before_flip < a
    assert flip <= after_flip <= flip + 3 * INTERVAL
    assert in_effect[SERVICE] == {"za": True, "zb": True, "zc": True}
    assert codes == {"n1": 0, "n2": 0, "n3": 0}, codes
