"""The EndpointSlice controller's hint decision: node aggregation, allocations, AddHints, trafficDistribution.

Reproduces ``staging/src/k8s.io/endpointslice``: ``reconciler.go reconcileByAddressType``,
``utils.go hintsEnabled``, ``topologycache/topologycache.go`` (``SetNodes``,
``getAllocations``, ``AddHints``) for ``service.kubernetes.io/topology-mode: Auto``, and
``trafficdist/trafficdist.go`` for ``spec.trafficDistribution``.

Determinism: where the real controller depends on Go map iteration order (``getMost`` tie
breaks, which receiving zone a donated endpoint goes to, the order of zones in
``getAllocations``), this model iterates zones in sorted (code point) order. Per-zone totals
do not depend on that choice (see docs/hints.md).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.hints.versions import DEFAULT_VERSION, KubeVersion
from agent.hints.vocabulary import (
    ANNOTATION_DEPRECATED,
    ANNOTATION_TOPOLOGY_MODE,
    MSG_DISABLED,
    MSG_ENABLED,
    MSG_INSUFFICIENT_ENDPOINTS,
    MSG_INSUFFICIENT_NODE_INFO,
    MSG_MIN_ALLOCATION,
    MSG_NO_ALLOCATED,
    MSG_NO_ZONE,
    MSG_ONE_ZONE,
    OVERLOAD_THRESHOLD,
    REASON_DISABLED,
    REASON_ENABLED,
    UNKNOWN_ZONE,
)
from agent.k8s.parse import (
    Endpoint,
    Hints,
    NodeInfo,
    ServiceInfo,
    Slice,
    intern_hints,
    parse_node_info,
    parse_service_info,
    parse_slice,
)


@dataclass(frozen=True, slots=True)
class Event:
    """A Kubernetes Event the EndpointSlice controller records on the Service."""

    type: str
    reason: str
    message: str

    def to_json(self) -> dict[str, str]:
        """``{"type", "reason", "message"}``."""
        return {"type": self.type, "reason": self.reason, "message": self.message}


@dataclass(frozen=True, slots=True)
class Allocation:
    """Per-zone allocation of ``getAllocations``: integer minimum/maximum, float64 desired."""

    minimum: int
    maximum: int
    desired: float

    def to_json(self) -> dict[str, Any]:
        """``{"minimum", "maximum", "desired"}``."""
        return {"minimum": self.minimum, "maximum": self.maximum, "desired": self.desired}


@dataclass(frozen=True, slots=True)
class ZoneCapacity:
    """Result of the topology cache's ``SetNodes`` (``topologycache.go``), computed once per cluster.

    Attributes:
        ratios: zone -> float64 share of allocatable milli-CPU; None when node info is
            insufficient (then every Auto Service is refused).
        bad_node: the first eligible (ready, non-control-plane) node lacking a zone label or
            with zero allocatable CPU, which made ``ratios`` None; else None.
        bad_node_problem: ``"no zone label"``, ``"no status.allocatable.cpu"``, ``"zero
            allocatable CPU"`` or ``"unreadable allocatable CPU"``.
        eligible_nodes: how many nodes passed the label and readiness filters.
    """

    ratios: Mapping[str, float] | None
    bad_node: str | None = None
    bad_node_problem: str | None = None
    eligible_nodes: int = 0


@dataclass(frozen=True, slots=True)
class AllocationResult:
    """``getAllocations(N)`` outcome.

    Attributes:
        allocations: zone -> Allocation, or None when ``getAllocations`` refused (the
            refusals after it, in ``AddHints``, keep them).
        refusal: the event message (without suffix) when refused, else None.
        reason: diagnosis reason for the refusal, else None.
        minimums: zone -> minimum when the ratio test ran (also on refusal by overload).
    """

    allocations: Mapping[str, Allocation] | None
    refusal: str | None
    reason: str | None
    minimums: Mapping[str, int] | None


class AddressHints(Mapping[str, "Hints | None"]):
    """Read-only ``address -> hints`` over slices, built on first access.

    An address present in several slices (several port sets) takes its last slice's hints.
    """

    __slots__ = ("_rows", "_map")

    def __init__(self, rows: Sequence[tuple[Sequence[Endpoint], Sequence[Hints | None]]]) -> None:
        self._rows = rows
        self._map: dict[str, Hints | None] | None = None

    def _get(self) -> dict[str, Hints | None]:
        if self._map is None:
            m: dict[str, Hints | None] = {}
            for eps, row in self._rows:
                m.update(zip([e.address for e in eps], row, strict=False))
            self._map = m
        return self._map

    def __getitem__(self, address: str) -> Hints | None:
        return self._get()[address]

    def __iter__(self) -> Iterator[str]:
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())


@dataclass(frozen=True, slots=True)
class ControllerResult:
    """What the EndpointSlice controller would do for one Service and address type.

    Attributes:
        mechanism: ``topology-mode-annotation``, ``topology-mode-annotation (refused)``,
            ``trafficDistribution`` or ``none``.
        hints_enabled: Auto succeeded (Auto path), or trafficDistribution wrote hints.
        events: events recorded on the Service, exact upstream strings.
        zone_cpu_ratios: the cluster's ratios when the Auto path ran and they exist.
        allocations: per-zone allocations whenever ``getAllocations`` accepted the endpoint
            count: when Auto succeeded, and when it refused afterwards (an endpoint without a
            zone, ``NoZoneSpecified``; no hint allocated), as upstream computes them first.
        minimums: per-zone minimums when computed (Auto success or overload refusal).
        sum_of_minimums: their sum, or None.
        ready_endpoint_count: N, Ready==true endpoints over the controller's slices.
        refusal_reason: diagnosis reason when Auto refused, else None.
        hints: address -> hints the controller's slices will carry (managed slices only;
            a lazy read-only mapping).
        slices: slice name -> tuple of hints per endpoint, in slice order.
        rewritten: names of slices the controller would write (changed hints).
        kept_unchanged: names of slices whose valid Auto hints stay untouched.
        populated_after: whether the topology cache marks the Service populated afterwards.
    """

    mechanism: str
    hints_enabled: bool
    events: tuple[Event, ...]
    zone_cpu_ratios: Mapping[str, float] | None
    allocations: Mapping[str, Allocation] | None
    minimums: Mapping[str, int] | None
    sum_of_minimums: int | None
    ready_endpoint_count: int
    refusal_reason: str | None
    hints: Mapping[str, Hints | None]
    slices: Mapping[str, tuple[Hints | None, ...]]
    rewritten: tuple[str, ...]
    kept_unchanged: tuple[str, ...]
    populated_after: bool


def zone_capacity(nodes: Sequence[NodeInfo]) -> ZoneCapacity:
    """The topology cache's ``SetNodes`` (``topologycache/topologycache.go``).

    Control-plane/master-labelled nodes and nodes whose Ready condition is not True are
    skipped; the first remaining node without a zone label or with zero CPU makes the
    ratios None for the whole cluster; fewer than 2 zones also gives None.

    Returns:
        ZoneCapacity with float64 ratios (milli-CPU of zone / total milli-CPU).
    """
    cpu: dict[str, int] = {}
    total = 0
    eligible = 0
    for n in nodes:
        if n.excluded or not n.ready:
            continue
        eligible += 1
        if not n.zone or n.cpu_milli <= 0:
            problem = ("no zone label" if not n.zone
                       else "no status.allocatable.cpu" if n.cpu_milli == 0 and not n.cpu_reported
                       else "zero allocatable CPU" if n.cpu_milli == 0 else "unreadable allocatable CPU")
            return ZoneCapacity(None, n.name, problem, eligible)
        cpu[n.zone] = cpu.get(n.zone, 0) + n.cpu_milli
        total += n.cpu_milli
    if total == 0 or len(cpu) < 2:
        return ZoneCapacity(None, None, None, eligible)
    return ZoneCapacity({z: cpu[z] / total for z in sorted(cpu)}, None, None, eligible)


@dataclass(frozen=True, slots=True)
class ClusterIndex:
    """Per-cluster facts computed once: nodes, zone of each node, node aggregation."""

    nodes: tuple[NodeInfo, ...]
    node_zone: Mapping[str, str]          # node -> zone label ("" when absent)
    zones: Mapping[str, tuple[str, ...]]  # client zone ("unknown" for no label) -> nodes
    capacity: ZoneCapacity
    ready_zones: frozenset[str] = frozenset()  # client zones with at least one Ready node
    zoneless: tuple[str, ...] = ()        # nodes without a zone label

    def client_zone(self, node: str) -> str:
        """Zone label of a node, or ``"unknown"``."""
        return self.node_zone.get(node) or UNKNOWN_ZONE


def index_nodes(nodes: Sequence[dict[str, Any]]) -> ClusterIndex:
    """Parse Nodes and run ``SetNodes`` once.

    Raises:
        InputError: a malformed Node.
    """
    return index_node_infos(tuple(parse_node_info(n) for n in nodes))


def index_node_infos(infos: tuple[NodeInfo, ...]) -> ClusterIndex:
    node_zone = {n.name: (n.zone or "") for n in infos}
    zones: dict[str, list[str]] = {}
    for n in infos:
        zones.setdefault(n.zone or UNKNOWN_ZONE, []).append(n.name)
    return ClusterIndex(infos, node_zone, {z: tuple(v) for z, v in sorted(zones.items())},
                        zone_capacity(infos), frozenset(n.zone or UNKNOWN_ZONE for n in infos if n.ready),
                        tuple(n.name for n in infos if not n.zone))


def effective_annotation(annotations: Mapping[str, str]) -> tuple[str | None, str | None]:
    """(key, value) of the topology annotation the controller reads, or (None, None).

    The deprecated ``topology-aware-hints`` key wins whenever present (``utils.go
    hintsEnabled``).
    """
    if ANNOTATION_DEPRECATED in annotations:
        return ANNOTATION_DEPRECATED, annotations[ANNOTATION_DEPRECATED]
    if ANNOTATION_TOPOLOGY_MODE in annotations:
        return ANNOTATION_TOPOLOGY_MODE, annotations[ANNOTATION_TOPOLOGY_MODE]
    return None, None


def hints_enabled(annotations: Mapping[str, str]) -> bool:
    """Controller's ``hintsEnabled``: effective annotation value exactly "Auto" or "auto"."""
    return effective_annotation(annotations)[1] in ("Auto", "auto")


