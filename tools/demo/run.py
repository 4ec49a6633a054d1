"""One demo run: lab cluster, agents, optional Prometheus, traffic, summary.

:class:`DemoRun` is what ``zonemeter demo`` and ``tests/e2e`` drive::

    with DemoRun(load_demo(), DemoOptions(duration_seconds=10)) as run:
        result = run.execute()          # builds, runs, returns DemoResult
    # leaving the block tears everything down (unless options.keep)

Phases of :meth:`DemoRun.execute`:

1. build the lab, write the snapshot (controller hints), program proxies (kube-proxy's
   selection), both from the upstream oracle when built, else the model (``options.hints``,
   :mod:`tools.demo.hintsource`);
2. start one agent per node and wait until every ``/readyz`` answers 200;
3. (``prometheus``) start Prometheus scraping the agents;
4. warm-up: every client sends ``warmup_requests`` back-to-back requests to every Service,
   so every series the run will produce exists before the measured window (Prometheus's
   ``increase`` cannot see the first value of a series that appears inside its window);
5. wait until every agent drained after the warm-up ended (its ``/flows`` ``generated_at``)
   and two scrapes an interval apart agree, read the ground truth: the window starts
   (``t0``);
6. traffic for ``duration_seconds`` at the plan's rate, with a progress callback every
   ``refresh_seconds`` (agents scraped, ground truth read); ``during(run)`` is called once
   half-way (tests replace a pod there);
7. wait until the agents settle again, read the ground truth: the window ends (``t1``);
   Prometheus (if any) gets two more scrape intervals of flat counters first;
8. summary (agents beside ground truth), Prometheus checks, agents stopped with SIGTERM
   (unless ``keep``) and their exit codes recorded.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from agent.errors import InputError, RuntimeFailure
from tools.demo import prometheus as prom
from tools.demo.agents import AgentFleet, AgentMetrics
from tools.demo.cluster import DemoCluster, ServiceTruth
from tools.demo.summary import build_summary
from tools.demo.topology import DemoSpec, FlowPlan
from tools.lab import FlowHandle, FlowResult


@dataclass(frozen=True, slots=True)
class DemoOptions:
    """Settings of one run.

    Attributes:
        duration_seconds: measured traffic time (seconds).
        interval_seconds: the agents' export interval (seconds).
        refresh_seconds: progress callback period (seconds).
        warmup_requests: back-to-back requests per (client, Service) before the window.
        prometheus: start a Prometheus scraping the agents.
        scrape_seconds: Prometheus scrape interval (seconds).
        keep: leave lab, agents and Prometheus running after :meth:`DemoRun.execute`.
        workdir: directory for snapshot, logs and TSDB (default: a new temporary one).
        prefix: lab prefix (default random).
        state_dir: lab state directory (default the lab's).
        agent_args: more ``zonemeter agent`` flags for every agent (benchmarks).
        hints: where the lab's hints and kube-proxy selections come from: ``auto`` (the
            upstream oracle when built, else the model), ``oracle`` or ``model``
            (:func:`tools.demo.hintsource.hint_source`); not asked with ``kubernetes="real"``.
        kubernetes: ``emulated`` (the lab's own picture) or ``real`` (etcd, kube-apiserver,
            kube-controller-manager and kube-proxy; the agents read the apiserver with the
            token of deploy/daemonset's ServiceAccount), see docs/lab.md.
        kube_proxy_mode: the real kube-proxy's mode, ``iptables`` or ``nftables``.
        hook: where the agents count, ``veth`` or ``cgroup`` (docs/datapath.md); a topology
            whose nodes run ``dataPlane: bypass`` needs ``cgroup`` (docs/lab.md).
        zone_cidrs: a ``--zone-cidrs`` file for the agents, added to the lab's entries for
            its outside peers (:meth:`DemoCluster.write_zone_cidrs`).
    """

    duration_seconds: float = 30.0
    interval_seconds: float = 2.0
    refresh_seconds: float = 2.0
    warmup_requests: int = 30
    prometheus: bool = False
    scrape_seconds: float = 0.5
    keep: bool = False
    workdir: Path | None = None
    prefix: str | None = None
    state_dir: Path | None = None
    agent_args: tuple[str, ...] = ()
    hints: str = "auto"
    kubernetes: str = "emulated"
    kube_proxy_mode: str = "iptables"
    hook: str = "veth"
    zone_cidrs: Path | None = None


@dataclass(slots=True)
class PrometheusCheck:
    """What Prometheus says over the measured window.

    Attributes:
        url: base URL.
        window: (start, end) Unix seconds of the plain ``increase``: start is the earliest
            target's last successful scrape before the traffic.
        aligned: Service -> cross-zone bytes (``increase`` aligned on scrapes, no
            extrapolation).
        plain: Service -> cross-zone bytes (plain ``increase`` over the window,
            extrapolated by Prometheus).
        truth: Service -> cross-zone bytes the lab counted in the window.
        locality: Service -> {client zone: in effect} at t1.
        promql: the aligned query that was run.
    """

    url: str
    window: tuple[float, float]
    aligned: dict[str, float]
    plain: dict[str, float]
    truth: dict[str, int]
    locality: dict[str, dict[str, bool]]
    promql: str


@dataclass(slots=True)
class DemoResult:
    """Everything one run produced.

    Attributes:
        summary: the JSON summary (see :mod:`tools.demo.summary`).
        agents: the agents' final metrics summed over nodes.
        truth: Service -> ground truth (whole run).
        flows: results of every traffic client (warm-up and measured).
        prometheus: the Prometheus check, when enabled.
        agent_exit_codes: node -> exit code after SIGTERM (empty with ``keep``).
        per_node: node -> that agent's final metrics.
        traffic_seconds: how long one client sent (seconds): the median of the measured
            traffic clients' own wall times. ``summary["duration_seconds"]`` is longer: it
            runs from starting the first client process to the last client's last reply,
            and starting some 30 client processes on a small machine takes a second or two.
        baseline: the agents' metrics (summed) just before the measured traffic started.
        workload_truth: the lab's non-Service bytes as workload series (seen, unseen:
            :meth:`DemoCluster.workload_truth`).
    """

    summary: dict[str, Any]
    agents: AgentMetrics
    truth: dict[str, ServiceTruth]
    flows: list[FlowResult]
    prometheus: PrometheusCheck | None = None
    agent_exit_codes: dict[str, int | None] = field(default_factory=dict)
    per_node: dict[str, AgentMetrics] = field(default_factory=dict)
    traffic_seconds: float = 0.0
    baseline: AgentMetrics | None = None
    workload_truth: tuple[dict[Any, int], dict[Any, int]] = field(default_factory=lambda: ({}, {}))


Progress = Callable[[dict[str, Any], float, float], None]


class DemoRun:
    """Build, run and tear down one demo (see the module docstring)."""

    def __init__(self, spec: DemoSpec, options: DemoOptions | None = None) -> None:
        self.options = options or DemoOptions()
        self.workdir = Path(self.options.workdir or tempfile.mkdtemp(prefix="zonemeter-demo-"))
        self.cluster = DemoCluster(spec, self.workdir, hints=self.options.hints,
                                   prefix=self.options.prefix,
                                   state_dir=self.options.state_dir,
                                   server_max_seconds=max(3600.0, self.options.duration_seconds * 4),
                                   kubernetes=self.options.kubernetes,
                                   proxy_mode=self.options.kube_proxy_mode)
        real = self.options.kubernetes == "real"
        self.fleet = AgentFleet(self.cluster.lab, None if real else self.cluster.snapshot_path,
                                self.workdir / "logs", self.options.interval_seconds,
                                extra_args=self.options.agent_args,
                                kubeconfig=self.cluster.lab.agent_kubeconfig if real else None,
                                hook=self.options.hook)
        self.prometheus_url: str | None = None
        self._prom: subprocess.Popen[bytes] | None = None
        self._handles: list[FlowHandle] = []
        self._built = False
        self._owner_pid = os.getpid()
        #: (monotonic start, seconds) of the measured traffic while it runs
        self._measure: tuple[float, float] | None = None
        #: the agents' metrics just before the measured traffic (cost extrapolation)
        self._baseline: AgentMetrics | None = None

    # ------------------------------------------------------------------ context

    def __enter__(self) -> DemoRun:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.options.keep or exc[0] is not None:
            self.teardown()
        if os.getpid() == self._owner_pid:
            self.cluster.close()

    def teardown(self) -> None:
        """Stop traffic, Prometheus and agents, tear the lab down (idempotent; does
        nothing in a forked child that unwound into it, e.g. on Ctrl-C)."""
        if os.getpid() != self._owner_pid:
            return
        for h in self._handles:
            h.stop()
        self._handles = []
        if self._prom is not None and self._prom.poll() is None:
            self._prom.terminate()
            try:
                self._prom.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self._prom.kill()
                self._prom.wait()
        self._prom = None
        if self.fleet.agents:
            self.fleet.stop()
        if self._built:
            self.cluster.down()
            self._built = False

    # ------------------------------------------------------------------ phases

    def build(self, phase: Callable[[str], None] | None = None) -> None:
        """Phases 1-3: lab, agents, Prometheus.

        Args:
            phase: called with one line of text as each phase starts or an agent turns
                ready (progress for people; ``zonemeter demo`` prints it to stderr).
        """
        say = phase or (lambda _: None)
        self._built = True
        began = time.monotonic()
        self.cluster.up()
        zone_cidrs = self.cluster.write_zone_cidrs(self.options.zone_cidrs)
        if zone_cidrs is not None:
            self.fleet.extra_args = (*self.fleet.extra_args, "--zone-cidrs", str(zone_cidrs))
        n = len(self.cluster.topology.nodes)
        say(f"lab up in {time.monotonic() - began:.1f} s; starting {n} agents (each compiles "
            "and attaches its BPF program)")
        began = time.monotonic()
        self.fleet.start(on_ready=lambda node, ready, total: say(
            f"agents compiled and attached {ready}/{total} (node {node}, "
            f"{time.monotonic() - began:.1f} s)"))
        if self.options.prometheus:
            say("starting prometheus")
            self._start_prometheus()
        self._write_state()

    def _start_prometheus(self) -> None:
        binary = prom.find_prometheus()
        if binary is None:
            raise RuntimeFailure("--prometheus needs /usr/bin/prometheus (Debian package "
                                 "prometheus; tools/setup.sh installs it)")
        root = self.workdir / "prometheus"
        root.mkdir(parents=True, exist_ok=True)
        config = root / "prometheus.yml"
        config.write_text(prom.scrape_config(self.fleet.targets(), self.options.scrape_seconds))
        port = prom.free_port()
        log = open(root / "prometheus.log", "wb")
        self._prom = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={root / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
        log.close()
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            if self._prom.poll() is not None:
                raise RuntimeFailure("prometheus exited: "
                                     + (root / "prometheus.log").read_text()[-800:])
            try:
                prom.query(url, "up")
                break
            except RuntimeFailure:
                if time.monotonic() > deadline:
                    raise RuntimeFailure("prometheus not ready after 60 s") from None
                time.sleep(0.3)
        self.prometheus_url = url

    def _write_state(self) -> None:
        state = {"prefix": self.cluster.prefix, "state_dir": str(self.cluster.lab.state_dir),
                 "workdir": str(self.workdir),
                 "agents": [{"node": a.node, "pid": a.proc.pid, "metrics": a.address}
                            for a in self.fleet.agents],
                 "prometheus": None if self._prom is None else
                 {"pid": self._prom.pid, "url": self.prometheus_url}}
        (self.workdir / "demo.json").write_text(json.dumps(state, indent=1))

    def _run_traffic(self, duration: float, count: int | None, progress: Progress | None,
                     during: Callable[[DemoRun], None] | None, started: float,
                     total: float) -> list[FlowResult]:
        self._handles = self.cluster.start_traffic(duration, count=count)
        self._measure = (time.monotonic(), duration) if count is None else None
        mid = time.monotonic() + duration / 2
        next_refresh = time.monotonic() + self.options.refresh_seconds
        while not all(h.done() for h in self._handles):
            now = time.monotonic()
            if during is not None and now >= mid:
                during(self)
                during = None
            if progress is not None and now >= next_refresh:
                progress(self.snapshot_summary(time.monotonic() - started),
                         time.monotonic() - started, total)
                next_refresh = time.monotonic() + self.options.refresh_seconds
            time.sleep(0.1)
        if during is not None:
            during(self)
        results = [h.wait() for h in self._handles]
        self._handles = []
        self._measure = None
        return results

    def replace_pod(self, old: str, new: str) -> str:
        """Delete pod ``old`` mid-run and create ``new`` in its place, which reuses its
        address (:meth:`DemoCluster.replace_pod`). A client pod's requests stop first
        (connections cut short are counted alike by agents and lab) and its successor
        makes the remaining requests of the measured window.

        Returns:
            The new pod's IPv4 address.
        """
        mine = [h for h in self._handles if h.client == old]
        for h in mine:
            h.stop()
        for h in mine:
            try:
                h.wait()
            except RuntimeFailure:
                pass  # ended by us
        self._handles = [h for h in self._handles if h not in mine]
        address = self.cluster.replace_pod(old, new)
        if mine and self._measure is not None:
            start, duration = self._measure
            # at least a second of traffic, so the successor is seen even when the
            # replacement ate the rest of the window
            left = max(1.0, duration - (time.monotonic() - start))
            self._handles += self.cluster.start_traffic(left, clients=[new])
        return address

    def snapshot_summary(self, elapsed: float) -> dict[str, Any]:
        """The summary right now (agents scraped, ground truth read), for progress."""
        agents = self.fleet.scrape()
        gt = self.cluster.lab.ground_truth()
        sent = None if self._measure is None else time.monotonic() - self._measure[0]
        return build_summary(elapsed, agents, self.cluster.truth(gt), self.cluster.models,
                             baseline=self._baseline, traffic_seconds=sent,
                             workload_truth=self.cluster.workload_truth(gt),
                             entry_truth=self.cluster.entry_truth())

    def execute(self, progress: Progress | None = None,
                during: Callable[[DemoRun], None] | None = None,
                phase: Callable[[str], None] | None = None) -> DemoResult:
        """Run every phase (see the module docstring) and return the result.

        Args:
            progress: called with (summary so far, elapsed seconds, planned seconds).
            during: called once half-way through the measured traffic.
            phase: called with one line of text per phase (see :meth:`build`).

        Raises:
            RuntimeFailure: the lab, an agent or Prometheus failed.
        """
        opt = self.options
        say = phase or (lambda _: None)
        self.build(say)
        started = time.monotonic()
        say(f"warming up: {opt.warmup_requests} requests per client and Service, then waiting "
            "for every agent's next export")
        flows = self._run_traffic(0, opt.warmup_requests, None, None, started,
                                  opt.duration_seconds)
        baseline = self._baseline = self.fleet.scrape_settled(after=time.time())
        g0 = self.cluster.truth()
        if self._prom is not None:
            time.sleep(opt.scrape_seconds * 3)
        t0 = time.time()
        measured_start = time.monotonic()
        plan = self.cluster.traffic.flows
        fams = " and ".join(f"IPv{f}" for f in sorted({f for x in plan for f in x.families}))
        paths = ", ".join(dict.fromkeys(f.path for f in plan))
        say(f"traffic: {opt.duration_seconds:g} s per client, {fams}; paths: {paths}")
        measured = self._run_traffic(opt.duration_seconds, None, progress, during, started,
                                     opt.duration_seconds)
        flows += measured
        duration = time.monotonic() - measured_start
        traffic_seconds = client_seconds(measured) or duration
        say("traffic done; waiting for every agent's last export")
        agents = self.fleet.scrape_settled(after=time.time())
        gt = self.cluster.lab.ground_truth()
        truth = self.cluster.truth(gt)
        workload_truth = self.cluster.workload_truth(gt)
        summary = build_summary(duration, agents, truth, self.cluster.models, baseline=baseline,
                                traffic_seconds=traffic_seconds, workload_truth=workload_truth,
                                entry_truth=self.cluster.entry_truth())
        summary["flows"] = [plan_json(f) for f in self.cluster.traffic.flows]
        summary["requests"] = {"completed": sum(f.ok for f in flows),
                               "failed": sum(f.failed for f in flows)}
        summary["zone_cidrs"] = None if self.cluster.zone_cidrs_path is None else {
            "path": str(self.cluster.zone_cidrs_path),
            "load_balancers_marked": self.cluster.load_balancers_marked}
        # which control plane and kube-proxy judged the run, with their versions, and where
        # the agents' model answers otherwise (hints, kube-proxy endpoints: model bugs)
        summary["kubernetes"] = self.cluster.lab.kubernetes_status()
        summary["model_disagreements"] = list(self.cluster.disagreements)
        if summary["kubernetes"]["mode"] == "emulated":
            summary["kubernetes"]["hints"] = self.cluster.hints.kind  # "oracle" or "model"
        result = DemoResult(summary=summary,
                            agents=agents, truth=truth, flows=flows,
                            per_node=dict(self.fleet.last_nodes),
                            traffic_seconds=traffic_seconds, baseline=baseline,
                            workload_truth=workload_truth)
        if self._prom is not None and self.prometheus_url is not None:
            time.sleep(opt.scrape_seconds * 3)
            t1 = time.time()
            result.prometheus = self._prometheus_check(t0, t1, g0, truth)
        if not opt.keep:
            result.agent_exit_codes = self.fleet.stop()
        return result

    def _prometheus_check(self, t0: float, t1: float, g0: dict[str, ServiceTruth],
                          g1: dict[str, ServiceTruth]) -> PrometheusCheck:
        assert self.prometheus_url is not None
        url = self.prometheus_url
        aligned, promql, start = prom.service_increase_aligned(
            url, "zonemeter_service_bytes_total", 'crossing="cross_zone"', self.fleet.targets(),
            t0, t1)
        # from the earliest aligned start: every target has a scrape from before the traffic
        # in the plain range too, so plain can only extrapolate upwards
        plain = prom.service_increase(url, 'zonemeter_service_bytes_total{crossing="cross_zone"}',
                                      start, t1)
        truth = {k: g1[k].cross_zone_bytes - (g0[k].cross_zone_bytes if k in g0 else 0)
                 for k in g1 if k}
        return PrometheusCheck(url=url, window=(start, t1), aligned=aligned, plain=plain,
                               truth=truth, locality=prom.locality(url, t1), promql=promql)


def plan_json(f: FlowPlan) -> dict[str, Any]:
    """One flow of the traffic plan as the summary's ``flows`` lists it (docs/demo.md)."""
    return {"name": f.name, "path": f.path, "service": f.service, "target": f.target,
            "clients": list(f.clients), "nodes": list(f.nodes), "port": f.port,
            "families": list(f.families), "rate": f.rate, "request_bytes": f.request_bytes,
            "response_bytes": f.response_bytes}


