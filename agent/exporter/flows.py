"""The ``/flows`` JSON document that ``zonemeter top`` reads (per-Service totals and pairs)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from agent.attribution.vocabulary import K_LOAD_BALANCER
from agent.exporter.families import UNKNOWN, label
from agent.exporter.snapshot import ExportSnapshot

__all__ = ["client_class", "flows_document"]


def client_class(client_kind: str, lb_type: str) -> str:
    """One text for a client class: ``client_kind``, or ``load-balancer/<lb_type>`` for a load
    balancer (so an ALB and an NLB, priced differently, stay apart)."""
    kind = label(client_kind)
    return f"{kind}/{label(lb_type)}" if kind == K_LOAD_BALANCER else kind


def flows_document(snap: ExportSnapshot, top: int = 20) -> dict[str, Any]:
    """Return the ``/flows`` document of ``snap``.

    Shape::

        {"generated_at": float, "interval_seconds": float,
         "services": [{"namespace", "service", "bytes_total",
                       "by_crossing": {crossing: bytes}, "by_direction": {dir: bytes},
                       "by_client_kind": {client_kind: bytes},   # load balancers as
                                                                  # load-balancer/<lb_type>
                       "hint_ignored_bytes", "mode", "reason",
                       "locality_in_effect": {client_zone: bool},
                       "expected_cross_zone": {client_zone: share 0..1}}],   # by bytes, desc
         "pairs": [PairRow as dict],       # top ``top`` by bytes of pairs_interval
         "pairs_interval": [start, end] | None,
         "unattributed_bytes": {reason: bytes},
         "unknown_crossing_bytes": {reason: bytes}, "skipped_bytes": {reason: bytes},
         "self": {"flow_table_entries", "flow_table_capacity", "attached_interfaces",
                  "collector_duration_seconds", "metadata_synced": {resource: bool}}}

    Service and reason byte counts are cumulative L3 bytes (a client computes rates by
    diffing two reads); pair bytes are those of ``pairs_interval``.

    Args:
        snap: the snapshot to describe.
        top: pair rows to include (the heaviest first).
    """
    totals = snap.totals
    services: dict[tuple[str, str], dict[str, Any]] = {}

    def entry(ns: str, svc: str) -> dict[str, Any]:
        key = (label(ns), label(svc))
        if key not in services:
            services[key] = {"namespace": key[0], "service": key[1], "bytes_total": 0,
                             "by_crossing": {}, "by_direction": {}, "by_client_kind": {},
                             "hint_ignored_bytes": 0,
                             "mode": UNKNOWN, "reason": UNKNOWN, "locality_in_effect": {},
                             "expected_cross_zone": {}}
        return services[key]

    for k, v in totals.service_bytes.items():
        e = entry(k.namespace, k.service)
        e["bytes_total"] += v
        e["by_crossing"][label(k.crossing)] = e["by_crossing"].get(label(k.crossing), 0) + v
        e["by_direction"][label(k.direction)] = e["by_direction"].get(label(k.direction), 0) + v
        cls = client_class(k.client_kind, k.lb_type)
        e["by_client_kind"][cls] = e["by_client_kind"].get(cls, 0) + v
    for hk, hv in totals.hint_ignored_bytes.items():
        entry(hk.namespace, hk.service)["hint_ignored_bytes"] += hv
    for ref, loc in snap.locality.items():
        e = entry(ref.namespace, ref.service)
        e["mode"], e["reason"] = label(loc.mode), label(loc.reason)
        for zone, on in loc.in_effect.items():
            e["locality_in_effect"][label(zone)] = bool(on)
        for zone, share in loc.expected_cross_zone.items():
            e["expected_cross_zone"][label(zone)] = share
    rows = sorted(services.values(), key=lambda e: (-e["bytes_total"], e["namespace"], e["service"]))
    pairs = sorted(totals.top_pairs, key=lambda p: (-p.bytes, str(p.client), str(p.server)))[:max(0, top)]
    return {
        "generated_at": snap.generated_at,
        "interval_seconds": snap.interval_seconds,
        "services": rows,
        "pairs": [asdict(p) for p in pairs],
        "pairs_interval": list(totals.top_interval) if totals.top_interval else None,
        "unattributed_bytes": dict(sorted((label(r), v) for r, v in totals.unattributed_bytes.items())),
        "unknown_crossing_bytes": dict(sorted((label(r), v) for r, v in totals.unknown_crossing_bytes.items())),
        "skipped_bytes": dict(sorted((label(r), v) for r, v in totals.skipped_bytes.items())),
        "self": {"flow_table_entries": snap.flow_table_entries,
                 "flow_table_capacity": snap.flow_table_capacity,
                 "attached_interfaces": snap.attached_interfaces,
                 "collector_duration_seconds": snap.collector_duration_seconds,
                 "metadata_synced": dict(sorted((label(r), ok) for r, ok in snap.metadata_synced.items()))},
    }
