"""Plain record types exchanged between stages.

Stages never pass BCC, pyroute2 or Kubernetes client objects to each other: only these
frozen, slotted dataclasses with :mod:`ipaddress` addresses and :mod:`enum` states.
"""

from __future__ import annotations

import enum
import ipaddress
import math
import types
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class FlowKind(enum.Enum):
    """How the kernel classified a packet on a local pod's host-side veth.

    * ``REQUEST``: into a local Service endpoint (``local`` = endpoint, ``remote`` = client).
    * ``RESPONSE``: out of a local Service endpoint (``local`` = endpoint, ``remote`` = client).
    * ``EGRESS``: non-Service traffic leaving a local pod (``local`` = pod, ``remote`` = peer).
    * ``INGRESS``: non-Service traffic entering a local pod (``local`` = pod, ``remote`` = peer).
    """

    REQUEST = "request"
    RESPONSE = "response"
    EGRESS = "egress"
    INGRESS = "ingress"


@dataclass(frozen=True, slots=True)
class FlowDelta:
    """Bytes and packets counted for one flow key since the previous drain.

    Attributes:
        kind: the classification (see :class:`FlowKind`).
        local: the address on this node: the endpoint for REQUEST/RESPONSE, the local pod
            for EGRESS/INGRESS. Unspecified (``0.0.0.0`` / ``::``) when ``overflow``.
        remote: the peer: the client for REQUEST/RESPONSE, the other side otherwise.
        port: REQUEST/RESPONSE: the endpoint (target) port; EGRESS/INGRESS: the remote
            port, or 0 when it lies in the node's ephemeral port range or the protocol
            has no ports. Host byte order.
        protocol: IP protocol number (6 TCP, 17 UDP, 132 SCTP, others with port 0).
        bytes: L3 bytes (IP header included) as sent on the wire, see docs/datapath.md.
        packets: packets as sent on the wire (GSO segments counted one by one).
        overflow: the flow table was full and these bytes went to the overflow entry of
            this kind and address family; addresses and port are then unspecified.
        local_port: EGRESS/INGRESS: the local pod's port (host byte order) when it
            may be a server port (a TCP SYN entered the pod on it, a SYN-ACK of a local
            pod left from it, or the remote port was ephemeral and this one is not:
            bpf/classify.h ``zm_local_port``); else 0. Lets attribution recognise
            Service traffic to an endpoint the kernel's endpoint set did not hold yet
            (:meth:`agent.attribution.Attributor.attribute`). REQUEST/RESPONSE: 0, except
            for the first hop of a node port counted on an uplink (bpf/uplink.h), where it
            repeats ``port`` (the entry port) and marks the delta as such an entry hop:
            ``local`` is then a node address, LoadBalancer IP or externalIP of this node
            (:attr:`is_entry`).
        ifindex: the host-side veth the bytes crossed (this node's interface index); on
            the cgroup hook the low 32 bits of the pod's cgroup id (the parent of the
            socket's cgroup: bpf/cgroup.c ``zm_cg_hook_id``), 0 for sockets in the root
            cgroup or a child of it; 0 when unknown (overflow entries, records not from
            the kernel). The local
            address is resolved to the pod of that veth, so a reused address's bytes go
            to the pod that held it when they were counted (docs/datapath.md, "The veth
            in the key").
    """

    kind: FlowKind
    local: IPAddress
    remote: IPAddress
    port: int
    protocol: int
    bytes: int
    packets: int
    overflow: bool = False
    local_port: int = 0
    ifindex: int = 0

    @property
    def is_entry(self) -> bool:
        """True for the first hop of a node port counted on an uplink (``REQUEST`` into or
        ``RESPONSE`` out of an entry address of this node: docs/datapath.md, "The first hop
        of a node port")."""
        return bool(self.local_port) and (self.kind is FlowKind.REQUEST
                                          or self.kind is FlowKind.RESPONSE)


class PeerKind(enum.Enum):
    """What an address resolved to (see :meth:`agent.k8s` resolution order).

    The values are the client classes of docs/attribution.md, *Client classes* (except a
    host-network pod, which resolves to ``NODE``), so a kind's value is its label value.
    """

    POD = "pod"            # a pod IP (not host-network)
    NODE = "node"          # a node address, or a host-network pod on it
    LOAD_BALANCER = "load-balancer"  # a ``--zone-cidrs`` range marked ``kind: load-balancer``
    CIDR = "cidr"          # outside the cluster, in a ``--zone-cidrs`` range
    EXTERNAL = "external"  # outside the cluster, no zone known
    UNKNOWN = "unknown"    # looks like a cluster address but resolves to nothing (see reason)


