"""Host-network servers by port: a node address plus a port exactly one host-network pod on
that node declares resolves to that pod (agent.k8s parse, PodTable, MetadataAdapter), and
attribution names it in the workload series' pair rows; one connection is one pair row."""

from __future__ import annotations

import ipaddress
from typing import Any

from agent.attribution import Attributor
from agent.hints import HintModel
from agent.k8s import ClusterMetadata, MetadataAdapter
from agent.k8s.parse import parse_pod, pod_host_ports
from agent.k8s.snapshot import Snapshot
from agent.records import FlowDelta, FlowKind, PeerKind
from tests.fixtures import k8s
from tests.fixtures.topologies import two_zone_cluster

ip = ipaddress.ip_address
T0 = 1_700_000_000.0


def hostnet(name: str, node: str, node_ip: str, ports: list[dict[str, Any]],
            phase: str = "Running") -> dict[str, Any]:
    p = k8s.pod(name, node_ip, node, namespace="ingress", host_network=True,
                owner=("DaemonSet", name.rsplit("-", 1)[0]), phase=phase)
    p["spec"]["containers"][0]["ports"] = ports
    return p


def cache_with(*pods: dict[str, Any]) -> ClusterMetadata:
    c = two_zone_cluster()
    cache = ClusterMetadata()
    cache.load_snapshot(Snapshot(nodes=c["nodes"], services=c["services"],
                                 endpointslices=c["endpointslices"], pods=c["pods"] + list(pods)))
    return cache


def test_declared_ports_are_parsed_only_for_host_network_pods() -> None:
    spec = {"containers": [{"ports": [{"containerPort": 443}, {"containerPort": 53, "protocol": "UDP"},
                                      {"containerPort": 8443, "hostPort": 9443},
                                      {"containerPort": 0}, {"containerPort": True}, "junk",
                                      {"containerPort": 7, "protocol": "QUIC"}]}],
            "initContainers": [{"ports": [{"containerPort": 10254}]}]}
    assert pod_host_ports(spec) == ((53, 17), (443, 6), (8443, 6), (9443, 6), (10254, 6))
    assert pod_host_ports({"containers": "not a list"}) == ()
    pod = hostnet("ingress-x", "nb", "10.1.0.2", [{"containerPort": 443}])
    assert parse_pod(pod).host_ports == ((443, 6),)
    pod["spec"]["hostNetwork"] = False
    assert parse_pod(pod).host_ports == ()


def test_node_address_and_declared_port_resolve_to_the_one_pod() -> None:
    cache = cache_with(hostnet("ingress-x", "nb", "10.1.0.2", [{"containerPort": 443}]),
                       hostnet("dns-x", "nb", "10.1.0.2", [{"containerPort": 53, "protocol": "UDP"}]),
                       hostnet("dns-y", "nb", "10.1.0.2", [{"containerPort": 53, "protocol": "UDP"}]))
    m = MetadataAdapter(cache)
    p = m.resolve_host_port(ip("10.1.0.2"), 443, 6)
    assert p is not None and (p.kind, p.namespace, p.name, p.node, p.zone, p.host_network) == (
        PeerKind.POD, "ingress", "ingress-x", "nb", "zone-b", True)
    assert m.resolve_host_port(ip("10.1.0.2"), 443, 17) is None   # other protocol
    assert m.resolve_host_port(ip("10.1.0.2"), 53, 17) is None    # two pods declare it
    assert m.resolve_host_port(ip("10.1.0.1"), 443, 6) is None    # another node
    assert m.resolve_host_port(ip("10.244.2.20"), 443, 6) is None  # a pod address
    assert m.resolve_host_port(ip("10.1.0.2"), 0, 6) is None
    # the pod goes: the node again; a terminal pod declares nothing
    cache.apply("pods", "DELETED", hostnet("ingress-x", "nb", "10.1.0.2", [{"containerPort": 443}]))
    assert m.resolve_host_port(ip("10.1.0.2"), 443, 6) is None
    cache.apply("pods", "ADDED", hostnet("ingress-y", "nb", "10.1.0.2", [{"containerPort": 443}]))
    p = m.resolve_host_port(ip("10.1.0.2"), 443, 6)
    assert p is not None and p.name == "ingress-y"
    cache2 = cache_with(hostnet("ingress-x", "nb", "10.1.0.2", [{"containerPort": 443}], phase="Succeeded"))
    assert MetadataAdapter(cache2).resolve_host_port(ip("10.1.0.2"), 443, 6) is None


