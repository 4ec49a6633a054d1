"""The /metrics text of the family table, written without building client_python objects.

:func:`render` writes the exposition of :data:`agent.exporter.families.FAMILIES` over one
:class:`agent.exporter.ExportSnapshot` byte for byte as prometheus_client's
``generate_latest`` (Prometheus text format 0.0.4) and ``openmetrics.generate_latest``
(OpenMetrics 1.0.0) write it for the :class:`agent.exporter.Exporter` collector: families
in table order, ``# HELP``/``# TYPE`` lines, samples sorted by label values (then value),
label names sorted within a sample, values through client_python's ``floatToGoString``.
The library validates and escapes every label name and builds a sample object with a
label dict for every sample: 0.19 s of CPU per scrape of 22,858 series in bench_agent.
Here the text before the value (``name{labels} ``) is built once per series and kept while
the series exists (``prefixes``), so a scrape costs a sort, a dict lookup and a float
format per sample: 0.09 s for the same scrape (BENCHMARKS.md, "The agent's own cost").
``tests/unit/exporter/test_text.py`` checks the output against the library's for both
formats. Only what our families use is handled (legacy-valid metric and label names, no
timestamps, exemplars, units or ``_created`` samples); anything else is the library's job
(:func:`agent.exporter.http.make_app` falls back to it).
"""

from __future__ import annotations

from typing import Any

from prometheus_client.utils import floatToGoString as _go_float

from agent.exporter.families import COUNTER, FAMILIES, key_labels
from agent.exporter.snapshot import ExportSnapshot

__all__ = ["render"]

#: (family name, label values) -> the sample's text up to its value; and for the families
#: keyed by a label record, id(record) -> (record, label values, text up to the value)
Prefixes = dict[Any, Any]


def _value(text: str) -> str:
    """A label value as both formats escape it (backslash, newline, double quote)."""
    return text.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _prefix(name: str, labels: tuple[str, ...], values: tuple[str, ...]) -> str:
    if not labels:
        return name + " "
    pairs = ",".join(f'{k}="{_value(v)}"' for k, v in sorted(zip(labels, values, strict=True)))
    return f"{name}{{{pairs}}} "


def render(snapshot: ExportSnapshot, version: str, *, openmetrics: bool,
           prefixes: Prefixes | None = None) -> tuple[bytes, Prefixes]:
    """The exposition of every family over ``snapshot``.

    Args:
        snapshot: what the scrape shows.
        version: the ``version`` label of ``zonemeter_build_info``.
        openmetrics: OpenMetrics 1.0.0 text (counter families named without ``_total`` in
            ``# TYPE``, ``# EOF`` at the end) instead of Prometheus text 0.0.4.
        prefixes: the second value of the previous call (any format), or None.

    Returns:
        ``(UTF-8 text, prefixes)``: the prefixes of this snapshot's series, for the next
        call (series that are gone are dropped, so it stays as large as one scrape).
    """
    old = prefixes or {}
    new: Prefixes = {}
    out: list[str] = []
    append = out.append
    for row in FAMILIES:
        name = row.name
        # CounterMetricFamily drops a "_total" suffix from the family name and adds it to
        # the sample's; the 0.0.4 text names the family with it, OpenMetrics without
        if row.type == COUNTER:
            base = name[:-6] if name.endswith("_total") else name
            name = base + "_total"
            fname = base if openmetrics else name
        else:
            fname = name
        if openmetrics:
            doc = _value(row.help)
        else:
            doc = row.help.replace("\\", r"\\").replace("\n", r"\n")
        append(f"# HELP {fname} {doc}\n# TYPE {fname} {row.type}\n")
        labels = row.labels
        if row.series is not None:
            # a series' record lives as long as the series (AttributionTotals keeps it):
            # its label values and text are found by identity, without hashing the record
            samples = []
            for rec, value in row.series(snapshot).items():
                hit = old.get(id(rec))
                if hit is None or hit[0] is not rec:
                    values = key_labels(rec)
                    hit = (rec, values, _prefix(name, labels, values))
                new[id(rec)] = hit
                samples.append((hit[1], value, hit[2]))
            samples.sort()  # as the library: by label values, then value
            for _, value, p in samples:
                append(p + _go_float(value) + "\n")  # type: ignore[no-untyped-call]
            continue
        for values, value in sorted(row.getter(snapshot, version)):
            key = (name, values)
            p = old.get(key)
            if p is None:
                p = _prefix(name, labels, values)
            new[key] = p
            append(p + _go_float(value) + "\n")  # type: ignore[no-untyped-call]
    if openmetrics:
        append("# EOF\n")
    return "".join(out).encode("utf-8"), new