@dataclass(frozen=True, slots=True)
class Peer:
    """One side of a flow after IP resolution.

    Attributes:
        kind: see :class:`PeerKind`.
        zone: ``topology.kubernetes.io/zone`` of the node (or the CIDR's zone); None if unknown.
        region: ``topology.kubernetes.io/region``; None if unknown.
        node: node name for POD and NODE peers.
        namespace, name: the pod, for POD peers and host-network pods.
        workload, workload_kind: owning workload (``Deployment`` after walking the
            ReplicaSet, ``StatefulSet``, ``DaemonSet``, ``Job``...), else the pod itself
            with kind ``Pod``.
        host_network: the pod uses the node's network namespace.
        reason: for UNKNOWN peers (and peers with zone None), why: ``no_pod_for_ip``,
            ``node_without_zone``, ``pod_without_node``...
        lb_type: for LOAD_BALANCER peers, the load balancer's type from the zone CIDR file
            (``agent.k8s.cidrs.LB_TYPES``: ``aws-alb``, ``aws-nlb``, ...); None otherwise.
    """

    kind: PeerKind
    zone: str | None = None
    region: str | None = None
    node: str | None = None
    namespace: str | None = None
    name: str | None = None
    workload: str | None = None
    workload_kind: str | None = None
    host_network: bool = False
    reason: str | None = None
    lb_type: str | None = None


@dataclass(frozen=True, slots=True)
class ServicePort:
    """A Service port that an endpoint ``(address, target port, protocol)`` serves.

    Attributes:
        namespace, service: the Service.
        port: the Service port number (what clients dial on the ClusterIP).
        port_name: the Service port's name ("" when unnamed).
        target_port: the endpoint port (EndpointSlice ``ports[].port``), host byte order.
        protocol: IP protocol number (6 TCP, 17 UDP, 132 SCTP).
    """

    namespace: str
    service: str
    port: int
    port_name: str
    target_port: int
    protocol: int


@dataclass(frozen=True, slots=True)
class ProxyView:
    """What kube-proxy on one node does with one Service's ClusterIP traffic.

    Produced by :mod:`agent.hints` (kube-proxy ``CategorizeEndpoints``).

    Attributes:
        topology_mode: ``""`` (no filtering), ``"PreferSameZone"`` or ``"PreferSameNode"``.
        selected: endpoint addresses (as strings) the node forwards internal traffic to.
        internal_traffic: ``"cluster"``, ``"local"``, ``"DROP"`` or ``"REJECT"``.
    """

    topology_mode: str
    selected: frozenset[str]
    internal_traffic: str


# ------------------------------------------------------------------ counter keys
# Attribution accumulates under these keys and the exporter serves them as label sets, so
# they are one set of classes: the totals pass to the exporter without a copy.


@dataclass(frozen=True, slots=True, order=True)
class ServiceBytesKey:
    """Labels of ``zonemeter_service_bytes_total``.

    Attributes:
        namespace, service: the Service.
        port: the Service port number, as a string (label value).
        client_zone, server_zone: zone labels, ``unknown`` when missing.
        crossing: same_node, same_zone, cross_zone, cross_region, external, unknown.
        direction: ``request`` (client -> endpoint) or ``response`` (endpoint -> client).
        client_kind: the client's class (``agent.attribution.vocabulary.CLIENT_KINDS``:
            ``pod``, ``node``, ``load-balancer``, ``cidr``, ``external``, ``unknown``;
            docs/attribution.md, *Client classes*).
        lb_type: the load balancer's type when ``client_kind`` is ``load-balancer``
            (``agent.k8s.cidrs.LB_TYPES``), else ``none``.
    """

    namespace: str
    service: str
    port: str
    client_zone: str
    server_zone: str
    crossing: str
    direction: str
    client_kind: str = "unknown"
    lb_type: str = "none"


@dataclass(frozen=True, slots=True, order=True)
class HintIgnoredKey:
    """Labels of ``zonemeter_service_hint_ignored_bytes_total`` (both directions summed).

    Attributes:
        namespace, service: the Service.
        client_zone, server_zone: zone labels (``unknown`` when missing).
        client_node: the node whose kube-proxy selection the bytes ignored (the client's
            node; for a node-address client, the node owning the address).
        client_kind: ``pod`` (a pod with its own address) or ``node`` (the client's
            address is a node's: a host-network client, or a NodePort/LoadBalancer hop
            masqueraded to the node that received it); docs/attribution.md, "Why bytes
            ignored the hints". The vocabulary of :class:`ServiceBytesKey`'s
            ``client_kind``, of which only these two are judged.
    """

    namespace: str
    service: str
    client_zone: str
    server_zone: str
    client_node: str = "unknown"
    client_kind: str = "pod"


