"""Project-wide pytest rules.

In CI (``CI=true``) a skipped test under ``tests/kernel``, ``tests/e2e`` or ``tests/deploy`` fails
the run: those tests exist to exercise the real kernel and the real image, and a skip there
would hide a broken datapath or deployment behind a green build.

The suite runs on pytest-xdist workers (``-n 2 --dist loadgroup`` in pyproject.toml). Every test
under those three directories is in one group (:func:`pytest_xdist_make_scheduler`), so they run
one after another on a single worker, in file order, as without xdist: they share the host's network namespace
(``test_lab.py`` compares its links and routes before and after), real CPU-timed windows and
root-only resources. The unit and canned-Prometheus tiers (``tests/unit``, ``tests/prom``,
``tests/fixtures``) use only their own temporary directories and loopback ports, and run on
the other worker meanwhile.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

_MUST_RUN = ("tests/kernel/", "tests/e2e/", "tests/deploy/")
#: the xdist group of the tests under _MUST_RUN (pytest-xdist's ``--dist loadgroup``)
LAB_GROUP = "lab"
_skipped_in_ci: list[str] = []


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist's ``--dist loadgroup`` with one group, :data:`LAB_GROUP`, made of every test
    under :data:`_MUST_RUN` by path (so a new kernel test cannot forget a mark); every other
    test is a unit of its own, handed to whichever worker is free. Other ``--dist`` modes are
    xdist's own (None: xdist's default hook chooses).

    Returns:
        an ``xdist.scheduler.LoadScopeScheduling`` whose scope of a test is the group.
    """
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class LabGroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return LAB_GROUP if nodeid.startswith(_MUST_RUN) else nodeid

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
