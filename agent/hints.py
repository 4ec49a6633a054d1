"""Kubernetes topology-aware routing, reproduced as a pure model (no I/O).

Given Nodes, Services and EndpointSlices in their API JSON shape, this module answers, per
Service and address family, the two questions that decide whether ClusterIP traffic stays
in its zone:

1. What would the EndpointSlice controller write as ``hints`` on its next sync?
   (``staging/src/k8s.io/endpointslice``: ``reconciler.go reconcileByAddressType``,
   ``utils.go hintsEnabled``, ``topologycache/*`` for ``service.kubernetes.io/topology-mode:
   Auto``, ``trafficdist/trafficdist.go`` for ``spec.trafficDistribution``.)
2. Which endpoints does kube-proxy on each node forward to, given the hints the slices carry
   now? (``pkg/proxy/topology.go CategorizeEndpoints``, ``topologyModeFromHints`` (1.33+),
   ``canUseTopology`` (<= 1.32); DROP/REJECT from ``pkg/proxy/{iptables,nftables}/proxier.go``.)

Versions 1.27 to 1.35 are modelled (default 1.35), with each version's feature-gate defaults.
The specification is ``HINTS.md`` (shared with the project); section numbers below refer to it.

Determinism: where the real controller depends on Go map iteration order (``getMost`` tie
breaks, which receiving zone a donated endpoint goes to, the order of zones in
``getAllocations``), this model iterates zones in sorted (code point) order. Per-zone totals
do not depend on that choice (see docs/hints.md).

Cost: node aggregation (the topology cache's ``SetNodes``) and the zone index are computed once
per cluster; per Service the work is O(endpoints), and kube-proxy decisions are computed per
zone plus per node that hosts or is hinted by an endpoint, then shared (see :class:`ProxyMap`).
"""

from __future__ import annotations

import gc
import math
import re
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any, NamedTuple

from agent.errors import InputError
from agent.records import ProxyView

# ----------------------------------------------------------------------------------------
# Constants copied from Kubernetes
# ----------------------------------------------------------------------------------------

ANNOTATION_TOPOLOGY_MODE = "service.kubernetes.io/topology-mode"
ANNOTATION_DEPRECATED = "service.kubernetes.io/topology-aware-hints"
LABEL_ZONE = "topology.kubernetes.io/zone"
LABEL_SERVICE_NAME = "kubernetes.io/service-name"
LABEL_MANAGED_BY = "endpointslice.kubernetes.io/managed-by"
CONTROLLER_NAME = "endpointslice-controller.k8s.io"
EXCLUDED_NODE_LABELS = ("node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master")

#: topologycache.go overloadThreshold
OVERLOAD_THRESHOLD = 0.2

# topologycache/event.go messages (before the ", addressType: X" suffix)
MSG_INSUFFICIENT_NODE_INFO = ("Insufficient Node information: allocatable CPU or zone not "
                              "specified on one or more nodes")
MSG_ONE_ZONE = "Nodes only ready in one zone"
MSG_INSUFFICIENT_ENDPOINTS = "Insufficient number of endpoints"
MSG_MIN_ALLOCATION = ("Unable to allocate minimum required endpoints to each zone without "
                      "exceeding overload threshold")
MSG_NO_ZONE = "One or more endpoints do not have a zone specified"
MSG_NO_ALLOCATED = "No hints allocated for zones"
MSG_ENABLED = "Topology Aware Hints has been enabled"
MSG_DISABLED = "Topology Aware Hints has been disabled"
REASON_ENABLED = "TopologyAwareHintsEnabled"
REASON_DISABLED = "TopologyAwareHintsDisabled"

#: the fixed vocabulary of :attr:`ServiceDiagnosis.reason`
REASONS = (
    "none", "not-requested", "insufficient-node-info", "insufficient-number-of-endpoints",
    "min-allocation-exceeds-overload-threshold", "endpoint-without-zone",
    "annotation-value-not-accepted", "feature-gate-disabled", "partial-hints",
    "no-hints-for-zone", "internal-traffic-policy-local", "no-endpoints",
)

#: one plain sentence per :data:`REASONS` code, for people who do not know the code (the demo's
#: findings print it beside the code; the vocabulary is in docs/hints.md)
REASON_SENTENCES: dict[str, str] = {
    "none": "kube-proxy keeps traffic close (same zone or node) for clients in every zone.",
    "not-requested": "The Service asks for no topology-aware routing (no topology-mode: Auto, "
                     "no trafficDistribution), so kube-proxy spreads calls over every zone.",
    "insufficient-node-info": "topology-mode: Auto was refused: the controller lacks the nodes' "
                              "zones or CPUs, or sees only one zone.",
    "insufficient-number-of-endpoints": "topology-mode: Auto was refused: there are too few "
                                        "ready endpoints to give every zone its share.",
    "min-allocation-exceeds-overload-threshold": "topology-mode: Auto was refused: the endpoints "
                                                 "cannot be shared out by zone CPU without "
                                                 "overloading a zone by more than 20%.",
    "endpoint-without-zone": "topology-mode: Auto was refused: an endpoint has no zone.",
    "annotation-value-not-accepted": "The topology annotation (or trafficDistribution) has a "
                                     "value this Kubernetes version does not accept.",
    "feature-gate-disabled": "The requested routing needs a feature gate that is off in this "
                             "Kubernetes version.",
    "partial-hints": "Some ready endpoint has no zone hint, so kube-proxy ignores the hints and "
                     "uses every endpoint everywhere.",
    "no-hints-for-zone": "Some client zone has no endpoint hinted for it (or a node has no zone "
                         "label), so kube-proxy there uses every endpoint.",
    "internal-traffic-policy-local": "internalTrafficPolicy: Local keeps ClusterIP traffic on "
                                     "the client's node; topology routing does not apply.",
    "no-endpoints": "No endpoint is usable, so kube-proxy rejects the calls.",
}

#: warning codes emitted in :attr:`ServiceDiagnosis.warnings`
WARNING_CODES = (
    "auto-shadows-traffic-distribution", "deprecated-annotation-shadows-topology-mode",
    "annotation-value-not-accepted", "traffic-distribution-not-accepted",
    "ready-endpoints-without-hints", "stale-hints", "node-info-disables-auto",
    "internal-traffic-policy-local-drops", "prefer-same-node-skew", "single-endpoint-zone",
    "auto-minimum-endpoints", "node-without-zone", "no-endpointslices",
)

GATES = ("TopologyAwareHints", "ServiceTrafficDistribution", "PreferSameTrafficDistribution")
MIN_MINOR, MAX_MINOR = 27, 35
DEFAULT_VERSION = "1.35"

# ----------------------------------------------------------------------------------------
# Versions and feature gates
# ----------------------------------------------------------------------------------------


def _gate_default(gate: str, minor: int) -> tuple[bool, bool] | None:
    """(default, locked) of ``gate`` in 1.<minor>, or None when the gate does not exist.

    Source: ``pkg/features/kube_features.go`` (HINTS.md §2.4).
    """
    if gate == "TopologyAwareHints":
        return (True, minor >= 33)
    if gate == "ServiceTrafficDistribution":
        if minor < 30:
            return None
        return (minor >= 31, minor >= 33)
    if gate == "PreferSameTrafficDistribution":
        if minor < 33:
            return None
        return (minor >= 34, minor >= 35)
    return None


