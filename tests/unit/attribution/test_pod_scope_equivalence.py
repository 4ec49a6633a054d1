"""``--pod-scope node`` against ``--pod-scope cluster``: the same flows, every node of a cluster.

Each node's agent is run twice over the same drained deltas: once with a cache holding every
Pod, once with a cache holding only that node's Pods (other nodes' pod addresses resolved
through EndpointSlices and podCIDRs, docs/metadata.md "Pod scope"). The whole /metrics
exposition of the two must be identical (nothing in it names a pod), and the ``/flows`` pair
rows may differ only in labels naming another node's pod. The deltas cover each row of the
rule table (docs/attribution.md): Service bytes at the endpoint from local, same-zone,
cross-zone and host-network clients (hint-ignored among them), client-side copies through a
ClusterIP and by direct dial, pod-to-pod without a Service in both directions, a host-network
server by port, a ClusterIP whose endpoints are all host-network, a zone CIDR, the internet,
and a local pod the watch has not reported yet (held, then counted).

Only the metadata source differs; the datapath is the fake of every loop test, attribution,
hint model and exporter are the real ones.
"""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest
from prometheus_client import generate_latest

from agent.exporter import Exporter
from agent.hints import HintModel
from agent.k8s.cache import ClusterMetadata, MetadataSettings
from agent.k8s.cidrs import ZoneCidr
from agent.k8s.snapshot import Snapshot
from agent.loop import AgentLoop
from agent.records import FlowDelta, FlowKind
from tests.fixtures import k8s
from tests.fixtures.fakes import Clock, FakeDatapath

ip = ipaddress.ip_address
E, IN, RQ, RS = FlowKind.EGRESS, FlowKind.INGRESS, FlowKind.REQUEST, FlowKind.RESPONSE

NODES = {"n1": ("zone-a", "192.168.0.1", "10.1.1.0/24"), "n2": ("zone-a", "192.168.0.2", "10.1.2.0/24"),
         "n3": ("zone-b", "192.168.0.3", "10.1.3.0/24")}
#: name -> (node, address, owner) of the app pods; web-* back Service web
WEB, CLIENT = ("ReplicaSet", "web-7c9d"), ("ReplicaSet", "client-5f6a")
PODS = {"web-1": ("n1", "10.1.1.10", WEB), "client-1": ("n1", "10.1.1.20", CLIENT),
        "web-2": ("n2", "10.1.2.10", WEB), "client-2": ("n2", "10.1.2.20", CLIENT),
        "batch-2": ("n2", "10.1.2.30", ("Job", "batch-29000")),
        "web-3": ("n3", "10.1.3.10", WEB), "client-3": ("n3", "10.1.3.20", CLIENT)}
ZONE_CIDRS = (ZoneCidr(ipaddress.ip_network("172.16.0.0/16"), "zone-b", "r1"),)


def cluster() -> dict[str, list[dict[str, Any]]]:
    nodes = [k8s.node(n, z, internal=a, pod_cidrs=[c], region="r1", noise=True) for n, (z, a, c) in NODES.items()]
    pods = []
    for name, (node, addr, owner) in PODS.items():
        app = name.split("-")[0]
        pods.append(k8s.pod(name, addr, node, app=app, owner=owner,
                            template_hash=owner[1].rsplit("-", 1)[1] if owner[0] == "ReplicaSet" else None,
                            noise=True))
    for node, (_, addr, _) in NODES.items():  # a host-network exporter on every node: 9100
        # backs Service metrics, 9200 backs none
        p = k8s.pod(f"metrics-{node}", addr, node, app="metrics", owner=("DaemonSet", "metrics"),
                    host_network=True)
        p["spec"]["containers"][0]["ports"] = [{"containerPort": 9100, "protocol": "TCP"},
                                               {"containerPort": 9200, "protocol": "TCP"}]
        pods.append(p)
    web_eps = [k8s.endpoint(PODS[w][1], NODES[PODS[w][0]][0], PODS[w][0], target=w,
                            for_zones=[NODES[PODS[w][0]][0]]) for w in ("web-1", "web-2", "web-3")]
    metrics_eps = [k8s.endpoint(a, z, n, target=f"metrics-{n}") for n, (z, a, _) in NODES.items()]
    services = [k8s.service("web", cluster_ip="10.96.0.10", traffic_distribution="PreferClose"),
                k8s.service("metrics", cluster_ip="10.96.0.20", ports=[k8s.http_port(9100, 9100)])]
    slices = [k8s.endpointslice("web-x", "web", web_eps),
              k8s.endpointslice("metrics-x", "metrics", metrics_eps,
                                ports=[{"name": "http", "port": 9100, "protocol": "TCP"}])]
    return {"nodes": nodes, "pods": pods, "services": services, "endpointslices": slices}


