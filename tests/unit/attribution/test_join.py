"""agent.attribution: the exactly-once rule, crossing classification, hint-ignored bytes,
host-network endpoints, CIDR/external peers, overflow and reasons, monotonic totals."""

from __future__ import annotations

import pytest

from agent.attribution import (
    Attributor,
    HintIgnoredKey,
    HintView,
    MetadataView,
    PairRow,
    ServiceKey,
    WorkloadKey,
)
from agent.records import FlowDelta, FlowKind
from tests.unit.attribution.cluster import Conn, Model, build, ip, objects

A, B, US = "eu-west-1a", "eu-west-1b", "us-east-1a"
T0 = 1_764_470_000.0


def req(local: str, remote: str, port: int, n: int, kind: FlowKind = FlowKind.REQUEST,
        proto: int = 6) -> FlowDelta:
    return FlowDelta(kind, ip(local), ip(remote), port, proto, n, 1)


def flow(kind: FlowKind, local: str, remote: str, port: int, n: int, proto: int = 6) -> FlowDelta:
    return FlowDelta(kind, ip(local), ip(remote), port, proto, n, 1)


@pytest.fixture
def cluster():  # type: ignore[no-untyped-def]
    return build()


def test_fakes_satisfy_the_protocols() -> None:
    # checked by mypy (the fakes must keep matching what attribution consumes); at run time
    # the Attributor must accept them and produce totals
    meta, hints = build()
    m: MetadataView = meta
    h: HintView = hints
    at = Attributor("n1", m, h)
    at.attribute([], T0)
    assert at.totals().node == "n1"


def attributor(cluster, node: str, **kw) -> Attributor:  # type: ignore[no-untyped-def]
    meta, hints = cluster
    return Attributor(node, meta, hints, **kw)


def accounted(t) -> int:  # type: ignore[no-untyped-def]
    """Bytes that land in exactly one of the counted series (the cluster-wide sum)."""
    return (sum(t.service_bytes.values()) + sum(t.workload_bytes.values())
            + sum(t.unattributed_bytes.values()))


# --------------------------------------------------------------------------- service traffic


@pytest.mark.parametrize(("server_node", "server_ip", "client_ip", "cz", "sz", "crossing", "reason",
                          "kind", "lb"), [
    ("n1", "10.1.1.20", "10.1.1.10", A, A, "same_node", None, "pod", "none"),          # web n1 -> api n1
    ("n2", "10.1.2.20", "10.1.1.10", A, A, "same_zone", None, "pod", "none"),          # web n1 -> api n2
    ("n3", "10.1.3.20", "10.1.1.10", A, B, "cross_zone", None, "pod", "none"),         # web n1 -> api n3
    ("n3", "10.1.3.20", "10.1.4.40", US, B, "cross_region", None, "pod", "none"),      # worker n4 -> api n3
    ("n3", "10.1.3.20", "203.0.113.7", "unknown", B, "external", None, "external", "none"),  # internet
    ("n3", "10.1.3.20", "172.31.1.5", B, B, "same_zone", None, "cidr", "none"),        # CIDR-mapped VM
    ("n3", "10.1.3.20", "172.31.70.1", "unknown", B, "unknown", "cidr_without_zone", "cidr", "none"),
    ("n3", "10.1.3.20", "10.9.9.9", "unknown", B, "unknown", "no_pod_for_ip", "unknown", "none"),
    ("n2", "fd00:10:1:2::20", "fd00:10:9::9", "unknown", A, "unknown", "no_pod_for_ip", "unknown", "none"),
    ("n3", "10.1.3.20", "10.1.5.50", "unknown", B, "unknown", "node_without_zone", "pod", "none"),  # batch n5
    ("n3", "10.1.3.20", "192.168.0.1", A, B, "cross_zone", None, "node", "none"),      # host-network client n1
    ("n2", "fd00:10:1:2::20", "fd00:10:1:1::10", A, A, "same_zone", None, "pod", "none"),  # IPv6
    # load balancers (zone CIDR ranges marked kind load-balancer), IPv4 and IPv6
    ("n3", "10.1.3.20", "172.31.128.9", A, B, "cross_zone", None, "load-balancer", "aws-alb"),
    ("n2", "fd00:10:1:2::20", "fd00:172:31::9", B, A, "cross_zone", None, "load-balancer", "aws-nlb"),
    ("n2", "fd00:10:1:2::20", "fd00:172:32::9", A, A, "same_zone", None, "cidr", "none"),  # IPv6 VM
    ("n2", "fd00:10:1:2::20", "2001:db8::7", "unknown", A, "external", None, "external", "none"),
])
@pytest.mark.parametrize("sockets", [False, True], ids=["veth", "cgroup"])
def test_service_bytes_classified_both_directions(cluster, server_node, server_ip, client_ip,  # type: ignore[no-untyped-def]
                                                  cz, sz, crossing, reason, kind, lb, sockets) -> None:
    # the endpoint's node classes its client alike on both hooks (the socket view keys a
    # packet by the socket's own addresses: the same client address here)
    at = attributor(cluster, server_node, sockets_seen=sockets)
    at.attribute([req(server_ip, client_ip, 8080, 700),
                  req(server_ip, client_ip, 8080, 9100, FlowKind.RESPONSE)], T0)
    t = at.totals()
    # 10.1.x.20:8080 backs shop/api (and shop/api-canary for two of them): shop/api wins
    assert dict(t.service_bytes) == {
        ServiceKey("shop", "api", "80", cz, sz, crossing, "request", kind, lb): 700,
        ServiceKey("shop", "api", "80", cz, sz, crossing, "response", kind, lb): 9100,
    }
    assert dict(t.unknown_crossing_bytes) == ({reason: 9800} if reason else {})
    assert not t.workload_bytes and not t.unattributed_bytes and not t.skipped_bytes


def test_server_on_node_without_zone_is_unknown(cluster) -> None:  # type: ignore[no-untyped-def]
    meta, hints = cluster
    # an endpoint on n5 (no zone label): give the slice index one directly
    from agent.records import ServicePort
    meta.endpoints[(ip("10.1.5.50"), 8080, 6)] = [ServicePort("shop", "batch", 8080, "", 8080, 6)]
    at = Attributor("n5", meta, hints)
    at.attribute([req("10.1.5.50", "10.1.1.10", 8080, 42)], T0)
    t = at.totals()
    assert dict(t.service_bytes) == {
        ServiceKey("shop", "batch", "8080", A, "unknown", "unknown", "request", "pod", "none"): 42}
    assert dict(t.unknown_crossing_bytes) == {"node_without_zone": 42}


def test_ambiguous_endpoint_attributed_once_to_first_service(cluster) -> None:  # type: ignore[no-untyped-def]
    at = attributor(cluster, "n2")
    # 10.1.2.20:8080 backs shop/api and shop/api-canary
    at.attribute([req("10.1.2.20", "10.1.1.10", 8080, 500)], T0)
    t = at.totals()
    assert sum(t.service_bytes.values()) == 500
    assert [k.service for k in t.service_bytes] == ["api"]
    assert t.diagnostics_bytes["ambiguous_service"] == 500
    # an endpoint backing one Service is not ambiguous
    at3 = attributor(cluster, "n3")
    at3.attribute([req("10.1.3.30", "10.1.1.10", 5353, 80, proto=17)], T0)
    assert "ambiguous_service" not in at3.totals().diagnostics_bytes
    assert list(at3.totals().service_bytes) == [
        ServiceKey("shop", "dns", "53", A, B, "cross_zone", "request", "pod", "none")]


