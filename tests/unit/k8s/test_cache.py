"""agent.k8s.cache: slim records, IP resolution (every PeerKind), IP reuse by time,
endpoint mapping, pruned raw objects, dirty tracking."""

from __future__ import annotations

import ipaddress
import json

import pytest

from agent.k8s import snapshot
from agent.k8s.cache import ClusterMetadata, MetadataSettings
from agent.k8s.cidrs import parse_zone_cidrs
from agent.k8s.parse import Endpoint, NodeInfo, workload_of
from agent.records import Peer, PeerKind, ServicePort
from tests.fixtures import k8s
from tests.fixtures.fakes import Clock

ip = ipaddress.ip_address


def make(clock: Clock | None = None, **settings: object) -> ClusterMetadata:
    c = ClusterMetadata(MetadataSettings(**settings), clock=clock or Clock())  # type: ignore[arg-type]
    c.replace("nodes", [
        k8s.node("n1", "zone-a", internal="192.168.0.1", external="203.0.113.1",
                 pod_cidrs=["10.0.1.0/24", "fd00:1::/64"], region="region-1", noise=True),
        k8s.node("n2", "zone-b", internal=["192.168.0.2", "2001:db8::2"], pod_cidrs=["10.0.2.0/24"], region="region-1",
                 noise=True),
        k8s.node("n3", None, internal="192.168.0.3", pod_cidrs=["10.0.3.0/24"], noise=True),
        k8s.node("n4", "zone-old", internal="192.168.0.4", region="region-1", beta_zone=True, noise=True),
    ])
    return c


# ---------------------------------------------------------------- resolution, every kind

def test_pod_ip_resolves_to_pod_with_workload_node_zone_region() -> None:
    c = make()
    c.apply("pods", "ADDED",
            k8s.pod("cart-7d9f8-x2x", "10.0.1.5", "n1", owner=("ReplicaSet", "cart-7d9f8"), template_hash="7d9f8",
                    noise=True))
    assert c.resolve(ip("10.0.1.5")) == Peer(
        PeerKind.POD, zone="zone-a", region="region-1", node="n1", namespace="shop",
        name="cart-7d9f8-x2x", workload="cart", workload_kind="Deployment")


def test_ipv6_pod_and_dual_stack() -> None:
    c = make()
    c.apply("pods", "ADDED", k8s.pod("dual", ["10.0.2.7", "fd00:2::7"], "n2", namespace="ns", noise=True))
    for addr in ("10.0.2.7", "fd00:2::7"):
        peer = c.resolve(ip(addr))
        assert (peer.kind, peer.name, peer.zone) == (PeerKind.POD, "dual", "zone-b")


@pytest.mark.parametrize("addr, node_name, zone", [
    ("192.168.0.1", "n1", "zone-a"),   # InternalIP
    ("203.0.113.1", "n1", "zone-a"),   # ExternalIP
    ("2001:db8::2", "n2", "zone-b"),   # IPv6 InternalIP
    ("192.168.0.4", "n4", "zone-old"),  # beta zone label fallback
])
def test_node_addresses_resolve_to_node(addr: str, node_name: str, zone: str) -> None:
    peer = make().resolve(ip(addr))
    assert (peer.kind, peer.node, peer.zone, peer.reason) == (PeerKind.NODE, node_name, zone, None)


def test_node_without_zone_label() -> None:
    c = make()
    assert c.resolve(ip("192.168.0.3")) == Peer(PeerKind.NODE, node="n3", reason="node_without_zone")
    c.apply("pods", "ADDED", k8s.pod("p", "10.0.3.9", "n3", namespace="ns", noise=True))
    peer = c.resolve(ip("10.0.3.9"))
    assert (peer.kind, peer.zone, peer.reason) == (PeerKind.POD, None, "node_without_zone")


def test_host_network_pod_resolves_to_its_node() -> None:
    c = make()
    # a host-network pod on a node whose object lists no such address (e.g. a secondary IP)
    c.apply("pods", "ADDED",
            k8s.pod("agent", "192.168.9.9", "n2", namespace="kube-system", host_network=True, noise=True))
    peer = c.resolve(ip("192.168.9.9"))
    assert (peer.kind, peer.node, peer.zone) == (PeerKind.NODE, "n2", "zone-b")
    # and it never shadows the node address as a pod
    c.apply("pods", "ADDED",
            k8s.pod("proxy", "192.168.0.1", "n1", namespace="kube-system", host_network=True, noise=True))
    assert c.resolve(ip("192.168.0.1")).kind is PeerKind.NODE


def test_zone_cidr_then_pod_cidr_unknown_then_external() -> None:
    cidrs = parse_zone_cidrs("cidr,zone,region\n172.16.0.0/16,zone-a,region-1\n"
                             "172.16.5.0/24,zone-c,\n2001:db8:ff::/48,zone-b,region-1\n")
    c = make(zone_cidrs=cidrs)
    assert c.resolve(ip("172.16.9.9")) == Peer(PeerKind.CIDR, zone="zone-a", region="region-1")
    assert c.resolve(ip("172.16.5.1")) == Peer(PeerKind.CIDR, zone="zone-c")  # longest prefix
    assert c.resolve(ip("2001:db8:ff::1")).zone == "zone-b"
    assert c.resolve(ip("10.0.2.200")) == Peer(PeerKind.UNKNOWN, reason="no_pod_for_ip")
    assert c.resolve(ip("fd00:1::99")) == Peer(PeerKind.UNKNOWN, reason="no_pod_for_ip")
    assert c.resolve(ip("8.8.8.8")) == Peer(PeerKind.EXTERNAL)
    assert c.resolve(ip("2606:4700::1")) == Peer(PeerKind.EXTERNAL)


