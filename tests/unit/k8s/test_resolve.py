"""agent.k8s.resolve: MetadataAdapter (MetadataView/ObjectView) over a real ClusterMetadata."""

from __future__ import annotations

import ipaddress

from agent.k8s import ClusterMetadata, MetadataAdapter
from agent.k8s.snapshot import Snapshot
from agent.records import PeerKind
from tests.fixtures.topologies import two_zone_cluster

ip = ipaddress.ip_address


def loaded(hinted: bool = True) -> ClusterMetadata:
    c = two_zone_cluster(hinted)
    cache = ClusterMetadata()
    cache.load_snapshot(Snapshot(nodes=c["nodes"], services=c["services"],
                                 endpointslices=c["endpointslices"], pods=c["pods"]))
    return cache


def test_metadata_adapter_passes_through_and_turns_nodes_into_peers() -> None:
    m = MetadataAdapter(loaded())
    client = m.resolve(ip("10.244.1.10"), 0.0)
    assert (client.kind, client.zone, client.node, client.workload, client.workload_kind) == (
        PeerKind.POD, "zone-a", "na", "client", "Deployment")
    na = m.node("na")
    assert na is not None and (na.kind, na.zone, na.region, na.node) == (
        PeerKind.NODE, "zone-a", "region-1", "na")
    assert m.node("nope") is None
    [sp] = m.endpoint_services(ip("10.244.2.20"), 8080, 6)
    assert (sp.namespace, sp.service, sp.port, sp.target_port) == ("shop", "web", 80, 8080)
    sa = m.service_address(ip("10.96.0.10"), 80, 6)
    assert sa is not None and sa.service == "web"
    assert m.service_address(ip("10.96.0.10"), 81, 6) is None
