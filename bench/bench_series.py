"""Benchmark: Prometheus series one node's agent exports, as pods and connections grow.

Target (docs/metrics.md): the series count must not grow with pods or connections, only with
Services x zone pairs. For each point of a grid (pods, connections per pod, Services,
zones) this builds a synthetic cluster with the dict-backed ``MetadataView`` /
``HintView`` fakes of ``bench/bench_attribution.py`` (imported, not copied), feeds one
node's real :class:`agent.attribution.Attributor` one interval of :class:`FlowDelta`
batches, maps the totals with the real :func:`agent.loop.build_snapshot`, scrapes the
real :class:`agent.exporter.Exporter` (``prometheus_client.generate_latest`` on its
registry) and counts sample lines per metric family. It also checks that no label value
is a pod name or an IP address (per-pod detail must never become a series).

Cluster model (per grid point): ``pods`` pods on ``max(2 * zones, pods // 100)`` nodes
(node ``n`` in zone ``n % zones``); ``services`` Services (one port each), Service ``s``
backed by Deployment ``wl-s`` whose pods are every ``services``-th pod; the measured node
``node-0`` (first zone) holds the first pod of every Deployment (so one endpoint of every
Service: the worst case for one node) plus its share of the others, which are spread so
that every Service has endpoints in every zone. Every other Service asks for ``trafficDistribution: PreferSameZone``.

Traffic drained by node-0 in the interval (worst case: every pod is a client here):

* Service traffic: ``pods x conns`` connections to node-0's endpoints (REQUEST and
  RESPONSE deltas), spread evenly over the Services and over ``zones + 2`` client classes:
  a pod on node-0, a pod on another node of node-0's zone, a pod in each other zone, an
  external client (LoadBalancer traffic);
* client-side ClusterIP copies: each local pod opens ``conns`` connections to ClusterIPs
  (skipped here: the endpoint's node counts them);
* non-Service traffic: each local pod opens ``conns`` connections to each of these peer
  classes: a pod on node-0, a pod elsewhere in its zone, a pod in each other zone, the same
  for nodes, a CIDR-mapped address in another zone, one in another region, and the
  internet (EGRESS and INGRESS deltas; every connection has a distinct remote address).

Churn mode (``--churn N``): series stay bounded while pods come and go. A real
``ClusterMetadata`` cache (API-shaped objects), ``HintModel``, ``Attributor`` with
``series_retention`` and the ``MetadataAdapter`` as its object view, on a fake clock: N
owner-less pods (``--churn-kind job``: each owned by its own Job) replace each other one by
one on node-0, each living ``--lifetime`` seconds behind its own Service (created with it,
deleted with it), receiving a request from a steady client pod and sending to the internet
every ``--interval``. Every tenth of the run it reports the live service and workload series,
all exported sample lines (a real scrape), the expiry counter, and the memory tracemalloc
sees allocated (cache, model, attributor, exporter), once with ``--retention`` and once
with expiry off.

Usage:
    python -m bench.bench_series [--pods 1000,10000,100000] [--conns 1,10]
        [--services 10,100,200] [--zones 3] [--seed 1] [--bare-pods] [-o table|json]
    python -m bench.bench_series --churn N [--lifetime 60] [--interval 10]
        [--retention 600] [--churn-kind pod|job] [-o table|json]

Examples:
    python -m bench.bench_series                      # the grid in BENCHMARKS.md
    python -m bench.bench_series --pods 1000,10000 --conns 1 --services 10 -o json
    python -m bench.bench_series --churn 3000         # the churn table in BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import generate_latest

from agent.attribution import Attributor
from agent.attribution.join import HINT_IGNORED_NODES
from agent.exporter import Exporter
from agent.loop import build_snapshot
from agent.records import (
    FlowDelta,
    FlowKind,
    IPAddress,
    Peer,
    PeerKind,
    ProxyView,
    ServicePort,
)
from tests.fixtures import k8s
from tests.fixtures.fakes import DictHints, DictMetadata, LocalityDiag

#: the families whose series scale with the cluster (the rest are fixed-size)
FAMILIES = (
    "zonemeter_service_bytes",
    "zonemeter_service_hint_ignored_bytes",
    "zonemeter_service_locality_in_effect",
    "zonemeter_service_locality_info",
    "zonemeter_service_locality_last_change_timestamp_seconds",
    "zonemeter_workload_bytes",
)
NODE = "node-0"
BATCH = 50_000
T0 = 1_764_470_000.0


@dataclass
class Cluster:
    """A synthetic cluster as seen through the fakes.

    Attributes:
        meta, hints: the MetadataView / HintView fakes.
        zones: zone names; node-0 is in ``zones[0]``.
        local: node-0's pod IPs by workload index.
        by_class: client pod IPs by class: ``"node0"``, ``"zone0"`` (node-0's zone, other
            nodes), then each other zone's name.
        nodes_by_class: node IPs by the same classes.
        cluster_ips: ``(ClusterIP, port)`` of every Service.
        pod_names: every pod name (to detect a leak into label values).
    """

    meta: DictMetadata
    hints: DictHints
    zones: list[str]
    local: dict[int, list[IPAddress]]
    by_class: dict[str, list[IPAddress]]
    nodes_by_class: dict[str, list[IPAddress]]
    cluster_ips: list[tuple[IPAddress, int]]
    pod_names: set[str]


def build_cluster(pods: int, services: int, zones: int, bare: bool = False) -> Cluster:
    """Build the cluster model described in the module docstring.

    Args:
        pods: pods in the cluster (>= (zones + 1) * services: endpoints in every zone).
        services: Services, one port each (80 -> target 8080, TCP).
        zones: zones (>= 2).
        bare: pods have no ownerReferences, so each pod is its own workload (kind
            ``Pod``, as ``agent.k8s.cache.workload_of`` names it); the Services still
            select them.

    Raises:
        ValueError: pods < (zones + 1) * services or zones < 2.
    """
    if pods < (zones + 1) * services or zones < 2:
        raise ValueError("need pods >= (zones + 1) * services and zones >= 2")
    meta, hints = DictMetadata(), DictHints()
    zn = [f"zone-{chr(97 + z)}" for z in range(zones)]
    nnodes = max(2 * zones, pods // 100)
    node_zone = [zn[n % zones] for n in range(nnodes)]
    nodes_by_class: dict[str, list[IPAddress]] = {"node0": [], "zone0": [], **{z: [] for z in zn[1:]}}
    for n in range(nnodes):
        name, zone = f"node-{n}", node_zone[n]
        p = Peer(PeerKind.NODE, zone=zone, region="r1", node=name)
        meta.nodes[name] = p
        hints.node_zone[name] = zone
        ip = ipaddress.IPv4Address(0xC0A80000 + n)  # 192.168.x.y
        meta.peers[ip] = p
        nodes_by_class["node0" if n == 0 else "zone0" if zone == zn[0] else zone].append(ip)
    zone_nodes = [[n for n in range(nnodes) if n % zones == z] for z in range(zones)]
    by_class: dict[str, list[IPAddress]] = {"node0": [], "zone0": [], **{z: [] for z in zn[1:]}}
    local: dict[int, list[IPAddress]] = {}
    endpoints: list[list[IPAddress]] = [[] for _ in range(services)]
    names: set[str] = set()
    for i in range(pods):
        # layer 0 (one pod per Deployment) on node-0; layer L >= 1 in zone L % zones,
        # round-robin over that zone's nodes (node-0 included): every Service has an
        # endpoint in every zone once pods >= (zones + 1) * services
        w, layer = i % services, i // services
        if layer == 0:
            n = 0
        else:
            zl = zone_nodes[layer % zones]
            n = zl[(w + layer // zones) % len(zl)]
        ip = ipaddress.IPv4Address(0x0A000000 + i)  # 10.x.y.z
        name = f"pod-{i}"
        names.add(name)
        meta.peers[ip] = Peer(PeerKind.POD, zone=node_zone[n], region="r1", node=f"node-{n}",
                              namespace=f"ns-{w % 20}", name=name,
                              workload=name if bare else f"wl-{w}",
                              workload_kind="Pod" if bare else "Deployment")
        endpoints[w].append(ip)
        if n == 0:
            local.setdefault(w, []).append(ip)
            by_class["node0"].append(ip)
        else:
            by_class["zone0" if node_zone[n] == zn[0] else node_zone[n]].append(ip)
    cluster_ips: list[tuple[IPAddress, int]] = []
    for s in range(services):
        ns, name = f"ns-{s % 20}", f"svc-{s}"
        sp = ServicePort(ns, name, 80, "http", 8080, 6)
        cip = ipaddress.IPv4Address(0x0A600000 + s)  # 10.96.x.y
        meta.addresses[(cip, 80, 6)] = sp
        cluster_ips.append((cip, 80))
        for e in endpoints[s]:
            meta.endpoints[(e, 8080, 6)] = (sp,)
        hinted = s % 2 == 0
        everyone = frozenset(str(e) for e in endpoints[s])
        zv = {}
        for z in zn:
            sel = frozenset(str(e) for e in endpoints[s] if meta.peers[e].zone == z) if hinted else everyone
            zv[z] = ProxyView("PreferSameZone" if hinted and sel else "", sel or everyone, "cluster")
        hints.zone_views[(ns, name)] = zv
        hints.diag[(ns, name)] = LocalityDiag("PreferSameZone" if hinted else "none",
                                       "none" if hinted else "not_requested",
                                       {z: hinted for z in zn})
    return Cluster(meta, hints, zn, local, by_class, nodes_by_class, cluster_ips, names)


def traffic(c: Cluster, pods: int, conns: int, services: int, rng: random.Random) -> Iterator[list[FlowDelta]]:
    """Yield node-0's deltas for one interval in batches of at most ``BATCH``."""
    R, S, E, IN = FlowKind.REQUEST, FlowKind.RESPONSE, FlowKind.EGRESS, FlowKind.INGRESS
    classes = ["node0", "zone0", *c.zones[1:], "external"]
    out: list[FlowDelta] = []
    ext = 0x08000000

    def flush() -> Iterator[list[FlowDelta]]:
        nonlocal out
        if len(out) >= BATCH:
            yield out
            out = []

    for j in range(pods * conns):  # Service traffic at node-0's endpoints
        s = j % services
        ep = rng.choice(c.local[s])
        k = classes[(j // services) % len(classes)]
        if k == "external":
            ext += 1
            client: IPAddress = ipaddress.IPv4Address(ext)
        else:
            client = rng.choice(c.by_class[k])
        nb = rng.randint(60, 100_000)
        out.append(FlowDelta(R, ep, client, 8080, 6, nb, 1))
        out.append(FlowDelta(S, ep, client, 8080, 6, nb * 3, 1))
        yield from flush()
    cidr_zone = Peer(PeerKind.CIDR, zone=c.zones[1], region="r1")
    cidr_region = Peer(PeerKind.CIDR, zone="zone-x", region="r2")
    cidr = 0xAC100000  # 172.16.0.0/12 mapped by --zone-cidrs
    for lps in c.local.values():
        for lp in lps:
            for _ in range(conns):
                cip, port = rng.choice(c.cluster_ips)  # client-side ClusterIP copy
                out.append(FlowDelta(E, lp, cip, port, 6, 500, 1))
                out.append(FlowDelta(IN, lp, cip, port, 6, 1500, 1))
                remotes: list[IPAddress] = []
                for k in classes[:-1]:
                    remotes.append(rng.choice(c.by_class[k]))
                    if c.nodes_by_class[k]:
                        remotes.append(rng.choice(c.nodes_by_class[k]))
                for peer in (cidr_zone, cidr_region):
                    cidr += 1
                    ip = ipaddress.IPv4Address(cidr)
                    c.meta.peers[ip] = peer
                    remotes.append(ip)
                ext += 1
                remotes.append(ipaddress.IPv4Address(ext))
                for r in remotes:
                    out.append(FlowDelta(E, lp, r, 5432, 6, 700, 1))
                    out.append(FlowDelta(IN, lp, r, 5432, 6, 900, 1))
            yield from flush()
    if out:
        yield out


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def count_series(text: str, pod_names: set[str]) -> tuple[dict[str, int], list[str]]:
    """Count sample lines per metric family in a Prometheus text exposition.

    Args:
        text: ``generate_latest`` output.
        pod_names: names that must never appear as a label value.

    Returns:
        ``({family: samples}, leaks)``: family names without ``_total``; ``leaks`` lists
        label values that are a pod name or an IP address (must be empty).
    """
    counts: dict[str, int] = {}
    leaks: list[str] = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        fam = name.removesuffix("_total")
        counts[fam] = counts.get(fam, 0) + 1
        if "{" in line:
            for part in line[line.index("{") + 1:line.rindex("}")].split('",'):
                value = part.split('="', 1)[1].rstrip('"')
                if value in pod_names or _is_ip(value):
                    leaks.append(value)
    return counts, leaks


def bound(services: int, zones: int, hinted: int, other_nodes: int = 0) -> dict[str, int]:
    """Series bound of this traffic model on a node holding endpoints of ``services``.

    service_bytes: Services x ports (1) x (client zone, crossing) pairs seen at an endpoint
    node (same_node, same_zone, cross_zone per other zone, external) x 2 directions;
    hint_ignored: at most hinted Services x their client nodes in other zones
    (``other_nodes``), capped at ``HINT_IGNORED_NODES`` nodes plus one ``other`` per
    other zone (an upper bound: a Service may not hear from every node); locality:
    Services x zones, 1, 1;
    workload_bytes: workloads with a local pod x ((pod remotes: zones + 1, egress only) +
    (node remotes: zones + 1, both directions) + (CIDR zone, CIDR region, external: both)).
    """
    return {
        "zonemeter_service_bytes": services * 1 * (zones + 2) * 2,
        "zonemeter_service_hint_ignored_bytes": hinted * (
            other_nodes if other_nodes <= HINT_IGNORED_NODES else HINT_IGNORED_NODES + zones - 1),
        "zonemeter_service_locality_in_effect": services * zones,
        "zonemeter_service_locality_info": services,
        "zonemeter_service_locality_last_change_timestamp_seconds": services,
        "zonemeter_workload_bytes": services * ((zones + 1) + 2 * (zones + 1) + 2 * 3),
    }


def measure(pods: int, conns: int, services: int, zones: int, seed: int = 1,
            bare: bool = False) -> dict[str, Any]:
    """Run one grid point; return its counts (see module docstring)."""
    rng = random.Random(seed)
    t0 = time.perf_counter()
    c = build_cluster(pods, services, zones, bare)
    att = Attributor(NODE, c.meta, c.hints)
    deltas = 0
    for batch in traffic(c, pods, conns, services, rng):
        att.attribute(batch, T0)
        deltas += len(batch)
    att.close_interval(T0 + 10)
    totals = att.totals()
    attached = sum(len(v) for v in c.local.values())
    snap = build_snapshot(totals, locality=c.hints.localities(T0 + 10), table=None, attached=attached,
                          synced={"pods": True}, duration=0.0, at=T0 + 10, interval=10.0)
    exp = Exporter()
    exp.update(snap)
    text = generate_latest(exp.registry()).decode()
    counts, leaks = count_series(text, c.pod_names)
    return {
        "pods": pods, "conns_per_pod": conns, "services": services, "zones": zones,
        "nodes": max(2 * zones, pods // 100), "local_pods": sum(len(v) for v in c.local.values()),
        "deltas": deltas, "bytes_seen": totals.bytes_seen,
        "series": {f: counts.get(f, 0) for f in FAMILIES},
        "series_other": sum(v for f, v in counts.items() if f not in FAMILIES),
        "series_total": sum(counts.values()),
        "bound": bound(services, zones, (services + 1) // 2,
                       sum(1 for n in range(max(2 * zones, pods // 100)) if n % zones)),
        "leak_count": len(leaks), "leaks": leaks[:10], "seconds": round(time.perf_counter() - t0, 2),
    }


# ----------------------------------------------------------------------------- churn


def _api_objects() -> dict[str, list[dict[str, Any]]]:
    """node-0 (zone-a) and node-1 (zone-b); Deployment ``client`` with a pod on node-1."""
    client = k8s.pod("client-7d9f-x", "10.245.0.10", "node-1", namespace="churn", template_hash="7d9f",
                     owner=("ReplicaSet", "client-7d9f"))
    return {"nodes": [k8s.node("node-0", "zone-a", internal="192.168.0.1", pod_cidrs=["10.244.0.0/16"], region="r1"),
                      k8s.node("node-1", "zone-b", internal="192.168.0.2", pod_cidrs=["10.245.0.0/16"], region="r1")],
            "pods": [client], "services": [], "endpointslices": []}


def _service(name: str, cluster_ip: str, addr: str) -> tuple[dict[str, Any], dict[str, Any]]:
    svc = k8s.service(name, "churn", cluster_ip=cluster_ip)
    sl = k8s.endpointslice(f"{name}-abcde", name, [k8s.endpoint(addr, "zone-a", "node-0")], namespace="churn")
    return svc, sl


def churn(pods: int, retention: float, lifetime: float = 60.0, interval: float = 10.0,
          kind: str = "pod", samples: int = 10) -> dict[str, Any]:
    """Replace ``pods`` pods one by one on node-0 (see the module docstring).

    Returns:
        ``{"pods", "retention", "lifetime", "interval", "kind", "seconds", "rows": [{"pods_seen",
        "elapsed_s", "service_series", "workload_series", "exported_samples",
        "expired": {family: n}, "traced_kib"}], "bytes_seen", "balanced"}``.
    """
    import gc
    import tracemalloc

    from agent.hints import HintModel
    from agent.k8s import MetadataAdapter
    from agent.k8s.cache import ClusterMetadata
    from agent.k8s.snapshot import Snapshot

    t_start = time.perf_counter()
    mono = [0.0]
    objs = _api_objects()
    tracemalloc.start()
    cache = ClusterMetadata(clock=lambda: T0 + mono[0])
    cache.load_snapshot(Snapshot(nodes=objs["nodes"], pods=objs["pods"], services=[],
                                 endpointslices=[]))
    hints = HintModel(cache)
    hints.refresh(None)
    att = Attributor(NODE, MetadataAdapter(cache), hints, series_retention=retention,
                     clock=lambda: mono[0])
    exp = Exporter()
    client = ipaddress.IPv4Address("10.245.0.10")
    internet = ipaddress.IPv4Address("93.184.216.34")
    rows: list[dict[str, Any]] = []
    every = max(1, pods // samples)
    for i in range(pods):
        name = f"batch-{i}"
        addr = ipaddress.IPv4Address(0x0AF40000 + 0x100 + i)  # 10.244.1.0 + i
        pod = k8s.pod(name, str(addr), NODE, namespace="churn", owner=("Job", name) if kind == "job" else None)
        svc, sl = _service(name, str(ipaddress.IPv4Address(0x0A600000 + 1 + i % 60000)), str(addr))
        for res, obj in (("pods", pod), ("services", svc), ("endpointslices", sl)):
            cache.apply(res, "ADDED", obj)
        t = 0.0
        while t < lifetime:
            hints.refresh(cache.take_dirty())
            at = T0 + mono[0]
            att.attribute([FlowDelta(FlowKind.REQUEST, addr, client, 8080, 6, 1000, 2),
                           FlowDelta(FlowKind.RESPONSE, addr, client, 8080, 6, 9000, 7),
                           FlowDelta(FlowKind.EGRESS, addr, internet, 443, 6, 500, 1)], at)
            att.close_interval(at)
            exp.update(build_snapshot(att.totals(), table=None, attached=1, synced=cache.synced(),
                                      duration=0.0, at=at, interval=interval))
            mono[0] += interval
            t += interval
        for res, obj in (("endpointslices", sl), ("services", svc), ("pods", pod)):
            cache.apply(res, "DELETED", obj)
        if (i + 1) % every == 0 or i + 1 == pods:
            totals = att.totals()
            text = generate_latest(exp.registry()).decode()
            counts, _ = count_series(text, set())
            gc.collect()  # count live memory, not garbage awaiting the cyclic collector
            rows.append({"pods_seen": i + 1, "elapsed_s": mono[0],
                         "service_series": len(totals.service_bytes),
                         "workload_series": len(totals.workload_bytes),
                         "exported_samples": sum(counts.values()),
                         "expired": dict(totals.series_expired),
                         "traced_kib": round(tracemalloc.get_traced_memory()[0] / 1024)})
    tracemalloc.stop()
    end = att.totals()
    balanced = end.bytes_seen == (sum(end.service_bytes.values()) + sum(end.workload_bytes.values())
                                + sum(end.unattributed_bytes.values()) + sum(end.skipped_bytes.values())
                                + end.held_bytes + sum(v for f, v in end.expired_bytes.items()
                                                     if f != "zonemeter_service_hint_ignored_bytes_total"))
    return {"pods": pods, "retention": retention, "lifetime": lifetime, "interval": interval,
            "kind": kind, "rows": rows, "bytes_seen": end.bytes_seen, "balanced": balanced,
            "seconds": round(time.perf_counter() - t_start, 1)}


def _churn_main(args: argparse.Namespace) -> int:
    churn(20, args.retention, args.lifetime, args.interval, args.churn_kind)  # one-time allocations
    runs = [churn(args.churn, r, args.lifetime, args.interval, args.churn_kind)
            for r in (args.retention, 0.0)]
    if args.output == "json":
        print(json.dumps(runs, indent=1))
    else:
        for r in runs:
            print(f"retention {r['retention']:g} s, {r['pods']} pods ({r['kind']}) replaced one by "
                  f"one, {r['lifetime']:g} s each, interval {r['interval']:g} s "
                  f"({r['seconds']} s wall, bytes balanced: {r['balanced']})")
            print(f"{'pods':>6} {'elapsed':>8} {'svc':>6} {'workload':>8} {'exported':>8} "
                  f"{'exp_svc':>7} {'exp_wl':>6} {'KiB':>7}")
            for row in r["rows"]:
                e = row["expired"]
                print(f"{row['pods_seen']:>6} {row['elapsed_s']:>8g} {row['service_series']:>6} "
                      f"{row['workload_series']:>8} {row['exported_samples']:>8} "
                      f"{e['zonemeter_service_bytes_total']:>7} "
                      f"{e['zonemeter_workload_bytes_total']:>6} {row['traced_kib']:>7}")
    return 0 if all(r["balanced"] for r in runs) else 1


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


SHORT = ("svc", "ignored", "in_eff", "info", "chg", "workload")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[47:]))
    ap.add_argument("--pods", type=_ints, default=[1000, 10000, 100000])
    ap.add_argument("--conns", type=_ints, default=[1, 10], help="connections per pod")
    ap.add_argument("--services", type=_ints, default=[10, 100, 200])
    ap.add_argument("--zones", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--bare-pods", action="store_true",
                    help="pods without owners (each its own workload): shows the one way "
                    "per-pod names reach series (exit 1: leaks found)")
    ap.add_argument("--churn", type=int, metavar="N",
                    help="churn mode: replace N pods one by one (see above)")
    ap.add_argument("--lifetime", type=float, default=60.0, help="churn: seconds each pod lives")
    ap.add_argument("--interval", type=float, default=10.0, help="churn: agent interval, s")
    ap.add_argument("--retention", type=float, default=600.0,
                    help="churn: --series-retention of the first run (the second runs with 0)")
    ap.add_argument("--churn-kind", choices=("pod", "job"), default="pod",
                    help="churn: pods without owners, or each owned by its own Job")
    ap.add_argument("-o", "--output", choices=("table", "json"), default="table")
    args = ap.parse_args(argv)
    if args.churn:
        return _churn_main(args)
    rows = []
    for s in args.services:
        for p in args.pods:
            for cn in args.conns:
                r = measure(p, cn, s, args.zones, args.seed, args.bare_pods)
                rows.append(r)
                if args.output == "table":
                    if len(rows) == 1:
                        print(f"{'pods':>7} {'conn':>4} {'svcs':>5} {'lpods':>5} {'deltas':>9} "
                              + " ".join(f"{h:>8}" for h in SHORT)
                              + f" {'other':>5} {'total':>6} {'leaks':>5} {'s':>5}")
                    ser = r["series"]
                    print(f"{p:>7} {cn:>4} {s:>5} {r['local_pods']:>5} {r['deltas']:>9} "
                          + " ".join(f"{ser[f]:>8}" for f in FAMILIES)
                          + f" {r['series_other']:>5} {r['series_total']:>6} {r['leak_count']:>5}"
                          f" {r['seconds']:>5}", flush=True)
    if args.output == "json":
        print(json.dumps(rows, indent=1))
    else:
        for s in args.services:
            b = next(r["bound"] for r in rows if r["services"] == s)
            print(f"bound at {s} Services, {args.zones} zones: "
                  + " ".join(f"{k}={b[f]}" for k, f in zip(SHORT, FAMILIES, strict=True)))
    return 1 if any(r["leaks"] for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
