"""The lab as a cluster: controller hints, kube-proxy selection per node, ground truth.

:class:`DemoCluster` wraps a :class:`tools.lab.Lab` and makes it behave like the cluster
the agents are told about:

1. the lab's Nodes, Pods, Services and EndpointSlices (:meth:`Lab.snapshot`) get the
   ``hints`` the EndpointSlice controller writes (Kubernetes :data:`KUBERNETES_VERSION`
   defaults) and are written as the agents' snapshot file;
2. kube-proxy of that release says, per Service and node, which endpoints it forwards
   ClusterIP traffic to on that snapshot (empty for DROP/REJECT);
3. every node's kube-proxy emulation is programmed with exactly that selection
   (:meth:`Lab.program_proxies`), except nodes with ``ignoreHints: true``, which keep
   every ready endpoint (a data plane that ignores hints);
4. ground truth comes from the lab's nftables counters only (never from the agents) and is
   turned into the numbers the agents should report: bytes per Service and crossing,
   cross-zone bytes, and hint-ignored bytes (from a client on node N to an endpoint outside
   the set kube-proxy selects for N while the model says N filters by topology).

Steps 1 and 2 come from a :class:`tools.demo.hintsource.HintSource`: the upstream code
through the hint oracle (``tools/oracle``) when its binary for the version is built, else
zonemeter's model (``agent.hints.controller_hints`` / ``evaluate_cluster``). The diagnosis
(mode, reason, locality per zone, warnings, which nodes filter by topology) is always the
model's, the agents' own view, evaluated on the snapshot the agents read; with the oracle,
where the model would select other endpoints or write other hints the oracle's answer is
used and the difference is kept in :attr:`HintSource.disagreements` (a model bug).
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from agent import hints as hint_model
from agent.errors import InputError, RuntimeFailure
from tools.demo.hintsource import KUBERNETES_VERSION, HintSource, RealSource, hint_source, objects
from tools.demo.topology import DemoSpec, FlowPlan, TrafficPlan, observed_client
from tools.lab import FlowHandle, FlowSpec, Lab
from tools.lab import snapshot as lab_snapshot
from tools.lab.topology import Node, Service, Topology

__all__ = ["CROSSINGS", "DIRECTIONS", "KUBERNETES_VERSION", "DemoCluster", "LocalityChange",
           "ServiceModel", "ServiceTruth", "controller_snapshot", "controller_snapshot_of",
           "evaluate", "hint_source"]
CROSSINGS = ("same_node", "same_zone", "cross_zone", "cross_region", "external", "unknown")
DIRECTIONS = ("request", "response")
#: (namespace, workload, workload_kind, remote_kind, client_zone, remote_zone, crossing,
#: direction): the labels of ``zonemeter_workload_bytes_total`` a ground-truth row stands for
WorkloadKey = tuple[str, str, str, str, str, str, str, str]


@dataclass(frozen=True, slots=True)
class Side:
    """One side of a ground-truth pair, as the agents should resolve it.

    Attributes:
        name: the lab's name (pod, ``node/<n>``, ``outside/<peer>``, ``ip/<addr>``).
        kind: the client class (``pod``, ``node``, ``load-balancer``, ``cidr``,
            ``external``, ``unknown``; the vocabulary of ``client_kind``/``remote_kind``).
        zone, region: where it is (None: no zone, an external peer).
        node: its node (pods, host-network pods, node addresses), else None.
        veth: a pod with its own network namespace (an agent sees its veth).
        namespace, workload: the pod's namespace and name (the agents' workload of a pod
            without owner), else the lab name.
    """

    name: str
    kind: str
    zone: str | None
    region: str | None
    node: str | None
    veth: bool
    namespace: str
    workload: str


def crossing_of(a: Side, b: Side) -> str:
    """The agents' ``crossing`` of a pair (docs/attribution.md, *Classification*: external
    first, then same node, unknown zone, region, zone)."""
    if a.kind == "external" or b.kind == "external":
        return "external"
    if a.node is not None and a.node == b.node:
        return "same_node"
    if a.zone is None or b.zone is None:
        return "unknown"
    if a.region and b.region and a.region != b.region:
        return "cross_region"
    return "same_zone" if a.zone == b.zone else "cross_zone"


@dataclass(frozen=True, slots=True)
class ServiceModel:
    """What the hint model says about one Service (IPv4 diagnosis; IPv6 must agree).

    Attributes:
        key: ``namespace/name``.
        mode: requested mode (``ServiceDiagnosis.mode``).
        reason: why locality is (not) in effect (``ServiceDiagnosis.reason``).
        locality_in_effect: client zone -> bool.
        warnings: warning codes.
        selection: node -> endpoint pod names kube-proxy there forwards to (the hint
            source's answer for every node, including nodes whose data plane ignores hints).
        filtering: node -> True when kube-proxy there filters by topology
            (``topology_mode`` ``PreferSameZone``/``PreferSameNode``).
        expected_cross_zone: client zone -> expected cross-zone share
            (``ServiceDiagnosis.expected_cross_zone``; what the agents export as
            ``zonemeter_service_expected_cross_zone_ratio``, None where they export none).
    """

    key: str
    mode: str
    reason: str
    locality_in_effect: Mapping[str, bool]
    warnings: tuple[str, ...]
    selection: Mapping[str, tuple[str, ...]]
    filtering: Mapping[str, bool]
    expected_cross_zone: Mapping[str, float | None] = field(default_factory=dict)


@dataclass(slots=True)
class ServiceTruth:
    """Ground truth of one Service, from the lab's counters (L3 bytes).

    Attributes:
        bytes: crossing -> bytes (both directions).
        by_series: (client_zone, server_zone, crossing, direction) -> bytes: the labels of
            ``zonemeter_service_bytes_total`` without namespace, service and port.
        by_class: (client_kind, client_zone, server_zone, crossing, direction) -> bytes: the
            same with the client's class (:meth:`DemoCluster.side`).
        hint_ignored: (client_zone, server_zone) -> bytes (both directions).
        hint_ignored_by_cause: (client node, cause) -> hint-ignored bytes (both directions)
            and the cause the lab played (docs/attribution.md, "Why bytes ignored the
            hints"): ``data-plane`` (a pod called the ClusterIP and its node's data plane
            ignores hints), ``client-side`` (a pod dialled the endpoint itself),
            ``external`` (the client is the node's address: a host-network client, or a
            node-port call the node masqueraded).
    """

    bytes: dict[str, int] = field(default_factory=lambda: {c: 0 for c in CROSSINGS})
    by_series: dict[tuple[str, str, str, str], int] = field(default_factory=dict)
    by_class: dict[tuple[str, str, str, str, str], int] = field(default_factory=dict)
    hint_ignored: dict[tuple[str, str], int] = field(default_factory=dict)
    hint_ignored_by_cause: dict[tuple[str, str], int] = field(default_factory=dict)

    @property
    def hint_ignored_by_node(self) -> dict[str, int]:
        """client node -> its hint-ignored bytes (both directions, every cause)."""
        out: dict[str, int] = {}
        for (node, _), n in self.hint_ignored_by_cause.items():
            out[node] = out.get(node, 0) + n
        return out

    @property
    def cross_zone_bytes(self) -> int:
        """Bytes whose client and server zones differ (same region)."""
        return self.bytes["cross_zone"]

    @property
    def hint_ignored_bytes(self) -> int:
        """All hint-ignored bytes of the Service."""
        return sum(self.hint_ignored.values())


def controller_snapshot(lab: Lab, source: HintSource) -> dict[str, Any]:
    """Return the lab's objects with EndpointSlice hints as the controller would write them.

    Source: EndpointSlice controller (``reconciler.go reconcileByAddressType``,
    ``topologycache``, ``trafficdist``), upstream or modelled as ``source`` says.

    Returns:
        A kubectl ``List`` (Nodes, Pods, Services, EndpointSlices per family).

    Raises:
        RuntimeFailure: the oracle failed.
    """
    return controller_snapshot_of(lab.topology, source)


def controller_snapshot_of(topology: Topology, source: HintSource) -> dict[str, Any]:
    """:func:`controller_snapshot` of a topology (e.g. a planned change of the lab's); the
    lab's snapshot depends on its topology only (:meth:`Lab.snapshot`)."""
    return source.controller(lab_snapshot.build(topology, kubernetes_version=KUBERNETES_VERSION))


def evaluate(snapshot: Mapping[str, Any], topo: Topology, source: HintSource) -> dict[str, ServiceModel]:
    """Diagnose a snapshot with the hint model and take kube-proxy's selection per node from
    ``source``, in lab pod names.

    Returns:
        ``namespace/name`` -> :class:`ServiceModel`, in topology order.

    Raises:
        RuntimeFailure: the IPv6 selection holds other pods than the IPv4 one (the lab
            programs one pod list for both families), or the oracle failed.
    """
    nodes, services, slices, pods = objects(snapshot)
    diags = hint_model.evaluate_cluster(nodes, services, slices, pods, version=source.version,
                                        strict=True)
    selected = source.proxy(snapshot, diags)
    by_key: dict[str, list[hint_model.ServiceDiagnosis]] = defaultdict(list)
    for d in diags:
        by_key[f"{d.namespace}/{d.name}"].append(d)
    out: dict[str, ServiceModel] = {}
    for svc in topo.services:
        found = by_key.get(svc.key)
        if not found:
            raise RuntimeFailure(f"the hint model has no diagnosis for Service {svc.key}")
        selections = []
        for d in found:
            family = 6 if d.address_type == "IPv6" else 4
            owner = {str(topo.pod(p).address(family)): p for p in svc.endpoints
                     if family == 4 or topo.pod(p).ip6 is not None}
            chosen_by_node = selected.get(svc.key, {}).get(d.address_type, {})
            sel: dict[str, tuple[str, ...]] = {}
            filt: dict[str, bool] = {}
            for n in topo.nodes:
                if d.headless:  # no kube-proxy decision: never hint-ignored (the agents' rule)
                    sel[n.name], filt[n.name] = (), False
                    continue
                chosen = chosen_by_node.get(n.name, frozenset())
                sel[n.name] = tuple(sorted(p for a, p in owner.items() if a in chosen))
                filt[n.name] = bool(d.proxy[n.name].topology_mode)
            selections.append((d, sel, filt))
        d4, sel4, filt4 = selections[0]
        for d, sel, filt in selections[1:]:
            if sel != sel4 or filt != filt4:
                raise RuntimeFailure(f"Service {svc.key}: kube-proxy selects different pods for "
                                     f"{d.address_type} than for {d4.address_type}; the lab "
                                     "programs one list for both")
        out[svc.key] = ServiceModel(
            key=svc.key, mode=d4.mode, reason=d4.reason,
            locality_in_effect=dict(d4.locality_in_effect),
            warnings=tuple(w.code for w in d4.warnings), selection=sel4, filtering=filt4,
            expected_cross_zone=dict(d4.expected_cross_zone))
    return out


#: marker for "leave this setting as it is" in :meth:`DemoCluster.set_locality`
UNCHANGED: Any = type("Unchanged", (), {"__repr__": lambda self: "UNCHANGED"})()


@dataclass(frozen=True, slots=True)
class LocalityChange:
    """A change of one Service's locality settings, planned or applied.

    Attributes:
        service: ``namespace/name``.
        before: the hint model's view of the Service before the change.
        after: ... and after it (what the new snapshot says).
        transition: node -> endpoint pods its kube-proxy emulation uses while the agents
            learn the new snapshot: inside the selection of every model (old or new) that
            filters by topology on that node, so no byte is judged hint-ignored by an agent
            on either model (the old selection when the two filtering selections are
            disjoint). Nodes with ``ignoreHints: true`` are absent (they keep every ready
            endpoint).
        topology: the lab topology with the new settings.
        snapshot: the new snapshot (kubectl ``List``, controller hints recomputed).
        models: every Service's model on the new snapshot.
        narrowed_at: Unix seconds when the transition selection was programmed (None
            while only planned).
        changed_at: Unix seconds when the new snapshot file was in place (the change
            instant the agents see; None while only planned).
        programmed_at: Unix seconds when every node held the new selection (None while
            only planned).
    """

    service: str
    before: ServiceModel
    after: ServiceModel
    transition: Mapping[str, tuple[str, ...]]
    topology: Topology
    snapshot: dict[str, Any]
    models: Mapping[str, ServiceModel]
    narrowed_at: float | None = None
    changed_at: float | None = None
    programmed_at: float | None = None


def _transition(before: ServiceModel, after: ServiceModel, nodes: Iterable[Node]
                ) -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    for n in nodes:
        if n.ignore_hints:
            continue
        old, new = before.selection[n.name], after.selection[n.name]
        sets = [set(sel) for sel, filt in ((old, before.filtering[n.name]),
                                           (new, after.filtering[n.name])) if filt]
        if not sets:
            out[n.name] = old
            continue
        both = set.intersection(*sets)
        out[n.name] = tuple(sorted(both)) if both else old
    return out


def write_json_atomic(path: Path, data: Any) -> Path:
    """Write ``data`` as JSON to ``path`` through a rename, so readers never see half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)
    return path


class DemoCluster:
    """A lab built from a :class:`DemoSpec`, programmed from a hint source (the upstream oracle
    or the model) and explained by the hint model.

    Args:
        spec: topology and traffic plan.
        workdir: where the snapshot file goes (``snapshot.json``).
        hints: where hints and kube-proxy selections come from: ``"auto"`` (the oracle when
            built, else the model), ``"oracle"``, ``"model"`` (see
            :func:`tools.demo.hintsource.hint_source`), or a :class:`HintSource`.
        prefix, state_dir: passed to :class:`Lab`.
        server_max_seconds: lifetime of the lab's servers.
        kubernetes, proxy_mode: passed to :class:`Lab`; with ``kubernetes="real"`` the hints
            and selections are the real components' (:class:`tools.demo.hintsource.RealSource`)
            and ``hints`` is not asked.

    Raises:
        InputError: unknown ``hints``.
        RuntimeFailure: ``hints="oracle"`` and the oracle is not built.
    """

    def __init__(self, spec: DemoSpec, workdir: Path, *, hints: str | HintSource,
                 prefix: str | None = None, state_dir: Path | str | None = None,
                 server_max_seconds: float = 3600.0, kubernetes: str = "emulated",
                 proxy_mode: str = "iptables") -> None:
        kwargs: dict[str, Any] = {"server_max_seconds": server_max_seconds}
        if state_dir is not None:
            kwargs["state_dir"] = state_dir
        self.lab = Lab(spec.topology, prefix=prefix, kubernetes=kubernetes, proxy_mode=proxy_mode, **kwargs)
        self.hints: HintSource
        if kubernetes == "real":
            self.hints = RealSource(self.lab)
        else:
            self.hints = hint_source(hints) if isinstance(hints, str) else hints
        self.traffic: TrafficPlan = spec.traffic
        self.workdir = Path(workdir)
        self.snapshot_path = self.workdir / "snapshot.json"
        self.models: dict[str, ServiceModel] = {}
        self.snapshot: dict[str, Any] = {}
        #: every pod the lab ever had -> node (ground truth keeps removed pods' names)
        self.pod_node: dict[str, str] = {}
        #: every pod the lab ever had -> Kubernetes namespace
        self.pod_namespace: dict[str, str] = {}
        #: every host-network pod the lab ever had
        self.host_network: set[str] = set()
        #: every server pod the lab ever had -> Service key
        self.pod_service: dict[str, str] = {}
        #: removed pod -> the pod that replaced it (same node, address, Service)
        self.replaced_by: dict[str, str] = {}
        #: the traffic plan's clients now (a replaced client's successor takes its place)
        self.clients: list[str] = list(spec.traffic.clients)
        #: the zone-CIDR file the agents read (``write_zone_cidrs``), None without one
        self.zone_cidrs_path: Path | None = None
        #: whether that file marks load balancers (the agents then class their bytes
        #: ``load-balancer``; an agent without that vocabulary reads them as ``cidr``)
        self.load_balancers_marked = False
        #: (client as the server sees it, server) -> the flow path that connects them
        self.paths: dict[tuple[str, str], FlowPlan] = {}
        for f in spec.traffic.flows:
            for c in f.clients:
                for n in f.nodes or (None,):
                    for server in f.servers:
                        self.paths.setdefault((observed_client(spec.topology, f, c, n), server), f)
        self._remember_pods()

    @property
    def topology(self) -> Topology:
        """The lab's current topology."""
        return self.lab.topology

    @property
    def prefix(self) -> str:
        """The lab's name prefix."""
        return self.lab.prefix

    def _remember_pods(self) -> None:
        topo = self.lab.topology
        for p in topo.pods:
            self.pod_node[p.name] = p.node
            self.pod_namespace[p.name] = p.namespace
            if p.host_network:
                self.host_network.add(p.name)
        for s in topo.services:
            for ep in s.endpoints:
                self.pod_service[ep] = s.key

    # ------------------------------------------------------------------ lifecycle

    def up(self) -> DemoCluster:
        """Build the lab, write the snapshot and program every node's proxy.

        Raises:
            RuntimeFailure: not root, or building failed (the lab is torn down then).
        """
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.lab.up()
        try:
            self.apply_model()
        except BaseException:
            self.lab.down()
            raise
        return self

    def down(self) -> list[str]:
        """Tear the lab down and stop the oracle (idempotent); returns the namespaces removed."""
        self.close()
        return self.lab.down()

    def close(self) -> None:
        """Stop the hint source's helper process, if any (it restarts when needed)."""
        self.hints.close()

    @property
    def disagreements(self) -> list[str]:
        """Where the model answers otherwise than the upstream oracle the lab follows (model
        bugs, one line each); empty when the lab runs on the model."""
        return self.hints.disagreements

    def write_snapshot(self) -> Path:
        """Recompute controller hints and the model, and write the snapshot file (atomically).

        Returns:
            The snapshot path.
        """
        self._remember_pods()
        self.snapshot = controller_snapshot(self.lab, self.hints)
        self.models = evaluate(self.snapshot, self.lab.topology, self.hints)
        # the agents and `explain --snapshot` read the cluster's version beside the dump
        write_json_atomic(self.snapshot_path.with_name("version.json"),
                          lab_snapshot.version_document(KUBERNETES_VERSION))
        return write_json_atomic(self.snapshot_path, self.snapshot)

    def program(self) -> None:
        """Program every node's proxy with the hint source's selection (ignore-hints nodes: all
        ready endpoints, see :meth:`Lab.program_proxies`)."""
        models = self.models

        def select(svc: Service, node: Node) -> Iterable[str]:
            return models[svc.key].selection[node.name]

        self.lab.program_proxies(select)

    def apply_model(self) -> None:
        """:meth:`write_snapshot` then :meth:`program`."""
        self.write_snapshot()
        self.program()

    # ------------------------------------------------------------------ locality changes

    def plan_locality(self, service: str, *, traffic_distribution: Any = UNCHANGED,
                      annotations: Mapping[str, str | None] | None = None) -> LocalityChange:
        """Work out a change of ``service``'s locality settings without applying it (no
        root needed): the new topology, snapshot (controller hints recomputed by the hint
        source), every Service's model, and the transition
        selection (see :class:`LocalityChange`).

        Args:
            service: ``namespace/name`` (or an unambiguous name).
            traffic_distribution: new ``spec.trafficDistribution`` (``PreferClose``,
                ``PreferSameZone``, ``PreferSameNode``), ``None`` to remove the field, or
                :data:`UNCHANGED`.
            annotations: ``metadata.annotations`` to set; a ``None`` value removes that
                annotation (e.g. ``{"service.kubernetes.io/topology-mode": "Auto"}``).

        Raises:
            InputError: unknown Service, or a value the lab topology refuses (named as
                ``Service <ns/name>`` and the field).
        """
        if self.lab.kubernetes == "real":
            raise InputError("on real Kubernetes a planned change cannot be evaluated before it is applied; "
                             "change the Service with kubectl (Lab.kubectl) and let the controller decide",
                             obj=f"Service {service}", field="locality")
        if not self.models:
            self.write_snapshot()
        svc = self.lab.topology.service(service)
        data = self.lab.topology.to_dict()
        entry = next(s for s in data["services"]
                     if f"{s['namespace']}/{s['name']}" == svc.key)
        if traffic_distribution is None:
            entry.pop("trafficDistribution", None)
        elif traffic_distribution is not UNCHANGED:
            entry["trafficDistribution"] = traffic_distribution
        if annotations:
            merged = dict(entry.get("annotations") or {})
            for k, v in annotations.items():
                if v is None:
                    merged.pop(k, None)
                else:
                    merged[k] = v
            entry["annotations"] = merged
        topo = Topology.from_dict(data, source=f"set_locality {svc.key}")
        snap = controller_snapshot_of(topo, self.hints)
        models = evaluate(snap, topo, self.hints)
        return LocalityChange(service=svc.key, before=self.models[svc.key],
                              after=models[svc.key],
                              transition=_transition(self.models[svc.key], models[svc.key],
                                                     topo.nodes),
                              topology=topo, snapshot=snap, models=models)

    def set_locality(self, service: str, *, traffic_distribution: Any = UNCHANGED,
                     annotations: Mapping[str, str | None] | None = None,
                     settle_seconds: float = 1.5) -> LocalityChange:
        """Change a Service's locality settings on the running cluster, as the API server,
        EndpointSlice controller and kube-proxy would, with the agents' snapshot rewritten.

        Order (so the data plane's choices stay inside what both the old and the new model
        select wherever either filters by topology, and no byte is judged hint-ignored by an
        agent that has not yet read the change):

        1. :meth:`plan_locality`;
        2. every node's proxy gets the transition selection (enabling locality narrows
           here), then ``settle_seconds`` for in-flight exchanges and the agents' drains;
        3. the snapshot file is replaced atomically (``changed_at``), then
           ``settle_seconds`` for the agents to reload it;
        4. every node's proxy gets the new model's selection (withdrawing locality widens
           here).

        Args:
            service, traffic_distribution, annotations: as :meth:`plan_locality`.
            settle_seconds: pause after steps 2 and 3 (seconds); at least the agents'
                snapshot reload latency plus one export interval.

        Returns:
            The applied :class:`LocalityChange` with its three timestamps.

        Raises:
            InputError: as :meth:`plan_locality`.
            RuntimeFailure: iptables-restore failed.
        """
        plan = self.plan_locality(service, traffic_distribution=traffic_distribution,
                                  annotations=annotations)
        current = self.models

        def transition(svc: Service, node: Node) -> Iterable[str]:
            if svc.key == plan.service:
                return plan.transition[node.name]
            return current[svc.key].selection[node.name]

        self.lab.program_proxies(transition)
        narrowed = time.time()
        time.sleep(settle_seconds)
        self.lab.topology = plan.topology
        self.snapshot = plan.snapshot
        self.models = dict(plan.models)
        write_json_atomic(self.snapshot_path, self.snapshot)
        changed = time.time()
        time.sleep(settle_seconds)
        self.program()
        return replace(plan, narrowed_at=narrowed, changed_at=changed,
                       programmed_at=time.time())

    def programmed(self, service: str, node: str) -> tuple[str, ...]:
        """Return the endpoint pods ``node``'s proxy actually uses for ``service``."""
        return tuple(sorted(self.lab.service_endpoints(service, node)))

    # ------------------------------------------------------------------ traffic

    def flow_specs(self, duration_seconds: float, rate: float | None = None,
                   count: int | None = None) -> list[FlowSpec]:
        """Return the traffic plan for ``duration_seconds``: every flow's every client (each
        family) at the flow's rate (or ``rate``), one TCP connection per request,
        ``max(1, round(rate * duration))`` requests each; with ``count``, that many requests
        back to back instead. A flow with several destinations (a self-balancing client, a
        load balancer over nodes) is one client process sending round robin."""
        specs = []
        for f in self.traffic.flows:
            r: float | None = f.rate if rate is None else rate
            n = max(1, round((r or 0) * duration_seconds)) if count is None else count
            if count is not None:
                r = None
            clients = self.clients if f.name == "matrix" else [self._current(c) for c in f.clients]
            for client in clients:
                for fam in f.families:
                    dsts, port = self.destinations(f, fam)
                    if dsts:
                        specs.append(FlowSpec(client, ",".join(dsts), port, "tcp",
                                              request_bytes=f.request_bytes,
                                              response_bytes=f.response_bytes, count=n, rate=r,
                                              timeout=5.0))
        return specs

    def _current(self, pod: str) -> str:
        while pod in self.replaced_by:
            pod = self.replaced_by[pod]
        return pod

    def destinations(self, flow: FlowPlan, family: int) -> tuple[list[str], int]:
        """The addresses (in round-robin order) and port one client of ``flow`` sends to in
        ``family`` (pods without an address of the family left out).

        Raises:
            InputError: a node port the emulated mode cannot know (no ``nodePort`` given).
        """
        topo = self.topology
        port = flow.port
        if flow.path == "clusterIP":
            assert flow.service is not None
            return [str(self.lab.cluster_ip(flow.service, family))], int(port or 0)
        if flow.path == "endpoints":
            assert flow.service is not None
            eps = [topo.pod(e) for e in topo.service(flow.service).endpoints]
            return [str(p.address(family)) for p in eps if family == 4 or p.ip6 is not None], int(port or 0)
        if flow.path == "nodePort":
            assert flow.service is not None
            return ([str(self.lab.node_ip(n, family)) for n in flow.nodes],
                    port if port is not None else self.lab.node_port(flow.service))
        if flow.path == "pod":
            pod = topo.pod(self._current(str(flow.target)))
            return ([str(pod.address(family))] if family == 4 or pod.ip6 else []), int(port or 0)
        if flow.path in ("hostPort", "node"):
            return [str(self.lab.node_ip(flow.nodes[0], family))], int(port or 0)
        peer = topo.peer(str(flow.target))
        return [str(peer.address(family))], int(port or 0)

    def start_traffic(self, duration_seconds: float, rate: float | None = None,
                      clients: Iterable[str] | None = None, count: int | None = None
                      ) -> list[FlowHandle]:
        """Start :meth:`flow_specs` (optionally only for ``clients``) without waiting."""
        wanted = None if clients is None else set(clients)
        return [self.lab.start_flow(f.client, f.dst, f.port, f.proto, f.request_bytes,
                                    f.response_bytes, f.count, f.rate, f.timeout, f.reuse)
                for f in self.flow_specs(duration_seconds, rate, count)
                if wanted is None or f.client in wanted]

    # ------------------------------------------------------------------ pods come and go

    def replace_pod(self, old: str, new: str, settle_seconds: float = 0.5,
                    before_announce: Callable[[], None] | None = None) -> str:
        """Delete pod ``old`` and create ``new`` like it (same node, namespace, labels,
        ports), which takes the lowest free address of the node: ``old``'s.

        Order keeps the data plane's choices inside the model's at every moment, so no byte
        is judged hint-ignored by a stale model: proxies stop using ``old`` first, then the
        pod goes, then the new pod is announced in the snapshot (``settle_seconds`` for
        agents to read it) before the proxies start using it. ``before_announce``, when
        given, runs once the new pod exists and before the snapshot announces it: the
        agents' metadata is stale meanwhile (the old pod deleted, no new holder of the
        address), as during an API outage.

        Returns:
            The new pod's IPv4 address.
        """
        topo = self.lab.topology
        pod = topo.pod(old)
        emulated = [n for n in topo.nodes if not self.lab.uses_kube_proxy(n.name)]
        for n in emulated:  # a real kube-proxy follows the apiserver by itself
            self.lab.set_node_endpoints(n.name, {
                s.key: [e for e in self.lab.service_endpoints(s.key, n.name) if e != old]
                for s in topo.services})
        time.sleep(settle_seconds)  # in-flight exchanges with the old pod finish
        self.lab.remove_pod(old)
        self.write_snapshot()
        spec = {"name": new, "namespace": pod.namespace, "node": pod.node,
                "labels": dict(pod.labels), "hostNetwork": pod.host_network,
                "ports": [{"port": pp.port, "protocol": pp.protocol,
                           **({"name": pp.name} if pp.name else {})} for pp in pod.ports]}
        # add_pod programs every node with the default (all endpoints): pin the current
        # selection first so the new endpoint is not used before the agents know it
        for n in emulated:
            self.lab.set_node_endpoints(n.name, {
                s.key: list(self.lab.service_endpoints(s.key, n.name))
                for s in self.lab.topology.services})
        added = self.lab.add_pod(spec)
        if before_announce is not None:
            before_announce()
        self.replaced_by[old] = new
        self.clients = [new if c == old else c for c in self.clients]
        self.write_snapshot()
        time.sleep(settle_seconds)
        self.program()
        return str(added.ip)

    # ------------------------------------------------------------------ ground truth

    def _client_node(self, client: str) -> str | None:
        if client.startswith("node/"):
            return client[len("node/"):]
        return self.pod_node.get(client)

    def side(self, name: str) -> Side:
        """How the agents should resolve the lab's name ``name`` (a pod, ``node/<n>``, an
        outside peer, ``ip/<addr>``): its class, zone and node (:class:`Side`)."""
        topo = self.lab.topology
        region = {z.name: z.region for z in topo.zones}
        if name.startswith("outside/"):
            peer = topo.peer(name)
            kind = peer.client_kind
            if kind == "load-balancer" and not self.load_balancers_marked:
                kind = "cidr"
            return Side(name, kind, peer.zone, region.get(peer.zone or ""), None, False, "",
                        peer.name)
        node = self._client_node(name)
        if node is None or not any(n.name == node for n in topo.nodes):
            return Side(name, "unknown", None, None, None, False, "", name)
        zone = topo.zone_of(node)
        if name.startswith("node/"):
            return Side(name, "node", zone, region.get(zone), node, False, "", name)
        host = name in self.host_network or name not in self.pod_namespace
        return Side(name, "node" if host else "pod", zone, region.get(zone), node, not host,
                    self.pod_namespace.get(name, ""), name)

    def truth(self, ground_truth: Mapping[tuple[str, str, str], int] | None = None
              ) -> dict[str, ServiceTruth]:
        """Turn the lab's ground truth into what the agents should report, per Service.

        Args:
            ground_truth: ``{(client, server pod, direction): L3 bytes}``; read from the
                lab when None.

        Returns:
            ``namespace/name`` -> :class:`ServiceTruth` for every Service of the topology
            (zeros when it had no traffic). Bytes to a server pod that backs no Service go
            to the key ``""``.
        """
        gt = self.lab.ground_truth() if ground_truth is None else ground_truth
        topo = self.lab.topology
        out: dict[str, ServiceTruth] = {s.key: ServiceTruth() for s in topo.services}
        for (client, server, direction), n in gt.items():
            key = self.pod_service.get(server, "")
            t = out.setdefault(key, ServiceTruth())
            c, srv = self.side(client), self.side(server)
            cz, sz = c.zone or "unknown", srv.zone or "unknown"
            crossing = crossing_of(c, srv)
            t.bytes[crossing] = t.bytes.get(crossing, 0) + n
            sk = (cz, sz, crossing, direction)
            t.by_series[sk] = t.by_series.get(sk, 0) + n
            ck = (c.kind, cz, sz, crossing, direction)
            t.by_class[ck] = t.by_class.get(ck, 0) + n
            model = self.models.get(key)
            current = self._current(server)
            cnode = c.node
            # judged against the model's final state; a replaced pod stands for its successor
            if model and cnode is not None and model.filtering.get(cnode) \
                    and current not in model.selection[cnode]:
                hk = (cz, sz)
                t.hint_ignored[hk] = t.hint_ignored.get(hk, 0) + n
                cause = self.hint_cause(client, server)
                t.hint_ignored_by_cause[(cnode, cause)] = t.hint_ignored_by_cause.get((cnode, cause), 0) + n
        return out

    def entry_truth(self, client_truth: Mapping[tuple[str, Any, int, str], int] | None = None
                    ) -> dict[str, dict[tuple[str, str, str, str, str], int]]:
        """The first hop of node ports as the agents' ``zonemeter_service_entry_bytes_total``
        should report it, from the outside peers' own counters (``Lab.outside_client_truth``):
        a peer's bytes to and from a node's address on the node port of a Service with
        ``externalTrafficPolicy: Cluster`` that the plan sends it to. ``Local`` Services get
        none: their endpoint sees the peer itself, one hop (docs/attribution.md, "Two hops
        of NodePort and LoadBalancer traffic").

        Args:
            client_truth: ``{(outside/<peer>, remote address, remote port, direction):
                bytes}``; read from the lab when None.

        Returns:
            ``namespace/name`` -> ``{(client_kind, client_zone, server_zone, crossing,
            direction): bytes}`` (server_zone: the receiving node's), Services with
            entries only.
        """
        topo = self.lab.topology
        routes: dict[tuple[str, str, int], tuple[str, str]] = {}
        for f in self.traffic.flows:
            if f.path != "nodePort" or f.service is None:
                continue
            if topo.service(f.service).external_traffic_policy == "Local":
                continue
            port = f.port if f.port is not None else self.lab.node_port(f.service)
            for c in f.clients:
                if not c.startswith("outside/"):
                    continue
                for n in f.nodes:
                    for fam in f.families:
                        if fam == 4 or topo.node(n).ip6 is not None:
                            routes[(c, str(self.lab.node_ip(n, fam)), int(port))] = (f.service, n)
        ct = self.lab.outside_client_truth() if client_truth is None else client_truth
        out: dict[str, dict[tuple[str, str, str, str, str], int]] = {}
        for (peer, addr, port, direction), n in ct.items():
            hit = routes.get((peer, str(addr), int(port)))
            if hit is None or not n:
                continue
            key, node = hit
            c, srv = self.side(peer), self.side(f"node/{node}")
            k = (c.kind, c.zone or "unknown", srv.zone or "unknown", crossing_of(c, srv), direction)
            rows = out.setdefault(key, {})
            rows[k] = rows.get(k, 0) + n
        return out

    def hint_cause(self, client: str, server: str) -> str:
        """The cause the lab played when ``client``'s bytes to ``server`` ignore the hints
        (docs/attribution.md, "Why bytes ignored the hints"): ``external`` when the client is
        its node's address (a host-network client, a node-port call masqueraded there),
        ``client-side`` when a pod dialled the server itself (a self-balancing client, a pod
        address), ``data-plane`` when a pod called the ClusterIP (its node's data plane
        chose)."""
        if self.side(client).kind == "node":
            return "external"
        # a replaced pod plays its predecessor's part
        flow = self.paths.get((self._first_of(client), self._first_of(server)))
        return "data-plane" if flow is None or flow.path == "clusterIP" else "client-side"

    def _first_of(self, pod: str) -> str:
        """The pod ``pod`` replaced (its oldest predecessor), or ``pod``."""
        back = {new: old for old, new in self.replaced_by.items()}
        while pod in back:
            pod = back[pod]
        return pod

    def workload_truth(self, ground_truth: Mapping[tuple[str, str, str], int] | None = None
                       ) -> tuple[dict[WorkloadKey, int], dict[WorkloadKey, int]]:
        """Turn the lab's ground truth of non-Service traffic (servers backing no Service:
        pods, host-network pods, outside peers) into the ``zonemeter_workload_bytes_total``
        series the agents should report (docs/attribution.md, the rule table): a pod's
        bytes to a pod are its ``egress``, counted where it runs (the receiver skips its
        copy); a pod's bytes with anything else (a node address, a host-network pod, an
        outside peer) are its ``egress`` and ``ingress``. A ``hostPort`` call is the client's
        pod's egress to the pod it leads to (the agents resolve ``node:hostPort`` to that
        pod), the answer that pod's egress.

        Returns:
            ``(seen, unseen)``: series -> bytes; ``unseen`` holds pairs without a pod veth on
            their path (a host-network server or an outside peer called by a node address or
            an outside peer), which the veth hook never sees, keyed from the server's side
            (its name as workload, the client as remote, ``ingress``/``egress``).
        """
        gt = self.lab.ground_truth() if ground_truth is None else ground_truth
        seen: dict[WorkloadKey, int] = {}
        unseen: dict[WorkloadKey, int] = {}

        def add(into: dict[WorkloadKey, int], local: Side, remote: Side, direction: str, n: int) -> None:
            k: WorkloadKey = (local.namespace, local.workload, "Pod", remote.kind, local.zone or "unknown",
                              remote.zone or "unknown", crossing_of(local, remote), direction)
            into[k] = into.get(k, 0) + n

        for (client, server, direction), n in gt.items():
            if self.pod_service.get(server):
                continue
            c, srv = self.side(client), self.side(server)
            if c.veth and srv.veth:
                if direction == "request":
                    add(seen, c, srv, "egress", n)
                else:
                    add(seen, srv, c, "egress", n)
            elif srv.veth:
                add(seen, srv, c, "ingress" if direction == "request" else "egress", n)
            elif c.veth:
                add(seen, c, srv, "egress" if direction == "request" else "ingress", n)
            else:
                add(unseen, srv, c, "ingress" if direction == "request" else "egress", n)
        return seen, unseen

    def write_zone_cidrs(self, extra: Path | None = None) -> Path | None:
        """Write the zone-CIDR file the agents read (``--zone-cidrs``): the lab's entries for its
        outside peers (``Lab.zone_cidr_entries``; load balancers marked when the agent's parser
        knows the mark) followed by ``extra``'s, the user's file (``zonemeter demo
        --zone-cidrs``). None, and no file, when there is neither.

        Raises:
            InputError: ``extra`` cannot be read or is invalid (the agent's parser,
                ``agent.k8s.cidrs``), or maps one of the lab's ranges elsewhere.
        """
        from agent.k8s import cidrs

        marked = hasattr(cidrs, "KIND_LOAD_BALANCER")
        entries = self.lab.zone_cidr_entries(mark_load_balancers=marked)
        if extra is not None:
            theirs = cidrs.load_zone_cidrs(extra)
            for zc in theirs:
                e: dict[str, Any] = {"cidr": str(zc.network), "zone": zc.zone}
                if zc.region:
                    e["region"] = zc.region
                for attr, key in (("kind", "kind"), ("lb_type", "type")):
                    value = getattr(zc, attr, None)
                    if value is not None and not (attr == "kind" and value == "cidr"):
                        e[key] = value
                entries.append(e)
        if not entries:
            return None
        path = self.workdir / "zone-cidrs.yaml"
        text = "".join("- " + json.dumps(e) + "\n" for e in entries)
        cidrs.parse_zone_cidrs(text, str(path))  # the agents' own check, before they start
        path.write_text(text)
        self.zone_cidrs_path = path
        self.load_balancers_marked = marked and any(e.get("kind") == "load-balancer" for e in entries)
        return path

