"""Every test under tests/e2e drives the whole lab: network namespaces, real agents (BPF),
often a real Prometheus.

They need root. Without it they fail with one clear line instead of skipping: an end-to-end
test that quietly does not run would let a broken product pass (CI runs as root).
"""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True, scope="session")
def _root() -> None:
    if os.geteuid() != 0:
        pytest.fail("tests/e2e need root (network namespaces, BPF, the lab's agents): run them as root",
                    pytrace=False)
