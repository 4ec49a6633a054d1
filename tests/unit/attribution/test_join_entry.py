"""The first hop of a node port (docs/attribution.md, "Two hops of NodePort and LoadBalancer
traffic"): counted once, at the receiving node's uplink, in its own series; the endpoint
counts the next hop; externalTrafficPolicy Local and data planes that do not masquerade to a
local endpoint leave one hop, counted once. Driven by the kernel model of cluster.py, which
emits what the uplink programs (bpf/uplink.h) and the endpoint's hook count."""

from __future__ import annotations

from typing import Any

import pytest

from agent.attribution import Attributor, ServiceKey
from agent.records import FlowDelta, FlowKind
from tests.unit.attribution.cluster import Conn, Model, build, ip, objects

A, B = "eu-west-1a", "eu-west-1b"
T0 = 1_764_470_000.0
ALB = "172.31.128.9"   # a load balancer in zone a (zone CIDR marked aws-alb)
N1 = "192.168.0.1"     # node n1, zone a

#: name -> (connection, bytes each hop family should hold: (entry, endpoint) as multiples
#: of req + resp). web-lb: nodePort 30080 -> web's 8080 (10.1.1.10 on n1, 10.1.3.11 on n3),
#: externalTrafficPolicy Cluster; web-local: 30443 -> 8443, Local.
NODE_PORT: dict[str, tuple[Conn, tuple[int, int]]] = {
    # kube-proxy on n1 masquerades to n1's address and forwards to n3: two hops on the wire
    "cluster_remote_endpoint": (Conn(ALB, N1, 30080, 700, 9100, backend="10.1.3.11", bport=8080,
                                     node_port=True), (1, 1)),
    # ... to its own endpoint: the first hop on the wire, the second inside n1 (same_node)
    "cluster_local_endpoint": (Conn(ALB, N1, 30080, 600, 8000, backend="10.1.1.10", bport=8080,
                                    node_port=True), (1, 1)),
    # a data plane that does not masquerade to a local endpoint (Cilium's kube-proxy
    # replacement): the endpoint sees the load balancer itself, one hop
    "cluster_local_endpoint_unmasqueraded": (Conn(ALB, N1, 30080, 500, 7000, backend="10.1.1.10",
                                                  bport=8080, node_port=True, masquerade=False),
                                             (0, 1)),
    # externalTrafficPolicy Local: never an entry, the endpoint sees the client
    "local_policy": (Conn(ALB, N1, 30443, 400, 6000, backend="10.1.1.10", bport=8443,
                          node_port=True, masquerade=False), (0, 1)),
    # a pod on n3 calls n1's node port: its own copy is skipped, n1's uplink counts the hop
    "cluster_pod_client": (Conn("api-5d8b-ccccc", N1, 30080, 300, 5000, backend="10.1.3.11",
                                bport=8080, node_port=True), (1, 1)),
    # a host process on n3: the same (its socket's copy skipped on the cgroup hook)
    "cluster_host_client": (Conn("node:n3", N1, 30080, 200, 4000, backend="10.1.3.11", bport=8080,
                                 node_port=True), (1, 1)),
    # a pod on n1 calls n3's node port of host-network endpoints, kube-proxy on n3 picks n3's
    # own: one hop on the wire, counted on n3's uplink; the client's copy is no second
    # count of it (the endpoint's socket, cgroup hook, sees the hop inside n3, same_node)
    "cluster_host_network_endpoint_on_the_receiving_node": (
        Conn("web-7c9f-abcde", "192.168.0.3", 30090, 150, 2500, backend="192.168.0.3", bport=9100,
             node_port=True), (1, 0)),
    # ... or n2's: the second hop, n3 to a host-network server, only sockets see
    "cluster_host_network_endpoint_on_another_node": (
        Conn("web-7c9f-abcde", "192.168.0.3", 30090, 140, 2400, backend="192.168.0.2", bport=9100,
             node_port=True), (1, 0)),
}
#: the cgroup hook's counts where they differ: it sees host-network servers
CGROUP = {"cluster_host_network_endpoint_on_the_receiving_node": (1, 1),
          "cluster_host_network_endpoint_on_another_node": (1, 1)}


def run(conns: list[Conn], sockets: bool = False) -> dict[str, Attributor]:
    o = objects()
    meta, hints = build(o)
    model = Model(meta, o, sockets=sockets)
    for c in conns:
        model.send(c)
    out = {}
    for node in ("n1", "n2", "n3"):
        out[node] = Attributor(node, meta, hints, sockets_seen=sockets)
        out[node].attribute(model.deltas.get(node, []), T0)
        out[node].close_interval(T0 + 1)
    return out