def test_extra_pod_cidrs_mark_unknown() -> None:
    c = make(extra_pod_cidrs=(ipaddress.ip_network("100.64.0.0/10"),))
    assert c.resolve(ip("100.64.3.3")).reason == "no_pod_for_ip"


def test_pod_on_unknown_node_and_unscheduled() -> None:
    c = make()
    c.apply("pods", "ADDED", k8s.pod("p", "10.9.0.1", "ghost", namespace="ns", noise=True))
    assert c.resolve(ip("10.9.0.1")).reason == "node_not_in_cache"
    assert c.zone_of(ip("10.9.0.1")) is None
    assert c.node_of(ip("10.9.0.1")) == "ghost"


@pytest.mark.parametrize("owner, tmpl, expect", [
    (("ReplicaSet", "web-5c6b7d"), "5c6b7d", ("web", "Deployment")),
    (("ReplicaSet", "web-5c6b7d"), None, ("web-5c6b7d", "ReplicaSet")),     # no hash label
    (("ReplicaSet", "standalone"), "abc", ("standalone", "ReplicaSet")),   # not the convention
    (("StatefulSet", "db"), None, ("db", "StatefulSet")),
    (("DaemonSet", "fluent"), None, ("fluent", "DaemonSet")),
    (("Job", "backup-28911"), None, ("backup-28911", "Job")),
    (None, None, ("solo", "Pod")),
])
def test_workload_walk(owner: tuple[str, str] | None, tmpl: str | None, expect: tuple[str, str]) -> None:
    meta = k8s.pod("solo", "10.0.0.1", "n1", namespace="ns", owner=owner, template_hash=tmpl, noise=True)["metadata"]
    assert workload_of(meta) == expect


# ---------------------------------------------------------------- deletion, grace, reuse

def test_deleted_pod_resolvable_within_grace_then_gone() -> None:
    clock = Clock()
    c = make(clock, grace_seconds=60)
    c.apply("pods", "ADDED", k8s.pod("old", "10.0.1.10", "n1", namespace="ns", noise=True))
    clock.t += 5
    c.apply("pods", "DELETED", k8s.pod("old", "10.0.1.10", "n1", namespace="ns", noise=True))
    clock.t += 59
    assert c.resolve(ip("10.0.1.10")).name == "old"
    clock.t += 2
    assert c.resolve(ip("10.0.1.10")) == Peer(PeerKind.UNKNOWN, reason="no_pod_for_ip")


def test_ip_reuse_resolves_by_time() -> None:
    clock = Clock(1000)
    c = make(clock)
    c.apply("pods", "ADDED", k8s.pod("old", "10.0.1.10", "n1", namespace="ns", noise=True))
    clock.t = 1010
    c.apply("pods", "DELETED", k8s.pod("old", "10.0.1.10", "n1", namespace="ns", noise=True))
    clock.t = 1012
    c.apply("pods", "ADDED", k8s.pod("new", "10.0.1.10", "n1", namespace="ns", noise=True))
    assert c.resolve(ip("10.0.1.10"), at=1005).name == "old"
    assert c.resolve(ip("10.0.1.10"), at=1011).name == "old"   # gap: the last owner before
    assert c.resolve(ip("10.0.1.10"), at=1013).name == "new"
    assert c.resolve(ip("10.0.1.10")).name == "new"            # now


def test_ip_taken_by_new_pod_before_old_delete_event() -> None:
    clock = Clock(1000)
    c = make(clock)
    c.apply("pods", "ADDED", k8s.pod("old", "10.0.1.11", "n1", namespace="ns", noise=True))
    clock.t = 1020
    c.apply("pods", "ADDED", k8s.pod("new", "10.0.1.11", "n1", namespace="ns", noise=True))
    clock.t = 1021
    c.apply("pods", "DELETED", k8s.pod("old", "10.0.1.11", "n1", namespace="ns", noise=True))  # must not evict "new"
    assert c.resolve(ip("10.0.1.11"), at=1010).name == "old"
    assert c.resolve(ip("10.0.1.11"), at=1022).name == "new"


def test_terminal_pod_releases_ip() -> None:
    clock = Clock(1000)
    c = make(clock)
    c.apply("pods", "ADDED", k8s.pod("job", "10.0.1.12", "n1", namespace="ns", noise=True))
    clock.t = 1010
    c.apply("pods", "MODIFIED", k8s.pod("job", "10.0.1.12", "n1", namespace="ns", phase="Succeeded", noise=True))
    clock.t = 1011
    c.apply("pods", "ADDED", k8s.pod("next", "10.0.1.12", "n1", namespace="ns", noise=True))
    assert c.resolve(ip("10.0.1.12"), at=1005).name == "job"
    assert c.resolve(ip("10.0.1.12"), at=1012).name == "next"