@dataclass(frozen=True, slots=True)
class KubeVersion:
    """A Kubernetes minor version with its effective feature gates.

    Attributes:
        minor: the minor version (27..35 for 1.27..1.35).
        gates: effective value of each gate that exists in that version (defaults from
            ``pkg/features/kube_features.go``, overridden by the caller).
    """

    minor: int
    gates: Mapping[str, bool]

    @classmethod
    def parse(cls, version: str = DEFAULT_VERSION,
              feature_gates: Mapping[str, bool] | None = None) -> "KubeVersion":
        """Build from ``"1.X"`` (``"v1.X.Y"`` accepted) and gate overrides.

        Raises:
            InputError: unsupported version, unknown gate for that version, or a locked gate
                set against its locked value.
        """
        m = re.fullmatch(r"v?1\.(\d+)(?:\.\d+)?", str(version).strip())
        if not m or not MIN_MINOR <= int(m.group(1)) <= MAX_MINOR:
            raise InputError(f"unsupported Kubernetes version {version!r} (supported: 1.27 to 1.35)",
                             field="--kubernetes-version")
        minor = int(m.group(1))
        gates: dict[str, bool] = {}
        for gate in GATES:
            d = _gate_default(gate, minor)
            if d is not None:
                gates[gate] = d[0]
        for name, value in (feature_gates or {}).items():
            d = _gate_default(name, minor)
            if d is None:
                raise InputError(f"feature gate {name!r} does not exist in 1.{minor}",
                                 field="--feature-gates")
            if d[1] and bool(value) != d[0]:
                raise InputError(f"feature gate {name} is locked to {str(d[0]).lower()} in 1.{minor}",
                                 field="--feature-gates")
            gates[name] = bool(value)
        return cls(minor, gates)

    def gate(self, name: str) -> bool:
        """Effective value of a gate (False when the gate does not exist in this version)."""
        return self.gates.get(name, False)

    def __str__(self) -> str:
        return f"1.{self.minor}"


# ----------------------------------------------------------------------------------------
# Records
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hints:
    """EndpointSlice ``endpoints[].hints``: zone names and node names (empty tuples if unset)."""

    for_zones: tuple[str, ...] = ()
    for_nodes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, list[str]]:
        """``{"forZones": [...], "forNodes": [...]}`` (names only)."""
        return {"forZones": list(self.for_zones), "forNodes": list(self.for_nodes)}


def hints_json(h: Hints | None) -> dict[str, list[str]] | None:
    """JSON form of optional hints (None stays None)."""
    return None if h is None else h.to_json()


class Endpoint(NamedTuple):
    """One EndpointSlice endpoint, slimmed (``discovery.k8s.io/v1`` Endpoint).

    A NamedTuple rather than a dataclass: a cluster holds hundreds of thousands of these and
    tuple construction is three times cheaper; it is just as immutable.

    Attributes:
        address: ``addresses[0]`` as written in the slice.
        ready, serving, terminating: the conditions; None when unset.
        zone: ``zone``; None when the field is absent ("" kept as "").
        node: ``nodeName``; None when absent.
        hints: ``hints``; None when absent.
    """

    address: str
    ready: bool | None
    serving: bool | None
    terminating: bool | None
    zone: str | None
    node: str | None
    hints: Hints | None

    @property
    def controller_ready(self) -> bool:
        """Ready as the controller counts it: condition set and true (topologycache EndpointReady)."""
        return self.ready is True

    @property
    def proxy_ready(self) -> bool:
        """Ready as kube-proxy sees it: unset counts as true (endpointslicecache.go)."""
        return self.ready is not False


@dataclass(frozen=True, slots=True)
class Slice:
    """One EndpointSlice, slimmed.

    Attributes:
        name: metadata.name.
        address_type: ``IPv4``, ``IPv6`` or ``FQDN``.
        managed: labelled managed-by the EndpointSlice controller (only those get hints).
        ports: ``(name, port)`` pairs of ``ports[]`` (port None when unset).
        endpoints: the endpoints in slice order.
    """

    name: str
    address_type: str
    managed: bool
    ports: tuple[tuple[str, int | None], ...]
    endpoints: tuple[Endpoint, ...]


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
class Warning:  # noqa: A001 - the issue names it Warning; shadows the builtin only here
    """A diagnosis warning: a stable ``code`` (see WARNING_CODES) and a one-line message."""

    code: str
    message: str

    def to_json(self) -> dict[str, str]:
        """``{"code", "message"}``."""
        return {"code": self.code, "message": self.message}