def valid_traffic_distribution(value: str | None, kv: KubeVersion) -> bool:
    """Reconciler's ``validTrafficDistribution`` for the version (``reconciler.go``).

    1.33+: PreferClose always; PreferSameZone/PreferSameNode only with the
    PreferSameTrafficDistribution gate. 1.30-1.32: no value check, equals the
    ServiceTrafficDistribution gate. <= 1.29: the field does not exist.
    """
    if kv.minor < 30:
        return False
    if kv.minor <= 32:
        return kv.gate("ServiceTrafficDistribution")
    if value is None:
        return False
    if value == "PreferClose":
        return True
    return kv.gate("PreferSameTrafficDistribution") and value in ("PreferSameZone", "PreferSameNode")


def close_values(kv: KubeVersion) -> tuple[str, ...]:
    """trafficdist ``closeTrafficDistribution`` in that version."""
    return ("PreferClose",) if kv.minor <= 32 else ("PreferClose", "PreferSameZone", "PreferSameNode")


def get_allocations(ratios: Mapping[str, float] | None, n: int) -> AllocationResult:
    """``TopologyCache.getAllocations`` (``topologycache/topologycache.go``), float64 arithmetic.

    Args:
        ratios: zone -> CPU ratio, or None (insufficient node info).
        n: ready endpoints (Ready == true) over all slices of the address type.
    """
    if ratios is None:
        return AllocationResult(None, MSG_INSUFFICIENT_NODE_INFO, "insufficient-node-info", None)
    if len(ratios) < 2:
        return AllocationResult(None, MSG_ONE_ZONE, "insufficient-node-info", None)
    if len(ratios) > n:
        return AllocationResult(None, f"{MSG_INSUFFICIENT_ENDPOINTS} ({n} endpoints, {len(ratios)} zones)",
                                "insufficient-number-of-endpoints", None)
    mins: dict[str, int] = {}
    desired: dict[str, float] = {}
    factor = 1 / (1 + OVERLOAD_THRESHOLD)
    for z in sorted(ratios):
        d = ratios[z] * float(n)
        m = int(math.ceil(d * factor))
        mins[z] = m
        desired[z] = max(d, float(m))
    total = sum(mins.values())
    if total > n:
        return AllocationResult(None, f"{MSG_MIN_ALLOCATION} ({n} endpoints, {len(ratios)} zones)",
                                "min-allocation-exceeds-overload-threshold", mins)
    allocs = {z: Allocation(mins[z], mins[z] + n - total, desired[z]) for z in sorted(ratios)}
    return AllocationResult(allocs, None, None, mins)


