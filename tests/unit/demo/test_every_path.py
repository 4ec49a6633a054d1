"""The demo's flows (every path a byte takes) and what the lab's ground truth says about each,
on docs/examples/every-path.yaml, from synthetic counters (no root needed)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.errors import InputError
from tests.fixtures.lab_hints import lab_hints
from tools.demo.agents import parse_metrics
from tools.demo.cluster import DemoCluster
from tools.demo.summary import build_summary
from tools.demo.topology import load_demo, parse_demo

EXAMPLE = Path(__file__).resolve().parents[3] / "docs" / "examples" / "every-path.yaml"
DOC: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())


def _with_flows(*flows: dict[str, Any], **traffic: Any) -> str:
    doc = copy.deepcopy(DOC)
    doc["traffic"] = {**traffic, "flows": list(flows)} if flows else traffic
    return yaml.safe_dump(doc)


@pytest.fixture()
def cluster(tmp_path: Path) -> DemoCluster:
    c = DemoCluster(load_demo(EXAMPLE), tmp_path, hints=lab_hints("model"), prefix="zmunit",
                    state_dir=tmp_path / "state")
    c.write_snapshot()
    return c


def test_example_plans_every_path() -> None:
    plan = load_demo(EXAMPLE).traffic
    assert plan.services == () and plan.clients == ()  # flows only, no matrix
    by = {f.name: f for f in plan.flows}
    assert [f.path for f in plan.flows] == ["clusterIP", "endpoints", "endpoints", "nodePort", "nodePort",
                                            "node", "clusterIP", "endpoints", "outside", "node", "pod",
                                            "pod", "hostPort", "hostPort"]
    assert by["flows[0]"].families == (4, 6) and by["flows[1]"].families == (6,)
    assert (by["flows[3]"].nodes, by["flows[3]"].port, by["flows[3]"].rate) == (("c2", "b1"), 30080, 6.0)
    assert by["flows[5]"].servers == ("ingress-a1",) and by["flows[5]"].port == 443
    assert by["flows[8]"].servers == ("outside/orders-db",) and by["flows[8]"].port == 5432
    assert by["flows[12]"].servers == ("cache-a1",) and by["flows[12]"].port == 16379
    assert by["flows[13]"].servers == ("queue-c1",) and by["flows[13]"].port == 15672
    assert by["flows[7]"].port == 7000  # the headless Service's endpoints' port


@pytest.mark.parametrize("flow, field, problem", [
    ({"from": "outside/lb-a", "to": {"service": "shop/web"}}, "flows[0].to.via", "no route to ClusterIPs"),
    ({"from": "frontend-a1", "to": {"service": "shop/peers"}}, "flows[0].to.via", "headless"),
    ({"from": "outside/lb-a", "to": {"service": "shop/checkout", "via": "nodePort"}}, "flows[0].to.via",
     "no node ports"),
    ({"from": "outside/lb-a", "to": {"service": "shop/api", "via": "nodePort", "nodes": ["a1"]}},
     "flows[0].to.nodes", "externalTrafficPolicy Local drops"),
    ({"from": "frontend-a1", "to": {"node": "b1", "port": 9100}}, "flows[0].to.port",
     "no host-network pod on node b1"),
    ({"from": "outside/lb-a", "to": {"outside": "orders-db"}}, "flows[0].to.outside", "both outside"),
    ({"from": "frontend-a1", "to": {"hostPort": "batch-a1"}}, "flows[0].to.hostPort", "no TCP port with a hostPort"),
    ({"from": "frontend-a1", "to": {"hostPort": "ingress-a1"}}, "flows[0].to.hostPort", "host-network"),
    ({"from": "frontend-a1", "to": {"pod": "checkout-b1"}, "bogus": 1}, "flows[0].bogus", "unknown field"),
    ({"from": "frontend-a1", "to": {"pod": "checkout-b1", "service": "shop/web"}}, "flows[0].to", "exactly one"),
    ({"from": "outside/nobody", "to": {"pod": "batch-a1"}}, "flows[0].from", "no outside peer"),
    ({"from": {"app": "none"}, "to": {"pod": "batch-a1"}}, "flows[0].from", "selects no pod"),
    ({"from": "frontend-a1", "to": {"service": "shop/web", "via": "endpoints", "nodes": ["a1"]}},
     "flows[0].to.nodes", "only a nodePort flow"),
    ({"from": "frontend-a1", "to": {"pod": "batch-a1"}, "family": 7}, "flows[0].family", "4, 6 or both"),
])
def test_bad_flow_names_the_field(flow: dict[str, Any], field: str, problem: str) -> None:
    with pytest.raises(InputError) as info:
        parse_demo(_with_flows(flow), "every.yaml")
    err = info.value
    assert (err.source, err.obj, err.field) == ("every.yaml", "traffic", field)
    assert problem in err.problem and "\n" not in str(err)


def test_two_paths_the_ground_truth_cannot_tell_apart_are_refused() -> None:
    """frontend-b1 calling checkout by its ClusterIP (data-plane if ignored) and by its
    endpoints (client-side) reaches the same servers as the same client."""
    with pytest.raises(InputError) as info:
        parse_demo(_with_flows({"from": "frontend-b1", "to": {"service": "shop/checkout"}},
                               {"from": "frontend-b1", "to": {"service": "shop/checkout", "via": "endpoints"}}))
    assert info.value.field == "flows[1].from" and "cannot tell apart" in info.value.problem
    # the NodePort hop c2 masquerades and a host-network client on c2 are one class: allowed
    parse_demo(_with_flows({"from": "outside/lb-c", "to": {"service": "shop/web", "via": "nodePort", "nodes": ["c2"]}},
                           {"from": "outside/lb-b", "to": {"service": "shop/web", "via": "nodePort", "nodes": ["c2"]}}))


def test_a_pod_called_off_its_service_port_is_refused() -> None:
    doc = copy.deepcopy(DOC)
    doc["pods"].append({"name": "two-ports-a1", "namespace": "shop", "node": "a1", "app": "checkout",
                        "ports": [{"port": 8080, "name": "http"}, {"port": 9090, "name": "admin"}]})
    doc["pods"] = [p for p in doc["pods"] if p["name"] != "checkout-a1"]
    flows = [{"from": "frontend-a1", "to": {"pod": "two-ports-a1"}}]
    doc["traffic"] = {"flows": flows}
    # its first TCP port is checkout's: fine
    parse_demo(yaml.safe_dump(doc))
    doc["pods"][-1]["ports"] = [{"port": 9090, "name": "admin"}, {"port": 8080, "name": "http"}]
    with pytest.raises(InputError) as info:
        parse_demo(yaml.safe_dump(doc))
    assert info.value.field == "flows[0].to" and "per pod, not per port" in info.value.problem


def test_destinations_per_path_and_family(cluster: DemoCluster) -> None:
    topo = cluster.topology
    by = {f.name: f for f in cluster.traffic.flows}
    assert cluster.destinations(by["flows[1]"], 6) == (
        [str(topo.pod(p).ip6) for p in ("checkout-a1", "checkout-b1", "checkout-c1")], 8080)
    assert cluster.destinations(by["flows[3]"], 4) == ([str(topo.node("c2").ip), str(topo.node("b1").ip)], 30080)
    assert cluster.destinations(by["flows[12]"], 4) == ([str(topo.node("a1").ip)], 16379)
    assert cluster.destinations(by["flows[8]"], 4) == ([str(topo.peer("orders-db").ip)], 5432)
    specs = cluster.flow_specs(2)
    # one process per client, flow and family; a self-balancing client is one process
    assert len(specs) == 4 * 2 + 1 + 1 + 1 + 1 + 1 + 1 + 2 + 2 + 1 + 1 + 2 + 1 + 1
    lb_c = next(s for s in specs if s.client == "outside/lb-c")
    assert (lb_c.count, lb_c.rate, lb_c.port) == (12, 6.0, 30080)


def test_truth_classes_and_causes(cluster: DemoCluster) -> None:
    """Each client class and hint cause the example plays, from synthetic counters."""
    cluster.load_balancers_marked = True
    gt = {("frontend-c2", "checkout-a1", "request"): 100,   # c2's data plane: data-plane
          ("mesh-b1", "checkout-c1", "request"): 50,        # its own dial: client-side
          ("mesh-b1", "checkout-b1", "request"): 5,         # inside b1's selection
          ("node/c2", "web-b1", "request"): 30,             # the NodePort hop c2 masqueraded
          ("outside/lb-a", "web-b1", "request"): 20,        # ALB IP target: not judged
          ("ingress-a1", "web-a1", "request"): 9,           # host-network client, own zone
          ("outside/lb-b", "api-b1", "response"): 7,        # externalTrafficPolicy Local
          ("frontend-a1", "peers-c1", "request"): 3}        # headless: never hint-ignored
    t = cluster.truth(gt)
    assert t["shop/checkout"].hint_ignored_by_cause == {("c2", "data-plane"): 100, ("b1", "client-side"): 50}
    assert t["shop/web"].hint_ignored_by_cause == {("c2", "external"): 30}
    assert t["shop/peers"].hint_ignored_bytes == 0 and t["shop/api"].hint_ignored_bytes == 0
    assert t["shop/web"].by_class == {
        ("node", "zone-c", "zone-b", "cross_zone", "request"): 30,
        ("load-balancer", "zone-a", "zone-b", "cross_zone", "request"): 20,
        ("node", "zone-a", "zone-a", "same_node", "request"): 9}
    assert t["shop/api"].by_class == {("load-balancer", "zone-b", "zone-b", "same_zone", "response"): 7}
    cluster.load_balancers_marked = False  # an agent without the mark sees a cidr peer
    assert set(cluster.truth(gt)["shop/api"].by_class) == {("cidr", "zone-b", "zone-b", "same_zone", "response")}


def test_entry_truth_is_the_load_balancers_own_count_of_the_cluster_policy_node_ports(
        cluster: DemoCluster) -> None:
    """lb-c calls web's node port (externalTrafficPolicy Cluster) on c2 and b1: its bytes to
    and from those nodes' addresses on 30080 are the first hop, at the node's zone; lb-b's
    calls to api's (Local) node port and anything else lb-c sent are no entry hop."""
    cluster.load_balancers_marked = True
    topo = cluster.topology
    c2, b1 = topo.node("c2"), topo.node("b1")
    ct = {("outside/lb-c", c2.ip, 30080, "request"): 100, ("outside/lb-c", c2.ip, 30080, "response"): 900,
          ("outside/lb-c", b1.ip, 30080, "request"): 50, ("outside/lb-c", b1.ip, 30080, "response"): 500,
          ("outside/lb-b", b1.ip, 30081, "request"): 7,          # api: Local, one hop
          ("outside/lb-c", b1.ip, 9999, "request"): 3,           # no flow there
          ("outside/lb-a", topo.pod("web-b1").ip, 8080, "request"): 11}  # IP targets: no node port
    assert cluster.entry_truth(ct) == {"shop/web": {
        ("load-balancer", "zone-c", "zone-c", "same_zone", "request"): 100,
        ("load-balancer", "zone-c", "zone-c", "same_zone", "response"): 900,
        ("load-balancer", "zone-c", "zone-b", "cross_zone", "request"): 50,
        ("load-balancer", "zone-c", "zone-b", "cross_zone", "response"): 500}}


