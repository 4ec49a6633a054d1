"""Benchmark: flow deltas attributed per second with a full-scale metadata cache.

Builds dict-backed fakes of ``MetadataView`` and ``HintView`` holding 150,000 pods on
5,000 nodes (3 zones) and 10,000 Services (3 endpoints each, zone hints on half of them),
then feeds one node's :class:`agent.attribution.Attributor` batches of synthetic deltas with
the mix a node's datapath drains: Service requests and responses at local endpoints from
clients anywhere in the cluster, client-side ClusterIP copies, pod-to-pod, pod-to-node and
pod-to-external traffic. Each batch uses fresh flows (the per-call caches start cold for
remote addresses, as after a real drain). Target: >= 200,000 deltas/s.

Usage:
    python -m bench.bench_attribution [--pods 150000] [--nodes 5000] [--services 10000]
        [--batch 50000] [--batches 20] [--seed 1] [--remotes N]

Examples:
    python -m bench.bench_attribution                 # full scale
    python -m bench.bench_attribution --batch 5000    # smaller drains
    python -m bench.bench_attribution --batch 5000 --per-drain 10   # one drain, 10 batches
    python -m bench.bench_attribution --remotes 2000  # clients repeat within a drain
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import ipaddress
import random
import time

from agent.attribution import Attributor
from agent.records import (
    FlowDelta,
    FlowKind,
    IPAddress,
    Peer,
    PeerKind,
    ProxyView,
    ServicePort,
)
from tests.fixtures.fakes import DictHints, DictMetadata, LocalityDiag

ZONES = ("zone-a", "zone-b", "zone-c")


def build(pods: int, nodes: int, services: int, rng: random.Random
          ) -> tuple[DictMetadata, DictHints, list[list[IPAddress]], list[IPAddress], list[tuple[IPAddress, int]]]:
    meta, hints = DictMetadata(), DictHints()
    node_ips: list[IPAddress] = []
    for i in range(nodes):
        name = f"node-{i}"
        zone = ZONES[i % 3]
        p = Peer(PeerKind.NODE, zone=zone, region="r1", node=name)
        meta.nodes[name] = p
        hints.node_zone[name] = zone
        ip = ipaddress.IPv4Address(0xC0A80000 + i)  # 192.168.x.y
        meta.peers[ip] = p
        node_ips.append(ip)
    pods_by_node: list[list[IPAddress]] = [[] for _ in range(nodes)]
    for i in range(pods):
        n = i % nodes
        ip = ipaddress.IPv4Address(0x0A000000 + i)  # 10.x.y.z
        meta.peers[ip] = Peer(PeerKind.POD, zone=ZONES[n % 3], region="r1", node=f"node-{n}",
                              namespace=f"ns-{i % 200}", name=f"pod-{i}", workload=f"wl-{i // 3}",
                              workload_kind="Deployment")
        pods_by_node[n].append(ip)
    all_pods = [ip for lst in pods_by_node for ip in lst]
    cluster_ips: list[tuple[IPAddress, int]] = []
    for s in range(services):
        ns, name = f"ns-{s % 200}", f"svc-{s}"
        sp = ServicePort(ns, name, 80, "http", 8080, 6)
        cip = ipaddress.IPv4Address(0x0A600000 + s)  # 10.96.x.y
        meta.addresses[(cip, 80, 6)] = sp
        cluster_ips.append((cip, 80))
        eps = [all_pods[(s * 3 + k) % len(all_pods)] for k in range(3)]
        for e in eps:
            meta.endpoints[(e, 8080, 6)] = meta.endpoints.get((e, 8080, 6), ()) + (sp,)
        hinted = s % 2 == 0
        zv = {}
        for z in ZONES:
            sel = frozenset(str(e) for e in eps if not hinted or meta.peers[e].zone == z)
            zv[z] = ProxyView("PreferSameZone" if hinted and sel else "", sel or
                              frozenset(str(e) for e in eps), "cluster")
        hints.zone_views[(ns, name)] = zv
        hints.diag[(ns, name)] = LocalityDiag("trafficDistribution" if hinted else "none",
                                       "none" if hinted else "not_requested",
                                       {z: hinted for z in ZONES})
    return meta, hints, pods_by_node, node_ips, cluster_ips


def deltas(batch: int, local_pods: list[IPAddress], meta: DictMetadata, all_pods: list[IPAddress],
           node_ips: list[IPAddress], cluster_ips: list[tuple[IPAddress, int]],
           rng: random.Random, veth: bool = False) -> list[FlowDelta]:
    local_eps = [k for k in meta.endpoints if k[0] in set(local_pods)]
    out = []
    R, S, E, IN = FlowKind.REQUEST, FlowKind.RESPONSE, FlowKind.EGRESS, FlowKind.INGRESS
    for _ in range(batch // 2):
        x = rng.random()
        nb = rng.randint(60, 1_000_000)
        if x < 0.45 and local_eps:   # service traffic at a local endpoint
            ep, port, proto = rng.choice(local_eps)
            client = rng.choice(all_pods)
            out.append(FlowDelta(R, ep, client, port, proto, nb, 1))
            out.append(FlowDelta(S, ep, client, port, proto, nb * 3, 1))
        elif x < 0.75:               # client-side ClusterIP copies
            cip, port = rng.choice(cluster_ips)
            lp = rng.choice(local_pods)
            out.append(FlowDelta(E, lp, cip, port, 6, nb, 1))
            out.append(FlowDelta(IN, lp, cip, port, 6, nb * 3, 1))
        elif x < 0.90:               # pod to pod, no Service
            lp = rng.choice(local_pods)
            rp = rng.choice(all_pods)
            out.append(FlowDelta(E, lp, rp, 5432, 6, nb, 1))
            out.append(FlowDelta(IN, lp, rp, 5432, 6, nb, 1))
        elif x < 0.95:               # pod to node
            lp = rng.choice(local_pods)
            out.append(FlowDelta(E, lp, rng.choice(node_ips), 10250, 6, nb, 1))
            out.append(FlowDelta(IN, lp, rng.choice(node_ips), 10250, 6, nb, 1))
        else:                        # pod to the internet
            lp = rng.choice(local_pods)
            ext = ipaddress.IPv4Address(rng.randint(0x08000000, 0x09000000))
            out.append(FlowDelta(E, lp, ext, 443, 6, nb, 1))
            out.append(FlowDelta(IN, lp, ext, 443, 6, nb * 5, 1))
    if veth:  # as the kernel keys them: each local pod behind a veth of its own
        index = {a: 100 + i for i, a in enumerate(local_pods)}
        out = [dataclasses.replace(d, ifindex=index[d.local]) for d in out]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[11:]))
    ap.add_argument("--pods", type=int, default=150_000)
    ap.add_argument("--nodes", type=int, default=5_000)
    ap.add_argument("--services", type=int, default=10_000)
    ap.add_argument("--batch", type=int, default=50_000, help="deltas per attribute() call")
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--per-drain", type=int, default=1,
                    help="consecutive batches that form one drain (same `at`, one "
                    "close_interval() after the last)")
    ap.add_argument("--remotes", type=int, default=0,
                    help="draw remote pods from this many (0: all pods); a real node's "
                    "endpoints see a bounded set of clients, so per-call caches hit more")
    ap.add_argument("--veth", action="store_true",
                    help="deltas carry their local pod's veth (FlowDelta.ifindex), as drained")
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    t0 = time.perf_counter()
    meta, hints, pods_by_node, node_ips, cluster_ips = build(args.pods, args.nodes, args.services, rng)
    all_pods = [ip for lst in pods_by_node for ip in lst]
    if args.remotes:
        all_pods = rng.sample(all_pods, args.remotes)
    print(f"remote pods drawn from {len(all_pods)}")
    print(f"cache: {args.pods} pods, {args.nodes} nodes, {args.services} services "
          f"built in {time.perf_counter() - t0:.1f} s")
    node = 0
    local = pods_by_node[node]
    at = Attributor(f"node-{node}", meta, hints)
    gc.collect()
    total = 0
    attr_s = 0.0
    attr_cpu = 0.0
    close_s: list[float] = []
    seen = 0
    for i in range(args.batches):
        drain = i // args.per_drain
        # generated outside the timing, one batch alive at a time (like a real drain)
        b = deltas(args.batch, local, meta, all_pods, node_ips, cluster_ips, rng, args.veth)
        seen += sum(d.bytes for d in b)
        start, cpu = time.perf_counter(), time.process_time()
        at.attribute(b, 1_764_470_000.0 + 10 * drain)
        attr_s += time.perf_counter() - start
        attr_cpu += time.process_time() - cpu
        total += len(b)
        del b
        if (i + 1) % args.per_drain == 0 or i + 1 == args.batches:
            start = time.perf_counter()
            at.close_interval(1_764_470_000.0 + 10 * drain + 10)
            close_s.append(time.perf_counter() - start)
    start = time.perf_counter()
    t = at.totals()
    totals_s = time.perf_counter() - start
    assert t.bytes_seen == seen
    print(f"attribute(): {total} deltas in {attr_s:.2f} s: {total / attr_s:,.0f} deltas/s "
          f"wall, {total / attr_cpu:,.0f} deltas/s CPU time "
          f"(batches of {args.batch}, {args.per_drain} per drain)")
    print(f"close_interval() over {args.services} Services: first {close_s[0] * 1000:.0f} ms, "
          f"then median {sorted(close_s[1:] or close_s)[len(close_s[1:] or close_s) // 2] * 1000:.0f} ms "
          f"(once per interval)")
    both = attr_s + sum(close_s)
    print(f"with one close_interval() per drain: {total / both:,.0f} deltas/s")
    print(f"series: service {len(t.service_bytes)}, workload {len(t.workload_bytes)}, "
          f"hint_ignored {len(t.hint_ignored_bytes)}; totals() {totals_s * 1000:.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
