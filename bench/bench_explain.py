"""Benchmark: explain a cluster of 10,000 Services x 50 endpoints over 1,000 nodes.

Target: at most 5 s. Measures, in one process and one run:

* ``build``: generating the API-shaped dicts (not counted against the target);
* ``evaluate``: :func:`agent.hints.evaluate_cluster` over the whole cluster (parsing, node
  aggregation, controller model, kube-proxy model, diagnosis and warnings for every Service);
* ``table``: rendering the table for every Service (what ``zonemeter explain`` prints), so
  ``evaluate + table`` is the explain time compared with the target;
* reading the cluster back from a kubectl JSON dump with ``agent.k8s.snapshot.load``
  (reported separately: it is JSON parsing, not the model);
* ``JSON --node``: building and serialising the explain JSON for every Service with
  ``proxy`` limited to one node (reported separately: 500,000 endpoints x 2 hint maps).
  (The unfiltered JSON has 10,000 x 1,000 proxy entries, about 10 M objects, which is a
  reporting-size problem rather than a model one; it is not part of the target.)

Usage:
    python -m bench.bench_explain [--services 10000] [--endpoints 50] [--nodes 1000] [--zones 3]
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import time
from typing import Any

from agent import hints
from agent.cli.explain import render_table
from tests.fixtures import k8s


def build(services: int, endpoints: int, nodes: int, zones: int) -> tuple[list[dict[str, Any]], ...]:
    """Synthetic cluster: mixed mechanisms (Auto, PreferClose, PreferSameNode, none, iTP Local)."""
    zone_names = [f"zone-{chr(97 + i)}" for i in range(zones)]
    node_objs = [k8s.node(f"node-{i}", zone_names[i % zones], cpu="8") for i in range(nodes)]
    svcs, slices = [], []
    kinds = ["auto", "close", "node", "none", "local"]
    for s in range(services):
        kind = kinds[s % len(kinds)]
        td = {"close": "PreferClose", "local": "PreferClose", "node": "PreferSameNode"}.get(kind)
        svcs.append(k8s.service(f"s{s}", "bench", cluster_ip=f"10.96.{s >> 8 & 255}.{s & 255}", auto=kind == "auto",
                                traffic_distribution=td,
                                internal_traffic_policy="Local" if kind == "local" else None))
        eps = []
        for e in range(endpoints):
            n = (s * 7 + e * 13) % nodes
            z = zone_names[n % zones]
            eps.append(k8s.endpoint(f"10.{(s >> 8) & 255}.{s & 255}.{e}", z, f"node-{n}",
                                    for_zones=None if kind == "none" else [z],
                                    for_nodes=[f"node-{n}"] if kind == "node" else None))
        slices.append(k8s.endpointslice(f"s{s}-1", f"s{s}", eps, namespace="bench"))
    return node_objs, svcs, slices


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--services", type=int, default=10_000)
    ap.add_argument("--endpoints", type=int, default=50)
    ap.add_argument("--nodes", type=int, default=1_000)
    ap.add_argument("--zones", type=int, default=3)
    ap.add_argument("--skip-load", action="store_true", help="do not time reading a JSON dump")
    a = ap.parse_args()
    t0 = time.perf_counter()
    nodes, svcs, slices = build(a.services, a.endpoints, a.nodes, a.zones)
    gc.disable()  # as zonemeter explain does after loading its input (see agent/cli/explain.py)
    t1 = time.perf_counter()
    c1 = time.process_time()
    diags = hints.evaluate_cluster(nodes, svcs, slices, strict=True)
    t2 = time.perf_counter()
    text = render_table(diags, "1.35")
    t3 = time.perf_counter()
    c3 = time.process_time()
    body = json.dumps(hints.to_document(diags, "1.35", "node-0"))
    t4 = time.perf_counter()
    load_s = None
    if not a.skip_load:
        import tempfile

        from agent.k8s import snapshot

        with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
            json.dump({"apiVersion": "v1", "kind": "List", "items": [*nodes, *svcs, *slices]}, f)
            f.flush()
            t5 = time.perf_counter()
            snap = snapshot.load(f.name)
            load_s = time.perf_counter() - t5
            assert len(snap.endpointslices) == a.services
    reasons: dict[str, int] = {}
    for d in diags:
        reasons[d.reason] = reasons.get(d.reason, 0) + 1
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"cluster: {a.services} Services x {a.endpoints} endpoints, {a.nodes} nodes, {a.zones} zones")
    print(f"build {t1 - t0:.2f}s | evaluate (model+diagnosis) {t2 - t1:.2f}s | table {t3 - t2:.2f}s "
          f"| explain (model+table) {t3 - t1:.2f}s wall, {c3 - c1:.2f}s CPU (target <= 5 s) "
          f"| JSON --node {t4 - t3:.2f}s")
    print(f"table {len(text) // 1024} KiB, json {len(body) // 1024} KiB, peak RSS {rss_mb:.0f} MiB")
    if load_s is not None:
        print(f"reading the same cluster as a kubectl JSON dump (agent.k8s.snapshot.load): {load_s:.2f}s")
    print("reasons:", dict(sorted(reasons.items())))


if __name__ == "__main__":
    main()
