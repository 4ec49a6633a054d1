"""What ``PodCgroupOrder`` (agent/datapath/cgroup.py) costs the agent on the cgroup hook.

A node's cgroup hierarchy is made for the run below a child of the cgroup v2 root: ``--pods``
pod cgroups named as kubelet's cgroupfs driver names them (``kubepods/burstable/pod<uid>``),
each with ``--containers`` container cgroups, beside the machine's own hierarchy (which the
walk also lists, as on a node). Measured, each ``--rounds`` times in one process:

* ``walk``: one walk of the whole hierarchy (what a new id costs once a second at most),
  wall seconds;
* ``first ask``: asking every pod's id once on a fresh ``PodCgroupOrder`` (one walk, then
  one listing of each pod's cgroup), per id;
* ``asked again``: the same ids asked again (the remembered answers), per id.

Usage (root, repository root)::

    .venv/bin/python -m bench.bench_pod_order [--pods 500] [--containers 2] [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid

from agent.datapath import cgroup as cg
from bench.bench_datapath import summary


def main() -> int:
    """Run the bench and print a table. Returns the exit code."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=500)
    ap.add_argument("--containers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    root = cg.cgroup2_root()
    top = os.path.join(root, f"zm-bench-order-{os.getpid()}")
    qos = os.path.join(top, "kubepods", "burstable")
    made: list[str] = [top, os.path.join(top, "kubepods"), qos]
    for d in made:
        os.mkdir(d)
    pods: list[int] = []
    try:
        for _ in range(args.pods):
            pod = os.path.join(qos, f"pod{uuid.uuid4()}")
            os.mkdir(pod)
            made.append(pod)
            for c in range(args.containers):
                os.mkdir(os.path.join(pod, f"c{c}"))
                made.append(os.path.join(pod, f"c{c}"))
            pods.append(os.stat(pod).st_ino & 0xFFFFFFFF)
        walk, first, again = [], [], []
        dirs = 0
        for _ in range(args.rounds):
            order = cg.PodCgroupOrder(root)
            t = time.perf_counter()
            order._walk()  # noqa: SLF001 - the bench times the walk itself
            walk.append(time.perf_counter() - t)
            dirs = len(order._dirs)  # noqa: SLF001
            order = cg.PodCgroupOrder(root)
            t = time.perf_counter()
            keys = [order(p) for p in pods]
            first.append((time.perf_counter() - t) / len(pods))
            assert all(k and k != p for k, p in zip(keys, pods, strict=True))
            t = time.perf_counter()
            for p in pods:
                order(p)
            again.append((time.perf_counter() - t) / len(pods))
    finally:
        for d in reversed(made):
            os.rmdir(d)

    def fmt(s: dict[str, float], scale: float, unit: str) -> str:
        return f"{s['median'] * scale:.1f} {unit} ({s['min'] * scale:.1f}..{s['max'] * scale:.1f})"

    print(f"{args.pods} pod cgroups x {args.containers} containers; {dirs} cgroup directories "
          f"walked in all; median (min..max) of {args.rounds} rounds")
    print("| walk of the hierarchy | first ask, per pod id | asked again, per pod id |")
    print("|---|---|---|")
    print(f"| {fmt(summary(walk), 1e3, 'ms')} | {fmt(summary(first), 1e6, 'us')} | "
          f"{fmt(summary(again), 1e6, 'us')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
