"""Exporter: the prometheus-client Collector that serves the family table over the snapshot.

The agent loop builds an immutable :class:`ExportSnapshot` after each interval and hands it
to :meth:`Exporter.update`, which swaps one reference. A scrape reads whatever snapshot is
current and yields fresh metric families from it (client_python's custom ``Collector``
pattern): no global counters, no locks on the hot path, and a scrape never sees half of an
interval.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.openmetrics import exposition as openmetrics_exposition
from prometheus_client.registry import Collector

from agent.exporter.families import COUNTER, FAMILIES, MetricFamily
from agent.exporter.flows import flows_document
from agent.exporter.snapshot import ExportSnapshot

__all__ = ["Exporter"]


def _family(row: MetricFamily) -> CounterMetricFamily | GaugeMetricFamily:
    cls = CounterMetricFamily if row.type == COUNTER else GaugeMetricFamily
    return cls(row.name, row.help, labels=list(row.labels))


class Exporter(Collector):
    """A prometheus-client Collector over the current :class:`ExportSnapshot`.

    Args:
        version: value of the ``version`` label of ``zonemeter_build_info``.
    """

    def __init__(self, version: str = "0.1.0") -> None:
        self.version = version
        self._snapshot = ExportSnapshot()
        self._registry = self.registry()
        #: the last text written, per format: (snapshot, its text); a second scrape of one
        #: snapshot (an HA pair of Prometheus servers) costs nothing
        self._rendered: dict[bool, tuple[ExportSnapshot, bytes]] = {}

    def update(self, snapshot: ExportSnapshot) -> None:
        """Make ``snapshot`` the one scrapes see (one atomic reference swap)."""
        self._snapshot = snapshot

    def snapshot(self) -> ExportSnapshot:
        """Return the current snapshot."""
        return self._snapshot

    def describe(self) -> Iterable[Metric]:
        """Yield every metric family without samples (names and types for the registry)."""
        return (_family(row) for row in FAMILIES)

    def collect(self) -> Iterable[Metric]:
        """Yield the metric families of the current snapshot, in table order, samples sorted
        by label values (then value)."""
        return self._families(self._snapshot)

    def render(self, *, openmetrics: bool = False) -> bytes:
        """Return the /metrics text of the current snapshot, UTF-8: prometheus_client's
        ``generate_latest`` (Prometheus text 0.0.4) or, with ``openmetrics``, its
        ``openmetrics.generate_latest`` (OpenMetrics 1.0.0) over this collector. The text
        is written once per snapshot and format; later scrapes of the same snapshot get
        the same bytes."""
        snap = self._snapshot
        done = self._rendered.get(openmetrics)
        if done is not None and done[0] is snap:
            return done[1]
        write = openmetrics_exposition.generate_latest if openmetrics else generate_latest
        body = write(self._registry)
        self._rendered[openmetrics] = (snap, body)
        return body

    def registry(self) -> CollectorRegistry:
        """Return a new registry holding only this collector (no process/GC metrics)."""
        reg = CollectorRegistry(auto_describe=True)
        reg.register(self)
        return reg

    def flows(self, top: int = 20) -> dict[str, Any]:
        """Return the ``/flows`` document of the current snapshot (see
        :func:`agent.exporter.flows.flows_document`)."""
        return flows_document(self._snapshot, top)

    def _families(self, snap: ExportSnapshot) -> Iterator[Metric]:
        for row in FAMILIES:
            fam = _family(row)
            for values, value in sorted(row.getter(snap, self.version)):
                fam.add_metric(list(values), value)
            yield fam
