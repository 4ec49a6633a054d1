"""Attribution: flow deltas x metadata x hint state -> cumulative byte totals.

This module is the single source of truth for the **exactly-once rule** of
DESIGN.md ("Counting rule: every byte exactly once, cluster-wide"): each node's
agent feeds the :class:`agent.records.FlowDelta` records its datapath drained into one
:class:`Attributor`, which keeps, drops or re-labels each delta so that the sum over
all agents counts every byte once. The rule, per delta kind (docs/attribution.md has the
full table and the reasons vocabulary):

* ``overflow`` deltas: ``unattributed{reason="flow_table_full"}`` (never lost).
* ``REQUEST`` / ``RESPONSE`` (counted at the endpoint's veth): always counted as Service
  traffic, ``direction`` ``request`` (client -> server) or ``response``.
* ``EGRESS`` / ``INGRESS`` (non-Service traffic at a local pod's veth), by remote side:

  - a ClusterIP (or other address kube-proxy DNATs, see :meth:`MetadataView.service_address`):
    a client-side copy, dropped, because the endpoint's node counts it; except when every
    endpoint this node's kube-proxy may pick has no veth (host-network, or outside the
    cluster for selector-less Services): then it is counted here as Service traffic. With a
    mix of veth and veth-less endpoints the client cannot tell which one got the bytes:
    they are dropped and reported as the skipped reason ``clusterip_mixed_host_network``
    (the veth-less share is then counted nowhere; a known limitation).
  - a known Service endpoint ``(address, port, protocol)``: a client-side copy, dropped,
    unless the endpoint has no veth: then counted here as Service traffic.
  - a pod (on any node, or an unresolved cluster address): only ``EGRESS`` is kept (the
    other pod's node counts the other direction as its own egress).
  - anything else (node, CIDR, external): both directions are kept.

Service ambiguity: an endpoint ``(address, port, protocol)`` that backs several Service
ports is attributed to the first by ``(namespace, service, port, port_name)`` and counted
once; the bytes also go to the diagnostic ``ambiguous_service``.

Hint-ignored bytes (DESIGN.md "Hint state, joined with traffic"): Service bytes (both
directions) whose client is a pod or node on node N, when kube-proxy on N filters by
topology for that Service (``ProxyView.topology_mode != ""``, kube-proxy
``pkg/proxy/topology.go`` ``CategorizeEndpoints``) and the server endpoint is not in the
set N selects. The server cannot tell a client that went through the ClusterIP from one
that dialled the pod address directly, so clients that bypass the ClusterIP count too.

Series expiry (issue 8, ``series_retention``): a service/hint-ignored series whose Service
no longer exists, or a workload series whose workload no pod belongs to any more, is
dropped from the totals once it has gained no bytes for ``series_retention`` seconds
(:class:`ObjectView` says what exists). Its bytes are kept in ``expired_bytes``; bytes
arriving later for the same labels start a new series from 0.
"""

from __future__ import annotations

import heapq
import ipaddress
import logging
import time
import types
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from agent.records import (FlowDelta, FlowKind, HintIgnoredKey, IPAddress, Peer, PeerKind, ProxyView,
                            ServiceBytesKey, ServicePort, WorkloadBytesKey)

#: attribution's names for the shared counter keys (agent/records.py)
ServiceKey = ServiceBytesKey
WorkloadKey = WorkloadBytesKey

_log = logging.getLogger(__name__)

__all__ = [
    "AttributionTotals",
    "Attributor",
    "HintIgnoredKey",
    "HintView",
    "LocalityDiagnosis",
    "LocalityState",
    "MetadataView",
    "ObjectView",
    "PairRow",
    "ServiceKey",
    "ServiceRef",
    "WorkloadKey",
    "counted_here",
    "CROSSINGS",
    "EXPIRY_FAMILIES",
    "FAMILY_HINT_IGNORED",
    "FAMILY_SERVICE",
    "FAMILY_WORKLOAD",
    "SKIPPED_REASONS",
    "UNATTRIBUTED_REASONS",
    "UNKNOWN",
]

#: label value for anything missing (metric contract: "missing values are unknown")
UNKNOWN = "unknown"

SAME_NODE = "same_node"
SAME_ZONE = "same_zone"
CROSS_ZONE = "cross_zone"
CROSS_REGION = "cross_region"
EXTERNAL = "external"

#: every value ``crossing`` takes
CROSSINGS: tuple[str, ...] = (SAME_NODE, SAME_ZONE, CROSS_ZONE, CROSS_REGION, EXTERNAL, UNKNOWN)

# Reasons vocabulary (docs/attribution.md lists them with their meaning).
# unattributed: bytes in no service/workload series
R_FLOW_TABLE_FULL = "flow_table_full"
R_ENDPOINT_WITHOUT_SERVICE = "endpoint_without_service"
R_ATTRIBUTION_ERROR = "attribution_error"
# skipped: client-side copies counted by another agent (or by this one at the endpoint)
S_CLUSTERIP_CLIENT_COPY = "clusterip_client_copy"
S_CLUSTERIP_MIXED_HOST_NETWORK = "clusterip_mixed_host_network"
S_ENDPOINT_CLIENT_COPY = "endpoint_client_copy"
S_POD_PEER_INGRESS = "pod_peer_ingress"
# unknown crossing: attributed bytes whose crossing is unknown
R_NO_POD_FOR_IP = "no_pod_for_ip"
R_NODE_WITHOUT_ZONE = "node_without_zone"
R_CIDR_WITHOUT_ZONE = "cidr_without_zone"
R_CLUSTERIP_TO_HOST_NETWORK = "clusterip_to_host_network_endpoint"
# diagnostics: a subset of counted bytes worth a look
D_AMBIGUOUS_SERVICE = "ambiguous_service"
D_HINT_CHECK_NO_CLIENT_NODE = "hint_check_client_node_unknown"
D_OVERFLOW_UNFILTERED = "flow_table_full_unfiltered"
D_HOLD_FULL = "hold_full"
D_LATE_ENDPOINT = "endpoint_not_in_kernel"

#: reasons of ``unattributed_bytes`` (bytes in no other series)
UNATTRIBUTED_REASONS = frozenset({R_FLOW_TABLE_FULL, R_ENDPOINT_WITHOUT_SERVICE, R_ATTRIBUTION_ERROR})
#: reasons of ``skipped_bytes`` (copies another veth counts)
SKIPPED_REASONS = frozenset({S_CLUSTERIP_CLIENT_COPY, S_CLUSTERIP_MIXED_HOST_NETWORK,
                             S_ENDPOINT_CLIENT_COPY, S_POD_PEER_INGRESS})

#: ``family`` label values of ``zonemeter_series_expired_total``: the exported metric whose
#: series expired (see :class:`Attributor`, ``series_retention``)
FAMILY_SERVICE = "zonemeter_service_bytes_total"
FAMILY_HINT_IGNORED = "zonemeter_service_hint_ignored_bytes_total"
FAMILY_WORKLOAD = "zonemeter_workload_bytes_total"
EXPIRY_FAMILIES: tuple[str, ...] = (FAMILY_SERVICE, FAMILY_HINT_IGNORED, FAMILY_WORKLOAD)
#: an expiry sweep runs at most every ``series_retention * SWEEP_FRACTION`` seconds, so a
#: series expires between ``series_retention`` and ``(1 + 2 * SWEEP_FRACTION) *
#: series_retention`` seconds after its last byte (gains are noticed at sweeps)
SWEEP_FRACTION = 0.1