def test_deleted_cache_is_bounded() -> None:
    clock = Clock()
    c = make(clock, max_deleted=10)
    for i in range(50):
        c.apply("pods", "ADDED", k8s.pod(f"p{i}", f"10.0.1.{i + 1}", "n1", namespace="ns", noise=True))
        c.apply("pods", "DELETED", k8s.pod(f"p{i}", f"10.0.1.{i + 1}", "n1", namespace="ns", noise=True))
    assert c.counts()["deleted_ips"] == 10
    assert c.resolve(ip("10.0.1.50")).name == "p49"          # the newest survive
    assert c.resolve(ip("10.0.1.2")).kind is PeerKind.UNKNOWN  # the oldest were dropped


def test_relist_deletes_missing_and_keeps_them_in_grace() -> None:
    c = make()
    c.replace("pods",
              [k8s.pod("a", "10.0.1.1", "n1", namespace="ns", noise=True),
               k8s.pod("b", "10.0.1.2", "n1", namespace="ns", noise=True)])
    c.replace("pods", [k8s.pod("a", "10.0.1.1", "n1", namespace="ns", noise=True)])
    assert c.counts()["pods"] == 1
    assert c.resolve(ip("10.0.1.2")).name == "b"  # within grace


def test_pod_ip_change_moves_index() -> None:
    c = make()
    c.apply("pods", "ADDED", k8s.pod("p", None, "n1", namespace="ns", noise=True))
    assert c.resolve(ip("10.0.1.20")).kind is PeerKind.UNKNOWN
    c.apply("pods", "MODIFIED", k8s.pod("p", "10.0.1.20", "n1", namespace="ns", noise=True))
    assert c.resolve(ip("10.0.1.20")).name == "p"


def test_bad_objects_are_counted_not_fatal() -> None:
    c = make()
    c.apply("pods", "ADDED", {"kind": "Pod", "metadata": {"namespace": "ns"}})
    c.apply("services", "ADDED",
            k8s.service("s", "ns", cluster_ip="10.96.0.1", ports=[{"port": "eighty"}], selector={}, noise=True))
    c.apply("services", "ADDED",
            k8s.service("s2", "ns", cluster_ip="10.96.0.2", ports=[{"port": 80, "protocol": "ICMP"}], selector={},
                        noise=True))
    c.replace("endpointslices",
              [{**k8s.endpointslice("x", "s", None, namespace="ns", ports=[{"port": 1}], noise=True),
                "endpoints": "nope"},
                                 "not an object"])  # type: ignore[list-item]
    assert c.bad_objects() == {"pods": 1, "nodes": 0, "services": 2, "endpointslices": 2}
    assert c.counts()["services"] == 0


# ---------------------------------------------------------------- endpoints and services

def _svc_cache() -> ClusterMetadata:
    c = make()
    c.apply("services", "ADDED", k8s.service("web", "shop", cluster_ip=["10.96.0.10", "fd00:96::10"], ports=[
        {"name": "http", "port": 80, "targetPort": "http-port", "protocol": "TCP"},
        {"name": "metrics", "port": 9090, "targetPort": 9100, "protocol": "TCP"},
        {"name": "dns", "port": 53, "targetPort": 5353, "protocol": "UDP"},
    ], selector={}, noise=True))
    # 10.0.1.5 carries only the ready condition (serving and terminating unset)
    eps = [k8s.endpoint("10.0.1.5", "zone-a", "n1", conditions={"ready": True}, target="x", target_namespace="y"),
           k8s.endpoint("10.0.2.5", "zone-b", "n2", target="x", target_namespace="y"),
           k8s.endpoint("10.0.1.6", "zone-a", "n1", ready=False, serving=True, target="x", target_namespace="y"),
           k8s.endpoint("10.0.1.7", "zone-a", "n1", ready=False, serving=False, target="x", target_namespace="y"),
           k8s.endpoint("10.0.1.8", "zone-a", "n1", conditions={}, target="x", target_namespace="y")]
    c.apply("endpointslices", "ADDED", k8s.endpointslice("web-abc", "web", eps, ports=[
        {"name": "http", "port": 8080, "protocol": "TCP"},
        {"name": "metrics", "port": 9100, "protocol": "TCP"},
        {"name": "dns", "port": 5353, "protocol": "UDP"},
    ], noise=True))
    return c


def test_endpoint_services_maps_target_port_back_by_name() -> None:
    c = _svc_cache()
    assert c.endpoint_services(ip("10.0.1.5"), 8080, 6) == (
        ServicePort("shop", "web", 80, "http", 8080, 6),)
    assert c.endpoint_services(ip("10.0.1.5"), 9100, 6) == (
        ServicePort("shop", "web", 9090, "metrics", 9100, 6),)
    assert c.endpoint_services(ip("10.0.2.5"), 5353, 17) == (
        ServicePort("shop", "web", 53, "dns", 5353, 17),)
    assert c.endpoint_services(ip("10.0.2.5"), 5353, 6) == ()  # TCP is not UDP
    assert c.endpoint_services(ip("10.0.1.5"), 80, 6) == ()    # service port, not target port