def minimum_accepted_endpoints(ratios: Mapping[str, float] | None, n: int) -> int | None:
    """Smallest endpoint count >= ``n`` that ``getAllocations`` accepts (None if never)."""
    if ratios is None or len(ratios) < 2:
        return None
    # sum(ceil(x)) <= n/1.2 + Z <= n once n >= 6Z, so the search is bounded
    for m in range(max(n, len(ratios)), max(n, len(ratios)) + 6 * len(ratios) + 2):
        if get_allocations(ratios, m).allocations is not None:
            return m
    return None


def _hint_zone(z: str) -> Hints:
    return Hints((z,), ())


class _Work:
    """Mutable hint state of one Service's controller slices during a reconcile."""

    __slots__ = ("slices", "hints", "update", "unchanged")

    def __init__(self, slices: Sequence[Slice]) -> None:
        self.slices = list(slices)
        self.hints: list[list[Hints | None]] = [[e.hints for e in s.endpoints] for s in slices]
        self.update: list[int] = []
        self.unchanged: list[int] = list(range(len(slices)))

    def strip_all(self) -> None:
        """``RemoveHintsFromSlices``: nil every hint; unchanged slices with hints -> update."""
        for i in self.update:
            self.hints[i] = [None] * len(self.hints[i])
        keep = []
        for i in self.unchanged:
            if any(h is not None for h in self.hints[i]):
                self.hints[i] = [None] * len(self.hints[i])
                self.update.append(i)
            else:
                keep.append(i)
        self.unchanged = keep