def test_endpoint_without_service_is_unattributed(cluster) -> None:  # type: ignore[no-untyped-def]
    at = attributor(cluster, "n2")
    at.attribute([req("10.1.2.20", "10.1.1.10", 7777, 300)], T0)
    t = at.totals()
    assert dict(t.unattributed_bytes) == {"endpoint_without_service": 300}
    assert not t.service_bytes


# --------------------------------------------------------------------------- non-Service traffic


def test_pod_to_pod_keeps_egress_only(cluster) -> None:  # type: ignore[no-untyped-def]
    at = attributor(cluster, "n1")
    at.attribute([flow(FlowKind.EGRESS, "10.1.1.10", "10.1.3.30", 5432, 100),
                  flow(FlowKind.INGRESS, "10.1.1.10", "10.1.3.30", 5432, 4000)], T0)
    t = at.totals()
    assert dict(t.workload_bytes) == {
        WorkloadKey("shop", "web", "Deployment", A, B, "pod", "cross_zone", "egress"): 100}
    assert dict(t.skipped_bytes) == {"pod_peer_ingress": 4000}


@pytest.mark.parametrize(("remote", "port", "rzone", "rkind", "crossing", "reason"), [
    ("192.168.0.3", 10250, B, "node", "cross_zone", None),
    ("192.168.0.2", 10250, A, "node", "same_zone", None),
    ("192.168.0.1", 10250, A, "node", "same_node", None),
    ("172.31.1.5", 5432, B, "cidr", "cross_zone", None),
    ("172.31.70.1", 5432, "unknown", "cidr", "unknown", "cidr_without_zone"),
    ("203.0.113.7", 443, "unknown", "external", "external", None),
    ("2001:db8::7", 443, "unknown", "external", "external", None),
    ("192.168.0.4", 22, US, "node", "cross_region", None),
    ("192.168.0.5", 22, "unknown", "node", "unknown", "node_without_zone"),
])
def test_non_pod_peers_keep_both_directions(cluster, remote, port, rzone, rkind, crossing,  # type: ignore[no-untyped-def]
                                            reason) -> None:
    at = attributor(cluster, "n1")
    local = "fd00:10:1:1::10" if ":" in remote else "10.1.1.10"
    at.attribute([flow(FlowKind.EGRESS, local, remote, port, 120),
                  flow(FlowKind.INGRESS, local, remote, port, 3400)], T0)
    t = at.totals()
    assert dict(t.workload_bytes) == {
        WorkloadKey("shop", "web", "Deployment", A, rzone, rkind, crossing, "egress"): 120,
        WorkloadKey("shop", "web", "Deployment", A, rzone, rkind, crossing, "ingress"): 3400,
    }
    assert dict(t.unknown_crossing_bytes) == ({reason: 3520} if reason else {})
    assert not t.skipped_bytes


def test_unresolved_local_pod_still_gets_node_zone(cluster) -> None:  # type: ignore[no-untyped-def]
    at = attributor(cluster, "n1")
    at.attribute([flow(FlowKind.EGRESS, "10.1.1.99", "203.0.113.7", 443, 10)], T0)
    assert dict(at.totals().workload_bytes) == {
        WorkloadKey("unknown", "unknown", "unknown", A, "unknown", "external", "external", "egress"): 10}


def test_unresolved_cluster_peer_treated_as_pod(cluster) -> None:  # type: ignore[no-untyped-def]
    at = attributor(cluster, "n1")
    at.attribute([flow(FlowKind.EGRESS, "10.1.1.10", "10.9.9.9", 8000, 10),
                  flow(FlowKind.INGRESS, "10.1.1.10", "10.9.9.9", 8000, 20)], T0)
    t = at.totals()
    assert dict(t.workload_bytes) == {
        WorkloadKey("shop", "web", "Deployment", A, "unknown", "unknown", "unknown", "egress"): 10}
    assert dict(t.skipped_bytes) == {"pod_peer_ingress": 20}
    assert dict(t.unknown_crossing_bytes) == {"no_pod_for_ip": 10}


# --------------------------------------------------------------------------- exactly once


SCENARIOS = {
    "clusterip_cross_zone": Conn("web-7c9f-abcde", "10.96.0.10", 80, 1200, 64000,
                                 backend="10.1.3.20", bport=8080),
    "clusterip_same_node": Conn("web-7c9f-abcde", "10.96.0.10", 80, 800, 3000,
                                backend="10.1.1.20", bport=8080),
    "clusterip_ipv6": Conn("web-7c9f-abcde", "fd00:96::10", 80, 900, 7000,
                           backend="fd00:10:1:2::20", bport=8080),
    "clusterip_udp": Conn("web-7c9f-abcde", "10.96.0.53", 53, 70, 300,
                          backend="10.1.3.30", bport=5353, proto=17),
    "direct_pod": Conn("web-7c9f-abcde", "10.1.2.20", 8080, 1500, 20000),
    "direct_pod_same_node": Conn("web-7c9f-abcde", "10.1.1.20", 8080, 150, 2000),
    "pod_to_pod": Conn("web-7c9f-abcde", "10.1.3.30", 5432, 4000, 90000),
    "pod_to_pod_same_node": Conn("web-7c9f-abcde", "10.1.1.20", 9999, 40, 50),
    "pod_to_node": Conn("web-7c9f-abcde", "192.168.0.3", 10250, 600, 1800),
    "pod_to_external": Conn("web-7c9f-abcde", "203.0.113.7", 443, 2500, 125000),
    "pod_to_cidr": Conn("web-7c9f-abcde", "172.31.1.5", 5432, 333, 4444),
    "clusterip_host_network": Conn("web-7c9f-abcde", "10.96.0.21", 9100, 210, 51000,
                                   backend="192.168.0.2", bport=9100),
    "direct_host_network": Conn("web-7c9f-abcde", "192.168.0.3", 9100, 190, 47000),
    "host_network_client": Conn("node:n2", "10.1.3.20", 8080, 560, 7100),
    "host_network_client_clusterip": Conn("node:n2", "10.96.0.10", 80, 77, 880,
                                          backend="10.1.3.20", bport=8080),
    "server_replies_from_pod_to_pod": Conn("db-0", "10.1.1.10", 7000, 11, 22),
    "clusterip_selectorless_cidr": Conn("web-7c9f-abcde", "10.96.0.40", 5432, 640, 9900,
                                        backend="172.31.1.6", bport=5432),
    "clusterip_selectorless_external": Conn("web-7c9f-abcde", "10.96.0.41", 443, 123, 4567,
                                            backend="203.0.113.51", bport=443),
    "direct_selectorless_cidr": Conn("web-7c9f-abcde", "172.31.1.6", 5432, 1, 2),
    # a load balancer's address as the client (docs/attribution.md, "Two hops of NodePort
    # and LoadBalancer traffic"): IP-mode targets, or a NodePort with externalTrafficPolicy
    # Local (no SNAT): the endpoint sees the load balancer's own address
    "load_balancer_ip_mode": Conn("172.31.128.9", "10.1.3.20", 8080, 5000, 90000),
    "load_balancer_ip_mode_ipv6": Conn("fd00:172:31::9", "fd00:10:1:2::20", 8080, 700, 9000),
    # externalTrafficPolicy Cluster: the receiving node n1 masqueraded the hop to its address
    "nodeport_cluster_second_hop": Conn("node:n1", "10.1.3.20", 8080, 320, 4100),
}


