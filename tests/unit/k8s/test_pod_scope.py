"""``--pod-scope node`` in the cache (:attr:`agent.k8s.cache.MetadataSettings.pod_node`): only
this node's Pods are kept, and other nodes' pod addresses resolve through EndpointSlices
(``targetRef``, ``nodeName``) and Nodes' ``spec.podCIDRs`` (docs/metadata.md, "Pod scope")."""

from __future__ import annotations

import ipaddress

import pytest

from agent.k8s.cache import ClusterMetadata, MetadataSettings
from agent.k8s.cidrs import ZoneCidr
from agent.records import PeerKind
from tests.fixtures import k8s
from tests.fixtures.fakes import Clock

ip = ipaddress.ip_address
net = ipaddress.ip_network


def make(pod_node: str | None = "n1", **settings: object) -> tuple[ClusterMetadata, Clock]:
    clock = Clock(1000.0)
    c = ClusterMetadata(MetadataSettings(pod_node=pod_node, grace_seconds=60, **settings),  # type: ignore[arg-type]
                        clock=clock)
    c.replace("nodes", [
        k8s.node("n1", "zone-a", internal="192.168.0.1", pod_cidrs=["10.0.1.0/24", "fd00:1::/64"], region="r1"),
        k8s.node("n2", "zone-b", internal="192.168.0.2", pod_cidrs=["10.0.2.0/24"], region="r1"),
        k8s.node("n3", "zone-c", internal="192.168.0.3", region="r1"),  # no podCIDRs (a VPC CNI node)
    ])
    c.replace("pods", [
        k8s.pod("web-1", "10.0.1.5", "n1", owner=("ReplicaSet", "web-5f7c9"), template_hash="5f7c9"),
        k8s.pod("web-2", "10.0.2.5", "n2", owner=("ReplicaSet", "web-5f7c9"), template_hash="5f7c9"),
        k8s.pod("batch-2", "10.0.2.9", "n2"),
        k8s.pod("web-3", "10.50.0.7", "n3"),
        k8s.pod("agent-n2", "192.168.0.2", "n2", host_network=True),
    ])
    c.replace("services", [k8s.service("web", cluster_ip="10.96.0.10")])
    c.replace("endpointslices", [k8s.endpointslice("web-x", "web", [
        k8s.endpoint("10.0.1.5", "zone-a", "n1", target="web-1"),
        k8s.endpoint("10.0.2.5", "zone-b", "n2", target="web-2"),
        k8s.endpoint("10.50.0.7", "zone-c", "n3", target="web-3"),
        k8s.endpoint("192.168.0.2", "zone-b", "n2", target="agent-n2")])])
    return c, clock


def peer_of(c: ClusterMetadata, addr: str) -> tuple[object, ...]:
    p = c.resolve(ip(addr))
    return (p.kind, p.namespace, p.name, p.node, p.zone, p.region, p.reason)


def test_only_this_nodes_pods_are_kept() -> None:
    c, _ = make()
    assert c.counts()["pods"] == 1
    c.apply("pods", "ADDED", k8s.pod("late-2", "10.0.2.77", "n2"))
    assert c.counts()["pods"] == 1
    assert c.pod_at(ip("10.0.1.5")) is not None and c.pod_at(ip("10.0.2.5")) is None
    # a local pod keeps everything the cluster scope gives it
    assert c.resolve(ip("10.0.1.5")).workload == "web"


@pytest.mark.parametrize(("addr", "expected"), [
    # an endpoint of another node: named by its targetRef, on its nodeName
    ("10.0.2.5", (PeerKind.POD, "shop", "web-2", "n2", "zone-b", "r1", None)),
    # a VPC-CNI node without podCIDRs: the endpoint alone says where the pod runs
    ("10.50.0.7", (PeerKind.POD, "shop", "web-3", "n3", "zone-c", "r1", None)),
    # no Service: inside n2's podCIDR, a pod there without a name
    ("10.0.2.9", (PeerKind.POD, None, None, "n2", "zone-b", "r1", None)),
    # a host-network endpoint is its node's address: the node, as in the cluster scope
    ("192.168.0.2", (PeerKind.NODE, None, None, "n2", "zone-b", "r1", None)),
    # the node's bridge address (first of its podCIDR) stays the node
    ("10.0.2.1", (PeerKind.NODE, None, None, "n2", "zone-b", "r1", None)),
    # this node's range, no pod reported: unresolved (held by attribution), never a "remote" pod
    ("10.0.1.99", (PeerKind.UNKNOWN, None, None, None, None, None, "no_pod_for_ip")),
    ("8.8.8.8", (PeerKind.EXTERNAL, None, None, None, None, None, None)),
])
def test_other_nodes_addresses_resolve_through_slices_and_pod_cidrs(addr: str, expected: tuple[object, ...]) -> None:
    c, _ = make()
    assert peer_of(c, addr) == expected