def test_attribution_names_the_host_network_server_and_keeps_one_row_per_connection() -> None:
    cache = cache_with(hostnet("ingress-x", "nb", "10.1.0.2", [{"containerPort": 443}]))
    at = Attributor("na", MetadataAdapter(cache), HintModel(cache))
    at.attribute([FlowDelta(FlowKind.EGRESS, ip("10.244.1.10"), ip("10.1.0.2"), 443, 6, 100, 1),
                  FlowDelta(FlowKind.INGRESS, ip("10.244.1.10"), ip("10.1.0.2"), 443, 6, 900, 1),
                  # the node's address on an undeclared port stays the node
                  FlowDelta(FlowKind.EGRESS, ip("10.244.1.10"), ip("10.1.0.2"), 10250, 6, 7, 1)], T0)
    at.close_interval(T0 + 10)
    t = at.totals()
    rows = {(r.client, r.server): r.bytes for r in t.top_pairs}
    assert rows == {("shop/client-a", "ingress/ingress-x"): 1000, ("shop/client-a", "node/nb"): 7}
    kinds = {(k.remote_kind, k.direction): v for k, v in t.workload_bytes.items()}
    assert kinds == {("node", "egress"): 107, ("node", "ingress"): 900}


def test_a_local_server_is_the_server_of_its_row() -> None:
    """Pod web-b on nb serves 8443 (not a Service port) to client-a on na: nb's agent sees
    web-b's egress with its own (server) port kept and the client's ephemeral port as 0,
    and names client-a the client, as na's agent does."""
    cache = cache_with()
    na = Attributor("na", MetadataAdapter(cache), HintModel(cache))
    nb = Attributor("nb", MetadataAdapter(cache), HintModel(cache))
    na.attribute([FlowDelta(FlowKind.EGRESS, ip("10.244.1.10"), ip("10.244.2.20"), 8443, 6, 100, 1)], T0)
    nb.attribute([FlowDelta(FlowKind.EGRESS, ip("10.244.2.20"), ip("10.244.1.10"), 0, 6, 900, 1,
                            local_port=8443)], T0)
    for at in (na, nb):
        at.close_interval(T0 + 10)
    rows = [(r.client, r.server) for at in (na, nb) for r in at.totals().top_pairs]
    assert rows == [("shop/client-a", "shop/web-b"), ("shop/client-a", "shop/web-b")]


def hostport_pod(name: str, node: str, pod_ip: str, ports: list[dict[str, Any]]) -> dict[str, Any]:
    p = k8s.pod(name, pod_ip, node, namespace="jobs")
    p["spec"]["containers"][0]["ports"] = ports
    return p


def test_a_host_port_is_the_pod_it_leads_to() -> None:
    """An ordinary pod's hostPort (the CNI's portmap DNAT) resolves to that pod, a POD peer;
    its containerPort alone is no port of the node's address."""
    spec = {"containers": [{"ports": [{"containerPort": 6379, "hostPort": 16379}, {"containerPort": 80}]}]}
    assert pod_host_ports(spec, host_network=False) == ((16379, 6),)
    cache = cache_with(hostport_pod("cache-x", "nb", "10.244.2.30", [{"containerPort": 6379, "hostPort": 16379}]))
    m = MetadataAdapter(cache)
    p = m.resolve_host_port(ip("10.1.0.2"), 16379, 6)
    assert p is not None and (p.kind, p.namespace, p.name, p.node, p.host_network) == (
        PeerKind.POD, "jobs", "cache-x", "nb", False)
    assert m.resolve_host_port(ip("10.1.0.2"), 6379, 6) is None


def test_a_host_port_call_is_counted_once_across_both_nodes() -> None:
    """client-a on na dials nb's address at cache-x's hostPort; nb DNATs it to cache-x. na
    sees its egress to and ingress from the node address, nb sees cache-x's ingress from and
    egress to client-a's address. Every byte once: the request as client-a's egress (na), the
    response as cache-x's egress (nb), both to a pod; client-a's ingress is cache-x's egress
    and is skipped (it used to be counted too, as ingress from the node)."""
    cache = cache_with(hostport_pod("cache-x", "nb", "10.244.2.30", [{"containerPort": 6379, "hostPort": 16379}]))
    na = Attributor("na", MetadataAdapter(cache), HintModel(cache))
    nb = Attributor("nb", MetadataAdapter(cache), HintModel(cache))
    na.attribute([FlowDelta(FlowKind.EGRESS, ip("10.244.1.10"), ip("10.1.0.2"), 16379, 6, 100, 1),
                  FlowDelta(FlowKind.INGRESS, ip("10.244.1.10"), ip("10.1.0.2"), 16379, 6, 900, 1)], T0)
    nb.attribute([FlowDelta(FlowKind.INGRESS, ip("10.244.2.30"), ip("10.244.1.10"), 0, 6, 100, 1,
                            local_port=6379),
                  FlowDelta(FlowKind.EGRESS, ip("10.244.2.30"), ip("10.244.1.10"), 0, 6, 900, 1,
                            local_port=6379)], T0)
    for at in (na, nb):
        at.close_interval(T0 + 10)
    counted = {(at.node, k.workload, k.remote_kind, k.direction): v for at in (na, nb)
               for k, v in at.totals().workload_bytes.items()}
    assert counted == {("na", "client", "pod", "egress"): 100, ("nb", "cache-x", "pod", "egress"): 900}