def run(conns: list[Conn], behind: frozenset[str] = frozenset(),
        sockets: bool = False, egress_backend: bool = False,
        socket_nodes: frozenset[str] = frozenset()) -> dict[str, Attributor]:
    """One Attributor per node fed what the kernel model counted; ``behind``: nodes whose
    kernel endpoint map is still empty; ``sockets``: the cgroup hook on every node
    (``egress_backend``: host sockets unconnected, see Model); ``socket_nodes``: the
    cgroup hook on these nodes only, the veth hook on the others (a mixed cluster)."""
    o = objects()
    meta, hints = build(o)
    model = Model(meta, o, kernel_behind=behind, sockets=sockets, egress_backend=egress_backend,
                  socket_nodes=socket_nodes)
    for c in conns:
        model.send(c)
    out = {}
    for node in ("n1", "n2", "n3"):
        out[node] = Attributor(node, meta, hints, sockets_seen=sockets or node in socket_nodes)
        out[node].attribute(model.deltas.get(node, []), T0)
    assert set(model.deltas) <= set(out)
    return out


@pytest.mark.parametrize("sockets", [False, True], ids=["veth", "cgroup"])
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_each_byte_counted_once_cluster_wide(name: str, sockets: bool) -> None:
    c = SCENARIOS[name]
    agents = run([c], sockets=sockets)
    totals = [a.totals() for a in agents.values()]
    assert sum(accounted(t) for t in totals) == c.req + c.resp
    for t in totals:  # per node, every byte seen is either counted or a known copy
        assert t.bytes_seen == accounted(t) + sum(t.skipped_bytes.values())


#: traffic only the socket view (the cgroup hook on every node) sees, or sees whole: the
#: veth view loses the host-network share of a mixed ClusterIP and never sees host to host
SOCKET_SCENARIOS = {
    "clusterip_mixed_to_host_network": Conn("web-7c9f-abcde", "10.96.0.30", 9100, 300, 7000,
                                            backend="192.168.0.3", bport=9100),
    "clusterip_mixed_to_pod": Conn("web-7c9f-abcde", "10.96.0.30", 9100, 310, 7100,
                                   backend="10.1.2.60", bport=9100),
    "host_to_host_cross_zone": Conn("node:n1", "192.168.0.3", 10250, 500, 900),
    "host_client_clusterip_to_host_network": Conn("node:n1", "10.96.0.21", 9100, 50, 6000,
                                                  backend="192.168.0.2", bport=9100),
    # a load balancer straight to a host-network server (an ingress controller on the node's
    # port): no veth on either side, only sockets see it
    "load_balancer_to_host_network": Conn("172.31.128.9", "192.168.0.3", 9100, 410, 8200),
    # a host process calls a selector-less Service whose endpoint is a managed database
    "host_client_clusterip_selectorless_cidr": Conn("node:n1", "10.96.0.40", 5432, 60, 700,
                                                    backend="172.31.1.6", bport=5432),
}


@pytest.mark.parametrize("egress_backend", [False, True], ids=["connected", "unconnected"])
@pytest.mark.parametrize("name", sorted({**SCENARIOS, **SOCKET_SCENARIOS}))
def test_socket_view_counts_each_byte_once_and_loses_no_host_network_share(
        name: str, egress_backend: bool) -> None:
    c = {**SCENARIOS, **SOCKET_SCENARIOS}[name]
    totals = [a.totals() for a in run([c], sockets=True, egress_backend=egress_backend).values()]
    assert sum(accounted(t) for t in totals) == c.req + c.resp
    for t in totals:
        assert t.bytes_seen == accounted(t) + sum(t.skipped_bytes.values())
        assert "clusterip_mixed_host_network" not in t.skipped_bytes


#: a cluster on two hooks (docs/datapath.md, "A cluster on two hooks"): what the whole
#: cluster counts of each scenario's request and response bytes, (request x, response x),
#: when the client's node n1 is on the veth hook and n2..n3 on the cgroup hook, and the
#: other way round. Everything not listed is counted once either way.
MIXED = {
    # a Service whose endpoints are all host-network: the veth client counts it (no agent
    # sees the server side on the veth hook), a cgroup server counts it too; a cgroup
    # client skips its copy and a veth server cannot see it
    "clusterip_host_network": ((2, 2), (0, 0)),
    "direct_host_network": ((2, 2), (0, 0)),
    # a ClusterIP mixing pod and host-network endpoints: the veth client drops its copy
    # (clusterip_mixed_host_network) as always, so only the host-network server's hook counts
    "clusterip_mixed_to_host_network": ((1, 1), (0, 0)),
    "host_client_clusterip_to_host_network": ((1, 1), (0, 0)),
    # host processes, no Service: the cgroup node keeps only its own sockets' egress, the
    # veth node sees no host socket at all, or a pod's both directions with a node
    "host_to_host_cross_zone": ((0, 1), (1, 0)),
    "pod_to_node": ((1, 2), (1, 0)),
    # a load balancer to a host-network server on n3: only a cgroup n3 sees it
    "load_balancer_to_host_network": ((1, 1), (0, 0)),
    # a host process on n1 to a managed database behind a ClusterIP: only a cgroup n1
    # sees its socket (no agent sees the database's side)
    "host_client_clusterip_selectorless_cidr": ((0, 0), (1, 1)),
}


@pytest.mark.parametrize("name", sorted({**SCENARIOS, **SOCKET_SCENARIOS}))
def test_a_cluster_on_two_hooks_doubles_or_loses_exactly_the_listed_bytes(name: str) -> None:
    c = {**SCENARIOS, **SOCKET_SCENARIOS}[name]
    veth_client, cgroup_client = MIXED.get(name, ((1, 1), (1, 1)))
    for socket_nodes, (rq, rs) in ((frozenset({"n2", "n3"}), veth_client),
                                   (frozenset({"n1"}), cgroup_client)):
        totals = [a.totals() for a in run([c], socket_nodes=socket_nodes).values()]
        assert sum(accounted(t) for t in totals) == rq * c.req + rs * c.resp, (name, socket_nodes)
        # per node, every byte seen is still counted or a known copy: nothing disappears
        # inside an agent; what is wrong is which agent saw what
        for t in totals:
            assert t.bytes_seen == accounted(t) + sum(t.skipped_bytes.values())


def test_socket_view_counts_host_network_endpoints_at_their_own_node() -> None:
    agents = run([SOCKET_SCENARIOS["clusterip_mixed_to_host_network"]], sockets=True)
    t = {n: a.totals() for n, a in agents.items()}
    # the client's copy (to the ClusterIP) is skipped, the endpoint's node counts it
    assert dict(t["n1"].skipped_bytes) == {"clusterip_client_copy": 7300}
    assert not t["n1"].service_bytes
    # 192.168.0.3:9100 backs two Services: the first by name gets it (Service ambiguity)
    assert {(k.namespace, k.service, k.direction, k.crossing): v
            for k, v in t["n3"].service_bytes.items()} == {
        ("monitoring", "node-exporter", "request", "cross_zone"): 300,
        ("monitoring", "node-exporter", "response", "cross_zone"): 7000}


