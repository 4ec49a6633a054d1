#!/usr/bin/env python3
"""Soak and churn: real agents on a lab cluster whose pods keep being replaced while
traffic runs; agent memory and CPU sampled, totals compared with the lab's ground truth.

The cluster (:data:`CHURN_TOPOLOGY`): zones ``za`` (node n1) and ``zb`` (n2, n3); a ``web``
client pod per node calling Service ``shop/api`` (6 replicas, two per node) through its
ClusterIP; every api pod also calls a ``db`` pod of the next node directly by pod IP
(non-Service traffic, counted per client workload: the lab's pods have no owner, so each
pod is its own workload). A **rolling update** replaces the api replicas one after the other
(:meth:`ChurnRun.replace_api`): the old pod's own traffic stops, the proxies stop using it,
it is deleted, and a pod with a new name takes its address (the lab gives a new pod the
lowest free address of its node), the snapshot is rewritten (the agents reload it), the
proxies use the new pod, and it starts calling its db.

Checks at the end (both :func:`main` and ``tests/e2e/test_churn.py``):

* per (client zone, server zone, crossing, direction) bytes of ``shop/api`` equal the lab's;
* per workload, ``zonemeter_workload_bytes_total{direction="egress"}`` equals what the lab
  counted from that pod (requests of api pods, responses of db pods): a byte credited to
  the wrong owner of a reused address shows up here;
* no unattributed bytes.

Usage (root):
    python -m bench.soak                      # 600 s, a replacement every 5 s (<= 150)
    python -m bench.soak --duration 60 --every 3 -o json

Figures go to BENCHMARKS.md (*Soak*).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tools.demo.run import DemoOptions, DemoRun
from tools.demo.topology import parse_demo
from tools.lab import FlowHandle

CHURN_TOPOLOGY = """\
zones: [{name: za}, {name: zb}]
nodes:
  - {name: n1, zone: za, cpu: 4}
  - {name: n2, zone: zb, cpu: 4}
  - {name: n3, zone: zb, cpu: 4}
pods:
  - {name: web-n1, namespace: shop, node: n1, app: web}
  - {name: web-n2, namespace: shop, node: n2, app: web}
  - {name: web-n3, namespace: shop, node: n3, app: web}
  - {name: api-1, namespace: shop, node: n1, app: api, ports: [{port: 8080}]}
  - {name: api-2, namespace: shop, node: n1, app: api, ports: [{port: 8080}]}
  - {name: api-3, namespace: shop, node: n2, app: api, ports: [{port: 8080}]}
  - {name: api-4, namespace: shop, node: n2, app: api, ports: [{port: 8080}]}
  - {name: api-5, namespace: shop, node: n3, app: api, ports: [{port: 8080}]}
  - {name: api-6, namespace: shop, node: n3, app: api, ports: [{port: 8080}]}
  - {name: db-n1, namespace: shop, node: n1, app: db, ports: [{port: 5432}]}
  - {name: db-n2, namespace: shop, node: n2, app: db, ports: [{port: 5432}]}
  - {name: db-n3, namespace: shop, node: n3, app: db, ports: [{port: 5432}]}
services:
  - {name: api, namespace: shop, selector: {app: api}, ports: [{port: 80, targetPort: 8080}]}
