"""Ground truth -> per-Service expectations (DemoCluster.truth), from synthetic counters.

Nothing is built: the lab's snapshot and the hint model need no root."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tests.fixtures.lab_hints import lab_hints
from tools.demo.cluster import DemoCluster
from tools.demo.topology import load_demo


@pytest.fixture()
def cluster(tmp_path: Path) -> DemoCluster:
    c = DemoCluster(load_demo(), tmp_path, hints=lab_hints("model"), prefix="zmunit", state_dir=tmp_path / "state")
    c.write_snapshot()
    return c


def test_crossings(cluster: DemoCluster) -> None:
    gt = {("frontend-a1", "catalog-a1", "request"): 10,   # same node
          ("frontend-a1", "catalog-a2", "response"): 20,  # same zone
          ("frontend-a1", "catalog-c1", "request"): 40,   # cross zone
          ("node/b1", "catalog-b2", "request"): 80,       # host-network client on b1
          ("ip/10.9.9.9", "catalog-b2", "request"): 160}  # nobody the lab knows
    t = cluster.truth(gt)["shop/catalog"]
    assert t.bytes == {"same_node": 10, "same_zone": 20 + 80, "cross_zone": 40,
                       "cross_region": 0, "external": 0, "unknown": 160}
    assert t.by_series[("zone-a", "zone-c", "cross_zone", "request")] == 40
    assert t.by_series[("unknown", "zone-b", "unknown", "request")] == 160
    assert t.hint_ignored_bytes == 0  # catalog: no topology filtering anywhere


def test_hint_ignored_only_outside_the_selection_of_a_filtering_node(cluster: DemoCluster) -> None:
    gt = {("frontend-c2", "checkout-a1", "request"): 100,      # c2 -> other zone: ignored
          ("frontend-c2", "checkout-a1", "response"): 1000,
          ("frontend-c2", "checkout-c1", "request"): 7,        # inside c2's selection
          ("frontend-c2", "node-cache-c1", "request"): 50,     # PreferSameNode: c1 != c2
          ("frontend-a1", "checkout-b1", "request"): 9,        # a1 outside its selection too
          ("frontend-c2", "cart-1", "request"): 3}             # Auto refused: no filtering
    truth = cluster.truth(gt)
    assert truth["shop/checkout"].hint_ignored == {("zone-c", "zone-a"): 1100,
                                                   ("zone-a", "zone-b"): 9}
    assert truth["shop/checkout"].cross_zone_bytes == 1109
    assert truth["shop/node-cache"].hint_ignored == {("zone-c", "zone-c"): 50}
    assert truth["shop/node-cache"].bytes["same_zone"] == 50
    assert truth["shop/cart"].hint_ignored_bytes == 0


def test_replaced_pod_stands_for_its_successor(cluster: DemoCluster) -> None:
    # checkout-b1 was replaced by checkout-b1-new (which the final model selects on b2);
    # bytes b2 sent to the old pod were inside b2's selection at the time
    cluster.pod_node["checkout-b1-new"] = "b1"
    cluster.pod_service["checkout-b1-new"] = "shop/checkout"
    cluster.replaced_by["checkout-b1"] = "checkout-b1-new"
    sel = dict(cluster.models["shop/checkout"].selection)
    sel["b2"] = ("checkout-b1-new", "checkout-b2")
    cluster.models["shop/checkout"] = replace(cluster.models["shop/checkout"], selection=sel)
    gt = {("frontend-b2", "checkout-b1", "request"): 5,
          ("frontend-b2", "checkout-b1-new", "request"): 6}
    t = cluster.truth(gt)["shop/checkout"]
    assert t.hint_ignored_bytes == 0 and t.bytes["same_zone"] == 11
    del cluster.replaced_by["checkout-b1"]
    assert cluster.truth(gt)["shop/checkout"].hint_ignored_bytes == 5


def test_bytes_to_a_pod_of_no_service_go_to_the_empty_key(cluster: DemoCluster) -> None:
    truth = cluster.truth({("frontend-a1", "frontend-b1", "request"): 4})
    assert truth[""].bytes["cross_zone"] == 4


def test_flow_specs_follow_the_plan(cluster: DemoCluster) -> None:
    specs = cluster.flow_specs(2.5)
    assert len(specs) == 6 * 5
    assert {s.count for s in specs} == {10} and {s.rate for s in specs} == {4.0}
    assert {(s.request_bytes, s.response_bytes, s.port, s.proto) for s in specs} == {
        (400, 4000, 80, "tcp")}
    back_to_back = cluster.flow_specs(0, count=30)
    assert {(s.count, s.rate) for s in back_to_back} == {(30, None)}
    cip = str(cluster.lab.cluster_ip("shop/checkout"))
    assert sum(1 for s in specs if s.dst == cip) == 6
