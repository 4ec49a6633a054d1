"""Attacks on the Attributor's contract that broke it once: a NaN hold kept bytes held
forever; ingress from a node's bridge gateway (first address of its podCIDR) was skipped
as a pod's copy and counted nowhere."""

from __future__ import annotations

import ipaddress
import math

from agent.exporter import Exporter
from agent.hints import HintModel
from agent.k8s.cache import ClusterMetadata
from agent.k8s.snapshot import Snapshot
from agent.loop import AgentLoop
from agent.records import FlowDelta, FlowKind
from tests.fixtures.fakes import FakeDatapath
from tests.fixtures.topologies import two_zone_cluster

ip = ipaddress.ip_address


def test_nan_hold_never_loses_bytes() -> None:
    c = two_zone_cluster()
    cache = ClusterMetadata()
    cache.load_snapshot(Snapshot(nodes=c["nodes"], services=c["services"],
                                 endpointslices=c["endpointslices"], pods=c["pods"]))
    dp = FakeDatapath()
    t = [1000.0]
    try:
        loop = AgentLoop("nb", dp, cache, HintModel(cache), Exporter(version="t"), interval=10,
                         clock=lambda: t[0], hold_unresolved_seconds=math.nan)
    except ValueError:
        return  # refusing NaN is a fix too
    # a request to web-b from an address in nb's pod CIDR that no pod holds (yet)
    dp.pending = [FlowDelta(FlowKind.REQUEST, ip("10.244.2.20"), ip("10.244.2.99"), 8080, 6, 500, 1)]
    loop.tick()
    t[0] += 3600
    loop.tick()
    loop.flush_held()
    tot = loop.attributor.totals()
    assert tot.held_bytes == 0
    assert sum(tot.service_bytes.values()) == 500


def test_ingress_from_the_node_bridge_gateway_is_counted_once() -> None:
    c = two_zone_cluster()
    cache = ClusterMetadata()
    cache.load_snapshot(Snapshot(nodes=c["nodes"], services=c["services"],
                                 endpointslices=c["endpointslices"], pods=c["pods"]))
    dp = FakeDatapath()
    loop = AgentLoop("nb", dp, cache, HintModel(cache), Exporter(version="t"), interval=10,
                     clock=lambda: 1000.0, hold_unresolved_seconds=60)
    # client-b (10.244.2.10) on nb and nb's bridge address 10.244.2.1 (podCIDR 10.244.2.0/24)
    dp.pending = [FlowDelta(FlowKind.INGRESS, ip("10.244.2.10"), ip("10.244.2.1"), 0, 6, 300, 1),
                  FlowDelta(FlowKind.EGRESS, ip("10.244.2.10"), ip("10.244.2.1"), 0, 6, 200, 1)]
    loop.tick()
    loop.flush_held()
    tot = loop.attributor.totals()
    assert "pod_peer_ingress" not in tot.skipped_bytes
    assert sum(tot.workload_bytes.values()) == 500