def _add_hints(work: _Work, ratios: Mapping[str, float] | None, at: str
               ) -> tuple[AllocationResult, Event | None, bool]:
    """``TopologyCache.AddHints`` (``topologycache/topologycache.go``). Returns (allocation, warning event, ok)."""
    n = sum(1 for s in work.slices for e in s.endpoints if e.controller_ready)
    res = get_allocations(ratios, n)
    if res.allocations is None:
        work.strip_all()
        return res, Event("Warning", REASON_DISABLED, f"{res.refusal}, addressType: {at}"), False
    allocs = res.allocations
    allocated: dict[str, int] = {}
    # (a) getAllocatedHintsByZone: valid hints in unchanged slices are sticky
    keep = []
    for i in work.unchanged:
        counts: dict[str, int] = {}
        valid = True
        for e, h in zip(work.slices[i].endpoints, work.hints[i], strict=False):
            if not e.controller_ready:
                continue
            if h is None or not h.for_zones or any(z not in allocs for z in h.for_zones):
                valid = False
                break
            for z in h.for_zones:
                counts[z] = counts.get(z, 0) + 1
        by_zone: dict[str, int] | None = counts if valid else None
        if by_zone is not None and any(c + allocated.get(z, 0) > allocs[z].maximum
                                       for z, c in by_zone.items()):
            by_zone = None
        if by_zone is None:
            work.update.append(i)
        else:
            keep.append(i)
            for z, c in by_zone.items():
                allocated[z] = allocated.get(z, 0) + c
    work.unchanged = keep
    # (b) step 1: own-zone hints on create+update slices (here: update, in order)
    for i in work.update:
        row = work.hints[i]
        for j, e in enumerate(work.slices[i].endpoints):
            if not e.controller_ready:
                continue  # Go assigns nil to a copy: not-ready endpoints keep their hints
            if not e.zone:
                work.strip_all()
                # upstream computed the allocations before refusing (getAllocations runs
                # first in AddHints); they are kept for the explain JSON
                nz = AllocationResult(allocs, MSG_NO_ZONE, "endpoint-without-zone", res.minimums)
                return nz, Event("Warning", REASON_DISABLED, f"{MSG_NO_ZONE}, addressType: {at}"), False
            allocated[e.zone] = allocated.get(e.zone, 0) + 1
            row[j] = _hint_zone(e.zone)
    # (c) step 2: getGivingAndReceivingZones (ties: sorted zone order)
    giving_d: dict[str, float] = {}
    receiving_d: dict[str, float] = {}
    for z in sorted(allocs):
        got = float(allocated.get(z, 0))
        if got > allocs[z].desired:
            giving_d[z] = got - allocs[z].desired
        elif got < allocs[z].desired:
            receiving_d[z] = allocs[z].desired - got

    def most(d: dict[str, float]) -> tuple[str, float]:
        best, num = "", 0.0
        for z in sorted(d):
            if d[z] > num:
                best, num = z, d[z]
        return best, num

    giving: dict[str, int] = {}
    receiving: dict[str, int] = {}
    while True:
        g, ng = most(giving_d)
        r, nr = most(receiving_d)
        if not g or not r or (ng < 1.0 and nr < 1.0) or ng < 0.5 or nr < 0.5:
            break
        giving[g] = giving.get(g, 0) + 1
        giving_d[g] -= 1
        receiving[r] = receiving.get(r, 0) + 1
        receiving_d[r] -= 1
    # (d) step 3: redistributeHints: first ready endpoints of a giving zone donate
    done = False
    for i in work.update:
        if done:
            break
        row = work.hints[i]
        for j, e in enumerate(work.slices[i].endpoints):
            if not e.controller_ready:
                continue
            if not giving or not receiving:
                done = True
                break
            if not e.zone:
                continue
            if giving.get(e.zone, 0) > 0:
                for rz in sorted(receiving):
                    row[j] = _hint_zone(rz)
                    giving[e.zone] -= 1
                    if giving[e.zone] == 0:
                        del giving[e.zone]
                    receiving[rz] -= 1
                    if receiving[rz] == 0:
                        del receiving[rz]
                    allocated[rz] = allocated.get(rz, 0) + 1
                    allocated[e.zone] -= 1
                    break
    if not allocated:
        work.strip_all()
        na = AllocationResult(allocs, MSG_NO_ALLOCATED, "insufficient-number-of-endpoints", res.minimums)
        return na, Event("Warning", REASON_DISABLED, f"{MSG_NO_ALLOCATED}, addressType: {at}"), False
    return res, None, True