def client_seconds(flows: list[FlowResult]) -> float:
    """Return how long one traffic client sent, in seconds: the median of the clients'
    own wall times (``FlowResult.elapsed_seconds``); 0.0 for no flows.

    The median, because a client replaced mid-run is split into two shorter ones."""
    return float(statistics.median(f.elapsed_seconds for f in flows)) if flows else 0.0


def warning_messages(snapshot_path: Path) -> dict[str, dict[str, str]]:
    """Return Service key -> {warning code: message} of the hint model on the demo's snapshot.

    The model at the Kubernetes version the lab runs
    (``tools.demo.cluster.KUBERNETES_VERSION``), as the agents run it, so the messages are what
    ``zonemeter explain --snapshot`` prints for it. Every address family's warnings are
    merged (first message per code wins).

    Raises:
        InputError: the snapshot cannot be read.
    """
    from agent import hints
    from agent.k8s import snapshot
    from tools.demo.cluster import KUBERNETES_VERSION

    snap = snapshot.load(snapshot_path)
    out: dict[str, dict[str, str]] = {}
    for d in hints.evaluate_cluster(snap.nodes, snap.services, snap.endpointslices, snap.pods,
                                    version=KUBERNETES_VERSION):
        msgs = out.setdefault(f"{d.namespace}/{d.name}", {})
        for w in d.warnings:
            msgs.setdefault(w.code, w.message)
    return out