def test_workload_truth_follows_the_rule_table(cluster: DemoCluster) -> None:
    gt = {("frontend-b1", "exporter-c1", "request"): 10, ("frontend-b1", "exporter-c1", "response"): 11,
          ("scraper-b1", "batch-a1", "request"): 12, ("scraper-b1", "batch-a1", "response"): 13,
          ("frontend-c1", "batch-a1", "request"): 14, ("frontend-c1", "batch-a1", "response"): 15,
          ("frontend-b1", "cache-a1", "request"): 16, ("frontend-b1", "cache-a1", "response"): 17,
          ("frontend-a1", "outside/orders-db", "request"): 18,
          ("outside/lb-a", "ingress-a1", "request"): 19,
          ("frontend-a1", "checkout-a1", "request"): 99}    # Service traffic: not here
    seen, unseen = cluster.workload_truth(gt)
    assert seen == {
        ("shop", "frontend-b1", "Pod", "node", "zone-b", "zone-c", "cross_zone", "egress"): 10,
        ("shop", "frontend-b1", "Pod", "node", "zone-b", "zone-c", "cross_zone", "ingress"): 11,
        ("jobs", "batch-a1", "Pod", "node", "zone-a", "zone-b", "cross_zone", "ingress"): 12,
        ("jobs", "batch-a1", "Pod", "node", "zone-a", "zone-b", "cross_zone", "egress"): 13,
        ("shop", "frontend-c1", "Pod", "pod", "zone-c", "zone-a", "cross_zone", "egress"): 14,
        ("jobs", "batch-a1", "Pod", "pod", "zone-a", "zone-c", "cross_zone", "egress"): 15,
        ("shop", "frontend-b1", "Pod", "pod", "zone-b", "zone-a", "cross_zone", "egress"): 16,
        ("jobs", "cache-a1", "Pod", "pod", "zone-a", "zone-b", "cross_zone", "egress"): 17,
        ("shop", "frontend-a1", "Pod", "cidr", "zone-a", "zone-b", "cross_zone", "egress"): 18}
    assert unseen == {("ingress", "ingress-a1", "Pod", "cidr", "zone-a", "zone-a", "same_zone", "ingress"): 19}