def _traffic_dist(work: _Work, value: str | None, kv: KubeVersion) -> None:
    """``trafficdist.ReconcileHints`` (``trafficdist/trafficdist.go``)."""
    close = value is not None and value in close_values(kv)
    node_hints = close and value == "PreferSameNode"
    legacy_zone = kv.minor <= 32  # 1.30-1.32 wrote forZones [""] for zoneless endpoints

    def want(e: Endpoint) -> Hints | None:
        if legacy_zone:
            zones: tuple[str, ...] = (e.zone or "",)
        else:
            zones = (e.zone,) if e.zone is not None else ()
        nodes = (e.node,) if node_hints and e.node is not None else ()
        return intern_hints(zones, nodes) if zones or nodes else None

    keep: list[int] = []
    for i in work.unchanged:
        s, row = work.slices[i], work.hints[i]
        if close:
            needs = False
            for e, h in zip(s.endpoints, row, strict=False):
                if e.ready is True:
                    w = want(e)
                    if h is not w and norm_hints(h) != norm_hints(w):
                        needs = True
                        break
        else:
            needs = any(h is not None for h in row)
        (work.update if needs else keep).append(i)
    work.unchanged = keep
    for i in work.update:
        s, row = work.slices[i], work.hints[i]
        for j, e in enumerate(s.endpoints):
            if not close:
                row[j] = None
            elif e.controller_ready:
                row[j] = want(e)