#: the same class under a name that does not shadow the builtin ``Warning`` when imported
DiagnosisWarning = Warning


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
    """Result of the topology cache's ``SetNodes`` (HINTS.md §4.1), computed once per cluster.

    Attributes:
        ratios: zone -> float64 share of allocatable milli-CPU; None when node info is
            insufficient (then every Auto Service is refused).
        bad_node: the first eligible (ready, non-control-plane) node lacking a zone label or
            with zero allocatable CPU, which made ``ratios`` None; else None.
        bad_node_problem: ``"no zone label"`` or ``"zero allocatable CPU"``.
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
        allocations: zone -> Allocation, or None when refused.
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
                m.update(zip([e.address for e in eps], row))
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
        allocations: per-zone allocations when Auto succeeded.
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


@dataclass(frozen=True, slots=True)
class ProxyDecision:
    """kube-proxy's view of one Service on one node (``CategorizeEndpoints`` + dataplane).

    Attributes:
        topology_mode: ``""``, ``"PreferSameZone"`` or ``"PreferSameNode"``; None when the
            Service never uses Cluster endpoints (before 1.33 "PreferSameZone" stands for
            ``canUseTopology() == true``).
        cluster_endpoints: sorted ``ip:port`` strings, None when the category is unused.
        local_endpoints: sorted ``ip:port`` strings, None when the category is unused.
        all_reachable_endpoints: sorted union of the used lists.
        has_any_endpoints: some endpoint is usable anywhere in the cluster.
        internal_traffic: ``cluster``, ``local``, ``DROP`` or ``REJECT``.
        external_traffic: same, or None when the Service is not externally accessible.
        internal_addresses: endpoint addresses (no port) internal traffic goes to.
    """

    topology_mode: str | None
    cluster_endpoints: tuple[str, ...] | None
    local_endpoints: tuple[str, ...] | None
    all_reachable_endpoints: tuple[str, ...]
    has_any_endpoints: bool
    internal_traffic: str
    external_traffic: str | None
    internal_addresses: frozenset[str]

    def to_json(self) -> dict[str, Any]:
        """The ``proxy[node]`` object of the explain JSON."""
        return {
            "topology_mode": self.topology_mode,
            "cluster_endpoints": None if self.cluster_endpoints is None else list(self.cluster_endpoints),
            "local_endpoints": None if self.local_endpoints is None else list(self.local_endpoints),
            "internal_traffic": self.internal_traffic,
            "external_traffic": self.external_traffic,
        }

    def view(self) -> ProxyView:
        """The shared :class:`agent.records.ProxyView` (selected = internal addresses)."""
        return ProxyView(self.topology_mode or "", self.internal_addresses, self.internal_traffic)


class ProxyMap(Mapping[str, ProxyDecision]):
    """Read-only ``node name -> ProxyDecision`` for every node of the input.

    Decisions are computed per zone for nodes that neither host nor are hinted by an
    endpoint (they all behave the same), and per node otherwise, so the map costs
    O(endpoints) per Service instead of O(nodes).
    """

    __slots__ = ("_node_zone", "_by_zone", "_special", "_compute")

    def __init__(self, node_zone: Mapping[str, str], special: Collection[str],
                 compute: Callable[[str | None, str], ProxyDecision]) -> None:
        self._node_zone = node_zone
        self._by_zone: dict[str, ProxyDecision] = {}
        self._special: dict[str, ProxyDecision | None] = {n: None for n in special if n in node_zone}
        self._compute = compute

    def __getitem__(self, node: str) -> ProxyDecision:
        zone = self._node_zone[node]  # KeyError for unknown nodes, as a dict would
        if node in self._special:
            got = self._special[node]
            if got is None:
                got = self._special[node] = self._compute(node, zone)
            return got
        got = self._by_zone.get(zone)
        if got is None:
            got = self._by_zone[zone] = self._compute(None, zone)
        return got

    def __iter__(self) -> Iterator[str]:
        return iter(self._node_zone)

    def __len__(self) -> int:
        return len(self._node_zone)


@dataclass(slots=True)
class ServiceDiagnosis:
    """Why one Service (one address family) does or does not keep traffic in its zone.

    Attributes:
        namespace, name: the Service.
        address_type: ``IPv4`` or ``IPv6``.
        mechanism: see :class:`ControllerResult`.
        mode: short label for metrics: ``internalTrafficPolicy-Local`` (iTP Local wins for
            ClusterIP traffic), ``topology-mode`` (effective annotation is Auto/auto),
            the ``spec.trafficDistribution`` value (``PreferClose``, ``PreferSameZone``,
            ``PreferSameNode``; also when not accepted), else ``none``. It says what was
            requested; ``reason`` says whether it works.
        reason: one of :data:`REASONS` (``none`` = locality in effect in every client zone).
        locality_in_effect: client zone -> True when kube-proxy on every node of that zone
            filters ClusterIP traffic by topology. Zones of Ready nodes only; Ready nodes
            without a zone label count under ``"unknown"``.
        warnings: list of :class:`Warning`.
        controller: what the controller would write next (:class:`ControllerResult`).
        observed_hints: address -> hints the slices carry now (all slices, as kube-proxy merges).
        proxy: node -> :class:`ProxyDecision` for every node in the input (lazy mapping).
        service_port: the port used in ``ip:port`` strings (endpoint port of the
            Service's first port), or None.
    """

    namespace: str
    name: str
    address_type: str
    mechanism: str
    mode: str
    reason: str
    locality_in_effect: dict[str, bool]
    warnings: list[Warning]
    controller: ControllerResult
    observed_hints: Mapping[str, Hints | None]
    proxy: Mapping[str, ProxyDecision]
    service_port: int | None = None
    headless: bool = False

    def proxy_view(self, node: str) -> ProxyView | None:
        """What kube-proxy on ``node`` does with this Service's ClusterIP traffic.

        Returns:
            ProxyView (``selected`` = endpoint addresses, empty for DROP/REJECT), or None
            when the node is not in the input or the Service is headless.
        """
        if self.headless:
            return None
        d = self.proxy.get(node)
        return None if d is None else d.view()

    def to_json(self, nodes: Sequence[str] | None = None) -> dict[str, Any]:
        """The ``services[]`` element of the explain JSON (``nodes`` limits ``proxy``)."""
        c = self.controller
        keys = list(self.proxy) if nodes is None else [n for n in nodes if n in self.proxy]
        return {
            "namespace": self.namespace,
            "name": self.name,
            "address_type": self.address_type,
            "mechanism": self.mechanism,
            "controller": {
                "hints_enabled": c.hints_enabled,
                "events": [e.to_json() for e in c.events],
                "zone_cpu_ratios": None if c.zone_cpu_ratios is None else dict(c.zone_cpu_ratios),
                "allocations": None if c.allocations is None
                else {z: a.to_json() for z, a in c.allocations.items()},
                "hints": {a: hints_json(h) for a, h in c.hints.items()},
            },
            "observed_hints": {a: hints_json(h) for a, h in self.observed_hints.items()},
            "proxy": {n: self.proxy[n].to_json() for n in keys},
            "locality_in_effect": dict(self.locality_in_effect),
            "reason": self.reason,
            "warnings": [w.to_json() for w in self.warnings],
        }


# ----------------------------------------------------------------------------------------
# Parsing API-shaped dicts (bad input -> InputError naming object and field)
# ----------------------------------------------------------------------------------------


def _meta(obj: dict[str, Any], kind: str) -> tuple[str, str, dict[str, Any]]:
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        raise InputError("missing or not an object", obj=kind, field="metadata")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise InputError("missing or not a string", obj=kind, field="metadata.name")
    ns = meta.get("namespace", "default" if kind != "Node" else "")
    if not isinstance(ns, str):
        raise InputError("not a string", obj=f"{kind} {name}", field="metadata.namespace")
    return ns, name, meta


def _str_map(value: Any, where: str, fld: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise InputError("must be an object of strings", obj=where, field=fld)
    return {k: ("" if v is None else str(v)) for k, v in value.items()}


def _opt_bool(value: Any, where: str, fld: str) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise InputError("must be true, false or absent", obj=where, field=fld)


def _opt_str(value: Any, where: str, fld: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise InputError("must be a string", obj=where, field=fld)


#: largest CPU quantity whose milli value fits Go's int64 (``Quantity.MilliValue``)
_MAX_CPU = Decimal((1 << 63) - 1) / 1000


def cpu_millis(quantity: Any, where: str, fld: str = "status.allocatable.cpu") -> int:
    """Parse a CPU quantity into milli-CPU, rounding up like Go ``Quantity.MilliValue``.

    Uses ``kubernetes.utils.parse_quantity``.

    Raises:
        InputError: the quantity is malformed, negative, or its milli value exceeds
            int64.
    """
    from kubernetes.utils import parse_quantity

    if quantity is None:
        return 0
    if isinstance(quantity, bool):  # JSON true is no quantity (Go's Quantity refuses it)
        raise InputError(f"bad quantity {quantity!r}: not a number", obj=where, field=fld)
    try:
        q = parse_quantity(quantity)
    except (ValueError, TypeError, InvalidOperation) as err:
        raise InputError(f"bad quantity {quantity!r}: {err}", obj=where, field=fld) from None
    if not isinstance(q, Decimal) or not q.is_finite():  # "NaN", "Infinity": no quantity
        raise InputError(f"bad quantity {quantity!r}: not a finite number", obj=where, field=fld)
    if q < 0:
        raise InputError(f"bad quantity {quantity!r}: negative", obj=where, field=fld)
    # Go's Quantity.MilliValue is an int64; beyond it (1e999999 overflowed the Decimal
    # context: a traceback; 1e100000 cost a 330,000-bit integer per node) it is no CPU count
    if q > _MAX_CPU:
        raise InputError(f"bad quantity {quantity!r}: more than {_MAX_CPU} CPUs", obj=where,
                         field=fld)
    return int(math.ceil(q * 1000))


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """A Node, slimmed: zone label (None if absent), Ready condition, exclusion, milli-CPU."""

    name: str
    zone: str | None
    ready: bool
    excluded: bool
    cpu_milli: int


def parse_node(obj: dict[str, Any]) -> NodeInfo:
    """Slim a Node dict.

    Raises:
        InputError: malformed metadata, labels, conditions or allocatable CPU.
    """
    _, name, meta = _meta(obj, "Node")
    where = f"Node {name}"
    labels = _str_map(meta.get("labels"), where, "metadata.labels")
    status = obj.get("status") or {}
    if not isinstance(status, dict):
        raise InputError("must be an object", obj=where, field="status")
    conds = status.get("conditions") or []
    if not isinstance(conds, list):
        raise InputError("must be a list", obj=where, field="status.conditions")
    ready = False
    for i, c in enumerate(conds):
        if not isinstance(c, dict):
            raise InputError("must be an object", obj=where, field=f"status.conditions[{i}]")
        if c.get("type") == "Ready":  # first Ready condition decides (isNodeReady)
            ready = c.get("status") == "True"
            break
    alloc = status.get("allocatable") or {}
    if not isinstance(alloc, dict):
        raise InputError("must be an object", obj=where, field="status.allocatable")
    return NodeInfo(name=name, zone=labels.get(LABEL_ZONE), ready=ready,
                    excluded=any(k in labels for k in EXCLUDED_NODE_LABELS),
                    cpu_milli=cpu_millis(alloc.get("cpu"), where))


def zone_capacity(nodes: Sequence[NodeInfo]) -> ZoneCapacity:
    """The topology cache's ``SetNodes`` (topologycache.go, HINTS.md §4.1).

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
            problem = ("no zone label" if not n.zone else "zero allocatable CPU" if n.cpu_milli == 0
                       else "unreadable allocatable CPU")
            return ZoneCapacity(None, n.name, problem, eligible)
        cpu[n.zone] = cpu.get(n.zone, 0) + n.cpu_milli
        total += n.cpu_milli
    if total == 0 or len(cpu) < 2:
        return ZoneCapacity(None, None, None, eligible)
    return ZoneCapacity({z: cpu[z] / total for z in sorted(cpu)}, None, None, eligible)


@dataclass(frozen=True, slots=True)
class ServiceInfo:
    """A Service, slimmed to what the controller and kube-proxy read."""

    namespace: str
    name: str
    type: str
    annotations: Mapping[str, str]
    traffic_distribution: str | None
    internal_local: bool
    external_local: bool
    externally_accessible: bool
    headless: bool
    ip_families: tuple[str, ...]
    first_port_name: str | None

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return f"{self.namespace}/{self.name}"


def parse_service(obj: dict[str, Any]) -> ServiceInfo:
    """Slim a Service dict (kube-proxy ``serviceport.go`` flags, §6.2).

    Raises:
        InputError: malformed fields (object and field named).
    """
    ns, name, meta = _meta(obj, "Service")
    where = f"Service {ns}/{name}"
    ann = _str_map(meta.get("annotations"), where, "metadata.annotations")
    spec = obj.get("spec") or {}
    if not isinstance(spec, dict):
        raise InputError("must be an object", obj=where, field="spec")
    stype = _opt_str(spec.get("type"), where, "spec.type") or "ClusterIP"
    td = _opt_str(spec.get("trafficDistribution"), where, "spec.trafficDistribution")
    itp = _opt_str(spec.get("internalTrafficPolicy"), where, "spec.internalTrafficPolicy")
    etp = _opt_str(spec.get("externalTrafficPolicy"), where, "spec.externalTrafficPolicy")
    ports = spec.get("ports") or []
    if not isinstance(ports, list):
        raise InputError("must be a list", obj=where, field="spec.ports")
    node_port = False
    first_name: str | None = None
    for i, p in enumerate(ports):
        if not isinstance(p, dict):
            raise InputError("must be an object", obj=where, field=f"spec.ports[{i}]")
        if i == 0:
            first_name = _opt_str(p.get("name"), where, "spec.ports[0].name") or ""
        np_ = p.get("nodePort")
        if np_ not in (None, 0) and not isinstance(np_, int):
            raise InputError("must be an integer", obj=where, field=f"spec.ports[{i}].nodePort")
        node_port = node_port or bool(np_)
    ext_ips = spec.get("externalIPs") or []
    status = obj.get("status") or {}
    lb = ((status.get("loadBalancer") or {}).get("ingress") or []) if isinstance(status, dict) else []
    accessible = node_port or bool(ext_ips) or bool(lb) or stype in ("NodePort", "LoadBalancer")
    external_local = etp == "Local" and (stype in ("NodePort", "LoadBalancer")
                                         or (stype == "ClusterIP" and bool(ext_ips)))
    fams = spec.get("ipFamilies") or []
    if not isinstance(fams, list):
        raise InputError("must be a list", obj=where, field="spec.ipFamilies")
    return ServiceInfo(
        namespace=ns, name=name, type=stype, annotations=ann, traffic_distribution=td,
        internal_local=itp == "Local", external_local=external_local,
        externally_accessible=accessible,
        headless=spec.get("clusterIP") == "None",
        ip_families=tuple(str(f) for f in fams), first_port_name=first_name,
    )


_HINTS_CACHE: dict[tuple[tuple[str, ...], tuple[str, ...]], Hints] = {}


def _intern_hints(zones: tuple[str, ...], nodes: tuple[str, ...]) -> Hints:
    key = (zones, nodes)
    h = _HINTS_CACHE.get(key)
    if h is None:
        if len(_HINTS_CACHE) > 100_000:
            _HINTS_CACHE.clear()
        h = _HINTS_CACHE[key] = Hints(zones, nodes)
    return h


def _parse_hints(value: Any, where: str, fld: str) -> Hints | None:
    if value is None:
        return None
    if type(value) is dict and len(value) == 1:  # fast path: {"forZones": [{"name": z}]}
        fz = value.get("forZones")
        if type(fz) is list and len(fz) == 1 and type(fz[0]) is dict:
            name = fz[0].get("name")
            if type(name) is str:
                return _intern_hints((name,), ())
    if not isinstance(value, dict):
        raise InputError("must be an object", obj=where, field=fld)
    out: list[tuple[str, ...]] = []
    for key in ("forZones", "forNodes"):
        items = value.get(key) or ()
        if not isinstance(items, (list, tuple)):
            raise InputError("must be a list", obj=where, field=f"{fld}.{key}")
        names = []
        for j, it in enumerate(items):
            name = it.get("name", "") if type(it) is dict else None
            if type(name) is not str:
                raise InputError("must be an object with a string name", obj=where,
                                 field=f"{fld}.{key}[{j}]")
            names.append(name)
        out.append(tuple(names))
    return _intern_hints(out[0], out[1])


_EMPTY: dict[str, Any] = {}


def _parse_endpoint_checked(e: Any, where: str, f: str) -> Endpoint:
    """Slow path of endpoint parsing: validate every field and name the bad one."""
    if not isinstance(e, dict):
        raise InputError("must be an object", obj=where, field=f)
    addrs = e.get("addresses")
    if not isinstance(addrs, list) or not addrs or not isinstance(addrs[0], str):
        raise InputError("missing or empty", obj=where, field=f"{f}.addresses")
    cond = e.get("conditions") or {}
    if not isinstance(cond, dict):
        raise InputError("must be an object", obj=where, field=f"{f}.conditions")
    return Endpoint(
        address=addrs[0],
        ready=_opt_bool(cond.get("ready"), where, f"{f}.conditions.ready"),
        serving=_opt_bool(cond.get("serving"), where, f"{f}.conditions.serving"),
        terminating=_opt_bool(cond.get("terminating"), where, f"{f}.conditions.terminating"),
        zone=_opt_str(e.get("zone"), where, f"{f}.zone"),
        node=_opt_str(e.get("nodeName"), where, f"{f}.nodeName"),
        hints=_parse_hints(e.get("hints"), where, f"{f}.hints"),
    )


def parse_slice(obj: dict[str, Any]) -> tuple[str, str, Slice]:
    """Slim an EndpointSlice dict.

    Returns:
        (namespace, service name from the ``kubernetes.io/service-name`` label ("" if
        unlabelled), Slice).

    Raises:
        InputError: malformed fields (object and field named).
    """
    ns, name, meta = _meta(obj, "EndpointSlice")
    where = f"EndpointSlice {ns}/{name}"
    labels = _str_map(meta.get("labels"), where, "metadata.labels")
    at = obj.get("addressType")
    if not isinstance(at, str) or not at:
        raise InputError("missing or not a string", obj=where, field="addressType")
    ports_raw = obj.get("ports") or []
    if not isinstance(ports_raw, list):
        raise InputError("must be a list", obj=where, field="ports")
    ports = []
    for i, p in enumerate(ports_raw):
        if not isinstance(p, dict):
            raise InputError("must be an object", obj=where, field=f"ports[{i}]")
        num = p.get("port")
        if num is not None and (not isinstance(num, int) or isinstance(num, bool)
                                or not 0 < num <= 65535):  # true was "ip:True" in explain
            raise InputError("must be a port number 1..65535", obj=where, field=f"ports[{i}].port")
        ports.append((_opt_str(p.get("name"), where, f"ports[{i}].name") or "", num))
    eps_raw = obj.get("endpoints") or []
    if not isinstance(eps_raw, list):
        raise InputError("must be a list", obj=where, field="endpoints")
    eps = []
    for i, e in enumerate(eps_raw):
        # fast path for well-formed endpoints; anything odd goes to the checked path
        if type(e) is dict:
            addrs = e.get("addresses")
            cond = e.get("conditions") or _EMPTY
            if type(addrs) is list and addrs and type(addrs[0]) is str and type(cond) is dict:
                r, sv, t = cond.get("ready"), cond.get("serving"), cond.get("terminating")
                z, n, h = e.get("zone"), e.get("nodeName"), e.get("hints")
                if (r is None or r is True or r is False) and (sv is None or sv is True or sv is False) \
                        and (t is None or t is True or t is False) and (z is None or type(z) is str) \
                        and (n is None or type(n) is str):
                    eps.append(Endpoint(addrs[0], r, sv, t, z, n,
                                        None if h is None else _parse_hints(h, where, f"endpoints[{i}].hints")))
                    continue
        eps.append(_parse_endpoint_checked(e, where, f"endpoints[{i}]"))
    return ns, labels.get(LABEL_SERVICE_NAME, ""), Slice(
        name=name, address_type=at, managed=labels.get(LABEL_MANAGED_BY) == CONTROLLER_NAME,
        ports=tuple(ports), endpoints=tuple(eps))


# ----------------------------------------------------------------------------------------
# EndpointSlice controller
# ----------------------------------------------------------------------------------------


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
    """Reconciler's ``validTrafficDistribution`` for the version (HINTS.md §3).

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


def _close_values(kv: KubeVersion) -> tuple[str, ...]:
    """trafficdist ``closeTrafficDistribution`` in that version."""
    return ("PreferClose",) if kv.minor <= 32 else ("PreferClose", "PreferSameZone", "PreferSameNode")


def get_allocations(ratios: Mapping[str, float] | None, n: int) -> AllocationResult:
    """``TopologyCache.getAllocations`` (topologycache.go, HINTS.md §4.2), float64 arithmetic.

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
    """``TopologyCache.AddHints`` (HINTS.md §4.3). Returns (allocation, warning event, ok)."""
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
        for e, h in zip(work.slices[i].endpoints, work.hints[i]):
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
                nz = AllocationResult(None, MSG_NO_ZONE, "endpoint-without-zone", res.minimums)
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
        na = AllocationResult(None, MSG_NO_ALLOCATED, "insufficient-number-of-endpoints", res.minimums)
        return na, Event("Warning", REASON_DISABLED, f"{MSG_NO_ALLOCATED}, addressType: {at}"), False
    return res, None, True


def _traffic_dist(work: _Work, value: str | None, kv: KubeVersion) -> None:
    """``trafficdist.ReconcileHints`` (HINTS.md §5)."""
    close = value is not None and value in _close_values(kv)
    node_hints = close and value == "PreferSameNode"
    legacy_zone = kv.minor <= 32  # 1.30-1.32 wrote forZones [""] for zoneless endpoints

    def want(e: Endpoint) -> Hints | None:
        if legacy_zone:
            zones: tuple[str, ...] = (e.zone or "",)
        else:
            zones = (e.zone,) if e.zone is not None else ()
        nodes = (e.node,) if node_hints and e.node is not None else ()
        return _intern_hints(zones, nodes) if zones or nodes else None

    keep: list[int] = []
    for i in work.unchanged:
        s, row = work.slices[i], work.hints[i]
        if close:
            needs = False
            for e, h in zip(s.endpoints, row):
                if e.ready is True:
                    w = want(e)
                    if h is not w and _norm(h) != _norm(w):
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


def _norm(h: Hints | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    return ((), ()) if h is None else (h.for_zones, h.for_nodes)


def reconcile(svc: ServiceInfo, slices: Sequence[Slice], at: str, cap: ZoneCapacity,
              kv: KubeVersion, populated: bool) -> ControllerResult:
    """The controller's hint decision for one Service and address type (HINTS.md §3).

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
        if svc.traffic_distribution is not None and svc.traffic_distribution in _close_values(kv):
            mechanism = "trafficDistribution"
    per_slice: dict[str, tuple[Hints | None, ...]] = {}
    for s, row in zip(work.slices, work.hints):
        per_slice[s.name] = tuple(row)
    hints = AddressHints([(s.endpoints, row) for s, row in zip(work.slices, work.hints)])
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
        allocations=alloc.allocations if (alloc and ok) else None,
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


# ----------------------------------------------------------------------------------------
# kube-proxy
# ----------------------------------------------------------------------------------------


def _proxy_annotation_on(annotations: Mapping[str, str]) -> bool:
    """kube-proxy ``hintsAnnotation`` (<= 1.32): non-empty and not "disabled"/"Disabled"."""
    v = effective_annotation(annotations)[1] or ""
    return v not in ("", "disabled", "Disabled")


def _proxy_hints_allowed(svc: ServiceInfo, kv: KubeVersion) -> bool:
    """<= 1.32 ``canUseTopology`` preconditions that do not depend on endpoints or node."""
    if kv.minor >= 33:
        return True
    if kv.minor >= 30:
        std = kv.gate("ServiceTrafficDistribution")
        if not kv.gate("TopologyAwareHints") and not std:
            return False
        return std or _proxy_annotation_on(svc.annotations)
    return kv.gate("TopologyAwareHints") and _proxy_annotation_on(svc.annotations)


class ProxyIndex:
    """One Service's endpoints as kube-proxy merges them, indexed once for per-node decisions.

    Endpoints of every slice labelled for the Service (any manager) are merged for the
    Service's first port (``pkg/proxy/endpointslicecache.go``): ready = Ready unset or true,
    serving = Serving unset or true, terminating = Terminating true; node hints are read only
    with the PreferSameTrafficDistribution gate. Each decision then costs O(result size).

    Attributes:
        keys: ``ip:port`` per endpoint (IPv6 in brackets), parallel to ``eps``.
        port: the endpoint port of the Service's first port, or None.
        special_nodes: nodes whose decision can differ from other nodes of their zone
            (hosting an endpoint with a Local policy in use, or hinted by node hints in use).
    """

    __slots__ = ("svc", "kv", "eps", "keys", "port", "ready", "fallback", "all_zone", "all_node",
                 "by_zone", "by_node", "local_ready", "local_st", "allowed", "uses_cluster",
                 "uses_local", "ext_local", "any_usable", "special_nodes", "_sorted", "_addrs")

    def __init__(self, svc: ServiceInfo, slices: Sequence[Slice], kv: KubeVersion) -> None:
        self.svc, self.kv = svc, kv
        read_nodes = kv.gate("PreferSameTrafficDistribution")
        self.uses_cluster = not svc.internal_local or svc.externally_accessible
        self.ext_local = svc.external_local and svc.externally_accessible
        self.uses_local = uses_local = svc.internal_local or self.ext_local
        self.allowed = _proxy_hints_allowed(svc, kv)
        seen: set[str] = set()
        eps: list[Endpoint] = []
        keys: list[str] = []
        ready: list[int] = []
        fallback: list[int] = []
        by_zone: dict[str, list[int]] = {}
        by_node: dict[str, list[int]] = {}
        local_ready: dict[str, list[int]] = {}
        local_st: dict[str, list[int]] = {}
        all_zone = True
        all_node = read_nodes
        self.port: int | None = None
        first_port_set = False
        for s in slices:
            port: int | None = None
            if svc.first_port_name is not None:
                for pname, pnum in s.ports:
                    if pname == svc.first_port_name:
                        port = pnum
                        break
                if port is None and s.ports:
                    continue  # this slice does not serve the Service's first port
            if not first_port_set:
                self.port, first_port_set = port, True
            suffix = "" if port is None else f":{port}"
            for e in s.endpoints:
                a = e.address
                key = (f"[{a}]" if ":" in a else a) + suffix
                if key in seen:
                    continue
                seen.add(key)
                i = len(eps)
                eps.append(e)
                keys.append(key)
                h = e.hints
                st = e.serving is not False and e.terminating is True
                if e.ready is not False:
                    ready.append(i)
                    if h is None or not h.for_zones:
                        all_zone = False
                    elif all_zone:
                        for z in h.for_zones:
                            if z in by_zone:
                                by_zone[z].append(i)
                            else:
                                by_zone[z] = [i]
                    if all_node:
                        if h is None or not h.for_nodes:
                            all_node = False
                        else:
                            for n in h.for_nodes:
                                by_node.setdefault(n, []).append(i)
                    if uses_local and e.node is not None:
                        local_ready.setdefault(e.node, []).append(i)
                elif uses_local and st and e.node is not None:
                    local_st.setdefault(e.node, []).append(i)
                if st:
                    fallback.append(i)
        self.eps, self.keys = eps, keys
        if not all_zone:
            by_zone = {}  # zone hints are ignored as a whole
        if not all_node:
            by_node = {}
        self.ready, self.fallback = ready, fallback
        self.all_zone, self.all_node = all_zone and bool(ready), all_node and bool(ready)
        self.by_zone, self.by_node = by_zone, by_node
        self.local_ready, self.local_st = local_ready, local_st
        self.any_usable = bool(ready) or bool(fallback)
        special: set[str] = set()
        if self.uses_local:
            special.update(local_ready, local_st)
        if self.all_node and self.uses_cluster:
            special.update(by_node)
        self.special_nodes = special
        self._sorted: dict[Any, tuple[str, ...]] = {}
        self._addrs: dict[Any, frozenset[str]] = {}

    def _keys(self, tag: Any, idx: list[int]) -> tuple[str, ...]:
        got = self._sorted.get(tag)
        if got is None:
            got = self._sorted[tag] = tuple(sorted(self.keys[i] for i in idx))
        return got

    def topology_mode(self, node: str | None, zone: str) -> str:
        """kube-proxy topology mode on a node (HINTS.md §6.3).

        1.33+: ``topologyModeFromHints`` (node hints, then zone hints); <= 1.32:
        ``canUseTopology`` as ``"PreferSameZone"``/``""``. ``node`` None stands for a node
        that hosts no endpoint and is named by no node hint.
        """
        if not self.ready:
            return ""
        if self.kv.minor >= 33:
            if self.all_node and node is not None and node in self.by_node:
                return "PreferSameNode"
            if self.all_zone and zone in self.by_zone:
                return "PreferSameZone"
            return ""
        if not self.allowed or not zone or not self.all_zone:
            return ""
        return "PreferSameZone" if zone in self.by_zone else ""

    def decide(self, node: str | None, zone: str) -> ProxyDecision:
        """``CategorizeEndpoints`` plus the iptables/nftables DROP/REJECT outcome (§6.4, §6.5).

        Args:
            node: the node name, or None for "a node of ``zone`` without endpoints or hints".
            zone: the node's ``topology.kubernetes.io/zone`` label ("" when absent).
        """
        svc = self.svc
        mode: str | None = None
        ctag: Any = None
        ckeys: tuple[str, ...] | None = None
        lkeys: tuple[str, ...] | None = None
        cidx: list[int] = []
        lidx: list[int] = []
        has_any = False
        if self.eps:
            if self.uses_cluster:
                mode = self.topology_mode(node, zone)
                tag: Any
                if mode == "PreferSameNode":
                    cidx, tag = self.by_node[node], ("n", node)  # type: ignore[index]
                elif mode == "PreferSameZone":
                    cidx, tag = self.by_zone[zone], ("z", zone)
                else:
                    cidx, tag = self.ready, "all"
                if not cidx:
                    cidx, tag = self.fallback, "fallback"
                ctag = tag
                ckeys = self._keys(tag, cidx)
                has_any = bool(cidx)
            if self.uses_local:
                has_any = has_any or self.any_usable
                if node is not None and node in self.local_ready:
                    lidx = self.local_ready[node]
                elif node is not None and node in self.local_st:
                    lidx = self.local_st[node]
                lkeys = self._keys(("l", node), lidx) if lidx else ()
        reach = tuple(sorted(set(ckeys or ()) | set(lkeys or ()))) if lkeys else (ckeys or ())
        if not has_any:
            internal, external = "REJECT", ("REJECT" if svc.externally_accessible else None)
        else:
            internal = ("local" if lidx else "DROP") if svc.internal_local else "cluster"
            external = None
            if svc.externally_accessible:
                external = ("local" if lidx else "DROP") if self.ext_local else "cluster"
        if internal == "cluster":
            atag, chosen = ("c", ctag), cidx
        elif internal == "local":
            atag, chosen = ("l", node), lidx
        else:
            atag, chosen = None, []
        addrs = self._addrs.get(atag)
        if addrs is None:
            addrs = self._addrs[atag] = frozenset(self.eps[i].address for i in chosen)
        return ProxyDecision(mode, ckeys, lkeys, reach, has_any, internal, external, addrs)


# ----------------------------------------------------------------------------------------
# Cluster evaluation and diagnosis
# ----------------------------------------------------------------------------------------

UNKNOWN_ZONE = "unknown"


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
    return _index(tuple(parse_node(n) for n in nodes))


def _index(infos: tuple[NodeInfo, ...]) -> ClusterIndex:
    node_zone = {n.name: (n.zone or "") for n in infos}
    zones: dict[str, list[str]] = {}
    for n in infos:
        zones.setdefault(n.zone or UNKNOWN_ZONE, []).append(n.name)
    return ClusterIndex(infos, node_zone, {z: tuple(v) for z, v in sorted(zones.items())},
                        zone_capacity(infos), frozenset(n.zone or UNKNOWN_ZONE for n in infos if n.ready),
                        tuple(n.name for n in infos if not n.zone))


def _unreadable_node(obj: Any) -> NodeInfo | None:
    """A Node :func:`parse_node` refused, as the topology cache must count it.

    Its allocatable CPU is unknown (``cpu_milli`` -1), so when it is an eligible worker it
    makes the zone ratios insufficient, as zero CPU does (HINTS.md §4.1, ``SetNodes``):
    dropping it would give every Auto Service ratios computed from the other nodes only,
    a silently wrong answer. Zone, exclusion and readiness are read when readable; an
    unreadable Ready condition counts as Ready (the conservative side: Auto refuses).
    Returns None when the object has no name (no Node the API server could hold).
    """
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(meta, dict):
        return None
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        return None
    raw_labels = meta.get("labels")
    labels: dict[str, Any] = raw_labels if isinstance(raw_labels, dict) else {}
    zone = labels.get(LABEL_ZONE)
    status = obj.get("status") if isinstance(obj.get("status"), dict) else {}
    conds = status.get("conditions") if isinstance(status.get("conditions"), list) else None
    ready = True
    if conds is not None and all(isinstance(c, dict) for c in conds):
        ready = next((c.get("status") == "True" for c in conds if c.get("type") == "Ready"), False)
    return NodeInfo(name=name, zone=zone if isinstance(zone, str) else None, ready=ready,
                    excluded=any(k in labels for k in EXCLUDED_NODE_LABELS), cpu_milli=-1)


def _zone_groups(idx: ClusterIndex, proxy: Mapping[str, ProxyDecision], special: Collection[str]
                 ) -> list[tuple[str, ProxyDecision, int, list[str]]]:
    """Distinct kube-proxy decisions per client zone without visiting every node.

    Returns:
        (client zone, decision, number of nodes with it, up to 5 of their names) tuples;
        nodes that host or are hinted by no endpoint share one decision per zone.
    """
    out: list[tuple[str, ProxyDecision, int, list[str]]] = []
    special_by_zone: dict[str, list[str]] = {}
    for n in special:
        if n in idx.node_zone:
            special_by_zone.setdefault(idx.client_zone(n), []).append(n)
    for z, nodes in idx.zones.items():
        sp = special_by_zone.get(z, [])
        generic = len(nodes) - len(sp)
        if generic > 0:
            sps = set(sp)
            sample = []
            for n in nodes:
                if n not in sps:
                    sample.append(n)
                    if len(sample) == 5:
                        break
            out.append((z, proxy[sample[0]], generic, sample))
        for n in sp:
            out.append((z, proxy[n], 1, [n]))
    return out


def _names(items: Sequence[str], limit: int = 5) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def diagnose(svc: ServiceInfo, at: str, slices: Sequence[Slice], idx: ClusterIndex,
             kv: KubeVersion, populated: bool) -> ServiceDiagnosis:
    """Controller + kube-proxy + diagnosis for one Service and address family.

    Args:
        svc: the Service.
        at: ``IPv4`` or ``IPv6``.
        slices: every slice labelled for the Service with that address type (any manager).
        idx: cluster index.
        kv: version and gates.
        populated: topology cache's populated mark for the Service before this family.
    """
    managed = [s for s in slices if s.managed]
    ctrl = reconcile(svc, managed, at, idx.capacity, kv, populated)
    observed = AddressHints([(s.endpoints, [e.hints for e in s.endpoints]) for s in slices])
    pidx = ProxyIndex(svc, slices, kv)
    peps, port, special = pidx.eps, pidx.port, pidx.special_nodes
    proxy: Mapping[str, ProxyDecision] = {} if svc.headless else ProxyMap(idx.node_zone, special, pidx.decide)
    warnings: list[Warning] = []
    ann_key, ann_val = effective_annotation(svc.annotations)
    auto = hints_enabled(svc.annotations)
    td = svc.traffic_distribution
    td_ok = valid_traffic_distribution(td, kv)
    cache = kv.gate("TopologyAwareHints")

    # --- locality per client zone (internal traffic)
    locality: dict[str, bool] = {}
    groups = [] if svc.headless else _zone_groups(idx, proxy, special)
    for z, d, _, _ in groups:
        if z not in idx.ready_zones:
            continue  # no Ready node there, so no client either
        ok_ = d.internal_traffic == "cluster" and d.topology_mode in ("PreferSameZone", "PreferSameNode")
        locality[z] = locality.get(z, True) and ok_

    # --- mode label
    if svc.internal_local:
        mode = "internalTrafficPolicy-Local"
    elif auto:
        mode = "topology-mode"
    elif td:
        mode = td
    else:
        mode = "none"

    # --- warnings
    if auto and td:
        msg = (f"{ann_key}: {ann_val} shadows spec.trafficDistribution: {td}; the controller "
               "ignores trafficDistribution")
        if ctrl.refusal_reason:
            msg += " and, as Auto refused, the Service gets no hints at all"
        warnings.append(Warning("auto-shadows-traffic-distribution", msg))
    if ANNOTATION_DEPRECATED in svc.annotations and ANNOTATION_TOPOLOGY_MODE in svc.annotations:
        warnings.append(Warning(
            "deprecated-annotation-shadows-topology-mode",
            f"{ANNOTATION_DEPRECATED}: {svc.annotations[ANNOTATION_DEPRECATED]!r} is read instead of "
            f"{ANNOTATION_TOPOLOGY_MODE}: {svc.annotations[ANNOTATION_TOPOLOGY_MODE]!r}"))
    bad_ann = ann_val not in (None, "", "Auto", "auto", "Disabled", "disabled")
    if bad_ann:
        warnings.append(Warning(
            "annotation-value-not-accepted",
            f"{ann_key}: {ann_val!r} is not accepted by the EndpointSlice controller (only \"Auto\" "
            "or \"auto\")" + ("; kube-proxy <= 1.32 still treats it as enabled" if kv.minor <= 32 else "")))
    td_refused = td is not None and not auto and not (td_ok and td in _close_values(kv))
    if td_refused:
        why = ("the field needs Kubernetes 1.30+" if kv.minor < 30 else
               "the ServiceTrafficDistribution gate is off" if not kv.gate("ServiceTrafficDistribution") else
               "the PreferSameTrafficDistribution gate is off" if td in ("PreferSameZone", "PreferSameNode")
               and kv.minor >= 33 else f"the value is not recognised in {kv}")
        warnings.append(Warning("traffic-distribution-not-accepted",
                                f"spec.trafficDistribution: {td} is not used: {why}; hints are removed"))
    if auto and idx.capacity.ratios is None and idx.capacity.bad_node:
        warnings.append(Warning(
            "node-info-disables-auto",
            f"Node {idx.capacity.bad_node} (ready worker) has {idx.capacity.bad_node_problem}: "
            "topology-mode Auto is refused for every Service in the cluster"))
    if ctrl.refusal_reason in ("insufficient-number-of-endpoints",
                               "min-allocation-exceeds-overload-threshold"):
        m = minimum_accepted_endpoints(idx.capacity.ratios, ctrl.ready_endpoint_count)
        if m is not None:
            warnings.append(Warning(
                "auto-minimum-endpoints",
                f"Auto refuses {ctrl.ready_endpoint_count} ready endpoints; the smallest count at "
                f"or above it that Auto accepts is {m}"))
    hinted = 0
    unhinted: list[tuple[str, Endpoint]] = []
    for s in slices:
        for e in s.endpoints:
            if e.ready is not False:
                if e.hints is not None and e.hints.for_zones:
                    hinted += 1
                else:
                    unhinted.append((s.name, e))
    if hinted and unhinted:
        warnings.append(Warning(
            "ready-endpoints-without-hints",
            f"{len(unhinted)} ready endpoint(s) carry no zone hint, so kube-proxy ignores zone hints "
            f"for the whole Service: " + _names([f"{e.address} (EndpointSlice {n})" for n, e in unhinted])))
    stale: list[str] = []
    if ctrl.rewritten:
        rewritten = set(ctrl.rewritten)
        for s in managed:
            if s.name in rewritten:
                stale.extend(e.address for e, h in zip(s.endpoints, ctrl.slices[s.name])
                             if h is not e.hints and _norm(h) != _norm(e.hints))
    if stale:
        warnings.append(Warning(
            "stale-hints",
            f"{len(stale)} endpoint(s) carry hints that differ from what the controller would write now "
            f"(slices {_names(list(ctrl.rewritten) or ['?'])}): " + _names(stale)))
    if svc.internal_local and peps:
        dropped = [(c, ns_) for _, d, c, ns_ in groups if d.internal_traffic == "DROP"]
        if dropped:
            count = sum(c for c, _ in dropped)
            sample = [n for _, ns_ in dropped for n in ns_]
            warnings.append(Warning(
                "internal-traffic-policy-local-drops",
                f"internalTrafficPolicy: Local and {count} node(s) have no local endpoint: "
                f"ClusterIP traffic from them is dropped: " + _names(sample)
                + (f" and {count - min(5, len(sample))} more" if count > 5 else "")))
    if td == "PreferSameNode" and td_ok and not svc.headless and peps:
        hosts = {e.node for e in peps if e.ready is not False and e.node} & set(idx.node_zone)
        count = len(idx.node_zone) - len(hosts)
        if count > 0:
            sample = []
            for n in idx.node_zone:
                if n not in hosts:
                    sample.append(n)
                    if len(sample) == 5:
                        break
            warnings.append(Warning(
                "prefer-same-node-skew",
                f"PreferSameNode: {count} of {len(idx.node_zone)} node(s) have no ready endpoint "
                "(they fall back to same-zone) while each node with one sends all its traffic to it: "
                + ", ".join(sample) + (f" and {count - len(sample)} more" if count > len(sample) else "")))
    if peps:
        n_ready = len(pidx.ready)
        singles = []
        seen: set[str] = set()
        for z, d, _, _ in groups:
            if z not in seen and d.topology_mode == "PreferSameZone" and d.cluster_endpoints is not None \
                    and len(d.cluster_endpoints) == 1 and n_ready > 1:
                seen.add(z)
                singles.append(f"{z} -> {d.cluster_endpoints[0]}")
        if singles:
            warnings.append(Warning(
                "single-endpoint-zone",
                "a single endpoint receives all traffic of its zone: " + _names(singles)))
    zoneless = list(idx.zoneless)
    if zoneless and (hinted or auto or td):
        warnings.append(Warning("node-without-zone",
                                f"{len(zoneless)} node(s) have no {LABEL_ZONE} label, so kube-proxy there "
                                "never filters by zone: " + _names(zoneless)))
    if not slices:
        warnings.append(Warning("no-endpointslices",
                                f"no EndpointSlice labelled {LABEL_SERVICE_NAME}={svc.name} ({at})"))

    # --- reason (first match wins; see docs/hints.md)
    any_usable = pidx.any_usable
    requested = auto or td is not None or bad_ann
    foreign_hinted = any(e.hints is not None for s in slices if not s.managed for e in s.endpoints)
    if not peps or not any_usable:
        reason = "no-endpoints"
    elif svc.internal_local:
        reason = "internal-traffic-policy-local"
    elif auto and not cache:
        reason = "feature-gate-disabled"
    elif ctrl.refusal_reason:
        reason = ctrl.refusal_reason
    elif not requested and not foreign_hinted:
        reason = "not-requested"  # the controller strips any hints from its own slices
    elif bad_ann and not (td_ok and td in _close_values(kv)):
        reason = "annotation-value-not-accepted"
    elif td_refused:
        reason = ("annotation-value-not-accepted" if (kv.minor in (30, 31, 32)
                  and kv.gate("ServiceTrafficDistribution")) else "feature-gate-disabled")
    elif hinted and kv.minor <= 32 and _proxy_blocked(svc, kv):
        reason = "feature-gate-disabled" if _proxy_gates_off(kv) else "not-requested"
    elif locality and all(locality.values()):
        reason = "none"
    elif unhinted:
        reason = "partial-hints"
    elif not locality:
        reason = "none" if ctrl.hints_enabled else "partial-hints"
    else:
        reason = "no-hints-for-zone"
    return ServiceDiagnosis(
        namespace=svc.namespace, name=svc.name, address_type=at, mechanism=ctrl.mechanism,
        mode=mode, reason=reason, locality_in_effect=locality, warnings=warnings,
        controller=ctrl, observed_hints=observed, proxy=proxy, service_port=port,
        headless=svc.headless)


def _proxy_gates_off(kv: KubeVersion) -> bool:
    return not kv.gate("TopologyAwareHints") and not kv.gate("ServiceTrafficDistribution")


def _proxy_blocked(svc: ServiceInfo, kv: KubeVersion) -> bool:
    """kube-proxy <= 1.32 ignores hints for reasons other than the hints themselves."""
    if kv.minor >= 30:
        if _proxy_gates_off(kv):
            return True
        return not kv.gate("ServiceTrafficDistribution") and not _proxy_annotation_on(svc.annotations)
    return not kv.gate("TopologyAwareHints") or not _proxy_annotation_on(svc.annotations)


def _families(svc: ServiceInfo, slices: Sequence[Slice]) -> list[str]:
    fams: list[str] = [f for f in ("IPv4", "IPv6") if f in svc.ip_families]
    for s in slices:
        if s.address_type in ("IPv4", "IPv6") and s.address_type not in fams:
            fams.append(s.address_type)
    return fams or ["IPv4"]


def _slice_owner(obj: Any) -> tuple[str, str]:
    """(namespace, ``kubernetes.io/service-name`` label) of a slice, read leniently."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(meta, dict):
        return ("", "")
    labels = meta.get("labels")
    ns = meta.get("namespace", "default")
    name = labels.get(LABEL_SERVICE_NAME) if isinstance(labels, dict) else None
    return (ns if isinstance(ns, str) else "", name if isinstance(name, str) else "")


def evaluate_cluster(nodes: list[dict[str, Any]], services: list[dict[str, Any]],
                     endpointslices: list[dict[str, Any]], pods: list[dict[str, Any]] | None = None,
                     *, version: str = DEFAULT_VERSION, feature_gates: Mapping[str, bool] | None = None,
                     hints_populated: Collection[str] | None = None, strict: bool = False,
                     errors: list[InputError] | None = None) -> list[ServiceDiagnosis]:
    """Diagnose every Service of a cluster (one entry per Service and address family).

    Args:
        nodes, services, endpointslices: API-shaped dicts (``kubectl get -o json`` items).
        pods: accepted for API stability; the model reads endpoint state from the slices
            (the controller's own output), so pods are currently not consulted.
        version: ``"1.27"`` .. ``"1.35"``.
        feature_gates: gate overrides (name -> bool), validated per version.
        hints_populated: ``namespace/name`` keys the controller's topology cache marks as
            having Auto hints (controls the Enabled/Disabled events). None: inferred, a
            Service counts as populated when its controller slices carry hints and
            trafficDistribution is not what wrote them.
        strict: raise on the first malformed object instead of skipping it.
        errors: when given (and not strict), skipped objects' errors are appended here.
            Skipping never yields a confident wrong answer: a malformed Node still counts
            in the zone capacity with unknown CPU (so Auto is refused while it is an
            eligible worker), and a Service with a malformed EndpointSlice gets no
            diagnosis.

    Returns:
        ServiceDiagnosis list, Services in input order, IPv4 before IPv6. ExternalName
        Services are skipped.

    Raises:
        InputError: bad version/gates; a malformed object when ``strict``.
    """
    kv = KubeVersion.parse(version, feature_gates)
    # The records built here are acyclic; pausing the cyclic collector avoids repeated full
    # scans of the (large) input dicts while hundreds of thousands of records are created.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _evaluate(nodes, services, endpointslices, kv, hints_populated, strict, errors)
    finally:
        if was_enabled:
            gc.enable()


def _evaluate(nodes: list[dict[str, Any]], services: list[dict[str, Any]],
              endpointslices: list[dict[str, Any]], kv: KubeVersion,
              hints_populated: Collection[str] | None, strict: bool,
              errors: list[InputError] | None) -> list[ServiceDiagnosis]:
    def bad(err: InputError) -> None:
        if strict:
            raise err
        if errors is not None:
            errors.append(err)

    infos = []
    for n in nodes:
        try:
            infos.append(parse_node(n))
        except InputError as err:
            bad(err)
            unreadable = _unreadable_node(n)
            if unreadable is not None:
                infos.append(unreadable)
    idx = _index(tuple(infos))
    by_svc: dict[tuple[str, str], list[Slice]] = {}
    # Services with a slice the model cannot read: diagnosing them from their other slices
    # would be a confident answer about endpoints it has not seen, so they get none.
    unreadable_svc: set[tuple[str, str]] = set()
    for obj in endpointslices:
        try:
            ns, sname, sl = parse_slice(obj)
        except InputError as err:
            bad(err)
            unreadable_svc.add(_slice_owner(obj))
            continue
        if sname:
            by_svc.setdefault((ns, sname), []).append(sl)
    out: list[ServiceDiagnosis] = []
    for obj in services:
        try:
            svc = parse_service(obj)
        except InputError as err:
            bad(err)
            continue
        if svc.type == "ExternalName" or (svc.namespace, svc.name) in unreadable_svc:
            continue
        slices = by_svc.get((svc.namespace, svc.name), [])
        if hints_populated is not None:
            populated = svc.key in hints_populated
        else:
            populated = (not valid_traffic_distribution(svc.traffic_distribution, kv)
                         or hints_enabled(svc.annotations)) and any(
                e.hints is not None for s in slices if s.managed for e in s.endpoints)
        for at in _families(svc, slices):
            d = diagnose(svc, at, [s for s in slices if s.address_type == at], idx, kv, populated)
            populated = d.controller.populated_after
            out.append(d)
    return out


# ----------------------------------------------------------------------------------------
# For the lab: write the controller's hints into EndpointSlice dicts
# ----------------------------------------------------------------------------------------


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
    svc = parse_service(service)
    idx = index_nodes(nodes)
    parsed = [parse_slice(o) for o in endpointslices]
    mine = [(i, sl) for i, (ns, name, sl) in enumerate(parsed)
            if ns == svc.namespace and name == svc.name and sl.managed]
    out = [copy.deepcopy(o) for o in endpointslices]
    events: list[Event] = []
    populated = hints_populated
    for at in _families(svc, [sl for _, sl in mine]):
        group = [(i, sl) for i, sl in mine if sl.address_type == at]
        res = reconcile(svc, [sl for _, sl in group], at, idx.capacity, kv, populated)
        populated = res.populated_after
        events.extend(res.events)
        for i, sl in group:
            for ep_obj, h in zip(out[i].get("endpoints") or [], res.slices[sl.name]):
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