def test_the_cluster_scope_names_the_same_node_and_zone() -> None:
    """Wherever the node scope resolves another node's pod, the cluster scope (every Pod
    watched) says the same kind, node, zone and region; only names may be missing."""
    node_c, _ = make()
    cluster_c, _ = make(pod_node=None)
    for addr in ("10.0.2.5", "10.50.0.7", "10.0.2.9", "192.168.0.2", "10.0.2.1", "8.8.8.8"):
        a, b = node_c.resolve(ip(addr)), cluster_c.resolve(ip(addr))
        assert (a.kind, a.node, a.zone, a.region, a.host_network) == (b.kind, b.node, b.zone, b.region,
                                                                      b.host_network), addr


def test_a_removed_endpoint_keeps_its_name_for_the_grace() -> None:
    c, clock = make()
    assert peer_of(c, "10.0.2.5")[2] == "web-2"
    c.apply("endpointslices", "MODIFIED", k8s.endpointslice("web-x", "web", [
        k8s.endpoint("10.0.1.5", "zone-a", "n1", target="web-1")]))
    assert peer_of(c, "10.0.2.5")[2] == "web-2"
    assert peer_of(c, "10.50.0.7")[3] == "n3"
    clock.advance(61)
    # past the grace: n2's podCIDR still places it; n3 has none, and no pod range holds it
    assert peer_of(c, "10.0.2.5") == (PeerKind.POD, None, None, "n2", "zone-b", "r1", None)
    assert peer_of(c, "10.50.0.7")[0] is PeerKind.EXTERNAL


def test_an_address_listed_again_answers_its_new_pod() -> None:
    c, _ = make()
    assert peer_of(c, "10.0.2.5")[2] == "web-2"  # memoized now
    c.apply("endpointslices", "MODIFIED", k8s.endpointslice("web-x", "web", [
        k8s.endpoint("10.0.2.5", "zone-b", "n2", target="web-2b")]))
    assert peer_of(c, "10.0.2.5")[2] == "web-2b"
    c.apply("endpointslices", "DELETED", k8s.endpointslice("web-x", "web", []))
    assert peer_of(c, "10.0.2.5")[2] == "web-2b"  # the grace


def test_pod_ranges_without_a_node_use_the_zone_cidrs() -> None:
    """``--pod-cidrs`` (a VPC CNI's subnets) with ``--zone-cidrs`` for them: a pod address no
    slice names is a pod in that subnet's zone; without a zone range, unresolved."""
    c, _ = make(extra_pod_cidrs=(net("10.50.0.0/16"), net("10.60.0.0/16")),
                zone_cidrs=(ZoneCidr(net("10.50.0.0/17"), "zone-c", "r1"),))
    assert peer_of(c, "10.50.0.9") == (PeerKind.POD, None, None, None, "zone-c", "r1", None)
    assert peer_of(c, "10.60.0.9") == (PeerKind.UNKNOWN, None, None, None, None, None, "no_pod_for_ip")
    assert peer_of(c, "10.50.0.7")[2] == "web-3"  # an endpoint still by its slice


def test_a_local_address_the_watch_has_not_reported_is_unresolved() -> None:
    c, clock = make()
    peer, settled = c.resolve_veth(ip("10.0.1.66"), 9, clock.t)
    assert (peer.kind, peer.reason, settled) == (PeerKind.UNKNOWN, "no_pod_for_ip", True)
    # a VPC CNI range: a local address never reads as a pod "of unknown node"
    c2, _ = make(extra_pod_cidrs=(net("10.50.0.0/16"),), zone_cidrs=(ZoneCidr(net("10.50.0.0/16"), "zone-a", None),))
    assert c2.resolve_veth(ip("10.50.3.3"), 9, clock.t)[0].kind is PeerKind.CIDR