def norm_hints(h: Hints | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    return ((), ()) if h is None else (h.for_zones, h.for_nodes)


def reconcile(svc: ServiceInfo, slices: Sequence[Slice], at: str, cap: ZoneCapacity,
              kv: KubeVersion, populated: bool) -> ControllerResult:
    """The controller's hint decision for one Service and address type (``reconciler.go reconcileByAddressType``).

    All given slices are treated as the controller's existing ("unchanged") slices, in the
    given order: the next sync with no pod change. Only controller-managed slices are passed.

    Args:
        svc: the Service.
        slices: its controller-managed slices of address type ``at``.
        at: ``IPv4`` or ``IPv6``.
        cap: cluster node aggregation.
        kv: version and gates.
        populated: the topology cache already marks the Service as having Auto hints.
    """
    auto = hints_enabled(svc.annotations)
    cache = kv.gate("TopologyAwareHints")
    td_ok = valid_traffic_distribution(svc.traffic_distribution, kv)
    use_td = td_ok and not auto
    work = _Work(slices)
    events: list[Event] = []
    alloc: AllocationResult | None = None
    ok = False
    populated_after = populated
    if cache and auto:
        alloc, ev, ok = _add_hints(work, cap.ratios, at)
        if ev:
            events.append(ev)
        if ok:
            if not populated:
                events.append(Event("Normal", REASON_ENABLED, f"{MSG_ENABLED}, addressType: {at}"))
            populated_after = True
        else:
            populated_after = False
        mechanism = "topology-mode-annotation" if ok else "topology-mode-annotation (refused)"
    else:
        if cache:
            if populated:
                events.append(Event("Warning", REASON_DISABLED, f"{MSG_DISABLED}, addressType: {at}"))
            populated_after = False
        if not use_td:
            work.strip_all()
        mechanism = "none"
    if use_td:
        _traffic_dist(work, svc.traffic_distribution, kv)
        if svc.traffic_distribution is not None and svc.traffic_distribution in close_values(kv):
            mechanism = "trafficDistribution"
    per_slice: dict[str, tuple[Hints | None, ...]] = {}
    for s, row in zip(work.slices, work.hints, strict=False):
        per_slice[s.name] = tuple(row)
    hints = AddressHints([(s.endpoints, row) for s, row in zip(work.slices, work.hints, strict=False)])
    rewritten = tuple(work.slices[i].name for i in work.update
                      if tuple(work.hints[i]) != tuple(e.hints for e in work.slices[i].endpoints))
    n_ready = sum(1 for s in slices for e in s.endpoints if e.ready is True)
    td_wrote = mechanism == "trafficDistribution" and any(
        h is not None for row in work.hints for h in row)
    mins = alloc.minimums if alloc else None
    return ControllerResult(
        mechanism=mechanism,
        hints_enabled=ok or td_wrote,
        events=tuple(events),
        zone_cpu_ratios=cap.ratios if (cache and auto) else None,
        allocations=alloc.allocations if alloc else None,
        minimums=mins,
        sum_of_minimums=sum(mins.values()) if mins else None,
        ready_endpoint_count=n_ready,
        refusal_reason=alloc.reason if (alloc and not ok) else None,
        hints=hints,
        slices=per_slice,
        rewritten=rewritten,
        kept_unchanged=tuple(work.slices[i].name for i in work.unchanged)
        if (cache and auto and ok) else (),
        populated_after=populated_after,
    )


def address_families(svc: ServiceInfo, slices: Sequence[Slice]) -> list[str]:
    fams: list[str] = [f for f in ("IPv4", "IPv6") if f in svc.ip_families]
    for s in slices:
        if s.address_type in ("IPv4", "IPv6") and s.address_type not in fams:
            fams.append(s.address_type)
    return fams or ["IPv4"]


def controller_hints(service: dict[str, Any], endpointslices: list[dict[str, Any]],
                     nodes: list[dict[str, Any]], *, version: str = DEFAULT_VERSION,
                     feature_gates: Mapping[str, bool] | None = None,
                     hints_populated: bool = False) -> tuple[list[dict[str, Any]], list[Event]]:
    """Apply the controller's next-sync hints to a Service's EndpointSlices.

    Args:
        service: the Service dict.
        endpointslices: its EndpointSlice dicts (others and non-managed ones are returned
            unchanged).
        nodes: all Node dicts.
        version, feature_gates: as :func:`evaluate_cluster`.
        hints_populated: the topology cache already marks the Service populated.

    Returns:
        (new EndpointSlice dicts in input order with ``endpoints[].hints`` replaced,
        events the controller records on the Service).

    Raises:
        InputError: malformed objects, bad version or gates.
    """
    import copy

    kv = KubeVersion.parse(version, feature_gates)
    svc = parse_service_info(service)
    idx = index_nodes(nodes)
    parsed = [parse_slice(o) for o in endpointslices]
    mine = [(i, sl) for i, (ns, name, sl) in enumerate(parsed)
            if ns == svc.namespace and name == svc.name and sl.managed]
    out = [copy.deepcopy(o) for o in endpointslices]
    events: list[Event] = []
    populated = hints_populated
    for at in address_families(svc, [sl for _, sl in mine]):
        group = [(i, sl) for i, sl in mine if sl.address_type == at]
        res = reconcile(svc, [sl for _, sl in group], at, idx.capacity, kv, populated)
        populated = res.populated_after
        events.extend(res.events)
        for i, sl in group:
            for ep_obj, h in zip(out[i].get("endpoints") or [], res.slices[sl.name], strict=False):
                if h is None:
                    ep_obj.pop("hints", None)
                else:
                    hj: dict[str, Any] = {}
                    if h.for_zones:
                        hj["forZones"] = [{"name": z} for z in h.for_zones]
                    if h.for_nodes:
                        hj["forNodes"] = [{"name": n} for n in h.for_nodes]
                    ep_obj["hints"] = hj
    return out, events


def compute_slice_hints(service: dict[str, Any], endpointslices: list[dict[str, Any]],
                        nodes: list[dict[str, Any]], *, version: str = DEFAULT_VERSION) -> list[dict[str, Any]]:
    """Like :func:`controller_hints`, returning only the new EndpointSlice dicts."""
    return controller_hints(service, endpointslices, nodes, version=version)[0]