@dataclass(frozen=True, slots=True, order=True)
class ClientPathKey:
    """Labels of ``zonemeter_service_client_path_bytes_total``: how this node's pods reached
    a Service that kube-proxy on this node filters by topology (the client's node's
    evidence for why bytes ignored the hints; docs/attribution.md).

    Attributes:
        namespace, service: the Service.
        client_node: this node (the agent's own), so the series joins the hint-ignored
            series on ``client_node``.
        path: ``clusterip`` (a pod dialled a Service address: ClusterIP, NodePort,
            externalIP or LoadBalancer IP; the node's data plane picked the endpoint) or
            ``direct`` (a pod dialled an endpoint address that kube-proxy on this node
            would not select: the client chose the endpoint itself).
    """

    namespace: str
    service: str
    client_node: str
    path: str


@dataclass(frozen=True, slots=True, order=True)
class WorkloadBytesKey:
    """Labels of ``zonemeter_workload_bytes_total`` (non-Service traffic of a local pod).

    Attributes:
        namespace, workload, workload_kind: the local pod's owner (``unknown`` when the
            pod is not in the cache).
        client_zone: the local pod's zone (this node's zone).
        remote_zone: the peer's zone, ``unknown`` when missing.
        remote_kind: ``pod``, ``node``, ``load-balancer``, ``cidr``, ``external`` or
            ``unknown`` (the client classes' vocabulary, docs/attribution.md).
        crossing: same_node, same_zone, cross_zone, cross_region, external, unknown.
        direction: ``egress`` (out of the local pod) or ``ingress`` (into it; only from
            non-pod peers, which no other agent sees).
    """

    namespace: str
    workload: str
    workload_kind: str
    client_zone: str
    remote_zone: str
    remote_kind: str
    crossing: str
    direction: str


@dataclass(frozen=True, slots=True, order=True)
class ServiceRef:
    """A Service by namespace and name (keys per-Service state: locality, diagnoses)."""

    namespace: str
    service: str


@dataclass(frozen=True, slots=True)
class Locality:
    """One Service's locality as the hint model derives it (read by the exporter).

    Attributes:
        mode: requested mode (hint-model vocabulary: ``none``, ``topology-mode``,
            ``PreferClose``, ``PreferSameZone``, ``PreferSameNode``,
            ``internalTrafficPolicy-Local``, ...).
        reason: why locality is off, ``none`` when in effect in every client zone.
        in_effect: client zone -> kube-proxy of that zone filters by topology
            (read-only mapping, sorted by zone).
        last_change: Unix time in seconds of the hint-model refresh at which
            ``(mode, reason, in_effect)`` last changed or was first seen.
        expected_cross_zone: client zone -> expected share (0..1) of that zone's ClusterIP
            calls that cross zones under today's hints (``ServiceDiagnosis.expected_cross_zone``;
            zones without a figure are absent; read-only mapping sorted by zone).
    """

    mode: str
    reason: str
    in_effect: Mapping[str, bool]
    last_change: float
    expected_cross_zone: Mapping[str, float] = field(default_factory=lambda: types.MappingProxyType({}))


# ------------------------------------------------------------------ attribution output
# Attribution produces these and the exporter serves them as they are (no copy between).