def _by_class(agents: dict[str, Attributor]) -> dict[tuple[str, str, str, str, str], int]:
    """Service bytes of every agent by (node, service, client_kind, lb_type, crossing)."""
    out: dict[tuple[str, str, str, str, str], int] = {}
    for node, a in agents.items():
        for k, v in a.totals().service_bytes.items():
            key = (node, k.service, k.client_kind, k.lb_type, k.crossing)
            out[key] = out.get(key, 0) + v
    return out


@pytest.mark.parametrize("sockets", [False, True], ids=["veth", "cgroup"])
def test_client_classes_of_load_balancer_and_node_hops(sockets: bool) -> None:
    # an ALB in zone a sends to api on n3 (zone b); an NLB in zone b to api on n2 over IPv6;
    # a NodePort hop masqueraded by n1 reaches api on n3: each counted once, at the
    # endpoint's node, in its own class; load balancers are never judged hint-ignored
    names = ("load_balancer_ip_mode", "load_balancer_ip_mode_ipv6", "nodeport_cluster_second_hop")
    conns = [SCENARIOS[n] for n in names]
    agents = run(conns, sockets=sockets)
    alb, nlb, hop = conns
    assert _by_class(agents) == {
        ("n3", "api", "load-balancer", "aws-alb", "cross_zone"): alb.req + alb.resp,
        ("n2", "api", "load-balancer", "aws-nlb", "cross_zone"): nlb.req + nlb.resp,
        ("n3", "api", "node", "none", "cross_zone"): hop.req + hop.resp,
    }
    ignored = {k: v for a in agents.values() for k, v in a.totals().hint_ignored_bytes.items()}
    # only the node hop is judged (n1's kube-proxy selects zone a's endpoints)
    assert ignored == {HintIgnoredKey("shop", "api", A, B, "n1", "node"): hop.req + hop.resp}
    zones = {(k.client_zone, k.server_zone) for a in agents.values() for k in a.totals().service_bytes
             if k.client_kind == "load-balancer"}
    assert zones == {(A, B), (B, A)}


def test_socket_view_classes_load_balancer_and_host_clients() -> None:
    lb = SOCKET_SCENARIOS["load_balancer_to_host_network"]
    db = SOCKET_SCENARIOS["host_client_clusterip_selectorless_cidr"]
    agents = run([lb, db], sockets=True)
    assert _by_class(agents) == {
        # the host-network server counts its load balancer client at its own node
        ("n3", "node-exporter", "load-balancer", "aws-alb", "cross_zone"): lb.req + lb.resp,
        # a host process's call to a managed database, counted at the client: class node
        ("n1", "rds", "node", "none", "cross_zone"): db.req + db.resp,
    }


def test_workload_remote_kind_and_pair_class_of_a_load_balancer(cluster) -> None:  # type: ignore[no-untyped-def]
    at = attributor(cluster, "n1")
    # web dials an internal load balancer in zone a (its own zone), and one in zone b (v6)
    at.attribute([flow(FlowKind.EGRESS, "10.1.1.10", "172.31.128.7", 443, 100),
                  flow(FlowKind.INGRESS, "10.1.1.10", "172.31.128.7", 443, 900),
                  flow(FlowKind.EGRESS, "fd00:10:1:1::10", "fd00:172:31::7", 443, 30)], T0)
    at.close_interval(T0 + 10)
    t = at.totals()
    assert dict(t.workload_bytes) == {
        WorkloadKey("shop", "web", "Deployment", A, A, "load-balancer", "same_zone", "egress"): 100,
        WorkloadKey("shop", "web", "Deployment", A, A, "load-balancer", "same_zone", "ingress"): 900,
        WorkloadKey("shop", "web", "Deployment", A, B, "load-balancer", "cross_zone", "egress"): 30,
    }
    # the pod is the client of both connections: its class, not the load balancer's
    assert {(p.server, p.client_kind, p.lb_type) for p in t.top_pairs} == {
        ("172.31.128.7", "pod", "none"), ("fd00:172:31::7", "pod", "none")}
    # a load balancer as client of a Service: the pair row names its class and type
    at3 = attributor(cluster, "n3")
    at3.attribute([req("10.1.3.20", "172.31.128.9", 8080, 50)], T0)
    at3.close_interval(T0 + 10)
    assert [(p.client, p.client_kind, p.lb_type) for p in at3.totals().top_pairs] == [
        ("172.31.128.9", "load-balancer", "aws-alb")]


def test_socket_view_counts_host_to_host_at_the_sender() -> None:
    agents = run([SOCKET_SCENARIOS["host_to_host_cross_zone"]], sockets=True)
    t = {n: a.totals() for n, a in agents.items()}
    assert {(k.direction, k.crossing): v for k, v in t["n1"].workload_bytes.items()} == {
        ("egress", "cross_zone"): 500}
    assert {(k.direction, k.crossing): v for k, v in t["n3"].workload_bytes.items()} == {
        ("egress", "cross_zone"): 900}
    assert dict(t["n1"].skipped_bytes) == {"pod_peer_ingress": 900}


