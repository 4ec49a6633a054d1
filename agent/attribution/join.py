"""The join: flow deltas x metadata x hint state -> cumulative byte totals (the hot loop).

Each node's agent feeds the :class:`agent.records.FlowDelta` records its datapath drained
into one :class:`Attributor`, which keeps, drops or re-labels each delta so that the sum
over all agents counts every byte once (the exactly-once rule: docs/attribution.md, "The
rule table"; :func:`agent.attribution.counted_here`). Per delta kind:

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
  - anything else (node, load balancer, CIDR, external): both directions are kept.

Service ambiguity: an endpoint ``(address, port, protocol)`` that backs several Service
ports is attributed to the first by ``(namespace, service, port, port_name)`` and counted
once; the bytes also go to the diagnostic ``ambiguous_service``.

Hint-ignored bytes (docs/attribution.md, "Hint-ignored bytes"): Service bytes (both
directions) whose client is a pod or node on node N, when kube-proxy on N filters by
topology for that Service (``ProxyView.topology_mode != ""``, kube-proxy
``pkg/proxy/topology.go`` ``CategorizeEndpoints``) and the server endpoint is not in the
set N selects. The server cannot tell a client that went through the ClusterIP from one
that dialled the pod address directly, so clients that bypass the ClusterIP count too.

Series of deleted objects expire after ``series_retention`` (:mod:`agent.attribution.expiry`).
Locality state is not attribution's: the hint model owns it (``HintModel.localities()``).
"""

from __future__ import annotations

import dataclasses
import heapq
import ipaddress
import logging
import socket
import time
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from agent.attribution.expiry import ObjectView, SeriesExpiry
from agent.attribution.vocabulary import (
    D_AMBIGUOUS_SERVICE,
    D_HINT_CHECK_NO_CLIENT_NODE,
    D_HOLD_FULL,
    D_LATE_ENDPOINT,
    D_OVERFLOW_UNFILTERED,
    DEFAULT_REASON,
    EXPIRY_FAMILIES,
    FAMILY_CLIENT_PATH,
    FAMILY_HINT_IGNORED,
    FAMILY_SERVICE,
    FAMILY_SERVICE_ENTRY,
    FAMILY_WORKLOAD,
    K_NODE,
    K_POD,
    NO_LB,
    P_CLUSTERIP,
    P_DIRECT,
    R_ATTRIBUTION_ERROR,
    R_CLUSTERIP_TO_HOST_NETWORK,
    R_ENDPOINT_WITHOUT_SERVICE,
    R_ENTRY_WITHOUT_SERVICE,
    R_FLOW_TABLE_FULL,
    R_NODE_WITHOUT_ZONE,
    S_CLUSTERIP_CLIENT_COPY,
    S_CLUSTERIP_MIXED_HOST_NETWORK,
    S_ENDPOINT_CLIENT_COPY,
    S_ENTRY_ENDPOINT_COPY,
    S_POD_PEER_INGRESS,
    UNKNOWN,
    counted_here,
    lb_label,
    peer_class,
)
from agent.attribution.vocabulary import crossing as _crossing
from agent.errors import ZonemeterError
from agent.logs import LogOnce
from agent.records import (
    AttributionTotals,
    ClientPathKey,
    FlowDelta,
    FlowKind,
    HintIgnoredKey,
    IPAddress,
    PairRow,
    Peer,
    PeerKind,
    ProxyView,
    ServiceBytesKey,
    ServicePort,
    WorkloadBytesKey,
)

_log = logging.getLogger(__name__)

__all__ = ["HINT_IGNORED_NODES", "HOSTNET_TTL", "LOOKUP_ERRORS", "Attributor", "HintView", "MetadataView"]

#: seconds a "do this Service's selected endpoints lack a veth?" decision is reused across
#: drains (only decisions in which every endpoint resolved; see _clusterip_hostnet)
HOSTNET_TTL = 300.0

#: endpoint address texts whose parsed form is kept across drains (see _hostnet_decide)
PARSED_MAX = 1 << 16
_NOT_PARSED: Any = object()

#: distinct ``client_node`` values of one Service's hint-ignored series on one agent; the
#: bytes of further client nodes go to ``client_node="other"`` (docs/metrics.md, Series count)
HINT_IGNORED_NODES = 16
OTHER_NODE = "other"

#: what a metadata or hint view raises when its data is unavailable or inconsistent for a
#: moment (an index rebuilt under a lookup, a restarting cache, an API call that failed):
#: the delta is counted as ``attribution_error`` and the batch goes on. Anything else (a
#: TypeError, an AttributeError) is a bug and propagates to the agent loop.
LOOKUP_ERRORS: tuple[type[Exception], ...] = (LookupError, OSError, RuntimeError, ValueError,
                                              ZonemeterError)


class MetadataView(Protocol):
    """What attribution reads from the Kubernetes metadata (``agent.k8s.MetadataAdapter``).

    Implementations must be cheap (dict lookups): :meth:`Attributor.attribute` calls
    them per distinct address and endpoint in each batch. Optional, used when present
    (``agent.k8s.MetadataAdapter`` has both): ``resolve_veth(ip, ifindex, at, final) ->
    (Peer, settled)`` for local addresses, and ``endpoint_gone(ip, port, protocol) ->
    bool``, True when :meth:`endpoint_services` answers from the grace after the
    endpoint's slices dropped it (its bytes are then not judged hint-ignored).
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

    # Optional: ``resolve_host_port(ip, port, protocol) -> Peer | None``, the pod that
    # serves a node address's port, host-network or through a hostPort
    # (``MetadataAdapter.resolve_host_port``); a view without it leaves node addresses as
    # ``node/NAME``. ``host_port_target(ip, port, protocol) -> (address, port) | None``:
    # where a hostPort's DNAT leads (the pod's address and containerPort), so a hostPort
    # call to a Service endpoint is skipped as the endpoint's copy. ``is_entry_point(ip, port,
    # protocol) -> bool``: a node's address with a node port of a Service with
    # externalTrafficPolicy Cluster, whose first hop that node's uplink counts.



class HintView(Protocol):
    """What attribution reads from the hint model (``agent.hints.HintModel``)."""

    def proxy_view(self, namespace: str, service: str, node: str) -> ProxyView | None:
        """What kube-proxy on ``node`` does with the Service's ClusterIP traffic.

        Returns:
            The view (kube-proxy ``pkg/proxy/topology.go`` ``CategorizeEndpoints``), or None
            when the Service or node is unknown to the model.
        """
        ...


#: kinds of addresses outside the cluster: no agent sees their side
_OUTSIDE = frozenset({PeerKind.CIDR, PeerKind.LOAD_BALANCER, PeerKind.EXTERNAL})
#: series_expired / expired_bytes when expiry is off: every family, none expired
_NONE_EXPIRED: Mapping[str, int] = types.MappingProxyType({f: 0 for f in EXPIRY_FAMILIES})


def _ro(d: Mapping[str, int]) -> Mapping[str, int]:
    return types.MappingProxyType(dict(d))


def _count(value: object) -> int:
    """``value`` as a byte or event count (a non-negative int; bool refused).

    Raises:
        ValueError: anything else.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"count {value!r} is not a non-negative integer")
    return value


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