def test_endpoint_in_two_services_and_slice_update_and_delete() -> None:
    c = _svc_cache()
    c.apply("services", "ADDED",
            k8s.service("web-canary", "shop", cluster_ip="10.96.0.11", ports=[{"port": 81, "targetPort": 8080}],
                        selector={}, noise=True))
    c.apply("endpointslices", "ADDED",
            k8s.endpointslice("canary-1", "web-canary",
                              [k8s.endpoint("10.0.1.5", "zone-a", "n1", target="x",
                                            target_namespace="y")], ports=[{"name": "", "port": 8080,
                                                                            "protocol": "TCP"}], noise=True))
    assert [s.service for s in c.endpoint_services(ip("10.0.1.5"), 8080, 6)] == ["web", "web-canary"]
    c.apply("endpointslices", "MODIFIED",
            k8s.endpointslice("canary-1", "web-canary",
                              [k8s.endpoint("10.0.1.99", "zone-a", "n1", target="x",
                                            target_namespace="y")], ports=[{"port": 8080}], noise=True))
    assert [s.service for s in c.endpoint_services(ip("10.0.1.5"), 8080, 6)] == ["web"]
    assert c.endpoint_services(ip("10.0.1.99"), 8080, 6)[0].port == 81
    c.apply("endpointslices", "DELETED",
            k8s.endpointslice("web-abc", "web", None, omit=("ports", "endpoints"), noise=True))
    # no slice lists it: still web's for the grace (bytes counted before the deletion are
    # drained after it), then not an endpoint
    assert [s.service for s in c.endpoint_services(ip("10.0.1.5"), 8080, 6)] == ["web"]
    assert c.local_endpoints("n1") == frozenset({(ip("10.0.1.99"), 8080, 6)})  # the kernel's: at once
    c._clock.t += c.settings.grace_seconds + 1  # type: ignore[attr-defined]
    assert c.endpoint_services(ip("10.0.1.5"), 8080, 6) == ()


def test_an_endpoint_listed_again_is_no_longer_gone() -> None:
    c = _svc_cache()
    one = k8s.endpointslice("web-abc", "web", [k8s.endpoint("10.0.1.5", "zone-a", "n1")],
                            ports=[{"name": "http", "port": 8080, "protocol": "TCP"}])
    c.apply("endpointslices", "MODIFIED", k8s.endpointslice("web-abc", "web", [], ports=one["ports"]))
    assert [s.service for s in c.endpoint_services(ip("10.0.1.5"), 8080, 6)] == ["web"]  # in its grace
    c.apply("endpointslices", "MODIFIED", one)
    c.apply("endpointslices", "ADDED",
            k8s.endpointslice("other-1", "other", [k8s.endpoint("10.0.1.5", "zone-a", "n1")],
                              ports=[{"name": "http", "port": 8080, "protocol": "TCP"}]))
    c.apply("endpointslices", "DELETED", one)
    # listed by another Service's slice: that one alone, no grace for the dropped one
    assert [s.service for s in c.endpoint_services(ip("10.0.1.5"), 8080, 6)] == ["other"]


def test_slice_before_service_reports_port_zero_then_real_port() -> None:
    c = make()
    c.apply("endpointslices", "ADDED",
            k8s.endpointslice("s-1", "s", [k8s.endpoint("fd00:1::5", "zone-a", "n1", target="x", target_namespace="y")],
                              namespace="ns", address_type="IPv6", ports=[{"name": "a", "port": 7000}], noise=True))
    assert c.endpoint_services(ip("fd00:1::5"), 7000, 6)[0].port == 0
    c.apply("services", "ADDED",
            k8s.service("s", "ns", cluster_ip="fd00:96::1", ports=[{"name": "a", "port": 70, "targetPort": 7000}],
                        selector={}, noise=True))
    assert c.endpoint_services(ip("fd00:1::5"), 7000, 6)[0].port == 70


def test_odd_slices_do_not_break_the_index() -> None:
    c = make()
    c.replace("endpointslices", [
        k8s.endpointslice("noports", "s", [k8s.endpoint("10.0.1.1", "zone-a", "n1", target="x", target_namespace="y")],
                          namespace="ns", omit=("ports",), noise=True),
        k8s.endpointslice("noeps", "s", None, namespace="ns", ports=[{"port": 80}], omit=("endpoints",), noise=True),
        k8s.endpointslice("nolabel", None, [k8s.endpoint("10.0.1.2", "zone-a", "n1", target="x", target_namespace="y")],
                          namespace="ns", ports=[{"port": 80}], noise=True),
        k8s.endpointslice("fqdn", "s",
                          [k8s.endpoint("db.example.com", "zone-a", "n1", target="x",
                                        target_namespace="y")],
                          namespace="ns", address_type="FQDN", ports=[{"port": 80}], noise=True),
        k8s.endpointslice("dups", "s",
                          [k8s.endpoint("10.0.1.3", "zone-a", "n1", target="x", target_namespace="y"),
                           k8s.endpoint("10.0.1.3", "zone-a", "n1", target="x",
                                        target_namespace="y")], namespace="ns", ports=[{"port": 80}], noise=True),
        k8s.endpointslice("nilport", "s", [k8s.endpoint("10.0.1.4", "zone-a", "n1", target="x", target_namespace="y")],
                          namespace="ns", ports=[{"name": "all"}], noise=True),
    ])
    assert c.bad_objects()["endpointslices"] == 0
    assert c.endpoint_services(ip("10.0.1.2"), 80, 6) == ()
    assert len(c.endpoint_services(ip("10.0.1.3"), 80, 6)) == 1
    assert c.local_endpoints("n1") == frozenset({(ip("10.0.1.3"), 80, 6)})


