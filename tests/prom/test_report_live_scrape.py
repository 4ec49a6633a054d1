"""``zonemeter report`` on data Prometheus scraped live (head block, ``job``/``instance``
labels added by the scrape) from an exporter of the metric contract, through a change.

The exporter is not the zonemeter agent: it is a fixed-increment source, so the expected
numbers follow from its increments and the scrape timestamps Prometheus stored. The live case
with the lab's agents through a change of ``trafficDistribution`` follows the same shape:
see ``docs/report.md`` ("Live lab test").
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from agent.cli import main
from agent.report.prom import PromClient
from tests.fixtures.promdata import running_prometheus, scrape_config

SAME = 1_000_000          # same-zone bytes added per scrape, both phases
CROSS_BEFORE = 3_000_000  # cross-zone bytes added per scrape before the change
CROSS_AFTER = 250_000     # ... and after it
SWITCH_AFTER = 6          # scrapes in the before phase
LABELS = ["namespace", "service", "port", "client_zone", "server_zone", "crossing", "direction"]


class PhasedExporter:
    """shop/cart as one agent would export it; every scrape adds fixed byte counts, and after
    :data:`SWITCH_AFTER` scrapes cross-zone bytes drop and locality goes on in both zones."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.scrapes = 0
        self.same = 0
        self.cross = 0

    def collect(self) -> Iterator[Metric]:
        with self.lock:
            self.scrapes += 1
            after = self.scrapes > SWITCH_AFTER
            self.same += SAME
            self.cross += CROSS_AFTER if after else CROSS_BEFORE
            same, cross = self.same, self.cross
        b = CounterMetricFamily("zonemeter_service_bytes", "bytes", labels=LABELS)
        b.add_metric(["shop", "cart", "8080", "a", "a", "same_zone", "request"], same)
        b.add_metric(["shop", "cart", "8080", "a", "b", "cross_zone", "request"], cross)
        yield b
        g = GaugeMetricFamily("zonemeter_service_locality_in_effect", "0/1",
                              labels=["namespace", "service", "client_zone"])
        for zone in ("a", "b"):
            g.add_metric(["shop", "cart", zone], 1 if after else 0)
        yield g


