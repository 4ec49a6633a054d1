"""zonemeter agent end to end on the cgroup hook: a host-network endpoint behind a ClusterIP,
mixed with a veth endpoint, is counted at its own node as server.

Lab (tools/lab, flat): nodes a1 (zone-a) and b1 (zone-b); ``shop/web`` has a pod endpoint
web-a1 on a1 and a host-network endpoint web-hb1 on b1 (the node's address). Clients on
both nodes and a host-network client on a1 (the node's own socket: host to host across
zones when kube-proxy picks web-hb1) dial the ClusterIP, kube-proxy picks either endpoint
per connection. One real
``python -m agent agent --hook cgroup`` per node, each counting only its own lab
namespaces (``--cgroup-scope-netns``: lab namespaces share the machine's cgroup tree).
The sum of ``zonemeter_service_bytes_total`` over both agents equals the nftables ground
truth (in the server pods' namespaces, the node's for web-hb1) per (client zone, server
zone, crossing, direction); nothing lands in workload or unattributed series and
nothing in ``skipped{clusterip_mixed_host_network}``: on the veth hook the share of
web-hb1 was counted nowhere (docs/attribution.md).
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.datapath import tcx
from tests.kernel.test_agent_lab import INTERVAL, Agents, coverage, expected, service_bytes

pytestmark = pytest.mark.kernel

TOPOLOGY = """\
options: {mode: flat, ipv6: false}
zones:
  - {name: zone-a, region: region-1}
  - {name: zone-b, region: region-1}
nodes:
  - {name: a1, zone: zone-a, cpu: 4}
  - {name: b1, zone: zone-b, cpu: 4}
pods:
  - {name: client-a1, namespace: shop, node: a1, app: client}
  - {name: client-b1, namespace: shop, node: b1, app: client}
  - {name: hclient-a1, namespace: shop, node: a1, app: client, hostNetwork: true}
  - name: web-a1
    namespace: shop
    node: a1
    app: web
    ports: [{port: 8080, name: http}]
  - name: web-hb1
    namespace: shop
    node: b1
    app: web
    hostNetwork: true
    ports: [{port: 8080, name: http}]
services:
  - name: web
    namespace: shop
    selector: {app: web}
    ports:
      - {name: http, port: 80, targetPort: http}
