"""tools/demo/run.py's signal handling: SIGINT and SIGTERM raise KeyboardInterrupt in the demo
process, and one that arrives inside a fork callback (where CPython drops exceptions) is
delivered again outside it instead of being lost."""

from __future__ import annotations

import signal
import time

import pytest

from tools.demo import run


def test_the_standard_librarys_fork_callbacks_are_known() -> None:
    assert run._FORK_HOOKS
    assert all(c.co_filename.endswith("logging/__init__.py") for c in run._FORK_HOOKS)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_raises_keyboard_interrupt(signum: int) -> None:
    restore = run.sigterm_as_interrupt()
    try:
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signum)
            time.sleep(5)
    finally:
        restore()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_inside_a_fork_callback_comes_again_outside_it(signum: int,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    def fork_callback() -> str:
        """Stands for logging's lock release that CPython runs after a fork."""
        signal.raise_signal(signum)
        return "returned"  # the handler did not raise in here

    monkeypatch.setattr(run, "_FORK_HOOKS", run._FORK_HOOKS | {fork_callback.__code__})
    restore = run.sigterm_as_interrupt()
    try:
        assert fork_callback() == "returned"
        began = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            time.sleep(5)  # the signal comes again after REDELIVER_SECONDS
        assert time.monotonic() - began < 2
    finally:
        restore()
