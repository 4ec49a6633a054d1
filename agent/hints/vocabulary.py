"""The hint model's fixed strings: annotations, event messages and reasons, diagnosis codes.

Event messages and reasons are copied from the EndpointSlice controller
(``staging/src/k8s.io/endpointslice/topologycache/event.go``); the diagnosis vocabulary
(:data:`REASONS`, :data:`WARNING_CODES`, :data:`REASON_SENTENCES`) is documented in
docs/hints.md. Kubernetes label names are shared with the parser (:mod:`agent.k8s.parse`).
"""

from __future__ import annotations

from agent.k8s.parse import (
    CONTROLLER_NAME,
    EXCLUDED_NODE_LABELS,
    LABEL_MANAGED_BY,
    LABEL_SERVICE_NAME,
    LABEL_ZONE,
)

__all__ = [
    "EXPECTED_CROSS_ZONE_WARN", "ANNOTATION_DEPRECATED", "ANNOTATION_TOPOLOGY_MODE", "CONTROLLER_NAME",
    "EXCLUDED_NODE_LABELS",
    "LABEL_MANAGED_BY", "LABEL_SERVICE_NAME", "LABEL_ZONE", "MSG_DISABLED", "MSG_ENABLED",
    "MSG_INSUFFICIENT_ENDPOINTS", "MSG_INSUFFICIENT_NODE_INFO", "MSG_MIN_ALLOCATION", "MSG_NO_ALLOCATED",
    "MSG_NO_ZONE", "MSG_ONE_ZONE", "OVERLOAD_THRESHOLD", "REASONS", "REASON_DISABLED", "REASON_ENABLED",
    "REASON_SENTENCES", "UNKNOWN_ZONE", "WARNING_CODES",
]

ANNOTATION_TOPOLOGY_MODE = "service.kubernetes.io/topology-mode"
ANNOTATION_DEPRECATED = "service.kubernetes.io/topology-aware-hints"

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
    "no-hints-for-zone", "internal-traffic-policy-local", "no-endpoints", "kube-proxy-version-skew",
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
    "internal-traffic-policy-local": "Node-local: internalTrafficPolicy: Local keeps ClusterIP "
                                     "traffic on the client's node (a node without a local "
                                     "endpoint drops it); hints do not apply.",
    "no-endpoints": "No endpoint is usable, so kube-proxy rejects the calls.",
    "kube-proxy-version-skew": "The control plane writes hints, but kube-proxy on some nodes runs "
                               "an older (or newer) version that does not use them the same way.",
}

#: warning codes emitted in :attr:`ServiceDiagnosis.warnings`
WARNING_CODES = (
    "auto-shadows-traffic-distribution", "deprecated-annotation-shadows-topology-mode",
    "annotation-value-not-accepted", "traffic-distribution-not-accepted",
    "ready-endpoints-without-hints", "stale-hints", "node-info-disables-auto",
    "internal-traffic-policy-local-drops", "prefer-same-node-skew", "single-endpoint-zone",
    "auto-minimum-endpoints", "node-without-zone", "no-endpointslices", "kube-proxy-version-skew",
    "expected-cross-zone",
)

#: the ``expected-cross-zone`` warning fires when locality is in effect in a client zone and
#: more than this share of its calls is still expected to cross zones (docs/hints.md): a
#: quarter is above what one donated endpoint does to a zone with four or more of its own
#: (at most 1/5), and well below the half a 4/1/1 spread under Auto gives two zones
EXPECTED_CROSS_ZONE_WARN = 0.25

#: the client zone of Ready nodes without a zone label
UNKNOWN_ZONE = "unknown"
