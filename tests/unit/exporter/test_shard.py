"""The locality series' owners (agent/exporter/shard.py; docs/metrics.md, "Locality series").

Properties: with more nodes than replicas every Service has exactly ``replicas`` distinct
owners among the nodes, a node leaving changes the owners only of the Services it owned,
small clusters and ``replicas=0`` export everything, and an agent always exports the
Services it holds bytes of; through the real loop, two agents with one replica export each
idle Service exactly once between them.
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.exporter import Exporter
from agent.exporter.shard import LocalityShard, ring_point
from agent.hints import HintModel
from agent.k8s.cache import ClusterMetadata
from agent.k8s.snapshot import Snapshot
from agent.loop import AgentLoop
from agent.records import FlowDelta, FlowKind, ServiceRef
from tests.fixtures.fakes import FakeDatapath
from tests.fixtures.topologies import two_zone_cluster

REFS = [ServiceRef(f"ns{i % 7}", f"svc-{i}") for i in range(400)]


def owners(nodes: list[str], ref: ServiceRef, replicas: int) -> set[str]:
    """The nodes whose shard owns ``ref`` (each node's shard asked on its own)."""
    out = set()
    for n in nodes:
        shard = LocalityShard(n, replicas)
        shard.select({}, nodes)
        if shard.owns(ref):
            out.add(n)
    return out


@settings(max_examples=25, deadline=None)
@given(st.integers(4, 30), st.integers(1, 3))
def test_every_service_has_exactly_replicas_owners(n: int, replicas: int) -> None:
    nodes = [f"node-{i}" for i in range(n)]
    for ref in REFS[:60]:
        assert len(owners(nodes, ref, replicas)) == replicas, ref


def test_a_node_leaving_moves_only_the_services_it_owned() -> None:
    nodes = [f"ip-10-0-{i}-7.ec2.internal" for i in range(12)]
    gone = nodes[5]
    rest = [n for n in nodes if n != gone]
    moved = 0
    for ref in REFS:
        before, after = owners(nodes, ref, 3), owners(rest, ref, 3)
        if gone in before:
            assert before - {gone} <= after and len(after) == 3, ref
            moved += 1
        else:
            assert after == before, ref
    assert 0 < moved < len(REFS) // 2


def test_the_ring_spreads_services_over_nodes() -> None:
    nodes = [f"n{i}" for i in range(10)]
    load = {n: 0 for n in nodes}
    for ref in REFS:
        for n in owners(nodes, ref, 1):
            load[n] += 1
    assert sum(load.values()) == len(REFS)
    assert min(load.values()) > 0, load


def test_small_clusters_and_replicas_zero_export_everything() -> None:
    loc = {ref: object() for ref in REFS[:20]}
    assert LocalityShard("a", 3).select(loc, ["a", "b", "c"]) == loc
    assert LocalityShard("a", 0).select(loc, [f"n{i}" for i in range(50)]) == loc
    # a node the cache does not know yet exports only its own Services' state
    got = LocalityShard("new", 2).select(loc, [f"n{i}" for i in range(50)], active=[REFS[3]])
    assert set(got) == {REFS[3]}


def test_active_services_are_exported_whatever_the_ring_says() -> None:
    nodes = [f"n{i}" for i in range(40)]
    loc = {ref: ref.service for ref in REFS}
    shard = LocalityShard("n7", 1)
    owned = set(shard.select(loc, nodes))
    assert 0 < len(owned) < len(REFS)
    idle = [r for r in REFS if r not in owned][:5]
    got = shard.select(loc, nodes, active=idle)
    assert set(got) == owned | set(idle)
    assert all(got[r] == r.service for r in got)


def test_ring_points_are_stable_across_processes() -> None:
    # every agent must place a name at the same point: not Python's salted hash()
    code = "from agent.exporter.shard import ring_point; print(ring_point('shop/web'))"
    got = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONHASHSEED": seed}).stdout
           for seed in ("1", "2", "3")}
    assert got == {f"{ring_point('shop/web')}\n"}
    assert ring_point("shop/web") != ring_point("shop/db")


def test_negative_replicas_are_refused() -> None:
    with pytest.raises(ValueError, match="replicas must be >= 0"):
        LocalityShard("n", -1)


def _loop(node: str) -> tuple[AgentLoop, FakeDatapath, Exporter]:
    c = two_zone_cluster()
    cache = ClusterMetadata(clock=lambda: 1000.0)
    cache.load_snapshot(Snapshot(nodes=c["nodes"], services=c["services"],
                                 endpointslices=c["endpointslices"], pods=c["pods"]))
    dp, exp = FakeDatapath(), Exporter(version="t")
    return AgentLoop(node, dp, cache, HintModel(cache), exp, interval=10,
                     clock=lambda: 1000.0, locality_replicas=1), dp, exp


