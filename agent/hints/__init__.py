"""Kubernetes topology-aware routing, reproduced as a pure model (no I/O), and the incremental hint model.

Given Nodes, Services and EndpointSlices, the model answers, per Service and address family,
the two questions that decide whether ClusterIP traffic stays in its zone:

1. What would the EndpointSlice controller write as ``hints`` on its next sync?
   (:mod:`agent.hints.controller`)
2. Which endpoints does kube-proxy on each node forward to, given the hints the slices carry
   now? (:mod:`agent.hints.proxy`)

:mod:`agent.hints.diagnosis` combines both into one reason per Service
(:func:`evaluate_cluster`); :mod:`agent.hints.model` keeps it incrementally per Service
and owns each Service's locality (:class:`HintModel`). Versions 1.27 to 1.37 are modelled (default 1.37) with each
version's feature-gate defaults (:mod:`agent.hints.versions`), the control plane at one
version and each node's kube-proxy at its own (:func:`proxy_versions`); the vocabulary is in
:mod:`agent.hints.vocabulary` and docs/hints.md. The objects are parsed by
:mod:`agent.k8s.parse`.
"""

from __future__ import annotations

from agent.hints.controller import (
    AddressHints,
    Allocation,
    AllocationResult,
    ClusterIndex,
    ControllerResult,
    Event,
    ZoneCapacity,
    compute_slice_hints,
    controller_hints,
    effective_annotation,
    get_allocations,
    hints_enabled,
    index_nodes,
    minimum_accepted_endpoints,
    reconcile,
    valid_traffic_distribution,
    zone_capacity,
)
from agent.hints.diagnosis import (
    ClientGroup,
    DiagnosisWarning,
    ProxyVersions,
    ServiceDiagnosis,
    diagnose,
    evaluate_cluster,
    evaluate_parsed,
    hinted_per_zone,
    proxy_versions,
)
from agent.hints.explain import (
    ExplainProblem,
    diagnose_objects,
    explain_document,
    load_problem,
    to_document,
    version_document,
)
from agent.hints.model import HintModel, merge_locality, merge_views
from agent.hints.proxy import ProxyDecision, ProxyIndex, ProxyMap
from agent.hints.versions import (
    DEFAULT_VERSION,
    GATES,
    MAX_MINOR,
    MIN_MINOR,
    PROXY_VERSION_SOURCES,
    VERSION_SOURCES,
    KubeVersion,
    _gate_default,
    choose_version,
    covered_version,
    parse_feature_gates,
    parse_proxy_flag,
)
from agent.hints.vocabulary import (
    ANNOTATION_DEPRECATED,
    ANNOTATION_TOPOLOGY_MODE,
    CONTROLLER_NAME,
    EXCLUDED_NODE_LABELS,
    EXPECTED_CROSS_ZONE_WARN,
    LABEL_MANAGED_BY,
    LABEL_SERVICE_NAME,
    LABEL_ZONE,
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
    REASON_SENTENCES,
    REASONS,
    UNKNOWN_ZONE,
    WARNING_CODES,
)
from agent.hints.whatif import MAX_WHATIF_ENDPOINTS, MAX_WHATIF_REPLICAS, what_if
from agent.k8s.parse import (
    Endpoint,
    Hints,
    NodeInfo,
    ServiceInfo,
    Slice,
    cpu_millis,
    hints_json,
    parse_node_info,
    parse_service_info,
    parse_slice,
)

__all__ = [
    "ANNOTATION_DEPRECATED", "ANNOTATION_TOPOLOGY_MODE", "CONTROLLER_NAME", "DEFAULT_VERSION",
    "EXCLUDED_NODE_LABELS", "EXPECTED_CROSS_ZONE_WARN", "ClientGroup", "GATES", "LABEL_MANAGED_BY",
    "LABEL_SERVICE_NAME", "LABEL_ZONE", "MAX_MINOR",
    "MAX_WHATIF_ENDPOINTS", "MAX_WHATIF_REPLICAS", "MIN_MINOR", "MSG_DISABLED", "MSG_ENABLED",
    "MSG_INSUFFICIENT_ENDPOINTS", "MSG_INSUFFICIENT_NODE_INFO", "MSG_MIN_ALLOCATION", "MSG_NO_ALLOCATED",
    "MSG_NO_ZONE", "MSG_ONE_ZONE", "OVERLOAD_THRESHOLD", "REASON_DISABLED", "REASON_ENABLED",
    "REASON_SENTENCES", "REASONS", "UNKNOWN_ZONE", "WARNING_CODES", "_gate_default", "AddressHints",
    "Allocation", "AllocationResult", "ClusterIndex", "compute_slice_hints", "controller_hints",
    "ControllerResult", "cpu_millis", "diagnose", "diagnose_objects", "DiagnosisWarning",
    "effective_annotation", "Endpoint", "evaluate_cluster", "evaluate_parsed", "Event",
    "explain_document", "ExplainProblem", "get_allocations", "hinted_per_zone", "load_problem",
    "HintModel", "Hints", "hints_enabled", "hints_json", "index_nodes", "KubeVersion", "merge_locality",
    "merge_views", "minimum_accepted_endpoints", "NodeInfo", "parse_feature_gates", "parse_node_info",
    "parse_service_info", "parse_slice", "ProxyDecision", "ProxyIndex", "ProxyMap", "reconcile",
    "PROXY_VERSION_SOURCES", "VERSION_SOURCES", "ProxyVersions", "choose_version", "covered_version",
    "parse_proxy_flag", "proxy_versions", "version_document",
    "ServiceDiagnosis", "ServiceInfo", "Slice", "to_document", "valid_traffic_distribution", "what_if",
    "zone_capacity", "ZoneCapacity",
]
