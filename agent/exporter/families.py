"""The metric family table: one row per exported family (name, type, help, labels, getter).

Declared the way kube-state-metrics declares its families (``internal/store/pod.go``
``podMetricFamilies``), so this table reads like docs/metrics.md, which is the contract:
prefix ``zonemeter_``, counters end in ``_total``, missing label values are ``unknown``,
no IPs or pod names on any series. Bytes are L3 bytes (IP header included), see
docs/datapath.md. The collector (:class:`agent.exporter.Exporter`) yields the families in
table order, each with the samples its getter reads from the current
:class:`agent.exporter.ExportSnapshot`, sorted by label values.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from agent.attribution.vocabulary import (
    DIAGNOSTIC_NAMES,
    SKIPPED_REASONS,
    UNATTRIBUTED_REASONS,
    UNKNOWN_CROSSING_REASONS,
)
from agent.exporter.snapshot import ExportSnapshot
from agent.records import ClientPathKey, HintIgnoredKey, ServiceBytesKey, WorkloadBytesKey

__all__ = ["COUNTER", "FAMILIES", "GAUGE", "UNKNOWN", "MetricFamily", "Sample", "key_labels", "label"]

UNKNOWN = "unknown"
COUNTER = "counter"
GAUGE = "gauge"

#: one sample: label values (in the family's label order) and the value
Sample = tuple[tuple[str, ...], float]


def label(value: object) -> str:
    """Return a label value: ``str(value)``, or ``"unknown"`` for None and ""."""
    if value is None:
        return UNKNOWN
    text = str(value)
    return text if text else UNKNOWN


@dataclass(frozen=True, slots=True)
class MetricFamily:
    """One row of the table.

    Attributes:
        name: the exposed name (counters with their ``_total``).
        type: :data:`COUNTER` or :data:`GAUGE`.
        help: the ``# HELP`` text.
        labels: label names, in the order the getter yields values.
        getter: ``(snapshot, build version) -> samples`` (any order; the collector sorts).
    """

    name: str
    type: str
    help: str
    labels: tuple[str, ...]
    getter: Callable[[ExportSnapshot, str], Iterable[Sample]]


#: label record type -> its field names, in order
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def key_labels(key: Any) -> tuple[str, ...]:
    """The label values of a label record: :func:`label` of each field, in field order."""
    names = _FIELD_NAMES.get(type(key))
    if names is None:
        names = _FIELD_NAMES[type(key)] = tuple(f.name for f in fields(key))
    return tuple([label(getattr(key, n)) for n in names])


def _keyed(series: Mapping[Any, float]) -> Iterable[Sample]:
    """Samples of a mapping keyed by a label record (labels = the record's fields)."""
    for key, value in series.items():
        yield key_labels(key), value


def _by_name(series: Mapping[str, float], known: Iterable[str] = ()) -> Iterable[Sample]:
    """Samples of a ``{label value: value}`` mapping (one label), with every ``known`` value
    exported from the start at 0: a series that appears only at its first increment hides
    that increment from ``rate()``/``increase()`` and from the alerts built on them
    (Prometheus instrumentation practices, "Avoid missing metrics")."""
    for name in sorted(set(known) - set(series)):
        yield (label(name),), 0
    for name, value in series.items():
        yield (label(name),), value


def _in_effect(s: ExportSnapshot, _: str) -> Iterable[Sample]:
    for ref, loc in s.locality.items():
        for zone, on in loc.in_effect.items():
            yield (label(ref.namespace), label(ref.service), label(zone)), 1 if on else 0


def _expected_cross_zone(s: ExportSnapshot, _: str) -> Iterable[Sample]:
    for ref, loc in s.locality.items():
        for zone, share in loc.expected_cross_zone.items():
            yield (label(ref.namespace), label(ref.service), label(zone)), share


def _locality_info(s: ExportSnapshot, _: str) -> Iterable[Sample]:
    for ref, loc in s.locality.items():
        yield (label(ref.namespace), label(ref.service), label(loc.mode), label(loc.reason)), 1


def _last_change(s: ExportSnapshot, _: str) -> Iterable[Sample]:
    for ref, loc in s.locality.items():
        yield (label(ref.namespace), label(ref.service)), loc.last_change


def _synced(s: ExportSnapshot, _: str) -> Iterable[Sample]:
    for resource, ok in s.metadata_synced.items():
        yield (label(resource),), 1 if ok else 0


def _hint_model(s: ExportSnapshot, _: str) -> Iterable[Sample]:
    if s.hint_model is not None:
        yield tuple(label(v) for v in s.hint_model), 1


def _datapath(s: ExportSnapshot, _: str) -> Iterable[Sample]:
    if s.datapath is not None:
        yield tuple(label(v) for v in s.datapath), 1


def _scalar(value: float) -> Iterable[Sample]:
    yield (), value


SERVICE_LABELS = ("namespace", "service", "port", "client_zone", "server_zone", "crossing", "direction",
                  "client_kind", "lb_type")
HINT_IGNORED_LABELS = ("namespace", "service", "client_zone", "server_zone", "client_node", "client_kind")
CLIENT_PATH_LABELS = ("namespace", "service", "client_node", "path")
WORKLOAD_LABELS = ("namespace", "workload", "workload_kind", "client_zone", "remote_zone", "remote_kind",
                   "crossing", "direction")
#: the record whose fields give each keyed family's label values, in this order
KEYED_LABELS: Mapping[tuple[str, ...], type] = {
    SERVICE_LABELS: ServiceBytesKey, HINT_IGNORED_LABELS: HintIgnoredKey,
    CLIENT_PATH_LABELS: ClientPathKey, WORKLOAD_LABELS: WorkloadBytesKey}

FAMILIES: tuple[MetricFamily, ...] = (
    MetricFamily(
        "zonemeter_service_bytes_total", COUNTER,
        "L3 bytes of Service traffic counted at the endpoint's node, by client and server zone, "
        "crossing, direction and the client's class (pod, node, load-balancer with its lb_type, "
        "cidr, external, unknown).",
        SERVICE_LABELS, lambda s, _: _keyed(s.totals.service_bytes)),
    MetricFamily(
        "zonemeter_service_entry_bytes_total", COUNTER,
        "L3 bytes of the first hop of a node port (a load balancer or another client off the "
        "node to a node port, LoadBalancer IP or externalIP of a Service with "
        "externalTrafficPolicy Cluster), counted on the receiving node's uplinks: server_zone "
        "is that node's; the endpoint counts the next hop in zonemeter_service_bytes_total.",
        SERVICE_LABELS, lambda s, _: _keyed(s.totals.service_entry_bytes)),
    MetricFamily(
        "zonemeter_service_hint_ignored_bytes_total", COUNTER,
        "L3 bytes from a client zone to an endpoint outside the set kube-proxy selects for that "
        "zone while topology hints were in effect, by the client's node and kind (pod or node).",
        HINT_IGNORED_LABELS, lambda s, _: _keyed(s.totals.hint_ignored_bytes)),
    MetricFamily(
        "zonemeter_service_client_path_bytes_total", COUNTER,
        "L3 bytes this node's pods exchanged with a Service its kube-proxy filters by topology, "
        "by path: clusterip (a Service address) or direct (an endpoint outside this node's "
        "selection); evidence for why bytes ignored the hints, never billed again.",
        CLIENT_PATH_LABELS, lambda s, _: _keyed(s.totals.client_path_bytes)),
    MetricFamily(
        "zonemeter_service_locality_in_effect", GAUGE,
        "1 when kube-proxy keeps this Service's ClusterIP traffic from client_zone close: "
        "topology hints (same zone or node) or internalTrafficPolicy Local (node-local), else 0.",
        ("namespace", "service", "client_zone"), _in_effect),
    MetricFamily(
        "zonemeter_service_expected_cross_zone_ratio", GAUGE,
        "Share (0..1) of client_zone's calls to this Service expected to cross zones under "
        "today's hints: equal weight per endpoint kube-proxy selects, equal weight per node.",
        ("namespace", "service", "client_zone"), _expected_cross_zone),
    MetricFamily(
        "zonemeter_service_locality_info", GAUGE,
        "Requested locality mode and why locality is not in effect by topology hints (reason "
        "none when it is; internal-traffic-policy-local: node-local instead); always 1.",
        ("namespace", "service", "mode", "reason"), _locality_info),
    MetricFamily(
        "zonemeter_service_locality_last_change_timestamp_seconds", GAUGE,
        "When the Service's locality state last changed.",
        ("namespace", "service"), _last_change),
    MetricFamily(
        "zonemeter_workload_bytes_total", COUNTER,
        "L3 bytes of non-Service traffic of a local pod by workload, remote zone and kind, "
        "crossing and direction (egress from / ingress to the workload).",
        WORKLOAD_LABELS, lambda s, _: _keyed(s.totals.workload_bytes)),
    MetricFamily(
        "zonemeter_unattributed_bytes_total", COUNTER,
        "L3 bytes that could not be attributed, by reason.",
        ("reason",), lambda s, _: _by_name(s.totals.unattributed_bytes, UNATTRIBUTED_REASONS)),
    MetricFamily(
        "zonemeter_unknown_crossing_bytes_total", COUNTER,
        "L3 bytes of service, entry and workload series whose crossing is unknown, by reason (a "
        "subset of those series).",
        ("reason",), lambda s, _: _by_name(s.totals.unknown_crossing_bytes, UNKNOWN_CROSSING_REASONS)),
    MetricFamily(
        "zonemeter_skipped_bytes_total", COUNTER,
        "L3 bytes seen but not counted here because another veth counts them (client-side "
        "copies), by reason; never billed.",
        ("reason",), lambda s, _: _by_name(s.totals.skipped_bytes, SKIPPED_REASONS)),
    MetricFamily(
        "zonemeter_diagnostic_bytes_total", COUNTER,
        "L3 bytes already counted in the series above that are worth a look, by diagnostic name "
        "(e.g. endpoint_not_in_kernel: the kernel endpoint map lagged the EndpointSlices).",
        ("name",), lambda s, _: _by_name(s.totals.diagnostics_bytes, DIAGNOSTIC_NAMES)),
    MetricFamily(
        "zonemeter_series_expired_total", COUNTER,
        "Series dropped because their Service or workload no longer exists and they gained no "
        "bytes for --series-retention seconds, by the metric (family) they belonged to.",
        ("family",), lambda s, _: _by_name(s.totals.series_expired)),
    MetricFamily(
        "zonemeter_checkpoint_discarded_total", COUNTER,
        "Checkpoint files the agent could not use and started from zero instead, by reason "
        "(unreadable, corrupt, version: another format or kernel layout, node: another "
        "node's); absent without --checkpoint-path.",
        ("reason",), lambda s, _: _by_name(s.checkpoint_discarded)),
    MetricFamily(
        "zonemeter_flow_table_entries", GAUGE,
        "Entries in the kernel flow table at the last drain.",
        (), lambda s, _: _scalar(s.flow_table_entries)),
    MetricFamily(
        "zonemeter_flow_table_capacity", GAUGE,
        "Maximum entries of the kernel flow table.",
        (), lambda s, _: _scalar(s.flow_table_capacity)),
    MetricFamily(
        "zonemeter_attached_interfaces", GAUGE,
        "Interfaces the datapath is attached to.",
        (), lambda s, _: _scalar(s.attached_interfaces)),
    MetricFamily(
        "zonemeter_hook_counted_bytes_total", COUNTER,
        "L3 bytes our programs counted that the compared interfaces should have carried: every "
        "byte on the veth hook, bytes of peers off the node on the cgroup hook (intervals with "
        "interface counters only).",
        (), lambda s, _: _scalar(s.coverage.counted_bytes)),
    MetricFamily(
        "zonemeter_interface_bytes_total", COUNTER,
        "L3 bytes the compared interfaces (the hooked veths; the node's uplinks on the cgroup "
        "hook) carried in the same intervals by their own counters (non-IP frames included).",
        (), lambda s, _: _scalar(s.coverage.carried_bytes)),
    MetricFamily(
        "zonemeter_hook_unseen_bytes_total", COUNTER,
        "L3 bytes the compared interfaces carried beyond what our programs counted, summed per "
        "interval: a data plane moving packets past the hook, or sockets outside its cgroup.",
        (), lambda s, _: _scalar(s.coverage.unseen_bytes)),
    MetricFamily(
        "zonemeter_hook_coverage_ratio", GAUGE,
        "Bytes our programs counted over bytes the compared interfaces carried in the last 5 "
        "minutes; NaN below 64 KiB carried.",
        (), lambda s, _: _scalar(s.coverage.ratio)),
    MetricFamily(
        "zonemeter_hook_tcp_direction_ratio", GAUGE,
        "TCP packets our programs counted in the less busy direction (into or out of local pods "
        "or sockets) over the busier one in the last 5 minutes; 0 when a data plane moves one "
        "direction past the hook; NaN below 1,000 packets.",
        (), lambda s, _: _scalar(s.coverage.tcp_direction_ratio)),
    MetricFamily(
        "zonemeter_datapath_info", GAUGE,
        "Where this agent counts: hook (veth or cgroup), attach (tcx, clsact or cgroup) and "
        "the --hook it was given (requested: veth, cgroup or auto); always 1. Every agent of "
        "a cluster should show the same hook (alert ZonemeterHookMixed).",
        ("hook", "attach", "requested"), _datapath),
    MetricFamily(
        "zonemeter_collector_duration_seconds", GAUGE,
        "Wall time of the last drain and attribution.",
        (), lambda s, _: _scalar(s.collector_duration_seconds)),
    MetricFamily(
        "zonemeter_metadata_synced", GAUGE,
        "1 when the resource's Kubernetes metadata is in sync.",
        ("resource",), _synced),
    MetricFamily(
        "zonemeter_hint_model_info", GAUGE,
        "Kubernetes versions the hint model judges with: the control plane's (kubernetes_version, "
        "from source cluster, snapshot, flag or default) and this node's kube-proxy's "
        "(kube_proxy_version, from kube_proxy_source node, flag or default); always 1.",
        ("kubernetes_version", "kube_proxy_version", "source", "kube_proxy_source"), _hint_model),
    MetricFamily(
        "zonemeter_build_info", GAUGE,
        "zonemeter build; always 1.",
        ("version",), lambda _, version: [((label(version),), 1)]),
)