def balance(t: Any) -> int:
    """What a node's bytes_seen must equal: every counted series, and the copies skipped."""
    return (sum(t.service_bytes.values()) + sum(t.workload_bytes.values())
            + sum(t.service_entry_bytes.values()) + sum(t.unattributed_bytes.values())
            + sum(t.skipped_bytes.values()) + t.held_bytes)


@pytest.mark.parametrize("sockets", [False, True], ids=["veth", "cgroup"])
@pytest.mark.parametrize("name", sorted(NODE_PORT))
def test_each_hop_of_a_node_port_counted_once(name: str, sockets: bool) -> None:
    c, (entry_x, endpoint_x) = NODE_PORT[name]
    if sockets:
        entry_x, endpoint_x = CGROUP.get(name, (entry_x, endpoint_x))
    agents = run([c], sockets=sockets)
    totals = [a.totals() for a in agents.values()]
    entry = sum(sum(t.service_entry_bytes.values()) for t in totals)
    endpoint = sum(sum(t.service_bytes.values()) for t in totals)
    assert (entry, endpoint) == (entry_x * (c.req + c.resp), endpoint_x * (c.req + c.resp))
    assert sum(sum(t.workload_bytes.values()) + sum(t.unattributed_bytes.values()) for t in totals) == 0
    for t in totals:
        assert t.bytes_seen == balance(t)


def _entries(agents: dict[str, Attributor]) -> dict[tuple[str, ...], int]:
    return {(node, k.service, k.port, k.client_kind, k.lb_type, k.client_zone, k.server_zone, k.crossing,
             k.direction): v for node, a in agents.items() for k, v in a.totals().service_entry_bytes.items()}


def test_first_hop_is_the_load_balancers_at_the_receiving_node_and_the_second_the_nodes() -> None:
    c = NODE_PORT["cluster_remote_endpoint"][0]
    agents = run([c])
    assert _entries(agents) == {
        ("n1", "web-lb", "80", "load-balancer", "aws-alb", A, A, "same_zone", "request"): c.req,
        ("n1", "web-lb", "80", "load-balancer", "aws-alb", A, A, "same_zone", "response"): c.resp}
    # the endpoint on n3 counts the hop n1 masqueraded: a node client, across zones
    assert dict(agents["n3"].totals().service_bytes) == {
        ServiceKey("shop", "web-lb", "80", A, B, "cross_zone", "request", "node", "none"): c.req,
        ServiceKey("shop", "web-lb", "80", A, B, "cross_zone", "response", "node", "none"): c.resp}
    # one pair row per hop: the load balancer with the receiving node
    rows = [(p.client, p.server, p.service, p.client_kind, p.bytes) for p in agents["n1"].totals().top_pairs]
    assert rows == [(ALB, "node/n1", "web-lb", "load-balancer", c.req + c.resp)]


def test_a_pod_calling_another_nodes_node_port_is_counted_at_that_nodes_uplink() -> None:
    c = NODE_PORT["cluster_pod_client"][0]
    agents = run([c])
    assert _entries(agents) == {
        ("n1", "web-lb", "80", "pod", "none", B, A, "cross_zone", "request"): c.req,
        ("n1", "web-lb", "80", "pod", "none", B, A, "cross_zone", "response"): c.resp}
    # the pod's own copy, to n1's node port, is a Service address's copy: skipped there
    assert dict(agents["n3"].totals().skipped_bytes) == {"clusterip_client_copy": c.req + c.resp}


def test_an_unmasqueraded_hop_to_a_local_endpoint_is_the_endpoints_alone() -> None:
    """The endpoint on n1 sees the load balancer's address: its count is the hop, and the
    uplink's copy of the same bytes is skipped as entry_endpoint_copy, in the same drain."""
    c = NODE_PORT["cluster_local_endpoint_unmasqueraded"][0]
    t = run([c])["n1"].totals()
    assert not t.service_entry_bytes
    assert dict(t.skipped_bytes) == {"entry_endpoint_copy": c.req + c.resp}
    assert {(k.service, k.client_kind, k.lb_type, k.crossing, k.direction): v
            for k, v in t.service_bytes.items()} == {
        ("web-lb", "load-balancer", "aws-alb", "same_zone", "request"): c.req,
        ("web-lb", "load-balancer", "aws-alb", "same_zone", "response"): c.resp}
    # masqueraded (kube-proxy), the endpoint sees n1 itself and both hops stay
    m = NODE_PORT["cluster_local_endpoint"][0]
    t = run([m])["n1"].totals()
    assert sum(t.service_entry_bytes.values()) == m.req + m.resp
    assert {k.crossing for k in t.service_bytes} == {"same_node"}