#: seconds a "do this Service's selected endpoints lack a veth?" decision is reused across
#: drains (only decisions in which every endpoint resolved; see _clusterip_hostnet)
HOSTNET_TTL = 300.0

_DEFAULT_REASON = {
    PeerKind.UNKNOWN: R_NO_POD_FOR_IP,
    PeerKind.POD: R_NODE_WITHOUT_ZONE,
    PeerKind.NODE: R_NODE_WITHOUT_ZONE,
    PeerKind.CIDR: R_CIDR_WITHOUT_ZONE,
    PeerKind.EXTERNAL: R_NO_POD_FOR_IP,  # never used: external is never "unknown"
}


def counted_here(kind: FlowKind, *, remote_is_frontend: bool, remote_is_pod: bool) -> bool:
    """The exactly-once rule for one non-overflow delta drained on this node.

    The kernel counts a packet at every local pod veth it crosses; this says which of
    those copies this node keeps so that the sum over all agents counts each byte once
    (DESIGN.md "Counting rule"). :class:`Attributor` decides with it, and the kernel
    tests apply it to real drained deltas (tests/kernel/test_datapath*.py).

    * ``REQUEST`` / ``RESPONSE``: always (they exist only at the endpoint's own veth).
    * ``EGRESS`` / ``INGRESS`` to a frontend: never; that is the client-side copy of
      Service traffic, which the endpoint's node counts as request/response.
    * otherwise ``EGRESS`` always; ``INGRESS`` only when the remote is not a pod (a pod's
      own veth counted those bytes as its ``EGRESS``).

    Args:
        kind: the delta's :class:`FlowKind`.
        remote_is_frontend: ``(remote, port, protocol)`` is a Service address kube-proxy
            DNATs to endpoints with a veth, or such an endpoint (EndpointSlice address and
            port of a non-host-network pod).
        remote_is_pod: the remote is a non-host-network pod (or an unresolved cluster
            address), so some agent watches its veth.

    Returns:
        True when the delta's bytes belong in this node's totals.
    """
    if kind is FlowKind.REQUEST or kind is FlowKind.RESPONSE:
        return True
    if remote_is_frontend:
        return False
    return kind is FlowKind.EGRESS or not remote_is_pod


# --------------------------------------------------------------------------- interfaces


class MetadataView(Protocol):
    """What attribution reads from the Kubernetes metadata cache (agent/k8s).

    Implementations must be cheap (dict lookups): :meth:`Attributor.attribute` calls
    them per distinct address and endpoint in each batch.
    """

    def resolve(self, ip: IPAddress, at: float) -> Peer:
        """Resolve an address as it was at time ``at``.

        Args:
            ip: the address (IPv4 or IPv6).
            at: Unix time in seconds; deleted pods stay resolvable for a grace period.

        Returns:
            The peer: POD (not host-network), NODE (a node address or host-network pod,
            ``node`` set), CIDR, EXTERNAL, or UNKNOWN with ``reason``. Never raises.
        """
        ...

    def endpoint_services(self, ip: IPAddress, port: int, protocol: int) -> tuple[ServicePort, ...]:
        """Service ports an EndpointSlice endpoint ``(ip, port, protocol)`` serves.

        Args:
            ip: the endpoint address.
            port: the endpoint (target) port, host byte order.
            protocol: IP protocol number.

        Returns:
            Every Service port whose EndpointSlices list this endpoint and port (empty
            when none; several when Services share pods).
        """
        ...

    def service_address(self, ip: IPAddress, port: int, protocol: int) -> ServicePort | None:
        """The Service port behind an address that kube-proxy DNATs on the client's node.

        Args:
            ip: a ClusterIP; implementations should also answer for addresses kube-proxy
                rewrites the same way (NodePorts on node addresses, LoadBalancer ingress
                IPs, externalIPs), so those client-side copies are not counted twice.
            port: the Service port (or NodePort), host byte order.
            protocol: IP protocol number.

        Returns:
            The Service port, or None when ``(ip, port, protocol)`` is not a Service address.
        """
        ...

    def node(self, name: str) -> Peer | None:
        """The node called ``name`` as a NODE peer (zone, region), or None if unknown."""
        ...


class LocalityDiagnosis(Protocol):
    """Per-Service locality state as the hint model (agent/hints.py) diagnoses it.

    Treated as immutable: a changed diagnosis must be a new object (the same object
    handed out again is taken to mean "unchanged" without comparing its fields).
    """

    @property
    def mode(self) -> str:
        """Requested mode (hint-model vocabulary, e.g. ``trafficDistribution``, ``none``)."""
        ...

    @property
    def reason(self) -> str:
        """Why locality is off (hint-model vocabulary); ``none`` when in effect."""
        ...

    @property
    def in_effect(self) -> Mapping[str, bool]:
        """Client zone -> whether kube-proxy in that zone filters by topology."""
        ...


class HintView(Protocol):
    """What attribution reads from the hint model (agent/hints.py)."""

    def proxy_view(self, namespace: str, service: str, node: str) -> ProxyView | None:
        """What kube-proxy on ``node`` does with the Service's ClusterIP traffic.

        Returns:
            The view (kube-proxy ``pkg/proxy/topology.go`` ``CategorizeEndpoints``), or None
            when the Service or node is unknown to the model.
        """
        ...

    def services(self) -> Iterable[tuple[str, str]]:
        """Every known Service as ``(namespace, name)``."""
        ...

    def locality(self, namespace: str, service: str) -> LocalityDiagnosis | None:
        """The Service's locality diagnosis, or None when the Service is unknown."""
        ...


class ObjectView(Protocol):
    """Which Kubernetes objects still exist: what series expiry asks before it drops a
    series (:class:`Attributor`, ``series_retention``). Asked only about series that have
    gained no bytes for the retention, at most once per sweep, in one batch per family.

    Implementations must answer "exists" when unsure (cache not synced, a lookup failed):
    a series is only ever dropped for an object that is known to be gone.
    """

    def live_services(self, services: Collection[tuple[str, str]]) -> Collection[tuple[str, str]]:
        """The Services of ``services`` (``(namespace, name)``) that still exist."""
        ...

    def live_workloads(self, workloads: Collection[tuple[str, str, str]]
                       ) -> Collection[tuple[str, str, str]]:
        """The workloads of ``workloads`` (``(namespace, workload, workload_kind)``, as in
        :class:`WorkloadKey`) that at least one pod in the metadata still belongs to."""
        ...


# --------------------------------------------------------------------------- output records


@dataclass(frozen=True, slots=True)
class ServiceRef:
    """A Service by namespace and name."""

    namespace: str
    service: str


@dataclass(frozen=True, slots=True)
class LocalityState:
    """Locality state of one Service, for the ``zonemeter_service_locality_*`` gauges.

    Attributes:
        mode, reason: from :class:`LocalityDiagnosis`.
        in_effect: client zone -> in effect (read-only mapping).
        last_change: Unix time (seconds) of the interval in which ``(mode, reason,
            in_effect)`` last changed, or was first seen, as observed by
            :meth:`Attributor.close_interval` (precision: one interval).
    """

    mode: str
    reason: str
    in_effect: Mapping[str, bool]
    last_change: float


