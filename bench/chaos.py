#!/usr/bin/env python3
"""Chaos soak: real agents on the churn cluster of :mod:`bench.soak` with everything that
can go wrong at once, ending with every agent's totals equal to the lab's ground truth.

While traffic runs (``web`` pods call ``shop/api`` through its ClusterIP; every api pod
calls a ``db`` pod of the next node by pod IP, an endpoint of ``shop/db``), one thing
after the other at random (seeded) moments:

* **pod churn with address reuse**: a rolling replacement of the api pods of the nodes
  other than the first (:data:`CHURN_SLOTS`), each new pod taking its predecessor's
  address (:meth:`bench.soak.ChurnRun.replace_api`);
* **agent crashes and restarts**: an agent killed with SIGKILL (or, one time in three,
  stopped with SIGTERM: a rolling update), left down for up to 3 s while the kernel keeps
  counting into the pinned tables, then restarted; it resumes from its checkpoint
  (``--pin-path``, ``--checkpoint-path``; docs/datapath.md, "Exactly once across a
  crash"). The agent of the second node is never restarted (:data:`KEEPER`), so one
  process lives the whole run for the memory and CPU slopes;
* **link flaps**: a ``web`` pod's ``eth0`` down for a second and up again
  (:meth:`tools.lab.Lab.flap_pod_link`); only client pods flap, whose bytes are counted at
  the servers by both the agents and the lab;
* **the metadata source stopped and restarted**: with ``--kubernetes real`` the lab's
  kube-apiserver (``Lab.stop_apiserver``/``start_apiserver``) for ``--outage-seconds``;
  the real kube-proxies keep forwarding, the agents keep counting and relist after it.
  Pods are not replaced meanwhile (the lab writes them through the apiserver), nor for
  :data:`KUBE_PROXY_BACKOFF_SECONDS` after it: the real kube-proxies back off like any
  client-go reflector (30 to 60 s once backed off) and would forward to a deleted pod meanwhile
  (docs/lab.md, "What the real components showed"). The emulated lab's metadata is a
  snapshot file the agents poll, with nothing to stop;
* **a deliberately small flow table** (``--flow-capacity``, default 16 flows) on the
  first node (:data:`SMALL_TABLE_NODE`), whose agent is killed like the others: most
  intervals overflow, so the per-(kind, family) overflow entries carry bytes
  (``unattributed{reason="flow_table_full"}``) across crashes and hand-overs. Its api
  pods are not replaced: a new endpoint's first bytes, counted before the node's agent
  wrote it to the kernel (a late endpoint, docs/datapath.md), are ``ingress``/``egress``
  keys, which in an overflow entry have no address left to find the endpoint by
  (``flow_table_full``, documented); on the churned nodes the table keeps every flow,
  so late endpoints are counted as their Service's, exactly.

Checks at the end (after the traffic stopped and the agents settled):

* **exactly once, per node**: the agent's Service bytes plus its request/response
  overflow bytes (``unattributed{flow_table_full}`` minus the diagnostic
  ``flow_table_full_unfiltered``, which holds the ingress/egress overflow) equal what the
  lab counted for the server pods of that node, exactly. Per series (client zone, server
  zone, crossing, direction) the sums over nodes are reported too: with overflow they
  differ by what the overflow entries hold, which carry no zones;
* **never decreasing**: a scraper reads every agent every 0.5 s; no ``_total`` sample
  ever went down, across every restart (``--series-retention 0``: no series expiry);
* **checkpointed = exported**: each agent's checkpoint file holds the Service bytes its
  last export shows;
* RSS and CPU of each agent process sampled every ``--sample-every`` seconds, slopes per
  hour after the first 5 minutes (or the second half of shorter runs).

Usage (root):
    python -m bench.chaos --duration 1800 --kubernetes real          # BENCHMARKS.md, "Chaos soak"
    python -m bench.chaos --duration 60 --kubernetes real -o json     # tests/e2e/test_chaos.py

The first line of the output is the seed; ``--seed`` repeats a run's schedule.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.soak import CHURN_TOPOLOGY, ChurnRun, Sample, sample_process, slope

#: the churn cluster plus a Service for the db pods: every byte the lab sends is Service
#: traffic, so overflowed request/response bytes can be checked exactly per node
CHAOS_TOPOLOGY = CHURN_TOPOLOGY.replace(
    "services:\n",
    "services:\n  - {name: db, namespace: shop, selector: {app: db}, ports: [{port: 5432}]}\n")

#: the node whose agent runs with the small flow table (its api pods stay)
SMALL_TABLE_NODE = "n1"
#: the node whose agent is never restarted (RSS and CPU over the whole run)
KEEPER = "n2"
#: the api replica slots replaced (:attr:`bench.soak.ChurnRun.api`): those of n2 and n3
CHURN_SLOTS = (3, 4, 5, 6)

#: no pod replacement this long after kube-apiserver came back: the real kube-proxies'
#: informers retry with client-go's reflector backoff (tools/cache/reflector.go:
#: defaultBackoffMax 30 s with jitter 1.0, so [30, 60) s once an outage lasted, and not
#: reset within 2 minutes, less than the outages' spacing), plus a list and a sync
KUBE_PROXY_BACKOFF_SECONDS = 75.0

_SAMPLE = re.compile(r"^(zonemeter_\w+_total)(\{[^}]*\})? (\S+)$", re.M)


@dataclass(slots=True)
class ChaosSettings:
    """One run's schedule.

    Attributes:
        duration: traffic seconds.
        kubernetes: ``real`` (kube-apiserver outages) or ``emulated`` (snapshot, none).
        interval: the agents' interval, seconds.
        flow_capacity: flows per kernel table (``--flow-capacity``) of the agent of
            :data:`SMALL_TABLE_NODE` (the others keep the default, 65,536).
        churn_every, kill_every, flap_every, outage_every: mean seconds between two
            events of each kind (exponential gaps, seeded); 0 disables a kind.
        outage_seconds: how long kube-apiserver stays down.
        sample_every: seconds between RSS/CPU samples.
        seed: the schedule's random seed.
    """

    duration: float = 1800.0
    kubernetes: str = "real"
    interval: float = 1.0
    flow_capacity: int = 16
    churn_every: float = 20.0
    kill_every: float = 30.0
    flap_every: float = 25.0
    outage_every: float = 240.0
    outage_seconds: float = 20.0
    sample_every: float = 10.0
    seed: int = 0


@dataclass(slots=True)
class Events:
    """What the run did (counts)."""

    replacements: int = 0
    reused: int = 0
    kills: int = 0
    terms: int = 0
    flaps: int = 0
    outages: int = 0
    outage_seconds: float = 0.0
    failed_requests: int = 0
    log: list[tuple[float, str]] = field(default_factory=list)


class Monotonic:
    """Scrape every agent every ``period`` seconds in a thread; record every ``_total``
    sample that went down (an agent down between scrapes is skipped)."""

    def __init__(self, urls: dict[str, str], period: float = 0.5) -> None:
        self.urls = urls  # node -> base URL; the same address across restarts
        self.period = period
        self.last: dict[tuple[str, str], float] = {}
        self.decreases: list[str] = []
        self.scrapes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Monotonic:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            for node, url in self.urls.items():
                try:
                    with urllib.request.urlopen(url + "/metrics", timeout=2) as r:  # noqa: S310
                        text = r.read().decode()
                except OSError:
                    continue
                self.scrapes += 1
                for name, labels, value in _SAMPLE.findall(text):
                    key = (node, name + labels)
                    v = float(value)
                    old = self.last.get(key)
                    if old is not None and v < old:
                        self.decreases.append(f"{node} {name}{labels}: {old:g} -> {v:g}")
                    self.last[key] = v


@contextmanager
def private_bpffs() -> Iterator[Path]:
    """A BPF filesystem mounted on a new temporary directory (the agents' pins), unmounted
    afterwards."""
    mnt = Path(tempfile.mkdtemp(prefix="zmchaos" + secrets.token_hex(2)))
    subprocess.run(["mount", "-t", "bpf", "bpf", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
        os.rmdir(mnt)


def _served_by_node(cr: ChurnRun, gt: dict[tuple[str, str, str], int]) -> dict[str, int]:
    """node -> bytes the lab counted for the server pods that were on it (both directions)."""
    out: dict[str, int] = {}
    for (_client, server, _direction), n in gt.items():
        node = cr.cluster.pod_node.get(server)
        if node is not None:
            out[node] = out.get(node, 0) + n
    return out


#: the leading fields of a checkpoint's Service row and the labels they are exported as
#: (rows and series may carry more, e.g. the client's class: summed over here)
SERVICE_KEY = ("namespace", "service", "port", "client_zone", "server_zone", "crossing",
               "direction")


def _checkpoint_service(path: Path) -> dict[tuple[str, ...], int]:
    """(:data:`SERVICE_KEY`) -> bytes in a checkpoint file (``Attributor.state()["service"]``)."""
    doc = json.loads(path.read_text())
    out: dict[tuple[str, ...], int] = {}
    for row in doc["attribution"]["service"]:
        key = tuple(str(x) for x in row[:len(SERVICE_KEY)])
        out[key] = out.get(key, 0) + int(row[-1])
    return {k: v for k, v in out.items() if v}


def _exported_service(text: str) -> dict[tuple[str, ...], int]:
    """(:data:`SERVICE_KEY`) -> bytes of one agent's ``zonemeter_service_bytes_total``."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[tuple[str, ...], int] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "zonemeter_service_bytes_total" and s.value:
                key = tuple(s.labels.get(k, "") for k in SERVICE_KEY)
                out[key] = out.get(key, 0) + int(s.value)
    return out


def _sample(text: str, family: str, label: str, value: str) -> int:
    """The value of ``family{label="value"}`` in exposition ``text`` (0 when absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == family and s.labels.get(label) == value:
                return int(s.value)
    return 0


def _slopes(samples: list[Sample], warmup: float) -> dict[str, Any]:
    """RSS (MiB) and CPU (% of one core) of one process: first, last, max, slope per hour
    after ``warmup`` seconds (after half the samples when fewer remain)."""
    if len(samples) < 2:
        return {"samples": len(samples)}
    cpu = [((a.t + b.t) / 2, (b.cpu_seconds - a.cpu_seconds) / (b.t - a.t) * 100)
           for a, b in zip(samples, samples[1:], strict=False) if b.t > a.t]
    late = [s for s in samples if s.t >= samples[0].t + warmup]
    if len(late) < max(3, len(samples) // 2):
        late = samples[len(samples) // 2:]
    late_cpu = [c for c in cpu if c[0] >= late[0].t]
    return {
        "samples": len(samples),
        "seconds": round(samples[-1].t - samples[0].t, 1),
        "rss_mib": {"first": round(samples[0].rss_bytes / 2**20, 1),
                    "last": round(samples[-1].rss_bytes / 2**20, 1),
                    "max": round(max(s.rss_bytes for s in samples) / 2**20, 1),
                    "slope_mib_per_hour_after_warmup": round(slope(
                        (s.t / 3600, s.rss_bytes / 2**20) for s in late), 2)},
        "cpu_percent": {"mean": round(sum(c for _, c in cpu) / len(cpu), 2) if cpu else None,
                        "max": round(max(c for _, c in cpu), 1) if cpu else None,
                        "slope_pct_per_hour_after_warmup": round(slope(
                            (t / 3600, c) for t, c in late_cpu), 2) if len(late_cpu) > 1 else None},
    }


def chaos(st: ChaosSettings, workdir: Path, progress: Any = None) -> dict[str, Any]:
    """Run the chaos soak; returns the figures and the checks (see the module doc)."""
    rng = random.Random(st.seed)
    ev = Events()
    say = progress or (lambda msg: None)
    with private_bpffs() as pins:
        args = ("--pin-path", f"{pins}/{{node}}", "--checkpoint-path",
                f"{workdir}/checkpoint-{{node}}.json", "--series-retention", "0")
        with ChurnRun(workdir, st.interval, args, 0.5, kubernetes=st.kubernetes,
                      topology=CHAOS_TOPOLOGY,
                      node_args={SMALL_TABLE_NODE: ("--flow-capacity", str(st.flow_capacity))}
                      ) as cr:
            fleet = cr.run.fleet
            lab = cr.lab
            nodes = [a.node for a in fleet.agents]
            keeper = KEEPER
            urls = {a.node: a.url for a in fleet.agents}
            mono = Monotonic(urls).start()
            samples: dict[str, list[list[Sample]]] = {n: [[]] for n in nodes}
            pids = {a.node: a.proc.pid for a in fleet.agents}
            t0 = time.monotonic()

            def note(what: str) -> None:
                ev.log.append((round(time.monotonic() - t0, 1), what))
                say(f"{time.monotonic() - t0:7.1f}s {what}")

            def sample() -> None:
                now = time.monotonic() - t0
                for a in fleet.agents:
                    if a.proc.pid != pids[a.node]:  # restarted: a new process, a new series
                        pids[a.node] = a.proc.pid
                        samples[a.node].append([])
                    try:
                        samples[a.node][-1].append(sample_process(a.proc.pid, now))
                    except OSError:
                        pass

            def gap(mean: float) -> float:
                return rng.expovariate(1 / mean) if mean > 0 else float("inf")

            cr.start_traffic(st.duration)
            end = t0 + st.duration
            quiet = end - max(10.0, 4 * st.interval)  # no new event in the last seconds
            # every kind once early (even in a short run), then at random
            def first(mean: float, k: int) -> float:
                return t0 + min(gap(mean), k * st.duration / 10) if mean > 0 else float("inf")

            nxt = {"churn": first(st.churn_every, 1), "kill": first(st.kill_every, 2),
                   "flap": first(st.flap_every, 3),
                   "outage": (first(st.outage_every, 4) if st.kubernetes == "real"
                              else float("inf"))}
            outage_until: float | None = None
            churn_after = 0.0  # monotonic time before which no pod is replaced
            next_sample = t0
            gen = 0
            slot = 0
            while time.monotonic() < end or outage_until is not None:
                now = time.monotonic()
                if now >= next_sample:
                    sample()
                    next_sample += st.sample_every
                if outage_until is not None and now >= outage_until:
                    lab.start_apiserver()
                    ev.outage_seconds += now - (outage_until - st.outage_seconds)
                    outage_until = None
                    churn_after = time.monotonic() + KUBE_PROXY_BACKOFF_SECONDS
                    note("kube-apiserver started")
                    continue
                kind = min(nxt, key=lambda k: nxt[k])
                if nxt[kind] > now or now >= quiet:
                    time.sleep(0.2)
                    continue
                if kind == "churn":
                    nxt[kind] = now + gap(st.churn_every)
                    if outage_until is not None or now < churn_after:
                        continue  # the lab writes pods through the apiserver
                    slot = CHURN_SLOTS[(CHURN_SLOTS.index(slot) + 1) % len(CHURN_SLOTS)
                                       if slot in CHURN_SLOTS else 0]
                    if slot == CHURN_SLOTS[0]:
                        gen += 1
                    reused = cr.replace_api(slot, f"api-g{gen}-{slot}")
                    ev.replacements += 1
                    ev.reused += reused
                    note(f"replaced api slot {slot} (address reused: {reused})")
                elif kind == "kill":
                    nxt[kind] = now + gap(st.kill_every)
                    node = rng.choice([n for n in nodes if n != keeper])
                    sig = signal.SIGTERM if rng.random() < 1 / 3 else signal.SIGKILL
                    down = rng.uniform(0, 3)
                    # during an outage the new agent cannot list: not waited for (ready later)
                    fleet.restart(node, sig, down, ready_timeout=0 if outage_until else 180)
                    ev.kills += sig == signal.SIGKILL
                    ev.terms += sig == signal.SIGTERM
                    note(f"agent {node}: {signal.Signals(sig).name}, down {down:.1f}s, restarted")
                elif kind == "flap":
                    nxt[kind] = now + gap(st.flap_every)
                    pod = rng.choice([p.name for p in lab.topology.pods if p.name.startswith("web")])
                    lab.flap_pod_link(pod, 1.0)
                    ev.flaps += 1
                    note(f"link of {pod} flapped")
                else:
                    nxt[kind] = now + st.outage_seconds + gap(st.outage_every)
                    if outage_until is None:
                        lab.stop_apiserver()
                        outage_until = time.monotonic() + st.outage_seconds
                        ev.outages += 1
                        note("kube-apiserver stopped")
            traffic_end = time.time()
            while cr.traffic_running():
                sample()
                time.sleep(0.5)
            fleet.wait_ready(300)
            res = cr.finish()  # waits for the traffic, settles the agents
            sample()
            mono.stop()
            texts = fleet.scrape_text()
            gt = lab.ground_truth()
            served = _served_by_node(cr, gt)
            per_node = {}
            for node in nodes:
                text = texts[node]
                svc = sum(_exported_service(text).values())
                overflow = (
                    _sample(text, "zonemeter_unattributed_bytes_total", "reason", "flow_table_full")
                    - _sample(text, "zonemeter_diagnostic_bytes_total", "name",
                              "flow_table_full_unfiltered"))
                per_node[node] = {"service_bytes": svc, "request_response_overflow_bytes": overflow,
                                  "ingress_egress_overflow_bytes": _sample(
                                      text, "zonemeter_diagnostic_bytes_total", "name",
                                      "flow_table_full_unfiltered"),
                                  "late_endpoint_bytes": _sample(
                                      text, "zonemeter_diagnostic_bytes_total", "name",
                                      "endpoint_not_in_kernel"),
                                  "truth_served_bytes": served.get(node, 0),
                                  "equal": svc + overflow == served.get(node, 0)}
            checkpoint_equal = {}
            for node in nodes:
                ck = _checkpoint_service(workdir / f"checkpoint-{node}.json")
                checkpoint_equal[node] = ck == _exported_service(texts[node])
            ev.failed_requests = res.failed_requests
            cr.failed = 0
    truth_series = {"/".join(k): v for k, v in res.service_truth.items()}
    agent_series = {"/".join(k): v for k, v in res.service_agents.items()}
    warm = min(300.0, st.duration / 2)
    resources = {n: [_slopes(seg, warm) for seg in segs if seg] for n, segs in samples.items()}
    ok = (all(v["equal"] for v in per_node.values()) and not mono.decreases
          and all(checkpoint_equal.values()))
    return {
        "seed": st.seed, "settings": {k: getattr(st, k) for k in st.__slots__},
        "ok": ok,
        "events": {k: getattr(ev, k) for k in ("replacements", "reused", "kills", "terms",
                                               "flaps", "outages", "failed_requests")}
        | {"outage_seconds": round(ev.outage_seconds, 1)},
        "per_node": per_node,
        "shop_api_series": {"agents": agent_series, "truth": truth_series},
        "monotonic": {"scrapes": mono.scrapes, "decreases": mono.decreases[:20]},
        "checkpoint_equals_export": checkpoint_equal,
        "traffic_ended_at": traffic_end,
        "resources": resources,
        "keeper": KEEPER, "small_table_node": SMALL_TABLE_NODE,
        "loadavg_1m_end": round(os.getloadavg()[0], 2),
        "events_log": ev.log,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the chaos soak and print the figures (exit 1 when a check fails)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="examples:\n  python -m bench.chaos --duration 1800 "
                                       "--kubernetes real\n  python -m bench.chaos --duration 60 "
                                       "--kubernetes emulated -o json")
    d = ChaosSettings()
    p.add_argument("--duration", type=float, default=d.duration, help="traffic seconds (<= 7200)")
    p.add_argument("--kubernetes", choices=("real", "emulated"), default=d.kubernetes)
    p.add_argument("--interval", type=float, default=d.interval, help="agent interval, seconds")
    p.add_argument("--flow-capacity", type=int, default=d.flow_capacity)
    p.add_argument("--churn-every", type=float, default=d.churn_every, metavar="SECONDS")
    p.add_argument("--kill-every", type=float, default=d.kill_every, metavar="SECONDS")
    p.add_argument("--flap-every", type=float, default=d.flap_every, metavar="SECONDS")
    p.add_argument("--outage-every", type=float, default=d.outage_every, metavar="SECONDS")
    p.add_argument("--outage-seconds", type=float, default=d.outage_seconds)
    p.add_argument("--sample-every", type=float, default=d.sample_every)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--keep", type=Path, default=None, metavar="DIR",
                   help="work in DIR and keep it (agent logs, checkpoints, lab state)")
    p.add_argument("-o", "--output", choices=("text", "json"), default="text")
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        print("chaos: needs root (network namespaces, BPF)", file=sys.stderr)
        return 2
    st = ChaosSettings(duration=min(args.duration, 7200.0), kubernetes=args.kubernetes,
                       interval=args.interval, flow_capacity=args.flow_capacity,
                       churn_every=args.churn_every, kill_every=args.kill_every,
                       flap_every=args.flap_every, outage_every=args.outage_every,
                       outage_seconds=args.outage_seconds, sample_every=args.sample_every,
                       seed=args.seed if args.seed is not None else secrets.randbelow(2**31))
    print(f"seed {st.seed}", file=sys.stderr, flush=True)
    if args.keep is not None:  # agent logs and checkpoints stay there
        args.keep.mkdir(parents=True, exist_ok=True)
        out = chaos(st, args.keep, progress=lambda m: print(m, file=sys.stderr, flush=True))
    else:
        with tempfile.TemporaryDirectory(prefix="zonemeter-chaos-") as tmp:
            out = chaos(st, Path(tmp), progress=lambda m: print(m, file=sys.stderr, flush=True))
    if args.output == "json":
        print(json.dumps(out, indent=1))
    else:
        for k, v in out.items():
            if k not in ("events_log", "resources"):
                print(f"{k}: {v}")
        for node, segs in out["resources"].items():
            for seg in segs:
                print(f"agent {node}: {seg}")
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