def test_zone_cidrs_for_the_outside_peers(cluster: DemoCluster, tmp_path: Path) -> None:
    from agent.k8s.cidrs import load_zone_cidrs
    entries = cluster.lab.zone_cidr_entries(mark_load_balancers=True)
    lb_a = cluster.topology.peer("lb-a")
    assert entries[0] == {"cidr": f"{lb_a.ip}/32", "zone": "zone-a", "region": "region-1",
                          "kind": "load-balancer", "type": "aws-alb"}
    assert len(entries) == 8  # four peers, two families
    assert all("kind" not in e for e in cluster.lab.zone_cidr_entries(mark_load_balancers=False))
    mine = tmp_path / "mine.csv"
    mine.write_text("10.50.0.0/16,zone-c,region-1\n")
    path = cluster.write_zone_cidrs(mine)
    assert path is not None
    got = load_zone_cidrs(path)
    assert [str(z.network) for z in got][-1] == "10.50.0.0/16"
    assert {z.zone for z in got if str(z.network) == f"{cluster.topology.peer('orders-db').ip}/32"} == {"zone-b"}
    bad = tmp_path / "bad.csv"
    bad.write_text("10.50.0.0/33,zone-c\n")
    with pytest.raises(InputError) as info:
        cluster.write_zone_cidrs(bad)
    assert info.value.source == str(bad) and info.value.field == "cidr"