def teardown_kept(workdir: Path) -> list[str]:
    """Tear down a run left by ``--keep``: SIGTERM its agents and Prometheus (only
    processes whose command line is still theirs) and remove the lab.

    Returns:
        What was stopped or removed, for the user.

    Raises:
        InputError: ``workdir`` is not a directory, has no ``demo.json``, or that file is
            not a kept demo's state (one line naming the directory; exit 2).
    """
    from tools.lab import Lab

    workdir = Path(workdir)
    hint = "give the directory a 'zonemeter demo --keep' run printed"
    if not workdir.is_dir():
        raise InputError(f"no such directory ({hint})", source="--teardown", obj=str(workdir))
    path = workdir / "demo.json"
    if not path.is_file():
        raise InputError(f"has no demo.json, so it is not a kept demo ({hint})",
                         source="--teardown", obj=str(workdir))
    try:
        state = json.loads(path.read_text())
        if not isinstance(state, dict) or "prefix" not in state or "state_dir" not in state:
            raise ValueError("prefix/state_dir missing")
    except (OSError, ValueError) as err:
        raise InputError(f"demo.json is not a kept demo's state ({err})",
                         source="--teardown", obj=str(workdir)) from None
    done = []
    procs = [(a["pid"], b"agent\0agent") for a in state.get("agents", [])]
    if state.get("prometheus"):
        procs.append((state["prometheus"]["pid"], b"prometheus"))
    for pid, marker in procs:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if marker not in fh.read():
                    continue
            os.kill(pid, signal.SIGTERM)
            done.append(f"stopped pid {pid}")
        except (OSError, ProcessLookupError):
            continue
    deadline = time.monotonic() + 20
    for pid, _ in procs:
        while time.monotonic() < deadline and os.path.exists(f"/proc/{pid}"):
            time.sleep(0.1)
    removed = Lab.down_prefix(state["prefix"], state["state_dir"])
    done.append(f"lab {state['prefix']}: {len(removed)} namespaces removed")
    # the work directory is the one thing left behind, on purpose (explain reads its
    # snapshot): say so, or a user checking /tmp afterwards takes it for a leak
    kept = "snapshot, agent logs" + (", Prometheus data" if state.get("prometheus") else "")
    done.append(f"kept {workdir} ({kept}); remove it when done: rm -r "
                f"{shlex.quote(str(workdir))}")
    return done


