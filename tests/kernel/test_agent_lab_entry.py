"""zonemeter agent end to end on node ports whose receiving node does not masquerade to its
own endpoints (docs/attribution.md, "Two hops of NodePort and LoadBalancer traffic").

Lab (tools/lab, flat): node a1 (zone-a) runs the bypass data plane (``dataPlane: bypass``,
as Cilium's kube-proxy replacement: node-port connections to a local endpoint keep the
client's address, those to another node's are masqueraded), b1 (zone-b) the kube-proxy
emulation. ``shop/web`` (NodePort 30080, externalTrafficPolicy Cluster) has web-a1 on a1 and
web-b1 on b1. The load balancer ``lb`` (outside, zone-a, in the agents' zone-CIDR file)
calls a1's node port; a1 sends each connection to either endpoint. Real agents (``python
-m agent agent``), both hooks, uplinks named. Exactly once, per direction:

* lb's own counters (its namespace) = web-a1's bytes from lb (the one hop of the local,
  unmasqueraded connections) + web-b1's bytes from a1 (the second hop of the remote ones);
* the agents' ``zonemeter_service_entry_bytes_total`` = only the remote connections' first
  hop = web-b1's bytes (NAT keeps each packet's length); the uplink's copy of the local
  connections is skipped as ``entry_endpoint_copy``;
* ``zonemeter_service_bytes_total`` = the endpoints' ground truth, web-a1's from the load
  balancer (class ``load-balancer``), web-b1's from a1 (class ``node``).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.kernel.test_agent_lab import INTERVAL, Agents

pytestmark = pytest.mark.kernel

TOPOLOGY = """\
options: {mode: flat, ipv6: false}
zones:
  - {name: zone-a, region: region-1}
  - {name: zone-b, region: region-1}
nodes:
  - {name: a1, zone: zone-a, cpu: 4, dataPlane: bypass}
  - {name: b1, zone: zone-b, cpu: 4}
pods:
  - {name: web-a1, namespace: shop, node: a1, app: web, ports: [{port: 8080, name: http}]}
  - {name: web-b1, namespace: shop, node: b1, app: web, ports: [{port: 8080, name: http}]}
services:
  - {name: web, namespace: shop, type: NodePort, externalTrafficPolicy: Cluster,
     selector: {app: web}, ports: [{name: http, port: 80, targetPort: http, nodePort: 30080}]}
outside:
  - {name: lb, kind: load-balancer, zone: zone-a, type: aws-nlb}
"""


@pytest.fixture(scope="module")
def lab() -> Iterator[Any]:
    from tools.lab import Lab, Topology

    with Lab(Topology.from_yaml(TOPOLOGY)) as the_lab:
        yield the_lab


def _families(texts: list[str]) -> dict[str, dict[tuple[str, ...], int]]:
    """Per family: (client_kind, direction) of web's series, or reason, summed over agents."""
    out: dict[str, dict[tuple[str, ...], int]] = defaultdict(lambda: defaultdict(int))
    for text in texts:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name in ("zonemeter_service_bytes_total", "zonemeter_service_entry_bytes_total"):
                    out[s.name][(s.labels["client_kind"], s.labels["direction"])] += int(s.value)
                elif s.name in ("zonemeter_skipped_bytes_total", "zonemeter_unattributed_bytes_total",
                                "zonemeter_workload_bytes_total"):
                    out[s.name][(s.labels.get("reason", ""),)] += int(s.value)
    return out


@pytest.mark.parametrize("hook", ["veth", "cgroup"])
def test_a_node_that_keeps_the_clients_address_for_local_endpoints_counts_each_hop_once(
        lab: Any, hook: str, tmp_path: Path) -> None:
    snapshot = lab.write_snapshot(tmp_path / "lab.json")
    cidrs = tmp_path / "zone-cidrs.yaml"
    cidrs.write_text("".join(f"- {{cidr: {e['cidr']}, zone: {e['zone']}, kind: {e['kind']}, type: {e['type']}}}\n"
                             for e in lab.zone_cidr_entries(mark_load_balancers=True)))
    extra = {}
    for n in ("a1", "b1"):
        args = ["--uplink-interfaces", lab.uplink(n)[1], "--zone-cidrs", str(cidrs)]
        if hook == "cgroup":
            scope = [lab.node_netns(n)] + [lab.pod_netns(p.name) for p in lab.topology.pods_on(n)]
            args += ["--hook", "cgroup", "--cgroup-scope-netns", ",".join(scope)]
        extra[n] = args
    agents = Agents(lab, snapshot, tmp_path, extra=extra)
    try:
        agents.wait_ready()
        time.sleep(INTERVAL)  # the agents wrote their entry points
        lab.reset_ground_truth()
        r = lab.run_flow("outside/lb", lab.node_ip("a1"), 30080, "tcp", 700, 5000, count=40)
        assert (r.ok, r.failed) == (40, 0), r
        time.sleep(INTERVAL * 1.5)
        got = _families([agents.scrape(n) for n in ("a1", "b1")])
        truth = lab.ground_truth()
        sent = lab.outside_client_truth()
        assert agents.stop() == {"a1": 0, "b1": 0}
    finally:
        agents.kill()
    a1 = lab.node_ip("a1")
    for d in ("request", "response"):
        local = truth.get(("outside/lb", "web-a1", d), 0)   # kept the load balancer's address
        remote = truth.get(("node/a1", "web-b1", d), 0)     # masqueraded to a1's
        assert local > 0 and remote > 0, truth               # a1 sent connections both ways
        assert sent[("outside/lb", a1, 30080, d)] == local + remote
        assert got["zonemeter_service_bytes_total"][("load-balancer", d)] == local
        assert got["zonemeter_service_bytes_total"][("node", d)] == remote
        assert got["zonemeter_service_entry_bytes_total"][("load-balancer", d)] == remote
    assert got["zonemeter_skipped_bytes_total"][("entry_endpoint_copy",)] == sum(
        truth.get(("outside/lb", "web-a1", d), 0) for d in ("request", "response"))
    assert sum(got["zonemeter_unattributed_bytes_total"].values()) == 0
    assert sum(got["zonemeter_workload_bytes_total"].values()) == 0