@dataclass(frozen=True, slots=True)
class PairRow:
    """One client -> server row of the ``zonemeter top`` view (both directions summed).

    Attributes:
        client, server: ``namespace/pod`` for pods, ``node/NAME`` for nodes and
            host-network pods, the address for other peers; ``other`` for the row that
            sums the pairs not listed.
        namespace, service: the Service, ``""`` for non-Service traffic.
        client_zone, server_zone, crossing: as in :class:`ServiceKey`.
        bytes: bytes in the interval.
        port: the Service port (its name, or its number when unnamed, as the ``port``
            label of :class:`ServiceKey`), ``""`` for non-Service traffic.
    """

    client: str
    server: str
    namespace: str
    service: str
    client_zone: str
    server_zone: str
    crossing: str
    bytes: int
    port: str = ""


def _ro(d: Mapping) -> Mapping:  # type: ignore[type-arg]
    return types.MappingProxyType(dict(d))


@dataclass(frozen=True, slots=True)
class AttributionTotals:
    """Immutable copy of an :class:`Attributor`'s cumulative totals (all bytes are L3 bytes).

    Every counter is cumulative since the Attributor was created and never decreases.
    Per node, ``bytes_seen == sum(service_bytes) + sum(workload_bytes) +
    sum(unattributed_bytes) + sum(skipped_bytes) + held_bytes``.

    Attributes:
        node: the node this Attributor runs on.
        service_bytes: ``Mapping[ServiceKey, int]`` bytes.
        hint_ignored_bytes: ``Mapping[HintIgnoredKey, int]`` bytes (a subset of service_bytes).
        workload_bytes: ``Mapping[WorkloadKey, int]`` bytes of non-Service traffic.
        unattributed_bytes: ``Mapping[reason, int]``: bytes in no other series
            (``flow_table_full``, ``endpoint_without_service``, ``attribution_error``).
        unknown_crossing_bytes: ``Mapping[reason, int]``: bytes of service/workload series
            whose crossing is ``unknown``, by why (a subset of those series).
        skipped_bytes: ``Mapping[reason, int]``: client-side copies not counted here
            because another veth counts them (not part of any series).
        diagnostics_bytes: ``Mapping[name, int]``: counted bytes worth a look
            (``ambiguous_service``, ``hint_check_client_node_unknown``,
            ``flow_table_full_unfiltered``, ``hold_full``).
        bytes_seen: every byte of every delta given to :meth:`Attributor.attribute`.
        deltas_seen: number of deltas given, ``invalid_deltas`` those with negative bytes
            (ignored).
        held_bytes: bytes held for a later retry (see ``hold_unresolved_seconds``), in no
            series yet (a gauge: it goes down when they are counted).
        locality: ``Mapping[ServiceRef, LocalityState]`` from the last
            :meth:`Attributor.close_interval`.
        top_pairs: the heaviest pairs of the last closed interval, bytes descending, then
            one ``other`` row for the rest (absent when nothing was left over).
        top_interval: ``(start, end)`` Unix seconds of that interval, or None before the first.
        series_expired: ``Mapping[family, int]``: series dropped by expiry (see
            :class:`Attributor`, ``series_retention``), per :data:`EXPIRY_FAMILIES` name;
            every family is present (0 when none expired).
        expired_bytes: ``Mapping[family, int]``: bytes those series held when they were
            dropped (cumulative). With expiry the per-node sum reads ``bytes_seen ==
            sum(service_bytes) + sum(workload_bytes) + sum(unattributed_bytes) +
            sum(skipped_bytes) + held_bytes + expired_bytes[FAMILY_SERVICE] +
            expired_bytes[FAMILY_WORKLOAD]`` (hint-ignored bytes are a subset of service
            bytes, expired or not).
    """

    node: str
    service_bytes: Mapping[ServiceKey, int]
    hint_ignored_bytes: Mapping[HintIgnoredKey, int]
    workload_bytes: Mapping[WorkloadKey, int]
    unattributed_bytes: Mapping[str, int]
    unknown_crossing_bytes: Mapping[str, int]
    skipped_bytes: Mapping[str, int]
    diagnostics_bytes: Mapping[str, int]
    bytes_seen: int
    deltas_seen: int
    invalid_deltas: int
    held_bytes: int
    locality: Mapping[ServiceRef, LocalityState]
    top_pairs: tuple[PairRow, ...]
    top_interval: tuple[float, float] | None = None
    series_expired: Mapping[str, int] = field(default_factory=lambda: _ro({f: 0 for f in EXPIRY_FAMILIES}))
    expired_bytes: Mapping[str, int] = field(default_factory=lambda: _ro({f: 0 for f in EXPIRY_FAMILIES}))

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-ready form (for the agent's ``/flows`` endpoint and ``zonemeter top -o json``).

        Returns:
            ``{"node", "bytes_seen", "deltas_seen", "invalid_deltas", "held_bytes",
            "service_bytes": [{key fields..., "bytes"}], "hint_ignored_bytes": [...],
            "workload_bytes": [...], "unattributed_bytes": {reason: bytes},
            "unknown_crossing_bytes": {...}, "skipped_bytes": {...},
            "diagnostics_bytes": {...}, "locality": [{"namespace", "service", "mode",
            "reason", "in_effect": {zone: bool}, "last_change"}], "top_pairs": [...],
            "top_interval": [start, end] | None, "series_expired": {family: series},
            "expired_bytes": {family: bytes}}``; rows sorted by their key, bytes are ints.
        """
        def rows(m: Mapping[Any, int]) -> list[dict[str, Any]]:
            return [{**{f: getattr(k, f) for f in k.__slots__}, "bytes": v}
                    for k, v in sorted(m.items(), key=lambda kv: tuple(
                        getattr(kv[0], f) for f in kv[0].__slots__))]
        return {
            "node": self.node,
            "bytes_seen": self.bytes_seen,
            "deltas_seen": self.deltas_seen,
            "invalid_deltas": self.invalid_deltas,
            "held_bytes": self.held_bytes,
            "service_bytes": rows(self.service_bytes),
            "hint_ignored_bytes": rows(self.hint_ignored_bytes),
            "workload_bytes": rows(self.workload_bytes),
            "unattributed_bytes": dict(sorted(self.unattributed_bytes.items())),
            "unknown_crossing_bytes": dict(sorted(self.unknown_crossing_bytes.items())),
            "skipped_bytes": dict(sorted(self.skipped_bytes.items())),
            "diagnostics_bytes": dict(sorted(self.diagnostics_bytes.items())),
            "locality": [{"namespace": r.namespace, "service": r.service, "mode": st.mode,
                          "reason": st.reason, "in_effect": dict(sorted(st.in_effect.items())),
                          "last_change": st.last_change}
                         for r, st in sorted(self.locality.items(),
                                             key=lambda kv: (kv[0].namespace, kv[0].service))],
            "top_pairs": [{f: getattr(p, f) for f in p.__slots__} for p in self.top_pairs],
            "top_interval": list(self.top_interval) if self.top_interval else None,
            "series_expired": dict(sorted(self.series_expired.items())),
            "expired_bytes": dict(sorted(self.expired_bytes.items())),
        }


# --------------------------------------------------------------------------- the join


def _label(peer: Peer, ip: IPAddress) -> str:
    kind = peer.kind
    if kind is PeerKind.POD and peer.name:
        return f"{peer.namespace}/{peer.name}"
    if kind is PeerKind.NODE and peer.node:
        return f"node/{peer.node}"
    return str(ip)


def _no_veth(peer: Peer) -> bool:
    """True when no agent counts the peer's side at a veth: host-network pods, nodes, and
    addresses outside the cluster (selector-less Services with hand-written EndpointSlices).
    Unresolved cluster addresses are taken to be pods (their node's agent counts them)."""
    kind = peer.kind
    return peer.host_network or (kind is not PeerKind.POD and kind is not PeerKind.UNKNOWN)


def _canonical(text: str) -> str:
    """``str(ip_address(text))``, or ``text`` itself when it is not an address."""
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        try:  # leading zeros in IPv4 octets, which ipaddress rejects
            parts = text.split(".")
            if len(parts) == 4:
                return str(ipaddress.IPv4Address(".".join(str(int(p, 10)) for p in parts)))
        except ValueError:
            pass
        return text


def _ikey(ip: IPAddress) -> int:
    """A cheap hash key for an address (``ipaddress`` hashes in Python, about 0.5 us).

    IPv4 addresses map to their integer value, IPv6 ones to its bitwise complement
    (negative), so the two families never collide.
    """
    return ip._ip if isinstance(ip, ipaddress.IPv4Address) else ~ip._ip  # type: ignore[attr-defined]


def _crossing(cz: str | None, cr: str | None, cn: str | None, ck: PeerKind,
              sz: str | None, sr: str | None, sn: str | None, sk: PeerKind) -> str:
    """Crossing of a flow between two sides (zone, region, node, kind); see docs/attribution.md."""
    if ck is PeerKind.EXTERNAL or sk is PeerKind.EXTERNAL:
        return EXTERNAL
    if cn is not None and cn == sn:
        return SAME_NODE
    if cz is None or sz is None:
        return UNKNOWN
    if cr is not None and sr is not None and cr != sr:
        return CROSS_REGION
    return SAME_ZONE if cz == sz else CROSS_ZONE


# A Service as counted: (namespace, service, port label, ambiguous)
_Svc = tuple[str, str, str, bool]
_NOT_CACHED: _Svc = ("", "", "", False)  # cache-miss sentinel, compared by identity
# A local endpoint: (its Service, its pair label, hint-ignored by client node name)
_Ep = tuple[_Svc, str, dict[str, bool]]
_NOT_CACHED_EP: _Ep = (_NOT_CACHED, "", {})
# REQUEST/RESPONSE client: (client_zone label, crossing, unknown reason, node for the hint
# check or None, hint check applies, pair label, unresolved)
_Client = tuple[str, str, str | None, str | None, bool, str, bool]
# EGRESS/INGRESS remote decision, tagged by its first item:
#   (0, skip reason, decided on unresolved addresses)
#   (1, svc, server_zone label, crossing, unknown reason, hint-ignored, pair label)
#   (2, remote_zone label, remote_kind, crossing, unknown reason, INGRESS counted here
#    (counted_here(INGRESS, ...)), pair label, unresolved)
_Remote = tuple  # type: ignore[type-arg]


@dataclass(frozen=True, slots=True)
class _Loc:
    """A Service's locality as last seen: the diagnosis object, its comparable state, and
    the published value (whose ``last_change`` moves only when ``state`` does)."""

    ref: ServiceRef
    diag: object
    state: tuple[str, str, frozenset[tuple[str, bool]]]
    value: LocalityState


@dataclass(slots=True)
class _Batch:
    """Per-drain caches: metadata and hint answers are taken as stable for one drain time.

    Keys use :func:`_ikey` integers rather than ``ipaddress`` objects for speed.
    """

    at: float
    oz: str | None
    orr: str | None
    peers: dict[int, Peer] = field(default_factory=dict)
    endpoints: dict[tuple[int, int, int], _Svc | None] = field(default_factory=dict)
    clients: dict[int, _Client] = field(default_factory=dict)
    local_eps: dict[tuple[int, int, int], _Ep | None] = field(default_factory=dict)
    remotes: dict[tuple[int, int, int], _Remote] = field(default_factory=dict)
    locals: dict[int, tuple[str, str, str, str, bool]] = field(default_factory=dict)
    labels: dict[int, str] = field(default_factory=dict)
    views: dict[tuple[str, str, str], ProxyView | None] = field(default_factory=dict)
    hostnet: dict[tuple[str, str], tuple[str, Peer | None, bool]] = field(default_factory=dict)


class Attributor:
    """Turns one node's flow deltas into cumulative per-Service / per-workload byte totals.

    One per agent (node). Per interval the agent calls :meth:`attribute` for each drained
    batch, then :meth:`close_interval`, then :meth:`totals` and hands the copy to the
    exporter. Batches of one drain should carry the same ``at``: they then share one set
    of lookups (metadata answers are taken as stable for one drain), which is what makes
    small batches as cheap as one big one. Not thread-safe: call it from one thread; the
    totals it returns are immutable.

    Args:
        node: this node's name (``spec.nodeName`` of the pods whose veths it watches).
        metadata: the metadata cache (see :class:`MetadataView`).
        hints: the hint model (see :class:`HintView`).
        top_n: pair rows kept in :attr:`AttributionTotals.top_pairs`.
        pair_capacity: distinct pod pairs tracked per interval; pairs beyond it are summed
            into the ``other`` row (bounds memory whatever the number of flows).
        hold_unresolved_seconds: when > 0, deltas whose deciding address resolves to
            nothing (``PeerKind.UNKNOWN``: a pod the metadata cache has not heard of yet,
            e.g. during an API outage) are held and retried at each later
            :meth:`attribute` call, resolved as of their own drain time, until this many
            seconds have passed; then they are counted as they resolve (``unknown`` with a
            reason if still unresolved). 0 (default) counts them at once.
        hold_capacity: at most this many deltas are held; beyond it they are counted at
            once (diagnostic ``hold_full``), so memory stays bounded.
        series_retention: seconds; when > 0, :meth:`close_interval` drops a
            ``service_bytes`` or ``hint_ignored_bytes`` series whose Service no longer
            exists, and a ``workload_bytes`` series whose workload no pod belongs to any
            more (``objects`` says), once the series has gained no bytes for this long
            (measured on ``clock``; gains are noticed at sweeps, which run at most every
            ``series_retention * SWEEP_FRACTION`` seconds, so a series goes between 1x
            and 1.2x the retention after its last byte). A series still gaining bytes, or
            whose object exists, is never dropped; workload ``unknown`` (pods not in the
            cache) never is. The dropped bytes move to ``expired_bytes``; bytes that
            arrive later for the same labels start a new series from 0 (a counter reset
            to Prometheus). 0 (default) never expires anything.
        objects: what exists (see :class:`ObjectView`); default ``metadata``, which must
            then implement it when ``series_retention`` > 0.
        clock: monotonic seconds for the retention (``time.monotonic``; injectable for
            tests). Not the ``at`` of :meth:`attribute`, which is wall-clock time.

    Raises:
        ValueError: a negative ``top_n``, ``hold_unresolved_seconds``, ``hold_capacity``
            or ``series_retention``, a non-finite ``hold_unresolved_seconds``, ``pair_capacity`` < 1, or ``series_retention`` > 0
            without an :class:`ObjectView`.
    """

    def __init__(self, node: str, metadata: MetadataView, hints: HintView, *,
                 top_n: int = 50, pair_capacity: int = 65536,
                 hold_unresolved_seconds: float = 0.0, hold_capacity: int = 100_000,
                 series_retention: float = 0.0, objects: ObjectView | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if top_n < 0 or pair_capacity < 1 or not 0 <= hold_unresolved_seconds < float("inf") \
                or hold_capacity < 0:  # "not 0 <= x < inf" also refuses NaN
            raise ValueError("top_n, hold_unresolved_seconds and hold_capacity must be >= 0 "
                             "(the hold finite) and pair_capacity >= 1")
        if not series_retention >= 0:  # also rejects NaN
            raise ValueError(f"series_retention must be >= 0, got {series_retention!r}")
        if objects is None and series_retention > 0:
            if not (callable(getattr(metadata, "live_services", None))
                    and callable(getattr(metadata, "live_workloads", None))):
                raise ValueError("series_retention > 0 needs an ObjectView (objects=, or a "
                                 "metadata view with live_services and live_workloads)")
            objects = metadata  # type: ignore[assignment]
        self._retention = float(series_retention)
        self._objects = objects
        self._clock = clock
        self._last_sweep: float | None = None
        # per family: series key -> (value when last seen to change, clock at that sweep)
        self._seen: dict[str, dict[tuple[str, ...], tuple[int, float]]] = {
            f: {} for f in EXPIRY_FAMILIES}
        self._expired: dict[str, int] = {f: 0 for f in EXPIRY_FAMILIES}
        self._expired_bytes: dict[str, int] = {f: 0 for f in EXPIRY_FAMILIES}
        self._hold_s = hold_unresolved_seconds
        self._hold_capacity = hold_capacity
        self._pending: list[tuple[float, list[FlowDelta]]] = []
        self._held_bytes = 0
        self.node = node
        self._meta = metadata
        self._hints = hints
        self._top_n = top_n
        self._pair_capacity = pair_capacity
        # cumulative counters, keyed by plain tuples on the hot path
        self._service: dict[tuple[str, str, str, str, str, str, str], int] = {}
        self._ignored: dict[tuple[str, str, str, str], int] = {}
        self._workload: dict[tuple[str, str, str, str, str, str, str, str], int] = {}
        self._unattributed: dict[str, int] = {}
        self._unknown: dict[str, int] = {}
        self._skipped: dict[str, int] = {}
        self._diag: dict[str, int] = {}
        self._bytes_seen = 0
        self._deltas_seen = 0
        self._invalid = 0
        self._logged: set[str] = set()
        # tuple -> frozen key, so totals() allocates each key object once
        self._service_keys: dict[tuple[str, ...], ServiceKey] = {}
        self._ignored_keys: dict[tuple[str, ...], HintIgnoredKey] = {}
        self._workload_keys: dict[tuple[str, ...], WorkloadKey] = {}
        # per-interval pairs
        self._pairs: dict[tuple[str, str, str, str, str, str, str, str], int] = {}
        self._pairs_other = 0
        self._interval_start: float | None = None
        self._top: tuple[PairRow, ...] = ()
        self._top_interval: tuple[float, float] | None = None
        # lookups of the current drain (calls with the same ``at`` share them)
        self._drain: _Batch | None = None
        # selected endpoint set -> canonical spellings (only built when a lookup misses)
        self._canonical: dict[frozenset[str], frozenset[str]] = {}
        # ClusterIP host-network decisions by selected endpoint set: (decided at, decision)
        self._hostnet: dict[frozenset[str], tuple[float, tuple[str, Peer | None]]] = {}
        # locality
        self._locality: dict[tuple[str, str], _Loc] = {}

    # ------------------------------------------------------------------ public verbs

    def attribute(self, deltas: Iterable[FlowDelta], at: float) -> None:
        """Add a batch of flow deltas to the cumulative totals.

        Args:
            deltas: the deltas one drain produced on this node (bytes are L3 bytes).
            at: Unix time in seconds of the drain; addresses are resolved as of then.

        Never raises on odd deltas: a delta with negative bytes is ignored and counted in
        ``invalid_deltas``; bytes that cannot be attributed go to a reason counter; a delta
        whose metadata or hint lookup raises goes to ``attribution_error`` (logged once per
        error type) and the batch goes on. With ``hold_unresolved_seconds`` set, held deltas
        of earlier calls are retried first.
        """
        if self._drain is not None and self._drain.at == at:
            pending = []  # retried once per drain, not per batch
        else:
            pending, self._pending = self._pending, []
        for at0, held in pending:
            self._held_bytes -= sum(d.bytes for d in held)
            self._run(held, at0, fresh=False, final=at - at0 >= self._hold_s)
        self._run(deltas, at, fresh=True, final=self._hold_s <= 0)

    def _run(self, deltas: Iterable[FlowDelta], at: float, *, fresh: bool, final: bool) -> None:
        """Attribute deltas resolved as of ``at``; unless ``final``, hold unresolved ones."""
        cur = self._drain
        if fresh and cur is not None and cur.at == at:
            b = cur  # another batch of the same drain: its lookups are still good
        else:
            try:
                own = self._meta.node(self.node)
            except Exception as err:  # a node without zone, rather than losing the batch
                self._failed(err, 0)
                own = None
            b = _Batch(at, own.zone if own is not None else None,
                       own.region if own is not None else None)
            if fresh:
                self._drain = b
        if self._interval_start is None:
            self._interval_start = at
        szl = b.oz or UNKNOWN
        request, response, egress = FlowKind.REQUEST, FlowKind.RESPONSE, FlowKind.EGRESS
        local_eps, clients, remotes, locals_ = b.local_eps, b.clients, b.remotes, b.locals
        service, workload, ignored = self._service, self._workload, self._ignored
        unknown, diag, skipped = self._unknown, self._diag, self._skipped
        pairs, cap = self._pairs, self._pair_capacity
        v4 = ipaddress.IPv4Address
        held: list[FlowDelta] = []
        room = 0 if final else self._hold_capacity - self._held_count()
        seen = 0
        n = 0
        for n, d in enumerate(deltas, 1):  # noqa: B007 (n is the count after the loop)
            nb = d.bytes
            if fresh:
                if nb < 0:
                    self._invalid += 1
                    continue
                seen += nb
            kind = d.kind
            if d.overflow:
                self._add(self._unattributed, R_FLOW_TABLE_FULL, nb)
                if kind is not request and kind is not response:
                    self._add(diag, D_OVERFLOW_UNFILTERED, nb)
                continue
            try:
                local, remote = d.local, d.remote
                # _ikey() inlined: this loop runs per delta
                lk = local._ip if isinstance(local, v4) else ~local._ip  # type: ignore[attr-defined]
                rk = remote._ip if isinstance(remote, v4) else ~remote._ip  # type: ignore[attr-defined]
                port = d.port
                lp = d.local_port
                late = False
                if lp and kind is not request and kind is not response:
                    # the kernel's endpoint set lacked (local, lp): a pod traffic delta
                    # from the server side; it is Service traffic if the metadata now
                    # lists the endpoint (the client side skips it as a copy either way)
                    ek = (lk, lp, d.protocol)
                    ep = local_eps.get(ek, _NOT_CACHED_EP)
                    if ep is _NOT_CACHED_EP:
                        ep = local_eps[ek] = self._local_endpoint(b, local, lk, ek)
                    if ep is not None:
                        kind = request if kind is FlowKind.INGRESS else response
                        port = lp
                        late = True
                if kind is request or kind is response:
                    ek = (lk, port, d.protocol)
                    ep = local_eps.get(ek, _NOT_CACHED_EP)
                    if ep is _NOT_CACHED_EP:
                        ep = local_eps[ek] = self._local_endpoint(b, local, lk, ek)
                    if ep is None:
                        self._add(self._unattributed, R_ENDPOINT_WITHOUT_SERVICE, nb)
                        continue
                    svc, slabel, ig_by_node = ep
                    cl = clients.get(rk)
                    if cl is None:
                        cl = clients[rk] = self._client(b, remote, rk)
                    czl, crossing, reason, cnode, check, clabel, unresolved = cl
                    if unresolved and not final:
                        if room > 0:
                            room -= 1
                            held.append(d)
                            continue
                        diag[D_HOLD_FULL] = diag.get(D_HOLD_FULL, 0) + nb
                    # every lookup that can fail happens before the first counter moves
                    ig = False
                    if check and cnode is not None:
                        ig = ig_by_node.get(cnode)  # type: ignore[assignment]
                        if ig is None:
                            ig = ig_by_node[cnode] = self._is_ignored(b, svc, cnode, local)
                    key = (svc[0], svc[1], svc[2], czl, szl, crossing,
                           "request" if kind is request else "response")
                    service[key] = service.get(key, 0) + nb
                    if late:
                        diag[D_LATE_ENDPOINT] = diag.get(D_LATE_ENDPOINT, 0) + nb
                    if reason is not None:
                        unknown[reason] = unknown.get(reason, 0) + nb
                    if svc[3]:
                        diag[D_AMBIGUOUS_SERVICE] = diag.get(D_AMBIGUOUS_SERVICE, 0) + nb
                    if ig:
                        ikey = (svc[0], svc[1], czl, szl)
                        ignored[ikey] = ignored.get(ikey, 0) + nb
                    elif check and cnode is None:
                        diag[D_HINT_CHECK_NO_CLIENT_NODE] = diag.get(D_HINT_CHECK_NO_CLIENT_NODE, 0) + nb
                    pk = (clabel, slabel, svc[0], svc[1], czl, szl, crossing, svc[2])
                else:
                    # EGRESS / INGRESS at a local pod
                    rkey = (rk, d.port, d.protocol)
                    r = remotes.get(rkey)
                    if r is None:
                        r = remotes[rkey] = self._remote(b, d, rk)
                    tag = r[0]
                    if tag == 0:
                        if r[2] and not final:  # endpoints not resolved yet: maybe no veth
                            if room > 0:
                                room -= 1
                                held.append(d)
                                continue
                            diag[D_HOLD_FULL] = diag.get(D_HOLD_FULL, 0) + nb
                        skipped[r[1]] = skipped.get(r[1], 0) + nb
                        continue
                    loc = locals_.get(lk)
                    if loc is None:
                        loc = locals_[lk] = self._local(b, local, lk)
                    if not final and (loc[4] or (tag == 2 and r[7] and kind is egress)):
                        if room > 0:
                            room -= 1
                            held.append(d)
                            continue
                        diag[D_HOLD_FULL] = diag.get(D_HOLD_FULL, 0) + nb
                    # from here on nothing calls out: counters move together
                    czl = szl
                    if tag == 1:
                        _, svc, rzl, crossing, reason, ig, rlabel = r
                        direction = "request" if kind is egress else "response"
                        key = (svc[0], svc[1], svc[2], czl, rzl, crossing, direction)
                        service[key] = service.get(key, 0) + nb
                        if svc[3]:
                            diag[D_AMBIGUOUS_SERVICE] = diag.get(D_AMBIGUOUS_SERVICE, 0) + nb
                        if ig:
                            ikey = (svc[0], svc[1], czl, rzl)
                            ignored[ikey] = ignored.get(ikey, 0) + nb
                        pk = (loc[3], rlabel, svc[0], svc[1], czl, rzl, crossing, svc[2])
                    else:
                        _, rzl, rkind, crossing, reason, ingress_here, rlabel, _ = r
                        if kind is not egress and not ingress_here:
                            skipped[S_POD_PEER_INGRESS] = skipped.get(S_POD_PEER_INGRESS, 0) + nb
                            continue
                        if kind is egress:
                            wkey = (loc[0], loc[1], loc[2], czl, rzl, rkind, crossing, "egress")
                            pk = (loc[3], rlabel, "", "", czl, rzl, crossing, "")
                        else:
                            wkey = (loc[0], loc[1], loc[2], czl, rzl, rkind, crossing, "ingress")
                            pk = (rlabel, loc[3], "", "", rzl, czl, crossing, "")
                        workload[wkey] = workload.get(wkey, 0) + nb
                    if reason is not None:
                        unknown[reason] = unknown.get(reason, 0) + nb
            except Exception as err:  # a metadata or hint adapter failed on this delta
                self._failed(err, nb)
                continue
            v = pairs.get(pk)
            if v is not None:
                pairs[pk] = v + nb
            elif len(pairs) < cap:
                pairs[pk] = nb
            else:
                self._pairs_other += nb
        self._bytes_seen += seen
        if fresh:
            self._deltas_seen += n
        if held:
            self._pending.append((at, held))
            self._held_bytes += sum(d.bytes for d in held)

    def _held_count(self) -> int:
        return sum(len(h) for _, h in self._pending)

    def close_interval(self, at: float) -> None:
        """End the current interval: publish its top pairs and refresh locality state.

        Args:
            at: Unix time in seconds (the interval end, and the ``last_change`` stamped on
                Services whose locality state changed since the previous call).
        """
        start = self._interval_start if self._interval_start is not None else at
        top = heapq.nsmallest(self._top_n, self._pairs.items(), key=lambda kv: (-kv[1], kv[0]))
        rows = [PairRow(*k[:7], bytes=v, port=k[7]) for k, v in top]
        other = self._pairs_other + sum(self._pairs.values()) - sum(v for _, v in top)
        if other:
            rows.append(PairRow("other", "other", "", "", UNKNOWN, UNKNOWN, UNKNOWN, other))
        self._top = tuple(rows)
        self._top_interval = (start, at)
        self._pairs = {}
        self._pairs_other = 0
        self._interval_start = at
        self._hostnet = {k: v for k, v in self._hostnet.items() if at - v[0] < HOSTNET_TTL}
        self._canonical = {}
        self._drain = None
        try:
            self._refresh_locality(at)
        except Exception as err:  # keep the previous locality state; counters are unaffected
            self._failed(err, 0)
        if self._retention > 0:
            self.expire_series()

    def expire_series(self) -> int:
        """Run an expiry sweep now, unless one ran less than ``series_retention *
        SWEEP_FRACTION`` seconds ago (:meth:`close_interval` calls it every interval).

        A series is dropped when, at this sweep, it has not changed since a sweep at least
        ``series_retention`` seconds ago and its object is gone (see the class docstring).
        Never raises: when ``objects`` raises, nothing of that family is dropped this time.

        Returns:
            number of series dropped (0 when expiry is off or the sweep was skipped).
        """
        if self._retention <= 0 or self._objects is None:
            return 0
        now = self._clock()
        if self._last_sweep is not None and now - self._last_sweep < self._retention * SWEEP_FRACTION:
            return 0
        self._last_sweep = now
        dropped = 0
        families: tuple[tuple[str, dict[Any, int], dict[Any, Any], int], ...] = (
            (FAMILY_SERVICE, self._service, self._service_keys, 2),
            (FAMILY_HINT_IGNORED, self._ignored, self._ignored_keys, 2),
            (FAMILY_WORKLOAD, self._workload, self._workload_keys, 3))
        for family, counts, keys, width in families:
            seen = self._seen[family]
            idle: list[tuple[str, ...]] = []
            for k, v in counts.items():
                s = seen.get(k)
                if s is None or s[0] != v:  # new, or gained bytes since the last sweep
                    seen[k] = (v, now)
                elif now - s[1] >= self._retention:
                    idle.append(k)
            if not idle:
                continue
            objs = {k[:width] for k in idle}
            if width == 3:  # pods not in the cache: a catch-all, not an object
                objs.discard((UNKNOWN, UNKNOWN, UNKNOWN))
            try:
                live: set[tuple[str, ...]] = set()
                if objs and width == 2:
                    live.update(self._objects.live_services(objs))  # type: ignore[arg-type]
                elif objs:
                    live.update(self._objects.live_workloads(objs))  # type: ignore[arg-type]
            except Exception as err:  # unsure: keep every series of this family
                name = "expiry:" + type(err).__name__
                if name not in self._logged:
                    self._logged.add(name)
                    _log.warning("series expiry: object lookup failed (%s: %s); no series of "
                                 "%s dropped this sweep, further %s errors not logged",
                                 type(err).__name__, err, family, type(err).__name__,
                                 exc_info=err)
                continue
            for k in idle:
                obj = k[:width]
                if obj in live or obj not in objs:
                    continue
                v = counts.pop(k)
                del seen[k]
                keys.pop(k, None)
                self._expired[family] += 1
                self._expired_bytes[family] += v
                dropped += 1
        if dropped:
            _log.info("expired %d series of deleted objects", dropped,
                      extra={"fields": {"series_expired": dict(self._expired)}})
        return dropped

    def totals(self) -> AttributionTotals:
        """Return an immutable copy of the cumulative totals (see :class:`AttributionTotals`)."""
        return AttributionTotals(
            node=self.node,
            service_bytes=self._keyed(self._service, self._service_keys, ServiceKey),
            hint_ignored_bytes=self._keyed(self._ignored, self._ignored_keys, HintIgnoredKey),
            workload_bytes=self._keyed(self._workload, self._workload_keys, WorkloadKey),
            unattributed_bytes=_ro(self._unattributed),
            unknown_crossing_bytes=_ro(self._unknown),
            skipped_bytes=_ro(self._skipped),
            diagnostics_bytes=_ro(self._diag),
            bytes_seen=self._bytes_seen,
            deltas_seen=self._deltas_seen,
            invalid_deltas=self._invalid,
            held_bytes=self._held_bytes,
            locality=types.MappingProxyType({v.ref: v.value for v in self._locality.values()}),
            top_pairs=self._top,
            top_interval=self._top_interval,
            series_expired=_ro(self._expired),
            expired_bytes=_ro(self._expired_bytes),
        )

    # ------------------------------------------------------------------ helpers (cache misses)

    def _failed(self, err: Exception, nb: int) -> None:
        """Count a delta whose lookups raised, and log each error type once."""
        if nb:
            self._add(self._unattributed, R_ATTRIBUTION_ERROR, nb)
        name = type(err).__name__
        if name not in self._logged:
            self._logged.add(name)
            _log.warning("attribution lookup failed (%s: %s); bytes counted as "
                         "unattributed reason %s, further %s errors not logged",
                         name, err, R_ATTRIBUTION_ERROR, name, exc_info=err)

    @staticmethod
    def _add(d: dict[str, int], key: str, n: int) -> None:
        d[key] = d.get(key, 0) + n

    @staticmethod
    def _keyed(src: Mapping, cache: dict, cls: type) -> Mapping:  # type: ignore[type-arg]
        out = {}
        for k, v in src.items():
            key = cache.get(k)
            if key is None:
                key = cache[k] = cls(*k)
            out[key] = v
        return types.MappingProxyType(out)

    def _peer(self, b: _Batch, ip: IPAddress, k: int) -> Peer:
        p = b.peers.get(k)
        if p is None:
            if ip.is_link_local or ip.is_multicast or ip.is_unspecified:
                # link-scope packets (IPv6 neighbour discovery, MLD reports, DAD from ::,
                # 169.254/16) never leave the veth's link: they stay between the pod and
                # this node, so they are the node's traffic, never cross-zone
                p = self._meta.node(self.node) or Peer(PeerKind.NODE, node=self.node)
            else:
                p = self._meta.resolve(ip, b.at)
            b.peers[k] = p
        return p

    def _endpoint(self, b: _Batch, ip: IPAddress, ek: tuple[int, int, int]) -> _Svc | None:
        """The first Service port (by namespace, name, port, port name) an endpoint serves."""
        sps = self._meta.endpoint_services(ip, ek[1], ek[2])
        r: _Svc | None = None
        if sps:
            first = min(sps, key=lambda sp: (sp.namespace, sp.service, sp.port, sp.port_name))
            r = (first.namespace, first.service, str(first.port), len(sps) > 1)
        b.endpoints[ek] = r
        return r

    def _local_endpoint(self, b: _Batch, ip: IPAddress, lk: int,
                        ek: tuple[int, int, int]) -> _Ep | None:
        """A local endpoint's Service and label, with an empty hint-check cache."""
        svc = b.endpoints.get(ek, _NOT_CACHED)
        if svc is _NOT_CACHED:
            svc = self._endpoint(b, ip, ek)
        if svc is None:
            return None
        label = b.labels.get(lk)
        if label is None:
            label = b.labels[lk] = _label(self._peer(b, ip, lk), ip)
        return (svc, label, {})

    def _client(self, b: _Batch, ip: IPAddress, k: int) -> _Client:
        """Classify the client of a REQUEST/RESPONSE delta (the server is on this node)."""
        c = self._peer(b, ip, k)
        cz = c.zone
        crossing = _crossing(cz, c.region, c.node, c.kind, b.oz, b.orr, self.node, PeerKind.POD)
        reason: str | None = None
        if crossing == UNKNOWN:
            reason = (c.reason or _DEFAULT_REASON[c.kind]) if cz is None else R_NODE_WITHOUT_ZONE
        # kube-proxy on the client's node decides; CIDR and external clients have none
        check = c.kind is PeerKind.POD or c.kind is PeerKind.NODE or c.kind is PeerKind.UNKNOWN
        return (cz or UNKNOWN, crossing, reason, c.node, check, _label(c, ip),
                c.kind is PeerKind.UNKNOWN)

    def _local(self, b: _Batch, ip: IPAddress, k: int) -> tuple[str, str, str, str, bool]:
        """(namespace, workload, workload kind, pair label, unresolved) of a local pod."""
        p = self._peer(b, ip, k)
        if p.kind is PeerKind.POD:
            return (p.namespace or UNKNOWN, p.workload or p.name or UNKNOWN,
                    p.workload_kind or ("Pod" if p.name else UNKNOWN), _label(p, ip), False)
        return (UNKNOWN, UNKNOWN, UNKNOWN, str(ip), p.kind is PeerKind.UNKNOWN)

    def _remote(self, b: _Batch, d: FlowDelta, rk: int) -> _Remote:
        """Decide an EGRESS/INGRESS delta by its remote (address, port, protocol)."""
        remote, port, proto = d.remote, d.port, d.protocol
        sa = self._meta.service_address(remote, port, proto)
        if sa is not None:
            skip, server, settled = self._clusterip_hostnet(b, sa)
            if server is None:
                return (0, skip, not settled)
            svc = (sa.namespace, sa.service, str(sa.port), False)
            label = _label(server, remote) if server.node else f"{sa.namespace}/{sa.service}"
            # kube-proxy on this node picked among the endpoints it selects: not ignored
            return self._server_side(b, svc, server, False, label)
        ek = (rk, port, proto)
        svc_ = b.endpoints.get(ek, _NOT_CACHED)
        if svc_ is _NOT_CACHED:
            svc_ = self._endpoint(b, remote, ek)
        peer = self._peer(b, remote, rk)
        if svc_ is not None:
            # an endpoint with a veth is a frontend: its node counts these bytes as
            # request/response (the answer is the same for EGRESS and INGRESS)
            if not counted_here(FlowKind.EGRESS, remote_is_frontend=not _no_veth(peer),
                                remote_is_pod=True):
                return (0, S_ENDPOINT_CLIENT_COPY, False)
            # a direct dial of an endpoint without veth: did it bypass this node's selection?
            ig = self._is_ignored(b, svc_, self.node, remote)
            return self._server_side(b, svc_, peer, ig, _label(peer, remote))
        pk = peer.kind
        podlike = (pk is PeerKind.POD or pk is PeerKind.UNKNOWN) and not peer.host_network
        crossing = _crossing(b.oz, b.orr, self.node, PeerKind.POD,
                             peer.zone, peer.region, peer.node, pk)
        reason: str | None = None
        if crossing == UNKNOWN:
            reason = R_NODE_WITHOUT_ZONE if b.oz is None else (peer.reason or _DEFAULT_REASON[pk])
        rkind = "node" if peer.host_network else pk.value
        ingress_here = counted_here(FlowKind.INGRESS, remote_is_frontend=False, remote_is_pod=podlike)
        return (2, peer.zone or UNKNOWN, rkind, crossing, reason, ingress_here, _label(peer, remote),
                pk is PeerKind.UNKNOWN)

    def _server_side(self, b: _Batch, svc: _Svc, server: Peer, ignored: bool, label: str) -> _Remote:
        """Service traffic counted at the client (host-network endpoint, no veth there)."""
        sz = server.zone
        crossing = _crossing(b.oz, b.orr, self.node, PeerKind.POD,
                             sz, server.region, server.node, server.kind)
        reason: str | None = None
        if crossing == UNKNOWN:
            reason = R_NODE_WITHOUT_ZONE if b.oz is None else (
                server.reason or _DEFAULT_REASON[server.kind])
        return (1, svc, sz or UNKNOWN, crossing, reason, ignored, label)

    def _view(self, b: _Batch, ns: str, svc: str, node: str) -> ProxyView | None:
        k = (ns, svc, node)
        if k in b.views:
            return b.views[k]
        v = b.views[k] = self._hints.proxy_view(ns, svc, node)
        return v

    def _is_ignored(self, b: _Batch, svc: _Svc, cnode: str, server: IPAddress) -> bool:
        """True when kube-proxy on ``cnode`` filters by topology and would not pick ``server``."""
        pv = self._view(b, svc[0], svc[1], cnode)
        if pv is None or not pv.topology_mode:
            return False
        text = str(server)
        if text in pv.selected:
            return False
        # Slices may carry non-canonical spellings ("fd00:0::1", "010.1.2.3" in old
        # clusters): compare canonical forms before calling the bytes hint-ignored.
        canon = self._canonical.get(pv.selected)
        if canon is None:
            canon = self._canonical[pv.selected] = frozenset(_canonical(a) for a in pv.selected)
        return text not in canon

    def _clusterip_hostnet(self, b: _Batch, sa: ServicePort) -> tuple[str, Peer | None, bool]:
        """Decide a ClusterIP client-side copy: (skip reason, None, settled) or
        ("", server peer, settled); ``settled``: every selected endpoint resolved.

        The bytes are counted here when every endpoint kube-proxy on this node may pick has
        no veth (host-network, or outside the cluster), since no agent sees the server side;
        the server is then the endpoint, or what all of them share (node, zone, external).
        """
        k = (sa.namespace, sa.service)
        r = b.hostnet.get(k)
        if r is not None:
            return r
        pv = self._view(b, sa.namespace, sa.service, self.node)
        selected = pv.selected if pv is not None else frozenset()
        # Across calls, keyed by the selected set (its hash is cached by frozenset): once
        # every endpoint resolved, whether an address has a veth cannot change (a pod IP
        # never becomes a node's, a node IP never a pod's), only a veth-less endpoint's zone
        # label could; so the decision is reused for HOSTNET_TTL seconds instead of parsing
        # and resolving every endpoint at each drain. Decisions that met an unresolved
        # address (cache still syncing) are redone at the next drain.
        hit = self._hostnet.get(selected)
        if hit is not None and b.at - hit[0] < HOSTNET_TTL:
            r = (*hit[1], True)
        else:
            decision, settled = self._hostnet_decide(b, selected)
            if settled:
                self._hostnet[selected] = (b.at, decision)
            r = (*decision, settled)
        b.hostnet[k] = r
        return r

    def _hostnet_decide(self, b: _Batch, selected: frozenset[str]
                        ) -> tuple[tuple[str, Peer | None], bool]:
        """The decision for a selected endpoint set, and whether every endpoint resolved."""
        peers: list[Peer] = []
        for a in sorted(selected):
            try:
                ip = ipaddress.ip_address(_canonical(a))
            except ValueError:
                continue
            peers.append(self._peer(b, ip, _ikey(ip)))
        settled = all(p.kind is not PeerKind.UNKNOWN for p in peers)
        return self._hostnet_server(peers), settled

    @staticmethod
    def _hostnet_server(peers: list[Peer]) -> tuple[str, Peer | None]:
        hn = [p for p in peers if _no_veth(p)]
        if not hn:
            return (S_CLUSTERIP_CLIENT_COPY, None)
        if len(hn) < len(peers):
            return (S_CLUSTERIP_MIXED_HOST_NETWORK, None)
        nodes = {p.node for p in hn}
        zones = {p.zone for p in hn}
        regions = {p.region for p in hn}
        kinds = {p.kind for p in hn}
        if len(hn) == 1 or (len(nodes) == 1 and None not in nodes):
            return ("", hn[0])
        if kinds == {PeerKind.EXTERNAL}:
            return ("", Peer(PeerKind.EXTERNAL))
        if len(zones) == 1 and None not in zones:
            return ("", Peer(kinds.pop() if len(kinds) == 1 else PeerKind.NODE, zone=hn[0].zone,
                             region=hn[0].region if len(regions) == 1 else None))
        return ("", Peer(PeerKind.UNKNOWN, reason=R_CLUSTERIP_TO_HOST_NETWORK))

    def _refresh_locality(self, at: float) -> None:
        old = self._locality
        new: dict[tuple[str, str], _Loc] = {}
        for ns, name in self._hints.services():
            diag = self._hints.locality(ns, name)
            if diag is None:
                continue
            k = (ns, name)
            prev = old.get(k)
            if prev is not None and prev.diag is diag:  # the model handed out the same object
                new[k] = prev
                continue
            in_effect = dict(diag.in_effect)
            state = (diag.mode, diag.reason, frozenset(in_effect.items()))
            if prev is not None and prev.state == state:
                new[k] = _Loc(prev.ref, diag, state, prev.value)
            else:
                new[k] = _Loc(prev.ref if prev else ServiceRef(ns, name), diag, state,
                              LocalityState(diag.mode, diag.reason,
                                            types.MappingProxyType(in_effect), at))
        self._locality = new  # Services the model no longer lists are dropped
