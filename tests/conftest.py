"""Project-wide pytest rules.

In CI (``CI=true``) a skipped test under ``tests/kernel``, ``tests/e2e`` or ``tests/deploy`` fails
the run: those tests exist to exercise the real kernel and the real image, and a skip there
would hide a broken datapath or deployment behind a green build.
"""

from __future__ import annotations

import os

import pytest

_MUST_RUN = ("tests/kernel/", "tests/e2e/", "tests/deploy/")
_skipped_in_ci: list[str] = []


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
