"""Every path a byte takes, in one demo run per mode, checked from the demo's JSON alone
(docs/demo.md, "Every path"; docs/examples/every-path.yaml).

One run per mode (a module fixture, every check shares it): the kube-proxy emulation
(70-100 s on two cores) and real Kubernetes (about 90 s: the real EndpointSlice controller
writes the slices, the headless Service's too, and the real kube-proxy serves a1, b1 and c1,
node ports with externalTrafficPolicy Local and Cluster included; c2 keeps the emulation
that ignores hints). Four nodes in three zones:
``c2``'s data plane ignores hints, ``mesh-b1`` balances itself over ``shop/checkout``'s
endpoints, a load balancer per zone (``lb-a`` an ALB with IP targets, ``lb-b`` and ``lb-c``
NLBs on node ports, Local and Cluster: ``lb-c``'s calls reach c2 and b1, whose uplinks count
the first hop), a host-network ingress on ``a1``, the headless ``shop/peers``, the managed
database ``orders-db`` in zone-b, pod -> node, host -> pod, pod -> pod and a hostPort (to a
plain pod, and to ``jobs/queue``'s endpoint), in IPv4 and IPv6. Each test reads ``summary``
(the ``-o json`` document) only: per Service and for non-Service traffic the agents' bytes
per zone pair, direction and client class equal the lab's, the first hop of node ports
equals what the load balancer's own counters say, dollars follow AWS's rule per class,
hint-ignored bytes carry the cause the lab played on the node that played it, and what no
agent can see is named as such.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.lab_hints import lab_hints
from tools.demo.run import DemoOptions, DemoRun
from tools.demo.topology import load_demo

pytestmark = pytest.mark.e2e

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "every-path.yaml"


@pytest.fixture(scope="module", params=["emulated", "real"])
def summary(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp(f"demo-every-path-{request.param}")
    opts = DemoOptions(duration_seconds=6, interval_seconds=1, warmup_requests=10, workdir=work,
                       state_dir=work / "state", hints=lab_hints("oracle").kind, kubernetes=request.param)
    began = time.monotonic()
    with DemoRun(load_demo(EXAMPLE), opts) as run:
        result = run.execute()
    doc = dict(result.summary)
    doc["agent_exit_codes"] = result.agent_exit_codes
    doc["asked_mode"] = request.param
    print(f"every-path demo run ({request.param}): {time.monotonic() - began:.1f} s wall")
    yield doc


def _svc(summary: dict[str, Any], key: str) -> dict[str, Any]:
    ns, name = key.split("/")
    return next(s for s in summary["services"] if (s["namespace"], s["name"]) == (ns, name))


def test_every_request_completed_and_agents_exit_cleanly(summary: dict[str, Any]) -> None:
    assert summary["requests"]["failed"] == 0
    assert summary["requests"]["completed"] > 0
    assert set(summary["agent_exit_codes"].values()) == {0}
    # the plan played every path, in both families
    assert {f["path"] for f in summary["flows"]} == {
        "clusterIP", "endpoints", "nodePort", "node", "outside", "pod", "hostPort"}
    assert {fam for f in summary["flows"] for fam in f["families"]} == {4, 6}
    # the lab followed upstream (the oracle) or the real components, and the model agrees
    assert summary["model_disagreements"] == []
    kube = summary["kubernetes"]
    assert kube["mode"] == summary["asked_mode"]
    assert kube.get("emulatedProxyNodes", ["c2"]) == ["c2"]  # real: c2 keeps the emulation


def test_service_bytes_per_zone_pair_and_direction_equal_the_lab(summary: dict[str, Any]) -> None:
    for s in summary["services"]:
        key = f"{s['namespace']}/{s['name']}"
        rows = s["by_zone_pair"]
        assert rows, key
        for r in rows:
            assert r["bytes"] == r["ground_truth_bytes"] > 0, (key, r)
        assert s["cross_zone_bytes"] == s["ground_truth_cross_zone_bytes"], key
        assert {r["direction"] for r in rows} == {"request", "response"}, key
    assert summary["double_counted_bytes"] == 0
    assert sum(summary["unattributed_bytes"].values()) == 0


def test_each_client_class_is_counted_where_the_topology_puts_it(summary: dict[str, Any]) -> None:
    """Per Service, zone pair, direction and client class the agents' bytes equal the lab's:
    pods call checkout and the headless peers; web is reached by the ALB's IP targets (a
    load-balancer client), by the NodePort hop c2 masqueraded and the host-network ingress
    (node clients); api, externalTrafficPolicy Local, sees the NLB's own address."""
    assert summary["client_kind_exported"] is True
    assert summary["zone_cidrs"]["load_balancers_marked"] is True
    lb = "load-balancer"
    for s in summary["services"]:
        for r in s["by_client_kind"]:
            assert r["bytes"] == r["ground_truth_bytes"] > 0, (s["name"], r)

    def classes(key: str) -> dict[tuple[str, str], int]:
        out: dict[tuple[str, str], int] = {}
        for r in _svc(summary, key)["by_client_kind"]:
            k = (r["client_kind"], r["client_zone"])
            out[k] = out.get(k, 0) + r["ground_truth_bytes"]
        return out

    assert set(classes("shop/checkout")) == {("pod", "zone-a"), ("pod", "zone-b"), ("pod", "zone-c")}
    assert set(classes("shop/peers")) == {("pod", "zone-a"), ("pod", "zone-c")}
    # c2's and b1's masqueraded node-port hops, the ingress on a1: node clients
    assert set(classes("shop/web")) == {(lb, "zone-a"), ("node", "zone-a"), ("node", "zone-b"), ("node", "zone-c")}
    # a hostPort call to the queue's endpoint is the Service's, from the calling pod
    assert set(classes("jobs/queue")) == {("pod", "zone-a")}
    assert set(classes("shop/api")) == {(lb, "zone-b")}
    api = _svc(summary, "shop/api")
    assert set(api["bytes"]) == {"same_zone"}  # the NLB's zone-b address, its own node's endpoint


