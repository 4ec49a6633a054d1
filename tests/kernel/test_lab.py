"""The lab builds a working multi-zone data path and its ground truth is exact.

Real namespaces, real traffic (root). Expected UDP bytes are computed independently of the
lab: payload + 8 (UDP) + 20 (IPv4) or 40 (IPv6) per datagram, one datagram per request
and per response. TCP bytes depend on the kernel (options, ACK timing), so TCP checks
bound them: every packet carries an IP and TCP header of legal size, no packet exceeds
the MTU (so TSO/GSO/GRO are really off), and the payload is all there.
"""

from __future__ import annotations

import math
import re
import subprocess
from collections.abc import Iterator

import pytest

from tools.lab import Lab, Topology

pytestmark = [
    pytest.mark.kernel,
]

TOPOLOGY = """
options: {mode: MODE, ipv6: true}
zones: [{name: zone-a}, {name: zone-b}]
nodes:
  - {name: a1, zone: zone-a, cpu: 4}
  - {name: a2, zone: zone-a, cpu: 2}
  - {name: b1, zone: zone-b, cpu: 4}
pods:
  - {name: client-a1, namespace: shop, node: a1}
  - {name: client-b1, namespace: shop, node: b1}
  - {name: web-a1, namespace: shop, node: a1, app: web,
     ports: [{port: 8080, name: http}, {port: 5353, protocol: UDP, name: dns}]}
  - {name: web-a2, namespace: shop, node: a2, app: web,
     ports: [{port: 8080, name: http}, {port: 5353, protocol: UDP, name: dns}]}
  - {name: web-b1, namespace: shop, node: b1, app: web,
     ports: [{port: 8080, name: http}, {port: 5353, protocol: UDP, name: dns}]}
  - {name: hn-a2, namespace: shop, node: a2, hostNetwork: true,
     ports: [{port: 9100, protocol: UDP}, {port: 9101}]}
services:
  - name: web
    namespace: shop
    selector: {app: web}
    ports:
      - {name: http, port: 80, targetPort: http}
      - {name: dns, port: 53, targetPort: dns, protocol: UDP}
  - name: local-web
    namespace: shop
    endpoints: [web-b1]
    internalTrafficPolicy: Local
    ports: [{port: 81, targetPort: 8080}]
  - name: node-agent
    namespace: shop
    endpoints: [hn-a2]
    ports: [{port: 91, targetPort: 9100, protocol: UDP}]
"""

IP_HEADER = {4: 20, 6: 40}
WEB = ("web-a1", "web-a2", "web-b1")


def _host_view() -> tuple[list[str], str, str]:
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    names = sorted(line.split(":")[1].strip().split("@")[0] for line in links.splitlines())
    r4 = subprocess.run(["ip", "route"], capture_output=True, text=True).stdout
    r6 = subprocess.run(["ip", "-6", "route"], capture_output=True, text=True).stdout
    # router-advertised routes count their lifetime down: not a change
    r6 = re.sub(r"expires \S+ ?", "", r6)
    return names, r4, r6


@pytest.fixture(scope="module")
def host_before() -> tuple[list[str], str, str]:
    return _host_view()