#: code of the Python callbacks the standard library registers with ``os.register_at_fork``
#: for the parent (logging's lock: 3.11 ``_acquireLock``/``_releaseLock``, 3.13
#: ``_prepareFork``/``_afterFork``). CPython runs them around every fork (``subprocess``,
#: pyroute2's helpers) and prints and drops any exception they raise (``run_at_forkers``
#: in Modules/posixmodule.c): a KeyboardInterrupt raised there would be lost.
_FORK_HOOKS = frozenset(f.__code__ for name in ("_acquireLock", "_releaseLock", "_prepareFork", "_afterFork")
                        if callable(f := getattr(logging, name, None)) and hasattr(f, "__code__"))
#: how long a signal that arrived inside a fork callback waits before it is delivered again (s)
REDELIVER_SECONDS = 0.05


def in_fork_hook(frame: FrameType | None) -> bool:
    """True when ``frame`` or a caller of it runs one of :data:`_FORK_HOOKS`."""
    while frame is not None:
        if frame.f_code in _FORK_HOOKS:
            return True
        frame = frame.f_back
    return False


def sigterm_as_interrupt() -> Callable[[], None]:
    """Make SIGTERM raise KeyboardInterrupt (like Ctrl-C) so ``finally`` blocks clean up, and
    make neither signal get lost in a fork: one that arrives while the process forks is handled
    inside the standard library's fork callbacks, where an exception is dropped
    (:data:`_FORK_HOOKS`), so it is sent again :data:`REDELIVER_SECONDS` later instead. Returns
    a function restoring the previous handlers."""
    old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    owner = os.getpid()

    def handler(signum: int, frame: FrameType | None) -> None:
        if os.getpid() != owner:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt  # as Python's default handler does
            # a forked child (pyroute2 runs netlink in forked helpers and ends them with
            # SIGTERM) must die as by default, not unwind into our cleanup code
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        if in_fork_hook(frame):
            threading.Timer(REDELIVER_SECONDS, os.kill, (owner, signum)).start()
            return
        raise KeyboardInterrupt

    for s in old:
        signal.signal(s, handler)

    def restore() -> None:
        for s, h in old.items():
            signal.signal(s, h)

    return restore