def test_all_scenarios_together_once_and_in_the_right_series() -> None:
    conns = list(SCENARIOS.values())
    agents = run(conns)
    t = {n: a.totals() for n, a in agents.items()}
    assert sum(accounted(x) for x in t.values()) == sum(c.req + c.resp for c in conns)

    def service(ns: str, svc: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for x in t.values():
            for k, v in x.service_bytes.items():
                if (k.namespace, k.service) == (ns, svc):
                    out[k.direction] = out.get(k.direction, 0) + v
        return out

    api = [SCENARIOS[s] for s in ("clusterip_cross_zone", "clusterip_same_node", "clusterip_ipv6",
                                  "direct_pod", "direct_pod_same_node", "host_network_client",
                                  "host_network_client_clusterip", "load_balancer_ip_mode",
                                  "load_balancer_ip_mode_ipv6", "nodeport_cluster_second_hop")]
    assert service("shop", "api") == {"request": sum(c.req for c in api),
                                      "response": sum(c.resp for c in api)}
    dns = SCENARIOS["clusterip_udp"]
    assert service("shop", "dns") == {"request": dns.req, "response": dns.resp}
    hn = [SCENARIOS["clusterip_host_network"], SCENARIOS["direct_host_network"]]
    # 192.168.0.2:9100 backs exporter-n2 and node-exporter: first by name is exporter-n2;
    # 192.168.0.3:9100 backs monitoring/node-exporter and shop/mixed: monitoring first.
    assert service("monitoring", "exporter-n2") == {"request": hn[0].req, "response": hn[0].resp}
    assert service("monitoring", "node-exporter") == {"request": hn[1].req, "response": hn[1].resp}
    rds = [SCENARIOS["clusterip_selectorless_cidr"], SCENARIOS["direct_selectorless_cidr"]]
    assert service("shop", "rds") == {"request": sum(c.req for c in rds),
                                      "response": sum(c.resp for c in rds)}
    assert t["n1"].service_bytes[ServiceKey("shop", "rds", "5432", A, B, "cross_zone", "request", "pod", "none")] == 641
    partner = SCENARIOS["clusterip_selectorless_external"]
    assert t["n1"].service_bytes[ServiceKey("shop", "partner", "443", A, "unknown", "external",
                                            "response", "pod", "none")] == partner.resp
    nonsvc = [SCENARIOS[s] for s in ("pod_to_pod", "pod_to_pod_same_node", "pod_to_node",
                                     "pod_to_external", "pod_to_cidr",
                                     "server_replies_from_pod_to_pod")]
    assert sum(sum(x.workload_bytes.values()) for x in t.values()) == sum(c.req + c.resp for c in nonsvc)
    # zone a -> api in zone b: counted on n3 only (web on n1, and node n2 twice)
    # by client class: the pod's, and the host-network clients' (their node's address)
    node_clients = [SCENARIOS[s] for s in ("host_network_client", "host_network_client_clusterip",
                                           "nodeport_cluster_second_hop")]
    assert t["n3"].service_bytes[ServiceKey("shop", "api", "80", A, B, "cross_zone", "response",
                                            "pod", "none")] == SCENARIOS["clusterip_cross_zone"].resp
    assert t["n3"].service_bytes[ServiceKey("shop", "api", "80", A, B, "cross_zone", "response",
                                            "node", "none")] == sum(c.resp for c in node_clients)
    assert not any(k.service == "api" for k in t["n1"].service_bytes if k.crossing == "cross_zone")


@pytest.mark.parametrize("behind", [frozenset({"n1"}), frozenset({"n2"}), frozenset({"n3"}),
                                    frozenset({"n1", "n2", "n3"})])
def test_endpoint_missing_from_kernel_is_still_service_traffic(behind: frozenset[str]) -> None:
    # a node whose kernel endpoint map is empty (new pod, agent restart, API outage) counts
    # its endpoints' traffic as ingress/egress with the pod's port: attribution must give
    # the same series as when the kernel knew them, and count the bytes exactly once
    conns = list(SCENARIOS.values())
    exact = {n: a.totals() for n, a in run(conns).items()}
    late = {n: a.totals() for n, a in run(conns, behind).items()}
    for n in exact:
        assert dict(late[n].service_bytes) == dict(exact[n].service_bytes), n
        assert dict(late[n].workload_bytes) == dict(exact[n].workload_bytes), n
        assert dict(late[n].hint_ignored_bytes) == dict(exact[n].hint_ignored_bytes), n
        assert dict(late[n].unattributed_bytes) == dict(exact[n].unattributed_bytes), n
    promoted = sum(late[n].diagnostics_bytes.get("endpoint_not_in_kernel", 0) for n in behind)
    o = objects()
    model = Model(build(o)[0], o)
    expected = 0
    for c in conns:  # bytes to a veth endpoint (EndpointSlice address and port) on a node behind
        node, addr, veth = model._pod(c.backend or c.dst)
        port = c.bport if c.bport is not None else c.dport
        if node in behind and veth and (addr, port, c.proto) in model._local_endpoints(node):
            expected += c.req + c.resp
    assert promoted == expected > 0
    assert not any(exact[n].diagnostics_bytes.get("endpoint_not_in_kernel") for n in exact)


def test_local_port_of_a_non_endpoint_stays_pod_traffic(cluster) -> None:  # type: ignore[no-untyped-def]
    # db-0 (10.1.3.30) serves 5432 outside any Service: the local port is kept by the
    # kernel but the traffic stays the pod's own (egress counted, ingress a pod copy)
    at = attributor(cluster, "n3")
    at.attribute([FlowDelta(FlowKind.INGRESS, ip("10.1.3.30"), ip("10.1.1.10"), 0, 6, 400, 1,
                            local_port=5432),
                  FlowDelta(FlowKind.EGRESS, ip("10.1.3.30"), ip("10.1.1.10"), 0, 6, 9000, 1,
                            local_port=5432)], T0)
    t = at.totals()
    assert not t.service_bytes
    assert sum(t.workload_bytes.values()) == 9000
    assert dict(t.skipped_bytes) == {"pod_peer_ingress": 400}
    assert "endpoint_not_in_kernel" not in t.diagnostics_bytes


def test_late_endpoint_held_delta_counts_its_diagnostic_once(cluster) -> None:  # type: ignore[no-untyped-def]
    # a late-endpoint request from an unresolved client is held, then counted once
    at = attributor(cluster, "n3", hold_unresolved_seconds=30)
    d = FlowDelta(FlowKind.INGRESS, ip("10.1.3.20"), ip("10.1.1.99"), 0, 6, 700, 1,
                  local_port=8080)
    at.attribute([d], T0)
    assert at.totals().held_bytes == 700
    at.attribute([], T0 + 5)
    at.attribute([], T0 + 31)
    t = at.totals()
    assert sum(t.service_bytes.values()) == 700 and t.held_bytes == 0
    assert t.diagnostics_bytes["endpoint_not_in_kernel"] == 700


def test_clusterip_to_host_network_endpoints_in_several_zones_is_unknown(cluster) -> None:  # type: ignore[no-untyped-def]
    # monitoring/node-exporter: both endpoints host-network (n2 zone a, n3 zone b), no hints
    at = attributor(cluster, "n1")
    at.attribute([flow(FlowKind.EGRESS, "10.1.1.10", "10.96.0.20", 9100, 90),
                  flow(FlowKind.INGRESS, "10.1.1.10", "10.96.0.20", 9100, 900)], T0)
    t = at.totals()
    assert dict(t.service_bytes) == {
        ServiceKey("monitoring", "node-exporter", "9100", A, "unknown", "unknown", "request", "pod", "none"): 90,
        ServiceKey("monitoring", "node-exporter", "9100", A, "unknown", "unknown", "response", "pod", "none"): 900,
    }
    assert dict(t.unknown_crossing_bytes) == {"clusterip_to_host_network_endpoint": 990}


def test_clusterip_with_mixed_host_network_endpoints_is_skipped_and_reported(cluster) -> None:  # type: ignore[no-untyped-def]
    at = attributor(cluster, "n1")
    at.attribute([flow(FlowKind.EGRESS, "10.1.1.10", "10.96.0.30", 9100, 5)], T0)
    t = at.totals()
    assert dict(t.skipped_bytes) == {"clusterip_mixed_host_network": 5}
    assert not t.service_bytes and not t.workload_bytes


# --------------------------------------------------------------------------- hint-ignored


def test_node_ignoring_hints_counts_hint_ignored_bytes() -> None:
    # kube-proxy on n1 (zone a) selects the zone-a endpoints of shop/api; a data plane that
    # ignores hints sends the connection to 10.1.3.20 in zone b anyway
    ignoring = Conn("web-7c9f-abcde", "10.96.0.10", 80, 1000, 30000, backend="10.1.3.20", bport=8080)
    honouring = Conn("web-7c9f-abcde", "10.96.0.10", 80, 2000, 40000, backend="10.1.2.20", bport=8080)
    bypass = Conn("web-7c9f-abcde", "10.1.3.20", 8080, 10, 20)   # dials the pod directly
    no_hints = Conn("web-7c9f-abcde", "10.96.0.53", 53, 5, 7, backend="10.1.3.30", bport=5353, proto=17)
    from_b = Conn("web-7c9f-fghij", "10.96.0.10", 80, 3, 4, backend="10.1.3.20", bport=8080)
    agents = run([ignoring, honouring, bypass, no_hints, from_b])
    ignored: dict[HintIgnoredKey, int] = {}
    for a in agents.values():
        for k, v in a.totals().hint_ignored_bytes.items():
            ignored[k] = ignored.get(k, 0) + v
    assert ignored == {HintIgnoredKey("shop", "api", A, B, "n1", "pod"): 1000 + 30000 + 10 + 20}
    # the client's node's evidence: its pod used the ClusterIP, and dialled 10.1.3.20
    # (outside n1's selection) directly; shop/dns is not filtered by topology: no series
    paths = {(k.client_node, k.service, k.path): v for a in agents.values()
             for k, v in a.totals().client_path_bytes.items()}
    assert paths == {("n1", "api", "clusterip"): 1000 + 30000 + 2000 + 40000,
                     ("n1", "api", "direct"): 10 + 20, ("n3", "api", "clusterip"): 3 + 4}


def test_hint_check_skipped_when_client_node_unknown(cluster) -> None:  # type: ignore[no-untyped-def]
    at = attributor(cluster, "n3")
    at.attribute([req("10.1.3.20", "10.9.9.9", 8080, 64)], T0)
    t = at.totals()
    assert not t.hint_ignored_bytes
    assert dict(t.diagnostics_bytes) == {"hint_check_client_node_unknown": 64}


def test_host_network_client_judged_by_its_node(cluster) -> None:  # type: ignore[no-untyped-def]
    at = attributor(cluster, "n3")
    # node n1 (zone a) dials api: n1's kube-proxy selects zone-a endpoints only
    at.attribute([req("10.1.3.20", "192.168.0.1", 8080, 64)], T0)
    assert dict(at.totals().hint_ignored_bytes) == {HintIgnoredKey("shop", "api", A, B, "n1", "node"): 64}


# --------------------------------------------------------------------------- overflow, bad input


def test_overflow_counted_as_flow_table_full(cluster) -> None:  # type: ignore[no-untyped-def]
    at = attributor(cluster, "n1")
    zero4 = "0.0.0.0"
    at.attribute([FlowDelta(FlowKind.REQUEST, ip(zero4), ip(zero4), 0, 0, 5000, 4, overflow=True),
                  FlowDelta(FlowKind.EGRESS, ip("::"), ip("::"), 0, 0, 700, 1, overflow=True)], T0)
    t = at.totals()
    assert dict(t.unattributed_bytes) == {"flow_table_full": 5700}
    assert dict(t.diagnostics_bytes) == {"flow_table_full_unfiltered": 700}
    assert t.bytes_seen == 5700


def test_negative_delta_ignored_and_counted(cluster) -> None:  # type: ignore[no-untyped-def]
    at = attributor(cluster, "n1")
    at.attribute([flow(FlowKind.EGRESS, "10.1.1.10", "203.0.113.7", 443, -5),
                  flow(FlowKind.EGRESS, "10.1.1.10", "203.0.113.7", 443, 5)], T0)
    t = at.totals()
    assert t.invalid_deltas == 1 and t.deltas_seen == 2 and t.bytes_seen == 5
    assert sum(t.workload_bytes.values()) == 5


def test_bad_arguments_rejected(cluster) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError):
        attributor(cluster, "n1", pair_capacity=0)