def test_pod_scope_problems() -> None:
    c, _ = make()
    assert c.pod_scope_problems() == []
    c.apply("pods", "ADDED", k8s.pod("odd-1", "10.0.2.200", "n1"))
    c.apply("pods", "ADDED", k8s.pod("far-1", "10.99.0.1", "n1"))
    assert sorted(c.pod_scope_problems()) == [
        "pod shop/far-1 10.99.0.1: outside every pod range: other nodes' pods may read as external",
        "pod shop/odd-1 10.0.2.200: inside node n2's podCIDRs, not this node's: other nodes' pods "
        "may resolve to the wrong node and zone"]
    bare = ClusterMetadata(MetadataSettings(pod_node="n1"))
    bare.replace("nodes", [k8s.node("n1", "zone-a", internal="192.168.0.1")])
    assert bare.pod_scope_problems()[0].startswith("no pod range")
    with_extra = ClusterMetadata(MetadataSettings(pod_node="n1", extra_pod_cidrs=(net("10.0.0.0/8"),)))
    with_extra.replace("nodes", [k8s.node("n1", "zone-a", internal="192.168.0.1")])
    assert with_extra.pod_scope_problems() == []
    cluster_c, _ = make(pod_node=None)
    cluster_c.apply("pods", "ADDED", k8s.pod("far-1", "10.99.0.1", "n1"))
    assert cluster_c.pod_scope_problems() == []


