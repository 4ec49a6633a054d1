"""``zonemeter report``: before/after proof of cross-zone savings per Service, from Prometheus.

Stages, each a module:

- :mod:`agent.report.timespec`: parse times (RFC 3339, ``-7d``, ``now``), durations and
  windows; validate them; choose the query step.
- :mod:`agent.report.pricing`: the price per GB that crosses a zone boundary.
- :mod:`agent.report.prom`: a thin Prometheus HTTP API client (``/api/v1/query``,
  ``/api/v1/query_range``) over ``requests``.
- :mod:`agent.report.compute`: queries -> per-Service window statistics -> savings.
- :mod:`agent.report.render`: table, JSON and CSV output.
- :mod:`agent.report.chart`: the PNG chart (matplotlib, Agg) and the HTML report.
- :mod:`agent.cli.report`: the ``report`` verb.

See ``docs/report.md`` for the exact definitions of every number.
"""