@pytest.fixture(scope="module")
def lab(host_before: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    topo = Topology.from_yaml(TOPOLOGY.replace("MODE", "flat"))
    with Lab(topo, state_dir=tmp_path_factory.mktemp("labstate"), server_max_seconds=600) as lab:
        yield lab


@pytest.fixture(scope="module")
def vxlan_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    topo = Topology.from_yaml(TOPOLOGY.replace("MODE", "vxlan"))
    with Lab(topo, state_dir=tmp_path_factory.mktemp("labstate"), server_max_seconds=600) as lab:
        yield lab


def _udp_expected(lab: Lab, client: str, server: str, family: int, count: int, req: int,
                  resp: int) -> dict[tuple[str, str, str], int]:
    h = IP_HEADER[family] + 8
    return {(client, server, "request"): count * (req + h),
            (client, server, "response"): count * (resp + h)}


# ------------------------------------------------------------------ UDP: exact


@pytest.mark.parametrize("family", [4, 6])
@pytest.mark.parametrize("server", ["web-a1", "web-b1"])  # same node, other zone
def test_udp_to_pod_ip_ground_truth_is_exact(lab: Lab, family: int, server: str) -> None:
    lab.reset_ground_truth()
    res = lab.run_flow("client-a1", lab.pod_ip(server, family), 5353, "udp",
                       request_bytes=200, response_bytes=900, count=7)
    assert (res.ok, res.failed) == (7, 0), res.errors
    assert lab.ground_truth() == _udp_expected(lab, "client-a1", server, family, 7, 200, 900)
    counters = lab.ground_truth_counters()
    assert {k: p for k, (_, p) in counters.items()} == {
        ("client-a1", server, "request"): 7, ("client-a1", server, "response"): 7}


@pytest.mark.parametrize("family", [4, 6])
def test_udp_through_cluster_ip_spreads_and_is_exact(lab: Lab, family: int) -> None:
    lab.reset_ground_truth()
    count, req, resp = 40, 64, 300
    res = lab.run_flow("client-b1", lab.cluster_ip("shop/web", family), 53, "udp",
                       request_bytes=req, response_bytes=resp, count=count)
    assert (res.ok, res.failed) == (count, 0), res.errors
    gt = lab.ground_truth()
    h = IP_HEADER[family] + 8
    servers = {s for (_, s, _) in gt}
    assert servers <= set(WEB) and len(servers) >= 2  # 40 random picks among 3
    assert {c for (c, _, _) in gt} == {"client-b1"}  # real client address: no SNAT
    assert sum(b for (_, _, d), b in gt.items() if d == "request") == count * (req + h)
    assert sum(b for (_, _, d), b in gt.items() if d == "response") == count * (resp + h)
    for s in servers:  # each server answered every datagram it got
        assert gt[("client-b1", s, "request")] // (req + h) == \
            gt[("client-b1", s, "response")] // (resp + h)


# ------------------------------------------------------------------ TCP: consistent


def _check_tcp(lab: Lab, gt_counters: dict[tuple[str, str, str], tuple[int, int]],
               client: str, server: str, family: int, connections: int, req: int,
               resp: int) -> None:
    mtu = lab.topology.options.pod_mtu
    for direction, payload in (("request", req), ("response", resp)):
        nbytes, packets = gt_counters[(client, server, direction)]
        header = nbytes - connections * payload
        ip = IP_HEADER[family]
        # every packet: IP header + TCP header of 20..60 bytes
        assert packets * (ip + 20) <= header <= packets * (ip + 60), (direction, nbytes, packets)
        # SYN or SYN-ACK, the final ACK or FIN/ACK pair, and the payload segments
        segments = math.ceil(payload / (mtu - ip - 20))
        assert packets >= connections * (2 + segments)
        # one packet per skb: none above the MTU (TSO/GSO/GRO really off)
        assert nbytes <= packets * mtu


@pytest.mark.parametrize("family", [4, 6])
def test_tcp_to_pod_ip_ground_truth_is_consistent(lab: Lab, family: int) -> None:
    lab.reset_ground_truth()
    res = lab.run_flow("client-a1", lab.pod_ip("web-a2", family), 8080, "tcp",
                       request_bytes=3000, response_bytes=50000, count=5)
    assert (res.ok, res.failed) == (5, 0), res.errors
    counters = lab.ground_truth_counters()
    assert set(counters) == {("client-a1", "web-a2", "request"),
                             ("client-a1", "web-a2", "response")}
    _check_tcp(lab, counters, "client-a1", "web-a2", family, 5, 3000, 50000)


def _eth0_and_ip6(lab: Lab, pod: str) -> tuple[int, int, int, int, int]:
    """(rx_packets, rx_bytes, tx_packets, tx_bytes, IPv6 packets in+out) of a pod's eth0."""
    script = ("cat /sys/class/net/eth0/statistics/rx_packets /sys/class/net/eth0/statistics/"
              "rx_bytes /sys/class/net/eth0/statistics/tx_packets /sys/class/net/eth0/"
              "statistics/tx_bytes; grep -E '^Ip6(InReceives|OutRequests) ' /proc/net/snmp6")
    out = subprocess.run(["ip", "netns", "exec", lab.pod_netns(pod), "sh", "-c", script],
                         capture_output=True, text=True, check=True).stdout.split()
    rxp, rxb, txp, txb = (int(x) for x in out[:4])
    return rxp, rxb, txp, txb, int(out[5]) + int(out[7])


@pytest.mark.parametrize("reuse", [False, True])
def test_tcp_ground_truth_equals_interface_counters(lab: Lab, reuse: bool) -> None:
    """An independent count: the server pod's eth0 statistics (L2 bytes: L3 + 14 per
    frame). The lab pins neighbours, so only IP packets cross the veth; a run during which
    IPv6 housekeeping (MLD) crossed it is repeated."""
    for _attempt in range(3):
        lab.reset_ground_truth()
        before = _eth0_and_ip6(lab, "web-a2")
        res = lab.run_flow("client-b1", lab.pod_ip("web-a2"), 8080, "tcp", request_bytes=7000,
                           response_bytes=90000, count=4, reuse=reuse)
        after = _eth0_and_ip6(lab, "web-a2")
        assert res.ok == 4
        if after[4] == before[4]:
            break
    else:
        pytest.fail("IPv6 packets crossed the veth in every attempt")
    gt = lab.ground_truth_counters()
    req_b, req_p = gt[("client-b1", "web-a2", "request")]
    resp_b, resp_p = gt[("client-b1", "web-a2", "response")]
    assert (after[0] - before[0], after[1] - before[1]) == (req_p, req_b + 14 * req_p)
    assert (after[2] - before[2], after[3] - before[3]) == (resp_p, resp_b + 14 * resp_p)


def test_tcp_reused_connection_is_consistent(lab: Lab) -> None:
    lab.reset_ground_truth()
    res = lab.run_flow("client-b1", lab.pod_ip("web-a1"), 8080, "tcp", request_bytes=3000,
                       response_bytes=50000, count=5, reuse=True)
    assert (res.ok, res.failed) == (5, 0), res.errors
    counters = lab.ground_truth_counters()
    assert set(counters) == {("client-b1", "web-a1", "request"),
                             ("client-b1", "web-a1", "response")}
    # one connection carrying all five exchanges
    _check_tcp(lab, counters, "client-b1", "web-a1", 4, 1, 5 * 3000, 5 * 50000)


def test_tcp_through_cluster_ip_spreads_without_snat(lab: Lab) -> None:
    lab.reset_ground_truth()
    res = lab.run_flow("client-a1", lab.cluster_ip("web"), 80, "tcp", request_bytes=500,
                       response_bytes=4000, count=30)
    assert (res.ok, res.failed) == (30, 0), res.errors
    counters = lab.ground_truth_counters()
    servers = {s for (_, s, _) in counters}
    assert servers <= set(WEB) and len(servers) >= 2
    assert {c for (c, _, _) in counters} == {"client-a1"}
    # connections per server: each has exactly one SYN; payload adds up across servers
    total_req = sum(b for (_, _, d), (b, _) in counters.items() if d == "request")
    assert total_req >= 30 * (500 + 3 * 40)


# ------------------------------------------------------------------ kube-proxy emulation


def test_per_node_endpoints_are_programmed_per_node(lab: Lab) -> None:
    try:
        lab.set_service_endpoints("shop/web", "a1", ["web-b1"])
        assert lab.service_endpoints("shop/web", "a1") == ("web-b1",)
        lab.reset_ground_truth()
        assert lab.run_flow("client-a1", lab.cluster_ip("web"), 80, count=15).ok == 15
        assert lab.run_flow("client-a1", lab.cluster_ip("web", 6), 53, "udp", count=15).ok == 15
        assert {s for (_, s, _) in lab.ground_truth()} == {"web-b1"}
        # node b1 still uses every endpoint
        lab.reset_ground_truth()
        assert lab.run_flow("client-b1", lab.cluster_ip("web"), 80, count=30).ok == 30
        assert len({s for (_, s, _) in lab.ground_truth()}) >= 2
    finally:
        lab.set_service_endpoints("shop/web", "a1", None)
    assert lab.service_endpoints("shop/web", "a1") == WEB


def test_no_endpoints_rejects(lab: Lab) -> None:
    try:
        lab.set_service_endpoints("shop/web", "a1", [])
        lab.reset_ground_truth()
        res = lab.run_flow("client-a1", lab.cluster_ip("web"), 80, count=2, timeout=3)
        assert res.failed == 2 and all("Refused" in e for e in res.errors), res.errors
        assert lab.ground_truth() == {}
    finally:
        lab.set_service_endpoints("shop/web", "a1", None)


def test_internal_traffic_policy_local_drops_without_local_endpoint(lab: Lab) -> None:
    lab.reset_ground_truth()
    # a1 has no local endpoint of shop/local-web: DROP, so the client times out
    res = lab.run_flow("client-a1", lab.cluster_ip("local-web"), 81, count=1, timeout=1)
    assert res.failed == 1 and "timed out" in res.errors[0], res.errors
    assert lab.ground_truth() == {}
    # b1 has one: it is used
    res = lab.run_flow("client-b1", lab.cluster_ip("local-web"), 81, count=3)
    assert res.ok == 3
    assert {s for (_, s, _) in lab.ground_truth()} == {"web-b1"}


def test_host_network_server_and_client(lab: Lab) -> None:
    lab.reset_ground_truth()
    node_ip = lab.pod_ip("hn-a2")
    assert node_ip == lab.node_ip("a2")
    res = lab.run_flow("client-b1", node_ip, 9100, "udp", request_bytes=40, response_bytes=60,
                       count=5)
    assert res.ok == 5
    assert lab.ground_truth() == _udp_expected(lab, "client-b1", "hn-a2", 4, 5, 40, 60)
    # TCP from the node's own stack: still one packet per skb at OUTPUT (gso_max_segs 1)
    lab.reset_ground_truth()
    res = lab.run_flow("client-b1", node_ip, 9101, "tcp", request_bytes=5000,
                       response_bytes=40000, count=3)
    assert res.ok == 3
    _check_tcp(lab, lab.ground_truth_counters(), "client-b1", "hn-a2", 4, 3, 5000, 40000)
    # a Service whose endpoint is host-network: DNAT to the node address
    lab.reset_ground_truth()
    res = lab.run_flow("client-b1", lab.cluster_ip("node-agent", 6), 91, "udp",
                       request_bytes=40, response_bytes=60, count=4)
    assert res.ok == 4
    assert lab.ground_truth() == _udp_expected(lab, "client-b1", "hn-a2", 6, 4, 40, 60)
    # a host-network client reaches a ClusterIP through the OUTPUT chain
    lab.reset_ground_truth()
    res = lab.run_flow("hn-a2", lab.cluster_ip("web"), 53, "udp", request_bytes=40,
                       response_bytes=60, count=20)
    assert res.ok == 20
    gt = lab.ground_truth()
    assert {c for (c, _, _) in gt} == {"hn-a2"}
    assert sum(b for (_, _, d), b in gt.items() if d == "request") == 20 * (40 + 28)


def test_nothing_in_host_namespace(lab: Lab, host_before: tuple[list[str], str, str]) -> None:
    names, r4, r6 = _host_view()
    assert not [n for n in names if n.startswith(lab.prefix)]
    assert (r4, r6) == host_before[1:]
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    present = {line.split()[0] for line in netns.splitlines() if line.strip()}
    assert set(lab.all_netns()) <= present


def test_status_describes_running_lab(lab: Lab) -> None:
    status = lab.status()
    assert all(status["netns"].values())
    assert lab.host_veth("web-a1") == (lab.node_netns("a1"),
                                       next(p["hostVeth"] for p in status["pods"]
                                            if p["name"] == "web-a1"))
    assert len(lab.host_veth("web-a1")[1]) <= 15


# ------------------------------------------------------------------ VXLAN overlay


def _vxlan_tx_packets(lab: Lab, node: str) -> int:
    dev = lab.vxlan_device(node)
    assert dev is not None
    ns, name = dev
    out = subprocess.run(["ip", "netns", "exec", ns, "cat",
                          f"/sys/class/net/{name}/statistics/tx_packets"],
                         capture_output=True, text=True, check=True).stdout
    return int(out)


@pytest.mark.parametrize("family", [4, 6])
def test_vxlan_udp_across_nodes_is_exact_and_uses_the_overlay(vxlan_lab: Lab,
                                                              family: int) -> None:
    lab = vxlan_lab
    before = _vxlan_tx_packets(lab, "a1")
    lab.reset_ground_truth()
    res = lab.run_flow("client-a1", lab.pod_ip("web-b1", family), 5353, "udp",
                       request_bytes=1000, response_bytes=20, count=9)
    assert res.ok == 9
    assert lab.ground_truth() == _udp_expected(lab, "client-a1", "web-b1", family, 9, 1000, 20)
    assert _vxlan_tx_packets(lab, "a1") - before >= 9


def test_vxlan_tcp_through_cluster_ip(vxlan_lab: Lab) -> None:
    lab = vxlan_lab
    lab.set_service_endpoints("web", "a1", ["web-b1"])
    try:
        lab.reset_ground_truth()
        res = lab.run_flow("client-a1", lab.cluster_ip("web", 6), 80, "tcp",
                           request_bytes=2000, response_bytes=30000, count=4)
        assert res.ok == 4
        counters = lab.ground_truth_counters()
        assert set(counters) == {("client-a1", "web-b1", "request"),
                                 ("client-a1", "web-b1", "response")}
        _check_tcp(lab, counters, "client-a1", "web-b1", 6, 4, 2000, 30000)
    finally:
        lab.set_service_endpoints("web", "a1", None)