def _endpoint_address(text: str) -> IPAddress | None:
    """``ip_address(_canonical(text))``, or None when ``text`` is no address. A canonical
    dotted quad (most EndpointSlice addresses) is read by ``inet_pton``, which refuses
    leading zeros and short forms (glibc ``inet_pton4``), several times faster; anything
    else takes the ipaddress path."""
    try:
        return ipaddress.IPv4Address(socket.inet_pton(socket.AF_INET, text))
    except OSError:
        pass
    try:
        return ipaddress.ip_address(_canonical(text))
    except ValueError:
        return None


def _link_scope(ip: IPAddress) -> bool:
    """``ip.is_link_local or ip.is_multicast or ip.is_unspecified``; for IPv4 by its integer
    (169.254.0.0/16, 224.0.0.0/4, 0.0.0.0: RFC 3927, RFC 5771), about five times faster
    than the three ``ipaddress`` properties, which test network membership."""
    if isinstance(ip, ipaddress.IPv4Address):
        v: int = ip._ip  # type: ignore[attr-defined]
        return v >> 16 == 0xA9FE or v >> 28 == 0xE or v == 0
    return ip.is_link_local or ip.is_multicast or ip.is_unspecified


def _ikey(ip: IPAddress) -> int:
    """A cheap hash key for an address (``ipaddress`` hashes in Python, about 0.5 us).

    IPv4 addresses map to their integer value, IPv6 ones to its bitwise complement
    (negative), so the two families never collide.
    """
    return ip._ip if isinstance(ip, ipaddress.IPv4Address) else ~ip._ip  # type: ignore[attr-defined,no-any-return]


# Records of the hot loop. Plain tuples with the field names below, built once per distinct
# address (or endpoint, or remote) per drain and unpacked into named locals per delta:
# named classes (NamedTuple, slotted dataclasses) cost 8-14% of attribute() throughput
# (bench/bench_attribution.py, docs/attribution.md "Performance").

#: a Service port as counted: (namespace, service, port label, ambiguous: every other
#: (namespace, service) the endpoint backs, empty when none (truthy when the endpoint
#: backs several Service ports)
_Svc = tuple[str, str, str, tuple[tuple[str, str], ...]]
_NOT_CACHED: _Svc = ("", "", "", ())  # cache-miss sentinel, compared by identity
#: a local endpoint: (its Service, its pair label, hint-ignored by client node name)
_Ep = tuple[_Svc, str, dict[str, bool]]
_NOT_CACHED_EP: _Ep = (_NOT_CACHED, "", {})
#: the client of a REQUEST/RESPONSE delta: (client_zone label, crossing, unknown-crossing
#: reason or None, client node for the hint check or None, hint check applies, pair label,
#: unresolved, client class (``CLIENT_KINDS``), its ``lb_type`` label)
_Client = tuple[str, str, str | None, str | None, bool, str, bool, str, str]
#: an EGRESS/INGRESS remote, tagged by its first item:
#: (_SKIP, skipped reason, unsettled: decided on endpoints that did not all resolve,
#: client path key (namespace, service, this node, path) or None)
_SKIP = 0
#: (_SERVER_SIDE, svc, server_zone label, crossing, reason, hint-ignored, pair label,
#: client path key or None): Service traffic counted at the client (the endpoint has no veth)
_SERVER_SIDE = 1
#: (_PEER_SIDE, remote_zone label, remote_kind, crossing, reason, INGRESS counted here
#: (``counted_here(INGRESS, ...)``), pair label, unresolved, remote ``lb_type`` label):
#: non-Service traffic
_PEER_SIDE = 2
_Remote = tuple[Any, ...]
#: a local pod: (namespace, workload, workload_kind, pair label, unresolved, its class
#: ``pod``/``node``/``unknown`` as a client)
_Local = tuple[str, str, str, str, bool, str]