def test_the_endpoint_copy_rule_holds_for_an_endpoint_that_backs_several_services() -> None:
    """An endpoint backing two Services counts its bytes to the first by name (Service
    ambiguity), but an entry hop of either is the same bytes."""
    o = objects()
    # web's pod 10.1.1.10 also backs shop/aaa-web on 8080 (first by name)
    from tests.unit.attribution.cluster import endpoint, service, slice_
    o["services"].append(service("shop", "aaa-web", ["10.96.0.52"], [("http", 80, 8080, "TCP")]))
    o["slices"].append(slice_("shop", "aaa-web", "aaa-1", [endpoint("10.1.1.10", "n1", A)],
                              [("http", 8080, "TCP")]))
    meta, hints = build(o)
    model = Model(meta, o)
    c = NODE_PORT["cluster_local_endpoint_unmasqueraded"][0]
    model.send(c)
    at = Attributor("n1", meta, hints)
    at.attribute(model.deltas["n1"], T0)
    t = at.totals()
    assert {k.service for k in t.service_bytes} == {"aaa-web"}
    assert not t.service_entry_bytes and dict(t.skipped_bytes) == {"entry_endpoint_copy": c.req + c.resp}


def test_an_entry_without_a_service_is_unattributed_and_an_unresolved_client_held() -> None:
    meta, hints = build()
    at = Attributor("n1", meta, hints, hold_unresolved_seconds=30)
    # a node port no Service has (the kernel's entry set was stale), and a client in a pod
    # range no pod holds yet
    at.attribute([FlowDelta(FlowKind.REQUEST, ip(N1), ip(ALB), 31999, 6, 40, 1, local_port=31999),
                  FlowDelta(FlowKind.REQUEST, ip(N1), ip("10.9.9.9"), 30080, 6, 60, 1, local_port=30080)],
                 T0)
    t = at.totals()
    assert dict(t.unattributed_bytes) == {"entry_without_service": 40}
    assert t.held_bytes == 60 and not t.service_entry_bytes
    at.attribute([], T0 + 31)  # the hold ran out: counted as it resolves, unknown
    t = at.totals()
    assert t.held_bytes == 0
    assert {(k.client_kind, k.crossing): v for k, v in t.service_entry_bytes.items()} == {("unknown", "unknown"): 60}
    assert t.bytes_seen == balance(t)


def test_entry_series_survive_a_checkpoint() -> None:
    c = NODE_PORT["cluster_remote_endpoint"][0]
    n1 = run([c])["n1"]
    meta, hints = build()
    again = Attributor("n1", meta, hints)
    again.restore(n1.state())
    assert dict(again.totals().service_entry_bytes) == dict(n1.totals().service_entry_bytes)
    state = n1.state()
    del state["entry"]  # a checkpoint from before entry hops
    again.restore(state)
    assert not again.totals().service_entry_bytes


def test_a_node_that_masquerades_only_to_remote_endpoints_counts_their_first_hop_alone() -> None:
    """One load balancer, one drain, two connections through n1's node port: one to the
    local endpoint unmasqueraded (its hop is the endpoint's), one to n3 masqueraded (a first
    hop of its own). The uplink's count of both, merged into one key per direction as the
    kernel merges it, is reduced by what the local endpoint saw: the remote one's hop stays."""
    local = NODE_PORT["cluster_local_endpoint_unmasqueraded"][0]
    remote = NODE_PORT["cluster_remote_endpoint"][0]
    o = objects()
    meta, hints = build(o)
    model = Model(meta, o)
    model.send(local)
    model.send(remote)
    merged: dict[tuple[Any, ...], FlowDelta] = {}
    for d in model.deltas["n1"]:
        k = (d.kind, d.local, d.remote, d.port, d.local_port)
        old = merged.get(k)
        merged[k] = d if old is None else FlowDelta(d.kind, d.local, d.remote, d.port, d.protocol,
                                                   old.bytes + d.bytes, old.packets + d.packets,
                                                   local_port=d.local_port, ifindex=d.ifindex)
    assert len([d for d in merged.values() if d.is_entry]) == 2  # request, response
    at = Attributor("n1", meta, hints)
    at.attribute(list(merged.values()), T0)
    t = at.totals()
    assert {k.direction: v for k, v in t.service_entry_bytes.items()} == {"request": remote.req,
                                                                         "response": remote.resp}
    assert dict(t.skipped_bytes) == {"entry_endpoint_copy": local.req + local.resp}
    assert t.bytes_seen == balance(t)