def test_the_first_hop_of_node_ports_equals_the_load_balancers_own_count(summary: dict[str, Any]) -> None:
    """lb-c's calls to web's node port (externalTrafficPolicy Cluster) on c2 (zone-c) and b1
    (zone-b): each first hop counted once, on the receiving node's uplink, equal per class,
    zone pair and direction to what lb-c's own nftables counters say it sent and received;
    api's node port (Local) has none (its endpoint sees lb-b itself), nor has any Service
    without node ports."""
    rows = _svc(summary, "shop/web")["entry_by_client_kind"]
    for r in rows:
        assert r["bytes"] == r["ground_truth_bytes"] > 0, r
    assert {(r["client_kind"], r["client_zone"], r["server_zone"], r["crossing"]) for r in rows} == {
        ("load-balancer", "zone-c", "zone-c", "same_zone"), ("load-balancer", "zone-c", "zone-b", "cross_zone")}
    assert {r["direction"] for r in rows} == {"request", "response"}
    for key in ("shop/api", "shop/checkout", "shop/peers", "jobs/queue"):
        assert _svc(summary, key)["entry_by_client_kind"] == [], key


def test_dollars_by_client_class(summary: dict[str, Any]) -> None:
    """At AWS's rules: the ALB's hop to web's pods crosses zones but is not billed (its
    dollars 0, with the reason), the NodePort hop and the ingress (node clients) and the
    pods' calls are, and so is the NLB's cross-zone first hop to b1; a Service's dollars are
    its billed classes' only; the database's cross-zone bytes are billed non-Service bytes."""
    def lab_cross_zone(key: str, kind: str) -> int:
        return sum(r["ground_truth_bytes"] for r in _svc(summary, key)["by_client_kind"]
                   if r["client_kind"] == kind and r["crossing"] == "cross_zone")

    web = _svc(summary, "shop/web")
    classes = {(c["hop"], c["client_kind"], c["lb_type"]): c for c in web["cost_by_class"]}
    assert set(classes) == {("endpoint", "load-balancer", "aws-alb"), ("endpoint", "node", ""),
                            ("entry", "load-balancer", "aws-nlb")}
    alb, node = classes[("endpoint", "load-balancer", "aws-alb")], classes[("endpoint", "node", "")]
    nlb = classes[("entry", "load-balancer", "aws-nlb")]
    assert alb["cross_zone_bytes"] == lab_cross_zone("shop/web", "load-balancer") > 0
    assert (alb["billed"], alb["usd_per_month_at_aws_price"]) == (False, 0.0) and alb["reason"]
    assert node["cross_zone_bytes"] == lab_cross_zone("shop/web", "node") > 0
    assert node["billed"] and node["usd_per_month_at_aws_price"] > 0
    assert nlb["cross_zone_bytes"] == sum(r["ground_truth_bytes"] for r in web["entry_by_client_kind"]
                                          if r["crossing"] == "cross_zone") > 0
    assert nlb["billed"] and nlb["usd_per_month_at_aws_price"] > 0
    assert web["usd_per_month_at_aws_price"] == round(node["usd_per_month_at_aws_price"]
                                                      + nlb["usd_per_month_at_aws_price"], 2)
    [pod] = _svc(summary, "shop/checkout")["cost_by_class"]
    assert (pod["hop"], pod["client_kind"], pod["billed"]) == ("endpoint", "pod", True)
    assert pod["usd_per_month_at_aws_price"] > 0
    assert _svc(summary, "shop/api")["cost_by_class"] == []  # the NLB's zone-b calls stay in zone-b
    db = [w for w in summary["workloads"] if w["remote_kind"] == "cidr" and w["cross_zone_bytes"]]
    assert db and all(w["billed"] and w["usd_per_month_at_aws_price"] > 0 for w in db)


