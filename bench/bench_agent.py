"""The agent's own cost per node: userspace CPU and RSS of its interval work at 1,000, 10,000
and 100,000 flows per interval, with the full-scale metadata cache (root: real BPF tables).

One process plays one node's agent (``ip-192-168-0-0.ec2.internal`` of
:mod:`bench.bench_cache`'s cluster: 150,000 pods on 5,000 nodes in 3 zones, 10,000
Services, a quarter of them with topology-mode Auto and zone hints; the real
:class:`agent.k8s.cache.ClusterMetadata` and :class:`agent.hints.HintModel`). Its
:class:`agent.loop.AgentLoop` drains a real :class:`agent.datapath.Datapath` (BCC maps, no
programs attached: the entries are written into the active flow table from userspace with
``bpf_map_update_batch`` before each interval, so the kernel side costs nothing here) and
exports to the real :class:`agent.exporter.Exporter`, which is scraped once per interval
(:meth:`agent.exporter.Exporter.render` in OpenMetrics, prometheus_client's text, what a
Prometheus scrape gets from the agent's /metrics: at a 10 s interval and a 15-30 s scrape
this is an upper bound).

Each interval's N entries are fresh flows with the mix a node drains (kinds as in
bench/bench_attribution.py): 45 % Service traffic at this node's endpoints (REQUEST and
RESPONSE at port 8080 from clients anywhere in the cluster), 10 % client-side ClusterIP
copies, 30 % pod-to-pod (EGRESS/INGRESS), 10 % pod-to-node, 5 % pod-to-internet. Keys
carry ifindex 0 (local pods resolved by address; the veth path costs the same lookup).

Reported per flow count, over ``--intervals`` measured intervals after 3 warm-up ones:
the tick's CPU time (``time.process_time``: this process only, which other jobs on shared
cores do not inflate) and wall time, the scrape's CPU time, the agent's CPU as a share of
one core at a 10 s interval ((tick + scrape) / 10 s; its mean is the figure, since a
collection of the garbage collector lands in a few intervals only; the loop runs with the
agent's :class:`agent.loop.HeapFreezer` unless ``--no-heap-freezer``), the series exported
and the RSS after the run, each flow count with ``--locality-replicas`` 0 (every Service's locality series on
every agent) and 3 (agent/exporter/shard.py), one after the other in one process. Also the
drain alone of 1,000,000 entries (:func:`bench.bench_datapath.bench_drain`).

Usage (as root, from the repository root):
    .venv/bin/python -m bench.bench_agent [--flows 1000 --flows 10000 --flows 100000]
        [--intervals 10] [--drain-million] [--json]

Figures go to BENCHMARKS.md (*The agent's own cost*).
"""

from __future__ import annotations

import argparse
import ctypes as ct
import gc
import json
import os
import random
import socket
import statistics
import sys
import time
from typing import Any

from agent.datapath import Datapath, DatapathConfig
from agent.datapath.abi import FlowKey, FlowValue
from agent.exporter import Exporter
from agent.hints import HintModel
from agent.k8s.cache import ClusterMetadata
from agent.loop import AgentLoop, HeapFreezer
from bench import bench_cache as bc
from bench.bench_datapath import bench_drain

NODE_K = 0  # this node: bench_cache's node 0
NODE = f"ip-192-168-{NODE_K // 256}-{NODE_K % 256}.ec2.internal"
INTERVAL = 10.0
MIX = (("request", 0.225), ("response", 0.225), ("clusterip", 0.10), ("pod", 0.30),
       ("node", 0.10), ("internet", 0.05))
KIND = {"request": 0, "response": 1, "egress": 2, "ingress": 3}  # enum zm_kind (bpf/zonemeter.h)


def _set_addr(arr: Any, ip: str) -> None:
    """Write ``ip`` (IPv4 text) into a 16-byte key field as ::ffff:a.b.c.d (network order)."""
    raw = socket.inet_aton(ip)
    for i in range(10):
        arr[i] = 0
    arr[10] = arr[11] = 0xFF
    for i in range(4):
        arr[12 + i] = raw[i]