# --------------------------------------------------------------------------- monotonic, immutable


def test_totals_are_cumulative_monotonic_and_immutable(cluster) -> None:  # type: ignore[no-untyped-def]
    at = attributor(cluster, "n3")
    batch = [req("10.1.3.20", "10.1.1.10", 8080, 100), flow(FlowKind.EGRESS, "10.1.3.30", "172.31.1.5", 5432, 7)]
    at.attribute(batch, T0)
    first = at.totals()
    at.attribute(batch, T0 + 10)
    at.attribute([], T0 + 20)
    second = at.totals()
    assert first.service_bytes[ServiceKey("shop", "api", "80", A, B, "cross_zone", "request", "pod", "none")] == 100
    assert second.service_bytes[ServiceKey("shop", "api", "80", A, B, "cross_zone", "request", "pod", "none")] == 200
    for name in ("service_bytes", "workload_bytes", "hint_ignored_bytes"):
        a, b = getattr(first, name), getattr(second, name)
        assert all(b[k] >= v for k, v in a.items())
    with pytest.raises(TypeError):
        first.service_bytes[ServiceKey("x", "y", "1", A, A, "same_zone", "request", "pod", "none")] = 1  # type: ignore[index]
    assert second.deltas_seen == 4 and second.bytes_seen == 214


# --------------------------------------------------------------------------- top pairs


def test_top_pairs_ranked_bounded_and_per_interval(cluster) -> None:  # type: ignore[no-untyped-def]
    at = attributor(cluster, "n3", top_n=1, pair_capacity=2)
    at.attribute([req("10.1.3.20", "10.1.1.10", 8080, 100),
                  req("10.1.3.20", "10.1.1.10", 8080, 50, FlowKind.RESPONSE),
                  req("10.1.3.20", "10.1.4.40", 8080, 400),
                  req("10.1.3.20", "203.0.113.7", 8080, 30)], T0)  # third pair: over capacity
    at.close_interval(T0 + 10)
    t = at.totals()
    assert t.top_interval == (T0, T0 + 10)
    assert t.top_pairs == (
        PairRow("shop/worker-x", "shop/api-5d8b-ccccc", "shop", "api", US, B, "cross_region", 400,
                port="80", client_kind="pod"),
        PairRow("other", "other", "", "", "unknown", "unknown", "unknown", 150 + 30),
    )
    at.close_interval(T0 + 20)
    assert at.totals().top_pairs == ()  # a new interval without traffic
    assert sum(at.totals().service_bytes.values()) == 580  # cumulative totals untouched


def test_ipv4_and_ipv6_with_equal_integer_values_are_kept_apart(cluster) -> None:  # type: ignore[no-untyped-def]
    # ::c0a8:3 has the integer value of 192.168.0.3 (node n3): it must not resolve as n3
    at = attributor(cluster, "n1")
    at.attribute([flow(FlowKind.EGRESS, "10.1.1.10", "192.168.0.3", 10250, 5),
                  flow(FlowKind.EGRESS, "fd00:10:1:1::10", "::c0a8:3", 10250, 7)], T0)
    assert dict(at.totals().workload_bytes) == {
        WorkloadKey("shop", "web", "Deployment", A, B, "node", "cross_zone", "egress"): 5,
        WorkloadKey("shop", "web", "Deployment", A, "unknown", "external", "external", "egress"): 7,
    }


def test_failing_lookup_counts_the_delta_and_the_batch_goes_on(cluster, caplog) -> None:  # type: ignore[no-untyped-def]
    meta, hints = cluster

    class Broken:
        def __init__(self) -> None:
            self.calls = 0

        def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
            return getattr(meta, name)

        def resolve(self, ip_, at):  # type: ignore[no-untyped-def]
            if str(ip_) == "10.1.4.40":
                self.calls += 1
                raise KeyError("index rebuilt under us")
            return meta.resolve(ip_, at)

    broken = Broken()
    at = Attributor("n3", broken, hints)  # type: ignore[arg-type]
    at.attribute([req("10.1.3.20", "10.1.4.40", 8080, 11),
                  req("10.1.3.20", "10.1.4.40", 8080, 12, FlowKind.RESPONSE),
                  req("10.1.3.20", "10.1.1.10", 8080, 13)], T0)
    t = at.totals()
    assert dict(t.unattributed_bytes) == {"attribution_error": 23}
    assert sum(t.service_bytes.values()) == 13
    assert t.bytes_seen == accounted(t) + sum(t.skipped_bytes.values())
    assert broken.calls == 2
    assert sum("attribution lookup failed" in r.getMessage() for r in caplog.records) == 1


# --------------------------------------------------------------------------- holding unresolved


def _learn_pod(meta, addr: str, node_name: str, name: str) -> None:  # type: ignore[no-untyped-def]
    from agent.records import Peer, PeerKind
    n = meta.nodes[node_name]
    meta.by_ip[ip(addr)] = Peer(PeerKind.POD, zone=n.zone, region=n.region, node=node_name,
                                namespace="shop", name=name, workload="late", workload_kind="Deployment")


