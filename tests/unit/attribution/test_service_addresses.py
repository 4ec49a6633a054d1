"""Attribution of a pod dialling a Service through a NodePort, an externalIP or a
LoadBalancer ingress IP. kube-proxy DNATs the connection (on the client's node for its own
node address, externalIPs and LB IPs; on the target node for another node's address, then
with masquerade SNAT), so the endpoint's node counts the bytes as ``request``/``response``.
The client's veth copy must therefore be skipped like a ClusterIP copy: counting it too
counted every such byte twice cluster-wide (once as the client's workload egress to a
node / external address, once as Service traffic)."""

from __future__ import annotations

import copy
import ipaddress
from typing import Any

import pytest

from agent.attribution import Attributor
from agent.hints import HintModel
from agent.k8s import MetadataAdapter
from agent.k8s.cache import ClusterMetadata
from agent.k8s.snapshot import Snapshot
from agent.records import FlowDelta, FlowKind
from tests.fixtures.topologies import two_zone_cluster

ip = ipaddress.ip_address
T0 = 1_764_000_000.0


def objs(ip_mode: str | None = None) -> dict[str, Any]:
    o = copy.deepcopy(two_zone_cluster())
    web = next(s for s in o["services"] if s["metadata"]["name"] == "web")
    web["spec"]["type"] = "LoadBalancer"
    web["spec"]["ports"][0]["nodePort"] = 30080
    web["spec"]["externalIPs"] = ["198.51.100.7"]
    ingress: dict[str, Any] = {"ip": "203.0.113.80"}
    if ip_mode:
        ingress["ipMode"] = ip_mode
    web["status"] = {"loadBalancer": {"ingress": [ingress]}}
    return o


def agents(o: dict[str, Any]) -> tuple[ClusterMetadata, dict[str, Attributor]]:
    cache = ClusterMetadata()
    cache.load_snapshot(Snapshot(nodes=o["nodes"], services=o["services"],
                                 endpointslices=o["endpointslices"], pods=o["pods"]))
    meta, hints = MetadataAdapter(cache), HintModel(cache)
    hints.refresh()
    return cache, {n: Attributor(n, meta, hints) for n in ("na", "nb")}


def counted(t: Any) -> int:
    return (sum(t.service_bytes.values()) + sum(t.workload_bytes.values())
            + sum(t.unattributed_bytes.values()))


# client-a (na, 10.244.1.10) -> web-b (nb, 10.244.2.20:8080) through each front door;
# "seen" is the client address web-b's veth sees (masquerade to na's address when the
# DNAT happens on nb for na's traffic to nb's NodePort)
DOORS = [
    ("own node NodePort", "10.1.0.1", 30080, "10.244.1.10"),
    ("other node NodePort", "10.1.0.2", 30080, "10.1.0.2"),
    ("externalIP", "198.51.100.7", 80, "10.244.1.10"),
    ("LoadBalancer IP", "203.0.113.80", 80, "10.244.1.10"),
    # ipMode Proxy (KEP-1860): not short-circuited; the LB sends it to a NodePort
    ("LoadBalancer IP ipMode Proxy", "203.0.113.80", 80, "10.1.0.2"),
]


@pytest.mark.parametrize("door,addr,port,seen", DOORS, ids=[d[0] for d in DOORS])
def test_front_door_client_copy_not_counted(door: str, addr: str, port: int, seen: str) -> None:
    _, a = agents(objs("Proxy" if "Proxy" in door else None))
    req, resp = 1000, 7000
    a["na"].attribute([FlowDelta(FlowKind.EGRESS, ip("10.244.1.10"), ip(addr), port, 6, req, 1),
                       FlowDelta(FlowKind.INGRESS, ip("10.244.1.10"), ip(addr), port, 6, resp, 5)], T0)
    a["nb"].attribute([FlowDelta(FlowKind.REQUEST, ip("10.244.2.20"), ip(seen), 8080, 6, req, 1),
                       FlowDelta(FlowKind.RESPONSE, ip("10.244.2.20"), ip(seen), 8080, 6, resp, 5)], T0)
    ta, tb = a["na"].totals(), a["nb"].totals()
    assert counted(ta) + counted(tb) == req + resp
    assert ta.skipped_bytes.get("clusterip_client_copy") == req + resp
    assert sum(v for k, v in tb.service_bytes.items() if k.service == "web") == req + resp


