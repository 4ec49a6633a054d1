"""Attribution's vocabulary: crossing values, reason names and the exactly-once rule.

Every label value attribution writes is named here once (docs/attribution.md lists them
with their meaning; docs/metrics.md says which series carries which), together with
:func:`counted_here`, the rule that decides which node counts a byte.
"""

from __future__ import annotations

from agent.records import FlowKind, Peer, PeerKind

__all__ = [
    "CLIENT_KINDS",
    "CROSSINGS",
    "NO_LB",
    "EXPIRY_FAMILIES",
    "P_CLUSTERIP",
    "P_DIRECT",
    "FAMILY_CLIENT_PATH",
    "FAMILY_HINT_IGNORED",
    "FAMILY_SERVICE",
    "FAMILY_SERVICE_ENTRY",
    "FAMILY_WORKLOAD",
    "SKIPPED_REASONS",
    "UNKNOWN_CROSSING_REASONS",
    "DIAGNOSTIC_NAMES",
    "UNATTRIBUTED_REASONS",
    "UNKNOWN",
    "counted_here",
    "crossing",
    "lb_label",
    "peer_class",
]

#: label value for anything missing (docs/metrics.md: "missing values are unknown")
UNKNOWN = "unknown"

SAME_NODE = "same_node"
SAME_ZONE = "same_zone"
CROSS_ZONE = "cross_zone"
CROSS_REGION = "cross_region"
EXTERNAL = "external"

#: every value ``crossing`` takes
CROSSINGS: tuple[str, ...] = (SAME_NODE, SAME_ZONE, CROSS_ZONE, CROSS_REGION, EXTERNAL, UNKNOWN)

# Client classes (docs/attribution.md, "Client classes"): one vocabulary for the
# ``client_kind`` of zonemeter_service_bytes_total and of the hint-ignored series, and for
# the ``remote_kind`` of zonemeter_workload_bytes_total.
K_POD = "pod"                       # a pod with its own address
K_NODE = "node"                     # a Node's address: host-network pod or process, or a
#                                     NodePort/LoadBalancer hop the receiving node masqueraded
K_LOAD_BALANCER = "load-balancer"   # in a --zone-cidrs range marked kind load-balancer
K_CIDR = "cidr"                     # in another --zone-cidrs range (a VM, a managed database)
K_EXTERNAL = "external"             # an address nothing maps
#: every client class, in the order reports list them (``unknown``: a cluster address that
#: resolves to nothing, its reason in zonemeter_unknown_crossing_bytes_total)
CLIENT_KINDS: tuple[str, ...] = (K_POD, K_NODE, K_LOAD_BALANCER, K_CIDR, K_EXTERNAL, UNKNOWN)
#: ``lb_type`` of a client that is not a load balancer
NO_LB = "none"

# Reasons vocabulary (docs/attribution.md lists them with their meaning).
# unattributed: bytes in no service/workload series
R_FLOW_TABLE_FULL = "flow_table_full"
R_ENDPOINT_WITHOUT_SERVICE = "endpoint_without_service"
R_ATTRIBUTION_ERROR = "attribution_error"
R_ENTRY_WITHOUT_SERVICE = "entry_without_service"
# skipped: client-side copies counted by another agent (or by this one at the endpoint)
S_CLUSTERIP_CLIENT_COPY = "clusterip_client_copy"
S_CLUSTERIP_MIXED_HOST_NETWORK = "clusterip_mixed_host_network"
S_ENDPOINT_CLIENT_COPY = "endpoint_client_copy"
S_POD_PEER_INGRESS = "pod_peer_ingress"
S_ENTRY_ENDPOINT_COPY = "entry_endpoint_copy"
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
UNATTRIBUTED_REASONS = frozenset({R_FLOW_TABLE_FULL, R_ENDPOINT_WITHOUT_SERVICE, R_ENTRY_WITHOUT_SERVICE,
                                  R_ATTRIBUTION_ERROR})
#: reasons of ``skipped_bytes`` (copies another veth counts; entry_endpoint_copy: an uplink's
#: copy of a hop a local endpoint saw with the client's own address)
SKIPPED_REASONS = frozenset({S_CLUSTERIP_CLIENT_COPY, S_CLUSTERIP_MIXED_HOST_NETWORK,
                             S_ENDPOINT_CLIENT_COPY, S_POD_PEER_INGRESS, S_ENTRY_ENDPOINT_COPY})
#: reasons of ``unknown_crossing_bytes``
UNKNOWN_CROSSING_REASONS = frozenset({R_NO_POD_FOR_IP, R_NODE_WITHOUT_ZONE, R_CIDR_WITHOUT_ZONE,
                                      R_CLUSTERIP_TO_HOST_NETWORK})