def test_service_address_for_client_side_copies() -> None:
    c = _svc_cache()
    assert c.service_address(ip("10.96.0.10"), 80, 6) == ServicePort("shop", "web", 80, "http", 0, 6)
    assert c.service_address(ip("fd00:96::10"), 9090, 6) == ServicePort("shop", "web", 9090, "metrics", 9100, 6)
    assert c.service_address(ip("10.96.0.10"), 53, 17) == ServicePort("shop", "web", 53, "dns", 5353, 17)
    assert c.service_address(ip("10.96.0.10"), 81, 6) is None
    assert c.service_address(ip("10.0.1.5"), 80, 6) is None
    c.apply("services", "DELETED", k8s.service("web", "shop", cluster_ip=None, ports=[], selector={}, noise=True))
    assert c.service_address(ip("10.96.0.10"), 80, 6) is None
    assert not c.is_cluster_ip(ip("10.96.0.10"))


def test_headless_service_has_no_cluster_ip() -> None:
    c = make()
    c.apply("services", "ADDED",
            k8s.service("h", "ns", headless=True, ports=[{"port": 80}], selector={}, noise=True))
    assert c.service("ns", "h").cluster_ips == ()  # type: ignore[union-attr]


def test_local_endpoints_ready_or_serving_on_this_node() -> None:
    c = _svc_cache()
    local = c.local_endpoints("n1")
    addrs = {a for a, _, _ in local}
    assert addrs == {ip("10.0.1.5"), ip("10.0.1.6"), ip("10.0.1.8")}  # not 10.0.1.7, not n2's
    assert (ip("10.0.1.5"), 8080, 6) in local and (ip("10.0.1.5"), 5353, 17) in local
    assert len(local) == 9
    assert c.local_endpoints("n2") == frozenset({(ip("10.0.2.5"), p, pr) for p, pr in
                                                 ((8080, 6), (9100, 6), (5353, 17))})
    c.apply("endpointslices", "DELETED",
            k8s.endpointslice("web-abc", "web", None, omit=("ports", "endpoints"), noise=True))
    assert c.local_endpoints("n1") == frozenset()


def test_service_ports_are_every_port_a_service_uses_kept_for_the_grace() -> None:
    """Service ports, numeric targetPorts and slice ports (a named targetPort resolved per
    endpoint), any protocol; a port that leaves stays for grace_seconds (the datapath's
    ZM_PORT_SERVICE bits, docs/datapath.md "Late endpoints")."""
    clock = Clock()
    c = ClusterMetadata(MetadataSettings(grace_seconds=60), clock=clock)  # type: ignore[arg-type]
    assert c.service_ports() == frozenset()
    c.apply("services", "ADDED", k8s.service("web", "shop", ports=[
        {"name": "http", "port": 80, "targetPort": "http-port", "protocol": "TCP"},
        {"name": "rtp", "port": 40000, "targetPort": 40002, "protocol": "UDP"},
    ], selector={}, noise=True))
    assert c.service_ports() == {80, 40000, 40002}  # the named targetPort: not yet
    c.apply("endpointslices", "ADDED", k8s.endpointslice("web-abc", "web", [
        k8s.endpoint("10.0.1.5", "zone-a", "n1")], ports=[
        {"name": "http", "port": 8080, "protocol": "TCP"},
        {"name": "rtp", "port": 40002, "protocol": "UDP"}], noise=True))
    assert c.service_ports() == {80, 8080, 40000, 40002}
    c.apply("services", "DELETED", k8s.service("web", "shop", cluster_ip=None, ports=[], selector={}))
    c.apply("endpointslices", "DELETED",
            k8s.endpointslice("web-abc", "web", None, omit=("ports", "endpoints")))
    assert c.service_ports() == {80, 8080, 40000, 40002}  # the last exchanges keep them
    clock.t += 59
    assert c.service_ports() == {80, 8080, 40000, 40002}
    clock.t += 2
    assert c.service_ports() == frozenset()


# ---------------------------------------------------------------- raw objects, dirty, snapshot

def test_model_inputs_are_parsed_records() -> None:
    c = _svc_cache()
    c.apply("services", "ADDED",
            k8s.service("td", "ns", cluster_ip="10.96.1.1", ports=[{"port": 80}], selector={},
                        annotations={"service.kubernetes.io/topology-mode": "Auto"}, traffic_distribution="PreferClose",
                        noise=True))
    nodes, services, slices = c.model_inputs()
    # the kubelet's version survives pruning: it stands in for the node's kube-proxy version
    assert (NodeInfo("n1", "zone-a", True, False, 4000, "v1.31.0"), None) in nodes
    assert c.node_entry("n1") == (NodeInfo("n1", "zone-a", True, False, 4000, "v1.31.0"), None)
    td = next(s for s, err in services if s is not None and s.name == "td")
    # only the topology annotations are kept (kubectl's last-applied-configuration goes)
    assert td.annotations == {"service.kubernetes.io/topology-mode": "Auto"}
    assert td.traffic_distribution == "PreferClose"
    ns, svc_name, sl, err = slices[0]
    assert (ns, svc_name, err) == ("shop", "web", None) and sl is not None
    assert sl.address_type == "IPv4" and sl.ports[0] == ("http", 8080)
    assert sl.endpoints[0] == Endpoint("10.0.1.5", True, None, None, "zone-a", "n1", None)
    svc, its_slices = c.service_inputs("shop", "web")
    assert svc is not None and svc[0] is not None and svc[0].name == "web"
    assert [s[2].name for s in its_slices if s[2] is not None] == ["web-abc"]
    assert c.service_inputs("shop", "nope") == (None, [])