def _series(family: str, value: float, **labels: str) -> str:
    return family + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "} " + f"{value}\n"


_WEB = dict(namespace="shop", service="web", port="80", server_zone="zone-b", crossing="cross_zone",
            direction="request")
CLASSES = ("# TYPE zonemeter_service_bytes_total counter\n"
           + _series("zonemeter_service_bytes_total", 30, **_WEB, client_zone="zone-c", client_kind="node")
           + _series("zonemeter_service_bytes_total", 20, **_WEB, client_zone="zone-a",
                     client_kind="load-balancer"))


def test_breakdown_per_zone_pair_and_class(cluster: DemoCluster) -> None:
    cluster.load_balancers_marked = True
    gt = {("node/c2", "web-b1", "request"): 30, ("outside/lb-a", "web-b1", "request"): 20}
    agents = parse_metrics(CLASSES)
    assert agents.service_bytes_by_kind[("shop", "web", "node", "zone-c", "zone-b", "cross_zone", "request")] == 30
    s = build_summary(1.0, agents, cluster.truth(gt), cluster.models, workload_truth=cluster.workload_truth(gt))
    web = next(x for x in s["services"] if x["name"] == "web")
    assert s["client_kind_exported"] is True
    assert web["by_zone_pair"] == [
        {"client_zone": "zone-a", "server_zone": "zone-b", "crossing": "cross_zone", "direction": "request",
         "bytes": 20, "ground_truth_bytes": 20},
        {"client_zone": "zone-c", "server_zone": "zone-b", "crossing": "cross_zone", "direction": "request",
         "bytes": 30, "ground_truth_bytes": 30}]
    assert [(r["client_kind"], r["bytes"], r["ground_truth_bytes"]) for r in web["by_client_kind"]] == [
        ("load-balancer", 20, 20), ("node", 30, 30)]
    # agents without the label: the lab's classes stand alone, the agents' bytes are null
    plain = parse_metrics(CLASSES.replace(',client_kind="node"', "").replace(',client_kind="load-balancer"', ""))
    s = build_summary(1.0, plain, cluster.truth(gt), cluster.models, workload_truth=({}, {}))
    web = next(x for x in s["services"] if x["name"] == "web")
    assert s["client_kind_exported"] is False
    assert [(r["client_kind"], r["bytes"]) for r in web["by_client_kind"]] == [("load-balancer", None), ("node", None)]
    assert s["double_counted_bytes"] == 0


def test_workload_breakdown_counts_extra_agent_bytes_as_double(cluster: DemoCluster) -> None:
    wl = dict(workload_kind="Pod", client_zone="zone-a", direction="egress")
    text = ("# TYPE zonemeter_workload_bytes_total counter\n"
            + _series("zonemeter_workload_bytes_total", 25, namespace="shop", workload="frontend-a1", **wl,
                      remote_zone="zone-b", remote_kind="cidr", crossing="cross_zone")
            + _series("zonemeter_workload_bytes_total", 4, namespace="jobs", workload="cache-a1", **wl,
                      remote_zone="zone-b", remote_kind="pod", crossing="cross_zone")
            + _series("zonemeter_workload_bytes_total", 3, namespace="jobs", workload="cache-a1", **wl,
                      remote_zone="zone-a", remote_kind="node", crossing="same_node"))
    gt = {("frontend-a1", "outside/orders-db", "request"): 18, ("outside/lb-a", "ingress-a1", "request"): 19}
    s = build_summary(1.0, parse_metrics(text), cluster.truth(gt), cluster.models,
                      workload_truth=cluster.workload_truth(gt))
    rows = {(r["workload"], r["remote_kind"], r["direction"], r["seen_by_agents"]):
            (r["bytes"], r["ground_truth_bytes"]) for r in s["workload_breakdown"]}
    assert rows == {("frontend-a1", "cidr", "egress", True): (25, 18),     # 7 above the lab
                    ("cache-a1", "pod", "egress", True): (4, 0),          # none sent: all double
                    ("ingress-a1", "cidr", "ingress", False): (0, 19)}    # no veth on the path
    assert s["double_counted_bytes"] == 7 + 4  # the link-scope node row is left out
