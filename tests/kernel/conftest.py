"""Every test under tests/kernel drives the real kernel (network namespaces, BPF).

They need root. Without it they fail with one clear line instead of skipping: a kernel
test that quietly does not run would let a broken datapath pass (CI runs as root).
"""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True, scope="session")
def _root() -> None:
    if os.geteuid() != 0:
        pytest.fail("tests/kernel need root (network namespaces, BPF): run them as root",
                    pytrace=False)