def test_take_dirty_tracks_services_and_nodes() -> None:
    c = make()
    c.take_dirty()
    c.apply("services", "ADDED",
            k8s.service("a", "ns", cluster_ip="10.96.0.1", ports=[{"port": 80}], selector={}, noise=True))
    c.apply("endpointslices", "ADDED",
            k8s.endpointslice("b-1", "b", [], namespace="ns", ports=[{"port": 80}], noise=True))
    d = c.take_dirty()
    assert d.services == frozenset({("ns", "a"), ("ns", "b")}) and not d.all
    assert c.take_dirty().services == frozenset()
    gen = c.generation("nodes")
    c.apply("nodes", "MODIFIED", k8s.node("n1", "zone-z", internal="192.168.0.1", region="region-1", noise=True))
    assert c.take_dirty().all and c.generation("nodes") == gen + 1
    assert c.resolve(ip("192.168.0.1")).zone == "zone-z"
    c.apply("nodes", "DELETED", k8s.node("n1", "zone-a", region="region-1", noise=True))
    assert c.resolve(ip("192.168.0.1")).kind is PeerKind.EXTERNAL


def test_unknown_event_types_are_ignored() -> None:
    c = make()
    gen = c.generation("pods")
    c.apply("pods", "BOOKMARK", k8s.pod("p", "10.0.1.1", "n1", namespace="ns", noise=True))
    assert c.generation("pods") == gen and c.counts()["pods"] == 0


def test_load_snapshot_fills_the_same_cache() -> None:
    items = [k8s.node("n1", "zone-a", internal="192.168.0.1", pod_cidrs=["10.0.1.0/24"], region="region-1", noise=True),
             k8s.pod("p", "10.0.1.5", "n1", namespace="ns", owner=("StatefulSet", "db"), noise=True),
             k8s.service("db", "ns", cluster_ip="10.96.0.5", ports=[{"port": 5432}], selector={}, noise=True),
             k8s.endpointslice("db-1", "db",
                               [k8s.endpoint("10.0.1.5", "zone-a", "n1", target="x",
                                             target_namespace="y")],
                               namespace="ns", ports=[{"port": 5432}], noise=True)]
    snap = snapshot.load_text(json.dumps({"kind": "List", "items": items}), "dump.json")
    c = ClusterMetadata()
    c.load_snapshot(snap)
    assert c.synced() == {"pods": True, "nodes": True, "services": True, "endpointslices": True}
    assert c.resolve(ip("10.0.1.5")).workload == "db"
    assert c.endpoint_services(ip("10.0.1.5"), 5432, 6)[0].port == 5432
    assert c.local_endpoints("n1") == frozenset({(ip("10.0.1.5"), 5432, 6)})


def test_memoized_answers_follow_changes() -> None:
    c = make()
    assert c.resolve(ip("10.0.1.30")).kind is PeerKind.UNKNOWN          # memoized miss
    c.apply("pods", "ADDED", k8s.pod("p", "10.0.1.30", "n1", namespace="ns", noise=True))
    assert c.resolve(ip("10.0.1.30")).zone == "zone-a"                 # memo dropped on add
    c.apply("nodes", "MODIFIED",
            k8s.node("n1", "zone-q", internal="192.168.0.1", pod_cidrs=["10.0.1.0/24"], region="region-1", noise=True))
    assert c.resolve(ip("10.0.1.30")).zone == "zone-q"                 # memo dropped on node change
    c.apply("pods", "ADDED", k8s.pod("hn", "10.0.1.31", "n2", namespace="kube-system", host_network=True, noise=True))
    assert c.resolve(ip("10.0.1.31")).kind is PeerKind.NODE
    c.apply("pods", "DELETED", k8s.pod("hn", "10.0.1.31", "n2", namespace="kube-system", host_network=True, noise=True))
    assert c.resolve(ip("10.0.1.31")).kind is PeerKind.UNKNOWN         # host-network pod gone


def test_a_full_memo_drops_its_older_half_and_answers_stay_right() -> None:
    c = make()
    c._memo_max = 8
    addrs = [ip(f"10.0.1.{i}") for i in range(100, 120)]
    first = [c.resolve(a) for a in addrs]
    # never emptied at once: 20 answers in a memo of 8 leave the 8 newest (clearing all
    # whenever full would leave the last 4)
    assert len(c._memo) == 8
    assert [c.resolve(a) for a in addrs] == first