class _NotJudged(dict[str, bool]):
    """The hint-check cache of an endpoint that is not judged: never hint-ignored."""

    def get(self, key: str, default: object = None) -> bool:
        return False


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
    locals: dict[int, _Local] = field(default_factory=dict)
    labels: dict[int, str] = field(default_factory=dict)
    views: dict[tuple[str, str, str], ProxyView | None] = field(default_factory=dict)
    hostnet: dict[tuple[str, str], tuple[str, Peer | None, bool]] = field(default_factory=dict)
    #: (namespace, service, remote key, kind) -> bytes local endpoints exchanged with that
    #: client in this drain, request or response: that much of an entry hop from the same
    #: client to the same Service is the endpoint's own hop (_count_entries)
    ep_clients: dict[tuple[str, str, int, FlowKind], int] = field(default_factory=dict)
    #: entry (address key, port, protocol) -> its Service port or None
    entries: dict[tuple[int, int, int], ServicePort | None] = field(default_factory=dict)


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
            or ``series_retention``, a non-finite ``hold_unresolved_seconds``,
            ``pair_capacity`` < 1, or ``series_retention`` > 0 without an :class:`ObjectView`.
    """

    def __init__(self, node: str, metadata: MetadataView, hints: HintView, *,
                 top_n: int = 50, pair_capacity: int = 65536,
                 hold_unresolved_seconds: float = 0.0, hold_capacity: int = 100_000,
                 series_retention: float = 0.0, objects: ObjectView | None = None,
                 clock: Callable[[], float] = time.monotonic, sockets_seen: bool = False) -> None:
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
        self._expiry = (SeriesExpiry(float(series_retention), objects, clock)
                        if series_retention > 0 and objects is not None else None)
        self._hold_s = hold_unresolved_seconds
        self._hold_capacity = hold_capacity
        self._pending: list[tuple[float, list[FlowDelta]]] = []
        self._held_bytes = 0
        self.node = node
        self._meta = metadata
        self._host_port: Callable[[IPAddress, int, int], Peer | None] | None = getattr(
            metadata, "resolve_host_port", None)
        self._host_port_target: Callable[[IPAddress, int, int], tuple[IPAddress, int] | None] | None = (
            getattr(metadata, "host_port_target", None))
        self._is_entry_point: Callable[[IPAddress, int, int], bool] | None = getattr(
            metadata, "is_entry_point", None)
        # every node counts at its sockets (the cgroup hook): host-network and node sides
        # are seen at their own node too (docs/attribution.md, "The socket view")
        self._sockets_seen = sockets_seen
        # optional: resolves a local address by the veth its bytes crossed (IP reuse)
        self._resolve_veth: Callable[[IPAddress, int, float, bool], tuple[Peer, bool]] | None = (
            getattr(metadata, "resolve_veth", None))
        # optional: the endpoint is answered from the grace after its slices dropped it
        self._endpoint_gone: Callable[[IPAddress, int, int], bool] | None = (
            getattr(metadata, "endpoint_gone", None))
        self._hints = hints
        self._top_n = top_n
        self._pair_capacity = pair_capacity
        # cumulative counters, keyed by plain tuples on the hot path
        self._service: dict[tuple[str, str, str, str, str, str, str, str, str], int] = {}
        self._ignored: dict[tuple[str, str, str, str, str, str], int] = {}
        # (the series dict, its size, (namespace, service) -> client nodes) for _ignored_key
        self._ignored_nodes: tuple[dict[Any, int], int, dict[tuple[str, str], set[str]]] | None = None
        self._paths: dict[tuple[str, str, str, str], int] = {}
        self._workload: dict[tuple[str, str, str, str, str, str, str, str], int] = {}
        self._entry: dict[tuple[str, str, str, str, str, str, str, str, str], int] = {}
        self._unattributed: dict[str, int] = {}
        self._unknown: dict[str, int] = {}
        self._skipped: dict[str, int] = {}
        self._diag: dict[str, int] = {}
        self._bytes_seen = 0
        self._deltas_seen = 0
        self._invalid = 0
        self._once = LogOnce(_log)
        # tuple -> frozen key, so totals() allocates each key object once
        self._service_keys: dict[tuple[str, ...], ServiceBytesKey] = {}
        self._ignored_keys: dict[tuple[str, ...], HintIgnoredKey] = {}
        self._path_keys: dict[tuple[str, ...], ClientPathKey] = {}
        self._workload_keys: dict[tuple[str, ...], WorkloadBytesKey] = {}
        self._entry_keys: dict[tuple[str, ...], ServiceBytesKey] = {}
        # per-interval pairs
        self._pairs: dict[tuple[str, str, str, str, str, str, str, str, str, str], int] = {}
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
        # selected endpoint address text -> (address, _ikey) or None (not an address):
        # parsing took two ipaddress calls per endpoint of every decision
        self._parsed: dict[str, tuple[IPAddress, int] | None] = {}

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
            except LOOKUP_ERRORS as err:  # a node without zone, rather than losing the batch
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
        service, workload, ignored, paths = self._service, self._workload, self._ignored, self._paths
        node = self.node
        unknown, diag, skipped = self._unknown, self._diag, self._skipped
        pairs, cap = self._pairs, self._pair_capacity
        v4 = ipaddress.IPv4Address
        held: list[FlowDelta] = []
        room = 0 if final else self._hold_capacity - self._held_count()
        seen = 0
        n = 0
        entries: list[FlowDelta] = []  # first hops of node ports, decided after the loop
        ep_clients = b.ep_clients
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
                hook = d.ifindex
                # the local side on its veth: unique, since an ifindex is a u32 (lk of
                # IPv6 is negative: its low 32 bits are zero after the shift all the same)
                hk = (lk << 32) | hook
                late = False
                if lp and (kind is request or kind is response):
                    # an uplink's count of the first hop of a node port (bpf/uplink.h):
                    # decided once every local endpoint of this batch said which clients
                    # it saw itself
                    entries.append(d)
                    continue
                if lp and kind is not request and kind is not response and (
                        kind is not egress or lp != port):
                    # the kernel's endpoint set lacked (local, lp): a pod traffic delta
                    # from the server side; it is Service traffic if the metadata now
                    # lists the endpoint (the client side skips it as a copy either way).
                    # Leaving from lp to the same port is a peer's request, as the kernel
                    # rules for known endpoints (bpf/classify.h): not promoted
                    ek = (hk, lp, d.protocol)
                    ep = local_eps.get(ek, _NOT_CACHED_EP)
                    if ep is _NOT_CACHED_EP:
                        ep = local_eps[ek] = self._local_endpoint(b, local, lk, hook, ek, final)
                    if ep is not None:
                        kind = request if kind is FlowKind.INGRESS else response
                        port = lp
                        late = True
                if kind is request or kind is response:
                    ek = (hk, port, d.protocol)
                    ep = local_eps.get(ek, _NOT_CACHED_EP)
                    if ep is _NOT_CACHED_EP:
                        ep = local_eps[ek] = self._local_endpoint(b, local, lk, hook, ek, final)
                    if ep is None:
                        self._add(self._unattributed, R_ENDPOINT_WITHOUT_SERVICE, nb)
                        continue
                    svc, slabel, ig_by_node = ep
                    cl = clients.get(rk)
                    if cl is None:
                        cl = clients[rk] = self._client(b, remote, rk)
                    czl, crossing, reason, cnode, check, clabel, unresolved, ckind, clb = cl
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
                    ns, sname, sport, ambiguous = svc
                    key = (ns, sname, sport, czl, szl, crossing,
                           "request" if kind is request else "response", ckind, clb)
                    service[key] = service.get(key, 0) + nb
                    ck = (ns, sname, rk, kind)
                    ep_clients[ck] = ep_clients.get(ck, 0) + nb
                    for ons, osvc in ambiguous:  # an entry of any Service it backs is this hop
                        ok = (ons, osvc, rk, kind)
                        ep_clients[ok] = ep_clients.get(ok, 0) + nb
                    if late:
                        diag[D_LATE_ENDPOINT] = diag.get(D_LATE_ENDPOINT, 0) + nb
                    if reason is not None:
                        unknown[reason] = unknown.get(reason, 0) + nb
                    if ambiguous:
                        diag[D_AMBIGUOUS_SERVICE] = diag.get(D_AMBIGUOUS_SERVICE, 0) + nb
                    if ig:
                        ikey = (ns, sname, czl, szl, cnode or UNKNOWN, ckind)
                        v = ignored.get(ikey)
                        if v is None:
                            ikey = self._ignored_key(ikey)
                            v = ignored.get(ikey, 0)
                        ignored[ikey] = v + nb
                    elif check and cnode is None:
                        diag[D_HINT_CHECK_NO_CLIENT_NODE] = diag.get(D_HINT_CHECK_NO_CLIENT_NODE, 0) + nb
                    pk = (clabel, slabel, ns, sname, czl, szl, crossing, sport, ckind, clb)
                else:
                    # EGRESS / INGRESS at a local pod
                    rkey = (rk, d.port, d.protocol)
                    r = remotes.get(rkey)
                    if r is None:
                        r = remotes[rkey] = self._remote(b, d, rk)
                    tag = r[0]
                    if tag == _SKIP:
                        _, skip_reason, unsettled, path = r
                        if unsettled and not final:  # endpoints not resolved yet: maybe no veth
                            if room > 0:
                                room -= 1
                                held.append(d)
                                continue
                            diag[D_HOLD_FULL] = diag.get(D_HOLD_FULL, 0) + nb
                        skipped[skip_reason] = skipped.get(skip_reason, 0) + nb
                        if path is not None:
                            paths[path] = paths.get(path, 0) + nb
                        continue
                    loc = locals_.get(hk)
                    if loc is None:
                        loc = locals_[hk] = self._local(b, local, lk, hook, final)
                    lns, lworkload, lkind, llabel, lunresolved, lclass = loc
                    if tag == _SERVER_SIDE:
                        _, svc, rzl, crossing, reason, ig, rlabel, path = r
                        runresolved = False
                    else:
                        _, rzl, rkind, crossing, reason, ingress_here, rlabel, runresolved, rlb = r
                    if not final and (lunresolved or (runresolved and kind is egress)):
                        if room > 0:
                            room -= 1
                            held.append(d)
                            continue
                        diag[D_HOLD_FULL] = diag.get(D_HOLD_FULL, 0) + nb
                    # from here on nothing calls out: counters move together
                    czl = szl
                    if tag == _SERVER_SIDE:
                        ns, sname, sport, ambiguous = svc
                        direction = "request" if kind is egress else "response"
                        # the client is the local side (a pod; with the socket view maybe
                        # the node itself)
                        key = (ns, sname, sport, czl, rzl, crossing, direction, lclass, NO_LB)
                        service[key] = service.get(key, 0) + nb
                        if ambiguous:
                            diag[D_AMBIGUOUS_SERVICE] = diag.get(D_AMBIGUOUS_SERVICE, 0) + nb
                        if ig:
                            ikey = (ns, sname, czl, rzl, node, K_NODE if lclass == K_NODE else K_POD)
                            v = ignored.get(ikey)
                            if v is None:
                                ikey = self._ignored_key(ikey)
                                v = ignored.get(ikey, 0)
                            ignored[ikey] = v + nb
                        if path is not None:
                            paths[path] = paths.get(path, 0) + nb
                        pk = (llabel, rlabel, ns, sname, czl, rzl, crossing, sport, lclass, NO_LB)
                    else:
                        if kind is not egress and not ingress_here:
                            skipped[S_POD_PEER_INGRESS] = skipped.get(S_POD_PEER_INGRESS, 0) + nb
                            continue
                        wkey = (lns, lworkload, lkind, czl, rzl, rkind, crossing,
                                "egress" if kind is egress else "ingress")
                        # one connection, one pair row whichever way its bytes go: the
                        # local pod is the server when its own port may be a server port
                        # and the remote's is ephemeral (0) or higher (docs/attribution.md,
                        # "Top pairs")
                        if lp and (not port or lp < port):
                            pk = (rlabel, llabel, "", "", rzl, czl, crossing, "", rkind, rlb)
                        else:
                            pk = (llabel, rlabel, "", "", czl, rzl, crossing, "", lclass, NO_LB)
                        workload[wkey] = workload.get(wkey, 0) + nb
                    if reason is not None:
                        unknown[reason] = unknown.get(reason, 0) + nb
            except LOOKUP_ERRORS as err:  # a metadata or hint view failed on this delta
                self._failed(err, nb)
                continue
            v = pairs.get(pk)
            if v is not None:
                pairs[pk] = v + nb
            elif len(pairs) < cap:
                pairs[pk] = nb
            else:
                self._pairs_other += nb
        if entries:
            room = self._count_entries(b, entries, final, room, held)
        self._bytes_seen += seen
        if fresh:
            self._deltas_seen += n
        if held:
            self._pending.append((at, held))
            self._held_bytes += sum(d.bytes for d in held)

    def _count_entries(self, b: _Batch, entries: list[FlowDelta], final: bool, room: int,
                       held: list[FlowDelta]) -> int:
        """Count the first hops of node ports an uplink of this node saw (``entries``:
        deltas with :attr:`agent.records.FlowDelta.is_entry`), after the batch's other
        deltas (docs/attribution.md, "Two hops of NodePort and LoadBalancer traffic").

        The entry ``(local, port, protocol)`` names the Service (a node address on a
        nodePort, a LoadBalancer IP or externalIP on its port: ``MetadataView.service_address``);
        the remote is the client, classed as a Service client is, and this node is the
        server side (its zone). When a local endpoint of the same Service exchanged bytes
        with the same client address in this drain, that share of the hop was not
        masqueraded to the endpoint (a data plane without SNAT to local endpoints, Cilium's
        kube-proxy replacement): the endpoint's count is that hop already, so as many of
        the uplink's bytes, per direction, are skipped (``entry_endpoint_copy``; NAT keeps
        every packet's length) and the rest, the first hop of connections sent to other
        nodes, is counted. Unresolved clients are held like any delta.

        Returns:
            the hold room left.
        """
        v4 = ipaddress.IPv4Address
        request = FlowKind.REQUEST
        szl = b.oz or UNKNOWN
        for d in entries:
            nb = d.bytes
            try:
                local, remote = d.local, d.remote
                lk = local._ip if isinstance(local, v4) else ~local._ip  # type: ignore[attr-defined]
                rk = remote._ip if isinstance(remote, v4) else ~remote._ip  # type: ignore[attr-defined]
                ek = (lk, d.port, d.protocol)
                if ek in b.entries:
                    sa = b.entries[ek]
                else:
                    sa = b.entries[ek] = self._meta.service_address(local, d.port, d.protocol)
                if sa is None:
                    self._add(self._unattributed, R_ENTRY_WITHOUT_SERVICE, nb)
                    continue
                ck = (sa.namespace, sa.service, rk, d.kind)
                seen = b.ep_clients.get(ck, 0)
                if seen:
                    take = min(seen, nb)
                    b.ep_clients[ck] = seen - take  # each endpoint byte stands for one copy
                    self._add(self._skipped, S_ENTRY_ENDPOINT_COPY, take)
                    nb -= take
                    if not nb:
                        continue
                    d = dataclasses.replace(d, bytes=nb)
                cl = b.clients.get(rk)
                if cl is None:
                    cl = b.clients[rk] = self._client(b, remote, rk)
                czl, crossing, reason, _, _, clabel, unresolved, ckind, clb = cl
                if unresolved and not final:
                    if room > 0:
                        room -= 1
                        held.append(d)
                        continue
                    self._add(self._diag, D_HOLD_FULL, nb)
                sport = str(sa.port)
                key = (sa.namespace, sa.service, sport, czl, szl, crossing,
                       "request" if d.kind is request else "response", ckind, clb)
                self._entry[key] = self._entry.get(key, 0) + nb
                if reason is not None:
                    self._add(self._unknown, reason, nb)
            except LOOKUP_ERRORS as err:
                self._failed(err, nb)
                continue
            pk = (clabel, f"node/{self.node}", sa.namespace, sa.service, czl, szl, crossing,
                  sport, ckind, clb)
            v = self._pairs.get(pk)
            if v is not None:
                self._pairs[pk] = v + nb
            elif len(self._pairs) < self._pair_capacity:
                self._pairs[pk] = nb
            else:
                self._pairs_other += nb
        return room

    def _held_count(self) -> int:
        return sum(len(h) for _, h in self._pending)

    def close_interval(self, at: float) -> None:
        """End the current interval: publish its top pairs, then run an expiry sweep when
        ``series_retention`` is set (see :meth:`expire_series`).

        Args:
            at: Unix time in seconds of the interval end.
        """
        start = self._interval_start if self._interval_start is not None else at
        top = heapq.nsmallest(self._top_n, self._pairs.items(), key=lambda kv: (-kv[1], kv[0]))
        rows = [PairRow(*k[:7], bytes=v, port=k[7], client_kind=k[8], lb_type=k[9]) for k, v in top]
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
        if self._expiry is not None:
            self.expire_series()

    def expire_series(self) -> int:
        """Run an expiry sweep now, unless one ran less than ``series_retention *
        SWEEP_FRACTION`` seconds ago (:meth:`close_interval` calls it every interval).

        A series is dropped when, at this sweep, it has not changed since a sweep at least
        ``series_retention`` seconds ago and its object is gone (see
        :class:`agent.attribution.expiry.SeriesExpiry`). Never raises for a failing
        ``objects`` view: nothing of that family is dropped this time.

        Returns:
            number of series dropped (0 when expiry is off or the sweep was skipped).
        """
        if self._expiry is None:
            return 0
        return self._expiry.sweep((
            (FAMILY_SERVICE, self._service, self._service_keys, 2),
            (FAMILY_HINT_IGNORED, self._ignored, self._ignored_keys, 2),
            (FAMILY_CLIENT_PATH, self._paths, self._path_keys, 2),
            (FAMILY_WORKLOAD, self._workload, self._workload_keys, 3),
            (FAMILY_SERVICE_ENTRY, self._entry, self._entry_keys, 2)))

    def totals(self) -> AttributionTotals:
        """Return an immutable copy of the cumulative totals (see :class:`AttributionTotals`)."""
        exp = self._expiry
        return AttributionTotals(
            node=self.node,
            service_bytes=self._keyed(self._service, self._service_keys, ServiceBytesKey),
            hint_ignored_bytes=self._keyed(self._ignored, self._ignored_keys, HintIgnoredKey),
            client_path_bytes=self._keyed(self._paths, self._path_keys, ClientPathKey),
            workload_bytes=self._keyed(self._workload, self._workload_keys, WorkloadBytesKey),
            service_entry_bytes=self._keyed(self._entry, self._entry_keys, ServiceBytesKey),
            unattributed_bytes=_ro(self._unattributed),
            unknown_crossing_bytes=_ro(self._unknown),
            skipped_bytes=_ro(self._skipped),
            diagnostics_bytes=_ro(self._diag),
            bytes_seen=self._bytes_seen,
            deltas_seen=self._deltas_seen,
            invalid_deltas=self._invalid,
            held_bytes=self._held_bytes,
            top_pairs=self._top,
            top_interval=self._top_interval,
            series_expired=_ro(exp.expired if exp else _NONE_EXPIRED),
            expired_bytes=_ro(exp.expired_bytes if exp else _NONE_EXPIRED),
        )

    def state(self) -> dict[str, Any]:
        """The cumulative state a checkpoint keeps (:mod:`agent.checkpoint`), JSON-ready.

        Returns:
            ``{"service": [[namespace, service, ..., bytes], ...], "ignored": [...],
            "workload": [...], "unattributed"|"unknown"|"skipped"|"diag": {reason: bytes},
            "bytes_seen", "deltas_seen", "invalid": int, "expired", "expired_bytes":
            {family: int}, "held": [[drain at (Unix s), [[kind, local, remote, port,
            local_port, protocol, bytes, packets, overflow], ...]], ...]}``. Bounded by the
            live series (expiry) and ``hold_capacity`` held deltas. Per-interval state
            (top pairs) and lookup caches are not kept.
        """
        exp = self._expiry
        return {
            "service": [[*k, v] for k, v in self._service.items()],
            "ignored": [[*k, v] for k, v in self._ignored.items()],
            "paths": [[*k, v] for k, v in self._paths.items()],
            "workload": [[*k, v] for k, v in self._workload.items()],
            "entry": [[*k, v] for k, v in self._entry.items()],
            "unattributed": dict(self._unattributed), "unknown": dict(self._unknown),
            "skipped": dict(self._skipped), "diag": dict(self._diag),
            "bytes_seen": self._bytes_seen, "deltas_seen": self._deltas_seen,
            "invalid": self._invalid,
            "expired": dict(exp.expired) if exp else {},
            "expired_bytes": dict(exp.expired_bytes) if exp else {},
            "held": [[at, [[d.kind.value, str(d.local), str(d.remote), d.port, d.local_port,
                            d.protocol, d.bytes, d.packets, d.overflow] for d in ds]]
                     for at, ds in self._pending],
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Replace the cumulative state with ``state`` (what :meth:`state` returned in a
        previous process), so counters continue where they were.

        Raises:
            ValueError: ``state`` is malformed (a missing field, a key of the wrong width,
                a negative or non-integer count, a bad address); nothing is changed then.
        """
        try:
            def series(name: str, width: int, old: int | None = None) -> dict[Any, int]:
                out: dict[Any, int] = {}
                for row in state.get(name, ()) if old is not None else state[name]:
                    if old is not None and len(row) == old + 1:
                        # a row of an older checkpoint: labels it lacked are unknown
                        row = [*row[:old], *([UNKNOWN] * (width - old)), row[old]]
                    if len(row) != width + 1 or not all(isinstance(x, str) for x in row[:width]):
                        raise ValueError(f"{name}: a row is not {width} labels and bytes")
                    out[tuple(row[:width])] = _count(row[width])
                return out

            def reasons(name: str) -> dict[str, int]:
                return {str(k): _count(v) for k, v in dict(state[name]).items()}

            # rows of a checkpoint from before client classes: client_kind and lb_type
            # "unknown" (the class of those bytes was not recorded)
            service, ignored, workload = (series("service", 9, 7), series("ignored", 6, 4),
                                          series("workload", 8))
            paths = series("paths", 4, 4)
            entry = series("entry", 9, 9)  # absent from checkpoints before entry hops
            maps = {n: reasons(n) for n in ("unattributed", "unknown", "skipped", "diag",
                                            "expired", "expired_bytes")}
            counts = [_count(state[n]) for n in ("bytes_seen", "deltas_seen", "invalid")]
            held: list[tuple[float, list[FlowDelta]]] = []
            for at, rows in state["held"]:
                held.append((float(at), [FlowDelta(FlowKind(k), ipaddress.ip_address(lo),
                                                   ipaddress.ip_address(re), int(p), int(pr),
                                                   _count(nb), _count(npk), bool(ov), int(lp))
                                         for k, lo, re, p, lp, pr, nb, npk, ov in rows]))
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise ValueError(f"attribution state: {err}") from err
        self._service, self._ignored, self._workload = service, ignored, workload
        self._paths, self._path_keys = paths, {}
        self._entry, self._entry_keys = entry, {}
        self._service_keys, self._ignored_keys, self._workload_keys = {}, {}, {}
        self._unattributed, self._unknown = maps["unattributed"], maps["unknown"]
        self._skipped, self._diag = maps["skipped"], maps["diag"]
        self._bytes_seen, self._deltas_seen, self._invalid = counts
        self._pending = held
        self._held_bytes = sum(d.bytes for _, ds in held for d in ds)
        if self._expiry is not None:
            for f in EXPIRY_FAMILIES:
                self._expiry.expired[f] = maps["expired"].get(f, 0)
                self._expiry.expired_bytes[f] = maps["expired_bytes"].get(f, 0)

    # ------------------------------------------------------------------ helpers (cache misses)

    def _failed(self, err: Exception, nb: int) -> None:
        """Count a delta whose lookups raised, and log each error type once."""
        if nb:
            self._add(self._unattributed, R_ATTRIBUTION_ERROR, nb)
        name = type(err).__name__
        self._once(name, logging.WARNING, "attribution lookup failed (%s: %s); bytes counted as "
                   "unattributed reason %s, further %s errors not logged",
                   name, err, R_ATTRIBUTION_ERROR, name, exc=err)

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
            if _link_scope(ip):
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
            r = (first.namespace, first.service, str(first.port),
                 tuple((sp.namespace, sp.service) for sp in sps if sp is not first))
        b.endpoints[ek] = r
        return r

    def _local_endpoint(self, b: _Batch, ip: IPAddress, lk: int, hook: int,
                        hek: tuple[int, int, int], final: bool) -> _Ep | None:
        """A local endpoint's Service and label (its pod as its veth ``hook`` says), with
        an empty hint-check cache; ``hek``: (address key on its veth, port, protocol)."""
        ek = (lk, hek[1], hek[2])
        svc = b.endpoints.get(ek, _NOT_CACHED)
        if svc is _NOT_CACHED:
            svc = self._endpoint(b, ip, ek)
        if svc is None:
            return None
        hk = hek[0]
        label = b.labels.get(hk)
        if label is None:
            label = b.labels[hk] = _label(self._local_peer(b, ip, lk, hook, final)[0], ip)
        gone = self._endpoint_gone
        if gone is not None and gone(ip, hek[1], hek[2]):
            # the hint model no longer has the endpoint in any selection: not judged
            # (docs/attribution.md, "Endpoints just removed")
            return (svc, label, _NotJudged())
        return (svc, label, {})

    def _local_peer(self, b: _Batch, ip: IPAddress, lk: int, hook: int, final: bool
                    ) -> tuple[Peer, bool]:
        """A local address resolved by its veth ``hook`` when the metadata can (the pod
        that held it when the bytes were counted), else by time: ``(peer, settled)``."""
        rv = self._resolve_veth
        if hook and rv is not None and not _link_scope(ip):
            return rv(ip, hook, b.at, final)
        return self._peer(b, ip, lk), True

    def _client(self, b: _Batch, ip: IPAddress, k: int) -> _Client:
        """Classify the client of a REQUEST/RESPONSE delta (the server is on this node)."""
        c = self._peer(b, ip, k)
        cz = c.zone
        crossing = _crossing(cz, c.region, c.node, c.kind, b.oz, b.orr, self.node, PeerKind.POD)
        reason: str | None = None
        if crossing == UNKNOWN:
            reason = (c.reason or DEFAULT_REASON[c.kind]) if cz is None else R_NODE_WITHOUT_ZONE
        # kube-proxy on the client's node decides; CIDR and external clients have none
        check = c.kind is PeerKind.POD or c.kind is PeerKind.NODE or c.kind is PeerKind.UNKNOWN
        return (cz or UNKNOWN, crossing, reason, c.node, check, _label(c, ip),
                c.kind is PeerKind.UNKNOWN, peer_class(c), lb_label(c))

    def _local(self, b: _Batch, ip: IPAddress, k: int, hook: int, final: bool) -> _Local:
        """The workload labels and pair label of a local pod (on its veth ``hook``);
        unresolved while its veth's pod is not known yet."""
        p, settled = self._local_peer(b, ip, k, hook, final)
        if p.kind is PeerKind.POD:
            return (p.namespace or UNKNOWN, p.workload or p.name or UNKNOWN,
                    p.workload_kind or ("Pod" if p.name else UNKNOWN), _label(p, ip),
                    not settled, peer_class(p))
        # a veth is a pod's whatever its address resolves to; with the socket view a local
        # side may be the node itself (a host process, a host-network pod)
        cls = peer_class(p) if self._sockets_seen else K_POD
        return (UNKNOWN, UNKNOWN, UNKNOWN, str(ip), p.kind is PeerKind.UNKNOWN, cls)

    def _remote(self, b: _Batch, d: FlowDelta, rk: int) -> _Remote:
        """Decide an EGRESS/INGRESS delta by its remote (address, port, protocol)."""
        remote, port, proto = d.remote, d.port, d.protocol
        sa = self._meta.service_address(remote, port, proto)
        if sa is not None:
            path = self._path(b, sa.namespace, sa.service, P_CLUSTERIP)
            entry = self._is_entry_point
            if entry is not None and entry(remote, port, proto) and \
                    self._peer(b, remote, rk).node != self.node:
                # another node's node port (kube-proxy here DNATs only its own addresses'):
                # that node's uplink counts this hop as its first hop, and the endpoint, or
                # nobody for a veth-less one on the veth hook, the next (docs/attribution.md,
                # "Two hops of NodePort and LoadBalancer traffic")
                return (_SKIP, S_CLUSTERIP_CLIENT_COPY, False, path)
            skip, server, settled = self._clusterip_hostnet(b, sa)
            if server is None:
                return (_SKIP, skip, not settled, path)
            svc = (sa.namespace, sa.service, str(sa.port), ())
            label = _label(server, remote) if server.node else f"{sa.namespace}/{sa.service}"
            # kube-proxy on this node picked among the endpoints it selects: not ignored
            return self._server_side(b, svc, server, False, label, path)
        ek = (rk, port, proto)
        svc_ = b.endpoints.get(ek, _NOT_CACHED)
        if svc_ is _NOT_CACHED:
            svc_ = self._endpoint(b, remote, ek)
        peer = self._peer(b, remote, rk)
        if svc_ is not None:
            # a direct dial: did it bypass this node's selection? (the client's node's
            # evidence that the client chose the endpoint itself)
            ig = self._is_ignored(b, svc_, self.node, remote)
            path = (svc_[0], svc_[1], self.node, P_DIRECT) if ig else None
            # an endpoint with a veth is a frontend: its node counts these bytes as
            # request/response (the answer is the same for EGRESS and INGRESS)
            if not counted_here(FlowKind.EGRESS, remote_is_frontend=not self._unseen(peer),
                                remote_is_pod=True):
                return (_SKIP, S_ENDPOINT_CLIENT_COPY, False, path)
            return self._server_side(b, svc_, peer, ig, _label(peer, remote), path)
        if peer.kind is PeerKind.NODE and port and self._host_port is not None:
            # a node address on a port exactly one host-network pod there declares is
            # that pod; a hostPort is the pod it is DNATed to, a POD peer whose node
            # counts its egress (docs/attribution.md, "Host-network servers by port")
            hp = self._host_port(remote, port, proto)
            if hp is not None:
                peer = hp
                target = (self._host_port_target(remote, port, proto)
                          if self._host_port_target is not None else None)
                if target is not None:
                    # the pod behind the hostPort is a Service endpoint: the portmap DNAT
                    # keeps the client's address, so the endpoint's node counts these
                    # bytes as that Service's request/response, as for a direct dial
                    t_ip, t_port = target
                    tk = (_ikey(t_ip), t_port, proto)
                    tsvc = b.endpoints.get(tk, _NOT_CACHED)
                    if tsvc is _NOT_CACHED:
                        tsvc = self._endpoint(b, t_ip, tk)
                    if tsvc is not None and not self._unseen(hp):
                        ig = self._is_ignored(b, tsvc, self.node, t_ip)
                        path = (tsvc[0], tsvc[1], self.node, P_DIRECT) if ig else None
                        return (_SKIP, S_ENDPOINT_CLIENT_COPY, False, path)
        pk = peer.kind
        # its own node's agent counts its egress (a veth, or with the socket view every
        # socket of the cluster: a host-network pod named by its port as much as its node)
        podlike = not self._unseen(peer)
        crossing = _crossing(b.oz, b.orr, self.node, PeerKind.POD,
                             peer.zone, peer.region, peer.node, pk)
        reason: str | None = None
        if crossing == UNKNOWN:
            reason = R_NODE_WITHOUT_ZONE if b.oz is None else (peer.reason or DEFAULT_REASON[pk])
        ingress_here = counted_here(FlowKind.INGRESS, remote_is_frontend=False, remote_is_pod=podlike)
        return (_PEER_SIDE, peer.zone or UNKNOWN, peer_class(peer), crossing, reason, ingress_here,
                _label(peer, remote), pk is PeerKind.UNKNOWN, lb_label(peer))

    def _server_side(self, b: _Batch, svc: _Svc, server: Peer, ignored: bool, label: str,
                     path: tuple[str, str, str, str] | None) -> _Remote:
        """Service traffic counted at the client (host-network endpoint, no veth there)."""
        sz = server.zone
        crossing = _crossing(b.oz, b.orr, self.node, PeerKind.POD,
                             sz, server.region, server.node, server.kind)
        reason: str | None = None
        if crossing == UNKNOWN:
            reason = R_NODE_WITHOUT_ZONE if b.oz is None else (
                server.reason or DEFAULT_REASON[server.kind])
        return (_SERVER_SIDE, svc, sz or UNKNOWN, crossing, reason, ignored, label, path)

    def _ignored_key(self, key: tuple[str, str, str, str, str, str]
                     ) -> tuple[str, str, str, str, str, str]:
        """``key`` for a new hint-ignored series, or the same with ``client_node="other"``
        when the Service already has :data:`HINT_IGNORED_NODES` client nodes here (the
        series count stays bounded by Services, not nodes: docs/metrics.md, Series count).
        Scans the Service's series: only on a key's first bytes."""
        ns, svc, _, _, cnode, _ = key
        ignored = self._ignored
        index = self._ignored_nodes
        if index is None or index[0] is not ignored or index[1] != len(ignored):
            # built again only when series were added or removed elsewhere (expiry, a
            # restore); scanning every series for every new key was quadratic
            by_svc: dict[tuple[str, str], set[str]] = {}
            for k in ignored:
                by_svc.setdefault((k[0], k[1]), set()).add(k[4])
            index = (ignored, len(ignored), by_svc)
        nodes = index[2].setdefault((ns, svc), set())
        if not (cnode in nodes or len(nodes - {OTHER_NODE}) < HINT_IGNORED_NODES):
            key = (*key[:4], OTHER_NODE, key[5])
        nodes.add(key[4])
        # the caller adds key to the series at once: count it as added
        self._ignored_nodes = (ignored, len(ignored) + (key not in ignored), index[2])
        return key

    def _path(self, b: _Batch, ns: str, svc: str, path: str) -> tuple[str, str, str, str] | None:
        """The client path key of this node's pods' traffic to a Service, or None when
        kube-proxy on this node does not filter the Service by topology (no hint to
        ignore there, so no evidence worth a series)."""
        pv = self._view(b, ns, svc, self.node)
        return (ns, svc, self.node, path) if pv is not None and pv.topology_mode else None

    def _view(self, b: _Batch, ns: str, svc: str, node: str) -> ProxyView | None:
        k = (ns, svc, node)
        if k in b.views:
            return b.views[k]
        v = b.views[k] = self._hints.proxy_view(ns, svc, node)
        return v

    def _is_ignored(self, b: _Batch, svc: _Svc, cnode: str, server: IPAddress) -> bool:
        """True when kube-proxy on ``cnode`` filters by topology and would not pick ``server``."""
        ns, name, _, _ = svc
        pv = self._view(b, ns, name, cnode)
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
        parsed = self._parsed
        for a in sorted(selected):
            hit = parsed.get(a, _NOT_PARSED)
            if hit is _NOT_PARSED:
                ip = _endpoint_address(a)
                hit = None if ip is None else (ip, _ikey(ip))
                if len(parsed) >= PARSED_MAX:
                    parsed.clear()
                parsed[a] = hit
            if hit is not None:
                peers.append(self._peer(b, hit[0], hit[1]))
        settled = all(p.kind is not PeerKind.UNKNOWN for p in peers)
        return self._hostnet_server(peers), settled

    def _unseen(self, peer: Peer) -> bool:
        """True when no agent counts the peer's own side: :func:`_no_veth` on the veth
        hook; with ``sockets_seen`` only addresses outside the cluster (CIDR-mapped, load
        balancers, external), since every node's sockets, host-network ones included, are seen."""
        if self._sockets_seen:
            return peer.kind in _OUTSIDE
        return _no_veth(peer)

    def _hostnet_server(self, peers: list[Peer]) -> tuple[str, Peer | None]:
        hn = [p for p in peers if self._unseen(p)]
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