def deltas(node: str) -> list[FlowDelta]:
    """What the datapath of ``node`` drains: per local pod, every row of the rule table."""
    web = next(a for n, (nd, a, _) in PODS.items() if nd == node and n.startswith("web"))
    client = next(a for n, (nd, a, _) in PODS.items() if nd == node and n.startswith("client"))
    others = [a for n, (nd, a, _) in PODS.items() if nd != node and n.startswith("client")]
    remote_web = next(a for n, (nd, a, _) in PODS.items() if nd != node and n.startswith("web"))
    remote_host = next(a for n, (_, a, _) in NODES.items() if n != node)
    new_pod = str(ipaddress.ip_network(NODES[node][2])[77])   # a local pod not reported yet
    out: list[tuple[FlowKind, str, str, int, int]] = []
    for k, c in enumerate([client, *others]):                 # Service web at the local endpoint
        out += [(RQ, web, c, 8080, 1000 + k), (RS, web, c, 8080, 5000 + k)]
    out += [(RQ, web, remote_host, 8080, 333), (RS, web, remote_host, 8080, 777),   # a host client
            (E, client, "10.96.0.10", 80, 1200), (IN, client, "10.96.0.10", 80, 5100),  # ClusterIP copy
            (E, client, remote_web, 8080, 210), (IN, client, remote_web, 8080, 420),   # direct dial
            (E, client, "10.1.2.30", 9000, 64), (IN, client, "10.1.2.30", 0, 128),    # batch-2, no Service
            (E, client, others[0], 0, 31), (IN, client, others[0], 0, 17),          # pod to pod
            (E, client, remote_host, 9100, 90), (IN, client, remote_host, 9100, 900),  # host endpoint, direct
            (E, client, remote_host, 9200, 91), (IN, client, remote_host, 9200, 901),  # host-network pod by port
            (E, client, "10.96.0.20", 9100, 55), (IN, client, "10.96.0.20", 9100, 550),  # all endpoints host-network
            (E, client, "172.16.3.4", 5432, 40), (IN, client, "172.16.3.4", 5432, 400),  # a zone CIDR
            (E, client, "93.184.216.34", 443, 20), (IN, client, "93.184.216.34", 443, 200),  # the internet
            (E, new_pod, "93.184.216.34", 443, 11), (IN, new_pod, others[0], 0, 12)]
    return [FlowDelta(kind, ip(local), ip(remote), port, 6, nb, 1, ifindex=4 + (local == new_pod))
            for kind, local, remote, port, nb in out]


def run(node: str, scope: str, hook: str = "veth") -> tuple[str, AgentLoop, tuple[Any, ...]]:
    """The exposition after three ticks (the held bytes counted), the loop, and the pair
    rows of the first interval."""
    c = cluster()
    clock = Clock(1000.0)
    cache = ClusterMetadata(MetadataSettings(zone_cidrs=ZONE_CIDRS, pod_node=node if scope == "node" else None),
                            clock=clock)
    cache.load_snapshot(Snapshot(nodes=c["nodes"], services=c["services"],
                                 endpointslices=c["endpointslices"], pods=c["pods"]))
    exporter = Exporter(version="t")
    dp = FakeDatapath()
    dp.hook = hook  # type: ignore[attr-defined]  # "cgroup": the socket view (sockets_seen)
    loop = AgentLoop(node, dp, cache, HintModel(cache), exporter, interval=10, clock=clock,
                     perf=lambda: 0.0, monotonic=clock, hold_unresolved_seconds=60, series_retention=600)
    dp.pending = deltas(node)
    loop.tick()
    pairs = loop.attributor.totals().top_pairs
    clock.advance(10)
    loop.tick()  # the new pod is still held: no pod for its address yet
    clock.advance(61)
    loop.tick()  # the hold ran out: counted as it resolves (unknown)
    return generate_latest(exporter.registry()).decode(), loop, pairs


@pytest.mark.parametrize("hook", ["veth", "cgroup"])
@pytest.mark.parametrize("node", sorted(NODES))
def test_every_exported_series_is_the_same_in_both_scopes(node: str, hook: str) -> None:
    cluster_text, cl, _ = run(node, "cluster", hook)
    node_text, nl, _ = run(node, "node", hook)
    assert cluster_text == node_text
    # the node-scope cache holds this node's pods only, the other one all of them
    assert nl.cache.counts()["pods"] == sum(1 for _, (n, _, _) in PODS.items() if n == node) + 1
    assert cl.cache.counts()["pods"] == len(PODS) + len(NODES)
    t = cl.attributor.totals()
    # the flows reached every family the exposition compares (the equality is not vacuous)
    assert t.hint_ignored_bytes and t.client_path_bytes and t.workload_bytes
    # the veth hook counts the all-host-network ClusterIP at the client, zone unknown
    assert bool(t.unknown_crossing_bytes) == (hook == "veth")
    assert {"clusterip_client_copy", "endpoint_client_copy", "pod_peer_ingress"} <= set(t.skipped_bytes)
    assert t.held_bytes == 0 and t.bytes_seen == sum(d.bytes for d in deltas(node))


@pytest.mark.parametrize("node", sorted(NODES))
def test_pair_rows_differ_only_in_the_names_of_other_nodes_pods(node: str) -> None:
    _, _, crows = run(node, "cluster")
    _, _, nrows = run(node, "node")
    assert len(crows) == len(nrows)
    remote_pods = {f"shop/{n}": a for n, (nd, a, _) in PODS.items() if nd != node}
    remote_pods |= {f"shop/metrics-{n}": a for n, (_, a, _) in NODES.items() if n != node}
    renamed = 0
    for c, n in zip(crows, nrows, strict=True):
        assert (c.bytes, c.namespace, c.service, c.client_zone, c.server_zone, c.crossing, c.port) == (
            n.bytes, n.namespace, n.service, n.client_zone, n.server_zone, n.crossing, n.port)
        for cl_label, n_label in ((c.client, n.client), (c.server, n.server)):
            if cl_label == n_label:
                continue
            renamed += 1
            # a pod of another node: by its targetRef name when it is an endpoint, else by
            # its address (or, a host-network server, its node)
            assert cl_label in remote_pods, (cl_label, n_label)
            assert n_label in (remote_pods[cl_label],
                               f"node/{next(x for x, v in NODES.items() if v[1] == remote_pods[cl_label])}"
                               if cl_label.startswith("shop/metrics-") else "")
    assert renamed  # pod-to-pod rows name client-* pods of other nodes
