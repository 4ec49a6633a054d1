"""ExportSnapshot: everything one scrape exposes, built once per interval, never mutated."""

from __future__ import annotations

import types
from collections.abc import Mapping
from dataclasses import dataclass, field

from agent.records import AttributionTotals, CoverageState, Locality, ServiceRef

__all__ = ["ExportSnapshot"]


@dataclass(frozen=True, slots=True)
class ExportSnapshot:
    """Everything one scrape exposes; built once per interval, never mutated.

    Byte counts are CUMULATIVE since the agent started (Prometheus counters). The
    attribution totals and the hint model's locality are held as those stages produce
    them; mapping fields are copied into read-only mappings on construction.

    Attributes:
        totals: the Attributor's totals (service, hint-ignored, workload, reason and
            diagnostic bytes, expired series, top pairs for ``/flows``).
        locality: ``{ServiceRef: Locality}`` from the hint model (``HintModel.localities()``).
        flow_table_entries, flow_table_capacity: kernel flow table fill and size.
        attached_interfaces: veths with the datapath attached.
        collector_duration_seconds: wall time of the last drain+attribute interval.
        metadata_synced: ``{resource: synced}``.
        generated_at: when this snapshot was built (seconds since the epoch).
        interval_seconds: the agent's interval.
        coverage: hook coverage: counted against carried bytes (docs/datapath.md).
        hint_model: what the hint model assumes: ``(kubernetes_version, kube_proxy_version,
            source, kube_proxy_source)`` (``HintModel.model_info`` of this node), or None
            before the model exists.
        datapath: ``(hook, attach, requested)`` of the node's datapath
            (:func:`agent.loop.datapath_info`), or None (not known yet).
        checkpoint_discarded: ``{reason: count}`` of checkpoint files discarded
            (:data:`agent.checkpoint.DISCARD_REASONS`); empty without a checkpoint.
    """

    totals: AttributionTotals = field(default_factory=AttributionTotals)
    locality: Mapping[ServiceRef, Locality] = field(default_factory=dict)
    flow_table_entries: int = 0
    flow_table_capacity: int = 0
    attached_interfaces: int = 0
    collector_duration_seconds: float = 0.0
    metadata_synced: Mapping[str, bool] = field(default_factory=dict)
    generated_at: float = 0.0
    interval_seconds: float = 0.0
    coverage: CoverageState = field(default_factory=CoverageState)
    hint_model: tuple[str, str, str, str] | None = None
    datapath: tuple[str, str, str] | None = None
    checkpoint_discarded: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("locality", "metadata_synced", "checkpoint_discarded"):
            value = getattr(self, name)
            if not isinstance(value, types.MappingProxyType):
                object.__setattr__(self, name, types.MappingProxyType(dict(value or {})))