def test_unresolved_client_held_until_metadata_arrives(cluster) -> None:  # type: ignore[no-untyped-def]
    meta, hints = cluster
    at = Attributor("n3", meta, hints, hold_unresolved_seconds=30)
    at.attribute([req("10.1.3.20", "10.1.2.99", 8080, 100),
                  req("10.1.3.20", "10.1.1.10", 8080, 5)], T0)
    t = at.totals()
    assert t.held_bytes == 100 and sum(t.service_bytes.values()) == 5
    assert t.bytes_seen == accounted(t) + sum(t.skipped_bytes.values()) + t.held_bytes
    _learn_pod(meta, "10.1.2.99", "n2", "late-1")   # the watch catches up
    at.attribute([], T0 + 10)
    t = at.totals()
    assert t.held_bytes == 0
    assert t.service_bytes[ServiceKey("shop", "api", "80", A, B, "cross_zone", "request", "pod", "none")] == 105
    assert not t.unknown_crossing_bytes
    assert t.bytes_seen == accounted(t) + sum(t.skipped_bytes.values())


def test_unresolved_counted_as_unknown_after_the_hold(cluster) -> None:  # type: ignore[no-untyped-def]
    meta, hints = cluster
    at = Attributor("n1", meta, hints, hold_unresolved_seconds=30)
    at.attribute([flow(FlowKind.EGRESS, "10.1.1.77", "203.0.113.7", 443, 40),   # local pod unknown
                  flow(FlowKind.EGRESS, "10.1.1.10", "10.9.9.9", 80, 30),       # remote pod unknown
                  flow(FlowKind.INGRESS, "10.1.1.10", "10.9.9.9", 80, 20)], T0)  # skipped anyway
    assert at.totals().held_bytes == 70
    at.attribute([], T0 + 10)
    assert at.totals().held_bytes == 70        # still unresolved, still within the hold
    at.attribute([], T0 + 30)
    t = at.totals()
    assert t.held_bytes == 0
    assert dict(t.workload_bytes) == {
        WorkloadKey("unknown", "unknown", "unknown", A, "unknown", "external", "external", "egress"): 40,
        WorkloadKey("shop", "web", "Deployment", A, "unknown", "unknown", "unknown", "egress"): 30,
    }
    assert dict(t.skipped_bytes) == {"pod_peer_ingress": 20}
    assert t.bytes_seen == accounted(t) + sum(t.skipped_bytes.values())


def test_hold_is_bounded(cluster) -> None:  # type: ignore[no-untyped-def]
    meta, hints = cluster
    at = Attributor("n3", meta, hints, hold_unresolved_seconds=30, hold_capacity=1)
    at.attribute([req("10.1.3.20", "10.1.2.98", 8080, 7), req("10.1.3.20", "10.1.2.99", 8080, 9)], T0)
    t = at.totals()
    assert t.held_bytes == 7
    assert dict(t.unknown_crossing_bytes) == {"no_pod_for_ip": 9}
    assert dict(t.diagnostics_bytes) == {"hold_full": 9, "hint_check_client_node_unknown": 9}


def test_failing_own_node_lookup_keeps_the_batch(cluster) -> None:  # type: ignore[no-untyped-def]
    meta, hints = cluster

    class NoNodes:
        def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
            return getattr(meta, name)

        def node(self, name: str):  # type: ignore[no-untyped-def]
            raise ConnectionError("cache restarting")

    at = Attributor("n3", NoNodes(), hints)  # type: ignore[arg-type]
    at.attribute([req("10.1.3.20", "10.1.1.10", 8080, 9)], T0)
    t = at.totals()
    # server zone unknown (this node's labels unavailable), the bytes still counted once
    assert dict(t.service_bytes) == {
        ServiceKey("shop", "api", "80", A, "unknown", "unknown", "request", "pod", "none"): 9}
    assert dict(t.unknown_crossing_bytes) == {"node_without_zone": 9}


def test_totals_to_json_round_trips_through_json(cluster) -> None:  # type: ignore[no-untyped-def]
    import json
    at = attributor(cluster, "n3")
    at.attribute([req("10.1.3.20", "10.1.1.10", 8080, 100),
                  flow(FlowKind.EGRESS, "10.1.3.30", "203.0.113.7", 443, 5)], T0)
    at.close_interval(T0 + 10)
    doc = json.loads(json.dumps(at.totals().to_json()))
    assert doc["service_bytes"] == [{"namespace": "shop", "service": "api", "port": "80",
                                     "client_zone": A, "server_zone": B, "crossing": "cross_zone",
                                     "direction": "request", "client_kind": "pod",
                                     "lb_type": "none", "bytes": 100}]
    assert doc["workload_bytes"][0]["workload"] == "db" and doc["workload_bytes"][0]["bytes"] == 5
    assert doc["top_pairs"][0] == {"client": "shop/web-7c9f-abcde", "server": "shop/api-5d8b-ccccc",
                                   "namespace": "shop", "service": "api", "client_zone": A,
                                   "server_zone": B, "crossing": "cross_zone", "bytes": 100,
                                   "port": "80", "client_kind": "pod", "lb_type": "none"}
    assert doc["top_interval"] == [T0, T0 + 10]
    assert "locality" not in doc  # the hint model's (tests/unit/hints/test_model_locality.py)


def test_close_interval_never_asks_the_hint_view(cluster) -> None:  # type: ignore[no-untyped-def]
    # locality is the hint model's now: a hint view that cannot list its Services does not
    # stop the interval from closing
    meta, hints = cluster
    at = Attributor("n1", meta, hints)
    at.close_interval(T0)

    def broken() -> list[tuple[str, str]]:
        raise RuntimeError("model rebuilding")

    hints.services = broken
    at.close_interval(T0 + 10)
    assert at.totals().top_interval == (T0, T0 + 10)


def test_hostnet_decision_not_kept_while_endpoints_unresolved(cluster) -> None:  # type: ignore[no-untyped-def]
    meta, hints = cluster
    from agent.records import Peer, PeerKind

    class Syncing:
        synced = False

        def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
            return getattr(meta, name)

        def resolve(self, ip_, at):  # type: ignore[no-untyped-def]
            if not self.synced and str(ip_).startswith("192.168."):
                return Peer(PeerKind.UNKNOWN, reason="no_pod_for_ip")
            return meta.resolve(ip_, at)

    view = Syncing()
    at = Attributor("n1", view, hints)  # type: ignore[arg-type]
    # web on n1 -> exporter-n2 ClusterIP, whose only endpoint is host-network on n2
    delta = flow(FlowKind.EGRESS, "10.1.1.10", "10.96.0.21", 9100, 50)
    at.attribute([delta], T0)
    assert dict(at.totals().skipped_bytes) == {"clusterip_client_copy": 50}  # looks like a pod
    view.synced = True
    at.attribute([delta], T0 + 10)   # well within HOSTNET_TTL: decided again all the same
    assert dict(at.totals().service_bytes) == {
        ServiceKey("monitoring", "exporter-n2", "9100", A, A, "same_zone", "request", "pod", "none"): 50}