class Traffic:
    """Fresh flow entries for one node per interval, in :data:`MIX` proportions."""

    def __init__(self, pods: int, nodes: int, services: int, seed: int = 1) -> None:
        self.rng = random.Random(seed)
        self.per_node = -(-pods // nodes)
        self.pods, self.nodes, self.services = pods, nodes, services
        self.local = [bc.pod_ip(NODE_K, j) for j in range(self.per_node)]

    def remote_pod(self) -> str:
        i = self.rng.randrange(self.pods)
        return bc.pod_ip(i // self.per_node, i % self.per_node)

    def fill(self, n: int) -> tuple[Any, Any]:
        """(keys, values): ctypes arrays of n distinct :class:`FlowKey` / :class:`FlowValue`."""
        keys, vals = (FlowKey * n)(), (FlowValue * n)()
        rng = self.rng
        cum: list[tuple[float, str]] = []
        acc = 0.0
        for name, share in MIX:
            acc += share
            cum.append((acc, name))
        seen: set[tuple[int, str, str, int]] = set()
        for i in range(n):
            k, v = keys[i], vals[i]
            while True:  # distinct keys: a batch update with duplicates would merge them
                local, remote, kind, port = self._draw(i, cum, acc)
                if (kind, local, remote, port) not in seen:
                    seen.add((kind, local, remote, port))
                    break
            k.family, k.proto, k.kind, k.port = 4, 6, kind, socket.htons(port)
            _set_addr(k.local, local)
            _set_addr(k.remote, remote)
            v.bytes, v.packets = 1000 + rng.randrange(100_000), 1 + rng.randrange(100)
        return keys, vals

    def _draw(self, i: int, cum: list[tuple[float, str]], acc: float) -> tuple[str, str, int, int]:
        """(local address, remote address, kind, port) of one entry of the mix."""
        rng = self.rng
        r = rng.random()
        what = next(name for c, name in cum if r <= c) if r < acc else MIX[-1][0]
        local = self.local[i % len(self.local)]
        if what in ("request", "response"):
            return local, self.remote_pod(), KIND[what], 8080
        if what == "clusterip":
            s = rng.randrange(self.services)
            return local, f"172.20.{s // 256}.{s % 256}", KIND["egress"], 80
        if what == "pod":
            if rng.random() < 0.5:
                return local, self.remote_pod(), KIND["egress"], 8080
            return local, self.remote_pod(), KIND["ingress"], 0
        if what == "node":
            nk = rng.randrange(self.nodes)
            return local, f"192.168.{nk // 256}.{nk % 256}", KIND["egress"], 10250
        return (local, f"52.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(1, 255)}",
                KIND["egress"], 443)


def write_table(dp: Datapath, keys: Any, vals: Any) -> None:
    """Write the entries into the active flow table (``bpf_map_update_batch``)."""
    from bcc.libbcc import lib

    n = len(keys)
    t = dp.tables
    cnt = ct.c_uint32(n)
    res = lib.bpf_update_batch(t._fds[t._active], ct.byref(keys), ct.byref(vals), ct.byref(cnt))
    if res != 0 or cnt.value != n:
        raise RuntimeError(f"bpf_update_batch: {res} {cnt.value} of {n}")


def summary(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "mean": statistics.mean(xs), "min": min(xs),
            "max": max(xs)}


def run(flows: list[int], intervals: int, pods: int, nodes: int, services: int,
        replicas: list[int], freeze: bool = True) -> dict[str, Any]:
    t0 = time.perf_counter()
    cache = ClusterMetadata()
    cache.replace("nodes", bc.nodes(nodes))
    cache.replace("services", bc.services(services))
    cache.replace("endpointslices", bc.endpointslices(pods, nodes, services))
    cache.replace("pods", bc.pods(pods, nodes, services))
    hints = HintModel(cache)
    load_s = time.perf_counter() - t0
    out: dict[str, Any] = {"pods": pods, "nodes": nodes, "services": services,
                           "interval_s": INTERVAL, "cache_load_s": round(load_s, 1), "rows": {}}
    traffic = Traffic(pods, nodes, services)
    for n, rep in ((n, rep) for n in flows for rep in replicas):
        dp = Datapath(DatapathConfig(flow_capacity=max(n, 1024)))
        exporter = Exporter()
        loop = AgentLoop(NODE, dp, cache, hints, exporter, interval=INTERVAL,
                         locality_replicas=rep, heap=HeapFreezer() if freeze else None)
        tick_cpu, tick_wall, scrape_cpu, drained = [], [], [], []
        try:
            for r in range(3 + intervals):
                keys, vals = traffic.fill(n)
                write_table(dp, keys, vals)
                del keys, vals
                c0, w0 = time.process_time(), time.perf_counter()
                res = loop.tick()
                c1, w1 = time.process_time(), time.perf_counter()
                text = exporter.render(openmetrics=True)
                c2 = time.process_time()
                if r >= 3:
                    tick_cpu.append(c1 - c0)
                    tick_wall.append(w1 - w0)
                    scrape_cpu.append(c2 - c1)
                    drained.append(res.deltas)
        finally:
            dp.close()
        if min(drained) != n:
            raise RuntimeError(f"{n} flows: drained {min(drained)}")
        share = [(t + s) / INTERVAL * 100 for t, s in zip(tick_cpu, scrape_cpu, strict=True)]
        gc.collect()
        out["rows"][f"{n}/{rep}"] = {"flows": n, "locality_replicas": rep,
                               "series": sum(1 for line in text.splitlines()
                                             if line and not line.startswith(b"#")),
                               "tick_cpu_s": summary(tick_cpu), "tick_wall_s": summary(tick_wall),
                               "scrape_cpu_s": summary(scrape_cpu),
                               "core_percent": summary(share), "exported_bytes": len(text),
                               "rss_mib": round(bc.rss_mib(), 1)}
        print(f"bench_agent: {n} flows, --locality-replicas {rep} done", file=sys.stderr)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flows", type=int, action="append", default=[],
                    help="flow entries per interval (default 1000, 10000, 100000); repeatable")
    ap.add_argument("--intervals", type=int, default=10, help="measured intervals per flow count")
    ap.add_argument("--locality-replicas", type=int, action="append", default=[],
                    help="AgentLoop locality_replicas, each run side by side per flow count "
                    "(default 0 (every Service's locality series) and 3); repeatable")
    ap.add_argument("--pods", type=int, default=150_000)
    ap.add_argument("--nodes", type=int, default=5_000)
    ap.add_argument("--services", type=int, default=10_000)
    ap.add_argument("--drain-million", action="store_true",
                    help="also time the drain of 1,000,000 entries (3 rounds)")
    ap.add_argument("--no-heap-freezer", action="store_true",
                    help="run the loop without agent.loop.HeapFreezer (the agent uses it)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench_agent: run as root", file=sys.stderr)
        return 1
    res = run(args.flows or [1000, 10_000, 100_000], args.intervals, args.pods, args.nodes,
              args.services, args.locality_replicas or [0, 3], not args.no_heap_freezer)
    if args.drain_million:
        res["drain_1m_seconds"] = bench_drain(3, 1_000_000)
    res["load_average_1m"] = os.getloadavg()[0]
    if args.json:
        print(json.dumps(res, indent=2))
        return 0

    def fmt(s: dict[str, float], scale: float = 1.0, digits: int = 3) -> str:
        return (f"{s['median'] * scale:.{digits}f} ({s['min'] * scale:.{digits}f}.."
                f"{s['max'] * scale:.{digits}f})")

    print(f"{res['pods']} pods, {res['nodes']} nodes, {res['services']} Services (cache loaded "
          f"in {res['cache_load_s']} s); interval {INTERVAL:g} s; load average {res['load_average_1m']:.2f}\n")
    print("| flows per interval | locality replicas | series | tick CPU s | tick wall s | scrape CPU s | "
          "agent CPU, % of one core: mean, median (min..max) | "
          "RSS MiB |")
    print("|---|---|---|---|---|---|---|---|")
    for row in res["rows"].values():
        print(f"| {row['flows']:,} | {row['locality_replicas']} | {row['series']:,} | "
              f"{fmt(row['tick_cpu_s'])} | {fmt(row['tick_wall_s'])} | "
              f"{fmt(row['scrape_cpu_s'])} | "
              f"{row['core_percent']['mean']:.2f} mean, {fmt(row['core_percent'], digits=2)} | "
              f"{row['rss_mib']} |")
    for layout, s in res.get("drain_1m_seconds", {}).items():
        if "_step" not in layout:
            print(f"drain 1,000,000 entries ({layout}): {s['median']:.3f} s ({s['min']:.3f}..{s['max']:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