def test_a_host_port_call_to_a_service_endpoint_is_counted_once() -> None:
    """db-b (nb) backs shop/db on 5432 and declares hostPort 15432 -> 5432. client-a (na)
    dials nb's address at 15432: nb's portmap DNAT keeps client-a's address, so db-b's veth
    counts the exchange as shop/db's request and response (its endpoint is in nb's kernel
    map). client-a's egress to nb:15432 is then a client copy of that Service traffic, as a
    direct dial of the endpoint is: counted as a workload byte too, the request bytes were
    counted twice (docs/attribution.md, formerly a known limitation)."""
    c = two_zone_cluster()
    db = next(p for p in c["pods"] if p["metadata"]["name"] == "db-b")
    db["spec"]["containers"][0]["ports"] = [{"containerPort": 5432, "hostPort": 15432}]
    cache = ClusterMetadata()
    cache.load_snapshot(Snapshot(nodes=c["nodes"], services=c["services"],
                                 endpointslices=c["endpointslices"], pods=c["pods"]))
    assert (ip("10.244.2.30"), 5432, 6) in cache.local_endpoints("nb")
    na = Attributor("na", MetadataAdapter(cache), HintModel(cache))
    nb = Attributor("nb", MetadataAdapter(cache), HintModel(cache))
    na.attribute([FlowDelta(FlowKind.EGRESS, ip("10.244.1.10"), ip("10.1.0.2"), 15432, 6, 100, 1),
                  FlowDelta(FlowKind.INGRESS, ip("10.244.1.10"), ip("10.1.0.2"), 15432, 6, 900, 1)], T0)
    nb.attribute([FlowDelta(FlowKind.REQUEST, ip("10.244.2.30"), ip("10.244.1.10"), 5432, 6, 100, 1),
                  FlowDelta(FlowKind.RESPONSE, ip("10.244.2.30"), ip("10.244.1.10"), 5432, 6, 900, 1)], T0)
    totals = [at.totals() for at in (na, nb)]
    counted = (sum(sum(t.service_bytes.values()) + sum(t.workload_bytes.values()) for t in totals))
    assert counted == 1000
    assert {(k.service, k.direction, k.client_kind): v for k, v in totals[1].service_bytes.items()} == {
        ("db", "request", "pod"): 100, ("db", "response", "pod"): 900}
    assert not totals[0].workload_bytes
    assert dict(totals[0].skipped_bytes) == {"endpoint_client_copy": 1000}
    # the hostPort's target: the pod's address of the node address's family, its containerPort
    assert MetadataAdapter(cache).host_port_target(ip("10.1.0.2"), 15432, 6) == (ip("10.244.2.30"), 5432)
    assert MetadataAdapter(cache).host_port_target(ip("10.1.0.2"), 5432, 6) is None


def test_socket_view_counts_a_host_network_servers_reply_once() -> None:
    """With the cgroup hook on every node the host-network server's own node sees its socket
    and counts its reply as that socket's egress; the client's node must then skip the same
    bytes as a pod peer's ingress, whether the server resolved to its pod (a declared port)
    or to its node. It counted them once more when the port named the pod."""
    cache = cache_with(hostnet("ingress-x", "nb", "10.1.0.2", [{"containerPort": 443}]))
    na = Attributor("na", MetadataAdapter(cache), HintModel(cache), sockets_seen=True)
    nb = Attributor("nb", MetadataAdapter(cache), HintModel(cache), sockets_seen=True)
    # client-a on na dials nb:443; ingress-x's socket on nb answers (client's port ephemeral: 0)
    na.attribute([FlowDelta(FlowKind.EGRESS, ip("10.244.1.10"), ip("10.1.0.2"), 443, 6, 100, 1),
                  FlowDelta(FlowKind.INGRESS, ip("10.244.1.10"), ip("10.1.0.2"), 443, 6, 900, 1)], T0)
    nb.attribute([FlowDelta(FlowKind.INGRESS, ip("10.1.0.2"), ip("10.244.1.10"), 0, 6, 100, 1, local_port=443),
                  FlowDelta(FlowKind.EGRESS, ip("10.1.0.2"), ip("10.244.1.10"), 0, 6, 900, 1, local_port=443)],
                 T0)
    ta, tb = na.totals(), nb.totals()
    assert sum(ta.workload_bytes.values()) + sum(tb.workload_bytes.values()) == 1000
    assert dict(ta.skipped_bytes) == {"pod_peer_ingress": 900}
    assert dict(tb.skipped_bytes) == {"pod_peer_ingress": 100}