def test_two_agents_one_replica_export_each_idle_service_once_and_their_own_always() -> None:
    loops = {n: _loop(n) for n in ("na", "nb")}
    for loop, _, _ in loops.values():
        loop.tick()
    exported = {n: set(exp.snapshot().locality) for n, (_, _, exp) in loops.items()}
    every = {ServiceRef("shop", "web"), ServiceRef("shop", "db")}
    assert exported["na"] | exported["nb"] == every
    assert not exported["na"] & exported["nb"], exported
    # bytes of both Services at both nodes: each agent exports both from then on
    ip = ipaddress.ip_address
    loops["na"][1].pending = [FlowDelta(FlowKind.REQUEST, ip("10.244.1.20"), ip("10.244.2.10"),
                                        8080, 6, 1000, 1)]
    loops["nb"][1].pending = [FlowDelta(FlowKind.REQUEST, ip("10.244.2.30"), ip("10.244.1.10"),
                                        5432, 6, 1000, 1),
                              FlowDelta(FlowKind.REQUEST, ip("10.244.2.20"), ip("10.244.1.10"),
                                        8080, 6, 1000, 1)]
    for loop, _, _ in loops.values():
        loop.tick()
    exported = {n: set(exp.snapshot().locality) for n, (_, _, exp) in loops.items()}
    assert ServiceRef("shop", "web") in exported["na"]
    assert exported["nb"] == every


def _mixed_cluster(n_services: int) -> tuple[ClusterMetadata, list[str]]:
    """A cluster of 12 Nodes where the agent DaemonSet runs on 6: 3 Windows nodes (outside
    its nodeSelector: no pod), 2 virtual nodes (its pod scheduled, never started: no IP), a
    node whose agent pod was deleted; ``n_services`` Services with one endpoint each.
    Returns the cache and the nodes that run an agent."""
    from tests.fixtures import k8s

    nodes = [f"n{i}" for i in range(12)]
    running, pending = nodes[:6], nodes[9:11]
    pods = [k8s.pod(f"agent-{n}", f"10.0.0.{i + 1}", n, namespace="zonemeter", app="agent",
                    owner=("DaemonSet", "zonemeter-agent"), host_network=True)
            for i, n in enumerate(nodes) if n in running]
    pods += [k8s.pod(f"agent-{n}", None, n, namespace="zonemeter", app="agent",
                     owner=("DaemonSet", "zonemeter-agent"), phase="Pending") for n in pending]
    # another DaemonSet of the same namespace, on every node: not ours
    pods += [k8s.pod(f"other-{n}", f"10.0.1.{i + 1}", n, namespace="zonemeter", app="other",
                     owner=("DaemonSet", "node-exporter"), host_network=True)
             for i, n in enumerate(nodes)]
    services, slices = [], []
    for s in range(n_services):
        ip = f"10.244.{s // 200}.{s % 200 + 10}"
        services.append(k8s.service(f"svc-{s}", cluster_ip=f"10.96.{s // 200}.{s % 200 + 1}"))
        slices.append(k8s.endpointslice(f"svc-{s}-a", f"svc-{s}", [k8s.endpoint(ip, "zone-a", "n0")]))
        pods.append(k8s.pod(f"svc-{s}-0", ip, "n0", app=f"svc-{s}"))
    cache = ClusterMetadata(clock=lambda: 1000.0)
    cache.load_snapshot(Snapshot(nodes=[k8s.node(n, "zone-a" if i % 2 else "zone-b")
                                        for i, n in enumerate(nodes)],
                                 services=services, endpointslices=slices, pods=pods))
    # its node has no agent right now
    cache.apply("pods", "DELETED", k8s.pod("agent-n5", "10.0.0.6", "n5", namespace="zonemeter"))
    return cache, running[:5]


def test_the_ring_holds_the_nodes_running_the_agent_and_every_service_keeps_an_exporter() -> None:
    cache, agents = _mixed_cluster(300)
    hints = HintModel(cache)
    refs = {ServiceRef("shop", f"svc-{s}") for s in range(300)}
    exported: dict[str, set[ServiceRef]] = {}
    for n in agents:
        loop = AgentLoop(n, FakeDatapath(), cache, hints, Exporter(version="t"), interval=10,
                         clock=lambda: 1000.0, locality_replicas=2,
                         agent_pod=("zonemeter", f"agent-{n}"))
        assert loop.ring_nodes() == frozenset(agents)
        loop.tick()
        exported[n] = set(loop.exporter.snapshot().locality) & refs
    per_service = {r: sum(r in e for e in exported.values()) for r in refs}
    assert set(per_service.values()) == {2}, "each Service exactly --locality-replicas times"
    # the ring of every Node (no pod identity) leaves Services whose owners all lack an agent
    orphans = 0
    for r in refs:
        owners_all = owners(sorted(cache.node_names()), r, 2)
        orphans += not owners_all & set(agents)
    assert orphans > 0


def test_without_its_pod_in_the_cache_the_ring_is_every_node() -> None:
    cache, agents = _mixed_cluster(1)
    loop = AgentLoop("n5", FakeDatapath(), cache, HintModel(cache), Exporter(version="t"),
                     interval=10, clock=lambda: 1000.0, agent_pod=("zonemeter", "agent-n5"))
    assert loop.ring_nodes() == cache.node_names() and len(cache.node_names()) == 12
    assert cache.workload_nodes("zonemeter", "agent-n0") == frozenset(agents)


def test_an_agent_holding_only_a_services_first_hops_holds_bytes_of_it() -> None:
    from agent.loop import active_services
    from agent.records import AttributionTotals, ServiceBytesKey, ServiceRef

    key = ServiceBytesKey("shop", "edge", "80", "zone-a", "zone-b", "cross_zone", "request",
                          "load-balancer", "aws-nlb")
    assert active_services(AttributionTotals(service_entry_bytes={key: 10})) == {ServiceRef("shop", "edge")}
