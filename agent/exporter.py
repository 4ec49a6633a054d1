"""Prometheus exposition of the agent's totals, plus ``/healthz``, ``/readyz`` and ``/flows``.

The agent loop builds an immutable :class:`ExportSnapshot` after each interval (cumulative
byte counts since the agent started, hint state, self-health) and hands it to
:meth:`Exporter.update`, which swaps one reference. A scrape reads whatever snapshot is
current and yields fresh metric families from it (client_python's custom ``Collector``
pattern): no global counters, no locks on the hot path, and a scrape never sees half of
an interval.

Metric contract (DESIGN.md, with the issue-4 ``client_zone`` label on
``locality_in_effect``); missing label values are ``unknown``; no IPs or pod names on any
series:

* ``zonemeter_service_bytes_total{namespace,service,port,client_zone,server_zone,crossing,direction}``
* ``zonemeter_service_hint_ignored_bytes_total{namespace,service,client_zone,server_zone}``
* ``zonemeter_service_locality_in_effect{namespace,service,client_zone}`` 0/1
* ``zonemeter_service_locality_info{namespace,service,mode,reason}`` 1
* ``zonemeter_service_locality_last_change_timestamp_seconds{namespace,service}``
* ``zonemeter_workload_bytes_total{namespace,workload,workload_kind,client_zone,remote_zone,remote_kind,crossing,direction}``
  (DESIGN.md's ``workload_egress_bytes_total``, renamed: bytes a pod receives from a non-pod
  remote are billed too, see docs/metrics.md)
* ``zonemeter_unattributed_bytes_total{reason}``, ``zonemeter_unknown_crossing_bytes_total{reason}``,
  ``zonemeter_skipped_bytes_total{reason}``
* ``zonemeter_series_expired_total{family}`` (issue 8: series of deleted Services and
  workloads dropped after ``--series-retention``; not in DESIGN.md)
* ``zonemeter_diagnostic_bytes_total{name}``: counted bytes worth a look (a subset of the
  series above, e.g. ``endpoint_not_in_kernel``; docs/attribution.md; not in DESIGN.md)
* ``zonemeter_flow_table_entries``, ``zonemeter_flow_table_capacity``,
  ``zonemeter_attached_interfaces``, ``zonemeter_collector_duration_seconds``,
  ``zonemeter_metadata_synced{resource}``, ``zonemeter_build_info{version}``

Bytes are L3 bytes (IP header included), see docs/datapath.md.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import threading
import time
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields
from socketserver import ThreadingMixIn
from typing import Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agent.errors import InputError
from agent.records import HintIgnoredKey, ServiceBytesKey, WorkloadBytesKey

UNKNOWN = "unknown"


def label(value: object) -> str:
    """Return a label value: ``str(value)``, or ``"unknown"`` for None and ""."""
    if value is None:
        return UNKNOWN
    text = str(value)
    return text if text else UNKNOWN


# ----------------------------------------------------------------------------- keys

@dataclass(frozen=True, slots=True, order=True)
class LocalityKey:
    """Labels of ``zonemeter_service_locality_in_effect`` (one series per client zone)."""

    namespace: str
    service: str
    client_zone: str


@dataclass(frozen=True, slots=True, order=True)
class ServiceId:
    """A Service: keys ``locality_info`` and ``locality_last_change``."""

    namespace: str
    service: str


@dataclass(frozen=True, slots=True, order=True)
class LocalityInfo:
    """Value of ``zonemeter_service_locality_info``: the requested mode and why locality
    is off (``none`` when in effect); vocabulary from :mod:`agent.hints`."""

    mode: str
    reason: str


@dataclass(frozen=True, slots=True)
class PairRow:
    """One client -> server pod pair for ``/flows`` (never a Prometheus series).

    Attributes:
        client, server: ``namespace/pod`` (or an address / ``node:NAME`` when not a pod).
        client_zone, server_zone, crossing: as on the service series.
        namespace, service, port: the Service ("" for non-Service traffic).
        bytes: L3 bytes in the snapshot's ``pairs_interval`` (both directions).
    """

    client: str
    server: str
    client_zone: str
    server_zone: str
    crossing: str
    namespace: str
    service: str
    port: str
    bytes: int


def _frozen_map(value: Mapping[Any, Any] | None) -> Mapping[Any, Any]:
    return types.MappingProxyType(dict(value or {}))


@dataclass(frozen=True, slots=True)
class ExportSnapshot:
    """Everything one scrape exposes; built once per interval, never mutated.

    Counts are CUMULATIVE since the agent started (Prometheus counters). Mapping fields
    are copied into read-only mappings on construction.

    Attributes:
        service_bytes: ``{ServiceBytesKey: bytes}``.
        hint_ignored_bytes: ``{HintIgnoredKey: bytes}``.
        locality_in_effect: ``{LocalityKey: in effect}``.
        locality_info: ``{ServiceId: LocalityInfo}``.
        locality_last_change: ``{ServiceId: seconds since the epoch}``.
        workload_bytes: ``{WorkloadBytesKey: bytes}``.
        unattributed_bytes: ``{reason: bytes}``: bytes in no other series.
        unknown_crossing_bytes: ``{reason: bytes}``: bytes already in service/workload
            series with crossing ``unknown``, by why.
        skipped_bytes: ``{reason: bytes}``: client-side copies another veth counts
            (self-health, never billed).
        diagnostic_bytes: ``{name: bytes}``: bytes already in the series above that are
            worth a look (attribution's ``diagnostics_bytes``).
        series_expired: ``{family: series}``: series of deleted objects dropped so far,
            ``family`` the metric they belonged to (``zonemeter_service_bytes_total``...).
        flow_table_entries, flow_table_capacity: kernel flow table fill and size.
        attached_interfaces: veths with the datapath attached.
        collector_duration_seconds: wall time of the last drain+attribute interval.
        metadata_synced: ``{resource: synced}``.
        pairs: top client->server pairs for ``/flows`` (bounded by the producer); their
            bytes are those of ``pairs_interval``, not cumulative.
        pairs_interval: ``(start, end)`` seconds since the epoch of the interval the pairs
            cover, or None.
        generated_at: when this snapshot was built (seconds since the epoch).
        interval_seconds: the agent's interval.
    """

    service_bytes: Mapping[ServiceBytesKey, int] = field(default_factory=dict)
    hint_ignored_bytes: Mapping[HintIgnoredKey, int] = field(default_factory=dict)
    locality_in_effect: Mapping[LocalityKey, bool] = field(default_factory=dict)
    locality_info: Mapping[ServiceId, LocalityInfo] = field(default_factory=dict)
    locality_last_change: Mapping[ServiceId, float] = field(default_factory=dict)
    workload_bytes: Mapping[WorkloadBytesKey, int] = field(default_factory=dict)
    unattributed_bytes: Mapping[str, int] = field(default_factory=dict)
    unknown_crossing_bytes: Mapping[str, int] = field(default_factory=dict)
    skipped_bytes: Mapping[str, int] = field(default_factory=dict)
    diagnostic_bytes: Mapping[str, int] = field(default_factory=dict)
    series_expired: Mapping[str, int] = field(default_factory=dict)
    flow_table_entries: int = 0
    flow_table_capacity: int = 0
    attached_interfaces: int = 0
    collector_duration_seconds: float = 0.0
    metadata_synced: Mapping[str, bool] = field(default_factory=dict)
    pairs: tuple[PairRow, ...] = ()
    pairs_interval: tuple[float, float] | None = None
    generated_at: float = 0.0
    interval_seconds: float = 0.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Mapping) and not isinstance(value, types.MappingProxyType):
                object.__setattr__(self, f.name, _frozen_map(value))
        object.__setattr__(self, "pairs", tuple(self.pairs))


# ----------------------------------------------------------------------------- collector

_HELP = {
    "zonemeter_service_bytes": "L3 bytes of Service traffic counted at the endpoint's node, "
                               "by client and server zone, crossing and direction.",
    "zonemeter_service_hint_ignored_bytes": "L3 bytes from a client zone to an endpoint outside "
                                            "the set kube-proxy selects for that zone while "
                                            "topology hints were in effect.",
    "zonemeter_service_locality_in_effect": "1 when kube-proxy filters this Service's endpoints "
                                            "by topology for clients in client_zone, else 0.",
    "zonemeter_service_locality_info": "Requested locality mode and why locality is not in "
                                       "effect (reason none when it is); always 1.",
    "zonemeter_service_locality_last_change_timestamp_seconds": "When the Service's locality "
                                                                "state last changed.",
    "zonemeter_workload_bytes": "L3 bytes of non-Service traffic of a local pod by workload, "
                                "remote zone and kind, crossing and direction (egress from / "
                                "ingress to the workload).",
    "zonemeter_unattributed_bytes": "L3 bytes that could not be attributed, by reason.",
    "zonemeter_unknown_crossing_bytes": "L3 bytes of service and workload series whose crossing "
                                        "is unknown, by reason (a subset of those series).",
    "zonemeter_skipped_bytes": "L3 bytes seen but not counted here because another veth counts "
                               "them (client-side copies), by reason; never billed.",
    "zonemeter_diagnostic_bytes": "L3 bytes already counted in the series above that are worth "
                                  "a look, by diagnostic name (e.g. endpoint_not_in_kernel: "
                                  "the kernel endpoint map lagged the EndpointSlices).",
    "zonemeter_flow_table_entries": "Entries in the kernel flow table at the last drain.",
    "zonemeter_flow_table_capacity": "Maximum entries of the kernel flow table.",
    "zonemeter_attached_interfaces": "Interfaces the datapath is attached to.",
    "zonemeter_collector_duration_seconds": "Wall time of the last drain and attribution.",
    "zonemeter_metadata_synced": "1 when the resource's Kubernetes metadata is in sync.",
    "zonemeter_series_expired": "Series dropped because their Service or workload no longer "
                                "exists and they gained no bytes for --series-retention seconds, "
                                "by the metric (family) they belonged to.",
    "zonemeter_build_info": "zonemeter build; always 1.",
}

_SERVICE_BYTES_LABELS = [f.name for f in fields(ServiceBytesKey)]
_HINT_IGNORED_LABELS = [f.name for f in fields(HintIgnoredKey)]
_LOCALITY_LABELS = [f.name for f in fields(LocalityKey)]
_WORKLOAD_LABELS = [f.name for f in fields(WorkloadBytesKey)]


def _values(key: Any) -> list[str]:
    return [label(getattr(key, f.name)) for f in fields(key)]


def _add_all(family: Metric, series: Mapping[Any, float]) -> None:
    """Add one sample per key (labels from the key's fields), sorted by label values
    (not by the keys themselves: a producer may mix None and str, or int and str ports)."""
    for values, value in sorted((_values(k), v) for k, v in series.items()):
        family.add_metric(values, value)  # type: ignore[attr-defined]


class Exporter(Collector):
    """A prometheus-client Collector over the current :class:`ExportSnapshot`.

    Args:
        version: value of the ``version`` label of ``zonemeter_build_info``.
    """

    def __init__(self, version: str = "0.1.0") -> None:
        self.version = version
        self._snapshot = ExportSnapshot()

    def update(self, snapshot: ExportSnapshot) -> None:
        """Make ``snapshot`` the one scrapes see (one atomic reference swap)."""
        self._snapshot = snapshot

    def snapshot(self) -> ExportSnapshot:
        """Return the current snapshot."""
        return self._snapshot

    def describe(self) -> Iterable[Metric]:
        """Yield every metric family without samples (names and types for the registry)."""
        return self._families(None)

    def collect(self) -> Iterable[Metric]:
        """Yield the metric families of the current snapshot."""
        return self._families(self._snapshot)

    def registry(self) -> CollectorRegistry:
        """Return a new registry holding only this collector (no process/GC metrics)."""
        reg = CollectorRegistry(auto_describe=True)
        reg.register(self)
        return reg

    def _families(self, snap: ExportSnapshot | None) -> Iterator[Metric]:
        def counter(name: str, labels: list[str]) -> CounterMetricFamily:
            return CounterMetricFamily(name, _HELP[name], labels=labels)

        def gauge(name: str, labels: list[str] | None = None) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, _HELP[name], labels=labels or [])

        fam = counter("zonemeter_service_bytes", _SERVICE_BYTES_LABELS)
        if snap:
            _add_all(fam, snap.service_bytes)
        yield fam

        fam = counter("zonemeter_service_hint_ignored_bytes", _HINT_IGNORED_LABELS)
        if snap:
            _add_all(fam, snap.hint_ignored_bytes)
        yield fam

        g = gauge("zonemeter_service_locality_in_effect", _LOCALITY_LABELS)
        if snap:
            _add_all(g, {k: 1 if on else 0 for k, on in snap.locality_in_effect.items()})
        yield g

        g = gauge("zonemeter_service_locality_info", ["namespace", "service", "mode", "reason"])
        if snap:
            for values in sorted(_values(sid) + [label(info.mode), label(info.reason)]
                                 for sid, info in snap.locality_info.items()):
                g.add_metric(values, 1)
        yield g

        g = gauge("zonemeter_service_locality_last_change_timestamp_seconds", ["namespace", "service"])
        if snap:
            _add_all(g, snap.locality_last_change)
        yield g

        fam = counter("zonemeter_workload_bytes", _WORKLOAD_LABELS)
        if snap:
            _add_all(fam, snap.workload_bytes)
        yield fam

        for name, attr in (("zonemeter_unattributed_bytes", "unattributed_bytes"),
                           ("zonemeter_unknown_crossing_bytes", "unknown_crossing_bytes"),
                           ("zonemeter_skipped_bytes", "skipped_bytes")):
            fam = counter(name, ["reason"])
            if snap:
                for reason, value in sorted((label(r), v) for r, v in getattr(snap, attr).items()):
                    fam.add_metric([reason], value)
            yield fam

        fam = counter("zonemeter_diagnostic_bytes", ["name"])
        if snap:
            for name_, value in sorted((label(n), v) for n, v in snap.diagnostic_bytes.items()):
                fam.add_metric([name_], value)
        yield fam

        fam = counter("zonemeter_series_expired", ["family"])
        if snap:
            for family, value in sorted((label(f), v) for f, v in snap.series_expired.items()):
                fam.add_metric([family], value)
        yield fam

        for name, attr in (("zonemeter_flow_table_entries", "flow_table_entries"),
                           ("zonemeter_flow_table_capacity", "flow_table_capacity"),
                           ("zonemeter_attached_interfaces", "attached_interfaces"),
                           ("zonemeter_collector_duration_seconds", "collector_duration_seconds")):
            g = gauge(name)
            if snap:
                g.add_metric([], getattr(snap, attr))
            yield g

        g = gauge("zonemeter_metadata_synced", ["resource"])
        if snap:
            for res, ok in sorted((label(r), ok) for r, ok in snap.metadata_synced.items()):
                g.add_metric([res], 1 if ok else 0)
        yield g

        g = gauge("zonemeter_build_info", ["version"])
        if snap:
            g.add_metric([label(self.version)], 1)
        yield g

    # ------------------------------------------------------------------ /flows

    def flows(self, top: int = 20) -> dict[str, Any]:
        """Return the ``/flows`` document read by ``zonemeter top``.

        Shape::

            {"generated_at": float, "interval_seconds": float,
             "services": [{"namespace", "service", "bytes_total",
                           "by_crossing": {crossing: bytes}, "by_direction": {dir: bytes},
                           "hint_ignored_bytes", "mode", "reason",
                           "locality_in_effect": {client_zone: bool}}],   # by bytes, desc
             "pairs": [PairRow as dict],       # top ``top`` by bytes of pairs_interval
             "pairs_interval": [start, end] | None,
             "unattributed_bytes": {reason: bytes},
             "unknown_crossing_bytes": {reason: bytes}, "skipped_bytes": {reason: bytes},
             "self": {"flow_table_entries", "flow_table_capacity", "attached_interfaces",
                      "collector_duration_seconds", "metadata_synced": {resource: bool}}}

        Service and reason byte counts are cumulative L3 bytes (a client computes rates by
        diffing two reads); pair bytes are those of ``pairs_interval``.
        """
        snap = self._snapshot
        services: dict[tuple[str, str], dict[str, Any]] = {}

        def entry(ns: str, svc: str) -> dict[str, Any]:
            key = (label(ns), label(svc))
            if key not in services:
                services[key] = {"namespace": key[0], "service": key[1], "bytes_total": 0,
                                 "by_crossing": {}, "by_direction": {}, "hint_ignored_bytes": 0,
                                 "mode": UNKNOWN, "reason": UNKNOWN, "locality_in_effect": {}}
            return services[key]

        for k, v in snap.service_bytes.items():
            e = entry(k.namespace, k.service)
            e["bytes_total"] += v
            e["by_crossing"][label(k.crossing)] = e["by_crossing"].get(label(k.crossing), 0) + v
            e["by_direction"][label(k.direction)] = e["by_direction"].get(label(k.direction), 0) + v
        for hk, hv in snap.hint_ignored_bytes.items():
            entry(hk.namespace, hk.service)["hint_ignored_bytes"] += hv
        for sid, info in snap.locality_info.items():
            e = entry(sid.namespace, sid.service)
            e["mode"], e["reason"] = label(info.mode), label(info.reason)
        for lk, on in snap.locality_in_effect.items():
            entry(lk.namespace, lk.service)["locality_in_effect"][label(lk.client_zone)] = bool(on)
        rows = sorted(services.values(), key=lambda e: (-e["bytes_total"], e["namespace"], e["service"]))
        pairs = sorted(snap.pairs, key=lambda p: (-p.bytes, str(p.client), str(p.server)))[:max(0, top)]
        return {
            "generated_at": snap.generated_at,
            "interval_seconds": snap.interval_seconds,
            "services": rows,
            "pairs": [asdict(p) for p in pairs],
            "pairs_interval": list(snap.pairs_interval) if snap.pairs_interval else None,
            "unattributed_bytes": dict(sorted((label(r), v) for r, v in snap.unattributed_bytes.items())),
            "unknown_crossing_bytes": dict(sorted((label(r), v) for r, v in snap.unknown_crossing_bytes.items())),
            "skipped_bytes": dict(sorted((label(r), v) for r, v in snap.skipped_bytes.items())),
            "self": {"flow_table_entries": snap.flow_table_entries,
                     "flow_table_capacity": snap.flow_table_capacity,
                     "attached_interfaces": snap.attached_interfaces,
                     "collector_duration_seconds": snap.collector_duration_seconds,
                     "metadata_synced": dict(sorted((label(r), ok) for r, ok in snap.metadata_synced.items()))},
        }


# ----------------------------------------------------------------------------- readiness

Readiness = Callable[[], tuple[bool, str]]


def make_readiness(datapath_attached: Callable[[], bool],
                   metadata_synced: Callable[[], Mapping[str, bool]]) -> Readiness:
    """Return the ``/readyz`` check: ready only when the datapath is attached and every
    metadata resource is synced; the text says which condition fails.

    Args:
        datapath_attached: True once the datapath programs are loaded and attached.
        metadata_synced: ``{resource: synced}`` (e.g. ``ClusterMetadata.synced``).
    """
    def check() -> tuple[bool, str]:
        problems = []
        if not datapath_attached():
            problems.append("datapath not attached")
        state = metadata_synced()
        stale = sorted(r for r, ok in state.items() if not ok)
        if not state:
            problems.append("metadata not started")
        elif stale:
            problems.append("metadata not synced: " + ", ".join(stale))
        if problems:
            return False, "not ready: " + "; ".join(problems)
        return True, "ready: datapath attached, metadata synced (" + ", ".join(sorted(state)) + ")"
    return check


# ----------------------------------------------------------------------------- HTTP

def parse_address(value: str) -> tuple[str, int]:
    """Parse ``HOST:PORT`` or ``[V6]:PORT`` (``--metrics-address``).

    Raises:
        InputError: malformed address or port out of range.
    """
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InputError(f"expected HOST:PORT, got {value!r}", source="--metrics-address")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    return host or "0.0.0.0", int(port)


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass


def _is_loopback(addr: str) -> bool:
    """True for 127.0.0.0/8, ::1 and IPv4-mapped loopback peers."""
    try:
        ip = ipaddress.ip_address(addr.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool((mapped or ip).is_loopback)


def make_app(exporter: Exporter, readiness: Readiness, *,
             flows_remote: bool = False) -> Callable[..., Iterable[bytes]]:
    """Return the WSGI app: ``/metrics`` (prometheus_client), ``/healthz``, ``/readyz``,
    ``/flows?top=N`` (JSON, N default 20, at most 1000).

    ``/flows`` carries pod names and peer IPs, so it answers only loopback peers unless
    ``flows_remote`` is set (403 otherwise): with ``hostNetwork`` the metrics port is
    reachable from every pod, and per-pair detail is for ``zonemeter top`` run on the node
    (``kubectl exec`` into the agent pod). See docs/security.md.
    """
    metrics_app = make_wsgi_app(exporter.registry())

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            return metrics_app(environ, start_response)

        def reply(status: str, body: bytes, ctype: str = "text/plain; charset=utf-8") -> list[bytes]:
            start_response(status, [("Content-Type", ctype), ("Content-Length", str(len(body)))])
            return [body]

        if path == "/healthz":
            return reply("200 OK", b"ok\n")
        if path == "/readyz":
            try:
                ok, text = readiness()
            except Exception as err:  # noqa: BLE001 - a failing check means not ready
                ok, text = False, f"not ready: readiness check failed: {err}"
            return reply("200 OK" if ok else "503 Service Unavailable", (text + "\n").encode())
        if path == "/flows":
            if not flows_remote and not _is_loopback(str(environ.get("REMOTE_ADDR", ""))):
                return reply("403 Forbidden",
                             b"/flows answers loopback only (run zonemeter top on the node, "
                             b"or start the agent with --flows-allow-remote)\n")
            qs = parse_qs(environ.get("QUERY_STRING", ""))
            try:
                top = min(max(int(qs.get("top", ["20"])[0]), 0), 1000)
            except ValueError:
                return reply("400 Bad Request", b"top must be an integer\n")
            body = json.dumps(exporter.flows(top), sort_keys=True).encode()
            return reply("200 OK", body, "application/json")
        return reply("404 Not Found", b"not found: try /metrics, /healthz, /readyz, /flows\n")

    return app


class MetricsServer:
    """The HTTP server thread (see :func:`start_server`).

    Attributes:
        host, port: where it listens (port resolved when 0 was asked).
    """

    def __init__(self, server: WSGIServer) -> None:
        self._server = server
        self.host = str(server.server_address[0])
        self.port = int(server.server_address[1])
        self._thread = threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:9808``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def close(self) -> None:
        """Stop serving and release the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def start_server(exporter: Exporter, address: str = "0.0.0.0:9808",
                 readiness: Readiness | None = None, *,
                 flows_remote: bool = False) -> MetricsServer:
    """Serve ``/metrics``, ``/healthz``, ``/readyz``, ``/flows`` on ``address`` in a thread.

    Args:
        exporter: the collector to expose.
        address: ``HOST:PORT`` (``[::]:9808`` for IPv6; port 0 picks a free one).
        readiness: see :func:`make_readiness`; default: always ready.
        flows_remote: let non-loopback peers read ``/flows`` (see :func:`make_app`).

    Raises:
        InputError: malformed address.
        OSError: the address cannot be bound.
    """
    host, port = parse_address(address)
    check = readiness or (lambda: (True, "ready"))

    class Server(_ThreadingWSGIServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    server = make_server(host, port, make_app(exporter, check, flows_remote=flows_remote), server_class=Server,
                         handler_class=_QuietHandler)
    return MetricsServer(server)


def build_time() -> float:
    """Seconds since the epoch (for ``ExportSnapshot.generated_at``)."""
    return time.time()