def test_clusterip_copy_held_while_its_endpoints_are_unresolved(cluster) -> None:  # type: ignore[no-untyped-def]
    meta, hints = cluster
    from agent.records import Peer, PeerKind

    class Syncing:
        synced = False

        def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
            return getattr(meta, name)

        def resolve(self, ip_, at):  # type: ignore[no-untyped-def]
            if not self.synced and str(ip_).startswith("192.168."):
                return Peer(PeerKind.UNKNOWN, reason="no_pod_for_ip")
            return meta.resolve(ip_, at)

    view = Syncing()
    at = Attributor("n1", view, hints, hold_unresolved_seconds=30)  # type: ignore[arg-type]
    at.attribute([flow(FlowKind.EGRESS, "10.1.1.10", "10.96.0.21", 9100, 50),
                  flow(FlowKind.EGRESS, "10.1.1.10", "10.96.0.10", 80, 8)], T0)  # api: pods
    t = at.totals()
    assert t.held_bytes == 50 and dict(t.skipped_bytes) == {"clusterip_client_copy": 8}
    view.synced = True
    at.attribute([], T0 + 10)
    t = at.totals()
    assert t.held_bytes == 0
    assert dict(t.service_bytes) == {
        ServiceKey("monitoring", "exporter-n2", "9100", A, A, "same_zone", "request", "pod", "none"): 50}


def test_non_canonical_selected_addresses_are_not_hint_ignored(cluster) -> None:  # type: ignore[no-untyped-def]
    from agent.records import ProxyView
    meta, hints = cluster

    class Spelled:
        def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
            return getattr(hints, name)

        def proxy_view(self, ns: str, svc: str, node: str) -> ProxyView:
            # same endpoints as the model selects for zone a, spelled as an old slice might
            return ProxyView("PreferSameZone", frozenset({"010.1.1.20", "10.1.2.20",
                                                          "fd00:10:1:2:0::20"}), "cluster")

    at = Attributor("n2", meta, Spelled())  # type: ignore[arg-type]
    at.attribute([req("fd00:10:1:2::20", "fd00:10:1:1::10", 8080, 10),
                  req("10.1.2.20", "10.1.1.10", 8080, 20)], T0)
    assert not at.totals().hint_ignored_bytes
    at3 = Attributor("n3", meta, Spelled())  # type: ignore[arg-type]
    at3.attribute([req("10.1.3.20", "10.1.1.10", 8080, 30)], T0)   # really outside the set
    assert dict(at3.totals().hint_ignored_bytes) == {HintIgnoredKey("shop", "api", A, B, "n1", "pod"): 30}


def test_batches_of_one_drain_share_lookups(cluster) -> None:  # type: ignore[no-untyped-def]
    meta, hints = cluster

    class Counting:
        def __init__(self) -> None:
            self.resolves = 0

        def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
            return getattr(meta, name)

        def resolve(self, ip_, at):  # type: ignore[no-untyped-def]
            self.resolves += 1
            return meta.resolve(ip_, at)

    view = Counting()
    at = Attributor("n3", view, hints)  # type: ignore[arg-type]
    at.attribute([req("10.1.3.20", "10.1.1.10", 8080, 1)], T0)
    first = view.resolves
    at.attribute([req("10.1.3.20", "10.1.1.10", 8080, 2, FlowKind.RESPONSE)], T0)  # same drain
    assert view.resolves == first
    at.attribute([req("10.1.3.20", "10.1.1.10", 8080, 4)], T0 + 10)           # next drain
    assert view.resolves == 2 * first
    assert sum(at.totals().service_bytes.values()) == 7


@pytest.mark.parametrize("remote", ["ff02::16", "ff02::1:ff00:20", "fe80::1", "::", "169.254.1.1",
                                    "224.0.0.22"])
@pytest.mark.parametrize("kind", [FlowKind.EGRESS, FlowKind.INGRESS])
def test_link_scope_traffic_is_the_nodes_never_cross_zone(cluster, remote: str,  # type: ignore[no-untyped-def]
                                                          kind: FlowKind) -> None:
    # a new pod's veth sends MLD reports and DAD probes: they never leave the link, so they
    # count once, as traffic between the pod and its own node, not as external traffic
    local = "fd00:10:1:1::10" if ":" in remote else "10.1.1.10"
    a = attributor(cluster, "n1")
    a.attribute([flow(kind, local, remote, 0, 96, proto=58 if ":" in remote else 2)], T0)
    t = a.totals()
    assert accounted(t) == 96
    (key, n), = t.workload_bytes.items()
    assert n == 96
    assert (key.remote_kind, key.crossing, key.remote_zone, key.client_zone) == ("node", "same_node", A, A)


def test_state_round_trips_and_an_older_checkpoint_restores_its_hint_ignored_series(cluster) -> None:  # type: ignore[no-untyped-def]
    at = attributor(cluster, "n3")
    at.attribute([req("10.1.3.20", "192.168.0.1", 8080, 64)], T0)  # node n1 dials api: ignored
    state = at.state()
    again = attributor(cluster, "n3")
    again.restore(state)
    assert dict(again.totals().hint_ignored_bytes) == dict(at.totals().hint_ignored_bytes) == {
        HintIgnoredKey("shop", "api", A, B, "n1", "node"): 64}
    # the previous version's rows had four labels and no client path series
    old = {**state, "ignored": [["shop", "api", A, B, 64]]}
    del old["paths"]
    again.restore(old)
    assert dict(again.totals().hint_ignored_bytes) == {
        HintIgnoredKey("shop", "api", A, B, "unknown", "unknown"): 64}
    assert dict(again.totals().client_path_bytes) == {}
    with pytest.raises(ValueError):
        again.restore({**state, "ignored": [["shop", "api", A, 64]]})
    # service rows from before client classes (seven labels): kind and type unknown, kept
    old = {**state, "service": [["shop", "api", "80", A, B, "cross_zone", "request", 64]]}
    again.restore(old)
    assert dict(again.totals().service_bytes) == {
        ServiceKey("shop", "api", "80", A, B, "cross_zone", "request", "unknown", "unknown"): 64}
    assert dict(at.totals().service_bytes) == {
        ServiceKey("shop", "api", "80", A, B, "cross_zone", "request", "node", "none"): 64}
    with pytest.raises(ValueError):
        again.restore({**state, "service": [["shop", "api", "80", A, B, "cross_zone", 64]]})


@pytest.mark.parametrize("text", ["169.254.0.0", "169.254.3.4", "169.255.0.1", "224.0.0.1",
                                  "239.255.255.255", "240.0.0.1", "223.255.255.255", "0.0.0.0",
                                  "0.0.0.1", "10.1.2.3", "fe80::1", "ff02::1", "::", "fd00::1"])
def test_link_scope_is_the_three_ipaddress_properties(text: str) -> None:
    import ipaddress

    from agent.attribution.join import _link_scope

    a = ipaddress.ip_address(text)
    assert _link_scope(a) == (a.is_link_local or a.is_multicast or a.is_unspecified)


@pytest.mark.parametrize("text", ["10.244.1.7", "010.244.1.7", "10.244.001.7", "10.244.1",
                                  "255.255.255.255", "256.1.1.1", "fd00:0::1", "FD00::1",
                                  "::ffff:10.1.2.3", " 10.1.2.3", "pod-a", ""])
def test_endpoint_addresses_parse_as_the_canonical_path_does(text: str) -> None:
    import ipaddress

    from agent.attribution.join import _canonical, _endpoint_address

    try:
        want = ipaddress.ip_address(_canonical(text))
    except ValueError:
        want = None
    assert _endpoint_address(text) == want
