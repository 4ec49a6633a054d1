"""Attribution: one node's flow deltas joined with metadata and hint state into byte totals.

* :mod:`agent.attribution.vocabulary`: crossing values, reasons, :func:`counted_here`
  (the exactly-once rule);
* :mod:`agent.attribution.join`: :class:`Attributor`, the per-delta join (the hot loop);
* :mod:`agent.attribution.expiry`: series of deleted Services and workloads.

The totals it produces (:class:`agent.records.AttributionTotals`) go to the exporter as
they are. docs/attribution.md describes the rules.
"""

from agent.attribution.expiry import SWEEP_FRACTION, ObjectView
from agent.attribution.join import HOSTNET_TTL, LOOKUP_ERRORS, Attributor, HintView, MetadataView
from agent.attribution.vocabulary import (
    CROSSINGS,
    EXPIRY_FAMILIES,
    FAMILY_CLIENT_PATH,
    FAMILY_HINT_IGNORED,
    FAMILY_SERVICE,
    FAMILY_SERVICE_ENTRY,
    FAMILY_WORKLOAD,
    SKIPPED_REASONS,
    UNATTRIBUTED_REASONS,
    UNKNOWN,
    counted_here,
)
from agent.records import AttributionTotals, ClientPathKey, HintIgnoredKey, PairRow, ServiceBytesKey, WorkloadBytesKey

#: attribution's names for the shared counter keys (agent/records.py)
ServiceKey = ServiceBytesKey
WorkloadKey = WorkloadBytesKey

__all__ = [
    "CROSSINGS",
    "EXPIRY_FAMILIES",
    "FAMILY_CLIENT_PATH",
    "FAMILY_HINT_IGNORED",
    "FAMILY_SERVICE",
    "FAMILY_SERVICE_ENTRY",
    "FAMILY_WORKLOAD",
    "HOSTNET_TTL",
    "LOOKUP_ERRORS",
    "SKIPPED_REASONS",
    "SWEEP_FRACTION",
    "UNATTRIBUTED_REASONS",
    "UNKNOWN",
    "AttributionTotals",
    "Attributor",
    "ClientPathKey",
    "HintIgnoredKey",
    "HintView",
    "MetadataView",
    "ObjectView",
    "PairRow",
    "ServiceKey",
    "WorkloadKey",
    "counted_here",
]