traffic: {clients: {app: web}, services: [shop/api], rate: 5, requestBytes: 300, responseBytes: 3000}
"""

NEXT_NODE = {"n1": "n2", "n2": "n3", "n3": "n1"}
DB_RATE = 3.0
DB_REQUEST, DB_RESPONSE = 200, 1500


@dataclass(slots=True)
class Sample:
    """One resource sample of one agent process.

    Attributes:
        t: seconds since the soak started.
        rss_bytes: resident set size (``/proc/PID/status`` VmRSS), bytes.
        cpu_seconds: user + system CPU time since the process started, seconds.
    """

    t: float
    rss_bytes: int
    cpu_seconds: float


def sample_process(pid: int, t: float) -> Sample:
    """Read RSS and CPU time of ``pid`` from /proc.

    Raises:
        OSError: the process is gone.
    """
    rss = 0
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return Sample(t, rss, (int(fields[11]) + int(fields[12])) / ticks)


def slope(points: Iterable[tuple[float, float]]) -> float:
    """Least-squares slope of ``(x, y)`` points (0.0 with fewer than two)."""
    pts = list(points)
    if len(pts) < 2:
        return 0.0
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    den = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / den if den else 0.0


def workload_egress(text: str) -> dict[str, int]:
    """``workload -> bytes`` of ``zonemeter_workload_bytes_total{direction="egress"}``."""
    out: dict[str, int] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "zonemeter_workload_bytes_total" and s.labels.get("direction") == "egress":
                w = s.labels.get("workload", "")
                out[w] = out.get(w, 0) + int(s.value)
    return out


@dataclass(slots=True)
class ChurnResult:
    """What the agents and the lab counted (whole run, warm-up included).

    Attributes:
        service_agents, service_truth: (client_zone, server_zone, crossing, direction) ->
            bytes of ``shop/api``.
        workload_agents, workload_truth: workload (pod) -> egress bytes of non-Service
            traffic, for the lab's pods.
        workload_other: workload -> egress bytes the agents counted for addresses that are
            no lab pod's: IPv6 link-local neighbour discovery and MLD of each new pod's
            interface (``unknown`` workload, ``external`` remote), which the lab's ground
            truth (TCP to pod ports) does not count.
        unattributed: reason -> bytes the agents could not attribute.
        replacements: api pods replaced.
        reused: replacements whose new pod took the old pod's address.
        failed_requests: exchanges the traffic clients saw fail.
        samples: node -> resource samples of its agent.
    """

    service_agents: dict[tuple[str, str, str, str], int]
    service_truth: dict[tuple[str, str, str, str], int]
    workload_agents: dict[str, int]
    workload_truth: dict[str, int]
    workload_other: dict[str, int]
    unattributed: dict[str, int]
    replacements: int
    reused: int
    failed_requests: int
    samples: dict[str, list[Sample]] = field(default_factory=dict)


class ChurnRun:
    """The churn cluster with its agents (a :class:`DemoRun` driven step by step).

    Args:
        workdir: snapshot, logs, lab state.
        interval: the agents' interval, seconds.
        agent_args: more ``zonemeter agent`` flags (``{node}`` names each agent's node).
        settle_seconds: pause for in-flight exchanges and for the agents to read the
            snapshot at each replacement (:meth:`DemoCluster.replace_pod`).
        kubernetes: ``emulated`` (agents read the snapshot) or ``real`` (the lab's real
            control plane and kube-proxies; the agents read kube-apiserver).
        topology: the demo topology (default :data:`CHURN_TOPOLOGY`; it must keep its
            ``web``, ``api-1``..``api-6`` and ``db-<node>`` pods).
        node_args: node -> more flags for that node's agent only.
        hook: where the agents count, ``veth`` or ``cgroup`` (:class:`DemoOptions`).
    """

    def __init__(self, workdir: Path, interval: float = 1.0, agent_args: tuple[str, ...] = (),
                 settle_seconds: float = 0.5, kubernetes: str = "emulated",
                 topology: str = CHURN_TOPOLOGY,
                 node_args: dict[str, tuple[str, ...]] | None = None, hook: str = "veth") -> None:
        spec = parse_demo(topology, "churn")
        self.run = DemoRun(spec, DemoOptions(interval_seconds=interval, workdir=workdir,
                                             state_dir=workdir / "state", agent_args=agent_args,
                                             kubernetes=kubernetes, hook=hook))
        self.run.fleet.node_args = dict(node_args or {})
        self.settle_seconds = settle_seconds
        self.cluster = self.run.cluster
        self.lab = self.cluster.lab
        #: replica slot -> current pod name
        self.api = {k: f"api-{k}" for k in range(1, 7)}
        self._db_flows: dict[str, FlowHandle] = {}
        self._web_flows: list[FlowHandle] = []
        self._end = 0.0
        self.replacements = 0
        self.reused = 0
        self.failed = 0

    def __enter__(self) -> ChurnRun:
        self.run.build()
        return self

    def __exit__(self, *exc: object) -> None:
        for h in [*self._db_flows.values(), *self._web_flows]:
            h.stop()
        self.run.teardown()

    def _db_of(self, pod: str) -> str:
        node = self.lab.topology.pod(pod).node
        return str(self.lab.pod_ip(f"db-{NEXT_NODE[node]}"))

    def _start_db(self, pod: str) -> None:
        if not self._end:  # no traffic (churn_memory): no db flows either
            return
        # a pod that joins after the traffic's planned end still sends for a second, so
        # every owner of an address has bytes of its own however long the replacements took
        left = max(1.0, self._end - time.monotonic())
        self._db_flows[pod] = self.lab.start_flow(
            pod, self._db_of(pod), 5432, "tcp", DB_REQUEST, DB_RESPONSE,
            count=max(1, round(DB_RATE * left)), rate=DB_RATE, timeout=5.0)

    def start_traffic(self, seconds: float) -> None:
        """web -> api (ClusterIP) and api -> db (pod IP) for ``seconds``."""
        self._end = time.monotonic() + seconds
        self._web_flows = self.cluster.start_traffic(seconds)
        for pod in self.api.values():
            self._start_db(pod)

    def _collect(self, h: FlowHandle) -> None:
        try:
            self.failed += h.wait().failed
        except Exception:  # noqa: BLE001 - ended by us (SIGTERM): the lab counted what it sent
            pass

    def replace_api(self, slot: int, new: str, stale_seconds: float = 0.0) -> bool:
        """Rolling-update step: replace the api pod of ``slot`` by ``new``; True when the
        new pod took the old pod's address.

        ``stale_seconds`` > 0: the new pod starts calling its db ``settle_seconds`` after
        it exists (its veth attached) and sends this long before the snapshot announces
        it, so the agents drain its bytes while their metadata still shows the old pod
        deleted and no new holder of the address."""
        old = self.api[slot]
        h = self._db_flows.pop(old, None)
        if h is not None:
            h.stop()
            self._collect(h)
        before = str(self.lab.pod_ip(old))

        def early() -> None:
            time.sleep(self.settle_seconds)
            self._start_db(new)
            time.sleep(stale_seconds)

        after = self.cluster.replace_pod(old, new, settle_seconds=self.settle_seconds,
                                         before_announce=early if stale_seconds > 0 else None)
        self.api[slot] = new
        self.replacements += 1
        self.reused += before == after
        if stale_seconds <= 0:
            self._start_db(new)
        return before == after

    def traffic_running(self) -> bool:
        """True while any client still sends."""
        return any(not h.done() for h in [*self._web_flows, *self._db_flows.values()])

    def finish(self) -> ChurnResult:
        """Wait for the traffic, let the agents settle, and compare with the lab."""
        for h in [*self._web_flows, *self._db_flows.values()]:
            self._collect(h)
        self._web_flows, self._db_flows = [], {}
        fleet = self.run.fleet
        agents = fleet.scrape_settled(after=time.time())
        texts = fleet.scrape_text()
        service_agents: dict[tuple[str, str, str, str], int] = {}
        for (ns, svc, cz, sz, crossing, direction), n in agents.service_bytes.items():
            if (ns, svc) == ("shop", "api"):
                k = (cz, sz, crossing, direction)
                service_agents[k] = service_agents.get(k, 0) + n
        wl_agents: dict[str, int] = {}
        for text in texts.values():
            for w, n in workload_egress(text).items():
                wl_agents[w] = wl_agents.get(w, 0) + n
        gt = self.lab.ground_truth()
        wl_truth: dict[str, int] = {}
        for (client, server, direction), n in gt.items():
            if server.startswith("db-"):
                who = client if direction == "request" else server
                wl_truth[who] = wl_truth.get(who, 0) + n
        truth = self.cluster.truth(gt)["shop/api"]
        pods = set(self.cluster.pod_node)  # every pod the lab ever had
        return ChurnResult(service_agents={k: v for k, v in service_agents.items() if v},
                           service_truth={k: v for k, v in truth.by_series.items() if v},
                           workload_agents={k: v for k, v in wl_agents.items() if v and k in pods},
                           workload_other={k: v for k, v in wl_agents.items()
                                           if v and k not in pods},
                           workload_truth={k: v for k, v in wl_truth.items() if v},
                           unattributed={k: v for k, v in agents.unattributed.items() if v},
                           replacements=self.replacements, reused=self.reused,
                           failed_requests=self.failed)

    def agent_pids(self) -> dict[str, int]:
        """node -> pid of its agent process."""
        return {a.node: a.proc.pid for a in self.run.fleet.agents}


def soak(duration: float, every: float, max_replacements: int, sample_every: float,
         workdir: Path, interval: float = 1.0, agent_args: tuple[str, ...] = (),
         settle: float = 0.5) -> ChurnResult:
    """Run traffic for ``duration`` seconds with a rolling replacement every ``every``
    seconds (at most ``max_replacements``), sampling every agent every ``sample_every``."""
    with ChurnRun(workdir, interval, agent_args, settle) as cr:
        pids = cr.agent_pids()
        samples: dict[str, list[Sample]] = {n: [] for n in pids}
        t0 = time.monotonic()
        cr.start_traffic(duration)
        next_sample = t0
        next_churn = t0 + every
        gen = 0
        slot = 0
        while cr.traffic_running():
            now = time.monotonic()
            if now >= next_sample:
                for node, pid in pids.items():
                    samples[node].append(sample_process(pid, now - t0))
                next_sample += sample_every
            if now >= next_churn and cr.replacements < max_replacements \
                    and now < t0 + duration - every:
                slot = slot % 6 + 1
                if slot == 1:
                    gen += 1
                cr.replace_api(slot, f"api-g{gen}-{slot}")
                next_churn = time.monotonic() + every
            time.sleep(0.2)
        res = cr.finish()
        for node, pid in pids.items():
            samples[node].append(sample_process(pid, time.monotonic() - t0))
        res.samples = samples
        return res


def churn_memory(cycles: int, settle: float, sample_every: int, workdir: Path,
                 interval: float = 1.0, agent_args: tuple[str, ...] = ()) -> dict[str, Any]:
    """Replace api pods back to back, without traffic, ``cycles`` times; sample every
    agent's RSS every ``sample_every`` replacements. Each replacement deletes a pod veth,
    creates one (the agent attaches to it), rewrites the snapshot twice (the agent reloads
    it, a new owner-less workload name appears) and changes the endpoint set.

    Returns:
        ``{"cycles", "seconds", "agents": {node: {"rss_kib": [(cycle, KiB), ...],
        "kib_per_cycle_second_half": float}}, "workload_series": {node: n}}``.
    """
    with ChurnRun(workdir, interval, agent_args, settle_seconds=settle) as cr:
        pids = cr.agent_pids()
        curve: dict[str, list[tuple[int, int]]] = {n: [] for n in pids}
        t0 = time.monotonic()
        gen = 0
        for i in range(cycles + 1):
            if i % sample_every == 0:
                for node, pid in pids.items():
                    curve[node].append((i, sample_process(pid, 0).rss_bytes // 1024))
            if i == cycles:
                break
            slot = i % 6 + 1
            if slot == 1:
                gen += 1
            cr.replace_api(slot, f"api-g{gen}-{slot}")
        seconds = time.monotonic() - t0
        texts = cr.run.fleet.scrape_text()
    out: dict[str, Any] = {"cycles": cycles, "seconds": round(seconds, 1), "agents": {},
                           "workload_series": {}}
    for node, pts in curve.items():
        half = [p for p in pts if p[0] >= cycles // 2]
        out["agents"][node] = {"rss_kib": pts,
                               "kib_per_cycle_second_half": round(slope(half), 2)}
    for node, text in texts.items():
        out["workload_series"][node] = sum(
            1 for line in text.splitlines() if line.startswith("zonemeter_workload_bytes_total{"))
    return out


def summarize(res: ChurnResult, duration: float) -> dict[str, Any]:
    """The figures BENCHMARKS.md records."""
    agents = {}
    for node, ss in res.samples.items():
        rss = [s.rss_bytes / 2**20 for s in ss]
        cpu = [(b.cpu_seconds - a.cpu_seconds) / (b.t - a.t) * 100
               for a, b in itertools.pairwise(ss) if b.t > a.t]
        agents[node] = {
            "samples": len(ss),
            "rss_mib_each_minute": [round(s.rss_bytes / 2**20, 1) for s in ss
                                    if int(s.t) % 60 < 10] + [round(rss[-1], 1)],
            "rss_mib": {"first": round(rss[0], 1), "last": round(rss[-1], 1),
                        "max": round(max(rss), 1),
                        "slope_mib_per_min": round(slope(
                            (s.t / 60, s.rss_bytes / 2**20) for s in ss), 3),
                        # warm-up (caches, allocator arenas) is over by then
                        "slope_mib_per_min_second_half": round(slope(
                            (s.t / 60, s.rss_bytes / 2**20) for s in ss
                            if s.t >= ss[-1].t / 2), 3)},
            "cpu_percent": {"first": round(cpu[0], 1) if cpu else None,
                            "last": round(cpu[-1], 1) if cpu else None,
                            "max": round(max(cpu), 1) if cpu else None,
                            "slope_pct_per_min": round(slope(
                                ((a.t + b.t) / 120, c)
                                for (a, b), c in zip(itertools.pairwise(ss), cpu, strict=False)), 3)},
        }
    return {
        "duration_seconds": duration,
        "replacements": res.replacements, "address_reused": res.reused,
        "failed_requests": res.failed_requests,
        "service_bytes_agents": sum(res.service_agents.values()),
        "service_bytes_truth": sum(res.service_truth.values()),
        "service_series_equal": res.service_agents == res.service_truth,
        "workload_bytes_agents": sum(res.workload_agents.values()),
        "workload_bytes_truth": sum(res.workload_truth.values()),
        "workload_series_equal": res.workload_agents == res.workload_truth,
        "workloads": len(res.workload_truth),
        "workload_other_bytes": res.workload_other,
        "workload_diff": {w: [res.workload_agents.get(w, 0), res.workload_truth.get(w, 0)]
                          for w in sorted(set(res.workload_agents) | set(res.workload_truth))
                          if res.workload_agents.get(w, 0) != res.workload_truth.get(w, 0)},
        "service_diff": {"/".join(k): [res.service_agents.get(k, 0), res.service_truth.get(k, 0)]
                         for k in sorted(set(res.service_agents) | set(res.service_truth))
                         if res.service_agents.get(k, 0) != res.service_truth.get(k, 0)},
        "unattributed": res.unattributed,
        "loadavg_1m_end": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
        "agents": agents,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the soak and print the figures (exit 1 when totals differ)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=600.0, help="traffic seconds (<= 3600)")
    p.add_argument("--every", type=float, default=5.0, help="seconds between replacements")
    p.add_argument("--max-replacements", type=int, default=150)
    p.add_argument("--sample-every", type=float, default=10.0)
    p.add_argument("--interval", type=float, default=1.0, help="agent interval, seconds")
    p.add_argument("--agent-arg", action="append", default=[], metavar="FLAG",
                   help="extra zonemeter agent flag, repeatable (e.g. --agent-arg=--series-retention=60)")
    p.add_argument("--churn-only", type=int, default=0, metavar="CYCLES",
                   help="memory under churn alone: CYCLES back-to-back replacements, no traffic")
    p.add_argument("--settle", type=float, default=0.5,
                   help="seconds each replacement waits for the agents (twice per replacement)")
    p.add_argument("-o", "--output", choices=("text", "json"), default="text")
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        print("soak: needs root (network namespaces, BPF)", file=sys.stderr)
        return 2
    duration = min(args.duration, 3600.0)
    if args.churn_only > 0:
        with tempfile.TemporaryDirectory(prefix="zonemeter-soak-") as tmp:
            mem = churn_memory(args.churn_only, args.settle, max(1, args.churn_only // 20),
                               Path(tmp), args.interval, tuple(args.agent_arg))
        print(json.dumps(mem, indent=1) if args.output == "json" else mem)
        return 0
    with tempfile.TemporaryDirectory(prefix="zonemeter-soak-") as tmp:
        res = soak(duration, args.every, args.max_replacements, args.sample_every, Path(tmp),
                   args.interval, tuple(args.agent_arg), args.settle)
    out = summarize(res, duration)
    if args.output == "json":
        print(json.dumps(out, indent=1))
    else:
        for k, v in out.items():
            if k != "agents":
                print(f"{k}: {v}")
        for node, a in out["agents"].items():
            print(f"agent {node}: {a}")
    ok = out["service_series_equal"] and out["workload_series_equal"] and not res.unattributed
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