@pytest.fixture
def exporter_target() -> Iterator[str]:
    registry = CollectorRegistry()
    registry.register(PhasedExporter())  # type: ignore[arg-type]
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    yield f"127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def test_live_scrape_through_a_change(exporter_target: str, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    with running_prometheus(tmp_path, scrape_config([exporter_target], 1)) as url:
        client = PromClient(url)
        sel = 'zonemeter_service_bytes_total{crossing="cross_zone"}'
        deadline = time.monotonic() + 60
        while True:  # wait for 2 x SWITCH_AFTER scrapes
            series = client.raw_samples(sel, 120, time.time())
            points = series[0].points if series else []
            if len(points) >= 2 * SWITCH_AFTER:
                break
            assert time.monotonic() < deadline, "Prometheus did not scrape the exporter"
            time.sleep(0.5)
        values = [v for _, v in points]
        times = [t for t, _ in points]
        # index of the last before-phase sample: the next delta is the first after-phase one
        k = next(i for i in range(1, len(values)) if values[i] - values[i - 1] == CROSS_AFTER) - 1
        m = min(k, len(values) - 1 - k)  # scrape intervals on each side
        assert m >= 4
        b0, change, a1 = times[k - m], times[k], times[k + m]
        code = main(["report", "--prometheus", url, "-o", "json",
                     "--before", f"{b0}..{change}", "--after", f"{change}..{a1}"])
        out, err = capsys.readouterr()
    assert code == 0, err
    (cart,) = json.loads(out)["services"]
    # windows sit exactly on stored samples, so increase() is the sum of m increments
    db, da = change - b0, a1 - change
    before, after = cart["before"], cart["after"]
    assert before["bytes_per_second"] == pytest.approx(m * (SAME + CROSS_BEFORE) / db, rel=1e-9)
    assert before["cross_zone_bytes_per_second"] == pytest.approx(m * CROSS_BEFORE / db, rel=1e-9)
    assert before["cross_zone_fraction"] == pytest.approx(0.75, rel=1e-9)
    assert after["bytes_per_second"] == pytest.approx(m * (SAME + CROSS_AFTER) / da, rel=1e-9)
    assert after["cross_zone_fraction"] == pytest.approx(0.2, rel=1e-9)
    assert cart["normalized_cross_zone_bytes_per_second_saved"] == pytest.approx(
        0.75 * m * (SAME + CROSS_AFTER) / da - m * CROSS_AFTER / da, rel=1e-9)
    assert before["locality_in_effect_share"] == 0
    # the first after instant sees the last before-phase scrape (state lags by <= 1 scrape)
    n = int(-(-da // 1))  # 1 s steps
    assert (n - 2) / n <= after["locality_in_effect_share"] <= (n - 1) / n


ALB = 2_000_000  # cross-zone bytes per scrape from an ALB (client class), both phases
CLASS_LABELS = [*LABELS, "client_kind", "lb_type"]


class ClassedExporter(PhasedExporter):
    """shop/cart as an agent with client classes exports it: the pods' bytes as in
    :class:`PhasedExporter`, and an ALB's steady cross-zone bytes (its hop to targets, which
    AWS does not bill)."""

    def collect(self) -> Iterator[Metric]:
        with self.lock:
            self.scrapes += 1
            after = self.scrapes > SWITCH_AFTER
            self.same += SAME
            self.cross += CROSS_AFTER if after else CROSS_BEFORE
            same, cross, alb = self.same, self.cross, ALB * self.scrapes
        b = CounterMetricFamily("zonemeter_service_bytes", "bytes", labels=CLASS_LABELS)
        b.add_metric(["shop", "cart", "8080", "a", "a", "same_zone", "request", "pod", "none"], same)
        b.add_metric(["shop", "cart", "8080", "a", "b", "cross_zone", "request", "pod", "none"], cross)
        b.add_metric(["shop", "cart", "8080", "a", "b", "cross_zone", "request", "load-balancer",
                      "aws-alb"], alb)
        yield b


def test_live_scrape_prices_only_the_billed_classes(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    registry = CollectorRegistry()
    registry.register(ClassedExporter())  # type: ignore[arg-type]
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        with running_prometheus(tmp_path, scrape_config([f"127.0.0.1:{server.server_port}"], 1)) as url:
            client = PromClient(url)
            sel = 'zonemeter_service_bytes_total{crossing="cross_zone",client_kind="pod"}'
            deadline = time.monotonic() + 60
            while True:
                series = client.raw_samples(sel, 120, time.time())
                points = series[0].points if series else []
                if len(points) >= 2 * SWITCH_AFTER:
                    break
                assert time.monotonic() < deadline, "Prometheus did not scrape the exporter"
                time.sleep(0.5)
            values = [v for _, v in points]
            times = [t for t, _ in points]
            k = next(i for i in range(1, len(values)) if values[i] - values[i - 1] == CROSS_AFTER) - 1
            m = min(k, len(values) - 1 - k)
            assert m >= 4
            b0, change, a1 = times[k - m], times[k], times[k + m]
            code = main(["report", "--prometheus", url, "-o", "json", "--price", "aws",
                         "--before", f"{b0}..{change}", "--after", f"{change}..{a1}"])
            out, err = capsys.readouterr()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
    assert code == 0, err
    doc = json.loads(out)
    (cart,) = doc["services"]
    db, da = change - b0, a1 - change
    tb, ta = SAME + CROSS_BEFORE + ALB, SAME + CROSS_AFTER + ALB
    # every cross-zone byte in the bytes arithmetic, the pods' only in the billed one
    assert cart["normalized_cross_zone_bytes_per_second_saved"] == pytest.approx(
        (CROSS_BEFORE + ALB) / tb * m * ta / da - m * (CROSS_AFTER + ALB) / da, rel=1e-9)
    assert cart["billed_normalized_cross_zone_bytes_per_second_saved"] == pytest.approx(
        CROSS_BEFORE / tb * m * ta / da - m * CROSS_AFTER / da, rel=1e-9)
    assert {(c["client_kind"], c["lb_type"]): c["bytes_per_second"]
            for c in cart["after"]["cross_zone_by_class"]} == {
        ("pod", ""): pytest.approx(m * CROSS_AFTER / da, rel=1e-9),
        ("load-balancer", "aws-alb"): pytest.approx(m * ALB / da, rel=1e-9)}
    classes = {(c["client_kind"], c["lb_type"]): c for c in doc["classes"]}
    alb, pod = classes[("load-balancer", "aws-alb")], classes[("pod", "")]
    assert alb["billed"] is False and alb["usd_per_month_after"] == 0.0
    assert alb["before_cross_zone_bytes_per_second"] == pytest.approx(m * ALB / db, rel=1e-9)
    assert alb["after_cross_zone_bytes_per_second"] == pytest.approx(m * ALB / da, rel=1e-9)
    assert pod["billed"] is True and pod["usd_per_month_after"] == pytest.approx(
        m * CROSS_AFTER / da * 2_629_746 / 1e9 * 0.02, rel=1e-9)
