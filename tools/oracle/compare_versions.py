"""Random clusters through two oracle minors: where does upstream behaviour change between them?

Usage: python -m tools.oracle.compare_versions A B [--cases N] [--seed S] [--unique] [--show K]

Each case is a random small cluster (1-3 zones, nodes with and without zone labels, odd CPUs,
NotReady or condition-less nodes, a control-plane node now and then), one Service (Auto
annotation or its legacy key, ``Disabled``, each trafficDistribution value,
internalTrafficPolicy Local) and one or two controller slices, some addresses repeated
(``--unique`` avoids that). Both oracles answer with ``trials`` = 8; a case differs when the two
sets of outcomes (events, per-Pod hints, every node's cluster/local lists) have nothing in
common, so Go map-order noise alone does not count as a difference.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from typing import Any

from tools.oracle.client import Oracle

ZONE = "topology.kubernetes.io/zone"
MANAGED = {"endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}


def random_case(rng: random.Random, unique: bool) -> dict[str, Any]:
    """One oracle request (with ``trials`` = 8) for a random cluster."""
    zones = [f"z{i}" for i in range(rng.randint(1, 3))]
    nodes: list[dict[str, Any]] = []
    for i in range(rng.randint(1, 5)):
        labels: dict[str, str] = {}
        if rng.random() < 0.9:
            labels[ZONE] = rng.choice(zones)
        if rng.random() < 0.1:
            labels["node-role.kubernetes.io/control-plane"] = ""
        nodes.append({"name": f"n{i}", "labels": labels, "allocatable_cpu": rng.choice(["1", "2", "500m", "0", "3"]),
                      "ready": rng.choice([True, True, True, False, None])})
    ann = rng.choice([{}, {"service.kubernetes.io/topology-mode": "Auto"},
                      {"service.kubernetes.io/topology-aware-hints": "auto"},
                      {"service.kubernetes.io/topology-mode": "Disabled"}])
    spec: dict[str, Any] = {"selector": {"app": "s"}, "clusterIP": "10.96.0.1",
                            "ports": [{"name": "", "port": 80, "protocol": "TCP", "targetPort": 80}]}
    td = rng.choice([None, "PreferClose", "PreferSameZone", "PreferSameNode"])
    if td:
        spec["trafficDistribution"] = td
    if rng.random() < 0.2:
        spec["internalTrafficPolicy"] = "Local"
    eps = []
    for j in range(rng.randint(0, 7)):
        n = rng.choice(nodes)
        ready = rng.random() < 0.8
        term = (not ready) and rng.random() < 0.5
        e: dict[str, Any] = {
            "addresses": [f"10.1.0.{j + 1}" if unique else f"10.1.0.{rng.randint(1, 6)}"],
            "conditions": {"ready": ready, "serving": ready or term, "terminating": term},
            "nodeName": n["name"], "targetRef": {"kind": "Pod", "namespace": "default", "name": f"p{j}"}}
        if n["labels"].get(ZONE):
            e["zone"] = n["labels"][ZONE]
        eps.append(e)
    rng.shuffle(eps)
    k = rng.randint(1, 2)
    slices = [{"metadata": {"name": f"s-{i}", "labels": {"kubernetes.io/service-name": "s", **MANAGED}},
               "addressType": "IPv4", "ports": [{"name": "", "port": 80, "protocol": "TCP"}],
               "endpoints": eps[i::k]} for i in range(k)]
    return {"nodes": nodes, "endpoint_slices": slices, "proxy_nodes": "all", "trials": 8,
            "service": {"metadata": {"name": "s", "namespace": "default", "annotations": ann}, "spec": spec}}


def outcomes(ans: dict[str, Any]) -> set[str] | str:
    """The distinct outcomes of a trials answer, or the error line's message."""
    if "error" in ans:
        return str(ans["error"])
    out = set()
    for a in ans["answers"]:
        c = a["controller"]
        hints = sorted((e["pod"], json.dumps(e["hints"], sort_keys=True)) for e in c["endpoints"])
        proxy = {n: {p: (v["cluster"], v["local"], v["has_any"]) for p, v in ports.items()}
                 for n, ports in (a.get("proxy") or {}).items()}
        out.add(json.dumps([c["events"], hints, proxy], sort_keys=True))
    return out


def main(argv: list[str] | None = None) -> int:
    """Print the differing cases (up to ``--show``) and the count; exit 1 if any differ."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--cases", type=int, default=500)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--unique", action="store_true", help="no address appears twice")
    ap.add_argument("--show", type=int, default=3)
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    differing = 0
    with Oracle(args.a) as oa, Oracle(args.b) as ob:
        for i in range(args.cases):
            req = random_case(rng, args.unique)
            sa, sb = outcomes(oa.ask_raw(req)), outcomes(ob.ask_raw(req))
            same = sa == sb if isinstance(sa, str) or isinstance(sb, str) else bool(sa & sb)
            if not same:
                differing += 1
                if differing <= args.show:
                    print(f"=== case {i}: {json.dumps(req)}")
                    print(f"  {args.a}: {sorted(sa) if isinstance(sa, set) else sa}")
                    print(f"  {args.b}: {sorted(sb) if isinstance(sb, set) else sb}")
    print(f"{args.cases} cases, {differing} differ between {args.a} and {args.b}")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
