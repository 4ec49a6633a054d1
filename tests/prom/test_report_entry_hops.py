"""``zonemeter report`` prices both hops of a node port (docs/report.md): the endpoint's
(``zonemeter_service_bytes_total``) and the first hop counted on the receiving node's uplink
(``zonemeter_service_entry_bytes_total``), each by its client's class, against a real
Prometheus serving hand-made data.

shop/edge, one agent (``node-b``), constant rates over two hours (before: the first, after:
the second): the endpoint's hop from node a (class node) 1,000 B/s cross-zone; the first hop
of an NLB into node-b with the very same labels (another family) 500 B/s, billed; the first
hop of an ALB 2,000 B/s cross-zone, not billed on AWS; 4,000 B/s same-zone. A selector of
both names (``__name__=~``) would refuse the first two ("vector cannot contain metrics with
the same labelset"); the report keeps them apart by a hop label until it sums them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from agent.cli import main
from agent.report.timespec import format_time
from tests.fixtures.promdata import ONE_T0, SCRAPE, running_prometheus

#: a day after the scale data set: no other series of the shared fixtures are near
T0 = ONE_T0 + 2 * 86400
HOUR = 3600
MONTH = 2_629_746
_L = ('namespace="shop",service="edge",port="80",client_zone="{cz}",server_zone="b",crossing="{cr}",'
      'direction="request",client_kind="{kind}",lb_type="{lb}",instance="node-b"')
SERIES = {
    "zonemeter_service_bytes": [(_L.format(cz="a", cr="cross_zone", kind="node", lb="none"), 1000),
                                (_L.format(cz="b", cr="same_zone", kind="pod", lb="none"), 4000)],
    "zonemeter_service_entry_bytes": [(_L.format(cz="a", cr="cross_zone", kind="node", lb="none"), 500),
                                      (_L.format(cz="c", cr="cross_zone", kind="load-balancer", lb="aws-alb"),
                                       2000)],
}


def _input() -> str:
    lines = []
    for family, series in SERIES.items():
        lines.append(f"# TYPE {family} counter")
        for labels, rate in series:
            lines += [f"{family}_total{{{labels}}} {rate * (t - T0)} {t}"
                      for t in range(T0, T0 + 2 * HOUR + 1, SCRAPE)]
    return "\n".join([*lines, "# EOF"]) + "\n"


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_prometheus(tmp_path_factory.mktemp("prom-entry"), openmetrics=_input()) as u:
        yield u


def test_both_hops_are_priced_by_their_own_class(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["report", "--prometheus", url, "-o", "json", "--now", str(T0 + 2 * HOUR + 60),
                 "--before", f"{format_time(T0)}..{format_time(T0 + HOUR)}",
                 "--after", f"{format_time(T0 + HOUR)}..{format_time(T0 + 2 * HOUR)}"])
    out, err = capsys.readouterr()
    assert code == 0, err
    doc = json.loads(out)
    (edge,) = doc["services"]
    for side in ("before", "after"):
        w = edge[side]
        assert w["bytes_per_second"] == pytest.approx(7500)
        assert w["cross_zone_bytes_per_second"] == pytest.approx(3500)
        assert sorted((c["client_kind"], c["lb_type"], round(c["bytes_per_second"]))
                      for c in w["cross_zone_by_class"]) == [("load-balancer", "aws-alb", 2000), ("node", "", 1500)]
    classes = {(c["client_kind"], c["lb_type"]): c for c in doc["classes"] if c["scope"] == "services"}
    node, alb = classes[("node", "")], classes[("load-balancer", "aws-alb")]
    assert node["billed"] and node["usd_per_month_before"] == pytest.approx(1500 * MONTH / 1e9 * 0.02)
    assert not alb["billed"] and alb["usd_per_month_before"] == 0
