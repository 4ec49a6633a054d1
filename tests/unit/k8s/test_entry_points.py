"""ClusterMetadata.entry_points and MetadataAdapter.is_entry_point: where each node's uplink
counts the first hop of node ports (docs/datapath.md, "The first hop of a node port")."""

from __future__ import annotations

import ipaddress

from agent.k8s import ClusterMetadata, MetadataAdapter
from agent.k8s.snapshot import Snapshot
from tests.fixtures import k8s
from tests.fixtures.topologies import two_zone_cluster

ip = ipaddress.ip_address


def cache() -> ClusterMetadata:
    c = two_zone_cluster()
    services = c["services"] + [
        k8s.service("edge", cluster_ip="10.96.0.30", stype="LoadBalancer", load_balancer_ips=["203.0.113.9"],
                    ports=[k8s.http_port(80, 8080, node_port=30080), k8s.http_port(53, 53, name="dns",
                                                                                  node_port=30053, protocol="UDP")]),
        k8s.service("edge-local", cluster_ip="10.96.0.31", stype="NodePort", external_traffic_policy="Local",
                    ports=[k8s.http_port(80, 8080, node_port=30081)]),
        k8s.service("ext", cluster_ip="10.96.0.32", external_ips=["198.51.100.4"]),  # ClusterIP: Cluster
    ]
    m = ClusterMetadata()
    m.load_snapshot(Snapshot(nodes=c["nodes"], services=services, endpointslices=c["endpointslices"],
                             pods=c["pods"]))
    return m


def test_entry_points_of_a_node_are_its_addresses_node_ports_and_the_cluster_policy_doors() -> None:
    m = cache()
    assert m.entry_points("na") == frozenset({
        (ip("10.1.0.1"), 30080, 6), (ip("10.1.0.1"), 30053, 17),    # na's address, edge's node ports
        (ip("203.0.113.9"), 80, 6), (ip("203.0.113.9"), 53, 17),    # edge's LoadBalancer IP
        (ip("198.51.100.4"), 80, 6)})                                # ext's externalIP
    assert (ip("10.1.0.2"), 30080, 6) in m.entry_points("nb")
    assert m.entry_points("nx") == frozenset({(ip("203.0.113.9"), 80, 6), (ip("203.0.113.9"), 53, 17),
                                              (ip("198.51.100.4"), 80, 6)})  # an unknown node: no address
    # the Local Service changes to Cluster: its node port joins (memoized per generation)
    m.apply("services", "MODIFIED", k8s.service("edge-local", cluster_ip="10.96.0.31", stype="NodePort",
                                                ports=[k8s.http_port(80, 8080, node_port=30081)]))
    assert (ip("10.1.0.1"), 30081, 6) in m.entry_points("na")


def test_is_entry_point_only_for_a_nodes_address_and_a_cluster_policy_node_port() -> None:
    a = MetadataAdapter(cache())
    assert a.is_entry_point(ip("10.1.0.2"), 30080, 6)
    assert not a.is_entry_point(ip("10.1.0.2"), 30081, 6)       # Local
    assert not a.is_entry_point(ip("10.1.0.2"), 30080, 17)      # another protocol
    assert not a.is_entry_point(ip("203.0.113.9"), 80, 6)       # an LB IP: DNATed at the client's node
    assert not a.is_entry_point(ip("10.244.2.20"), 30080, 6)    # a pod
