"""Fixtures of the real-Prometheus tests: see :mod:`tests.fixtures.promdata`."""

from tests.fixtures.promdata import prometheus_url  # noqa: F401  (a pytest fixture)