def test_concurrent_writers_and_readers() -> None:
    """Watch threads write while the agent reads: no exception, and a consistent end."""
    import threading

    c = make()
    errors: list[BaseException] = []
    stop = threading.Event()

    def churn() -> None:
        try:
            for round_ in range(30):
                c.replace("pods",
                          [k8s.pod(f"p{i}", f"10.0.1.{i + 1}", "n1", namespace="ns", noise=True) for i in range(100)])
                for i in range(100):
                    c.apply("pods", "DELETED", k8s.pod(f"p{i}", f"10.0.1.{i + 1}", "n1", namespace="ns", noise=True))
                c.apply("endpointslices", "ADDED",
                        k8s.endpointslice("s-1", "s",
                                          [k8s.endpoint("10.0.1.1", "zone-a", "n1", target="x",
                                                        target_namespace="y")],
                                          namespace="ns", ports=[{"port": 80 + round_ % 2}], noise=True))
        except BaseException as err:  # noqa: BLE001
            errors.append(err)
        finally:
            stop.set()

    def read() -> None:
        try:
            while not stop.is_set():
                for i in range(100):
                    c.resolve(ip(f"10.0.1.{i + 1}"), at=1000.0)
                    c.endpoint_services(ip("10.0.1.1"), 80, 6)
                c.local_endpoints("n1")
                c.model_inputs()
        except BaseException as err:  # noqa: BLE001
            errors.append(err)

    threads = [threading.Thread(target=churn)] + [threading.Thread(target=read) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert c.counts()["pods"] == 0
    assert c.resolve(ip("10.0.1.5")).name == "p4"  # deleted, within the grace
    assert c.local_endpoints("n1") == frozenset({(ip("10.0.1.1"), 81, 6)})


def test_interrupted_relist_deletes_nothing() -> None:
    """A list that fails after some pages (410 on a continue token, stop) must not delete
    the objects of the pages it never read."""
    c = make()
    def addr(i: int) -> str:
        return f"10.0.{i // 200 + 1}.{i % 200 + 1}"

    c.replace("pods", [k8s.pod(f"p{i}", addr(i), "n1", namespace="ns", noise=True) for i in range(600)])

    def pages():  # type: ignore[no-untyped-def]
        yield from (k8s.pod(f"p{i}", addr(i), "n2", namespace="ns", noise=True) for i in range(550))
        raise RuntimeError("continue token expired")

    with pytest.raises(RuntimeError):
        c.replace("pods", pages())
    assert c.counts()["pods"] == 600
    assert c.resolve(ip(addr(0))).node == "n2"    # applied pages stay applied
    assert c.resolve(ip(addr(599))).node == "n1"  # unread pages untouched


def test_local_endpoints_skip_host_network_endpoints() -> None:
    c = make()
    c.apply("endpointslices", "ADDED", k8s.endpointslice("dns-1", "dns", [
        k8s.endpoint("192.168.0.1", "zone-a", "n1", target="x",
                     target_namespace="y"),   # the node's own address (a host-network endpoint)
        k8s.endpoint("10.0.1.40", "zone-a", "n1", target="x", target_namespace="y"),
        k8s.endpoint("10.0.1.41", "zone-a", "n1", target="x",
                     target_namespace="y")], namespace="kube-system", ports=[{"port": 53,
                                                                              "protocol": "UDP"}], noise=True))
    assert {a for a, _, _ in c.local_endpoints("n1")} == {ip("10.0.1.40"), ip("10.0.1.41")}
    c.apply("pods", "ADDED", k8s.pod("hn", "10.0.1.41", "n1", namespace="kube-system", host_network=True, noise=True))
    assert {a for a, _, _ in c.local_endpoints("n1")} == {ip("10.0.1.40")}
    # the cgroup hook sees host-network sockets: their endpoints are counted here as server
    assert {a for a, _, _ in c.local_endpoints("n1", host_network=True)} == {
        ip("192.168.0.1"), ip("10.0.1.40"), ip("10.0.1.41")}
    c.apply("pods", "DELETED", k8s.pod("hn", "10.0.1.41", "n1", namespace="kube-system", host_network=True, noise=True))
    assert {a for a, _, _ in c.local_endpoints("n1")} == {ip("10.0.1.40"), ip("10.0.1.41")}
    # the Service mapping still knows them: client-side counting needs it
    assert c.endpoint_services(ip("192.168.0.1"), 53, 17)[0].service == "dns"


def test_pod_cidrs_follow_node_changes() -> None:
    c = make()
    assert c.resolve(ip("10.0.2.200")).reason == "no_pod_for_ip"
    c.apply("nodes", "DELETED", k8s.node("n2", "zone-a", region="region-1", noise=True))
    assert c.resolve(ip("10.0.2.200")).kind is PeerKind.EXTERNAL
    # two nodes declaring one range (a misconfiguration, but possible): both must go
    c.apply("nodes", "ADDED", k8s.node("x1", "zone-a", pod_cidrs=["10.9.0.0/16"], region="region-1", noise=True))
    c.apply("nodes", "ADDED", k8s.node("x2", "zone-a", pod_cidrs=["10.9.0.0/16"], region="region-1", noise=True))
    c.apply("nodes", "DELETED", k8s.node("x1", "zone-a", region="region-1", noise=True))
    assert c.resolve(ip("10.9.1.1")).kind is PeerKind.UNKNOWN
    c.apply("nodes", "MODIFIED", k8s.node("x2", "zone-a", pod_cidrs=["10.8.0.0/16"], region="region-1", noise=True))
    assert c.resolve(ip("10.9.1.1")).kind is PeerKind.EXTERNAL
    assert c.resolve(ip("10.8.1.1")).kind is PeerKind.UNKNOWN


def test_first_address_of_a_pod_cidr_is_the_nodes_bridge_unless_a_pod_holds_it() -> None:
    c = make()
    gw = c.resolve(ip("10.0.1.1"))
    assert (gw.kind, gw.node, gw.zone) == (PeerKind.NODE, "n1", "zone-a")
    assert c.resolve(ip("fd00:1::1")).node == "n1"
    assert c.resolve(ip("10.0.2.1")).node == "n2"
    assert c.resolve(ip("10.0.1.2")).kind is PeerKind.UNKNOWN  # other free addresses: no pod
    c.apply("pods", "ADDED", k8s.pod("odd", "10.0.2.1", "n2", namespace="ns", noise=True))  # an IPAM that hands it out
    assert c.resolve(ip("10.0.2.1")).name == "odd"
    c.replace("nodes",
              [k8s.node("n1", "zone-a", internal="192.168.0.1", pod_cidrs=["10.0.9.0/24"], region="region-1",
                        noise=True)])
    assert c.resolve(ip("10.0.1.1")).kind is PeerKind.EXTERNAL  # n1 left that range
    assert c.resolve(ip("10.0.9.1")).node == "n1"


def test_endpoint_without_node_name_is_local_where_its_pod_runs() -> None:
    # a hand-written or mirrored slice (no nodeName): local on the node of the live pod
    # that holds the address, and it follows that pod
    c = make()
    c.apply("services", "ADDED",
            k8s.service("legacy", "shop", cluster_ip="10.96.0.71", ports=[{"port": 80}], selector={}, noise=True))
    c.apply("endpointslices", "ADDED",
            k8s.endpointslice("legacy-x", "legacy",
                              [k8s.endpoint("10.0.1.71", None, None, target="x", target_namespace="y"),
                               k8s.endpoint("10.0.9.9", None, None, target="x",
                                            target_namespace="y")], ports=[{"port": 8001,
                                                                            "protocol": "TCP"}], noise=True))
    assert c.local_endpoints("n1") == frozenset()  # no pod holds 10.0.1.71 yet
    c.apply("pods", "ADDED", k8s.pod("legacy-0", "10.0.1.71", "n1", noise=True))
    assert c.local_endpoints("n1") == frozenset({(ip("10.0.1.71"), 8001, 6)})
    assert c.local_endpoints("n2") == frozenset()
    c.apply("pods", "DELETED", k8s.pod("legacy-0", "10.0.1.71", "n1", noise=True))
    assert c.local_endpoints("n1") == frozenset()


def test_non_string_pod_cidrs_are_ignored_not_read_as_numbers() -> None:
    # JSON true / 7 in spec.podCIDRs: ip_network() would take them as 0.0.0.1/32, 0.0.0.7/32
    c = ClusterMetadata()
    c.replace("nodes",
              [k8s.node("n9", "zone-a", internal="192.168.9.1", pod_cidrs=[True, 7, "10.9.0.0/24"], region="region-1",
                        noise=True)])
    assert c.resolve(ip("0.0.0.1")).kind is PeerKind.EXTERNAL
    assert c.resolve(ip("0.0.0.7")).kind is PeerKind.EXTERNAL
    assert c.resolve(ip("10.9.0.5")).kind is PeerKind.UNKNOWN


def test_live_workloads_answers_which_still_have_a_pod() -> None:
    c = make()
    c.apply("pods", "ADDED",
            k8s.pod("solo", "10.0.1.40", "n1", namespace="ns", noise=True))  # owner-less: its own workload
    asked = {("ns", "solo", "Pod"), ("ns", "gone", "Pod"), ("other", "solo", "Pod")}
    assert c.live_workloads(asked) == {("ns", "solo", "Pod")}
    c.apply("pods", "DELETED", k8s.pod("solo", "10.0.1.40", "n1", namespace="ns", noise=True))
    assert c.live_workloads(asked) == set()
    c.apply("pods", "ADDED",
            k8s.pod("web-7c9f-x1", "10.0.1.41", "n1", namespace="ns", owner=("ReplicaSet", "web-7c9f"),
                    template_hash="7c9f", noise=True))
    assert c.live_workloads({("ns", "web", "Deployment"), ("ns", "api", "Deployment")}) == {
        ("ns", "web", "Deployment")}


def test_a_node_status_report_that_changes_nothing_read_dirties_nothing() -> None:
    """A kubelet's periodic status report (heartbeat times only, every 5 min per node) must not
    re-evaluate every Service nor drop the resolve memo: at 5,000 nodes that is 17 reports a
    second, so every agent tick would re-evaluate the whole cluster's hints."""
    c = make()
    c.take_dirty()
    gen = c.generation("nodes")
    beat = k8s.node("n2", "zone-b", internal=["192.168.0.2", "2001:db8::2"], pod_cidrs=["10.0.2.0/24"],
                    region="region-1", noise=True)
    beat["status"]["conditions"][1]["lastHeartbeatTime"] = "2026-12-07T13:00:00Z"
    beat["metadata"]["resourceVersion"] = "2"
    c.apply("nodes", "MODIFIED", beat)
    assert c.take_dirty().all is False and c.generation("nodes") == gen
    beat["metadata"]["labels"]["topology.kubernetes.io/zone"] = "zone-c"
    c.apply("nodes", "MODIFIED", beat)
    assert c.take_dirty().all is True and c.generation("nodes") == gen + 1
    assert c.node_zone("n2") == "zone-c"