"""


@pytest.fixture(scope="module")
def lab() -> Iterator[object]:
    from tools.lab import Lab, Topology

    with Lab(Topology.from_yaml(TOPOLOGY)) as the_lab:
        yield the_lab


def scope(lab, node: str) -> str:  # type: ignore[no-untyped-def]
    """The node's namespace and its pods' (a host-network pod lives in the node's)."""
    spaces = [lab.node_netns(node)] + [lab.pod_netns(p.name) for p in lab.topology.pods_on(node)
                                       if not p.host_network]
    return ",".join(spaces)


def test_host_network_endpoint_counted_at_its_node_without_mixed_loss(lab, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    snapshot = lab.write_snapshot(tmp_path / "lab.json")
    extra = {n: ["--hook", "cgroup", "--cgroup-scope-netns", scope(lab, n)] for n in ("a1", "b1")}
    agents = Agents(lab, snapshot, tmp_path, extra=extra)
    try:
        agents.wait_ready()
        lab.reset_ground_truth()
        cip = lab.cluster_ip("shop/web")
        for client in ("client-a1", "client-b1", "hclient-a1"):
            r = lab.run_flow(client, cip, 80, "tcp", 1200, 9000, count=16)
            assert (r.ok, r.failed) == (16, 0), r
        time.sleep(INTERVAL * 1.5)
        got, other = service_bytes([agents.scrape(n) for n in ("a1", "b1")])
        truth = lab.ground_truth()
        assert any(s == "web-hb1" and v for (_, s, _), v in truth.items()), truth
        assert any(s == "web-a1" and v for (_, s, _), v in truth.items()), truth
        # host to host across zones (a1's own socket to b1's host-network server)
        assert truth.get(("hclient-a1", "web-hb1", "request"), 0) > 0, truth
        assert got == expected(lab)
        assert {k: v for k, v in other.items() if v and "skipped" not in k} == {}
        assert other.get("zonemeter_skipped_bytes_total/clusterip_mixed_host_network", 0) == 0
        assert other.get("zonemeter_skipped_bytes_total/clusterip_client_copy", 0) > 0
        rcs = agents.stop()
        assert rcs == {"a1": 0, "b1": 0}, {n: agents.logs[n].read_text()[-2000:] for n in agents.logs}
    finally:
        agents.kill()


def agent_cgroup_links(pid: int) -> list[int]:
    """Link ids of the cgroup links one agent process holds (``/proc/PID/fdinfo``:
    ``link_type: cgroup``), so the test detaches exactly that agent's, nobody else's."""
    ids = []
    for fd in os.listdir(f"/proc/{pid}/fdinfo"):
        try:
            info = Path(f"/proc/{pid}/fdinfo/{fd}").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
        if fields.get("link_type", "").strip() == "cgroup":
            ids.append(int(fields["link_id"]))
    return sorted(set(ids))


def detach_link(link_id: int) -> None:
    attr = tcx._attr()
    struct.pack_into("=I", attr, 0, link_id)
    fd = tcx.sys_bpf(tcx.BPF_LINK_GET_FD_BY_ID, attr)
    try:
        tcx.link_detach(fd)
    finally:
        os.close(fd)


def test_cgroup_coverage_is_quiet_when_complete_and_alarmed_when_starved(lab, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The cgroup hook's comparison: bytes counted for peers off the node against the
    uplinks' own counters. a1 counts its pods (complete): quiet, ratio about 1. b1's scope
    leaves its pods out (as a --cgroup-root that is not the hierarchy's root would): its
    uplink carries client-b1's calls, its programs see none of them: alarmed. Then a1's
    cgroup links are detached from outside while traffic goes on: a1 is alarmed too."""
    snapshot = lab.write_snapshot(tmp_path / "lab.json")
    uplinks = ["--uplink-interfaces", f"{lab.prefix}u*"]
    extra = {"a1": ["--hook", "cgroup", "--cgroup-scope-netns", scope(lab, "a1"), *uplinks],
             "b1": ["--hook", "cgroup", "--cgroup-scope-netns", lab.node_netns("b1"), *uplinks]}
    agents = Agents(lab, snapshot, tmp_path, extra=extra)
    try:
        agents.wait_ready()
        web = lab.pod_ip("web-a1")
        # client-b1 (b1's pod) to web-a1 (a1's pod): over both uplinks, ~360 KB each way
        r = lab.run_flow("client-b1", web, 8080, "tcp", 1200, 9000, count=40)
        assert (r.ok, r.failed) == (40, 0), r
        time.sleep(INTERVAL * 2.5)
        a1, b1 = coverage(agents.scrape("a1")), coverage(agents.scrape("b1"))
        assert a1["zonemeter_interface_bytes_total"] > 40 * 10200, a1
        assert 0.95 < a1["zonemeter_hook_coverage_ratio"] <= 1.05, a1
        assert "hook coverage low" not in agents.logs["a1"].read_text()
        assert b1["zonemeter_interface_bytes_total"] > 40 * 10200, b1
        assert b1["zonemeter_hook_coverage_ratio"] < 0.05, b1
        assert b1["zonemeter_hook_unseen_bytes_total"] > 40 * 10200, b1
        assert agents.logs["b1"].read_text().count("hook coverage low") == 1
        info = 'zonemeter_datapath_info{attach="cgroup",hook="cgroup",requested="cgroup"} 1.0'
        assert info in agents.scrape("a1") and info in agents.scrape("b1")

        # a1's programs detached behind its back: the uplink goes on carrying
        links = agent_cgroup_links(agents.procs["a1"].pid)
        assert len(links) == 2, links  # ingress and egress
        for link in links:
            detach_link(link)
        r = lab.run_flow("client-b1", web, 8080, "tcp", 1200, 9000, count=120)
        assert (r.ok, r.failed) == (120, 0), r
        time.sleep(INTERVAL * 2.5)
        a1 = coverage(agents.scrape("a1"))
        assert a1["zonemeter_hook_coverage_ratio"] < 0.3, a1
        assert a1["zonemeter_hook_unseen_bytes_total"] > 120 * 10200, a1
        assert agents.logs["a1"].read_text().count("hook coverage low") == 1
        assert agents.stop() == {"a1": 0, "b1": 0}
    finally:
        agents.kill()