def test_hint_ignored_verdicts_name_node_and_cause(summary: dict[str, Any]) -> None:
    """checkout: c2's ClusterIP calls (its data plane ignores hints) are data-plane, mesh-b1's
    own dials outside zone-b client-side; web: the NodePort hop c2 masqueraded is external;
    the ETP-Local api, the ALB's IP targets and the headless peers ignore no hint (no
    kube-proxy selection applies to them)."""
    def causes(key: str) -> dict[tuple[str, str | None], tuple[int, int, str | None]]:
        return {(c["client_node"], c["cause"]): (c["bytes"], c["ground_truth_bytes"], c["ground_truth_cause"])
                for c in _svc(summary, key)["hint_ignored_causes"]}

    co = causes("shop/checkout")
    assert set(co) == {("c2", "data-plane"), ("b1", "client-side")}
    for (node, cause), (got, want, played) in co.items():
        assert got == want > 0 and played == cause, (node, cause)
    web = causes("shop/web")
    assert set(web) == {("c2", "external")}
    got, want, played = web[("c2", "external")]
    assert got == want > 0 and played == "external"
    assert causes("shop/api") == causes("shop/peers") == causes("jobs/queue") == {}
    for key in ("shop/checkout", "shop/web", "shop/api", "shop/peers", "jobs/queue"):
        s = _svc(summary, key)
        assert s["hint_ignored_bytes"] == s["ground_truth_hint_ignored_bytes"], key
    sentences = {c["cause"]: c["sentence"] for key in ("shop/checkout", "shop/web")
                 for c in _svc(summary, key)["hint_ignored_causes"]}
    assert sentences["data-plane"].startswith("locality configured, but node c2's data plane ignores the hints")
    assert sentences["client-side"].startswith("clients of this Service on node b1 choose endpoints themselves")
    assert "came in through node c2's address" in sentences["external"]


def test_non_service_bytes_per_workload_equal_the_lab(summary: dict[str, Any]) -> None:
    """pod -> node (frontend-b1 to c1's exporter), host -> pod (b1's scraper to batch-a1),
    pod -> pod (frontend-c1 to batch-a1), a hostPort (frontend-b1 to cache-a1 through a1's
    address) and the managed database (frontend-a1 across zones, frontend-b1 in its zone):
    every series the agents export equals the lab's bytes; the load balancer's hop to the
    host-network ingress passes no pod veth and is named unseen."""
    rows = summary["workload_breakdown"]
    seen = [r for r in rows if r["seen_by_agents"]]
    for r in seen:
        assert r["bytes"] == r["ground_truth_bytes"] > 0, r
    got = {(r["workload"], r["remote_kind"], r["remote_zone"], r["crossing"], r["direction"]) for r in seen}
    assert {
        ("frontend-b1", "node", "zone-c", "cross_zone", "egress"),      # pod -> node
        ("frontend-b1", "node", "zone-c", "cross_zone", "ingress"),
        ("batch-a1", "node", "zone-b", "cross_zone", "ingress"),        # host -> pod
        ("batch-a1", "node", "zone-b", "cross_zone", "egress"),
        ("frontend-c1", "pod", "zone-a", "cross_zone", "egress"),       # pod -> pod
        ("batch-a1", "pod", "zone-c", "cross_zone", "egress"),
        ("frontend-b1", "pod", "zone-a", "cross_zone", "egress"),       # hostPort
        ("cache-a1", "pod", "zone-b", "cross_zone", "egress"),
        ("frontend-a1", "cidr", "zone-b", "cross_zone", "egress"),      # managed database
        ("frontend-a1", "cidr", "zone-b", "cross_zone", "ingress"),
        ("frontend-b1", "cidr", "zone-b", "same_zone", "egress"),
        ("frontend-b1", "cidr", "zone-b", "same_zone", "ingress"),
    } <= got
    # the hostPort call to queue-c1 (a Service endpoint) is no workload byte: the Service's
    assert not any(r["workload"] == "frontend-a1" and r["remote_kind"] == "pod" for r in rows)
    unseen = [r for r in rows if not r["seen_by_agents"]]
    assert {(r["namespace"], r["workload"], r["direction"]) for r in unseen} == {
        ("ingress", "ingress-a1", "ingress"), ("ingress", "ingress-a1", "egress")}
    assert all(r["bytes"] == 0 and r["ground_truth_bytes"] > 0 for r in unseen)
    # the non-Service cost counts the database's cross-zone bytes
    assert summary["usd_per_month_at_aws_price"]["workloads"] > 0
