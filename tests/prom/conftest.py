"""Fixtures of the real-Prometheus tests: see :mod:`tests.prom.promdata`."""

from tests.prom.promdata import prometheus_url  # noqa: F401  (a pytest fixture)
