"""One ``zonemeter agent`` process per lab node, and reading their ``/metrics``.

Each agent runs in the host network namespace (so its metrics listen on host loopback
and a Prometheus on the host can scrape them), attaches to the pod veths inside its node's
namespace (``--netns``), excludes the node's uplink (a veth whose peer is in the fabric
namespace, see docs/lab.md) and reads the lab's snapshot for metadata and hints.

Metrics are parsed with ``prometheus_client.parser.text_string_to_metric_families`` into
:class:`AgentMetrics`; :func:`merge` adds the counters of every node, which is what
``sum`` in PromQL does.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from agent.errors import InputError, RuntimeFailure
from tools.lab import Lab
from tools.lab.proc import node_cgroup

#: repository root (the agent runs as ``python -m agent`` from here)
_ROOT = Path(__file__).resolve().parents[2]

ServiceSeries = tuple[str, str, str, str, str, str]  # ns, service, cz, sz, crossing, direction

#: the agent's metric families the demo reads (sample names carry ``_total`` for counters);
#: tests check each against ``agent.exporter.Exporter.describe()`` so a rename fails there
SERVICE_BYTES = "zonemeter_service_bytes_total"
ENTRY_BYTES = "zonemeter_service_entry_bytes_total"
HINT_IGNORED_BYTES = "zonemeter_service_hint_ignored_bytes_total"
LOCALITY_IN_EFFECT = "zonemeter_service_locality_in_effect"
LOCALITY_INFO = "zonemeter_service_locality_info"
EXPECTED_CROSS_ZONE = "zonemeter_service_expected_cross_zone_ratio"
WORKLOAD_BYTES = "zonemeter_workload_bytes_total"
CLIENT_PATH_BYTES = "zonemeter_service_client_path_bytes_total"
UNATTRIBUTED_BYTES = "zonemeter_unattributed_bytes_total"
ATTACHED_INTERFACES = "zonemeter_attached_interfaces"
READ_SAMPLES = (SERVICE_BYTES, HINT_IGNORED_BYTES, LOCALITY_IN_EFFECT, LOCALITY_INFO,
                EXPECTED_CROSS_ZONE, WORKLOAD_BYTES, UNATTRIBUTED_BYTES, ATTACHED_INTERFACES,
                CLIENT_PATH_BYTES, ENTRY_BYTES)
#: (namespace, workload, workload_kind, client_zone, remote_zone, remote_kind, crossing,
#: direction): the labels of ``zonemeter_workload_bytes_total``
WorkloadSeries = tuple[str, str, str, str, str, str, str, str]


@dataclass(slots=True)
class AgentMetrics:
    """The series the demo reads from one agent (or the sum over agents).

    Attributes:
        service_bytes: (namespace, service, client_zone, server_zone, crossing, direction)
            -> bytes, summed over ``port``.
        service_classes: (namespace, service, crossing, client_kind, lb_type) -> bytes of
            ``zonemeter_service_bytes_total`` by the client's class (``""`` for an agent
            without the labels), what prices them (docs/report.md, Prices by client class).
        service_bytes_by_kind: (namespace, service, client_kind, client_zone, server_zone,
            crossing, direction) -> bytes, summed over the other labels; empty when the
            agents export no ``client_kind`` label on the family.
        entry_by_kind: (namespace, service, client_kind, client_zone, server_zone, crossing,
            direction) -> bytes of ``zonemeter_service_entry_bytes_total`` (the first hop of
            node ports, counted on the receiving node's uplinks), summed over the rest.
        entry_classes: (namespace, service, crossing, client_kind, lb_type) -> bytes of
            that family, what prices them.
        hint_ignored: (namespace, service, client_zone, server_zone) -> bytes.
        hint_ignored_by_node: (namespace, service, client_node, client_kind) -> bytes.
        client_paths: (namespace, service, client_node, path) -> bytes of
            ``zonemeter_service_client_path_bytes_total`` (the client node's evidence).
        workload_series: every ``zonemeter_workload_bytes_total`` series
            (:data:`WorkloadSeries` labels) -> bytes, the own-node link traffic included.
        in_effect: (namespace, service) -> {client_zone: bool}.
        info: (namespace, service) -> (mode, reason).
        expected: (namespace, service) -> {client_zone: expected cross-zone share 0..1}.
        workload_bytes: sum of ``zonemeter_workload_bytes_total`` over every label (both
            ``direction`` values) except the pods' traffic with their own node
            (``remote_kind="node", crossing="same_node"``).
        node_link_bytes: that traffic with the own node: link-scope packets (IPv6
            neighbour discovery, MLD reports of a new pod's interface) the kernel sends
            by itself; never Service traffic, never cross-zone.
        unattributed: reason -> bytes.
        attached_interfaces: ``zonemeter_attached_interfaces`` (summed over agents).
    """

    service_bytes: dict[ServiceSeries, int] = field(default_factory=dict)
    service_classes: dict[tuple[str, str, str, str, str], int] = field(default_factory=dict)
    service_bytes_by_kind: dict[tuple[str, str, str, str, str, str, str], int] = field(default_factory=dict)
    entry_by_kind: dict[tuple[str, str, str, str, str, str, str], int] = field(default_factory=dict)
    entry_classes: dict[tuple[str, str, str, str, str], int] = field(default_factory=dict)
    hint_ignored: dict[tuple[str, str, str, str], int] = field(default_factory=dict)
    hint_ignored_by_node: dict[tuple[str, str, str, str], int] = field(default_factory=dict)
    client_paths: dict[tuple[str, str, str, str], int] = field(default_factory=dict)
    workload_series: dict[WorkloadSeries, int] = field(default_factory=dict)
    in_effect: dict[tuple[str, str], dict[str, bool]] = field(default_factory=dict)
    info: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)
    expected: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)
    workload_bytes: int = 0
    node_link_bytes: int = 0
    unattributed: dict[str, int] = field(default_factory=dict)
    attached_interfaces: int = 0


def parse_metrics(text: str) -> AgentMetrics:
    """Parse one agent's exposition text (Prometheus text format 0.0.4).

    Raises:
        ValueError: the text is not valid exposition format (prometheus_client's parser).
    """
    m = AgentMetrics()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            lb = s.labels
            v = s.value
            if s.name == SERVICE_BYTES:
                k6 = (lb.get("namespace", ""), lb.get("service", ""), lb.get("client_zone", ""),
                      lb.get("server_zone", ""), lb.get("crossing", ""), lb.get("direction", ""))
                m.service_bytes[k6] = m.service_bytes.get(k6, 0) + int(v)
                kc = (k6[0], k6[1], k6[4], lb.get("client_kind", ""), lb.get("lb_type", ""))
                m.service_classes[kc] = m.service_classes.get(kc, 0) + int(v)
                if "client_kind" in lb:
                    k7 = (k6[0], k6[1], lb["client_kind"], *k6[2:])
                    m.service_bytes_by_kind[k7] = m.service_bytes_by_kind.get(k7, 0) + int(v)  # type: ignore[index]
            elif s.name == ENTRY_BYTES:
                ke = tuple(lb.get(n, "") for n in ("namespace", "service", "client_kind", "client_zone",
                                                    "server_zone", "crossing", "direction"))
                m.entry_by_kind[ke] = m.entry_by_kind.get(ke, 0) + int(v)  # type: ignore[index]
                kc = (ke[0], ke[1], ke[5], ke[2], lb.get("lb_type", ""))
                m.entry_classes[kc] = m.entry_classes.get(kc, 0) + int(v)
            elif s.name == HINT_IGNORED_BYTES:
                k4 = (lb.get("namespace", ""), lb.get("service", ""), lb.get("client_zone", ""),
                      lb.get("server_zone", ""))
                m.hint_ignored[k4] = m.hint_ignored.get(k4, 0) + int(v)
                kn = (lb.get("namespace", ""), lb.get("service", ""), lb.get("client_node", "unknown"),
                      lb.get("client_kind", "pod"))
                m.hint_ignored_by_node[kn] = m.hint_ignored_by_node.get(kn, 0) + int(v)
            elif s.name == CLIENT_PATH_BYTES:
                kp = (lb.get("namespace", ""), lb.get("service", ""), lb.get("client_node", ""),
                      lb.get("path", ""))
                m.client_paths[kp] = m.client_paths.get(kp, 0) + int(v)
            elif s.name == LOCALITY_IN_EFFECT:
                m.in_effect.setdefault((lb["namespace"], lb["service"]), {})[
                    lb.get("client_zone", "unknown")] = v >= 1
            elif s.name == EXPECTED_CROSS_ZONE:
                m.expected.setdefault((lb["namespace"], lb["service"]), {})[
                    lb.get("client_zone", "unknown")] = float(v)
            elif s.name == LOCALITY_INFO:
                m.info[(lb["namespace"], lb["service"])] = (lb.get("mode", ""), lb.get("reason", ""))
            elif s.name == WORKLOAD_BYTES:
                kw = tuple(lb.get(n, "") for n in ("namespace", "workload", "workload_kind", "client_zone",
                                                    "remote_zone", "remote_kind", "crossing", "direction"))
                m.workload_series[kw] = m.workload_series.get(kw, 0) + int(v)  # type: ignore[index]
                if lb.get("remote_kind") == "node" and lb.get("crossing") == "same_node":
                    m.node_link_bytes += int(v)
                else:
                    m.workload_bytes += int(v)
            elif s.name == UNATTRIBUTED_BYTES:
                r = lb.get("reason", "")
                m.unattributed[r] = m.unattributed.get(r, 0) + int(v)
            elif s.name == ATTACHED_INTERFACES:
                m.attached_interfaces += int(v)
    return m


def merge(parts: Iterable[AgentMetrics]) -> AgentMetrics:
    """Sum counters over agents; locality gauges come from the first agent that has them
    (every agent evaluates the same model from the same snapshot)."""
    out = AgentMetrics()
    for p in parts:
        for k6, n in p.service_bytes.items():
            out.service_bytes[k6] = out.service_bytes.get(k6, 0) + n
        for kc, n in p.service_classes.items():
            out.service_classes[kc] = out.service_classes.get(kc, 0) + n
        for k7, n in p.service_bytes_by_kind.items():
            out.service_bytes_by_kind[k7] = out.service_bytes_by_kind.get(k7, 0) + n
        for k7, n in p.entry_by_kind.items():
            out.entry_by_kind[k7] = out.entry_by_kind.get(k7, 0) + n
        for kc, n in p.entry_classes.items():
            out.entry_classes[kc] = out.entry_classes.get(kc, 0) + n
        for k4, n in p.hint_ignored.items():
            out.hint_ignored[k4] = out.hint_ignored.get(k4, 0) + n
        for k4, n in p.hint_ignored_by_node.items():
            out.hint_ignored_by_node[k4] = out.hint_ignored_by_node.get(k4, 0) + n
        for k4, n in p.client_paths.items():
            out.client_paths[k4] = out.client_paths.get(k4, 0) + n
        for kw, n in p.workload_series.items():
            out.workload_series[kw] = out.workload_series.get(kw, 0) + n
        for k, z in p.in_effect.items():
            out.in_effect.setdefault(k, dict(z))
        for k, i in p.info.items():
            out.info.setdefault(k, i)
        for k, e in p.expected.items():
            out.expected.setdefault(k, dict(e))
        out.workload_bytes += p.workload_bytes
        out.node_link_bytes += p.node_link_bytes
        for r, n in p.unattributed.items():
            out.unattributed[r] = out.unattributed.get(r, 0) + n
        out.attached_interfaces += p.attached_interfaces
    return out


def free_port() -> int:
    """Return a TCP port free on 127.0.0.1 now (the kernel's choice)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(slots=True)
class AgentProcess:
    """One running agent: its node, metrics address, process and log file."""

    node: str
    address: str
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def url(self) -> str:
        """Base URL of its HTTP server (``/metrics``, ``/readyz``)."""
        return f"http://{self.address}"


def agent_argv(lab: Lab, node: str, snapshot: Path | None, address: str, interval: float,
               python: str = sys.executable, command: list[str] | None = None,
               extra: tuple[str, ...] = (), kubeconfig: Path | None = None,
               hook: str = "veth") -> list[str]:
    """Return the command line of the agent for ``node`` (the agent verb's flags, docs/agent.md).

    ``hook`` ``"cgroup"`` runs the cgroup hook, scoped to the node's lab namespaces (its own
    and its pods': every lab shares the machine's cgroup tree) and its pods' cgroups (pods
    added later are there too: tools/lab/proc.py) and compared with its uplink
    (docs/datapath.md, "Interface counters"). Either hook counts the first hop of node ports
    on the node's uplink (``--uplink-interfaces``).

    The agent reads its metadata from ``snapshot`` (``--snapshot``) or, when ``kubeconfig`` is
    given, from the apiserver it names (``--kubeconfig``: a lab on real Kubernetes). ``command``
    replaces ``[python, "-m", "agent"]`` (another build of the agent); ``extra`` flags go after
    the generated ones (e.g. ``("--series-retention", "60")``).

    Raises:
        InputError: neither or both of ``snapshot`` and ``kubeconfig``.
    """
    if (snapshot is None) == (kubeconfig is None):
        raise InputError("give exactly one of a snapshot file and a kubeconfig", obj=f"agent of node {node}",
                         field="metadata source")
    source = ["--kubeconfig", str(kubeconfig)] if kubeconfig is not None else ["--snapshot", str(snapshot)]
    netns, uplink = lab.uplink(node)
    exclude = [uplink]
    vx = lab.vxlan_device(node)
    if vx is not None:
        exclude.append(vx[1])
    # the uplink: where the first hop of node ports is counted (both hooks), and the cgroup
    # hook's coverage comparison
    hooked: list[str] = ["--uplink-interfaces", uplink]
    if hook == "cgroup":
        scope = [netns] + [lab.pod_netns(p.name) for p in lab.topology.pods_on(node) if not p.host_network]
        hooked += ["--hook", "cgroup", "--cgroup-scope-netns", ",".join(scope)]
        pods = node_cgroup(lab.prefix, node)
        if pods is not None:  # pods added later are below it (tools/lab/proc.py)
            hooked += ["--cgroup-scope-cgroup", str(pods)]
    return [*(command or [python, "-m", "agent"]), "agent", "--node-name", node, *source,
            "--netns", netns, "--metrics-address", address, "--interval", f"{interval:g}",
            "--exclude-interfaces", ",".join(exclude), *hooked, *extra]


def _get(url: str, timeout: float = 3.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (loopback)
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, ""


class AgentFleet:
    """Start, scrape and stop one agent per lab node.

    Args:
        lab: the running lab.
        snapshot: the snapshot file the agents read (``None`` with ``kubeconfig``).
        logdir: each agent's stdout/stderr goes to ``<logdir>/agent-<node>.log``.
        interval: the agents' export interval (seconds).
        command: the agent program (default ``python -m agent``; the environment variable
            ``ZONEMETER_DEMO_AGENT``, split on spaces, overrides it).
        extra_args: more ``zonemeter agent`` flags for every agent; ``{node}`` in a flag
            is replaced by the agent's node name (a pin directory or checkpoint file each).
        kubeconfig: the agents read the apiserver with it instead of a snapshot (a lab on real
            Kubernetes: :attr:`tools.lab.Lab.agent_kubeconfig`).
        hook: ``veth`` or ``cgroup``: where every agent counts (:func:`agent_argv`).
    """

    def __init__(self, lab: Lab, snapshot: Path | None, logdir: Path, interval: float = 2.0,
                 command: list[str] | None = None, extra_args: tuple[str, ...] = (),
                 kubeconfig: Path | None = None, hook: str = "veth") -> None:
        self.kubeconfig = kubeconfig
        self.hook = hook
        self.extra_args = tuple(extra_args)
        #: node -> flags for that node's agent only, after ``extra_args``
        self.node_args: dict[str, tuple[str, ...]] = {}
        env_cmd = os.environ.get("ZONEMETER_DEMO_AGENT", "").split()
        self.command = command or env_cmd or None
        self.lab = lab
        self.snapshot = snapshot
        self.logdir = logdir
        self.interval = interval
        self.agents: list[AgentProcess] = []
        #: node -> metrics of the last scrape
        self.last_nodes: dict[str, AgentMetrics] = {}

    def start(self, ready_timeout: float = 180.0,
              on_ready: Callable[[str, int, int], None] | None = None) -> None:
        """Start every agent and wait until each answers ``/readyz`` with 200.

        Args:
            ready_timeout: seconds to wait for all of them.
            on_ready: called as each agent turns ready with (node, agents ready so far,
                agents started), for progress output.

        Raises:
            RuntimeFailure: an agent exited or did not become ready (the message carries the
                end of its log); agents already started are stopped.
        """
        self.logdir.mkdir(parents=True, exist_ok=True)
        try:
            for node in self.lab.topology.nodes:
                self.agents.append(self._spawn(node.name, f"127.0.0.1:{free_port()}"))
            self._wait_ready(list(self.agents), ready_timeout, on_ready)
        except BaseException:
            self.stop()
            raise

    def _spawn(self, node: str, address: str) -> AgentProcess:
        """Start the agent of ``node`` serving on ``address``; its log is appended to."""
        log = self.logdir / f"agent-{node}.log"
        extra = tuple(a.replace("{node}", node) for a in self.extra_args) + self.node_args.get(node, ())
        with open(log, "ab") as fh:
            proc = subprocess.Popen(
                agent_argv(self.lab, node, self.snapshot, address, self.interval,
                           command=self.command, extra=extra, kubeconfig=self.kubeconfig,
                           hook=self.hook),
                stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=_ROOT,
                env=_env(), start_new_session=True)
        return AgentProcess(node, address, proc, log)

    def restart(self, node: str, sig: int = signal.SIGKILL, down_seconds: float = 0.0,
                ready_timeout: float = 180.0) -> None:
        """Stop the agent of ``node`` with ``sig`` (SIGKILL: a crash; SIGTERM: a rolling
        update), wait for it to exit, leave the node without an agent for ``down_seconds``,
        then start a new one on the same metrics address and wait until it is ready (not
        when ``ready_timeout`` is 0: :meth:`wait_ready` later). With
        ``--pin-path`` and ``--checkpoint-path`` in ``extra_args`` the new agent resumes from
        what the old one left (docs/datapath.md, "Exactly once across a crash").

        Raises:
            RuntimeFailure: the new agent exited or did not become ready.
        """
        i = next(i for i, a in enumerate(self.agents) if a.node == node)
        old = self.agents[i]
        if old.proc.poll() is None:
            old.proc.send_signal(sig)
        try:
            old.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            old.proc.kill()
            old.proc.wait()
        if down_seconds > 0:
            time.sleep(down_seconds)
        self.agents[i] = self._spawn(node, old.address)
        if ready_timeout > 0:
            self._wait_ready([self.agents[i]], ready_timeout, None)

    def wait_ready(self, timeout: float = 180.0) -> None:
        """Wait until every agent answers ``/readyz`` with 200 (after restarts).

        Raises:
            RuntimeFailure: an agent exited or is not ready within ``timeout`` seconds.
        """
        self._wait_ready(list(self.agents), timeout, None)

    def _wait_ready(self, pending: list[AgentProcess], ready_timeout: float,
                    on_ready: Callable[[str, int, int], None] | None) -> None:
        """Wait until every agent of ``pending`` answers ``/readyz`` with 200."""
        deadline = time.monotonic() + ready_timeout
        while pending:
            for a in list(pending):
                if a.proc.poll() is not None:
                    raise RuntimeFailure(f"agent of node {a.node} exited with "
                                         f"{a.proc.returncode}: {self.log_tail(a)}")
                try:
                    if _get(a.url + "/readyz", timeout=1.0)[0] == 200:
                        pending.remove(a)
                        if on_ready is not None:
                            on_ready(a.node, len(self.agents) - len(pending),
                                     len(self.agents))
                except OSError:
                    pass
            if pending and time.monotonic() > deadline:
                raise RuntimeFailure(f"agent of node {pending[0].node} not ready after "
                                     f"{ready_timeout:.0f}s: {self.log_tail(pending[0])}")
            time.sleep(0.3)

    @staticmethod
    def log_tail(agent: AgentProcess, chars: int = 800) -> str:
        """Return the last ``chars`` characters of an agent's log, on one line."""
        try:
            text = agent.log.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"
        return " | ".join(line for line in text.splitlines() if line.strip())

    def scrape_text(self) -> dict[str, str]:
        """Return node -> ``/metrics`` text of every agent.

        Raises:
            RuntimeFailure: an agent is gone or does not answer.
        """
        out = {}
        for a in self.agents:
            if a.proc.poll() is not None:
                raise RuntimeFailure(f"agent of node {a.node} exited with {a.proc.returncode}: "
                                     f"{self.log_tail(a)}")
            try:
                status, text = _get(a.url + "/metrics")
            except OSError as err:
                raise RuntimeFailure(f"agent of node {a.node} at {a.address}: {err}") from None
            if status != 200:
                raise RuntimeFailure(f"agent of node {a.node}: /metrics answered {status}")
            out[a.node] = text
        return out

    def scrape_nodes(self) -> dict[str, AgentMetrics]:
        """Return node -> that agent's metrics (also kept as :attr:`last_nodes`)."""
        self.last_nodes = {node: parse_metrics(t) for node, t in self.scrape_text().items()}
        return self.last_nodes

    def scrape(self) -> AgentMetrics:
        """Return the sum of every agent's metrics (see :func:`merge`)."""
        return merge(self.scrape_nodes().values())

    def exported_at(self) -> dict[str, float | None]:
        """Return node -> ``generated_at`` of each agent's last export (``/flows``; the
        agent takes it just before draining), None where ``/flows`` is not served."""
        out: dict[str, float | None] = {}
        for a in self.agents:
            try:
                status, text = _get(a.url + "/flows?top=1")
                out[a.node] = float(json.loads(text)["generated_at"]) if status == 200 else None
            except (OSError, ValueError, KeyError, TypeError):
                out[a.node] = None
        return out

    def scrape_settled(self, after: float | None = None, timeout: float = 60.0) -> AgentMetrics:
        """Wait until every agent drained after ``after`` (Unix seconds: when the traffic
        stopped) and two scrapes at least one interval apart agree; returns the last scrape.

        Raises:
            RuntimeFailure: an agent did not drain, or the numbers still moved, within
                ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        if after is not None:
            while True:
                stamps = self.exported_at()
                if all(t is None or t > after for t in stamps.values()):
                    break
                if time.monotonic() > deadline:
                    late = [n for n, t in stamps.items() if t is not None and t <= after]
                    raise RuntimeFailure(f"agents of {', '.join(late)} did not drain after the "
                                         "traffic stopped")
                time.sleep(0.2)
        time.sleep(self.interval * 1.2 + 0.3)
        last = self.scrape()
        while True:
            time.sleep(self.interval * 1.2 + 0.3)
            now = self.scrape()
            if now.service_bytes == last.service_bytes and now.hint_ignored == last.hint_ignored \
                    and now.unattributed == last.unattributed \
                    and now.workload_bytes == last.workload_bytes:
                return now
            if time.monotonic() > deadline:
                raise RuntimeFailure("agent counters still changing after traffic stopped")
            last = now

    def targets(self) -> list[str]:
        """``host:port`` of every agent (for a Prometheus scrape config)."""
        return [a.address for a in self.agents]

    def stop(self, timeout: float = 30.0) -> dict[str, int | None]:
        """SIGTERM every agent (final drain, export, detach), wait, SIGKILL stragglers.

        Returns:
            node -> exit code (None if it had to be killed).
        """
        for a in self.agents:
            if a.proc.poll() is None:
                a.proc.send_signal(signal.SIGTERM)
        codes: dict[str, int | None] = {}
        deadline = time.monotonic() + timeout
        for a in self.agents:
            try:
                codes[a.node] = a.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                a.proc.kill()
                a.proc.wait()
                codes[a.node] = None
        self.agents = []
        return codes


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH")
                                      else "")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env