def grpc_objs() -> dict[str, Any]:
    """web serves gRPC on Service port 50051 (inside Linux's default ephemeral range
    32768-60999, where the kernel records the remote port of ingress/egress as 0)."""
    o = copy.deepcopy(two_zone_cluster())
    web = next(s for s in o["services"] if s["metadata"]["name"] == "web")
    web["spec"]["ports"] = [{"name": "grpc", "port": 50051, "targetPort": 50051, "protocol": "TCP"}]
    web["spec"]["externalIPs"] = ["198.51.100.7"]
    for sl in o["endpointslices"]:
        if sl["metadata"]["labels"]["kubernetes.io/service-name"] == "web":
            sl["ports"] = [{"name": "grpc", "port": 50051, "protocol": "TCP"}]
    return o


@pytest.mark.parametrize("dialled", ["10.96.0.10", "198.51.100.7"])
def test_service_port_in_the_ephemeral_range_client_copy_not_counted(dialled: str) -> None:
    # client-a (na) -> ClusterIP:50051 -> web-b (nb): the client's veth records port 0
    _, a = agents(grpc_objs())
    req, resp = 2000, 9000
    a["na"].attribute([FlowDelta(FlowKind.EGRESS, ip("10.244.1.10"), ip(dialled), 0, 6, req, 1),
                       FlowDelta(FlowKind.INGRESS, ip("10.244.1.10"), ip(dialled), 0, 6, resp, 5)], T0)
    a["nb"].attribute([FlowDelta(FlowKind.REQUEST, ip("10.244.2.20"), ip("10.244.1.10"), 50051, 6, req, 1),
                       FlowDelta(FlowKind.RESPONSE, ip("10.244.2.20"), ip("10.244.1.10"), 50051, 6, resp, 5)],
                      T0)
    ta, tb = a["na"].totals(), a["nb"].totals()
    assert counted(ta) + counted(tb) == req + resp
    assert not ta.workload_bytes
    assert {k.port for k in tb.service_bytes} == {"50051"}


def statsd_objs() -> dict[str, Any]:
    o = copy.deepcopy(two_zone_cluster())
    web = next(s for s in o["services"] if s["metadata"]["name"] == "web")
    web["spec"]["ports"].append({"name": "statsd", "port": 8125, "targetPort": 8125, "protocol": "UDP"})
    for sl in o["endpointslices"]:
        if sl["metadata"]["labels"]["kubernetes.io/service-name"] == "web":
            sl["ports"].append({"name": "statsd", "port": 8125, "protocol": "UDP"})
    return o


def test_udp_fragments_to_a_clusterip_counted_once() -> None:
    # A UDP datagram larger than the MTU (statsd, Jaeger agent batches): non-first
    # fragments carry no ports, so both veths record port 0. The endpoint's node skips
    # them as a pod's ingress, so the client's copy must stay counted (a port-0 answer for
    # UDP would lose them); TCP and SCTP are not fragmented this way (PMTU, DF).
    _, a = agents(statsd_objs())
    frag = 2960
    a["na"].attribute([FlowDelta(FlowKind.EGRESS, ip("10.244.1.10"), ip("10.96.0.10"), 0, 17, frag, 2)], T0)
    a["nb"].attribute([FlowDelta(FlowKind.INGRESS, ip("10.244.2.20"), ip("10.244.1.10"), 0, 17, frag, 2)], T0)
    ta = a["na"].totals()
    assert counted(ta) + counted(a["nb"].totals()) == frag
    # a ClusterIP is no address outside the cluster: not "external"
    assert [(k.remote_kind, k.crossing) for k in ta.workload_bytes] == [("unknown", "unknown")]
    assert ta.unknown_crossing_bytes == {"service_address_port_unknown": frag}


def test_udp_response_fragments_from_a_clusterip_counted_once() -> None:
    # the endpoint's node counts its fragments as the pod's egress; the client's veth
    # sees them un-DNATed, from the ClusterIP, port 0: a copy (was counted as ingress from
    # an external address, twice in all)
    _, a = agents(statsd_objs())
    frag = 4400
    a["nb"].attribute([FlowDelta(FlowKind.EGRESS, ip("10.244.2.20"), ip("10.244.1.10"), 0, 17, frag, 3)], T0)
    a["na"].attribute([FlowDelta(FlowKind.INGRESS, ip("10.244.1.10"), ip("10.96.0.10"), 0, 17, frag, 3)], T0)
    assert counted(a["na"].totals()) + counted(a["nb"].totals()) == frag
