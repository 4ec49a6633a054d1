"""The lab driven by a model: per-node proxy programming from a model (a node that ignores
hints keeps every endpoint), a concurrent traffic matrix, and the snapshot of a live lab."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.k8s.snapshot import load
from tools.lab import FlowSpec, Lab, Topology

pytestmark = [
    pytest.mark.kernel,
]

TOPOLOGY = """
zones: [{name: za}, {name: zb}]
nodes:
  - {name: a1, zone: za}
  - {name: b1, zone: zb}
  - {name: b2, zone: zb, ignoreHints: true}
pods:
  - {name: fe-a1, node: a1}
  - {name: fe-b1, node: b1}
  - {name: fe-b2, node: b2}
  - {name: be-a1, node: a1, app: be, ports: [{port: 8080}, {port: 5353, protocol: UDP}]}
  - {name: be-b1, node: b1, app: be, ports: [{port: 8080}, {port: 5353, protocol: UDP}]}
services:
  - name: be
    selector: {app: be}
    trafficDistribution: PreferSameZone
    ports: [{name: http, port: 80, targetPort: 8080}, {name: dns, port: 53, targetPort: 5353,
             protocol: UDP}]
"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with Lab(Topology.from_yaml(TOPOLOGY), state_dir=tmp_path_factory.mktemp("state"),
             server_max_seconds=300) as lab:
        yield lab


def test_program_proxies_by_zone_except_hint_ignoring_node(lab: Lab) -> None:
    topo = lab.topology
    asked: list[str] = []

    def same_zone(svc, node):  # type: ignore[no-untyped-def]
        asked.append(node.name)
        return [e for e in svc.endpoints if topo.zone_of(topo.pod(e).node) == node.zone]

    lab.program_proxies(same_zone)
    assert asked == ["a1", "b1"]  # b2 ignores hints: not asked
    assert lab.service_endpoints("be", "a1") == ("be-a1",)
    assert lab.service_endpoints("be", "b1") == ("be-b1",)
    assert lab.service_endpoints("be", "b2") == ("be-a1", "be-b1")

    lab.reset_ground_truth()
    cip = str(lab.cluster_ip("be"))
    results = lab.run_flows([
        FlowSpec("fe-a1", cip, 80, count=10, rate=200),
        FlowSpec("fe-b1", cip, 53, "udp", request_bytes=50, response_bytes=70, count=10),
        FlowSpec("fe-b2", cip, 80, count=40),
    ])
    assert [r.ok for r in results] == [10, 10, 40]
    gt = lab.ground_truth()
    servers = {c: {s for (cc, s, _) in gt if cc == c} for c in ("fe-a1", "fe-b1", "fe-b2")}
    assert servers["fe-a1"] == {"be-a1"} and servers["fe-b1"] == {"be-b1"}
    assert servers["fe-b2"] == {"be-a1", "be-b1"}  # 40 random picks: both (p = 1 - 2^-39)
    assert gt[("fe-b1", "be-b1", "request")] == 10 * (50 + 28)


def test_snapshot_of_running_lab_loads(lab: Lab, tmp_path: Path) -> None:
    path = lab.write_snapshot(tmp_path / "snap.json")
    snap = load(path)
    assert {p["status"]["podIP"] for p in snap.pods} == {str(lab.pod_ip(p.name))
                                                        for p in lab.topology.pods}
    assert json.loads(path.read_text())["kind"] == "List"


def test_pods_come_and_go_and_ground_truth_survives_ip_reuse(lab: Lab) -> None:
    lab.reset_ground_truth()
    old_ip = lab.pod_ip("fe-a1")
    assert lab.run_flow("fe-a1", lab.pod_ip("be-a1"), 5353, "udp", request_bytes=40,
                        response_bytes=10, count=5).ok == 5
    lab.remove_pod("fe-a1")
    assert lab.node_netns("a1") and "fe-a1" not in {p.name for p in lab.topology.pods}
    new = lab.add_pod({"name": "fe2-a1", "node": "a1"})
    assert new.ip == old_ip  # the freed address is reused
    assert lab.run_flow("fe2-a1", lab.pod_ip("be-a1"), 5353, "udp", request_bytes=40,
                        response_bytes=10, count=3).ok == 3
    gt = lab.ground_truth()
    assert gt[("fe-a1", "be-a1", "request")] == 5 * (40 + 28)
    assert gt[("fe2-a1", "be-a1", "request")] == 3 * (40 + 28)
    assert gt[("fe2-a1", "be-a1", "response")] == 3 * (10 + 28)

    # a server pod goes away: b1's proxy (programmed with only be-b1) now rejects
    lab.remove_pod("be-b1")
    assert lab.service_endpoints("be", "b1") == ()
    res = lab.run_flow("fe-b1", lab.cluster_ip("be"), 80, count=1, timeout=2)
    assert res.failed == 1 and "Refused" in res.errors[0]
    # a new server pod joins by selector; b2 (all endpoints) spreads over both
    lab.add_pod({"name": "be2-b1", "node": "b1", "app": "be",
                 "ports": [{"port": 8080}, {"port": 5353, "protocol": "UDP"}]})
    assert lab.service_endpoints("be", "b2") == ("be-a1", "be2-b1")
    lab.reset_ground_truth()
    assert lab.run_flow("fe-b2", lab.cluster_ip("be"), 80, count=40).ok == 40
    assert {s for (_, s, _) in lab.ground_truth()} == {"be-a1", "be2-b1"}
