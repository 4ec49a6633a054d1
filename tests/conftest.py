"""Project-wide pytest rules.

In CI (``CI=true``) a skipped test under ``tests/kernel``, ``tests/e2e`` or ``tests/deploy`` fails
the run: those tests exist to exercise the real kernel and the real image, and a skip there
would hide a broken datapath or deployment behind a green build.

The suite runs on three pytest-xdist workers (``-n 3 --dist loadgroup`` in pyproject.toml,
:func:`pytest_xdist_make_scheduler`): the end-to-end tests in one group, the kernel and deploy
tests in another (:data:`LAB_GROUPS`), each group one after another on a worker of its own, in
file order as without xdist (module-scoped labs stay shared within their module); every other
test (unit, canned-Prometheus, fixtures) goes to whichever worker is free. The two lab groups
can run side by side because nothing they build is shared: each lab, control plane and
partition test makes network namespaces under a random prefix, pins go to per-test directories,
agents and Prometheus listen on loopback ports the kernel picks, and nothing changes the host
namespace's links or routes (``tests/kernel/test_lab.py`` compares them before and after). They
mostly wait (traffic at fixed rates, export intervals) rather than compute.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

_MUST_RUN = ("tests/kernel/", "tests/e2e/", "tests/deploy/")
#: the serial pytest-xdist groups: tests under these paths -> group name (the first match).
#: The churn test goes with the kernel tests only to even out the two groups' wall times
#: (by the slowest tests' durations in a full run). The demo on the bypass data plane runs
#: cgroup-hook agents, whose programs sit on the machine's cgroup root where
#: tests/kernel/test_datapath_cgroup.py counts ours exactly: one group, one at a time.
LAB_GROUPS = {"tests/e2e/test_churn.py": "lab-kernel", "tests/e2e/test_demo_bypass.py": "lab-kernel",
              "tests/e2e/": "lab-e2e",
              "tests/kernel/": "lab-kernel", "tests/deploy/": "lab-kernel"}
_skipped_in_ci: list[str] = []


def lab_group(nodeid: str) -> str | None:
    """Return the serial group of a test (:data:`LAB_GROUPS`), None for a test of no group."""
    return next((g for d, g in LAB_GROUPS.items() if nodeid.startswith(d)), None)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist's ``--dist loadgroup`` with the groups of :func:`lab_group`, by path (so a
    new kernel test needs no mark); every other test is a unit of its own, handed to whichever
    worker is free. Other ``--dist`` modes are xdist's own (None: its default hook chooses).
    (xdist's own loadgroup reads ``xdist_group`` marks into ``Item._nodeid``, which pytest 9.2
    no longer uses for the node id, so it would spread a marked group over every worker.)

    Returns:
        an ``xdist.scheduler.LoadScopeScheduling`` whose scope of a test is its group.
    """
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class LabGroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return lab_group(nodeid) or nodeid

    return LabGroupScheduling(config, log)


def in_ci() -> bool:
    """True when running under CI (``CI`` set to a true value)."""
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if report.skipped and in_ci() and item.nodeid.startswith(_MUST_RUN):
        _skipped_in_ci.append(item.nodeid)
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, which counts as a failure here: {report.longrepr}"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _skipped_in_ci:
        session.exitstatus = 1