def test_the_agent_loop_logs_each_misplaced_pod_once(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from agent.exporter import Exporter
    from agent.hints import HintModel
    from agent.loop import AgentLoop
    from tests.fixtures.fakes import FakeDatapath

    c, clock = make()
    for r in ("pods", "nodes", "services", "endpointslices"):
        c.set_synced(r, True)
    loop = AgentLoop("n1", FakeDatapath(), c, HintModel(c), Exporter(version="t"), clock=clock)
    with caplog.at_level(logging.WARNING, logger="agent.loop"):
        loop.tick()
        c.apply("pods", "ADDED", k8s.pod("odd-1", "10.0.2.200", "n1"))
        loop.tick()
        loop.tick()
        c.apply("pods", "ADDED", k8s.pod("ok-1", "10.0.1.77", "n1"))
        loop.tick()
    said = [r.getMessage() for r in caplog.records if "--pod-scope node" in r.getMessage()]
    assert said == ["--pod-scope node: pod shop/odd-1 10.0.2.200: inside node n2's podCIDRs, not this "
                    "node's: other nodes' pods may resolve to the wrong node and zone (docs/metadata.md, "
                    "Pod scope)"]


def test_an_endpoint_without_node_name_is_placed_by_its_pod_cidr() -> None:
    """Hand-written or mirrored slices may lack ``nodeName``: the pod is on the node whose
    podCIDR holds its address, and named by its targetRef; a targetRef of another kind names
    nothing."""
    c, _ = make()
    c.apply("endpointslices", "ADDED", k8s.endpointslice("odd-x", "web", [
        k8s.endpoint("10.0.2.8", target="mirrored-1"),
        {"addresses": ["10.0.2.7"], "targetRef": {"kind": "Node", "name": "n2"}}]))
    assert peer_of(c, "10.0.2.8") == (PeerKind.POD, "shop", "mirrored-1", "n2", "zone-b", "r1", None)
    assert peer_of(c, "10.0.2.7") == (PeerKind.POD, None, None, "n2", "zone-b", "r1", None)


def test_a_host_port_of_another_nodes_pod_is_its_node_and_its_own_node_says_so() -> None:
    """The cluster scope resolves ``node:hostPort`` of an ordinary pod to that pod (the
    portmap DNAT), so the client's ingress copy is skipped. The node scope does not know
    other nodes' hostPorts: the address stays the node, whose replies the client's node
    counts as ingress while the pod's node counts the pod's egress (twice). The pod's own
    node, which watches it, reports it."""
    c, _ = make()
    cluster_c, _ = make(pod_node=None)
    hp = k8s.pod("cache-x", "10.0.2.30", "n2", namespace="jobs")
    hp["spec"]["containers"][0]["ports"] = [{"containerPort": 6379, "hostPort": 16379}]
    for cache in (c, cluster_c):
        cache.apply("pods", "ADDED", hp)
    assert cluster_c.resolve_host_port(ip("192.168.0.2"), 16379, 6).name == "cache-x"  # type: ignore[union-attr]
    assert c.resolve_host_port(ip("192.168.0.2"), 16379, 6) is None
    n2, _ = make(pod_node="n2")
    n2.apply("pods", "ADDED", hp)
    assert n2.pod_scope_problems() == [
        "pod jobs/cache-x serves hostPort 16379/6: other nodes' agents count its replies twice in the node scope"]


def test_the_locality_ring_is_every_node_in_the_node_scope() -> None:
    """``workload_nodes`` needs the agent DaemonSet's pods on every node: the node scope has
    its own only, so the ring falls back to every Node (not to this node alone, which would
    make every agent export every Service's locality)."""
    from agent.exporter import Exporter
    from agent.hints import HintModel
    from agent.loop import AgentLoop
    from tests.fixtures.fakes import FakeDatapath

    for scope in ("node", "cluster"):
        c, clock = make(pod_node="n1" if scope == "node" else None)
        for n in ("n1", "n2"):
            c.apply("pods", "ADDED", k8s.pod(f"agent-{n}", None, n, namespace="zonemeter",
                                             owner=("DaemonSet", "zonemeter-agent"), host_network=True))
            ds = k8s.pod(f"agent-{n}", f"192.168.0.{n[1]}", n, namespace="zonemeter",
                         owner=("DaemonSet", "zonemeter-agent"), host_network=True)
            c.apply("pods", "MODIFIED", ds)
        loop = AgentLoop("n1", FakeDatapath(), c, HintModel(c), Exporter(version="t"), clock=clock,
                         agent_pod=("zonemeter", "agent-n1"))
        assert loop.ring_nodes() == ({"n1", "n2", "n3"} if scope == "node" else {"n1", "n2"}), scope


def test_the_replies_through_another_nodes_host_port_count_twice_in_the_node_scope() -> None:
    """The cost of the limit above, across the two agents (as
    tests/unit/k8s/test_host_ports.py counts it once in the cluster scope): client-1 on n1
    dials n2's address at cache-x's hostPort; n2 sees cache-x's ingress and egress, n1 its
    client's egress and ingress. n1 cannot know the hostPort, so it keeps its ingress from
    the node (900 bytes) that n2 counts as cache-x's egress: 1,900 bytes counted for 1,000.
    docs/metadata.md, Pod scope, lists it; the pod's node logs it (above)."""
    from agent.attribution import Attributor
    from agent.hints import HintModel
    from agent.k8s import MetadataAdapter
    from agent.records import FlowDelta, FlowKind

    hp = k8s.pod("cache-x", "10.0.2.30", "n2", namespace="jobs")
    hp["spec"]["containers"][0]["ports"] = [{"containerPort": 6379, "hostPort": 16379}]
    counted = {}
    for scope in ("cluster", "node"):
        c1, _ = make(pod_node="n1" if scope == "node" else None)
        c2, _ = make(pod_node="n2" if scope == "node" else None)
        for c in (c1, c2):
            c.apply("pods", "ADDED", hp)
            c.apply("pods", "ADDED", k8s.pod("client-1", "10.0.1.20", "n1"))
        a1 = Attributor("n1", MetadataAdapter(c1), HintModel(c1))
        a2 = Attributor("n2", MetadataAdapter(c2), HintModel(c2))
        a1.attribute([FlowDelta(FlowKind.EGRESS, ip("10.0.1.20"), ip("192.168.0.2"), 16379, 6, 100, 1),
                      FlowDelta(FlowKind.INGRESS, ip("10.0.1.20"), ip("192.168.0.2"), 16379, 6, 900, 1)], 1000.0)
        a2.attribute([FlowDelta(FlowKind.INGRESS, ip("10.0.2.30"), ip("10.0.1.20"), 0, 6, 100, 1, local_port=6379),
                      FlowDelta(FlowKind.EGRESS, ip("10.0.2.30"), ip("10.0.1.20"), 0, 6, 900, 1, local_port=6379)],
                     1000.0)
        counted[scope] = sum(v for a in (a1, a2) for v in a.totals().workload_bytes.values())
    assert counted == {"cluster": 1000, "node": 1900}
