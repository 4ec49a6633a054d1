"""The exporter: Prometheus exposition of the agent's totals, and its HTTP endpoints.

* :mod:`agent.exporter.families`: the metric family table (the metric contract,
  docs/metrics.md);
* :mod:`agent.exporter.snapshot`: :class:`ExportSnapshot`, what one scrape exposes;
* :mod:`agent.exporter.collector`: :class:`Exporter`, the Collector over the table;
* :mod:`agent.exporter.flows`: the ``/flows`` document ``zonemeter top`` reads;
* :mod:`agent.exporter.http`: the WSGI server, readiness, ``/flows`` access.
"""

from agent.exporter.collector import Exporter
from agent.exporter.families import FAMILIES, UNKNOWN, MetricFamily, label
from agent.exporter.flows import flows_document
from agent.exporter.http import (
    MetricsServer,
    Readiness,
    build_time,
    make_app,
    make_readiness,
    parse_address,
    start_server,
)
from agent.exporter.snapshot import ExportSnapshot
from agent.records import (
    AttributionTotals,
    ClientPathKey,
    HintIgnoredKey,
    Locality,
    PairRow,
    ServiceBytesKey,
    ServiceRef,
    WorkloadBytesKey,
)

__all__ = [
    "FAMILIES",
    "UNKNOWN",
    "AttributionTotals",
    "ExportSnapshot",
    "Exporter",
    "ClientPathKey",
    "HintIgnoredKey",
    "Locality",
    "MetricFamily",
    "MetricsServer",
    "PairRow",
    "Readiness",
    "ServiceBytesKey",
    "ServiceRef",
    "WorkloadBytesKey",
    "build_time",
    "flows_document",
    "label",
    "make_app",
    "make_readiness",
    "parse_address",
    "start_server",
]