#: names of ``diagnostics_bytes``
DIAGNOSTIC_NAMES = frozenset({D_AMBIGUOUS_SERVICE, D_HINT_CHECK_NO_CLIENT_NODE, D_OVERFLOW_UNFILTERED,
                              D_HOLD_FULL, D_LATE_ENDPOINT})

#: ``family`` label values of ``zonemeter_series_expired_total``: the exported metric whose
#: series expired (see :mod:`agent.attribution.expiry`)
FAMILY_SERVICE = "zonemeter_service_bytes_total"
FAMILY_HINT_IGNORED = "zonemeter_service_hint_ignored_bytes_total"
FAMILY_WORKLOAD = "zonemeter_workload_bytes_total"
FAMILY_CLIENT_PATH = "zonemeter_service_client_path_bytes_total"
FAMILY_SERVICE_ENTRY = "zonemeter_service_entry_bytes_total"
EXPIRY_FAMILIES: tuple[str, ...] = (FAMILY_SERVICE, FAMILY_HINT_IGNORED, FAMILY_WORKLOAD,
                                    FAMILY_CLIENT_PATH, FAMILY_SERVICE_ENTRY)

#: ``path`` of ``zonemeter_service_client_path_bytes_total`` (docs/attribution.md, "Why
#: bytes ignored the hints"): a pod dialled a Service address / an endpoint outside this
#: node's selection
P_CLUSTERIP = "clusterip"
P_DIRECT = "direct"

#: the unknown-crossing reason of a peer that resolved without one, by its kind
DEFAULT_REASON = {
    PeerKind.UNKNOWN: R_NO_POD_FOR_IP,
    PeerKind.POD: R_NODE_WITHOUT_ZONE,
    PeerKind.NODE: R_NODE_WITHOUT_ZONE,
    PeerKind.CIDR: R_CIDR_WITHOUT_ZONE,
    PeerKind.LOAD_BALANCER: R_CIDR_WITHOUT_ZONE,  # never used: the zone CIDR file gives a zone
    PeerKind.EXTERNAL: R_NO_POD_FOR_IP,  # never used: external is never "unknown"
}


def peer_class(peer: Peer) -> str:
    """The client class of a resolved peer (one of :data:`CLIENT_KINDS`).

    A host-network pod (``PeerKind.NODE``, or a peer with ``host_network``) is ``node``: its
    address is its node's, so the bytes cannot tell it from a node process or from a
    NodePort/LoadBalancer hop masqueraded to that node. Every other kind's value is its class.
    """
    if peer.host_network:
        return K_NODE
    return peer.kind.value


def lb_label(peer: Peer) -> str:
    """The ``lb_type`` label of a peer: its load balancer type, :data:`NO_LB` for any other
    class (``unknown`` for a load balancer without a type, which the zone CIDR parser never
    gives)."""
    if peer.kind is PeerKind.LOAD_BALANCER:
        return peer.lb_type or UNKNOWN
    return NO_LB


def counted_here(kind: FlowKind, *, remote_is_frontend: bool, remote_is_pod: bool) -> bool:
    """The exactly-once rule for one non-overflow delta drained on this node.

    The kernel counts a packet at every local pod veth it crosses; this says which of
    those copies this node keeps so that the sum over all agents counts each byte once
    (docs/attribution.md, "The rule table"). :class:`agent.attribution.Attributor`
    decides with it, and the kernel tests apply it to real drained deltas
    (tests/kernel/test_datapath*.py).

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


def crossing(cz: str | None, cr: str | None, cn: str | None, ck: PeerKind,
             sz: str | None, sr: str | None, sn: str | None, sk: PeerKind) -> str:
    """Crossing of a flow between two sides (docs/attribution.md, "Classification").

    Args:
        cz, cr, cn, ck: one side's zone, region, node name (None when unknown) and kind.
        sz, sr, sn, sk: the other side's.

    Returns:
        One of :data:`CROSSINGS`: ``external`` when either side is external, ``same_node``
        on one node, ``unknown`` when a zone is missing, ``cross_region`` between two known
        regions that differ, else ``same_zone`` or ``cross_zone``.
    """
    if ck is PeerKind.EXTERNAL or sk is PeerKind.EXTERNAL:
        return EXTERNAL
    if cn is not None and cn == sn:
        return SAME_NODE
    if cz is None or sz is None:
        return UNKNOWN
    if cr is not None and sr is not None and cr != sr:
        return CROSS_REGION
    return SAME_ZONE if cz == sz else CROSS_ZONE