@dataclass(frozen=True, slots=True)
class PairRow:
    """One client -> server row of the ``/flows`` document and ``zonemeter top`` (both
    directions summed; never a Prometheus series: it names pods and addresses).

    Attributes:
        client, server: ``namespace/pod`` for pods, ``node/NAME`` for nodes and
            host-network pods, the address for other peers; ``other`` for the row that
            sums the pairs not listed.
        namespace, service: the Service, ``""`` for non-Service traffic.
        client_zone, server_zone, crossing: as in :class:`ServiceBytesKey`.
        bytes: L3 bytes in the interval the row covers (not cumulative).
        port: the Service port label (as in :class:`ServiceBytesKey`), ``""`` for
            non-Service traffic.
        client_kind: the client's class (as in :class:`ServiceBytesKey`; for non-Service
            rows the class of whichever side is the client), ``unknown`` for ``other``.
        lb_type: the client load balancer's type, ``none`` unless ``client_kind`` is
            ``load-balancer``.
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
    client_kind: str = "unknown"
    lb_type: str = "none"


def _read_only(value: Mapping[Any, Any]) -> Mapping[Any, Any]:
    return value if isinstance(value, types.MappingProxyType) else types.MappingProxyType(dict(value))


@dataclass(frozen=True, slots=True)
class CoverageState:
    """Hook coverage (:class:`agent.datapath.coverage.HookCoverage`): cumulative counters and
    the window ratio, for the exporter.

    Attributes:
        counted_bytes: L3 bytes our programs counted that the compared interfaces should
            have carried (veth hook: every byte, on the hooked veths; cgroup hook: bytes of
            peers off the node, which cross an uplink), in the intervals that had
            interface counters (cumulative).
        carried_bytes: L3 bytes the compared interfaces (the hooked veths, or the node's
            uplinks) carried in those intervals by their own counters (cumulative).
        unseen_bytes: per interval ``max(0, carried - counted)``, summed (cumulative): bytes
            the interfaces carried that no program of ours counted.
        ratio: counted / carried over the last ``WINDOW_SECONDS`` (300 s), NaN when the
            window carried fewer than ``MIN_CARRIED_BYTES`` (64 KiB; both in
            :mod:`agent.datapath.coverage`). Above 1 with GSO (we count each wire segment's
            headers, the device one super-packet).
        starved: ``ratio`` below ``STARVED_RATIO`` (0.5), or ``tcp_direction_ratio``
            below ``ONE_WAY_RATIO`` (0.001).
        tcp_direction_ratio: TCP packets counted in the less busy direction (into or out
            of local sockets and pods) over those of the busier one, in the same window;
            NaN below ``MIN_TCP_PACKETS`` (1,000). 0 when a data plane moves one direction
            past the hook (and past the devices' counters, so ``ratio`` cannot see it).
    """

    counted_bytes: int = 0
    carried_bytes: int = 0
    unseen_bytes: int = 0
    ratio: float = math.nan
    starved: bool = False
    tcp_direction_ratio: float = math.nan


@dataclass(frozen=True, slots=True)
class AttributionTotals:
    """Immutable copy of one node's cumulative attribution totals (all bytes are L3 bytes).

    Produced by :meth:`agent.attribution.Attributor.totals`, served by
    :class:`agent.exporter.Exporter` (docs/metrics.md says where each byte goes). Every
    counter is cumulative since the Attributor was created and never decreases. Per node,
    ``bytes_seen == sum(service_bytes) + sum(workload_bytes) + sum(unattributed_bytes) +
    sum(skipped_bytes) + sum(service_entry_bytes) + held_bytes`` (plus the expired bytes,
    see ``expired_bytes``).
    Mapping fields are read-only (copied into one on construction unless they already are).

    Attributes:
        node: the node the Attributor runs on.
        service_bytes: ``Mapping[ServiceBytesKey, int]`` bytes.
        hint_ignored_bytes: ``Mapping[HintIgnoredKey, int]`` bytes (a subset of service_bytes).
        client_path_bytes: ``Mapping[ClientPathKey, int]`` bytes of this node's pods' own
            copies of Service traffic, by path (a subset of ``skipped_bytes`` and
            ``service_bytes``: evidence, never billed again).
        workload_bytes: ``Mapping[WorkloadBytesKey, int]`` bytes of non-Service traffic.
        service_entry_bytes: ``Mapping[ServiceBytesKey, int]``: the first hop of node ports
            counted on this node's uplinks (a load balancer or another client off the node
            to a node port, LoadBalancer IP or externalIP of a Service with
            ``externalTrafficPolicy: Cluster``); ``server_zone`` is this node's. A hop of
            its own beside ``service_bytes``, whose endpoint counts the next hop
            (docs/attribution.md, "Two hops of NodePort and LoadBalancer traffic").
        unattributed_bytes: ``Mapping[reason, int]``: bytes in no other series
            (``flow_table_full``, ``endpoint_without_service``, ``entry_without_service``,
            ``attribution_error``).
        unknown_crossing_bytes: ``Mapping[reason, int]``: bytes of service/entry/workload
            series whose crossing is ``unknown``, by why (a subset of those series).
        skipped_bytes: ``Mapping[reason, int]``: client-side copies not counted here
            because another veth counts them (not part of any series).
        diagnostics_bytes: ``Mapping[name, int]``: counted bytes worth a look
            (``ambiguous_service``, ``hint_check_client_node_unknown``,
            ``flow_table_full_unfiltered``, ``hold_full``, ``endpoint_not_in_kernel``).
        bytes_seen: every byte of every delta given to the Attributor.
        deltas_seen: number of deltas given, ``invalid_deltas`` those with negative bytes
            (ignored).
        held_bytes: bytes held for a later retry (``hold_unresolved_seconds``), in no
            series yet (a gauge: it goes down when they are counted).
        top_pairs: the heaviest pairs of the last closed interval, bytes descending, then
            one ``other`` row for the rest (absent when nothing was left over).
        top_interval: ``(start, end)`` Unix seconds of that interval, or None before the first.
        series_expired: ``Mapping[family, int]``: series dropped by expiry, per exported
            metric name (``agent.attribution.EXPIRY_FAMILIES``; the Attributor lists every
            family, 0 when none expired).
        expired_bytes: ``Mapping[family, int]``: bytes those series held when they were
            dropped (cumulative). With expiry the per-node sum reads ``bytes_seen ==
            sum(service_bytes) + sum(workload_bytes) + sum(unattributed_bytes) +
            sum(skipped_bytes) + sum(service_entry_bytes) + held_bytes +
            expired_bytes[service family] + expired_bytes[workload family] +
            expired_bytes[entry family]`` (hint-ignored bytes are a subset of service bytes,
            expired or not).
    """

    node: str = ""
    service_bytes: Mapping[ServiceBytesKey, int] = field(default_factory=dict)
    hint_ignored_bytes: Mapping[HintIgnoredKey, int] = field(default_factory=dict)
    client_path_bytes: Mapping[ClientPathKey, int] = field(default_factory=dict)
    workload_bytes: Mapping[WorkloadBytesKey, int] = field(default_factory=dict)
    service_entry_bytes: Mapping[ServiceBytesKey, int] = field(default_factory=dict)
    unattributed_bytes: Mapping[str, int] = field(default_factory=dict)
    unknown_crossing_bytes: Mapping[str, int] = field(default_factory=dict)
    skipped_bytes: Mapping[str, int] = field(default_factory=dict)
    diagnostics_bytes: Mapping[str, int] = field(default_factory=dict)
    bytes_seen: int = 0
    deltas_seen: int = 0
    invalid_deltas: int = 0
    held_bytes: int = 0
    top_pairs: tuple[PairRow, ...] = ()
    top_interval: tuple[float, float] | None = None
    series_expired: Mapping[str, int] = field(default_factory=dict)
    expired_bytes: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Mapping) and not isinstance(value, types.MappingProxyType):
                object.__setattr__(self, f.name, _read_only(value))
        if not isinstance(self.top_pairs, tuple):
            object.__setattr__(self, "top_pairs", tuple(self.top_pairs))

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-ready form (debugging and tests).

        Returns:
            ``{"node", "bytes_seen", "deltas_seen", "invalid_deltas", "held_bytes",
            "service_bytes": [{key fields..., "bytes"}], "hint_ignored_bytes": [...],
            "client_path_bytes": [...], "workload_bytes": [...], "service_entry_bytes": [...],
            "unattributed_bytes": {reason: bytes},
            "unknown_crossing_bytes": {...}, "skipped_bytes": {...},
            "diagnostics_bytes": {...}, "top_pairs": [...], "top_interval": [start, end] |
            None, "series_expired": {family: series}, "expired_bytes": {family: bytes}}``;
            rows sorted by their key, bytes are ints.
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
            "client_path_bytes": rows(self.client_path_bytes),
            "workload_bytes": rows(self.workload_bytes),
            "service_entry_bytes": rows(self.service_entry_bytes),
            "unattributed_bytes": dict(sorted(self.unattributed_bytes.items())),
            "unknown_crossing_bytes": dict(sorted(self.unknown_crossing_bytes.items())),
            "skipped_bytes": dict(sorted(self.skipped_bytes.items())),
            "diagnostics_bytes": dict(sorted(self.diagnostics_bytes.items())),
            "top_pairs": [{f: getattr(p, f) for f in p.__slots__} for p in self.top_pairs],
            "top_interval": list(self.top_interval) if self.top_interval else None,
            "series_expired": dict(sorted(self.series_expired.items())),
            "expired_bytes": dict(sorted(self.expired_bytes.items())),
        }
